"""Conversion of image datasets (ImageFolder trees, CIFAR archives, arrays, indexable datasets)
into ``.beton`` files and LMDB databases: sources, image normalisation, parallel encoding."""
from __future__ import annotations

from .convert import ConvertError, ConvertReport, convert_dataset, image_fields

__all__ = ["convert_dataset", "ConvertReport", "ConvertError", "image_fields"]
