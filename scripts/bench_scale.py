"""Loading a dataset larger than RAM from a cold disk: ffload vs ffcv 1.0.2 vs the disk itself.

    # with ffload importable (pip install -e . or PYTHONPATH=.); cases run in child processes
    flock /tmp/ffload-bench.lock python scripts/bench_scale.py                   # > RAM (slow)
    flock /tmp/ffload-bench.lock python scripts/bench_scale.py --size-gb 4 --seconds 40
    python scripts/bench_scale.py --data big.beton --num-workers 16 --keep       # a given file

1. Dataset: raw 256x256 RGB images (192 KiB each, as ImageNet at 256 px stored raw), labels
   equal to the sample index, and the index stamped in each image's first 8 bytes, written by
   ``ffload.formats.write_dataset`` (8 MiB pages) in ``--dir``; ``--size-gb`` defaults to 1.25x
   this machine's RAM. It is deleted at the end unless ``--keep`` (a ``--data`` file is kept).
2. The disk's own limits on that file, in the same run: random reads of one sample's size
   (``O_DIRECT``, 1, 4 and 16 in flight, one thread each) and sequential 8 MiB reads.
3. Optional (``--readahead-probe``): how fast random samples are read through a memory map with
   no prefetch, ``posix_fadvise(WILLNEED)``, ``madvise(MADV_WILLNEED)`` or ``preadv`` from 16
   threads issued first (the choice documented in ``ffload/loaders/memory/readahead.py``).
   ``--cache-probe``: ffload's ``os_cache=False`` cache alone (``prepare``/``release`` of the
   QUASI_RANDOM batches, no decoding), page pool vs block cache, twice each, cold each time.
4. ffload and ffcv, each in RANDOM and QUASI_RANDOM x ``os_cache`` True/False, each in a fresh
   process, page cache dropped first (``sync; echo 3 > /proc/sys/vm/drop_caches``: needs root;
   the script checks that ``Cached`` fell and says when it could not drop), batch 256, decoder
   ``SimpleRGBImageDecoder`` + ``ToTensor``, for up to ``--seconds`` after the first batch (or one
   epoch); ``--warm``: the page cache kept instead (the loaders' CPU side alone, on a dataset
   that fits in RAM). ``--lmdb``: ffload also on an LMDB copy of the same samples (rows ``ffload-lmdb``,
   whose ratio is against ffload on the ``.beton``). Every batch is checked: stamp == label,
   and for ffload the indices are exactly ``loader.epoch_order(0)``; for ffcv no sample twice.
   ``--rounds N``: each cell's loaders run N times, interleaved (in order, then reversed: A B,
   B A, ...); a row shows the run of median MiB/s and its ratio is the median of the rounds'
   ratios (this VM's disk swings 1.5-2x within minutes: one round per cell is not enough to
   compare two formats).

``--scaling``: instead of the above, how ffload scales with worker threads on this machine, data in
the page cache (``--quick``: <= 90 s on a 16-core node):

* ``raw``: raw 32x32 images (``--raw-samples``, random pixels), ``SimpleRGBImageDecoder`` + flip,
  batch 256, random order (each sample repeated so that an epoch has 40 batches per worker of the
  largest count); ``rrc``: ImageNet-sized JPEGs (``--jpeg-samples`` photos of
  ``ffload.bench.datasets.build_photo_jpegs``), ``RandomResizedCrop(224)`` + flip, batch 128. Both
  are built in ``--dir`` and reused. ``wait``: ``raw`` plus a stage that sleeps ``--wait-us`` per
  row (:func:`wait_stage`): workers that need no core, standing for a machine with a core per worker,
  so that how the loader schedules jobs at 16 workers can be measured on 2 cores (worker counts
  are then not capped at the usable CPUs, neither by this script nor by the loader). ``--epoch-samples N``: epochs of N samples instead
  (CIFAR-10's 50,000: at 16 workers an epoch is then about 12 batches per worker, and its
  start and end are a large part of it).
* img/s at each of ``--workers`` (default 1, 2, 4, 8, 12, 16, the usable CPUs at most), every case
  in a fresh process, ``--seconds`` each after the first batch; and the median wall time of
  ``iter(loader)`` at each new epoch (an epoch start: no worker has a job meanwhile).
* the serial fraction (:func:`ffload.bench.serial.serial_fraction`): per batch, the CPU time the
  loader's threads hold the GIL against all the CPU time they spend, with one worker, profiled; and
  the workers' lock wait. Then the same split without a profiler
  (:func:`ffload.bench.serial.kernel_timed_fraction`: the threads' CPU clocks against timed kernel
  calls), a tighter bound; and, where ``py-spy`` is installed (the ``bench`` extra), the GIL itself
  sampled (:func:`ffload.bench.serial.gil_sampled_fraction`: which thread holds it, ``--gil-seconds``
  at 500 Hz, against the threads' CPU); and, where this runs as root on Linux with uprobe events,
  every hold of the GIL traced (:func:`ffload.bench.serial.gil_traced_fraction`: the kernel times
  each ``take_gil`` return and ``drop_gil`` entry, ``--gil-seconds``; nothing sampled, the probes'
  cost per hold measured and removed). The measuring code is this checkout's for every tree.
  ``--cold-cache`` (raw, this checkout's loader): a one-sample job's Python timed right after 0 to
  64 MiB were copied (:func:`ffload.bench.serial.job_python_after_traffic`), what a job's Python
  costs once its own payloads and outputs have evicted it from the caches. Amdahl's projection ``1 / (s + (1 - s) / n)`` for 16 and 32 workers (and
  its share of linear), next to the measured curve. ``--serial-jobs N``: the serial measures run
  jobs of N batches (``batches_per_job``) instead of the loader's choice for one worker, such as
  the jobs the largest worker count runs (42 for raw 32x32 at 16 workers, 32 MiB; 170, 128 MiB, once
  they are measured fast in a long epoch), for a projection
  of those workers; the scaling curve keeps the loader's choice. ``--serial-epoch-samples N``: the
  serial measures' epochs are N samples (samples repeated), as long as those workers' epochs: with
  the scaling curve's (40 batches per worker of the largest count: 80 at ``--workers 1,2``) an
  epoch holds two 42-batch jobs, and each epoch's start and order are counted once per 80 batches.
  ``--process-cache``: every loader reads through the process cache (``os_cache=False``: blocks
  copied into the process's own memory, what a dataset larger than RAM is read with) instead of
  the mapped file; ``--cache-limit BYTES`` gives them that ``cache_limit`` (below the data's size,
  each epoch evicts blocks and reads them again, from the page cache: the loader's side of reading
  a dataset larger than its cache). ``--quasi-random``: the loaders read in QUASI_RANDOM order
  (with ``--process-cache``: the page pool, FFCV's setting for a dataset larger than RAM, where
  ``cache_limit`` holds a batch's pages; the report names the memory manager each tree read
  through).
* ``--baseline DIR``: another checkout's ``ffload`` (its parent folder on ``PYTHONPATH``) measured
  in the same run, rounds interleaved (``--rounds``), with the ratio per worker count.

Writes ``results.md`` and ``results.json`` to ``--out``.

Prints img/s, MiB/s, peak RSS (``VmHWM`` of the case's process; with ``os_cache=True`` it
counts the page-cache pages the process mapped, which the kernel reclaims), the ratio to ffcv in the
same cell, and to the disk limit (random cases: the 16-in-flight random rate; quasi-random: the
sequential rate); writes ``results.md``, ``results.json`` and ``throughput.png`` to ``--out``.
"""

