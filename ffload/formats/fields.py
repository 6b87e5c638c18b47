"""Field types: how one value of a sample is encoded on disk, identically in `.beton` and LMDB.

Each field owns a fixed-size *metadata* record per sample (FFCV's ``metadata_type``) and, for
variable-size values, one *payload* (a byte string stored in a data page / the LMDB value).
Type ids, metadata layouts and the 1024-byte argument blocks follow FFCV 1.0.2's ``.beton`` v2
format (``ffcv/types.py``, ``ffcv/fields/*.py``) so that files round-trip with ffcv both ways.

Payload encodings:
    RGBImageField  raw: ``H*W*3`` bytes, RGB, row-major; jpg: a baseline JPEG file (YCbCr,
                   decodes to RGB).  Metadata ``mode`` is 0 for jpg, 1 for raw (FFCV's values).
    NDArrayField   ``prod(shape) * itemsize`` bytes, C order, the field's dtype.
    BytesField     the bytes as given.
    JSONField      UTF-8 JSON text followed by one NUL byte (FFCV's ``JSONField``).
    IntField / FloatField have no payload; the value is the metadata (``<i8`` / ``<f8``).
"""
from __future__ import annotations

import json
import math
from typing import Any, Dict, Optional, Tuple

import cv2
import numpy as np

MAX_PAYLOAD = 1 << 31  # bytes: a .beton page (uint32 page size) holds at most this much
ARG_SIZE = 1024  # bytes of the per-field argument block in the .beton field descriptor

JPG, RAW = 0, 1  # RGBImageField metadata 'mode' values (FFCV's IMAGE_MODES)
WRITE_MODES = ("raw", "jpg", "smart", "proportion")


class FieldError(ValueError):
    """A value cannot be encoded by its field (wrong type, shape or dtype)."""


class Field:
    """Base class of field types.

    Class attributes:
        type_id: FFCV's type id (``ffcv.types.TYPE_ID_HANDLER``).
        metadata_type: numpy dtype of the per-sample metadata record.
        ptr_name: the metadata sub-field holding the payload's file offset, ``""`` when the whole
            metadata record is the offset (NDArrayField), ``None`` when there is no payload.
    """

    type_id: int = 255
    metadata_type: np.dtype
    ptr_name: Optional[str] = None

    def arguments(self) -> Dict[str, Any]:
        """The field's arguments as a JSON-able dict (stored in LMDB's metadata record)."""
        return {}

    def to_binary(self) -> np.ndarray:
        """The ``(1024,) uint8`` argument block of the .beton field descriptor (zeros: FFCV's
        layout for fields without arguments)."""
        return np.zeros(ARG_SIZE, dtype=np.uint8)

    @classmethod
    def from_binary(cls, binary: np.ndarray) -> "Field":
        """Rebuild the field from its ``(1024,) uint8`` argument block."""
        return cls()

    @classmethod
    def from_arguments(cls, args: Dict[str, Any]) -> "Field":
        """Rebuild the field from :meth:`arguments` (LMDB metadata)."""
        return cls(**args)

    def encode(self, value, index: int) -> Tuple[np.void, Optional[np.ndarray]]:
        """Encode one value of sample ``index``.

        Returns:
            ``(metadata, payload)``: a metadata record of :attr:`metadata_type` (its pointer left
            0: the writer fills it) and the payload as a 1-D uint8 array, or ``None``.

        Raises:
            FieldError: the value does not fit the field.
        """
        raise NotImplementedError

    def check_payloads(self, column: np.ndarray, sizes: np.ndarray) -> Optional[str]:
        """Check metadata against payload sizes (bytes) for every sample at open time.

        Returns ``None`` when consistent, else a message naming the first bad sample.
        """
        return None

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.arguments().items())
        return f"{type(self).__name__}({args})"

    def __eq__(self, other) -> bool:
        return type(self) is type(other) and self.arguments() == other.arguments()


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
            raise FieldError(f"{type(self).__name__} expects bytes or a 1-D uint8 array, "
                             f"got {arr.dtype} of shape {arr.shape}")
        return np.ascontiguousarray(arr)

    def encode(self, value, index):
        payload = self._payload(value)
        meta = np.zeros((), dtype=self.metadata_type)
        meta["size"] = payload.size
        return meta[()], payload

    def check_payloads(self, column, sizes):
        bad = np.flatnonzero(column["size"] != sizes)
        if bad.size:
            i = int(bad[0])
            return (f"sample {i}: metadata size {int(column['size'][i])} != "
                    f"allocated {int(sizes[i])} bytes")
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


# FFCV's NDArrayField argument block: shape as 32 x <u8 (zero-terminated), then the length of a
# JSON dtype description (numpy ``dtype.descr``), then that JSON text in ASCII.
_NDARRAY_ARGS = np.dtype([("shape", "<u8", 32), ("type_length", "<u8")])


