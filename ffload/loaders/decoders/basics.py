"""Decoders of the scalar, array and byte fields: a metadata take for ints and floats, one
compiled gather per batch for the payload fields.

Semantics follow FFCV 1.0.2's decoders (``ffcv/fields/{basics,ndarray,bytes}.py``) unless a
docstring says otherwise; the ragged decoders have no FFCV counterpart.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ffload.errors import ConfigurationError, FormatError
from ffload.formats.fields.bytes import BytesField, JSONField
from ffload.formats.fields.ndarray import NDArrayField, RaggedArrayField, cast_values
from ffload.formats.fields.scalars import FloatField, IntField
from ffload.loaders.decoders.base import Decoder, copy_bytes, flat_view, region_array
from ffload.loaders.pipeline.operation import Spec


class _MetadataDecoder(Decoder):
    """Scalars stored as the metadata itself: ``dst[:B] = metadata[indices]``."""

    dtype: np.dtype

    def declare(self, spec, field, view):
        self._check_field(field, view)
        return Spec((), self.dtype)

    def __call__(self, src, dst, ctx):
        out = dst[: len(ctx.indices)]
        # a compiled loop, not NumPy: ``np.take(..., out=out)`` on a strided column (a field of the
        # metadata table) first copies the whole column, every batch (~200 us per batch for 50,000
        # samples), and fancy indexing holds the GIL for every row of a job of many batches
        _gather_rows(ctx.metadata, ctx.indices, out)
        return out


@njit(nogil=True, cache=True)
def _gather_rows(column, indices, out):
    """``out[i] = column[indices[i]]`` for every row ``i`` (``column``: ``(N,)``, any stride)."""
    for i in range(indices.shape[0]):
        out[i] = column[indices[i]]


class IntDecoder(_MetadataDecoder):
    """Decode an IntField: per sample ``() int64`` (FFCV's ``IntDecoder``).

    Raises PipelineError at declare for another field type."""

    field_types = (IntField,)
    dtype = np.dtype(np.int64)


class FloatDecoder(_MetadataDecoder):
    """Decode a FloatField: per sample ``() float64`` (FFCV's ``FloatDecoder``).

    Raises PipelineError at declare for another field type."""

    field_types = (FloatField,)
    dtype = np.dtype(np.float64)


@njit(nogil=True, cache=True)
def _gather_payloads(indices, ptrs, sizes, region, dst, width):
    """Copy each sample's payload into its row of ``dst`` (flat ``(B * width,) uint8``),
    zero-padding the rest. Returns -1, or the row whose payload is longer than ``width`` or
    outside ``region``."""
    for b in range(indices.shape[0]):
        s = indices[b]
        p = np.int64(ptrs[s])
        n = np.int64(sizes[s])
        if p < 0 or n > width or p + n > region.shape[0]:
            return b
        copy_bytes(region, p, dst, b * width, n)
        start = np.uint64(b * width)
        for k in range(np.uint64(n), np.uint64(width)):
            dst[start + k] = 0
    return -1


class NDArrayDecoder(Decoder):
    """Decode an NDArrayField to its ``shape`` and ``dtype`` per sample (FFCV's ``NDArrayDecoder``).

    Per sample the field's ``shape`` and ``dtype`` (little-endian), gathered by one kernel per
    batch.

    Raises:
        PipelineError: (building the pipeline) the field is not an NDArrayField.
        FormatError: (building the pipeline) a payload's size differs from ``prod(shape) * itemsize``.
    """

    field_types = (NDArrayField,)

    def declare(self, spec, field, view):
        name = self._check_field(field, view)
        self.dtype = np.dtype(field.dtype).newbyteorder("<")
        self.nbytes = int(np.prod(field.shape)) * self.dtype.itemsize
        bad = np.flatnonzero(view.sizes[name] != self.nbytes)
        if bad.size:
            s = int(bad[0])
            raise FormatError(
                f"field '{name}', sample {s}: payload is {int(view.sizes[name][s])} bytes, expected {self.nbytes}"
            )
        return Spec(tuple(field.shape), self.dtype)

    def __call__(self, src, dst, ctx):
        batch = len(ctx.indices)
        out = dst[:batch]
        flat = flat_view(out).view(np.uint8)
        bad = _gather_payloads(ctx.indices, ctx.ptrs, ctx.sizes, region_array(ctx), flat, self.nbytes)
        if bad >= 0:
            raise FormatError(
                f"field '{self.field_name}', sample {int(ctx.indices[bad])}: payload lies outside the data region"
            )
        return out


class BytesDecoder(Decoder):
    """Decode a BytesField or JSONField to zero-padded ``(max_size,) uint8`` rows (FFCV's ``BytesDecoder``).

    Per sample the payload followed by zeros; ``max_size`` is the largest payload of the samples to be read (``view.selected()``:
    the dataset, or a Loader's ``indices``; FFCV's ``BytesDecoder``, which
    leaves the padding unspecified). Use ``JSONField.unpack`` to parse JSON rows.

    Raises:
        PipelineError: (building the pipeline) the field is neither a BytesField nor a JSONField.
    """

    field_types = (BytesField, JSONField)

    def declare(self, spec, field, view):
        name = self._check_field(field, view)
        sizes = view.sizes[name][view.selected()]
        self.max_size = int(sizes.max()) if len(sizes) else 0
        return Spec((self.max_size,), np.dtype(np.uint8))

    def __call__(self, src, dst, ctx):
        out = dst[: len(ctx.indices)]
        bad = _gather_payloads(ctx.indices, ctx.ptrs, ctx.sizes, region_array(ctx), flat_view(out), self.max_size)
        if bad >= 0:
            raise FormatError(
                f"field '{self.field_name}', sample {int(ctx.indices[bad])}: payload is "
                f"longer than {self.max_size} bytes or outside the data region"
            )
        return out


@njit(nogil=True, cache=True)
def _gather_clipped(indices, ptrs, sizes, region, dst, width, pad):
    """Copy the first ``min(size, width)`` bytes of each sample's payload into its row of ``dst``
    (flat ``(B * width,) uint8``) and fill the rest of the row from ``pad`` (``(width,) uint8``).
    Returns -1, or the row whose payload lies outside ``region``."""
    for b in range(indices.shape[0]):
        s = indices[b]
        p = np.int64(ptrs[s])
        n = np.int64(sizes[s])
        if p < 0 or p + n > region.shape[0]:
            return b
        n = min(n, width)
        copy_bytes(region, p, dst, b * width, n)
        start = np.uint64(b * width)
        for k in range(np.uint64(n), np.uint64(width)):
            dst[start + k] = pad[k]
    return -1


def _max_length(max_length) -> int | None:
    if max_length is not None and int(max_length) < 0:
        raise ConfigurationError(f"max_length must be >= 0 or None, got {max_length}")
    return None if max_length is None else int(max_length)


class RaggedArrayDecoder(Decoder):
    """Decode a RaggedArrayField into a padded ``(B, K_max, *inner_shape)`` batch.

    Per sample ``(K_max, *inner_shape)`` of the field's dtype, the sample's ``K`` rows first, then rows of ``fill``. Pair it with
    :class:`RaggedLengthDecoder` on a second view of the field for the ``(B,)`` lengths::

        Loader(path, ..., pipelines={"boxes": [RaggedArrayDecoder(), ToTensor()],
                                     "num_boxes": [RaggedLengthDecoder(), ToTensor()]},
               custom_field_mapper={"num_boxes": "boxes"})

    (torch's ``pad_sequence`` layout, batch first; FFCV has no such decoder.)

    Args:
        max_length: ``K_max`` in rows. ``None``: the largest ``K`` of the samples to be read
            (``view.selected()``: the dataset, or a Loader's ``indices``), from the sizes at declare (one batch shape for every epoch). An int: samples with more rows
            keep their first ``max_length`` rows (the rest are dropped; the lengths decoder then
            reports ``min(K, max_length)``), and ``K_max = max_length`` even if no sample is that long.
        fill: the padding value, cast to the field's dtype (e.g. ``-1`` for label lists).

    Memory: each batch buffer is ``batch_size * K_max * row_bytes`` bytes, so one very long
    sample sets the size of every batch: pass ``max_length`` to bound it.

    Raises:
        PipelineError: (building the pipeline) the field is not a RaggedArrayField.
        ConfigurationError: a negative ``max_length``.
        FieldError: (building the pipeline) a ``fill`` the dtype
            cannot hold.
        FormatError: (loading) a payload outside the data region, naming the field
            and sample.
    """

    field_types = (RaggedArrayField,)

    def __init__(self, max_length: int | None = None, fill: float = 0):
        self.max_length = _max_length(max_length)
        self.fill = fill

    def declare(self, spec, field, view):
        name = self._check_field(field, view)
        lengths = field.lengths(view.sizes[name][view.selected()])
        rows = self.max_length if self.max_length is not None else int(lengths.max()) if lengths.size else 0
        fill = cast_values(np.array(self.fill), field.dtype, f"fill {self.fill!r}")
        row = np.full(field.inner_shape, fill, dtype=field.dtype)
        self.pad = np.tile(row.reshape(-1).view(np.uint8), rows)
        self.width = rows * field.row_bytes
        return Spec((rows,) + field.inner_shape, field.dtype)

    def __call__(self, src, dst, ctx):
        out = dst[: len(ctx.indices)]
        bad = _gather_clipped(
            ctx.indices, ctx.ptrs, ctx.sizes, region_array(ctx), flat_view(out).view(np.uint8), self.width, self.pad
        )
        if bad >= 0:
            raise FormatError(
                f"field '{self.field_name}', sample {int(ctx.indices[bad])}: payload lies outside the data region"
            )
        return out


class RaggedLengthDecoder(Decoder):
    """Decode the row counts ``K`` of a RaggedArrayField, ``(B,) int64``, from the metadata only.

    Per sample ``() int64``, ``K`` (or ``min(K, max_length)``, matching
    :class:`RaggedArrayDecoder` with the same ``max_length``). ``K = size // row_bytes``; the
    payload is never read.

    Args:
        max_length: cap on the count, as the :class:`RaggedArrayDecoder` it accompanies; None: no cap.

    Raises:
        PipelineError: (building the pipeline) the field is not a RaggedArrayField.
        ConfigurationError: a negative ``max_length``.
    """

    field_types = (RaggedArrayField,)

    def __init__(self, max_length: int | None = None):
        self.max_length = _max_length(max_length)

    def declare(self, spec, field, view):
        self._check_field(field, view)
        self.row_bytes = np.uint64(field.row_bytes)
        return Spec((), np.dtype(np.int64))

    def __call__(self, src, dst, ctx):
        out = dst[: len(ctx.indices)]
        out[:] = ctx.sizes[ctx.indices] // self.row_bytes
        if self.max_length is not None:
            np.minimum(out, self.max_length, out=out)
        return out