from __future__ import annotations

import argparse
import functools
import json
import mmap
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

SIDE = 256
SAMPLE = SIDE * SIDE * 3  # bytes of one raw image
MIB = 1 << 20


# ------------------------------------------------------------------ dataset
def build_dataset(path: str, size_bytes: int) -> int:
    """Write ``size_bytes // SAMPLE`` stamped raw images to ``path``; returns the count."""
    from ffload.formats import IntField, RGBImageField, write_dataset

    n = max(1, size_bytes // SAMPLE)
    pool = np.random.default_rng(0).integers(0, 256, 64 * MIB, dtype=np.uint8)

    def samples():
        for i in range(n):
            start = (i * 7919 * 4096) % (pool.size - SAMPLE)
            image = pool[start : start + SAMPLE].copy()
            image[:8] = np.frombuffer(np.int64(i).tobytes(), np.uint8)
            yield image.reshape(SIDE, SIDE, 3), i

    write_dataset(path, {"image": RGBImageField(write_mode="raw"), "label": IntField()}, samples(), n)
    return n


# --------------------------------------------------------------- page cache
def cached_bytes() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("Cached:"):
                return int(line.split()[1]) * 1024
    return 0


def drop_caches(data_path: str) -> str:
    """Drop the page cache (root) and say whether it worked; otherwise evict the data file's
    pages with ``POSIX_FADV_DONTNEED`` (works for clean pages without root)."""
    before = cached_bytes()
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        dropped = True
    except OSError:
        dropped = False
    fd = os.open(data_path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
    after = cached_bytes()
    how = "drop_caches" if dropped else "fadvise(DONTNEED) only (drop_caches not permitted)"
    return f"{how}: Cached {before / 2**30:.1f} -> {after / 2**30:.1f} GiB"


# --------------------------------------------------------------- disk limits
def _direct_reader(path, offsets, size, out, stop):
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECT", 0))
    buf = mmap.mmap(-1, size)
    done = 0
    try:
        for off in offsets:
            if stop[0] < time.perf_counter():
                break
            done += os.preadv(fd, [buf], int(off))
    finally:
        os.close(fd)
        buf.close()
    out.append(done)


def disk_rate(path: str, data_size: int, size: int, in_flight: int, seconds: float, sequential: bool = False) -> float:
    """MiB/s of ``O_DIRECT`` reads of ``size`` bytes, ``in_flight`` threads, for ``seconds``."""
    span = (data_size - size) // 4096
    rng = np.random.default_rng(in_flight)
    out, threads = [], []
    stop = [time.perf_counter() + seconds]
    for _ in range(in_flight):
        if sequential:
            start = rng.integers(0, max(1, span)) * 4096
            offsets = (start + np.arange(data_size // size) * size) % (data_size - size)
            offsets -= offsets % 4096
        else:
            offsets = rng.integers(0, span, 200_000) * 4096
        threads.append(threading.Thread(target=_direct_reader, args=(path, offsets, size, out, stop)))
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(out) / MIB / (time.perf_counter() - t0)


# ------------------------------------------------------------ cache path alone
def cache_probe(path: str, kind: str, limit: int, batch_size: int, workers: int, seconds: float) -> float:
    """MiB/s of samples made resident by ffload's ``os_cache=False`` cache alone: ``prepare`` +
    ``release`` of each batch of the QUASI_RANDOM epoch, in order from ``workers`` threads, no
    decoding and no read-ahead, for up to ``seconds``. ``kind``: ``"pool"`` (the page pool) or
    ``"blocks"`` (the block cache, 4-64 KiB blocks, which gives evicted memory back)."""
    import concurrent.futures

    import ffload
    from ffload.loaders.memory.pagepool import PagePoolMemory
    from ffload.loaders.memory.process_cache import ProcessCacheMemory

    with ffload.Loader(path, batch_size=batch_size, order="quasi_random", read_ahead=0) as loader:
        order, view = loader.epoch_order(0), loader.view
    batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    memory = (
        PagePoolMemory(view, ["image"], limit, batch_size)
        if kind == "pool"
        else ProcessCacheMemory(view, ["image"], limit, batch_size, whole_pages=True)
    )
    memory.schedule(batches, 0)
    t0 = time.perf_counter()

    def one(k):
        if time.perf_counter() - t0 > seconds:
            return 0
        memory.release(memory.prepare(batches[k], k))
        return len(batches[k])

    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        done = sum(pool.map(one, range(len(batches))))
    rate = done * SAMPLE / MIB / (time.perf_counter() - t0)
    memory.close()
    return rate


# ------------------------------------------------------ read-ahead mechanisms
def readahead_probe(path: str, ptrs: np.ndarray, mechanism: str, count: int) -> float:
    """MiB/s reading ``count`` random samples through a memory map after prefetching them all
    with ``mechanism`` (cold cache; prefetch and touch both timed)."""
    import concurrent.futures

    picks = np.random.default_rng(7).choice(len(ptrs), count, replace=False)
    fd = os.open(path, os.O_RDONLY)
    region = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
    view = np.frombuffer(region, np.uint8)
    t0 = time.perf_counter()
    if mechanism == "fadvise":
        for p in ptrs[picks]:
            os.posix_fadvise(fd, int(p), SAMPLE, os.POSIX_FADV_WILLNEED)
    elif mechanism == "madvise":
        for p in ptrs[picks]:
            start = int(p) - int(p) % mmap.PAGESIZE
            region.madvise(mmap.MADV_WILLNEED, start, int(p) + SAMPLE - start)
    elif mechanism == "preadv16":

        def read(p, buf=threading.local()):
            if not hasattr(buf, "b"):
                buf.b = bytearray(SAMPLE)
            os.preadv(fd, [buf.b], int(p))

        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            list(pool.map(read, ptrs[picks]))
    total = 0
    for p in ptrs[picks]:
        total += int(view[int(p) : int(p) + SAMPLE : 4096].sum())  # touch every page
    seconds = time.perf_counter() - t0
    del view
    region.close()
    os.close(fd)
    return count * SAMPLE / MIB / seconds


# -------------------------------------------------------------- one case
def run_case(args) -> dict:
    """In a fresh process: one loader, one order, one os_cache; returns the measurement."""
    import torch  # noqa: F401  (both loaders import it; keep it out of the timing)

    t_open = time.perf_counter()
    if args.loader == "ffload":
        import ffload

        loader = ffload.Loader(
            args.data,
            batch_size=args.batch_size,
            num_workers=args.num_workers,
            order=args.order,
            os_cache=args.os_cache,
            cache_limit=args.cache_limit_gb and int(args.cache_limit_gb * 2**30),
        )
        expected = loader.epoch_order(0)
    else:
        from ffcv.fields.decoders import IntDecoder, SimpleRGBImageDecoder
        from ffcv.loader import Loader, OrderOption
        from ffcv.transforms import ToTensor

        loader = Loader(
            args.data,
            batch_size=args.batch_size,
            num_workers=args.num_workers,
            order=OrderOption[args.order.upper()],
            os_cache=args.os_cache,
            pipelines={"image": [SimpleRGBImageDecoder(), ToTensor()], "label": [IntDecoder(), ToTensor()]},
        )
        expected = None
    seen = 0
    stamps_ok = True
    visited = []
    start = None
    for k, (images, labels) in enumerate(loader):
        flat = images.reshape(images.shape[0], -1)[:, :8].numpy().copy().view(np.int64)[:, 0]
        labels = labels.reshape(-1).numpy()
        stamps_ok &= bool(np.array_equal(flat, labels))
        if expected is not None:
            stamps_ok &= bool(np.array_equal(labels, expected[k * args.batch_size : k * args.batch_size + len(labels)]))
        visited.append(labels.copy())
        if start is None:
            start, first = time.perf_counter(), time.perf_counter() - t_open
            continue
        seen += len(labels)
        if time.perf_counter() - start > args.seconds:
            break
    seconds = time.perf_counter() - start
    visited = np.concatenate(visited)
    stamps_ok &= len(np.unique(visited)) == len(visited)
    del loader
    return {
        "img_s": seen / seconds,
        "mib_s": seen * SAMPLE / MIB / seconds,
        "peak_rss_gib": peak_rss() / 2**30,
        "samples": int(len(visited)),
        "first_batch_s": first,
        "correct": bool(stamps_ok),
    }


def peak_rss() -> int:
    """This process's peak resident set, bytes: ``VmHWM`` of ``/proc/self/status``. Not
    ``ru_maxrss``: Linux carries a forked parent's high-water mark across ``exec`` into it, so a
    case spawned by a parent that had mapped the dataset would report the parent's peak."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise OSError("no VmHWM in /proc/self/status")


def spawn_case(script_args, loader, order, os_cache, data=None) -> dict:
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "--case",
        loader,
        order,
        str(int(os_cache)),
        "--data",
        data or script_args.data,
        "--batch-size",
        str(script_args.batch_size),
        "--num-workers",
        str(script_args.num_workers),
        "--seconds",
        str(script_args.seconds),
    ]
    if script_args.cache_limit_gb:
        cmd += ["--cache-limit-gb", str(script_args.cache_limit_gb)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=script_args.seconds * 4 + 600)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode != 0 or not lines:
        tail = (out.stderr or out.stdout).strip().splitlines()[-1:] or ["no output"]
        return {"error": f"exit {out.returncode}: {tail[0][:160]}"}
    return json.loads(lines[-1])


# ------------------------------------------------------------ worker scaling
SCALING_CASES = {"raw": ("simple", 256), "rrc": ("rrc", 128), "wait": ("wait", 256)}
"""Case -> (``ffload bench`` pipeline, batch size)."""


def wait_stage(us: float):
    """``--cases wait``: a stage that sleeps ``us`` microseconds per row and changes nothing. A
    sleeping worker holds no GIL and no core, so on a machine with fewer cores than workers it
    stands for a worker with a core of its own: what is measured is how the loader schedules
    jobs (epoch ends, job sizes, the serial work per batch), not this machine's cores. A
    public ``ffload.loaders.Operation`` (rowwise, in place), so that a ``--baseline`` checkout
    runs it too."""
    from ffload.loaders import Operation

    class Wait(Operation):
        keeps_geometry = True
        rowwise = True

        def declare(self, spec, field, view):
            return spec

        def buffer_spec(self, spec_out, batch_size):
            return None

        def __call__(self, src, dst, ctx):
            time.sleep(len(ctx.indices) * us * 1e-6)
            return src

    return Wait()


def build_scaling_data(folder: str, raw_samples: int, jpeg_samples: int) -> dict:
    """The two datasets of ``--scaling`` in ``folder`` (reused when present): ``{'raw': path, 'rrc': path}``."""
    from ffload.bench.datasets import write_random_raw

    os.makedirs(folder, exist_ok=True)
    paths = {
        "raw": os.path.join(folder, f"raw32_{raw_samples}.beton"),
        "rrc": os.path.join(folder, f"photos_{jpeg_samples}.beton"),
    }
    if not os.path.exists(paths["raw"]):
        write_random_raw(paths["raw"], raw_samples)  # atomic: complete or absent
    if not os.path.exists(paths["rrc"]):
        from ffload.bench.datasets import build_photo_jpegs
        from ffload.convert import convert_dataset
        from ffload.convert.sources import ImageFolderSource

        photos = os.path.join(folder, f"photos_{jpeg_samples}")
        shutil.rmtree(photos, ignore_errors=True)
        build_photo_jpegs(photos, jpeg_samples)
        convert_dataset(ImageFolderSource(photos), paths["rrc"], write_mode="jpg", progress=False)
        shutil.rmtree(photos)
    return paths


def scaling_case(args) -> dict:
    """In a fresh process: one case at every worker count, then its serial fraction. Uses only the
    public ``Loader`` and ``ffload.loaders`` (so that ``--baseline`` may be an older checkout); the
    serial fraction where the checkout has :mod:`ffload.bench.serial`."""
    import torch  # noqa: F401  (kept out of the timing)

    import ffload
    import ffload.formats
    from ffload.loaders import (
        IntDecoder,
        RandomHorizontalFlip,
        RandomResizedCropRGBImageDecoder,
        SimpleRGBImageDecoder,
        ToTensor,
        ToTorchImage,
    )

    pipeline, batch_size = SCALING_CASES[args.case_name]
    if pipeline == "wait":  # its workers need no core: the loader must not cap them at the usable CPUs
        import ffload.loaders.loader

        ffload.loaders.loader.available_cpus = lambda: max(args.worker_list)
    n = ffload.formats.open_dataset(args.data).num_samples
    if args.epoch_samples:  # an epoch as long as a user's (samples repeated or cut)
        indices = np.resize(np.arange(n), args.epoch_samples)
    else:
        # an epoch of at least 40 batches per worker of the largest count (samples repeated): epoch
        # boundaries, where the workers drain, must not be what limits 16 workers on a small dataset
        indices = np.tile(np.arange(n), -(-40 * max(args.worker_list) * batch_size // n))
    serial_indices = np.resize(np.arange(n), args.serial_epoch_samples) if args.serial_epoch_samples else indices

    def build(workers, batches_per_job="auto", indices=indices):
        decoder = RandomResizedCropRGBImageDecoder((224, 224)) if pipeline == "rrc" else SimpleRGBImageDecoder()
        image = [decoder, RandomHorizontalFlip(), ToTensor(), ToTorchImage()]
        if pipeline == "wait":
            image.insert(2, wait_stage(args.wait_us))
        pipes = {"image": image, "label": [IntDecoder(), ToTensor()]}
        return ffload.Loader(
            args.data,
            batch_size=batch_size,
            num_workers=workers,
            order="quasi_random" if args.quasi_random else "random",
            pipelines=pipes,
            indices=indices,
            batches_per_job=batches_per_job,
            os_cache=not args.process_cache,
            **({"cache_limit": args.cache_limit} if args.cache_limit else {}),
        )

    def rate(workers):
        """img/s, and the median wall ms of ``iter(loader)`` at the epochs after the first (an
        epoch start, during which no worker has a job)."""
        with build(workers) as loader:
            memories.add(type(getattr(loader, "memory", None)).__name__)
            it = iter(loader)
            next(it)  # compilation, buffers, page faults
            images, starts, t0 = 0, [], time.perf_counter()
            while time.perf_counter() - t0 < args.seconds:
                try:
                    images += len(next(it)[0])
                except StopIteration:
                    t = time.perf_counter()
                    it = iter(loader)
                    starts.append(time.perf_counter() - t)
            return images / (time.perf_counter() - t0), float(np.median(starts)) * 1e3 if starts else None

    memories: set[str] = set()  # the memory manager each loader read through
    measured = {w: rate(w) for w in args.worker_list}
    rates = {w: r for w, (r, _) in measured.items()}
    starts = {w: ms for w, (_, ms) in measured.items()}
    batches = args.serial_batches if pipeline == "simple" else max(10, args.serial_batches // 8)  # JPEG: ~0.1 s each
    serial = timed = sampled = traced = None
    if args.serial_batches:
        measure = serial_measures()
        jobs = functools.partial(build, batches_per_job=args.serial_jobs or "auto", indices=serial_indices)
        try:
            serial = measure.serial_fraction(jobs, batches)
        except measure.UnavailableError as e:  # Python 3.12+: no cProfile per thread
            serial = {"error": str(e)}
        timed = measure.kernel_timed_fraction(jobs, batches)
        if measure.py_spy_path() is not None:
            try:
                sampled = measure.gil_sampled_fraction(jobs, args.gil_seconds)
            except OSError as e:  # no ptrace here, say: the round's rates stand
                sampled = {"error": str(e)}
        try:
            traced = measure.gil_traced_fraction(jobs, args.gil_seconds)
        except (measure.UnavailableError, OSError) as e:  # not root, no uprobes, a stripped build, lost events
            traced = {"error": str(e)}
    cold = None
    if args.cold_cache and pipeline == "simple":
        try:
            cold = serial_measures().job_python_after_traffic(build)
        except (AttributeError, TypeError):  # another checkout's loader
            pass
    return {
        "rates": rates,
        "epoch_start_ms": starts,
        "serial": serial,
        "timed": timed,
        "sampled": sampled,
        "traced": traced,
        "cold_cache": cold,
        "ffload": os.path.dirname(ffload.__file__),
        "memory": ", ".join(sorted(memories)),
    }


def serial_measures():
    """:mod:`ffload.bench.serial` of this script's checkout, not of the tree under test, so that
    both trees of a ``--baseline`` run are measured by the same code (it uses only the public
    ``Loader``, the loader's thread names and numba's dispatchers)."""
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "ffload", "bench", "serial.py")
    spec = importlib.util.spec_from_file_location("_bench_scale_serial", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def spawn_scaling(args, case: str, data: str, pythonpath: str) -> dict:
    cmd = (
        [
            sys.executable,
            os.path.abspath(__file__),
            "--scaling-case",
            case,
            "--data",
            data,
            "--workers",
            ",".join(map(str, args.worker_list)),
            "--seconds",
            str(args.seconds),
            "--serial-batches",
            str(args.serial_batches),
            "--wait-us",
            str(args.wait_us),
            "--epoch-samples",
            str(args.epoch_samples or 0),
            "--gil-seconds",
            str(args.gil_seconds),
            "--serial-jobs",
            str(args.serial_jobs or 0),
            "--serial-epoch-samples",
            str(args.serial_epoch_samples or 0),
        ]
        + (["--cold-cache"] if args.cold_cache else [])
        + (["--process-cache"] if args.process_cache else [])
        + (["--quasi-random"] if args.quasi_random else [])
        + (["--cache-limit", str(args.cache_limit)] if args.cache_limit else [])
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [pythonpath, os.environ.get("PYTHONPATH")]))}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode != 0 or not lines:
        tail = (out.stderr or out.stdout).strip().splitlines()[-1:] or ["no output"]
        return {"error": f"exit {out.returncode}: {tail[0][:300]}"}
    return json.loads(lines[-1])


def projection(fraction: float) -> tuple[str, dict[str, float]]:
    """Amdahl's speed-up of a serial ``fraction`` at 16 and 32 workers: the report's line, and
    ``{workers: speed-up}`` for the JSON."""
    from ffload.bench.doctor.verdict import amdahl

    speedups = {n: amdahl(fraction, n) for n in (16, 32)}
    line = "Amdahl: " + ", ".join(f"{n} workers {v:.1f}x ({v / n:.2f} of linear)" for n, v in speedups.items())
    return line, {str(n): v for n, v in speedups.items()}


def median_round(measures: list[dict]) -> dict:
    """The round of median ``serial_fraction`` (of an even count, the upper middle one): the one
    whose details are printed beside the median."""
    return sorted(measures, key=lambda m: m["serial_fraction"])[len(measures) // 2]


def measured_rounds(runs: list[dict], key: str) -> tuple[list[dict], list[str]]:
    """One serial measure (``key``: ``serial``, ``timed``, ``sampled`` or ``traced``) across a tree's rounds:
    the rounds' results that give a fraction, and the errors of those where it failed."""
    measures = [r.get(key) or {} for r in runs]
    return [m for m in measures if m.get("serial_fraction") is not None], [m["error"] for m in measures if "error" in m]


def summarize_measure(measures: list[dict]) -> tuple[float, dict, str, dict[str, float]]:
    """The median fraction of a measure's rounds, the round printed beside it (:func:`median_round`),
    and its Amdahl projection (:func:`projection`): ``(fraction, round, line, {workers: speed-up})``."""
    fraction = float(np.median([m["serial_fraction"] for m in measures]))
    return (fraction, median_round(measures), *projection(fraction))


def measure_lines(measures: list[dict], key: str, head, per_kind) -> tuple[list[str], dict[str, object]]:
    """The report of one unprofiled serial measure across a tree's rounds (:func:`summarize_measure`):
    its line, ``head(fraction, round)`` then ``per_kind(kind, values)`` for each thread kind of the
    printed round, joined by commas, and its Amdahl line; and the JSON entries ``{key}_fraction``
    and ``{key}_amdahl``."""
    fraction, x, amdahl_line, amdahl = summarize_measure(measures)
    line = head(fraction, x) + ", ".join(per_kind(kind, v) for kind, v in x["per_batch_us"].items())
    return [line, amdahl_line], {f"{key}_fraction": fraction, f"{key}_amdahl": amdahl}


def scaling_report(results: dict, note: str) -> tuple[str, dict]:
    """Markdown and JSON of ``--scaling``: per case and tree, the median img/s per worker count,
    speed-up over one worker, the serial fraction and Amdahl's projection."""

    lines, data = [f"# bench_scale --scaling: {note}", ""], {"note": note, "cases": {}}
    for case, trees in results.items():
        data["cases"][case] = {}
        for tree, runs in trees.items():
            ok = [r for r in runs if "rates" in r]
            if not ok:
                lines += [f"## {case} ({tree}): failed: {runs[0].get('error')}", ""]
                continue
            workers = sorted({int(w) for r in ok for w in r["rates"]})
            median = {w: float(np.median([r["rates"][str(w)] or 0 for r in ok])) for w in workers}
            serials, unprofiled = measured_rounds(ok, "serial")
            timed, _ = measured_rounds(ok, "timed")
            sampled, failed = measured_rounds(ok, "sampled")
            traced, untraced = measured_rounds(ok, "traced")
            starts = {
                w: [r["epoch_start_ms"][str(w)] for r in ok if (r.get("epoch_start_ms") or {}).get(str(w)) is not None]
                for w in workers
            }
            start_ms = {w: float(np.median(v)) if v else None for w, v in starts.items()}
            base = median[workers[0]] / workers[0] if workers and median[workers[0]] else None
            lines += [
                f"## {case} ({tree}, {len(ok)} round(s))",
                "",
                "| workers | img/s | vs 1 worker x n | `iter()` ms |",
                "|---|---|---|---|",
            ]
            for w in workers:
                linear = f"{median[w] / (base * w):.2f}" if base else "-"
                start = f"{start_ms[w]:.2f}" if start_ms[w] is not None else "-"
                lines.append(f"| {w} | {median[w]:.0f} | {linear} | {start} |")
            entry = {"img_s": median, "epoch_start_ms": start_ms, "runs": ok}
            if serials:
                s, x, amdahl_line, amdahl = summarize_measure(serials)
                lines += [
                    "",
                    f"serial fraction {s:.3f} (upper bound {x['serial_fraction_upper']:.3f}): per batch "
                    f"{x['held_corrected_us']:.0f} us CPU holding the GIL, {x['nogil_us']:.0f} us without it; "
                    f"workers' lock wait {x['worker_lock_wait_us']:.1f} us; dispatch {x['dispatch_us']:.0f} us; "
                    f"profiler overhead removed {x['profiler_overhead_us']:.0f} us",
                    amdahl_line,
                    "largest GIL holders (us per batch, profiled): "
                    + "; ".join(f"{label} {us:.1f}" for label, us in x["top_held"][:6]),
                ]
                entry.update(serial_fraction=s, amdahl=amdahl)
            elif unprofiled:
                lines += ["", f"profiled serial fraction not measured: {unprofiled[0]}"]
            if timed:
                report, found = measure_lines(
                    timed,
                    "kernel_timed",
                    lambda t, x: (
                        f"kernel-timed serial fraction {t:.3f} (no profiler: threads' CPU clocks against timed "
                        f"kernel calls): per batch {x['held_us']:.0f} us CPU outside the nogil kernels, "
                        f"{x['nogil_us']:.0f} us inside; "
                    ),
                    lambda kind, v: f"{kind} {v['cpu']:.0f} us CPU ({v['kernel']:.0f} in kernels)",
                )
                lines += report
                entry.update(found)
            if failed:
                lines.append(f"GIL sampling failed in {len(failed)} round(s): {failed[0][:300]}")
            if sampled:
                report, found = measure_lines(
                    sampled,
                    "gil_sampled",
                    lambda g, x: (
                        f"GIL-sampled serial fraction {g:.3f} (py-spy --gil, {x['rate']} Hz for {x['seconds']} s, "
                        f"+-{100 * (x['relative_error'] or 1):.0f} %): per batch {x['held_us']:.1f} us holding the "
                        f"GIL of {x['cpu_us']:.0f} us CPU; "
                    ),
                    lambda kind, v: f"{kind} {v['held']:.1f} of {v['cpu']:.0f} us",
                )
                lines += report
                entry.update(found)
            if traced:
                report, found = measure_lines(
                    traced,
                    "gil_traced",
                    lambda g, x: (
                        f"GIL-traced serial fraction {g:.3f} (every hold, uprobes on take_gil/drop_gil, "
                        f"{x['seconds']} s; {x['probe_us']:.2f} us probe cost per hold removed): per batch "
                        f"{x['held_us']:.1f} us holding the GIL in {x['holds']:.1f} holds, of {x['cpu_us']:.0f} us CPU; "
                    ),
                    lambda kind, v: f"{kind} {v['held']:.2f} us in {v['holds']:.2f} holds of {v['cpu']:.0f} us",
                )
                lines += report
                entry.update(found)
            elif untraced:
                lines.append(f"GIL not traced: {untraced[0][:300]}")
            colds = [r["cold_cache"] for r in ok if r.get("cold_cache")]
            if colds:
                mib = list(colds[0])
                cold = {m: float(np.median([c[m] for c in colds])) for m in mib}
                lines += [
                    "a 1-sample job's Python (median us) right after this many MiB copied: "
                    + ", ".join(f"{m} MiB {us:.1f}" for m, us in cold.items())
                ]
                entry.update(job_python_after_traffic_us=cold)
            lines.append("")
            data["cases"][case][tree] = entry
        if len(trees) == 2 and all(t in data["cases"][case] for t in trees):
            a, b = (data["cases"][case][t]["img_s"] for t in trees)
            names = list(trees)
            lines += [
                f"{names[1]} / {names[0]}: "
                + ", ".join(f"{w} workers {b[w] / a[w]:.2f}x" for w in a if a[w] and w in b),
                "",
            ]
    return "\n".join(lines), data


def _fraction(measure: dict | None) -> float | None:
    """A round's serial fraction, rounded, or None where that measure did not run or failed."""
    value = (measure or {}).get("serial_fraction")
    return None if value is None else round(value, 3)


def run_scaling(args) -> None:
    from ffload.system import available_cpus

    cpus = available_cpus()
    if any(case != "wait" for case in args.cases.split(",")):  # wait's workers need no core of their own
        args.worker_list = [w for w in args.worker_list if w <= cpus] or [1]
    t0 = time.perf_counter()
    paths = build_scaling_data(os.path.join(args.dir, "ffload_bench_scale"), args.raw_samples, args.jpeg_samples)
    paths["wait"] = paths["raw"]
    print(f"data ready in {time.perf_counter() - t0:.0f} s: {paths}", flush=True)
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    trees = {"current": here}
    if args.baseline:
        trees = {"baseline": os.path.abspath(args.baseline), "current": here}
    results = {}
    for case in args.cases.split(","):
        for round_ in range(args.rounds):
            order = list(trees.items())
            for name, tree in order[::-1] if round_ % 2 else order:
                r = spawn_scaling(args, case, paths[case], tree)
                results.setdefault(case, {}).setdefault(name, []).append(r)
                summary = r.get("error") or {w: round(v or 0) for w, v in r["rates"].items()}
                sf, gs, gt = (_fraction(r.get(k)) for k in ("serial", "sampled", "traced"))
                print(
                    f"{case} {name} round {round_ + 1}: {summary} serial {sf}, GIL-sampled {gs}, GIL-traced {gt}",
                    flush=True,
                )
    memory = f"os_cache={not args.process_cache}"
    if args.cache_limit:
        memory += f", cache_limit {args.cache_limit}"
    if args.quasi_random:
        memory += ", QUASI_RANDOM order"
    trees: dict[str, set] = {}  # tree -> the memory managers its loaders read through
    for runs in results.values():
        for name, rs in runs.items():
            trees.setdefault(name, set()).update(r["memory"] for r in rs if r.get("memory"))
    memory += "; read through " + ", ".join(f"{name}: {' + '.join(sorted(m)) or '?'}" for name, m in trees.items())
    note = (
        f"{cpus} usable CPUs, workers {args.worker_list}, {args.seconds:g} s per count, raw {args.raw_samples} / "
        f"JPEG {args.jpeg_samples} samples, epochs of {args.epoch_samples or '40 batches per worker of'} samples, "
        f"wait {args.wait_us:g} us per row, serial measures with {args.serial_jobs or 'auto'} batches per job "
        f"in epochs of {args.serial_epoch_samples or 'those'} samples, "
        f"{memory}, "
        f"page cache warm, {args.rounds} round(s), {time.perf_counter() - t0:.0f} s"
    )
    text, data = scaling_report(results, note)
    from ffload.bench import write_results

    write_results(args.out, text, data)
    print(text)


# ------------------------------------------------------------------- report
def ratio(a, b):
    return f"{a / b:.2f}x" if a and b else "-"


def median_run(runs: list[dict]) -> dict:
    """The run of median MiB/s among a case's ``runs`` (of an even count, the lower middle one),
    with every run's MiB/s under ``mib_s_runs`` (0 for a failed run); the first run when every
    run failed."""
    ok = sorted((r for r in runs if "mib_s" in r), key=lambda r: r["mib_s"])
    if not ok:
        return runs[0]
    return {**ok[(len(ok) - 1) // 2], "mib_s_runs": [r.get("mib_s", 0.0) for r in runs]}


def paired_ratio(r: dict, peer: dict) -> str:
    """The median over rounds of ``r``'s MiB/s over ``peer``'s in the same round; the plain ratio
    of the two rows without rounds."""
    a, b = r.get("mib_s_runs", [r.get("mib_s")]), peer.get("mib_s_runs", [peer.get("mib_s")])
    pairs = [x / y for x, y in zip(a, b) if x and y]
    return f"{np.median(pairs):.2f}x" if pairs and len(a) == len(b) else "-"


def report(results, disk, note, out_dir) -> str:
    lines = [f"# bench_scale: {note}", "", "| disk (O_DIRECT) and probes | MiB/s |", "|---|---|"]
    lines += [f"| {k} | {v:.0f} |" for k, v in disk.items()]
    lines += [
        "",
        "(vs ffcv: ffload-lmdb rows are against ffload on the .beton)",
        "",
        "| loader | order | os_cache | img/s | MiB/s | peak RSS GiB | vs ffcv | vs disk "
        "| first batch s | samples | correct |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (loader, order, os_cache), r in results.items():
        if "error" in r:
            lines.append(f"| {loader} | {order} | {os_cache} | {r['error']} |")
            continue
        peer = results.get(("ffcv", order, os_cache), {})
        if loader == "ffload-lmdb":  # LMDB against the same loader on the .beton
            peer = results.get(("ffload", order, os_cache), {})
        limit = disk.get("random x16") if order == "random" else disk.get("sequential")
        lines.append(
            f"| {loader} | {order} | {os_cache} | {r['img_s']:.0f} | {r['mib_s']:.0f} "
            f"| {r['peak_rss_gib']:.2f} | {paired_ratio(r, peer) if loader != 'ffcv' else '-'} "
            f"| {ratio(r['mib_s'], limit)} | {r['first_batch_s']:.1f} | {r['samples']} "
            f"| {r['correct']} |"
        )
    text = "\n".join(lines) + "\n"
    from ffload.bench import write_results

    write_results(
        out_dir,
        text,
        {
            "note": note,
            "disk": disk,
            "cases": [{"loader": k[0], "order": k[1], "os_cache": k[2], **v} for k, v in results.items()],
        },
    )
    plot(results, disk, os.path.join(out_dir, "throughput.png"))
    return text


def plot(results, disk, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [k for k, v in results.items() if "mib_s" in v]
    fig, ax = plt.subplots(figsize=(10, 4.5))
    labels = [f"{k[0]}\n{k[1]}\nos_cache={k[2]}" for k in keys]
    ax.bar(
        range(len(keys)),
        [results[k]["mib_s"] for k in keys],
        color=["tab:blue" if k[0] == "ffload" else "tab:orange" for k in keys],
    )
    for name, style in (("random x16", "--"), ("sequential", ":")):
        if name in disk:
            ax.axhline(disk[name], linestyle=style, color="k", label=f"disk {name}")
    ax.set_xticks(range(len(keys)), labels, fontsize=7)
    ax.set_ylabel("MiB/s (cold cache)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", help="an existing stamped .beton to use (kept)")
    parser.add_argument("--dir", default=tempfile.gettempdir(), help="where to build the dataset")
    parser.add_argument("--size-gb", type=float, default=None, help="dataset size in GiB (default: 1.25x RAM)")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--num-workers", type=int, default=os.cpu_count())
    parser.add_argument("--seconds", type=float, default=60.0, help="time limit per case")
    parser.add_argument("--disk-seconds", type=float, default=4.0)
    parser.add_argument("--loaders", default="ffload,ffcv")
    parser.add_argument("--orders", default="random,quasi_random")
    parser.add_argument("--os-cache", default="true,false", help="os_cache values to run")
    parser.add_argument(
        "--cache-limit-gb",
        type=float,
        default=None,
        help="ffload's cache_limit with os_cache=False (default: the loader's)",
    )
    parser.add_argument("--readahead-probe", action="store_true")
    parser.add_argument(
        "--cache-probe", action="store_true", help="time ffload's os_cache=False cache alone: page pool vs block cache"
    )
    parser.add_argument("--keep", action="store_true", help="keep the dataset built here")
    parser.add_argument(
        "--lmdb",
        action="store_true",
        help="also run ffload on an LMDB copy (built next to the .beton, kept as the .beton is)",
    )
    parser.add_argument(
        "--warm",
        action="store_true",
        help="keep the page cache: the files (which must fit in RAM) are read once before the "
        "cases instead of dropped before each: the loaders' CPU side alone",
    )
    parser.add_argument("--rounds", type=int, default=1, help="runs per case, interleaved; medians reported")
    parser.add_argument("--out", default="runs/bench_scale")
    parser.add_argument("--case", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--scaling", action="store_true", help="worker scaling and serial fraction (see above)")
    parser.add_argument("--quick", action="store_true", help="--scaling: small data, 1 s per count (<= 90 s)")
    parser.add_argument("--workers", default="1,2,4,8,12,16", help="--scaling: worker counts (<= usable CPUs)")
    parser.add_argument("--cases", default="raw,rrc", help="--scaling: raw, rrc, wait")
    parser.add_argument("--wait-us", type=float, default=40.0, help="--scaling, case wait: sleep per row (us)")
    parser.add_argument(
        "--epoch-samples",
        type=int,
        default=None,
        help="--scaling: samples per epoch (default: 40 batches per worker of the largest count)",
    )
    parser.add_argument("--raw-samples", type=int, default=None, help="--scaling: default 50000 (--quick 20000)")
    parser.add_argument("--jpeg-samples", type=int, default=None, help="--scaling: default 1024 (--quick 256)")
    parser.add_argument("--serial-batches", type=int, default=None, help="--scaling: default 400 (--quick 150)")
    parser.add_argument(
        "--gil-seconds",
        type=int,
        default=4,
        help="--scaling: seconds of py-spy --gil sampling (where py-spy is installed)",
    )
    parser.add_argument(
        "--serial-jobs",
        type=int,
        default=0,
        help="--scaling: batches per job in the serial measures (default: the loader's choice for one worker)",
    )
    parser.add_argument(
        "--serial-epoch-samples",
        type=int,
        default=0,
        help="--scaling: samples per epoch in the serial measures (default: the scaling curve's epochs)",
    )
    parser.add_argument(
        "--cold-cache",
        action="store_true",
        help="--scaling, raw: also a 1-sample job's Python after 0-64 MiB copied (this checkout's loader only)",
    )
    parser.add_argument(
        "--process-cache",
        action="store_true",
        help="--scaling: the loaders read through the process cache (os_cache=False), not the mapped file",
    )
    parser.add_argument(
        "--quasi-random",
        action="store_true",
        help="--scaling: the loaders read in QUASI_RANDOM order (with --process-cache: the page pool)",
    )
    parser.add_argument(
        "--cache-limit",
        type=int,
        default=0,
        help="--scaling --process-cache: the loaders' cache_limit, bytes (below the data's size: blocks are "
        "evicted and read again every epoch, from the page cache)",
    )
    parser.add_argument("--baseline", default=None, help="--scaling: another checkout to compare, same run")
    parser.add_argument("--scaling-case", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.scaling or args.scaling_case:
        args.worker_list = [int(w) for w in args.workers.split(",") if w.strip()]
        args.raw_samples = args.raw_samples or (20000 if args.quick else 50000)
        args.jpeg_samples = args.jpeg_samples or (256 if args.quick else 1024)
        args.serial_batches = args.serial_batches if args.serial_batches is not None else (150 if args.quick else 400)
        if args.quick and args.seconds == 60.0:
            args.seconds = 1.0
        elif args.seconds == 60.0:
            args.seconds = 3.0
        if args.scaling_case:
            args.case_name = args.scaling_case
            print(json.dumps(scaling_case(args)), flush=True)
        else:
            if args.out == "runs/bench_scale":
                args.out = "runs/bench_scale_scaling"
            run_scaling(args)
        return

    if args.case:
        args.loader, args.order, args.os_cache = args.case[0], args.case[1], args.case[2] == "1"
        print(json.dumps(run_case(args)), flush=True)
        return

    os.makedirs(args.out, exist_ok=True)
    ram = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    built = None
    if args.data is None:
        size = int((args.size_gb or 1.25 * ram / 2**30) * 2**30)
        built = args.data = os.path.join(args.dir, f"bench_scale_{size >> 20}MiB.beton")
        t0 = time.perf_counter()
        n = build_dataset(built, size)
        print(
            f"built {built}: {n} samples, {os.path.getsize(built) / 2**30:.1f} GiB in {time.perf_counter() - t0:.0f} s",
            flush=True,
        )
    lmdb_built = None
    if args.lmdb:
        args.lmdb = os.path.splitext(args.data)[0] + ".lmdb"
        if not os.path.exists(args.lmdb):
            t0 = time.perf_counter()
            from ffload.formats import open_dataset

            n = build_dataset(args.lmdb, open_dataset(args.data).num_samples * SAMPLE)
            lmdb_built = args.lmdb if built is not None and not args.keep else None
            print(f"built {args.lmdb}: {n} samples in {time.perf_counter() - t0:.0f} s", flush=True)
    try:
        from ffload.formats import open_dataset

        view = open_dataset(args.data)
        ptrs = view.ptrs["image"].astype(np.int64)
        note = (
            f"{view.num_samples} samples, {os.path.getsize(args.data) / 2**30:.1f} GiB "
            f"(RAM {ram / 2**30:.1f} GiB), batch {args.batch_size}, {args.num_workers} workers, "
            f"{os.cpu_count()} CPUs, <= {args.seconds:.0f} s per case"
        )
        print(note, flush=True)
        disk = {}
        for depth in (1, 4, 16):
            drop_caches(args.data)
            disk[f"random x{depth}"] = disk_rate(args.data, view.data_size, SAMPLE, depth, args.disk_seconds)
        disk["sequential"] = disk_rate(args.data, view.data_size, 8 * MIB, 1, args.disk_seconds, sequential=True)
        print("disk:", {k: round(v) for k, v in disk.items()}, flush=True)
        if args.readahead_probe:
            for mechanism in ("none", "fadvise", "madvise", "preadv16"):
                print(drop_caches(args.data))
                rate = readahead_probe(args.data, ptrs, mechanism, min(2000, len(ptrs)))
                disk[f"mmap after {mechanism}"] = rate
                print(f"read-ahead probe {mechanism}: {rate:.0f} MiB/s", flush=True)
        if args.cache_probe:
            limit = int((args.cache_limit_gb or 4) * 2**30)
            for round_, kind in enumerate(("blocks", "pool") * 2):
                print(drop_caches(args.data))
                rate = cache_probe(args.data, kind, limit, args.batch_size, args.num_workers, args.seconds)
                disk[f"cache path {kind} #{round_ // 2 + 1}"] = rate
                print(f"cache probe {kind}: {rate:.0f} MiB/s", flush=True)
        runs = {}
        if args.warm:
            for path in [args.data] + ([os.path.join(args.lmdb, "data.mdb")] if args.lmdb else []):
                with open(path, "rb") as f:
                    while f.read(8 * MIB):
                        pass
            note += ", warm page cache (--warm)"
        loaders = args.loaders.split(",") + (["ffload-lmdb"] if args.lmdb else [])
        for order in args.orders.split(","):
            for os_cache in [v.strip().lower() == "true" for v in args.os_cache.split(",")]:
                for round_ in range(args.rounds):
                    for loader in loaders[::-1] if round_ % 2 else loaders:
                        how = "warm" if args.warm else drop_caches(args.data)
                        if loader == "ffload-lmdb":
                            r = spawn_case(args, "ffload", order, os_cache, data=args.lmdb)
                        else:
                            r = spawn_case(args, loader, order, os_cache)
                        runs.setdefault((loader, order, os_cache), []).append(r)
                        print(
                            f"{loader:6s} {order:12s} os_cache={os_cache!s:5s} round {round_ + 1} {how} -> {r}",
                            flush=True,
                        )
        results = {key: median_run(rs) for key, rs in runs.items()}
        if args.rounds > 1:
            note += f", median of {args.rounds} interleaved rounds"
        print(report(results, disk, note, args.out))
    finally:
        if lmdb_built is not None:
            shutil.rmtree(lmdb_built)
        if built is not None and not args.keep:
            os.remove(built)
            print(f"deleted {built}")
        elif built is not None:
            print(f"kept {built}")


if __name__ == "__main__":
    main()
