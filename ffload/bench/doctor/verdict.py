"""The doctor's reading of its measurements: where the loader stands against each limit, which limit
binds, and the settings to use. Pure functions of the measured figures (no measuring, no I/O), so
the logic is tested on injected measurements.

A *limit* is a rate (images/s) that no loader can exceed on this machine for this dataset and
pipeline (:data:`LIMIT_NAMES`); it *applies* when it constrains the steady state of the run the
doctor measured (``order='random'``, ``os_cache=True``): the disk only when the file does not fit
in the page cache (otherwise only the first epoch reads it), the sequential rate only to
``quasi_random`` / ``sequential`` orders, the consumer only when ``--step-ms`` was given.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

LIMIT_NAMES = ("disk_random", "disk_sequential", "decode", "memory", "consumer")
"""The limits, in report order: the disk's random and sequential read rates on the file (over the
mean payload), the payload decode rate of all usable cores, the batch copy's memory bandwidth (over
the output bytes per image), the consumer's step (batch size over ``--step-ms``)."""

NEAR = 0.8
"""A loader at this fraction of a limit or above is bound by it (measurement noise and the
loader's own overhead keep it from reaching 1.0)."""

ENOUGH = 0.95
"""The recommended ``num_workers`` is the fewest measured workers within this fraction of the best
measured rate (more threads than that only contend with the training thread)."""

HEADROOM = 1.1
"""When the consumer binds, the loader needs this margin over the consumer's rate to never make it
wait (jitter)."""

PAGE_CACHE_SHARE = 0.5
"""``os_cache=True`` is recommended when the data file takes at most this share of the available
memory (the page cache then keeps it across epochs and shares it among ranks)."""


def limit(img_s: float | None, applies: bool, note: str = "", measured: Mapping | None = None) -> dict:
    """One limit's record: ``{'img_s': images/s or None (not measured), 'applies': bool, 'note': str,
    'measured': {the raw figures it came from}}``."""
    return {
        "img_s": None if img_s is None else float(img_s),
        "applies": bool(applies),
        "note": note,
        "measured": dict(measured or {}),
    }


def disk_applies(file_bytes: int, memory_available: int) -> bool:
    """Whether the disk limits every epoch: the file does not fit in :data:`PAGE_CACHE_SHARE` of the
    available memory (bytes both); otherwise the page cache serves every epoch after the first."""
    return file_bytes > PAGE_CACHE_SHARE * memory_available


