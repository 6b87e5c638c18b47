"""Decompression bombs: a small file whose header declares a huge image is refused from its header,
before anything is decoded, naming the file (conversion) or the sample (open, verify, inspect)."""

from __future__ import annotations

import json
import logging
import os
import struct
import subprocess
import sys
import zlib

import numpy as np
import pytest

import ffload
from ffload.convert import convert_dataset
from ffload.convert.images import check_pixels, decode_image_bytes, header_size, load_image
from ffload.convert.sources import ImageFolderSource
from ffload.errors import FormatError, ImageBombError
from ffload.formats import IntField, RGBImageField, open_dataset, write_dataset
from ffload.limits import DEFAULT_MAX_PIXELS

FFLOAD = [sys.executable, "-m", "ffload.cli"]


def _png_bomb(width: int, height: int) -> bytes:
    """A valid-looking gray PNG declaring ``width x height`` with a few bytes of deflate data."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 4096)) + chunk(b"IEND", b"")
    )


def _jpeg_declaring(width: int, height: int) -> bytes:
    import cv2

    data = bytearray(cv2.imencode(".jpg", np.zeros((8, 8, 3), np.uint8))[1].tobytes())
    sof = data.find(b"\xff\xc0")
    data[sof + 5 : sof + 9] = struct.pack(">HH", height, width)
    return bytes(data)


@pytest.mark.parametrize("ext", [".jpg", ".png", ".bmp", ".webp", ".tif"])
def test_header_size_of_every_format_matches_the_image(ext):
    import cv2

    data = cv2.imencode(ext, np.zeros((37, 53, 3), np.uint8))[1].tobytes()
    fmt = {".jpg": "JPEG", ".png": "PNG", ".bmp": "BMP", ".webp": "WebP", ".tif": "TIFF"}[ext]
    assert header_size(data, fmt, "x") == (37, 53)


def test_png_bomb_is_refused_from_its_header_naming_the_file(tmp_path):
    path = tmp_path / "bomb.png"
    path.write_bytes(_png_bomb(30000, 30000))
    with pytest.raises(ImageBombError, match=r"bomb\.png: 30000x30000 image \(900,000,000 pixels\)"):
        load_image(path)


def test_jpeg_bomb_is_refused_and_a_raised_limit_lets_a_small_image_through():
    with pytest.raises(ImageBombError, match="60000x60000"):
        decode_image_bytes(_jpeg_declaring(60000, 60000), "big.jpg")
    assert decode_image_bytes(_jpeg_declaring(8, 8), "ok.jpg", max_pixels=64).shape == (8, 8, 3)
    with pytest.raises(ImageBombError, match="ok.jpg"):
        decode_image_bytes(_jpeg_declaring(8, 8), "ok.jpg", max_pixels=63)


def test_above_half_the_limit_warns_naming_the_file(caplog):
    with caplog.at_level(logging.WARNING, logger="ffload.convert.images"):
        check_pixels(100, 100, 15_000, "large.png")
        check_pixels(100, 100, 20_000, "fine.png")
    assert "large.png: large image, 100x100" in caplog.text and "fine.png" not in caplog.text
    assert DEFAULT_MAX_PIXELS == 2 * 89_478_485  # Pillow's MAX_IMAGE_PIXELS, doubled


def test_convert_refuses_the_bomb_naming_the_file_and_max_pixels_changes_it(tmp_path):
    root = tmp_path / "src"
    (root / "a").mkdir(parents=True)
    (root / "a" / "bomb.png").write_bytes(_png_bomb(30000, 30000))
    import cv2

    cv2.imwrite(str(root / "a" / "ok.png"), np.zeros((40, 40, 3), np.uint8))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    run = subprocess.run(
        [*FFLOAD, "convert", str(root), str(tmp_path / "o.beton"), "--quiet", "--num-workers", "0"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert run.returncode == 1 and "bomb.png" in run.stderr and "30000x30000" in run.stderr, run.stderr
    assert "Traceback" not in run.stderr and not (tmp_path / "o.beton").exists()
    run = subprocess.run(
        [
            *FFLOAD,
            "convert",
            str(root),
            str(tmp_path / "o.beton"),
            "--quiet",
            "--num-workers",
            "0",
            "--on-error",
            "skip",
            "--json",
            "--max-pixels",
            "1600",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)  # ok.png is 40x40 = 1,600 pixels: exactly at the limit, allowed
    assert report["samples"] == 1 and [s["input"] for s in report["skipped"]] == [str(root / "a" / "bomb.png")]


@pytest.mark.parametrize("suffix", [".beton", ".lmdb"])
def test_open_refuses_metadata_declaring_a_huge_image_naming_the_sample(tmp_path, suffix, monkeypatch):
    path = str(tmp_path / f"d{suffix}")
    images = [np.zeros((4, 4, 3), np.uint8) for _ in range(3)]
    write_dataset(path, {"image": RGBImageField("raw"), "label": IntField()}, [(im, 0) for im in images], 3)
    view = open_dataset(path)
    view.metadata["image"]["height"][1] = 60000  # what a hostile header would say
    view.metadata["image"]["width"][1] = 60000
    import ffload.formats as formats

    monkeypatch.setattr(formats, "open_beton", lambda p: view)
    monkeypatch.setattr(formats, "open_lmdb", lambda p: view)
    with pytest.raises(FormatError, match=r"sample 1, field 'image'.*60000x60000"):
        open_dataset(path)
    with pytest.raises(FormatError, match="sample 1"):
        ffload.Loader(path, batch_size=2, num_workers=1)
    assert open_dataset(path, max_pixels=None) is view


def test_verify_and_inspect_refuse_a_beton_whose_metadata_declares_a_huge_image(tmp_path):
    path = str(tmp_path / "d.beton")
    images = [np.zeros((4, 4, 3), np.uint8) for _ in range(3)]
    write_dataset(path, {"image": RGBImageField("raw"), "label": IntField()}, [(im, 0) for im in images], 3)
    view = open_dataset(path)
    # patch the metadata table in the file: find sample 2's (height, width) uint16 pair after the header
    table = view.metadata.tobytes()
    raw = bytearray(open(path, "rb").read())
    at = raw.find(table)
    assert at > 0
    patched = view.metadata.copy()
    patched["image"]["height"][2] = 65535
    patched["image"]["width"][2] = 65535
    raw[at : at + len(table)] = patched.tobytes()
    open(path, "wb").write(bytes(raw))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    for command in (["verify", path, "--quiet"], ["inspect", path, "--grid", str(tmp_path / "g.png")]):
        run = subprocess.run([*FFLOAD, *command], capture_output=True, text=True, env=env, timeout=120)
        assert run.returncode == 1 and "sample 2" in run.stderr and "65535x65535" in run.stderr, run.stderr
        assert "Traceback" not in run.stderr


def test_image_folder_source_passes_its_limit_to_the_decoder(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x.png").write_bytes(_png_bomb(20, 20))
    src = ImageFolderSource(tmp_path, max_pixels=100)
    with pytest.raises(ImageBombError, match="x.png"):
        src[0]
    src.max_pixels = None
    image, label = src[0]
    assert image.shape == (20, 20, 3) and label == 0


def test_convert_max_pixels_reaches_the_encoders_and_pass_through(tmp_path, caplog):
    """``--max-pixels`` is the limit of every image a conversion reads: a 12000x12000 PNG (decoded by the
    encoders) and a 12000x12000 JPEG (stored as it is, never decoded) are refused at 100 Mpx, below the
    default limit; the warning above half of it states the limit in force."""
    root = tmp_path / "src"
    (root / "a").mkdir(parents=True)
    (root / "a" / "big.png").write_bytes(_png_bomb(12000, 12000))
    (root / "a" / "big.jpg").write_bytes(_jpeg_declaring(12000, 12000))
    (root / "a" / "large.png").write_bytes(_png_bomb(8000, 8000))  # 64 Mpx: above half, warned, then corrupt
    import cv2

    cv2.imwrite(str(root / "a" / "ok.png"), np.zeros((40, 40, 3), np.uint8))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    run = subprocess.run(
        [
            *FFLOAD,
            "convert",
            str(root),
            str(tmp_path / "o.beton"),
            "--quiet",
            "--num-workers",
            "0",
            "--on-error",
            "skip",
            "--json",
            "--write-mode",
            "jpg",
            "--max-pixels",
            "100000000",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    skipped = {os.path.basename(s["input"]): s["cause"] for s in json.loads(run.stdout)["skipped"]}
    for name in ("big.png", "big.jpg"):
        assert "12000x12000 image (144,000,000 pixels) exceeds the limit of 100,000,000" in skipped[name], skipped
    assert open_dataset(str(tmp_path / "o.beton")).num_samples == 1  # ok.png (large.png is not a whole PNG)
    with caplog.at_level(logging.WARNING, logger="ffload.convert.images"):
        report = convert_dataset(
            str(root), str(tmp_path / "p.beton"), num_workers=0, on_error="skip", progress=False, max_pixels=100_000_000
        )
    assert sorted(os.path.basename(name) for name, _ in report.skipped) == ["big.jpg", "big.png", "large.png"]
    assert "8000x8000 (64,000,000 pixels; the limit is 100,000,000)" in caplog.text


def test_convert_applies_its_limit_to_a_source_object_without_changing_it(tmp_path):
    (tmp_path / "src" / "a").mkdir(parents=True)
    (tmp_path / "src" / "a" / "x.png").write_bytes(_png_bomb(30, 30))
    import cv2

    cv2.imwrite(str(tmp_path / "src" / "a" / "y.png"), np.zeros((10, 10, 3), np.uint8))
    source = ImageFolderSource(tmp_path / "src", max_pixels=None)
    report = convert_dataset(
        source, str(tmp_path / "o.beton"), num_workers=0, on_error="skip", progress=False, max_pixels=100
    )
    assert [os.path.basename(name) for name, _ in report.skipped] == ["x.png"] and report.samples == 1
    assert "30x30 image (900 pixels) exceeds the limit of 100 pixels" in report.skipped[0][1]
    assert source.max_pixels is None


def _dataset_with_a_jpeg_declaring(path: str, width: int, height: int) -> None:
    """Write three 16x16 JPEG samples (labels 0, 1, 2), then patch sample 1's frame header to declare
    ``width x height``, the metadata still saying 16x16."""
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, (16, 16, 3), dtype=np.uint8) for _ in range(3)]
    write_dataset(
        path, {"image": RGBImageField("jpg"), "label": IntField()}, [(im, i) for i, im in enumerate(images)], 3
    )
    view = open_dataset(path)
    start = int(view.ptrs["image"][1])
    payload = bytes(view.payload("image", 1))
    at = start + payload.find(b"\xff\xc0") + 5
    target = os.path.join(path, "data.mdb") if view.format == "lmdb" else path  # the file the pointers index
    del view
    with open(target, "r+b") as fp:
        fp.seek(at)
        fp.write(struct.pack(">HH", height, width))


@pytest.mark.parametrize("suffix", [".beton", ".lmdb"])
def test_a_stored_jpeg_declaring_a_huge_image_is_one_error_line_naming_the_sample(tmp_path, suffix):
    path = str(tmp_path / f"d{suffix}")
    _dataset_with_a_jpeg_declaring(path, 60000, 60000)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    grid = subprocess.run(
        [*FFLOAD, "inspect", path, "--grid", str(tmp_path / "g.png")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert grid.returncode == 1 and "Traceback" not in grid.stderr, grid.stderr
    assert grid.stderr.strip().splitlines() == [
        f"ffload: error: {path}: field 'image', sample 1: JPEG decodes to 60000x60000, metadata says 16x16"
    ]
    run = subprocess.run([*FFLOAD, "verify", path, "--quiet"], capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == 1 and "Traceback" not in run.stderr, run.stderr
    assert "sample 1, field 'image': JPEG decodes to 60000x60000, metadata says 16x16" in run.stderr
    assert "1 of 3 samples do not decode" in run.stderr


@pytest.mark.parametrize("backend", ["turbojpeg", "opencv"])
def test_the_loader_refuses_a_jpeg_whose_header_disagrees_with_its_metadata(tmp_path, backend, monkeypatch):
    """LoaderError naming the sample, before a buffer is sized from the header: the OpenCV fallback
    never hands it to ``cv2.imdecode`` (which would allocate 60000x60000x3 bytes); the good samples load."""
    import threading

    from ffload.codecs import jpeg
    from ffload.errors import LoaderError

    path = str(tmp_path / "d.beton")
    _dataset_with_a_jpeg_declaring(path, 60000, 60000)
    decoded = []
    if backend == "opencv":
        monkeypatch.setattr(jpeg, "_lib", None)
        monkeypatch.setattr(jpeg, "_local", threading.local())
        monkeypatch.setattr(jpeg, "_warned", [True])
        imdecode = jpeg.cv2.imdecode
        monkeypatch.setattr(
            jpeg.cv2, "imdecode", lambda data, flags: decoded.append(data.size) or imdecode(data, flags)
        )
    with ffload.Loader(path, batch_size=3, num_workers=1, order="sequential") as loader:
        with pytest.raises(
            LoaderError,
            match=r"sample 1, field 'image'.*JPEG decodes to 60000x60000, metadata "
            r"says 16x16",
        ) as caught:
            next(iter(loader))
    assert caught.value.sample_index == 1
    view = open_dataset(path)
    if backend == "opencv":
        assert len(decoded) == 2, decoded  # sample 0 in the batch, then alone; sample 1 never
    with ffload.Loader(path, batch_size=2, num_workers=1, order="sequential", indices=[0, 2]) as loader:
        ((image, label),) = list(loader)
    import cv2

    assert label.tolist() == [0, 2] and view.num_samples == 3
    for k, i in enumerate([0, 2]):  # the stored JPEG's pixels, as OpenCV decodes them
        expected = cv2.cvtColor(cv2.imdecode(np.asarray(view.payload("image", i)), cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)
        assert np.array_equal(image[k].numpy(), expected)
