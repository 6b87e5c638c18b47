"""Decode image files to RGB uint8 "as a viewer shows it".

Every image that enters a dataset goes through this module, so that a ``.beton`` or LMDB file always stores
``(H, W, 3) uint8`` RGB pixels whatever the source file looked like. Decoding uses OpenCV (libjpeg-turbo, libpng,
libtiff, libwebp); Pillow is not needed. The rules:

* **Formats.** JPEG, PNG, BMP, WebP and TIFF, recognised by their signature (the first bytes), not by the file
  extension. Files found by extension (``ImageFolderSource``) use :data:`IMAGE_EXTENSIONS`, compared in any case.
  GIF, JPEG 2000, HEIF/AVIF, PNM and others raise :class:`ImageDecodeError` ("unsupported format").
* **Orientation.** The EXIF Orientation tag (JPEG, PNG, WebP) and the TIFF Orientation tag are applied: the
  result is the upright image, ``H`` and ``W`` swapped for orientations 5-8 (as ``PIL.ImageOps.exif_transpose``).
* **Grayscale** (8/16-bit, 1-bit) is replicated to 3 equal channels.
* **Alpha** is dropped without compositing, as Pillow's ``convert("RGB")``: an RGBA pixel ``(r, g, b, a)`` becomes
  ``(r, g, b)``; gray+alpha becomes gray. Exception forced by libtiff: 8-bit TIFFs with alpha are read through
  ``TIFFReadRGBA``, which premultiplies colour by alpha; the premultiplication is divided back out, exact where
  alpha is 255, within ``255 / (2 * alpha) + 1`` elsewhere, black where alpha is 0.
* **Palette** images are expanded to their RGB colours (the tRNS transparency is dropped like alpha).
* **CMYK** (JPEG as written by Photoshop/Pillow, with inverted Adobe CMYK; TIFF) is converted with the naive
  formula ``R = (255 - C) * (255 - K) / 255`` (same for G/M and B/Y) as Pillow does, up to rounding: within 1 of
  the formula for TIFF (libtiff), within 2 of Pillow for JPEG (OpenCV).
* **16-bit** samples are scaled to 8 bits as ``round(v / 257)`` (65535 -> 255, exact integer arithmetic).
* **Float** samples (float TIFFs, in-memory arrays) must lie in ``[0, 1]`` and become ``round(v * 255)``.
* **No colour management**: ICC profiles and PNG gamma are ignored (like Pillow and torchvision).
* **No resizing** here: ``max_resolution`` is applied by the field encoder.
* **Pixel limit** (decompression bombs): the width and height are read from the header (JPEG SOF, PNG IHDR, BMP
  info header, WebP VP8/VP8L/VP8X, TIFF first IFD) *before* anything is decoded. An image of more than
  ``max_pixels`` pixels (default :data:`DEFAULT_MAX_PIXELS`, twice Pillow's ``MAX_IMAGE_PIXELS``) is refused with
  :class:`ImageBombError`; one above half of it is logged as a warning, as Pillow's ``DecompressionBombWarning``.

Bad input raises :class:`ImageDecodeError` (a ``ValueError``) whose message names the file and the cause: an
unreadable or empty file, an unrecognised or unsupported format, a truncated JPEG (no end-of-image marker after the
scan data) or PNG (chunks cut short, no ``IEND``), or data OpenCV cannot decode. The structural checks matter
because OpenCV 4.x returns a half-gray image for a truncated JPEG instead of failing. Damaged entropy-coded data
inside a complete JPEG, which libjpeg only warns about, still decodes (with gray blocks), as in Pillow.
"""
from __future__ import annotations

import logging
import os
import stat
import struct

import cv2
import numpy as np

from ..errors import ImageBombError, ImageDecodeError
from ..limits import DEFAULT_MAX_PIXELS

__all__ = ["IMAGE_EXTENSIONS", "DEFAULT_MAX_PIXELS", "ImageBombError", "ImageDecodeError", "has_image_extension",
           "load_image", "read_image_file", "decode_image_bytes", "header_size", "check_pixels", "to_rgb_uint8"]

logger = logging.getLogger(__name__)


IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff")
"""File extensions (lower case, with the dot) treated as images; matched case-insensitively."""

# Decoders pick gray -> BGR, drop alpha, expand palettes, convert CMYK and apply EXIF orientation; ANYDEPTH keeps
# 16-bit samples so that we scale them with round(v / 257) instead of OpenCV's truncating v >> 8.
_COLOR_FLAGS = cv2.IMREAD_COLOR | cv2.IMREAD_ANYDEPTH
# libtiff applies the TIFF orientation itself; IMREAD_COLOR fails on float TIFFs and decodes 16-bit TIFFs wrongly
# with IMREAD_COLOR_RGB, so TIFFs are read unchanged and normalised here.
_TIFF_FLAGS = cv2.IMREAD_UNCHANGED

