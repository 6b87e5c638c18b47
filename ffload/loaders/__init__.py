"""Loading: ``Loader``, traversal orders, and the operations of field pipelines (FFCV's names).

``from ffload.loaders import Loader, OrderOption, SimpleRGBImageDecoder, ToTensor, ...``
"""
from .decoders import (BytesDecoder, CenterCropRGBImageDecoder, FloatDecoder, IntDecoder,
                       NDArrayDecoder, RandomResizedCropRGBImageDecoder, SimpleRGBImageDecoder)
from .iterator import EpochIterator, LoaderError
from .loader import Loader
from .operation import BatchContext, Operation, Spec
from .orders import OrderOption
from .torch_ops import Convert, Squeeze, ToDevice, ToTensor, ToTorchImage
from .transforms import Cutout, NormalizeImage, RandomHorizontalFlip, RandomTranslate

__all__ = ["Loader", "OrderOption", "LoaderError", "EpochIterator", "Operation", "Spec",
           "BatchContext", "SimpleRGBImageDecoder", "CenterCropRGBImageDecoder",
           "RandomResizedCropRGBImageDecoder", "IntDecoder", "FloatDecoder", "NDArrayDecoder",
           "BytesDecoder", "RandomHorizontalFlip", "RandomTranslate", "Cutout", "NormalizeImage",
           "ToTensor", "ToTorchImage", "Convert", "ToDevice", "Squeeze"]
