"""What an image file's first bytes say, read without decoding: the format (by signature), whether a JPEG or PNG
is complete, the size the header declares and the pixel limit on it, the JPEG marker segments and frame header
(ITU T.81), and the integer tags of a TIFF's first IFD (TIFF 6.0, BigTIFF). The rule they serve is in
:mod:`ffload.convert.images`."""

from __future__ import annotations

import logging
import struct

from ffload.errors import ImageBombError, ImageDecodeError, ImageUnsupportedError

logger = logging.getLogger(__package__)  # ffload.convert.images, whichever of its modules logs

_UNSUPPORTED_SIGNATURES = (
    (b"GIF87a", "GIF"),
    (b"GIF89a", "GIF"),
    (b"\x00\x00\x00\x0cjP  \r\n\x87\n", "JPEG 2000"),
    (b"\xff\x4f\xff\x51", "JPEG 2000 codestream"),
    (b"\xff\x0a", "JPEG XL"),
    (b"\x00\x00\x00\x0cJXL \r\n\x87\n", "JPEG XL"),
    (b"8BPS", "Photoshop PSD"),
    (b"%PDF", "PDF"),
    (b"\x76\x2f\x31\x01", "OpenEXR"),
    (b"#?RADIANCE", "Radiance HDR"),
    (b"P1", "PNM"),
    (b"P2", "PNM"),
    (b"P3", "PNM"),
    (b"P4", "PNM"),
    (b"P5", "PNM"),
    (b"P6", "PNM"),
)
_SUPPORTED_NAMES = "JPEG, PNG, BMP, WebP, TIFF"


# names of the values of the TIFF tags Compression (259) and PhotometricInterpretation (262), for messages
TIFF_COMPRESSIONS = {
    1: "none",
    2: "CCITT RLE",
    3: "CCITT Group 3",
    4: "CCITT Group 4",
    5: "LZW",
    6: "old-style JPEG",
    7: "JPEG",
    8: "Deflate",
    32773: "PackBits",
    32946: "Deflate",
    34661: "JBIG",
    34676: "SGI LogLuv",
    34677: "SGI LogLuv",
    34712: "JPEG 2000",
    34887: "LERC",
    34925: "LZMA",
    50000: "Zstandard",
    50001: "WebP",
    50002: "JPEG XL",
}
TIFF_PHOTOMETRICS = {
    0: "min-is-white",
    1: "min-is-black",
    2: "RGB",
    3: "palette",
    4: "mask",
    5: "separated (CMYK)",
    6: "YCbCr",
    8: "CIELab",
    9: "ICCLab",
    10: "ITULab",
    32844: "LogL",
    32845: "LogLuv",
}


def sniff_format(data: bytes, name: str) -> str:
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
            raise ImageUnsupportedError(f"{name}: unsupported image format {fmt} (supported: {_SUPPORTED_NAMES})")
    if data[4:8] == b"ftyp":
        raise ImageUnsupportedError(
            f"{name}: unsupported image format HEIF/AVIF/MP4 container (supported: {_SUPPORTED_NAMES})"
        )
    raise ImageDecodeError(
        f"{name}: not an image (unrecognised file signature {data[:8].hex(' ')}; supported: {_SUPPORTED_NAMES})"
    )


def check_jpeg_complete(data: bytes, name: str) -> None:
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
        length = int.from_bytes(data[pos + 2 : pos + 4], "big")
        end = pos + 2 + length
        if length < 2 or end > n:
            raise ImageDecodeError(
                f"{name}: truncated JPEG (marker segment 0xFF{marker:02X} at byte {pos} needs "
                f"{length} bytes, the file has {n} bytes)"
            )
        if marker == 0xDA:  # SOS: entropy-coded data follows
            break
        pos = end
    if data.rfind(b"\xff\xd9", end) < 0:
        raise ImageDecodeError(f"{name}: truncated JPEG (no end-of-image marker FFD9 after the scan data; {n} bytes)")


def check_png_complete(data: bytes, name: str) -> None:
    """Walk the PNG chunks (length, type, data, CRC) and require every chunk to fit and an IEND chunk to end them.
    Raises ImageDecodeError for a truncated file."""
    n = len(data)
    pos = 8  # after the signature
    while True:
        if pos + 8 > n:
            raise ImageDecodeError(f"{name}: truncated PNG (no IEND chunk; the file ends after {n} bytes)")
        length = int.from_bytes(data[pos : pos + 4], "big")
        chunk_type = data[pos + 4 : pos + 8]
        end = pos + 12 + length
        if end > n:
            raise ImageDecodeError(
                f"{name}: truncated PNG (chunk {chunk_type.decode('latin-1')!r} at byte {pos} "
                f"needs {length + 12} bytes, the file has {n} bytes)"
            )
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
        raise ImageBombError(
            f"{name}: {width}x{height} image ({pixels:,} pixels) exceeds the limit of "
            f"{max_pixels:,} pixels (a decompression bomb?); nothing was decoded",
            path=name,
            hint="raise it with --max-pixels / max_pixels=",
        )
    if pixels > max_pixels // 2:
        logger.warning(
            "%s: large image, %dx%d (%s pixels; the limit is %s)", name, width, height, f"{pixels:,}", f"{max_pixels:,}"
        )


