"""Lazy package attributes (PEP 562): a package names its public objects and the submodule
defining each, and imports that submodule on first use, so that importing a light part of the
package (or ``ffload --help``) does not import numba, OpenCV or torch."""
from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping


def lazy_getattr(package: str, modules: Mapping[str, str], namespace: dict) -> Callable[[str], object]:
    """A module ``__getattr__`` for ``package``: ``name`` is imported from ``package.<modules[name]>``
    on first use and cached in ``namespace`` (the package's ``globals()``).

    Raises (from the returned function):
        AttributeError: ``name`` is not one of ``modules``.
    """
    def __getattr__(name: str) -> object:
        module = modules.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f".{module}", package), name)
        namespace[name] = value
        return value
    return __getattr__
