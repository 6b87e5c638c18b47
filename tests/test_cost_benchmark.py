"""The vanilla baseline loader and scripts/cost_benchmark.py (a tiny CPU run of all 3 loaders)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from cifar_fixture import write_cifar10_folder
from click.testing import CliRunner
from PIL import Image
from sklearn.datasets import load_digits

from ffload.recipes.data import CIFAR_MEAN, CIFAR_STD
from ffload.recipes.vanilla import ImageFolderDataset, VanillaLoader, augment, write_image_folder

ROOT = Path(__file__).resolve().parent.parent
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def load_script():
    spec = importlib.util.spec_from_file_location("cost_benchmark", ROOT / "scripts" / "cost_benchmark.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def digits_rgb32(n):
    """``(n, 32, 32, 3) uint8`` scikit-learn digits (4x upscaled, channels tinted) and labels."""
    d = load_digits()
    gray = np.kron(d.images[:n], np.ones((4, 4))) * 15
    return (gray[..., None] * np.array([1.0, 0.8, 0.6])).astype(np.uint8), d.target[:n]


# --------------------------------------------------------------------------- augmentation


def test_augment_is_a_flip_translate_and_cutout_of_the_image():
    rng = np.random.default_rng(0)
    image = rng.integers(0, 200, size=(10, 12, 3), dtype=np.uint8)
    fill = np.array([250, 251, 252], dtype=np.uint8)
    pad, crop = 2, 3
    seen_offsets, seen_flips = set(), set()
    for seed in range(100):
        out = augment(image, np.random.default_rng(seed), pad, crop, fill)
        assert out.shape == image.shape and out.dtype == np.uint8
        matches = []
        for flip in (False, True):
            src = image[:, ::-1] if flip else image
            padded = np.empty((14, 16, 3), np.uint8)
            padded[:] = fill
            padded[2:12, 2:14] = src
            for y in range(2 * pad + 1):
                for x in range(2 * pad + 1):
                    window = padded[y : y + 10, x : x + 12]
                    for cy in range(10 - crop + 1):
                        for cx in range(12 - crop + 1):
                            expected = window.copy()
                            expected[cy : cy + crop, cx : cx + crop] = fill
                            if np.array_equal(out, expected):
                                matches.append((flip, y, x))
        assert matches, f"seed {seed}: not a flip/translate/cutout of the image"
        seen_flips.add(matches[0][0])
        seen_offsets.add(matches[0][1:])
    assert seen_flips == {False, True}
    assert len(seen_offsets) > 15  # of the 25 translations


def test_augment_without_translate_and_cutout_is_identity_or_mirror():
    image = np.arange(4 * 5 * 3, dtype=np.uint8).reshape(4, 5, 3)
    for seed in range(10):
        out = augment(image, np.random.default_rng(seed), 0, 0, (0, 0, 0))
        assert np.array_equal(out, image) or np.array_equal(out, image[:, ::-1])


# ------------------------------------------------------------------- dataset and loader


def test_image_folder_round_trip_and_normalisation(tmp_path):
    images, _ = digits_rgb32(24)
    # 12 classes, two images each: folder names must sort in label order ('02' < '10'); every
    # class folder holds images (an empty one is an error, as for torchvision's ImageFolder)
    labels = np.arange(24) % 12
    n = write_image_folder(list(zip(images, labels)), tmp_path / "f", num_classes=12)
    assert n == 24
    ds = ImageFolderDataset(tmp_path / "f", CIFAR_MEAN, CIFAR_STD, train=False)
    assert ds.classes == [f"{c:02d}" for c in range(12)]
    mean = np.array(CIFAR_MEAN, np.float32)
    std = np.array(CIFAR_STD, np.float32)
    for path, label in ds.samples:
        i = int(Path(path).stem)
        assert label == labels[i]
        x, y = ds[ds.samples.index((path, label))]
        assert y == labels[i] and x.shape == (3, 32, 32) and x.dtype == torch.float32
        ref = (images[i].astype(np.float32) - mean) / std
        np.testing.assert_allclose(x.permute(1, 2, 0).numpy(), ref, rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="label 12"):
        write_image_folder([(images[0], 12)], tmp_path / "g", num_classes=12)


def test_image_folder_dataset_lists_the_folder_as_convert_does(tmp_path):
    """One ImageFolder in the project: nested folders and upper-case extensions are read, hidden
    and non-image files skipped, as ``ImageFolderSource`` (what ``ffload convert`` reads) does."""
    images, _ = digits_rgb32(3)
    root = tmp_path / "f"
    (root / "a" / "nested").mkdir(parents=True)
    (root / "b").mkdir()
    files = [root / "a" / "0.png", root / "a" / "nested" / "1.PNG", root / "b" / "2.png"]
    for image, path in zip(images, files):
        Image.fromarray(image).save(path, format="PNG")
    Image.fromarray(images[0]).save(root / "b" / ".hidden.png")
    (root / "b" / "notes.txt").write_text("not an image")
    ds = ImageFolderDataset(root, (0, 0, 0), (1, 1, 1), train=False)
    assert ds.classes == ["a", "b"]
    assert ds.samples == [(str(files[0]), 0), (str(files[1]), 0), (str(files[2]), 1)]
    for i, image in enumerate(images):
        x, _ = ds[i]
        assert np.array_equal(x.permute(1, 2, 0).numpy(), image.astype(np.float32))
    (root / "c").mkdir()  # a class folder without images: named in the error
    with pytest.raises(ValueError, match="'c'"):
        ImageFolderDataset(root, (0, 0, 0), (1, 1, 1), train=False)


def test_vanilla_loader_batches_do_not_depend_on_workers(tmp_path):
    images, labels = digits_rgb32(40)
    write_image_folder(list(zip(images, labels)), tmp_path / "f", num_classes=10)

    def epochs(workers):
        loader = VanillaLoader(
            tmp_path / "f", 16, workers, torch.device("cpu"), train=True, mean=CIFAR_MEAN, std=CIFAR_STD, seed=3
        )
        assert len(loader) == 2  # 40 // 16, last partial batch dropped
        return [[(x.clone(), y.clone()) for x, y in loader] for _ in range(2)]

    inline, workers = epochs(0), epochs(2)
    for e0, e1 in zip(inline, workers):
        for (x0, y0), (x1, y1) in zip(e0, e1):
            assert torch.equal(x0, x1) and torch.equal(y0, y1)
            assert x0.is_contiguous(memory_format=torch.channels_last)
    assert not torch.equal(inline[0][0][1], inline[1][0][1])  # next epoch, new order


# ------------------------------------------------------------------------- the script


@pytest.mark.smoke
def test_cost_benchmark_tiny_run(tmp_path):
    images, labels = digits_rgb32(260)
    data = tmp_path / "cifar-10-batches-py"
    write_cifar10_folder(data, images[:200], labels[:200], images[200:], labels[200:])
    out = tmp_path / "cost"
    script = load_script()
    res = CliRunner().invoke(
        script.cost_benchmark,
        [
            "--data",
            str(data),
            "--out",
            str(out),
            "--epochs",
            "1",
            "--batch-size",
            "50",
            "--width",
            "0.125",
            "--device",
            "cpu",
            "--num-workers",
            "1",
            "--price-per-hour",
            "3.6",
        ],
    )
    assert res.exit_code == 0, res.output

    # the PNG folder holds the same pixels and labels as the archive
    pngs = sorted((out / "png" / "train").glob("*/*.png"))
    assert len(pngs) == 200
    for p in pngs[::25]:
        i = int(p.stem)
        assert int(p.parent.name) == labels[i]
        assert np.array_equal(np.asarray(Image.open(p).convert("RGB")), images[i])

    report = json.loads((out / "cost_benchmark.json").read_text())
    results = {r["loader"]: r for r in report["results"]}
    assert list(results) == ["vanilla", "lmdb", "beton"]
    expected_counts = np.bincount(labels[:200], minlength=10).tolist()
    for r in results.values():
        assert 0 <= r["final_test_accuracy"] <= 1 and 0 <= r["data_wait_fraction"] <= 1
        assert r["total_seconds"] >= r["train_seconds"] > 0
        assert r["cost_usd"] == pytest.approx(r["total_seconds"] / 3600 * 3.6)
        assert len(r["epochs"]) == 1
        # every loader reads the same 200 training samples and trains on 4 full batches of 50
        assert r["train_label_counts"] == expected_counts
        epoch = r["epochs"][0]
        assert round(epoch["images_per_second"] * epoch["epoch_seconds"]) == 200
        assert r["train_seconds"] == pytest.approx(epoch["epoch_seconds"])
        assert r["median_epoch_seconds"] == epoch["epoch_seconds"]
        assert r["final_test_accuracy"] == epoch["test_accuracy"]
        assert r["data_wait_fraction"] == pytest.approx(epoch["data_wait_seconds"] / epoch["epoch_seconds"])
    md = (out / "cost_benchmark.md").read_text()
    rows = [line for line in md.splitlines() if line.startswith("| ")][1:]
    assert [row.split("|")[1].strip() for row in rows] == ["vanilla", "lmdb", "beton"]
    for row in rows:
        cells = [c.strip() for c in row.strip(" |").split("|")]
        r = results[cells[0]]
        # each cell is the JSON's measured value of the same run, the ratio from its totals
        ratio = results["vanilla"]["total_seconds"] / r["total_seconds"]
        assert cells == [
            cells[0],
            f"{r['median_epoch_seconds']:.2f}",
            f"{100 * r['data_wait_fraction']:.1f}%",
            f"{r['total_seconds']:.1f}",
            f"{100 * r['final_test_accuracy']:.2f}%",
            f"{r['cost_usd']:.4f}",
            f"{ratio:.2f}x",
        ]
    assert report["conditions"]["torch"] == torch.__version__ and report["conditions"]["cpu_count"] >= 1
    assert "conditions: ffload " in md and f"torch {torch.__version__}" in md
    assert md in res.output
    assert (out / "cost_benchmark.png").read_bytes()[:8] == PNG_MAGIC


def test_cost_benchmark_rejects_unknown_loader(tmp_path):
    res = CliRunner().invoke(
        load_script().cost_benchmark, ["--demo", "--out", str(tmp_path), "--loaders", "vanilla,dali"]
    )
    assert res.exit_code == 2 and "dali" in res.output
