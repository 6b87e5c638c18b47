"""Samples wider than 8 bits, or float, scaled exactly to uint8 by the rule of :mod:`ffload.convert.images`:
``round(v * 255 / (2**b - 1))`` for unsigned integers of ``b`` bits (associated alpha undone first, min-is-white
inverted, CMYK converted as Pillow does), ``rint(v * 255)`` for floats in ``[0, 1]``; and in-memory arrays
normalised to ``(H, W, 3) uint8`` by the same rule."""

from __future__ import annotations

import numpy as np

from ffload.errors import ImageDecodeError, ImageUnsupportedError

_BLOCK_SAMPLES = 1 << 18
"""Integer samples scaled at once by :func:`wide_to_rgb` (whole rows): its temporaries stay a few MB whatever the
image size."""


def wide_to_rgb(
    samples: np.ndarray, bits: int, photometric: int, name: str, associated: bool = False, cmyk: bool = False
) -> np.ndarray:
    """``(H, W, C)`` samples (unsigned ints of ``bits`` <= 32 bits, or floats) in RGB(A) / grey(+alpha) / CMYK
    order -> ``(H, W, 3)`` RGB uint8 by the package's rules: associated alpha undone, min-is-white (``photometric``
    0) inverted, CMYK (``cmyk``, ``bits`` <= 16) converted as Pillow does, then scaled. Integers are converted
    a block of rows at a time, in uint32 up to 16 bits. Raises ImageUnsupportedError for floats outside [0, 1]."""
    if samples.dtype.kind == "f":
        colour = samples[..., :3] if samples.shape[2] >= 3 else samples[..., :1]
        if associated and samples.shape[2] > colour.shape[2]:
            alpha = samples[..., colour.shape[2] : colour.shape[2] + 1]
            colour = np.where(alpha > 0, np.minimum(colour / np.where(alpha > 0, alpha, 1), 1.0), 0.0)
        out = _to_uint8(1.0 - colour if photometric == 0 else colour, name)
        return np.ascontiguousarray(np.repeat(out, 3, axis=2) if out.shape[2] == 1 else out)
    height, width, channels = samples.shape
    out = np.empty((height, width, 3), np.uint8)
    rows = max(1, _BLOCK_SAMPLES // max(1, width * channels))
    for y in range(0, height, rows):
        block = samples[y : y + rows]
        out[y : y + rows] = _cmyk_rows(block, bits) if cmyk else _scaled_rows(block, bits, photometric == 0, associated)
    return out


def _scaled_rows(samples: np.ndarray, bits: int, inverted: bool, associated: bool) -> np.ndarray:
    """RGB or grey rows of :func:`wide_to_rgb`: ``(h, W, 3 or 1) uint8``. Exact in uint32 up to 16 bits
    (``c * top`` < 2**32), uint64 up to 32."""
    wide = np.uint32 if bits <= 16 else np.uint64
    top = wide((1 << bits) - 1)
    c = 3 if samples.shape[2] >= 3 else 1
    colour = samples[..., :c].astype(wide)
    if associated and samples.shape[2] > c:  # as Pillow at 8 bits: min(c * top // a, top), 0 where a is 0
        alpha = samples[..., c : c + 1].astype(wide)
        colour = np.where(alpha == 0, wide(0), np.minimum(colour * top // np.maximum(alpha, wide(1)), top))
    if inverted:
        colour = top - colour
    # round(v * 255 / top) exactly: floor((2 * 255 * v + top) / (2 * top)); no ties for top > 255
    return ((colour * wide(510) + top) // (wide(2) * top)).astype(np.uint8)


def _cmyk_rows(samples: np.ndarray, bits: int) -> np.ndarray:
    """CMYK rows of :func:`wide_to_rgb` (``bits`` <= 16; extra samples dropped) -> ``(h, W, 3) uint8``:
    Pillow's CMYK -> RGB (``R = (255 - C) * (255 - K) / 255``) on the exact samples, i.e.
    ``round(255 * (M - C) * (M - K) / M**2)`` with ``M = 2**bits - 1`` (no ties: ``M`` is odd)."""
    m = np.uint64((1 << bits) - 1)
    ink = m - samples[..., :4].astype(np.uint64)
    return ((ink[..., :3] * ink[..., 3:] * np.uint64(510) + m * m) // (np.uint64(2) * m * m)).astype(np.uint8)


def to_rgb_uint8(array, name: str) -> np.ndarray:
    """Normalise an in-memory image to RGB uint8 with the rules of :mod:`ffload.convert.images`.

    Args:
        array: array-like in RGB(A) channel order: ``(H, W)`` gray, ``(H, W, 1)`` gray, ``(H, W, 2)`` gray+alpha,
            ``(H, W, 3)`` RGB or ``(H, W, 4)`` RGBA; dtype uint8, uint16 (scaled ``round(v / 257)``), bool
            (``True`` -> 255) or floating point with every value in ``[0, 1]`` (scaled ``round(v * 255)``).
        name: what to call it in error messages.
    Returns:
        ``(H, W, 3) uint8``, C-contiguous. It shares memory with ``array`` when that already is a C-contiguous
        ``(H, W, 3) uint8`` array.
    Raises:
        ImageDecodeError: another shape or an empty image.
        ImageUnsupportedError: (an ImageDecodeError) another dtype, or floats outside ``[0, 1]`` / not finite.
    """
    a = np.asarray(array)
    if a.ndim == 3 and a.shape[2] in (1, 2):
        a = a[..., 0]  # gray (+ alpha, dropped)
    elif a.ndim == 3 and a.shape[2] == 4:
        a = a[..., :3]  # RGBA -> RGB, alpha dropped
    elif not (a.ndim == 2 or (a.ndim == 3 and a.shape[2] == 3)):
        raise ImageDecodeError(
            f"{name}: expected an (H, W), (H, W, 1), (H, W, 2), (H, W, 3) or (H, W, 4) image array, got shape {a.shape}"
        )
    if a.shape[0] == 0 or a.shape[1] == 0:
        raise ImageDecodeError(f"{name}: empty image (shape {a.shape})")
    a = _to_uint8(a, name)
    if a.ndim == 2:
        return np.repeat(a[:, :, None], 3, axis=2)
    return np.ascontiguousarray(a)


def _to_uint8(a: np.ndarray, name: str) -> np.ndarray:
    """Scale uint8/uint16/bool/float samples to uint8 (rules in the :mod:`ffload.convert.images` docstring)."""
    if a.dtype == np.uint8:
        return a
    if a.dtype == np.bool_:
        return a.astype(np.uint8) * np.uint8(255)
    if a.dtype.kind == "u" and a.dtype.itemsize == 2:
        # round(v / 257) exactly: v / 257 is never k + 1/2 for integer v, so floor((v + 128) / 257) equals it.
        return ((a.astype(np.uint32) + 128) // 257).astype(np.uint8)
    if a.dtype.kind == "f":
        if not np.isfinite(a).all():
            raise ImageUnsupportedError(f"{name}: unsupported: float samples that are NaN or infinite")
        low, high = float(a.min()), float(a.max())
        if low < 0.0 or high > 1.0:
            raise ImageUnsupportedError(
                f"{name}: unsupported: float samples outside [0, 1] (found [{low:g}, "
                f"{high:g}]; the rule is round(v * 255) for [0, 1])"
            )
        return np.rint(a.astype(np.float64) * 255.0).astype(np.uint8)
    raise ImageUnsupportedError(
        f"{name}: unsupported: sample type {a.dtype} (expected uint8, uint16, bool, or float in [0, 1])"
    )
