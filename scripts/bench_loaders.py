"""Loader throughput, side by side: ffload vs ffcv 1.0.2 vs PyTorch DataLoader vs the decode ceiling.

    python scripts/bench_loaders.py            # full run (< 15 min on 2 cores)
    python scripts/bench_loaders.py --quick    # smaller data, one round (< 3 min)
    python scripts/bench_loaders.py --plot --workers-list 1,2 --out runs/bench_loaders

Datasets (built in --data, reused while their parameters match):

* ``raw32``: N real-photo crops of 32x32 (random square crops of the JPEG set below, INTER_AREA),
  written raw to ``raw32.beton`` and ``raw32.lmdb``; 11 classes.
* ``photos``: an ImageNet-sized JPEG ImageFolder. ``ffload.convert.demo_data.build_photos_folder``
  gives ~400 px / ~34 KB images (smooth upscaled crops), smaller than the ImageNet reference
  (~430 px, ~98 KB mean at q90), so each demo image is resized to a longer side drawn from
  [360, 500] px and given film grain (Gaussian, sigma 26 per channel, from one fixed noise
  field), then saved as JPEG q90: ~430 px, ~98 KB mean. Converted (``write_mode='jpg'``,
  quality 90) to ``photos.beton`` and ``photos.lmdb``; the DataLoader + PIL baseline reads the
  folder itself.

Groups (each loader in its own subprocess, see ``ffload.bench``; within a group the loaders
alternate over ``--repeats`` rounds; ratios divide medians of the same run):

1. raw 32x32, ``SimpleRGBImageDecoder`` + flip, batch 512: ffload vs ffcv on the same ``.beton``,
   vs ``DataLoader`` over the same images held in memory, and ffload on the LMDB copy.
2. JPEG, ``RandomResizedCrop(224)`` + flip, batch 128: ffload vs ffcv, vs ``DataLoader`` + PIL over
   the ImageFolder, vs the decode ceiling (``--num-workers`` threads decoding the same payloads at
   full size with ``cv2.imdecode`` at once, measured; the one-thread rate is the row
   ``decode ceiling (1 thread)``), and ffload on the LMDB copy.
3. JPEG, ``CenterCrop(224, ratio=224/256)`` + flip: ffload vs ffcv vs ``DataLoader`` + PIL (and the
   ceiling of group 2).

Plus: time from ``import ffload`` to the first batch with a warm numba cache (fresh process, torch
imported first) and from process spawn; ffcv's import and compile time; RSS growth of ffload
over 20 epochs (after a warm-up epoch). Every loader runs ``order=RANDOM``, ``os_cache=True``,
``drop_last=False``, the same batch size and ``--num-workers``; the data files are read once
before each group so the page cache is warm. Tables are printed and written to ``--out``
(``results.md``, ``results.json``, and ``workers_<group>.png`` with ``--plot``) with the
conditions of the run (``ffload.bench.measurement_conditions``: versions, git commit, CPUs,
device).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

import numpy as np

from ffload.bench import (
    BenchConfig,
    compute_ratios,
    ffcv_available,
    format_conditions,
    format_ratios,
    format_rows,
    measurement_conditions,
    plot_throughput,
    run_rounds,
    summarize,
    write_results,
)
from ffload.bench.datasets import GRAIN_SIGMA, JPEG_QUALITY, LONGER_SIDE, build_photo_jpegs, raw_crops

RAW_BATCH, JPEG_BATCH, CROP = 512, 128, 224


# ----------------------------------------------------------------------------- data
def prepare_data(data: str, n_raw: int, n_jpeg: int, workers: int) -> dict:
    """Build (or reuse) the datasets in ``data``; returns their paths and statistics."""
    from ffload.convert import convert_dataset
    from ffload.convert.sources import ArraySource, ImageFolderSource
    from ffload.formats import open_dataset

    params = {
        "n_raw": n_raw,
        "n_jpeg": n_jpeg,
        "grain": GRAIN_SIGMA,
        "longer": list(LONGER_SIDE),
        "quality": JPEG_QUALITY,
        "version": 1,
    }
    marker = os.path.join(data, "datasets.json")
    if os.path.isfile(marker):
        with open(marker) as f:
            info = json.load(f)
        if info.get("params") == params:
            return info
    if os.path.isdir(data) and os.listdir(data):
        if not os.path.isfile(marker):
            sys.exit(
                f"--data {data}: folder exists, is not empty and holds no datasets.json of this script; "
                "choose a new folder"
            )
        shutil.rmtree(data)  # built by this script with other parameters
    os.makedirs(data, exist_ok=True)
    t0 = time.perf_counter()
    folder = os.path.join(data, "photos")
    build_photo_jpegs(folder, n_jpeg)
    images, labels = raw_crops(folder, n_raw)
    paths = {"folder": folder}
    for suffix in ("beton", "lmdb"):
        paths[f"raw_{suffix}"] = os.path.join(data, f"raw32.{suffix}")
        convert_dataset(
            ArraySource(images, labels), paths[f"raw_{suffix}"], write_mode="raw", num_workers=workers, progress=False
        )
        paths[f"jpeg_{suffix}"] = os.path.join(data, f"photos.{suffix}")
        convert_dataset(
            ImageFolderSource(folder),
            paths[f"jpeg_{suffix}"],
            write_mode="jpg",
            jpeg_quality=JPEG_QUALITY,
            num_workers=workers,
            progress=False,
        )
    view = open_dataset(paths["jpeg_beton"])
    meta = view.metadata["image"]
    files = [os.path.join(r, f) for r, _, fs in os.walk(folder) for f in fs]
    info = {
        "params": params,
        "paths": paths,
        "build_s": time.perf_counter() - t0,
        "raw": {"samples": n_raw, "side": 32},
        "jpeg": {
            "samples": view.num_samples,
            "file_kb_mean": float(np.mean([os.path.getsize(f) for f in files]) / 1000),
            "payload_kb_mean": float(view.sizes["image"].mean() / 1000),
            "width_mean": float(meta["width"].mean()),
            "height_mean": float(meta["height"].mean()),
            "longer_mean": float(np.maximum(meta["width"], meta["height"]).mean()),
        },
    }
    with open(marker, "w") as f:
        json.dump(info, f, indent=2)
    return info


def warm_page_cache(*paths: str) -> None:
    """Read every file under ``paths`` once so the OS page cache holds them."""
    for path in paths:
        files = [os.path.join(r, f) for r, _, fs in os.walk(path) for f in fs] if os.path.isdir(path) else [path]
        for name in files:
            with open(name, "rb") as f:
                while f.read(1 << 24):
                    pass


# ----------------------------------------------------------------------------- plan
def groups(paths: dict, workers: list, epochs: int, with_ffcv: bool) -> list:
    """``[(key, title, configs, ratio pairs with targets, files to warm)]``."""

    def cfgs(kinds, pipeline, batch, workers_list):
        out = []
        for w in workers_list:
            for name, kind, path in kinds:
                out.append(
                    BenchConfig(
                        kind=kind,
                        path=path,
                        pipeline=pipeline,
                        batch_size=batch,
                        num_workers=w,
                        epochs=epochs,
                        size=CROP,
                        name=name,
                    )
                )
        return out

    ffcv = [("ffcv", "ffcv")] if with_ffcv else []
    raw = (
        [("ffload", "ffload", paths["raw_beton"])]
        + [(n, k, paths["raw_beton"]) for n, k in ffcv]
        + [
            ("dataloader (arrays)", "dataloader_arrays", paths["raw_beton"]),
            ("ffload (lmdb)", "ffload", paths["raw_lmdb"]),
        ]
    )
    jpeg = (
        [("ffload", "ffload", paths["jpeg_beton"])]
        + [(n, k, paths["jpeg_beton"]) for n, k in ffcv]
        + [("dataloader (PIL)", "dataloader_pil", paths["folder"])]
    )
    ceiling = [("decode ceiling", "decode_ceiling", paths["jpeg_beton"])]
    lmdb_jpeg = [("ffload (lmdb)", "ffload", paths["jpeg_lmdb"])]
    return [
        (
            "raw",
            "raw 32x32, SimpleRGBImageDecoder + flip",
            cfgs(raw, "simple", RAW_BATCH, workers),
            {
                ("ffload", "ffcv"): (">=", 1.3),
                ("ffload", "dataloader (arrays)"): (">=", 3.0),
                ("ffload (lmdb)", "ffload"): (">=", 0.9),
            },
            [paths["raw_beton"], paths["raw_lmdb"]],
        ),
        (
            "rrc",
            "JPEG, RandomResizedCrop(224) + flip",
            cfgs(jpeg + ceiling + lmdb_jpeg, "rrc", JPEG_BATCH, workers),
            {
                ("ffload", "ffcv"): (">=", 1.5),
                ("ffload", "decode ceiling"): (">=", 0.8),
                ("ffload", "dataloader (PIL)"): (">=", 1.7),
                ("ffload (lmdb)", "ffload"): (">=", 0.9),
            },
            [paths["jpeg_beton"], paths["jpeg_lmdb"], paths["folder"]],
        ),
        (
            "center",
            "JPEG, CenterCrop(224, ratio=224/256) + flip",
            cfgs(jpeg, "center", JPEG_BATCH, workers),
            {("ffload", "ffcv"): (">=", 1.5), ("ffload", "dataloader (PIL)"): (">=", 1.7)},
            [paths["jpeg_beton"], paths["folder"]],
        ),
    ]


def warm_numba_cache(paths: dict) -> None:
    """One short ffload run per pipeline so that the timed runs find numba's on-disk cache warm."""
    from ffload.bench import measure

    for path, pipeline, batch in (
        (paths["raw_beton"], "simple", RAW_BATCH),
        (paths["jpeg_beton"], "rrc", JPEG_BATCH),
        (paths["jpeg_beton"], "center", JPEG_BATCH),
    ):
        r = measure(
            BenchConfig(
                kind="ffload",
                path=path,
                pipeline=pipeline,
                batch_size=batch,
                num_workers=1,
                epochs=1,
                size=CROP,
                limit=2 * batch,
            )
        )
        if "error" in r:
            sys.exit(f"ffload failed on {path} ({pipeline}): {r['error']}")


