"""ffload: convert image datasets once into memory-mapped files, then load them with compiled pipelines.

``ffload.Loader`` and ``ffload.OrderOption`` are imported on first use, so that ``import ffload``
(and the ``convert`` / ``inspect`` commands) do not pay for importing torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ffload.lazy import lazy_getattr

if TYPE_CHECKING:
    from ffload.loaders.loader import Loader as Loader
    from ffload.loaders.orders import OrderOption as OrderOption

__version__ = "0.1.0"

_MODULES = {  # public name -> the module defining it; imported on first use (torch)
    "Loader": "ffload.loaders.loader",
    "OrderOption": "ffload.loaders.orders",
}

__getattr__ = lazy_getattr(__name__, _MODULES, globals())

__all__ = [*_MODULES, "__version__"]
