"""The bounded process cache (``os_cache=False``) and the deep read-ahead, on files several
times larger than the cache (issue 10, parts 1 and 2). No timing: the cache's own counters, the
kernel's resident-page count of its mapping, and the recorded ``posix_fadvise`` ranges."""

from __future__ import annotations

import ctypes
import mmap
import os
import sys
import threading
import time

import numpy as np
import pytest

import ffload
from ffload.errors import ConfigurationError
from ffload.formats import BytesField, NDArrayField, open_dataset, write_dataset
from ffload.loaders.memory.anonymous import MAP_NORESERVE
from ffload.loaders.memory.base import MemoryManager
from ffload.loaders.memory.os_cache import OSCacheMemory
from ffload.loaders.memory.pagepool import PagePoolMemory
from ffload.loaders.memory.process_cache import CACHE_BLOCK, ProcessCacheMemory, cache_block
from ffload.loaders.memory.readahead import (
    ADVISE_PAGE,
    ReadAhead,
    advise_runs,
    payloads_resident,
    sampled_resident,
    unit_runs,
)
from ffload.loaders.memory.schedule import (
    NEVER,
    EpochSchedule,
    batch_blocks,
    payload_columns,
    sort_unique,
    sorted_unique,
)
from ffload.loaders.orders import EpochBatches
from ffload.loaders.pagedsamples import PagedSamples

N, SAMPLE = 240, 30_000  # 7.2 MB of payloads, about 5x the cache limit below
LIMIT = 24 * CACHE_BLOCK  # 1.5 MiB: one batch of 8 samples needs at most 16 blocks


def stamped(i: int) -> np.ndarray:
    """Payload of sample ``i``: its index in the first 8 bytes, then bytes that depend on it."""
    out = np.full(SAMPLE, i % 251, np.uint8)
    out[:8] = np.frombuffer(np.int64(i).tobytes(), np.uint8)
    return out


@pytest.fixture(scope="module", params=["beton", "lmdb"])
def stamped_dataset(request, tmp_path_factory):
    """``blob`` (stamped BytesField) and ``other`` (an NDArrayField never decoded here)."""
    path = str(tmp_path_factory.mktemp("cache") / f"stamped.{request.param}")
    fields = {"blob": BytesField(), "other": NDArrayField(np.uint8, (5000,))}
    return write_dataset(
        path, fields, ((stamped(i), np.full(5000, 7, np.uint8)) for i in range(N)), N, page_size=1 << 21
    )


def loader(path, **kw):
    return ffload.Loader(path, batch_size=8, num_workers=3, pipelines={"other": None}, **kw)


def mapping_rss(region: np.ndarray) -> int:
    """Resident bytes of ``region`` (a page-aligned mapping), from ``mincore(2)``: exactly its own
    pages (``/proc/self/smaps`` would count a neighbouring mapping the kernel merged with it)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    pages = np.zeros(-(-region.nbytes // mmap.PAGESIZE), np.uint8)
    assert region.ctypes.data % mmap.PAGESIZE == 0
    if libc.mincore(region.ctypes.data, region.nbytes, pages.ctypes.data) != 0:
        raise OSError(ctypes.get_errno(), "mincore")
    return int(np.count_nonzero(pages & 1)) * mmap.PAGESIZE


@pytest.mark.parametrize("order", ["sequential", "random", "quasi_random"])
def test_process_cache_stays_under_its_limit_and_serves_the_right_samples(stamped_dataset, order):
    assert os.path.getsize(open_dataset(stamped_dataset).data_path) > 4 * LIMIT
    cached = loader(stamped_dataset, order=order, os_cache=False, cache_limit=LIMIT)
    mapped = loader(stamped_dataset, order=order, os_cache=True)
    memory = cached._memory
    for epoch in range(2):
        want = cached.epoch_order(epoch)
        got = [b[0].numpy().copy() for b in cached]
        ref = [b[0].numpy().copy() for b in mapped]
        rows = np.concatenate(got)
        np.testing.assert_array_equal(rows[:, :8].copy().view(np.int64)[:, 0], want)
        np.testing.assert_array_equal(rows, np.stack([stamped(int(i)) for i in want]))
        np.testing.assert_array_equal(rows, np.concatenate(ref))  # same bytes as os_cache=True
        assert 0 < memory.peak_resident_bytes <= LIMIT
        if sys.platform.startswith("linux"):
            assert mapping_rss(memory.region) <= LIMIT  # evicted blocks gave their memory back
    assert memory.bytes_read > 2 * LIMIT  # the epochs did cycle through more than the limit
    cached.close()
    mapped.close()


@pytest.mark.parametrize("suffix", ["beton", "lmdb"])
def test_quasi_random_reads_each_block_once_per_epoch(tmp_path, suffix):
    # 29 pages of 2 MiB; a quasi-random window spans 4 pages, the cache a little over 2 windows
    n, limit = 2000, 20 << 20
    path = write_dataset(
        str(tmp_path / f"many.{suffix}"),
        {"blob": BytesField()},
        ((stamped(i),) for i in range(n)),
        n,
        page_size=1 << 21,
    )
    cached = ffload.Loader(
        path, batch_size=32, num_workers=3, order="quasi_random", os_cache=False, cache_limit=limit, read_ahead=0
    )
    assert os.path.getsize(cached.view.data_path) > 2.5 * limit
    unit = cached._memory.block
    blocks = batch_blocks(payload_columns(cached.view, ["blob"]), np.arange(n), unit)
    # an LMDB record may straddle two pages: the first block of the next page is shared by two
    # windows and may be read twice (.beton payloads never straddle a page)
    ptrs, sizes = cached.view.ptrs["blob"].astype(np.int64), cached.view.sizes["blob"].astype(np.int64)
    page = cached.view.page_size
    straddlers = int(np.sum(ptrs // page != (ptrs + sizes - 1) // page))
    assert suffix == "lmdb" or straddlers == 0
    for epoch in range(2):
        got = np.concatenate([b[0][:, :8].numpy().copy().view(np.int64)[:, 0] for b in cached])
        np.testing.assert_array_equal(got, cached.epoch_order(epoch))
        assert cached._memory.peak_resident_bytes <= limit
    cached._runner.wait_idle()  # epoch 2's first jobs (submitted during epoch 1's last ones) are done
    # a page's samples are drawn together: its blocks are read once per epoch, not per batch
    # (.beton: whole pages at once, with the page's tail after its last payload); the process cache
    # (LMDB here) runs the next epoch's first jobs during an epoch's last ones, so the epochs' reads
    # are counted together (the third's first jobs included)
    pages = np.unique(blocks // (page // unit)).size
    bound = pages * page // unit if suffix == "beton" else blocks.size + straddlers
    assert cached._memory.bytes_read <= 2 * bound * unit
    cached.close()


@pytest.mark.parametrize("suffix", ["beton", "lmdb"])
def test_page_pool_serves_quasi_random_order_from_fixed_slots(tmp_path, suffix, monkeypatch):
    # about 29 pages of 2 MiB, a pool of 9 or 10 page slots: each slot's memory is allocated once
    # and reused (an LMDB slot also holds the bytes its page's last record runs over by; LMDB
    # views get the .beton's 2 MiB pages here, not their default 8 MiB)
    monkeypatch.setattr("ffload.formats.lmdb.reader.PROCESS_CACHE_PAGE", 1 << 21)
    n, limit = 2000, 20 << 20
    path = write_dataset(
        str(tmp_path / f"pool.{suffix}"),
        {"blob": BytesField()},
        ((stamped(i),) for i in range(n)),
        n,
        page_size=1 << 21,
    )
    kw = dict(batch_size=8, num_workers=3, order="quasi_random", read_ahead=0)
    cached = ffload.Loader(path, os_cache=False, cache_limit=limit, **kw)
    mapped = ffload.Loader(path, os_cache=True, **kw)
    memory = cached._memory
    assert isinstance(memory, PagePoolMemory)
    assert os.path.getsize(cached.view.data_path) > 2.5 * limit
    assert (memory.stride > 1 << 21) == (suffix == "lmdb")
    pages = np.unique(cached.view.sample_pages).size
    for epoch in range(2):
        before = memory.bytes_read
        got = np.concatenate([b[0].numpy().copy() for b in cached])
        np.testing.assert_array_equal(got[:, :8].copy().view(np.int64)[:, 0], cached.epoch_order(epoch))
        np.testing.assert_array_equal(got, np.concatenate([b[0].numpy().copy() for b in mapped]))
        assert memory.bytes_read - before <= pages * memory.stride  # each page read once per epoch
        assert memory.peak_resident_bytes <= limit and memory.region.nbytes <= limit
        if sys.platform.startswith("linux"):  # slots stay populated between reads
            assert 0 < mapping_rss(memory.region) <= limit
    # the epochs read more than the pool holds: slots were reused, their memory kept
    assert memory.bytes_read > 2 * memory.region.nbytes >= 2 * memory.resident_bytes > 0
    cached.close()
    mapped.close()
    # RANDOM order, and a limit below batch_size pages, use the block cache
    for order, small in [("random", limit), ("quasi_random", 4 << 20)]:
        with ffload.Loader(path, batch_size=8, order=order, os_cache=False, cache_limit=small) as other:
            assert isinstance(other._memory, ProcessCacheMemory)


@pytest.mark.parametrize("suffix", ["beton", "lmdb"])
def test_the_page_pools_read_ahead_asks_for_nothing_in_an_epoch_the_pool_holds(tmp_path, suffix, monkeypatch):
    """The page pool's read-ahead asks for no page in an epoch whose pages the pool holds at its
    start (a pool as large as the file, after the first epoch), and keeps asking in every epoch of
    a pool smaller than the file; the batches are the mapped file's either way."""
    monkeypatch.setattr("ffload.formats.lmdb.reader.PROCESS_CACHE_PAGE", 1 << 21)
    n = 2000
    path = write_dataset(
        str(tmp_path / f"pool.{suffix}"),
        {"blob": BytesField()},
        ((stamped(i),) for i in range(n)),
        n,
        page_size=1 << 21,
    )
    asked = []  # the sample ids of every prefetch, as bytes (compared with each epoch's batches)
    prefetch = PagePoolMemory.prefetch

    def counted(self, indices, batch):
        asked.append(np.asarray(indices, np.int64).tobytes())
        return prefetch(self, indices, batch)

    monkeypatch.setattr(PagePoolMemory, "prefetch", counted)
    kw = dict(batch_size=8, num_workers=2, order="quasi_random")
    with ffload.Loader(path, os_cache=True, **kw) as mapped:
        expected = [np.concatenate([b[0].numpy().copy() for b in mapped]) for _ in range(3)]
    size = os.path.getsize(open_dataset(path).data_path)
    for limit, asks in [(2 * size, False), (20 << 20, True)]:
        asked.clear()
        with ffload.Loader(path, os_cache=False, cache_limit=limit, **kw) as cached:
            assert isinstance(cached._memory, PagePoolMemory)
            assert (cached._memory.region.nbytes < size) == asks
            for epoch in range(3):
                got = np.concatenate([b[0].numpy().copy() for b in cached])
                np.testing.assert_array_equal(got, expected[epoch])
            # which epoch each prefetch served (the IO thread may still walk an epoch's last
            # batches when the next starts): a cold pool's first epoch always asks
            epochs = {b.tobytes(): e for e in range(3) for b in cached._epoch_batches(e)}
            served = {epochs.get(a) for a in asked}
        assert 0 in served
        assert bool(served & {1, 2}) == asks, served


