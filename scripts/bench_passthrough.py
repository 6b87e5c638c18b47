"""Conversion of a JPEG ImageFolder where pass-through applies: ffload vs ffcv 1.0.2's DatasetWriter.

    flock /tmp/ffload-bench.lock python scripts/bench_passthrough.py [--images 3000] [--workers 2] [--repeats 3]

Builds an ImageFolder of 3-channel JPEGs (quality 95, 390-650 px on the longer side, views of the bundled
photos: ``ffload.convert.demo_data``) unless ``--folder`` is given, then converts it to ``.beton`` with
``write_mode='jpg'`` three ways, alternating (ffload, ffload --reencode, ffcv, ffload, ...) so that machine noise
hits all alike, each in a fresh Python process:

* ``ffload``: pass-through (the source JPEGs stored as they are);
* ``ffload-reencode``: ``reencode=True`` (decode + encode at the same quality, as ffcv does);
* ``ffcv``: ``DatasetWriter(..., RGBImageField(write_mode='jpg')).from_indexed_dataset(src)``, reading the
  images through ffload's ``ImageFolderSource`` (OpenCV decode) as in ``scripts/bench_convert.py``.

Two times per run: the **whole process** (interpreter start, imports, conversion, exit; measured by this script
around the subprocess) and the conversion alone (measured inside, after the imports). Medians are reported with
the ratios ``ffcv / ffload`` (> 1: ffload is faster), and the closing note projects ImageNet-1k (1,281,167
JPEGs, ~110 KB mean) conversion time per core from ffload's measured rate, by images and by bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from ffload.bench.conditions import format_conditions, measurement_conditions

IMAGENET_IMAGES = 1_281_167
IMAGENET_MEAN_BYTES = 110e3
SCALE, QUALITY = 1.3, 95  # 390-650 px on the longer side: about ImageNet's sizes

RUNNER = r"""
import json, sys, time
kind, folder, dst, workers = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
from ffload.convert.sources import ImageFolderSource
if kind == "ffcv":
    from ffcv.writer import DatasetWriter
    from ffcv.fields import RGBImageField, IntField
else:
    from ffload.convert import convert_dataset
t0 = time.perf_counter()
src = ImageFolderSource(folder)
if kind == "ffcv":
    import contextlib, io
    w = DatasetWriter(dst, {"image": RGBImageField(write_mode="jpg", jpeg_quality=90), "label": IntField()},
                      num_workers=workers)
    with contextlib.redirect_stderr(io.StringIO()):
        w.from_indexed_dataset(src)
    passed = 0
else:
    r = convert_dataset(src, dst, write_mode="jpg", jpeg_quality=90, num_workers=workers, progress=False,
                        reencode=kind == "ffload-reencode")
    passed = r.passed_through
print(json.dumps({"seconds": time.perf_counter() - t0, "samples": len(src), "passed_through": passed}))
"""

KINDS = ("ffload", "ffload-reencode", "ffcv")


def build_folder(root: str, images: int) -> int:
    """``images`` 3-channel JPEGs (quality :data:`QUALITY`) under ``root/<class>/``; returns their total bytes."""
    import cv2
    import numpy as np

    from ffload.convert.demo_data import PHOTO_CLASSES, _load_photos, _random_view

    photos = _load_photos()
    total = 0
    for k in range(images):
        c = k % len(PHOTO_CLASSES)
        view = _random_view(photos[PHOTO_CLASSES[c]], np.random.default_rng([k, c]))
        if view.ndim == 2:
            view = np.repeat(view[:, :, None], 3, axis=2)
        view = cv2.resize(view, None, fx=SCALE, fy=SCALE, interpolation=cv2.INTER_CUBIC)
        path = os.path.join(root, PHOTO_CLASSES[c], f"{k:06d}.JPEG")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        cv2.imwrite(path, np.ascontiguousarray(view[:, :, ::-1]), [cv2.IMWRITE_JPEG_QUALITY, QUALITY])
        total += os.path.getsize(path)
    return total


def run_once(kind: str, folder: str, dst: str, workers: int) -> dict:
    if os.path.lexists(dst):
        os.remove(dst)
    t0 = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-c", RUNNER, kind, folder, dst, str(workers)], check=True, capture_output=True, text=True
    )
    whole = time.perf_counter() - t0
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result["whole"] = whole
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--folder", help="a JPEG ImageFolder to convert (default: build one)")
    ap.add_argument("--images", type=int, default=3000, help="images to build (without --folder)")
    ap.add_argument("--workers", type=int, default=os.cpu_count())
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    try:
        import ffcv  # noqa: F401
    except ImportError:
        sys.exit("ffcv is not installed: pip install 'ffload[ffcv]'")
    work = tempfile.mkdtemp(prefix="bench_passthrough_")
    folder = args.folder
    if folder is None:
        folder = os.path.join(work, "jpegs")
        build_folder(folder, args.images)
    source_bytes = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(folder) for f in fs)
    runs = {k: [] for k in KINDS}
    for _ in range(args.repeats):
        for kind in KINDS:
            runs[kind].append(run_once(kind, folder, os.path.join(work, "out.beton"), args.workers))
    n = runs["ffload"][0]["samples"]
    med = {k: {t: statistics.median(r[t] for r in v) for t in ("whole", "seconds")} for k, v in runs.items()}
    conditions = measurement_conditions()
    print(
        f"\nconversion of {folder}: {n} JPEGs, {source_bytes / n / 1e3:.0f} KB mean, write_mode jpg, "
        f"{args.workers} workers, median of {args.repeats} alternating runs; passed through: "
        f"{runs['ffload'][0]['passed_through']}"
    )
    print(format_conditions(conditions))
    print("| converter | whole process s | img/s | conversion s | img/s | ffcv / this (whole) | ffcv / this (conv.) |")
    print("|---|---|---|---|---|---|---|")
    for kind in KINDS:
        m = med[kind]
        print(
            f"| {kind} | {m['whole']:.2f} | {n / m['whole']:.0f} | {m['seconds']:.2f} | {n / m['seconds']:.0f} | "
            f"{med['ffcv']['whole'] / m['whole']:.2f}x | {med['ffcv']['seconds'] / m['seconds']:.2f}x |"
        )
    rate = n / med["ffload"]["seconds"] / max(args.workers, 1)  # images/s per core, conversion alone
    byte_rate = source_bytes / med["ffload"]["seconds"] / max(args.workers, 1)
    ffcv_rate = n / med["ffcv"]["seconds"] / max(args.workers, 1)
    print(
        f"\nImageNet-1k projection ({IMAGENET_IMAGES} JPEGs, {IMAGENET_MEAN_BYTES / 1e3:.0f} KB mean), per core: "
        f"ffload pass-through {IMAGENET_IMAGES / rate / 3600:.2f} h at {rate:.0f} img/s/core, or "
        f"{IMAGENET_IMAGES * IMAGENET_MEAN_BYTES / byte_rate / 3600:.2f} h at {byte_rate / 1e6:.0f} MB/s/core; "
        f"ffcv {IMAGENET_IMAGES / ffcv_rate / 3600:.2f} h at {ffcv_rate:.0f} img/s/core (these images are "
        f"smaller than ImageNet's: ffcv's per-image cost grows with pixels, so its projection is optimistic)"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"conditions": conditions, "images": n, "source_bytes": source_bytes, "runs": runs, "medians": med},
                f,
                indent=2,
            )
    subprocess.run(["rm", "-rf", work], check=False)


if __name__ == "__main__":
    main()
