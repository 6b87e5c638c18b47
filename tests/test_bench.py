"""`ffload bench` / ffload.bench: the harness runs each loader on real images and reports
well-formed rows, JSON, markdown and PNG. Behaviour only: no assertion on any timing value."""

from __future__ import annotations

import concurrent.futures
import json
import math
import os
import random
import subprocess
import sys
import threading
from collections import Counter

import cv2
import numpy as np
import pytest
import torch
from click.testing import CliRunner
from PIL import Image

import ffload
from ffload import bench
from ffload.bench import (
    ArrayImages,
    BenchConfig,
    PILImageFolder,
    bench_command,
    center_box,
    compute_ratios,
    format_ratios,
    format_rows,
    measure,
    rrc_box,
    summarize,
)
from ffload.bench.peers.ceiling import DECODERS, default_decoder, load_jpeg_payloads, measure_decode_ceiling
from ffload.bench.worker import BOOTSTRAP
from ffload.codecs import jpeg
from ffload.convert import convert_dataset
from ffload.convert.demo_data import digits_images
from ffload.convert.sources import ArraySource, ImageFolderSource
from ffload.formats import open_dataset

N_RAW = 300


@pytest.fixture(scope="module")
def raw_data(tmp_path_factory):
    """300 sklearn digits (16x16 RGB, raw) as .beton and .lmdb."""
    root = tmp_path_factory.mktemp("raw")
    images, labels = digits_images(16)
    paths = {}
    for suffix in ("beton", "lmdb"):
        paths[suffix] = str(root / f"digits.{suffix}")
        convert_dataset(
            ArraySource(images[:N_RAW], labels[:N_RAW]), paths[suffix], write_mode="raw", num_workers=0, progress=False
        )
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
            cv2.imwrite(
                str(folder / name / f"{k}.jpg"),
                photo[y : y + h, x : x + w, ::-1].copy(),
                [cv2.IMWRITE_JPEG_QUALITY, 90],
            )
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
        if row["kind"] in ("decode_ceiling", "decode_single_thread"):
            continue
        assert row["samples"] == samples  # every sample once per epoch (drop_last=False)
        assert row["epoch0_s"] > 0 and row["first_batch_s"] > 0 and row["first_batch_total_s"] > 0
        assert row["epochs"] == epochs


@pytest.mark.smoke
def test_raw_json_and_plot(raw_data, tmp_path):
    paths, _ = raw_data
    png = tmp_path / "workers.png"
    result = invoke(
        [paths["beton"], "--epochs", "2", "--batch-size", "64", "--json", "--plot", str(png), "--workers-list", "2,1"]
    )
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert out["dataset"]["one_size"] and out["dataset"]["image_field"] == "image"
    conditions = out["conditions"]
    assert conditions["ffload"] == ffload.__version__ and conditions["torch"] == torch.__version__
    assert conditions["numpy"] == np.__version__ and conditions["opencv"] == cv2.__version__
    assert conditions["cpu_count"] == os.cpu_count()
    assert (conditions["device"] == "cpu") == (not torch.cuda.is_available())
    assert conditions["git_commit"] is None or len(conditions["git_commit"]) == 40
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


@pytest.mark.smoke
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
    # the header and the conditions once each (stdout), before the table
    assert [line for line in lines if line.startswith(paths["lmdb"] + " (lmdb, ")] == lines[:1]
    assert [line.startswith("conditions: ffload ") for line in lines].count(True) == 1
    assert lines[1].startswith("conditions: ffload ") and f"torch {torch.__version__}" in lines[1]
    rows = [line for line in lines if line.startswith("| ffload | 1 | 100 |")]
    assert len(rows) == 1


def test_header_printed_once_with_stderr_apart(raw_data):
    """The header goes to stdout once; stderr holds only the progress lines."""
    paths, _ = raw_data
    result = invoke([paths["beton"], "--epochs", "1", "--batch-size", "100", "--num-workers", "1"])
    assert result.exit_code == 0, result.output
    header = [line for line in result.stdout.splitlines() if line.startswith(paths["beton"] + " (beton, ")]
    assert len(header) == 1 and header[0].endswith("1 round(s)")
    assert paths["beton"] + " (beton, " not in result.stderr
    assert [line.strip().split(" ")[:2] for line in result.stderr.splitlines()] == [["[1/1]", "ffload"]]


