"""ffload.convert.demo_data and the fixture scripts: structure, counts and real pixels."""

from __future__ import annotations

import collections
import importlib.util
import os

import cv2
import numpy as np
import pytest

from ffload.convert.demo_data import (
    PHOTO_CLASSES,
    _load_photos,
    _random_view,
    build_digits_folder,
    build_photos_folder,
    digits_images,
)
from ffload.convert.images import decode_image_bytes, load_image
from ffload.convert.sources import ImageFolderSource
from ffload.convert.sources.cifar import CIFARSource

sklearn_datasets = pytest.importorskip("sklearn.datasets")
pytest.importorskip("skimage.data")

SCRIPTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts")


@pytest.fixture(scope="module")
def digits():
    return sklearn_datasets.load_digits()


def blocky(digit_8x8, factor):
    """The expected upscaled digit: each of the 64 gray levels round(v * 255 / 16) as a factor x factor block."""
    gray = np.rint(digit_8x8 * 255.0 / 16.0).astype(np.uint8)
    return np.repeat(np.kron(gray, np.ones((factor, factor), np.uint8))[..., None], 3, axis=2)


def split_files(root):
    """{split: {digit: sorted file names}}."""
    return {
        split: {
            d: sorted(os.listdir(os.path.join(root, split, d))) for d in sorted(os.listdir(os.path.join(root, split)))
        }
        for split in ("train", "test")
    }


def test_digits_folder_structure_counts_and_pixels(tmp_path, digits):
    root = tmp_path / "digits"
    summary = build_digits_folder(root, size=32, test_fraction=0.2, seed=0)
    files = split_files(root)
    assert sorted(os.listdir(root)) == ["test", "train"]
    per_class = np.bincount(digits.target)
    seen = []
    for d in range(10):
        train, test = files["train"][str(d)], files["test"][str(d)]
        assert len(test) == round(per_class[d] * 0.2) == summary["test_per_class"][str(d)]
        assert len(train) + len(test) == per_class[d] == summary["train_per_class"][str(d)] + len(test)
        indices = [int(name[:-4]) for name in train + test]
        assert all(digits.target[k] == d for k in indices)
        seen += indices
    assert sorted(seen) == list(range(len(digits.target)))  # every digit once, in one split
    assert summary["num_train"] + summary["num_test"] == len(digits.target)
    for split in ("train", "test"):
        for d in range(10):
            for name in files[split][str(d)][::25]:
                image = load_image(root / split / str(d) / name)
                np.testing.assert_array_equal(image, blocky(digits.images[int(name[:-4])], 4))
    src = ImageFolderSource(root / "train")
    assert src.classes == [str(d) for d in range(10)] and len(src) == summary["num_train"]
    np.testing.assert_array_equal(
        src.labels, [digits.target[int(os.path.basename(src.describe(i))[:-4])] for i in range(len(src))]
    )


def test_digits_split_is_seeded(tmp_path):
    build_digits_folder(tmp_path / "a", size=8, seed=3)
    build_digits_folder(tmp_path / "b", size=8, seed=3)
    build_digits_folder(tmp_path / "c", size=8, seed=4)
    assert split_files(tmp_path / "a") == split_files(tmp_path / "b")
    assert split_files(tmp_path / "a")["test"] != split_files(tmp_path / "c")["test"]


def test_digits_images_other_size(digits):
    images, labels = digits_images(size=24)
    assert images.shape == (len(digits.target), 24, 24, 3) and images.dtype == np.uint8
    np.testing.assert_array_equal(labels, digits.target)
    np.testing.assert_array_equal(images[100], blocky(digits.images[100], 3))


def test_digits_argument_errors(tmp_path):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("x")
    with pytest.raises(FileExistsError, match="not empty"):
        build_digits_folder(tmp_path / "full")
    with pytest.raises(ValueError, match="test_fraction"):
        build_digits_folder(tmp_path / "new", test_fraction=1.0)
    with pytest.raises(ValueError, match="size"):
        digits_images(size=4)


