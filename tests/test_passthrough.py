"""JPEG pass-through at conversion: source JPEG bytes stored as they are when the write mode allows."""

from __future__ import annotations

import json
import shutil
import struct

import cv2
import numpy as np
import pytest
from click.testing import CliRunner

from ffload.cli import main
from ffload.codecs import turbojpeg as tj
from ffload.convert import ConvertError, convert_dataset
from ffload.convert.passthrough import decode_problem, inspect_jpeg, read_jpeg_header, strip_jpeg_metadata
from ffload.convert.sources import ArraySource, ImageFolderSource
from ffload.formats import open_dataset
from ffload.formats.fields.image import JPG, RAW
from ffload.loaders.samples import decode_image


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """The demo photos: 3-channel JPEGs, grayscale JPEGs (class 'camera') and PNGs."""
    from ffload.convert.demo_data import build_photos_folder

    root = tmp_path_factory.mktemp("pt") / "photos"
    build_photos_folder(root, n_per_class=4)
    return root


def exif_segment(orientation: int) -> bytes:
    """An APP1 Exif segment whose IFD0 holds one Orientation (SHORT) entry, little-endian TIFF."""
    tiff = b"II*\0" + struct.pack("<I", 8) + struct.pack("<H", 1)
    tiff += struct.pack("<HHIHH", 0x0112, 3, 1, orientation, 0) + struct.pack("<I", 0)
    payload = b"Exif\0\0" + tiff
    return b"\xff\xe1" + struct.pack(">H", len(payload) + 2) + payload


def with_segment(jpeg: bytes, segment: bytes) -> bytes:
    return jpeg[:2] + segment + jpeg[2:]


def payload(view, region, i) -> bytes:
    p, n = int(view.ptrs["image"][i]), int(view.sizes["image"][i])
    return region[p : p + n].tobytes()


def source_kind(data: bytes) -> str:
    """'jpeg3' for a 3-channel JPEG, else 'other'."""
    header = read_jpeg_header(data) if data.startswith(b"\xff\xd8") else None
    return "jpeg3" if header is not None and header.components == 3 else "other"