def analyse(
    limits: Mapping[str, dict],
    runs: Sequence[Mapping],
    usable_cpus: int,
    file_bytes: int,
    memory_available: int,
    batch_size: int,
    step_ms: float | None = None,
) -> dict:
    """Fractions, the binding limit and recommended settings.

    Args:
        limits: name (of :data:`LIMIT_NAMES`) -> :func:`limit` record; missing names count as not
            measured.
        runs: the loader's measured runs, ``{'num_workers': int, 'img_s': float}`` each (a run
            with ``img_s`` None failed and is ignored).
        usable_cpus: the CPUs this process may use.
        file_bytes, memory_available: the data file's size and the available memory, bytes.
        batch_size: samples per batch of the runs.
        step_ms: the consumer's step, milliseconds, or None.

    Returns:
        ``{'loader_img_s', 'best_num_workers', 'fractions', 'binding', 'binding_reason',
        'recommended': {'num_workers', 'batches_ahead', 'os_cache'}, 'reasons': {same keys: str}}``:
        ``fractions`` maps every measured limit to the best loader rate over it; ``binding`` is
        ``'consumer'`` when the consumer is slower than the loader, else the slowest applicable
        limit when the loader reaches :data:`NEAR` of it, else ``'loader'`` (the loader's own
        per-batch work: it is far from every limit); ``loader_img_s`` is None (and ``binding``
        ``'unknown'``) when no run succeeded.
    """
    ok = [r for r in runs if r.get("img_s")]
    best = max(ok, key=lambda r: r["img_s"]) if ok else None
    best_rate = best["img_s"] if best else None
    measured = {n: rec for n, rec in limits.items() if rec.get("img_s")}
    fractions = {n: (best_rate / rec["img_s"] if best_rate else None) for n, rec in measured.items()}
    applicable = {n: rec["img_s"] for n, rec in measured.items() if rec["applies"] and n != "consumer"}
    consumer = measured.get("consumer", {}).get("img_s") if "consumer" in measured else None

    if best_rate is None:
        binding, why = "unknown", "no loader run succeeded"
    elif consumer is not None and consumer <= best_rate:
        binding = "consumer"
        why = f"the consumer takes {consumer:.0f} img/s, the loader delivers {best_rate:.0f}"
    else:
        slowest = min(applicable, key=applicable.get) if applicable else None
        if slowest is not None and best_rate >= NEAR * applicable[slowest]:
            binding = slowest
            why = f"the loader reaches {best_rate / applicable[slowest]:.0%} of the {slowest} limit"
        else:
            binding = "loader"
            nearest = f" (nearest: {slowest}, {best_rate / applicable[slowest]:.0%})" if slowest else ""
            why = f"the loader is below {NEAR:.0%} of every limit{nearest}: its own per-batch work binds"

    workers, workers_why = _num_workers(ok, best, consumer, binding, usable_cpus, step_ms)
    ahead, ahead_why = _batches_ahead(binding, workers)
    fits = not disk_applies(file_bytes, memory_available)
    os_cache_why = (
        f"the file ({file_bytes / 2**30:.2f} GiB) fits in {PAGE_CACHE_SHARE:.0%} of the available memory "
        f"({memory_available / 2**30:.1f} GiB): the page cache keeps it, shared by every rank"
        if fits
        else f"the file ({file_bytes / 2**30:.2f} GiB) exceeds {PAGE_CACHE_SHARE:.0%} of the available memory "
        f"({memory_available / 2**30:.1f} GiB): use the process cache, with order='quasi_random' to read whole pages"
    )
    return {
        "loader_img_s": best_rate,
        "best_num_workers": best["num_workers"] if best else None,
        "fractions": fractions,
        "binding": binding,
        "binding_reason": why,
        "recommended": {"num_workers": workers, "batches_ahead": ahead, "os_cache": fits},
        "reasons": {"num_workers": workers_why, "batches_ahead": ahead_why, "os_cache": os_cache_why},
    }


def _num_workers(ok, best, consumer, binding, usable_cpus, step_ms) -> tuple[int | None, str]:
    """The fewest measured workers that deliver enough (see :func:`analyse`), and why."""
    if best is None:
        return None, "no loader run succeeded"
    if binding == "consumer":
        target = HEADROOM * consumer
        enough = [r for r in ok if r["img_s"] >= target]
        why = f"the fewest workers measured above {HEADROOM:.1f}x the consumer's rate"
    else:
        target = ENOUGH * best["img_s"]
        enough = [r for r in ok if r["img_s"] >= target]
        why = f"the fewest workers measured within {ENOUGH:.0%} of the best rate"
    chosen = min(enough, key=lambda r: r["num_workers"]) if enough else best
    workers = chosen["num_workers"]
    if step_ms is not None and usable_cpus > 2 and workers >= usable_cpus:
        workers = usable_cpus - 1
        why += "; one CPU left to the training thread"
    return workers, why


def _batches_ahead(binding: str, workers: int | None) -> tuple[int, str]:
    """``batches_ahead`` for the binding limit, and why."""
    if binding in ("disk_random", "disk_sequential"):
        n = 2 * max(1, workers or 1)
        return n, "the disk binds: twice the workers keeps more reads in flight"
    if binding == "consumer":
        return 2, "the consumer binds: two batches absorb its jitter; more only holds memory"
    return 3, "the default: the loader keeps max(batches_ahead, num_workers) batches in flight"


def amdahl(serial_fraction: float, workers: int) -> float:
    """Amdahl's speed-up of ``workers`` parallel workers when ``serial_fraction`` (in [0, 1]) of one
    worker's time is serial: ``1 / (s + (1 - s) / n)``."""
    s = min(max(float(serial_fraction), 0.0), 1.0)
    return 1.0 / (s + (1.0 - s) / workers) if workers >= 1 else math.nan