_UNSUPPORTED_SIGNATURES = (
    (b"GIF87a", "GIF"), (b"GIF89a", "GIF"),
    (b"\x00\x00\x00\x0cjP  \r\n\x87\n", "JPEG 2000"), (b"\xff\x4f\xff\x51", "JPEG 2000 codestream"),
    (b"\xff\x0a", "JPEG XL"), (b"\x00\x00\x00\x0cJXL \r\n\x87\n", "JPEG XL"),
    (b"8BPS", "Photoshop PSD"), (b"%PDF", "PDF"), (b"\x76\x2f\x31\x01", "OpenEXR"),
    (b"#?RADIANCE", "Radiance HDR"), (b"P1", "PNM"), (b"P2", "PNM"), (b"P3", "PNM"), (b"P4", "PNM"),
    (b"P5", "PNM"), (b"P6", "PNM"),
)
_SUPPORTED_NAMES = "JPEG, PNG, BMP, WebP, TIFF"


def has_image_extension(path: str | os.PathLike) -> bool:
    """True when ``path`` ends with one of :data:`IMAGE_EXTENSIONS`, in any case (torchvision's ``IMG_EXTENSIONS``
    check, restricted to the formats this module decodes)."""
    return os.fspath(path).lower().endswith(IMAGE_EXTENSIONS)


def load_image(path: str | os.PathLike, max_pixels: int | None = DEFAULT_MAX_PIXELS) -> np.ndarray:
    """Read and decode one image file.

    Args:
        path: the file; its content decides the format, not its extension.
        max_pixels: refuse images whose header declares more pixels (``None``: no limit); see
            :func:`check_pixels`.
    Returns:
        ``(H, W, 3) uint8`` RGB, C-contiguous, upright (EXIF orientation applied), following the rules in the
        module docstring.
    Raises:
        ImageDecodeError: the file cannot be read (the ``OSError`` is chained), is not a regular file (a FIFO or
            device is never read), is empty, is not an image, is in an
            unsupported format, is truncated, or cannot be decoded. The message starts with the path.
        ImageBombError: the header declares more than ``max_pixels`` pixels (nothing was decoded).
    """
    return decode_image_bytes(read_image_file(path), os.fspath(path), max_pixels)


def read_image_file(path: str | os.PathLike) -> bytes:
    """The bytes of an image file, as stored. Raises ImageDecodeError naming the file when it cannot be read (the
    ``OSError`` is chained) or is not a regular file (a FIFO or device is refused, never waited on)."""
    name = os.fspath(path)
    try:  # O_NONBLOCK + fstat: a FIFO or device named x.jpg is refused, never waited on
        fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        with open(fd, "rb") as f:
            mode = os.fstat(fd).st_mode
            if not stat.S_ISREG(mode):
                raise ImageDecodeError(f"{name}: not a regular file (mode {stat.filemode(mode)}); not read")
            return f.read()
    except OSError as e:
        raise ImageDecodeError(f"{name}: cannot read the file ({e.strerror or e})") from e


def decode_image_bytes(data: bytes, name: str, max_pixels: int | None = DEFAULT_MAX_PIXELS) -> np.ndarray:
    """Decode the bytes of an image file.

    Args:
        data: the whole file (``bytes``, ``bytearray`` or ``memoryview``).
        name: what to call it in error messages (a path, or "sample i of <dataset>").
        max_pixels: refuse images whose header declares more pixels (``None``: no limit); see
            :func:`check_pixels`.
    Returns:
        ``(H, W, 3) uint8`` RGB, C-contiguous, following the rules in the module docstring.
    Raises:
        ImageDecodeError: empty data, unrecognised or unsupported format, truncated JPEG/PNG, or data OpenCV
            cannot decode; the message starts with ``name``.
        ImageBombError: the header declares more than ``max_pixels`` pixels (checked before decoding).
    """
    if not isinstance(data, bytes):
        data = bytes(data)
    if not data:
        raise ImageDecodeError(f"{name}: empty file (0 bytes)")
    fmt = _sniff_format(data, name)
    if fmt == "JPEG":
        _check_jpeg_complete(data, name)
    elif fmt == "PNG":
        _check_png_complete(data, name)
    if max_pixels is not None:
        height, width = header_size(data, fmt, name)
        check_pixels(height, width, max_pixels, name)
    flags = _TIFF_FLAGS if fmt == "TIFF" else _COLOR_FLAGS
    try:
        decoded = cv2.imdecode(np.frombuffer(data, np.uint8), flags)
    except cv2.error as e:
        raise ImageDecodeError(f"{name}: OpenCV cannot decode this {fmt} file ({str(e).strip()})") from e
    if decoded is None or decoded.size == 0:
        raise ImageDecodeError(f"{name}: corrupt or truncated {fmt} data (OpenCV could not decode it)")
    if decoded.ndim == 3 and decoded.shape[2] == 4 and decoded.dtype == np.uint8 and fmt == "TIFF":
        decoded = _unpremultiply_bgra(decoded)
    if decoded.ndim == 3 and decoded.shape[2] >= 3:
        decoded = decoded[..., 2::-1]  # BGR(A) -> RGB; alpha dropped
    return to_rgb_uint8(decoded, name)


