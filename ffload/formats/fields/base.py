"""The field base class and what every field type shares: the argument block's size and JSON
reader, the largest payload, plain dtypes, and the per-sample metadata record of a dataset.

Each field owns a fixed-size *metadata* record per sample (FFCV's ``metadata_type``) and, for
variable-size values, one *payload* (a byte string stored in a data page / the LMDB value).
Type ids, metadata layouts and the 1024-byte argument blocks follow FFCV 1.0.2's ``.beton`` v2
format (``ffcv/types.py``, ``ffcv/fields/*.py``) so that files round-trip with ffcv both ways.
The field types live in :mod:`.scalars`, :mod:`.bytes`, :mod:`.ndarray` and :mod:`.image`;
the tables of them by type id and name in :mod:`.registry`.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from ffload.errors import ConfigurationError, FieldError

MAX_PAYLOAD = 1 << 31  # bytes: a .beton page (uint32 page size) holds at most this much
ARG_SIZE = 1024  # bytes of the per-field argument block in the .beton field descriptor


class Field:
    """Base class of field types.

    Attributes:
        type_id: FFCV's type id (``ffcv.types.TYPE_ID_HANDLER``).
        metadata_type: numpy dtype of the per-sample metadata record.
        ptr_name: the metadata sub-field holding the payload's file offset, ``""`` when the whole
            metadata record is the offset (NDArrayField), ``None`` when there is no payload.
    """

    type_id: int = 255
    metadata_type: np.dtype
    ptr_name: str | None = None

    @property
    def has_payload(self) -> bool:
        """True when the field stores a payload besides its metadata record (:attr:`ptr_name`
        is not None)."""
        return self.ptr_name is not None

    def get_pointer(self, records: np.ndarray) -> np.ndarray:
        """The payload offsets (bytes) held in ``records``, this field's metadata records (any
        shape): a view, ``records`` itself when the whole record is the offset.

        Raises:
            TypeError: the field has no payload.
        """
        if self.ptr_name is None:
            raise TypeError(f"{type(self).__name__} has no payload, hence no pointer")
        return records if self.ptr_name == "" else records[self.ptr_name]

    def set_pointer(self, records: np.ndarray, offsets) -> None:
        """Store payload ``offsets`` (bytes, broadcast to ``records``' shape) into ``records``,
        this field's metadata records (a writable array view, 0-d for one record).

        Raises:
            TypeError: the field has no payload.
        """
        if self.ptr_name is None:
            raise TypeError(f"{type(self).__name__} has no payload, hence no pointer")
        if self.ptr_name == "":
            records[...] = offsets
        else:
            records[self.ptr_name] = offsets

    def arguments(self) -> dict[str, Any]:
        """The field's arguments as a JSON-able dict (stored in LMDB's metadata record)."""
        return {}

    def to_binary(self) -> np.ndarray:
        """The ``(1024,) uint8`` argument block of the .beton field descriptor (zeros: FFCV's
        layout for fields without arguments)."""
        return np.zeros(ARG_SIZE, dtype=np.uint8)

    @classmethod
    def from_binary(cls, binary: np.ndarray) -> Field:
        """Rebuild the field from its ``(1024,) uint8`` argument block: zeros for a field without
        arguments (what ffcv and ffload write), FieldError otherwise (another type's arguments: the
        type id was changed)."""
        argument_json(binary, None, cls.__name__)
        return cls()

    @classmethod
    def from_arguments(cls, args: dict[str, Any]) -> Field:
        """Rebuild the field from :meth:`arguments` (LMDB metadata)."""
        return cls(**args)

    def encode(self, value, index: int) -> tuple[np.void, np.ndarray | None]:
        """Encode one value of sample ``index``.

        Returns:
            ``(metadata, payload)``: a metadata record of :attr:`metadata_type` (its pointer left
            0: the writer fills it) and the payload as a 1-D uint8 array, or ``None``.

        Raises:
            FieldError: the value does not fit the field.
        """
        raise NotImplementedError

    def check_payloads(self, column: np.ndarray, sizes: np.ndarray) -> str | None:
        """Check metadata against payload sizes (bytes) for every sample at open time.

        Returns ``None`` when consistent, else a message naming the first bad sample.
        """
        return None

    def check_values(self, column: np.ndarray) -> str | None:
        """Check that the ``(N,)`` metadata column looks like this field's data, at open time (O(N),
        vectorised): catches a type id flipped to another type of the same layout. Returns
        ``None`` when plausible, else the cause."""
        return None

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.arguments().items())
        return f"{type(self).__name__}({args})"

    def __eq__(self, other) -> bool:
        return type(self) is type(other) and self.arguments() == other.arguments()


def argument_json(binary: np.ndarray, magic: bytes | None, owner: str) -> dict:
    """The JSON object an argument block holds after ``magic`` (then NUL padding), or ``{}`` for an
    all-zero block (ffcv's, for every type but NDArrayField). ``magic`` None: the type has no
    arguments, only zeros are valid.

    Raises:
        FieldError: anything else (the type id was changed: the block is another type's, e.g.
            ``ffload-rgb:`` under FloatField), naming ``owner`` and the block's first bytes.
    """
    raw = bytes(binary)
    text, _, rest = raw.partition(b"\0")
    if not text:
        if rest.strip(b"\0"):
            raise FieldError(
                f"{owner}'s argument block is not empty ({raw[:40]!r}...): another field type's "
                "arguments (corrupt field type)"
            )
        return {}
    if magic is None or not text.startswith(magic) or rest.strip(b"\0"):
        raise FieldError(
            f"{owner}'s argument block holds {text[:40]!r}: another field type's arguments (corrupt field type)"
        )
    try:
        args = json.loads(text[len(magic) :].decode("ascii"))
    except ValueError as e:
        raise FieldError(f"corrupt {owner} arguments {text[:80]!r}: {e}") from e
    if not isinstance(args, dict):
        raise FieldError(f"corrupt {owner} arguments {text[:80]!r}: not a JSON object")
    return args


def plain_dtype(dtype, kinds: str, owner: str) -> np.dtype:
    """``dtype`` little-endian, or ConfigurationError unless it is a plain numeric dtype whose
    kind is in ``kinds`` (numpy's ``dtype.kind`` letters)."""
    try:
        dtype = np.dtype(dtype)
    except TypeError as e:
        raise ConfigurationError(f"{owner}: not a dtype: {dtype!r}") from e
    if dtype.kind not in kinds or dtype.fields is not None or dtype.subdtype is not None:
        raise ConfigurationError(f"{owner} stores plain numeric dtypes of kinds {kinds!r}, got {dtype}")
    return dtype.newbyteorder("<") if dtype.itemsize > 1 else dtype


def metadata_dtype(fields) -> np.dtype:
    """The per-sample metadata record of a dataset: the fields' records in order, aligned
    (FFCV's ``get_metadata_type``: ``np.dtype([('', t) ...], align=True)``, names f0, f1, ...)."""
    return np.dtype([("", f.metadata_type) for f in fields], align=True)


def named_metadata_dtype(fields: dict[str, Field]) -> np.dtype:
    """:func:`metadata_dtype` with the fields' names instead of f0, f1, ... (same layout)."""
    base = metadata_dtype(list(fields.values()))
    return np.dtype(
        {
            "names": list(fields),
            "formats": [base.fields[f"f{k}"][0] for k in range(len(fields))],
            "offsets": [base.fields[f"f{k}"][1] for k in range(len(fields))],
            "itemsize": base.itemsize,
        }
    )