def header_size(data: bytes, fmt: str, name: str) -> tuple[int, int]:
    """``(height, width)`` in pixels as declared by the header of an image of format ``fmt`` (from
    :func:`sniff_format`), read without decoding: JPEG SOFn (ITU T.81 B.2.2), PNG IHDR, BMP
    BITMAPINFOHEADER / BITMAPCOREHEADER, WebP VP8X / VP8L / VP8 (RFC 9649), TIFF tags 256/257 of the first IFD
    (TIFF 6.0). Raises ImageDecodeError when the header holds no size."""
    try:
        size = _HEADER_READERS[fmt](data)
    except (struct.error, IndexError):
        size = None
    if size is None:
        raise ImageDecodeError(f"{name}: corrupt {fmt} header (no image size found)")
    return size


def _jpeg_segments(data: bytes):
    """``(marker, pos)`` of each marker segment of a JPEG's header (ITU T.81 B.1.1.4), from after SOI up to and
    including SOS (start of scan) or EOI; fill bytes and standalone markers are stepped over."""
    pos, n = 2, len(data)
    while pos + 4 <= n:
        if data[pos] != 0xFF:
            pos += 1
            continue
        marker = data[pos + 1]
        if marker in (0xFF, 0x00, 0x01) or 0xD0 <= marker <= 0xD8:
            pos += 1 if marker == 0xFF else 2
            continue
        yield marker, pos
        if marker in (0xDA, 0xD9):
            return
        pos += 2 + int.from_bytes(data[pos + 2 : pos + 4], "big")


def jpeg_frame(data: bytes) -> tuple[int, int, int, int, int, bool] | None:
    """``(SOFn marker, precision, height, width, components, adobe)`` from a JPEG's frame header (ITU T.81
    B.2.2), ``adobe`` True when an APP14 "Adobe" segment precedes it; None when there is no frame header."""
    adobe = False
    for marker, pos in _jpeg_segments(data):
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):  # SOFn: P, Y, X, Nf
            precision, height, width, components = struct.unpack(">BHHB", data[pos + 4 : pos + 10])
            return marker, precision, height, width, components, adobe
        if marker in (0xDA, 0xD9):
            return None
        adobe = adobe or (marker == 0xEE and data[pos + 4 : pos + 9] == b"Adobe")
    return None


def jpeg_has_app1(data: bytes) -> bool:
    """Whether a JPEG's header holds an APP1 segment (Exif or XMP: where Pillow looks for an orientation)."""
    return any(marker == 0xE1 for marker, _ in _jpeg_segments(data))


def _jpeg_size(data: bytes) -> tuple[int, int] | None:
    frame = jpeg_frame(data)
    return None if frame is None else (frame[2], frame[3])


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


_TIFF_TYPES = {1: "B", 3: "H", 4: "I", 16: "Q"}  # BYTE, SHORT, LONG, LONG8: the integer tag types used here


_TIFF_TAGS_READ = frozenset((256, 257, 258, 259, 262, 274, 277, 284, 332, 338, 339))
"""The tags :func:`tiff_tags` reads: ImageWidth, ImageLength, BitsPerSample, Compression, Photometric, Orientation,
SamplesPerPixel, PlanarConfiguration, InkSet, ExtraSamples, SampleFormat."""


def tiff_tags(data: bytes) -> dict[int, tuple[int, ...]]:
    """The integer tags of :data:`_TIFF_TAGS_READ` in a TIFF's first IFD (TIFF 6.0 section 2; BigTIFF): tag ->
    values (up to 16 of them). A tag whose values lie outside the data is left out, as every other tag is (Pillow
    skips such a tag too, so one broken tag does not make the header unreadable). Raises struct.error or
    IndexError when the IFD itself is malformed."""
    order = "<" if data[:2] == b"II" else ">"
    if data[2:4] in (b"+\x00", b"\x00+"):  # BigTIFF: 8-byte offsets and counts, 20-byte entries
        (ifd,) = struct.unpack(order + "Q", data[8:16])
        (count,) = struct.unpack(order + "Q", data[ifd : ifd + 8])
        first, entry, head, inline = ifd + 8, 20, order + "HHQ", 8
    else:
        (ifd,) = struct.unpack(order + "I", data[4:8])
        (count,) = struct.unpack(order + "H", data[ifd : ifd + 2])
        first, entry, head, inline = ifd + 2, 12, order + "HHI", 4
    tags = {}
    for k in range(min(count, 4096)):
        at = first + k * entry
        tag, kind, n = struct.unpack_from(head, data, at)
        code = _TIFF_TYPES.get(kind)
        if tag not in _TIFF_TAGS_READ or code is None or n == 0:
            continue
        n = min(n, 16)
        where = at + entry - inline
        if n * struct.calcsize(code) > inline:  # the values are elsewhere: at the offset the entry holds
            (where,) = struct.unpack_from(order + ("Q" if inline == 8 else "I"), data, where)
        if where + n * struct.calcsize(code) <= len(data):
            tags[tag] = struct.unpack_from(order + code * n, data, where)
    return tags


def first_value(tags: dict[int, tuple[int, ...]], tag: int, default: int) -> int:
    """The first value of ``tag`` in :func:`tiff_tags`' result, or ``default``."""
    return tags[tag][0] if tag in tags else default


def _tiff_size(data: bytes) -> tuple[int, int] | None:
    tags = tiff_tags(data)
    if 256 not in tags or 257 not in tags:
        return None
    return tags[257][0], tags[256][0]


_HEADER_READERS = {"JPEG": _jpeg_size, "PNG": _png_size, "BMP": _bmp_size, "WebP": _webp_size, "TIFF": _tiff_size}
