"""``num_workers="auto"`` against every fixed ``num_workers`` x ``batches_ahead``, same run.

    python scripts/bench_autotune.py              # ~5 min on 2 cores
    python scripts/bench_autotune.py --quick      # ~90 s on 16 cores (raw and rrc, 4 situations, short runs)

Cells: pipeline x situation. Pipelines: ``raw`` (32x32 raw images, flip, batch 256), ``rrc``
(ImageNet-sized JPEGs, RandomResizedCrop 160, flip, batch 32), ``dl_complex`` (Deep Lake's
complex stack at 128 px, :data:`ffload.bench.config.DEEPLAKE_STACKS`, batch 16). Situations,
each in its own process:

* ``gpu``: a GPU-like consumer that sleeps ``step`` per batch (its thread uses no CPU);
* ``cpu``: a consumer that needs a full core for ``step`` (single-threaded torch matmuls);
* ``affinity``: ``gpu``, the process restricted by ``os.sched_setaffinity`` to a quarter of
  the CPUs (at least 1);
* ``quota``: ``gpu``, the process in a cgroup whose CPU quota is a quarter of the CPUs (at
  least 1; cgroup v2 ``cpu.max`` or v1 ``cpu.cfs_quota_us``, created by the script where the
  machine lets it, else the cell is skipped and says why);
* ``memory``: ``gpu`` with a buffer budget of 4 batch slots: fixed settings needing more slots
  (``max(batches_ahead, num_workers) + 2``) are refused, the others run one batch per job; auto
  gets ``buffer_limit`` (within which ``batches_per_job="auto"`` also stays).

``step`` is ``job / (0.6 * cpus)``, ``job`` the batch time of one worker measured at the
start of each cell (the consumer needs about 60 % of the usable CPUs' output). Every config
runs ``--warm`` batches and ``--warm-seconds`` (auto converges in them), then ``--seconds`` timed; the configs run
in a rotated order for ``--repeats`` rounds and the medians are compared. Ratios: auto / the
best fixed setting, auto / today's default (``num_workers`` = the CPUs of the affinity mask,
the cgroup quota ignored as before this change, ``batches_ahead=3``). Goal (issue 33): auto >=
0.95x the best fixed setting everywhere, >= 1.2x the default where the default is wrong.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

PIPELINES = {
    "raw": ("raw", "simple", 256, 32),
    "rrc": ("jpeg", "rrc", 32, 160),
    "dl_complex": ("jpeg", "dl_complex", 16, 128),
}
"""name -> (dataset, :data:`ffload.bench.config.PIPELINES` name, batch size, output size)."""
SITUATIONS = ("gpu", "cpu", "affinity", "quota", "memory")
STEP_SHARE = 0.6
MEMORY_SLOTS = 4


def prepare(data: str, n_raw: int, n_jpeg: int) -> dict[str, str]:
    """The raw 32x32 and the JPEG ``.beton`` datasets in ``data`` (built once, reused)."""
    from ffload.bench.datasets import JPEG_QUALITY, build_photo_jpegs, raw_crops
    from ffload.convert import convert_dataset
    from ffload.convert.sources import ArraySource, ImageFolderSource

    paths = {"raw": os.path.join(data, f"raw32_{n_raw}.beton"), "jpeg": os.path.join(data, f"photos{n_jpeg}.beton")}
    folder = os.path.join(data, f"photos{n_jpeg}")
    if not os.path.isdir(folder):
        build_photo_jpegs(folder, n_jpeg)
    if not os.path.isfile(paths["jpeg"]):
        convert_dataset(
            ImageFolderSource(folder), paths["jpeg"], write_mode="jpg", jpeg_quality=JPEG_QUALITY, progress=False
        )
    if not os.path.isfile(paths["raw"]):
        images, labels = raw_crops(folder, n_raw)
        convert_dataset(ArraySource(images, labels), paths["raw"], write_mode="raw", progress=False)
    return paths


# ------------------------------------------------------------------ child
def _pipelines(pipeline: str, path: str, batch: int, size: int):
    import ffload.loaders
    from ffload.bench import BenchConfig
    from ffload.bench.pipelines import build_pipelines

    cfg = BenchConfig(kind="ffload", path=path, pipeline=pipeline, batch_size=batch, num_workers=1, epochs=1, size=size)
    return build_pipelines(cfg, {name: getattr(ffload.loaders, name) for name in ffload.loaders.__all__})


def _consumer(kind: str, step: float):
    """The consumer's work per batch: sleep ``step`` s, or burn ``step`` s of one core in
    single-threaded matmuls (which release the GIL, like a training step)."""
    if kind == "sleep":
        return lambda: time.sleep(step)
    import torch

    a = torch.randn(128, 128)
    t0, n = time.thread_time(), 0
    while time.thread_time() - t0 < 0.05:
        a @ a
        n += 1
    per = (time.thread_time() - t0) / n
    reps = max(1, round(step / per))

    def work():
        for _ in range(reps):
            a @ a

    return work


def _run(
    path, pipes, batch, workers, ahead, consume, warm, seconds, buffer_limit=None, warm_seconds=0.0, per_job="auto"
):
    """Images/s of one config with the consumer; the loader's stats at the end."""
    import ffload

    with ffload.Loader(
        path,
        batch_size=batch,
        num_workers=workers,
        batches_ahead=ahead,
        pipelines=pipes,
        buffer_limit=buffer_limit,
        batches_per_job=per_job,
    ) as loader:

        def batches():
            while True:
                yield from loader

        it = batches()
        n, t0 = 0, time.perf_counter()
        while n < warm or time.perf_counter() - t0 < warm_seconds:
            next(it)
            consume()
            n += 1
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            next(it)
            consume()
            n += 1
        rate = n * batch / (time.perf_counter() - t0)
        return rate, loader.stats()


