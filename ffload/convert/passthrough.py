"""JPEG pass-through: store a source JPEG's own bytes when they already are what the write mode asks for.

FFCV's writer decodes every image and re-encodes it, which is most of a conversion's time. When the source file is a JPEG that the requested ``RGBImageField`` would store as JPEG anyway,
and nothing has to change in its pixels, its bytes can be stored as they are: no decode, no encode, and the pixels
at load time are exactly the source's decode (the loader decodes the very same bytes).

A JPEG passes through (:func:`inspect_jpeg` returns no reason) when all of these hold, read from its header only:

* it is complete: marker segments well formed up to the first scan, an end-of-image marker after it;
* its frame is 8-bit Huffman-coded baseline (SOF0), extended sequential (SOF1) or progressive (SOF2), with
  3 components (YCbCr, or RGB per an Adobe APP14 marker) and a height in the frame header (no DNL);
* TurboJPEG (the loader's decoder, :mod:`ffload.codecs.turbojpeg`) reads the header and finds the same size,
  where that library is present;
* no EXIF orientation is to be applied: no Exif APP1, or one whose IFD0 Orientation tag is absent or 1, and
  Pillow finds none either (:func:`~ffload.convert.images.jpeg_orientation`: it also reads XMP
  ``tiff:Orientation``); the converter stores what Pillow's ``exif_transpose`` shows, see
  :mod:`ffload.convert.images`;
* its longer side is within ``max_resolution`` (no resize);
* the write mode stores it as JPEG (``jpg`` always; ``smart`` / ``proportion`` by FFCV's rule, decided by the
  caller with :meth:`~ffload.formats.fields.image.RGBImageField.stores_jpeg`); otherwise it is decoded and stored raw.

The stored JPEG keeps the source's quality: ``jpeg_quality`` applies only to images that are re-encoded.
``strip_jpeg_metadata`` removes the metadata segments APP1-APP13, APP15 (Exif, XMP, ICC, IPTC ...) and COM,
keeping APP0 (JFIF) and APP14 (Adobe, whose transform flag decides YCbCr vs RGB): decoded pixels are unchanged.
Without ``--verify`` the entropy-coded data is not decoded at conversion; a JPEG whose data is damaged inside (which
libjpeg only warns about) is then stored, and the loader refuses it by name. :func:`decode_problem` is the
``--verify`` check: one full decode through TurboJPEG, as the loader decodes (warnings count as failures).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from ffload.codecs import turbojpeg as tj
from ffload.limits import DEFAULT_MAX_PIXELS

__all__ = ["REASONS", "JpegHeader", "inspect_jpeg", "strip_jpeg_metadata", "decode_problem"]

REASONS = {
    "reencode_requested": "--reencode / reencode=True asked for it",
    "no_source_bytes": "the source holds decoded images, not files",
    "not_jpeg": "the source file is not a JPEG (PNG, BMP, WebP, TIFF)",
    "jpeg_header": "truncated or unreadable JPEG header",
    "jpeg_coding": "not an 8-bit baseline/progressive Huffman JPEG (lossless, arithmetic, 12-bit, DNL)",
    "not_3_channel": "grayscale or CMYK JPEG (the stored image must be 3-channel)",
    "exif_orientation": "an EXIF orientation to apply (or unreadable EXIF)",
    "max_resolution": "longer side above max_resolution",
    "decode_warning": "--verify: the decoder reported an error or warning",
}
"""Why an image stored as JPEG was re-encoded rather than passed through: key -> description."""

_PASSABLE_FRAMES = (0xC0, 0xC1, 0xC2)  # SOF0 baseline, SOF1 extended sequential, SOF2 progressive (Huffman)
_FRAMES = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}  # every SOFn (C4 DHT, C8 JPG, CC DAC are not)
_STRIPPED = frozenset(range(0xE1, 0xEE)) | {0xEF, 0xFE}  # APP1..APP13, APP15, COM


@dataclass(frozen=True)
class JpegHeader:
    """What pass-through needs from a JPEG header.

    Attributes:
        width, height: pixels (frame header). components: colour components (3 for YCbCr/RGB).
        frame: the SOFn marker (0xC0..0xCF). precision: bits per sample.
        orientation: the EXIF IFD0 Orientation (1 when absent; 0 when an Exif block is unreadable).
        metadata: ``(start, end)`` byte ranges of the APP1-13/APP15/COM segments (marker included).
    """

    width: int
    height: int
    components: int
    frame: int
    precision: int
    orientation: int
    metadata: tuple[tuple[int, int], ...]


class _Unreadable(Exception):
    """The header cannot be walked (truncated or malformed)."""


def _segments(data: bytes):
    """Yield ``(marker, start, end)`` for the marker segments from SOI up to and including the first SOS
    (``start`` at the FF byte, ``end`` past the segment); raises _Unreadable for a cut or malformed header, and
    when no end-of-image marker follows the scan (libjpeg's walk: fill bytes skipped; ITU T.81 B.1.1)."""
    n, pos = len(data), 2
    while True:
        pos = data.find(b"\xff", pos)
        if pos < 0 or pos + 1 >= n:
            raise _Unreadable
        marker = data[pos + 1]
        if marker in (0xFF, 0x00):
            pos += 1
            continue
        if marker == 0x01 or 0xD0 <= marker <= 0xD8:
            pos += 2
            continue
        if marker == 0xD9 or pos + 4 > n:
            raise _Unreadable
        end = pos + 2 + int.from_bytes(data[pos + 2 : pos + 4], "big")
        if end > n or end < pos + 4:
            raise _Unreadable
        yield marker, pos, end
        if marker == 0xDA:
            if data.rfind(b"\xff\xd9", end) < 0:
                raise _Unreadable
            return
        pos = end


def exif_orientation(exif: bytes) -> int:
    """The IFD0 Orientation tag (0x0112) of an Exif block (the APP1 payload after ``Exif\\0\\0``, a TIFF
    structure: byte order, 42, IFD0 offset; TIFF 6.0 / Exif 2.3): 1..8, 1 when absent, 0 when unreadable."""
    if len(exif) < 8 or exif[:2] not in (b"II", b"MM"):
        return 0
    order = "<" if exif[:2] == b"II" else ">"
    magic, ifd = struct.unpack(order + "HI", exif[2:8])
    if magic != 42 or ifd + 2 > len(exif):
        return 0
    (count,) = struct.unpack(order + "H", exif[ifd : ifd + 2])
    for k in range(count):
        entry = ifd + 2 + 12 * k
        if entry + 12 > len(exif):
            return 0
        tag, kind, n = struct.unpack(order + "HHI", exif[entry : entry + 8])
        if tag == 0x0112:
            value = struct.unpack(order + "H", exif[entry + 8 : entry + 10])[0]
            return value if kind == 3 and n == 1 and 1 <= value <= 8 else 0
    return 1


def read_jpeg_header(data: bytes) -> JpegHeader | None:
    """The :class:`JpegHeader` of JPEG file bytes, or None when the header is truncated or malformed (or has
    no frame header, or no end-of-image marker after the first scan)."""
    frame, orientation, metadata = None, 1, []
    try:
        for marker, start, end in _segments(data):
            if marker in _FRAMES and frame is None:
                frame = (marker, data[start + 4 : end])
            elif marker == 0xE1 and data[start + 4 : start + 10] == b"Exif\0\0":
                value = exif_orientation(data[start + 10 : end])
                if value != 1:  # any block asking for a transform (or unreadable) decides
                    orientation = value
            if marker in _STRIPPED:
                metadata.append((start, end))
    except _Unreadable:
        return None
    if frame is None or len(frame[1]) < 6:
        return None
    precision, height, width, components = struct.unpack(">BHHB", frame[1][:6])
    return JpegHeader(width, height, components, frame[0], precision, orientation, tuple(metadata))


def inspect_jpeg(data: bytes, max_resolution: int | None) -> tuple[JpegHeader | None, str | None]:
    """Whether ``data`` (a whole source file) can be stored as it is (see the module docstring).

    Returns:
        ``(header, None)`` when it can; ``(header or None, reason)`` when it must be decoded, ``reason`` a key of
        :data:`REASONS`.
    """
    if not data.startswith(b"\xff\xd8"):
        return None, "not_jpeg"
    header = read_jpeg_header(data)
    if header is None:
        return None, "jpeg_header"
    if header.frame not in _PASSABLE_FRAMES or header.precision != 8 or header.height == 0:
        return header, "jpeg_coding"
    if header.components != 3:
        return header, "not_3_channel"
    if header.orientation != 1 or _pillow_orientation(data) != 1:
        return header, "exif_orientation"
    if max_resolution is not None and max(header.width, header.height) > max_resolution:
        return header, "max_resolution"
    if tj.library() is not None:
        from ffload.codecs.jpeg import header_size

        if header_size(np.frombuffer(data, np.uint8))[0] != (header.width, header.height):
            return header, "jpeg_header"
    return header, None


def _pillow_orientation(data: bytes) -> int:
    """:func:`~ffload.convert.images.jpeg_orientation`, 0 when Pillow cannot read the header."""
    from ffload.convert.images import jpeg_orientation

    try:
        return jpeg_orientation(data)
    except Exception:  # Pillow's header errors: the file is decoded (and named) by the full path instead
        return 0


def strip_jpeg_metadata(data: bytes, header: JpegHeader) -> bytes:
    """``data`` without its APP1-APP13, APP15 and COM segments (``header.metadata``); the image data and
    APP0/APP14 are kept byte for byte, so the decoded pixels do not change."""
    if not header.metadata:
        return data
    pieces, pos = [], 0
    for start, end in header.metadata:
        pieces.append(data[pos:start])
        pos = end
    pieces.append(data[pos:])
    return b"".join(pieces)


def decode_problem(
    data: bytes, header: JpegHeader, name: str, max_pixels: int | None = DEFAULT_MAX_PIXELS
) -> str | None:
    """Decode ``data`` fully as the loader does (TurboJPEG 3 to RGB, no scaling or crop; a warning is a
    failure), or through :func:`~ffload.convert.images.decode_image_bytes` (with ``max_pixels``, its pixel
    limit) without TurboJPEG.

    Returns:
        None when it decodes cleanly to ``header``'s size, else the problem: libjpeg-turbo's message,
        or its size against the frame header's.
    Raises:
        ImageDecodeError: (OpenCV path only) the data cannot be decoded, or its header declares more than
            ``max_pixels`` pixels (ImageBombError); the message starts with ``name``.
    """
    lib = tj.library()
    if lib is None:
        from ffload.convert.images import decode_image_bytes

        shape = decode_image_bytes(data, name, max_pixels).shape
        return None if shape[:2] == (header.height, header.width) else f"decoded to {shape[1]}x{shape[0]}"
    from ffload.codecs.jpeg import decode_whole, header_size

    buf = np.frombuffer(data, np.uint8)
    size, message = header_size(buf)
    if size is None:
        return message
    if size != (header.width, header.height):
        return f"libjpeg-turbo reads {size[0]}x{size[1]}, the frame header says {header.width}x{header.height}"
    return decode_whole(buf, np.empty((header.height, header.width, 3), np.uint8)) or None
