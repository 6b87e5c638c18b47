"""Image fields and what reads their metadata.

Payload encodings:
    RGBImageField  raw: ``H*W*3`` bytes, RGB, row-major; jpg: a baseline JPEG file (YCbCr,
                   decodes to RGB).  Metadata ``mode`` is 0 for jpg, 1 for raw (FFCV's values;
                   FFCV type id 2).
    ImageArrayField  an ffload extension stored as an FFCV BytesField: an 8-byte ``(height,
                   width)`` header and ``(H, W, C)`` pixels, or a PNG file.

:func:`image_sizes`, :func:`differing_sizes` and :func:`describe_size_mismatch` read the sizes of
stored RGB images from their metadata; :func:`resize_to_max_resolution` is RGBImageField's resize.
"""

from __future__ import annotations

import json

import numpy as np
import numpy.typing as npt

from ffload.codecs.jpeg_encode import encode_jpeg
from ffload.errors import ConfigurationError, FieldError
from ffload.formats.fields.base import ARG_SIZE, MAX_PAYLOAD, Field, argument_json, plain_dtype
from ffload.formats.fields.bytes import BytesExtensionField

JPG, RAW = 0, 1  # RGBImageField metadata 'mode' values (FFCV's IMAGE_MODES)
WRITE_MODES = ("raw", "jpg", "smart", "proportion")
RESTART_MIN_SIDE = 128
"""Pixels: ``RGBImageField`` writes restart markers by default into JPEGs at least this large on
both sides (smaller images are rarely cropped; the markers would only slow their decode)."""


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

    def __init__(
        self,
        write_mode: str = "raw",
        max_resolution: int | None = None,
        smart_threshold: int | None = None,
        jpeg_quality: int = 90,
        compress_probability: float = 0.5,
        jpeg_restart_interval: int | None = None,
    ):
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
        return {
            "write_mode": self.write_mode,
            "max_resolution": self.max_resolution,
            "smart_threshold": self.smart_threshold,
            "jpeg_quality": self.jpeg_quality,
            "compress_probability": self.compress_probability,
            "jpeg_restart_interval": self.jpeg_restart_interval,
        }

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
        args = argument_json(binary, _RGB_MAGIC, cls.__name__)
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
            raise FieldError(
                f"RGBImageField expects an (H, W, 3) uint8 array, got {image.dtype} of shape {image.shape}"
            )
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
        bad = np.flatnonzero(
            ((modes == RAW) & (sizes != raw_size)) | (sizes == 0) | (column["width"] == 0) | (column["height"] == 0)
        )
        if bad.size:
            i = int(bad[0])
            return (
                f"sample {i}: {int(column['width'][i])}x{int(column['height'][i])} image "
                f"with a {int(sizes[i])}-byte payload"
            )
        return None


# ImageArrayField payload header: the image's height and width in pixels.
IMAGE_HEADER = np.dtype([("height", "<u4"), ("width", "<u4")])
IMAGE_DTYPES = ("|u1", "<u2", "<f4")


IMAGE_COMPRESSIONS = ("raw", "png")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_PNG_MIN_BYTES = 8 + 25 + 12  # signature, IHDR chunk, IEND chunk


class ImageArrayField(BytesExtensionField):
    """An image of any channel count and depth per sample (uint8, uint16, float32), raw or lossless PNG.

    Per sample ``(H, W, C)`` of uint8, uint16 or float32 (grayscale ``C = 1`` kept 1 channel, 16-bit depth
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

    def __init__(self, dtype: npt.DTypeLike = "uint8", channels: int = 1, compression: str = "raw"):
        self.dtype = plain_dtype(dtype, "uf", "ImageArrayField")
        if self.dtype.str not in IMAGE_DTYPES:
            raise ConfigurationError(f"ImageArrayField stores uint8, uint16 or float32, got {self.dtype}")
        self.channels = int(channels)
        if not 1 <= self.channels <= 0xFFFF:
            raise ConfigurationError(f"ImageArrayField channels must be in 1..65535, got {channels}")
        if compression not in IMAGE_COMPRESSIONS:
            raise ConfigurationError(
                f"ImageArrayField compression must be one of {IMAGE_COMPRESSIONS}, got {compression!r}"
            )
        if compression == "png" and (self.dtype.kind != "u" or self.channels not in (1, 3, 4)):
            raise ConfigurationError(
                f"ImageArrayField(compression='png') stores uint8 or uint16 pixels of 1, 3 or 4 "
                f"channels (PNG's grey, RGB, RGBA), got {self.channels} x {self.dtype}",
                hint="store this field with compression='raw'",
            )
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
            raise FieldError(f"ImageArrayField expects (H, W, {self.channels}) with H, W >= 1, got shape {arr.shape}")
        if arr.dtype != self.dtype and not np.can_cast(arr.dtype, self.dtype, casting="safe"):
            raise FieldError(
                f"ImageArrayField expects {self.dtype} pixels (or a dtype that casts safely to it), got {arr.dtype}"
            )
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
        import cv2  # on first use: listing or opening a dataset does not load OpenCV

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
        import cv2

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
        header = np.frombuffer(payload[: IMAGE_HEADER.itemsize], dtype=IMAGE_HEADER)
        h, w = (int(header["height"][0]), int(header["width"][0])) if header.size else (0, 0)
        if IMAGE_HEADER.itemsize + h * w * self.pixel_bytes != len(payload) or h * w == 0:
            raise FieldError(f"header says {w}x{h}x{self.channels} {self.dtype}, payload is {len(payload)} bytes")
        return np.frombuffer(payload[IMAGE_HEADER.itemsize :], dtype=self.dtype).reshape(h, w, self.channels)

    def bad_sizes(self, sizes):
        sizes = np.asarray(sizes, dtype=np.uint64)
        if self.compression == "png":
            return np.flatnonzero(sizes < np.uint64(_PNG_MIN_BYTES))
        head = np.uint64(IMAGE_HEADER.itemsize)
        return np.flatnonzero((sizes <= head) | ((sizes - head) % np.uint64(self.pixel_bytes) != 0))

    def describe_bad_size(self, size):
        if self.compression == "png":
            return f"payload of {size} bytes is shorter than the smallest PNG file ({_PNG_MIN_BYTES} bytes)"
        return (
            f"payload of {size} bytes is not the {IMAGE_HEADER.itemsize}-byte header plus a "
            f"positive number of {self.pixel_bytes}-byte pixels ({self.channels} x {self.dtype})"
        )


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
    import cv2

    return cv2.resize(image, (new_w, new_h), interpolation=cv2.INTER_AREA)