def child(spec: dict) -> dict:
    """One cell, in this process (restricted first when the situation says so)."""
    if spec.get("cgroup_procs"):
        with open(spec["cgroup_procs"], "w") as f:
            f.write(str(os.getpid()))
    if spec.get("affinity"):
        os.sched_setaffinity(0, set(sorted(os.sched_getaffinity(0))[: spec["affinity"]]))
    import torch

    torch.set_num_threads(1)
    from ffload.loaders.loader import _slot_bytes
    from ffload.system import available_cpus

    cpus = available_cpus()
    default_workers = len(os.sched_getaffinity(0))  # before this change: the affinity mask only
    path, batch = spec["path"], spec["batch"]
    pipes = _pipelines(spec["pipeline"], path, batch, spec["size"])
    rate1, _ = _run(path, pipes, batch, 1, 3, lambda: None, min(10, spec["warm"]), spec["seconds"] / 2)  # compiles too
    job = batch / rate1
    step = job / (STEP_SHARE * cpus)
    consume = _consumer("busy" if spec["situation"] == "cpu" else "sleep", step)
    buffer_limit = None
    slots_allowed = None
    if spec["situation"] == "memory":
        import ffload

        with ffload.Loader(path, batch_size=batch, num_workers=1, pipelines=pipes, batches_per_job=1) as probe:
            per_slot = _slot_bytes(probe._pipelines)  # one batch's
        buffer_limit, slots_allowed = per_slot * MEMORY_SLOTS, MEMORY_SLOTS
    grid = [(w, a) for w in spec["workers"] for a in spec["ahead"] if w <= max(cpus, default_workers)]
    configs = [("auto", "auto")] + [c for c in dict.fromkeys(grid + [(default_workers, 3)])]
    rates: dict = {c: [] for c in configs}
    chosen, refused = {}, []
    for r in range(spec["repeats"]):
        for k in range(len(configs)):
            w, a = configs[(k + r) % len(configs)]
            if slots_allowed is not None and w != "auto" and max(a, w) + 2 > slots_allowed:
                refused.append(f"{w}x{a}")
                continue
            rate, stats = _run(
                path,
                pipes,
                batch,
                w,
                a,
                consume,
                spec["warm"],
                spec["seconds"],
                buffer_limit if w == "auto" else None,
                spec["warm_seconds"],
                1 if slots_allowed is not None and w != "auto" else "auto",  # the refusal counts batch slots
            )
            rates[(w, a)].append(rate)
            if w == "auto":
                chosen = {k2: stats[k2] for k2 in ("num_workers", "batches_ahead", "cap", "reserve", "need")}
                chosen["history"] = [(h["batch"], h["workers"], h["ahead"]) for h in stats["history"]]
    return {
        "cpus": cpus,
        "default": [default_workers, 3],
        "job_ms": job * 1e3,
        "step_ms": step * 1e3,
        "rates": [[w, a, statistics.median(v)] for (w, a), v in rates.items() if v],
        "refused": sorted(set(refused)),
        "auto": chosen,
    }


