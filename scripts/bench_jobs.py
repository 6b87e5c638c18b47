"""Batches per job against worker count: raw 32x32 images/s of each ``batches_per_job`` at each
``num_workers``, same run, rounds interleaved, as ratios to the first ``--jobs`` value (``"auto"``).

    python scripts/bench_jobs.py                                   # 1, 2 workers (2-core VM), ~1 min
    python scripts/bench_jobs.py --workers 4,8,16 --jobs auto,10,20,40,170 --seconds 2   # a 16-core node

Why: every job runs the same Python under the GIL (seeds, contexts, kernel calls, hand-offs), which
all workers share; with many workers on small batches that Python, not the kernels, bounds the
loader, and only longer jobs amortise it. This measures where the automatic job size stands
against fixed ones on this machine.

Dataset: ``--samples`` raw 32x32 images of random pixels (:func:`ffload.bench.datasets.write_random_raw`,
built in ``--data`` and reused). Pipeline: ``SimpleRGBImageDecoder`` + ``RandomHorizontalFlip`` +
``ToTensor`` + ``ToTorchImage``, labels ``IntDecoder``; batch 256, random order, page cache warm.
Epochs (``--epochs``): ``cifar`` (50,000 samples, CIFAR-10's train set: 196 batches, where the
epoch caps the automatic size) and ``long`` (ImageNet-1k's train set, 1,281,167 samples: 5,005
batches, where the job limits do: 42 per job at 16 workers, 170 once the jobs are measured
fast). Progress goes to stderr; ``--out``
gets ``results.md`` and ``results.json`` (per-round rates). Every config runs in this process,
one ``Loader`` at a time, ``--seconds`` after its first batch and enough more to fill every job
slot once; the configs run in order, then reversed, for ``--rounds``; the table shows medians.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

BATCH_SIZE = 256


def rate(path: str, workers: int, per_job, indices: np.ndarray, seconds: float) -> tuple[float, int]:
    """Images/s of one config over ``seconds`` after its first batch and enough batches to fill
    every job slot once (:func:`ffload.bench.doctor.probes.loader_rate` with ``warm_slots``: no
    slot's first touch of its buffers is timed), and the job size it ran last."""
    import ffload
    from ffload.bench.doctor.probes import loader_rate
    from ffload.loaders import IntDecoder, RandomHorizontalFlip, SimpleRGBImageDecoder, ToTensor, ToTorchImage

    built = []

    def make(num_workers):
        pipelines = {
            "image": [SimpleRGBImageDecoder(), RandomHorizontalFlip(), ToTensor(), ToTorchImage()],
            "label": [IntDecoder(), ToTensor()],
        }
        loader = ffload.Loader(
            path,
            batch_size=BATCH_SIZE,
            num_workers=num_workers,
            order="random",
            pipelines=pipelines,
            indices=indices,
            batches_per_job=per_job,
        )
        built.append(loader)
        return loader

    measured = loader_rate(make, workers, seconds, warm_slots=True)
    return measured["img_s"], built[0].stats()["batches_per_job"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", default="1,2", help="num_workers values (at most the usable CPUs)")
    ap.add_argument("--jobs", default="auto,5,10,20,40", help="batches_per_job values")
    ap.add_argument(
        "--epochs", default="cifar,long", help="cifar (50,000 samples) and/or long (1,281,167), comma-separated"
    )
    ap.add_argument("--samples", type=int, default=20000, help="images in the dataset")
    ap.add_argument("--seconds", type=float, default=1.0, help="timed seconds per config and round")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--data", default="runs/bench_jobs_data")
    ap.add_argument("--out", default="runs/bench_jobs")
    args = ap.parse_args()

    from ffload.bench import format_conditions, measurement_conditions, write_results
    from ffload.bench.datasets import write_random_raw
    from ffload.system import available_cpus

    asked = [int(w) for w in args.workers.split(",")]
    workers = [w for w in asked if w <= available_cpus()] or [1]
    if workers != asked:
        print(f"workers {asked} cut to {workers}: {available_cpus()} usable CPUs", file=sys.stderr)
    jobs = [j if j == "auto" else int(j) for j in args.jobs.split(",")]
    names = args.epochs.split(",")
    if not set(names) <= {"cifar", "long"}:
        ap.error(f"--epochs: cifar and/or long, got {args.epochs}")
    os.makedirs(args.data, exist_ok=True)
    path = os.path.join(args.data, f"raw32_{args.samples}.beton")
    if not os.path.exists(path):
        write_random_raw(path, args.samples)
    lengths = {"cifar": 50000, "long": 1281167}
    epochs = {name: lengths[name] for name in names}
    configs = [(e, w, j) for e in epochs for w in workers for j in jobs]
    rate(path, 1, "auto", np.arange(args.samples), 0.1)  # compile before any timing
    rates: dict = {c: [] for c in configs}
    sizes: dict = {}
    t0 = time.perf_counter()
    for r in range(args.rounds):
        for c in configs if r % 2 == 0 else configs[::-1]:
            epoch, w, j = c
            value, sizes[c] = rate(path, w, j, np.resize(np.arange(args.samples), epochs[epoch]), args.seconds)
            rates[c].append(value)
            print(f"round {r + 1} {epoch} {w} workers, batches_per_job {j}: {value:,.0f} img/s", file=sys.stderr)
    conditions = measurement_conditions()
    lines = [
        "# bench_jobs: batches_per_job against num_workers, raw 32x32, batch 256",
        "",
        format_conditions(conditions),
        "",
        f"{args.rounds} round(s) of {args.seconds:g} s per config, medians; {time.perf_counter() - t0:.0f} s",
        "",
    ]
    data = {"environment": conditions, "args": vars(args), "cells": []}
    for epoch, samples in epochs.items():
        lines += [
            f"## {epoch} epochs ({samples} samples, {-(-samples // BATCH_SIZE)} batches)",
            "",
            "| workers | "
            + " | ".join(f"{j} (img/s)" for j in jobs)
            + "".join(f" | {j} / {jobs[0]}" for j in jobs[1:])
            + " |",
            "|---" * (2 * len(jobs)) + "|",
        ]
        for w in workers:
            med = {j: statistics.median(rates[(epoch, w, j)]) for j in jobs}
            cells = [f"{med[j]:,.0f}" + (f" ({sizes[(epoch, w, j)]})" if j == "auto" else "") for j in jobs]
            ratios = [f"{med[j] / med[jobs[0]]:.2f}" for j in jobs[1:]]
            lines.append(f"| {w} | " + " | ".join(cells + ratios) + " |")
            chosen = {str(j): sizes[(epoch, w, j)] for j in jobs}
            data["cells"].append(
                {
                    "epoch": epoch,
                    "workers": w,
                    "img_s": {str(j): v for j, v in med.items()},
                    "rounds": {str(j): rates[(epoch, w, j)] for j in jobs},
                    "batches_per_job": chosen,
                }
            )
        lines.append("")
    if "auto" in jobs:
        lines.append("(n) after auto's rate: the batches per job it ran.")
    text = "\n".join(lines)
    print(text)
    write_results(args.out, text, data)


if __name__ == "__main__":
    main()
