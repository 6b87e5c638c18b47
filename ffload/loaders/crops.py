"""Crop geometry of the resized-crop decoders: one compiled kernel per batch.

Boxes are ``(B, 4) int64`` rows ``(top, left, height, width)`` in pixels of the stored image
(torchvision's ``(i, j, h, w)``), always inside the image and at least 1 x 1.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

from .rng import randint, seed_state, uniform_range


@njit(nogil=True, cache=True)
def random_resized_crop_boxes(indices, heights, widths, seeds, salt, scale_lo, scale_hi,
                              ratio_lo, ratio_hi, out):
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
def jpeg_reductions(indices, modes, heights, widths, boxes, out_h, out_w, jpg_mode, factors, dec_boxes):
    """Pick the DCT-domain reduction of each JPEG sample and map its box into the reduced image.

    The factor is the largest ``k`` in (8, 4, 2) with ``box_h / k >= out_h`` and
    ``box_w / k >= out_w`` (else 1); libjpeg then decodes a ``ceil(H/k) x ceil(W/k)`` image.
    Box edges are divided by ``k`` and rounded half up (the box snaps to the k-pixel grid, moving
    each edge by at most k/2 pixels), clamped to the reduced image, at least 1 pixel.

    Args:
        modes: ``(N,)`` image modes; ``jpg_mode``: the value meaning JPEG. Raw samples get k = 1.
        boxes: ``(B, 4) int64`` crop boxes in stored-image pixels.
        factors: ``(B,) int64`` out: k per sample. dec_boxes: ``(B, 4) int64`` out: boxes in the
            decoded (possibly reduced) image.
    """
    for b in range(indices.shape[0]):
        s = indices[b]
        top, left, h, w = boxes[b, 0], boxes[b, 1], boxes[b, 2], boxes[b, 3]
        k = np.int64(1)
        if modes[s] == jpg_mode:
            for kk in (8, 4, 2):
                if h >= kk * out_h and w >= kk * out_w:
                    k = np.int64(kk)
                    break
        factors[b] = k
        if k == 1:
            dec_boxes[b, 0] = top
            dec_boxes[b, 1] = left
            dec_boxes[b, 2] = h
            dec_boxes[b, 3] = w
            continue
        rh = (np.int64(heights[s]) + k - 1) // k
        rw = (np.int64(widths[s]) + k - 1) // k
        y0 = min((2 * top + k) // (2 * k), rh - 1)  # edges / k, rounded half up
        x0 = min((2 * left + k) // (2 * k), rw - 1)
        y1 = max(min((2 * (top + h) + k) // (2 * k), rh), y0 + 1)
        x1 = max(min((2 * (left + w) + k) // (2 * k), rw), x0 + 1)
        dec_boxes[b, 0] = y0
        dec_boxes[b, 1] = x0
        dec_boxes[b, 2] = y1 - y0
        dec_boxes[b, 3] = x1 - x0
