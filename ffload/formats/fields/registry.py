"""The tables of field types: by FFCV type id (:data:`FIELD_TYPES`, what ``.beton`` descriptors
name), by class name (:data:`FIELD_CLASSES`, what LMDB's metadata record names), and ffload's
BytesField extensions by kind (:data:`BYTES_EXTENSIONS`, re-exported from :mod:`.bytes`)."""

from __future__ import annotations

from ffload.formats.fields.bytes import BYTES_EXTENSIONS, BytesField, JSONField
from ffload.formats.fields.image import ImageArrayField, RGBImageField
from ffload.formats.fields.ndarray import NDArrayField, RaggedArrayField
from ffload.formats.fields.scalars import FloatField, IntField

__all__ = ["FIELD_TYPES", "FIELD_CLASSES", "BYTES_EXTENSIONS"]

# FFCV's TYPE_ID_HANDLER (type id 6, TorchTensorField, is an NDArrayField on disk).
FIELD_TYPES: dict[int, type] = {
    0: FloatField,
    1: IntField,
    2: RGBImageField,
    3: BytesField,
    4: NDArrayField,
    5: JSONField,
    6: NDArrayField,
}
FIELD_CLASSES: dict[str, type] = {
    c.__name__: c
    for c in (
        FloatField,
        IntField,
        RGBImageField,
        BytesField,
        NDArrayField,
        JSONField,
        RaggedArrayField,
        ImageArrayField,
    )
}
