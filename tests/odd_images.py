"""A corpus of odd image files, small and built here: what scraped, medical and satellite folders hold.

Each :class:`OddImage` is one file (its bytes), where it goes in an ImageFolder tree (``<class>/<file>``), the
outcome ffload must give it (:data:`STORED`, :data:`UNSUPPORTED`, :data:`CORRUPT` or :data:`BOMB`) and, for the
documented exceptions to "the pixels are Pillow's" (16-bit and float samples, see ``docs/images.md``), the exact
``(H, W, 3) uint8`` image to expect. Pillow writes most files; the variants it cannot write (PNG 16-bit colour,
APNG, BMP bit fields and broken headers, 2/4-bit grey, old-style JPEG and 16-bit JPEG TIFFs, 12-bit JPEG) are
hand-built from the specifications (PNG 1.2 + APNG 1.0, BMP v3-v5, TIFF 6.0); tifffile writes the planar,
16-bit and float TIFFs. The pixels are crops of ``skimage.data`` photos, so a wrong decode shows.

Used by tests/test_odd_images.py (pixels and reasons) and by the reproducibility tests (the same folder converted
twice and with several workers must give the same bytes): :func:`write_odd_corpus` is the entry point.
"""

from __future__ import annotations

import functools
import io
import os
import struct
import zlib
from dataclasses import dataclass

import numpy as np

STORED, UNSUPPORTED, CORRUPT, BOMB = "stored", "unsupported", "corrupt", "bomb"
"""The four outcomes of an input file."""


@dataclass(frozen=True)
class OddImage:
    """One file of the corpus.

    Attributes:
        name: ``<class>/<file>``, its place in an ImageFolder tree.
        outcome: :data:`STORED`, :data:`UNSUPPORTED`, :data:`CORRUPT` or :data:`BOMB`.
        data: the file's bytes.
        expected: ``(H, W, 3) uint8`` pixels to store when the rule is an exception to Pillow's decode
            (16-bit / float samples); None: Pillow's ``exif_transpose(open(f)).convert("RGB")`` (or no pixels).
        reason: a fragment the skip reason must hold (unsupported, corrupt, bomb), else "".
    """

    name: str
    outcome: str
    data: bytes
    expected: np.ndarray | None = None
    reason: str = ""


def write_odd_corpus(root: str | os.PathLike) -> dict[str, str]:
    """Write every :func:`odd_images` file under ``root`` (ImageFolder layout ``root/<class>/<file>``).

    Returns:
        ``{"<class>/<file>": outcome}``, outcome one of ``stored``, ``unsupported``, ``corrupt``, ``bomb``.
    """
    outcomes = {}
    for item in odd_images():
        path = os.path.join(os.fspath(root), *item.name.split("/"))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(item.data)
        outcomes[item.name] = item.outcome
    return outcomes


def pillow_rgb(data: bytes) -> np.ndarray:
    """The reference: ``ImageOps.exif_transpose(Image.open(f)).convert("RGB")`` as ``(H, W, 3) uint8``."""
    from PIL import Image, ImageOps

    return np.asarray(ImageOps.exif_transpose(Image.open(io.BytesIO(data))).convert("RGB"))


# -- content ----------------------------------------------------------------------------------------------------


@functools.cache
def photo(seed: int = 0) -> np.ndarray:
    """A ``(24, 36, 3) uint8`` crop of a real photo (non-square, so transposes show); seeds pick other crops."""
    import skimage.data

    image = skimage.data.astronaut() if seed % 2 == 0 else skimage.data.chelsea()
    y, x = 90 + 13 * seed, 160 + 7 * seed
    return np.ascontiguousarray(image[y : y + 24, x : x + 36])


def deep(seed: int = 0) -> np.ndarray:
    """``(24, 36, 3) uint16``: the photo spread to 16 bits with low bits that change the 8-bit rounding."""
    low = np.random.default_rng(seed).integers(0, 257, (24, 36, 3))
    return (photo(seed).astype(np.int64) * 257 - 128 + low).clip(0, 65535).astype(np.uint16)


