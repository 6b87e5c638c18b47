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

:func:`kernel_timed_fraction` measures the same split without a profiler: every loaded nogil
dispatcher is wrapped (in the module namespaces that name it) by a timer of the calling thread's
CPU clock, and each loader thread's whole CPU time is read from its own clock
(``time.pthread_getcpuclockid``). A Python thread's CPU time outside the GIL-releasing calls is
time it holds the GIL, so ``held`` is the threads' CPU less the kernels' (plus the numba dispatch
the kernels' time includes, less the timers' own cost): no per-call overhead to correct, only one
timer per kernel call. What releases the GIL without being a wrapped kernel (file reads, OpenCV)
counts as held, so that figure is an upper bound too, a much tighter one for the compiled
pipelines. So does the CPU a thread spends in the kernel while it waits on a lock or a future,
which it does without the GIL.

:func:`gil_sampled_fraction` measures the GIL itself: `py-spy <https://github.com/benfred/py-spy>`_
(``record --gil``) samples, from another process, which thread holds the GIL, ``rate`` times a
second, without stopping this one. The samples in which a loader thread holds it, against the
threads' CPU time over the same batches, give the serial fraction with neither a profiler's cost
per call nor the waits and GIL-free library calls the two measures above count as held. Its
uncertainty is the sampling's (about ``1 / sqrt(samples)``), and time a thread holds the GIL
while the OS has preempted it counts (no other thread can run Python meanwhile either).

:func:`gil_traced_fraction` measures every hold of the GIL instead of sampling it: uprobes on the
return of CPython's ``take_gil`` and the entry of ``drop_gil`` (:class:`GilTrace`, root on Linux)
time each thread's holds in the kernel, so nothing is missed between samples. Each hold is
lengthened by the two probes' cost, measured in the same run on a loop that does nothing else
(:meth:`GilTrace.calibrate`) and removed. It also counts the holds: every GIL-releasing call (a
kernel, a file read, torch freeing a tensor) ends one, and each is a point where a waiting
thread may take the GIL over.
"""

from __future__ import annotations

import cProfile
import itertools
import os
import pstats
import re
import secrets
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable

import numpy as np

from ffload.errors import UnavailableError

PER_THREAD_PROFILES = sys.version_info < (3, 12)
"""Whether ``cProfile`` can profile each thread on its own, as :class:`ThreadProfiles` needs. From
Python 3.12 it is a ``sys.monitoring`` tool (PEP 669), one per process: a second profiler cannot
start ("Another profiling tool is already active"), and the one that runs gets every thread's calls
on one call stack, each timed by its own thread's clock, so its times mean nothing (on a 16-core
node under 3.12 they came out as minus 0.2 s per batch). :func:`serial_fraction` needs it; the other
two measures do not."""

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


class _Batches:
    """Batches taken from ``loader`` on one iterator, epochs started as needed; ``taken`` counts them."""

    def __init__(self, loader):
        self._loader, self._it, self.taken = loader, iter(loader), 0

    def take(self, count: int) -> None:
        done = 0
        while done < count:
            try:
                next(self._it)
            except StopIteration:
                self._it = iter(self._loader)
                continue
            done += 1
        self.taken += count


def _consume(loader, count: int) -> None:
    """Take ``count`` batches from ``loader``, starting epochs as needed."""
    _Batches(loader).take(count)


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
    together), ``readahead``, ``order`` and ``other`` (:func:`_thread_kind`).

    Raises:
        UnavailableError: Python 3.12 or later (:data:`PER_THREAD_PROFILES`); measure with
            :func:`kernel_timed_fraction` or :func:`gil_sampled_fraction` there."""
    if not PER_THREAD_PROFILES:
        raise UnavailableError(
            f"serial_fraction needs one cProfile per thread, which Python {sys.version_info[0]}.{sys.version_info[1]} "
            "cannot run (from 3.12 cProfile is one sys.monitoring tool for the whole process); use "
            "kernel_timed_fraction or gil_sampled_fraction"
        )
    loader = make_loader(num_workers)
    try:
        _consume(loader, min(batches, 20))  # JIT, buffers, page faults
        t0 = time.perf_counter()
        _consume(loader, batches)
        plain = (time.perf_counter() - t0) / batches
    finally:
        loader.close()
    kernels = nogil_kernels()
    profiles = ThreadProfiles()
    profiles.install()
    try:
        loader = make_loader(num_workers)
        _consume(loader, min(batches, 20))
        t0 = time.perf_counter()
        profiles.start()
        _consume(loader, batches)
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
        kind = _thread_kind(name) or "other"
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


