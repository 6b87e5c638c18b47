"""The shared bases of the numpy NHWC stage's transforms: the input check, the fill colour, the
pixel view the kernels move, and the parameter ranges of torchvision's constructors.

A transform is one compiled kernel per batch, in place when the shape and dtype do not change
(then ``buffer_spec`` is ``None``). Random decisions derive from ``ctx.seeds`` (one seed per
sample) and the operation's ``salt`` (see :mod:`ffload.loaders.rng`), so a sample's augmentation
depends only on ``(seed, epoch, sample id)``. Kernels move pixels as unsigned integers of the
element size (:func:`bits`), so every dtype works (float16 included, which numba cannot compute
with). The torchvision-style transforms run two numba ``nopython``/``nogil`` calls per batch: the
parameter draw, public as ``op.params(seeds)`` so that tests (and a device implementation) apply
exactly the same parameters, then the pixel kernel.

After ``ToTensor`` / ``ToTorchImage`` / ``ToDevice`` (or after a device decoder), the transforms that
set ``torch_impl`` take a ``torch.Tensor`` batch instead, on any device: ``(B, H, W, C)``, or ``(B, C, H,
W)`` when ``Spec.channels_first``. They draw the same ``params(seeds)`` on the CPU (the same compiled
call), upload them, and apply them to the whole batch with a few torch kernels
(:mod:`ffload.loaders.transforms.batch_torch`), so a sample's augmentation does not depend on the
device it runs on.
"""

from __future__ import annotations

import numpy as np
import torch

from ffload.errors import ConfigurationError, PipelineError
from ffload.loaders.decoders.base import field_name
from ffload.loaders.pipeline.operation import Operation
from ffload.loaders.rng import op_salt


def bits(array: np.ndarray) -> np.ndarray:
    """``array`` viewed as unsigned integers of the same element size (``uint8`` .. ``uint64``,
    same shape, no copy)."""
    return array.view(np.dtype(f"u{array.dtype.itemsize}"))


def range_pair(value, name: str, center: float = 0.0, low: float | None = None) -> tuple[float, float]:
    """A ``(min, max)`` range from a constructor argument, as torchvision's ``_setup_angle`` and
    ColorJitter's ``_check_input`` read it: a number ``v`` means ``(center - v, center + v)`` (the
    minimum clipped at ``low``), a pair is taken as it is.

    Raises:
        ConfigurationError: a negative number, or not a number nor an ordered pair (the message names ``name``).
    """
    if isinstance(value, (int, float)):
        if value < 0:
            raise ConfigurationError(f"{name} must be >= 0 when a single number, got {value}")
        lo, hi = center - float(value), center + float(value)
        if low is not None:
            lo = max(lo, low)
        return lo, hi
    values = tuple(float(v) for v in value)
    if len(values) != 2 or values[0] > values[1]:
        raise ConfigurationError(f"{name} must be a number or a (min, max) pair, got {value}")
    return values


class NHWCTransform(Operation):
    """Base of the in-place random transforms: checks for an ``(H, W, C)`` image input, needs no
    buffer.

    The input is a numpy batch ``(B, H, W, C)``; a subclass with ``torch_impl = True`` also takes a
    torch batch (any device) ``(B, H, W, C)``, or ``(B, C, H, W)`` after ``ToTorchImage``
    (``Spec.channels_first``), and its ``__call__`` then returns a new tensor of the same shape,
    dtype and device.

    Attributes:
        salt: ``uint64`` mixed into every sample seed, set at declare from the class and field
            names (two fields, or two different ops, draw independently).
        field_name: the field (or view) it runs on, set at declare, for messages.
        on_torch: the input is a torch batch (set at declare).
        channels_first: the torch batch is ``(B, C, H, W)`` (set at declare).

    Raises:
        PipelineError: (building the pipeline) input not an (H, W, C) image (numpy, or torch where ``torch_impl``).
    """

    rowwise = True  # per-sample draws and pixels (Operation)
    torch_impl = False  # True where batch_torch implements the op on torch batches
    on_torch = channels_first = False

    def declare(self, spec, field, view):
        name = field_name(field, view)
        if spec is None or len(spec.shape) != 3 or (spec.on_torch and not self.torch_impl):
            stage = "numpy or torch" if self.torch_impl else "numpy"
            after = "" if self.torch_impl else " before ToTensor"
            raise PipelineError(
                f"{type(self).__name__} (field '{name}') works on {stage} (H, W, C) images{after}, got {spec}"
            )
        self.salt = op_salt(type(self).__name__, name)
        self.field_name = name
        self.on_torch = spec.on_torch
        self.channels_first = spec.on_torch and spec.channels_first
        return spec

    def buffer_spec(self, spec_out, batch_size):
        return None

    def _image(self, spec) -> tuple[int, int, int]:
        """``(height, width, channels)`` of the declared per-sample image."""
        if self.channels_first:
            return spec.shape[1], spec.shape[2], spec.shape[0]
        return spec.shape[0], spec.shape[1], spec.shape[2]

    def _fill(self, fill, spec) -> np.ndarray | torch.Tensor:
        """The fill colour: ``(C,)`` unsigned bits of the image dtype for a numpy input, a ``(C,)``
        tensor of the image dtype on the spec's device for a torch input."""
        fill = np.asarray(fill, dtype=np.float64).reshape(-1)
        channels = self._image(spec)[2]
        if fill.size != channels:
            raise ConfigurationError(
                f"{type(self).__name__} (field '{self.field_name}'): fill has "
                f"{fill.size} values for {channels} channels"
            )
        if spec.on_torch:
            integer = not (spec.dtype.is_floating_point or spec.dtype.is_complex or spec.dtype == torch.bool)
            low, high = (torch.iinfo(spec.dtype).min, torch.iinfo(spec.dtype).max) if integer else (None, None)
        else:
            dtype = np.dtype(spec.dtype)
            integer = dtype.kind in "ui"
            low, high = (np.iinfo(dtype).min, np.iinfo(dtype).max) if integer else (None, None)
        if integer and (fill.min() < low or fill.max() > high or np.any(fill != np.round(fill))):
            raise ConfigurationError(
                f"{type(self).__name__} (field '{self.field_name}'): fill "
                f"{fill.tolist()} is not representable as {spec.dtype}"
            )
        if spec.on_torch:
            return torch.tensor(fill, dtype=torch.float64).to(device=spec.device, dtype=spec.dtype)
        return bits(fill.astype(dtype))


class FilledTransform(NHWCTransform):
    """An in-place transform that paints ``self.fill`` (a subclass sets it in ``__init__``).

    Attributes:
        fill_bits: ``(C,)`` the fill as unsigned bits of the image dtype (:func:`bits`), set at
            declare for a numpy input; for a torch input a ``(C,)`` tensor of the image dtype on
            the batch's declared device.

    Raises:
        ConfigurationError: (building the pipeline) the fill has not ``C`` values, or is not representable in the image
            dtype.
        PipelineError: (building the pipeline) input not an (H, W, C) image (see :class:`NHWCTransform`).
    """

    def declare(self, spec, field, view):
        spec = super().declare(spec, field, view)
        self.fill_bits = self._fill(self.fill, spec)
        return spec