@pytest.mark.parametrize("read_ahead", [None, 0])
def test_a_page_pool_that_holds_the_data_reads_each_page_once(tmp_path, read_ahead):
    """A page pool larger than the file keeps what it read: a page the epoch needs no more takes a
    never used slot rather than evicting another page (the next epoch's), so the epochs after the
    first read nothing, with or without the read-ahead."""
    n = 2000
    path = write_dataset(
        str(tmp_path / "fits.beton"), {"blob": BytesField()}, ((stamped(i),) for i in range(n)), n, page_size=1 << 21
    )
    size = os.path.getsize(path)
    kw = {} if read_ahead is None else {"read_ahead": read_ahead}
    with ffload.Loader(
        path, batch_size=32, num_workers=2, order="quasi_random", os_cache=False, cache_limit=2 * size, **kw
    ) as loader:
        memory = loader._memory
        assert isinstance(memory, PagePoolMemory)
        pages = np.unique(loader.view.sample_pages).size
        for epoch in range(3):
            got = np.concatenate([b[0][:, :8].numpy().copy().view(np.int64)[:, 0] for b in loader])
            np.testing.assert_array_equal(got, loader.epoch_order(epoch))
            loader._runner.wait_idle()
            assert memory.bytes_read == pages * memory.stride  # the first epoch's reads, no more
        assert memory.resident_bytes == pages * memory.stride


def test_batch_larger_than_the_cache_fails_at_open(stamped_dataset):
    with pytest.raises(ValueError, match=r"batch \(or job\) of 8 samples may need \d+ bytes.*cache_limit=65536"):
        loader(stamped_dataset, os_cache=False, cache_limit=CACHE_BLOCK)
    with pytest.raises(ValueError, match="cache_limit"):
        loader(stamped_dataset, os_cache=False, cache_limit=0)


def test_every_memory_manager_has_the_hooks_the_loader_calls(stamped_dataset):
    """The three managers satisfy MemoryManager (region, ptrs, schedule, prepare, check, release,
    close); an object lacking one hook does not."""
    view = open_dataset(stamped_dataset)
    managers = [
        OSCacheMemory(view),
        ProcessCacheMemory(view, ["blob"], LIMIT, 8),
        PagePoolMemory(view, ["blob"], 256 << 20, 8),
    ]
    try:
        for memory in managers:
            assert isinstance(memory, MemoryManager), type(memory).__name__
            memory.schedule([np.arange(8, dtype=np.int64)])
            lease = memory.prepare(np.arange(8, dtype=np.int64), 0)
            memory.check(np.arange(8, dtype=np.int64))
            ptr = int(memory.ptrs["blob"][3])
            assert memory.region[ptr : ptr + 8].view(np.int64)[0] == 3  # sample 3's stamp, read through the hooks
            memory.release(lease)
    finally:
        for memory in managers:
            memory.close()

    class NoCheck:
        region, ptrs = None, {}

        def schedule(self, batches, start=0): ...
        def prepare(self, indices, batch=None, batches=1): ...
        def release(self, lease): ...
        def close(self): ...

    assert not isinstance(NoCheck(), MemoryManager)


@pytest.mark.parametrize("cause", ["batch_over_cache_limit", "pool_too_small", "read_ahead_unit", "paged_local"])
def test_memory_configuration_mistakes_raise_configuration_error(stamped_dataset, cause):
    view = open_dataset(stamped_dataset)
    with pytest.raises(ConfigurationError, match=str(view.path) if cause != "read_ahead_unit" else "unit"):
        if cause == "batch_over_cache_limit":
            ProcessCacheMemory(view, ["blob"], CACHE_BLOCK, 8)
        elif cause == "pool_too_small":
            PagePoolMemory(view, ["blob"], 1 << 20, 8)
        elif cause == "read_ahead_unit":
            ReadAhead(view.data_path, view.data_size, payload_columns(view, ["blob"]), 1 << 20, unit=ADVISE_PAGE + 1)
        else:
            PagedSamples(view, [np.arange(8, dtype=np.int64)])


