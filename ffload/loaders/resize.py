"""Compiled resize of an RGB crop into an output row, with an optional horizontal flip.

Follows OpenCV's ``cv2.resize`` (``imgproc/src/resize.cpp``) for ``uint8`` images:
``INTER_AREA`` when neither side grows (area-weighted averages, the tables of
``computeResizeAreaTab``) and ``INTER_LINEAR`` otherwise (half-pixel centres; the window's edge
pixels replicated at its borders, as ``cv2.resize`` of the cut-out crop does: no pixel outside the
crop box is ever read).
Arithmetic is fixed point where OpenCV uses 11-bit fixed point (linear) or ``float`` with
``cvRound`` (area): results differ from OpenCV's by at most one grey level (tests/test_resize.py).
Separable, vertical pass first (it shrinks the rows the horizontal pass reads):

* vertical: per output row, ``Q15`` integer weights (summing to exactly ``2**15``) over the
  window's columns (contiguous bytes: LLVM vectorises the multiply-adds), stored as ``uint16``
  with 8 fraction bits (value * 256, at most 65280);
* transpose of that intermediate (each byte column becomes a contiguous run of ``out_h``
  rounded up to 16) in 8 x 8 blocks of vector shuffles (:mod:`.simd`);
* horizontal: each output byte column is a ``Q14``-weighted sum of whole transposed columns
  (contiguous again, vectorised), rounded half up, stored as a contiguous byte run at its
  mirrored place when ``flip``;
* transpose of those runs into the output rows, in 16 x 16 blocks of vector shuffles.

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

from .simd import transpose8_u16, transpose16_u8

AREA = 0
LINEAR = 1


@njit(nogil=True, cache=True)
def interpolation(crop_h, crop_w, out_h, out_w):
    """:data:`AREA` when the crop shrinks or keeps both sides (pixels), else :data:`LINEAR`."""
    if crop_h >= out_h and crop_w >= out_w:
        return AREA
    return LINEAR


@njit(nogil=True, cache=True)
def _taps(offset, length, n, m, mode):
    """Source indices ``(m, T) int64``, weights ``(m, T) float64`` and tap counts ``(m,) int64``
    resampling the window ``[offset, offset + length)`` (source pixels, fractional allowed) of an
    axis of ``n`` pixels to ``m`` output pixels: OpenCV's tables for the window cut out as an image
    of its own (no tap outside it; for an integer window exactly ``cv2.resize`` of the crop)."""
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
    the row copy vectorises (2.3x faster than signed indices on 256x256 rows)."""
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


_VBITS = 15  # vertical weights: Q15
_FRAC = 8  # fraction bits kept in the uint16 intermediate
_HBITS = 14  # horizontal weights: Q14 (65280 * 2**14 < 2**31)


@njit(nogil=True, cache=True)
def _fixed(wts, count, bits):
    """``(m, T) int32`` weights ``round(w * 2**bits)``, each row's largest adjusted so the row
    sums to exactly ``2**bits`` (a constant image stays constant, no saturation needed)."""
    one = np.int64(1) << bits
    out = np.zeros(wts.shape, np.int32)
    for d in range(wts.shape[0]):
        total = 0
        big = 0
        for k in range(count[d]):
            v = np.int64(math.floor(wts[d, k] * one + 0.5))
            out[d, k] = v
            total += v
            if v > out[d, big]:
                big = k
        out[d, big] += one - total
    return out


@njit(nogil=True, cache=True)
def scratch_size(out_h, out_w, src_w):
    """``uint16`` elements of :func:`resize_rgb`'s scratch for an ``out_h x out_w`` output from
    a source ``src_w`` pixels wide (any window inside columns ``[0, src_w)``)."""
    rp = (out_h + 15) // 16 * 16  # output rows, padded to the u8 block
    cs = (src_w * 3 + 7) // 8 * 8  # the vertical result's columns, padded to the u16 block
    ow3p = (out_w * 3 + 15) // 16 * 16  # output bytes per row, padded to the u8 block
    return _scratch(rp, cs, ow3p)


@njit(nogil=True, cache=True)
def _scratch(rp, cs, ow3p):
    """``uint16`` elements for ``rp`` padded rows, ``cs`` padded vertical-result columns and
    ``ow3p`` padded output bytes per row: the vertical result and its transpose, then the byte
    runs and one 16 x 16 byte block."""
    return 2 * rp * cs + (ow3p * rp + 16 * 16) // 2


