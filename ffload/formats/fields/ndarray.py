"""Array fields: :class:`NDArrayField` (fixed shape and dtype, FFCV type id 4: ``prod(shape) *
itemsize`` bytes, C order) and :class:`RaggedArrayField` (``K`` rows of an array, ``K`` varying per
sample; an ffload extension stored as an FFCV BytesField), with :func:`cast_values`, the casting
rule of ffload's typed values."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from ffload.errors import ConfigurationError, FieldError
from ffload.formats.fields.base import ARG_SIZE, MAX_PAYLOAD, Field, plain_dtype
from ffload.formats.fields.bytes import BytesExtensionField

# FFCV's NDArrayField argument block: shape as 32 x <u8 (zero-terminated), then the length of a
# JSON dtype description (numpy ``dtype.descr``), then that JSON text in ASCII.
_NDARRAY_ARGS = np.dtype([("shape", "<u8", 32), ("type_length", "<u8")])


class NDArrayField(Field):
    """A fixed-shape, fixed-dtype array per sample (FFCV type id 4); metadata is the ``<u8`` offset.

    Args:
        dtype: numpy dtype of the arrays (stored little-endian as given by ``dtype.descr``).
        shape: per-sample shape, at most 32 dimensions, every dimension >= 1.
    Raises:
        ConfigurationError: a bad shape, an object dtype, or more than 2 GiB per sample.
    """

    type_id = 4
    metadata_type = np.dtype("<u8")
    ptr_name = ""

    def __init__(self, dtype: npt.DTypeLike, shape: Sequence[int]):
        self.dtype = np.dtype(dtype)
        self.shape = tuple(int(s) for s in shape)
        if not 1 <= len(self.shape) <= 32 or min(self.shape) < 1:
            raise ConfigurationError(f"NDArrayField shape must have 1..32 positive dims, got {shape}")
        if self.dtype.hasobject:
            raise ConfigurationError("NDArrayField cannot store object arrays")
        self.element_size = self.dtype.itemsize * math.prod(self.shape)  # Python ints: no overflow
        if self.element_size > MAX_PAYLOAD:
            raise ConfigurationError(
                f"NDArrayField of shape {self.shape} would need {self.element_size} "
                f"bytes per sample (more than {MAX_PAYLOAD})"
            )

    def arguments(self):
        return {"dtype": self.dtype.str, "shape": list(self.shape)}

    def to_binary(self):
        out = np.zeros(ARG_SIZE, dtype=np.uint8)
        header = np.zeros((), dtype=_NDARRAY_ARGS)
        header["shape"][: len(self.shape)] = self.shape
        descr = json.dumps(self.dtype.descr).encode("ascii")
        header["type_length"] = len(descr)
        blob = header.tobytes() + descr
        if len(blob) > ARG_SIZE:
            raise FieldError(f"NDArrayField dtype description too long ({len(blob)} bytes)")
        out[: len(blob)] = np.frombuffer(blob, dtype=np.uint8)
        return out

    @classmethod
    def from_binary(cls, binary):
        header = np.frombuffer(binary[: _NDARRAY_ARGS.itemsize].tobytes(), dtype=_NDARRAY_ARGS)[0]
        n = int(header["type_length"])
        if not 0 < n <= ARG_SIZE - _NDARRAY_ARGS.itemsize:
            raise FieldError(f"corrupt NDArrayField arguments (dtype length {n})")
        descr = json.loads(binary[_NDARRAY_ARGS.itemsize :][:n].tobytes().decode("ascii"))
        descr = [tuple(tuple(y) if isinstance(y, list) else y for y in x) for x in descr]
        dtype = np.dtype(descr)
        if len(descr) == 1 and descr[0][0] == "":  # a plain dtype: numpy's descr names it ''
            dtype = dtype["f0"]
        shape = [int(s) for s in header["shape"]]
        while shape and shape[-1] == 0:
            shape.pop()
        return cls(dtype, shape)

    @classmethod
    def from_arguments(cls, args):
        return cls(np.dtype(args["dtype"]), args["shape"])

    def encode(self, value, index):
        arr = np.asarray(value)
        if arr.shape != self.shape:
            raise FieldError(f"NDArrayField expects shape {self.shape}, got {arr.shape}")
        if arr.dtype != self.dtype:
            if not np.can_cast(arr.dtype, self.dtype, casting="same_kind"):
                raise FieldError(f"NDArrayField expects dtype {self.dtype}, got {arr.dtype}")
            arr = arr.astype(self.dtype)
        payload = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
        return np.zeros((), dtype=self.metadata_type)[()], payload

    def check_payloads(self, column, sizes):
        bad = np.flatnonzero(sizes != self.element_size)
        if bad.size:
            i = int(bad[0])
            return f"sample {i}: payload is {int(sizes[i])} bytes, expected {self.element_size}"
        return None

    def __eq__(self, other):
        return isinstance(other, NDArrayField) and (self.dtype, self.shape) == (other.dtype, other.shape)


def cast_values(arr: np.ndarray, dtype: np.dtype, owner: str) -> np.ndarray:
    """``arr`` as ``dtype``: safe casts always; integers into another integer type only when
    every value fits (a label 300 is refused by uint8 instead of wrapping); numbers into floats.

    Raises:
        FieldError: naming ``owner``, when the values cannot be cast so.
    """
    if arr.dtype == dtype:
        return arr
    if arr.size == 0 or np.can_cast(arr.dtype, dtype, casting="safe"):
        return arr.astype(dtype)
    if arr.dtype.kind in "biu" and dtype.kind in "iu":
        info = np.iinfo(dtype)
        if info.min <= arr.min() and arr.max() <= info.max:
            return arr.astype(dtype)
        raise FieldError(f"{owner}: values {arr.min()}..{arr.max()} do not fit {dtype}")
    if arr.dtype.kind in "biuf" and dtype.kind == "f" and np.can_cast(arr.dtype, dtype, "same_kind"):
        return arr.astype(dtype)
    raise FieldError(f"{owner} expects dtype {dtype}, got {arr.dtype}")


class RaggedArrayField(BytesExtensionField):
    """A variable-length array per sample: shape ``(K, *inner_shape)``, ``K >= 0`` varying per sample.

    For example multi-label targets ``(K,) int``, boxes ``(K, 4) float32``, keypoints
    ``(K, 17, 3)``.

    On disk (ffload extension, see ``docs/fields.md``): FFCV's BytesField (type id 3) with the
    ``K * prod(inner_shape) * itemsize`` bytes of the array, C order, little-endian; ``K`` is
    ``size // row_bytes`` (no header), so ffcv 1.0.2 reads the field as bytes and
    ``np.frombuffer(payload, dtype).reshape(-1, *inner_shape)`` restores it.

    Args:
        dtype: a numeric dtype (bool, int, uint, float, complex).
        inner_shape: the shape of one row, 0..31 dimensions, each >= 1 (``()``: K scalars).

    Encoding accepts anything ``np.asarray`` turns into ``(K, *inner_shape)`` (an empty list is
    ``K = 0``); integers are cast only when every value fits ``dtype``.

    Raises:
        ConfigurationError: a bad dtype or inner shape, or a row larger than 2 GiB.
    """

    kind = "ragged"

    def __init__(self, dtype: npt.DTypeLike, inner_shape: Sequence[int] = ()):
        self.dtype = plain_dtype(dtype, "biufc", "RaggedArrayField")
        self.inner_shape = tuple(int(s) for s in inner_shape)
        if len(self.inner_shape) > 31 or (self.inner_shape and min(self.inner_shape) < 1):
            raise ConfigurationError(f"RaggedArrayField inner_shape must have 0..31 positive dims, got {inner_shape}")
        self.row_bytes = self.dtype.itemsize * math.prod(self.inner_shape)
        if self.row_bytes > MAX_PAYLOAD:
            raise ConfigurationError(f"RaggedArrayField row of {self.row_bytes} bytes is above {MAX_PAYLOAD}")

    def arguments(self):
        return {"dtype": self.dtype.str, "inner_shape": list(self.inner_shape)}

    def encode(self, value, index):
        arr = np.asarray(value)
        if arr.size == 0 and arr.ndim <= 1:
            arr = np.zeros((0,) + self.inner_shape, dtype=self.dtype)
        if arr.ndim != len(self.inner_shape) + 1 or arr.shape[1:] != self.inner_shape:
            raise FieldError(f"RaggedArrayField expects shape (K,) + {self.inner_shape}, got {arr.shape}")
        arr = cast_values(arr, self.dtype, "RaggedArrayField")
        if arr.nbytes > MAX_PAYLOAD:
            raise FieldError(f"RaggedArrayField value of {arr.nbytes} bytes is above {MAX_PAYLOAD}")
        meta = np.zeros((), dtype=self.metadata_type)
        meta["size"] = arr.nbytes
        return meta[()], np.ascontiguousarray(arr).reshape(-1).view(np.uint8)

    def to_array(self, payload):
        """``(K, *inner_shape)`` of :attr:`dtype` (see :meth:`BytesExtensionField.to_array`)."""
        if len(payload) % self.row_bytes:
            raise FieldError(self.describe_bad_size(len(payload)))
        return np.frombuffer(payload, dtype=self.dtype).reshape((-1,) + self.inner_shape)

    def lengths(self, sizes: np.ndarray) -> np.ndarray:
        """``(N,) int64`` row counts K of payloads of ``sizes`` bytes (``view.sizes[name]``)."""
        return (np.asarray(sizes, dtype=np.uint64) // np.uint64(self.row_bytes)).astype(np.int64)

    def bad_sizes(self, sizes):
        return np.flatnonzero(np.asarray(sizes, dtype=np.uint64) % np.uint64(self.row_bytes))

    def describe_bad_size(self, size):
        return (
            f"payload of {size} bytes is not a whole number of {self.row_bytes}-byte rows "
            f"({self.dtype}, inner shape {self.inner_shape})"
        )
