"""Plot the recorded benchmark results, one figure per question, for the documentation's benchmarks page.

    python scripts/plot_benchmarks.py                       # docs/_static/benchmarks/*.png
    python scripts/plot_benchmarks.py --out DIR

Runs nothing: the numbers below are the same-run ratios (ffload's median over the peer's median, both measured
in one run of the named script, rounds interleaved) that those scripts printed and that the README recorded with
each change (see docs/benchmarks.md for the machine and command line of each). A bar is a ratio; a range is the
lowest and highest ratio of the runs recorded. Rerun a script to measure again on your machine: its report records
the versions and the machine (``ffload.bench.measurement_conditions``).
"""

from __future__ import annotations

import argparse
import os

# question id -> (title, machine, [(label, low, high, peer)]); low == high for a single ratio
RESULTS = {
    "convert": (
        "Conversion time: ffload vs ffcv's DatasetWriter",
        "2-core VM; bench_convert.py (2 workers), bench_passthrough.py (2 workers)",
        [
            ("660 photos, raw", 1.32, 1.45, "ffcv DatasetWriter"),
            ("660 photos, jpg (re-encoded)", 1.33, 1.61, "ffcv DatasetWriter"),
            ("2000 JPEGs, jpg (pass-through)", 10.2, 10.2, "ffcv DatasetWriter"),
        ],
    ),
    "jpeg_loading": (
        "JPEG loading rate: ffload vs ffcv's Loader, same .beton",
        "2-core VM; bench_jpeg.py --fast-dct, one run",
        [
            ("CIFAR-sized, decode + flip, 1 worker", 1.32, 1.32, "ffcv Loader"),
            ("CIFAR-sized, decode + flip, 2 workers", 1.35, 1.35, "ffcv Loader"),
            ("~430 px, RandomResizedCrop(224) + flip, 1 worker", 2.74, 2.74, "ffcv Loader"),
            ("~430 px, RandomResizedCrop(224) + flip, 2 workers", 2.36, 2.36, "ffcv Loader"),
            ("~430 px, CenterCrop(224) + flip, 1 worker", 2.70, 2.70, "ffcv Loader"),
            ("~430 px, CenterCrop(224) + flip, 2 workers", 3.00, 3.00, "ffcv Loader"),
        ],
    ),
    "augment": (
        "Augmentation stacks (Deep Lake's), 2 workers: ffload vs DataLoader",
        "2-core Intel Xeon (Sapphire Rapids) VM; bench_augment.py, two runs",
        [
            ("complex stack vs DataLoader + PIL", 4.21, 4.25, "DataLoader + PIL"),
            ("complex stack vs DataLoader + Albumentations", 2.03, 2.08, "DataLoader + Albumentations"),
            ("simple stack vs DataLoader + PIL", 2.42, 2.49, "DataLoader + PIL"),
            ("simple stack vs DataLoader + Albumentations", 1.74, 1.77, "DataLoader + Albumentations"),
        ],
    ),
    "larger_than_ram": (
        "A 29.9 GiB raw .beton larger than RAM, cold disk, 2 workers: ffload vs ffcv",
        "2-core VM, virtio SSD; bench_scale.py",
        [
            ("os_cache=False, quasi_random (1.5 GiB RSS vs 5.1)", 1.15, 1.15, "ffcv Loader"),
            ("os_cache=True, random", 6.95, 6.95, "ffcv Loader"),
            ("os_cache=True, quasi_random", 1.40, 1.40, "ffcv Loader"),
        ],
    ),
    "remote": (
        "A cold quasi_random epoch from a loopback S3 server: ffload vs WebDataset",
        "2-core VM, moto S3 server on 127.0.0.1; bench_remote.py, medians of 3",
        [("3300 JPEGs, 128x128 center crops, 2 workers", 1.27, 1.27, "WebDataset + DataLoader")],
    ),
    "ray_convert": (
        "Conversion on Ray, 2200 photos re-encoded: 2 Ray processes vs 1",
        "2-core VM, local Ray instance; bench_ray_convert.py, two runs",
        [
            ("one .beton (the driver writes)", 1.45, 1.76, "1 Ray process"),
            ("sharded (each task writes its shards)", 1.71, 2.00, "1 Ray process"),
        ],
    ),
}


def plot(question: str, out_dir: str) -> str:
    """Write ``out_dir/<question>.png``: one horizontal bar per row, the ratio (a range as an error bar),
    a line at 1 (as fast as the peer). Returns the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    title, machine, rows = RESULTS[question]
    labels = [label for label, *_ in rows]
    mids = [(low + high) / 2 for _, low, high, _ in rows]
    errs = [[m - low for m, (_, low, _, _) in zip(mids, rows)], [high - m for m, (_, _, high, _) in zip(mids, rows)]]
    fig, ax = plt.subplots(figsize=(7.5, 0.55 * len(rows) + 1.4), dpi=100)
    ax.barh(range(len(rows)), mids, xerr=errs, color="#3b7dd8", capsize=3)
    ax.axvline(1.0, color="black", linewidth=0.8)
    for y, (_, low, high, peer) in enumerate(rows):
        text = f"{low:.2f}x" if low == high else f"{low:.2f}-{high:.2f}x"
        ax.text(high * 1.02 + 0.02, y, f"{text} {peer}", va="center", fontsize=8)
    ax.set_yticks(range(len(rows)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, max(high for _, _, high, _ in rows) * 1.6)
    ax.set_xlabel("ffload's rate / the peer's rate, same run (higher is better for ffload)", fontsize=8)
    ax.set_title(title, fontsize=9)
    fig.text(0.01, 0.01, machine, fontsize=7, color="#555555")
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    path = os.path.join(out_dir, f"{question}.png")
    fig.savefig(path)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "docs", "_static", "benchmarks"))
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    for question in RESULTS:
        print(plot(question, args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
