"""How far a DCT-scaled JPEG decode lands from a full decode, by how much the crop shrinks.

    python scripts/jpeg_scale_quality.py                       # the benchmark photos, ~15 s
    python scripts/jpeg_scale_quality.py --folder /data/imagenet/val --max-images 2000

The resized-crop decoders (``ffload.codecs.jpeg``) may decode a JPEG at DCT scale M/8 and resize
the crop from there instead of from a full-size decode. This script measures what that costs in
pixels, to choose the rule: for every JPEG of ``--folder`` (default: the ImageNet-sized photo set
of ``ffload.bench.datasets``, film grain included, built there once) and every ratio ``r`` of
``--ratios``, the centred square box of side ``c`` (the shorter side) is resized to
``floor(c / r)`` pixels twice with the same compiled resize
(``ffload.codecs.resize.resize_rgb``, the decoders' interpolation rule): from a full-size
TurboJPEG decode, and from a decode at M/8 with the box's edges times M/8, as the decoders map
them. Both decodes are of the whole image, where the decoders decode the box's region only (its
chroma upsampling differs on the region's border: a few levels on a pixel or two). The table
gives the mean absolute difference (grey levels, over all pixels and channels of one image), its
mean, 95th percentile and maximum over the images. The issue's rule for the decoders: within 2
grey levels of the full decode + resize, mean absolute difference. Files libjpeg-turbo refuses or
warns about are skipped and counted.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))

from ffload.bench import write_results  # noqa: E402
from ffload.bench.datasets import build_photo_jpegs  # noqa: E402
from ffload.codecs import jpeg  # noqa: E402
from ffload.codecs.resize import interpolation, resize_rgb, scratch_size  # noqa: E402

DEFAULT_FOLDER, DEFAULT_IMAGES = "runs/bench_augment_data/photos512", 512


def jpeg_files(folder: str, limit: int) -> list[str]:
    """The first ``limit`` ``.jpg``/``.jpeg`` files under ``folder`` (any case), sorted."""
    found = sorted(
        os.path.join(d, f) for d, _, names in os.walk(folder) for f in names if f.lower().endswith((".jpg", ".jpeg"))
    )
    return found[:limit]


def decode(data: np.ndarray, m: int, path: str) -> np.ndarray:
    """``(ceil(H*m/8), ceil(W*m/8), 3) uint8``: the whole JPEG at DCT scale m/8. Raises
    ValueError naming ``path`` where libjpeg-turbo fails or warns."""
    size, error = jpeg.header_size(data)
    if size is not None:
        w, h = size
        out = np.empty(((h * m + 7) // 8, (w * m + 7) // 8, 3), np.uint8)
        error = jpeg.decode_whole(data, out, m)
    if error:
        raise ValueError(f"{path}: {error}")
    return out


def resized(image: np.ndarray, top: float, left: float, side: float, out: int, mode: int) -> np.ndarray:
    """``(out, out, 3) uint8``: the square window ``(top, left, side)`` (pixels, fractional) of
    ``image`` resized by the decoders' compiled resize with interpolation ``mode``."""
    h, w = image.shape[:2]
    dst = np.empty(out * out * 3, np.uint8)
    tmp = np.empty(scratch_size(out, out, w), np.uint16)
    resize_rgb(image.reshape(-1), 0, w * 3, h, w, top, left, side, side, mode, dst, 0, out, out, False, tmp)
    return dst.reshape(out, out, 3)


def measure(files: list[str], factors: list[int], ratios: list[float]) -> tuple[dict, list[str]]:
    """``({(m, r): (n,) float64}, skipped)``: per-image mean absolute differences (grey levels),
    and the messages of the files that did not decode."""
    diffs = {(m, r): [] for m in factors for r in ratios}
    skipped = []
    for path in files:
        data = np.fromfile(path, np.uint8)
        try:
            full = decode(data, 8, path)
            scaled = {m: decode(data, m, path) for m in factors}
        except ValueError as e:
            skipped.append(str(e))
            continue
        h, w = full.shape[:2]
        side = min(h, w)
        top, left = (h - side) // 2, (w - side) // 2
        for r in ratios:
            out = int(side // r)
            if out < 1:
                continue
            mode = interpolation(side, side, out, out)
            ref = resized(full, top, left, side, out, mode).astype(np.int16)
            for m in factors:
                f = m / 8  # the scale: box edges in the scaled image, as jpeg._decode_jpeg maps them
                diffs[m, r].append(np.abs(resized(scaled[m], top * f, left * f, side * f, out, mode) - ref).mean())
    return {key: np.array(v) for key, v in diffs.items()}, skipped


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--folder",
        default=DEFAULT_FOLDER,
        help="JPEGs (any folder tree); the default, bench_augment.py's 512 photos, is built if missing",
    )
    ap.add_argument("--max-images", type=int, default=512)
    ap.add_argument("--factors", default="4,2,1", help="DCT scale numerators M (scale M/8)")
    ap.add_argument("--ratios", default="2,2.5,3,3.5,4,5,6,8", help="box side / output side")
    ap.add_argument("--out", default="runs/jpeg_scale_quality")
    args = ap.parse_args()
    if jpeg.backend() != "turbojpeg":
        sys.exit("needs the TurboJPEG library (ffload.codecs.jpeg.backend() is 'opencv')")
    factors = [int(m) for m in args.factors.split(",")]
    ratios = [float(r) for r in args.ratios.split(",")]
    if not all(1 <= m <= 8 for m in factors) or not all(r > 0 for r in ratios):
        sys.exit(f"--factors must lie in 1..8 and --ratios be positive, got {args.factors!r}, {args.ratios!r}")
    if not os.path.isdir(args.folder):
        if args.folder != DEFAULT_FOLDER:
            sys.exit(f"{args.folder}: no such folder")
        build_photo_jpegs(args.folder, DEFAULT_IMAGES)
    files = jpeg_files(args.folder, args.max_images)
    if not files:
        sys.exit(f"{args.folder}: no JPEG files")
    diffs, skipped = measure(files, factors, ratios)
    md = [
        f"# DCT-scaled decode vs full decode + resize ({len(files)} JPEGs of `{args.folder}`)",
        "",
        "Mean absolute difference per image, grey levels (centred square box, the decoders' resize).",
        f"Skipped (libjpeg-turbo error or warning): {len(skipped)}" + (f", e.g. {skipped[0]}" if skipped else ""),
        "",
        "| scale | box / output | images | mean | p95 | max |",
        "|---|---|---|---|---|---|",
    ]
    for (m, r), d in diffs.items():
        if d.size:
            md.append(f"| {m}/8 | {r:g} | {d.size} | {d.mean():.2f} | {np.percentile(d, 95):.2f} | {d.max():.2f} |")
    text = "\n".join(md) + "\n"
    print(text)
    write_results(
        args.out, text, {"diffs": {f"{m}/8 x{r:g}": d.tolist() for (m, r), d in diffs.items()}, "skipped": skipped}
    )


if __name__ == "__main__":
    main()