# ----------------------------------------------------------------- parent
def make_cgroup(cpus: float) -> tuple[str | None, str]:
    """A cgroup limited to ``cpus`` CPUs of run time: its ``cgroup.procs`` path and a note, or
    ``None`` and why not."""
    name = f"ffload-bench-{os.getpid()}"
    v2 = "/sys/fs/cgroup"
    try:
        if os.path.isfile(os.path.join(v2, "cgroup.controllers")):
            with open(os.path.join(v2, "cgroup.subtree_control")) as f:
                if "cpu" not in f.read().split():
                    return None, "cgroup v2 without the cpu controller delegated here"
            folder = os.path.join(v2, name)
            os.mkdir(folder)
            with open(os.path.join(folder, "cpu.max"), "w") as f:
                f.write(f"{int(cpus * 100000)} 100000")
            return os.path.join(folder, "cgroup.procs"), f"cgroup v2 cpu.max {cpus:g} CPUs"
        v1 = os.path.join(v2, "cpu")
        folder = os.path.join(v1, name)
        os.mkdir(folder)
        with open(os.path.join(folder, "cpu.cfs_period_us"), "w") as f:
            f.write("100000")
        with open(os.path.join(folder, "cpu.cfs_quota_us"), "w") as f:
            f.write(str(int(cpus * 100000)))
        return os.path.join(folder, "cgroup.procs"), f"cgroup v1 cpu.cfs_quota_us {cpus:g} CPUs"
    except OSError as e:
        return None, f"cannot create a cgroup here ({e.strerror}: {e.filename})"


