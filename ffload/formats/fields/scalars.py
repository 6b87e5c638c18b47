"""Scalar fields, whose value is the metadata record itself (no payload): :class:`IntField`
(``<i8``, FFCV type id 1) and :class:`FloatField` (``<f8``, FFCV type id 0)."""

from __future__ import annotations

import numpy as np

from ffload.errors import FieldError
from ffload.formats.fields.base import Field


class IntField(Field):
    """A scalar integer per sample, stored as ``<i8`` metadata (FFCV type id 1). Decodes to int64."""

    type_id = 1
    metadata_type = np.dtype("<i8")

    def encode(self, value, index):
        try:
            v = np.int64(value)
        except (TypeError, ValueError, OverflowError) as e:
            raise FieldError(f"IntField expects an integer, got {value!r}") from e
        if np.ndim(value) != 0 or float(value) != float(v):
            raise FieldError(f"IntField expects an integer scalar, got {value!r}")
        return np.array(v, dtype=self.metadata_type)[()], None

    def check_values(self, column):
        """FloatField data read as IntField (FFCV type ids 0 and 1 share the 8-byte layout): refused
        when at least 8 values are all the bit patterns of float64s in ``[1e-12, 1e12]`` (``3.0``
        is the int 4613937818241073152), which integers below 2**52 never are and random 64-bit
        integers are with probability ~0.03 each."""
        values = np.asarray(column).astype("<i8", copy=False)
        nonzero = values[values != 0]
        if nonzero.size < 8 or np.any(np.abs(nonzero.astype(np.float64)) < 2.0**52):
            return None
        as_float = np.abs(nonzero.view("<f8"))
        if np.all((as_float >= 1e-12) & (as_float <= 1e12)):
            return (
                f"every value is the bit pattern of a float (e.g. {int(nonzero[0])} is "
                f"{float(nonzero.view('<f8')[0])!r}): float data under the IntField type id "
                f"(corrupt field type)"
            )
        return None


class FloatField(Field):
    """A scalar float per sample, stored as ``<f8`` metadata (FFCV type id 0). Decodes to float64."""

    type_id = 0
    metadata_type = np.dtype("<f8")

    def encode(self, value, index):
        if np.ndim(value) != 0:
            raise FieldError(f"FloatField expects a scalar, got shape {np.shape(value)}")
        try:
            return np.array(value, dtype=self.metadata_type)[()], None
        except (TypeError, ValueError) as e:
            raise FieldError(f"FloatField expects a number, got {value!r}") from e

    def check_values(self, column):
        """IntField data read as FloatField: refused when at least two non-zero values and all of
        them are subnormal float64s (below ``np.finfo(float).tiny``), as small integers' bit
        patterns are."""
        values = np.asarray(column).astype("<f8", copy=False)
        nonzero = values[values != 0]
        if nonzero.size >= 2 and np.all(np.abs(nonzero) < np.finfo(np.float64).tiny):
            return (
                f"every non-zero value is a subnormal float (e.g. {float(nonzero[0])!r} is the "
                f"integer {int(nonzero[:1].view('<i8')[0])}): integer data under the FloatField "
                f"type id (corrupt field type)"
            )
        return None
