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
"""

from __future__ import annotations

import numpy as np

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
    """Base of the in-place random transforms: checks for a numpy ``(H, W, C)`` input, needs no
    buffer.

    Attributes:
        salt: ``uint64`` mixed into every sample seed, set at declare from the class and field
            names (two fields, or two different ops, draw independently).
        field_name: the field (or view) it runs on, set at declare, for messages.

    Raises:
        PipelineError: (building the pipeline) input not numpy (H, W, C).
    """

    def declare(self, spec, field, view):
        name = field_name(field, view)
        if spec is None or spec.on_torch or len(spec.shape) != 3:
            raise PipelineError(
                f"{type(self).__name__} (field '{name}') works on numpy (H, W, C) images before ToTensor, got {spec}"
            )
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
            raise ConfigurationError(
                f"{type(self).__name__} (field '{self.field_name}'): fill has "
                f"{fill.size} values for {channels} channels"
            )
        dtype = np.dtype(spec.dtype)
        if dtype.kind in "ui":
            info = np.iinfo(dtype)
            if fill.min() < info.min or fill.max() > info.max or np.any(fill != np.round(fill)):
                raise ConfigurationError(
                    f"{type(self).__name__} (field '{self.field_name}'): fill "
                    f"{fill.tolist()} is not representable as {dtype}"
                )
        return bits(fill.astype(dtype))


class FilledTransform(NHWCTransform):
    """An in-place transform that paints ``self.fill`` (a subclass sets it in ``__init__``).

    Attributes:
        fill_bits: ``(C,)`` the fill as unsigned bits of the image dtype (:func:`bits`), set at declare.

    Raises:
        ConfigurationError: (building the pipeline) the fill has not ``C`` values, or is not representable in the image
            dtype.
        PipelineError: (building the pipeline) input not numpy (H, W, C).
    """

    def declare(self, spec, field, view):
        spec = super().declare(spec, field, view)
        self.fill_bits = self._fill(self.fill, spec)
        return spec
