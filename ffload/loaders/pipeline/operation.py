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
Subclass :class:`Operation`; in :meth:`Operation.declare` validate the input spec and return the output
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

from dataclasses import dataclass, field
from typing import Any

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

    shape: tuple[int, ...]
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
        shared: one dict per batch, the same object for every field's pipeline of that batch:
            what a pipeline publishes for pipelines that run after it (an image's crop boxes
            and flips, :class:`~.geometry.Geometry`, under ``("geometry", name)``; a box
            transform's kept counts under ``("count", name)``). Values are per-sample arrays of
            ``B`` rows (or objects with ``rows(j)``); see :mod:`ffload.loaders.pipeline.geometry`.
    """

    indices: np.ndarray
    seeds: np.ndarray
    region: np.ndarray
    metadata: np.ndarray
    ptrs: np.ndarray | None
    sizes: np.ndarray | None
    epoch: int
    shared: dict = field(default_factory=dict)


class Operation:
    """One stage of a field pipeline.

    ffload's own protocol (FFCV's ``Operation`` is similar in
    spirit, not in its methods). A stage implements:

    ``declare(spec, field, view) -> Spec`` — once, when the loader is built
        Check the input (``spec`` is ``None`` for a decoder, else the previous stage's output)
        and return this stage's per-sample output :class:`Spec`. Raise
        :class:`~ffload.errors.PipelineError` (a ``TypeError``) for an input it cannot handle,
        :class:`~ffload.errors.ConfigurationError` for a bad option, a ``FormatError`` for a
        bad dataset; the pipeline prefixes the field and stage.
        Anything the stage computes once (tables, salts) is set on ``self`` here.
    ``buffer_spec(spec_out, batch_size) -> Spec | None`` — optional
        The output buffer it needs per in-flight batch slot. Default: ``(batch_size,) +
        spec_out.shape`` of ``spec_out.dtype`` (numpy); return ``None`` for an in-place stage
        (it returns its input) or a torch stage that allocates.
    ``__call__(src, dst, ctx) -> batch`` — per batch, on a worker thread
        Fill ``dst[:B]`` from ``src`` (``B = len(ctx.indices)``) with compiled code and return it
        (or return ``src`` modified in place). Called concurrently on several threads: keep no
        per-call state on ``self``.

    Hooks the loader honours:

    * ``salt`` (a ``uint64`` attribute, set in ``declare``, e.g. from :func:`~.rng.op_salt`):
      random stages draw from ``seed_state(ctx.seeds[b], self.salt)``; the pipeline mixes the
      stage's position into it, so two identical stages in one pipeline draw independently.
      That position does not count the stages with ``transfer = True`` (class attribute:
      :class:`~.transforms.ToTensor`, :class:`~.transforms.ToTorchImage`, :class:`~.transforms.ToDevice`,
      which only hand the batch on), so ``[decoder, ToTensor(), flip]`` draws as ``[decoder, flip,
      ToTensor()]`` does.
    * ``is_decoder`` (class attribute): True for the first stage, which reads the dataset
      through ``ctx.region`` / ``ctx.ptrs`` / ``ctx.sizes``; ``field_types``: the field classes
      a decoder accepts (checked when the pipeline is built).
    * Geometry (:mod:`.geometry`): ``keeps_geometry = True`` (class attribute) says the stage
      moves no pixel (colour, normalisation, dtype and layout stages), so boxes and masks
      transformed with the image's geometry stay valid after it; a stage that moves pixels
      either records what it did (:meth:`record_geometry`) or makes the loader refuse box/mask
      operations that follow its image. The default, False, is the safe answer for unknown stages.
    * Reading another field's pipeline (:mod:`.geometry`): a stage with ``requires = ((kind,
      name), ...)`` gets ``link(kind, producer)`` (the :class:`~ffload.loaders.pipeline.build.FieldPipeline` named
      ``name``, already built and declared) before its own ``declare``; at run time it reads
      ``ctx.shared[(kind, name)]``. The loader refuses a ``name`` that is absent or runs later.
    * Flip fusion: a stage whose :meth:`fusable_flip` returns ``(flip_prob, salt)`` (ffload's
      :class:`~.transforms.RandomHorizontalFlip`) and that directly follows a decoder whose
      :meth:`fuse_flip` accepts that pair (the RGB image decoders) is fused: after every
      ``declare`` (so ``salt`` is final), the pipeline calls ``decoder.fuse_flip(flip_prob,
      salt)``, which mirrors sample b while writing it when ``uniform(seed_state(ctx.seeds[b],
      salt)) < flip_prob`` (the flip's own rule and draws: same batches), and sets the flip
      stage's ``fused = True``, which makes its ``__call__`` return its input untouched.

    * ``rowwise = True`` (class attribute) says row ``b`` of the stage's output depends only on
      row ``b`` of its input and of ``ctx`` (``indices``, ``seeds``, ``shared``), its output's
      per-sample shape is fixed at ``declare``, and it writes (or returns) the first ``B`` rows
      of ``dst`` or of its input. A loader whose stages are all rowwise may run several
      consecutive batches as one call of ``B1 + B2 + ...`` rows (``Loader(batches_per_job=)``)
      and hand them out as row ranges of the result. The default, False, keeps one batch per
      call: a stage that mixes rows (a batch statistic, a user function) sees whole batches only.

    Everything random derives from ``ctx.seeds``, never from global state, so batches do not
    depend on ``num_workers`` or thread timing. A complete example is in the module docstring.
    """

    is_decoder = False
    field_types: tuple[type, ...] = ()
    keeps_geometry = False
    transfer = False  # only hands the batch on (type, layout view, device): not counted in salts
    rowwise = False  # rows independent of each other: several batches may run as one call
    requires: tuple[tuple[str, str], ...] = ()
    publish = None  # set by .geometry.link: the key under which this stage publishes in ctx.shared

    def declare(self, spec: Spec | None, field, view) -> Spec:
        """Validate the input and return the per-sample output spec.

        Args:
            spec: the previous operation's output (``None`` for a decoder).
            field: the :class:`ffload.formats.fields.base.Field` this pipeline decodes.
            view: the :class:`ffload.formats.DatasetView` (metadata, sizes) of the dataset.

        Raises:
            ffload.errors.PipelineError: the operation cannot run on that input, naming the field
                (a plain ``TypeError`` raised here becomes one when the pipeline is built).
        """
        raise NotImplementedError

    def buffer_spec(self, spec_out: Spec, batch_size: int) -> Spec | None:
        """The output buffer this operation needs per batch slot, or ``None`` (in place, or a
        torch operation that allocates). Default: ``(batch_size,) + spec_out.shape`` of
        ``spec_out.dtype``, a numpy array the loader allocates once per slot. A spec with
        ``on_torch=True`` makes the loader allocate a ``torch.empty`` on ``spec.device``."""
        if spec_out.on_torch:
            return None
        return Spec((batch_size,) + tuple(spec_out.shape), spec_out.dtype)

    def fusable_flip(self) -> tuple[float, np.uint64] | None:
        """``(flip_prob, salt)`` when this stage is a random horizontal flip that the decoder
        before it may apply instead (see the class docstring), else ``None`` (the default)."""
        return None

    def fuse_flip(self, flip_prob: float, salt: np.uint64) -> bool:
        """Take over the next stage's random horizontal flip (a decoder hook, see the class
        docstring): return True when this stage will mirror sample b while writing it whenever
        ``uniform(seed_state(ctx.seeds[b], salt)) < flip_prob``. Default: False (not supported)."""
        return False

    def link(self, kind: str, producer) -> None:
        """Called once per ``requires`` entry when the loader is built, before :meth:`declare`,
        with the producing :class:`~ffload.loaders.pipeline.build.FieldPipeline`. Default: nothing."""

    def record_geometry(self, geometry, ctx: BatchContext) -> None:
        """Geometry hook of stages that move pixels in a known way (the random flips,
        ``RandomTranslate``, ``RandomAffine`` / ``RandomRotation``): apply this
        batch's per-sample change to ``geometry`` (a :class:`~.geometry.Geometry` of ``B`` rows)
        so that box and mask operations of other fields follow it. Only called on stages that
        define it, after the decoder published the geometry and before the stage's own call."""
        raise NotImplementedError

    def __call__(self, src, dst, ctx: BatchContext):
        """Process one batch: ``src`` is the previous output (``None`` for decoders), ``dst`` the
        buffer allocated from :meth:`buffer_spec` (or ``None``). Returns the batch (the first
        ``B = len(ctx.indices)`` rows)."""
        raise NotImplementedError