def to_rgb_uint8(array, name: str) -> np.ndarray:
    """Normalise an in-memory image to RGB uint8 with the module's rules.

    Args:
        array: array-like in RGB(A) channel order: ``(H, W)`` gray, ``(H, W, 1)`` gray, ``(H, W, 2)`` gray+alpha,
            ``(H, W, 3)`` RGB or ``(H, W, 4)`` RGBA; dtype uint8, uint16 (scaled ``round(v / 257)``), bool
            (``True`` -> 255) or floating point with every value in ``[0, 1]`` (scaled ``round(v * 255)``).
        name: what to call it in error messages.
    Returns:
        ``(H, W, 3) uint8``, C-contiguous. It shares memory with ``array`` when that already is a C-contiguous
        ``(H, W, 3) uint8`` array.
    Raises:
        ImageDecodeError: another shape, an empty image, another dtype, or floats outside ``[0, 1]`` / not finite.
    """
    a = np.asarray(array)
    if a.ndim == 3 and a.shape[2] in (1, 2):
        a = a[..., 0]  # gray (+ alpha, dropped)
    elif a.ndim == 3 and a.shape[2] == 4:
        a = a[..., :3]  # RGBA -> RGB, alpha dropped
    elif not (a.ndim == 2 or (a.ndim == 3 and a.shape[2] == 3)):
        raise ImageDecodeError(f"{name}: expected an (H, W), (H, W, 1), (H, W, 2), (H, W, 3) or (H, W, 4) image "
                               f"array, got shape {a.shape}")
    if a.shape[0] == 0 or a.shape[1] == 0:
        raise ImageDecodeError(f"{name}: empty image (shape {a.shape})")
    a = _to_uint8(a, name)
    if a.ndim == 2:
        return np.repeat(a[:, :, None], 3, axis=2)
    return np.ascontiguousarray(a)


