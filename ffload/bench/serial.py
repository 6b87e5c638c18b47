"""The loader's serial fraction, measured: per batch, how long its threads hold the GIL (the work
that cannot run on two cores at once) against all the work they do, and how long workers wait on
locks; with Amdahl's projection to more workers.

:class:`ThreadProfiles` puts a ``cProfile`` profiler in every thread (``threading.setprofile`` hooks
each thread as it starts; the hook starts profiling at the thread's first call once armed). :func:`split_profile` sorts
each thread's own time (``tottime``) into:

* ``nogil``: compiled kernels that release the GIL (numba dispatchers compiled with ``nogil=True``)
  and the C calls known to release it around their work (:data:`RELEASING`); their time includes
  getting the GIL back, which is where another thread's hold shows;
* ``wait``: blocking on a lock, a condition or the job queue (:data:`WAITING`): idle, not work;
* ``held``: everything else, Python and the C calls that keep the GIL.

The serial fraction is ``held / (held + nogil)`` summed over the loader's threads per batch (the
consumer's thread, the workers and the read-ahead thread). The profiler adds a fixed cost to each
Python call, so ``held`` is an upper bound; :func:`serial_fraction` reports the profiled and the
plain rate of the same run to show by how much.
"""

from __future__ import annotations

import cProfile
import pstats
import sys
import threading
import time
from collections.abc import Callable

import numpy as np

CLOCK = time.thread_time
"""The profilers' clock: the calling thread's CPU time, so that waiting for the GIL or a lock, and
being preempted on a busy machine, count nothing; only work counts."""

RELEASING = frozenset(
    {
        "<built-in method posix.fstat>",
        "<built-in method posix.preadv>",
        "<built-in method posix.pread>",
        "<built-in method posix.read>",
        "<built-in method time.sleep>",
    }
)
"""C calls that release the GIL around their work (counted ``nogil``)."""

WAITING = frozenset(
    {
        "<method 'acquire' of '_thread.lock' objects>",
        "<method 'acquire' of '_thread.RLock' objects>",
        "<method '_acquire_restore' of '_thread.RLock' objects>",
        "<method 'get' of '_queue.SimpleQueue' objects>",
    }
)
"""Blocking waits (counted ``wait``); a worker's lock ``acquire`` is contention, its queue ``get`` idleness."""


def nogil_kernels() -> set[tuple[str, int, str]]:
    """``(file, first line, name)`` of every loaded numba dispatcher compiled with ``nogil=True``
    (how ``cProfile`` names their calls)."""
    try:
        from numba.core.registry import CPUDispatcher
    except ImportError:
        return set()
    found = set()
    for module in list(sys.modules.values()):
        for value in list(getattr(module, "__dict__", {}).values()):
            if isinstance(value, CPUDispatcher) and value.targetoptions.get("nogil"):
                code = value.py_func.__code__
                found.add((code.co_filename, code.co_firstlineno, code.co_name))
    return found


def _label(key: tuple[str, int, str]) -> str:
    filename, line, name = key
    return name if filename == "~" and line == 0 else f"{filename}:{line}({name})"


def split_profile(stats: pstats.Stats, kernels: set) -> dict:
    """One thread's own time by kind (see the module docstring): ``{'held', 'nogil', 'wait',
    'lock_wait'}`` seconds (``lock_wait``: the lock ``acquire`` part of ``wait``), ``'calls'`` (all
    entries' calls), ``'kernel_calls'`` (calls of ``kernels``), and ``'top_held'``:
    the five largest ``held`` entries as ``[label, seconds, calls]``."""
    out = {"held": 0.0, "nogil": 0.0, "wait": 0.0, "lock_wait": 0.0, "calls": 0, "kernel_calls": 0}
    held = []
    for key, (_, calls, tottime, _, _) in stats.stats.items():
        out["calls"] += calls
        label = _label(key)
        if key in kernels or label in RELEASING:
            out["nogil"] += tottime
            out["kernel_calls"] += calls if key in kernels else 0
        elif label in WAITING:
            out["wait"] += tottime
            if "acquire" in label:
                out["lock_wait"] += tottime
        else:
            out["held"] += tottime
            held.append([label, tottime, calls])
    out["top_held"] = sorted(held, key=lambda h: -h[1])[:5]
    return out


class ThreadProfiles:
    """A ``cProfile`` profiler in this thread and in every thread started after :meth:`install`,
    collecting only between :meth:`start` and :meth:`stop` (threads started before ``start``, such
    as a loader's workers built and warmed up first, begin at their next call after it)."""

    def __init__(self):
        self._on = False
        self._lock = threading.Lock()
        self._profilers: dict[str, cProfile.Profile] = {}
        self._main = cProfile.Profile(CLOCK)

    def _pending(self, frame, event, arg):
        if self._on:  # the first call after start(): a profiler replaces this hook in this thread
            profiler = cProfile.Profile(CLOCK)
            with self._lock:
                self._profilers[f"{threading.current_thread().name}#{threading.get_ident()}"] = profiler
            profiler.enable()

    def install(self) -> None:
        """Hook the threads started from now on (``threading.setprofile``)."""
        threading.setprofile(self._pending)

    def start(self) -> None:
        self._on = True
        self._main.enable()

    def stop(self) -> None:
        """Stop this thread's profiler and hooking new threads (the others stop when they end)."""
        self._main.disable()
        self._on = False
        threading.setprofile(None)

    def stats(self) -> dict[str, pstats.Stats]:
        """``{thread name: pstats.Stats}`` (``'main'``: this thread); call once the threads ended."""
        out = {"main": pstats.Stats(self._main)}
        with self._lock:
            for name, profiler in self._profilers.items():
                try:
                    out[name] = pstats.Stats(profiler)
                except TypeError:  # a thread that recorded nothing
                    continue
        return out


