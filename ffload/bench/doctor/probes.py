"""The machine's limits on one dataset, measured here: the disk's random and sequential read rates on
the data file, the payload decode rate of one core, the memory bandwidth of a batch-sized copy, and
the loader itself at a few worker counts.

Every probe runs in this process for a bounded time and returns plain numbers (no ffload import at
module level: the CLI's ``--help`` stays light).
"""

from __future__ import annotations

import mmap
import os
import threading
import time

import numpy as np

MIB = 1 << 20
ALIGN = 4096
"""``O_DIRECT`` reads need offsets, sizes and buffers aligned to the device's logical block; 4 KiB
covers every common one."""


def data_file(view) -> str:
    """The local file that holds ``view``'s payloads: the ``.beton``, LMDB's ``data.mdb``, or a sharded
    dataset's first shard.

    Raises:
        ffload.errors.ConfigurationError: a dataset on object storage (the doctor measures a local disk).
    """
    from ffload.errors import ConfigurationError

    if view.remote is not None:
        raise ConfigurationError(f"{view.path}: the doctor measures local datasets; this one is on object storage")
    if view.shards is not None:
        return view.shards.paths[0]
    return view.data_path


def drop_page_cache(path: str) -> tuple[bool, str]:
    """Evict ``path``'s clean pages from the page cache (``fdatasync`` then
    ``posix_fadvise(POSIX_FADV_DONTNEED)``, which needs no privilege). Returns ``(done, how)``;
    ``done`` is False (and ``how`` says why) where the call is refused or unavailable."""
    if not hasattr(os, "posix_fadvise"):
        return False, "posix_fadvise is not available here: the page cache was kept (rates may be the cache's)"
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    except OSError as e:
        return False, f"posix_fadvise(DONTNEED) refused ({e.strerror}): the page cache was kept"
    finally:
        os.close(fd)
    return True, "posix_fadvise(DONTNEED) on the file"


def _open_direct(path: str) -> tuple[int, bool]:
    """``(fd, direct)``: the file opened with ``O_DIRECT`` where the file system allows it, else plainly."""
    flag = getattr(os, "O_DIRECT", 0)
    if flag:
        try:
            return os.open(path, os.O_RDONLY | flag), True
        except OSError:
            pass
    return os.open(path, os.O_RDONLY), False


