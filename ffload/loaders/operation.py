"""The contract between the loader and the operations of a field pipeline.

A field pipeline is a list ``[decoder, transform, transform, ...]`` (as in FFCV). The loader
calls :meth:`Operation.declare` once per operation when the loader is built, allocates the
buffers each operation asked for (once per in-flight batch slot, reused every batch), and then,
for every batch, calls :meth:`Operation.__call__` on one worker thread::

    x = None
    for op, buf in zip(ops, buffers):
        x = op(x, buf, ctx)
    # x is the field's batch

Operations are batch-level: Python touches the batch, compiled (numba ``nopython``,
``nogil``) kernels touch the samples. ``__call__`` runs concurrently on several worker threads
(different batches, different buffer slots), so an operation keeps no per-call state on
``self``: everything a call needs comes from its arguments. Every random choice an operation makes must derive from
``ctx.seeds`` (one 64-bit seed per sample, itself derived from ``(seed, epoch, sample index)``),
never from global random state, so that batches do not depend on ``num_workers`` or thread
timing.

Writing a custom operation
--------------------------
Subclass :class:`Operation`; in :meth:`declare` validate the input spec and return the output
spec (per-sample shape and dtype, or a torch spec once :class:`ToTensor` has run); in
``__call__`` fill ``dst[:B]`` from ``src`` with a numba kernel and return ``dst[:B]``::

    @numba.njit(nogil=True, cache=True)
    def _invert(src, dst):
        for i in range(src.shape[0]):
            dst[i] = 255 - src[i]

    class Invert(Operation):
        def declare(self, spec, field, view):
            return spec                         # same (H, W, 3) uint8 per sample
        def __call__(self, src, dst, ctx):
            _invert(src, dst[:len(src)])
            return dst[:len(src)]
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Tuple

import numpy as np


@dataclass(frozen=True)
class Spec:
    """What one operation hands the next, per sample.

    Attributes:
        shape: per-sample shape, e.g. ``(H, W, 3)`` for an NHWC image stage or ``()`` for a label.
        dtype: a numpy dtype while the data is a numpy array; a ``torch.dtype`` once ``on_torch``.
        on_torch: True after :class:`ToTensor` (the batch is a ``torch.Tensor``).
        device: the torch device string (``'cpu'``, ``'cuda:0'``) when ``on_torch``.
        channels_first: per-sample ``(C, H, W)`` images (after ``ToTorchImage``) rather than
            ``(H, W, C)``; operations that need the channel axis read it here.
    """

    shape: Tuple[int, ...]
    dtype: Any
    on_torch: bool = False
    device: str = "cpu"
    channels_first: bool = False


@dataclass
class BatchContext:
    """Everything an operation may read while processing one batch.

    Attributes:
        indices: ``(B,) int64`` sample ids of the batch, in batch order.
        seeds: ``(B,) uint64`` per-sample random seeds from ``(seed, epoch, sample id)``.
        region: ``uint8`` 1-D array (a memory map of the file, or the process cache), which
            ``ptrs``/``sizes`` index; the loader guarantees the batch's bytes are resident.
        metadata: the dataset's per-sample metadata column of this field, ``(N,)`` (structured
            dtype for images: ``mode``, ``width``, ``height``, ``data_ptr``).
        ptrs: ``(N,) uint64`` absolute byte offsets of this field's payloads into ``region``
            (``None`` for fields without a payload: ints, floats).
        sizes: ``(N,) uint64`` payload sizes in bytes (``None`` likewise).
        epoch: the epoch number.
    """

    indices: np.ndarray
    seeds: np.ndarray
    region: np.ndarray
    metadata: np.ndarray
    ptrs: Optional[np.ndarray]
    sizes: Optional[np.ndarray]
    epoch: int


class Operation:
    """Base class of decoders and transforms (see the module docstring for the protocol).

    Class attributes:
        is_decoder: True for the first operation of a pipeline (it reads the dataset).
        field_types: for decoders, the field classes it can decode (checked at construction).
    """

    is_decoder = False
    field_types: Tuple[type, ...] = ()

    def declare(self, spec: Optional[Spec], field, view) -> Spec:
        """Validate the input and return the per-sample output spec.

        Args:
            spec: the previous operation's output (``None`` for a decoder).
            field: the :class:`ffload.formats.fields.Field` this pipeline decodes.
            view: the :class:`ffload.formats.DatasetView` (metadata, sizes) of the dataset.

        Raises:
            TypeError / ValueError: the operation cannot run on that input, naming the field.
        """
        raise NotImplementedError

    def buffer_spec(self, spec_out: Spec, batch_size: int) -> Optional[Spec]:
        """The output buffer this operation needs per batch slot, or ``None`` (in place, or a
        torch operation that allocates). Default: ``(batch_size,) + spec_out.shape`` of
        ``spec_out.dtype``, a numpy array the loader allocates once per slot. A spec with
        ``on_torch=True`` makes the loader allocate a ``torch.empty`` on ``spec.device``."""
        if spec_out.on_torch:
            return None
        return Spec((batch_size,) + tuple(spec_out.shape), spec_out.dtype)

    def __call__(self, src, dst, ctx: BatchContext):
        """Process one batch: ``src`` is the previous output (``None`` for decoders), ``dst`` the
        buffer allocated from :meth:`buffer_spec` (or ``None``). Returns the batch (the first
        ``B = len(ctx.indices)`` rows)."""
        raise NotImplementedError