def test_a_waiting_batch_gets_room_when_others_release(stamped_dataset):
    """Two batches that cannot be resident together: the second waits for the first's release."""
    view = open_dataset(stamped_dataset)
    columns = payload_columns(view, ["blob"])
    block = cache_block(columns, view.data_size)
    one, two = (batch_blocks(columns, np.arange(start, start + 8), block).size * block for start in (0, 100))
    limit = max(one, two) * 3 // 2  # room for either batch, not for both
    memory = ProcessCacheMemory(view, ["blob"], cache_limit=limit, batch_size=4)
    first = memory.prepare(np.arange(0, 8))
    done = threading.Event()

    def second():
        memory.release(memory.prepare(np.arange(100, 108)))
        done.set()

    thread = threading.Thread(target=second)
    thread.start()
    assert not done.wait(0.5)  # blocked: the first batch's blocks are pinned
    memory.release(first)
    thread.join(30)
    assert done.is_set() and memory.peak_resident_bytes <= limit
    memory.close()


def evict(path) -> None:
    """Drop ``path``'s pages from the page cache (``POSIX_FADV_DONTNEED``; clean pages, no privilege)."""
    fd = os.open(path, os.O_RDONLY)
    os.fdatasync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)


def test_read_ahead_skips_batches_in_the_page_cache(stamped_dataset):
    """A warm file's batches are not asked for; once evicted, they are."""
    view = open_dataset(stamped_dataset)
    columns = payload_columns(view, ["blob"])
    ahead = ReadAhead(view.data_path, view.data_size, columns, 1 << 30, record=True)
    batch = np.arange(8)
    with open(view.data_path, "rb") as f:
        f.read()  # warm
    assert ahead._request(batch, 0) == 0 and ahead.requested == []
    evict(view.data_path)
    assert ahead._request(batch, 0) > 0 and ahead.requested
    ahead.close()
    starts = np.array([0], np.int64)
    vec = np.zeros(1, np.uint8)
    assert not sampled_resident(ahead._address, starts[:0], 8, vec, vec.ctypes.data)  # no run: ask


def test_read_ahead_asks_for_no_batch_of_an_epoch_whose_payloads_are_cached(stamped_dataset):
    """The epoch's check finds every payload page of a warm file cached: no batch is asked for (nor
    checked one by one), and the IO thread is done with the epoch; after an eviction the next
    epoch's batches are asked for."""
    view = open_dataset(stamped_dataset)
    columns = payload_columns(view, ["blob"])
    batches = EpochBatches(np.arange(N, dtype=np.int64), 8)
    ptrs, sizes = columns[0]
    ahead = ReadAhead(view.data_path, view.data_size, columns, 1 << 30, record=True)
    try:
        pages = np.zeros(3, np.uint8)  # chunks of three pages: a run is checked in several calls

        def resident(indices):
            return payloads_resident(ahead._address, indices, ptrs, sizes, view.data_size, pages, pages.ctypes.data)

        evict(view.data_path)
        assert not resident(np.arange(N))
        fd = os.open(view.data_path, os.O_RDONLY)  # warm the blobs' pages only (no kernel read-ahead)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        for s in range(N):
            os.pread(fd, int(sizes[s]), int(ptrs[s]))
        os.close(fd)
        assert resident(np.arange(N)) and resident(np.array([3, 3, 1], np.int64))
        other_ptrs, other_sizes = payload_columns(view, ["other"])[0]  # pages holding no blob are not cached
        assert not payloads_resident(
            ahead._address, np.arange(N), other_ptrs, other_sizes, view.data_size, pages, pages.ctypes.data
        )
        checked, request = [], ahead._request  # the per-batch step (its own mincore probes) is not reached
        ahead._request = lambda indices, batch: checked.append(batch) or request(indices, batch)
        ahead.schedule(batches, 0)
        wait_until_stalled(ahead)
        assert ahead._next == len(batches) and checked == [] and ahead.requested == []
        evict(view.data_path)
        assert not resident(np.arange(N))
        ahead.schedule(EpochBatches(batches.order, 8), 0)  # a new epoch
        wait_until_stalled(ahead)
        assert checked and ahead.requested
    finally:
        ahead.close()


