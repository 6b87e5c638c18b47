"""A pipeline stage that hands each sample to a Python callable: the torchvision, Albumentations
or PIL transforms a user already has, inside ffload's loader.

Cost, stated plainly: the callable runs once per sample in the worker threads and holds the GIL
while it runs Python, so these samples are processed one at a time across all workers (C code
that releases the GIL, such as OpenCV inside Albumentations or torch ops, still overlaps). Put
the compiled decoders and augmentations first, and the callable only where nothing compiled
does the job. Randomness inside the callable comes from its own generator: to keep batches
independent of ``num_workers`` the callable may take a ``seed`` keyword, which this stage fills
with a per-sample seed derived from ``(seed, epoch, sample)`` like every ffload operation.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt
import torch

from ffload.errors import ConfigurationError, PipelineError
from ffload.loaders.decoders.base import field_name
from ffload.loaders.pipeline.operation import Operation, Spec
from ffload.loaders.rng import op_salt, seed_state

INPUTS = ("numpy", "tensor", "pil")


class PythonTransform(Operation):
    """Apply ``fn`` to every sample of a numpy ``(H, W, C)`` (or any per-sample array) stage.

    Args:
        fn: ``fn(x) -> y`` per sample; it may accept a ``seed`` keyword (a Python int).
        output_shape: ``y``'s per-sample shape, e.g. ``(224, 224, 3)``; None: learned at declare from one
            call of ``fn`` on a sample of zeros of the input's shape and dtype (``output_dtype`` is then
            that call's too), for callables whose output shape is the same for every sample.
        output_dtype: ``y``'s numpy dtype.
        input_type: what ``fn`` receives: ``'numpy'`` (the ``(H, W, C)`` array, Albumentations' input),
            ``'tensor'`` (a ``torch.Tensor`` sharing the array's memory, HWC as stored; a torchvision
            v2 transform wants CHW: permute in ``fn``) or ``'pil'`` (a ``PIL.Image`` of a uint8
            RGB/L image). ``y`` may be a numpy array, a tensor or a PIL image.

    Raises:
        ConfigurationError: an unknown ``input_type``.
        PipelineError: (building the pipeline) the input is already a torch
            batch.
        ValueError: (loading) ``fn`` returned a shape or dtype other than declared (the
            sample is named by the loader).
    """

    def __init__(
        self,
        fn: Callable,
        output_shape: Sequence[int] | None,
        output_dtype: npt.DTypeLike = np.uint8,
        input_type: str = "numpy",
    ):
        if input_type not in INPUTS:
            raise ConfigurationError(f"input_type must be one of {INPUTS}, got {input_type!r}")
        self.fn, self.input_type = fn, input_type
        self.output_dtype = np.dtype(output_dtype)
        self.output_shape = None if output_shape is None else tuple(int(d) for d in output_shape)
        try:
            self._takes_seed = "seed" in inspect.signature(fn).parameters
        except (TypeError, ValueError):  # builtins without a signature
            self._takes_seed = False

    def declare(self, spec, field, view):
        name = field_name(field, view)
        if spec is None or spec.on_torch:
            raise PipelineError(f"PythonTransform (field '{name}') runs on numpy samples, before ToTensor; got {spec}")
        self.salt = op_salt(type(self).__name__, name)
        self.field_name = name
        if self.output_shape is None:  # learned from one call on zeros (a copy: ops are shared between pipelines)
            kwargs = {"seed": 0} if self._takes_seed else {}
            y = _as_array(self.fn(self._convert_in(np.zeros(spec.shape, spec.dtype)), **kwargs))
            self.output_shape, self.output_dtype = y.shape, y.dtype
        return Spec(self.output_shape, self.output_dtype)

    def _convert_in(self, x: np.ndarray):
        if self.input_type == "tensor":
            return torch.from_numpy(x)
        if self.input_type == "pil":
            from PIL import Image

            return Image.fromarray(x[..., 0] if x.ndim == 3 and x.shape[2] == 1 else x)
        return x

    def __call__(self, src, dst, ctx):
        out = dst[: len(src)]
        for b in range(len(src)):
            kwargs = {"seed": int(seed_state(ctx.seeds[b], self.salt))} if self._takes_seed else {}
            y = _as_array(self.fn(self._convert_in(src[b]), **kwargs))
            if y.shape != self.output_shape or y.dtype != self.output_dtype:
                raise ValueError(
                    f"PythonTransform (field '{self.field_name}'): the callable returned "
                    f"{y.dtype}{list(y.shape)}, declared {self.output_dtype}{list(self.output_shape)}"
                )
            out[b] = y
        return out


def _as_array(y) -> np.ndarray:
    """A callable's result (numpy array, tensor or PIL image) as a numpy array."""
    return y.numpy() if isinstance(y, torch.Tensor) else np.asarray(y)
