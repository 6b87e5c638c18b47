"""``NormalizeImage``: ``(x - mean) / std`` per channel, fused with the integer -> float
conversion, on the numpy stage (a compiled pass) or the torch stage (one ``addcmul``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import numpy.typing as npt
import torch
from numba import njit

from ffload.errors import ConfigurationError, PipelineError
from ffload.loaders.decoders.base import field_name, flat_view
from ffload.loaders.pipeline.operation import Operation, Spec
from ffload.loaders.transforms.base import bits
from ffload.loaders.transforms.torch_ops import numpy_dtype, torch_dtype


@njit(nogil=True, cache=True)
def _lookup(src, table, out, channels):
    # src, out: flat (B * H * W * C,); src holds the unsigned bits of the integer pixels
    # (uint8 / uint16), which index table: (2**bits * C,) flattened (2**bits, C)
    c_n = np.uint64(channels)
    k = np.uint64(0)
    if channels == 3:  # RGB unrolled (see docs/developer-notes.md)
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
    """``(x - mean) / std`` per channel, fused with the integer -> float conversion (FFCV's ``NormalizeImage``).

    FFCV's version extended to 16-bit and signed pixels.

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
        ConfigurationError: mean/std lengths differ, a std is 0, dtype not
            floating.
        PipelineError: (building the pipeline) input not uint8/int8/uint16/int16 or without a C-sized
            axis, or a dtype numpy lacks on the numpy stage.
    """

    keeps_geometry = True
    rowwise = True

    def __init__(self, mean: Sequence[float], std: Sequence[float], dtype: npt.DTypeLike | torch.dtype = np.float32):
        self.mean = np.asarray(mean, dtype=np.float64).reshape(-1)
        self.std = np.asarray(std, dtype=np.float64).reshape(-1)
        if self.mean.size != self.std.size or not np.all(self.std != 0):
            raise ConfigurationError(
                f"NormalizeImage: mean and std need one value per channel and std != 0, got "
                f"{self.mean.tolist()} and {self.std.tolist()}"
            )
        self.dtype = dtype
        if not torch_dtype(dtype).is_floating_point:
            raise ConfigurationError(f"NormalizeImage outputs a floating dtype, got {dtype}")
        self.on_torch = False

    def declare(self, spec, field, view):
        name = field_name(field, view)
        channels = self.mean.size
        inputs = [torch_dtype(t) if spec is not None and spec.on_torch else np.dtype(t) for t in _NORMALIZE_INPUTS]
        if (
            spec is None
            or spec.dtype not in inputs
            or len(spec.shape) != 3
            or spec.shape[0 if spec.channels_first else 2] != channels
        ):
            raise PipelineError(
                f"NormalizeImage (field '{name}') needs a uint8, int8, uint16 or int16 image with "
                f"{channels} channels, got {spec}"
            )
        self.on_torch = spec.on_torch
        if not spec.on_torch:
            if spec.shape[-1] != channels:
                raise PipelineError(
                    f"NormalizeImage (field '{name}') needs numpy (H, W, {channels}) images, got {spec}"
                )
            try:
                dtype = numpy_dtype(self.dtype)
            except TypeError as e:
                raise PipelineError(f"NormalizeImage (field '{name}'): {e}; use it after ToTensor") from e
            levels = 1 << (8 * spec.dtype.itemsize)  # table row u holds the pixel whose bits are u
            values = np.arange(levels, dtype=f"u{spec.dtype.itemsize}").view(spec.dtype).astype(np.float64)
            table = ((values[:, None] - self.mean) / self.std).astype(dtype)
            self._table = bits(table).reshape(-1)
            scale, bias = 1.0 / self.std, -self.mean / self.std
            exact = (
                levels == 256
                and dtype == np.float32
                and np.array_equal((values[:, None] * scale + bias).astype(dtype), table)
            )
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
        out = dst[: src.shape[0]]
        if self._rows is not None:
            _scale_rows(flat_view(src), *self._rows, flat_view(out))
        else:
            _lookup(flat_view(bits(src)), self._table, flat_view(bits(out)), src.shape[-1])
        return out