def disk_rates(path: str, read_bytes: int, seconds: float = 1.0, in_flight: int = 8) -> dict:
    """The disk's read rates on ``path``, page cache dropped first (:func:`drop_page_cache`).

    Random: ``in_flight`` threads each reading ``read_bytes`` (rounded up to :data:`ALIGN`) at random
    aligned offsets for ``seconds``. Sequential: one thread reading 8 MiB blocks from the start for
    ``seconds`` (the cache is dropped again first). With ``O_DIRECT`` (when the file system allows it)
    every read reaches the device; without it a read of evicted pages does too, but the kernel's own
    read-ahead may serve neighbours (said in ``note``).

    Returns:
        ``{'random_mib_s', 'sequential_mib_s', 'read_bytes', 'in_flight', 'direct' (bool),
        'cache_dropped' (bool), 'note'}``.
    """
    size = os.path.getsize(path)
    read_bytes = max(ALIGN, -(-int(read_bytes) // ALIGN) * ALIGN)
    dropped, how = drop_page_cache(path)
    span = max(1, (size - read_bytes) // ALIGN)
    stop = time.perf_counter() + seconds
    done = [0] * in_flight
    direct_seen = []

    def reader(k: int) -> None:
        fd, direct = _open_direct(path)
        direct_seen.append(direct)
        buf = mmap.mmap(-1, read_bytes)  # page-aligned, as O_DIRECT needs
        rng = np.random.default_rng(k)
        try:
            while time.perf_counter() < stop:
                for off in rng.integers(0, span, 64) * ALIGN:
                    done[k] += os.preadv(fd, [buf], int(off))
        finally:
            os.close(fd)
            buf.close()

    t0 = time.perf_counter()
    threads = [threading.Thread(target=reader, args=(k,)) for k in range(in_flight)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    random_rate = sum(done) / MIB / (time.perf_counter() - t0)

    drop_page_cache(path)
    block = 8 * MIB
    fd, direct = _open_direct(path)
    buf = mmap.mmap(-1, block)
    read, off, t0 = 0, 0, time.perf_counter()
    try:
        while time.perf_counter() - t0 < seconds:
            n = os.preadv(fd, [buf], off)
            if n <= 0:
                if not direct:
                    break  # a second pass would read the page cache
                off = 0
                continue
            read, off = read + n, off + n
    finally:
        os.close(fd)
        buf.close()
    sequential_rate = read / MIB / max(time.perf_counter() - t0, 1e-9)
    direct = direct and all(direct_seen)
    note = how + ("; O_DIRECT reads" if direct else "; buffered reads (O_DIRECT refused by the file system)")
    return {
        "random_mib_s": random_rate,
        "sequential_mib_s": sequential_rate,
        "read_bytes": read_bytes,
        "in_flight": in_flight,
        "direct": direct,
        "cache_dropped": dropped,
        "note": note,
    }


def decode_rate(view, field: str, samples: int = 256, seconds: float = 1.0) -> dict:
    """One core's payload decode rate (images/s) on up to ``samples`` evenly spread samples of
    ``field``, copied into memory first: JPEG payloads decoded at full size by the bench's fastest
    decoder (:func:`ffload.bench.peers.ceiling.default_decoder`), raw payloads copied out (their
    decode), in this one thread, passes repeated for about ``seconds``.

    Returns:
        ``{'img_s_per_core', 'decoder', 'samples', 'jpeg_fraction', 'payload_mean_bytes'}``.

    Raises:
        ffload.errors.FormatError: a JPEG payload does not decode (names the sample).
    """
    from ffload.errors import FormatError
    from ffload.formats.fields.image import JPG

    from ..peers.ceiling import DECODERS, default_decoder

    n = view.num_samples
    picks = np.unique(np.linspace(0, n - 1, min(samples, n)).astype(np.int64))
    region = view.open_region()
    modes = view.metadata[field]["mode"][picks]
    payloads = [np.array(view.payload(field, int(i), region)) for i in picks]
    del region
    name = default_decoder()
    decode = DECODERS[name]()
    scratch = np.empty(max(p.size for p in payloads), np.uint8)
    jpeg = modes == JPG

    def one_pass() -> None:
        for i, payload in enumerate(payloads):
            if jpeg[i]:
                if decode(payload) is None:
                    raise FormatError(f"sample {int(picks[i])}: the JPEG payload does not decode", sample=int(picks[i]))
            else:
                scratch[: payload.size] = payload

    one_pass()  # warm-up: the decoder's handle, the caches
    images, t0 = 0, time.perf_counter()
    while True:
        one_pass()
        images += len(payloads)
        elapsed = time.perf_counter() - t0
        if elapsed >= seconds:
            break
    return {
        "img_s_per_core": images / elapsed,
        "decoder": name if jpeg.any() else "copy (raw payloads)",
        "samples": len(payloads),
        "jpeg_fraction": float(jpeg.mean()),
        "payload_mean_bytes": float(np.mean([p.size for p in payloads])),
    }


def memory_bandwidth(nbytes: int, seconds: float = 0.3) -> dict:
    """Bytes/s of one thread's ``np.copyto`` of an ``nbytes`` buffer (a batch's output) into another,
    repeated for about ``seconds`` (both buffers touched first).

    Returns ``{'bytes_s', 'buffer_bytes'}``."""
    nbytes = max(1, int(nbytes))
    src = np.ones(nbytes, np.uint8)
    dst = np.zeros(nbytes, np.uint8)
    np.copyto(dst, src)
    copies, t0 = 0, time.perf_counter()
    while True:
        np.copyto(dst, src)
        copies += 1
        elapsed = time.perf_counter() - t0
        if elapsed >= seconds:
            break
    return {"bytes_s": copies * nbytes / elapsed, "buffer_bytes": nbytes}


def loader_rate(
    make_loader, num_workers: int, seconds: float, step_s: float | None = None, warm_slots: bool = False
) -> dict:
    """The loader's steady rate: ``make_loader(num_workers)`` built, its first batch taken (JIT and
    warm-up, timed apart), with ``warm_slots`` then as many batches as fill every job slot once
    (``slots`` times ``batches_per_job`` of ``loader.stats()``, at most an epoch: a slot's first
    job touches its buffers' pages for the first time, 134 MB for 170 raw 32x32 batches, which a
    short timed run would count against large jobs), then batches consumed for about ``seconds``
    (across epochs), each followed by ``time.sleep(step_s)`` when ``step_s`` is given (a
    consumer's step).

    Returns ``{'num_workers', 'img_s', 'batches', 'first_batch_s', 'wait_fraction'}``:
    ``wait_fraction`` is the share of the timed run the consumer spent waiting for batches."""
    t0 = time.perf_counter()
    loader = make_loader(num_workers)
    try:
        it = iter(loader)
        next(it)
        first = time.perf_counter() - t0
        if warm_slots:
            stats = loader.stats()
            for _ in range(min(stats["slots"] * stats["batches_per_job"], len(loader) - 1)):
                next(it)
        images = batches = 0
        waited = 0.0
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            w0 = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                it = iter(loader)
                continue
            waited += time.perf_counter() - w0
            images += len(batch[0])
            batches += 1
            if step_s:
                time.sleep(step_s)
        elapsed = time.perf_counter() - start
    finally:
        loader.close()
    return {
        "num_workers": num_workers,
        "img_s": images / elapsed if images else None,
        "batches": batches,
        "first_batch_s": first,
        "wait_fraction": waited / elapsed if elapsed else None,
    }
