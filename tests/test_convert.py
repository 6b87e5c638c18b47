"""`ffload convert` / `convert_dataset`: real data end to end, parallel = serial, and bad input."""

from __future__ import annotations

import errno
import json
import os
import signal
import time

import cv2
import numpy as np
import pytest
from click.testing import CliRunner
from interrupt import start_slow_conversion

from ffload.cli import main
from ffload.convert import ConvertError, convert_dataset
from ffload.convert.sources import ArraySource, ImageFolderSource, IndexableSource, SourceError
from ffload.formats import open_dataset
from ffload.loaders.samples import decode_image


@pytest.fixture(scope="module")
def digits_folder(tmp_path_factory):
    """sklearn's 1797 real digits as an ImageFolder of 3-channel PNGs (classes '0'..'9')."""
    from sklearn.datasets import load_digits

    d = load_digits()
    root = tmp_path_factory.mktemp("digits")
    images, labels = [], []
    for i, (img, label) in enumerate(zip(d.images, d.target)):
        rgb = np.repeat((img * 255 / 16).round().astype(np.uint8)[:, :, None], 3, axis=2)
        rgb[:, :, 0] = 255 - rgb[:, :, 0]  # make channels differ so an RGB/BGR swap would show
        folder = root / str(label)
        folder.mkdir(exist_ok=True)
        cv2.imwrite(str(folder / f"{i:04d}.png"), cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR))
        images.append(rgb)
        labels.append(int(label))
    return root, images, labels


def expected_order(root, images, labels):
    """ImageFolder order: classes sorted, files sorted within a class."""
    entries = sorted((str(lab), f"{i:04d}.png", i) for i, lab in enumerate(labels))
    return [images[i] for _, _, i in entries], [labels[i] for _, _, i in entries]


@pytest.mark.smoke
@pytest.mark.parametrize("suffix", [".beton", ".lmdb"])
def test_digits_folder_round_trip(tmp_path, digits_folder, suffix):
    root, images, labels = digits_folder
    dst = str(tmp_path / f"digits{suffix}")
    result = CliRunner().invoke(main, ["convert", str(root), dst, "--workers", "2", "--quiet"])
    assert result.exit_code == 0, result.output
    assert "samples        1797" in result.output and "classes        10" in result.output
    view = open_dataset(dst)
    exp_images, exp_labels = expected_order(root, images, labels)
    assert view.num_samples == 1797
    np.testing.assert_array_equal(view.metadata["label"], exp_labels)
    region = view.open_region()
    for i in range(view.num_samples):
        np.testing.assert_array_equal(decode_image(view, "image", i, region), exp_images[i])


@pytest.mark.smoke
def test_parallel_output_is_identical_to_serial(tmp_path, digits_folder):
    root = digits_folder[0]
    a, b = str(tmp_path / "a.beton"), str(tmp_path / "b.beton")
    convert_dataset(str(root), a, write_mode="jpg", num_workers=0, progress=False)
    convert_dataset(str(root), b, write_mode="jpg", num_workers=2, chunk_size=7, progress=False)
    with open(a, "rb") as fa, open(b, "rb") as fb:
        assert fa.read() == fb.read()


def _split_folder(root):
    """SRC/train and SRC/test ImageFolders of real photos (PNG, lossless), 40x30 and 30x40 pixels.

    Returns ``{split: [(label, RGB image), ...]}`` in ImageFolder order."""
    from skimage import data

    photos = [data.astronaut(), data.chelsea(), data.coffee(), data.rocket()]
    layout = {"train": {"cat": [0, 1, 2], "dog": [3, 0]}, "test": {"cat": [1], "dog": [2, 3]}}
    expected = {}
    for split, classes in layout.items():
        expected[split] = []
        for label, (cls, picks) in enumerate(sorted(classes.items())):
            (root / split / cls).mkdir(parents=True)
            for k, p in enumerate(picks):
                size = (40, 30) if k % 2 == 0 else (30, 40)  # (width, height): landscape, portrait
                rgb = cv2.resize(photos[p], size, interpolation=cv2.INTER_AREA)
                cv2.imwrite(str(root / split / cls / f"{k}.png"), cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR))
                expected[split].append((label, rgb))
    return expected


