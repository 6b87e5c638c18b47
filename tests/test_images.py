"""ffload.convert.images: files written with Pillow (a test-only dependency) decode to the pixels a viewer shows."""

from __future__ import annotations

import io

import cv2
import numpy as np
import pytest

from ffload.convert.images import (
    IMAGE_EXTENSIONS,
    ImageDecodeError,
    decode_image_bytes,
    has_image_extension,
    load_image,
    to_rgb_uint8,
)

Image = pytest.importorskip("PIL.Image")
skdata = pytest.importorskip("skimage.data")


@pytest.fixture(scope="module")
def photo():
    """A real (96, 128, 3) uint8 RGB photo crop (non-square, so transposes are visible)."""
    return np.ascontiguousarray(skdata.astronaut()[100:196, 150:278])


def encode(image, fmt, **kw) -> bytes:
    buf = io.BytesIO()
    image.save(buf, fmt, **kw)
    return buf.getvalue()


def write(tmp_path, name, data: bytes):
    path = tmp_path / name
    path.write_bytes(data)
    return path


# -- lossless formats are pixel exact ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fmt,ext,kw",
    [
        ("PNG", "png", {}),
        ("BMP", "bmp", {}),
        ("TIFF", "tif", {}),
        ("TIFF", "tiff", {"compression": "tiff_lzw"}),
        ("TIFF", "TIF", {"compression": "tiff_adobe_deflate"}),
        ("WEBP", "webp", {"lossless": True}),
    ],
)
def test_lossless_rgb_is_pixel_exact(tmp_path, photo, fmt, ext, kw):
    path = write(tmp_path, f"img.{ext}", encode(Image.fromarray(photo), fmt, **kw))
    out = load_image(path)
    assert out.dtype == np.uint8 and out.shape == photo.shape and out.flags.c_contiguous
    np.testing.assert_array_equal(out, photo)


@pytest.mark.parametrize("progressive", [False, True])
def test_jpeg_matches_reference_decoder(tmp_path, photo, progressive):
    data = encode(Image.fromarray(photo), "JPEG", quality=90, progressive=progressive)
    out = load_image(write(tmp_path, "img.jpg", data))
    reference = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    assert out.shape == photo.shape
    assert np.abs(out.astype(int) - reference).max() <= 1  # same libjpeg-turbo family
    assert np.abs(out.astype(int) - photo).mean() < 4  # and close to what was encoded


def test_format_comes_from_content_not_extension(tmp_path, photo):
    path = write(tmp_path, "actually_a_png.jpg", encode(Image.fromarray(photo), "PNG"))
    np.testing.assert_array_equal(load_image(path), photo)


def test_jpeg_with_trailing_bytes_after_eoi_decodes(photo):
    data = encode(Image.fromarray(photo), "JPEG", quality=95) + b"\x00" * 100 + b"trailing"
    reference = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    assert np.abs(decode_image_bytes(data, "x").astype(int) - reference).max() <= 1


# -- orientation --------------------------------------------------------------------------------------------------


def oriented(a, orientation):
    """What a viewer shows for a stored array ``a`` and EXIF/TIFF orientation 1-8 (TIFF 6.0 / EXIF 2.3 tables)."""
    return {
        1: a,
        2: a[:, ::-1],  # mirrored horizontally
        3: a[::-1, ::-1],  # rotated 180
        4: a[::-1],  # mirrored vertically
        5: a.transpose(1, 0, 2),  # transposed
        6: np.rot90(a, -1),  # rotated 90 clockwise
        7: a[::-1, ::-1].transpose(1, 0, 2),  # transversed
        8: np.rot90(a, 1),  # rotated 90 counter-clockwise
    }[orientation]


def exif_with_orientation(orientation) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = orientation
    return exif.tobytes()


@pytest.mark.parametrize("orientation", range(1, 9))
def test_jpeg_exif_orientation(photo, orientation):
    plain = encode(Image.fromarray(photo), "JPEG", quality=95)
    tagged = encode(Image.fromarray(photo), "JPEG", quality=95, exif=exif_with_orientation(orientation))
    out = decode_image_bytes(tagged, "tagged.jpg")
    np.testing.assert_array_equal(out, oriented(decode_image_bytes(plain, "plain.jpg"), orientation))
    assert out.flags.c_contiguous


