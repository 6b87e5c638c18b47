"""Decoders, the first stage of a field's pipeline (FFCV's ``ffcv.fields.decoders``): stored bytes to a batch.

``from ffload.decoders import RandomResizedCropRGBImageDecoder, IntDecoder`` imports the defining module
under ``ffload.loaders.decoders`` on first use (numba, libjpeg-turbo). This map is the one list of the public
decoders; ``ffload.loaders`` and ``ffload.loaders.decoders`` reuse it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ffload.lazy import lazy_getattr

if TYPE_CHECKING:
    from ffload.loaders.decoders.base import Decoder as Decoder
    from ffload.loaders.decoders.basics import BytesDecoder as BytesDecoder
    from ffload.loaders.decoders.basics import FloatDecoder as FloatDecoder
    from ffload.loaders.decoders.basics import IntDecoder as IntDecoder
    from ffload.loaders.decoders.basics import NDArrayDecoder as NDArrayDecoder
    from ffload.loaders.decoders.basics import RaggedArrayDecoder as RaggedArrayDecoder
    from ffload.loaders.decoders.basics import RaggedLengthDecoder as RaggedLengthDecoder
    from ffload.loaders.decoders.image_array import CenterCropImageArrayDecoder as CenterCropImageArrayDecoder
    from ffload.loaders.decoders.image_array import ImageArrayDecoder as ImageArrayDecoder
    from ffload.loaders.decoders.image_array import RandomCropImageArrayDecoder as RandomCropImageArrayDecoder
    from ffload.loaders.decoders.rgb import CenterCropRGBImageDecoder as CenterCropRGBImageDecoder
    from ffload.loaders.decoders.rgb import RandomResizedCropRGBImageDecoder as RandomResizedCropRGBImageDecoder
    from ffload.loaders.decoders.rgb import ResizeCenterCropRGBImageDecoder as ResizeCenterCropRGBImageDecoder
    from ffload.loaders.decoders.rgb import ResizeRGBImageDecoder as ResizeRGBImageDecoder
    from ffload.loaders.decoders.rgb import SimpleRGBImageDecoder as SimpleRGBImageDecoder
    from ffload.loaders.decoders.targets import BoxCountDecoder as BoxCountDecoder
    from ffload.loaders.decoders.targets import MaskDecoder as MaskDecoder

_MODULES = {  # public name -> the module defining it; imported on first use (numba)
    "Decoder": "ffload.loaders.decoders.base",
    **dict.fromkeys(
        ["BytesDecoder", "FloatDecoder", "IntDecoder", "NDArrayDecoder", "RaggedArrayDecoder", "RaggedLengthDecoder"],
        "ffload.loaders.decoders.basics",
    ),
    **dict.fromkeys(
        [
            "CenterCropRGBImageDecoder",
            "RandomResizedCropRGBImageDecoder",
            "ResizeRGBImageDecoder",
            "ResizeCenterCropRGBImageDecoder",
            "SimpleRGBImageDecoder",
        ],
        "ffload.loaders.decoders.rgb",
    ),
    **dict.fromkeys(
        ["CenterCropImageArrayDecoder", "ImageArrayDecoder", "RandomCropImageArrayDecoder"],
        "ffload.loaders.decoders.image_array",
    ),
    **dict.fromkeys(["BoxCountDecoder", "MaskDecoder"], "ffload.loaders.decoders.targets"),
}

__getattr__ = lazy_getattr(__name__, _MODULES, globals())

__all__ = list(_MODULES)
