"""Operations of the torch stage: the numpy batch becomes a tensor, changes layout, dtype and
device (FFCV 1.0.2's ``ffcv/transforms/ops.py`` and ``common.py`` semantics). Their ``declare``
returns a torch :class:`Spec` (``on_torch=True``); they need no loader buffer.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import numpy.typing as npt
import torch

from ffload.errors import ConfigurationError, PipelineError, UnavailableError
from ffload.loaders.decoders.base import field_name
from ffload.loaders.pipeline.operation import Operation, Spec


def torch_dtype(dtype) -> torch.dtype:
    """The torch dtype of a numpy dtype (or a torch dtype, returned as is).
    Raises PipelineError for dtypes torch lacks (structured, strings, ...)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    try:
        return torch.from_numpy(np.empty(0, dtype=np.dtype(dtype))).dtype
    except TypeError as e:
        raise PipelineError(f"no torch dtype for numpy {np.dtype(dtype)}") from e


def numpy_dtype(dtype) -> np.dtype:
    """The numpy dtype of a torch dtype (or anything ``np.dtype`` takes).
    Raises PipelineError for torch dtypes numpy lacks (bfloat16, ...)."""
    if isinstance(dtype, torch.dtype):
        try:
            return torch.empty(0, dtype=dtype).numpy().dtype
        except TypeError as e:
            raise PipelineError(f"no numpy dtype for torch {dtype}") from e
    return np.dtype(dtype)


def _require(spec, on_torch: bool, op, field, view) -> None:
    if spec is None or spec.on_torch != on_torch:
        stage = "a torch tensor (after ToTensor)" if on_torch else "a numpy array (before ToTensor)"
        raise PipelineError(f"{type(op).__name__} (field '{field_name(field, view)}') needs {stage}, got {spec}")


class ToTensor(Operation):
    """Numpy batch -> ``torch.Tensor`` sharing its memory (``torch.from_numpy``, no copy).

    A pinned loader buffer stays pinned. Per-sample shape unchanged, dtype the torch equivalent: no
    scaling to ``[0, 1]`` and no ``HWC -> CHW`` permutation, unlike torchvision's ``ToTensor``.

    Raises:
        PipelineError: (building the pipeline) input already a tensor or a dtype torch lacks.
    """

    keeps_geometry = True
    rowwise = True
    transfer = True  # not counted in later stages' salts (Operation)

    def declare(self, spec, field, view):
        _require(spec, False, self, field, view)
        return Spec(spec.shape, torch_dtype(spec.dtype), on_torch=True, device="cpu")

    def __call__(self, src, dst, ctx):
        return torch.from_numpy(src)


class ToTorchImage(Operation):
    """``(B, H, W, C)`` -> ``(B, C, H, W)`` by ``permute`` (FFCV's ``ToTorchImage``).

    Args:
        channels_last: keep the NHWC memory (the result is ``torch.channels_last``-contiguous,
            no copy); False makes a contiguous NCHW copy.
        convert_back_int16: reinterpret an ``int16`` batch as ``float16`` (FFCV's CPU
            NormalizeImage emits float16 bits as int16; ffload's emits float16 directly).

    Raises:
        PipelineError: (building the pipeline) input not a ``(H, W, C)`` tensor.
    """

    keeps_geometry = True
    rowwise = True
    transfer = True  # not counted in later stages' salts (Operation)

    def __init__(self, channels_last: bool = True, convert_back_int16: bool = True):
        self.channels_last = channels_last
        self.convert_back_int16 = convert_back_int16
        self._view_f16 = False

    def declare(self, spec, field, view):
        _require(spec, True, self, field, view)
        if len(spec.shape) != 3:
            raise PipelineError(f"ToTorchImage (field '{field_name(field, view)}') needs (H, W, C) images, got {spec}")
        h, w, c = spec.shape
        self._view_f16 = spec.dtype == torch.int16 and self.convert_back_int16
        dtype = torch.float16 if self._view_f16 else spec.dtype
        return Spec((c, h, w), dtype, on_torch=True, device=spec.device, channels_first=True)

    def __call__(self, src, dst, ctx):
        if self._view_f16:
            src = src.view(torch.float16)
        out = src.permute(0, 3, 1, 2)
        return out if self.channels_last else out.contiguous()


