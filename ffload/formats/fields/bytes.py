"""Byte-string fields and ffload's extension mechanism.

Payload encodings:
    BytesField     the bytes as given (FFCV type id 3, metadata ``(ptr <u8, size <u8)``).
    JSONField      UTF-8 JSON text followed by one NUL byte (FFCV's ``JSONField``, type id 5).
    BytesExtensionField  base of ffload's fields that ffcv has no type for, stored as FFCV
                   BytesFields (:class:`~ffload.formats.fields.ndarray.RaggedArrayField`,
                   :class:`~ffload.formats.fields.image.ImageArrayField`); each subclass is
                   entered in :data:`BYTES_EXTENSIONS` under its ``kind`` when it is defined.
"""

from __future__ import annotations

import json

import numpy as np

from ffload.errors import FieldError
from ffload.formats.fields.base import ARG_SIZE, Field, argument_json

# ffload's fields that ffcv has no type for are stored under FFCV's BytesField type id and layout;
# their description is JSON in the argument block (zeros for ffcv's BytesField, which ignores it).
_EXTENSION_MAGIC = b"ffload-field:"

BYTES_EXTENSIONS: dict[str, type] = {}
"""ffload's fields under FFCV's BytesField type id, by their argument block's ``kind`` (filled by
:meth:`BytesExtensionField.__init_subclass__`; the package ``ffload.formats.fields`` imports every field module)."""


class BytesField(Field):
    """A variable-length byte string per sample (FFCV type id 3): metadata ``(ptr <u8, size <u8)``.

    Accepts ``bytes``, ``bytearray``, ``memoryview`` or a 1-D uint8 array.
    """

    type_id = 3
    metadata_type = np.dtype([("ptr", "<u8"), ("size", "<u8")])
    ptr_name = "ptr"

    def _payload(self, value) -> np.ndarray:
        if isinstance(value, (bytes, bytearray, memoryview)):
            return np.frombuffer(bytes(value), dtype=np.uint8)
        arr = np.asarray(value)
        if arr.dtype != np.uint8 or arr.ndim != 1:
            raise FieldError(
                f"{type(self).__name__} expects bytes or a 1-D uint8 array, got {arr.dtype} of shape {arr.shape}"
            )
        return np.ascontiguousarray(arr)

    def encode(self, value, index):
        payload = self._payload(value)
        meta = np.zeros((), dtype=self.metadata_type)
        meta["size"] = payload.size
        return meta[()], payload

    @classmethod
    def from_binary(cls, binary):
        """A BytesField, or the ffload extension field (:class:`RaggedArrayField`,
        :class:`ImageArrayField`) that its argument block describes (``ffload-field:`` + JSON,
        see :class:`BytesExtensionField`). An unknown ``kind`` (a newer ffload) reads as plain
        bytes, as ffcv reads every such field.

        Raises:
            FieldError: the block names a known kind with invalid arguments.
        """
        description = argument_json(binary, _EXTENSION_MAGIC if cls is BytesField else None, cls.__name__)
        if not description:
            return cls()
        kind = description.pop("kind", None)
        if not isinstance(kind, str):
            raise FieldError(f'corrupt ffload extension arguments: no "kind" in {description!r}')
        extension = BYTES_EXTENSIONS.get(kind)
        return cls() if extension is None else extension.from_arguments(description)

    def check_payloads(self, column, sizes):
        bad = np.flatnonzero(column["size"] != sizes)
        if bad.size:
            i = int(bad[0])
            return f"sample {i}: metadata size {int(column['size'][i])} != allocated {int(sizes[i])} bytes"
        return None


class JSONField(BytesField):
    """A JSON document per sample (FFCV type id 5): UTF-8 text plus a NUL byte, as a BytesField.

    Use :meth:`unpack` on a decoded ``(B, max_size) uint8`` batch to get the Python objects back.
    """

    type_id = 5

    def _payload(self, value):
        try:
            text = json.dumps(value)
        except (TypeError, ValueError) as e:
            raise FieldError(f"JSONField value is not JSON-serialisable: {e}") from e
        return np.frombuffer((text + "\0").encode("utf8"), dtype=np.uint8)

    @staticmethod
    def unpack(batch):
        """Decode a ``(B, L) uint8`` batch (numpy or torch) or one ``(L,)`` row to JSON objects."""
        arr = np.asarray(batch.numpy() if hasattr(batch, "numpy") else batch, dtype=np.uint8)
        rows = [arr] if arr.ndim == 1 else list(arr)
        out = []
        for row in rows:
            end = np.flatnonzero(row == 0)
            text = row[: end[0] if end.size else len(row)].tobytes().decode("utf8")
            out.append(json.loads(text))
        return out[0] if arr.ndim == 1 else out


class BytesExtensionField(BytesField):
    """Base of ffload's fields stored as FFCV ``BytesField``s (type id 3, metadata ``(ptr <u8,
    size <u8)``, one payload): ffcv 1.0.2 reads them as bytes (its ``BytesDecoder`` gives the
    payload), ffload as the typed field named by the argument block, which holds
    ``b"ffload-field:"`` + ASCII JSON ``{"kind": <kind>, **arguments()}``, NUL padded to 1024 bytes.

    A subclass sets :attr:`kind` and implements :meth:`arguments` (keyword arguments of its
    constructor), ``encode``, :meth:`to_array`, and :meth:`bad_sizes` / :meth:`describe_bad_size`
    (the open-time check, run after BytesField's own).
    """

    kind: str

    def __init_subclass__(cls, **kwargs):
        """Enter a subclass that sets :attr:`kind` in :data:`BYTES_EXTENSIONS` (a kind names one class)."""
        super().__init_subclass__(**kwargs)
        if "kind" in cls.__dict__:
            if BYTES_EXTENSIONS.setdefault(cls.kind, cls) is not cls:
                raise TypeError(f"two BytesExtensionFields of kind {cls.kind!r}")

    def to_binary(self):
        blob = _EXTENSION_MAGIC + json.dumps({"kind": self.kind, **self.arguments()}, separators=(",", ":")).encode(
            "ascii"
        )
        if len(blob) >= ARG_SIZE:
            raise FieldError(f"{type(self).__name__} description too long ({len(blob)} bytes)")
        out = np.zeros(ARG_SIZE, dtype=np.uint8)
        out[: len(blob)] = np.frombuffer(blob, dtype=np.uint8)
        return out

    @classmethod
    def from_arguments(cls, args):
        try:
            return cls(**args)
        except (TypeError, ValueError) as e:
            raise FieldError(f"invalid {cls.__name__} arguments {args!r}: {e}") from e

    def check_payloads(self, column, sizes):
        problem = super().check_payloads(column, sizes)
        if problem:
            return problem
        bad = self.bad_sizes(sizes)
        if bad.size:
            i = int(bad[0])
            return f"sample {i}: {self.describe_bad_size(int(sizes[i]))}"
        return None

    def bad_sizes(self, sizes: np.ndarray) -> np.ndarray:
        """Indices of the ``(N,) uint64`` payload sizes (bytes) this field cannot have."""
        raise NotImplementedError

    def to_array(self, payload) -> np.ndarray:
        """The value stored in ``payload`` (its bytes: ``view.payload(name, i)``), as a read-only
        array viewing them (no copy). Raises FieldError for bytes that cannot be such a value."""
        raise NotImplementedError

    def describe_bad_size(self, size: int) -> str:
        """Why a payload of ``size`` bytes cannot be this field's (for open-time errors)."""
        raise NotImplementedError
