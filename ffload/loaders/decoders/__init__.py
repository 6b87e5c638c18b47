"""Decoders: the first stage of a field's pipeline, from stored bytes to a batch.

Modules (each decoder is one compiled call per batch):

* ``base``: the :class:`Decoder` base, ``field_name``, and the kernels' helpers (region view,
  flat batch view, byte copy, ``output_size`` argument).
* ``basics``: scalars, arrays and bytes (``IntDecoder``, ``FloatDecoder``, ``NDArrayDecoder``,
  ``BytesDecoder``, ``RaggedArrayDecoder``, ``RaggedLengthDecoder``).
* ``rgb``: RGB images, raw or JPEG (``SimpleRGBImageDecoder``, ``CenterCropRGBImageDecoder``,
  ``RandomResizedCropRGBImageDecoder``, ``ResizeRGBImageDecoder``) and the flip draws they fuse.
* ``crops``: where crop boxes are drawn (RandomResizedCrop's box, the centre crop, the
  ImageArrayField windows).
* ``image_array``: ImageArrayFields (``ImageArrayDecoder``, ``CenterCropImageArrayDecoder``,
  ``RandomCropImageArrayDecoder``).
* ``image_payloads``: the raw ImageArrayField layout the kernels read (header, PNG staging).
* ``targets``: detection and segmentation targets that follow their image's geometry
  (``TransformBoxes``, ``FollowBoxes``, ``BoxCountDecoder``, ``MaskDecoder``).

``from ffload.loaders.decoders import RandomResizedCropRGBImageDecoder`` imports the defining
module on first use (numba, libjpeg-turbo); inside ffload, import from the defining module.
"""
from __future__ import annotations

from ffload.lazy import lazy_getattr

_MODULES = {  # public name -> the submodule defining it; imported on first use (numba)
    **dict.fromkeys(["BytesDecoder", "FloatDecoder", "IntDecoder", "NDArrayDecoder", "RaggedArrayDecoder",
                     "RaggedLengthDecoder"], "basics"),
    **dict.fromkeys(["CenterCropRGBImageDecoder", "RandomResizedCropRGBImageDecoder", "ResizeRGBImageDecoder",
                     "SimpleRGBImageDecoder"], "rgb"),
    **dict.fromkeys(["CenterCropImageArrayDecoder", "ImageArrayDecoder", "RandomCropImageArrayDecoder"],
                    "image_array"),
    **dict.fromkeys(["BoxCountDecoder", "FollowBoxes", "MaskDecoder", "TransformBoxes"], "targets"),
    "Decoder": "base",
}

__getattr__ = lazy_getattr(__name__, _MODULES, globals())

__all__ = list(_MODULES)