class KernelClock:
    """Times every loaded nogil numba dispatcher (:func:`nogil_kernels`) that a module names, on
    the calling thread's CPU clock (:data:`CLOCK`), between :meth:`install` and :meth:`restore`.

    Calls through the module attribute (``jpeg.decode_rows(...)``, or a name imported with ``from
    ... import``) are timed; calls from compiled code are part of their caller's time. The
    kernels must be compiled before :meth:`install`: a compiled function typed after it would see
    the timer, a Python function, where it expects the dispatcher.

    Attributes:
        seconds: ``{thread id: CPU seconds inside timed kernels}``.
        calls: ``{thread id: timed calls}``.
    """

    def __init__(self):
        self.seconds: dict[int, float] = {}
        self.calls: dict[int, int] = {}
        self._replaced: list[tuple[dict, str, object]] = []

    def timed(self, dispatcher):
        """``dispatcher`` behind a timer of this clock."""
        seconds, calls, get_ident = self.seconds, self.calls, threading.get_ident

        def call(*args, **kwargs):
            start = CLOCK()
            try:
                return dispatcher(*args, **kwargs)
            finally:
                thread = get_ident()  # only this thread writes its entries
                seconds[thread] = seconds.get(thread, 0.0) + CLOCK() - start
                calls[thread] = calls.get(thread, 0) + 1

        return call

    def install(self) -> None:
        """Replace each nogil dispatcher by its timer wherever a module names it."""
        try:
            from numba.core.registry import CPUDispatcher
        except ImportError:
            return
        timers: dict[int, object] = {}
        for module in list(sys.modules.values()):
            namespace = getattr(module, "__dict__", None)
            if not isinstance(namespace, dict):
                continue
            for name, value in list(namespace.items()):
                if isinstance(value, CPUDispatcher) and value.targetoptions.get("nogil"):
                    timer = timers.setdefault(id(value), self.timed(value))
                    self._replaced.append((namespace, name, value))
                    namespace[name] = timer

    def restore(self) -> None:
        """Put the dispatchers back."""
        for namespace, name, value in self._replaced:
            namespace[name] = value
        self._replaced.clear()


def timer_overhead(calls: int = 20000) -> float:
    """Seconds of :data:`CLOCK` a :class:`KernelClock` timer adds per call, held (a no-op wrapped
    and called ``calls`` times, against the no-op called directly; >= 0)."""

    def noop():
        return None

    timed = KernelClock().timed(noop)

    def loop(f):
        t0 = CLOCK()
        for _ in range(calls):
            f()
        return CLOCK() - t0

    loop(noop), loop(timed)
    return max(0.0, (loop(timed) - loop(noop)) / calls)


def job_python_after_traffic(
    make_loader: Callable[[int], object], mib: tuple[int, ...] = (0, 4, 8, 16, 32, 64), repeats: int = 200
) -> dict[int, float]:
    """What a job's Python costs when the data it touches was evicted from the CPU caches: per
    ``m`` in ``mib``, the median wall microseconds of one worker job of one sample (every field of
    sample 0: the job's Python around kernels that have almost nothing to do), run right after
    this thread copied ``m`` MiB (``np.copyto``: ``m`` MiB read, ``m`` MiB written), ``repeats``
    times. A job of many small batches streams its payloads and outputs through the caches in
    the same way, and its Python then runs at this cost while holding the GIL.

    Runs jobs on this thread through the loader's internal worker entry (``Loader._runner``):
    for this checkout's loader only (raises ``AttributeError`` / ``TypeError`` on another one).
    """
    loader = make_loader(1)
    try:
        _consume(loader, 20)  # JIT, buffers, every thread started
        runner = loader._runner
        runner.read_ahead = None  # no read-ahead notices for these out-of-epoch jobs
        slot = runner.acquire_slot(force=True)
        one = np.zeros(1, np.int64)
        source = np.ones(max(mib, default=0) << 20, np.uint8)
        out = {}
        for m in mib:
            target = np.empty(m << 20, np.uint8)
            times = []
            for _ in range(repeats):
                np.copyto(target, source[: m << 20])
                t0 = time.perf_counter()
                runner._run(slot, 0, one, [1], 0)
                times.append(time.perf_counter() - t0)
            out[m] = float(np.median(times)) * 1e6
        return out
    finally:
        loader.close()


