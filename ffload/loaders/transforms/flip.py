"""Random flips, in place: :class:`RandomHorizontalFlip` (FFCV's and torchvision's) and
:class:`RandomVerticalFlip` (torchvision's). Sample b flips when ``uniform(seed_state(seeds[b],
salt)) < flip_prob``; each flip also toggles the sample's recorded geometry, so boxes and masks
follow it (:mod:`ffload.loaders.pipeline.geometry`).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ffload.errors import ConfigurationError
from ffload.loaders.decoders.base import flat_view
from ffload.loaders.decoders.rgb import flip_draws
from ffload.loaders.rng import seed_state, uniform
from ffload.loaders.transforms.base import NHWCTransform, bits


@njit(nogil=True, cache=True)
def _flip(flat, batch, height, width, channels, seeds, salt, prob):
    # flat: (B * H * W * C,) elements; each flipped row is copied aside, then written back pixel
    # by pixel from its end (unsigned offsets keep the loops free of index checks; a constant
    # channel count for RGB lets LLVM unroll the pixel)
    row = width * channels
    line = np.empty(row, flat.dtype)
    c_n, u1, u2, u3 = np.uint64(channels), np.uint64(1), np.uint64(2), np.uint64(3)
    for b in range(batch):
        u, _ = uniform(seed_state(seeds[b], salt))
        if u < prob:
            for r in range(height):
                left = np.uint64((b * height + r) * row)
                for k in range(np.uint64(row)):
                    line[k] = flat[left + k]
                if channels == 3:
                    last = left + np.uint64(row) - u3
                    for x in range(np.uint64(width)):
                        k, j = last - u3 * x, u3 * x
                        flat[k], flat[k + u1], flat[k + u2] = line[j], line[j + u1], line[j + u2]
                else:
                    last = left + np.uint64(row) - c_n
                    for x in range(np.uint64(width)):
                        for c in range(c_n):
                            flat[last - c_n * x + c] = line[c_n * x + c]


class _RandomFlip(NHWCTransform):
    """Base of the random flips: sample b flips when ``uniform(seed_state(seeds[b], salt)) <
    flip_prob``. Raises ConfigurationError for ``flip_prob`` outside [0, 1]."""

    axis = "hflip"  # the Geometry attribute it toggles

    def __init__(self, flip_prob: float = 0.5):
        if not 0.0 <= flip_prob <= 1.0:
            raise ConfigurationError(f"flip_prob must be in [0, 1], got {flip_prob}")
        self.flip_prob = float(flip_prob)

    def record_geometry(self, geometry, ctx):
        """Toggle ``geometry.hflip`` (``vflip`` for the vertical flip) of the samples this stage
        flips (the same draws as its ``__call__``); a flip fused into the decoder is already in
        the decoder's geometry."""
        if getattr(self, "fused", False):
            return
        flips = np.empty(len(ctx.indices), np.bool_)
        flip_draws(ctx.seeds, self.salt, self.flip_prob, flips)
        geometry.flip(self.axis, flips)


class RandomHorizontalFlip(_RandomFlip):
    """Flip images left-right at random, in place (FFCV's / torchvision's ``RandomHorizontalFlip``).

    Images are ``(H, W, C)``; each flips with probability ``flip_prob``.

    Sample b flips when ``uniform(seed_state(seeds[b], salt)) < flip_prob``. Directly after an
    RGB image decoder, the decoder mirrors the samples while writing them and this stage does
    nothing (:attr:`fused`; the hook is described in :class:`~ffload.loaders.pipeline.operation.Operation`).

    Args:
        flip_prob: probability that a sample flips, in [0, 1].

    Raises:
        ConfigurationError: ``flip_prob`` outside [0, 1].
        PipelineError: (building the pipeline) input not numpy (H, W, C).
    """

    fused = False

    def fusable_flip(self):
        return self.flip_prob, self.salt

    def __call__(self, src, dst, ctx):
        if not self.fused:  # fused: the decoder before it has flipped the samples
            _flip(flat_view(bits(src)), *src.shape, ctx.seeds, self.salt, self.flip_prob)
        return src


@njit(nogil=True, cache=True)
def _swap_rows(flat, batch, height, row, seeds, salt, prob):
    # flat: (B * H * row,) words; the drawn samples' rows swap in place (unsigned offsets keep
    # the loop free of index checks)
    n = np.uint64(row)
    for b in range(batch):
        u, _ = uniform(seed_state(seeds[b], salt))
        if u < prob:
            for r in range(height // 2):
                top = np.uint64((b * height + r) * row)
                bottom = np.uint64((b * height + height - 1 - r) * row)
                for k in range(n):
                    v = flat[top + k]
                    flat[top + k] = flat[bottom + k]
                    flat[bottom + k] = v


def _vflip(images: np.ndarray, seeds, salt, prob) -> None:
    """Flip the drawn samples of ``(B, H, W, C)`` C-contiguous ``images`` upside down, in place,
    swapping 8-byte words when a row's size allows."""
    flat = flat_view(images).view(np.uint8)
    row = images.shape[2] * images.shape[3] * images.itemsize
    if row % 8 == 0:
        flat, row = flat.view(np.uint64), row // 8
    _swap_rows(flat, images.shape[0], images.shape[1], row, seeds, salt, prob)


class RandomVerticalFlip(_RandomFlip):
    """Flip images upside down at random, in place (torchvision's ``RandomVerticalFlip``).

    Images are ``(H, W, C)``; each flips with probability ``flip_prob``. Sample b flips when ``uniform(seed_state(seeds[b],
    salt)) < flip_prob``.

    Args:
        flip_prob: probability that a sample flips, in [0, 1].

    Raises:
        ConfigurationError: ``flip_prob`` outside [0, 1].
        PipelineError: (building the pipeline) input not numpy (H, W, C).
    """

    axis = "vflip"

    def __call__(self, src, dst, ctx):
        _vflip(src, ctx.seeds, self.salt, self.flip_prob)
        return src
