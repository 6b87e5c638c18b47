"""Transforms that paint a random rectangle with ``fill`` and move nothing (``keeps_geometry``),
in place: :class:`Cutout` (FFCV's square) and :class:`RandomErasing` (torchvision's rectangle
of random area and aspect ratio). ``RandomErasing`` also takes a torch batch (after ``ToTensor``, any
device): the same ``params(seeds, H, W)`` paint it with one ``torch.where``
(:func:`~ffload.loaders.transforms.batch_torch.erase`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from numba import njit

from ffload.errors import ConfigurationError
from ffload.loaders.rng import randint, seed_state, uniform, uniform_range
from ffload.loaders.transforms import batch_torch
from ffload.loaders.transforms.base import FilledTransform, bits, range_pair


@njit(nogil=True, cache=True)
def _cutout(images, seeds, salt, size, fill):
    batch, height, width, channels = images.shape
    for b in range(batch):
        state = seed_state(seeds[b], salt)
        y0, state = randint(state, max(height - size + 1, 1))
        x0, state = randint(state, max(width - size + 1, 1))
        for r in range(y0, min(y0 + size, height)):
            for c in range(x0, min(x0 + size, width)):
                for ch in range(channels):
                    images[b, r, c, ch] = fill[ch]


class Cutout(FilledTransform):
    """Fill a random square of each image with ``fill``, in place (FFCV's ``Cutout``).

    Cutout is DeVries & Taylor 2017, https://arxiv.org/abs/1708.04552; the placement is FFCV
    1.0.2's.

    The square has side ``crop_size``; its top-left corner ``(y0, x0)`` is uniform over the
    positions that keep it inside the image (``y0`` in ``0..H - crop_size``, drawn first, then
    ``x0``), as FFCV's ``Cutout`` draws it, so it always covers ``crop_size**2`` pixels (clipped
    only when ``crop_size`` exceeds the image). The paper centres it on a uniform pixel instead.

    Args:
        crop_size: pixels, >= 1.
        fill: per-channel colour (``C`` values representable in the image dtype).

    Raises:
        ConfigurationError: crop_size < 1, bad fill.
        PipelineError: (building the pipeline) input not numpy (H, W, C).
    """

    keeps_geometry = True  # it paints, it moves nothing

    def __init__(self, crop_size: int, fill: Sequence[float] = (0, 0, 0)):
        if int(crop_size) < 1:
            raise ConfigurationError(f"crop_size must be >= 1, got {crop_size}")
        self.crop_size = int(crop_size)
        self.fill = tuple(fill)

    def __call__(self, src, dst, ctx):
        _cutout(bits(src), ctx.seeds, self.salt, self.crop_size, self.fill_bits)
        return src


@njit(nogil=True, cache=True)
def _erasing_params(seeds, salt, height, width, prob, scale, log_ratio, out):
    # out[b] = (top, left, h, w); h = 0 when the sample is not erased
    area = height * width
    for b in range(seeds.shape[0]):
        state = seed_state(seeds[b], salt)
        out[b, :] = 0
        u, state = uniform(state)
        if u >= prob:
            continue
        for _ in range(10):  # torchvision's 10 attempts
            s, state = uniform_range(state, scale[0], scale[1])
            r, state = uniform_range(state, log_ratio[0], log_ratio[1])
            aspect = math.exp(r)
            h = int(np.round(math.sqrt(area * s * aspect)))
            w = int(np.round(math.sqrt(area * s / aspect)))
            if h < height and w < width:
                top, state = randint(state, height - h + 1)
                left, state = randint(state, width - w + 1)
                out[b, 0], out[b, 1], out[b, 2], out[b, 3] = top, left, h, w
                break


@njit(nogil=True, cache=True)
def _erase(images, boxes, fill):
    for b in range(images.shape[0]):
        top, left, h, w = boxes[b, 0], boxes[b, 1], boxes[b, 2], boxes[b, 3]
        for y in range(top, top + h):
            for x in range(left, left + w):
                for c in range(images.shape[3]):
                    images[b, y, x, c] = fill[c]


class RandomErasing(FilledTransform):
    """Erase a random rectangle of images at random, in place (torchvision's ``RandomErasing``).

    Each image is erased with probability ``p`` (Zhong et al. 2017,
    https://arxiv.org/abs/1708.04896).

    Per erased sample: up to 10 attempts draw an area fraction in ``scale`` and a log-uniform
    aspect ratio in ``ratio``; ``h = round(sqrt(area * ratio))``, ``w = round(sqrt(area / ratio))``;
    the first box that fits strictly inside is placed uniformly and painted with ``fill``; if none
    fits the sample is left as it is.

    ``params(seeds, height, width)``: ``(B, 4) int64`` ``(top, left, h, w)``, ``h = 0`` when not
    erased.

    Images are ``(H, W, C)`` of any dtype: numpy (in place), or a torch batch after ``ToTensor``
    (``(B, H, W, C)``, or ``(B, C, H, W)`` after ``ToTorchImage``, any device; a new tensor is returned).

    Args:
        p: probability that a sample is erased, in [0, 1].
        scale: ``(min, max)`` area of the box as a fraction of the image's.
        ratio: ``(min, max)`` aspect ratio (width / height) of the box, drawn log-uniform.
        fill: per-channel value painted into the box, in the image's units.

    Raises:
        ConfigurationError: ``p`` outside [0, 1], bad ranges or fill.
        PipelineError: (building the pipeline) input not an (H, W, C) image (numpy or torch).
    """

    keeps_geometry = True
    torch_impl = True

    def __init__(
        self,
        p: float = 0.5,
        scale: Sequence[float] = (0.02, 0.33),
        ratio: Sequence[float] = (0.3, 3.3),
        fill: Sequence[float] = (0, 0, 0),
    ):
        if not 0.0 <= p <= 1.0:
            raise ConfigurationError(f"p must be in [0, 1], got {p}")
        self.p = float(p)
        self.scale = np.array(range_pair(scale, "scale"), dtype=np.float64)
        lo, hi = range_pair(ratio, "ratio")
        if not 0 <= self.scale[0] <= self.scale[1] <= 1 or lo <= 0:
            raise ConfigurationError(f"scale must lie in [0, 1] and ratio be > 0, got {scale}, {ratio}")
        self.log_ratio = np.log(np.array([lo, hi], dtype=np.float64))
        self.fill = tuple(fill)

    def params(self, seeds: np.ndarray, height: int, width: int) -> np.ndarray:
        """``(B, 4) int64`` erased boxes for images of ``height x width`` pixels."""
        out = np.empty((len(seeds), 4), dtype=np.int64)
        _erasing_params(
            np.asarray(seeds, dtype=np.uint64), self.salt, height, width, self.p, self.scale, self.log_ratio, out
        )
        return out

    def __call__(self, src, dst, ctx):
        if self.on_torch:
            x = batch_torch.to_nhwc(src, self.channels_first)
            boxes = self.params(ctx.seeds, x.shape[1], x.shape[2])
            return batch_torch.from_nhwc(batch_torch.erase(x, boxes, self.fill_bits), self.channels_first)
        _erase(bits(src), self.params(ctx.seeds, src.shape[1], src.shape[2]), self.fill_bits)
        return src
