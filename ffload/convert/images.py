"""Decode image files to RGB uint8: the pixels are Pillow's, the ones torchvision's ``ImageFolder`` trains on.

Every image that enters a dataset goes through this module, so that a ``.beton`` or LMDB file always stores
``(H, W, 3) uint8`` RGB pixels whatever the source file looked like.

**The rule.** A file's pixels are Pillow's ``ImageOps.exif_transpose(Image.open(f)).convert("RGB")`` (Pillow is
the decoder of record): palettes expanded, alpha dropped without compositing, associated alpha undone, CMYK, YCbCr
and CIELab converted, 1/2/4-bit grey scaled, the first frame of an animation (an APNG's default image), and the
EXIF orientation applied wherever Pillow finds it (JPEG/PNG/WebP/TIFF Exif, the PNG ``eXIf`` chunk, ImageMagick's
"Raw profile type exif" text, XMP ``tiff:Orientation``). ICC profiles and gamma are ignored, as by Pillow. The
exceptions, a closed list (also the table in ``docs/images.md``), all where Pillow's ``convert`` loses the data:

* **Unsigned integer samples of b > 8 bits** (16-bit PNG, 16/32-bit TIFF) -> ``round(v * 255 / (2**b - 1))``,
  i.e. ``round(v / 257)`` for 16 bits (Pillow clips grey at 255 and keeps the high byte of colour). Associated
  (premultiplied) alpha is undone first as Pillow does at 8 bits: ``min(c * 65535 // a, 65535)``, 0 where ``a``
  is 0. CMYK TIFFs of up to 16 bits -> Pillow's CMYK formula on the exact samples,
  ``round(255 * (M - C) * (M - K) / M**2)`` with ``M = 2**b - 1`` (Pillow keeps each ink's high byte: within 2
  levels). Integer samples over 32 bits are refused as unsupported. The samples are read exactly: 16-bit PNGs
  by libpng (OpenCV, ancillary chunks removed, so an APNG gives its default image), TIFFs by ``tifffile``
  (planar, tiled, float), or by OpenCV for a chunky, non-CMYK TIFF whose compression ``tifffile`` needs
  ``imagecodecs`` for (LZW).
* **Float samples** (TIFF) -> ``rint(v * 255)`` when every value is finite and in ``[0, 1]``; any other float
  image is refused as unsupported with its range (Pillow truncates them to 0/1; clamping would store a guess).
* **Signed integer samples** (TIFF) are refused as unsupported (no unambiguous mapping to ``0..255``).

JPEG is decoded by OpenCV (libjpeg-turbo, about 30% faster than Pillow) where that is proven to give Pillow's
pixels: 8-bit baseline/extended/progressive Huffman JPEGs with 1 or 3 components and no Adobe marker
(tests/test_odd_images.py compares them); the orientation is then Pillow's. Every other JPEG goes to Pillow.

**Formats**: JPEG, PNG, BMP, WebP and TIFF, recognised by their signature (the first bytes), not by the file
extension. Files found by extension (``ImageFolderSource``) use :data:`IMAGE_EXTENSIONS`, compared in any case.
GIF, JPEG 2000, HEIF/AVIF, PNM and others raise :class:`ImageUnsupportedError` ("unsupported format").

**Outcomes.** A file is decoded, or raises one of:

* :class:`ImageBombError`: more than ``max_pixels`` pixels (default :data:`DEFAULT_MAX_PIXELS`, twice Pillow's
  ``MAX_IMAGE_PIXELS``), read from the header (JPEG SOF, PNG IHDR, BMP info header, WebP VP8/VP8L/VP8X, TIFF
  first IFD) before anything is decoded, and again from Pillow's reading of the header where it differs. Above
  half the limit a warning is logged, as Pillow's ``DecompressionBombWarning``; Pillow's own check (a global
  setting) is not used, so ``max_pixels`` alone decides.
* :class:`ImageUnsupportedError`: a valid file with a feature no decoder here reads; the message says
  ``unsupported: <feature>`` (bit depth, compression, colour space, sample format) and the decoder's words.
* :class:`ImageDecodeError` (corrupt): an unreadable or empty file, not an image, a truncated JPEG (no end-of-image
  marker after the scan data) or PNG (chunks cut short, no ``IEND``), or data the decoder refuses, in its words.

Decoder chatter never reaches the terminal: Python warnings raised while decoding (Pillow's) and what libtiff
writes to the process's standard error while Pillow decodes a TIFF are captured, added to the reason of a failure
and logged at DEBUG level otherwise; OpenCV's log is silenced while it decodes. Warnings are captured per thread
by one ``warnings.showwarning`` hook (put in place at a decode when it is not, passing on every warning of a
thread that is not decoding), so decoding from several threads leaves Python's warning filters as they were;
the filters still decide which warnings are shown at all (one already shown from the same place, under
Python's default filter, is not shown, nor captured, again). The capture of standard error changes
process-wide state for the length of one decode (file descriptor 2), so a thread printing meanwhile has its
lines captured too.
"""
from __future__ import annotations