def test_cli_convert_options_reach_the_file(tmp_path):
    """--write-mode, --jpeg-quality, --max-resolution, --page-size and --split all take effect."""
    expected = _split_folder(tmp_path / "src")
    for split, samples in expected.items():
        dst = tmp_path / f"{split}.beton"
        r = run_cli(
            "convert",
            tmp_path / "src",
            dst,
            "--split",
            split,
            "--write-mode",
            "jpg",
            "--jpeg-quality",
            "70",
            "--max-resolution",
            "16",
            "--page-size",
            4194304,
            "--workers",
            "0",
            "--quiet",
        )
        assert r.exit_code == 0, r.output
        view = open_dataset(str(dst))
        assert view.num_samples == len(samples)
        assert view.page_size == 4194304
        meta = view.metadata["image"]
        assert meta["mode"].tolist() == [0] * len(samples)  # all JPEG
        assert view.metadata["label"].tolist() == [label for label, _ in samples]
        for i, (_, rgb) in enumerate(samples):
            h, w = rgb.shape[:2]
            small_size = (16, 12) if w > h else (12, 16)  # FFCV's truncated sizes, (width, height)
            assert (int(meta["width"][i]), int(meta["height"][i])) == small_size
            small = cv2.resize(rgb, small_size, interpolation=cv2.INTER_AREA)
            ok, ref = cv2.imencode(".jpg", cv2.cvtColor(small, cv2.COLOR_RGB2BGR), [int(cv2.IMWRITE_JPEG_QUALITY), 70])
            assert ok
            np.testing.assert_array_equal(np.asarray(view.payload("image", i)), ref.reshape(-1))


def _proportion_images():
    rng = np.random.default_rng(5)
    return rng.integers(0, 255, (64, 6, 5, 3), dtype=np.uint8), rng.integers(0, 3, 64)


def test_proportion_mode_is_reproducible(tmp_path):
    """write_mode='proportion' draws JPEG or raw from the sample index: the same file whatever the
    number of workers, and the same pattern for other images."""
    imgs, labels = _proportion_images()
    a, b, c = (str(tmp_path / n) for n in ("a.beton", "b.beton", "c.beton"))
    convert_dataset(
        ArraySource(imgs, labels), a, write_mode="proportion", compress_probability=0.5, num_workers=0, progress=False
    )
    convert_dataset(
        ArraySource(imgs, labels),
        b,
        write_mode="proportion",
        compress_probability=0.5,
        num_workers=2,
        chunk_size=5,
        progress=False,
    )
    with open(a, "rb") as fa, open(b, "rb") as fb:
        assert fa.read() == fb.read()
    modes = open_dataset(a).metadata["image"]["mode"]
    assert 0 < (modes == 0).sum() < len(modes)  # both modes occur
    other = 255 - imgs[:, ::-1]  # different pixels, same indices
    convert_dataset(
        ArraySource(other, labels),
        c,
        write_mode="proportion",
        compress_probability=0.5,
        num_workers=2,
        chunk_size=3,
        progress=False,
    )
    np.testing.assert_array_equal(open_dataset(c).metadata["image"]["mode"], modes)


def test_arrays_and_indexable_sources(tmp_path):
    rng = np.random.default_rng(0)
    imgs = rng.integers(0, 255, (20, 12, 10, 3), dtype=np.uint8)
    labels = rng.integers(0, 4, 20)
    r1 = convert_dataset(ArraySource(imgs, labels), str(tmp_path / "a.lmdb"), progress=False, num_workers=2)
    assert r1.samples == 20 and r1.label_counts.tolist() == np.bincount(labels, minlength=4).tolist()

    class Pairs:  # any indexable of (image, label); grayscale images become RGB
        def __len__(self):
            return 5

        def __getitem__(self, i):
            return imgs[i, :, :, 0], int(labels[i])

    convert_dataset(IndexableSource(Pairs()), str(tmp_path / "b.beton"), progress=False)
    view = open_dataset(str(tmp_path / "b.beton"))
    for i in range(5):
        np.testing.assert_array_equal(decode_image(view, "image", i), np.repeat(imgs[i, :, :, :1], 3, axis=2))


# ---- bad input ------------------------------------------------------------------------------


