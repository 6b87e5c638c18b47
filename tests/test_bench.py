"""`ffload bench` / ffload.bench: the harness runs each loader on real images and reports
well-formed rows, JSON, markdown and PNG. Behaviour only: no assertion on any timing value."""
import json
import math
import os
import random

import cv2
import numpy as np
import pytest
import torch
from click.testing import CliRunner
from PIL import Image

from ffload import bench
from ffload.bench import (ArrayImages, BenchConfig, PILImageFolder, bench_command, center_box,
                          compute_ratios, format_ratios, format_rows, measure, rrc_box, summarize)
from ffload.convert import convert_dataset
from ffload.convert.demo_data import digits_images
from ffload.convert.sources import ArraySource, ImageFolderSource

N_RAW = 300


@pytest.fixture(scope="module")
def raw_data(tmp_path_factory):
    """300 sklearn digits (16x16 RGB, raw) as .beton and .lmdb."""
    root = tmp_path_factory.mktemp("raw")
    images, labels = digits_images(16)
    paths = {}
    for suffix in ("beton", "lmdb"):
        paths[suffix] = str(root / f"digits.{suffix}")
        convert_dataset(ArraySource(images[:N_RAW], labels[:N_RAW]), paths[suffix], write_mode="raw",
                        num_workers=0, progress=False)
    return paths, images[:N_RAW]


@pytest.fixture(scope="module")
def photo_data(tmp_path_factory):
    """An ImageFolder of 24 JPEG crops of different sizes of three scikit-image photos, and its
    JPEG .beton."""
    skdata = pytest.importorskip("skimage.data")
    root = tmp_path_factory.mktemp("photos")
    folder = root / "folder"
    rng = np.random.default_rng(0)
    for name in ("chelsea", "coffee", "rocket"):
        photo = getattr(skdata, name)()
        (folder / name).mkdir(parents=True)
        for k in range(8):
            h, w = int(rng.integers(120, 260)), int(rng.integers(120, 260))
            y, x = int(rng.integers(0, photo.shape[0] - h)), int(rng.integers(0, photo.shape[1] - w))
            cv2.imwrite(str(folder / name / f"{k}.jpg"), photo[y:y + h, x:x + w, ::-1].copy(),
                        [cv2.IMWRITE_JPEG_QUALITY, 90])
    beton = str(root / "photos.beton")
    convert_dataset(ImageFolderSource(str(folder)), beton, write_mode="jpg", num_workers=0, progress=False)
    return beton, str(folder), 24


def invoke(args):
    result = CliRunner().invoke(bench_command, args, catch_exceptions=False)
    return result


def check_run_rows(rows, samples, epochs):
    for row in rows:
        assert row["runs"] == 1 and row["errors"] == [], row
        assert row["img_s"] > 0 and math.isfinite(row["img_s"])
        assert row["peak_rss_mb"] > 0
        if row["kind"] in ("decode_ceiling", "decode_threads"):
            continue
        assert row["samples"] == samples  # every sample once per epoch (drop_last=False)
        assert row["epoch0_s"] > 0 and row["first_batch_s"] > 0 and row["first_batch_total_s"] > 0
        assert row["epochs"] == epochs