import contextlib
import io
import logging
import os
import stat
import struct
import sys
import tempfile
import threading
import warnings

import numpy as np

from ffload.errors import ImageBombError, ImageDecodeError, ImageUnsupportedError
from ffload.limits import DEFAULT_MAX_PIXELS

__all__ = ["IMAGE_EXTENSIONS", "DEFAULT_MAX_PIXELS", "ImageBombError", "ImageDecodeError", "ImageUnsupportedError",
           "has_image_extension", "load_image", "read_image_file", "decode_image_bytes", "header_size",
           "check_pixels", "to_rgb_uint8", "jpeg_orientation"]

logger = logging.getLogger(__name__)


IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff")
"""File extensions (lower case, with the dot) treated as images; matched case-insensitively."""

_UNSUPPORTED_SIGNATURES = (
    (b"GIF87a", "GIF"), (b"GIF89a", "GIF"),
    (b"\x00\x00\x00\x0cjP  \r\n\x87\n", "JPEG 2000"), (b"\xff\x4f\xff\x51", "JPEG 2000 codestream"),
    (b"\xff\x0a", "JPEG XL"), (b"\x00\x00\x00\x0cJXL \r\n\x87\n", "JPEG XL"),
    (b"8BPS", "Photoshop PSD"), (b"%PDF", "PDF"), (b"\x76\x2f\x31\x01", "OpenEXR"),
    (b"#?RADIANCE", "Radiance HDR"), (b"P1", "PNM"), (b"P2", "PNM"), (b"P3", "PNM"), (b"P4", "PNM"),
    (b"P5", "PNM"), (b"P6", "PNM"),
)
_SUPPORTED_NAMES = "JPEG, PNG, BMP, WebP, TIFF"

# Pillow's image classes per sniffed format: constructed directly, they parse the header as Image.open does but
# without its global decompression-bomb limit (max_pixels decides).
_PILLOW_CLASSES = {"JPEG": ("JpegImagePlugin", "JpegImageFile"), "PNG": ("PngImagePlugin", "PngImageFile"),
                   "BMP": ("BmpImagePlugin", "BmpImageFile"), "WebP": ("WebPImagePlugin", "WebPImageFile"),
                   "TIFF": ("TiffImagePlugin", "TiffImageFile")}

_TIFF_COMPRESSIONS = {1: "none", 2: "CCITT RLE", 3: "CCITT Group 3", 4: "CCITT Group 4", 5: "LZW",
                      6: "old-style JPEG", 7: "JPEG", 8: "Deflate", 32773: "PackBits", 32946: "Deflate",
                      34661: "JBIG", 34676: "SGI LogLuv", 34677: "SGI LogLuv", 34712: "JPEG 2000", 34887: "LERC",
                      34925: "LZMA", 50000: "Zstandard", 50001: "WebP", 50002: "JPEG XL"}
