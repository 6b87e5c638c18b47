"""Loading: ``Loader``, traversal orders, and the operations of field pipelines (FFCV's names).

``from ffload.loaders import Loader, OrderOption, SimpleRGBImageDecoder, ToTensor, ...`` (each name is
imported from its submodule on first use).
"""
from __future__ import annotations

from ffload.lazy import lazy_getattr

_MODULES = {  # public name -> the submodule defining it; imported on first use (torch, numba)
    **dict.fromkeys(["RandomHorizontalFlip", "RandomVerticalFlip"], "transforms.flip"),
    **dict.fromkeys(["RandomCrop", "RandomTranslate"], "transforms.crop"),
    **dict.fromkeys(["Cutout", "RandomErasing"], "transforms.erase"),
    **dict.fromkeys(["ColorJitter", "GaussianBlur", "RandomGrayscale"], "transforms.color"),
    **dict.fromkeys(["RandomAffine", "RandomPerspective", "RandomRotation"], "transforms.warp"),
    "NormalizeImage": "transforms.normalize",
    **dict.fromkeys(["BytesDecoder", "FloatDecoder", "IntDecoder", "NDArrayDecoder", "RaggedArrayDecoder",
                     "RaggedLengthDecoder"], "decoders.basics"),
    **dict.fromkeys(["CenterCropRGBImageDecoder", "RandomResizedCropRGBImageDecoder", "ResizeRGBImageDecoder",
                     "SimpleRGBImageDecoder"], "decoders.rgb"),
    **dict.fromkeys(["CenterCropImageArrayDecoder", "ImageArrayDecoder", "RandomCropImageArrayDecoder"],
                    "decoders.image_array"),
    **dict.fromkeys(["EpochIterator", "LoaderError"], "iterator"),
    "Loader": "loader",
    **dict.fromkeys(["BatchContext", "Operation", "Spec"], "pipeline.operation"),
    "OrderOption": "orders",
    **dict.fromkeys(["Convert", "Squeeze", "ToDevice", "ToTensor", "ToTorchImage"], "transforms.torch_ops"),
    "PythonTransform": "transforms.python",
    **dict.fromkeys(["BoxCountDecoder", "FollowBoxes", "MaskDecoder", "TransformBoxes"], "decoders.targets"),
}


__getattr__ = lazy_getattr(__name__, _MODULES, globals())

__all__ = list(_MODULES)
