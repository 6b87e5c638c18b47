"""Field pipelines: build and validate each field's operation chain, allocate its buffers, run it.

A pipeline is ``[decoder, transform, ...]`` (FFCV's convention, see :mod:`.operation`). At
loader construction :func:`build_pipelines` checks every chain (the first operation is a decoder
for the field's type, each ``declare`` accepts its input) so that mistakes surface as a
:class:`~ffload.errors.PipelineError` (a ``TypeError``: operations that do not fit) or
:class:`~ffload.errors.ConfigurationError` (a ``ValueError``) naming the field before any batch
runs. ``torch.nn.Module`` instances may follow :class:`ToTensor` (as in FFCV); they are applied to
the batch tensor and assumed to keep its shape, dtype and device.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence

import numpy as np
import torch

from ffload.errors import ConfigurationError, PipelineError
from ffload.formats.fields.bytes import BytesField, JSONField
from ffload.formats.fields.image import ImageArrayField, RGBImageField, describe_size_mismatch, differing_sizes
from ffload.formats.fields.ndarray import NDArrayField, RaggedArrayField
from ffload.formats.fields.scalars import FloatField, IntField
from ffload.loaders.decoders.basics import (
    BytesDecoder,
    FloatDecoder,
    IntDecoder,
    NDArrayDecoder,
    RaggedArrayDecoder,
)
from ffload.loaders.decoders.image_array import ImageArrayDecoder
from ffload.loaders.decoders.rgb import SimpleRGBImageDecoder
from ffload.loaders.pipeline.geometry import link, records
from ffload.loaders.pipeline.operation import BatchContext, Operation, Spec
from ffload.loaders.rng import op_salt
from ffload.loaders.transforms.torch_ops import ToTensor


class ModuleOp(Operation):
    """Adapter running a ``torch.nn.Module`` on the batch tensor (after :class:`ToTensor`).

    The module gets the whole ``(B, ...)`` tensor and must return a tensor of the same per-sample
    shape, dtype and device (FFCV's ``ModuleWrapper`` makes the same assumption).
    """

    def __init__(self, module: torch.nn.Module):
        self.module = module

    def declare(self, spec, field, view):
        if spec is None or not spec.on_torch:
            raise PipelineError(
                f"torch module {type(self.module).__name__} must come after ToTensor (it receives a numpy batch here)"
            )
        return spec

    def __call__(self, src, dst, ctx):
        return self.module(src)

    def __repr__(self):
        return f"ModuleOp({self.module!r})"


_DEFAULT_DECODERS = [
    (RGBImageField, SimpleRGBImageDecoder),
    (IntField, IntDecoder),
    (FloatField, FloatDecoder),
    (NDArrayField, NDArrayDecoder),
    (JSONField, BytesDecoder),
    (RaggedArrayField, RaggedArrayDecoder),
    (ImageArrayField, ImageArrayDecoder),
    (BytesField, BytesDecoder),
]


def default_pipeline(name: str, field, view) -> list[Operation]:
    """The pipeline used for a field missing from ``pipelines`` (FFCV: default decoder + ToTensor).

    ``RGBImageField`` -> ``[SimpleRGBImageDecoder(), ToTensor()]`` (all images read, those of
    ``view.selected()``, must share one size), ``IntField``/``FloatField``/``NDArrayField``/``BytesField``/``JSONField`` -> their
    decoder + ``ToTensor()``, ``RaggedArrayField`` -> ``RaggedArrayDecoder()`` (padded rows; the
    lengths need a second view, see there), ``ImageArrayField`` -> ``ImageArrayDecoder()`` (one size).

    Raises:
        ffload.errors.PipelineError: images of several sizes (a crop decoder is needed; the same
            class as ``SimpleRGBImageDecoder`` raises for them once the pipeline is built), or no
            default for the field's type.
    """
    if isinstance(field, RGBImageField):
        pair = differing_sizes(view.metadata[name], view.selected())
        if pair is not None:
            raise PipelineError(
                f"field {name!r} of {view.path} holds images of several sizes "
                f"({describe_size_mismatch(view.metadata[name], pair)}), "
                f"so batches need a crop: pass e.g. pipelines={{{name!r}: "
                f"[CenterCropRGBImageDecoder((224, 224), ratio=224 / 256), ToTensor()]}} or "
                f"RandomResizedCropRGBImageDecoder((224, 224))"
            )
    for field_type, decoder in _DEFAULT_DECODERS:
        if isinstance(field, field_type):
            return [decoder(), ToTensor()]
    raise PipelineError(
        f"field {name!r} has type {type(field).__name__}, which has no default "
        f"pipeline; pass pipelines={{{name!r}: [decoder, ...]}}"
    )


class FieldPipeline:
    """One field's validated chain.

    Attributes:
        name: the output name (the field's name, or a view's name from ``custom_field_mapper``).
        source: the dataset field it reads (``name`` unless it is a second view of a field).
        field: its :class:`ffload.formats.fields.base.Field`.
        ops: the operations (``torch.nn.Module`` wrapped in :class:`ModuleOp`).
        specs: the output :class:`Spec` of each operation (``specs[-1]`` is the batch's).
        buffer_specs: per operation, the buffer :class:`Spec` of ``batch_size`` rows, or ``None``.

    ``fuse=False`` keeps a flip that directly follows the decoder as its own stage (by default
    the decoder applies it, see :class:`~.operation.Operation`; the batches are identical).
    """

    def __init__(
        self,
        name: str,
        field,
        ops: list[Operation],
        view,
        batch_size: int,
        source: str | None = None,
        fuse: bool = True,
        upstream: Mapping[str, FieldPipeline] | None = None,
        later: Sequence[str] = (),
    ):
        # ``declare`` records per-pipeline facts on the operation (image shape, payload size):
        # each pipeline works on its own copies, so one op object may serve several pipelines
        # or loaders.
        ops = [copy.copy(op) for op in ops]
        self.name, self.field, self.ops = name, field, ops
        self.source = name if source is None else source
        self._check_decoder()
        for op in ops:  # box/mask stages read what earlier pipelines publish (.geometry)
            link(name, op, upstream or {}, set(later))
        self.specs: list[Spec] = []
        spec = None
        position = 0  # of the stage among those that are not transfers (mixed into salts)
        for i, op in enumerate(ops):
            try:
                spec = op.declare(spec, field, view)
            except (TypeError, ValueError) as e:  # a plain TypeError here is an operation that does not fit
                error = PipelineError if type(e) is TypeError else type(e)
                raise error(f"pipeline of field {name!r}, operation {i} ({type(op).__name__}): {e}") from e
            if not isinstance(spec, Spec):
                raise PipelineError(
                    f"pipeline of field {name!r}: {type(op).__name__}.declare returned "
                    f"{type(spec).__name__}, not a Spec"
                )
            if hasattr(op, "salt"):  # two identical random ops in one pipeline draw independently,
                # and so do two views of one field (their output names differ); transfers do not
                # count, so a stage draws the same before or after ToTensor / ToDevice
                op.salt = (
                    op_salt(int(op.salt), position)
                    if self.name == self.source
                    else op_salt(int(op.salt), position, self.name)
                )
            position += not getattr(op, "transfer", False)
            self.specs.append(spec)
        if fuse:
            self._fuse_flip()
        self.buffer_specs = [op.buffer_spec(s, batch_size) for op, s in zip(ops, self.specs)]
        self._to_pin = self._torch_input_buffer()

    def _fuse_flip(self) -> None:
        # A flip right after the decoder is applied by the decoder while it writes (Operation's
        # flip-fusion hook): same draws, one pass over the pixels fewer.
        flip = self.ops[1].fusable_flip() if len(self.ops) > 1 else None
        if flip is not None and self.ops[0].fuse_flip(*flip):
            self.ops[1].fused = True

    def _torch_input_buffer(self) -> int | None:
        # The numpy buffer ToTensor wraps: the last one allocated before the first torch stage
        # (in-place operations in between return their input, so they own no buffer).
        first_torch = next((i for i, s in enumerate(self.specs) if s.on_torch), None)
        if first_torch is None:
            return None
        return next((i for i in range(first_torch - 1, -1, -1) if self.buffer_specs[i] is not None), None)

    def _check_decoder(self) -> None:
        first = self.ops[0]
        if not first.is_decoder:
            raise PipelineError(
                f"pipeline of field {self.name!r} must start with a decoder, got {type(first).__name__}"
            )
        if not isinstance(self.field, tuple(first.field_types)):
            kinds = ", ".join(t.__name__ for t in first.field_types) or "no field type"
            raise PipelineError(
                f"field {self.name!r} is a {type(self.field).__name__}, but {type(first).__name__} decodes {kinds}"
            )
        for i, op in enumerate(self.ops[1:], start=1):
            if op.is_decoder:
                raise PipelineError(
                    f"pipeline of field {self.name!r}: operation {i} "
                    f"({type(op).__name__}) is a decoder; only the first may be"
                )

    @property
    def rowwise(self) -> bool:
        """Whether every stage is rowwise (:class:`~.operation.Operation`): the chain may run
        several batches as one call and hand them out as row ranges."""
        return all(op.rowwise for op in self.ops)

    @property
    def output_spec(self) -> Spec:
        """Per-sample spec of the field's batches."""
        return self.specs[-1]

    def allocate(self, pin_memory: bool) -> list[object | None]:
        """One slot's buffers: per operation a ``(batch_size, ...)`` array (numpy, or torch for a
        torch buffer spec) or ``None``. With ``pin_memory``, the numpy buffer that
        :class:`ToTensor` wraps (the last one allocated before it: in-place operations own none)
        lives in pinned (page-locked) memory so that host-to-device copies can be asynchronous."""
        buffers = []
        for i, bspec in enumerate(self.buffer_specs):
            if bspec is None:
                buffers.append(None)
            elif bspec.on_torch:
                buffers.append(torch.empty(bspec.shape, dtype=bspec.dtype, device=bspec.device))
            elif pin_memory and i == self._to_pin:
                dtype = torch.from_numpy(np.empty(0, dtype=bspec.dtype)).dtype
                buffers.append(torch.empty(bspec.shape, dtype=dtype, pin_memory=True).numpy())
            else:
                buffers.append(np.empty(bspec.shape, dtype=bspec.dtype))
        return buffers

    def run(self, buffers: Sequence, ctx: BatchContext):
        """Apply the chain to one batch (``ctx.indices``) with one slot's ``buffers``; stages
        that record geometry (:mod:`.geometry`) update the published record as they run."""
        x = None
        for op, buf in zip(self.ops, buffers):
            if op.publish is not None and records(op):
                op.record_geometry(ctx.shared[op.publish], ctx)
            x = op(x, buf, ctx)
        return x


def build_pipelines(
    view,
    pipelines: Mapping[str, Sequence | None] | None,
    batch_size: int,
    custom_field_mapper: Mapping[str, str] | None = None,
) -> list[FieldPipeline]:
    """Validate ``pipelines`` against the dataset and build the enabled fields' chains.

    Args:
        view: the :class:`ffload.formats.DatasetView`.
        pipelines: field name -> list of operations (``None`` disables the field); fields not
            listed get :func:`default_pipeline`. ``None`` means all defaults.
        batch_size: rows of each buffer.
        custom_field_mapper: extra output name -> the dataset field it decodes again (FFCV's
            argument of that name): several augmented views of one sample from one read, e.g.
            ``{"image2": "image"}`` with ``pipelines["image2"]`` (SimCLR / DINO multi-crop). Views
            come after the dataset's fields in the batch and draw their own random numbers.

    Returns:
        The enabled fields' :class:`FieldPipeline`, in the dataset's field order.

    Raises:
        ffload.errors.ConfigurationError: unknown field names, a bad ``custom_field_mapper``, an
            empty pipeline, every field disabled.
        ffload.errors.PipelineError: a pipeline that is not a list of operations, or an operation
            that does not fit its input (an operation's plain ``TypeError`` becomes one; its other
            errors keep their class), each naming the field and operation.
    """
    pipelines = {} if pipelines is None else pipelines
    if not isinstance(pipelines, Mapping):
        raise PipelineError(
            f"pipelines must be a dict of field name -> list of operations, got {type(pipelines).__name__}"
        )
    mapper = dict(custom_field_mapper or {})
    for out, src in mapper.items():
        if out in view.fields or src not in view.fields or out not in pipelines or pipelines[out] is None:
            raise ConfigurationError(
                f"custom_field_mapper {out!r} -> {src!r}: the view needs a new name, an existing "
                f"field ({', '.join(map(repr, view.fields))}) and a pipeline in pipelines[{out!r}]"
            )
    unknown = [k for k in pipelines if k not in view.fields and k not in mapper]
    if unknown:
        raise ConfigurationError(
            f"pipelines names unknown field(s) {', '.join(map(repr, unknown))}; "
            f"{view.path} has fields {', '.join(map(repr, view.fields))}"
        )
    built: list[FieldPipeline] = []
    enabled = [n for n in view.fields if not (n in pipelines and pipelines[n] is None)] + list(mapper)
    for name, field in view.fields.items():
        if name in pipelines and pipelines[name] is None:
            continue
        ops = _as_operations(name, pipelines[name]) if name in pipelines else default_pipeline(name, field, view)
        built.append(
            FieldPipeline(
                name, field, ops, view, batch_size, upstream={p.name: p for p in built}, later=enabled[len(built) + 1 :]
            )
        )
    for out, src in mapper.items():
        built.append(
            FieldPipeline(
                out,
                view.fields[src],
                _as_operations(out, pipelines[out]),
                view,
                batch_size,
                source=src,
                upstream={p.name: p for p in built},
                later=enabled[len(built) + 1 :],
            )
        )
    if not built:
        raise ConfigurationError(f"every field of {view.path} is disabled in pipelines; enable at least one")
    return built


def _as_operations(name: str, ops) -> list[Operation]:
    if isinstance(ops, (str, bytes)) or not isinstance(ops, Sequence):
        raise PipelineError(
            f"pipeline of field {name!r} must be a list of operations (or None), got {type(ops).__name__}"
        )
    if not ops:
        raise ConfigurationError(f"pipeline of field {name!r} is empty; pass None to disable the field")
    out: list[Operation] = []
    for i, op in enumerate(ops):
        if isinstance(op, Operation):
            out.append(op)
        elif isinstance(op, torch.nn.Module):
            out.append(ModuleOp(op))
        else:
            raise PipelineError(
                f"pipeline of field {name!r}: item {i} is {op!r}, not an ffload Operation or a torch.nn.Module"
            )
    return out


def cuda_device(pipelines: Sequence[FieldPipeline]) -> torch.device | None:
    """The CUDA device the batches end on (the first pipeline whose output is on CUDA), or None.

    Raises:
        ffload.errors.ConfigurationError: fields end on different CUDA devices (one loader feeds
            one device).
    """
    devices = set()
    for p in pipelines:
        device = torch.device(p.output_spec.device)
        if p.output_spec.on_torch and device.type == "cuda":
            devices.add(device if device.index is not None else torch.device("cuda", torch.cuda.current_device()))
    if len(devices) > 1:
        raise ConfigurationError(
            f"fields end on several CUDA devices {sorted(map(str, devices))}; one loader feeds one device"
        )
    return devices.pop() if devices else None
