"""One doctor run: every probe of :mod:`.probes` and :mod:`.startup` on one dataset, read by
:func:`.verdict.analyse` into the report (:data:`SCHEMA`)."""

from __future__ import annotations

import os
import time
from dataclasses import asdict

from ..config import DEFAULT_BATCH_SIZE, BenchConfig
from ..plan import choose_pipeline, describe_dataset
from . import probes, startup, verdict

SCHEMA = "ffload.doctor/1"
"""The report's ``schema`` value; its layout (documented in :func:`diagnose`) changes only with it."""


def make_loader(cfg: BenchConfig, num_workers: int):
    """The ``ffload.Loader`` the bench measures for ``cfg`` (:func:`ffload.bench.runners.run_ffload`'s
    settings: ``order='random'``, ``os_cache=True``, ``batches_ahead=3``) with ``num_workers``."""
    import ffload
    import ffload.loaders

    from ..pipelines import build_pipelines

    ops = {name: getattr(ffload.loaders, name) for name in ffload.loaders.__all__}
    return ffload.Loader(
        cfg.path,
        batch_size=cfg.batch_size,
        num_workers=num_workers,
        order="random",
        os_cache=True,
        pipelines=build_pipelines(cfg, ops),
        seed=cfg.seed,
        batches_ahead=3,
    )


