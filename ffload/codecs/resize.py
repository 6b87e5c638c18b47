"""Compiled resize of an RGB crop into an output row, with an optional horizontal flip.

Follows OpenCV's ``cv2.resize`` (``imgproc/src/resize.cpp``) for ``uint8`` images:
``INTER_AREA`` when neither side grows (area-weighted averages, the tables of
``computeResizeAreaTab``) and ``INTER_LINEAR`` otherwise (half-pixel centres; the window's edge
pixels replicated at its borders, as ``cv2.resize`` of the cut-out crop does: no pixel outside the
crop box is ever read); or, with :data:`TRIANGLE`, Pillow's (and torchvision's ``Resize``)
antialiased bilinear: a triangle filter over ``max(scale, 1)`` source pixels each side (Pillow's
``Resample.c``; within a grey level of ``PIL.Image.resize(..., BILINEAR)``, which rounds to 8 bits
between its two passes where this keeps 8 more bits).
Arithmetic is fixed point in 16-bit lanes where OpenCV uses 11-bit fixed point (linear) or
``float`` with ``cvRound`` (area): results differ from OpenCV's by at most one grey level
(tests/test_resize.py). Weights are ``Q16`` (``uint16``, a row's summing to ``2**16``, a lone
weight of one capped at ``2**16 - 1``); every product is the high half of a 16-bit multiply
(:mod:`.simd`'s ``mulhi``), truncated, so each loses ``[0, 1)`` unit of ``1/256`` grey level and a
pass's sum of ``n`` products starts at ``n // 2`` units to centre that error. Sums saturate at
``2**16 - 1`` (a lane that would pass it rounds to 255 either way): nothing wraps. The two
passes' errors then add up to less than half a grey level, within the rounding, while
``ceil(n / 2)`` of both passes together is at most 128; a window to be shrunk more than about 64
times on both sides (or 128 on one) is resized with exact products and one rounding per pass
instead, as is a window narrower than 11 pixels (one 32-byte run). Separable,
vertical pass first (it shrinks the rows the horizontal pass reads), in strips of 16 output rows
(a strip's intermediates stay in the core's cache):

* vertical: per output row, 32 bytes of the window's columns at a time, the taps summed in
  registers (:func:`~.simd.weighted_sum_u8`), stored as ``uint16`` with 8 fraction bits (value * 256);
* transpose of the strip's rows (each byte column becomes 16 contiguous ``uint16``) in 8 x 8
  blocks of vector shuffles (:func:`~.simd.transpose8_u16`);
* horizontal: each output byte column is a weighted sum of whole transposed columns, the 16 rows
  in the lanes (:func:`~.simd.weighted_sum_u16`), rounded half up, stored as a 16-byte run at its
  mirrored place when ``flip``;
* transpose of those runs into the strip's output rows, in 16 x 16 blocks of vector shuffles.

Scalar transposes cost a load and a store per element; block shuffles cost a few instructions
per 64 or 256 elements.
Offsets are unsigned (no negative-index wraparound checks), numba does no bounds checks and the
block transposes load and store through raw addresses: :func:`resize_rgb` checks its buffers'
dtypes, strides and sizes before it writes anything.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from ffload._jit.simd import transpose8_u16, transpose16_u8, weighted_sum_u8, weighted_sum_u16

AREA = 0
LINEAR = 1
TRIANGLE = 2
"""torchvision's antialiased bilinear (``Resize``'s default; Pillow's ``BILINEAR`` resample, ``Resample.c``):
a triangle filter whose support is scaled by the shrink factor (``max(scale, 1)`` source pixels each side of
the output pixel's centre, so it is plain bilinear when enlarging), weights normalised over the taps inside
the window (the window cut out as an image of its own, as torchvision's crop then resize)."""
TRIANGLE_SOURCE = 3
""":data:`TRIANGLE` with taps inside the whole source axis instead of the window: the window is then part
of a larger resized image (torchvision's ``Resize`` then ``CenterCrop``), and the source passed must reach
the filter's support beyond it (or the image's edge)."""
AUTO = -1
"""Pick per window: :data:`AREA` when shrinking, :data:`LINEAR` when enlarging (:func:`interpolation`)."""


@njit(nogil=True, cache=True)
def interpolation(crop_h, crop_w, out_h, out_w):
    """:data:`AREA` when the crop shrinks or keeps both sides (pixels), else :data:`LINEAR`."""
    if crop_h >= out_h and crop_w >= out_w:
        return AREA
    return LINEAR


@njit(nogil=True, cache=True)
def pick(mode, crop_h, crop_w, out_h, out_w):
    """``mode``, or :func:`interpolation`'s choice for ``crop_h x crop_w -> out_h x out_w`` when it is :data:`AUTO`."""
    if mode == AUTO:
        return interpolation(crop_h, crop_w, out_h, out_w)
    return mode


@njit(nogil=True, cache=True)
def _triangle_taps(offset, length, n, m, whole):
    """:func:`_taps` for :data:`TRIANGLE` (``whole`` False) and :data:`TRIANGLE_SOURCE` (``whole`` True):
    Pillow's ``precompute_coeffs`` for the bilinear filter (``ImagingResampleHorizontal_8bpc``): output
    pixel ``d``'s centre ``c = offset + (d + 0.5) * scale``, support ``max(scale, 1)``, weight of source
    pixel ``s`` ``1 - |s + 0.5 - c| / support`` where positive, normalised to sum to one."""
    scale = length / m
    support = max(scale, 1.0)
    if whole:
        lo = np.int64(0)
        hi = np.int64(n - 1)
    else:
        lo = max(np.int64(math.floor(offset)), np.int64(0))
        hi = min(np.int64(math.ceil(offset + length)) - 1, n - 1)
    t = 2 * np.int64(math.ceil(support)) + 2
    idx = np.zeros((m, t), np.int64)
    wts = np.zeros((m, t), np.float64)
    count = np.zeros(m, np.int64)
    for d in range(m):
        c = offset + (d + 0.5) * scale
        first = max(np.int64(math.floor(c - support - 0.5)), lo)
        last = min(np.int64(math.ceil(c + support - 0.5)), hi)
        total = 0.0
        k = 0
        for s in range(first, last + 1):
            w = 1.0 - abs(s + 0.5 - c) / support
            if w > 0.0:
                idx[d, k] = s
                wts[d, k] = w
                total += w
                k += 1
        if k == 0:  # a window thinner than a pixel, between two centres: the nearest pixel
            idx[d, 0] = min(max(np.int64(math.floor(c)), lo), hi)
            wts[d, 0] = 1.0
            total = 1.0
            k = 1
        for j in range(k):
            wts[d, j] /= total
        count[d] = k
        for j in range(k, t):  # padding taps: weight 0 on a pixel of the window
            idx[d, j] = idx[d, 0]
    return idx, wts, count


@njit(nogil=True, cache=True)
def _taps(offset, length, n, m, mode):
    """Source indices ``(m, T) int64``, weights ``(m, T) float64`` and tap counts ``(m,) int64``
    resampling the window ``[offset, offset + length)`` (source pixels, fractional allowed) of an
    axis of ``n`` pixels to ``m`` output pixels: OpenCV's tables for the window cut out as an image
    of its own (no tap outside it; for an integer window exactly ``cv2.resize`` of the crop)."""
    if mode == TRIANGLE or mode == TRIANGLE_SOURCE:
        return _triangle_taps(offset, length, n, m, mode == TRIANGLE_SOURCE)
    scale = length / m
    if mode == LINEAR:  # borders replicate the window's edge pixels, as cv2.resize of the crop does
        lo = np.int64(math.floor(offset))
        hi = min(np.int64(math.ceil(offset + length)) - 1, n - 1)
        idx = np.zeros((m, 2), np.int64)
        wts = np.zeros((m, 2), np.float64)
        count = np.full(m, 2, np.int64)
        for d in range(m):
            f = offset + (d + 0.5) * scale - 0.5
            s = np.int64(math.floor(f))
            f -= s
            if s < lo:
                f = 0.0
                s = lo
            if s >= hi:
                f = 0.0
                s = hi
            idx[d, 0] = s
            idx[d, 1] = min(s + 1, hi)
            wts[d, 0] = 1.0 - f
            wts[d, 1] = f
        return idx, wts, count
    t = np.int64(math.ceil(scale)) + 2
    idx = np.zeros((m, t), np.int64)
    wts = np.zeros((m, t), np.float64)
    count = np.zeros(m, np.int64)
    for d in range(m):
        f1 = offset + d * scale
        f2 = f1 + scale
        s1 = np.int64(math.ceil(f1))
        s2 = min(np.int64(math.floor(f2)), n - 1)
        s1 = min(s1, s2)
        cell = min(scale, n - f1)
        k = 0
        if s1 - f1 > 1e-3:
            idx[d, k] = s1 - 1
            wts[d, k] = (s1 - f1) / cell
            k += 1
        for s in range(s1, s2):
            idx[d, k] = s
            wts[d, k] = 1.0 / cell
            k += 1
        if f2 - s2 > 1e-3:
            idx[d, k] = s2
            wts[d, k] = min(min(f2 - s2, 1.0), cell) / cell
            k += 1
        count[d] = k
        for j in range(k, t):  # padding taps: weight 0 on a pixel of the window
            idx[d, j] = idx[d, 0]
    return idx, wts, count


@njit(nogil=True, cache=True)
def copy_rgb(src, src_start, src_stride, dst, dst_start, out_h, out_w, flip):
    """Copy an ``out_h x out_w`` RGB crop (layout as :func:`resize_rgb`) into an output row,
    mirrored left-right when ``flip``. Unsigned offsets: without numba's negative-index checks
    the row copy vectorises."""
    row = np.uint64(out_w * 3)
    w = np.uint64(out_w)
    three = np.uint64(3)
    for y in range(np.uint64(out_h)):
        s = np.uint64(src_start) + y * np.uint64(src_stride)
        d = np.uint64(dst_start) + y * row
        if flip:
            for x in range(w):
                t = d + (w - np.uint64(1) - x) * three
                f = s + x * three
                dst[t] = src[f]
                dst[t + np.uint64(1)] = src[f + np.uint64(1)]
                dst[t + np.uint64(2)] = src[f + np.uint64(2)]
        else:
            for k in range(row):
                dst[d + k] = src[s + k]


_STRIP = 16  # output rows per strip: the horizontal pass's lanes, the u8 transpose's block
_LANES = 32  # bytes per vertical weighted sum (weighted_sum_u8)
_HALF_TAPS = 128  # ceil(taps / 2) of both passes together, at most, for the 16-bit lanes (module docstring)


@njit(nogil=True, cache=True)
def _q16(wts, count):
    """``(m, T) uint16`` weights ``round(w * 2**16)``, each row's largest adjusted so the row sums to
    exactly ``2**16`` and then capped at ``2**16 - 1`` (a lone tap of weight one)."""
    one = np.int64(1) << 16
    out = np.zeros(wts.shape, np.uint16)
    for d in range(wts.shape[0]):
        total = 0
        big = 0
        for k in range(count[d]):
            v = np.int64(math.floor(wts[d, k] * one + 0.5))
            out[d, k] = np.uint16(min(v, one - 1))
            total += v
            if v > out[d, big]:
                big = k
        out[d, big] = np.uint16(min(np.int64(out[d, big]) + one - total, one - 1))
    return out


@njit(nogil=True, cache=True)
def scratch_size(out_h, out_w, src_w):
    """``uint16`` elements of :func:`resize_rgb`'s scratch for an ``out_h x out_w`` output from
    a source ``src_w`` pixels wide (any window inside columns ``[0, src_w)``)."""
    cs = (src_w * 3 + 7) // 8 * 8  # a strip's vertical result: bytes per row, padded to the u16 block
    ow3p = (out_w * 3 + 15) // 16 * 16  # output bytes per row, padded to the u8 block
    return _scratch(cs, ow3p)


@njit(nogil=True, cache=True)
def _scratch(cs, ow3p):
    """``uint16`` elements for one strip: its vertical result (``_STRIP x cs``) and that
    transposed, then, as bytes, its byte runs (``ow3p x _STRIP``) and one 16 x 16 byte block."""
    return 2 * _STRIP * cs + (ow3p * _STRIP + 16 * 16) // 2


@njit(nogil=True, cache=True)
def _bias(n):
    """Where a pass's sums of ``n`` truncated products start: each product loses ``[0, 1)``
    unit (of ``1/256`` grey level), so ``n / 2`` centres the error."""
    return n // 2


@njit(nogil=True, cache=True)
def _resize_exact(src, yo, wy, yn, xi, wx, xn, x_lo, cols, dst, dst_start, out_h, out_w, flip, row):
    """Both passes one value at a time, products exact (``uint64``): per output row the vertical
    sums rounded once to 8 fraction bits (``row``, ``uint16``), then each output byte's horizontal
    sum rounded once. For windows narrower than one 32-byte run and for taps too many for the
    16-bit lanes (module docstring). ``yo``: byte offsets of the vertical taps' rows from the
    window's first column; ``xi``: the horizontal taps' source columns."""
    for y in range(out_h):
        for j in range(cols):
            acc = np.uint64(128)
            for k in range(yn[y]):
                acc += np.uint64(src[yo[y, k] + j]) * np.uint64(wy[y, k])
            row[j] = np.uint16(acc >> np.uint64(8))
        d = dst_start + y * out_w * 3
        for x in range(out_w):
            ox = out_w - 1 - x if flip else x
            for c in range(3):
                acc = np.uint64(1 << 23)
                for k in range(xn[x]):
                    acc += np.uint64(row[(xi[x, k] - x_lo) * 3 + c]) * np.uint64(wx[x, k])
                dst[d + ox * 3 + c] = np.uint8(acc >> np.uint64(24))


@njit(nogil=True, cache=True)
def resize_rgb(
    src, src_start, src_stride, src_h, src_w, y0, x0, win_h, win_w, mode, dst, dst_start, out_h, out_w, flip, tmp
):
    """Resize a window of an RGB image into an output row.

    Strips of 16 output rows, four steps each: the vertical pass (32 bytes of a row at a time,
    all taps in registers, :func:`~.simd.weighted_sum_u8`), an 8 x 8 ``uint16`` block transpose of its result
    (:func:`~.simd.transpose8_u16`: each byte column becomes 16 contiguous ``uint16``), the
    horizontal pass (per output byte a weighted sum of whole transposed columns, the 16 rows in
    the lanes, :func:`~.simd.weighted_sum_u16`, written as a 16-byte run at its mirrored place
    when ``flip``) and a 16 x 16 ``uint8`` block transpose of those runs into the output rows
    (:func:`~.simd.transpose16_u8`; blocks that overhang the output go through a small buffer).
    A strip's rows past ``out_h`` repeat its last row; columns are padded to the blocks; what the
    padding holds never reaches ``dst``.

    Args:
        src: 1-D ``uint8`` array; pixel ``(y, x, c)`` of the ``src_h x src_w`` image is at
            ``src_start + y * src_stride + 3 * x + c`` (bytes).
        y0, x0, win_h, win_w: the window to resample (source pixels, floats: a crop box mapped
            into a DCT-scaled decode keeps its fractional edges).
        mode: :data:`AREA`, :data:`LINEAR` (see :func:`interpolation`), :data:`TRIANGLE` or
            :data:`TRIANGLE_SOURCE` (torchvision's antialiased bilinear).
        dst: 1-D ``uint8`` array with unit stride; the ``(out_h, out_w, 3)`` output starts at
            ``dst_start``.
        flip: mirror the output left-right (the fused horizontal flip).
        tmp: 1-D ``uint16`` scratch with unit stride, of at least :func:`scratch_size` elements.
            ``src``, ``dst`` and ``tmp`` must not overlap.

    Raises:
        ValueError: ``dst`` is strided or too short for the output; ``tmp`` is not unit-stride
            ``uint16`` or too small for the window (nothing is written then).
    """
    if dst.strides[0] != 1 or dst_start < 0 or dst_start + out_h * out_w * 3 > dst.shape[0]:
        raise ValueError("resize_rgb: dst must be a unit-stride uint8 array holding the output row")
    if tmp.itemsize != 2 or tmp.strides[0] != 2:
        raise ValueError("resize_rgb: tmp must be a unit-stride uint16 array")
    xi, xw, xn = _taps(x0, win_w, src_w, out_w, mode)
    yi, yw, yn = _taps(y0, win_h, src_h, out_h, mode)
    wy = _q16(yw, yn)
    wx = _q16(xw, xn)
    x_lo = xi[0, 0]
    x_hi = xi[out_w - 1, 0]
    for k in range(xi.shape[1]):
        x_hi = max(x_hi, xi[out_w - 1, k])
    cols = np.uint64((x_hi - x_lo + 1) * 3)
    cs = (cols + np.uint64(7)) // np.uint64(8) * np.uint64(8)
    ow3 = np.uint64(out_w * 3)
    ow3p = (ow3 + np.uint64(15)) // np.uint64(16) * np.uint64(16)
    if x_lo < 0 or tmp.shape[0] < _scratch(cs, ow3p):
        raise ValueError("resize_rgb: scratch buffer smaller than scratch_size(out_h, out_w, src_w)")
    # byte offsets of every tap: source rows from the window's first column, transposed columns
    yo = np.empty(yi.shape, np.int64)
    for y in range(out_h):
        for k in range(yi.shape[1]):
            yo[y, k] = src_start + yi[y, k] * src_stride + x_lo * 3
    if cols < np.uint64(_LANES) or (yi.shape[1] + 1) // 2 + (xi.shape[1] + 1) // 2 > _HALF_TAPS:
        _resize_exact(src, yo, wy, yn, xi, wx, xn, x_lo, cols, dst, dst_start, out_h, out_w, flip, tmp)
        return
    xo = np.empty(xi.shape, np.int64)
    for x in range(out_w):
        for k in range(xi.shape[1]):
            xo[x, k] = (xi[x, k] - x_lo) * 3 * 2 * _STRIP
    two = np.uint64(2)
    sixteen = np.uint64(16)
    strip = np.uint64(_STRIP)
    lanes = np.uint64(_LANES)
    # tmp: a strip's vertical result (strip x cs) and its transpose (cs x strip), then, as bytes,
    # its horizontal result (ow3p x strip) and a 16 x 16 block for output blocks that overhang
    at = np.uint64(tmp.ctypes.data)
    trans = at + two * strip * cs
    runs = trans + two * strip * cs
    edge = runs + ow3p * strip
    t8 = tmp.view(np.uint8)
    edge_i = edge - at
    src_at = np.uint64(src.ctypes.data)
    out_at = np.uint64(dst.ctypes.data) + np.uint64(dst_start)
    xo_at, wx_at = np.uint64(xo.ctypes.data), np.uint64(wx.ctypes.data)
    yo_at, wy_at = np.uint64(yo.ctypes.data), np.uint64(wy.ctypes.data)
    tx, ty = np.uint64(xi.shape[1]), np.uint64(yi.shape[1])
    for r0 in range(np.uint64(0), np.uint64(out_h), strip):
        for r in range(strip):  # vertical: 32 bytes of the row's window at a time, all taps in registers
            y = min(r0 + r, np.uint64(out_h - 1))
            n = np.uint64(yn[y])
            bias = _bias(n)
            row = at + two * r * cs
            offsets, weights = yo_at + np.uint64(8) * ty * y, wy_at + two * ty * y
            for j in range(np.uint64(0), cols - lanes, lanes):
                weighted_sum_u8(src_at + j, offsets, weights, n, bias, row + two * j)
            tail = cols - lanes  # the last 32 bytes, overlapping the run before: the same sums again
            weighted_sum_u8(src_at + tail, offsets, weights, n, bias, row + two * tail)
        for j in range(np.uint64(0), cs, np.uint64(8)):  # column j becomes the 16 uint16 at trans + 32 j
            for h in range(np.uint64(0), strip, np.uint64(8)):
                transpose8_u16(at + two * (h * cs + j), two * cs, trans + two * (j * strip + h), two * strip)
        for x in range(out_w):  # horizontal: output byte (x, c) from whole transposed columns
            n = np.uint64(xn[x])
            bias = _bias(n)
            offsets, weights = xo_at + np.uint64(8) * tx * np.uint64(x), wx_at + two * tx * np.uint64(x)
            ox = np.uint64(out_w - 1 - x if flip else x) * np.uint64(3)
            for c in range(np.uint64(3)):
                weighted_sum_u16(trans + two * strip * c, offsets, weights, n, bias, runs + strip * (ox + c))
        for j in range(np.uint64(0), ow3p, sixteen):  # transpose the runs into the strip's output rows
            block = runs + j * strip
            if r0 + strip <= np.uint64(out_h) and j + sixteen <= ow3:
                transpose16_u8(block, strip, out_at + r0 * ow3 + j, ow3)
                continue
            transpose16_u8(block, strip, edge, sixteen)
            for i in range(r0, min(r0 + strip, np.uint64(out_h))):
                d = np.uint64(dst_start) + i * ow3
                e = edge_i + (i - r0) * sixteen - j
                for k in range(j, min(j + sixteen, ow3)):
                    dst[d + k] = t8[e + k]
