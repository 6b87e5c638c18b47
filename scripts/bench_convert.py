"""Conversion speed: ffload's ``convert_dataset`` vs ffcv 1.0.2's ``DatasetWriter``, side by side; and the cost of
the decode rule (Pillow's pixels) against the decoders it replaced or follows.

    python scripts/bench_convert.py [--folder DIR] [--workers 2] [--repeats 3] [--modes raw jpg] [--decode-rounds 3]

Both convert the same ImageFolder with the same write mode, JPEG quality, max_resolution and
number of worker processes, reading images through the same decoder (ffload's ImageFolderSource,
so the comparison is about encoding and writing, not about PIL vs OpenCV). Runs alternate
(ffload, ffcv, ffload, ...) so that machine noise hits both alike; each run is timed end to
end (process pool start to file closed) in a fresh subprocess, and the median is reported with
the ratio ffcv_time / ffload_time (> 1: ffload is faster). Without --folder, a folder of real
photos is built with ``ffload.convert.demo_data.build_photos_folder``.

The decode table times, per file format of the folder, one thread decoding every file's bytes (already in memory)
to ``(H, W, 3) uint8`` RGB: ffload's decoder of record (``ffload.convert.images.decode_image_bytes``), plain
OpenCV (``cv2.imdecode`` + BGR->RGB, what conversions used before the rule), and Pillow as torchvision's
``ImageFolder`` calls it (``exif_transpose(open(f)).convert("RGB")``), in interleaved rounds; medians and ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from ffload.bench.conditions import format_conditions, measurement_conditions

RUNNER = r"""
import json, sys, time
from ffload.convert.sources import ImageFolderSource
kind, folder, dst, mode, quality, workers, maxres = sys.argv[1:8]
workers, quality = int(workers), int(quality)
maxres = None if maxres == "none" else int(maxres)
src = ImageFolderSource(folder)
if kind == "ffload":
    from ffload.convert import convert_dataset
else:
    from ffcv.writer import DatasetWriter
    from ffcv.fields import RGBImageField, IntField
t0 = time.perf_counter()  # imports done: time the conversion only
if kind == "ffload":
    convert_dataset(src, dst, write_mode=mode, jpeg_quality=quality, max_resolution=maxres,
                    num_workers=workers, progress=False)
else:
    w = DatasetWriter(dst, {"image": RGBImageField(write_mode=mode, jpeg_quality=quality,
                                                   max_resolution=maxres),
                            "label": IntField()}, num_workers=workers)
    import contextlib, io
    with contextlib.redirect_stderr(io.StringIO()):
        w.from_indexed_dataset(src)
