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

from typing import TYPE_CHECKING

from ffload.lazy import lazy_getattr

if TYPE_CHECKING:
    from ffload.convert.conversion import ConvertReport as ConvertReport
    from ffload.convert.convert import convert_dataset as convert_dataset
    from ffload.convert.options import ConvertOptions as ConvertOptions
    from ffload.convert.options import image_fields as image_fields
    from ffload.errors import ConvertError as ConvertError

_MODULES = {  # public name -> the module defining it
    "convert_dataset": "ffload.convert.convert",
    **dict.fromkeys(["ConvertOptions", "image_fields"], "ffload.convert.options"),
    "ConvertReport": "ffload.convert.conversion",
    "ConvertError": "ffload.errors",
}

__getattr__ = lazy_getattr(__name__, _MODULES, globals())

__all__ = list(_MODULES)
