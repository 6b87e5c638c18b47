"""The ResNet-9 recipe's driver (:mod:`ffload.recipes.cifar10_resnet9` is its command line): prepare the data once,
build the loaders, train and evaluate, and write the report (``metrics.json``, ``accuracy.png``)."""

from __future__ import annotations

import os
import platform
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import torch
from torch.nn.parallel import DistributedDataParallel

import ffload
from ffload.errors import ConfigurationError
from ffload.recipes.data import RecipeError, demo_folder, make_loaders, prepare_data
from ffload.recipes.distributed import ProcessGroup, join_process_group
from ffload.recipes.report import (
    cost_usd,
    format_header,
    format_row,
    format_summary,
    plot_accuracy,
    rows_to_dicts,
    write_json,
)
from ffload.recipes.resnet9 import resnet9
from ffload.recipes.training import RecipeConfig, resolve_device, train_model

__all__ = ["ensure_writable", "run_recipe"]


# --------------------------------------------------------------------------- the run


def ensure_writable(out: os.PathLike) -> Path:
    """Create ``out`` (and parents) and check a file can be written in it.

    Raises:
        RecipeError: it cannot be created or written (names the path and the OS error).
    """
    out = Path(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out):
            pass
    except OSError as e:
        raise RecipeError(f"--out {out}: cannot write there ({e.strerror or e})") from e
    return out


def run_recipe(
    data_dir: os.PathLike | None,
    out: os.PathLike,
    config: RecipeConfig,
    fmt: str = "beton",
    device: str | None = None,
    num_workers: int | None = None,
    price_per_hour: float = 0.0,
    cache_dir: os.PathLike | None = None,
    demo: bool = False,
    progress: bool = True,
    echo: Callable[[str], None] = lambda s: None,
    distributed: bool = False,
) -> dict:
    """The whole recipe: validate, convert (cached), train, evaluate, write the reports.

    Args:
        data_dir: CIFAR-10 archive folder or ImageFolder (see
            :func:`ffload.recipes.data.detect_layout`); ignored (must be ``None``) with ``demo``.
        out: report folder (``metrics.json``, ``accuracy.png``; the demo's digits too).
        config: hyperparameters.
        fmt: ``'beton'`` or ``'lmdb'``.
        device: see :func:`ffload.recipes.training.resolve_device`.
        num_workers: loader threads (default ``min(8, os.cpu_count())``).
        price_per_hour: USD per device-hour for the cost line.
        cache_dir: conversion cache (default ``<parent of out>/ffload-cache``).
        demo: build the scikit-learn digits as a 32x32 RGB ImageFolder under ``out/digits``
            (:func:`ffload.convert.demo_data.build_digits_folder`) and train on it.
        progress: conversion progress bars.
        echo: receives the table lines as they are produced (the CLI prints them).
        distributed: train with ``DistributedDataParallel`` in the ``torch.distributed``
            process group (initialised already, or from torchrun's environment, see
            :func:`ffload.recipes.distributed.join_process_group`). ``config.batch_size`` is the
            global batch, split evenly over the ranks (so the learning rate and schedule mean
            the same as with one process); each rank reads its share of every epoch
            (``Loader(..., distributed=True)``); metrics are reduced over the ranks; local rank 0
            of each node converts the data first; rank 0 alone echoes and writes the reports.

    Returns:
        the ``metrics.json`` dict: ``final_test_accuracy`` (fraction), ``total_seconds`` (wall,
        conversion included), ``train_seconds``, ``eval_seconds``, ``convert_seconds``,
        ``device_hours``, ``cost_usd``, ``price_per_hour``, ``mean_data_wait_fraction``,
        ``epochs`` (rows, see :class:`ffload.recipes.report.EpochStats`),
        ``iteration_losses``, ``config``, ``data``, ``device``, ``num_parameters``,
        ``world_size``, ``versions``.

    Raises:
        RecipeError: bad data folder, output folder or device, before any training;
            ``distributed`` without a process group or torchrun's environment, or a batch size
            not divisible by the world size.
        ffload.errors.ConfigurationError: bad ``fmt`` or hyperparameters.
    """
    start = time.perf_counter()
    if demo == (data_dir is not None):
        raise RecipeError("give exactly one of --data DIR and --demo")
    if config.epochs < 1 or config.batch_size < 1 or not config.width > 0:
        raise ConfigurationError(f"epochs and batch_size must be >= 1 and width > 0, got {config}")
    dev = resolve_device(device)
    group = join_process_group(dev) if distributed else None
    try:
        metrics = _train_and_report(
            data_dir,
            ensure_writable(out),
            config,
            fmt,
            group,
            dev,
            num_workers,
            price_per_hour,
            cache_dir,
            demo,
            progress,
            echo,
            start,
        )
    except BaseException:
        if group is not None:
            group.close(wait_for_peers=False)  # the others may never get here: torchrun ends them
        raise
    if group is not None:
        group.close()
    return metrics