print(json.dumps({"seconds": time.perf_counter() - t0, "samples": len(src)}))
"""


def run_once(kind, folder, dst, mode, quality, workers, maxres):
    if os.path.lexists(dst):
        subprocess.run(["rm", "-rf", dst], check=True)
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            RUNNER,
            kind,
            folder,
            dst,
            mode,
            str(quality),
            str(workers),
            "none" if maxres is None else str(maxres),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def decode_rates(folder: str, rounds: int) -> list[dict]:
    """Per format: img/s of ffload's decode rule, OpenCV and Pillow on the folder's files (see the docstring)."""
    import io
    import time

    import cv2
    import numpy as np
    from PIL import Image, ImageOps

    from ffload.convert.images import decode_image_bytes
    from ffload.convert.sources import ImageFolderSource

    def opencv(data, name):
        return cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)[..., ::-1]

    def pillow(data, name):
        return np.asarray(ImageOps.exif_transpose(Image.open(io.BytesIO(data))).convert("RGB"))

    decoders = {"ffload": decode_image_bytes, "opencv": opencv, "pillow": pillow}
    by_format: dict[str, list[tuple[str, bytes]]] = {}
    for path, _ in ImageFolderSource(folder).samples:
        with open(path, "rb") as f:
            data = f.read()
        fmt = "JPEG" if data[:2] == b"\xff\xd8" else "PNG" if data[:4] == b"\x89PNG" else "other"
        by_format.setdefault(fmt, []).append((path, data))
    rows = []
    for fmt, files in sorted(by_format.items()):
        times = {name: [] for name in decoders}
        for _ in range(rounds):
            for name, decode in decoders.items():
                t0 = time.perf_counter()
                for path, data in files:
                    decode(data, path)
                times[name].append(time.perf_counter() - t0)
        rate = {name: len(files) / statistics.median(t) for name, t in times.items()}
        rows.append(
            {
                "format": fmt,
                "files": len(files),
                **{f"{k}_img_s": v for k, v in rate.items()},
                "ffload_vs_opencv": rate["ffload"] / rate["opencv"],
                "ffload_vs_pillow": rate["ffload"] / rate["pillow"],
                "runs": times,
            }
        )
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--folder", help="ImageFolder to convert (default: build the demo photos)")
    ap.add_argument("--workers", type=int, default=os.cpu_count())
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--modes", nargs="+", default=["raw", "jpg"])
    ap.add_argument("--quality", type=int, default=90)
    ap.add_argument("--max-resolution", type=int, default=None)
    ap.add_argument("--per-class", type=int, default=60, help="demo photos per class (without --folder)")
    ap.add_argument("--decode-rounds", type=int, default=3, help="rounds of the decode table (0: none)")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    try:
        import ffcv  # noqa: F401
    except ImportError:
        sys.exit("ffcv is not installed: pip install 'ffload[ffcv]' (needs pkg-config libopencv-dev libturbojpeg0-dev)")
    work = tempfile.mkdtemp(prefix="bench_convert_")
    folder = args.folder
    if folder is None:
        from ffload.convert.demo_data import build_photos_folder

        folder = os.path.join(work, "photos")
        build_photos_folder(folder, n_per_class=args.per_class)
    rows = []
    for mode in args.modes:
        times = {"ffload": [], "ffcv": []}
        for _ in range(args.repeats):
            for kind in ("ffload", "ffcv"):
                r = run_once(
                    kind,
                    folder,
                    os.path.join(work, f"{kind}.beton"),
                    mode,
                    args.quality,
                    args.workers,
                    args.max_resolution,
                )
                times[kind].append(r["seconds"])
                n = r["samples"]
        med = {k: statistics.median(v) for k, v in times.items()}
        rows.append(
            {
                "mode": mode,
                "samples": n,
                "workers": args.workers,
                "ffload_s": med["ffload"],
                "ffcv_s": med["ffcv"],
                "ffload_img_s": n / med["ffload"],
                "ffcv_img_s": n / med["ffcv"],
                "ratio": med["ffcv"] / med["ffload"],
                "runs": times,
            }
        )
    print(
        f"\nconversion of {folder} ({rows[0]['samples']} images), {args.workers} workers, "
        f"median of {args.repeats} alternating runs"
    )
    conditions = measurement_conditions()
    print(format_conditions(conditions))
    print("| mode | ffload s | ffcv s | ffload img/s | ffcv img/s | ffload speed-up vs ffcv |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['mode']} | {r['ffload_s']:.2f} | {r['ffcv_s']:.2f} | {r['ffload_img_s']:.0f} | "
            f"{r['ffcv_img_s']:.0f} | {r['ratio']:.2f}x |"
        )
    decode = decode_rates(folder, args.decode_rounds) if args.decode_rounds > 0 else []
    if decode:
        print(f"\ndecoding the same files in one thread, median of {args.decode_rounds} interleaved rounds")
        print(
            "| format | files | ffload (decode rule) img/s | OpenCV img/s | Pillow img/s | ffload / OpenCV | "
            "ffload / Pillow |"
        )
        print("|---|---|---|---|---|---|---|")
        for r in decode:
            print(
                f"| {r['format']} | {r['files']} | {r['ffload_img_s']:.0f} | {r['opencv_img_s']:.0f} | "
                f"{r['pillow_img_s']:.0f} | {r['ffload_vs_opencv']:.2f}x | {r['ffload_vs_pillow']:.2f}x |"
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"conditions": conditions, "rows": rows, "decode": decode}, f, indent=2)
    subprocess.run(["rm", "-rf", work])


if __name__ == "__main__":
    main()
