"""The ResNet-9 recipe: model size, schedule, data preparation and its cache, bad input, and short
CPU training runs (CIFAR layout through both formats, the digits demo)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch
from cifar_fixture import write_cifar10_folder
from click.testing import CliRunner
from sklearn.datasets import load_digits

from ffload.recipes import data as recipe
from ffload.recipes.cifar10_resnet9 import recipe_command
from ffload.recipes.data import RecipeError, prepare_data
from ffload.recipes.resnet9 import resnet9
from ffload.recipes.run import run_recipe
from ffload.recipes.training import RecipeConfig, lr_schedule

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def digits_rgb32(n):
    """The first ``n`` scikit-learn digits as ``(n, 32, 32, 3) uint8`` (8x8 upscaled 4x, 0-16 ->
    0-240, tinted per channel so the channels differ) and their ``(n,)`` labels."""
    d = load_digits()
    gray = np.kron(d.images[:n], np.ones((4, 4))) * 15
    tint = np.array([1.0, 0.8, 0.6])
    return (gray[..., None] * tint).astype(np.uint8), d.target[:n].astype(np.int64)


@pytest.fixture(scope="module")
def cifar_dir(tmp_path_factory):
    images, labels = digits_rgb32(400)
    root = tmp_path_factory.mktemp("data") / "cifar-10-batches-py"
    write_cifar10_folder(root, images[:300], labels[:300], images[300:], labels[300:])
    return root


# ---------------------------------------------------------------------------------- model


def test_resnet9_parameter_count_matches_ffcv_architecture():
    # FFCV's CIFAR ResNet-9 (examples/cifar/train_cifar.py). conv_bn(i, o, k) has a bias-free
    # conv (i*o*k*k weights) and a BatchNorm with weight and bias (2*o).
    def conv_bn(i, o, k=3):
        return i * o * k * k + 2 * o

    expected = (
        conv_bn(3, 64)  # 1,856
        + conv_bn(64, 128, k=5)  # 205,056
        + 2 * conv_bn(128, 128)  # 295,424 (residual block)
        + conv_bn(128, 256)  # 295,424
        + 2 * conv_bn(256, 256)  # 1,180,672 (residual block)
        + conv_bn(256, 128)  # 295,168
        + 128 * 10
    )  # 1,280 (Linear, no bias); Mul(0.2) has none
    assert expected == 2_274_880
    model = resnet9(num_classes=10, width=1.0)
    assert sum(p.numel() for p in model.parameters()) == expected
    assert sum(p.numel() for p in model.parameters() if p.requires_grad) == expected


def test_resnet9_width_scales_channels_and_keeps_output_shape():
    model = resnet9(num_classes=7, width=0.25)
    convs = [m for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    assert [c.out_channels for c in convs] == [16, 32, 32, 32, 64, 64, 64, 32]
    model.eval()
    out = model(torch.randn(2, 3, 32, 32).to(memory_format=torch.channels_last))
    assert out.shape == (2, 7) and out.dtype == torch.float32
    with pytest.raises(ValueError, match="width"):
        resnet9(width=0)


def test_resnet9_output_is_scaled_linear_head():
    model = resnet9(num_classes=10, width=0.125).eval()
    x = torch.randn(3, 3, 32, 32)
    features = model[:-2](x)  # everything before Linear and Mul
    assert torch.allclose(model(x), 0.2 * model[-2](features))


# ------------------------------------------------------------------------------ schedule


def test_lr_schedule_is_ffcv_triangle():
    s = lr_schedule(RecipeConfig(epochs=24, lr_peak_epoch=5), iters_per_epoch=10)
    assert s.shape == (240,)
    assert s[0] == 0 and s[50] == 1 and s.argmax() == 50
    assert np.allclose(np.diff(s[:51]), 1 / 50) and np.allclose(np.diff(s[50:]), -1 / 190)
    short = lr_schedule(RecipeConfig(epochs=12, lr_peak_epoch=5), iters_per_epoch=24)
    assert short.argmax() == 60  # peak at epoch 2.5 = 5 * 12 / 24
    with pytest.raises(ValueError, match="peak"):
        lr_schedule(RecipeConfig(epochs=24, lr_peak_epoch=30), iters_per_epoch=10)


# ------------------------------------------------------------------- data and its cache


def test_prepare_data_converts_once_and_reuses_cache(cifar_dir, tmp_path, monkeypatch):
    import ffload.convert

    calls = []
    real = ffload.convert.convert_dataset

    def failing_on_test_split(src, dst, **kw):
        calls.append(os.path.basename(dst))
        if os.path.basename(dst).startswith("test"):
            raise OSError(28, "No space left on device")  # interrupted after the train split
        return real(src, dst, **kw)

    monkeypatch.setattr(ffload.convert, "convert_dataset", failing_on_test_split)
    with pytest.raises(RecipeError, match="No space left"):
        prepare_data(cifar_dir, tmp_path / "cache", "beton", num_workers=0, progress=False)
    entries = list((tmp_path / "cache").iterdir())
    assert len(entries) == 1 and not (entries[0] / "complete.json").exists()

    monkeypatch.setattr(ffload.convert, "convert_dataset", real)
    first = prepare_data(cifar_dir, tmp_path / "cache", "beton", num_workers=0, progress=False)
    assert not first.cache_hit
    assert (first.layout, first.num_train, first.num_test, first.num_classes) == ("cifar", 300, 100, 10)
    assert first.image_shape == (32, 32)
    again = prepare_data(cifar_dir, tmp_path / "cache", "beton", num_workers=0, progress=False)
    assert again.cache_hit and again.train_path == first.train_path

    # another format, or a changed source file, is another cache entry
    lmdb = prepare_data(cifar_dir, tmp_path / "cache", "lmdb", num_workers=0, progress=False)
    assert not lmdb.cache_hit and lmdb.train_path.endswith("train.lmdb")
    st = os.stat(cifar_dir / "test_batch")
    os.utime(cifar_dir / "test_batch", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    changed = prepare_data(cifar_dir, tmp_path / "cache", "beton", num_workers=0, progress=False)
    assert not changed.cache_hit and changed.train_path != first.train_path


def test_prepare_data_accepts_imagefolder_and_torchvision_root(cifar_dir, tmp_path):
    from PIL import Image

    images, labels = digits_rgb32(40)
    assert list(labels[:10]) == list(range(10))  # every class in the test split
    for split, rng in (("train", range(10, 40)), ("test", range(10))):
        for i in rng:
            folder = tmp_path / "folder" / split / f"class{labels[i]}"
            folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray(images[i]).save(folder / f"{i}.png")
    data = prepare_data(tmp_path / "folder", tmp_path / "cache", "beton", num_workers=0, progress=False)
    assert (data.layout, data.num_train, data.num_test) == ("imagefolder", 30, 10)
    # a test split without one of the train classes would shift the labels
    for split, name in (("train", "a"), ("train", "b"), ("test", "b")):
        (tmp_path / "uneven" / split / name).mkdir(parents=True)
        Image.fromarray(images[0]).save(tmp_path / "uneven" / split / name / "0.png")
    with pytest.raises(RecipeError, match="different classes"):
        prepare_data(tmp_path / "uneven", tmp_path / "cache", "beton", num_workers=0, progress=False)
    # torchvision's root (the folder containing cifar-10-batches-py) is accepted too
    assert recipe.detect_layout(cifar_dir.parent) == ("cifar", cifar_dir)


def _run_cli(args):
    return CliRunner().invoke(recipe_command, [str(a) for a in args])


def test_bad_data_folders_fail_before_training(cifar_dir, tmp_path):
    out = tmp_path / "out"
    empty = tmp_path / "empty"
    (empty / "train").mkdir(parents=True)
    res = _run_cli(["--data", empty, "--out", out, "--device", "cpu"])
    assert res.exit_code == 1 and "neither a CIFAR-10 archive folder" in res.output

    missing = tmp_path / "missing"
    missing.mkdir()
    for name in os.listdir(cifar_dir):
        if name != "data_batch_3":
            (missing / name).write_bytes((cifar_dir / name).read_bytes())
    res = _run_cli(["--data", missing, "--out", out, "--device", "cpu"])
    assert res.exit_code == 1 and "missing data_batch_3" in res.output

    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    for name in os.listdir(cifar_dir):
        (corrupt / name).write_bytes((cifar_dir / name).read_bytes())
    blob = (cifar_dir / "data_batch_2").read_bytes()
    (corrupt / "data_batch_2").write_bytes(blob[: len(blob) // 2])  # truncated
    res = _run_cli(["--data", corrupt, "--out", out, "--device", "cpu"])
    assert res.exit_code == 1 and "data_batch_2" in res.output and "corrupt" in res.output
    assert not (out / "metrics.json").exists()


def test_bad_device_out_and_options_fail_before_training(cifar_dir, tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    res = _run_cli(["--data", cifar_dir, "--out", blocker / "out", "--device", "cpu"])
    assert res.exit_code == 1 and "--out" in res.output and "cannot write" in res.output
    res = _run_cli(["--data", cifar_dir, "--out", tmp_path / "o", "--device", "cpu", "--cache-dir", blocker / "cache"])
    assert res.exit_code == 1 and "cannot convert" in res.output and "a_file" in res.output
    if not torch.cuda.is_available():
        res = _run_cli(["--data", cifar_dir, "--out", tmp_path / "o", "--device", "cuda"])
        assert res.exit_code == 1 and "CUDA is not available" in res.output
    res = _run_cli(["--data", cifar_dir, "--demo", "--out", tmp_path / "o"])
    assert res.exit_code == 2 and "mutually exclusive" in res.output
    res = _run_cli(["--out", tmp_path / "o"])
    assert res.exit_code == 2 and "--data" in res.output
    res = _run_cli(
        [
            "--data",
            cifar_dir,
            "--out",
            tmp_path / "o",
            "--device",
            "cpu",
            "--batch-size",
            "1000",
            "--cache-dir",
            tmp_path / "cache",
        ]
    )
    assert res.exit_code == 1 and "larger than the training set" in res.output
    assert not (tmp_path / "o" / "metrics.json").exists()


# ------------------------------------------------------------------------- training runs


@pytest.mark.parametrize("fmt", ["beton", "lmdb"])
def test_smoke_run_through_cli_writes_reports(cifar_dir, tmp_path, fmt):
    out = tmp_path / "run"
    # lr 2 at batch 512 = 0.078 at batch 20: enough to learn in 15 steps
    res = _run_cli(
        [
            "--data",
            cifar_dir,
            "--out",
            out,
            "--format",
            fmt,
            "--epochs",
            1,
            "--batch-size",
            20,
            "--lr",
            2,
            "--width",
            0.25,
            "--device",
            "cpu",
            "--num-workers",
            2,
            "--price-per-hour",
            3.6,
            "--no-progress",
        ]
    )
    assert res.exit_code == 0, res.output
    assert "train loss" in res.output and "data wait" in res.output
    assert "final test accuracy" in res.output and "cost: $" in res.output

    m = json.loads((out / "metrics.json").read_text())
    assert 0 <= m["final_test_accuracy"] <= 1
    assert m["final_test_accuracy"] == m["epochs"][-1]["test_accuracy"]
    assert m["cost_usd"] == pytest.approx(m["total_seconds"] / 3600 * 3.6)
    assert m["device_hours"] == pytest.approx(m["total_seconds"] / 3600)
    assert m["total_seconds"] >= m["train_seconds"] > 0
    assert m["config"]["epochs"] == 1 and m["config"]["batch_size"] == 20
    assert m["config"]["width"] == 0.25 and m["config"]["nesterov"] is False  # FFCV's example uses plain momentum
    assert m["data"]["format"] == fmt and m["data"]["num_train"] == 300
    (row,) = m["epochs"]
    assert 0 <= row["data_wait_fraction"] <= 1
    assert row["images_per_second"] == pytest.approx(300 / row["epoch_seconds"])
    losses = m["iteration_losses"]
    assert len(losses) == 15  # 300 // 20 steps
    assert row["train_loss"] == pytest.approx(np.mean(losses))
    # it learns within the run: below its start and below chance level (ln 10)
    assert np.mean(losses[-3:]) < min(np.mean(losses[:3]), np.log(10))
    assert (out / "accuracy.png").read_bytes()[:8] == PNG_MAGIC


def test_digits_demo_beats_chance(tmp_path):
    m = run_recipe(
        None,
        tmp_path / "demo",
        RecipeConfig(epochs=4, batch_size=64, width=0.125),
        device="cpu",
        num_workers=2,
        demo=True,
        progress=False,
    )
    assert (tmp_path / "demo" / "digits" / "train").is_dir()
    assert m["data"]["layout"] == "imagefolder" and m["data"]["num_classes"] == 10
    assert m["data"]["num_train"] + m["data"]["num_test"] == 1797
    assert m["final_test_accuracy"] > 0.5  # chance is 0.1
    assert [r["epoch"] for r in m["epochs"]] == [0, 1, 2, 3]


def test_same_seed_same_run(cifar_dir, tmp_path):
    config = RecipeConfig(epochs=1, batch_size=50, width=0.125, seed=5)
    runs = [
        run_recipe(
            cifar_dir,
            tmp_path / f"run{i}",
            config,
            device="cpu",
            num_workers=1 + i,
            cache_dir=tmp_path / "cache",
            progress=False,
        )
        for i in range(2)
    ]  # 1 and 2 loader threads
    assert runs[1]["data"]["cache_hit"] and not runs[0]["data"]["cache_hit"]
    assert runs[0]["iteration_losses"] == runs[1]["iteration_losses"]
    assert runs[0]["final_test_accuracy"] == runs[1]["final_test_accuracy"]