_TIFF_COMMON_COMPRESSIONS = (1, 2, 3, 4, 5, 7, 8, 32773, 32946)
_TIFF_PHOTOMETRICS = {0: "min-is-white", 1: "min-is-black", 2: "RGB", 3: "palette", 4: "mask", 5: "separated (CMYK)",
                      6: "YCbCr", 8: "CIELab", 9: "ICCLab", 10: "ITULab", 32844: "LogL", 32845: "LogLuv"}
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
        ``(H, W, 3) uint8`` RGB, C-contiguous and writable: Pillow's pixels, or the documented exception (module
        docstring).
    Raises:
        ImageBombError: the header declares more than ``max_pixels`` pixels (checked before decoding).
        ImageUnsupportedError: a format, bit depth, compression, colour space or sample format that no decoder
            here reads (the message names it after ``unsupported:``).
        ImageDecodeError: empty data, not an image, a truncated JPEG/PNG, or data the decoder refuses (its words
            in the message); every message starts with ``name``.
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
    size = None
    if max_pixels is not None:
        size = header_size(data, fmt, name)
        check_pixels(*size, max_pixels, name)
    failure = None
    with _decoder_messages(fmt == "TIFF") as said:  # libtiff (under Pillow) is the one that writes to stderr
        try:
            image = _decode(data, fmt, name, max_pixels, size)
        except (ImageDecodeError, MemoryError):  # out of memory is not a corrupt file
            raise
        except Exception as e:  # the decoders' own errors: OSError, SyntaxError, ValueError, cv2.error, ...
            failure = e
    if failure is not None:
        raise _failure(data, fmt, name, failure, "; ".join(said)) from failure
    if said:
        logger.debug("%s: decoder messages: %s", name, "; ".join(said))
    return image


def _decode(data: bytes, fmt: str, name: str, max_pixels: int | None, size: tuple[int, int] | None) -> np.ndarray:
    """The pixels by the module's rule; decoder errors propagate as they are (the caller words them)."""
    if fmt == "JPEG" and _jpeg_fast_path(data):
        import cv2

        rgb = hasattr(cv2, "IMREAD_COLOR_RGB")  # OpenCV before 4.10 has no RGB flag
        image = _opencv(data, (cv2.IMREAD_COLOR_RGB if rgb else cv2.IMREAD_COLOR) | cv2.IMREAD_IGNORE_ORIENTATION)
        if image is not None:  # else Pillow gives its verdict below
            image = image if rgb else image[..., ::-1]
            # Pillow finds a JPEG's orientation in APP1 segments only (Exif, XMP): without one it is 1
            return _oriented(image, _orientation(_pillow(data, fmt)) if _jpeg_has_app1(data) else 1)
    if fmt == "TIFF":
        tags = _tiff_tags(data)
        if _first(tags, 258, 1) > 8 or _first(tags, 339, 1) not in (1, 4):  # 4: "undefined", read as unsigned
            return _wide_tiff(data, name, tags)
    from PIL import ImageOps

    im = _pillow(data, fmt)
    if max_pixels is not None and (im.height, im.width) != size:  # Pillow reads another size: check it too
        check_pixels(im.height, im.width, max_pixels, name)
    if fmt == "PNG" and data[24] == 16:  # IHDR bit depth: Pillow keeps the high byte of 16-bit colour
        samples = _opencv(_png_image_chunks(data), _IMREAD_UNCHANGED)
        if samples is None:
            raise ValueError("libpng could not decode the 16-bit image data")
        return _oriented(_wide_to_rgb(_rgb_order(samples), 16, 1, name), _orientation(im))
    return np.array(ImageOps.exif_transpose(im).convert("RGB"))


def _pillow(data: bytes, fmt: str):
    """Pillow's image of ``data`` read as ``fmt`` (header parsed, pixels not yet decoded); raises its errors."""
    import importlib

    module, cls = _PILLOW_CLASSES[fmt]
    return getattr(importlib.import_module(f"PIL.{module}"), cls)(io.BytesIO(data))