class NDArrayField(Field):
    """A fixed-shape, fixed-dtype array per sample (FFCV type id 4); metadata is the ``<u8`` offset.

    Args:
        dtype: numpy dtype of the arrays (stored little-endian as given by ``dtype.descr``).
        shape: per-sample shape, at most 32 dimensions, every dimension >= 1.
    """

    type_id = 4
    metadata_type = np.dtype("<u8")
    ptr_name = ""

    def __init__(self, dtype, shape):
        self.dtype = np.dtype(dtype)
        self.shape = tuple(int(s) for s in shape)
        if not 1 <= len(self.shape) <= 32 or min(self.shape) < 1:
            raise FieldError(f"NDArrayField shape must have 1..32 positive dims, got {shape}")
        if self.dtype.hasobject:
            raise FieldError("NDArrayField cannot store object arrays")
        self.element_size = self.dtype.itemsize * math.prod(self.shape)  # Python ints: no overflow
        if self.element_size > MAX_PAYLOAD:
            raise FieldError(f"NDArrayField of shape {self.shape} would need {self.element_size} "
                             f"bytes per sample (more than {MAX_PAYLOAD})")

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
        descr = json.loads(binary[_NDARRAY_ARGS.itemsize:][:n].tobytes().decode("ascii"))
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


# ffload keeps RGBImageField's writing arguments in the argument block as JSON text (FFCV writes
# zeros there and ignores the block when reading, so ffcv still reads our files).
_RGB_MAGIC = b"ffload-rgb:"


class RGBImageField(Field):
    """An RGB image per sample (FFCV type id 2), stored raw or as JPEG.

    Metadata ``(mode <u1, width <u2, height <u2, data_ptr <u8)`` (FFCV's layout, unaligned).

    Args:
        write_mode: ``'raw'`` (uint8 pixels), ``'jpg'`` (JPEG at ``jpeg_quality``), ``'smart'``
            (JPEG only when the raw image is larger than ``smart_threshold`` bytes, else raw;
            raw for all when ``smart_threshold`` is None — FFCV's rule), ``'proportion'`` (JPEG
            with probability ``compress_probability``, drawn from the sample index so that a
            conversion is reproducible).
        max_resolution: if set, images whose longer side exceeds it are resized (INTER_AREA) so
            that the longer side is ``max_resolution`` pixels (sizes truncated as FFCV does).
        smart_threshold: bytes, see ``write_mode``.
        jpeg_quality: 1..100, OpenCV/libjpeg quality.
        compress_probability: 0..1, see ``write_mode``.

    Encoding expects ``(H, W, 3) uint8`` RGB with ``1 <= H, W <= 65535``.
    """

    type_id = 2
    metadata_type = np.dtype([("mode", "<u1"), ("width", "<u2"), ("height", "<u2"), ("data_ptr", "<u8")])
    ptr_name = "data_ptr"

    def __init__(self, write_mode: str = "raw", max_resolution: Optional[int] = None,
                 smart_threshold: Optional[int] = None, jpeg_quality: int = 90,
                 compress_probability: float = 0.5):
        if write_mode not in WRITE_MODES:
            raise FieldError(f"write_mode must be one of {WRITE_MODES}, got {write_mode!r}")
        if max_resolution is not None and int(max_resolution) < 1:
            raise FieldError(f"max_resolution must be >= 1, got {max_resolution}")
        if not 1 <= int(jpeg_quality) <= 100:
            raise FieldError(f"jpeg_quality must be in 1..100, got {jpeg_quality}")
        if not 0.0 <= float(compress_probability) <= 1.0:
            raise FieldError(f"compress_probability must be in [0, 1], got {compress_probability}")
        self.write_mode = write_mode
        self.max_resolution = None if max_resolution is None else int(max_resolution)
        self.smart_threshold = None if smart_threshold is None else int(smart_threshold)
        self.jpeg_quality = int(jpeg_quality)
        self.compress_probability = float(compress_probability)

    def arguments(self):
        return {"write_mode": self.write_mode, "max_resolution": self.max_resolution,
                "smart_threshold": self.smart_threshold, "jpeg_quality": self.jpeg_quality,
                "compress_probability": self.compress_probability}

    def to_binary(self):
        out = np.zeros(ARG_SIZE, dtype=np.uint8)
        blob = _RGB_MAGIC + json.dumps(self.arguments(), separators=(",", ":")).encode("ascii")
        out[: len(blob)] = np.frombuffer(blob, dtype=np.uint8)
        return out

    @classmethod
    def from_binary(cls, binary):
        raw = bytes(binary).split(b"\0", 1)[0]
        if raw.startswith(_RGB_MAGIC):
            try:
                return cls(**json.loads(raw[len(_RGB_MAGIC):]))
            except (ValueError, TypeError):
                pass
        return cls()  # written by ffcv: its arguments are not stored

    def _choose_jpeg(self, nbytes: int, index: int) -> bool:
        if self.write_mode == "jpg":
            return True
        if self.write_mode == "smart":
            return self.smart_threshold is not None and nbytes > self.smart_threshold
        if self.write_mode == "proportion":
            return np.random.default_rng([0x5EED, index]).random() < self.compress_probability
        return False

    def encode(self, image, index):
        image = np.asarray(image)
        if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
            raise FieldError(f"RGBImageField expects an (H, W, 3) uint8 array, got {image.dtype} "
                             f"of shape {image.shape}")
        image = resize_to_max_resolution(image, self.max_resolution)
        h, w = image.shape[:2]
        if not (1 <= h <= 0xFFFF and 1 <= w <= 0xFFFF):
            raise FieldError(f"image size {w}x{h} outside 1..65535 (use max_resolution)")
        meta = np.zeros((), dtype=self.metadata_type)
        meta["height"], meta["width"] = h, w
        if self._choose_jpeg(image.nbytes, index):
            meta["mode"] = JPG
            payload = encode_jpeg(image, self.jpeg_quality)
        else:
            meta["mode"] = RAW
            payload = np.ascontiguousarray(image).reshape(-1)
        return meta[()], payload

    def check_payloads(self, column, sizes):
        modes = column["mode"]
        bad_mode = np.flatnonzero((modes != JPG) & (modes != RAW))
        if bad_mode.size:
            i = int(bad_mode[0])
            return f"sample {i}: unknown image mode {int(modes[i])}"
        raw_size = column["width"].astype(np.uint64) * column["height"].astype(np.uint64) * 3
        bad = np.flatnonzero(((modes == RAW) & (sizes != raw_size)) | (sizes == 0)
                             | (column["width"] == 0) | (column["height"] == 0))
        if bad.size:
            i = int(bad[0])
            return (f"sample {i}: {int(column['width'][i])}x{int(column['height'][i])} image "
                    f"with a {int(sizes[i])}-byte payload")
        return None


