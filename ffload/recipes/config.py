"""The ResNet-9 recipe's hyperparameters, apart from the training code so that the command line
(:mod:`ffload.recipes.cifar10_resnet9`) states their defaults without importing torch."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RecipeConfig"]


@dataclass
class RecipeConfig:
    """Hyperparameters (FFCV's CIFAR example, see :mod:`ffload.recipes.cifar10_resnet9`).

    Attributes:
        epochs: passes over the training set.
        batch_size: images per step (the last partial training batch is dropped).
        lr: peak learning rate at batch size 512; the peak used is ``lr * batch_size / 512``.
        lr_peak_epoch: epoch of the triangle's peak for runs of >= 24 epochs (scaled by
            ``epochs / 24`` for shorter runs, see :func:`lr_schedule`).
        momentum, nesterov, weight_decay: SGD's.
        label_smoothing: of the cross-entropy loss.
        width: ResNet-9 channel multiplier (1 = the published model).
        seed: model initialisation, loader order and augmentation seed.
        tta: average the logits of each test image and its horizontal mirror.
    """

    epochs: int = 24
    batch_size: int = 512
    lr: float = 0.5
    lr_peak_epoch: float = 5.0
    momentum: float = 0.9
    nesterov: bool = False
    weight_decay: float = 5e-4
    label_smoothing: float = 0.1
    width: float = 1.0
    seed: int = 0
    tta: bool = True