def profiler_overhead(calls: int = 20000) -> float:
    """Seconds of :data:`CLOCK` that profiling adds per Python call (a trivial function called
    ``calls`` times, with and without a profiler; >= 0)."""

    def noop():
        return None

    def loop():
        for _ in range(calls):
            noop()

    t0 = CLOCK()
    loop()
    plain = CLOCK() - t0
    profiler = cProfile.Profile(CLOCK)
    t0 = CLOCK()
    profiler.enable()
    loop()
    profiler.disable()
    return max(0.0, (CLOCK() - t0 - plain) / calls)


def dispatch_cost(calls: int = 20000) -> float:
    """Seconds of :data:`CLOCK` one call of a compiled kernel spends in numba's dispatcher (typing
    its arguments, under the GIL) before the kernel runs: a four-argument kernel on empty arrays."""
    from ffload.loaders.rng import _sample_seeds

    indices, out = np.zeros(0, np.int64), np.zeros(0, np.uint64)
    seed = np.uint64(1)
    _sample_seeds(seed, seed, indices, out)
    t0 = CLOCK()
    for _ in range(calls):
        _sample_seeds(seed, seed, indices, out)
    return (CLOCK() - t0) / calls


def serial_fraction(make_loader: Callable[[int], object], batches: int, num_workers: int = 1) -> dict:
    """Measure the serial fraction of ``make_loader(num_workers)`` (a ``Loader``) over ``batches``
    batches (after one warm-up epoch's first batches), once plain and once profiled.

    Returns ``{'batches', 'num_workers', 'plain_batch_us', 'profiled_batch_us' (wall time per batch),
    'per_batch_us': {thread kind: {'held', 'nogil', 'wait', 'lock_wait'}}, 'calls_per_batch',
    'profiler_overhead_us' (calls x :func:`profiler_overhead`), 'dispatch_us' (kernel calls x
    :func:`dispatch_cost`: held, though the profiler times it as the kernel's), 'held_us',
    'held_corrected_us' (less the profiler's overhead, plus the dispatch), 'nogil_us' (less the
    dispatch), 'serial_fraction' (corrected held / (that + nogil)),
    'serial_fraction_upper' (uncorrected), 'worker_lock_wait_us', 'top_held': [[label, us], ...]}``,
    CPU microseconds per batch; thread kinds are ``main`` (the consumer), ``worker`` (all workers
    together), ``readahead`` and ``other``."""

    def consume(loader, count):
        it = iter(loader)
        done = 0
        while done < count:
            try:
                next(it)
            except StopIteration:
                it = iter(loader)
                continue
            done += 1

    loader = make_loader(num_workers)
    try:
        consume(loader, min(batches, 20))  # JIT, buffers, page faults
        t0 = time.perf_counter()
        consume(loader, batches)
        plain = (time.perf_counter() - t0) / batches
    finally:
        loader.close()
    kernels = nogil_kernels()
    profiles = ThreadProfiles()
    profiles.install()
    try:
        loader = make_loader(num_workers)
        consume(loader, min(batches, 20))
        t0 = time.perf_counter()
        profiles.start()
        consume(loader, batches)
        profiles.stop()
        profiled = (time.perf_counter() - t0) / batches
    finally:
        profiles.stop()
        loader.close()  # joins the workers and the read-ahead thread: their profiles are complete
    stats = profiles.stats()
    kinds: dict[str, dict] = {}
    top: dict[str, float] = {}
    calls = kernel_calls = 0
    for name, st in stats.items():
        kind = (
            "main"
            if name == "main"
            else "worker"
            if name.startswith("ffload-worker")
            else "readahead"
            if name.startswith("ffload-readahead")
            else "other"
        )
        split = split_profile(st, kernels)
        calls += split["calls"]
        kernel_calls += split["kernel_calls"]
        acc = kinds.setdefault(kind, {"held": 0.0, "nogil": 0.0, "wait": 0.0, "lock_wait": 0.0})
        for key in acc:
            acc[key] += split[key] * 1e6 / batches
        for label, seconds, _ in split["top_held"]:
            top[f"{kind}: {label}"] = top.get(f"{kind}: {label}", 0.0) + seconds * 1e6 / batches
    held = sum(k["held"] for k in kinds.values())
    nogil = sum(k["nogil"] for k in kinds.values())
    overhead = profiler_overhead() * 1e6 * calls / batches  # the profiler's own cost, per batch
    dispatch = min(nogil, dispatch_cost() * 1e6 * kernel_calls / batches)  # under the GIL, timed as the kernel's
    corrected = max(0.0, held - overhead) + dispatch
    nogil -= dispatch
    return {
        "batches": batches,
        "num_workers": num_workers,
        "plain_batch_us": plain * 1e6,
        "profiled_batch_us": profiled * 1e6,
        "per_batch_us": kinds,
        "calls_per_batch": calls / batches,
        "profiler_overhead_us": overhead,
        "dispatch_us": dispatch,
        "held_us": held,
        "held_corrected_us": corrected,
        "nogil_us": nogil,
        "serial_fraction": corrected / (corrected + nogil) if corrected + nogil else None,
        "serial_fraction_upper": (held + dispatch) / (held + dispatch + nogil) if held + nogil else None,
        "worker_lock_wait_us": kinds.get("worker", {}).get("lock_wait", 0.0),
        "top_held": sorted(([k, v] for k, v in top.items()), key=lambda kv: -kv[1])[:10],
    }