def _to_uint8(a: np.ndarray, name: str) -> np.ndarray:
    """Scale uint8/uint16/bool/float samples to uint8 (rules in the module docstring)."""
    if a.dtype == np.uint8:
        return a
    if a.dtype == np.bool_:
        return a.astype(np.uint8) * np.uint8(255)
    if a.dtype.kind == "u" and a.dtype.itemsize == 2:
        # round(v / 257) exactly: v / 257 is never k + 1/2 for integer v, so floor((v + 128) / 257) equals it.
        return ((a.astype(np.uint32) + 128) // 257).astype(np.uint8)
    if a.dtype.kind == "f":
        if not np.isfinite(a).all():
            raise ImageDecodeError(f"{name}: float image contains NaN or infinity")
        low, high = float(a.min()), float(a.max())
        if low < 0.0 or high > 1.0:
            raise ImageDecodeError(f"{name}: float image values must lie in [0, 1], found [{low:g}, {high:g}]")
        return np.rint(a.astype(np.float64) * 255.0).astype(np.uint8)
    raise ImageDecodeError(f"{name}: unsupported sample type {a.dtype} (expected uint8, uint16, bool, or float "
                           f"in [0, 1])")


def _unpremultiply_bgra(bgra: np.ndarray) -> np.ndarray:
    """Undo libtiff's ``TIFFReadRGBA`` premultiplication (``c' = (a * c + 127) // 255``) of a ``(H, W, 4) uint8``
    BGRA image: ``c = round(c' * 255 / a)`` clipped to 255, 0 where ``a`` is 0. Returns ``(H, W, 4) uint8``."""
    alpha = bgra[..., 3:].astype(np.uint32)
    color = bgra[..., :3].astype(np.uint32)
    safe = np.maximum(alpha, 1)
    restored = np.minimum((color * 255 + safe // 2) // safe, 255)
    restored = np.where(alpha == 0, 0, restored).astype(np.uint8)
    return np.concatenate([restored, bgra[..., 3:]], axis=2)


def _sniff_format(data: bytes, name: str) -> str:
    """The format named by the file signature: 'JPEG', 'PNG', 'BMP', 'WebP' or 'TIFF'; ImageDecodeError else."""
    if data.startswith(b"\xff\xd8"):
        return "JPEG"
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "PNG"
    if data.startswith(b"BM"):
        return "BMP"
    if data.startswith(b"RIFF") and data[8:12] == b"WEBP":
        return "WebP"
    if data.startswith((b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+")):
        return "TIFF"
    for signature, fmt in _UNSUPPORTED_SIGNATURES:
        if data.startswith(signature):
            raise ImageDecodeError(f"{name}: unsupported image format {fmt} (supported: {_SUPPORTED_NAMES})")
    if data[4:8] == b"ftyp":
        raise ImageDecodeError(f"{name}: unsupported image format HEIF/AVIF/MP4 container "
                               f"(supported: {_SUPPORTED_NAMES})")
    raise ImageDecodeError(f"{name}: not an image (unrecognised file signature {data[:8].hex(' ')}; "
                           f"supported: {_SUPPORTED_NAMES})")


def _check_jpeg_complete(data: bytes, name: str) -> None:
    """Walk the JPEG marker segments up to the first SOS (start of scan), then require an EOI marker (FF D9) after
    it. Entropy-coded data never contains FF D9 (FF is stuffed as FF 00), so a missing EOI means the file was cut.
    Raises ImageDecodeError for a truncated or structurally broken file."""
    n = len(data)
    pos = 2  # after SOI
    while True:
        pos = data.find(b"\xff", pos)  # libjpeg skips extraneous bytes before a marker too
        if pos < 0 or pos + 1 >= n:
            raise ImageDecodeError(f"{name}: truncated JPEG (the file ends inside the header, {n} bytes)")
        marker = data[pos + 1]
        if marker == 0xFF or marker == 0x00:  # fill byte, or a stuffed zero outside the scan: not a marker
            pos += 1
            continue
        if marker == 0x01 or 0xD0 <= marker <= 0xD8:  # standalone markers without a length
            pos += 2
            continue
        if marker == 0xD9:
            raise ImageDecodeError(f"{name}: corrupt JPEG (end-of-image marker before any image data)")
        if pos + 4 > n:
            raise ImageDecodeError(f"{name}: truncated JPEG (the file ends inside the header, {n} bytes)")
        length = int.from_bytes(data[pos + 2:pos + 4], "big")
        end = pos + 2 + length
        if length < 2 or end > n:
            raise ImageDecodeError(f"{name}: truncated JPEG (marker segment 0xFF{marker:02X} at byte {pos} needs "
                                   f"{length} bytes, the file has {n} bytes)")
        if marker == 0xDA:  # SOS: entropy-coded data follows
            break
        pos = end
    if data.rfind(b"\xff\xd9", end) < 0:
        raise ImageDecodeError(f"{name}: truncated JPEG (no end-of-image marker FFD9 after the scan data; "
                               f"{n} bytes)")


def _check_png_complete(data: bytes, name: str) -> None:
    """Walk the PNG chunks (length, type, data, CRC) and require every chunk to fit and an IEND chunk to end them.
    Raises ImageDecodeError for a truncated file."""
    n = len(data)
    pos = 8  # after the signature
    while True:
        if pos + 8 > n:
            raise ImageDecodeError(f"{name}: truncated PNG (no IEND chunk; the file ends after {n} bytes)")
        length = int.from_bytes(data[pos:pos + 4], "big")
        chunk_type = data[pos + 4:pos + 8]
        end = pos + 12 + length
        if end > n:
            raise ImageDecodeError(f"{name}: truncated PNG (chunk {chunk_type.decode('latin-1')!r} at byte {pos} "
                                   f"needs {length + 12} bytes, the file has {n} bytes)")
        if chunk_type == b"IEND":
            return
        pos = end


def check_pixels(height: int, width: int, max_pixels: int | None, name: str) -> None:
    """Apply the pixel limit to an image of ``height x width`` pixels.

    Raises :class:`ImageBombError` (naming ``name`` and the size) above ``max_pixels``; logs a warning above
    ``max_pixels // 2`` (Pillow's ``DecompressionBombWarning`` threshold for the default limit). ``None``: no limit.
    """
    if max_pixels is None:
        return
    pixels = int(height) * int(width)
    if pixels > max_pixels:
        raise ImageBombError(f"{name}: {width}x{height} image ({pixels:,} pixels) exceeds the limit of "
                             f"{max_pixels:,} pixels (a decompression bomb?); nothing was decoded",
                             path=name, hint="raise it with --max-pixels / max_pixels=")
    if pixels > max_pixels // 2:
        logger.warning("%s: large image, %dx%d (%s pixels; the limit is %s)", name, width, height,
                       f"{pixels:,}", f"{max_pixels:,}")


def header_size(data: bytes, fmt: str, name: str) -> tuple[int, int]:
    """``(height, width)`` in pixels as declared by the header of an image of format ``fmt`` (from
    :func:`_sniff_format`), read without decoding: JPEG SOFn (ITU T.81 B.2.2), PNG IHDR, BMP
    BITMAPINFOHEADER / BITMAPCOREHEADER, WebP VP8X / VP8L / VP8 (RFC 9649), TIFF tags 256/257 of the first IFD
    (TIFF 6.0). Raises ImageDecodeError when the header holds no size."""
    try:
        size = _HEADER_READERS[fmt](data)
    except (struct.error, IndexError):
        size = None
    if size is None:
        raise ImageDecodeError(f"{name}: corrupt {fmt} header (no image size found)")
    return size


def _jpeg_size(data: bytes) -> tuple[int, int] | None:
    pos, n = 2, len(data)
    while pos + 4 <= n:
        if data[pos] != 0xFF:
            pos += 1
            continue
        marker = data[pos + 1]
        if marker in (0xFF, 0x00, 0x01) or 0xD0 <= marker <= 0xD8:
            pos += 1 if marker == 0xFF else 2
            continue
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):  # SOFn: P, Y, X
            height, width = struct.unpack(">HH", data[pos + 5:pos + 9])
            return height, width
        if marker in (0xDA, 0xD9):
            return None
        pos += 2 + int.from_bytes(data[pos + 2:pos + 4], "big")
    return None


def _png_size(data: bytes) -> tuple[int, int] | None:
    if data[12:16] != b"IHDR":
        return None
    width, height = struct.unpack(">II", data[16:24])
    return height, width


def _bmp_size(data: bytes) -> tuple[int, int] | None:
    if int.from_bytes(data[14:18], "little") == 12:  # OS/2 BITMAPCOREHEADER
        width, height = struct.unpack("<HH", data[18:22])
        return height, width
    width, height = struct.unpack("<ii", data[18:26])
    return abs(height), abs(width)


def _webp_size(data: bytes) -> tuple[int, int] | None:
    chunk = data[12:16]
    if chunk == b"VP8X":
        return (int.from_bytes(data[27:30], "little") + 1, int.from_bytes(data[24:27], "little") + 1)
    if chunk == b"VP8L":
        bits = int.from_bytes(data[21:25], "little")
        return ((bits >> 14) & 0x3FFF) + 1, (bits & 0x3FFF) + 1
    if chunk == b"VP8 ":
        width, height = struct.unpack("<HH", data[26:30])
        return height & 0x3FFF, width & 0x3FFF
    return None


def _tiff_size(data: bytes) -> tuple[int, int] | None:
    order = "<" if data[:2] == b"II" else ">"
    if data[2:4] in (b"+\x00", b"\x00+"):  # BigTIFF: 8-byte offsets, 20-byte entries
        (ifd,) = struct.unpack(order + "Q", data[8:16])
        (count,) = struct.unpack(order + "Q", data[ifd:ifd + 8])
        first, entry, value_at = ifd + 8, 20, 12
    else:
        (ifd,) = struct.unpack(order + "I", data[4:8])
        (count,) = struct.unpack(order + "H", data[ifd:ifd + 2])
        first, entry, value_at = ifd + 2, 12, 8
    found = {}
    for k in range(min(count, 4096)):
        at = first + k * entry
        tag, kind = struct.unpack(order + "HH", data[at:at + 4])
        if tag in (256, 257):  # ImageWidth, ImageLength: SHORT (3) or LONG (4)
            fmt = order + ("H" if kind == 3 else "I")
            found[tag] = struct.unpack_from(fmt, data, at + value_at)[0]
    if 256 not in found or 257 not in found:
        return None
    return found[257], found[256]


_HEADER_READERS = {"JPEG": _jpeg_size, "PNG": _png_size, "BMP": _bmp_size, "WebP": _webp_size, "TIFF": _tiff_size}