def run_cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_missing_or_empty_source(tmp_path):
    r = run_cli("convert", tmp_path / "nope", tmp_path / "x.beton")
    assert r.exit_code != 0 and "nope" in r.output and "no such" in r.output.lower()
    (tmp_path / "empty").mkdir()
    r = run_cli("convert", tmp_path / "empty", tmp_path / "x.beton")
    assert r.exit_code != 0 and "empty" in r.output
    (tmp_path / "c" / "cat").mkdir(parents=True)
    (tmp_path / "c" / "dog").mkdir(parents=True)
    cv2.imwrite(str(tmp_path / "c" / "dog" / "a.png"), np.zeros((4, 4, 3), np.uint8))
    r = run_cli("convert", tmp_path / "c", tmp_path / "x.beton")
    assert r.exit_code != 0 and "cat" in r.output
    assert not (tmp_path / "x.beton").exists()


def bad_files_folder(tmp_path):
    root = tmp_path / "src"
    good = np.random.default_rng(0).integers(0, 255, (16, 16, 3), dtype=np.uint8)
    for cls in ("a", "b"):
        (root / cls).mkdir(parents=True)
        for k in range(3):
            cv2.imwrite(str(root / cls / f"good{k}.png"), good)
    ok, jpg = cv2.imencode(".jpg", good)
    (root / "a" / "truncated.jpg").write_bytes(jpg.tobytes()[: len(jpg) // 2])
    (root / "b" / "empty.png").write_bytes(b"")
    (root / "b" / "notes.jpeg").write_bytes(b"this is not an image")
    return root


def test_bad_files_fail_with_path(tmp_path):
    root = bad_files_folder(tmp_path)
    dst = tmp_path / "out.beton"
    r = run_cli("convert", root, dst, "--quiet", "--workers", "2")
    assert r.exit_code != 0
    assert "truncated.jpg" in r.output  # the first bad file in source order, with its path
    assert not dst.exists()
    assert os.listdir(tmp_path) == ["src"]  # no stray temporary file


@pytest.mark.parametrize("suffix", [".beton", ".lmdb"])
def test_bad_files_skipped_and_listed(tmp_path, suffix):
    root = bad_files_folder(tmp_path)
    dst = tmp_path / f"out{suffix}"
    r = run_cli("convert", root, dst, "--quiet", "--on-error", "skip", "--json")
    assert r.exit_code == 0, r.output
    report = json.loads(r.output)
    assert report["samples"] == 6
    skipped = {os.path.basename(s["input"]): s["cause"] for s in report["skipped"]}
    assert set(skipped) == {"truncated.jpg", "empty.png", "notes.jpeg"}
    assert all(skipped.values())
    view = open_dataset(str(dst))
    assert view.num_samples == 6
    assert view.metadata["label"].tolist() == [0, 0, 0, 1, 1, 1]


def test_existing_destination_needs_overwrite(tmp_path, digits_folder):
    root = digits_folder[0]
    dst = tmp_path / "d.beton"
    dst.write_bytes(b"precious")
    r = run_cli("convert", root, dst, "--quiet")
    assert r.exit_code != 0 and "already exists" in r.output
    assert dst.read_bytes() == b"precious"
    r = run_cli("convert", root, dst, "--quiet", "--overwrite")
    assert r.exit_code == 0, r.output
    assert open_dataset(str(dst)).num_samples == 1797


def _lmdb_disk_full():
    import lmdb

    return lmdb.DiskError("mdb_txn_commit", errno.ENOSPC)  # py-lmdb's class for ENOSPC


@pytest.mark.parametrize(
    "suffix,error",
    [
        (".beton", lambda: OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))),
        (".lmdb", lambda: OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))),
        (".lmdb", _lmdb_disk_full),
    ],
)
def test_full_disk_leaves_nothing(tmp_path, monkeypatch, suffix, error):
    from ffload.formats import beton
    from ffload.formats.lmdb import writer as lmdb_writer

    calls = {"n": 0}
    cls = beton.BetonWriter if suffix == ".beton" else lmdb_writer.LMDBWriter
    original = cls.add

    def add(self, *args):
        calls["n"] += 1
        if calls["n"] == 5:
            raise error()
        return original(self, *args)

    monkeypatch.setattr(cls, "add", add)
    rng = np.random.default_rng(0)
    src = ArraySource(rng.integers(0, 255, (10, 8, 8, 3), dtype=np.uint8), np.arange(10))
    with pytest.raises(ConvertError, match="no space left"):
        convert_dataset(src, str(tmp_path / f"out{suffix}"), progress=False, num_workers=0)
    assert os.listdir(tmp_path) == []


