"""Odd image files (tests/odd_images.py): each is stored with Pillow's pixels (or the documented 16-bit / float
exception), or skipped as unsupported / corrupt / a bomb with an honest reason, and no decoder chatter is printed."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("skimage.data")
pytest.importorskip("tifffile")

from odd_images import BOMB, CORRUPT, STORED, UNSUPPORTED, odd_images, oriented, pillow_rgb, write_odd_corpus  # noqa: E402

from ffload.convert.images import decode_image_bytes  # noqa: E402
from ffload.convert.passthrough import inspect_jpeg  # noqa: E402
from ffload.errors import ImageBombError, ImageDecodeError, ImageUnsupportedError  # noqa: E402
from ffload.formats import open_dataset  # noqa: E402
from ffload.loaders.samples import decode_image  # noqa: E402

ERRORS = {UNSUPPORTED: ImageUnsupportedError, BOMB: ImageBombError}


def expected_pixels(item) -> np.ndarray:
    """What the rule stores for a corpus file: the documented exception, or Pillow's decode."""
    return item.expected if item.expected is not None else pillow_rgb(item.data)


@pytest.mark.parametrize("item", odd_images(), ids=lambda item: item.name)
def test_each_odd_file_decodes_to_the_rule_or_gets_an_honest_reason(item):
    if item.outcome == STORED:
        out = decode_image_bytes(item.data, item.name)
        assert out.dtype == np.uint8 and out.flags.c_contiguous and out.flags.writeable
        np.testing.assert_array_equal(out, expected_pixels(item))
        return
    with pytest.raises(ImageDecodeError) as info:
        decode_image_bytes(item.data, item.name)
    error, message = info.value, str(info.value)
    assert message.startswith(item.name) and item.reason in message, message
    if item.outcome == CORRUPT:  # neither a bomb nor "unsupported": the file is broken
        assert type(error) is ImageDecodeError and "unsupported" not in message, message
    else:
        assert isinstance(error, ERRORS[item.outcome]), message
    if item.outcome == UNSUPPORTED:
        assert f"{item.name}: unsupported: " in message


def test_the_exceptions_differ_from_pillow_only_where_pillow_loses_the_samples():
    """16-bit colour: Pillow keeps the high byte (within 1 of round(v / 257)); 16-bit grey and floats: Pillow
    clips or truncates, so the corpus's exact values are the reference there (asserted above)."""
    for item in odd_images():
        if item.expected is not None and item.name.startswith("png/rgb"):
            assert np.abs(pillow_rgb(item.data).astype(int) - item.expected).max() <= 1, item.name


def test_the_jpeg_fast_path_is_pillows_decode():
    """OpenCV's libjpeg-turbo gives Pillow's pixels on the fast path: qualities, subsamplings, progressive, grey,
    from both encoders (a larger photo than the corpus's, so chroma upsampling edges are many)."""
    import cv2
    from PIL import Image
    from sklearn.datasets import load_sample_images

    photo = load_sample_images().images[1][100:230, 200:371]
    files = []
    for quality in (25, 75, 97):
        for sub in (0, 1, 2):
            for progressive in (False, True):
                buf = io.BytesIO()
                Image.fromarray(photo).save(buf, "JPEG", quality=quality, subsampling=sub, progressive=progressive)
                files.append(buf.getvalue())
        for factor in (
            cv2.IMWRITE_JPEG_SAMPLING_FACTOR_420,
            cv2.IMWRITE_JPEG_SAMPLING_FACTOR_422,
            cv2.IMWRITE_JPEG_SAMPLING_FACTOR_444,
            cv2.IMWRITE_JPEG_SAMPLING_FACTOR_440,
        ):
            files.append(
                cv2.imencode(
                    ".jpg", photo, [cv2.IMWRITE_JPEG_QUALITY, quality, cv2.IMWRITE_JPEG_SAMPLING_FACTOR, factor]
                )[1].tobytes()
            )
        files.append(cv2.imencode(".jpg", photo[..., 0], [cv2.IMWRITE_JPEG_QUALITY, quality])[1].tobytes())
    for k, data in enumerate(files):
        np.testing.assert_array_equal(decode_image_bytes(data, f"f{k}.jpg"), pillow_rgb(data), err_msg=str(k))


