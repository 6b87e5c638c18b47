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
    RaggedArrayField, ImageArrayField  ffload extensions stored as FFCV BytesFields (see
                   :class:`BytesExtensionField`): ``K`` rows of an array; an 8-byte
                   ``(height, width)`` header and ``(H, W, C)`` pixels, or a PNG file.
    IntField / FloatField have no payload; the value is the metadata (``<i8`` / ``<f8``).
"""
from __future__ import annotations

import json
import math
from typing import Any

import cv2
import numpy as np

from ffload.errors import ConfigurationError, FieldError

MAX_PAYLOAD = 1 << 31  # bytes: a .beton page (uint32 page size) holds at most this much
ARG_SIZE = 1024  # bytes of the per-field argument block in the .beton field descriptor

JPG, RAW = 0, 1  # RGBImageField metadata 'mode' values (FFCV's IMAGE_MODES)
WRITE_MODES = ("raw", "jpg", "smart", "proportion")
RESTART_MIN_SIDE = 128
"""Pixels: ``RGBImageField`` writes restart markers by default into JPEGs at least this large on
both sides (smaller images are rarely cropped; the markers would only slow their decode)."""


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
        _argument_json(binary, None, cls.__name__)
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
        if nonzero.size < 8 or np.any(np.abs(nonzero.astype(np.float64)) < 2.0 ** 52):
            return None
        as_float = np.abs(nonzero.view("<f8"))
        if np.all((as_float >= 1e-12) & (as_float <= 1e12)):
            return (f"every value is the bit pattern of a float (e.g. {int(nonzero[0])} is "
                    f"{float(nonzero.view('<f8')[0])!r}): float data under the IntField type id "
                    f"(corrupt field type)")
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
            return (f"every non-zero value is a subnormal float (e.g. {float(nonzero[0])!r} is the "
                    f"integer {int(nonzero[:1].view('<i8')[0])}): integer data under the FloatField "
                    f"type id (corrupt field type)")
        return None


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

    @classmethod
    def from_binary(cls, binary):
        """A BytesField, or the ffload extension field (:class:`RaggedArrayField`,
        :class:`ImageArrayField`) that its argument block describes (``ffload-field:`` + JSON,
        see :class:`BytesExtensionField`). An unknown ``kind`` (a newer ffload) reads as plain
        bytes, as ffcv reads every such field.

        Raises:
            FieldError: the block names a known kind with invalid arguments.
        """
        description = _argument_json(binary, _EXTENSION_MAGIC if cls is BytesField else None, cls.__name__)
        if not description:
            return cls()
        kind = description.pop("kind", None)
        if not isinstance(kind, str):
            raise FieldError(f"corrupt ffload extension arguments: no \"kind\" in {description!r}")
        extension = BYTES_EXTENSIONS.get(kind)
        return cls() if extension is None else extension.from_arguments(description)

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
    Raises:
        ConfigurationError: a bad shape, an object dtype, or more than 2 GiB per sample.
    """

    type_id = 4
    metadata_type = np.dtype("<u8")
    ptr_name = ""

    def __init__(self, dtype, shape):
        self.dtype = np.dtype(dtype)
        self.shape = tuple(int(s) for s in shape)
        if not 1 <= len(self.shape) <= 32 or min(self.shape) < 1:
            raise ConfigurationError(f"NDArrayField shape must have 1..32 positive dims, got {shape}")
        if self.dtype.hasobject:
            raise ConfigurationError("NDArrayField cannot store object arrays")
        self.element_size = self.dtype.itemsize * math.prod(self.shape)  # Python ints: no overflow
        if self.element_size > MAX_PAYLOAD:
            raise ConfigurationError(f"NDArrayField of shape {self.shape} would need {self.element_size} "
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
        jpeg_restart_interval: MCUs between the JPEG's restart markers (libjpeg's
            ``restart_interval``, ``cv2.IMWRITE_JPEG_RST_INTERVAL``; 0: none, up to 65535).
            ``None`` (default): one marker per MCU for images at least
            :data:`RESTART_MIN_SIDE` pixels on both sides, none for smaller ones. With markers
            whose interval divides the MCUs per row, crop decoders (``RandomResizedCrop``,
            ``CenterCrop``) entropy-decode only the MCUs of the box (:mod:`ffload.codecs.restarts`);
            the file is ~3 % larger and a whole-image decode ~5-7 % slower. Pixels are the same
            either way. ffcv reads such files (any JPEG decoder does). JPEGs passed through from
            the source (:mod:`ffload.convert.passthrough`) keep their own bytes.

    Encoding expects ``(H, W, 3) uint8`` RGB with ``1 <= H, W <= 65535``.

    Raises:
        ConfigurationError: an argument outside the ranges above.
    """

    type_id = 2
    metadata_type = np.dtype([("mode", "<u1"), ("width", "<u2"), ("height", "<u2"), ("data_ptr", "<u8")])
    ptr_name = "data_ptr"

    def __init__(self, write_mode: str = "raw", max_resolution: int | None = None,
                 smart_threshold: int | None = None, jpeg_quality: int = 90,
                 compress_probability: float = 0.5, jpeg_restart_interval: int | None = None):
        if write_mode not in WRITE_MODES:
            raise ConfigurationError(f"write_mode must be one of {WRITE_MODES}, got {write_mode!r}")
        if max_resolution is not None and int(max_resolution) < 1:
            raise ConfigurationError(f"max_resolution must be >= 1, got {max_resolution}")
        if not 1 <= int(jpeg_quality) <= 100:
            raise ConfigurationError(f"jpeg_quality must be in 1..100, got {jpeg_quality}")
        if not 0.0 <= float(compress_probability) <= 1.0:
            raise ConfigurationError(f"compress_probability must be in [0, 1], got {compress_probability}")
        if jpeg_restart_interval is not None and not 0 <= int(jpeg_restart_interval) <= 0xFFFF:
            raise ConfigurationError(f"jpeg_restart_interval must be in 0..65535 or None, got {jpeg_restart_interval}")
        self.write_mode = write_mode
        self.max_resolution = None if max_resolution is None else int(max_resolution)
        self.smart_threshold = None if smart_threshold is None else int(smart_threshold)
        self.jpeg_quality = int(jpeg_quality)
        self.compress_probability = float(compress_probability)
        self.jpeg_restart_interval = None if jpeg_restart_interval is None else int(jpeg_restart_interval)

    def arguments(self):
        return {"write_mode": self.write_mode, "max_resolution": self.max_resolution,
                "smart_threshold": self.smart_threshold, "jpeg_quality": self.jpeg_quality,
                "compress_probability": self.compress_probability,
                "jpeg_restart_interval": self.jpeg_restart_interval}

    def restart_interval(self, height: int, width: int) -> int:
        """MCUs between restart markers for an ``height x width`` image (pixels): the
        ``jpeg_restart_interval`` argument, or for ``None`` 1 when both sides are at least
        :data:`RESTART_MIN_SIDE`, else 0 (no markers)."""
        if self.jpeg_restart_interval is not None:
            return self.jpeg_restart_interval
        return 1 if min(height, width) >= RESTART_MIN_SIDE else 0

    def to_binary(self):
        out = np.zeros(ARG_SIZE, dtype=np.uint8)
        blob = _RGB_MAGIC + json.dumps(self.arguments(), separators=(",", ":")).encode("ascii")
        out[: len(blob)] = np.frombuffer(blob, dtype=np.uint8)
        return out

    @classmethod
    def from_binary(cls, binary):
        """The field of an argument block: zeros (ffcv writes no arguments) or ffload's
        ``ffload-rgb:`` + JSON arguments; FieldError for anything else or arguments out of range."""
        args = _argument_json(binary, _RGB_MAGIC, cls.__name__)
        try:
            return cls(**args)
        except (TypeError, ValueError) as e:
            raise FieldError(f"invalid RGBImageField arguments {args!r}: {e}") from e

    def stores_jpeg(self, nbytes: int, index: int) -> bool:
        """Whether sample ``index``, an image of ``nbytes`` raw bytes (``H * W * 3``, after
        ``max_resolution``), is stored as JPEG under the write mode (FFCV's rules, see the class)."""
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
        if self.stores_jpeg(image.nbytes, index):
            meta["mode"] = JPG
            payload = encode_jpeg(image, self.jpeg_quality, self.restart_interval(h, w))
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


# ffload's fields that ffcv has no type for are stored under FFCV's BytesField type id and layout;
# their description is JSON in the argument block (zeros for ffcv's BytesField, which ignores it).
_EXTENSION_MAGIC = b"ffload-field:"


def _argument_json(binary: np.ndarray, magic: bytes | None, owner: str) -> dict:
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
            raise FieldError(f"{owner}'s argument block is not empty ({raw[:40]!r}...): another field type's "
                             "arguments (corrupt field type)")
        return {}
    if magic is None or not text.startswith(magic) or rest.strip(b"\0"):
        raise FieldError(f"{owner}'s argument block holds {text[:40]!r}: another field type's arguments "
                         "(corrupt field type)")
    try:
        args = json.loads(text[len(magic):].decode("ascii"))
    except ValueError as e:
        raise FieldError(f"corrupt {owner} arguments {text[:80]!r}: {e}") from e
    if not isinstance(args, dict):
        raise FieldError(f"corrupt {owner} arguments {text[:80]!r}: not a JSON object")
    return args


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

    def to_binary(self):
        blob = _EXTENSION_MAGIC + json.dumps({"kind": self.kind, **self.arguments()},
                                             separators=(",", ":")).encode("ascii")
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


def _plain_dtype(dtype, kinds: str, owner: str) -> np.dtype:
    """``dtype`` little-endian, or ConfigurationError unless it is a plain numeric dtype whose
    kind is in ``kinds`` (numpy's ``dtype.kind`` letters)."""
    try:
        dtype = np.dtype(dtype)
    except TypeError as e:
        raise ConfigurationError(f"{owner}: not a dtype: {dtype!r}") from e
    if dtype.kind not in kinds or dtype.fields is not None or dtype.subdtype is not None:
        raise ConfigurationError(f"{owner} stores plain numeric dtypes of kinds {kinds!r}, got {dtype}")
    return dtype.newbyteorder("<") if dtype.itemsize > 1 else dtype


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
    """A variable-length array per sample: shape ``(K, *inner_shape)`` with ``K >= 0`` varying per
    sample (multi-label targets ``(K,) int``, boxes ``(K, 4) float32``, keypoints ``(K, 17, 3)``).

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

    def __init__(self, dtype, inner_shape=()):
        self.dtype = _plain_dtype(dtype, "biufc", "RaggedArrayField")
        self.inner_shape = tuple(int(s) for s in inner_shape)
        if len(self.inner_shape) > 31 or (self.inner_shape and min(self.inner_shape) < 1):
            raise ConfigurationError(f"RaggedArrayField inner_shape must have 0..31 positive dims, "
                                     f"got {inner_shape}")
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
        return (f"payload of {size} bytes is not a whole number of {self.row_bytes}-byte rows "
                f"({self.dtype}, inner shape {self.inner_shape})")


# ImageArrayField payload header: the image's height and width in pixels.
IMAGE_HEADER = np.dtype([("height", "<u4"), ("width", "<u4")])
IMAGE_DTYPES = ("|u1", "<u2", "<f4")


IMAGE_COMPRESSIONS = ("raw", "png")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_PNG_MIN_BYTES = 8 + 25 + 12  # signature, IHDR chunk, IEND chunk


class ImageArrayField(BytesExtensionField):
    """An image of any channel count and depth per sample, stored raw or as a lossless PNG:
    ``(H, W, C)`` of uint8, uint16 or float32 (grayscale ``C = 1`` kept 1 channel, 16-bit depth
    maps, segmentation masks and label maps, N-channel multispectral), sizes varying per sample.

    On disk (ffload extension, see ``docs/fields.md``): FFCV's BytesField (type id 3).
    ``compression="raw"``: the payload is an 8-byte header ``(height <u4, width <u4)`` followed by
    the ``H * W * C * itemsize`` pixel bytes, row-major ``(H, W, C)``, little-endian.
    ``compression="png"``: the payload is one complete PNG file (libpng via OpenCV, default
    compression level), grey, RGB or RGBA of 8 or 16 bits (the channels in that order,
    ``cv2.imdecode(payload, cv2.IMREAD_UNCHANGED)`` gives BGR/BGRA), decoded back to exactly the
    pixels written. ``dtype``, ``channels`` and ``compression`` are the field's; the argument
    block of a raw field holds no ``compression`` key (the layout of datasets written before
    PNG existed), a PNG field's holds ``"compression":"png"``. ffcv 1.0.2 reads the field as bytes.

    Why not RGBImageField: FFCV's type id 2 means 3-channel uint8 to ffcv's decoders, which would
    misread any other layout; under the BytesField type id ffcv reads the other fields, and this
    one as bytes, correctly.

    Args:
        dtype: ``uint8``, ``uint16`` or ``float32`` (raw only).
        channels: C, 1..65535 (raw); 1, 3 or 4 (png: grey, RGB, RGBA; PNG's grey + alpha has no
            OpenCV encoder).
        compression: ``"raw"`` (default) or ``"png"``.

    Encoding accepts ``(H, W, C)`` (or ``(H, W)`` when ``channels`` is 1) arrays whose dtype
    casts safely to ``dtype`` (uint8 into a uint16 field, not the reverse), ``1 <= H, W``.

    Raises:
        ConfigurationError: another dtype, a channel count outside 1..65535, an unknown
            compression, or PNG with float32 or with a channel count other than 1, 3, 4.
    """

    kind = "image"

    def __init__(self, dtype="uint8", channels: int = 1, compression: str = "raw"):
        self.dtype = _plain_dtype(dtype, "uf", "ImageArrayField")
        if self.dtype.str not in IMAGE_DTYPES:
            raise ConfigurationError(f"ImageArrayField stores uint8, uint16 or float32, got {self.dtype}")
        self.channels = int(channels)
        if not 1 <= self.channels <= 0xFFFF:
            raise ConfigurationError(f"ImageArrayField channels must be in 1..65535, got {channels}")
        if compression not in IMAGE_COMPRESSIONS:
            raise ConfigurationError(f"ImageArrayField compression must be one of {IMAGE_COMPRESSIONS}, "
                                     f"got {compression!r}")
        if compression == "png" and (self.dtype.kind != "u" or self.channels not in (1, 3, 4)):
            raise ConfigurationError(f"ImageArrayField(compression='png') stores uint8 or uint16 pixels of 1, 3 or 4 "
                                     f"channels (PNG's grey, RGB, RGBA), got {self.channels} x {self.dtype}",
                                     hint="store this field with compression='raw'")
        self.compression = compression
        self.pixel_bytes = self.channels * self.dtype.itemsize

    def arguments(self):
        args = {"dtype": self.dtype.str, "channels": self.channels}
        if self.compression != "raw":  # raw fields keep the argument block of earlier versions
            args["compression"] = self.compression
        return args

    def encode(self, image, index):
        arr = np.asarray(image)
        if arr.ndim == 2 and self.channels == 1:
            arr = arr[:, :, None]
        if arr.ndim != 3 or arr.shape[2] != self.channels or 0 in arr.shape:
            raise FieldError(f"ImageArrayField expects (H, W, {self.channels}) with H, W >= 1, "
                             f"got shape {arr.shape}")
        if arr.dtype != self.dtype and not np.can_cast(arr.dtype, self.dtype, casting="safe"):
            raise FieldError(f"ImageArrayField expects {self.dtype} pixels (or a dtype that casts "
                             f"safely to it), got {arr.dtype}")
        if IMAGE_HEADER.itemsize + arr.size * self.dtype.itemsize > MAX_PAYLOAD:  # so H, W < 2**32
            raise FieldError(f"ImageArrayField image of shape {arr.shape} is above {MAX_PAYLOAD} bytes")
        meta = np.zeros((), dtype=self.metadata_type)
        if self.compression == "png":
            payload = self._encode_png(np.ascontiguousarray(arr, dtype=self.dtype))
            meta["size"] = payload.size
            return meta[()], payload
        header = np.array((arr.shape[0], arr.shape[1]), dtype=IMAGE_HEADER)
        pixels = np.ascontiguousarray(arr, dtype=self.dtype).reshape(-1).view(np.uint8)
        meta["size"] = IMAGE_HEADER.itemsize + pixels.size
        return meta[()], np.concatenate([header.reshape(1).view(np.uint8), pixels])

    def _encode_png(self, arr: np.ndarray) -> np.ndarray:
        """``(H, W, C)`` of :attr:`dtype` as PNG file bytes (``(N,) uint8``); FieldError if OpenCV refuses."""
        if max(arr.shape[:2]) > 0x7FFFFFFF:
            raise FieldError(f"ImageArrayField image of shape {arr.shape} is too large for PNG")
        bgr = arr[:, :, 0] if self.channels == 1 else arr[:, :, _BGR_ORDER[self.channels]]
        try:
            ok, data = cv2.imencode(".png", np.ascontiguousarray(bgr))
        except cv2.error as e:
            raise FieldError(f"PNG encoding failed for a {arr.shape} {arr.dtype} image: {e}") from e
        if not ok:
            raise FieldError(f"PNG encoding failed for a {arr.shape} {arr.dtype} image")
        return data.reshape(-1)

    def decode_png(self, payload) -> np.ndarray:
        """``(H, W, C)`` of :attr:`dtype`: the pixels of a PNG payload (``cv2.imdecode`` with
        ``IMREAD_UNCHANGED``, channels back from OpenCV's BGR(A) order), a new array.

        Raises:
            FieldError: not a PNG file, a corrupt one, or one of another depth or channel count
                than the field's.
        """
        data = np.frombuffer(payload, dtype=np.uint8)
        if data.size < _PNG_MIN_BYTES or data[:8].tobytes() != PNG_SIGNATURE:
            raise FieldError(f"corrupt PNG ({data.size} bytes): no PNG signature")
        try:
            arr = cv2.imdecode(data, cv2.IMREAD_UNCHANGED)
        except cv2.error as e:
            raise FieldError(f"corrupt PNG ({data.size} bytes): {e}") from e
        if arr is None:
            raise FieldError(f"corrupt PNG ({data.size} bytes): OpenCV cannot decode it")
        if arr.ndim == 2:
            arr = arr[:, :, None]
        if arr.dtype != self.dtype or arr.shape[2] != self.channels:
            raise FieldError(f"PNG holds {arr.shape[2]} x {arr.dtype} pixels, the field {self.channels} x {self.dtype}")
        if self.channels > 1:
            arr = arr[:, :, _BGR_ORDER[self.channels]]
        return np.ascontiguousarray(arr)

    def to_array(self, payload):
        """``(H, W, C)`` of :attr:`dtype` (see :meth:`BytesExtensionField.to_array`; a PNG payload
        is decoded, so the array is a new one).

        Raises:
            FieldError: a raw payload that is not the header plus the ``H * W * C * itemsize``
                bytes its header declares; a PNG payload that :meth:`decode_png` refuses.
        """
        if self.compression == "png":
            return self.decode_png(payload)
        header = np.frombuffer(payload[:IMAGE_HEADER.itemsize], dtype=IMAGE_HEADER)
        h, w = (int(header["height"][0]), int(header["width"][0])) if header.size else (0, 0)
        if IMAGE_HEADER.itemsize + h * w * self.pixel_bytes != len(payload) or h * w == 0:
            raise FieldError(f"header says {w}x{h}x{self.channels} {self.dtype}, payload is "
                             f"{len(payload)} bytes")
        return np.frombuffer(payload[IMAGE_HEADER.itemsize:], dtype=self.dtype).reshape(h, w, self.channels)

    def bad_sizes(self, sizes):
        sizes = np.asarray(sizes, dtype=np.uint64)
        if self.compression == "png":
            return np.flatnonzero(sizes < np.uint64(_PNG_MIN_BYTES))
        head = np.uint64(IMAGE_HEADER.itemsize)
        return np.flatnonzero((sizes <= head) | ((sizes - head) % np.uint64(self.pixel_bytes) != 0))

    def describe_bad_size(self, size):
        if self.compression == "png":
            return f"payload of {size} bytes is shorter than the smallest PNG file ({_PNG_MIN_BYTES} bytes)"
        return (f"payload of {size} bytes is not the {IMAGE_HEADER.itemsize}-byte header plus a "
                f"positive number of {self.pixel_bytes}-byte pixels ({self.channels} x {self.dtype})")


_BGR_ORDER = {3: [2, 1, 0], 4: [2, 1, 0, 3]}  # RGB(A) <-> OpenCV's BGR(A): the same swap both ways


def image_sizes(column: np.ndarray, distinct: bool = True) -> np.ndarray:
    """The sizes of stored images, from their metadata (no payload is read).

    Args:
        column: ``(N,)`` :class:`RGBImageField` metadata records (``view.metadata[name]``).
        distinct: return each size once (sorted) rather than one row per sample.

    Returns:
        ``(K, 2) int64`` rows ``(height, width)`` in pixels: the K distinct sizes (one row when
        all N images share one size, none when N is 0), or with ``distinct=False`` the N
        samples' sizes in order.
    """
    heights, widths = column["height"].astype(np.int64), column["width"].astype(np.int64)
    if not distinct:
        return np.stack([heights, widths], axis=1)
    if heights.size == 0:
        return np.zeros((0, 2), dtype=np.int64)
    if heights.min() == heights.max() and widths.min() == widths.max():  # the common case, O(N)
        return np.array([[heights[0], widths[0]]], dtype=np.int64)
    keys = np.unique(heights << 16 | widths)  # both < 2**16 (uint16 metadata)
    return np.stack([keys >> 16, keys & 0xFFFF], axis=1)


def differing_sizes(column: np.ndarray, indices: np.ndarray) -> tuple[int, int] | None:
    """Two samples of ``indices`` whose images differ in size, from their metadata (no payload read).

    Args:
        column: ``(N,)`` :class:`RGBImageField` metadata records; indices: ``(M,)`` ints into it.

    Returns:
        ``(a, b)``: ``a`` the first of ``indices``, ``b`` the first whose ``(height, width)`` is not
        ``a``'s; None when all of them have one size (or ``indices`` is empty).
    """
    indices = np.asarray(indices, dtype=np.int64)
    if indices.size == 0:
        return None
    heights, widths = column["height"][indices], column["width"][indices]
    other = np.flatnonzero((heights != heights[0]) | (widths != widths[0]))
    return None if other.size == 0 else (int(indices[0]), int(indices[other[0]]))


def describe_size_mismatch(column: np.ndarray, pair: tuple[int, int]) -> str:
    """``'sample a is WxH pixels, sample b WxH'`` for a pair of :func:`differing_sizes`."""
    (a, b), h, w = pair, column["height"], column["width"]
    return f"sample {a} is {int(w[a])}x{int(h[a])} pixels, sample {b} {int(w[b])}x{int(h[b])}"


def resize_to_max_resolution(image: np.ndarray, max_resolution: int | None) -> np.ndarray:
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


def encode_jpeg(image: np.ndarray, quality: int, restart_interval: int = 0) -> np.ndarray:
    """JPEG-encode an ``(H, W, 3) uint8`` RGB image with libjpeg(-turbo) via OpenCV at ``quality``
    (1..100), 4:2:0, with a restart marker every ``restart_interval`` MCUs (0: none).

    Returns the file bytes as a 1-D uint8 array. Raises FieldError if OpenCV refuses.
    """
    ok, data = cv2.imencode(".jpg", cv2.cvtColor(image, cv2.COLOR_RGB2BGR),
                            [int(cv2.IMWRITE_JPEG_QUALITY), int(quality),
                             int(cv2.IMWRITE_JPEG_RST_INTERVAL), int(restart_interval)])
    if not ok:
        raise FieldError(f"JPEG encoding failed for a {image.shape} image")
    return data.reshape(-1)


# FFCV's TYPE_ID_HANDLER (type id 6, TorchTensorField, is an NDArrayField on disk).
FIELD_TYPES: dict[int, type] = {0: FloatField, 1: IntField, 2: RGBImageField, 3: BytesField,
                                4: NDArrayField, 5: JSONField, 6: NDArrayField}
FIELD_CLASSES: dict[str, type] = {c.__name__: c for c in
                                  (FloatField, IntField, RGBImageField, BytesField, NDArrayField, JSONField,
                                   RaggedArrayField, ImageArrayField)}
# ffload's fields under FFCV's BytesField type id, by their argument block's "kind".
BYTES_EXTENSIONS: dict[str, type] = {c.kind: c for c in (RaggedArrayField, ImageArrayField)}


def metadata_dtype(fields) -> np.dtype:
    """The per-sample metadata record of a dataset: the fields' records in order, aligned
    (FFCV's ``get_metadata_type``: ``np.dtype([('', t) ...], align=True)``, names f0, f1, ...)."""
    return np.dtype([("", f.metadata_type) for f in fields], align=True)


def named_metadata_dtype(fields: dict[str, Field]) -> np.dtype:
    """:func:`metadata_dtype` with the fields' names instead of f0, f1, ... (same layout)."""
    base = metadata_dtype(list(fields.values()))
    return np.dtype({"names": list(fields), "formats": [base.fields[f"f{k}"][0] for k in range(len(fields))],
                     "offsets": [base.fields[f"f{k}"][1] for k in range(len(fields))],
                     "itemsize": base.itemsize})