def run_cell(spec: dict, timeout: float) -> dict:
    proc = subprocess.run(
        [sys.executable, __file__, "--child", json.dumps(spec)], capture_output=True, text=True, timeout=timeout
    )
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def summarize(name: str, situation: str, res: dict) -> str:
    """One row of the ratio table."""
    if "error" in res or "skipped" in res:
        return f"| {name} | {situation} | {res.get('error') or res.get('skipped')} | | | | | |"
    rates = {(w, a): v for w, a, v in res["rates"]}
    auto = rates.pop(("auto", "auto"))
    best = max(rates, key=rates.get)
    default = tuple(res["default"])
    dflt = rates.get(default)
    chosen = f"{res['auto']['num_workers']}w x {res['auto']['batches_ahead']}"
    d = "refused (over budget)" if dflt is None else f"{dflt:,.0f}"
    ratio_d = "" if dflt is None else f"{auto / dflt:.2f}"
    return (
        f"| {name} | {situation} ({res['cpus']} CPUs, step {res['step_ms']:.2f} ms) | {best[0]}w x {best[1]}: "
        f"{rates[best]:,.0f} | {default[0]}w x 3: {d} | {auto:,.0f} ({chosen}) | {auto / rates[best]:.2f} | {ratio_d} |"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default="runs/bench_autotune_data")
    ap.add_argument("--out", default="runs/bench_autotune")
    ap.add_argument("--pipelines", default=",".join(PIPELINES))
    ap.add_argument("--situations", default=",".join(SITUATIONS))
    ap.add_argument("--seconds", type=float, default=2.0, help="timed seconds per config and round")
    ap.add_argument("--warm", type=int, default=120, help="batches before timing (auto converges in them)")
    ap.add_argument(
        "--warm-seconds", type=float, default=1.0, help="... and seconds at least (tuning windows are time)"
    )
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--ahead", default="1,3,8", help="fixed batches_ahead values (the memory cells use 1,3)")
    ap.add_argument("--n-raw", type=int, default=20000)
    ap.add_argument("--n-jpeg", type=int, default=256)
    ap.add_argument(
        "--quick",
        action="store_true",
        help="raw and rrc; gpu, cpu, quota, memory; batches_ahead 3, 40 warm batches and 0.3 s, 0.15 s per config, one round",
    )
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return
    if args.quick:
        args.pipelines, args.seconds, args.warm, args.repeats, args.ahead = "raw,rrc", 0.15, 40, 1, "3"
        args.warm_seconds = 0.3
        args.situations = "gpu,cpu,quota,memory"
    from ffload.bench import format_conditions, measurement_conditions, write_results

    t0 = time.perf_counter()
    os.makedirs(args.data, exist_ok=True)
    paths = prepare(args.data, args.n_raw, args.n_jpeg)
    machine = len(os.sched_getaffinity(0))
    workers = sorted({1, 2, 4, 8, 16, machine} & set(range(1, machine + 1)))
    ahead = [int(a) for a in args.ahead.split(",")]
    lines = [
        "| pipeline | situation | best fixed (img/s) | today's default | auto (choice at the end) | auto / best | auto / default |",
        "|---|---|---|---|---|---|---|",
    ]
    results = []
    for situation in args.situations.split(","):
        for name in args.pipelines.split(","):
            data, pipeline, batch, size = PIPELINES[name]
            spec = {
                "situation": situation,
                "pipeline": pipeline,
                "path": paths[data],
                "batch": batch,
                "size": size,
                "workers": workers,
                "ahead": [1, 3] if situation == "memory" else ahead,
                "warm": args.warm,
                "warm_seconds": args.warm_seconds,
                "seconds": args.seconds,
                "repeats": args.repeats,
            }
            quarter = max(1, machine // 4)
            note, folder = "", None
            if situation == "affinity":
                spec["affinity"] = quarter
            if situation == "quota":
                procs, note = make_cgroup(quarter)
                if procs is None:
                    res = {"skipped": note}
                    results.append({"pipeline": name, "situation": situation, **res})
                    lines.append(summarize(name, situation, res))
                    print(lines[-1], file=sys.stderr)
                    continue
                spec["cgroup_procs"], folder = procs, os.path.dirname(procs)
            try:
                res = run_cell(spec, timeout=600)
            finally:
                if folder is not None:
                    os.rmdir(folder)
            res["note"] = note
            results.append({"pipeline": name, "situation": situation, **res})
            lines.append(summarize(name, situation, res))
            print(lines[-1], file=sys.stderr)
    env = measurement_conditions()
    text = "\n".join(
        [
            "# num_workers='auto' against fixed settings",
            "",
            format_conditions(env),
            "",
            f"{machine} CPUs; workers {workers}, batches_ahead {ahead} (memory: [1, 3], budget {MEMORY_SLOTS} slots); "
            f"{args.warm} warm batches and {args.warm_seconds} s, {args.seconds} s timed, {args.repeats} round(s); "
            f"{time.perf_counter() - t0:.0f} s in all.",
            "",
            *lines,
            "",
        ]
    )
    print(text)
    write_results(args.out, text, {"environment": env, "cells": results, "args": vars(args)})


if __name__ == "__main__":
    main()
