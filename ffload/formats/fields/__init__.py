"""Field types: what a dataset column holds and how it is encoded (FFCV's fields and ffload's own),
with their binary arguments and metadata layouts.

    base      the Field base class, the argument block (size, JSON reader), plain dtypes, metadata records
    scalars   IntField, FloatField (the value is the metadata record)
    bytes     BytesField, JSONField, BytesExtensionField (ffload's fields stored as FFCV BytesFields)
    ndarray   NDArrayField, RaggedArrayField, cast_values
    image     RGBImageField, ImageArrayField, image sizes read from metadata, resize to max resolution
    registry  FIELD_TYPES (by FFCV type id), FIELD_CLASSES (by name), BYTES_EXTENSIONS (by kind)

Importing this package imports every field module (they are light), so that :data:`BYTES_EXTENSIONS`
knows every extension kind before any argument block is read.
"""

from __future__ import annotations

from ffload.formats.fields.base import Field, metadata_dtype, named_metadata_dtype
from ffload.formats.fields.bytes import BytesExtensionField, BytesField, JSONField
from ffload.formats.fields.image import ImageArrayField, RGBImageField, image_sizes
from ffload.formats.fields.ndarray import NDArrayField, RaggedArrayField
from ffload.formats.fields.registry import BYTES_EXTENSIONS, FIELD_CLASSES, FIELD_TYPES
from ffload.formats.fields.scalars import FloatField, IntField

__all__ = [
    "Field",
    "IntField",
    "FloatField",
    "BytesField",
    "JSONField",
    "BytesExtensionField",
    "NDArrayField",
    "RaggedArrayField",
    "RGBImageField",
    "ImageArrayField",
    "image_sizes",
    "metadata_dtype",
    "named_metadata_dtype",
    "FIELD_TYPES",
    "FIELD_CLASSES",
    "BYTES_EXTENSIONS",
]