def jpeg_orientation(data: bytes) -> int:
    """The EXIF orientation (1-8; 1 when none) that Pillow's ``ImageOps.exif_transpose`` applies to a JPEG file's
    bytes, read from its header only (Exif APP1 or XMP ``tiff:Orientation``). Raises Pillow's errors (``OSError``,
    ``SyntaxError``) when Pillow cannot read the header."""
    return _orientation(_pillow(data, "JPEG"))


def _orientation(im) -> int:
    """The EXIF orientation Pillow's ``ImageOps.exif_transpose`` applies to ``im`` (Exif, eXIf, raw profile,
    XMP, as its ``getexif`` finds it); 1 when there is none."""
    return im.getexif().get(0x0112, 1)


def _oriented(a: np.ndarray, orientation: int) -> np.ndarray:
    """``a`` ``(H, W, C)`` transposed as Pillow's ``exif_transpose`` does for ``orientation`` (EXIF 2.3: 2 mirror,
    3 rotate 180, 4 flip, 5 transpose, 6 rotate 270, 7 transverse, 8 rotate 90; others: unchanged); C-contiguous."""
    moves = {2: lambda x: x[:, ::-1], 3: lambda x: x[::-1, ::-1], 4: lambda x: x[::-1],
             5: lambda x: x.transpose(1, 0, 2), 6: lambda x: x[::-1].transpose(1, 0, 2),
             7: lambda x: x[::-1, ::-1].transpose(1, 0, 2), 8: lambda x: x[:, ::-1].transpose(1, 0, 2)}
    move = moves.get(orientation)
    return np.ascontiguousarray(a if move is None else move(a))


_IMREAD_UNCHANGED = -1
"""``cv2.IMREAD_UNCHANGED`` (OpenCV's value; OpenCV itself is imported on first use)."""


def _opencv(data: bytes, flags: int) -> np.ndarray | None:
    """``cv2.imdecode`` with OpenCV's log silenced (its libtiff/libpng/libjpeg warnings never print). OpenCV is
    imported here, on the first decode, so that ``ffload --help`` and the sources' listing never load it."""
    import cv2

    level = cv2.utils.logging.getLogLevel()
    cv2.utils.logging.setLogLevel(cv2.utils.logging.LOG_LEVEL_SILENT)
    try:
        image = cv2.imdecode(np.frombuffer(data, np.uint8), flags)
    finally:
        cv2.utils.logging.setLogLevel(level)
    return None if image is None or image.size == 0 else image


def _rgb_order(samples: np.ndarray) -> np.ndarray:
    """OpenCV's BGR(A) -> RGB(A); grey ``(H, W)`` -> ``(H, W, 1)``."""
    if samples.ndim == 2:
        return samples[..., None]
    return np.concatenate([samples[..., 2::-1], samples[..., 3:]], axis=2) if samples.shape[2] >= 3 else samples


_STDERR_REDIRECT = threading.Lock()
"""Held while file descriptor 2 points at a capture file: two threads that each saved and restored it could leave
the process's stderr pointing at a closed file."""


_DECODING = threading.local()
"""``said``: the list a decode in this thread collects warnings in; absent outside a decode."""
_shown_elsewhere = warnings.showwarning
"""The ``warnings.showwarning`` that :func:`_capture_warning` replaced: it shows other threads' warnings."""


def _capture_warning(message, category, filename, lineno, file=None, line=None):
    """``warnings.showwarning`` while ffload is imported: a warning raised in a thread that is decoding goes to
    that decode's messages; any other goes on to the function this one replaced."""
    said = getattr(_DECODING, "said", None)
    if said is None:
        return _shown_elsewhere(message, category, filename, lineno, file, line)
    said.append(f"{category.__name__}: {message}")


def _hook_warnings() -> None:
    """Put :func:`_capture_warning` in place where something (``warnings.catch_warnings``,
    ``logging.captureWarnings``) replaced it; idempotent, so threads racing here all leave it in place."""
    global _shown_elsewhere
    current = warnings.showwarning
    if current is not _capture_warning:
        _shown_elsewhere = current
        warnings.showwarning = _capture_warning


