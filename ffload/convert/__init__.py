"""Conversion of image datasets (ImageFolder trees, CIFAR archives, arrays, indexable datasets)
into ``.beton`` files and LMDB databases: sources, image normalisation, parallel encoding.

``from ffload.convert import convert_dataset`` imports :mod:`ffload.convert.convert` on first use,
so that ``ffload.convert.sources`` (listing a source) does not import numba or OpenCV.
"""
from __future__ import annotations

from ffload.lazy import lazy_getattr

_MODULES = dict.fromkeys(["convert_dataset", "ConvertReport", "ConvertError", "image_fields"], "convert")

__getattr__ = lazy_getattr(__name__, _MODULES, globals())

__all__ = ["convert_dataset", "ConvertReport", "ConvertError", "image_fields"]