@pytest.mark.parametrize("suffix", [".beton", ".lmdb"])
def test_passed_through_bytes_and_pixels_equal_the_source(tmp_path, photos, suffix):
    src = ImageFolderSource(photos)
    files = [src.encoded(i) for i in range(len(src))]
    kinds = [source_kind(d) for d in files]
    dst = str(tmp_path / f"out{suffix}")
    report = convert_dataset(src, dst, write_mode="jpg", num_workers=2, progress=False)
    assert report.passed_through == kinds.count("jpeg3") > 0
    assert report.reencoded == {"not_3_channel": 3, "not_jpeg": len(src) // 4}  # camera: gray
    view = open_dataset(dst)
    region = view.open_region()
    for i, (data, kind) in enumerate(zip(files, kinds)):
        assert view.metadata["image"]["mode"][i] == JPG
        stored = payload(view, region, i)
        if kind != "jpeg3":
            assert stored != data
            continue
        assert stored == data  # bit-identical
        expected = cv2.cvtColor(cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)
        assert (view.metadata["image"]["height"][i], view.metadata["image"]["width"][i]) == expected.shape[:2]
        np.testing.assert_array_equal(decode_image(view, "image", i, region), expected)


def test_reencode_forces_decode_and_encode(tmp_path, photos):
    src = ImageFolderSource(photos)
    report = convert_dataset(
        src, str(tmp_path / "r.beton"), write_mode="jpg", num_workers=0, progress=False, reencode=True
    )
    assert report.passed_through == 0
    assert report.reencoded == {"reencode_requested": len(src)}
    view = open_dataset(str(tmp_path / "r.beton"))
    region = view.open_region()
    assert all(payload(view, region, i) != src.encoded(i) for i in range(len(src)))


def test_raw_and_smart_modes(tmp_path, photos):
    src = ImageFolderSource(photos)
    raw = convert_dataset(src, str(tmp_path / "raw.beton"), write_mode="raw", num_workers=0, progress=False)
    assert raw.passed_through == 0 and raw.reencoded == {}
    sizes = [read_jpeg_header(src.encoded(i)) for i in range(len(src))]
    threshold = int(np.median([h.width * h.height * 3 for h in sizes if h is not None]))
    smart = convert_dataset(
        src, str(tmp_path / "smart.beton"), write_mode="smart", smart_threshold=threshold, num_workers=0, progress=False
    )
    view = open_dataset(str(tmp_path / "smart.beton"))
    region = view.open_region()
    kept = 0
    for i, h in enumerate(sizes):
        big = h is not None and h.width * h.height * 3 > threshold
        if big and h.components == 3:
            assert view.metadata["image"]["mode"][i] == JPG and payload(view, region, i) == src.encoded(i)
            kept += 1
        elif h is not None and not big:
            assert view.metadata["image"]["mode"][i] == RAW
    assert smart.passed_through == kept > 0


def test_exif_orientation_max_resolution_and_stripping(tmp_path, photos):
    src = ImageFolderSource(photos)
    jpeg = next(d for d in map(src.encoded, range(len(src))) if source_kind(d) == "jpeg3")
    h = read_jpeg_header(jpeg)
    root = tmp_path / "folder"
    (root / "a").mkdir(parents=True)
    (root / "a" / "0_plain.jpg").write_bytes(jpeg)
    (root / "a" / "1_upright.jpg").write_bytes(with_segment(jpeg, exif_segment(1)))
    (root / "a" / "2_rotated.jpg").write_bytes(with_segment(jpeg, exif_segment(6)))
    report = convert_dataset(
        ImageFolderSource(root), str(tmp_path / "o.beton"), write_mode="jpg", num_workers=0, progress=False
    )
    assert report.passed_through == 2 and report.reencoded == {"exif_orientation": 1}
    view = open_dataset(str(tmp_path / "o.beton"))
    assert (view.metadata["image"]["width"][2], view.metadata["image"]["height"][2]) == (h.height, h.width)

    small = convert_dataset(
        ImageFolderSource(root),
        str(tmp_path / "s.beton"),
        write_mode="jpg",
        num_workers=0,
        progress=False,
        max_resolution=max(h.width, h.height) - 1,
    )
    assert small.passed_through == 0 and small.reencoded == {"exif_orientation": 1, "max_resolution": 2}

    stripped = convert_dataset(
        ImageFolderSource(root),
        str(tmp_path / "x.beton"),
        write_mode="jpg",
        num_workers=0,
        progress=False,
        strip_metadata=True,
    )
    assert stripped.passed_through == 2
    view = open_dataset(str(tmp_path / "x.beton"))
    region = view.open_region()
    assert payload(view, region, 1) == payload(view, region, 0) == strip_jpeg_metadata(jpeg, h)
    assert b"Exif" not in payload(view, region, 1)
    np.testing.assert_array_equal(decode_image(view, "image", 1, region), decode_image(view, "image", 0, region))


def test_header_checks():
    rgb = np.random.default_rng(0).integers(0, 256, (40, 60, 3), np.uint8)
    ok, base = cv2.imencode(".jpg", rgb)
    base = base.tobytes()
    assert inspect_jpeg(base, None)[1] is None
    assert inspect_jpeg(base, 59)[1] == "max_resolution"
    assert inspect_jpeg(base[:-200], None)[1] == "jpeg_header"  # no end-of-image marker
    assert inspect_jpeg(b"\x89PNG\r\n\x1a\n", None)[1] == "not_jpeg"
    ok, gray = cv2.imencode(".jpg", rgb[..., 0])
    assert inspect_jpeg(gray.tobytes(), None)[1] == "not_3_channel"
    ok, progressive = cv2.imencode(".jpg", rgb, [cv2.IMWRITE_JPEG_PROGRESSIVE, 1])
    assert read_jpeg_header(progressive.tobytes()).frame == 0xC2
    assert inspect_jpeg(progressive.tobytes(), None)[1] is None
    lossless = bytearray(base)
    lossless[base.index(b"\xff\xc0") + 1] = 0xC3
    assert inspect_jpeg(bytes(lossless), None)[1] == "jpeg_coding"
    assert inspect_jpeg(with_segment(base, exif_segment(3)), None)[1] == "exif_orientation"
    broken_exif = b"\xff\xe1\x00\x0cExif\0\0MM\0\0"
    assert inspect_jpeg(with_segment(base, broken_exif), None)[1] == "exif_orientation"


def test_truncated_jpeg_still_fails_by_name(tmp_path, photos):
    src = ImageFolderSource(photos)
    jpeg = next(d for d in map(src.encoded, range(len(src))) if source_kind(d) == "jpeg3")
    (tmp_path / "f" / "a").mkdir(parents=True)
    bad = tmp_path / "f" / "a" / "cut.jpg"
    bad.write_bytes(jpeg[: len(jpeg) // 2])
    with pytest.raises(ConvertError, match="cut.jpg.*truncated JPEG"):
        convert_dataset(
            ImageFolderSource(tmp_path / "f"),
            str(tmp_path / "o.beton"),
            write_mode="jpg",
            num_workers=0,
            progress=False,
        )


def test_verify_reencodes_a_jpeg_the_decoder_warns_about(tmp_path, photos):
    src = ImageFolderSource(photos)
    jpeg = next(d for d in map(src.encoded, range(len(src))) if source_kind(d) == "jpeg3")
    sos = jpeg.index(b"\xff\xda")
    damaged = jpeg[: sos + 400] + jpeg[sos + 400 : -2][: len(jpeg) // 3] + b"\xff\xd9"  # scan cut short
    (tmp_path / "f" / "a").mkdir(parents=True)
    (tmp_path / "f" / "a" / "0.jpg").write_bytes(jpeg)
    (tmp_path / "f" / "a" / "1.jpg").write_bytes(damaged)
    folder = ImageFolderSource(tmp_path / "f")
    plain = convert_dataset(folder, str(tmp_path / "p.beton"), write_mode="jpg", num_workers=0, progress=False)
    assert plain.passed_through == 2
    checked = convert_dataset(
        folder, str(tmp_path / "v.beton"), write_mode="jpg", num_workers=0, progress=False, verify=True
    )
    assert checked.passed_through == 1 and checked.reencoded == {"decode_warning": 1}
    view = open_dataset(str(tmp_path / "v.beton"))
    decode_image(view, "image", 1)  # the re-encoded image loads


def test_in_memory_sources_are_reencoded(tmp_path):
    images = np.random.default_rng(1).integers(0, 256, (3, 16, 16, 3), np.uint8)
    report = convert_dataset(
        ArraySource(images, np.arange(3)), str(tmp_path / "a.beton"), write_mode="jpg", num_workers=0, progress=False
    )
    assert report.passed_through == 0 and report.reencoded == {"no_source_bytes": 3}


def test_cli_reports_pass_through(tmp_path, photos):
    root = tmp_path / "copy"
    shutil.copytree(photos, root)
    out = CliRunner().invoke(
        main,
        [
            "convert",
            str(root),
            str(tmp_path / "c.beton"),
            "--write-mode",
            "jpg",
            "--num-workers",
            "0",
            "--quiet",
            "--json",
            "--strip-metadata",
            "--verify",
        ],
    )
    assert out.exit_code == 0, out.output
    summary = json.loads(out.output)
    n = summary["samples"]
    assert summary["passed_through"] + summary["reencoded"] == n
    assert summary["reencode_reasons"] == {"not_3_channel": 3, "not_jpeg": n // 4}
    text = CliRunner().invoke(
        main,
        [
            "convert",
            str(root),
            str(tmp_path / "d.beton"),
            "--write-mode",
            "jpg",
            "--num-workers",
            "0",
            "--quiet",
            "--reencode",
        ],
    )
    assert text.exit_code == 0, text.output
    assert "JPEG kept      0" in text.output and f"reencode_requested: {n}" in text.output


def test_webdataset_members_pass_through(tmp_path, photos):
    import io
    import tarfile

    from ffload.convert.sources import detect_source

    src = ImageFolderSource(photos)
    jpegs = [d for d in map(src.encoded, range(len(src))) if source_kind(d) == "jpeg3"][:5]
    with tarfile.open(tmp_path / "train-000000.tar", "w") as tar:
        for k, blob in enumerate(jpegs):
            for name, data in ((f"{k:04d}.jpg", blob), (f"{k:04d}.cls", str(k % 2).encode())):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    shards = detect_source(str(tmp_path / "train-000000.tar"))
    report = convert_dataset(shards, str(tmp_path / "w.beton"), write_mode="jpg", num_workers=0, progress=False)
    assert report.passed_through == len(jpegs) and report.reencoded == {}
    view = open_dataset(str(tmp_path / "w.beton"))
    region = view.open_region()
    assert [payload(view, region, i) for i in range(len(jpegs))] == jpegs
    np.testing.assert_array_equal(view.metadata["label"], [k % 2 for k in range(len(jpegs))])


@pytest.mark.skipif(tj.library() is None, reason="needs the TurboJPEG 3 library")
def test_a_jpeg_libjpeg_turbo_refuses_does_not_spoil_the_next_ones():
    """libjpeg-turbo 3.0 fails every call on a handle whose header read failed: after a file
    it refuses, the next good JPEG on the same thread still passes through and verifies."""
    good = cv2.imencode(".jpg", np.full((20, 30, 3), 90, np.uint8))[1].tobytes()
    header = read_jpeg_header(good)
    bad = b"\xff\xd8\xff\xc0\x00\x11\x08" + bytes(60)  # a frame header of a 0x0 image
    for _ in range(2):
        assert decode_problem(bad, header, "bad.jpg")
        assert decode_problem(good, header, "good.jpg") is None
        assert inspect_jpeg(good, None) == (header, None)
