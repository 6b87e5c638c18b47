"""Random flips, in place: :class:`RandomHorizontalFlip` (FFCV's and torchvision's) and
:class:`RandomVerticalFlip` (torchvision's). Sample b flips when ``uniform(seed_state(seeds[b],
salt)) < flip_prob``; each flip also toggles the sample's recorded geometry, so boxes and masks
follow it (:mod:`ffload.loaders.pipeline.geometry`). On a torch batch (after ``ToTensor``, any device)
the same draws (``params(seeds)``) flip the batch with one ``torch.where``
(:func:`~ffload.loaders.transforms.batch_torch.flip`).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ffload.errors import ConfigurationError
from ffload.loaders.decoders.base import flat_view
from ffload.loaders.decoders.rgb import flip_draws
from ffload.loaders.rng import seed_state, uniform
from ffload.loaders.transforms import batch_torch
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
    torch_axis = 2  # the axis of a (B, H, W, C) batch it reverses
    torch_impl = True

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
        geometry.flip(self.axis, self.params(ctx.seeds))

    def params(self, seeds: np.ndarray) -> np.ndarray:
        """``(B,) bool``: the samples that flip, for ``(B,) uint64`` seeds."""
        flips = np.empty(len(seeds), np.bool_)
        flip_draws(np.asarray(seeds, dtype=np.uint64), self.salt, self.flip_prob, flips)
        return flips

    def _torch_call(self, src, ctx):
        x = batch_torch.to_nhwc(src, self.channels_first)
        return batch_torch.from_nhwc(batch_torch.flip(x, self.params(ctx.seeds), self.torch_axis), self.channels_first)


class RandomHorizontalFlip(_RandomFlip):
    """Flip images left-right at random, in place (FFCV's / torchvision's ``RandomHorizontalFlip``).

    Images are ``(H, W, C)``, any dtype (numpy, or a torch batch after ``ToTensor``, NHWC or NCHW,
    any device: then a new tensor is returned); each flips with probability ``flip_prob``.

    Sample b flips when ``uniform(seed_state(seeds[b], salt)) < flip_prob``. Directly after an
    RGB image decoder, the decoder mirrors the samples while writing them and this stage does
    nothing (:attr:`fused`; the hook is described in :class:`~ffload.loaders.pipeline.operation.Operation`).
    ``params(seeds)``: ``(B,) bool``, the samples that flip.

    Args:
        flip_prob: probability that a sample flips, in [0, 1].

    Raises:
        ConfigurationError: ``flip_prob`` outside [0, 1].
        PipelineError: (building the pipeline) input not an (H, W, C) image (numpy or torch).
    """

    fused = False

    def fusable_flip(self):
        return self.flip_prob, self.salt

    def __call__(self, src, dst, ctx):
        if self.fused:  # the decoder before it has flipped the samples
            return src
        if self.on_torch:
            return self._torch_call(src, ctx)
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

    Images are ``(H, W, C)``, any dtype (numpy, or a torch batch as for :class:`RandomHorizontalFlip`);
    each flips with probability ``flip_prob``. Sample b flips when ``uniform(seed_state(seeds[b],
    salt)) < flip_prob``. ``params(seeds)``: ``(B,) bool``, the samples that flip.

    Args:
        flip_prob: probability that a sample flips, in [0, 1].

    Raises:
        ConfigurationError: ``flip_prob`` outside [0, 1].
        PipelineError: (building the pipeline) input not an (H, W, C) image (numpy or torch).
    """

    axis = "vflip"
    torch_axis = 1

    def __call__(self, src, dst, ctx):
        if self.on_torch:
            return self._torch_call(src, ctx)
        _vflip(src, ctx.seeds, self.salt, self.flip_prob)
        return src