def test_raw_json_and_plot(raw_data, tmp_path):
    paths, _ = raw_data
    png = tmp_path / "workers.png"
    result = invoke([paths["beton"], "--epochs", "2", "--batch-size", "64", "--json", "--plot", str(png),
                     "--workers-list", "2,1"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert out["dataset"]["one_size"] and out["dataset"]["image_field"] == "image"
    assert [(r["name"], r["num_workers"]) for r in out["rows"]] == [("ffload", 1), ("ffload", 2)]
    check_run_rows(out["rows"], N_RAW, 2)
    for run in out["runs"]:
        assert run["config"]["pipeline"] == "simple"  # one image size -> simple decoder
        assert [e["epoch"] for e in run["epochs"]] == [0, 1]
        assert all(e["samples"] == N_RAW for e in run["epochs"])
        assert run["first_batch"] == {"shape": [64, 3, 16, 16], "dtype": "torch.uint8"}
        assert run["dataset_samples"] == N_RAW
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    import matplotlib.image
    assert matplotlib.image.imread(str(png)).ndim == 3


def test_compare_lmdb_text(raw_data):
    paths, _ = raw_data
    result = invoke([paths["lmdb"], "--compare", "--epochs", "2", "--batch-size", "100", "--num-workers", "1"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert any(line.startswith("| ffload | 1 | 100 |") for line in lines)
    assert any(line.startswith("| dataloader_arrays | 1 | 100 |") for line in lines)
    assert any(line.startswith("| ffload / dataloader_arrays | 1 |") for line in lines)
    assert "ffcv: skipped, ffcv reads .beton files only" in result.output
    assert "dataloader_pil: skipped" in result.output
    assert "FAILED" not in result.output


def test_compare_jpeg_all_loaders(photo_data):
    beton, folder, n = photo_data
    result = invoke([beton, "--compare", "--source-folder", folder, "--epochs", "2", "--batch-size", "8",
                     "--num-workers", "1", "--size", "64", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert not out["dataset"]["one_size"] and out["dataset"]["jpeg_samples"] == n
    kinds = [r["kind"] for r in out["rows"]]
    expected = ["ffload"] + (["ffcv"] if bench.ffcv_available() else []) + [
        "dataloader_pil", "decode_ceiling", "decode_threads"]
    assert kinds == expected
    check_run_rows(out["rows"], n, 2)
    for run in out["runs"]:
        assert run["config"]["pipeline"] == "rrc"  # several sizes -> RandomResizedCrop
        if run["kind"] == "decode_ceiling":
            assert run["dataset_samples"] == n
            assert run["img_s"] == pytest.approx(run["single_thread_img_s"])  # --num-workers 1
        else:  # the same pipeline output everywhere
            assert run["first_batch"] == {"shape": [8, 3, 64, 64], "dtype": "torch.uint8"}
    ratios = {(q["numerator"], q["denominator"]) for q in out["ratios"]}
    assert ("ffload", "dataloader_pil") in ratios and ("ffload", "decode_ceiling") in ratios
    rows = {r["name"]: r for r in out["rows"]}
    for q in out["ratios"]:
        assert q["ratio"] == pytest.approx(rows[q["numerator"]]["img_s"] / rows[q["denominator"]]["img_s"])


def test_decode_ceiling_scales_with_workers(photo_data):
    """The ceiling is the single-thread decode rate times num_workers (threads_img_s is measured)."""
    beton, _, n = photo_data
    res = measure(BenchConfig(kind="decode_ceiling", path=beton, pipeline="rrc", batch_size=8,
                              num_workers=2, epochs=2, size=64))
    assert "error" not in res, res
    assert res["dataset_samples"] == n and [e["samples"] for e in res["epochs"]] == [n, n]
    assert res["img_s"] == pytest.approx(res["single_thread_img_s"] * 2)
    assert res["threads_img_s"] > 0 and math.isfinite(res["threads_img_s"])


def test_bad_inputs(tmp_path, photo_data, raw_data):
    junk = tmp_path / "junk.beton"
    junk.write_bytes(b"not a dataset at all" * 10)
    result = invoke([str(junk)])
    assert result.exit_code != 0 and "junk.beton" in result.output
    beton, _, _ = photo_data
    result = invoke([beton, "--pipeline", "simple"])
    assert result.exit_code != 0 and "several sizes" in result.output
    result = invoke([raw_data[0]["beton"], "--plot", str(tmp_path / "p.png"), "--workers-list", "1,x"])
    assert result.exit_code != 0 and "--workers-list" in result.output


def test_measure_reports_failure_without_raising(tmp_path):
    missing = str(tmp_path / "missing.beton")
    res = measure(BenchConfig(kind="ffload", path=missing, pipeline="simple", batch_size=4, num_workers=1, epochs=1))
    assert "missing.beton" in res["error"] and res["kind"] == "ffload"
    rows = summarize([dict(res, round=0)])
    assert rows[0]["runs"] == 0 and rows[0]["img_s"] is None
    assert "missing.beton" in format_rows(rows)


def test_config_validation():
    common = dict(path="x", batch_size=4, num_workers=1, epochs=1)
    with pytest.raises(ValueError, match="kind"):
        BenchConfig(kind="tf.data", pipeline="simple", **common)
    with pytest.raises(ValueError, match="pipeline"):
        BenchConfig(kind="ffload", pipeline="resize", **common)
    with pytest.raises(ValueError, match="simple"):
        BenchConfig(kind="dataloader_arrays", pipeline="rrc", **common)
    with pytest.raises(ValueError, match="batch_size"):
        BenchConfig(kind="ffload", pipeline="simple", **dict(common, batch_size=0))
    cfg = BenchConfig(kind="ffcv", pipeline="center", disabled_fields=["a"], **common)
    assert BenchConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    assert cfg.name == "ffcv"


def fake_run(name, workers, img_s, kind="ffload"):
    cfg = BenchConfig(kind=kind, path="p", pipeline="simple", batch_size=8, num_workers=workers, epochs=2,
                      name=name).to_dict()
    return {"name": name, "kind": kind, "config": cfg, "img_s": img_s, "epoch0_s": 1.0, "first_batch_s": 0.5,
            "first_batch_total_s": 1.5, "import_torch_s": 0.3, "import_s": 0.2, "build_s": 0.1,
            "rss_growth_mb": 0.0, "peak_rss_mb": 100.0 + img_s / 100, "peak_rss_children_mb": 0.0,
            "epochs": [{"samples": 8}, {"samples": 8}], "first_batch": None}


def test_summarize_medians_and_ratios():
    runs = [fake_run("ffload", 2, v) for v in (300.0, 100.0, 200.0)] + [
        fake_run("ffcv", 2, v, "ffcv") for v in (50.0, 150.0, 100.0)] + [fake_run("ffload", 1, 80.0)]
    rows = summarize(runs)
    assert [(r["name"], r["num_workers"]) for r in rows] == [("ffload", 2), ("ffcv", 2), ("ffload", 1)]
    assert rows[0]["img_s"] == 200.0 and rows[1]["img_s"] == 100.0 and rows[0]["runs"] == 3
    assert rows[0]["peak_rss_mb"] == 103.0  # the maximum over runs
    ratios = compute_ratios(rows, [("ffload", "ffcv")])
    assert ratios == [{"numerator": "ffload", "denominator": "ffcv", "num_workers": 2, "ratio": 2.0}]
    table = format_ratios(ratios, {("ffload", "ffcv"): (">=", 2.5)})
    assert "| ffload / ffcv | 2 | 2.00x | >= 2.5x | NO |" in table
    assert "| ffload / ffcv | 2 | 2.00x | >= 1.5x | yes |" in format_ratios(ratios, {("ffload", "ffcv"): (">=", 1.5)})


def test_rrc_box_follows_torchvision_rule():
    rng = random.Random(0)
    for _ in range(2000):
        w = rng.randint(20, 600)
        h = int(w * rng.uniform(0.5, 2.0))
        left, top, right, bottom = rrc_box(w, h, rng)
        cw, ch = right - left, bottom - top
        assert 0 <= left < right <= w and 0 <= top < bottom <= h
        # area >= 8 % and aspect in [3/4, 4/3], up to the rounding of each side to an integer
        assert cw * ch >= 0.08 * w * h - (cw + ch + 1) / 2
        assert (cw + 0.5) / (ch - 0.5) >= 3 / 4 and (cw - 0.5) / (ch + 0.5) <= 4 / 3
    # a 1000x10 strip cannot hold a box of aspect <= 4/3 and 8 % area: the fallback is the
    # centred crop clamped to aspect 4/3
    left, top, right, bottom = rrc_box(1000, 10, rng)
    assert (right - left, bottom - top) == (13, 10) and left == (1000 - 13) // 2


def test_center_box_matches_ffcv():
    rgb = pytest.importorskip("ffcv.fields.rgb_image")
    for w, h in ((400, 300), (300, 400), (257, 256), (17, 1000)):
        top, left, ch, cw = rgb.get_center_crop(h, w, None, bench.CENTER_RATIO)
        assert center_box(w, h) == (left, top, left + cw, top + ch)


def test_pil_dataset_crops_and_flips(photo_data):
    _, folder, _ = photo_data
    src = ImageFolderSource(folder)
    path = os.path.join(src.root, src.describe(0))
    ds = PILImageFolder([path], src.labels[:1], "center", 48)
    reference = Image.open(path).convert("RGB")
    expected = np.array(reference.resize((48, 48), Image.BILINEAR, box=center_box(*reference.size)))
    random.seed(1)
    outcomes = set()
    for _ in range(20):
        image, label = ds[0]
        assert label == src.labels[0] and image.dtype == torch.uint8
        got = image.numpy()
        flipped = np.array_equal(got, expected[:, ::-1])
        assert flipped or np.array_equal(got, expected)
        outcomes.add(flipped)
    assert outcomes == {True, False}


def test_array_dataset_flips(raw_data):
    _, images = raw_data
    asymmetric = [i for i in range(len(images)) if not np.array_equal(images[i], images[i][:, ::-1])]
    ds = ArrayImages(images, np.arange(len(images)))
    assert len(ds) == N_RAW
    random.seed(0)
    outcomes = set()
    for i in asymmetric[:40]:
        image, label = ds[i]
        got = image.numpy()
        flipped = np.array_equal(got, images[i][:, ::-1])
        assert label == i and (flipped or np.array_equal(got, images[i]))
        outcomes.add(flipped)
    assert outcomes == {True, False}