@pytest.mark.parametrize("orientation", [3, 6, 8])
@pytest.mark.parametrize("fmt", ["PNG", "WEBP", "TIFF"])
def test_lossless_orientation_is_exact(photo, fmt, orientation):
    if fmt == "TIFF":
        kw = {"tiffinfo": {274: orientation}}
    else:
        kw = {"exif": exif_with_orientation(orientation), **({"lossless": True} if fmt == "WEBP" else {})}
    out = decode_image_bytes(encode(Image.fromarray(photo), fmt, **kw), f"img.{fmt}")
    np.testing.assert_array_equal(out, oriented(photo, orientation))


# -- channel layouts ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["PNG", "BMP", "TIFF"])
def test_gray_is_replicated(photo, fmt):
    gray = photo[..., 1]
    out = decode_image_bytes(encode(Image.fromarray(gray), fmt), f"gray.{fmt}")
    np.testing.assert_array_equal(out, np.repeat(gray[..., None], 3, axis=2))


def test_gray_jpeg_is_replicated(photo):
    gray = photo[..., 0]
    data = encode(Image.fromarray(gray), "JPEG", quality=95)
    out = decode_image_bytes(data, "gray.jpg")
    assert np.array_equal(out[..., 0], out[..., 1]) and np.array_equal(out[..., 0], out[..., 2])
    assert np.abs(out[..., 0].astype(int) - np.asarray(Image.open(io.BytesIO(data)))).max() <= 1


def test_one_bit_png_is_black_and_white(photo):
    mask = photo[..., 0] > 128
    out = decode_image_bytes(encode(Image.fromarray(mask), "PNG"), "mask.png")
    np.testing.assert_array_equal(out, np.repeat(np.where(mask, 255, 0).astype(np.uint8)[..., None], 3, axis=2))


def alpha_channel(photo):
    """An alpha plane with fully transparent, half and opaque regions."""
    alpha = np.full(photo.shape[:2], 255, np.uint8)
    alpha[:20] = 0
    alpha[20:50] = photo[20:50, :, 2] // 2 + 1
    return alpha


def test_gray_alpha_png_drops_alpha(photo):
    gray = photo[..., 0]
    image = Image.merge("LA", [Image.fromarray(gray), Image.fromarray(alpha_channel(photo))])
    out = decode_image_bytes(encode(image, "PNG"), "la.png")
    np.testing.assert_array_equal(out, np.repeat(gray[..., None], 3, axis=2))


@pytest.mark.parametrize("fmt,kw", [("PNG", {}), ("WEBP", {"lossless": True, "exact": True})])
def test_rgba_drops_alpha_without_compositing(photo, fmt, kw):
    rgba = np.dstack([photo, alpha_channel(photo)])
    out = decode_image_bytes(encode(Image.fromarray(rgba, "RGBA"), fmt, **kw), f"rgba.{fmt}")
    np.testing.assert_array_equal(out, photo)  # transparent pixels keep their colour: no compositing


def test_rgba_tiff_undoes_libtiff_premultiplication(photo):
    alpha = np.full(photo.shape[:2], 255, np.uint8)
    alpha[:40] = 64 + photo[:40, :, 2] // 2  # alpha in [64, 191]
    out = decode_image_bytes(encode(Image.fromarray(np.dstack([photo, alpha]), "RGBA"), "TIFF"), "rgba.tif")
    np.testing.assert_array_equal(out[40:], photo[40:])  # opaque: exact
    bound = 255.0 / (2 * alpha[:40, :, None].astype(float)) + 1
    assert (np.abs(out[:40].astype(int) - photo[:40]) <= bound).all()


@pytest.mark.parametrize("fmt", ["PNG", "BMP", "TIFF"])
def test_palette_is_expanded(photo, fmt):
    image = Image.fromarray(photo).convert("P", palette=Image.Palette.ADAPTIVE, colors=64)
    palette = np.array(image.getpalette(), np.uint8).reshape(-1, 3)
    expected = palette[np.asarray(image)]
    out = decode_image_bytes(encode(image, fmt), f"palette.{fmt}")
    np.testing.assert_array_equal(out, expected)


