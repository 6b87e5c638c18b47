"""Decode image files to RGB uint8: the pixels are Pillow's, the ones torchvision's ``ImageFolder`` trains on.

Every image that enters a dataset goes through this package, so that a ``.beton`` or LMDB file always stores
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

**Modules** (private; this one holds the entry points and the public names):

* ``_headers``: the format from the signature, the completeness of JPEG/PNG files, the size a header declares and
  the pixel limit, the JPEG marker walk and the TIFF tags of the first IFD.
* ``_decode``: which library decodes what (Pillow, OpenCV, tifffile), the orientation, the exact samples of 16-bit
  PNGs and of wide or float TIFFs.
* ``_wide``: the scaling of samples wider than 8 bits or float to uint8 (and of in-memory arrays).
* ``_messages``: the capture of decoder chatter (warnings, standard error) and the wording of a decoder's refusal.
"""

from __future__ import annotations

import logging
import os
import stat

import numpy as np

from ffload.convert.images._decode import decode, jpeg_orientation
from ffload.convert.images._headers import (
    check_jpeg_complete,
    check_pixels,
    check_png_complete,
    header_size,
    sniff_format,
)
from ffload.convert.images._messages import decoder_messages, refusal
from ffload.convert.images._wide import to_rgb_uint8
from ffload.errors import ImageBombError, ImageDecodeError, ImageUnsupportedError
from ffload.limits import DEFAULT_MAX_PIXELS

__all__ = [
    "IMAGE_EXTENSIONS",
    "DEFAULT_MAX_PIXELS",
    "ImageBombError",
    "ImageDecodeError",
    "ImageUnsupportedError",
    "has_image_extension",
    "load_image",
    "read_image_file",
    "decode_image_bytes",
    "header_size",
    "check_pixels",
    "to_rgb_uint8",
    "jpeg_orientation",
]

logger = logging.getLogger(__name__)


IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff")
"""File extensions (lower case, with the dot) treated as images; matched case-insensitively."""


def has_image_extension(path: str | os.PathLike) -> bool:
    """True when ``path`` ends with one of :data:`IMAGE_EXTENSIONS`, in any case (torchvision's ``IMG_EXTENSIONS``
    check, restricted to the formats this package decodes)."""
    return os.fspath(path).lower().endswith(IMAGE_EXTENSIONS)


def load_image(path: str | os.PathLike, max_pixels: int | None = DEFAULT_MAX_PIXELS) -> np.ndarray:
    """Read and decode one image file.

    Args:
        path: the file; its content decides the format, not its extension.
        max_pixels: refuse images whose header declares more pixels (``None``: no limit); see
            :func:`check_pixels`.
    Returns:
        ``(H, W, 3) uint8`` RGB, C-contiguous, upright (EXIF orientation applied), following the rule of
        :mod:`ffload.convert.images`.
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
        ``(H, W, 3) uint8`` RGB, C-contiguous and writable: Pillow's pixels, or the documented exception (package
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
    fmt = sniff_format(data, name)
    if fmt == "JPEG":
        check_jpeg_complete(data, name)
    elif fmt == "PNG":
        check_png_complete(data, name)
    size = None
    if max_pixels is not None:
        size = header_size(data, fmt, name)
        check_pixels(*size, max_pixels, name)
    failure = None
    with decoder_messages(fmt == "TIFF") as said:  # libtiff (under Pillow) is the one that writes to stderr
        try:
            image = decode(data, fmt, name, max_pixels, size)
        except (ImageDecodeError, MemoryError):  # out of memory is not a corrupt file
            raise
        except Exception as e:  # the decoders' own errors: OSError, SyntaxError, ValueError, cv2.error, ...
            failure = e
    if failure is not None:
        raise refusal(data, fmt, name, failure, "; ".join(said)) from failure
    if said:
        logger.debug("%s: decoder messages: %s", name, "; ".join(said))
    return image
