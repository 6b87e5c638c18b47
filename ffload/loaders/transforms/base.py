"""Image transforms of the numpy NHWC stage: one compiled kernel per batch, in place when the
shape and dtype do not change (then ``buffer_spec`` is ``None``).

Random decisions derive from ``ctx.seeds`` (one seed per sample) and the operation's ``salt``
(see :mod:`ffload.loaders.rng`), so a sample's augmentation depends only on ``(seed, epoch,
sample id)``. Kernels move pixels as unsigned integers of the element size, so every dtype works
(float16 included, which numba cannot compute with).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import torch
from numba import njit

from ffload.errors import ConfigurationError
from ffload.loaders.decoders.base import field_name, flat_view
from ffload.loaders.decoders.rgb import flip_draws
from ffload.loaders.pipeline.operation import Operation, Spec
from ffload.loaders.rng import op_salt, randint, seed_state, uniform
from ffload.loaders.transforms.torch_ops import numpy_dtype, torch_dtype


def _bits(array: np.ndarray) -> np.ndarray:
    """``array`` viewed as unsigned integers of the same element size."""
    return array.view(np.dtype(f"u{array.dtype.itemsize}"))


class _NHWCTransform(Operation):
    """Base of the in-place random transforms: checks for a numpy ``(H, W, C)`` input, needs no
    buffer.

    Attributes:
        salt: ``uint64`` mixed into every sample seed, set at declare from the class and field
            names (two fields, or two different ops, draw independently).
    """

    def declare(self, spec, field, view):
        name = field_name(field, view)
        if spec is None or spec.on_torch or len(spec.shape) != 3:
            raise TypeError(f"{type(self).__name__} (field '{name}') works on numpy (H, W, C) "
                            f"images before ToTensor, got {spec}")
        self.salt = op_salt(type(self).__name__, name)
        self.field_name = name
        return spec

    def buffer_spec(self, spec_out, batch_size):
        return None

    def _fill(self, fill, spec) -> np.ndarray:
        """The fill colour as ``(C,)`` unsigned bits of the image dtype."""
        fill = np.asarray(fill, dtype=np.float64).reshape(-1)
        channels = spec.shape[2]
        if fill.size != channels:
            raise ValueError(f"{type(self).__name__} (field '{self.field_name}'): fill has "
                             f"{fill.size} values for {channels} channels")
        dtype = np.dtype(spec.dtype)
        if dtype.kind in "ui":
            info = np.iinfo(dtype)
            if fill.min() < info.min or fill.max() > info.max or np.any(fill != np.round(fill)):
                raise ValueError(f"{type(self).__name__} (field '{self.field_name}'): fill "
                                 f"{fill.tolist()} is not representable as {dtype}")
        return _bits(fill.astype(dtype))


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


class _RandomFlip(_NHWCTransform):
    """Base of the random flips: sample b flips when ``uniform(seed_state(seeds[b], salt)) <
    flip_prob``. Raises ValueError for ``flip_prob`` outside [0, 1]."""

    axis = "hflip"  # the Geometry attribute it toggles

    def __init__(self, flip_prob: float = 0.5):
        if not 0.0 <= flip_prob <= 1.0:
            raise ValueError(f"flip_prob must be in [0, 1], got {flip_prob}")
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
    """Flip each ``(H, W, C)`` image left-right with probability ``flip_prob``, in place
    (FFCV's / torchvision's ``RandomHorizontalFlip``).

    Sample b flips when ``uniform(seed_state(seeds[b], salt)) < flip_prob``. Directly after an
    RGB image decoder, the decoder mirrors the samples while writing them and this stage does
    nothing (:attr:`fused`; the hook is described in :class:`~.operation.Operation`).

    Raises:
        ValueError: ``flip_prob`` outside [0, 1]. TypeError (declare): input not numpy (H, W, C).
    """

    fused = False

    def fusable_flip(self):
        return self.flip_prob, self.salt

    def __call__(self, src, dst, ctx):
        if not self.fused:  # fused: the decoder before it has flipped the samples
            _flip(flat_view(_bits(src)), *src.shape, ctx.seeds, self.salt, self.flip_prob)
        return src


@njit(nogil=True, cache=True)
def _fill_pixels(flat, start, count, fill):
    # count pixels of fill from element offset start
    c_n = np.uint64(fill.shape[0])
    d = np.uint64(start)
    for _ in range(count):
        for c in range(c_n):
            flat[d + c] = fill[c]
        d += c_n


@njit(nogil=True, cache=True)
def translate_offsets(seeds, salt, padding, out):
    """``out[b] = (dy, dx)``: the shift :func:`_translate` applies to sample b (``out[r, c] =
    in[r + dy, c + dx]``), ``y`` then ``x`` uniform in ``{0..2 * padding}`` minus ``padding``."""
    for b in range(seeds.shape[0]):
        state = seed_state(seeds[b], salt)
        y, state = randint(state, 2 * padding + 1)
        x, state = randint(state, 2 * padding + 1)
        out[b, 0] = y - padding
        out[b, 1] = x - padding


@njit(nogil=True, cache=True)
def _translate(flat, batch, height, width, channels, shifts, fill):
    # flat: (B * H * W * C,); out[r, c] = in[r + dy, c + dx] where inside, else fill; shifts (B, 2) (dy, dx)
    row = width * channels
    for b in range(batch):
        dy = shifts[b, 0]
        dx = shifts[b, 1]
        lo = min(max(-dx, 0), width)  # destination columns [lo, hi) have a source
        hi = max(min(width - dx, width), lo)
        n = np.uint64((hi - lo) * channels)
        for rr in range(height):
            r = rr if dy >= 0 else height - 1 - rr  # read rows before they are overwritten
            sr = r + dy
            d_row = (b * height + r) * row
            if sr < 0 or sr >= height:
                _fill_pixels(flat, d_row, width, fill)
                continue
            d0 = np.uint64(d_row + lo * channels)
            s0 = np.uint64((b * height + sr) * row + (lo + dx) * channels)
            if dx >= 0 or sr != r:
                for k in range(n):
                    flat[d0 + k] = flat[s0 + k]
            else:  # same row, source on the left: copy right to left
                for k in range(n):
                    flat[d0 + n - 1 - k] = flat[s0 + n - 1 - k]
            _fill_pixels(flat, d_row, lo, fill)
            _fill_pixels(flat, d_row + hi * channels, width - hi, fill)


class _FilledTransform(_NHWCTransform):
    """An in-place transform that paints ``self.fill`` (checked against the image dtype at
    declare)."""

    def declare(self, spec, field, view):
        spec = super().declare(spec, field, view)
        self._fill_bits = self._fill(self.fill, spec)
        return spec


class RandomTranslate(_FilledTransform):
    """Shift each image by a random offset, in place (FFCV's ``RandomTranslate``).

    FFCV semantics: the image is padded by ``padding`` pixels of ``fill`` on every side and a
    ``H x W`` window is cut at ``(y, x)``, ``y`` then ``x`` uniform in ``{0, ..., 2 * padding}``
    (drawn in that order from the sample's generator): ``out[r, c] = in[r + y - padding,
    c + x - padding]`` where inside, else ``fill``.

    Args:
        padding: pixels, >= 0.
        fill: per-channel colour (``C`` values representable in the image dtype).

    Raises:
        ValueError: negative padding, bad fill. TypeError (declare): input not numpy (H, W, C).
    """

    def __init__(self, padding: int, fill: Sequence[float] = (0, 0, 0)):
        if int(padding) < 0:
            raise ValueError(f"padding must be >= 0, got {padding}")
        self.padding = int(padding)
        self.fill = tuple(fill)

    def offsets(self, seeds: np.ndarray) -> np.ndarray:
        """``(B, 2) int64`` ``(dy, dx)`` per sample: ``out[r, c] = in[r + dy, c + dx]``."""
        out = np.empty((len(seeds), 2), np.int64)
        translate_offsets(np.asarray(seeds, np.uint64), self.salt, self.padding, out)
        return out

    def record_geometry(self, geometry, ctx):
        """Append this batch's shifts to ``geometry``: a point ``(x, y)`` moves to ``(x - dx, y - dy)``."""
        shift = self.offsets(ctx.seeds)
        forward = np.tile(np.eye(3), (len(shift), 1, 1))
        inverse = forward.copy()
        forward[:, 0, 2], forward[:, 1, 2] = -shift[:, 1], -shift[:, 0]
        inverse[:, 0, 2], inverse[:, 1, 2] = shift[:, 1], shift[:, 0]
        geometry.add_step(forward, inverse)

    def __call__(self, src, dst, ctx):
        _translate(flat_view(_bits(src)), *src.shape, self.offsets(ctx.seeds), self._fill_bits)
        return src


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


class Cutout(_FilledTransform):
    """Fill a random square of each image with ``fill``, in place (Cutout, DeVries & Taylor
    2017, https://arxiv.org/abs/1708.04552, with FFCV 1.0.2's placement).

    The square has side ``crop_size``; its top-left corner ``(y0, x0)`` is uniform over the
    positions that keep it inside the image (``y0`` in ``0..H - crop_size``, drawn first, then
    ``x0``), as FFCV's ``Cutout`` draws it, so it always covers ``crop_size**2`` pixels (clipped
    only when ``crop_size`` exceeds the image). The paper centres it on a uniform pixel instead.

    Args:
        crop_size: pixels, >= 1.
        fill: per-channel colour (``C`` values representable in the image dtype).

    Raises:
        ValueError: crop_size < 1, bad fill. TypeError (declare): input not numpy (H, W, C).
    """

    keeps_geometry = True  # it paints, it moves nothing

    def __init__(self, crop_size: int, fill: Sequence[float] = (0, 0, 0)):
        if int(crop_size) < 1:
            raise ValueError(f"crop_size must be >= 1, got {crop_size}")
        self.crop_size = int(crop_size)
        self.fill = tuple(fill)

    def __call__(self, src, dst, ctx):
        _cutout(_bits(src), ctx.seeds, self.salt, self.crop_size, self._fill_bits)
        return src


@njit(nogil=True, cache=True)
def _lookup(src, table, out, channels):
    # src, out: flat (B * H * W * C,); src holds the unsigned bits of the integer pixels
    # (uint8 / uint16), which index table: (2**bits * C,) flattened (2**bits, C)
    c_n = np.uint64(channels)
    k = np.uint64(0)
    if channels == 3:  # RGB unrolled: about twice as fast as the loop over channels
        u1, u2 = np.uint64(1), np.uint64(2)
        for _ in range(np.uint64(src.shape[0]) // c_n):
            out[k] = table[np.uint64(src[k]) * c_n]
            out[k + u1] = table[np.uint64(src[k + u1]) * c_n + u1]
            out[k + u2] = table[np.uint64(src[k + u2]) * c_n + u2]
            k += c_n
        return
    for _ in range(np.uint64(src.shape[0]) // c_n):
        for c in range(c_n):
            out[k + c] = table[np.uint64(src[k + c]) * c_n + c]
        k += c_n


@njit(nogil=True, cache=True)
def _scale_rows(src, scale, bias, out):
    # out = src * scale + bias per element of flat (N * R,) src/out (8-bit pixels), with scale and
    # bias (R,) float64 rows: the per-channel factors repeated along an image row, so the loop is
    # contiguous and vectorises (a table lookup per element does not)
    r = np.uint64(scale.shape[0])
    base = np.uint64(0)
    for _ in range(np.uint64(src.shape[0]) // r):
        for k in range(r):
            out[base + k] = np.float64(src[base + k]) * scale[k] + bias[k]
        base += r


_NORMALIZE_INPUTS = ("uint8", "int8", "uint16", "int16")  # integer pixels a lookup table covers


class NormalizeImage(Operation):
    """``(x - mean) / std`` per channel, fused with the integer -> float conversion (FFCV's
    ``NormalizeImage``, extended to 16-bit and signed pixels).

    Input: integer images of 8 or 16 bits, ``uint8`` (RGB decoders), ``uint16`` (depth maps,
    16-bit images of an ``ImageArrayField``), ``int8`` or ``int16``, with ``C`` channels.

    Numpy stage (before ToTensor): ``(H, W, C)`` integers -> ``(H, W, C) dtype`` in one compiled
    pass through a lookup table of every input value per channel (256 or 65536 rows, computed in
    float64), so values equal ``((x - mean) / std).astype(dtype)`` exactly. The table is
    ``2**bits * C * itemsize(dtype)`` bytes (768 KiB for 3-channel uint16 to float32). For 8-bit
    pixels to float32 the pass computes ``x * (1 / std) - mean / std`` in float64 instead (a
    vectorised loop, where the lookup is a scalar load per element), when that gives the table's
    value for every pixel value and channel (checked at declare; it does for the mean/std pairs
    tried, and the table is used where it would not).

    Torch stage (after ToTensor / ToTorchImage / ToDevice, CPU or CUDA): an 8-bit tensor ->
    ``dtype`` by one fused ``addcmul(-mean / std, x, 1 / std)`` (float rounding differs from the
    float64 formula by about one ulp); a 16-bit tensor is converted to float32 first (uint16
    values above 65504 do not fit float16), then the same ``addcmul`` in float32 and a cast to
    ``dtype``. The layout (NCHW, channels_last) is kept. The channel axis is the first per-sample
    axis after ToTorchImage (``Spec.channels_first``), else the last.

    Args:
        mean, std: ``(C,)`` in the units of the input pixels (e.g. ImageNet ``255 * [0.485, ...]``
            for uint8, millimetres of a uint16 depth map).
        dtype: floating output type, numpy (``np.float16``, ``np.float32``, ``np.float64``) or
            torch (``torch.bfloat16`` too, on the torch stage only).

    Raises:
        ConfigurationError (a ValueError): mean/std lengths differ, a std is 0, dtype not
            floating. TypeError (declare): input not uint8/int8/uint16/int16 or without a C-sized
            axis, or a dtype numpy lacks on the numpy stage.
    """

    keeps_geometry = True

    def __init__(self, mean: Sequence[float], std: Sequence[float], dtype=np.float32):
        self.mean = np.asarray(mean, dtype=np.float64).reshape(-1)
        self.std = np.asarray(std, dtype=np.float64).reshape(-1)
        if self.mean.size != self.std.size or not np.all(self.std != 0):
            raise ConfigurationError(f"NormalizeImage: mean and std need one value per channel and std != 0, got "
                                     f"{self.mean.tolist()} and {self.std.tolist()}")
        self.dtype = dtype
        if not torch_dtype(dtype).is_floating_point:
            raise ConfigurationError(f"NormalizeImage outputs a floating dtype, got {dtype}")
        self.on_torch = False

    def declare(self, spec, field, view):
        name = field_name(field, view)
        channels = self.mean.size
        inputs = [torch_dtype(t) if spec is not None and spec.on_torch else np.dtype(t) for t in _NORMALIZE_INPUTS]
        if spec is None or spec.dtype not in inputs or len(spec.shape) != 3 or \
                spec.shape[0 if spec.channels_first else 2] != channels:
            raise TypeError(f"NormalizeImage (field '{name}') needs a uint8, int8, uint16 or int16 image with "
                            f"{channels} channels, got {spec}")
        self.on_torch = spec.on_torch
        if not spec.on_torch:
            if spec.shape[-1] != channels:
                raise TypeError(f"NormalizeImage (field '{name}') needs numpy (H, W, {channels}) "
                                f"images, got {spec}")
            try:
                dtype = numpy_dtype(self.dtype)
            except TypeError as e:
                raise TypeError(f"NormalizeImage (field '{name}'): {e}; use it after ToTensor") from e
            levels = 1 << (8 * spec.dtype.itemsize)  # table row u holds the pixel whose bits are u
            values = np.arange(levels, dtype=f"u{spec.dtype.itemsize}").view(spec.dtype).astype(np.float64)
            table = ((values[:, None] - self.mean) / self.std).astype(dtype)
            self._table = _bits(table).reshape(-1)
            scale, bias = 1.0 / self.std, -self.mean / self.std
            exact = levels == 256 and dtype == np.float32 and np.array_equal(
                (values[:, None] * scale + bias).astype(dtype), table)
            self._rows = (np.tile(scale, spec.shape[1]), np.tile(bias, spec.shape[1])) if exact else None
            return Spec(spec.shape, dtype)
        axis = 0 if spec.channels_first else 2
        shape = [1, 1, 1, 1]
        shape[axis + 1] = channels
        out_dtype = torch_dtype(self.dtype)
        self._wide = spec.dtype.itemsize > 1  # 16-bit: through float32
        work = torch.float32 if self._wide else out_dtype
        self._out_dtype = out_dtype
        self._scale = torch.tensor(1.0 / self.std, dtype=work, device=spec.device).reshape(shape)
        self._bias = torch.tensor(-self.mean / self.std, dtype=work, device=spec.device).reshape(shape)
        return replace(spec, dtype=out_dtype)

    def __call__(self, src, dst, ctx):
        if self.on_torch:
            if self._wide:
                return torch.addcmul(self._bias, src.to(torch.float32), self._scale).to(self._out_dtype)
            return torch.addcmul(self._bias, src, self._scale)
        out = dst[:src.shape[0]]
        if self._rows is not None:
            _scale_rows(flat_view(src), *self._rows, flat_view(out))
        else:
            _lookup(flat_view(_bits(src)), self._table, flat_view(_bits(out)), src.shape[-1])
        return out