def test_ctrl_c_leaves_no_output(tmp_path):
    """SIGINT in the middle of a conversion: no destination and no temporary file remain."""
    proc = start_slow_conversion(tmp_path / "out.beton", "np.zeros((8, 8, 3), np.uint8)")
    time.sleep(0.3)
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=30)
    assert proc.returncode != 0
    assert os.listdir(tmp_path) == []


def test_inspect_reports_and_refuses(tmp_path, digits_folder):
    root = digits_folder[0]
    dst = tmp_path / "d.lmdb"
    assert run_cli("convert", root, dst, "--quiet").exit_code == 0
    r = run_cli("inspect", dst, "--json", "--grid", tmp_path / "grid.png")
    assert r.exit_code == 0, r.output
    info = json.loads(r.output)
    assert info["samples"] == 1797 and info["classes"] == 10
    assert sum(info["histogram"].values()) == 1797
    assert [f["name"] for f in info["fields"]] == ["image", "label"]
    assert cv2.imread(str(tmp_path / "grid.png")) is not None
    text = run_cli("inspect", dst)
    assert text.exit_code == 0 and "RGBImageField" in text.output
    junk = tmp_path / "junk.beton"
    junk.write_bytes(os.urandom(5000))
    r = run_cli("inspect", junk)
    assert r.exit_code != 0 and "junk.beton" in r.output
    with open(tmp_path / "cut.beton", "wb") as f:  # a truncated copy of a real .beton
        convert_dataset(str(root), str(tmp_path / "full.beton"), progress=False)
        data = (tmp_path / "full.beton").read_bytes()
        f.write(data[: len(data) // 3])
    r = run_cli("inspect", tmp_path / "cut.beton")
    assert r.exit_code != 0 and "truncated" in r.output


@pytest.mark.parametrize("suffix", [".beton", ".lmdb"])
def test_class_names_are_stored_and_inspected(tmp_path, suffix):
    root = tmp_path / "src"
    for k, name in enumerate(["zebra", "aardvark", "mole"]):  # sorted: aardvark 0, mole 1, zebra 2
        (root / name).mkdir(parents=True)
        for i in range(k + 1):
            cv2.imwrite(str(root / name / f"{i}.png"), np.full((8, 8, 3), 40 * k, np.uint8))
    dst = tmp_path / f"d{suffix}"
    assert run_cli("convert", root, dst, "--quiet").exit_code == 0
    assert open_dataset(str(dst)).info == {
        "classes": ["aardvark", "mole", "zebra"],
        "origin": {"source": "imagefolder", "id": "path"},
    }
    info = json.loads(run_cli("inspect", dst, "--json").output)
    assert info["class_names"] == ["aardvark", "mole", "zebra"] and info["histogram"] == {"0": 2, "1": 3, "2": 1}
    lines = run_cli("inspect", dst).output.splitlines()
    assert any(line.split()[:3] == ["1", "mole", "3"] for line in lines), lines
    no_names = convert_dataset(
        ArraySource(np.zeros((2, 4, 4, 3), np.uint8), [0, 1]), str(tmp_path / f"a{suffix}"), progress=False
    )
    assert open_dataset(no_names.dst).info == {  # no class names; the origins are sample numbers
        "origin": {"source": "ArraySource", "id": "index", "int": True}
    }


def test_source_errors_raise_before_writing(tmp_path):
    with pytest.raises(SourceError):
        ImageFolderSource(str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="suffix"):
        convert_dataset(ArraySource(np.zeros((1, 2, 2, 3), np.uint8), [0]), str(tmp_path / "x.zip"))


@pytest.mark.parametrize("suffix", [".beton", ".lmdb"])
def test_verify_finds_corrupt_jpeg(tmp_path, digits_folder, suffix):
    from ffload.formats import RGBImageField, write_dataset

    imgs = digits_folder[1][:6]
    dst = tmp_path / f"j{suffix}"
    write_dataset(str(dst), {"image": RGBImageField("jpg")}, [(im,) for im in imgs], 6)
    r = run_cli("verify", dst, "--quiet")
    assert r.exit_code == 0 and "all 6 samples decode" in r.output
    view = open_dataset(str(dst))
    p, n = int(view.ptrs["image"][4]), int(view.sizes["image"][4])
    data_file = view.data_path
    with open(data_file, "r+b") as f:  # wipe the entropy-coded data and the markers of sample 4
        f.seek(p + 2)
        f.write(b"\0" * (n - 2))
    r = run_cli("verify", dst, "--quiet")
    assert r.exit_code != 0
    assert "sample 4, field 'image'" in r.output and "1 of 6 samples" in r.output


def test_verify_decodes_with_the_loaders_decoder_and_lists_every_bad_sample(tmp_path, monkeypatch):
    from ffload.formats import JSONField, RGBImageField, write_dataset
    from ffload.loaders.decoders.rgb import SimpleRGBImageDecoder
    from ffload.verify import verify_dataset

    rng = np.random.default_rng(3)
    images = [rng.integers(0, 255, (8 + i % 3, 20 - i % 3, 3), dtype=np.uint8) for i in range(9)]  # 3 sizes
    dst = str(tmp_path / "mixed.beton")
    write_dataset(
        dst,
        {"image": RGBImageField("proportion"), "doc": JSONField()},
        [(im, {"i": i}) for i, im in enumerate(images)],
        9,
    )
    view = open_dataset(dst)
    assert verify_dataset(view, num_workers=2) == []
    assert set(view.metadata["image"]["mode"]) == {0, 1}  # raw and JPEG samples, of several sizes
    seen = []
    original = SimpleRGBImageDecoder.__call__

    def call(self, src, dst, ctx):  # the loader's default image decoder, made to fail on 2 and 6
        seen.extend(int(i) for i in ctx.indices)
        if {2, 6} & set(ctx.indices.tolist()):
            raise ValueError("planted failure")
        return original(self, src, dst, ctx)

    monkeypatch.setattr(SimpleRGBImageDecoder, "__call__", call)
    problems = verify_dataset(view, num_workers=1)
    assert set(seen) == set(range(9))
    assert problems == [(2, "image", "planted failure"), (6, "image", "planted failure")]


@pytest.mark.parametrize(
    "option,value",
    [
        ("on_error", "ignore"),
        ("engine", "spark"),
        ("num_workers", -1),
        ("chunk_size", 0),
        ("max_pixels", 0),
        ("checkpoint_seconds", -1.0),
        ("write_mode", "png"),
        ("jpeg_quality", 101),
        ("shard_size", "1 parsec"),
        ("fields", {"image": "RGBImageField"}),
    ],
)
def test_a_bad_option_is_refused_naming_it(tmp_path, option, value):
    from ffload.convert import ConvertOptions
    from ffload.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match=option.replace("_", "[_ ]")):
        ConvertOptions(**{option: value})
    with pytest.raises(ConfigurationError, match=option.replace("_", "[_ ]")):
        convert_dataset(
            ArraySource(np.zeros((1, 2, 2, 3), np.uint8), [0]),
            str(tmp_path / "x.beton"),
            progress=False,
            **{option: value},
        )
    assert os.listdir(tmp_path) == []


def test_options_object_and_keywords_write_the_same_bytes(tmp_path):
    import dataclasses

    from ffload.convert import ConvertOptions

    rng = np.random.default_rng(3)
    source = ArraySource(rng.integers(0, 256, (6, 12, 10, 3), dtype=np.uint8), np.arange(6) % 2)
    options = ConvertOptions(
        write_mode="proportion", compress_probability=0.5, jpeg_quality=70, num_workers=0, progress=False, chunk_size=2
    )
    convert_dataset(
        source,
        str(tmp_path / "k.beton"),
        write_mode="proportion",
        compress_probability=0.5,
        jpeg_quality=70,
        num_workers=0,
        progress=False,
        chunk_size=2,
    )
    convert_dataset(source, str(tmp_path / "o.beton"), options=options)
    assert (tmp_path / "k.beton").read_bytes() == (tmp_path / "o.beton").read_bytes()
    # keywords given with options= replace its fields; the options object stays as it was
    other = convert_dataset(source, str(tmp_path / "q.beton"), options=options, jpeg_quality=20)
    assert other.samples == 6 and options.jpeg_quality == 70
    assert (tmp_path / "q.beton").read_bytes() != (tmp_path / "o.beton").read_bytes()
    assert ConvertOptions(**options.as_keywords()) == options
    assert ConvertOptions(shard_size="1GB").shard_size == 10**9
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.jpeg_quality = 10
    with pytest.raises(TypeError, match="quality"):
        convert_dataset(source, str(tmp_path / "t.beton"), quality=90)
    assert not (tmp_path / "t.beton").exists()