@contextlib.contextmanager
def _decoder_messages(stderr: bool):
    """Capture what decoders say during the block: Python warnings (Pillow's) raised in this thread and, with
    ``stderr``, what C libraries write to file descriptor 2 (one thread at a time: the descriptor is the
    process's). Yields a list, filled with the messages when the block ends."""
    said: list[str] = []
    _hook_warnings()
    _DECODING.said = caught = []
    with contextlib.ExitStack() as stack:
        stack.callback(delattr, _DECODING, "said")
        sink = None
        if stderr:
            stack.enter_context(_STDERR_REDIRECT)
            sink = stack.enter_context(tempfile.TemporaryFile())
        if sink is not None:
            sys.stderr.flush()
            saved = os.dup(2)
            os.dup2(sink.fileno(), 2)
        try:
            yield said
        finally:
            if sink is not None:
                os.dup2(saved, 2)
                os.close(saved)
                sink.seek(0)
                said.extend(line.strip() for line in sink.read().decode("utf-8", "replace").splitlines()
                            if line.strip())
            said.extend(caught)


def _failure(data: bytes, fmt: str, name: str, error: Exception, said: str) -> ImageDecodeError:
    """The error for a file the decoder refused: unsupported when its header shows a feature from
    :func:`_unsupported_feature`, else corrupt; the decoder's words (and messages) in both."""
    words = str(error).strip() or type(error).__name__
    if said:
        words = f"{words}; {said}"
    feature = _unsupported_feature(data, fmt)
    if feature is not None:
        return ImageUnsupportedError(f"{name}: unsupported: {feature} (the decoder says: {words})")
    return ImageDecodeError(f"{name}: corrupt or truncated {fmt} file (the decoder says: {words})")


def _unsupported_feature(data: bytes, fmt: str) -> str | None:
    """A feature of a file's header that explains why a decoder refused it (an uncommon compression, bit depth,
    colour space or coding), or None (the file is then taken as corrupt)."""
    try:
        if fmt == "JPEG":
            frame = _jpeg_frame(data)
            if frame is None:
                return None
            marker, precision, _, _, components, _ = frame
            if precision != 8:
                return f"{precision}-bit JPEG"
            if marker in (0xC3, 0xC7, 0xCB, 0xCF):
                return "lossless JPEG"
            if marker in (0xC5, 0xC6, 0xCD, 0xCE):
                return "hierarchical JPEG"
            if marker >= 0xC9:
                return "arithmetic-coded JPEG"
            return f"JPEG with {components} components" if components not in (0, 1, 3, 4) else None
        if fmt == "TIFF":
            return _tiff_feature(_tiff_tags(data))
        if fmt == "BMP" and int.from_bytes(data[14:18], "little") >= 40:
            bits, compression = struct.unpack("<HI", data[28:34])
            if compression in (4, 5):
                return f"BMP holding a {'JPEG' if compression == 4 else 'PNG'} image (compression {compression})"
            if compression not in (0, 1, 2, 3, 6):
                return f"BMP compression {compression}"
            return f"{bits}-bit BMP" if bits not in (1, 2, 4, 8, 16, 24, 32) else None
    except (struct.error, IndexError):
        return None
    return None


def _tiff_feature(tags: dict[int, tuple[int, ...]]) -> str | None:
    """The uncommon feature of a TIFF's first IFD (compression, JPEG depth, colour space, bit depth), or None."""
    compression, bits = _first(tags, 259, 1), _first(tags, 258, 1)
    photometric = _first(tags, 262, -1)
    if compression not in _TIFF_COMMON_COMPRESSIONS:
        return f"TIFF compression {_TIFF_COMPRESSIONS.get(compression, compression)} ({compression})"
    if compression == 7 and bits != 8:
        return f"{bits}-bit JPEG-compressed TIFF"
    if photometric not in (0, 1, 2, 3, 5, 6, 8):
        return f"TIFF colour space {_TIFF_PHOTOMETRICS.get(photometric, photometric)}"
    if bits == 64 and _first(tags, 339, 1) != 3:
        return "64-bit integer TIFF samples"
    return f"{bits}-bit TIFF samples" if bits not in (1, 2, 4, 8, 16, 32, 64) else None