def resize_to_max_resolution(image: np.ndarray, max_resolution: Optional[int]) -> np.ndarray:
    """Shrink ``(H, W, 3)`` so that its longer side is ``max_resolution`` (INTER_AREA).

    New sizes are truncated (``int(ratio * size)``) as FFCV's ``resizer`` does; images already
    within the limit are returned unchanged.
    """
    if max_resolution is None:
        return image
    h, w = image.shape[:2]
    ratio = max_resolution / max(h, w)
    if ratio >= 1:
        return image
    new_w, new_h = max(1, int(ratio * w)), max(1, int(ratio * h))
    return cv2.resize(image, (new_w, new_h), interpolation=cv2.INTER_AREA)


def encode_jpeg(image: np.ndarray, quality: int) -> np.ndarray:
    """JPEG-encode an ``(H, W, 3) uint8`` RGB image with libjpeg(-turbo) via OpenCV.

    Returns the file bytes as a 1-D uint8 array. Raises FieldError if OpenCV refuses.
    """
    ok, data = cv2.imencode(".jpg", cv2.cvtColor(image, cv2.COLOR_RGB2BGR),
                            [int(cv2.IMWRITE_JPEG_QUALITY), int(quality)])
    if not ok:
        raise FieldError(f"JPEG encoding failed for a {image.shape} image")
    return data.reshape(-1)


# FFCV's TYPE_ID_HANDLER (type id 6, TorchTensorField, is an NDArrayField on disk).
FIELD_TYPES: Dict[int, type] = {0: FloatField, 1: IntField, 2: RGBImageField, 3: BytesField,
                                4: NDArrayField, 5: JSONField, 6: NDArrayField}
FIELD_CLASSES: Dict[str, type] = {c.__name__: c for c in
                                  (FloatField, IntField, RGBImageField, BytesField, NDArrayField, JSONField)}


def metadata_dtype(fields) -> np.dtype:
    """The per-sample metadata record of a dataset: the fields' records in order, aligned
    (FFCV's ``get_metadata_type``: ``np.dtype([('', t) ...], align=True)``, names f0, f1, ...)."""
    return np.dtype([("", f.metadata_type) for f in fields], align=True)


def named_metadata_dtype(fields: Dict[str, "Field"]) -> np.dtype:
    """:func:`metadata_dtype` with the fields' names instead of f0, f1, ... (same layout)."""
    base = metadata_dtype(list(fields.values()))
    return np.dtype({"names": list(fields), "formats": [base.fields[f"f{k}"][0] for k in range(len(fields))],
                     "offsets": [base.fields[f"f{k}"][1] for k in range(len(fields))],
                     "itemsize": base.itemsize})
