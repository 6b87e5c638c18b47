"""ffload: convert image datasets once into memory-mapped files, then load them with compiled pipelines.

``ffload.Loader`` and ``ffload.OrderOption`` are imported on first use, so that ``import ffload``
(and the ``convert`` / ``inspect`` commands) do not pay for importing torch.
"""
from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["Loader", "OrderOption", "__version__"]


def __getattr__(name):
    if name in ("Loader", "OrderOption"):
        from ffload import loaders
        return getattr(loaders, name)
    raise AttributeError(f"module 'ffload' has no attribute {name!r}")