def test_photos_folder(tmp_path):
    root = tmp_path / "photos"
    summary = build_photos_folder(root, n_per_class=4, seed=0)
    assert sorted(os.listdir(root)) == sorted(PHOTO_CLASSES) == summary["classes"]
    assert summary["num_images"] == 4 * len(PHOTO_CLASSES)
    assert summary["num_png"] == len(PHOTO_CLASSES) and summary["num_jpeg"] == 3 * len(PHOTO_CLASSES)
    photos = _load_photos()
    for c, name in enumerate(PHOTO_CLASSES):
        files = sorted(os.listdir(root / name))
        assert files == [f"{name}_0000.JPEG", f"{name}_0001.JPEG", f"{name}_0002.JPEG", f"{name}_0003.png"]
        rng = np.random.default_rng([0, c])  # the documented per-class stream
        for file in files:
            image = load_image(root / name / file)
            view = _random_view(photos[name], rng)
            expected = np.repeat(view[..., None], 3, axis=2) if view.ndim == 2 else view
            assert image.shape == expected.shape and 300 <= max(image.shape[:2]) <= 500
            if file.endswith(".png"):
                np.testing.assert_array_equal(image, expected)
            else:  # the view as a quality-90 JPEG
                bgr = view[..., ::-1] if view.ndim == 3 else view
                ok, jpeg = cv2.imencode(".jpg", np.ascontiguousarray(bgr), [cv2.IMWRITE_JPEG_QUALITY, 90])
                np.testing.assert_array_equal(image, decode_image_bytes(jpeg.tobytes(), file))
                assert np.abs(image.astype(int) - expected).mean() < 6
            is_gray = np.array_equal(image[..., 0], image[..., 1]) and np.array_equal(image[..., 1], image[..., 2])
            assert is_gray == (name == "camera")
    src = ImageFolderSource(root)
    assert src.classes == sorted(PHOTO_CLASSES) and len(src) == summary["num_images"]


def test_photos_folder_is_deterministic(tmp_path):
    build_photos_folder(tmp_path / "a", n_per_class=2, seed=7)
    build_photos_folder(tmp_path / "b", n_per_class=2, seed=7)
    for name in PHOTO_CLASSES:
        for file in os.listdir(tmp_path / "a" / name):
            assert (tmp_path / "a" / name / file).read_bytes() == (tmp_path / "b" / name / file).read_bytes()


def load_script(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(SCRIPTS, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_make_demo_data_script(tmp_path, capsys):
    main = load_script("make_demo_data").main
    assert main([str(tmp_path), "--digits-size", "16", "--photos-per-class", "1"]) == 0
    assert "num_train" in capsys.readouterr().out
    assert len(ImageFolderSource(tmp_path / "digits" / "test")) == 359
    assert len(ImageFolderSource(tmp_path / "photos")) == len(PHOTO_CLASSES)
    assert load_image(tmp_path / "digits" / "train" / "0" / "0000.png").shape == (16, 16, 3)
    assert main([str(tmp_path)]) == 1  # refuses to write into non-empty folders
    assert "not empty" in capsys.readouterr().err


@pytest.mark.parametrize("variant", ["cifar10", "cifar100"])
def test_make_cifar_like_script(tmp_path, digits, variant):
    out = tmp_path / variant
    assert load_script("make_cifar_like").main([str(out), "--variant", variant]) == 0
    train, test = CIFARSource(out, train=True), CIFARSource(out, train=False)
    assert (len(train), len(test)) == (1438, 359) and train.variant == variant
    got = collections.Counter()
    for src in (train, test):
        for i in range(len(src)):
            image, label = src[i]
            got[(image[::4, ::4, 0].tobytes(), label)] += 1
    wanted = collections.Counter(
        (np.rint(d * 255.0 / 16.0).astype(np.uint8).tobytes(), int(t)) for d, t in zip(digits.images, digits.target)
    )
    assert got == wanted  # every real digit exactly once, with its label
    if variant == "cifar100":
        coarse = CIFARSource(out, label_kind="coarse")
        np.testing.assert_array_equal(coarse.labels, train.labels % 2)
        assert coarse.classes == ["even", "odd"]