def _thread_kind(name: str) -> str | None:
    """A loader thread's kind (``main``, ``worker``, ``readahead``, ``order``: the
    next epoch's batches, :class:`~ffload.loaders.orders.EpochsAhead`), or None for other
    threads. ``name`` is the thread's name (``"main"`` for :class:`ThreadProfiles`' own)."""
    if name in ("MainThread", "main"):
        return "main"
    for prefix, kind in (("ffload-worker", "worker"), ("ffload-readahead", "readahead"), ("ffload-order", "order")):
        if name.startswith(prefix):
            return kind
    return None


def _thread_cpu() -> dict[int, tuple[str, float]]:
    """``{thread id: (kind, CPU seconds)}`` of this process's loader threads (:func:`_thread_kind`)."""
    out = {}
    for thread in threading.enumerate():
        kind = _thread_kind(thread.name)
        if kind is None or thread.ident is None:
            continue
        try:
            out[thread.ident] = (kind, time.clock_gettime(time.pthread_getcpuclockid(thread.ident)))
        except (OSError, ProcessLookupError):  # the thread ended meanwhile
            continue
    return out


def _cpu_us_per_batch(before: dict, after: dict, batches: int) -> dict[str, float]:
    """``{thread kind: CPU microseconds per batch}`` between two :func:`_thread_cpu` readings (a
    thread started meanwhile counts whole)."""
    out: dict[str, float] = {}
    for thread, (kind, cpu) in after.items():
        out[kind] = out.get(kind, 0.0) + (cpu - before.get(thread, (kind, 0.0))[1]) * 1e6 / batches
    return out


def kernel_timed_fraction(make_loader: Callable[[int], object], batches: int, num_workers: int = 1) -> dict:
    """Measure the serial fraction of ``make_loader(num_workers)`` (a ``Loader``) over ``batches``
    batches (after a warm-up of at most 20) without a profiler: each loader thread's CPU time (its
    own clock) against the CPU time spent inside the nogil kernels (:class:`KernelClock`); see the
    module docstring.

    Returns ``{'batches', 'num_workers', 'batch_us' (wall time per batch, timers on),
    'per_batch_us': {thread kind: {'cpu', 'kernel'}}, 'kernel_calls_per_batch', 'dispatch_us' and
    'timer_overhead_us' (per batch, moved out of the kernels' time and out of the held time),
    'held_us', 'nogil_us', 'serial_fraction'}``, CPU microseconds per batch; thread kinds as
    :func:`_thread_kind`. Linux (``pthread_getcpuclockid``) only: raises ``OSError`` elsewhere."""
    loader = make_loader(num_workers)
    clock = KernelClock()
    try:
        _consume(loader, min(batches, 20))  # JIT, buffers, page faults, every thread started
        clock.install()
        before = _thread_cpu()
        t0 = time.perf_counter()
        _consume(loader, batches)
        wall = time.perf_counter() - t0
        after = _thread_cpu()
    finally:
        clock.restore()
        loader.close()
    kinds = {kind: {"cpu": cpu, "kernel": 0.0} for kind, cpu in _cpu_us_per_batch(before, after, batches).items()}
    for thread, (kind, _) in after.items():
        kinds[kind]["kernel"] += clock.seconds.get(thread, 0.0) * 1e6 / batches
    calls = sum(clock.calls.values()) / batches
    kernel = sum(k["kernel"] for k in kinds.values())
    dispatch = min(kernel, dispatch_cost() * 1e6 * calls)
    overhead = timer_overhead() * 1e6 * calls
    nogil = kernel - dispatch
    held = max(0.0, sum(k["cpu"] for k in kinds.values()) - kernel + dispatch - overhead)
    return {
        "batches": batches,
        "num_workers": num_workers,
        "batch_us": wall * 1e6 / batches,
        "per_batch_us": kinds,
        "kernel_calls_per_batch": calls,
        "dispatch_us": dispatch,
        "timer_overhead_us": overhead,
        "held_us": held,
        "nogil_us": nogil,
        "serial_fraction": held / (held + nogil) if held + nogil else None,
    }


def py_spy_path() -> str | None:
    """The ``py-spy`` executable (next to this interpreter, else on ``PATH``), or None."""
    here = os.path.join(os.path.dirname(sys.executable), "py-spy")
    return here if os.access(here, os.X_OK) else shutil.which("py-spy")


def gil_samples(path: str) -> dict[str, int]:
    """``{thread name: samples}`` of a ``py-spy record --gil --threads --format raw`` output file
    (lines ``thread (<id>): <name>;<frames> <count>``; a thread without a name counts as its id)."""
    counts: dict[str, int] = {}
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            stack, _, count = line.strip().rpartition(" ")
            if not stack or not count.isdigit():
                continue
            head = stack.split(";", 1)[0]
            name = head.split("): ", 1)[1] if "): " in head else head
            counts[name] = counts.get(name, 0) + int(count)
    return counts


