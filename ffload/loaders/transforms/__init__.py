"""Transforms: compiled per-sample augmentations seeded per (epoch, sample), the torch conversions, and user Python callables.

    base        the shared bases (NHWCTransform, FilledTransform), the pixel view ``bits``, ``range_pair``
    flip        RandomHorizontalFlip, RandomVerticalFlip
    crop        RandomTranslate, RandomCrop: the image moved inside a window padded with ``fill``
    erase       Cutout, RandomErasing: a random rectangle painted with ``fill``
    color       RandomGrayscale, ColorJitter, GaussianBlur: pixel values change, geometry kept
    warp        RandomAffine, RandomRotation, RandomPerspective: bilinear warps (one shared kernel)
    normalize   NormalizeImage: (x - mean) / std fused with the integer -> float conversion
    torch_ops   ToTensor, ToTorchImage, Convert, ToDevice, Squeeze: the torch stage
    python      PythonTransform: a user's Python callable per sample

``from ffload.loaders.transforms import ColorJitter`` imports the defining module on first use.
"""
from __future__ import annotations

from ffload.lazy import lazy_getattr

_MODULES = {  # public name -> the submodule defining it; imported on first use (torch, numba)
    **dict.fromkeys(["RandomHorizontalFlip", "RandomVerticalFlip"], "flip"),
    **dict.fromkeys(["RandomTranslate", "RandomCrop"], "crop"),
    **dict.fromkeys(["Cutout", "RandomErasing"], "erase"),
    **dict.fromkeys(["RandomGrayscale", "ColorJitter", "GaussianBlur"], "color"),
    **dict.fromkeys(["RandomAffine", "RandomRotation", "RandomPerspective"], "warp"),
    "NormalizeImage": "normalize",
    **dict.fromkeys(["ToTensor", "ToTorchImage", "Convert", "ToDevice", "Squeeze"], "torch_ops"),
    "PythonTransform": "python",
}

__getattr__ = lazy_getattr(__name__, _MODULES, globals())

__all__ = list(_MODULES)