def test_palette_with_transparency_keeps_colours(photo):
    image = Image.fromarray(photo).convert("P", palette=Image.Palette.ADAPTIVE, colors=32)
    palette = np.array(image.getpalette(), np.uint8).reshape(-1, 3)
    out = decode_image_bytes(encode(image, "PNG", transparency=5), "trns.png")
    np.testing.assert_array_equal(out, palette[np.asarray(image)])


def sixteen_bit_values(shape, seed=0):
    """uint16 samples including the rounding edges of round(v / 257): 128 -> 0, 129 -> 1, 385 -> 1, 386 -> 2."""
    values = np.random.default_rng(seed).integers(0, 65536, shape, dtype=np.uint16)
    edges = np.array([0, 128, 129, 385, 386, 32767, 32768, 65406, 65407, 65535], np.uint16)
    values.reshape(-1)[: len(edges)] = edges
    return values


def test_sixteen_bit_gray_png_and_tiff(tmp_path):
    gray = sixteen_bit_values((40, 56))
    expected = np.repeat(np.round(gray / 257.0).astype(np.uint8)[..., None], 3, axis=2)
    assert list(expected[0, :10, 0]) == [0, 0, 1, 1, 2, 127, 128, 254, 255, 255]
    for fmt in ("PNG", "TIFF"):
        np.testing.assert_array_equal(decode_image_bytes(encode(Image.fromarray(gray), fmt), f"g16.{fmt}"), expected)


@pytest.mark.parametrize("ext", [".png", ".tiff"])
@pytest.mark.parametrize("with_alpha", [False, True])
def test_sixteen_bit_rgb(ext, with_alpha):
    rgb = sixteen_bit_values((40, 56, 3), seed=1)
    stored = np.dstack([rgb, sixteen_bit_values((40, 56, 1), seed=2)]) if with_alpha else rgb
    order = [2, 1, 0, 3] if with_alpha else [2, 1, 0]  # Pillow cannot write 16-bit RGB; OpenCV wants BGR(A)
    ok, buf = cv2.imencode(ext, np.ascontiguousarray(stored[..., order]))
    assert ok
    np.testing.assert_array_equal(
        decode_image_bytes(buf.tobytes(), f"rgb16{ext}"), np.round(rgb / 257.0).astype(np.uint8)
    )


def test_float_tiff_in_unit_range():
    values = np.random.default_rng(3).random((30, 40), dtype=np.float32)
    values[0, :3] = [0.0, 1.0, 0.5]
    out = decode_image_bytes(encode(Image.fromarray(values), "TIFF"), "f.tif")
    np.testing.assert_array_equal(out, np.repeat(np.rint(values * 255.0).astype(np.uint8)[..., None], 3, axis=2))


def cmyk_values():
    return np.random.default_rng(4).integers(0, 256, (40, 48, 4), dtype=np.uint8)


def cmyk_formula(cmyk):
    """Pillow's CMYK -> RGB: R = (255 - C) * (255 - K) / 255."""
    return np.rint((255.0 - cmyk[..., :3]) * (255.0 - cmyk[..., 3:]) / 255.0)


def test_cmyk_tiff():
    cmyk = cmyk_values()
    out = decode_image_bytes(encode(Image.fromarray(cmyk, "CMYK"), "TIFF"), "cmyk.tif")
    assert np.abs(out - cmyk_formula(cmyk)).max() <= 1