def _sampling_errors(log: str) -> int:
    """The failed samples py-spy reports in its last line (``... Samples: S Errors: E``), else 0."""
    _, found, rest = log.rpartition("Errors:")
    words = rest.split()
    return int(words[0]) if found and words and words[0].isdigit() else 0


TRACEFS = "/sys/kernel/tracing"
"""Where the kernel's tracing file system is (mounted there by :class:`GilTrace` when it is not)."""

_TRACE_LINE = re.compile(rb"-(\d+)\s+\(\s*(\d+)\)\s+\[\d+\]\s+\S+\s+(\d+\.\d+): (took|drop):")
_GROUP = "ffload_gil_"
_COLD_PART = re.compile(r"\.cold(\.\d+)?$")


def _interpreter_file() -> str:
    """The file that holds this interpreter's GIL code: the ``libpython3.X`` it mapped (not the
    ``libpython3.so`` stub), else its executable."""
    name = f"/libpython{sys.version_info.major}.{sys.version_info.minor}"
    with open("/proc/self/maps") as f:
        for line in f:
            path = line.split(maxsplit=5)[-1].strip()
            if name in path:
                return path
    return os.path.realpath(sys.executable)


def _elf_file_offset(path: str, address: int) -> int:
    """The file offset of the virtual ``address`` of a 64-bit little-endian ELF file (from its
    loadable segments, what a uprobe needs). Raises UnavailableError for another file format."""
    with open(path, "rb") as f:
        head = f.read(64)
        if head[:4] != b"\x7fELF" or head[4:6] != b"\x02\x01":
            raise UnavailableError(f"{path} is not a 64-bit little-endian ELF file")
        (phoff,) = struct.unpack_from("<Q", head, 32)
        size, count = struct.unpack_from("<HH", head, 54)
        f.seek(phoff)
        table = f.read(size * count)
    for k in range(count):
        kind, _, offset, vaddr, _, filesz = struct.unpack_from("<IIQQQQ", table, k * size)
        if kind == 1 and vaddr <= address < vaddr + filesz:  # PT_LOAD
            return address - vaddr + offset
    raise UnavailableError(f"{path}: address {address:#x} is in no loadable segment")


def gil_probe_points() -> tuple[str, int, int]:
    """``(file, take_gil offset, drop_gil offset)``: where this interpreter takes and drops the GIL
    (CPython's static ``take_gil`` and ``drop_gil``, from the file's symbol table by ``nm``).

    Raises:
        UnavailableError: no ``nm`` (binutils); the file has no such symbols (a stripped build;
            pyenv's and python.org's builds keep them); or the compiler made copies of them
            (``take_gil.constprop.0``, ...), whose holds a probe on the original would miss.
    """
    path = _interpreter_file()
    nm = shutil.which("nm")
    if nm is None:
        raise UnavailableError("nm (binutils) not found: the GIL's code cannot be located")
    listing = subprocess.run([nm, "--defined-only", path], capture_output=True, text=True).stdout
    found, copies = {}, []
    for line in listing.splitlines():
        words = line.split()
        if len(words) != 3:
            continue
        if words[2] in ("take_gil", "drop_gil"):
            found[words[2]] = int(words[0], 16)
        elif words[2].startswith(("take_gil.", "drop_gil.")) and not _COLD_PART.search(words[2]):
            copies.append(words[2])  # a clone (.constprop, .isra, .part); a .cold part is the same call
    if copies:
        raise UnavailableError(f"{path} has copies of the GIL's functions ({', '.join(copies)}): holds would be missed")
    if len(found) != 2:
        raise UnavailableError(f"{path} has no take_gil/drop_gil symbols (a stripped build)")
    return path, _elf_file_offset(path, found["take_gil"]), _elf_file_offset(path, found["drop_gil"])