@pytest.mark.parametrize("orientation", range(1, 9))
def test_orientation_of_sixteen_bit_files_follows_pillows_transposes(orientation):
    from odd_images import deep, exif, png_chunk, png_file, to8

    data = png_file(deep(4), 2, after=[png_chunk(b"eXIf", exif(orientation, prefix=False))])
    np.testing.assert_array_equal(decode_image_bytes(data, "o.png"), oriented(to8(deep(4)), orientation))
    eight = png_file(np.ascontiguousarray(to8(deep(4))), 2, after=[png_chunk(b"eXIf", exif(orientation, False))])
    np.testing.assert_array_equal(decode_image_bytes(eight, "o8.png"), pillow_rgb(eight))


def test_max_pixels_alone_decides_not_pillows_global_limit(monkeypatch):
    from PIL import Image

    data = next(item.data for item in odd_images() if item.name == "png/rgb.png")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)  # Pillow would refuse this 36x24 image
    assert decode_image_bytes(data, "x.png", max_pixels=None).shape == (24, 36, 3)
    with pytest.raises(ImageBombError, match="36x24"):
        decode_image_bytes(data, "x.png", max_pixels=800)


def test_a_jpeg_pillow_rotates_by_its_xmp_is_not_passed_through():
    data = next(item.data for item in odd_images() if item.name == "jpeg/xmp_orientation_8.jpg")
    assert inspect_jpeg(data, None)[1] == "exif_orientation"
    plain = next(item.data for item in odd_images() if item.name == "jpeg/pil_q90_ss0.jpg")
    assert inspect_jpeg(plain, None)[1] is None


@pytest.mark.parametrize("write_mode", ["raw", "jpg"])
def test_converting_the_corpus_stores_the_rule_and_reports_every_skip_quietly(tmp_path, write_mode):
    """The CLI run a user makes: every file stored with the rule's pixels (raw) or passed through / re-encoded
    (jpg: passed-through JPEGs decode at load time to Pillow's pixels), every other one skipped with its kind of
    reason; stderr holds no OpenCV/libtiff/Pillow chatter."""
    root = tmp_path / "odd"
    outcomes = write_odd_corpus(root)
    dst = tmp_path / "out.beton"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "ffload.cli",
            "convert",
            str(root),
            str(dst),
            "--on-error",
            "skip",
            "--json",
            "--num-workers",
            "1",
            "--write-mode",
            write_mode,
            "--quiet",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    for noise in ("[ WARN", "[ERROR", "TIFF", "JPEG", "Warning", "libpng", "Corrupt"):
        assert noise not in run.stderr, run.stderr
    report = json.loads(run.stdout)
    skipped = {os.path.relpath(s["input"], root).replace(os.sep, "/"): s["cause"] for s in report["skipped"]}
    assert sorted(skipped) == sorted(name for name, outcome in outcomes.items() if outcome != STORED)
    kinds = {UNSUPPORTED: "ImageUnsupportedError: ", BOMB: "ImageBombError: ", CORRUPT: "ImageDecodeError: "}
    for name, cause in skipped.items():
        assert cause.startswith(kinds[outcomes[name]]), (name, cause)
    by_name = {item.name: item for item in odd_images()}
    stored = sorted(name for name, outcome in outcomes.items() if outcome == STORED)  # ImageFolder order
    view = open_dataset(str(dst))
    assert view.num_samples == len(stored)
    for i, name in enumerate(stored):
        got = decode_image(view, "image", i)
        if write_mode == "raw" or inspect_jpeg(by_name[name].data, None)[1] is None:  # raw, or passed through
            np.testing.assert_array_equal(got, expected_pixels(by_name[name]), err_msg=name)
        else:  # re-encoded to JPEG: close to the rule's pixels
            assert np.abs(got.astype(int) - expected_pixels(by_name[name])).mean() < 12, name


def test_threads_decoding_tiffs_leave_stderr_where_it_was():
    """libtiff's messages are captured by pointing file descriptor 2 at a file during a TIFF decode; threads that
    decode TIFFs at once must leave it pointing where it did (not at a closed capture file)."""
    from concurrent.futures import ThreadPoolExecutor

    tiffs = [item for item in odd_images() if item.data[:4] in (b"II*\x00", b"MM\x00*") and item.outcome == STORED]
    before = os.fstat(2)

    def decode_all(_):
        for item in tiffs:
            decode_image_bytes(item.data, item.name)

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(decode_all, range(8)))
    after = os.fstat(2)
    assert (after.st_dev, after.st_ino) == (before.st_dev, before.st_ino)