@njit(nogil=True, cache=True)
def resize_rgb(src, src_start, src_stride, src_h, src_w, y0, x0, win_h, win_w, mode,
               dst, dst_start, out_h, out_w, flip, tmp):
    """Resize a window of an RGB image into an output row.

    Four steps: the vertical pass (contiguous rows, vectorised), an 8 x 8 ``uint16`` block
    transpose of its result (:func:`~.simd.transpose8_u16`), the horizontal pass (per output
    byte a sum of whole transposed columns, vectorised over the output rows, written as a
    contiguous byte run, mirrored when ``flip``) and a 16 x 16 ``uint8`` block transpose of those
    runs into the output rows (:func:`~.simd.transpose16_u8`; blocks that overhang the output go
    through a small buffer). Rows are padded to 16 and columns to the blocks; what the padding
    holds is resized along but never reaches ``dst``.

    Args:
        src: 1-D ``uint8`` array; pixel ``(y, x, c)`` of the ``src_h x src_w`` image is at
            ``src_start + y * src_stride + 3 * x + c`` (bytes).
        y0, x0, win_h, win_w: the window to resample (source pixels, floats: a crop box mapped
            into a DCT-scaled decode keeps its fractional edges).
        mode: :data:`AREA` or :data:`LINEAR` (see :func:`interpolation`).
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
    wy = _fixed(yw, yn, _VBITS)
    wx = _fixed(xw, xn, _HBITS)
    x_lo = xi[0, 0]
    x_hi = xi[out_w - 1, 0]
    for k in range(xi.shape[1]):
        x_hi = max(x_hi, xi[out_w - 1, k])
    cols = np.uint64((x_hi - x_lo + 1) * 3)
    cs = (cols + np.uint64(7)) // np.uint64(8) * np.uint64(8)
    rp = np.uint64((out_h + 15) // 16 * 16)
    ow3 = np.uint64(out_w * 3)
    ow3p = (ow3 + np.uint64(15)) // np.uint64(16) * np.uint64(16)
    if x_lo < 0 or tmp.shape[0] < _scratch(rp, cs, ow3p):
        raise ValueError("resize_rgb: scratch buffer smaller than scratch_size(out_h, out_w, src_w)")
    two = np.uint64(2)
    sixteen = np.uint64(16)
    # tmp: the vertical result (rp x cs), its transpose (cs x rp), then, as bytes, the
    # horizontal result (ow3p x rp) and a 16 x 16 block for output blocks that overhang
    at = np.uint64(tmp.ctypes.data)
    trans = rp * cs
    t8 = tmp.view(np.uint8)
    hbase = np.uint64(4) * rp * cs  # bytes
    edge = hbase + ow3p * rp
    acc = np.empty(max(cols, rp), np.uint32)
    half = np.uint32(1 << (_VBITS - _FRAC - 1))
    shift = np.uint32(_VBITS - _FRAC)
    for y in range(out_h):  # vertical: rows of the window's columns, contiguous
        s = np.uint64(src_start + yi[y, 0] * src_stride + x_lo * 3)
        w = np.uint32(wy[y, 0])
        for j in range(cols):
            acc[j] = half + w * np.uint32(src[s + j])
        for k in range(1, yn[y]):
            s = np.uint64(src_start + yi[y, k] * src_stride + x_lo * 3)
            w = np.uint32(wy[y, k])
            for j in range(cols):
                acc[j] += w * np.uint32(src[s + j])
        t = np.uint64(y) * cs
        for j in range(cols):
            tmp[t + j] = np.uint16(acc[j] >> shift)
    # transpose: column j of the vertical result becomes the contiguous run tmp[trans + j * rp:]
    for r in range(np.uint64(0), rp, np.uint64(8)):
        for j in range(np.uint64(0), cs, np.uint64(8)):
            transpose8_u16(at + two * (r * cs + j), two * cs, at + two * (trans + j * rp + r), two * rp)
    # horizontal: each output byte (x, c) as a weighted sum of whole transposed columns, stored
    # as the byte run t8[hbase + (x' * 3 + c) * rp:] (x' the mirrored x when flip)
    half = np.uint32(1 << (_HBITS + _FRAC - 1))
    shift = np.uint32(_HBITS + _FRAC)
    for x in range(out_w):
        ox = np.uint64(out_w - 1 - x if flip else x) * np.uint64(3)
        for c in range(3):
            t = trans + np.uint64((xi[x, 0] - x_lo) * 3 + c) * rp
            w = np.uint32(wx[x, 0])
            for y in range(rp):
                acc[y] = half + w * np.uint32(tmp[t + y])
            for k in range(1, xn[x]):
                t = trans + np.uint64((xi[x, k] - x_lo) * 3 + c) * rp
                w = np.uint32(wx[x, k])
                for y in range(rp):
                    acc[y] += w * np.uint32(tmp[t + y])
            q = hbase + (ox + np.uint64(c)) * rp
            for y in range(rp):
                t8[q + y] = np.uint8(acc[y] >> shift)
    # transpose the runs into the output rows
    out_at = np.uint64(dst.ctypes.data) + np.uint64(dst_start)
    for r in range(np.uint64(0), rp, sixteen):
        for j in range(np.uint64(0), ow3p, sixteen):
            block = at + hbase + j * rp + r
            if r + sixteen <= np.uint64(out_h) and j + sixteen <= ow3:
                transpose16_u8(block, rp, out_at + r * ow3 + j, ow3)
                continue
            transpose16_u8(block, rp, at + edge, sixteen)
            for i in range(r, min(r + sixteen, np.uint64(out_h))):
                d = np.uint64(dst_start) + i * ow3
                e = edge + (i - r) * sixteen - j
                for k in range(j, min(j + sixteen, ow3)):
                    dst[d + k] = t8[e + k]
