"""Photometric transforms of ``(H, W, C) uint8`` images, in place, geometry kept: torchvision's
:class:`RandomGrayscale`, :class:`ColorJitter` and :class:`GaussianBlur`.

Semantics follow torchvision 0.2x's tensor implementations (``torchvision/transforms/
functional_tensor.py`` / ``_functional_tensor.py``) for ``uint8`` tensors, rounding included: the
colour operations truncate to ``uint8`` after each step (torch's ``.to(uint8)``), the blur rounds
(``_cast_squeeze_out``). Random draws come from ffload's generator, so the *distribution* of
parameters is torchvision's, not its stream.

:class:`RandomGrayscale` and :class:`ColorJitter` also take a torch ``uint8`` batch (after ``ToTensor``,
any device): the same ``params(seeds)``, applied by :mod:`ffload.loaders.transforms.batch_torch` with the
same float32 arithmetic (equal values).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
from numba import njit

from ffload._jit.simd import narrow_rgb, widen_rgb
from ffload.errors import ConfigurationError, PipelineError
from ffload.loaders.decoders.rgb import flip_draws
from ffload.loaders.rng import randint, seed_state, uniform, uniform_range
from ffload.loaders.transforms import batch_torch
from ffload.loaders.transforms.base import NHWCTransform, range_pair


class _RGBTransform(NHWCTransform):
    """A transform of ``(H, W, 3) uint8`` RGB images (colour operations): numpy, or a torch batch
    (NHWC or NCHW, any device) where the subclass sets ``torch_impl``."""

    def declare(self, spec, field, view):
        spec = super().declare(spec, field, view)
        uint8 = spec.dtype == torch.uint8 if spec.on_torch else np.dtype(spec.dtype) == np.uint8
        if not uint8 or self._image(spec)[2] != 3:
            raise PipelineError(
                f"{type(self).__name__} (field '{self.field_name}') needs (H, W, 3) uint8 RGB images, got {spec}"
            )
        return spec


@njit(nogil=True, cache=True)
def _gray_u8(r, g, b):
    # torchvision's rgb_to_grayscale on uint8: float32 luma, truncated to uint8
    return np.uint8(
        np.float32(0.2989) * np.float32(r) + np.float32(0.587) * np.float32(g) + np.float32(0.114) * np.float32(b)
    )


@njit(nogil=True, cache=True)
def _grayscale(images, seeds, salt, prob):
    batch, height, width = images.shape[0], images.shape[1], images.shape[2]
    for b in range(batch):
        u, _ = uniform(seed_state(seeds[b], salt))
        if u < prob:
            for y in range(height):
                for x in range(width):
                    v = _gray_u8(images[b, y, x, 0], images[b, y, x, 1], images[b, y, x, 2])
                    images[b, y, x, 0] = v
                    images[b, y, x, 1] = v
                    images[b, y, x, 2] = v


class RandomGrayscale(_RGBTransform):
    """Replace RGB images by their luma at random, in place (torchvision's ``RandomGrayscale``).

    The luma is ``0.2989 R + 0.587 G + 0.114 B`` (float32), truncated, in all three channels; each
    image is replaced with probability ``p``: sample b when ``uniform(seed_state(seeds[b], salt)) <
    p``. ``params(seeds)``: ``(B,) bool``, the samples replaced. A torch batch (after ``ToTensor``,
    NHWC or NCHW, any device) gets the same values in a new tensor.

    Args:
        p: probability that a sample is replaced by its luma, in [0, 1].

    Raises:
        ConfigurationError: ``p`` outside [0, 1].
        PipelineError: (building the pipeline) input not ``(H, W, 3) uint8``.
    """

    keeps_geometry = True
    torch_impl = True

    def __init__(self, p: float = 0.1):
        if not 0.0 <= p <= 1.0:
            raise ConfigurationError(f"p must be in [0, 1], got {p}")
        self.p = float(p)

    def params(self, seeds: np.ndarray) -> np.ndarray:
        """``(B,) bool``: the samples replaced by their luma, for ``(B,) uint64`` seeds."""
        chosen = np.empty(len(seeds), np.bool_)
        flip_draws(np.asarray(seeds, dtype=np.uint64), self.salt, self.p, chosen)  # the same Bernoulli rule
        return chosen

    def __call__(self, src, dst, ctx):
        if self.on_torch:
            x = batch_torch.to_nhwc(src, self.channels_first)
            return batch_torch.from_nhwc(batch_torch.grayscale(x, self.params(ctx.seeds)), self.channels_first)
        _grayscale(src, ctx.seeds, self.salt, self.p)
        return src


@njit(nogil=True, cache=True)
def _jitter_params(seeds, salt, ranges, out):
    # out[b] = (order0..3, brightness, contrast, saturation, hue); ranges (4, 2) float64
    for b in range(seeds.shape[0]):
        state = seed_state(seeds[b], salt)
        order = np.arange(4)
        for i in range(3, 0, -1):  # Fisher-Yates: a uniform permutation, as torch.randperm(4)
            j, state = randint(state, i + 1)
            order[i], order[j] = order[j], order[i]
        for i in range(4):
            out[b, i] = order[i]
        for k in range(4):
            out[b, 4 + k], state = uniform_range(state, ranges[k, 0], ranges[k, 1])


@njit(nogil=True, cache=True, error_model="numpy")  # no ZeroDivisionError branch: vectorises
def _hue_row(r, g, b, shift, n):
    # torchvision's _rgb2hsv -> h += shift (mod 1) -> _hsv2rgb in float32 on the 0..255 scale, on
    # rows of channel values, branch-free so that it vectorises: the rotation keeps max (V) and
    # min (V(1 - S)), so only the middle channel is recomputed (truncated); both ``mod 1`` are
    # the one wrap their operand's range needs, which equals torch's fmod exactly; a grey pixel
    # (chroma 0) comes back unchanged
    s = np.float32(shift)
    one, zero, six = np.float32(1.0), np.float32(0.0), np.float32(6.0)
    two, three, four, five = np.float32(2.0), np.float32(3.0), np.float32(4.0), np.float32(5.0)
    for x in range(n):
        rf, gf, bf = r[x], g[x], b[x]
        m = rf if rf >= gf else gf
        mx = m if m >= bf else bf
        m = rf if rf <= gf else gf
        mn = m if m <= bf else bf
        chroma = mx - mn
        isr = mx == rf
        isg = (mx == gf) & ~isr
        num = (gf - bf) if isr else ((bf - rf) if isg else (rf - gf))
        base = zero if isr else (two if isg else four)
        h = (base + num / (one if chroma == zero else chroma)) / six + one
        h = (h - one if h >= one else h) + s
        h = h + one if h < zero else (h - one if h >= one else h)
        h6 = h * six
        i = np.float32(np.int32(h6))  # the sector, kept in float32 lanes like everything else
        f = h6 - i
        i = zero if i == six else i
        # sector i: (V, t, p) (q, V, p) (p, V, t) (p, q, V) (t, p, V) (V, p, q) with V = max,
        # p = min, the middle value t in even sectors and q in odd ones
        odd = (i == one) | (i == three) | (i == five)
        mid = np.float32(np.int32(mx - chroma * f)) if odd else np.float32(np.int32(mn + chroma * f))
        r[x] = mx if (i == zero) | (i == five) else (mn if (i == two) | (i == three) else mid)
        g[x] = mx if (i == one) | (i == two) else (mn if (i == four) | (i == five) else mid)
        b[x] = mx if (i == three) | (i == four) else (mn if (i == zero) | (i == one) else mid)


@njit(nogil=True, cache=True)
def _blend_row(v, other, f, n):
    # torchvision's _blend on uint8 values held as float32, with a constant other:
    # clamp(f v + (1 - f) other, 0, 255), truncated (torch's .to(uint8))
    fv = np.float32(f)
    rest = (np.float32(1.0) - fv) * np.float32(other)
    for x in range(n):
        v[x] = np.float32(np.int32(min(max(fv * v[x] + rest, np.float32(0.0)), np.float32(255.0))))


@njit(nogil=True, cache=True)
def _gray_row(r, g, b, out, n):
    # _gray_u8 on rows of float32 values
    for x in range(n):
        out[x] = np.float32(np.int32(np.float32(0.2989) * r[x] + np.float32(0.587) * g[x] + np.float32(0.114) * b[x]))


@njit(nogil=True, cache=True)
def _saturate_row(r, g, b, gray, f, n):
    # saturation: the blend of each channel with the pixel's truncated luma
    _gray_row(r, g, b, gray, n)
    fv = np.float32(f)
    rest = np.float32(1.0) - fv
    zero, top = np.float32(0.0), np.float32(255.0)
    for x in range(n):
        o = rest * gray[x]
        r[x] = np.float32(np.int32(min(max(fv * r[x] + o, zero), top)))
        g[x] = np.float32(np.int32(min(max(fv * g[x] + o, zero), top)))
        b[x] = np.float32(np.int32(min(max(fv * b[x] + o, zero), top)))


@njit(nogil=True, cache=True)
def _jitter_rows(img, kinds, factors, start, stop, mean, luma_sum, planes, rgbx):
    # kinds[start:stop] (0 brightness, 1 contrast with mean, 2 saturation, 3 hue) on img
    # (H, W, 3) uint8 row by row, each row widened to uint32 pixels (rgbx (W,), simd.widen_rgb)
    # and split into float32 channel planes (planes (4, W): r, g, b, scratch), then joined and
    # narrowed back; with luma_sum, returns the sum of the truncated luma of the result
    if stop <= start and not luma_sum:
        return 0.0
    height, width = img.shape[0], img.shape[1]
    r, g, b, scratch = planes[0], planes[1], planes[2], planes[3]
    flat = img.reshape(-1)
    byte = np.uint32(255)
    total = np.int64(0)
    for y in range(height):
        widen_rgb(flat, y * width * 3, width, rgbx, 0)
        for x in range(width):
            v = rgbx[x]
            r[x], g[x], b[x] = (
                np.float32(np.int32(v & byte)),
                np.float32(np.int32((v >> 8) & byte)),
                np.float32(np.int32((v >> 16) & byte)),
            )
        for step in range(start, stop):
            kind, f = kinds[step], factors[step]
            if kind <= 1:
                other = 0.0 if kind == 0 else mean
                _blend_row(r, other, f, width)
                _blend_row(g, other, f, width)
                _blend_row(b, other, f, width)
            elif kind == 2:
                _saturate_row(r, g, b, scratch, f, width)
            else:
                _hue_row(r, g, b, f, width)
        if stop > start:
            for x in range(width):
                rgbx[x] = (
                    np.uint32(np.int32(r[x])) | (np.uint32(np.int32(g[x])) << 8) | (np.uint32(np.int32(b[x])) << 16)
                )
            narrow_rgb(rgbx, 0, width, flat, y * width * 3)
        if luma_sum:  # whole numbers: an integer sum is exact in any order, so it vectorises
            _gray_row(r, g, b, scratch, width)
            for x in range(width):
                total += np.int64(scratch[x])
    return np.float64(total)


@njit(nogil=True, cache=True)
def _color_jitter(images, params, enabled):
    # params (B, 8) from _jitter_params; enabled (4,) bool: brightness, contrast, saturation, hue.
    # The enabled steps in the drawn order, row by row on float32 planes so that each step is a
    # vectorised loop; the values are the step-by-step uint8 definition's exactly (every step
    # truncates). Contrast needs the mean luma of the image as it enters that step: one pass up to
    # contrast sums it, a second pass runs contrast and the steps after it.
    height, width = images.shape[1], images.shape[2]
    kinds = np.empty(4, np.int64)
    factors = np.empty(4, np.float64)
    planes = np.empty((4, width), np.float32)
    rgbx = np.empty(width, np.uint32)
    for b in range(images.shape[0]):
        img = images[b]
        n, at = 0, -1
        for step in range(4):
            fn = int(params[b, step])
            if enabled[fn]:
                kinds[n], factors[n] = fn, params[b, 4 + fn]
                at = n if fn == 1 else at
                n += 1
        if at < 0:
            _jitter_rows(img, kinds, factors, 0, n, 0.0, False, planes, rgbx)
        else:
            total = _jitter_rows(img, kinds, factors, 0, at, 0.0, True, planes, rgbx)
            _jitter_rows(img, kinds, factors, at, n, np.float32(total / (height * width)), False, planes, rgbx)


class ColorJitter(_RGBTransform):
    """Randomly change brightness, contrast, saturation and hue, in place (torchvision's ``ColorJitter``).

    Per sample: a uniform random order of the four adjustments, then factors ``brightness`` in
    ``[max(0, 1 - b), 1 + b]``, ``contrast`` and ``saturation`` likewise, ``hue`` in ``[-h, h]``
    (``h <= 0.5``); a pair gives the range itself. Each adjustment is torchvision's on uint8:
    brightness blends with black, contrast with the mean of the truncated luma, saturation with
    the truncated luma per pixel (each ``clamp(f * x + (1 - f) * other)`` truncated to uint8),
    hue rotates H in HSV (float32 on the 0..255 scale, the recomputed channel truncated). A factor of 0
    disables its adjustment.

    ``params(seeds)``: ``(B, 8) float64``: the order (4 indices: 0 brightness, 1 contrast,
    2 saturation, 3 hue) then the four factors.

    A torch ``uint8`` batch (after ``ToTensor``, NHWC or NCHW, any device) gets the same parameters
    and arithmetic, one adjustment step at a time over the whole batch
    (:func:`~ffload.loaders.transforms.batch_torch.color_jitter`), in a new tensor.

    Args:
        brightness: ``b`` (factor in ``[max(0, 1 - b), 1 + b]``) or a ``(min, max)`` factor range; 0: off.
        contrast: as ``brightness``.
        saturation: as ``brightness``.
        hue: ``h`` in [0, 0.5] (shift in ``[-h, h]`` of a full turn) or a ``(min, max)`` range in [-0.5, 0.5].

    Raises:
        ConfigurationError: a negative factor, hue outside [-0.5, 0.5].
        PipelineError: (building the pipeline) input not
            ``(H, W, 3) uint8``.
    """

    keeps_geometry = True
    torch_impl = True

    def __init__(
        self,
        brightness: float | Sequence[float] = 0.0,
        contrast: float | Sequence[float] = 0.0,
        saturation: float | Sequence[float] = 0.0,
        hue: float | Sequence[float] = 0.0,
    ):
        self.ranges = np.array(
            [
                range_pair(brightness, "brightness", 1.0, 0.0),
                range_pair(contrast, "contrast", 1.0, 0.0),
                range_pair(saturation, "saturation", 1.0, 0.0),
                range_pair(hue, "hue"),
            ],
            dtype=np.float64,
        )
        if not -0.5 <= self.ranges[3, 0] <= self.ranges[3, 1] <= 0.5:
            raise ConfigurationError(f"hue must lie in [-0.5, 0.5], got {hue}")
        self.enabled = np.array([brightness != 0, contrast != 0, saturation != 0, hue != 0])

    def params(self, seeds: np.ndarray) -> np.ndarray:
        """``(B, 8) float64`` per-sample order and factors for ``(B,) uint64`` seeds."""
        out = np.empty((len(seeds), 8), dtype=np.float64)
        _jitter_params(np.asarray(seeds, dtype=np.uint64), self.salt, self.ranges, out)
        return out

    def __call__(self, src, dst, ctx):
        if self.on_torch:
            x = batch_torch.to_nhwc(src, self.channels_first)
            out = batch_torch.color_jitter(x, self.params(ctx.seeds), self.enabled)
            return batch_torch.from_nhwc(out, self.channels_first)
        _color_jitter(src, self.params(ctx.seeds), self.enabled)
        return src


@njit(nogil=True, cache=True)
def _reflect(i, n):
    # torch's "reflect" padding (OpenCV's BORDER_REFLECT_101), for |i| < 2n
    if i < 0:
        i = -i
    if i >= n:
        i = 2 * n - 2 - i
    return max(i, 0)


@njit(nogil=True, cache=True)
def _blur_sigmas(seeds, salt, sigma_lo, sigma_hi, out):
    for b in range(seeds.shape[0]):
        out[b], _ = uniform_range(seed_state(seeds[b], salt), sigma_lo, sigma_hi)


@njit(nogil=True, cache=True)
def _gaussian_blur(images, sigmas, ksize, scratch):
    # separable blur, float32 like torch's conv2d, rounded; scratch (H, W, C) float32 per call
    batch, height, width, channels = images.shape
    half = ksize // 2
    kernel = np.empty(ksize, dtype=np.float32)
    for b in range(batch):
        sigma = sigmas[b]
        total = np.float32(0.0)
        for k in range(ksize):
            x = np.float32(k - half)
            kernel[k] = np.float32(math.exp(-0.5 * (x / np.float32(sigma)) ** 2))
            total += kernel[k]
        for k in range(ksize):
            kernel[k] /= total
        img = images[b]
        for y in range(height):  # rows first: torchvision convolves with the x kernel, then y
            for x in range(width):
                for c in range(channels):
                    acc = np.float32(0.0)
                    for k in range(ksize):
                        acc += kernel[k] * np.float32(img[y, _reflect(x + k - half, width), c])
                    scratch[y, x, c] = acc
        for y in range(height):
            for x in range(width):
                for c in range(channels):
                    acc = np.float32(0.0)
                    for k in range(ksize):
                        acc += kernel[k] * scratch[_reflect(y + k - half, height), x, c]
                    img[y, x, c] = np.uint8(min(max(np.round(acc), 0.0), 255.0))


class GaussianBlur(NHWCTransform):
    """Blur images with a Gaussian of random standard deviation, in place (torchvision's ``GaussianBlur``).

    The kernel is square.

    Per sample ``sigma`` is uniform in ``sigma`` (a pair, pixels); the kernel is
    ``exp(-x^2 / (2 sigma^2))`` on ``x = -k//2 .. k//2``, normalised, applied along width then
    height in float32 with reflect padding (OpenCV's BORDER_REFLECT_101), rounded to uint8.

    Args:
        kernel_size: side of the square kernel, odd, pixels.
        sigma: standard deviation, pixels: a number, or a ``(min, max)`` range drawn uniformly per sample.

    Raises:
        ConfigurationError: ``kernel_size`` even or < 1; sigma not > 0.
        PipelineError: (building the pipeline) input not numpy ``(H, W, C) uint8``, or not larger than half the kernel.
    """

    keeps_geometry = True

    def __init__(self, kernel_size: int, sigma: float | Sequence[float] = (0.1, 2.0)):
        if int(kernel_size) < 1 or int(kernel_size) % 2 == 0:
            raise ConfigurationError(f"kernel_size must be an odd integer >= 1, got {kernel_size}")
        self.kernel_size = int(kernel_size)
        lo, hi = (float(sigma), float(sigma)) if isinstance(sigma, (int, float)) else range_pair(sigma, "sigma")
        if lo <= 0:
            raise ConfigurationError(f"sigma must be > 0, got {sigma}")
        self.sigma = (lo, hi)

    def declare(self, spec, field, view):
        spec = super().declare(spec, field, view)
        if np.dtype(spec.dtype) != np.uint8 or self.kernel_size // 2 >= min(spec.shape[:2]):
            raise PipelineError(
                f"GaussianBlur({self.kernel_size}) (field '{self.field_name}') needs uint8 images "
                f"larger than half the kernel, got {spec}"
            )
        return spec

    def __call__(self, src, dst, ctx):
        scratch = np.empty(src.shape[1:], dtype=np.float32)
        _gaussian_blur(src, self.params(ctx.seeds), self.kernel_size, scratch)
        return src

    def params(self, seeds: np.ndarray) -> np.ndarray:
        """``(B,) float64`` sigma per sample, as ``__call__`` draws it."""
        out = np.empty(len(seeds), dtype=np.float64)
        _blur_sigmas(np.asarray(seeds, dtype=np.uint64), self.salt, *self.sigma, out)
        return out
