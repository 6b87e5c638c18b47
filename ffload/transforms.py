"""Transforms, the stages of a field's pipeline after its decoder (FFCV's ``ffcv.transforms``): compiled
per-sample augmentations seeded per (epoch, sample), the torch conversions, user Python callables, and the
detection targets that follow their image's geometry (``TransformBoxes``, ``FollowBoxes``), and
``from_torchvision`` / ``from_albumentations``: a user's ``Compose`` compiled into these stages.

``from ffload.transforms import RandomHorizontalFlip, ToTensor`` imports the defining module under
``ffload.loaders.transforms`` (or ``ffload.loaders.decoders.targets``) on first use (numba, torch). This map
is the one list of the public transforms; ``ffload.loaders`` and ``ffload.loaders.transforms`` reuse it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ffload.lazy import lazy_getattr

if TYPE_CHECKING:
    from ffload.loaders.decoders.targets import FollowBoxes as FollowBoxes
    from ffload.loaders.decoders.targets import TransformBoxes as TransformBoxes
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
    **dict.fromkeys(["RandomHorizontalFlip", "RandomVerticalFlip"], "ffload.loaders.transforms.flip"),
    **dict.fromkeys(["RandomTranslate", "RandomCrop"], "ffload.loaders.transforms.crop"),
    **dict.fromkeys(["Cutout", "RandomErasing"], "ffload.loaders.transforms.erase"),
    **dict.fromkeys(["RandomGrayscale", "ColorJitter", "GaussianBlur"], "ffload.loaders.transforms.color"),
    **dict.fromkeys(["RandomAffine", "RandomRotation", "RandomPerspective"], "ffload.loaders.transforms.warp"),
    "NormalizeImage": "ffload.loaders.transforms.normalize",
    **dict.fromkeys(
        ["ToTensor", "ToTorchImage", "Convert", "ToDevice", "Squeeze"], "ffload.loaders.transforms.torch_ops"
    ),
    "PythonTransform": "ffload.loaders.transforms.python",
    **dict.fromkeys(
        ["from_torchvision", "from_albumentations", "CompiledTransforms"], "ffload.loaders.transforms.compose"
    ),
    **dict.fromkeys(["TransformBoxes", "FollowBoxes"], "ffload.loaders.decoders.targets"),
}

__getattr__ = lazy_getattr(__name__, _MODULES, globals())

__all__ = list(_MODULES)
