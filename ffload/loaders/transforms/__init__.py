"""Transforms: compiled per-sample augmentations seeded per (epoch, sample), the torch conversions, and user Python callables.

    base        the shared bases (NHWCTransform, FilledTransform), the pixel view ``bits``, ``range_pair``
    batch_torch the torch implementations of flips, erasing, grayscale, jitter and warps on whole tensor batches
    flip        RandomHorizontalFlip, RandomVerticalFlip
    crop        RandomTranslate, RandomCrop: the image moved inside a window padded with ``fill``
    erase       Cutout, RandomErasing: a random rectangle painted with ``fill``
    color       RandomGrayscale, ColorJitter, GaussianBlur: pixel values change, geometry kept
    warp        RandomAffine, RandomRotation, RandomPerspective: bilinear warps (one shared kernel)
    normalize   NormalizeImage: (x - mean) / std fused with the integer -> float conversion
    torch_ops   ToTensor, ToTorchImage, Convert, ToDevice, Squeeze: the torch stage
    python      PythonTransform: a user's Python callable per sample
    compose     from_torchvision, from_albumentations: a user's Compose compiled into these stages

``from ffload.loaders.transforms import ColorJitter`` imports the defining module on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ffload.lazy import lazy_getattr
from ffload.transforms import _MODULES as _TRANSFORMS

if TYPE_CHECKING:
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

# public name -> the module defining it: the names of ffload.transforms defined here
_MODULES = {name: module for name, module in _TRANSFORMS.items() if module.startswith(f"{__name__}.")}

__getattr__ = lazy_getattr(__name__, _MODULES, globals())

__all__ = list(_MODULES)