def gil_holds(lines, pid: int) -> tuple[dict[int, tuple[float, int]], int]:
    """Pair a trace's ``took`` and ``drop`` events (lines of a :class:`GilTrace` instance's
    ``trace`` file, bytes) per thread of process ``pid``: ``({thread id: (seconds held, holds)},
    unpaired)``, where ``unpaired`` counts a ``took`` that a second ``took`` replaced and a
    ``drop`` without its ``took`` (a hold begun before the trace). Timestamps are printed in
    microseconds: each hold is rounded to one, which a sum of many holds averages out."""
    wanted, taken, held, seen, unpaired = str(pid).encode(), {}, {}, set(), 0
    for line in lines:
        m = _TRACE_LINE.search(line)
        if m is None or m.group(2) != wanted:
            continue
        tid, at = int(m.group(1)), float(m.group(3))
        if m.group(4) == b"took":
            unpaired += tid in taken
            taken[tid] = at
        elif tid in taken:
            seconds, holds = held.get(tid, (0.0, 0))
            held[tid] = (seconds + at - taken.pop(tid), holds + 1)
        elif tid in seen:  # a thread's first drop ends a hold begun before the trace: not counted
            unpaired += 1
        seen.add(tid)
    return held, unpaired


def _lost_events(header: bytes) -> int:
    """Events the ring buffer overwrote, from a trace's ``# entries-in-buffer/entries-written: B/W``
    header line (0 where there is none)."""
    m = re.search(rb"entries-in-buffer/entries-written: (\d+)/(\d+)", header)
    return int(m.group(2)) - int(m.group(1)) if m else 0