def test_compare_jpeg_all_loaders(photo_data):
    beton, folder, n = photo_data
    result = invoke(
        [
            beton,
            "--compare",
            "--source-folder",
            folder,
            "--epochs",
            "2",
            "--batch-size",
            "8",
            "--num-workers",
            "1",
            "--size",
            "64",
            "--json",
        ]
    )
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert not out["dataset"]["one_size"] and out["dataset"]["jpeg_samples"] == n
    kinds = [r["kind"] for r in out["rows"]]
    expected = (
        ["ffload"]
        + (["ffcv"] if bench.ffcv_available() else [])
        + ["dataloader_pil", "decode_ceiling", "decode_single_thread"]
    )
    assert kinds == expected
    check_run_rows(out["rows"], n, 2)
    for run in out["runs"]:
        assert run["config"]["pipeline"] == "rrc"  # several sizes -> RandomResizedCrop
        if run["kind"] == "decode_ceiling":
            assert run["dataset_samples"] == n
            assert run["img_s"] == run["threads_img_s"] and run["decoder"] == default_decoder()  # measured
        else:  # the same pipeline output everywhere
            assert run["first_batch"] == {"shape": [8, 3, 64, 64], "dtype": "torch.uint8"}
    ratios = {(q["numerator"], q["denominator"]) for q in out["ratios"]}
    assert ("ffload", "dataloader_pil") in ratios and ("ffload", "decode_ceiling") in ratios
    rows = {r["name"]: r for r in out["rows"]}
    for q in out["ratios"]:
        assert q["ratio"] == pytest.approx(rows[q["numerator"]]["img_s"] / rows[q["denominator"]]["img_s"])


def test_decode_ceiling_decodes_exactly_the_datasets_jpegs(photo_data):
    """The ceiling decodes every JPEG payload of the dataset once per pass, in this thread for
    the one-thread passes and in other threads for the concurrent ones."""
    beton, _, n = photo_data
    indices, payloads = load_jpeg_payloads(beton, "image")
    assert indices == list(range(n))
    meta = open_dataset(beton).metadata["image"]
    opencv = DECODERS["opencv"]()
    for i, payload in zip(indices, payloads):
        assert payload.dtype == np.uint8 and bytes(payload[:2]) == b"\xff\xd8"  # JPEG SOI
        assert opencv(payload).shape == (meta["height"][i], meta["width"][i], 3)
    calls, lock = [], threading.Lock()

    def recording(payload):
        with lock:
            calls.append((id(payload), threading.get_ident()))
        return opencv(payload)

    result = measure_decode_ceiling(payloads, 3, 2, recording)
    main = threading.get_ident()
    single, threaded = calls[: 2 * n], calls[2 * n :]
    assert all(t == main for _, t in single) and all(t != main for _, t in threaded)
    expected = Counter({id(p): 2 for p in payloads})
    assert Counter(i for i, _ in single) == expected and Counter(i for i, _ in threaded) == expected
    assert result.num_threads == 3
    for records in (result.single_thread, result.threads):
        assert [(r.epoch, r.samples) for r in records] == [(0, n), (1, n)]
        assert all(r.img_s == pytest.approx(r.samples / r.seconds) for r in records)
    # two passes: the first is warm-up, the figure is the second pass's rate
    assert result.single_thread_img_s == result.single_thread[1].img_s
    assert result.threads_img_s == result.threads[1].img_s