class Convert(Operation):
    """Cast to ``target_dtype`` (FFCV's ``Convert``).

    On the numpy stage the cast (``numpy`` unsafe casting) writes into the loader's buffer; on
    the torch stage it is ``tensor.to(dtype)`` (layout kept). ``target_dtype`` may be numpy or
    torch.

    Args:
        target_dtype: the numpy or torch dtype of the output.

    Raises:
        PipelineError: (building the pipeline) a dtype the stage lacks, or placed first, as a decoder.
    """

    keeps_geometry = True
    rowwise = True

    def __init__(self, target_dtype: npt.DTypeLike | torch.dtype):
        self.target_dtype = target_dtype

    def declare(self, spec, field, view):
        if spec is None:
            raise PipelineError(f"Convert (field '{field_name(field, view)}') cannot be a decoder")
        if spec.on_torch:
            return replace(spec, dtype=torch_dtype(self.target_dtype))
        return replace(spec, dtype=numpy_dtype(self.target_dtype))

    def __call__(self, src, dst, ctx):
        if isinstance(src, torch.Tensor):
            return src.to(torch_dtype(self.target_dtype))
        out = dst[: len(src)]
        np.copyto(out, src, casting="unsafe")
        return out


class ToDevice(Operation):
    """Copy the tensor to ``device`` (FFCV's ``ToDevice``); memory format kept.

    Args:
        device: anything ``torch.device`` takes (``'cuda:0'``, ``torch.device('cpu')``).
        non_blocking: asynchronous host-to-device copy; only asynchronous from pinned memory.

    Raises:
        PipelineError: (building the pipeline) input not a tensor.
        UnavailableError: (building the pipeline) a CUDA device without CUDA (torch built without it,
            or no GPU).
    """

    keeps_geometry = True
    transfer = True  # not counted in later stages' salts (Operation)

    def __init__(self, device: str | int | torch.device, non_blocking: bool = True):
        self.device = torch.device(device)
        self.non_blocking = non_blocking

    def declare(self, spec, field, view):
        _require(spec, True, self, field, view)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise UnavailableError(
                f"ToDevice({str(self.device)!r}) (field '{field_name(field, view)}'): "
                "CUDA is not available to torch here"
            )
        return replace(spec, device=str(self.device))

    def __call__(self, src, dst, ctx):
        return src.to(self.device, non_blocking=self.non_blocking)


class Squeeze(Operation):
    """Remove size-1 dimensions (FFCV's ``Squeeze``), on a tensor or a numpy batch, as a view.

    Args:
        *dims: dimensions of the batch (0 is the batch dimension, which is never removed);
            none: every size-1 per-sample dimension (e.g. labels ``(B, 1)`` -> ``(B,)``).

    Raises:
        PipelineError: (building the pipeline) placed first, as a decoder.
        ConfigurationError: (building the pipeline) a dim is 0, out of range or not of size 1.
    """

    keeps_geometry = True
    rowwise = True

    def __init__(self, *dims: int):
        self.dims = tuple(int(d) for d in dims)

    def declare(self, spec, field, view):
        if spec is None:
            raise PipelineError(f"Squeeze (field '{field_name(field, view)}') cannot be a decoder")
        ndim = len(spec.shape) + 1
        dims = sorted({d % ndim for d in self.dims if -ndim <= d < ndim})
        if len(dims) != len(self.dims) or 0 in dims or any(spec.shape[d - 1] != 1 for d in dims):
            raise ConfigurationError(
                f"Squeeze (field '{field_name(field, view)}'): dims {self.dims} must "
                f"name size-1 per-sample dimensions of the batch (B,) + {spec.shape}"
            )
        if not self.dims:
            dims = [d + 1 for d, n in enumerate(spec.shape) if n == 1]
        self._axes = tuple(dims)
        shape = tuple(n for d, n in enumerate(spec.shape) if d + 1 not in dims)
        return replace(spec, shape=shape, channels_first=spec.channels_first and len(shape) == 3)

    def buffer_spec(self, spec_out, batch_size):
        return None

    def __call__(self, src, dst, ctx):
        if not self._axes:
            return src
        if isinstance(src, torch.Tensor):
            return src.squeeze(self._axes)
        return src.squeeze(axis=self._axes)