def _jpeg_fast_path(data: bytes) -> bool:
    """Whether OpenCV decodes this JPEG to Pillow's pixels (shown by tests/test_odd_images.py): 8-bit Huffman
    baseline / extended / progressive, 1 or 3 components, no Adobe APP14 marker (whose colour transform flag
    the two libraries might read differently)."""
    frame = _jpeg_frame(data)
    return (frame is not None and frame[0] in (0xC0, 0xC1, 0xC2) and frame[1] == 8 and frame[4] in (1, 3)
            and not frame[5])


def _png_image_chunks(data: bytes) -> bytes:
    """A complete PNG's signature, IHDR, IDAT and IEND chunks only: the default image, without animation
    frames (APNG), transparency or colour chunks that a decoder might apply."""
    pieces, pos = [data[:8]], 8
    while pos + 8 <= len(data):
        length = int.from_bytes(data[pos:pos + 4], "big")
        if data[pos + 4:pos + 8] in (b"IHDR", b"IDAT", b"IEND"):
            pieces.append(data[pos:pos + 12 + length])
        pos += 12 + length
    return b"".join(pieces)


def _wide_tiff(data: bytes, name: str, tags: dict[int, tuple[int, ...]]) -> np.ndarray:
    """A TIFF with samples wider than 8 bits or not unsigned: exact samples by tifffile (or OpenCV for a chunky
    file whose compression tifffile needs imagecodecs for), scaled by the module's rules, upright."""
    import tifffile

    with tifffile.TiffFile(io.BytesIO(data)) as tif:
        page = tif.pages[0]
        bits, kind = page.bitspersample, int(page.sampleformat)
        photometric, extras = int(page.photometric), tuple(int(e) for e in page.extrasamples)
        compression = _TIFF_COMPRESSIONS.get(int(page.compression), int(page.compression))
        if kind == 2:
            raise ImageUnsupportedError(f"{name}: unsupported: signed {bits}-bit integer samples (no unambiguous "
                                        f"mapping to 0..255)")
        if kind != 3 and bits > 32:
            raise ImageUnsupportedError(f"{name}: unsupported: {bits}-bit unsigned integer samples (up to 32 bits "
                                        f"are read)")
        cmyk = photometric == 5 and _first(tags, 332, 1) == 1 and page.samplesperpixel - len(extras) == 4
        if photometric not in (0, 1, 2) and not (cmyk and kind != 3 and bits <= 16):
            raise ImageUnsupportedError(f"{name}: unsupported: {bits}-bit "
                                        f"{_TIFF_PHOTOMETRICS.get(photometric, photometric)} TIFF ({compression} "
                                        f"compression)")
        try:
            samples = page.asarray()
            if page.axes.startswith("S"):  # planar: one plane per sample
                samples = np.moveaxis(samples, 0, -1)
        except ValueError as e:
            if "imagecodecs" not in str(e):
                raise
            if int(page.planarconfig) != 1 or cmyk:  # OpenCV reads neither exactly
                layout = "CMYK" if cmyk else "planar"
                raise ImageUnsupportedError(f"{name}: unsupported: {bits}-bit {layout} TIFF with {compression} "
                                            f"compression (tifffile reads it with the imagecodecs package: pip "
                                            f"install imagecodecs)") from e
            samples = _opencv(data, _IMREAD_UNCHANGED)
            if samples is None:
                raise ValueError(f"OpenCV could not decode the {bits}-bit {compression} data") from e
            samples = _rgb_order(samples)
    samples = samples.reshape(samples.shape[0], samples.shape[1], -1)
    try:
        orientation = _orientation(_pillow(data, "TIFF"))
    except Exception:  # Pillow cannot open it (e.g. planar float64): the Orientation tag, as Pillow would read it
        orientation = _first(tags, 274, 1)
    return _oriented(_wide_to_rgb(samples, bits, photometric, name, associated=extras[:1] == (1,), cmyk=cmyk),
                     orientation)