def test_turbojpeg_ceiling_decoder_gives_opencvs_pixels(photo_data):
    """The TurboJPEG ceiling decoder is the same full-size decode as cv2.imdecode (the same
    libjpeg-turbo algorithms and settings), from several threads at once, and refuses what does
    not decode; with the library present it is the default."""
    if jpeg.backend() != "turbojpeg":
        pytest.skip("no TurboJPEG 3 library")
    assert default_decoder() == "turbojpeg"
    beton, _, _ = photo_data
    _, payloads = load_jpeg_payloads(beton, "image")
    decode = DECODERS["turbojpeg"]()

    def check(payload):
        return np.array_equal(decode(payload), cv2.imdecode(payload, cv2.IMREAD_COLOR_RGB))

    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        assert all(pool.map(check, payloads * 2))
    assert decode(np.frombuffer(b"\xff\xd8 not a jpeg", np.uint8)) is None
    assert decode(payloads[0][: len(payloads[0]) // 2]) is None  # truncated: a warning counts as a failure
    assert check(payloads[1])  # the thread's handle still works


def test_decode_ceiling_names_a_payload_that_does_not_decode(photo_data, raw_data):
    beton, _, _ = photo_data
    _, payloads = load_jpeg_payloads(beton, "image", 4)
    assert len(payloads) == 4
    broken = payloads[:2] + [np.frombuffer(b"\xff\xd8 not a jpeg", np.uint8)] + payloads[3:]
    opencv = DECODERS["opencv"]()
    for threads in (1, 2):
        with pytest.raises(ValueError, match="sample 2: the JPEG payload does not decode"):
            measure_decode_ceiling(broken, threads, 1, opencv, [f"sample {i}" for i in range(4)])
    with pytest.raises(ValueError, match="no JPEG samples"):
        load_jpeg_payloads(raw_data[0]["beton"], "image")


def test_decode_ceiling_measurement_reports_both_rates(photo_data):
    """In a subprocess: the row's rate is the measured multi-thread rate, the one-thread rate is
    reported beside it, both over the dataset's JPEG payloads."""
    beton, _, n = photo_data
    res = measure(
        BenchConfig(kind="decode_ceiling", path=beton, pipeline="rrc", batch_size=8, num_workers=2, epochs=2, size=64)
    )
    assert "error" not in res, res
    assert res["dataset_samples"] == n and res["decoder"] == default_decoder()
    assert [e["samples"] for e in res["epochs"]] == [n, n] == [e["samples"] for e in res["single_thread_epochs"]]
    assert res["img_s"] == res["threads_img_s"] == res["epochs"][1]["img_s"]
    assert res["single_thread_img_s"] == res["single_thread_epochs"][1]["img_s"]
    assert res["payload_bytes_mean"] == pytest.approx(np.mean([p.size for p in load_jpeg_payloads(beton, "image")[1]]))
    rows = summarize([dict(res, round=0)])
    assert [(r["name"], r["kind"], r["img_s"]) for r in rows] == [
        ("decode_ceiling", "decode_ceiling", res["threads_img_s"]),
        ("decode_ceiling (1 thread)", "decode_single_thread", res["single_thread_img_s"]),
    ]
    (ratio,) = compute_ratios(rows + summarize([fake_run("ffload", 2, 1000.0)]), [("ffload", "decode_ceiling")])
    assert ratio["ratio"] == pytest.approx(1000.0 / res["threads_img_s"])


def test_worker_loads_without_importing_ffload():
    """The subprocess loads the bench package by path: ``import ffload`` stays inside the
    measurement."""
    code = BOOTSTRAP.replace(
        'importlib.import_module("_ffload_bench.worker").main(sys.argv[2:])',
        'importlib.import_module("_ffload_bench.worker"); print(sorted('
        'm for m in sys.modules if m == "ffload" or m.startswith("ffload.")))',
    )
    out = subprocess.run(
        [sys.executable, "-c", code, os.path.dirname(bench.__file__)], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"


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
    with pytest.raises(ValueError, match="ffload_torchvision compiles the augmentation stacks only"):
        BenchConfig(kind="ffload_torchvision", pipeline="rrc", **common)
    with pytest.raises(ValueError, match="batch_size"):
        BenchConfig(kind="ffload", pipeline="simple", **dict(common, batch_size=0))
    cfg = BenchConfig(kind="ffcv", pipeline="center", disabled_fields=["a"], **common)
    assert BenchConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    assert cfg.name == "ffcv"


def fake_run(name, workers, img_s, kind="ffload"):
    cfg = BenchConfig(
        kind=kind, path="p", pipeline="simple", batch_size=8, num_workers=workers, epochs=2, name=name
    ).to_dict()
    return {
        "name": name,
        "kind": kind,
        "config": cfg,
        "img_s": img_s,
        "epoch0_s": 1.0,
        "first_batch_s": 0.5,
        "first_batch_total_s": 1.5,
        "import_torch_s": 0.3,
        "import_s": 0.2,
        "build_s": 0.1,
        "rss_growth_mb": 0.0,
        "peak_rss_mb": 100.0 + img_s / 100,
        "peak_rss_children_mb": 0.0,
        "epochs": [{"samples": 8}, {"samples": 8}],
        "first_batch": None,
    }


def test_summarize_medians_and_ratios():
    runs = (
        [fake_run("ffload", 2, v) for v in (300.0, 100.0, 200.0)]
        + [fake_run("ffcv", 2, v, "ffcv") for v in (50.0, 150.0, 100.0)]
        + [fake_run("ffload", 1, 80.0)]
    )
    rows = summarize(runs)
    assert [(r["name"], r["num_workers"]) for r in rows] == [("ffload", 2), ("ffcv", 2), ("ffload", 1)]
    assert rows[0]["img_s"] == 200.0 and rows[1]["img_s"] == 100.0 and rows[0]["runs"] == 3
    assert rows[0]["peak_rss_mb"] == 103.0  # the maximum over runs
    ratios = compute_ratios(rows, [("ffload", "ffcv")])
    # rounds' ratios 6, 2/3, 2: their median 2; the medians' ratio 200 / 100
    assert ratios == [{"numerator": "ffload", "denominator": "ffcv", "num_workers": 2, "ratio": 2.0, "paired": 2.0}]
    table = format_ratios(ratios, {("ffload", "ffcv"): (">=", 2.5)})
    assert "| ffload / ffcv | 2 | 2.00x | 2.00x | >= 2.5x | NO |" in table
    assert "| ffload / ffcv | 2 | 2.00x | 2.00x | >= 1.5x | yes |" in format_ratios(
        ratios, {("ffload", "ffcv"): (">=", 1.5)}
    )
    drift = summarize(  # a machine that swings: a is 1.1x b in two rounds, the medians fall in different rounds
        [fake_run("a", 2, v) for v in (110.0, 550.0, 300.0)] + [fake_run("b", 2, v) for v in (100.0, 500.0, 600.0)]
    )
    (paired,) = compute_ratios(drift, [("a", "b")])
    assert paired["ratio"] == 300.0 / 500.0 and paired["paired"] == pytest.approx(1.1)


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


@pytest.mark.parametrize("pipeline", ["dl_simple", "dl_complex"])
def test_deeplake_stacks_run_on_every_peer(photo_data, pipeline):
    """ffload, DataLoader + PIL and DataLoader + Albumentations run the same stack: normalised
    float32 (B, 3, S, S) batches covering the dataset, values spread around zero."""
    pytest.importorskip("albumentations")
    import torch

    from ffload.bench.peers.baselines import BASELINES
    from ffload.bench.runners import RUNNERS

    beton, folder, n = photo_data
    sources = {"ffload": beton, "dataloader_pil": folder, "dataloader_albumentations": folder}
    assert set(sources) - {"ffload"} <= set(BASELINES)
    for kind, path in sources.items():
        cfg = BenchConfig(kind=kind, path=path, pipeline=pipeline, batch_size=4, num_workers=1, epochs=1, size=48)
        setup = RUNNERS[kind](cfg)
        try:
            batches = [images.clone() for images, _ in setup.loader]
        finally:
            setup.close()
        images = torch.cat(batches)
        assert images.shape == (n, 3, 48, 48) and images.dtype == torch.float32, kind
        assert -2.2 < float(images.mean()) < 2.7 and float(images.std()) > 0.2, kind
        assert float(images.min()) >= -2.2 and float(images.max()) <= 2.7, kind  # ImageNet-normalised [0, 1]
    with pytest.raises(ValueError, match="augmentation"):
        BenchConfig(kind="ffcv", path="x", pipeline=pipeline, batch_size=4, num_workers=1, epochs=1)
    BenchConfig(kind="decode_ceiling", path=beton, pipeline=pipeline, batch_size=4, num_workers=1, epochs=1)
    with pytest.raises(ValueError, match="augmentation"):
        BenchConfig(kind="dataloader_albumentations", path="x", pipeline="rrc", batch_size=4, num_workers=1, epochs=1)


def test_pil_perspective_coefficients_map_end_points_to_corners():
    from ffload.bench.peers.baselines import _perspective_coeffs

    start = [(0, 0), (47, 0), (47, 47), (0, 47)]
    end = [(5, 3), (40, 7), (44, 45), (2, 41)]
    a, b, c, d, e, f, g, h = _perspective_coeffs(start, end)
    for (ex, ey), (sx, sy) in zip(end, start):
        den = g * ex + h * ey + 1
        assert abs((a * ex + b * ey + c) / den - sx) < 1e-6 and abs((d * ex + e * ey + f) / den - sy) < 1e-6