class GilTrace:
    """Every hold of the GIL by this process's threads, timed by the kernel: a uprobe on the return
    of CPython's ``take_gil`` (the thread holds the GIL from then) and one on the entry of
    ``drop_gil`` (it lets go), recorded in a tracing instance of its own (``tracefs``, the
    ``global`` clock where the kernel has it, so that a thread moving between CPUs is timed on one
    clock), with each event's thread and process. Unlike sampling, nothing is missed and nothing
    is estimated; each hold is lengthened by the probes' own cost, which :meth:`calibrate` measures
    and :func:`gil_traced_fraction` removes. While recording, the probes also stop every other
    process that runs the same interpreter file at each GIL hand-off (a few microseconds each; their
    events are left out). Linux only; needs root (it mounts ``tracefs`` at :data:`TRACEFS` if
    needed) and a kernel with uprobe events. A context manager: leaving it removes the probes and
    the instance; probes that a killed process left are removed by the next one's constructor.

    Args:
        buffer_kib: the instance's ring buffer per CPU, KiB (kernel memory while it exists).

    Raises:
        UnavailableError: (constructing) not root, no uprobe events, or :func:`gil_probe_points` or
            setting up the probes failed.
    """

    def __init__(self, buffer_kib: int = 65536):
        self._added: list[str] = []
        self._instance: str | None = None
        if not sys.platform.startswith("linux") or os.geteuid() != 0:
            raise UnavailableError("tracing the GIL needs root on Linux (uprobes)")
        if not os.path.exists(os.path.join(TRACEFS, "uprobe_events")):
            try:
                subprocess.run(["mount", "-t", "tracefs", "nodev", TRACEFS], capture_output=True)
            except OSError:  # no mount command: the check below says so
                pass
        if not os.path.exists(os.path.join(TRACEFS, "uprobe_events")):
            raise UnavailableError(f"no uprobe events under {TRACEFS} (kernel without CONFIG_UPROBE_EVENTS?)")
        path, take, drop = gil_probe_points()
        _remove_stale_traces()
        self.group = f"{_GROUP}{_pid_namespace()}_{os.getpid()}_{secrets.token_hex(3)}"
        try:
            for event, spec in (
                ("took", f"r:{self.group}/took {path}:{take:#x}"),
                ("drop", f"p:{self.group}/drop {path}:{drop:#x}"),
            ):
                _tracefs_write("uprobe_events", spec + "\n", append=True)
                self._added.append(f"{self.group}/{event}")
            os.mkdir(os.path.join(TRACEFS, "instances", self.group))
            self._instance = os.path.join("instances", self.group)
            _tracefs_write(os.path.join(self._instance, "buffer_size_kb"), str(int(buffer_kib)))
            _tracefs_write(os.path.join(self._instance, "options", "record-tgid"), "1")
            try:
                _tracefs_write(os.path.join(self._instance, "trace_clock"), "global")
            except OSError:  # a kernel without it: the per-CPU clock
                pass
        except BaseException as e:
            try:
                self.close()
            except OSError:  # the setup's own error is the one to report
                pass
            if isinstance(e, OSError):
                raise UnavailableError(f"uprobes on {path}: {e}") from e
            raise

    def _enable(self, on: bool) -> None:
        """Switch the probes on (off) with the instance's buffer off, then the buffer on: enabling a
        probe installs it in every process that maps the interpreter, which a busy process's
        threads can take hundreds of milliseconds to let happen, one event after the other. Had the
        events recorded meanwhile, a thread's drops would be traced without their takes for that
        long (3 % of a 6 s trace's holds, raw 32x32 in long epochs); the buffer's switch starts and
        stops every event at once."""
        _tracefs_write(os.path.join(self._instance, "tracing_on"), "0")
        _tracefs_write(os.path.join(self._instance, "events", self.group, "enable"), "1" if on else "0")
        if on:
            _tracefs_write(os.path.join(self._instance, "tracing_on"), "1")

    def record(self, work: Callable[[], None]) -> dict[int, tuple[float, int]]:
        """Run ``work()`` with the probes on; ``{thread id (native): (seconds held, holds)}`` of this
        process's threads over that time (:func:`gil_holds`; a hold begun before ``work`` is not
        counted).

        Raises:
            UnavailableError: no event of this process was recorded (its ids as the kernel prints
                them differ from this process's own: another PID namespace).
            OSError: the ring buffer overwrote events (raise ``buffer_kib``), or more than 1 %
                of the holds could not be paired.
        """
        _tracefs_write(os.path.join(self._instance, "trace"), "")
        self._enable(True)
        try:
            work()
        except BaseException:
            _try(self._enable, False)  # the work's exception is the one to see
            raise
        self._enable(False)
        with open(os.path.join(TRACEFS, self._instance, "trace"), "rb") as f:
            header = []
            for line in f:  # the header, then the events, read as they come (the text may be GBs)
                if not line.startswith(b"#"):
                    header.append(line)
                    break
                header.append(line)
            lost = _lost_events(b"".join(header))
            if lost:
                raise OSError(f"the trace lost {lost} events: raise buffer_kib")
            held, unpaired = gil_holds(itertools.chain(header[-1:], f), os.getpid())
        holds = sum(n for _, n in held.values())
        if not holds:
            raise UnavailableError("no GIL hold of this process was traced (another PID namespace?)")
        if unpaired > 1 + holds // 100:
            raise OSError(f"{unpaired} GIL events of {holds} holds could not be paired")
        return held

    def calibrate(self, holds: int = 5000) -> float:
        """Seconds the probes add to one hold: the mean traced hold of a loop that drops the GIL at
        once after taking it (``os.fstat``, which releases it around the system call). The
        loop's own Python (a few tens of nanoseconds per turn) counts as probe cost, so what
        this removes undercounts a hold by as much."""
        fd = os.open(os.devnull, os.O_RDONLY)
        try:

            def loop():
                for _ in range(holds):
                    os.fstat(fd)

            held = self.record(loop).get(threading.get_native_id(), (0.0, 0))
        finally:
            os.close(fd)
        return held[0] / held[1] if held[1] else 0.0

    def close(self) -> None:
        """Remove the instance and the probes this object made (idempotent). Every step is tried;
        raises OSError for the first that failed, once all were."""
        errors = []
        if self._instance is not None:
            errors += _try(self._enable, False)
            failed = _try(os.rmdir, os.path.join(TRACEFS, self._instance))
            errors += failed
            if not failed:
                self._instance = None
        for event in list(reversed(self._added)):
            failed = _try(_tracefs_write, "uprobe_events", f"-:{event}\n", append=True)
            errors += failed
            if not failed:
                self._added.remove(event)
        if errors:
            raise errors[0]

    def __enter__(self):
        return self

    def __exit__(self, kind, *_) -> None:
        try:
            self.close()
        except OSError:
            if kind is None:  # else the exception in flight is the one to see
                raise


def _try(call: Callable, *args, **kwargs) -> list[OSError]:
    """``[]`` when ``call(*args, **kwargs)`` succeeds or finds nothing to undo (ENOENT), else its OSError."""
    try:
        call(*args, **kwargs)
    except FileNotFoundError:
        return []
    except OSError as e:
        return [e]
    return []