_BLOCK_SAMPLES = 1 << 18
"""Integer samples scaled at once by :func:`_wide_to_rgb` (whole rows): its temporaries stay a few MB whatever the
image size."""


def _wide_to_rgb(samples: np.ndarray, bits: int, photometric: int, name: str, associated: bool = False,
                 cmyk: bool = False) -> np.ndarray:
    """``(H, W, C)`` samples (unsigned ints of ``bits`` <= 32 bits, or floats) in RGB(A) / grey(+alpha) / CMYK
    order -> ``(H, W, 3)`` RGB uint8 by the module's rules: associated alpha undone, min-is-white (``photometric``
    0) inverted, CMYK (``cmyk``, ``bits`` <= 16) converted as Pillow does, then scaled. Integers are converted
    a block of rows at a time, in uint32 up to 16 bits. Raises ImageUnsupportedError for floats outside [0, 1]."""
    if samples.dtype.kind == "f":
        colour = samples[..., :3] if samples.shape[2] >= 3 else samples[..., :1]
        if associated and samples.shape[2] > colour.shape[2]:
            alpha = samples[..., colour.shape[2]:colour.shape[2] + 1]
            colour = np.where(alpha > 0, np.minimum(colour / np.where(alpha > 0, alpha, 1), 1.0), 0.0)
        out = _to_uint8(1.0 - colour if photometric == 0 else colour, name)
        return np.ascontiguousarray(np.repeat(out, 3, axis=2) if out.shape[2] == 1 else out)
    height, width, channels = samples.shape
    out = np.empty((height, width, 3), np.uint8)
    rows = max(1, _BLOCK_SAMPLES // max(1, width * channels))
    for y in range(0, height, rows):
        block = samples[y:y + rows]
        out[y:y + rows] = (_cmyk_rows(block, bits) if cmyk else
                           _scaled_rows(block, bits, photometric == 0, associated))
    return out


def _scaled_rows(samples: np.ndarray, bits: int, inverted: bool, associated: bool) -> np.ndarray:
    """RGB or grey rows of :func:`_wide_to_rgb`: ``(h, W, 3 or 1) uint8``. Exact in uint32 up to 16 bits
    (``c * top`` < 2**32), uint64 up to 32."""
    wide = np.uint32 if bits <= 16 else np.uint64
    top = wide((1 << bits) - 1)
    c = 3 if samples.shape[2] >= 3 else 1
    colour = samples[..., :c].astype(wide)
    if associated and samples.shape[2] > c:  # as Pillow at 8 bits: min(c * top // a, top), 0 where a is 0
        alpha = samples[..., c:c + 1].astype(wide)
        colour = np.where(alpha == 0, wide(0), np.minimum(colour * top // np.maximum(alpha, wide(1)), top))
    if inverted:
        colour = top - colour
    # round(v * 255 / top) exactly: floor((2 * 255 * v + top) / (2 * top)); no ties for top > 255
    return ((colour * wide(510) + top) // (wide(2) * top)).astype(np.uint8)


def _cmyk_rows(samples: np.ndarray, bits: int) -> np.ndarray:
    """CMYK rows of :func:`_wide_to_rgb` (``bits`` <= 16; extra samples dropped) -> ``(h, W, 3) uint8``:
    Pillow's CMYK -> RGB (``R = (255 - C) * (255 - K) / 255``) on the exact samples, i.e.
    ``round(255 * (M - C) * (M - K) / M**2)`` with ``M = 2**bits - 1`` (no ties: ``M`` is odd)."""
    m = np.uint64((1 << bits) - 1)
    ink = m - samples[..., :4].astype(np.uint64)
    return ((ink[..., :3] * ink[..., 3:] * np.uint64(510) + m * m) // (np.uint64(2) * m * m)).astype(np.uint8)


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
        ImageDecodeError: another shape or an empty image.
        ImageUnsupportedError: (an ImageDecodeError) another dtype, or floats outside ``[0, 1]`` / not finite.
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
            raise ImageUnsupportedError(f"{name}: unsupported: float samples that are NaN or infinite")
        low, high = float(a.min()), float(a.max())
        if low < 0.0 or high > 1.0:
            raise ImageUnsupportedError(f"{name}: unsupported: float samples outside [0, 1] (found [{low:g}, "
                                        f"{high:g}]; the rule is round(v * 255) for [0, 1])")
        return np.rint(a.astype(np.float64) * 255.0).astype(np.uint8)
    raise ImageUnsupportedError(f"{name}: unsupported: sample type {a.dtype} (expected uint8, uint16, bool, or "
                                f"float in [0, 1])")


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
            raise ImageUnsupportedError(f"{name}: unsupported image format {fmt} (supported: {_SUPPORTED_NAMES})")
    if data[4:8] == b"ftyp":
        raise ImageUnsupportedError(f"{name}: unsupported image format HEIF/AVIF/MP4 container "
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
        pos += 2 + int.from_bytes(data[pos + 2:pos + 4], "big")


def _jpeg_frame(data: bytes) -> tuple[int, int, int, int, int, bool] | None:
    """``(SOFn marker, precision, height, width, components, adobe)`` from a JPEG's frame header (ITU T.81
    B.2.2), ``adobe`` True when an APP14 "Adobe" segment precedes it; None when there is no frame header."""
    adobe = False
    for marker, pos in _jpeg_segments(data):
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):  # SOFn: P, Y, X, Nf
            precision, height, width, components = struct.unpack(">BHHB", data[pos + 4:pos + 10])
            return marker, precision, height, width, components, adobe
        if marker in (0xDA, 0xD9):
            return None
        adobe = adobe or (marker == 0xEE and data[pos + 4:pos + 9] == b"Adobe")
    return None


def _jpeg_has_app1(data: bytes) -> bool:
    """Whether a JPEG's header holds an APP1 segment (Exif or XMP: where Pillow looks for an orientation)."""
    return any(marker == 0xE1 for marker, _ in _jpeg_segments(data))


def _jpeg_size(data: bytes) -> tuple[int, int] | None:
    frame = _jpeg_frame(data)
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
"""The tags :func:`_tiff_tags` reads: ImageWidth, ImageLength, BitsPerSample, Compression, Photometric, Orientation,
SamplesPerPixel, PlanarConfiguration, InkSet, ExtraSamples, SampleFormat."""


def _tiff_tags(data: bytes) -> dict[int, tuple[int, ...]]:
    """The integer tags of :data:`_TIFF_TAGS_READ` in a TIFF's first IFD (TIFF 6.0 section 2; BigTIFF): tag ->
    values (up to 16 of them). A tag whose values lie outside the data is left out, as every other tag is (Pillow
    skips such a tag too, so one broken tag does not make the header unreadable). Raises struct.error or
    IndexError when the IFD itself is malformed."""
    order = "<" if data[:2] == b"II" else ">"
    if data[2:4] in (b"+\x00", b"\x00+"):  # BigTIFF: 8-byte offsets and counts, 20-byte entries
        (ifd,) = struct.unpack(order + "Q", data[8:16])
        (count,) = struct.unpack(order + "Q", data[ifd:ifd + 8])
        first, entry, head, inline = ifd + 8, 20, order + "HHQ", 8
    else:
        (ifd,) = struct.unpack(order + "I", data[4:8])
        (count,) = struct.unpack(order + "H", data[ifd:ifd + 2])
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


def _first(tags: dict[int, tuple[int, ...]], tag: int, default: int) -> int:
    """The first value of ``tag`` in :func:`_tiff_tags`' result, or ``default``."""
    return tags[tag][0] if tag in tags else default


def _tiff_size(data: bytes) -> tuple[int, int] | None:
    tags = _tiff_tags(data)
    if 256 not in tags or 257 not in tags:
        return None
    return tags[257][0], tags[256][0]


_HEADER_READERS = {"JPEG": _jpeg_size, "PNG": _png_size, "BMP": _bmp_size, "WebP": _webp_size, "TIFF": _tiff_size}