# ----------------------------------------------------------------------------- report
def startup_table(results_by_group: dict, rss_rows: list) -> str:
    def med(key, group, name):
        vals = [
            r[key]
            for r in results_by_group.get(group, [])
            if r["name"] == name and "error" not in r and r.get(key) is not None
        ]
        return None if not vals else float(np.median(vals))

    def fmt(v, spec=".2f"):
        return "-" if v is None else format(v, spec)

    lines = ["| measurement | value | target |", "|---|---|---|"]
    for group, label in (("raw", "raw"), ("rrc", "JPEG rrc")):
        lines += [
            f"| ffload {label}: `import ffload` -> first batch, warm numba cache, torch imported (s) | "
            f"{fmt(med('first_batch_s', group, 'ffload'))} | <= 2 |",
            f"| ffload {label}: process spawn -> first batch, incl. `import torch` (s) | "
            f"{fmt(med('first_batch_total_s', group, 'ffload'))} | - |",
            f"| ffload {label}: `import torch` alone (s) | {fmt(med('import_torch_s', group, 'ffload'))} | - |",
        ]
    for group, label in (("raw", "raw"), ("rrc", "JPEG rrc")):
        if not any(r["name"] == "ffcv" for r in results_by_group.get(group, [])):
            continue
        first, imp, build = (med(k, group, "ffcv") for k in ("first_batch_s", "import_s", "build_s"))
        compile_s = None if None in (first, imp, build) else first - imp - build
        lines += [
            f"| ffcv {label}: import (s) | {fmt(imp)} | - |",
            f"| ffcv {label}: `Loader()` (code generation) (s) | {fmt(build)} | - |",
            f"| ffcv {label}: `Loader()` -> first batch (JIT compilation) (s) | {fmt(compile_s)} | - |",
            f"| ffcv {label}: epoch 0 (s), vs ffload's | {fmt(med('epoch0_s', group, 'ffcv'))} vs "
            f"{fmt(med('epoch0_s', group, 'ffload'))} | - |",
        ]
    for row in rss_rows:
        lines.append(
            f"| ffload {row['name']}: RSS growth over 20 epochs after epoch 1 (MiB); peak RSS (MiB) | "
            f"{fmt(row['rss_growth_mb'], '+.1f')}; {fmt(row['peak_rss_mb'], '.0f')} | <= 50 |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small datasets, one round, 3 epochs (< 3 min)")
    ap.add_argument("--num-workers", type=int, default=2, help="num_workers of every loader (default 2)")
    ap.add_argument("--repeats", type=int, default=None, help="interleaved rounds (default 3; --quick 1)")
    ap.add_argument(
        "--epochs", type=int, default=None, help="epochs per run, epoch 0 excluded from img/s (default 4; --quick 3)"
    )
    ap.add_argument("--raw-samples", type=int, default=None, help="default 50000 (--quick 10000)")
    ap.add_argument("--jpeg-samples", type=int, default=None, help="default 1536 (--quick 384)")
    ap.add_argument("--data", default=None, help="dataset folder, kept and reused (default: a temporary folder)")
    ap.add_argument("--out", default="runs/bench_loaders", help="where results.md / results.json / PNGs go")
    ap.add_argument("--plot", action="store_true", help="also sweep --workers-list and plot img/s vs num_workers")
    ap.add_argument("--workers-list", default="1,2", help="worker counts of the --plot sweep")
    ap.add_argument("--no-ffcv", action="store_true", help="skip ffcv even when installed")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per measurement")
    args = ap.parse_args()
    repeats = args.repeats or (1 if args.quick else 3)
    epochs = args.epochs or (3 if args.quick else 4)
    n_raw = args.raw_samples or (10000 if args.quick else 50000)
    n_jpeg = args.jpeg_samples or (384 if args.quick else 1536)
    with_ffcv = ffcv_available() and not args.no_ffcv
    workers = (
        sorted({int(w) for w in args.num_workers_list.split(",")} | {args.num_workers})
        if args.plot
        else [args.num_workers]
    )

    t_start = time.perf_counter()
    env = measurement_conditions()
    env["load_avg_start"] = env.pop("load_avg")
    data = args.data or tempfile.mkdtemp(prefix="bench_loaders_")
    try:
        info = prepare_data(data, n_raw, n_jpeg, args.num_workers)
        paths = info["paths"]
        warm_numba_cache(paths)
        print(f"data ready in {time.perf_counter() - t_start:.0f} s: {data}", file=sys.stderr)
        results_by_group, sections, all_rows = {}, [], {}
        for key, title, configs, targets, warm in groups(paths, workers, epochs, with_ffcv):
            warm_page_cache(*warm)
            print(f"== {title}", file=sys.stderr)

            def progress(r):
                status = f"{r['img_s']:.0f} img/s" if "error" not in r else f"FAILED {r['error'][:300]}"
                print(
                    f"  round {r['round'] + 1}: {r['name']} ({r['config']['num_workers']}w): {status}", file=sys.stderr
                )

            results = run_rounds(configs, repeats, args.timeout, progress)
            results_by_group[key] = results
            rows = summarize(results)
            if key == "center":  # the decode ceiling does not depend on the crop: reuse group 2's
                rows += [r for r in all_rows.get("rrc", []) if r["kind"] in ("decode_ceiling", "decode_single_thread")]
                targets = {**targets, ("ffload", "decode ceiling"): (">=", 0.8)}
            all_rows[key] = rows
            ratios = compute_ratios(rows, list(targets))
            if args.plot:
                os.makedirs(args.out, exist_ok=True)
                plot_throughput(
                    rows, os.path.join(args.out, f"workers_{key}.png"), f"{title}, batch {rows[0]['batch_size']}"
                )
            sections.append(
                {
                    "key": key,
                    "title": title,
                    "rows": rows,
                    "ratios": ratios,
                    "targets": {f"{a} / {b}": list(t) for (a, b), t in targets.items()},
                    "table": format_rows(rows),
                    "ratio_table": format_ratios(ratios, targets),
                }
            )

        print("== RSS over 20 epochs", file=sys.stderr)
        rss_configs = [
            BenchConfig(
                kind="ffload",
                path=paths["raw_beton"],
                pipeline="simple",
                batch_size=RAW_BATCH,
                num_workers=args.num_workers,
                epochs=22,
                name="raw 32x32",
            )
        ]
        if not args.quick:
            rss_configs.append(
                BenchConfig(
                    kind="ffload",
                    path=paths["jpeg_beton"],
                    pipeline="rrc",
                    batch_size=JPEG_BATCH,
                    num_workers=args.num_workers,
                    epochs=22,
                    size=CROP,
                    limit=min(512, info["jpeg"]["samples"]),
                    name="JPEG rrc (512 samples)",
                )
            )
        rss_rows = summarize(run_rounds(rss_configs, 1, args.timeout))
        env["load_avg_end"] = os.getloadavg()
        env["total_s"] = time.perf_counter() - t_start

        jp = info["jpeg"]
        md = [
            f"# Loader benchmark ({'quick' if args.quick else 'full'})",
            "",
            f"{format_conditions(env)}; load average {env['load_avg_start'][0]:.2f} at start, "
            f"{env['load_avg_end'][0]:.2f} at end.",
            "",
            f"{args.num_workers} workers, {repeats} interleaved round(s), {epochs} epochs per run "
            f"(img/s: median of epochs 1+ per run, then median over rounds); order RANDOM, os_cache, "
            f"drop_last=False, page cache warm. Total {env['total_s']:.0f} s.",
            "",
            f"Data: raw 32x32: {n_raw} samples, batch {RAW_BATCH}. JPEG: {jp['samples']} images, mean "
            f"{jp['width_mean']:.0f}x{jp['height_mean']:.0f} px (longer side {jp['longer_mean']:.0f}), "
            f"{jp['payload_kb_mean']:.0f} KB mean payload (q{JPEG_QUALITY}), batch {JPEG_BATCH}, output "
            f"{CROP}x{CROP}.",
            "",
        ]
        for s in sections:
            md += [f"## {s['title']}", "", s["table"], "", s["ratio_table"], ""]
        md += ["## Start-up and memory", "", startup_table(results_by_group, rss_rows), ""]
        text = "\n".join(md)
        print(text)
        write_results(
            args.out,
            text,
            {
                "environment": env,
                "data": info,
                "sections": sections,
                "rss": rss_rows,
                "runs": results_by_group,
                "args": vars(args),
            },
        )
        print(f"\nwrote {args.out}/results.md and results.json", file=sys.stderr)
    finally:
        if args.data is None:
            shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    main()