def _tracefs_write(path: str, text: str, append: bool = False) -> None:
    """Write ``text`` to ``path`` under :data:`TRACEFS` (``os.open``: Python's append mode seeks to
    the end, which tracefs refuses). ``uprobe_events`` only by appending: truncating it would
    remove every uprobe on the machine."""
    if path == "uprobe_events" and not append:
        raise ValueError("uprobe_events is appended to, never truncated")
    fd = os.open(os.path.join(TRACEFS, path), os.O_WRONLY | (os.O_APPEND if append else os.O_TRUNC))
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _pid_namespace() -> int:
    """This process's PID namespace (the inode of ``/proc/self/ns/pid``), 0 where unreadable: a
    trace's name carries it, so that only traces of processes in this namespace, whose pids are
    this process's to check, are taken for dead."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def _stale(group: str) -> bool:
    """Whether ``group`` names a :class:`GilTrace` of a process in this PID namespace that is gone."""
    parts = group[len(_GROUP) :].split("_") if group.startswith(_GROUP) else []
    if len(parts) != 3 or not (parts[0].isdigit() and parts[1].isdigit()):
        return False
    return int(parts[0]) == _pid_namespace() and not os.path.exists(f"/proc/{parts[1]}")


def _remove_stale_traces() -> None:
    """Remove the instances and probes of :class:`GilTrace` objects whose process is gone (killed
    before it could leave its context). Best effort: what cannot be removed is left for later."""
    instances = os.path.join(TRACEFS, "instances")
    try:
        names = os.listdir(instances) if os.path.isdir(instances) else []
        for name in filter(_stale, names):
            _try(_tracefs_write, os.path.join("instances", name, "events", name, "enable"), "0")
            _try(os.rmdir, os.path.join(instances, name))
        with open(os.path.join(TRACEFS, "uprobe_events")) as f:
            events = {line.split()[0].split(":", 1)[1] for line in f if line.strip()}
    except OSError:
        return
    for event in events:
        if _stale(event.split("/", 1)[0]):
            _try(_tracefs_write, "uprobe_events", f"-:{event}\n", append=True)


def gil_traced_fraction(make_loader: Callable[[int], object], seconds: float = 3.0, num_workers: int = 1) -> dict:
    """Measure the serial fraction of ``make_loader(num_workers)`` (a ``Loader``) from every hold of
    the GIL (:class:`GilTrace`), while batches are taken for ``seconds`` (after a warm-up of 20),
    against the loader threads' CPU clocks over the same batches. Each hold's probe cost
    (:meth:`GilTrace.calibrate`, same run) is removed.

    Returns ``{'batches', 'num_workers', 'seconds', 'batch_us' (wall time per batch, probes on),
    'probe_us' (per hold), 'per_batch_us': {thread kind: {'cpu', 'held', 'holds'}}, 'holds'
    (per batch, all kinds), 'held_us', 'cpu_us', 'serial_fraction' (held / CPU)}``,
    microseconds per batch (``holds``: GIL holds per batch); thread kinds as :func:`_thread_kind`.

    Raises:
        UnavailableError: the GIL cannot be traced here (:class:`GilTrace`).
        OSError: the trace lost events or could not be read (:meth:`GilTrace.record`).
    """
    with GilTrace() as trace:
        probe = trace.calibrate()
        loader = make_loader(num_workers)
        try:
            batches = _Batches(loader)
            batches.take(20)  # JIT, buffers, page faults, every thread started
            state: dict = {}

            def work():
                state["first"], state["cpu"], t0 = batches.taken, _thread_cpu(), time.perf_counter()
                while time.perf_counter() - t0 < seconds:
                    batches.take(8)
                state["wall"], state["cpu_after"] = time.perf_counter() - t0, _thread_cpu()

            held = trace.record(work)
            kinds_of = {t.native_id: _thread_kind(t.name) for t in threading.enumerate()}
        finally:
            loader.close()
    taken = batches.taken - state["first"]
    kinds = {
        kind: {"cpu": cpu, "held": 0.0, "holds": 0.0}
        for kind, cpu in _cpu_us_per_batch(state["cpu"], state["cpu_after"], taken).items()
    }
    for tid, (secs, holds) in held.items():
        kind = kinds_of.get(tid)
        if kind is not None:
            acc = kinds.setdefault(kind, {"cpu": 0.0, "held": 0.0, "holds": 0.0})
            acc["held"] += max(0.0, secs - holds * probe) * 1e6 / taken
            acc["holds"] += holds / taken
    held_us = sum(k["held"] for k in kinds.values())
    cpu = sum(k["cpu"] for k in kinds.values())
    return {
        "batches": taken,
        "num_workers": num_workers,
        "seconds": seconds,
        "batch_us": state["wall"] * 1e6 / taken,
        "probe_us": probe * 1e6,
        "per_batch_us": kinds,
        "holds": sum(k["holds"] for k in kinds.values()),
        "held_us": held_us,
        "cpu_us": cpu,
        "serial_fraction": held_us / cpu if cpu else None,
    }


def gil_sampled_fraction(
    make_loader: Callable[[int], object],
    seconds: int = 3,
    num_workers: int = 1,
    rate: int = 500,
    py_spy: str | None = None,
) -> dict:
    """Measure the serial fraction of ``make_loader(num_workers)`` (a ``Loader``) by sampling the
    GIL's holder (see the module docstring): ``py-spy record --gil`` on this process for
    ``seconds`` (a whole number, >= 1) at ``rate`` Hz while batches are taken (after a warm-up of
    20), and the loader threads' CPU clocks over the same batches. Samples py-spy could not read
    are left out of the sampling window; GIL samples of threads that are not the loader's are
    reported (``samples['other']``) but not counted as the loader's.

    Returns ``{'batches', 'num_workers', 'seconds', 'rate', 'samples': {thread kind: GIL samples},
    'sampling_errors', 'batch_us' (wall time per batch), 'per_batch_us': {thread kind: {'cpu',
    'held'}}, 'held_us', 'cpu_us', 'serial_fraction' (held / CPU), 'relative_error'
    (``1 / sqrt(samples)``)}``, microseconds per batch; thread kinds as :func:`_thread_kind`.

    Raises:
        FileNotFoundError: no ``py-spy`` (``pip install py-spy``: the ``bench`` extra).
        OSError: ``py-spy`` failed, or ran a minute past ``seconds`` (it is then stopped; it
            needs ``ptrace`` on this process: a container may forbid it, see
            ``kernel.yama.ptrace_scope``); the message carries its output.
    """
    seconds = max(1, int(seconds))
    exe = py_spy or py_spy_path()
    if exe is None:
        raise FileNotFoundError("py-spy not found: pip install py-spy (ffload's 'bench' extra)")
    loader = make_loader(num_workers)
    spy = None
    try:
        batches = _Batches(loader)
        batches.take(20)  # JIT, buffers, page faults, every thread started
        with tempfile.TemporaryDirectory() as tmp:
            out, log_path = os.path.join(tmp, "gil.txt"), os.path.join(tmp, "py-spy.log")
            cmd = [exe, "record", "--pid", str(os.getpid()), "--rate", str(rate), "--duration", str(seconds)]
            cmd += ["--gil", "--threads", "--nonblocking", "--format", "raw", "--output", out]
            with open(log_path, "wb") as log_file:  # a file, not a pipe: py-spy never blocks on its output
                spy = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT)
            first, before, t0 = batches.taken, _thread_cpu(), time.perf_counter()
            deadline, overdue = t0 + seconds + 60, False
            while spy.poll() is None:
                if time.perf_counter() > deadline:
                    spy.kill()
                    spy.wait()
                    overdue = True
                    break
                batches.take(8)
            wall, after = time.perf_counter() - t0, _thread_cpu()
            with open(log_path, encoding="utf-8", errors="replace") as f:
                log = f.read()
            if overdue:
                raise OSError(
                    f"py-spy ran {seconds + 60} s (asked for {seconds}) and was stopped: {log.strip()[-2000:]}"
                )
            if spy.returncode != 0 or not os.path.exists(out):
                raise OSError(f"py-spy exited with {spy.returncode}: {log.strip()[-2000:]}")
            samples = gil_samples(out)
    finally:
        if spy is not None and spy.poll() is None:
            spy.kill()
            spy.wait()
        loader.close()
    taken = batches.taken - first
    errors = _sampling_errors(log)
    kinds = {kind: {"cpu": cpu, "held": 0.0} for kind, cpu in _cpu_us_per_batch(before, after, taken).items()}
    held_samples: dict[str, int] = {}
    for name, count in samples.items():
        kind = _thread_kind(name) or "other"
        held_samples[kind] = held_samples.get(kind, 0) + count
    # the share of the sampling window each kind held the GIL, times the wall time per batch
    per_sample_us = wall / max(1, seconds * rate - errors) * 1e6 / taken
    for kind, count in held_samples.items():
        if kind != "other":
            kinds.setdefault(kind, {"cpu": 0.0, "held": 0.0})["held"] = count * per_sample_us
    held = sum(k["held"] for k in kinds.values())
    cpu = sum(k["cpu"] for k in kinds.values())
    total = sum(v for k, v in held_samples.items() if k != "other")
    return {
        "batches": taken,
        "num_workers": num_workers,
        "seconds": seconds,
        "rate": rate,
        "samples": held_samples,
        "sampling_errors": errors,
        "batch_us": wall * 1e6 / taken,
        "per_batch_us": kinds,
        "held_us": held,
        "cpu_us": cpu,
        "serial_fraction": held / cpu if cpu else None,
        "relative_error": 1 / total**0.5 if total else None,
    }
