"""One measurement in this process (meant for a fresh subprocess, see
:func:`ffload.bench.harness.measure`): the ffload ``Loader``, a peer from
:mod:`ffload.bench.peers.baselines`, or the decode ceiling; each runner returns a typed result that
:func:`run_worker` turns into a :class:`Measurement`.

Nothing here imports ``ffload`` at module level: the worker loads this package by path, so that
``import ffload`` is part of the ffload measurement (``import_s``, ``first_batch_s``).
"""

from __future__ import annotations

import time

from .config import BenchConfig
from .measurement import LoaderSetup, Measurement, median_after_warmup, peak_rss_mb, time_epochs
from .peers.baselines import BASELINES
from .peers.ceiling import DECODERS, load_jpeg_payloads, measure_decode_ceiling
from .pipelines import build_pipelines, deeplake_compose


def run_ffload(cfg: BenchConfig) -> LoaderSetup:
    """``ffload.Loader`` with ffload's operations (:func:`build_pipelines`), ``order='random'``,
    ``os_cache=True``, ``drop_last=False``, ``batches_ahead=3``; ``import ffload`` is timed. Kind
    ``ffload_torchvision``: the image pipeline is :func:`ffload.transforms.from_torchvision` of the
    stack's torchvision ``Compose`` (:func:`~.pipelines.deeplake_compose`) instead."""
    start = time.perf_counter()
    import ffload  # the import being timed
    import ffload.loaders

    import_s = time.perf_counter() - start
    t1 = time.perf_counter()
    indices = None if cfg.limit is None else list(range(cfg.limit))
    ops = {name: getattr(ffload.loaders, name) for name in ffload.loaders.__all__}  # imported on first use
    pipelines = build_pipelines(cfg, ops)
    if cfg.kind == "ffload_torchvision":
        import warnings

        from ffload.transforms import from_torchvision

        with warnings.catch_warnings():  # the warning names what runs in Python: nothing, for these stacks
            warnings.simplefilter("ignore")
            pipelines[cfg.image_field] = from_torchvision(deeplake_compose(cfg))
    loader = ffload.Loader(
        cfg.path,
        batch_size=cfg.batch_size,
        num_workers=cfg.num_workers,
        order="random",
        os_cache=True,
        pipelines=pipelines,
        drop_last=False,
        seed=cfg.seed,
        indices=indices,
        batches_ahead=3,
    )
    return LoaderSetup(loader, start, import_s, time.perf_counter() - t1, len(loader.indices), close=loader.close)


RUNNERS = {"ffload": run_ffload, "ffload_torchvision": run_ffload, **BASELINES}
"""Loader kinds (all but ``decode_ceiling``) and the runners that build their loaders."""


def run_loader(cfg: BenchConfig, spawned: float | None = None) -> Measurement:
    """Build ``cfg``'s loader with :data:`RUNNERS` and time ``cfg.epochs`` epochs of it.

    ``spawned``: ``time.time()`` at which the parent spawned this process (for
    ``first_batch_total_s``), or ``None``. Raises whatever the loader raises."""
    t0 = time.perf_counter()
    import torch  # noqa: F401  (every loader here yields torch tensors)

    import_torch_s = time.perf_counter() - t0
    setup = RUNNERS[cfg.kind](cfg)
    try:
        records, first, first_batch = time_epochs(setup.loader, cfg.epochs)
    finally:
        setup.close()
    total = None
    if first is not None and spawned is not None:
        first_wall = time.time() - (time.perf_counter() - first)
        total = first_wall - spawned - setup.setup_s
    base = records[1] if len(records) >= 3 else records[0]
    return Measurement(
        name=cfg.name,
        kind=cfg.kind,
        config=cfg.to_dict(),
        dataset_samples=setup.dataset_samples,
        epochs=records,
        img_s=median_after_warmup(records),
        first_batch=first_batch,
        epoch0_s=records[0].seconds,
        import_torch_s=import_torch_s,
        import_s=setup.import_s,
        build_s=setup.build_s,
        first_batch_s=None if first is None else first - setup.start,
        first_batch_total_s=total,
        setup_s=setup.setup_s,
        rss_growth_mb=records[-1].rss_mb - base.rss_mb,
    )


def run_decode_ceiling(cfg: BenchConfig) -> Measurement:
    """The measured decode ceiling of ``cfg``'s dataset: :func:`load_jpeg_payloads` (untimed
    setup) then :func:`measure_decode_ceiling` with ``cfg.num_workers`` threads, ``cfg.epochs``
    passes and ``DECODERS[cfg.decoder]``. ``img_s`` is the multi-thread rate. Raises ValueError
    (no JPEG sample, a payload that does not decode)."""
    t0 = time.perf_counter()
    indices, payloads = load_jpeg_payloads(cfg.path, cfg.image_field, cfg.limit)
    setup_s = time.perf_counter() - t0
    ceiling = measure_decode_ceiling(
        payloads, cfg.num_workers, cfg.epochs, DECODERS[cfg.decoder](), [f"{cfg.path}: sample {i}" for i in indices]
    )
    return Measurement(
        name=cfg.name,
        kind=cfg.kind,
        config=cfg.to_dict(),
        dataset_samples=len(payloads),
        epochs=ceiling.threads,
        img_s=ceiling.threads_img_s,
        setup_s=setup_s,
        decoder=cfg.decoder,
        single_thread_img_s=ceiling.single_thread_img_s,
        threads_img_s=ceiling.threads_img_s,
        payload_bytes_mean=sum(p.size for p in payloads) / len(payloads),
        single_thread_epochs=ceiling.single_thread,
    )


def run_worker(cfg: BenchConfig, spawned: float | None = None) -> Measurement:
    """Run one measurement in this process and add its peak RSS (of the process and of its
    reaped children).

    Args:
        cfg: what to measure.
        spawned: ``time.time()`` at which the parent spawned this process, or ``None``.

    Raises:
        whatever the loader raises (missing ffcv: ImportError; a bad dataset: DatasetError).
    """
    result = run_decode_ceiling(cfg) if cfg.kind == "decode_ceiling" else run_loader(cfg, spawned)
    result.peak_rss_mb = peak_rss_mb(children=False)
    result.peak_rss_children_mb = peak_rss_mb(children=True)
    return result