def _train_and_report(
    data_dir,
    out: Path,
    config: RecipeConfig,
    fmt: str,
    group: ProcessGroup | None,
    dev: torch.device,
    num_workers: int | None,
    price_per_hour: float,
    cache_dir: os.PathLike | None,
    demo: bool,
    progress: bool,
    echo: Callable[[str], None],
    start: float,
) -> dict:
    """:func:`run_recipe` after validation, in this process's part of the job (``group``, or
    ``None`` for a single process)."""
    batch_size = config.batch_size
    if group is not None:
        dev = group.device
        if group.rank != 0:
            echo = _silent
        if batch_size % group.world_size:
            raise RecipeError(
                f"--batch-size {batch_size} is not divisible by the "
                f"{group.world_size} processes (each takes an equal share)"
            )
        batch_size //= group.world_size
    cache_dir = Path(cache_dir) if cache_dir is not None else out.resolve().parent / "ffload-cache"
    num_workers = num_workers or min(8, os.cpu_count() or 1)

    def prepare():
        source = demo_folder(out) if demo else data_dir
        return source, prepare_data(source, cache_dir, fmt, num_workers, progress)

    data_dir, data = prepare() if group is None else group.local_zero_first(prepare)
    echo(
        f"data: {data.layout} {data_dir} -> {data.format} "
        f"({'cached' if data.cache_hit else f'converted in {data.convert_seconds:.1f} s'}): "
        f"{data.num_train} train / {data.num_test} test images, {data.num_classes} classes"
    )
    if data.num_train < config.batch_size:
        raise RecipeError(f"--batch-size {config.batch_size} is larger than the training set ({data.num_train} images)")
    torch.manual_seed(config.seed)
    model = resnet9(num_classes=data.num_classes, width=config.width)
    model = model.to(device=dev, memory_format=torch.channels_last)
    num_parameters = sum(p.numel() for p in model.parameters())
    if group is not None:
        model = DistributedDataParallel(model, device_ids=[dev.index] if dev.type == "cuda" else None)
    train_loader, test_loader = make_loaders(
        data, batch_size, num_workers, dev, config.seed, distributed=group is not None
    )
    ranks = "" if group is None else f" in each of {group.world_size} processes"
    echo(f"device: {dev}, {num_parameters:,} parameters, {num_workers} loader workers{ranks}")
    echo(format_header())
    with train_loader, test_loader:  # their threads end here, not at interpreter exit
        rows, losses = train_model(
            model, train_loader, test_loader, config, dev, on_epoch=lambda r: echo(format_row(r))
        )
    total = time.perf_counter() - start
    train_seconds = sum(r.epoch_seconds for r in rows)
    metrics = {
        "final_test_accuracy": rows[-1].test_accuracy,
        "total_seconds": total,
        "train_seconds": train_seconds,
        "eval_seconds": sum(r.eval_seconds for r in rows),
        "convert_seconds": data.convert_seconds,
        "device_hours": total / 3600.0,
        "cost_usd": cost_usd(total, price_per_hour),
        "price_per_hour": price_per_hour,
        "mean_data_wait_fraction": sum(r.data_wait_seconds for r in rows) / train_seconds,
        "epochs": rows_to_dicts(rows),
        "iteration_losses": losses,
        "config": asdict(config),
        "data": {**asdict(data), "source": str(data_dir)},
        "device": str(dev) if dev.type == "cpu" else f"{dev} ({torch.cuda.get_device_name(dev)})",
        "num_workers": num_workers,
        "num_parameters": num_parameters,
        "world_size": 1 if group is None else group.world_size,
        "versions": {"ffload": ffload.__version__, "torch": torch.__version__, "python": platform.python_version()},
    }
    if group is None or group.rank == 0:
        write_json(out / "metrics.json", metrics)
        plot_accuracy(
            rows, out / "accuracy.png", title=f"ResNet-9 (width {config.width}) on {data.layout}, {data.format}"
        )
    echo(format_summary(metrics))
    echo(f"wrote {out / 'metrics.json'} and {out / 'accuracy.png'}")
    return metrics


def _silent(line: str) -> None:
    """The echo of ranks other than 0."""