def test_cmyk_jpeg(photo):
    cmyk = np.dstack([255 - photo, photo[..., :1] // 3]).astype(np.uint8)
    data = encode(Image.fromarray(cmyk, "CMYK"), "JPEG", quality=95)  # Adobe-inverted CMYK, as Photoshop writes
    out = decode_image_bytes(data, "cmyk.jpg")
    reference = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    assert out.shape == photo.shape
    assert np.abs(out.astype(int) - reference).max() <= 2
    assert np.abs(out - cmyk_formula(cmyk)).mean() < 3


# -- errors -------------------------------------------------------------------------------------------------------


def assert_decode_error(path, *fragments):
    with pytest.raises(ImageDecodeError) as info:
        load_image(path)
    message = str(info.value)
    assert str(path) in message
    for fragment in fragments:
        assert fragment in message, message


def test_zero_byte_file(tmp_path):
    assert_decode_error(write(tmp_path, "empty.jpg", b""), "empty file")


def test_missing_file(tmp_path):
    assert_decode_error(tmp_path / "nope.png", "cannot read")


def test_not_an_image(tmp_path):
    assert_decode_error(write(tmp_path, "notes.png", b"these are not pixels\n" * 10), "not an image")


@pytest.mark.parametrize("fmt", ["GIF", "PPM"])
def test_unsupported_format(tmp_path, photo, fmt):
    assert_decode_error(write(tmp_path, "img.png", encode(Image.fromarray(photo), fmt)), "unsupported image format")


@pytest.mark.parametrize("progressive", [False, True])
def test_truncated_jpeg(tmp_path, photo, progressive):
    data = encode(Image.fromarray(photo), "JPEG", quality=90, progressive=progressive)
    for cut in (len(data) // 3, len(data) * 2 // 3, len(data) - 2, len(data) - 1):
        assert_decode_error(write(tmp_path, f"cut{cut}.jpg", data[:cut]), "truncated JPEG")
    assert_decode_error(write(tmp_path, "header.jpg", data[:100]), "truncated JPEG")


def test_truncated_jpeg_with_end_marker_in_header(tmp_path, photo):
    """An FF D9 inside a header segment (as in an EXIF thumbnail) must not pass for the end of the image."""
    data = encode(Image.fromarray(photo), "JPEG", quality=90)
    payload = b"\xff\xd8 thumbnail \xff\xd9"
    comment = b"\xff\xfe" + (len(payload) + 2).to_bytes(2, "big") + payload
    with_comment = data[:2] + comment + data[2:]
    assert np.abs(decode_image_bytes(with_comment, "ok.jpg").astype(int) - decode_image_bytes(data, "x")).max() == 0
    assert_decode_error(write(tmp_path, "cut.jpg", with_comment[: len(with_comment) * 3 // 4]), "truncated JPEG")


def test_truncated_png(tmp_path, photo):
    data = encode(Image.fromarray(photo), "PNG")
    for cut in (20, len(data) // 2, len(data) - 12, len(data) - 1):
        assert_decode_error(write(tmp_path, f"cut{cut}.png", data[:cut]), "truncated PNG")


@pytest.mark.parametrize("fmt,kw", [("BMP", {}), ("TIFF", {}), ("WEBP", {"quality": 90})])
def test_truncated_other_formats(tmp_path, photo, fmt, kw):
    data = encode(Image.fromarray(photo), fmt, **kw)
    for cut in (len(data) // 2, len(data) - 1):
        assert_decode_error(write(tmp_path, f"cut{cut}.{fmt.lower()}", data[:cut]), "corrupt or truncated")


def test_corrupt_jpeg_header(tmp_path, photo):
    data = bytearray(encode(Image.fromarray(photo), "JPEG", quality=90))
    sof = data.index(b"\xff\xc0")  # SOF0: FF C0, length (2), precision, height (2), width (2), components
    data[sof + 9] = 0  # zero colour components: structurally complete, but not decodable
    assert_decode_error(write(tmp_path, "corrupt.jpg", bytes(data)), "corrupt or truncated JPEG")


# -- in-memory arrays ---------------------------------------------------------------------------------------------


def test_to_rgb_uint8_layouts(photo):
    gray = photo[..., 0]
    rgb = to_rgb_uint8(photo, "rgb")
    assert rgb.dtype == np.uint8 and np.shares_memory(rgb, photo)
    np.testing.assert_array_equal(rgb, photo)
    expected_gray = np.repeat(gray[..., None], 3, axis=2)
    np.testing.assert_array_equal(to_rgb_uint8(gray, "g"), expected_gray)
    np.testing.assert_array_equal(to_rgb_uint8(gray[..., None], "g1"), expected_gray)
    np.testing.assert_array_equal(to_rgb_uint8(np.dstack([gray, gray // 2]), "la"), expected_gray)
    out = to_rgb_uint8(np.dstack([photo, np.zeros_like(gray)]), "rgba")
    np.testing.assert_array_equal(out, photo)
    assert out.flags.c_contiguous
    np.testing.assert_array_equal(to_rgb_uint8(photo[:, ::-1], "flipped"), photo[:, ::-1])
    assert to_rgb_uint8(photo[:, ::-1], "flipped").flags.c_contiguous


def test_to_rgb_uint8_sample_types(photo):
    mask = photo[..., 0] > 100
    np.testing.assert_array_equal(to_rgb_uint8(mask, "b")[..., 1], np.where(mask, 255, 0))
    wide = sixteen_bit_values((10, 12, 3))
    np.testing.assert_array_equal(to_rgb_uint8(wide, "u16"), np.round(wide / 257.0))
    np.testing.assert_array_equal(to_rgb_uint8(wide.astype(">u2"), "u16be"), np.round(wide / 257.0))
    unit = np.random.default_rng(5).random((10, 12, 3))
    for dtype in (np.float16, np.float32, np.float64):
        values = unit.astype(dtype)
        np.testing.assert_array_equal(to_rgb_uint8(values, "f"), np.rint(values.astype(np.float64) * 255))


@pytest.mark.parametrize(
    "array,fragment",
    [
        (np.zeros((4, 4, 5), np.uint8), "shape"),
        (np.zeros(16, np.uint8), "shape"),
        (np.zeros((0, 4, 3), np.uint8), "empty image"),
        (np.zeros((4, 4, 3), np.int32), "unsupported: sample type int32"),
        (np.full((4, 4), 1.5), "[0, 1]"),
        (np.full((4, 4), -0.1, np.float32), "[0, 1]"),
        (np.full((4, 4), np.nan), "NaN"),
    ],
)
def test_to_rgb_uint8_rejects(array, fragment):
    from ffload.convert.images import ImageUnsupportedError

    with pytest.raises(ImageDecodeError, match="sample 7 of toy") as info:
        to_rgb_uint8(array, "sample 7 of toy")
    assert fragment in str(info.value)
    assert isinstance(info.value, ImageUnsupportedError) == ("unsupported" in fragment or fragment in ("[0, 1]", "NaN"))


def test_image_extensions():
    assert set(IMAGE_EXTENSIONS) == {".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff"}
    for name in ("a.jpg", "b.JPEG", "c.Png", "d.bmp", "e.WebP", "f.TIF", "g.tiff", "dir.x/h.jpg"):
        assert has_image_extension(name)
    for name in ("a.gif", "b.txt", "jpg", "c.jpg.bak", "d.pngx"):
        assert not has_image_extension(name)


# -- decoding from threads ------------------------------------------------------------------------------------------


def test_decoding_from_threads_leaves_python_warnings_working(photo):
    import warnings
    from concurrent.futures import ThreadPoolExecutor

    data = encode(Image.fromarray(photo), "PNG")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        filters = list(warnings.filters)
        with ThreadPoolExecutor(8) as pool:
            for out in pool.map(lambda k: decode_image_bytes(data, f"t{k}.png"), range(400)):
                np.testing.assert_array_equal(out, photo)
        assert warnings.filters == filters
        warnings.warn("after the threads", UserWarning, stacklevel=1)
    assert [str(w.message) for w in seen] == ["after the threads"]  # delivered where warnings went before


def _tiff_with_far_tag(image) -> bytes:
    """A little-endian TIFF of ``image`` with private tag 65000 (10 LONGs) whose values lie far past the file."""
    from PIL import TiffImagePlugin

    ifd = TiffImagePlugin.ImageFileDirectory_v2()
    ifd[65000] = tuple(range(10))
    ifd.tagtype[65000] = 4
    data = bytearray(encode(image, "TIFF", tiffinfo=ifd))
    first = int.from_bytes(data[4:8], "little")
    for k in range(int.from_bytes(data[first : first + 2], "little")):
        at = first + 2 + 12 * k
        if int.from_bytes(data[at : at + 2], "little") == 65000:
            data[at + 8 : at + 12] = (0x7FFFFF00).to_bytes(4, "little")
            return bytes(data)
    raise AssertionError("tag 65000 not written")


def test_tiff_with_an_unrelated_tag_past_the_end_is_decoded(photo, caplog):
    import logging

    data = _tiff_with_far_tag(Image.fromarray(photo))
    with caplog.at_level(logging.DEBUG, logger="ffload.convert.images"):
        out = decode_image_bytes(data, "far.tif")
    assert "far.tif: decoder messages: UserWarning: Truncated File Read" in caplog.text  # Pillow's, captured
    np.testing.assert_array_equal(out, np.asarray(Image.open(io.BytesIO(data)).convert("RGB")))
    np.testing.assert_array_equal(out, photo)
    wide = _tiff_with_far_tag(Image.fromarray(sixteen_bit_values((40, 56))))  # the tifffile path reads tags too
    np.testing.assert_array_equal(
        decode_image_bytes(wide, "far16.tif")[..., 0], np.round(sixteen_bit_values((40, 56)) / 257.0)
    )


def _tiff(array, **kw) -> bytes:
    import tifffile

    buf = io.BytesIO()
    tifffile.imwrite(buf, array, **kw)
    return buf.getvalue()


@pytest.mark.parametrize("planar", [None, "separate"])
def test_sixteen_bit_cmyk_tiff_is_stored_by_pillows_formula_on_exact_samples(planar):
    cmyk = np.random.default_rng(6).integers(0, 65536, (20, 30, 4), dtype=np.uint16)
    cmyk[0, :3] = [[0, 0, 0, 0], [65535, 65535, 65535, 0], [0, 0, 0, 65535]]
    data = _tiff(np.moveaxis(cmyk, -1, 0) if planar else cmyk, photometric="separated", planarconfig=planar)
    m = 65535
    ink = (m - cmyk[..., :3].astype(np.uint64)) * (m - cmyk[..., 3:].astype(np.uint64))
    expected = ((2 * 255 * ink + m * m) // (2 * m * m)).astype(np.uint8)  # round(255 (M-C)(M-K) / M^2)
    out = decode_image_bytes(data, "cmyk16.tif")
    np.testing.assert_array_equal(out, expected)
    assert out[0, :3].tolist() == [[255, 255, 255], [0, 0, 0], [0, 0, 0]]
    if planar is None:  # Pillow keeps the high byte of each ink: within 2 levels
        assert np.abs(out.astype(int) - np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))).max() <= 2


def test_sixty_four_bit_integer_tiff_is_unsupported_not_overflowed():
    from ffload.convert.images import ImageUnsupportedError

    values = np.full((8, 10), 2**63, np.uint64)
    with pytest.raises(ImageUnsupportedError, match=r"w64\.tif: unsupported: 64-bit unsigned integer samples"):
        decode_image_bytes(_tiff(values), "w64.tif")


def test_out_of_memory_is_not_reported_as_a_corrupt_file(photo, monkeypatch):
    import ffload.convert.images._decode as images

    def no_memory(*args):
        raise MemoryError

    monkeypatch.setattr(images, "_pillow", no_memory)
    with pytest.raises(MemoryError):
        decode_image_bytes(encode(Image.fromarray(photo), "PNG"), "big.png")


def test_wide_samples_are_scaled_in_row_blocks():
    import tracemalloc

    rgb = sixteen_bit_values((1500, 1000, 3), seed=7)  # 9 MB of samples; a uint64 copy would be 36 MB
    data = _tiff(rgb)
    tracemalloc.start()
    try:
        out = decode_image_bytes(data, "big16.tif")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    np.testing.assert_array_equal(out, np.round(rgb / 257.0).astype(np.uint8))
    assert peak < 2 * rgb.nbytes + out.nbytes + 8 * 2**20, peak  # the file, the samples, the output, blocks
