"""Decoders: the first stage of a field's pipeline, from stored bytes to a batch.

Modules (each decoder is one compiled call per batch):

* ``base``: the :class:`Decoder` base, ``field_name``, and the kernels' helpers (region view,
  flat batch view, byte copy, ``output_size`` argument).
* ``basics``: scalars, arrays and bytes (``IntDecoder``, ``FloatDecoder``, ``NDArrayDecoder``,
  ``BytesDecoder``, ``RaggedArrayDecoder``, ``RaggedLengthDecoder``).
* ``rgb``: RGB images, raw or JPEG (``SimpleRGBImageDecoder``, ``CenterCropRGBImageDecoder``,
  ``RandomResizedCropRGBImageDecoder``, ``ResizeRGBImageDecoder``, torchvision's resize then centre
  crop ``ResizeCenterCropRGBImageDecoder``) and the flip draws they fuse.
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

from typing import TYPE_CHECKING

from ffload.decoders import _MODULES as _DECODERS
from ffload.lazy import lazy_getattr
from ffload.transforms import _MODULES as _TRANSFORMS

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
    from ffload.loaders.decoders.targets import FollowBoxes as FollowBoxes
    from ffload.loaders.decoders.targets import MaskDecoder as MaskDecoder
    from ffload.loaders.decoders.targets import TransformBoxes as TransformBoxes

# public name -> the module defining it: the names of ffload.decoders and ffload.transforms defined here
_MODULES = {name: module for name, module in {**_DECODERS, **_TRANSFORMS}.items() if module.startswith(f"{__name__}.")}

__getattr__ = lazy_getattr(__name__, _MODULES, globals())

__all__ = list(_MODULES)
