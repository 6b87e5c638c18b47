"""What one measurement reports (:class:`Measurement`) and how a process measures itself: the
epoch clock and the resident set size (Linux ``/proc``)."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field

_MB = 1024.0 * 1024.0


@dataclass
class EpochRecord:
    """One pass over the data: ``seconds`` of wall time, ``samples`` yielded, ``img_s`` =
    samples / seconds, ``rss_mb`` = the process' RSS (MiB) at its end."""

    epoch: int
    seconds: float
    samples: int
    img_s: float
    rss_mb: float


@dataclass
class Measurement:
    """The result of one measurement, as :func:`ffload.bench.runners.run_worker` reports it.

    Attributes:
        name, kind: the row label and loader kind (:data:`ffload.bench.KINDS`).
        config: :meth:`BenchConfig.to_dict` of the measurement.
        dataset_samples: samples visited per epoch.
        epochs: one :class:`EpochRecord` per epoch (for ``decode_ceiling``: per pass of the
            ``num_workers`` threads).
        img_s: median images/s of epochs 1.. (epoch 0 when there is one epoch); for
            ``decode_ceiling`` the measured multi-thread rate (``threads_img_s``).
        first_batch: ``{'shape', 'dtype'}`` of the first batch's images, or ``None``.
        epoch0_s: seconds of epoch 0 (JIT compilation and warm-up included).
        import_torch_s, import_s, build_s: seconds to import torch, the loader library, and to
            build the loader.
        first_batch_s: seconds from the library import's start to the first batch.
        first_batch_total_s: wall seconds from the subprocess' spawn to the first batch, minus
            ``setup_s``.
        setup_s: untimed setup (baselines: reading the images into memory, listing files).
        peak_rss_mb, peak_rss_children_mb: peak RSS of the process and of its largest reaped
            child (``DataLoader`` workers), MiB.
        rss_growth_mb: RSS after the last epoch minus after epoch 1 (epoch 0 with < 3 epochs).
        decoder, single_thread_img_s, threads_img_s, payload_bytes_mean,
        single_thread_epochs: ``decode_ceiling`` only (``None`` / empty otherwise): the
            decoder's name, the one-thread and the ``num_workers``-thread decode rates
            (images/s, medians of passes 1..), the mean JPEG payload size (bytes) and the
            one-thread passes.
    """

    name: str
    kind: str
    config: dict
    dataset_samples: int
    epochs: list[EpochRecord]
    img_s: float
    first_batch: dict | None = None
    epoch0_s: float | None = None
    import_torch_s: float | None = None
    import_s: float | None = None
    build_s: float | None = None
    first_batch_s: float | None = None
    first_batch_total_s: float | None = None
    setup_s: float = 0.0
    peak_rss_mb: float | None = None
    peak_rss_children_mb: float | None = None
    rss_growth_mb: float | None = None
    decoder: str | None = None
    single_thread_img_s: float | None = None
    threads_img_s: float | None = None
    payload_bytes_mean: float | None = None
    single_thread_epochs: list[EpochRecord] = field(default_factory=list)

    def to_dict(self) -> dict:
        """A JSON-serialisable dict (what :func:`ffload.bench.measure` returns)."""
        return asdict(self)


def rss_mb() -> float:
    """Current resident set size of this process, MiB (Linux ``/proc``; else the peak)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / _MB
    except (OSError, ValueError, IndexError):
        return peak_rss_mb(children=False)


def peak_rss_mb(children: bool) -> float:
    """Peak RSS, MiB: of this process (``VmHWM``: since its ``exec``; ``ru_maxrss`` would start
    from the parent's RSS at fork), or of its largest reaped child (``ru_maxrss`` of
    ``RUSAGE_CHILDREN``: ``DataLoader`` workers, whose shared pages count in full)."""
    import resource

    if not children:
        try:
            with open("/proc/self/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1]) / 1024.0
        except (OSError, ValueError, IndexError):
            pass
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024.0


def epoch_record(epoch: int, seconds: float, samples: int) -> EpochRecord:
    """An :class:`EpochRecord` with the current RSS (``img_s`` is infinite for 0 seconds)."""
    return EpochRecord(epoch, seconds, samples, samples / seconds if seconds > 0 else math.inf, rss_mb())


def time_epochs(loader: Iterable, epochs: int) -> tuple[list[EpochRecord], float | None, dict | None]:
    """Iterate ``loader`` ``epochs`` times (``iter(loader)`` starts an epoch), counting samples
    from the batch's first entry (``(B, ...)``). Returns ``(per-epoch records, perf_counter at
    the first batch or None, {'shape', 'dtype'} of the first batch's first entry or None)``."""
    records, first, described = [], None, None
    for epoch in range(epochs):
        t0 = time.perf_counter()
        n = 0
        for batch in loader:
            if first is None:
                first = time.perf_counter()
                described = {"shape": list(batch[0].shape), "dtype": str(batch[0].dtype)}
            n += int(batch[0].shape[0])
        records.append(epoch_record(epoch, time.perf_counter() - t0, n))
    return records, first, described


def median_after_warmup(records: list[EpochRecord]) -> float:
    """Median ``img_s`` of records 1.. (record 0 when it is the only one)."""
    import statistics

    return statistics.median(r.img_s for r in (records[1:] or records))


def _nothing() -> None:
    """The ``close`` of loaders that hold nothing to release."""


@dataclass
class LoaderSetup:
    """What a loader runner built, for :func:`ffload.bench.runners.run_worker` to time.

    Attributes:
        loader: re-iterable; ``iter()`` starts an epoch yielding ``(images (B, 3, H, W) uint8
            tensor, labels ...)``.
        start: ``time.perf_counter()`` at the start of the loader library's import.
        import_s, build_s: seconds to import the library and to build the loader.
        dataset_samples: samples per epoch.
        setup_s: untimed setup before ``start`` (reading images into memory, listing files).
        close: releases the loader's threads and memory.
    """

    loader: Iterable
    start: float
    import_s: float
    build_s: float
    dataset_samples: int
    setup_s: float = 0.0
    close: Callable[[], None] = _nothing
