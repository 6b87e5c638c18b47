"""Which library decodes what, by the rule of :mod:`ffload.convert.images`: Pillow (the decoder of record, its
image classes constructed directly so that its global pixel limit plays no part), OpenCV for the JPEGs proven to
give Pillow's pixels and for the exact samples of 16-bit PNGs and LZW TIFFs, tifffile for TIFFs with samples wider
than 8 bits or not unsigned; and the EXIF orientation applied as Pillow's ``exif_transpose`` does. OpenCV and
tifffile are imported on first use."""

from __future__ import annotations

import io

import numpy as np

from ffload.convert.images._headers import (
    TIFF_COMPRESSIONS,
    TIFF_PHOTOMETRICS,
    check_pixels,
    first_value,
    jpeg_frame,
    jpeg_has_app1,
    tiff_tags,
)
from ffload.convert.images._wide import wide_to_rgb
from ffload.errors import ImageUnsupportedError

# Pillow's image classes per sniffed format: constructed directly, they parse the header as Image.open does but
# without its global decompression-bomb limit (max_pixels decides).
_PILLOW_CLASSES = {
    "JPEG": ("JpegImagePlugin", "JpegImageFile"),
    "PNG": ("PngImagePlugin", "PngImageFile"),
    "BMP": ("BmpImagePlugin", "BmpImageFile"),
    "WebP": ("WebPImagePlugin", "WebPImageFile"),
    "TIFF": ("TiffImagePlugin", "TiffImageFile"),
}


def decode(data: bytes, fmt: str, name: str, max_pixels: int | None, size: tuple[int, int] | None) -> np.ndarray:
    """``(H, W, 3) uint8`` pixels by the rule of :mod:`ffload.convert.images`, the header checked already (``size``
    from it, or None without a limit); decoder errors propagate as they are (the caller words them)."""
    if fmt == "JPEG" and _jpeg_fast_path(data):
        import cv2

        rgb = hasattr(cv2, "IMREAD_COLOR_RGB")  # OpenCV before 4.10 has no RGB flag
        image = _opencv(data, (cv2.IMREAD_COLOR_RGB if rgb else cv2.IMREAD_COLOR) | cv2.IMREAD_IGNORE_ORIENTATION)
        if image is not None:  # else Pillow gives its verdict below
            image = image if rgb else image[..., ::-1]
            # Pillow finds a JPEG's orientation in APP1 segments only (Exif, XMP): without one it is 1
            return _oriented(image, _orientation(_pillow(data, fmt)) if jpeg_has_app1(data) else 1)
    if fmt == "TIFF":
        tags = tiff_tags(data)
        # SampleFormat 4, "undefined", is read as unsigned
        if first_value(tags, 258, 1) > 8 or first_value(tags, 339, 1) not in (1, 4):
            return _wide_tiff(data, name, tags)
    from PIL import ImageOps

    im = _pillow(data, fmt)
    if max_pixels is not None and (im.height, im.width) != size:  # Pillow reads another size: check it too
        check_pixels(im.height, im.width, max_pixels, name)
    if fmt == "PNG" and data[24] == 16:  # IHDR bit depth: Pillow keeps the high byte of 16-bit colour
        samples = _opencv(_png_image_chunks(data), _IMREAD_UNCHANGED)
        if samples is None:
            raise ValueError("libpng could not decode the 16-bit image data")
        return _oriented(wide_to_rgb(_rgb_order(samples), 16, 1, name), _orientation(im))
    return np.array(ImageOps.exif_transpose(im).convert("RGB"))


