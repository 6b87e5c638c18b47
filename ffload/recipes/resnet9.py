"""The ResNet-9 of the KakaoBrain / FFCV lineage for 32x32 images (CIFAR-10).

Architecture as in FFCV's ``examples/cifar/train_cifar.py`` (itself taken from KakaoBrain's
torchskeleton): ``conv_bn(3, 64)``, ``conv_bn(64, 128, k=5, s=2, p=2)``,
``Residual(conv_bn(128, 128), conv_bn(128, 128))``, ``conv_bn(128, 256)``, ``MaxPool2d(2)``,
``Residual(conv_bn(256, 256), conv_bn(256, 256))``, ``conv_bn(256, 128, p=0)``,
``AdaptiveMaxPool2d(1)``, ``Flatten``, ``Linear(128, classes, bias=False)``, ``Mul(0.2)``.
At ``width=1`` it has 2,274,880 trainable parameters. (David Page's "ResNet-9" of the DAWNBench
line differs: 64-128-256-512 channels, max-pool after convs, ~6.5M parameters.)
"""

from __future__ import annotations

import torch
from torch import nn

from ffload.errors import ConfigurationError

__all__ = ["resnet9", "Mul", "Residual", "conv_bn"]


class Mul(nn.Module):
    """Multiplies its input by a constant ``weight`` (FFCV/KakaoBrain's output scaling)."""

    def __init__(self, weight: float):
        super().__init__()
        self.weight = weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Returns ``x * weight``, same shape and dtype as ``x``."""
        return x * self.weight


class Residual(nn.Module):
    """``x + module(x)``; ``module`` must keep the shape ``(B, C, H, W)``."""

    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Returns ``x + module(x)``, shape ``(B, C, H, W)``."""
        return x + self.module(x)


def conv_bn(
    channels_in: int, channels_out: int, kernel_size: int = 3, stride: int = 1, padding: int = 1
) -> nn.Sequential:
    """``Conv2d(bias=False) -> BatchNorm2d -> ReLU`` as in FFCV's CIFAR example.

    Parameters: ``channels_in * channels_out * kernel_size**2`` (conv) ``+ 2 * channels_out``
    (BatchNorm affine weight and bias).
    """
    return nn.Sequential(
        nn.Conv2d(channels_in, channels_out, kernel_size=kernel_size, stride=stride, padding=padding, bias=False),
        nn.BatchNorm2d(channels_out),
        nn.ReLU(inplace=True),
    )


def resnet9(num_classes: int = 10, width: float = 1.0) -> nn.Sequential:
    """ResNet-9 (FFCV lineage) with a channel multiplier, as an ``nn.Sequential`` whose
    ``state_dict`` keys match FFCV's example model (``0.0.weight``, ...) at ``width=1``.

    Args:
        num_classes: number of output logits.
        width: channel multiplier; stage widths are ``round(64*width)``, ``round(128*width)``,
            ``round(256*width)`` (at least 1 each). ``width=1`` is the published model.

    Input ``(B, 3, H, W)`` float (any memory format; ``H, W >= 8``, 32 for CIFAR), output
    ``(B, num_classes)`` logits in the input's dtype (or the autocast dtype).

    Raises:
        ffload.errors.ConfigurationError: ``width <= 0`` or ``num_classes < 1``.
    """
    if not width > 0:
        raise ConfigurationError(f"resnet9 width must be > 0, got {width}")
    if num_classes < 1:
        raise ConfigurationError(f"resnet9 num_classes must be >= 1, got {num_classes}")
    c1, c2, c3 = (max(1, round(c * width)) for c in (64, 128, 256))
    return nn.Sequential(
        conv_bn(3, c1, kernel_size=3, stride=1, padding=1),
        conv_bn(c1, c2, kernel_size=5, stride=2, padding=2),
        Residual(nn.Sequential(conv_bn(c2, c2), conv_bn(c2, c2))),
        conv_bn(c2, c3, kernel_size=3, stride=1, padding=1),
        nn.MaxPool2d(2),
        Residual(nn.Sequential(conv_bn(c3, c3), conv_bn(c3, c3))),
        conv_bn(c3, c2, kernel_size=3, stride=1, padding=0),
        nn.AdaptiveMaxPool2d((1, 1)),
        nn.Flatten(),
        nn.Linear(c2, num_classes, bias=False),
        Mul(0.2),
    )
