"""Lazy package attributes (PEP 562): a namespace maps its public names to the modules defining
them (``_MODULES``), and imports a module on first use, so that importing a light part of the
package (or ``ffload --help``) does not import numba, OpenCV or torch.

Type checkers do not run ``__getattr__``: each namespace also imports every name of its map under
``if TYPE_CHECKING:`` (``from module import Name as Name``, an explicit re-export), and
``tests/test_public_api.py`` checks that block against the map.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_getattr(package: str, modules: Mapping[str, str], namespace: dict[str, Any]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``: ``name`` is imported from the module
    ``modules[name]`` (an absolute module name, ``"ffload.loaders.loader"``) on first use and cached
    in ``namespace`` (the package's ``globals()``).

    Raises (from the returned function):
        AttributeError: ``name`` is not one of ``modules``.
    """

    def __getattr__(name: str) -> Any:
        module = modules.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    return __getattr__