def worker_counts(usable_cpus: int) -> list[int]:
    """The worker counts measured: 1, half the usable CPUs and all of them (distinct, sorted)."""
    return sorted({1, max(1, usable_cpus // 2), usable_cpus})


def output_bytes(cfg: BenchConfig, info: dict) -> int:
    """Bytes of one image of the pipeline's output (``uint8`` RGB; ``float32`` for the Deep Lake stacks)."""
    h, w = info["size"] if cfg.pipeline == "simple" else (cfg.size, cfg.size)
    return h * w * 3 * (4 if cfg.pipeline.startswith("dl_") else 1)


def diagnose(
    path: str,
    pipeline: str = "auto",
    size: int = 224,
    batch_size: int | None = None,
    step_ms: float | None = None,
    seconds: float = 2.0,
    startup_full: bool = False,
    ranks: int = 2,
    workers: list[int] | None = None,
    progress=None,
) -> dict:
    """Measure the limits and the loader on ``path`` and read them.

    Args:
        path: a local ``.beton``, LMDB or sharded dataset with an RGB image field.
        pipeline, size: as ``ffload bench`` (``auto``: simple for one image size, else rrc).
        batch_size: default per pipeline (:data:`~ffload.bench.config.DEFAULT_BATCH_SIZE`).
        step_ms: the consumer's step per batch, milliseconds, or None.
        seconds: per loader run (and the disk probes' duration; the decode probe's is half).
        startup_full: also the cold, concurrent-ranks and read-only starts (:mod:`.startup`; minutes
            on a small machine: numba compiles every kernel from scratch in each).
        ranks: processes started at once for the concurrent start.
        workers: worker counts to measure (default :func:`worker_counts`).
        progress: ``callable(str)`` told what runs next, or None.

    Returns the report, a JSON-ready dict::

        schema: "ffload.doctor/1"
        dataset: {path, format, samples, file, file_bytes, image_field, pipeline, batch_size,
                  output_bytes_per_image, payload_mean_bytes, jpeg_fraction}
        machine: {usable_cpus, memory_available_bytes}
        limits: {disk_random, disk_sequential, decode, memory, consumer}: each {img_s (or null),
                 applies, note, measured: {raw figures}}
        loader: {runs: [{num_workers, img_s, batches, first_batch_s, wait_fraction}],
                 with_consumer: a run at the recommended num_workers sleeping step_ms per batch, or null}
        startup: {cache: {numba_cache_dir, locator, path, package_writable, read_only_fallback,
                  fallback_writable}, warm: run, cold: run or null, ranks: {...} or null,
                  read_only: {...} or null}   (run: {wall_s, import_s, first_batch_s, ffload} or {error, wall_s})
        verdict: {loader_img_s, best_num_workers, fractions: {limit: loader / limit}, binding,
                  binding_reason, recommended: {num_workers, batches_ahead, os_cache}, reasons: {...}}
        seconds: wall time of the run

    Raises:
        ffload.formats.DatasetError: ``path`` is not a dataset.
        ffload.errors.ConfigurationError: no RGB image field, a dataset on object storage, or a pipeline
            that does not fit the images.
    """
    from ffload.formats import open_dataset
    from ffload.system import available_cpus, available_memory

    t_start = time.perf_counter()
    say = progress or (lambda message: None)
    info = describe_dataset(path)
    pipeline = choose_pipeline(info, pipeline)
    batch_size = batch_size or DEFAULT_BATCH_SIZE[pipeline]
    cfg = BenchConfig(
        kind="ffload",
        path=path,
        pipeline=pipeline,
        batch_size=batch_size,
        num_workers=1,
        epochs=1,
        size=size,
        image_field=info["image_field"],
        label_field=info["label_field"],
        disabled_fields=tuple(info["disabled_fields"]),
    )
    view = open_dataset(path)
    file = probes.data_file(view)
    file_bytes = os.path.getsize(file)
    cpus, memory = available_cpus(), available_memory()
    per_image = output_bytes(cfg, info)

    say("decode rate of one core")
    decode = probes.decode_rate(view, info["image_field"], seconds=seconds / 2)
    payload = decode["payload_mean_bytes"]
    say("disk read rates (page cache dropped)")
    disk = probes.disk_rates(file, payload, seconds=seconds)
    say("memory bandwidth of a batch copy")
    memory_bw = probes.memory_bandwidth(per_image * batch_size)
    on_disk = verdict.disk_applies(file_bytes, memory)
    cache_note = "" if on_disk else "applies to the first epoch only: the page cache holds the file afterwards"
    limits = {
        "disk_random": verdict.limit(
            disk["random_mib_s"] * probes.MIB / payload,
            on_disk,
            "; ".join(filter(None, [disk["note"], cache_note])),
            measured=disk,
        ),
        "disk_sequential": verdict.limit(
            disk["sequential_mib_s"] * probes.MIB / payload,
            False,
            "applies to order='quasi_random' and 'sequential' with a file larger than the page cache",
            measured=disk,
        ),
        "decode": verdict.limit(
            decode["img_s_per_core"] * cpus,
            True,
            f"{decode['img_s_per_core']:.0f} img/s per core x {cpus} usable CPUs ({decode['decoder']}, full-size)",
            measured=decode,
        ),
        "memory": verdict.limit(
            memory_bw["bytes_s"] / per_image,
            True,
            f"one thread copying a batch ({memory_bw['buffer_bytes']} bytes) at {memory_bw['bytes_s'] / 1e9:.1f} GB/s",
            measured=memory_bw,
        ),
        "consumer": verdict.limit(
            None if step_ms is None else batch_size / (step_ms / 1000.0),
            step_ms is not None,
            "not given (--step-ms)" if step_ms is None else f"{batch_size} images per {step_ms:g} ms step",
            measured={"step_ms": step_ms},
        ),
    }
    if on_disk:
        say("reading the file into the page cache is skipped: it does not fit")
    else:
        _warm_page_cache(file)
    runs = []
    for n in workers or worker_counts(cpus):
        say(f"loader, {n} worker(s)")
        runs.append(probes.loader_rate(lambda w: make_loader(cfg, w), n, seconds))
    reading = verdict.analyse(limits, runs, cpus, file_bytes, memory, batch_size, step_ms)
    with_consumer = None
    if step_ms is not None and reading["recommended"]["num_workers"]:
        n = reading["recommended"]["num_workers"]
        say(f"loader, {n} worker(s), consumer sleeping {step_ms:g} ms per batch")
        with_consumer = probes.loader_rate(lambda w: make_loader(cfg, w), n, seconds, step_s=step_ms / 1000.0)
    say("time to the first batch" + (" (cold, ranks, read-only: minutes)" if startup_full else ""))
    started = startup.measure_startup(asdict(cfg), startup_full, ranks)
    return {
        "schema": SCHEMA,
        "dataset": {
            "path": path,
            "format": info["format"],
            "samples": info["num_samples"],
            "file": file,
            "file_bytes": file_bytes,
            "image_field": info["image_field"],
            "pipeline": pipeline,
            "batch_size": batch_size,
            "output_bytes_per_image": per_image,
            "payload_mean_bytes": payload,
            "jpeg_fraction": decode["jpeg_fraction"],
        },
        "machine": {"usable_cpus": cpus, "memory_available_bytes": memory},
        "limits": limits,
        "loader": {"runs": runs, "with_consumer": with_consumer},
        "startup": started,
        "verdict": reading,
        "seconds": time.perf_counter() - t_start,
    }


def _warm_page_cache(path: str) -> None:
    """Read ``path`` once so that the loader runs measure the steady state (the disk probe evicted it)."""
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(8 << 20)
        while f.readinto(buf):
            pass
