"""Conversion of image datasets (ImageFolder trees, CIFAR archives, arrays, indexable datasets)
into ``.beton`` files and LMDB databases: sources, image normalisation, parallel encoding.

``from ffload.convert import convert_dataset`` imports its submodule on first use, so that
``ffload.convert.sources`` (listing a source) does not import numba or OpenCV. The rooms:

- ``convert``: ``convert_dataset`` (the entry point, URL destinations) and the local engine.
- ``options``: ``ConvertOptions`` (every option, checked once) and ``image_fields``.
- ``conversion``: the core every engine shares (source, atomic output, journal, report): ``ConvertReport``.
- ``ray_engine``, ``ray_shards``: the Ray engines (chunks written here; shards written by the tasks).
- ``journal``: the partial output and journal of a resumable ``.beton`` conversion.
- ``encode``: samples to field payloads, in chunks, in worker processes.
- ``images``, ``passthrough``: input images decoded and normalised; source JPEGs kept as they are.
- ``provenance``: each sample's origin. ``export``: WebDataset shards out. ``demo_data``: sample data.
- ``sources``: the input datasets.
"""
from __future__ import annotations

from ffload.lazy import lazy_getattr

_MODULES = {  # public name -> the submodule defining (or importing) it
    "convert_dataset": "convert",
    **dict.fromkeys(["ConvertOptions", "image_fields"], "options"),
    **dict.fromkeys(["ConvertReport", "ConvertError"], "conversion"),
}

__getattr__ = lazy_getattr(__name__, _MODULES, globals())

__all__ = list(_MODULES)