def to8(values: np.ndarray) -> np.ndarray:
    """The 16-bit rule: ``round(v / 257)``, as ``uint8``."""
    return ((values.astype(np.uint32) + 128) // 257).astype(np.uint8)


def rgb3(gray: np.ndarray) -> np.ndarray:
    """``(H, W)`` -> ``(H, W, 3)`` by replication."""
    return np.repeat(gray[..., None], 3, axis=2)


def pil(array: np.ndarray, fmt: str, mode: str | None = None, **kw) -> bytes:
    """Pillow's encoding of ``array`` (optionally converted to ``mode``) as ``fmt``."""
    from PIL import Image

    image = Image.fromarray(array)
    if mode is not None:
        image = (
            image.convert(mode)
            if mode not in ("P",)
            else image.convert("P", palette=Image.Palette.ADAPTIVE, colors=kw.pop("colors", 32))
        )
    buf = io.BytesIO()
    image.save(buf, fmt, **kw)
    return buf.getvalue()


def tiff_file(array: np.ndarray, **kw) -> bytes:
    """tifffile's encoding of ``array``."""
    import tifffile

    buf = io.BytesIO()
    tifffile.imwrite(buf, array, **kw)
    return buf.getvalue()


def exif(orientation: int, prefix: bool = True) -> bytes:
    """An Exif block holding one IFD0 Orientation tag; ``prefix``: starting ``Exif\\0\\0`` (as phones write)."""
    from PIL import Image

    block = Image.Exif()
    block[0x0112] = orientation
    data = block.tobytes()
    return data if prefix else data.removeprefix(b"Exif\x00\x00")


# -- hand-built files -------------------------------------------------------------------------------------------


def png_chunk(kind: bytes, data: bytes) -> bytes:
    """One PNG chunk: length, type, data, CRC-32 of type and data (PNG 1.2, 5.3)."""
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png_rows(samples: np.ndarray) -> bytes:
    """zlib stream of unfiltered scanlines (filter type 0) of big-endian ``samples`` ``(H, W[, C])``."""
    rows = samples.astype(samples.dtype.newbyteorder(">")).reshape(samples.shape[0], -1).view(np.uint8)
    return zlib.compress(np.hstack([np.zeros((len(rows), 1), np.uint8), rows]).tobytes())


def png_file(
    samples: np.ndarray, color_type: int, before: list[bytes] = (), after: list[bytes] = (), idat: bytes | None = None
) -> bytes:
    """A PNG of ``samples`` (uint8 or uint16 -> bit depth 8 or 16) with extra chunks before / after IDAT."""
    height, width = samples.shape[:2]
    depth = 16 if samples.dtype == np.uint16 else 8
    ihdr = struct.pack(">IIBBBBB", width, height, depth, color_type, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + png_chunk(b"IHDR", ihdr)
        + b"".join(before)
        + png_chunk(b"IDAT", png_rows(samples) if idat is None else idat)
        + b"".join(after)
        + png_chunk(b"IEND", b"")
    )


def apng(default_in_animation: bool) -> bytes:
    """An APNG of three different photos: the IDAT image (Pillow's frame 0) and two animation frames; when
    ``default_in_animation`` is False the IDAT image is not part of the animation (APNG 1.0, 'default image')."""
    images = [photo(0), photo(1), photo(2)]
    height, width = images[0].shape[:2]

    def fctl(seq: int) -> bytes:
        return png_chunk(b"fcTL", struct.pack(">IIIIIHHBB", seq, width, height, 0, 0, 1, 10, 0, 0))

    before, after, seq = [png_chunk(b"acTL", struct.pack(">II", 2 if not default_in_animation else 3, 0))], [], 0
    if default_in_animation:
        before.append(fctl(seq))
        seq += 1
    for image in images[1:]:
        after.append(fctl(seq))
        after.append(png_chunk(b"fdAT", struct.pack(">I", seq + 1) + png_rows(image)))
        seq += 2
    return png_file(images[0], 2, before, after)


def tiff_handmade(width: int, height: int, tags: dict[int, tuple[int, tuple[int, ...]]], strip: bytes) -> bytes:
    """A little-endian TIFF (TIFF 6.0) with one IFD and one strip. ``tags``: tag -> (type, values), type 3 SHORT or
    4 LONG; ImageWidth, ImageLength, RowsPerStrip, StripOffsets and StripByteCounts are added."""
    tags = {
        **tags,
        256: (4, (width,)),
        257: (4, (height,)),
        278: (4, (height,)),
        279: (4, (len(strip),)),
        273: (4, (0,)),
    }
    packed = {
        tag: struct.pack("<" + {3: "H", 4: "I"}[kind] * len(values), *values) for tag, (kind, values) in tags.items()
    }
    extra_at = 8 + 2 + 12 * len(tags) + 4
    outside = b"".join(v for v in packed.values() if len(v) > 4)
    packed[273] = struct.pack("<I", extra_at + len(outside))  # the strip follows the out-of-entry values
    entries, extra = b"", b""
    for tag in sorted(tags):
        kind, values = tags[tag]
        if len(packed[tag]) <= 4:
            value = packed[tag].ljust(4, b"\0")
        else:
            value = struct.pack("<I", extra_at + len(extra))
            extra += packed[tag]
        entries += struct.pack("<HHI", tag, kind, len(values)) + value
    return b"II*\0" + struct.pack("<IH", 8, len(tags)) + entries + b"\0\0\0\0" + extra + strip


def packed_gray(bits: int) -> tuple[np.ndarray, bytes]:
    """A grey ramp image at ``bits`` (1, 2 or 4) per sample: ``(levels (24, 36) uint8, packed rows)``."""
    levels = (photo(0)[..., 1].astype(np.int32) >> (8 - bits)).astype(np.uint8)
    per_byte = 8 // bits
    padded = np.zeros((levels.shape[0], -(-levels.shape[1] // per_byte) * per_byte), np.uint8)
    padded[:, : levels.shape[1]] = levels
    groups = padded.reshape(padded.shape[0], -1, per_byte)
    packed = np.zeros(groups.shape[:2], np.uint8)
    for k in range(per_byte):
        packed |= groups[:, :, k] << (8 - bits * (k + 1))
    return levels, packed.tobytes()


def bmp_file(
    pixels: bytes,
    width: int,
    height: int,
    bpp: int,
    compression: int = 0,
    masks: tuple[int, ...] = (),
    header_size: int = 40,
    offset: int | None = None,
) -> bytes:
    """A BMP (bottom-up rows in ``pixels``) with a BITMAPINFOHEADER (40) + mask DWORDs, or a V4/V5 header (108 /
    124) holding the masks; ``header_size`` / ``offset`` may lie (malformed files)."""
    if header_size in (108, 124):
        info = struct.pack(
            "<IiiHHIIiiII", header_size, width, height, 1, bpp, compression, len(pixels), 2835, 2835, 0, 0
        )
        info += struct.pack("<4I", *(list(masks) + [0] * 4)[:4]) + b"BGRs" + b"\0" * (header_size - 56)
        tail = b""
    else:
        info = struct.pack(
            "<IiiHHIIiiII", header_size, width, height, 1, bpp, compression, len(pixels), 2835, 2835, 0, 0
        )
        tail = struct.pack(f"<{len(masks)}I", *masks)
    start = 14 + len(info) + len(tail)
    file_header = struct.pack("<2sIHHI", b"BM", start + len(pixels), 0, 0, start if offset is None else offset)
    return file_header + info + tail + pixels


def bmp_rows(samples: np.ndarray, dtype: str) -> bytes:
    """Bottom-up rows of packed samples ``(H, W)`` of ``dtype`` ('<u2' or '<u4'), each padded to 4 bytes."""
    rows = samples[::-1].astype(dtype).view(np.uint8).reshape(samples.shape[0], -1)
    pad = (-rows.shape[1]) % 4
    return np.hstack([rows, np.zeros((rows.shape[0], pad), np.uint8)]).tobytes()


def bitfield_bmp(masks: tuple[int, int, int], bits: int, header_size: int = 40, alpha: int = 0) -> bytes:
    """A BI_BITFIELDS BMP of the photo packed with ``masks`` (R, G, B; the top bits of each channel)."""
    rgb = photo(3).astype(np.uint64)
    packed = np.zeros(rgb.shape[:2], np.uint64)
    for c, mask in enumerate(masks):
        shift, width = (mask & -mask).bit_length() - 1, bin(mask).count("1")
        packed |= (rgb[..., c] >> np.uint64(8 - width)) << np.uint64(shift)
    if alpha:
        packed |= np.uint64(alpha)
    all_masks = masks + ((alpha,) if header_size in (108, 124) else ())
    return bmp_file(bmp_rows(packed, "<u2" if bits == 16 else "<u4"), 36, 24, bits, 3, all_masks, header_size)


def jpeg_with_precision(bits: int) -> bytes:
    """A baseline JPEG whose frame header declares ``bits`` per sample (a 12-bit JPEG as far as a reader sees)."""
    data = bytearray(pil(photo(0), "JPEG", quality=90))
    sof = data.index(b"\xff\xc0")
    data[sof + 1] = 0xC1  # extended sequential: the frame type that allows 12 bits
    data[sof + 4] = bits
    return bytes(data)


def xmp_packet(orientation: int) -> bytes:
    """An XMP packet stating ``tiff:Orientation``."""
    return (
        b'<?xpacket begin="" id="W5M0MpCehiHzreSzNTczkc9d"?><x:xmpmeta xmlns:x="adobe:ns:meta/">'
        b'<rdf:RDF xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#"><rdf:Description '
        b'xmlns:tiff="http://ns.adobe.com/tiff/1.0/" tiff:Orientation="'
        + str(orientation).encode()
        + b'"/></rdf:RDF></x:xmpmeta><?xpacket end="w"?>'
    )


def raw_profile_exif(orientation: int) -> str:
    """ImageMagick's "Raw profile type exif" text: a blank line, ``exif``, the length, then hex lines."""
    data = exif(orientation)
    hexed = data.hex()
    return "\nexif\n" + f"{len(data):8d}" + "\n" + "\n".join(hexed[i : i + 72] for i in range(0, len(hexed), 72)) + "\n"


def png_bomb() -> bytes:
    """A gray PNG whose IHDR declares 30000 x 30000 pixels, with a few bytes of image data."""
    ihdr = struct.pack(">IIBBBBB", 30000, 30000, 8, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + png_chunk(b"IHDR", ihdr)
        + png_chunk(b"IDAT", zlib.compress(b"\0" * 4096))
        + png_chunk(b"IEND", b"")
    )


def oriented(a: np.ndarray, orientation: int) -> np.ndarray:
    """What a viewer shows for stored pixels ``a`` and EXIF orientation 1-8 (EXIF 2.3, as Pillow's transposes)."""
    return {
        1: a,
        2: a[:, ::-1],
        3: a[::-1, ::-1],
        4: a[::-1],
        5: a.transpose(1, 0, 2),
        6: np.rot90(a, -1),
        7: a[::-1, ::-1].transpose(1, 0, 2),
        8: np.rot90(a, 1),
    }[orientation]


def unpremultiplied(values: np.ndarray) -> np.ndarray:
    """16-bit associated alpha undone on ``(H, W, 4) uint16`` as Pillow undoes 8-bit (its ``RGBa`` unpacker):
    ``min(c * 65535 // a, 65535)``, 0 where ``a == 0``. Returns the colour ``(H, W, 3) uint16``."""
    color, alpha = values[..., :3].astype(np.uint64), values[..., 3:].astype(np.uint64)
    out = np.minimum(color * 65535 // np.maximum(alpha, 1), 65535)
    return np.where(alpha == 0, 0, out).astype(np.uint16)


# -- the corpus -------------------------------------------------------------------------------------------------


@functools.cache
def odd_images() -> tuple[OddImage, ...]:
    """Every file of the corpus (built once per process; about 80 files of a few KB)."""
    from PIL import Image, PngImagePlugin

    p, q = photo(0), photo(1)
    items: list[OddImage] = []

    def add(name, outcome, data, expected=None, reason=""):
        items.append(OddImage(name, outcome, data, expected, reason))

    # JPEG: every variant the fast path may take, and the ones it must leave to Pillow
    for quality in (40, 90):
        for sub in (0, 1, 2):
            add(f"jpeg/pil_q{quality}_ss{sub}.jpg", STORED, pil(p, "JPEG", quality=quality, subsampling=sub))
        add(f"jpeg/pil_q{quality}_progressive.jpg", STORED, pil(q, "JPEG", quality=quality, progressive=True))
    import cv2

    for label, factor in (
        ("420", cv2.IMWRITE_JPEG_SAMPLING_FACTOR_420),
        ("422", cv2.IMWRITE_JPEG_SAMPLING_FACTOR_422),
        ("444", cv2.IMWRITE_JPEG_SAMPLING_FACTOR_444),
        ("411", cv2.IMWRITE_JPEG_SAMPLING_FACTOR_411),
    ):
        ok, buf = cv2.imencode(
            ".jpg", q[..., ::-1], [cv2.IMWRITE_JPEG_QUALITY, 70, cv2.IMWRITE_JPEG_SAMPLING_FACTOR, factor]
        )
        add(f"jpeg/opencv_{label}.jpg", STORED, buf.tobytes())
    add("jpeg/gray.jpg", STORED, pil(p[..., 0], "JPEG", quality=80))
    add("jpeg/cmyk_adobe.jpg", STORED, pil(np.dstack([255 - p, p[..., :1] // 3]), "JPEG", "CMYK", quality=90))
    add("jpeg/exif_orientation_6.jpg", STORED, pil(p, "JPEG", quality=90, exif=exif(6)))
    add("jpeg/xmp_orientation_8.jpg", STORED, pil(p, "JPEG", quality=90, xmp=xmp_packet(8)))
    add("jpeg/twelve_bit.jpg", UNSUPPORTED, jpeg_with_precision(12), reason="12-bit")

    # PNG
    add("png/rgb.png", STORED, pil(p, "PNG"))
    add("png/palette.png", STORED, pil(p, "PNG", "P", colors=16))
    add("png/palette_4bit.png", STORED, pil(q, "PNG", "P", colors=16, bits=4))
    add("png/one_bit.png", STORED, pil(p[..., 0] > 100, "PNG"))
    add("png/gray_alpha.png", STORED, pil(np.dstack([p[..., 0], p[..., 1]]), "PNG", "LA"))
    gray16 = deep(0)[..., 0]
    add("png/gray16.png", STORED, pil(gray16, "PNG"), rgb3(to8(gray16)))
    add("png/rgb16.png", STORED, png_file(deep(1), 2), to8(deep(1)))
    rgba16 = np.dstack([deep(2), deep(3)[..., :1]])
    add("png/rgba16.png", STORED, png_file(rgba16, 6), to8(deep(2)))
    add("png/gray_alpha16.png", STORED, png_file(np.dstack([gray16, deep(3)[..., 0]]), 4), rgb3(to8(gray16)))
    add("png/apng_default_image_separate.png", STORED, apng(False))
    add("png/apng_default_image_is_frame_0.png", STORED, apng(True))
    add("png/exif_chunk_orientation_6.png", STORED, pil(p, "PNG", exif=exif(6)))
    info = PngImagePlugin.PngInfo()
    info.add_text("Raw profile type exif", raw_profile_exif(8), zip=True)
    add("png/raw_profile_exif_orientation_8.png", STORED, pil(p, "PNG", pnginfo=info))
    info = PngImagePlugin.PngInfo()
    info.add_itxt("XML:com.adobe.xmp", xmp_packet(3).decode())
    add("png/xmp_orientation_3.png", STORED, pil(p, "PNG", pnginfo=info))
    rgb16_oriented = png_file(deep(4), 2, after=[png_chunk(b"eXIf", exif(6, prefix=False))])
    add("png/rgb16_exif_orientation_6.png", STORED, rgb16_oriented, oriented(to8(deep(4)), 6))

    # TIFF
    add("tiff/one_bit.tif", STORED, pil(p[..., 0] > 120, "TIFF"))
    add("tiff/one_bit_group4.tif", STORED, pil(p[..., 0] > 120, "TIFF", compression="group4"))
    add("tiff/palette.tif", STORED, pil(p, "TIFF", "P", colors=24))
    add("tiff/palette_lzw.tif", STORED, pil(q, "TIFF", "P", colors=24, compression="tiff_lzw"))
    for bits in (2, 4):
        levels, packed = packed_gray(bits)
        add(
            f"tiff/gray_{bits}bit.tif",
            STORED,
            tiff_handmade(36, 24, {258: (3, (bits,)), 259: (3, (1,)), 262: (3, (1,)), 277: (3, (1,))}, packed),
        )
    add(
        "tiff/rgb_planar_8bit.tif",
        STORED,
        tiff_file(np.moveaxis(p, 2, 0).copy(), photometric="rgb", planarconfig="separate"),
    )
    add("tiff/rgb_orientation_6.tif", STORED, pil(p, "TIFF", tiffinfo={274: 6}))
    add("tiff/cmyk.tif", STORED, pil(np.dstack([255 - p, p[..., :1] // 3]), "TIFF", "CMYK"))
    add("tiff/cielab.tif", STORED, tiff_file(pil_lab(p), photometric="cielab"))
    add(
        "tiff/rgba_associated_8bit.tif",
        STORED,
        tiff_file(
            np.dstack([p // 2, np.full(p.shape[:2], 128, np.uint8)]), photometric="rgb", extrasamples=["assocalpha"]
        ),
    )
    add("tiff/gray16.tif", STORED, pil(gray16, "TIFF"), rgb3(to8(gray16)))
    for layout, kw in (("strip", {}), ("tiled", {"tile": (16, 16)}), ("deflate", {"compression": "zlib"})):
        add(
            f"tiff/rgb16_planar_{layout}.tif",
            STORED,
            tiff_file(np.moveaxis(deep(5), 2, 0).copy(), photometric="rgb", planarconfig="separate", **kw),
            to8(deep(5)),
        )
        add(
            f"tiff/rgba16_planar_{layout}.tif",
            STORED,
            tiff_file(
                np.moveaxis(np.dstack([deep(6), deep(7)[..., :1]]), 2, 0).copy(),
                photometric="rgb",
                planarconfig="separate",
                extrasamples=["unassalpha"],
                **kw,
            ),
            to8(deep(6)),
        )
    add("tiff/rgb16_contiguous.tif", STORED, tiff_file(deep(8), photometric="rgb"), to8(deep(8)))
    ok, buf = cv2.imencode(".tiff", deep(9)[..., ::-1])  # LZW with a predictor: OpenCV's default
    add("tiff/rgb16_lzw_opencv.tif", STORED, buf.tobytes(), to8(deep(9)))
    premultiplied = np.dstack([deep(10), deep(11)[..., :1] // 2 + 32768])
    premultiplied[..., :3] = premultiplied[..., :3].astype(np.uint64) * premultiplied[..., 3:] // 65535
    add(
        "tiff/rgba16_associated.tif",
        STORED,
        tiff_file(premultiplied, photometric="rgb", extrasamples=["assocalpha"]),
        to8(unpremultiplied(premultiplied)),
    )
    unit = photo(12).astype(np.float64) / 255.0 * 0.999 + 0.0004
    add(
        "tiff/float64_planar.tif",
        STORED,
        tiff_file(np.moveaxis(unit, 2, 0).copy(), photometric="rgb", planarconfig="separate"),
        np.rint(unit * 255).astype(np.uint8),
    )
    unit32 = unit[..., 0].astype(np.float32)
    add(
        "tiff/float32_gray.tif",
        STORED,
        tiff_file(unit32, photometric="minisblack"),
        rgb3(np.rint(unit32.astype(np.float64) * 255).astype(np.uint8)),
    )
    add(
        "tiff/float32_out_of_range.tif",
        UNSUPPORTED,
        tiff_file(unit32 * 1000 - 3, photometric="minisblack"),
        reason="float samples outside [0, 1]",
    )
    add(
        "tiff/int16_signed.tif",
        UNSUPPORTED,
        tiff_file(p[..., 0].astype(np.int16) - 100, photometric="minisblack"),
        reason="signed",
    )
    add("tiff/lzma.tif", STORED, tiff_file(p, photometric="rgb", compression="lzma"))
    add(
        "tiff/old_style_jpeg.tif",
        STORED,
        tiff_handmade(
            36, 24, {258: (3, (8, 8, 8)), 259: (3, (6,)), 262: (3, (6,)), 277: (3, (3,))}, pil(p, "JPEG", quality=90)
        ),
    )  # libtiff's OJPEG support reads it
    add(
        "tiff/cmyk16_jpeg.tif",
        UNSUPPORTED,
        tiff_handmade(
            36,
            24,
            {258: (3, (16, 16, 16, 16)), 259: (3, (7,)), 262: (3, (5,)), 277: (3, (4,))},
            pil(p, "JPEG", quality=90),
        ),
        reason="JPEG",
    )

    # WebP
    add("webp/exif_prefixed_orientation_6.webp", STORED, pil(p, "WEBP", lossless=True, exif=exif(6)))
    add("webp/exif_bare_orientation_8.webp", STORED, pil(p, "WEBP", lossless=True, exif=exif(8, prefix=False)))
    add("webp/lossy.webp", STORED, pil(q, "WEBP", quality=80))
    add("webp/alpha.webp", STORED, pil(np.dstack([p, p[..., :1]]), "WEBP", lossless=True, exact=True))
    frames = [Image.fromarray(photo(k)) for k in range(3)]
    buf = io.BytesIO()
    frames[0].save(buf, "WEBP", save_all=True, append_images=frames[1:], lossless=True, duration=100)
    add("webp/animated.webp", STORED, buf.getvalue())

    # BMP
    add("bmp/rgb24.bmp", STORED, pil(p, "BMP"))
    add("bmp/palette8.bmp", STORED, pil(q, "BMP", "P", colors=40))
    add("bmp/one_bit.bmp", STORED, pil(p[..., 0] > 90, "BMP"))
    add("bmp/bitfields32_xrgb.bmp", STORED, bitfield_bmp((0xFF0000, 0xFF00, 0xFF), 32))
    add("bmp/bitfields32_rgbx.bmp", STORED, bitfield_bmp((0xFF000000, 0xFF0000, 0xFF00), 32))
    add("bmp/bitfields32_v5_alpha.bmp", STORED, bitfield_bmp((0xFF0000, 0xFF00, 0xFF), 32, 124, alpha=0xFF000000))
    add("bmp/bitfields16_565.bmp", STORED, bitfield_bmp((0xF800, 0x07E0, 0x001F), 16))
    add("bmp/bitfields16_555.bmp", STORED, bitfield_bmp((0x7C00, 0x03E0, 0x001F), 16))
    add("bmp/bitfields16_565_v4.bmp", STORED, bitfield_bmp((0xF800, 0x07E0, 0x001F), 16, 108))
    rgb555 = (photo(3) >> 3).astype(np.uint16)  # BI_RGB 16-bit: 5-5-5, no masks
    packed = (rgb555[..., 0] << 10) | (rgb555[..., 1] << 5) | rgb555[..., 2]
    add("bmp/rgb16_555_plain.bmp", STORED, bmp_file(bmp_rows(packed, "<u2"), 36, 24, 16))
    good = pil(p, "BMP")
    add("bmp/bad_header_size.bmp", CORRUPT, good[:14] + struct.pack("<I", 41) + good[18:], reason="BMP")
    add("bmp/bad_pixel_offset.bmp", CORRUPT, good[:10] + struct.pack("<I", len(good) + 4000) + good[14:], reason="BMP")

    # broken files
    png = pil(p, "PNG")
    add("broken/truncated.png", CORRUPT, png[: len(png) // 2], reason="truncated PNG")
    jpeg = pil(p, "JPEG", quality=90)
    add("broken/truncated.jpg", CORRUPT, jpeg[: len(jpeg) * 2 // 3], reason="truncated JPEG")
    tif = pil(p, "TIFF")
    add("broken/truncated.tif", CORRUPT, tif[: len(tif) // 2], reason="TIFF")
    add("broken/empty.jpg", CORRUPT, b"", reason="empty file")
    add("broken/not_an_image.png", CORRUPT, b"these are not pixels\n" * 8, reason="not an image")
    bad_crc = bytearray(png)
    at = bad_crc.index(b"IDAT") + 20
    bad_crc[at] ^= 0xFF
    add("broken/bad_idat.png", CORRUPT, bytes(bad_crc), reason="PNG")
    add("broken/bomb.png", BOMB, png_bomb(), reason="30000x30000")
    return tuple(items)


def pil_lab(rgb: np.ndarray) -> np.ndarray:
    """``(H, W, 3) uint8`` CIELab samples (L 0..255, a/b signed as stored by TIFF) of an RGB photo, via Pillow's
    ImageCms sRGB -> LAB transform."""
    from PIL import Image, ImageCms

    transform = ImageCms.buildTransform(ImageCms.createProfile("sRGB"), ImageCms.createProfile("LAB"), "RGB", "LAB")
    return np.asarray(ImageCms.applyTransform(Image.fromarray(rgb), transform))
