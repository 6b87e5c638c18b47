"""Where the decoders' crop boxes are drawn: RandomResizedCrop's random box, the centre crop, and
the window of the ImageArrayField crops, each a compiled kernel (or kernel helper) per batch.

Looking for "where is RandomResizedCrop's box drawn"? :func:`random_resized_crop_boxes`
(torchvision's ``RandomResizedCrop.get_params`` rule, one draw stream per sample from
``seed_state(seed, salt)``). :func:`center_crop_boxes` is FFCV's centre crop; :func:`crop_window`
places the fixed-size window of ``CenterCropImageArrayDecoder`` / ``RandomCropImageArrayDecoder``
(torchvision's ``CenterCrop`` / ``RandomCrop.get_params``). The decoders that use them are in
:mod:`ffload.loaders.decoders.rgb` and :mod:`ffload.loaders.decoders.image_array`.

Boxes are ``(B, 4) int64`` rows ``(top, left, height, width)`` in pixels of the stored image
(torchvision's ``(i, j, h, w)``), always inside the image and at least 1 x 1.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from ffload.loaders.rng import randint, seed_state, uniform_range


@njit(nogil=True, cache=True)
def random_resized_crop_boxes(indices, heights, widths, seeds, salt, scale_lo, scale_hi, ratio_lo, ratio_hi, out):
    """Random crop boxes with torchvision's ``RandomResizedCrop.get_params`` rule.

    Per sample: up to 10 attempts of an area fraction uniform in ``[scale_lo, scale_hi)`` and an
    aspect ratio (w / h) log-uniform in ``[ratio_lo, ratio_hi)``, ``w = int(round(sqrt(area *
    ratio)))``, ``h = int(round(sqrt(area / ratio)))``; the first box that fits gets a uniform
    position. If none fits: the central crop of the whole image, clamped to the ratio range.

    Args:
        indices: ``(B,) int64`` sample ids; heights/widths: ``(N,)`` image sizes (pixels).
        seeds: ``(B,) uint64`` per-sample seeds; salt: ``uint64`` the operation's salt.
        scale_lo, scale_hi, ratio_lo, ratio_hi: floats, ``0 < lo <= hi``.
        out: ``(B, 4) int64``, filled with ``(top, left, height, width)``.
    """
    log_lo = math.log(ratio_lo)
    log_hi = math.log(ratio_hi)
    for b in range(indices.shape[0]):
        s = indices[b]
        height = np.int64(heights[s])
        width = np.int64(widths[s])
        area = np.float64(height * width)
        state = seed_state(seeds[b], salt)
        found = False
        for _ in range(10):
            frac, state = uniform_range(state, scale_lo, scale_hi)
            log_r, state = uniform_range(state, log_lo, log_hi)
            target = area * frac
            aspect = math.exp(log_r)
            w = np.int64(round(math.sqrt(target * aspect)))
            h = np.int64(round(math.sqrt(target / aspect)))
            if 0 < w <= width and 0 < h <= height:
                top, state = randint(state, height - h + 1)
                left, state = randint(state, width - w + 1)
                out[b, 0] = top
                out[b, 1] = left
                out[b, 2] = h
                out[b, 3] = w
                found = True
                break
        if not found:
            in_ratio = width / height
            if in_ratio < ratio_lo:
                w = width
                h = min(height, max(np.int64(1), np.int64(round(w / ratio_lo))))
            elif in_ratio > ratio_hi:
                h = height
                w = min(width, max(np.int64(1), np.int64(round(h * ratio_hi))))
            else:
                w = width
                h = height
            out[b, 0] = (height - h) // 2
            out[b, 1] = (width - w) // 2
            out[b, 2] = h
            out[b, 3] = w


@njit(nogil=True, cache=True)
def center_crop_boxes(indices, heights, widths, ratio, out):
    """Centred square boxes of side ``int(ratio * min(H, W))`` (at least 1), FFCV's
    ``get_center_crop``. Args as :func:`random_resized_crop_boxes`; ``ratio`` a float in (0, 1]."""
    for b in range(indices.shape[0]):
        s = indices[b]
        height = np.int64(heights[s])
        width = np.int64(widths[s])
        side = max(np.int64(1), np.int64(ratio * min(height, width)))
        out[b, 0] = (height - side) // 2
        out[b, 1] = (width - side) // 2
        out[b, 2] = side
        out[b, 3] = side


@njit(nogil=True, cache=True)
def crop_window(height, width, out_h, out_w, seed, salt, random):
    """The ``(top, left)`` (``int64`` each) of an ``out_h x out_w`` window of a ``height x width``
    image (``out_h <= height``, ``out_w <= width``; compiled, call it from kernels).

    Centred with torchvision's ``CenterCrop`` offsets, ``round((height - out_h) / 2)`` with halves
    to even (likewise ``left``), or, with ``random``, ``(top, left)`` uniform in
    ``{0..height - out_h} x {0..width - out_w}`` drawn in that order from ``seed_state(seed, salt)``
    (torchvision's ``RandomCrop.get_params``); ``seed``, ``salt``: ``uint64``.
    """
    if random:
        state = seed_state(seed, salt)
        top, state = randint(state, height - out_h + 1)
        left, state = randint(state, width - out_w + 1)
        return top, left
    top = (height - out_h) // 2 + ((height - out_h) % 2) * (((height - out_h) // 2) % 2)
    left = (width - out_w) // 2 + ((width - out_w) % 2) * (((width - out_w) // 2) % 2)
    return top, left
