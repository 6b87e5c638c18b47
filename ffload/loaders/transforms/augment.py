"""The augmentations of torchvision's ``transforms`` that image-classification recipes use, as
compiled per-batch kernels on the numpy NHWC ``uint8`` stage (before ``ToTensor``).

Each operation is two numba ``nopython``/``nogil`` calls per batch: a parameter draw from
``ctx.seeds`` and the operation's salt (:mod:`ffload.loaders.rng`: a sample's parameters depend
only on ``(seed, epoch, sample id)``, never on ``num_workers``), then the pixel kernel. The draw
is public as ``op.params(seeds)`` so that tests (and a device implementation) apply exactly the
same parameters. Semantics follow torchvision 0.2x's tensor implementations
(``torchvision/transforms/functional_tensor.py`` / ``_functional_tensor.py``) for ``uint8``
tensors, rounding included: colour operations truncate to ``uint8`` after each step (torch's
``.to(uint8)``), geometric and blur operations round (``_cast_squeeze_out``). Random draws come
from ffload's generator, so the *distribution* of parameters is torchvision's, not its stream.

Warps (:class:`RandomAffine`, :class:`RandomRotation`, :class:`RandomPerspective`) share one
bilinear kernel: output pixel ``(x, y)`` samples the input at ``H @ (x + 0.5, y + 0.5, 1)``
(projective, pixel-corner coordinates) minus 0.5, where ``H`` is torchvision's inverse matrix;
taps outside the image count as zero and the sampled coverage ``m`` blends in ``fill`` as
torchvision's ``_apply_grid_transform`` does: ``out = round(v * m + (1 - m) * fill)``.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from numba import njit

from ffload._jit.simd import narrow_rgb, widen_rgb
from ffload.loaders.decoders.base import flat_view
from ffload.loaders.pipeline.operation import Operation, Spec
from ffload.loaders.rng import randint, seed_state, uniform, uniform_range
from ffload.loaders.transforms.base import _bits, _FilledTransform, _NHWCTransform, _RandomFlip


def _pair(value, name: str, center: float = 0.0, low: float | None = None) -> tuple[float, float]:
    """torchvision's ``_setup_angle`` / ColorJitter ``_check_input``: a number ``v`` means
    ``(center - v, center + v)`` (clipped at ``low``), a pair is taken as it is."""
    if isinstance(value, (int, float)):
        if value < 0:
            raise ValueError(f"{name} must be >= 0 when a single number, got {value}")
        lo, hi = center - float(value), center + float(value)
        if low is not None:
            lo = max(lo, low)
        return lo, hi
    values = tuple(float(v) for v in value)
    if len(values) != 2 or values[0] > values[1]:
        raise ValueError(f"{name} must be a number or a (min, max) pair, got {value}")
    return values


class _RGBTransform(_NHWCTransform):
    """A transform of ``(H, W, 3) uint8`` RGB images (colour operations)."""

    def declare(self, spec, field, view):
        spec = super().declare(spec, field, view)
        if np.dtype(spec.dtype) != np.uint8 or spec.shape[2] != 3:
            raise TypeError(f"{type(self).__name__} (field '{self.field_name}') needs (H, W, 3) uint8 RGB "
                            f"images, got {spec}")
        return spec


# ----------------------------------------------------------------------------- vertical flip
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
    """Flip each ``(H, W, C)`` image upside down with probability ``flip_prob``, in place
    (torchvision's ``RandomVerticalFlip``). Sample b flips when ``uniform(seed_state(seeds[b],
    salt)) < flip_prob``.

    Raises:
        ValueError: ``flip_prob`` outside [0, 1]. TypeError (declare): input not numpy (H, W, C).
    """

    axis = "vflip"

    def __call__(self, src, dst, ctx):
        _vflip(src, ctx.seeds, self.salt, self.flip_prob)
        return src


# ----------------------------------------------------------------------------- colour
@njit(nogil=True, cache=True)
def _gray_u8(r, g, b):
    # torchvision's rgb_to_grayscale on uint8: float32 luma, truncated to uint8
    return np.uint8(np.float32(0.2989) * np.float32(r) + np.float32(0.587) * np.float32(g)
                    + np.float32(0.114) * np.float32(b))


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
    """Replace each RGB image by its luma (``0.2989 R + 0.587 G + 0.114 B``, truncated, in all
    three channels) with probability ``p``, in place (torchvision's ``RandomGrayscale``).

    Raises:
        ValueError: ``p`` outside [0, 1]. TypeError (declare): input not ``(H, W, 3) uint8``.
    """

    keeps_geometry = True

    def __init__(self, p: float = 0.1):
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"p must be in [0, 1], got {p}")
        self.p = float(p)

    def __call__(self, src, dst, ctx):
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
        out[x] = np.float32(np.int32(np.float32(0.2989) * r[x] + np.float32(0.587) * g[x]
                                     + np.float32(0.114) * b[x]))


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
            r[x], g[x], b[x] = (np.float32(np.int32(v & byte)), np.float32(np.int32((v >> 8) & byte)),
                                np.float32(np.int32((v >> 16) & byte)))
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
                rgbx[x] = np.uint32(np.int32(r[x])) | (np.uint32(np.int32(g[x])) << 8) | \
                    (np.uint32(np.int32(b[x])) << 16)
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
    """Randomly change brightness, contrast, saturation and hue, in place (torchvision's
    ``ColorJitter``).

    Per sample: a uniform random order of the four adjustments, then factors ``brightness`` in
    ``[max(0, 1 - b), 1 + b]``, ``contrast`` and ``saturation`` likewise, ``hue`` in ``[-h, h]``
    (``h <= 0.5``); a pair gives the range itself. Each adjustment is torchvision's on uint8:
    brightness blends with black, contrast with the mean of the truncated luma, saturation with
    the truncated luma per pixel (each ``clamp(f * x + (1 - f) * other)`` truncated to uint8),
    hue rotates H in HSV (float32 on ``x / 255``, back as ``trunc(255 * v)``). A factor of 0
    disables its adjustment.

    ``params(seeds)``: ``(B, 8) float64``: the order (4 indices: 0 brightness, 1 contrast,
    2 saturation, 3 hue) then the four factors.

    Raises:
        ValueError: a negative factor, hue outside [-0.5, 0.5]. TypeError (declare): input not
            ``(H, W, 3) uint8``.
    """

    keeps_geometry = True

    def __init__(self, brightness=0.0, contrast=0.0, saturation=0.0, hue=0.0):
        self.ranges = np.array([_pair(brightness, "brightness", 1.0, 0.0), _pair(contrast, "contrast", 1.0, 0.0),
                                _pair(saturation, "saturation", 1.0, 0.0), _pair(hue, "hue")], dtype=np.float64)
        if not -0.5 <= self.ranges[3, 0] <= self.ranges[3, 1] <= 0.5:
            raise ValueError(f"hue must lie in [-0.5, 0.5], got {hue}")
        self.enabled = np.array([brightness != 0, contrast != 0, saturation != 0, hue != 0])

    def params(self, seeds: np.ndarray) -> np.ndarray:
        """``(B, 8) float64`` per-sample order and factors for ``(B,) uint64`` seeds."""
        out = np.empty((len(seeds), 8), dtype=np.float64)
        _jitter_params(np.asarray(seeds, dtype=np.uint64), self.salt, self.ranges, out)
        return out

    def __call__(self, src, dst, ctx):
        _color_jitter(src, self.params(ctx.seeds), self.enabled)
        return src


# ----------------------------------------------------------------------------- blur
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


class GaussianBlur(_NHWCTransform):
    """Blur each image with a Gaussian of random standard deviation, in place (torchvision's
    ``GaussianBlur``; square kernel).

    Per sample ``sigma`` is uniform in ``sigma`` (a pair, pixels); the kernel is
    ``exp(-x^2 / (2 sigma^2))`` on ``x = -k//2 .. k//2``, normalised, applied along width then
    height in float32 with reflect padding (OpenCV's BORDER_REFLECT_101), rounded to uint8.

    Raises:
        ValueError: ``kernel_size`` even or < 1, or smaller than half the image; sigma not > 0.
        TypeError (declare): input not numpy ``(H, W, C) uint8``.
    """

    keeps_geometry = True

    def __init__(self, kernel_size: int, sigma: float | Sequence[float] = (0.1, 2.0)):
        if int(kernel_size) < 1 or int(kernel_size) % 2 == 0:
            raise ValueError(f"kernel_size must be an odd integer >= 1, got {kernel_size}")
        self.kernel_size = int(kernel_size)
        lo, hi = (float(sigma), float(sigma)) if isinstance(sigma, (int, float)) else _pair(sigma, "sigma")
        if lo <= 0:
            raise ValueError(f"sigma must be > 0, got {sigma}")
        self.sigma = (lo, hi)

    def declare(self, spec, field, view):
        spec = super().declare(spec, field, view)
        if np.dtype(spec.dtype) != np.uint8 or self.kernel_size // 2 >= min(spec.shape[:2]):
            raise TypeError(f"GaussianBlur({self.kernel_size}) (field '{self.field_name}') needs uint8 images "
                            f"larger than half the kernel, got {spec}")
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


# ----------------------------------------------------------------------------- erasing
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


class RandomErasing(_FilledTransform):
    """Erase a random rectangle of each image with probability ``p``, in place (torchvision's
    ``RandomErasing``; Zhong et al. 2017, https://arxiv.org/abs/1708.04896).

    Per erased sample: up to 10 attempts draw an area fraction in ``scale`` and a log-uniform
    aspect ratio in ``ratio``; ``h = round(sqrt(area * ratio))``, ``w = round(sqrt(area / ratio))``;
    the first box that fits strictly inside is placed uniformly and painted with ``fill``; if none
    fits the sample is left as it is.

    ``params(seeds, height, width)``: ``(B, 4) int64`` ``(top, left, h, w)``, ``h = 0`` when not
    erased.

    Raises:
        ValueError: ``p`` outside [0, 1], bad ranges or fill. TypeError (declare): input not
            numpy (H, W, C).
    """

    keeps_geometry = True

    def __init__(self, p: float = 0.5, scale=(0.02, 0.33), ratio=(0.3, 3.3), fill: Sequence[float] = (0, 0, 0)):
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"p must be in [0, 1], got {p}")
        self.p = float(p)
        self.scale = np.array(_pair(scale, "scale"), dtype=np.float64)
        lo, hi = _pair(ratio, "ratio")
        if not 0 <= self.scale[0] <= self.scale[1] <= 1 or lo <= 0:
            raise ValueError(f"scale must lie in [0, 1] and ratio be > 0, got {scale}, {ratio}")
        self.log_ratio = np.log(np.array([lo, hi], dtype=np.float64))
        self.fill = tuple(fill)

    def params(self, seeds: np.ndarray, height: int, width: int) -> np.ndarray:
        """``(B, 4) int64`` erased boxes for images of ``height x width`` pixels."""
        out = np.empty((len(seeds), 4), dtype=np.int64)
        _erasing_params(np.asarray(seeds, dtype=np.uint64), self.salt, height, width, self.p, self.scale,
                        self.log_ratio, out)
        return out

    def __call__(self, src, dst, ctx):
        _erase(_bits(src), self.params(ctx.seeds, src.shape[1], src.shape[2]), self._fill_bits)
        return src


# ----------------------------------------------------------------------------- random crop
@njit(nogil=True, cache=True)
def _random_crop(src, dst, seeds, salt, pad_top, pad_left, fill):
    # src (B, H, W, C) padded virtually by pad_top/pad_left (and the matching bottom/right) of fill
    batch, height, width, channels = src.shape
    out_h, out_w = dst.shape[1], dst.shape[2]
    padded_h, padded_w = height + 2 * pad_top, width + 2 * pad_left
    for b in range(batch):
        state = seed_state(seeds[b], salt)
        i, state = randint(state, padded_h - out_h + 1)
        j, state = randint(state, padded_w - out_w + 1)
        for y in range(out_h):
            sy = y + i - pad_top
            for x in range(out_w):
                sx = x + j - pad_left
                inside = 0 <= sy < height and 0 <= sx < width
                for c in range(channels):
                    dst[b, y, x, c] = src[b, sy, sx, c] if inside else fill[c]


class RandomCrop(_FilledTransform):
    """Cut a random ``size`` window from each image after padding it by ``padding`` pixels of
    ``fill`` on every side (torchvision's ``RandomCrop`` with ``padding_mode='constant'``; with
    ``pad_if_needed`` images smaller than ``size`` are padded up first, as torchvision does).

    Output per sample: ``(h, w, C)`` of the input dtype. The window's top ``i`` then left ``j`` are
    uniform over the positions inside the padded image.

    Raises:
        ValueError: non-positive size, negative padding, bad fill. TypeError (declare): input not
            numpy (H, W, C), or smaller than ``size`` without ``pad_if_needed``.
    """

    def __init__(self, size: int | Sequence[int], padding: int = 0, pad_if_needed: bool = False,
                 fill: Sequence[float] = (0, 0, 0)):
        h, w = (int(size), int(size)) if isinstance(size, (int, np.integer)) else (int(size[0]), int(size[1]))
        if h < 1 or w < 1 or int(padding) < 0:
            raise ValueError(f"size must be >= 1 and padding >= 0, got {size}, {padding}")
        self.size = (h, w)
        self.padding = int(padding)
        self.pad_if_needed = bool(pad_if_needed)
        self.fill = tuple(fill)

    def declare(self, spec, field, view):
        spec = super().declare(spec, field, view)
        height, width = spec.shape[0] + 2 * self.padding, spec.shape[1] + 2 * self.padding
        extra_h = max(self.size[0] - height, 0) if self.pad_if_needed else 0
        extra_w = max(self.size[1] - width, 0) if self.pad_if_needed else 0
        # torchvision pads both sides by the missing amount when pad_if_needed
        self._pads = (self.padding + extra_h, self.padding + extra_w)
        if height + 2 * extra_h < self.size[0] or width + 2 * extra_w < self.size[1]:
            raise TypeError(f"RandomCrop{self.size} (field '{self.field_name}'): images of {spec.shape[:2]} "
                            f"padded by {self.padding} are smaller than the crop; pass pad_if_needed=True")
        return Spec((*self.size, spec.shape[2]), spec.dtype)

    def buffer_spec(self, spec_out, batch_size):
        return Operation.buffer_spec(self, spec_out, batch_size)

    def __call__(self, src, dst, ctx):
        out = dst[:src.shape[0]]
        _random_crop(_bits(src), _bits(out), ctx.seeds, self.salt, *self._pads, self._fill_bits)
        return out


# ----------------------------------------------------------------------------- warps
@njit(nogil=True, cache=True)
def _inverse_affine(angle, tx, ty, scale, shear_x, shear_y, cx, cy, out):
    # torchvision's _get_inverse_affine_matrix (pixel-corner coordinates, centre (cx, cy))
    rot = math.radians(angle)
    sx = math.radians(shear_x)
    sy = math.radians(shear_y)
    a = math.cos(rot - sy) / math.cos(sy)
    b = -math.cos(rot - sy) * math.tan(sx) / math.cos(sy) - math.sin(rot)
    c = math.sin(rot - sy) / math.cos(sy)
    d = -math.sin(rot - sy) * math.tan(sx) / math.cos(sy) + math.cos(rot)
    m0, m1, m3, m4 = d / scale, -b / scale, -c / scale, a / scale
    out[0, 0], out[0, 1] = m0, m1
    out[0, 2] = m0 * (-cx - tx) + m1 * (-cy - ty) + cx
    out[1, 0], out[1, 1] = m3, m4
    out[1, 2] = m3 * (-cx - tx) + m4 * (-cy - ty) + cy
    out[2, 0], out[2, 1], out[2, 2] = 0.0, 0.0, 1.0


@njit(nogil=True, cache=True)
def _affine_params(seeds, salt, height, width, ranges, translate, apply_prob, out):
    # ranges (4, 2): degrees, scale, shear_x, shear_y; translate (2,) fractions; out (B, 3, 3)
    for b in range(seeds.shape[0]):
        state = seed_state(seeds[b], salt)
        u, state = uniform(state)
        if u >= apply_prob:
            _inverse_affine(0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, out[b])
            continue
        angle, state = uniform_range(state, ranges[0, 0], ranges[0, 1])
        dx, state = uniform_range(state, -translate[0] * width, translate[0] * width)
        dy, state = uniform_range(state, -translate[1] * height, translate[1] * height)
        scale, state = uniform_range(state, ranges[1, 0], ranges[1, 1])
        shx, state = uniform_range(state, ranges[2, 0], ranges[2, 1])
        shy, state = uniform_range(state, ranges[3, 0], ranges[3, 1])
        _inverse_affine(angle, np.round(dx), np.round(dy), scale, shx, shy, width * 0.5, height * 0.5, out[b])


@njit(nogil=True, cache=True)
def _warp_border(s, x, y, sx, sy, fill, out):
    # a pixel whose taps are partly outside: zero-padded taps, torchvision's coverage blend
    height, width, channels = s.shape
    x0, y0 = int(math.floor(sx)), int(math.floor(sy))
    fx, fy = sx - x0, sy - y0
    cover = 0.0
    for c in range(channels):
        out[c] = 0.0
    for ty in range(2):
        yy = y0 + ty
        wy = fy if ty else 1.0 - fy
        if 0 <= yy < height:
            for tx in range(2):
                xx = x0 + tx
                wx = fx if tx else 1.0 - fx
                if 0 <= xx < width:
                    cover += wx * wy
                    for c in range(channels):
                        out[c] += wx * wy * s[yy, xx, c]
    for c in range(channels):
        out[c] = min(max(np.round(out[c] * cover + (1.0 - cover) * fill[c]), 0.0), 255.0)


@njit(nogil=True, cache=True)
def _is_identity(m):
    return (m[0, 0] == 1.0 and m[0, 1] == 0.0 and m[0, 2] == 0.0 and m[1, 0] == 0.0 and m[1, 1] == 1.0
            and m[1, 2] == 0.0 and m[2, 0] == 0.0 and m[2, 1] == 0.0 and m[2, 2] == 1.0)


@njit(nogil=True, cache=True)
def _copy_flat(src, dst):
    # dst[:] = src for 1-D arrays, a vectorised loop (numba's copy of an (H, W, C) image walks it
    # element by element, ~25x slower than memcpy)
    for k in range(np.uint64(src.shape[0])):
        dst[k] = src[k]


@njit(nogil=True, cache=True)
def _warp(src, dst, mats, fill):
    # dst[b, y, x] = bilinear src at mats[b] @ (x + .5, y + .5, 1) - .5, torchvision's fill blend.
    # Coordinates advance incrementally along a row; pixels whose four taps are inside (almost
    # all of them) take the branch-free path on flat rows (3 channels unrolled), the rest
    # _warp_border; an identity matrix (a sample the op leaves alone) is a copy.
    batch, height, width, channels = src.shape
    out_h, out_w = dst.shape[1], dst.shape[2]
    border = np.empty(channels, dtype=np.float64)
    x_max, y_max = width - 1.0, height - 1.0
    row = width * channels
    for b in range(batch):
        s, d, m = src[b], dst[b], mats[b]
        if _is_identity(m) and out_h == height and out_w == width:
            _copy_flat(s.reshape(-1), d.reshape(-1))
            continue
        sf = s.reshape(-1)
        for y in range(out_h):
            py = y + 0.5
            nx = m[0, 0] * 0.5 + m[0, 1] * py + m[0, 2]
            ny = m[1, 0] * 0.5 + m[1, 1] * py + m[1, 2]
            nw = m[2, 0] * 0.5 + m[2, 1] * py + m[2, 2]
            for x in range(out_w):
                inv = 1.0 / nw
                sx, sy = nx * inv - 0.5, ny * inv - 0.5
                nx += m[0, 0]
                ny += m[1, 0]
                nw += m[2, 0]
                if 0.0 <= sx < x_max and 0.0 <= sy < y_max:
                    x0, y0 = int(sx), int(sy)
                    fx, fy = sx - x0, sy - y0
                    w00, w01 = (1.0 - fx) * (1.0 - fy), fx * (1.0 - fy)
                    w10, w11 = (1.0 - fx) * fy, fx * fy
                    i = np.uint64(y0 * row + x0 * channels)
                    j = i + np.uint64(row)
                    if channels == 3:
                        u1, u2, u3, u4, u5 = np.uint64(1), np.uint64(2), np.uint64(3), np.uint64(4), np.uint64(5)
                        d[y, x, 0] = np.uint8(w00 * sf[i] + w01 * sf[i + u3] + w10 * sf[j] + w11 * sf[j + u3] + 0.5)
                        d[y, x, 1] = np.uint8(w00 * sf[i + u1] + w01 * sf[i + u4] + w10 * sf[j + u1]
                                              + w11 * sf[j + u4] + 0.5)
                        d[y, x, 2] = np.uint8(w00 * sf[i + u2] + w01 * sf[i + u5] + w10 * sf[j + u2]
                                              + w11 * sf[j + u5] + 0.5)
                    else:
                        for c in range(channels):
                            v = (w00 * s[y0, x0, c] + w01 * s[y0, x0 + 1, c] + w10 * s[y0 + 1, x0, c]
                                 + w11 * s[y0 + 1, x0 + 1, c])
                            d[y, x, c] = np.uint8(v + 0.5)
                elif -1.0 < sx < width and -1.0 < sy < height:
                    _warp_border(s, x, y, sx, sy, fill, border)
                    for c in range(channels):
                        d[y, x, c] = np.uint8(border[c])
                else:
                    for c in range(channels):
                        d[y, x, c] = np.uint8(fill[c])


@njit(nogil=True, cache=True, error_model="numpy")  # no ZeroDivisionError branch: vectorises
def _warp_row_coords(m, y, pxs, sxs, sys_, n):
    # the source coordinates of output row y: m @ (x + .5, y + .5, 1), projected, minus .5, with
    # pxs[x] = x + .5 (one vectorised loop; affine matrices skip the division)
    py = y + 0.5
    bx, by, bw = m[0, 1] * py + m[0, 2], m[1, 1] * py + m[1, 2], m[2, 1] * py + m[2, 2]
    m00, m10, m20 = m[0, 0], m[1, 0], m[2, 0]
    if m20 == 0.0 and bw == 1.0:
        for x in range(n):
            px = pxs[x]
            sxs[x] = m00 * px + bx - 0.5
            sys_[x] = m10 * px + by - 0.5
    else:
        for x in range(n):
            px = pxs[x]
            inv = 1.0 / (m20 * px + bw)
            sxs[x] = (m00 * px + bx) * inv - 0.5
            sys_[x] = (m10 * px + by) * inv - 0.5


@njit(nogil=True, cache=True)
def _row_taps(sxs, sys_, height, width, idx, fxs, fys, covers, n):
    # per pixel of a row, from its source coordinates (float64): the index of its top-left tap in
    # the zero-bordered packed image (clamped so that all four taps lie inside it), the fractions
    # (float32) and the coverage, the bilinear weight of the taps inside the image (float32; exactly
    # 1 when all four are, 0 when none is). Coordinates are clamped to [-2, side + 1] first (NaN or
    # infinity from a zero denominator too: they sample only fill). Branch-free: vectorises.
    pw = np.int32(width + 2)
    one, zero = np.float32(1.0), np.float32(0.0)
    x_hi, y_hi = width + 1.0, height + 1.0
    w1, h1 = np.int32(width - 1), np.int32(height - 1)
    for x in range(n):
        sx, sy = sxs[x], sys_[x]
        sx = sx if sx > -2.0 else -2.0
        sx = sx if sx < x_hi else x_hi
        sy = sy if sy > -2.0 else -2.0
        sy = sy if sy < y_hi else y_hi
        fx0, fy0 = math.floor(sx), math.floor(sy)
        x0, y0 = np.int32(fx0), np.int32(fy0)
        fx, fy = np.float32(sx - fx0), np.float32(sy - fy0)
        lx, rx = (x0 >= 0) & (x0 <= w1), (x0 >= -1) & (x0 < w1)
        ty, by = (y0 >= 0) & (y0 <= h1), (y0 >= -1) & (y0 < h1)
        cx = one if lx & rx else (one - fx if lx else (fx if rx else zero))
        cy = one if ty & by else (one - fy if ty else (fy if by else zero))
        xi = x0 if x0 > -1 else np.int32(-1)
        xi = xi if xi < w1 else w1
        yi = y0 if y0 > -1 else np.int32(-1)
        yi = yi if yi < h1 else h1
        idx[x] = (yi + 1) * pw + xi + 1
        fxs[x], fys[x], covers[x] = fx, fy, cx * cy


@njit(nogil=True, cache=True)
def _blend_channel(t00, t01, t10, t11, shift, fx, fy, cover, fill):
    # one channel (bits shift.. of the packed taps) bilinear in float32, the fill blended in by
    # coverage (torchvision's v * m + (1 - m) * fill), rounded half up
    byte = np.uint32(255)
    a, b = np.float32(np.int32((t00 >> shift) & byte)), np.float32(np.int32((t01 >> shift) & byte))
    c, d = np.float32(np.int32((t10 >> shift) & byte)), np.float32(np.int32((t11 >> shift) & byte))
    top = a + fx * (b - a)
    v = top + fy * ((c + fx * (d - c)) - top)
    v = v if cover == np.float32(1.0) else v * cover + (np.float32(1.0) - cover) * fill
    return np.uint32(np.int32(v + np.float32(0.5)))


@njit(nogil=True, cache=True)
def _warp_rgb(src, dst, mats, fill):
    # _warp for 3 channels, row by row in vectorised passes: the image widened once to one uint32
    # per pixel (R | G << 8 | B << 16, simd.widen_rgb) inside a border of zero pixels, then per
    # output row its source coordinates (float64, computed directly rather than incrementally),
    # the taps' index, fractions and coverage (_row_taps), the four taps of every pixel (four
    # uint32 loads), the float32 blend per channel (_blend_channel: torchvision's own precision for
    # tensors, so a value may differ from _warp's by one where it lies within ~1e-4 of a rounding
    # boundary), narrowed back to RGB (simd.narrow_rgb). Taps outside the image read the zero
    # border, so partly covered and outside pixels need no separate path; a zero denominator
    # samples the fill instead of raising ZeroDivisionError. An identity matrix is a copy.
    batch, height, width = src.shape[0], src.shape[1], src.shape[2]
    out_h, out_w = dst.shape[1], dst.shape[2]
    pw = width + 2
    sxs, sys_ = np.empty(out_w), np.empty(out_w)
    pxs = np.arange(out_w) + 0.5
    fxs, fys, covers = np.empty(out_w, np.float32), np.empty(out_w, np.float32), np.empty(out_w, np.float32)
    idx = np.empty(out_w, np.int32)
    taps = np.empty((4, out_w), np.uint32)
    packed = np.zeros((height + 2) * pw, np.uint32)
    rgbx = np.empty(out_w, np.uint32)
    f0, f1, f2 = np.float32(fill[0]), np.float32(fill[1]), np.float32(fill[2])
    u1, row = np.uint64(1), np.uint64(pw)
    flat, flat_out = src.reshape(-1), dst.reshape(-1)
    for b in range(batch):
        m = mats[b]
        if _is_identity(m) and out_h == height and out_w == width:
            _copy_flat(src[b].reshape(-1), dst[b].reshape(-1))
            continue
        for y in range(height):
            widen_rgb(flat, (b * height + y) * width * 3, width, packed, (y + 1) * pw + 1)
        for y in range(out_h):
            _warp_row_coords(m, y, pxs, sxs, sys_, out_w)
            _row_taps(sxs, sys_, height, width, idx, fxs, fys, covers, out_w)
            t00, t01, t10, t11 = taps[0], taps[1], taps[2], taps[3]
            for x in range(out_w):
                i = np.uint64(idx[x])
                t00[x], t01[x] = packed[i], packed[i + u1]
                t10[x], t11[x] = packed[i + row], packed[i + row + u1]
            for x in range(out_w):
                fx, fy, cover = fxs[x], fys[x], covers[x]
                a00, a01, a10, a11 = t00[x], t01[x], t10[x], t11[x]
                rgbx[x] = (_blend_channel(a00, a01, a10, a11, 0, fx, fy, cover, f0)
                           | (_blend_channel(a00, a01, a10, a11, 8, fx, fy, cover, f1) << 8)
                           | (_blend_channel(a00, a01, a10, a11, 16, fx, fy, cover, f2) << 16))
            narrow_rgb(rgbx, 0, out_w, flat_out, (b * out_h + y) * out_w * 3)


class _Warp(_FilledTransform):
    """Base of the bilinear warps: ``(H, W, C) uint8`` in, the same shape out (into a buffer);
    subclasses implement ``params(seeds, height, width) -> (B, 3, 3) float64`` inverse matrices."""

    def declare(self, spec, field, view):
        spec = super().declare(spec, field, view)
        if np.dtype(spec.dtype) != np.uint8:
            raise TypeError(f"{type(self).__name__} (field '{self.field_name}') needs uint8 images, got {spec}")
        return spec

    def buffer_spec(self, spec_out, batch_size):
        return Operation.buffer_spec(self, spec_out, batch_size)

    def __call__(self, src, dst, ctx):
        out = dst[:src.shape[0]]
        warp = _warp_rgb if src.shape[3] == 3 else _warp
        warp(np.ascontiguousarray(src), out, self.params(ctx.seeds, src.shape[1], src.shape[2]),
             self._fill_bits.astype(np.float64))
        return out


class RandomAffine(_Warp):
    """Random rotation, translation, scale and shear about the image centre, bilinear
    (torchvision's ``RandomAffine`` on tensors).

    Per sample: angle uniform in ``degrees`` (a number d means ``(-d, d)``; clockwise, as
    torchvision's ``affine``), translation ``round(uniform(-t_x W, t_x W))`` then the same in y,
    scale uniform in ``scale``, shear x uniform in ``shear[:2]`` and y in ``shear[2:]`` (a number s
    means x shear in ``(-s, s)``). ``params(seeds, height, width)``: ``(B, 3, 3) float64`` inverse
    matrices in pixel-corner coordinates (torchvision's ``_get_inverse_affine_matrix``).

    Raises:
        ValueError: bad ranges or fill. TypeError (declare): input not numpy (H, W, C) uint8.
    """

    _apply_prob = 1.0

    def __init__(self, degrees, translate: Sequence[float] | None = None, scale: Sequence[float] | None = None,
                 shear=None, fill: Sequence[float] = (0, 0, 0)):
        shear = (0.0, 0.0) if shear is None else shear
        shear4 = (_pair(shear, "shear") + (0.0, 0.0)) if isinstance(shear, (int, float)) or len(shear) == 2 \
            else (_pair(shear[:2], "shear") + _pair(shear[2:], "shear"))
        self.ranges = np.array([_pair(degrees, "degrees"), _pair(scale or (1.0, 1.0), "scale"), shear4[:2],
                                shear4[2:]], dtype=np.float64)
        self.translate = np.array(translate or (0.0, 0.0), dtype=np.float64)
        if self.translate.shape != (2,) or not np.all((0 <= self.translate) & (self.translate <= 1)):
            raise ValueError(f"translate must be two fractions in [0, 1], got {translate}")
        if self.ranges[1, 0] <= 0:
            raise ValueError(f"scale must be > 0, got {scale}")
        self.fill = tuple(fill)

    def params(self, seeds: np.ndarray, height: int, width: int) -> np.ndarray:
        """``(B, 3, 3) float64`` inverse matrices for images of ``height x width`` pixels."""
        out = np.empty((len(seeds), 3, 3), dtype=np.float64)
        _affine_params(np.asarray(seeds, dtype=np.uint64), self.salt, height, width, self.ranges,
                       self.translate, self._apply_prob, out)
        return out

    def record_geometry(self, geometry, ctx):
        """Append this batch's warps to ``geometry`` (:mod:`.geometry`): the inverse matrices the
        image is sampled with (pixel-edge coordinates, see :meth:`params`) and their inverses."""
        height, width = geometry.out_size
        inverse = self.params(ctx.seeds, height, width)
        geometry.add_step(np.linalg.inv(inverse), inverse)


class RandomRotation(RandomAffine):
    """Rotate by an angle uniform in ``degrees`` about the centre, bilinear, same size
    (torchvision's ``RandomRotation`` without ``expand``; its angle is counter-clockwise, which
    for a symmetric range is the same distribution).

    Raises:
        ValueError: bad degrees or fill. TypeError (declare): input not numpy (H, W, C) uint8.
    """

    def __init__(self, degrees, fill: Sequence[float] = (0, 0, 0)):
        super().__init__(degrees, fill=fill)
        self.ranges[0] = -self.ranges[0, ::-1]


@njit(nogil=True, cache=True)
def _solve8(a, rhs):
    # Gaussian elimination with partial pivoting of an 8x8 system (torch.linalg.lstsq of a square
    # full-rank system gives the same solution)
    n = 8
    for col in range(n):
        piv = col
        for r in range(col + 1, n):
            if abs(a[r, col]) > abs(a[piv, col]):
                piv = r
        if piv != col:
            for k in range(n):
                a[col, k], a[piv, k] = a[piv, k], a[col, k]
            rhs[col], rhs[piv] = rhs[piv], rhs[col]
        for r in range(col + 1, n):
            f = a[r, col] / a[col, col]
            for k in range(col, n):
                a[r, k] -= f * a[col, k]
            rhs[r] -= f * rhs[col]
    x = np.zeros(n)
    for r in range(n - 1, -1, -1):
        s = rhs[r]
        for k in range(r + 1, n):
            s -= a[r, k] * x[k]
        x[r] = s / a[r, r]
    return x


@njit(nogil=True, cache=True)
def _perspective_params(seeds, salt, height, width, distortion, prob, out, corners):
    # out (B, 3, 3) inverse homographies; corners (B, 4, 2) end points (identity when not applied)
    half_h, half_w = height // 2, width // 2
    dw, dh = int(distortion * half_w), int(distortion * half_h)
    start = np.array([[0.0, 0.0], [width - 1.0, 0.0], [width - 1.0, height - 1.0], [0.0, height - 1.0]])
    for b in range(seeds.shape[0]):
        state = seed_state(seeds[b], salt)
        u, state = uniform(state)
        if u >= prob:
            corners[b] = start
            out[b] = np.eye(3)
            continue
        x, state = randint(state, dw + 1)
        y, state = randint(state, dh + 1)
        corners[b, 0, 0], corners[b, 0, 1] = x, y
        x, state = randint(state, dw + 1)
        y, state = randint(state, dh + 1)
        corners[b, 1, 0], corners[b, 1, 1] = width - 1 - x, y
        x, state = randint(state, dw + 1)
        y, state = randint(state, dh + 1)
        corners[b, 2, 0], corners[b, 2, 1] = width - 1 - x, height - 1 - y
        x, state = randint(state, dw + 1)
        y, state = randint(state, dh + 1)
        corners[b, 3, 0], corners[b, 3, 1] = x, height - 1 - y
        a = np.zeros((8, 8))
        rhs = np.zeros(8)
        for i in range(4):  # torchvision's _get_perspective_coeffs: end points -> start points
            ex, ey = corners[b, i, 0], corners[b, i, 1]
            sx, sy = start[i, 0], start[i, 1]
            a[2 * i, 0], a[2 * i, 1], a[2 * i, 2] = ex, ey, 1.0
            a[2 * i, 6], a[2 * i, 7] = -sx * ex, -sx * ey
            a[2 * i + 1, 3], a[2 * i + 1, 4], a[2 * i + 1, 5] = ex, ey, 1.0
            a[2 * i + 1, 6], a[2 * i + 1, 7] = -sy * ex, -sy * ey
            rhs[2 * i], rhs[2 * i + 1] = sx, sy
        c = _solve8(a, rhs)
        out[b, 0, 0], out[b, 0, 1], out[b, 0, 2] = c[0], c[1], c[2]
        out[b, 1, 0], out[b, 1, 1], out[b, 1, 2] = c[3], c[4], c[5]
        out[b, 2, 0], out[b, 2, 1], out[b, 2, 2] = c[6], c[7], 1.0


class RandomPerspective(_Warp):
    """A random perspective distortion with probability ``p``, bilinear (torchvision's
    ``RandomPerspective``).

    Per distorted sample, each corner moves inwards by integers uniform in
    ``0 .. int(distortion_scale * W // 2)`` (x) and ``0 .. int(distortion_scale * H // 2)`` (y),
    top-left, top-right, bottom-right, bottom-left, x before y, as torchvision's ``get_params``;
    the homography maps those end points to the original corners (torchvision's
    ``_get_perspective_coeffs``, solved exactly in float64). ``params(seeds, height, width)``:
    ``(B, 3, 3) float64`` inverse homographies; ``corners(seeds, height, width)``: the end points.

    Raises:
        ValueError: ``distortion_scale`` or ``p`` outside [0, 1], bad fill. TypeError (declare):
            input not numpy (H, W, C) uint8.
    """

    def __init__(self, distortion_scale: float = 0.5, p: float = 0.5, fill: Sequence[float] = (0, 0, 0)):
        if not 0.0 <= distortion_scale <= 1.0 or not 0.0 <= p <= 1.0:
            raise ValueError(f"distortion_scale and p must be in [0, 1], got {distortion_scale}, {p}")
        self.distortion_scale = float(distortion_scale)
        self.p = float(p)
        self.fill = tuple(fill)

    def _draw(self, seeds, height, width):
        out = np.empty((len(seeds), 3, 3), dtype=np.float64)
        corners = np.empty((len(seeds), 4, 2), dtype=np.float64)
        _perspective_params(np.asarray(seeds, dtype=np.uint64), self.salt, height, width,
                            self.distortion_scale, self.p, out, corners)
        return out, corners

    def params(self, seeds: np.ndarray, height: int, width: int) -> np.ndarray:
        """``(B, 3, 3) float64`` inverse homographies (pixel-corner coordinates)."""
        return self._draw(seeds, height, width)[0]

    def corners(self, seeds: np.ndarray, height: int, width: int) -> np.ndarray:
        """``(B, 4, 2) float64`` end points of the corners (x, y), torchvision's ``endpoints``."""
        return self._draw(seeds, height, width)[1]