def _jpeg_fast_path(data: bytes) -> bool:
    """Whether OpenCV decodes this JPEG to Pillow's pixels (shown by tests/test_odd_images.py): 8-bit Huffman
    baseline / extended / progressive, 1 or 3 components, no Adobe APP14 marker (whose colour transform flag
    the two libraries might read differently)."""
    frame = jpeg_frame(data)
    return (
        frame is not None and frame[0] in (0xC0, 0xC1, 0xC2) and frame[1] == 8 and frame[4] in (1, 3) and not frame[5]
    )


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
    moves = {
        2: lambda x: x[:, ::-1],
        3: lambda x: x[::-1, ::-1],
        4: lambda x: x[::-1],
        5: lambda x: x.transpose(1, 0, 2),
        6: lambda x: x[::-1].transpose(1, 0, 2),
        7: lambda x: x[::-1, ::-1].transpose(1, 0, 2),
        8: lambda x: x[:, ::-1].transpose(1, 0, 2),
    }
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


def _png_image_chunks(data: bytes) -> bytes:
    """A complete PNG's signature, IHDR, IDAT and IEND chunks only: the default image, without animation
    frames (APNG), transparency or colour chunks that a decoder might apply."""
    pieces, pos = [data[:8]], 8
    while pos + 8 <= len(data):
        length = int.from_bytes(data[pos : pos + 4], "big")
        if data[pos + 4 : pos + 8] in (b"IHDR", b"IDAT", b"IEND"):
            pieces.append(data[pos : pos + 12 + length])
        pos += 12 + length
    return b"".join(pieces)


def _wide_tiff(data: bytes, name: str, tags: dict[int, tuple[int, ...]]) -> np.ndarray:
    """A TIFF with samples wider than 8 bits or not unsigned: exact samples by tifffile (or OpenCV for a chunky
    file whose compression tifffile needs imagecodecs for), scaled by the package's rules, upright."""
    import tifffile

    with tifffile.TiffFile(io.BytesIO(data)) as tif:
        page = tif.pages[0]
        bits, kind = page.bitspersample, int(page.sampleformat)
        photometric, extras = int(page.photometric), tuple(int(e) for e in page.extrasamples)
        compression = TIFF_COMPRESSIONS.get(int(page.compression), int(page.compression))
        if kind == 2:
            raise ImageUnsupportedError(
                f"{name}: unsupported: signed {bits}-bit integer samples (no unambiguous mapping to 0..255)"
            )
        if kind != 3 and bits > 32:
            raise ImageUnsupportedError(
                f"{name}: unsupported: {bits}-bit unsigned integer samples (up to 32 bits are read)"
            )
        cmyk = photometric == 5 and first_value(tags, 332, 1) == 1 and page.samplesperpixel - len(extras) == 4
        if photometric not in (0, 1, 2) and not (cmyk and kind != 3 and bits <= 16):
            raise ImageUnsupportedError(
                f"{name}: unsupported: {bits}-bit "
                f"{TIFF_PHOTOMETRICS.get(photometric, photometric)} TIFF ({compression} "
                f"compression)"
            )
        try:
            samples = page.asarray()
            if page.axes.startswith("S"):  # planar: one plane per sample
                samples = np.moveaxis(samples, 0, -1)
        except ValueError as e:
            if "imagecodecs" not in str(e):
                raise
            if int(page.planarconfig) != 1 or cmyk:  # OpenCV reads neither exactly
                layout = "CMYK" if cmyk else "planar"
                raise ImageUnsupportedError(
                    f"{name}: unsupported: {bits}-bit {layout} TIFF with {compression} "
                    f"compression (tifffile reads it with the imagecodecs package: pip "
                    f"install imagecodecs)"
                ) from e
            samples = _opencv(data, _IMREAD_UNCHANGED)
            if samples is None:
                raise ValueError(f"OpenCV could not decode the {bits}-bit {compression} data") from e
            samples = _rgb_order(samples)
    samples = samples.reshape(samples.shape[0], samples.shape[1], -1)
    try:
        orientation = _orientation(_pillow(data, "TIFF"))
    except Exception:  # Pillow cannot open it (e.g. planar float64): the Orientation tag, as Pillow would read it
        orientation = first_value(tags, 274, 1)
    return _oriented(
        wide_to_rgb(samples, bits, photometric, name, associated=extras[:1] == (1,), cmyk=cmyk), orientation
    )
