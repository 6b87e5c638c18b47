"""Loading: ``Loader``, traversal orders, and the operations of field pipelines (FFCV's names).

``from ffload.loaders import Loader, OrderOption, SimpleRGBImageDecoder, ToTensor, ...`` (each name is
imported from its submodule on first use). The decoders and transforms are the lists of the public
namespaces :mod:`ffload.decoders` and :mod:`ffload.transforms` (FFCV's ``ffcv.fields.decoders`` /
``ffcv.transforms``), reused here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ffload.decoders import _MODULES as _DECODERS
from ffload.lazy import lazy_getattr
from ffload.transforms import _MODULES as _TRANSFORMS

if TYPE_CHECKING:
    from ffload.errors import LoaderError as LoaderError
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
    from ffload.loaders.iterator import EpochIterator as EpochIterator
    from ffload.loaders.loader import Loader as Loader
    from ffload.loaders.orders import OrderOption as OrderOption
    from ffload.loaders.pipeline.operation import BatchContext as BatchContext
    from ffload.loaders.pipeline.operation import Operation as Operation
    from ffload.loaders.pipeline.operation import Spec as Spec
    from ffload.loaders.transforms.color import ColorJitter as ColorJitter
    from ffload.loaders.transforms.color import GaussianBlur as GaussianBlur
    from ffload.loaders.transforms.color import RandomGrayscale as RandomGrayscale
    from ffload.loaders.transforms.compose import CompiledTransforms as CompiledTransforms
    from ffload.loaders.transforms.compose import from_albumentations as from_albumentations
    from ffload.loaders.transforms.compose import from_torchvision as from_torchvision
    from ffload.loaders.transforms.crop import RandomCrop as RandomCrop
    from ffload.loaders.transforms.crop import RandomTranslate as RandomTranslate
    from ffload.loaders.transforms.erase import Cutout as Cutout
    from ffload.loaders.transforms.erase import RandomErasing as RandomErasing
    from ffload.loaders.transforms.flip import RandomHorizontalFlip as RandomHorizontalFlip
    from ffload.loaders.transforms.flip import RandomVerticalFlip as RandomVerticalFlip
    from ffload.loaders.transforms.normalize import NormalizeImage as NormalizeImage
    from ffload.loaders.transforms.python import PythonTransform as PythonTransform
    from ffload.loaders.transforms.torch_ops import Convert as Convert
    from ffload.loaders.transforms.torch_ops import Squeeze as Squeeze
    from ffload.loaders.transforms.torch_ops import ToDevice as ToDevice
    from ffload.loaders.transforms.torch_ops import ToTensor as ToTensor
    from ffload.loaders.transforms.torch_ops import ToTorchImage as ToTorchImage
    from ffload.loaders.transforms.warp import RandomAffine as RandomAffine
    from ffload.loaders.transforms.warp import RandomPerspective as RandomPerspective
    from ffload.loaders.transforms.warp import RandomRotation as RandomRotation

_MODULES = {  # public name -> the module defining it; imported on first use (torch, numba)
    "Loader": "ffload.loaders.loader",
    "OrderOption": "ffload.loaders.orders",
    "EpochIterator": "ffload.loaders.iterator",
    "LoaderError": "ffload.errors",
    **dict.fromkeys(["BatchContext", "Operation", "Spec"], "ffload.loaders.pipeline.operation"),
    **_DECODERS,  # ffload.decoders: the one list of decoders
    **_TRANSFORMS,  # ffload.transforms: the one list of transforms
}

__getattr__ = lazy_getattr(__name__, _MODULES, globals())

__all__ = list(_MODULES)