def test_read_ahead_checks_a_warm_epoch_against_the_runs_of_every_sample(stamped_dataset, monkeypatch):
    """Given the loader's samples, the epoch check looks at the runs of pages their payloads span,
    merged once: a warm file's epochs neither sort their own payloads nor ask for a batch. With only
    an epoch's payloads cached, the runs miss a page of the others and the epoch's own payloads are
    checked (cached: nothing asked for); after a whole eviction the batches are asked for.
    (Without ``samples``, the epoch's payloads are checked: the test before.)"""
    from ffload.loaders.memory import readahead

    view = open_dataset(stamped_dataset)
    columns = payload_columns(view, ["blob"])
    ptrs, sizes = columns[0]
    samples = np.random.default_rng(5).permutation(N).astype(np.int32)  # taken as int64
    ahead = ReadAhead(view.data_path, view.data_size, columns, 1 << 30, record=True, samples=samples)
    sorted_epochs, merged = [], []  # calls of the per-epoch check and of the merge, after the constructor
    check, merge = readahead.payloads_resident, ahead._page_runs
    monkeypatch.setattr(readahead, "payloads_resident", lambda *a: sorted_epochs.append(1) or check(*a))
    monkeypatch.setattr(ahead, "_page_runs", lambda indices, *a: merged.append(len(indices)) or merge(indices, *a))

    def run_epoch(order):
        ahead.schedule(EpochBatches(order.astype(np.int64), 8), 0)
        wait_until_stalled(ahead)

    try:
        evict(view.data_path)
        with open(view.data_path, "rb") as f:  # warm every page
            f.read()
        for epoch in range(2):
            run_epoch(np.random.default_rng(epoch).permutation(samples))
            assert ahead._next == len(ahead._batches) and ahead.requested == []
        assert sorted_epochs == [] and merged == [N]  # the samples' runs, merged once
        epoch = samples[: N // 2]
        evict(view.data_path)
        fd = os.open(view.data_path, os.O_RDONLY)  # warm the epoch's payloads only (no kernel read-ahead)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        for s in epoch:
            os.pread(fd, int(sizes[s]), int(ptrs[s]))
        os.close(fd)
        run_epoch(epoch)
        assert sorted_epochs == [1] and ahead.requested == []
        evict(view.data_path)
        run_epoch(samples)
        assert ahead.requested  # the first batch's probe finds the eviction: batches asked for
    finally:
        ahead.close()


def _process_madvise_refusal() -> str | None:
    """Why this machine's kernel or C library refuses ``process_madvise(MADV_DONTNEED)`` on the
    calling process (``PIDFD_SELF``), asked directly; None where it takes it."""
    from ffload.loaders.memory.anonymous import PIDFD_SELF, VECTORED

    if not VECTORED:
        return "the C library has no process_madvise"
    libc = ctypes.CDLL(None, use_errno=True)
    libc.process_madvise.restype = ctypes.c_ssize_t
    region = mmap.mmap(-1, mmap.PAGESIZE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    iov = (ctypes.c_size_t * 2)(ctypes.addressof(ctypes.c_char.from_buffer(region)), mmap.PAGESIZE)
    done = libc.process_madvise(PIDFD_SELF, iov, 1, mmap.MADV_DONTNEED, 0)
    errno = ctypes.get_errno()
    del iov
    region.close()
    return None if done == mmap.PAGESIZE else f"this kernel refuses it: {os.strerror(errno)}"


def test_advise_vectored_gives_the_kernel_exactly_the_runs():
    """``process_madvise`` on this process reaches the kernel with the right addresses and lengths,
    over more runs than one call takes (``IOV_MAX``) and a run longer than one call advises
    (``MAX_ADVISE``, in pieces): MADV_DONTNEED zeroes exactly the pages advised. Skipped where the
    kernel refuses the call, asked directly; there the function says so (refused at run 0)."""
    from ffload.loaders.memory.anonymous import IOV_MAX, MAX_ADVISE, advise_vectored

    why = _process_madvise_refusal()
    page, runs = mmap.PAGESIZE, 2 * IOV_MAX + 5
    region = mmap.mmap(-1, 2 * runs * page, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    data = np.frombuffer(region, np.uint8)
    data[:] = 0xAB
    starts = np.arange(runs, dtype=np.int64) * 2 * page  # every other page
    got = advise_vectored(data.ctypes.data, starts, np.full(runs, page, np.int64), mmap.MADV_DONTNEED)
    if why is not None:
        assert got == (0, True)
        pytest.skip(why)
    assert got == (-1, False)
    pages = data.reshape(2 * runs, page)
    assert (pages[0::2] == 0).all() and (pages[1::2] == 0xAB).all()
    del data, pages
    region.close()
    # one run of 3 GiB of address space (nothing committed but the pages written)
    size = 3 << 30
    try:
        big = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | MAP_NORESERVE)
    except OSError as e:  # vm.overcommit_memory=2
        pytest.skip(f"no 3 GiB of address space here: {e}")
    data = np.frombuffer(big, np.uint8)
    marks = [0, MAX_ADVISE - page, MAX_ADVISE, size - page]
    for at in marks:
        data[at : at + page] = 0xCD
    got = advise_vectored(data.ctypes.data, np.array([0], np.int64), np.array([size], np.int64), mmap.MADV_DONTNEED)
    assert got == (-1, False) and not any(data[at : at + page].any() for at in marks)
    del data
    big.close()


def test_advise_vectored_resumes_at_the_run_the_kernel_stopped_in(monkeypatch):
    """Its Python body against a stand-in kernel: calls of at most ``IOV_MAX`` pieces and
    ``MAX_ADVISE`` bytes (a longer run split), and where a call stops part way (the bytes of the
    whole pieces it did) or fails, the run it stopped in; refused only for a failing first call."""
    from ffload.loaders.memory import anonymous

    page = mmap.PAGESIZE
    monkeypatch.setattr(anonymous, "IOV_MAX", 3)
    monkeypatch.setattr(anonymous, "MAX_ADVISE", 4 * page)
    lengths = np.array([page, 6 * page, page, 2 * page, page], np.int64)  # run 1 spans two calls
    starts = np.concatenate([[0], np.cumsum(lengths[:-1])]).astype(np.int64) * 2
    for fail_at in (None, 0, 1, 2, 3, 4, 5):  # the piece (in call order) the stand-in kernel stops at
        calls, pieces = [], [0]

        def kernel(pidfd, iov, count, advice, flags, fail_at=fail_at, calls=calls, pieces=pieces):
            view = np.ctypeslib.as_array((ctypes.c_uint64 * (2 * count)).from_address(iov))
            calls.append(view.reshape(count, 2).copy())
            done = 0
            for k in range(count):
                if pieces[0] == fail_at:
                    return -1 if done == 0 else done
                pieces[0] += 1
                done += int(view[2 * k + 1])
            return done

        monkeypatch.setattr(anonymous, "_process_madvise", kernel)
        first, refused = anonymous.advise_vectored.py_func(1 << 20, starts, lengths, 4)
        assert all(len(c) <= 3 and c[:, 1].sum() <= 4 * page for c in calls)
        advised = np.concatenate(calls)
        if fail_at is None:
            assert (first, refused) == (-1, False)
            assert advised[:, 1].sum() == lengths.sum()
            continue
        done_bytes = advised[:fail_at, 1].sum()  # what the pieces before the failing one covered
        stopped = int(np.searchsorted(np.cumsum(lengths), done_bytes, side="right"))
        assert (first, refused) == (stopped, fail_at == 0)


def test_read_ahead_compiles_its_kernels_before_its_thread_runs(stamped_dataset):
    """In a fresh process, every kernel of the IO thread has its signature once the constructor
    returns and before any epoch is scheduled: the IO thread never compiles (nor loads from the
    cache) while workers run compiled code, which crashed the process."""
    import subprocess

    script = """
import sys
from ffload.formats import open_dataset
from ffload.loaders.memory import readahead as ra, schedule as sc
view = open_dataset(sys.argv[1])
ahead = ra.ReadAhead(view.data_path, view.data_size, sc.payload_columns(view, ["blob"]), 1 << 20)
kernels = [(sc, "spanned_units"), (sc, "sort_unique")] + [(ra, name) for name in (
    "unit_runs", "advise_runs", "sampled_resident", "payloads_resident", "runs_resident", "payload_page_runs")]
print(sorted(name for module, name in kernels if not getattr(module, name).signatures))
ahead.close()
"""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")])))
    out = subprocess.run([sys.executable, "-c", script, stamped_dataset], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_the_caches_compile_their_kernels_before_any_worker_runs(stamped_dataset):
    """In a fresh process, once the page pool and the process cache are constructed, every kernel
    their workers and read-ahead call has its signature, and an epoch of prepares, prefetches,
    evictions and releases adds none: no kernel compiles (or loads from numba's cache) on a worker
    or the IO thread while another runs compiled code."""
    import subprocess

    script = """
import sys
import numpy as np
from ffload.formats import open_dataset
from ffload.loaders.memory import anonymous as an, pagepool as pp, process_cache as pc, readahead as ra, schedule as sc
view = open_dataset(sys.argv[1])
kernels = [(sc, "spanned_units"), (sc, "sort_unique"), (sc, "_next_uses"), (pp, "translate"), (pp, "most_job_pages"),
    (pc, "evictable"), (pc, "read_runs"), (ra, "advise_runs"), (ra, "unit_runs")] + [(an, "advise_vectored")] * an.VECTORED
pool = pp.PagePoolMemory(view, ["blob"], cache_limit=1 << 28, batch_size=8)
cache = pc.ProcessCacheMemory(view, ["blob"], cache_limit=1 << 19, batch_size=8)
print(sorted(name for module, name in kernels if not getattr(module, name).signatures))
before = {name: len(getattr(module, name).signatures) for module, name in kernels}
batches = [np.arange(k, k + 8, dtype=np.int64) for k in range(0, 64, 8)]
for memory in (pool, cache):
    memory.schedule(batches)
    for b, batch in enumerate(batches):
        if memory is pool:
            pool.prefetch(batches[(b + 1) % len(batches)], b)
        memory.release(memory.prepare(batch, b))
print(sorted(name for module, name in kernels if len(getattr(module, name).signatures) != before[name]))
assert cache.bytes_read > cache.cache_limit  # blocks were evicted
pool.close(); cache.close()
"""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")])))
    out = subprocess.run([sys.executable, "-c", script, stamped_dataset], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-2:] == ["[]", "[]"]


def wait_until_stalled(ahead: ReadAhead) -> None:
    deadline = time.monotonic() + 120  # liveness only: a loaded CI machine may be slow
    while time.monotonic() < deadline:
        with ahead._cond:
            if not ahead._may_advance() and ahead._thread.is_alive():
                # the IO thread has handed back the lock: no batch is being requested
                if all(b < ahead._next for b, _ in ahead._ahead):
                    return
        threading.Event().wait(0.005)
    raise AssertionError("read-ahead never stopped")


def test_read_ahead_requests_only_payload_pages_and_stays_bounded(stamped_dataset):
    view = open_dataset(stamped_dataset)
    columns = payload_columns(view, ["blob"])
    batches = EpochBatches(np.random.default_rng(0).permutation(N), 8)
    limit = 10 * 8 * SAMPLE
    evict(view.data_path)  # batches found in the page cache are not asked for
    ahead = ReadAhead(view.data_path, view.data_size, columns, limit, record=True)
    ahead.schedule(batches, 0)
    wait_until_stalled(ahead)
    for b in range(0, len(batches), 3):
        ahead.started(b)
        wait_until_stalled(ahead)
    requested = list(ahead.requested)
    ahead.close()
    assert ahead.refused == 0  # every run reached the kernel
    allowed = set(batch_blocks(columns, np.arange(N), ADVISE_PAGE).tolist())
    other = payload_columns(view, ["other"])[0]
    assert requested
    for offset, length in requested:
        assert 0 <= offset and offset + length <= view.data_size  # inside the data region
        assert offset % ADVISE_PAGE == 0
        pages = set(range(offset // ADVISE_PAGE, -(-(offset + length) // ADVISE_PAGE)))
        assert pages <= allowed  # only pages holding decoded payloads
    # the undecoded field's pages that hold no blob byte are never requested
    other_only = set(batch_blocks([other], np.arange(N), ADVISE_PAGE).tolist()) - allowed
    got = {p for off, n in requested for p in range(off // ADVISE_PAGE, -(-(off + n) // ADVISE_PAGE))}
    assert other_only and not got & other_only
    biggest = max(len(b) for b in batches) * (SAMPLE + 2 * ADVISE_PAGE)
    assert 0 < ahead.max_bytes_ahead <= limit + biggest


def test_read_ahead_with_the_loader_serves_the_same_bytes(stamped_dataset, monkeypatch):
    import ffload.loaders.loader as loader_module

    made = []
    monkeypatch.setattr(
        loader_module, "ReadAhead", lambda *a, **kw: made.append(ReadAhead(*a, **kw, record=True)) or made[-1]
    )
    view = open_dataset(stamped_dataset)
    evict(view.data_path)
    with (
        loader(stamped_dataset, order="random", read_ahead=64 * SAMPLE) as a,
        loader(stamped_dataset, order="random", read_ahead=0) as b,
    ):
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x[0].numpy(), y[0].numpy())
        requested = list(made[0].requested)
    assert len(made) == 1 and requested and made[0].refused == 0  # read_ahead=0 makes no read-ahead at all
    assert all(0 <= off and off + n <= view.data_size for off, n in requested)


@pytest.mark.parametrize(
    "values",
    [
        np.zeros(0, np.int64),
        np.array([7]),
        np.array([3, 3, 3]),
        np.random.default_rng(0).integers(-50, 50, 1000),
        np.random.default_rng(1).integers(0, 2**62, 5000, dtype=np.int64),
    ],
)
def test_sorted_unique_matches_numpy(values):
    got = sorted_unique(values)
    assert got.dtype == values.dtype
    np.testing.assert_array_equal(got, np.unique(values))


def test_epoch_schedule_next_use_is_the_first_batch_from_the_oldest_unprepared():
    rng = np.random.default_rng(4)
    sizes = rng.integers(0, 9000, 300).astype(np.uint64)  # some empty payloads
    ptrs = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.uint64)
    unit = 4096
    schedule = EpochSchedule([(ptrs, sizes)], unit)
    order = rng.permutation(300)
    batches = [np.sort(order[i : i + 32]) for i in range(0, 300, 32)]
    schedule.set(batches, 0)
    users = {}  # unit -> the batches whose payloads span it
    for b, batch in enumerate(batches):
        for s in batch:
            if sizes[s]:
                for u in range(int(ptrs[s]) // unit, (int(ptrs[s] + sizes[s]) - 1) // unit + 1):
                    users.setdefault(u, set()).add(b)
    units = np.arange(int(ptrs[-1] + sizes[-1]) // unit + 3, dtype=np.int64)  # and past the end

    def expected(low):
        return [min((b for b in users.get(u, ()) if b >= low), default=NEVER) for u in units]

    assert schedule.next_use(units, None).tolist() == [NEVER] * units.size  # outside the epoch
    assert schedule.next_use(units, 3).tolist() == expected(0)  # nothing prepared yet: from batch 0
    for b in (0, 1, 3):
        schedule.prepared(b)  # batch 2 is still to come: next use counts from it
    assert schedule.next_use(units, 5).tolist() == expected(2)
    schedule.prepared(2)
    assert schedule.next_use(units, 5).tolist() == expected(4)
    assert schedule.next_use(units, 1).tolist() == expected(1)
    schedule.set(batches[::-1], 9)  # a new epoch, resumed at its last batch
    reversed_users = {u: {len(batches) - 1 - b for b in bs} for u, bs in users.items()}
    assert schedule.next_use(units, 9).tolist() == [
        min((b for b in reversed_users.get(u, ()) if b >= 9), default=NEVER) for u in units
    ]
    # an epoch's batches as the loader gives them (read through their order) and as a list agree;
    # a job's batches are marked prepared together
    epoch = EpochBatches(order.astype(np.int64), 32)
    listed = EpochSchedule([(ptrs, sizes)], unit)
    listed.set([b.copy() for b in epoch], 0)
    schedule.set(epoch, 0)
    for batch in (5, 0, 9):
        assert schedule.next_use(units, batch).tolist() == listed.next_use(units, batch).tolist()
    schedule.prepared(0, 3)
    listed.prepared(0)
    listed.prepared(1)
    listed.prepared(2)
    assert schedule.next_use(units, 7).tolist() == listed.next_use(units, 7).tolist()
    assert schedule._low == listed._low == 3


@pytest.mark.parametrize("unit", [4096, 3000])  # a power of two (shifted) and not (divided)
@pytest.mark.parametrize("fields", [1, 3])
def test_epoch_schedule_lists_each_units_batches_once_in_order(unit, fields):
    """The schedule's CSR arrays: unit ``u``'s batches are exactly the batches one of whose
    payloads, in any decoded field, spans ``u``, each once, ascending; on random layouts (empty
    payloads, fields interleaved in the file, samples repeated within and across batches)."""
    rng = np.random.default_rng(unit + fields)
    n = 400
    columns = []
    for _ in range(fields):
        sizes = rng.integers(0, 9000, n).astype(np.uint64)
        sizes[rng.random(n) < 0.1] = 0
        ptrs = rng.permutation(np.concatenate([[0], np.cumsum(sizes)[:-1]])).astype(np.uint64)
        columns.append((ptrs + np.uint64(rng.integers(0, 50000)), rng.permutation(sizes)))
    order = rng.integers(0, n, 700).astype(np.int64)
    for batches in (EpochBatches(order, 37), [order[i : i + 50] for i in range(0, 700, 50)]):
        schedule = EpochSchedule(columns, unit)
        schedule.set(batches, 0)
        starts, uses, _ = schedule.uses(0)
        users: dict[int, set[int]] = {}
        for b, batch in enumerate(batches):
            for ptrs, sizes in columns:
                for s in batch:
                    if sizes[s]:
                        for u in range(int(ptrs[s]) // unit, (int(ptrs[s] + sizes[s]) - 1) // unit + 1):
                            users.setdefault(u, set()).add(b)
        assert starts.size == max(users) + 2
        for u in range(starts.size - 1):
            assert uses[starts[u] : starts[u + 1]].tolist() == sorted(users.get(u, ())), u


def test_only_a_cache_that_can_evict_lists_the_epochs_uses(stamped_dataset, monkeypatch):
    """The eviction schedule lists each unit's uses only where eviction can happen: a process
    cache or page pool with room for every block or page of the file never evicts, so every next
    use reads as never (nothing listed); a process cache smaller than the file lists them. The
    batches prepared are tracked either way."""
    monkeypatch.setattr("ffload.formats.lmdb.reader.PROCESS_CACHE_PAGE", 1 << 21)  # LMDB: the .beton's pages
    view = open_dataset(stamped_dataset)
    order = np.random.default_rng(3).permutation(N).astype(np.int64)
    batches = EpochBatches(order, 8)
    whole = 4 * view.data_size
    for memory, listed in [
        (ProcessCacheMemory(view, ["blob"], LIMIT, 8), True),
        (ProcessCacheMemory(view, ["blob"], whole, 8), False),
        (PagePoolMemory(view, ["blob"], whole, 8), False),
        (PagePoolMemory(view, ["blob"], 5 << 20, 2), True),  # 2 slots, of fewer pages than the file
    ]:
        try:
            if isinstance(memory, PagePoolMemory):
                assert (memory._page_in.size < memory._slot_of.size) == listed
            memory.schedule(batches, 2)
            schedule = memory._schedule
            assert (schedule.uses(5)[1].size > 0) == listed
            units = np.arange(view.data_size // 4096 + 1)  # every block or page, and more
            assert (schedule.next_use(units, 5) < NEVER).any() == listed
            assert schedule._low == 2  # the batches before ``start`` count as prepared
            schedule.prepared(2, 3)
            assert schedule._low == 5
        finally:
            memory.close()


def test_a_page_pool_fills_an_emptied_slot_before_it_evicts_a_page(stamped_dataset):
    """A prefetch that failed leaves its slot allocated and empty; the next page to load takes
    that slot, not the slot of a page still held (which would be read again), in a pool with a
    slot for every page that lists no eviction schedule."""
    import concurrent.futures

    view = open_dataset(stamped_dataset)
    pool = PagePoolMemory(view, ["blob"], 4 * view.data_size, 8)
    try:
        batches = EpochBatches(np.arange(N, dtype=np.int64), 8)
        pool.schedule(batches, 0)
        for b, batch in enumerate(batches):
            pool.release(pool.prepare(batch, b))
        held = pool._slot_of.copy()
        page = int(np.flatnonzero(held >= 0)[0])
        slot = int(held[page])
        with pool._cond:
            pool._loading[slot] = True  # as a prefetch into it, which then fails
        failed: concurrent.futures.Future = concurrent.futures.Future()
        failed.set_exception(OSError("the read failed"))
        pool._prefetched(failed, page, slot)
        assert pool._slot_of[page] == -1 and pool._page_in[slot] == -1 and pool._allocated[slot]
        with pool._cond:  # the pool's other slots were used longer ago: least recent use alone would pick one
            pool._last_use[slot] = pool._tick + 1
        user = next(b for b, batch in enumerate(batches) if page in batch_blocks(pool._starts, batch, pool.page))
        pool.release(pool.prepare(batches[user], user))
        assert pool._slot_of[page] == slot
        others = np.flatnonzero(held >= 0)
        np.testing.assert_array_equal(pool._slot_of[others], held[others])
    finally:
        pool.close()


def _aligned_samples(tmp_path, n=20, sample=64 << 10):
    """A file of ``n`` block-aligned samples of ``sample`` bytes (the uint32 ``k`` at byte ``4k``,
    each word odd: no sample reads as zeros) and a view of it with one field ``x``."""
    import types

    data = tmp_path / "data.bin"
    data.write_bytes((np.arange(n * sample // 4, dtype=np.uint32) * 2 + 1).tobytes())
    return types.SimpleNamespace(
        data_path=str(data),
        path=str(data),
        ptrs={"x": np.arange(n, dtype=np.uint64) * np.uint64(sample)},
        sizes={"x": np.full(n, sample, np.uint64)},
        data_size=n * sample,
        page_size=1 << 20,
        shards=None,
    )


def test_an_eviction_the_kernel_refuses_in_part_reads_the_blocks_again(tmp_path, monkeypatch):
    """``madvise(MADV_DONTNEED)`` that frees some runs and refuses others: every evicted block
    counts as gone (read again when needed), none is taken as resident with its memory zeroed."""
    import ffload.loaders.memory.process_cache as pc

    sample = 64 << 10
    view = _aligned_samples(tmp_path, sample=sample)
    memory = ProcessCacheMemory(view, ["x"], cache_limit=6 * sample, batch_size=2)
    real = pc.advise_runs

    def partly(address, starts, lengths, advice):  # frees the first run, refuses the others
        if advice == mmap.MADV_DONTNEED and len(starts) > 1:
            real(address, starts[:1], lengths[:1], advice)
            return len(starts) - 1
        return real(address, starts, lengths, advice)

    monkeypatch.setattr(pc, "advise_runs", partly)
    first = [np.array([0, 2]), np.array([4, 6]), np.array([8, 10])]
    batches = first + [np.array([12, 14])] + first  # every block comes back: batch 3 evicts live ones
    memory.schedule(batches)
    for b in range(len(batches)):
        lease = memory.prepare(batches[b], b)
        for s in batches[b].tolist():
            words = memory.region[s * sample : (s + 1) * sample].view(np.uint32)
            np.testing.assert_array_equal(words[:4], np.arange(4) * 2 + 1 + s * sample // 2)
        memory.release(lease)
    assert memory.resident_bytes <= memory.cache_limit
    memory.close()


def test_advice_goes_one_madvise_per_run_from_where_process_madvise_stopped(tmp_path, monkeypatch):
    """The process cache gives its runs' advice through ``process_madvise`` and, from the first run
    that call did not advise, one ``madvise`` each: an advice the kernel refuses the first time is
    not asked that way again, one stopped part way is; either way every evicted block is freed and
    the batches read right."""
    import ffload.loaders.memory.process_cache as pc

    sample = 64 << 10
    view = _aligned_samples(tmp_path, sample=sample)
    real_runs, calls = pc.advise_runs, []

    def runs(address, starts, lengths, advice):
        calls.append(("runs", advice, int(starts[0]) if len(starts) else None))
        return real_runs(address, starts, lengths, advice)

    monkeypatch.setattr(pc, "advise_runs", runs)
    monkeypatch.setattr(pc, "VECTORED", True)
    batches = [np.array([k, k + 2]) for k in (0, 4, 8, 12, 16, 0)]  # each from the third evicts
    for refuse in (True, False):

        def vectored(address, starts, lengths, advice, refuse=refuse):
            first = 0 if refuse else len(starts) // 2  # refused, or stopped at the middle run
            real_runs(address, starts[:first], lengths[:first], advice)  # what the call did advise
            calls.append(("vectored", advice, int(starts[first]) if len(starts) else None))
            return first, refuse

        monkeypatch.setattr(pc, "advise_vectored", vectored)
        memory = ProcessCacheMemory(view, ["x"], cache_limit=4 * sample, batch_size=2)
        calls.clear()
        memory.schedule(batches)
        for b, batch in enumerate(batches):
            lease = memory.prepare(batch, b)
            for s in batch.tolist():
                words = memory.region[s * sample : (s + 1) * sample].view(np.uint32)
                np.testing.assert_array_equal(words[:4], np.arange(4) * 2 + 1 + s * sample // 2)
            memory.release(lease)
        assert memory.resident_bytes <= memory.cache_limit
        gone = np.flatnonzero(~memory._resident)  # freed: private anonymous memory reads as zeros again
        assert gone.size and not memory.region.reshape(-1, memory.block)[gone].any()
        for advice in (mmap.MADV_DONTNEED, pc.MADV_POPULATE_WRITE):
            mine = [c for c in calls if c[1] == advice]
            asked = [c for c in mine if c[0] == "vectored"]
            assert (len(asked) == 1) if refuse else (len(asked) > 1)
            for k, call in enumerate(mine):  # after a vectored call, madvise from the run it stopped at
                if call[0] == "vectored":
                    assert mine[k + 1] == ("runs", advice, call[2])
        memory.close()


def test_a_job_reads_its_own_blocks_while_another_reads_the_ones_they_share(tmp_path):
    """Job B shares a sample with job A, whose read is in progress: B reads its own missing blocks
    meanwhile (not after A), then waits for the shared ones; when A's read fails, B claims and
    reads them itself, and A's error is A's alone."""
    import threading

    sample = 64 << 10
    view = _aligned_samples(tmp_path, sample=sample)
    memory = ProcessCacheMemory(view, ["x"], cache_limit=1 << 22, batch_size=2)
    real, order = memory._read_blocks, []
    a_reads, b_waits, a_fail = threading.Event(), threading.Event(), threading.Event()
    wait = memory._cond.wait

    def waiting(timeout=None):
        if threading.current_thread().name == "B":
            b_waits.set()
        return wait(timeout)

    def read(blocks):
        name = threading.current_thread().name
        order.append((name, sorted({int(b) * memory.block // sample for b in blocks})))
        if name == "A" and len(order) == 1:
            a_reads.set()
            assert a_fail.wait(30)  # held until B waits for the shared sample
            raise OSError("injected")
        return real(blocks)

    memory._cond.wait, memory._read_blocks = waiting, read
    errors, leases = {}, {}

    def job(name, samples):
        try:
            leases[name] = memory.prepare(np.array(samples, np.int64))
        except OSError as e:
            errors[name] = e

    a = threading.Thread(target=job, args=("A", [0, 1]), name="A", daemon=True)
    a.start()
    assert a_reads.wait(30)
    b = threading.Thread(target=job, args=("B", [1, 2]), name="B", daemon=True)
    b.start()
    assert b_waits.wait(30)
    assert order == [("A", [0, 1]), ("B", [2])]  # B read its own sample while A's read was in progress
    a_fail.set()
    a.join(30)
    b.join(30)
    assert str(errors.pop("A")) == "injected" and not errors
    assert order[2:] == [("B", [1])]  # claimed again after A's read failed
    for s in (1, 2):
        words = memory.region[s * sample : s * sample + 16].view(np.uint32)
        np.testing.assert_array_equal(words, np.arange(4) * 2 + 1 + s * sample // 2)
    memory.release(leases["B"])
    assert not memory._pins.any() and not memory._loading.any()
    memory.close()


def test_a_closed_process_cache_reads_no_other_file(tmp_path):
    """After ``close()`` the cache's file descriptor is not used again, even once the system has
    given its number to another file."""
    view = _aligned_samples(tmp_path)
    memory = ProcessCacheMemory(view, ["x"], cache_limit=1 << 22, batch_size=2)
    memory.close()
    other = os.open(view.data_path, os.O_RDONLY)  # likely the descriptor number just freed
    try:
        with pytest.raises(ValueError, match="data.bin: the process cache is closed"):
            memory.prepare(np.array([3], np.int64))
    finally:
        os.close(other)


def test_a_later_epochs_job_makes_room_from_blocks_this_epoch_no_longer_needs(tmp_path):
    """The next epoch's first jobs run during this epoch's last ones (``LATER_EPOCH``): their room
    comes from blocks no batch still to come needs, never from those of a batch still to come
    (which least-recent use would pick first here)."""
    from ffload.loaders.memory.schedule import LATER_EPOCH

    sample = 64 << 10  # 20 block-aligned samples of 64 KiB, 8 KiB blocks
    memory = ProcessCacheMemory(_aligned_samples(tmp_path, sample=sample), ["x"], cache_limit=12 * sample, batch_size=4)
    batches = [np.arange(4 * b, 4 * b + 4, dtype=np.int64) for b in range(4)] + [np.arange(4, dtype=np.int64)]
    memory.schedule(batches)  # batch 4 reads batch 0's samples again
    for b in range(3):
        memory.release(memory.prepare(batches[b], b))
    assert memory.resident_bytes == memory.cache_limit
    lease = memory.prepare(np.arange(16, 20, dtype=np.int64), LATER_EPOCH)  # the next epoch's first job
    again = batch_blocks(memory._payloads, batches[4], memory.block)
    assert memory._resident[again].all()  # batch 4's blocks stayed; batches 1-2's went
    memory.release(lease)
    before = memory.bytes_read
    memory.release(memory.prepare(batches[4], 4))
    assert memory.bytes_read == before
    memory.close()


def test_the_compiled_eviction_choice_is_belady_then_least_recent_use():
    """``evictable`` against the NumPy rule it replaced, on random cache states and schedules:
    candidates (resident, not loading, unpinned, not kept; with ``dead_only`` never used again),
    none when fewer than ``count``, else the furthest next use first, then the least recent use,
    then the lowest block, ``count`` of them or up to ``slack`` more never used again."""
    from ffload.loaders.memory.process_cache import evictable
    from ffload.loaders.memory.schedule import NEVER

    def reference(resident, loading, pins, keep, last_use, starts, uses, low, count, slack, dead_only):
        free = resident & ~loading & (pins == 0)
        free[keep] = False
        candidates = np.flatnonzero(free)
        next_use = np.full(candidates.size, NEVER, np.int64)
        for i, b in enumerate(candidates.tolist()):
            if b + 1 < starts.size:
                later = uses[starts[b] : starts[b + 1]]
                later = later[later >= low]
                if later.size:
                    next_use[i] = later[0]
        if dead_only:
            candidates, next_use = candidates[next_use == NEVER], next_use[next_use == NEVER]
        if candidates.size < count:
            return candidates[:0]
        count = max(count, min(int((next_use == NEVER).sum()), count + slack))
        if candidates.size > count:
            rank = np.lexsort((last_use[candidates], -next_use))
            candidates = np.sort(candidates[rank[:count]])
        return candidates

    rng = np.random.default_rng(7)
    for trial in range(400):
        n = int(rng.integers(1, 60))
        resident = rng.random(n) < 0.7
        loading = resident & (rng.random(n) < 0.1)
        pins = np.where(rng.random(n) < 0.2, rng.integers(1, 3, n), 0).astype(np.int32)
        keep = np.flatnonzero(rng.random(n) < 0.15).astype(np.int64)
        last_use = rng.integers(0, 6, n).astype(np.int64)  # ties, broken by block number
        scheduled = int(rng.integers(0, n + 3))  # units past the schedule's end have no use
        per_unit = rng.integers(0, 4, scheduled)
        index = np.int32 if trial % 2 else np.int64
        starts = np.concatenate([[0], np.cumsum(per_unit)]).astype(index)
        uses = np.concatenate([np.sort(rng.choice(40, k, replace=False)) for k in per_unit] or [[]]).astype(index)
        args = (starts, uses, int(rng.integers(0, 40)), int(rng.integers(1, 8)), int(rng.integers(0, 5)))
        dead_only = bool(rng.random() < 0.3)
        got = evictable(resident, loading, pins, keep, last_use, *args, dead_only)
        want = reference(resident, loading, pins, keep, last_use, *args, dead_only)
        assert got.tolist() == want.tolist(), trial


def test_eviction_slack_takes_only_blocks_never_needed_again(tmp_path):
    import types

    from ffload.loaders.memory.process_cache import EVICT_SLACK

    sample = 64 << 10  # 20 block-aligned samples of 64 KiB: 8 KiB blocks, 8 per sample
    data = tmp_path / "data.bin"
    data.write_bytes(np.arange(20 * sample, dtype=np.uint32).tobytes()[: 20 * sample])
    ptrs = np.arange(20, dtype=np.uint64) * np.uint64(sample)
    view = types.SimpleNamespace(
        data_path=str(data),
        path=str(data),
        ptrs={"x": ptrs},
        sizes={"x": np.full(20, sample, np.uint64)},
        data_size=20 * sample,
        page_size=1 << 20,
        shards=None,
    )
    limit = 16 * sample  # 4 batches of 4 samples; a slack of one sample
    memory = ProcessCacheMemory(view, ["x"], cache_limit=limit, batch_size=4)
    assert memory.block == 8 << 10 and int(limit * EVICT_SLACK) == sample
    batches = [np.arange(4 * b, 4 * b + 4, dtype=np.int64) for b in range(5)]
    batches += [batches[0], batches[1], batches[2]]  # batches 0-2's samples come back: live
    memory.schedule(batches)
    for b in range(4):
        memory.release(memory.prepare(batches[b], b))
    assert memory.resident_bytes == limit
    memory.release(memory.prepare(batches[4], 4))  # needs 4 samples' room: batch 3's, all dead
    live = batch_blocks(memory._payloads, np.arange(12, dtype=np.int64), memory.block)
    assert memory._resident[live].all()  # the slack found no other dead block: nothing live went
    assert memory.resident_bytes == limit
    for b in range(5, 8):
        before = memory.bytes_read
        lease = memory.prepare(batches[b], b)
        assert memory.bytes_read == before  # served from the cache
        first = int(ptrs[batches[b][0]])  # the file holds uint32 k at byte 4k
        np.testing.assert_array_equal(memory.region[first : first + 32].view(np.uint32), np.arange(8) + first // 4)
        memory.release(lease)
    memory.close()


def test_cache_block_follows_the_payload_size_and_bounds_the_block_count():
    from ffload.loaders.memory.process_cache import MAX_CACHE_BLOCKS, MIN_CACHE_BLOCK

    def column(size, n=100, stride=None, offset=0):
        starts = np.arange(n, dtype=np.uint64) * np.uint64(stride or size) + np.uint64(offset)
        return [(starts, np.full(n, size, np.uint64))]

    assert cache_block(column(196_608), 1 << 30) == 16 << 10  # 192 KiB raw samples, aligned
    # the same samples as LMDB overflow values: 40 bytes into a 4 KiB page, 49 pages apart; a
    # 16 KiB block would read 13 blocks (8% more), 8 KiB blocks 25 (2% more)
    assert cache_block(column(196_608, stride=49 << 12, offset=40), 1 << 30) == MIN_CACHE_BLOCK
    assert cache_block(column(110_000), 1 << 30) == MIN_CACHE_BLOCK  # ImageNet-sized JPEGs
    # 8 KiB-aligned payloads 14 blocks long: 8 KiB blocks (16 KiB is above the mean over 8)
    assert cache_block(column(114_000, stride=114_688), 1 << 30) == 8 << 10
    assert cache_block(column(3_000), 1 << 30) == MIN_CACHE_BLOCK  # CIFAR-sized
    assert cache_block(column(10 << 20), 1 << 30) == CACHE_BLOCK  # never above 64 KiB
    assert cache_block([], 1 << 30) == CACHE_BLOCK  # nothing decoded: the largest
    huge = 40 * MAX_CACHE_BLOCKS * MIN_CACHE_BLOCK  # 4 KiB to 32 KiB blocks would be too many: 64 KiB
    assert cache_block(column(110_000), huge) == CACHE_BLOCK


def test_read_ahead_in_cache_blocks_covers_what_the_cache_reads(stamped_dataset):
    """With os_cache=False the read-ahead requests whole cache blocks: every byte range the
    process cache reads for a batch lies inside what was requested for it."""
    view = open_dataset(stamped_dataset)
    columns = payload_columns(view, ["blob"])
    memory = ProcessCacheMemory(view, ["blob"], batch_size=8)
    ahead = ReadAhead(view.data_path, view.data_size, columns, 1 << 30, unit=memory.block)
    batch = np.random.default_rng(3).choice(N, 8, replace=False)
    requested = zip(*ahead._runs(batch))  # what the IO thread asks the kernel for, for this batch
    ahead.close()
    covered = np.zeros(view.data_size, bool)
    for offset, length in requested:
        assert offset % memory.block == 0
        covered[offset : offset + length] = True
    for b in batch_blocks(columns, batch, memory.block):
        assert covered[b * memory.block : min((b + 1) * memory.block, view.data_size)].all()
    memory.close()
    with pytest.raises(ValueError, match="multiple of"):
        ReadAhead(view.data_path, view.data_size, columns, 1, unit=1000)


def test_batch_blocks_are_every_unit_a_payload_touches():
    """batch_blocks (compiled, the workers' and the read-ahead's path) against a byte-by-byte
    reference: empty, one-unit and many-unit payloads, two columns sharing units, repeated
    samples."""
    rng = np.random.default_rng(5)
    n, unit = 300, 4096
    columns = []
    for most in (3_000, 40_000):
        sizes = rng.integers(0, most, n).astype(np.uint64)
        sizes[::7] = 0
        columns.append((rng.integers(0, 1 << 24, n).astype(np.uint64), sizes))
    indices = np.concatenate([rng.choice(n, 64, replace=False), [3, 3]]).astype(np.int64)
    touched = {
        byte // unit for p, s in columns for i in indices for byte in range(int(p[i]), int(p[i] + s[i]), 512)
    } | {int(p[i] + s[i] - 1) // unit for p, s in columns for i in indices if s[i]}
    np.testing.assert_array_equal(batch_blocks(columns, indices, unit), sorted(touched))
    assert sort_unique(np.zeros(0, np.int64)) == 0


def test_unit_runs_merge_consecutive_units_and_clip_to_the_region():
    units = np.array([0, 1, 2, 5, 7, 8, 11], np.int64)
    starts, lengths = np.empty(7, np.int64), np.empty(7, np.int64)
    n = unit_runs(units, 4096, 11 * 4096 + 100, starts, lengths)
    assert list(zip(starts[:n].tolist(), lengths[:n].tolist())) == [
        (0, 3 * 4096),
        (5 * 4096, 4096),
        (7 * 4096, 2 * 4096),
        (11 * 4096, 100),
    ]
    assert unit_runs(np.array([12], np.int64), 4096, 11 * 4096 + 100, starts, lengths) == 0  # past the end


def test_advise_runs_gives_the_kernel_exactly_the_runs():
    """The compiled madvise reaches the kernel with the right addresses and lengths:
    MADV_DONTNEED on a private anonymous mapping zeroes exactly the pages advised."""
    page = mmap.PAGESIZE
    region = mmap.mmap(-1, 6 * page, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    data = np.frombuffer(region, np.uint8)
    data[:] = 0xAB
    advise_runs(
        data.ctypes.data, np.array([page, 3 * page], np.int64), np.array([page, 2 * page], np.int64), mmap.MADV_DONTNEED
    )
    pages = data.reshape(6, page)
    assert (pages[[1, 3, 4]] == 0).all()
    assert (pages[[0, 2, 5]] == 0xAB).all()
    del data, pages
    region.close()
