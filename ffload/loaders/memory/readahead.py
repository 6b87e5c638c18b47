"""Deep read-ahead: ask the kernel for the next batches' bytes before the decoders touch them.

The loader knows the whole epoch's order. :class:`ReadAhead` walks it on one IO thread, batch by
batch ahead of the batches being decoded, and issues ``madvise(MADV_WILLNEED)`` on its own
read-only shared mapping of the data file for every run of units that the batch's payloads
span: the byte ranges ``[ptr, ptr + size)`` of the decoded fields, rounded out to units and
clipped to the data region, so nothing outside the payloads' units is ever requested. The unit
is what the batch will read: the kernel's page (``mmap.PAGESIZE``, 4 KiB) when the decoders
touch the mapped file (``os_cache=True``), the process cache's block
(:func:`~ffload.loaders.memory.process_cache.cache_block`, 4-64 KiB) when it reads whole blocks
(``os_cache=False``, RANDOM order). With pages there, each payload not aligned to a block would
leave the ends of its first and last blocks unrequested, and the block read would wait on the
disk for them: two synchronous small reads per sample. It stays at most ``limit`` bytes (plus
one batch) ahead of the batch being decoded, so read-ahead cannot flood the page cache. The
mapping itself costs no memory: WILLNEED fills the page cache without mapping pages into the
process.

Per batch, the IO thread computes the runs (:func:`~.schedule.batch_blocks`, :func:`unit_runs`)
and issues the ``madvise`` calls (:func:`advise_runs`, through the C library's symbol,
:mod:`ffload._jit.cextern`) in compiled calls that do not hold the GIL: a Python loop would make one
call per run (hundreds per batch of small random samples), and even NumPy's steps held the GIL that
the decoding workers need between their compiled calls about as long as a batch of small raw images
takes to decode.

Why ``madvise``: WILLNEED only *submits* the reads and returns, so one thread keeps many requests
in flight, and the block layer merges neighbours; ``posix_fadvise(WILLNEED)`` reached a fraction
of its rate, and ``os.preadv`` from threads waits for each read (one thread per request in
flight) and copies every byte once more. io_uring has no well-kept Python wheel to rely on. The
measurements (``scripts/bench_scale.py --readahead-probe``) are in ``docs/developer-notes.md``.

A batch whose pages are already in the page cache (the file is warm: every epoch after the first
of a dataset that fits in memory) is not asked for: the IO thread first checks a few of its pages
with ``mincore`` (:func:`sampled_resident`, :data:`RESIDENT_PROBES`), and asks for the whole batch
when one is missing. Without that check, a warm dataset of small samples cost one ``madvise`` per
run, hundreds per batch, as much CPU as decoding the batch, on a core the workers needed. Before
that, at the start of each epoch, the IO thread checks every page the epoch's payloads span: the
runs of pages of all the loader's samples' payloads, merged once (:func:`payload_page_runs`,
:func:`runs_resident`), and where one of those is missing, the epoch's own payloads
(:func:`payloads_resident`), ``mincore`` in chunks, stopping at the first missing page: a warm
file's payloads are sorted once, not once per epoch. When all are in the page cache it asks for none of
the epoch's batches, so a warm dataset costs no GIL time per batch for read-ahead
at all (the per-batch check took the GIL between the workers' compiled calls). Pages evicted later
in that epoch are read when the decoders touch them; the next epoch checks again.

The same read-ahead serves ``os_cache=False`` in RANDOM order: the block cache's reads then
copy from the page cache instead of waiting on the disk.

The page pool (QUASI_RANDOM with ``os_cache=False``, and every ``.beton`` on object storage) has
its own, :class:`PagePoolReadAhead`: it walks the schedule the same way (same thread, same bound)
and asks the pool to fetch each batch's missing pages in the background
(:meth:`~ffload.loaders.memory.pagepool.PagePoolMemory.prefetch`: whole pages, several in flight:
``preadv`` threads for a local file, range GETs for an object); when the pool has no slot to
spare yet, it waits for the batches in progress to move on and asks again. An epoch whose pages
are all in the pool at its start asks for none, as a warm file's epoch does above.
"""

from __future__ import annotations

import collections
import mmap
import os
import sys
import threading
from collections.abc import Sequence

import numpy as np
from numba import njit

from ffload._jit.cextern import extern, process_symbol
from ffload.errors import ConfigurationError
from ffload.formats.shardio import FileMapping, ShardLayout, shrank
from ffload.loaders.memory.schedule import batch_blocks

AVAILABLE = process_symbol("madvise")
"""Whether the C library's ``madvise`` was found (POSIX systems); without it the loader runs
without read-ahead (see ``Loader``)."""
_madvise = extern("madvise", "i", "ppi")
_MINCORE = process_symbol("mincore")
_mincore = extern("mincore", "i", "ppp")

RESIDENT_PROBES = 8
"""Pages of a batch (the first of evenly spread runs) whose residency is checked before asking for
the batch: when all are in the page cache, the batch is not asked for (see :meth:`ReadAhead._request`)."""

RESIDENT_CHUNK = 64 << 20
"""Most bytes per ``mincore`` call of an epoch's residency check (:func:`payloads_resident`)."""

_RETRY_SECONDS = 0.02
"""How long :class:`PagePoolReadAhead` waits before asking a full pool again (a batch starting
wakes it sooner)."""

ADVISE_PAGE = mmap.PAGESIZE
"""Default granularity (bytes) of the requested ranges: the kernel's page size."""

DEFAULT_READ_AHEAD = 512 << 20
"""Default bound (bytes) on the payload pages requested ahead of the batch being decoded."""


def _exiting() -> bool:
    """Whether the interpreter is shutting down: ``concurrent.futures`` then refuses new work
    (it sets its flag from ``threading``'s exit hooks, before ``sys.is_finalizing()``)."""
    import concurrent.futures.thread as futures_thread

    return sys.is_finalizing() or bool(getattr(futures_thread, "_shutdown", False))


class ReadAhead:
    """Requests the pages of the next batches of the epoch, at most ``limit`` bytes ahead.

    Args:
        path: the data file (``DatasetView.data_path``), or a sharded dataset's
            :class:`~ffload.formats.shardio.ShardLayout` (``DatasetView.shards``), whose shards
            it maps into one range (:class:`~ffload.formats.shardio.FileMapping`).
        data_size: bytes of the data region (``DatasetView.data_size``); no range reaches past it.
        columns: ``[(ptrs, sizes), ...]`` of the decoded fields (:func:`~ffload.loaders.memory.schedule.payload_columns`).
        limit: bytes of pages requested beyond the batch being decoded (>= 0; 0 disables).
        unit: granularity of the requested ranges, bytes (a multiple of :data:`ADVISE_PAGE`):
            the unit the batch itself will read (see the module docstring).
        samples: ``(M,)`` integer sample ids that hold every id any epoch schedules (the
            loader's ``indices``; repeats allowed; an id outside them goes unchecked), or None:
            the runs of pages their payloads span, merged once (:func:`payload_page_runs`), are
            what each epoch's residency check looks at first (:func:`runs_resident`), instead of
            sorting that epoch's payloads again.

    Attributes:
        requested: ``[(offset, length), ...]`` of the last epoch when ``record`` is True (tests): the
            runs of the batches asked for (not of those found in the page cache).
        refused: ``madvise`` calls the kernel refused so far (advice: nothing fails, but a
            non-zero count means the read-ahead is not reaching the kernel).
        max_bytes_ahead: the most bytes ever outstanding ahead (``<= limit`` + one batch).

    Raises:
        ConfigurationError: ``unit`` is not a multiple of :data:`ADVISE_PAGE` (a ValueError).
        OSError: the data file cannot be opened.
    """

    def __init__(
        self,
        path,
        data_size: int,
        columns,
        limit: int,
        record: bool = False,
        unit: int = ADVISE_PAGE,
        samples: np.ndarray | None = None,
    ):
        if unit < ADVISE_PAGE or unit % ADVISE_PAGE:
            raise ConfigurationError(f"unit must be a multiple of {ADVISE_PAGE} bytes, got {unit}")
        self.data_size = int(data_size)
        self.unit = int(unit)
        self._vec = np.zeros(1, np.uint8)  # mincore's answer for one page
        self._pages = np.zeros(RESIDENT_CHUNK // ADVISE_PAGE, np.uint8)  # ... for a chunk of the region
        # their addresses, read once: ``ndarray.ctypes`` makes a ctypes object per call, under the GIL
        self._vec_address, self._pages_address = self._vec.ctypes.data, self._pages.ctypes.data
        self._columns = columns
        # int64 and contiguous, the types _compile compiled for: nothing compiles on the IO thread
        self._samples = None if samples is None else np.ascontiguousarray(samples, np.int64)
        self._sample_runs: list | None = None  # [(starts, lengths)] per column of ``samples``, at the first check
        if isinstance(path, ShardLayout):  # a sharded dataset: its own contiguous mapping of the shards
            self._map = FileMapping(path.paths, path.bases, path.sizes)
            self._address = self._map.address
        else:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size < self.data_size:  # cut short since the dataset was opened: mmap would refuse it
                    raise shrank(path, self.data_size, size)
                self._map = mmap.mmap(f.fileno(), self.data_size, prot=mmap.PROT_READ)
            self._address = np.frombuffer(self._map, np.uint8).ctypes.data  # the view ends here: close() may unmap
        self._compile()
        self._start(limit, record)

    def _compile(self) -> None:
        """Compile (or load from numba's cache) every kernel the IO thread calls, here on the
        constructing thread, with this dataset's column types and no work: loading a kernel on the
        IO thread while the workers run theirs crashed the process (SIGSEGV: the IO thread in
        llvmlite's ``parse_bitcode`` for its first ``payloads_resident`` as two workers ran
        ``decode_rows``, once in about 60 runs)."""
        none = np.zeros(0, np.int64)
        starts, lengths = self._runs(none)
        advise_runs(self._address, starts, lengths, mmap.MADV_WILLNEED)  # no runs: no call
        if _MINCORE:
            sampled_resident(self._address, starts, RESIDENT_PROBES, self._vec, self._vec_address)
            runs_resident(self._address, starts, lengths, self._pages, self._pages_address)
            for ptrs, sizes in self._columns:
                self._page_runs(none, ptrs, sizes)
                payloads_resident(self._address, none, ptrs, sizes, self.data_size, self._pages, self._pages_address)

    def _start(self, limit: int, record: bool) -> None:
        """Set up the state and start the IO thread."""
        self.limit = int(limit)
        self._cond = threading.Condition()
        self._batches: Sequence = ()  # the epoch's EpochBatches
        self._next = 0  # next batch to request
        self._decoding = 0  # the earliest batch whose decoding may not have started yet
        self._ahead: collections.deque = collections.deque()  # (batch, bytes) requested
        self._ahead_bytes = 0
        self.max_bytes_ahead = 0
        self.requested: list[tuple[int, int]] | None = [] if record else None
        self.refused = 0
        self._checked = None  # the batches of the epoch whose residency was checked last
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="ffload-readahead", daemon=True)
        self._thread.start()

    def schedule(self, batches, start: int) -> None:
        """A new epoch: ``batches`` (:class:`~ffload.loaders.orders.EpochBatches`, each ``(B,)
        int64`` sample ids), decoding from ``start``."""
        with self._cond:
            self._batches, self._next, self._decoding = batches, start, start
            self._ahead.clear()
            self._ahead_bytes = 0
            if self.requested is not None:
                self.requested.clear()
            self._cond.notify_all()

    def started(self, batch: int) -> None:
        """Batch ``batch`` of the current epoch is being decoded: its pages no longer count as
        ahead, and the read-ahead may move on. Nothing to do, and the lock is not taken, where
        every batch of the epoch was asked for (or found in the page cache: a warm file's every
        job) and no bytes count as ahead: read without the lock, a new epoch's :meth:`schedule`
        seen late only leaves this batch's bytes counted until the next call."""
        if not self._ahead and self._next >= len(self._batches):
            return
        with self._cond:
            self._decoding = max(self._decoding, batch + 1)
            while self._ahead and self._ahead[0][0] < self._decoding:
                self._ahead_bytes -= self._ahead.popleft()[1]
            if self._may_advance():  # else the IO thread would only wake to wait again (a GIL hand-off per batch)
                self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed and not self._may_advance():
                    self._cond.wait()
                if self._closed:
                    self._finish()
                    return
                batches, b = self._batches, max(self._next, self._decoding)
                self._next = b + 1
            try:
                if batches is not self._checked:  # a new epoch: are all its payloads already cached?
                    self._checked = batches
                    if self._resident(batches, b):
                        with self._cond:
                            if batches is self._batches:
                                self._next = len(batches)
                        continue
                nbytes = self._request(batches[b], b)
            except RuntimeError:  # "cannot schedule new futures after (interpreter) shutdown": a
                if not (_exiting() or self._closed):  # loader left open at exit, or closed meanwhile
                    raise
                with self._cond:
                    self._closed = True
                continue
            with self._cond:
                if batches is not self._batches:
                    continue  # a new epoch started meanwhile
                if nbytes is None:  # no room yet: ask again once the batches in progress move on
                    self._next = min(self._next, b)
                    self._cond.wait(_RETRY_SECONDS)
                    continue
                if b >= self._decoding:
                    self._ahead.append((b, nbytes))
                    self._ahead_bytes += nbytes
                    self.max_bytes_ahead = max(self.max_bytes_ahead, self._ahead_bytes)

    def _resident(self, batches, first: int) -> bool:
        """Whether every page the payloads of ``batches`` span is in the page cache (once per epoch,
        on the IO thread; compiled, without the GIL). Batch ``first`` (the next to decode) is probed
        first: a cold epoch's first requests are not delayed by sorting the whole epoch. Then the
        runs of every sample's pages (``samples``, merged at the first check), which hold the
        epoch's; only when one is missing, the epoch's own payloads, sorted."""
        if not _MINCORE or not len(batches):
            return False
        starts, _ = self._runs(batches[first])
        if not sampled_resident(self._address, starts, RESIDENT_PROBES, self._vec, self._vec_address):
            return False
        address, pages, pages_address = self._address, self._pages, self._pages_address
        if self._samples is not None:
            if self._sample_runs is None:
                self._sample_runs = [self._page_runs(self._samples, ptrs, sizes) for ptrs, sizes in self._columns]
            if all(runs_resident(address, *runs, pages, pages_address) for runs in self._sample_runs):
                return True
        indices = batches.order  # the epoch's ids in one array: no copy under the GIL
        return all(
            payloads_resident(address, indices, ptrs, sizes, self.data_size, pages, pages_address)
            for ptrs, sizes in self._columns
        )

    def _request(self, indices: np.ndarray, batch: int) -> int | None:
        """Ask for the pages of one batch; the bytes asked for (None: not now, ask again). Runs
        on the IO thread, which alone uses ``_address`` (it unmaps at :meth:`_finish`)."""
        starts, lengths = self._runs(indices)
        if _MINCORE and sampled_resident(self._address, starts, RESIDENT_PROBES, self._vec, self._vec_address):
            # a warm file: one madvise per run (hundreds per batch of small samples) would only
            # find the pages there, and take a core from the workers to do it
            return 0
        self.refused += advise_runs(self._address, starts, lengths, mmap.MADV_WILLNEED)
        if self.requested is not None:
            with self._cond:
                self.requested.extend(zip(starts.tolist(), lengths.tolist()))
        return int(lengths.sum())

    def _finish(self) -> None:
        """On the IO thread, at close: release what the requests used."""
        self._map.close()  # the IO thread owns the mapping

    def _may_advance(self) -> bool:
        return (
            self.limit > 0 and max(self._next, self._decoding) < len(self._batches) and self._ahead_bytes < self.limit
        )

    def _page_runs(self, indices: np.ndarray, ptrs, sizes) -> tuple[np.ndarray, np.ndarray]:
        """``(offsets, lengths)`` of the runs of pages the payloads of ``indices`` span in one
        column (:func:`payload_page_runs`), copied out of the scratch to their size."""
        starts = np.empty(indices.size, np.int64)
        lengths = np.empty(indices.size, np.int64)
        n = payload_page_runs(indices, ptrs, sizes, self.data_size, starts, lengths)
        return starts[:n].copy(), lengths[:n].copy()

    def _runs(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(offsets, lengths)``, two ``(R,) int64`` arrays (bytes): the runs of units the payloads
        of ``indices`` span, clipped to the data region (:func:`~.schedule.batch_blocks`'
        units): compiled calls without the GIL."""
        units = batch_blocks(self._columns, indices, self.unit)
        starts = np.empty(units.size, np.int64)
        lengths = np.empty(units.size, np.int64)
        n = unit_runs(units, self.unit, self.data_size, starts, lengths)
        return starts[:n], lengths[:n]

    def close(self, wait: bool = True) -> None:
        """Stop the IO thread (with ``wait``, join it); it unmaps the file. Idempotent."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify_all()
        if wait:
            self._thread.join()


class PagePoolReadAhead(ReadAhead):
    """The read-ahead of the page pool (a remote object, or a local file with ``os_cache=False``
    in QUASI_RANDOM order): reads the next batches' pages into the pool, several at once, in the
    order's schedule, so that workers find them there (FFCV's process cache does the same).

    Args:
        pool: the :class:`~.pagepool.PagePoolMemory` (with a source that can ``submit``).
        limit: bytes of pages fetched beyond the batch being decoded (> 0).

    Attributes:
        max_bytes_ahead: as for :class:`ReadAhead`.
    """

    def __init__(self, pool, limit: int):
        self._pool = pool
        self._start(limit, record=False)

    def _request(self, indices: np.ndarray, batch: int) -> int | None:
        return self._pool.prefetch(indices, batch)

    def _resident(self, batches, first: int) -> bool:
        """Whether the pool holds every page the epoch's payloads start in (batch ``first``'s
        checked first: a cold epoch's first requests wait for no pass over the epoch): then the
        epoch asks for nothing (a pool that holds the dataset, every epoch after the first, and
        the read-ahead's per-batch work held the GIL for nothing). No page of the epoch goes
        missing during it: the pool evicts only to load a missing page."""
        return len(batches) > first and self._pool.holds(batches[first]) and self._pool.holds(batches.order)

    def _finish(self) -> None:
        pass


@njit(nogil=True, cache=True)
def unit_runs(units, unit, data_size, starts, lengths):
    """Merge sorted distinct unit numbers ``units`` (``(U,) int64``) into runs of consecutive
    units: run ``r`` is bytes ``[starts[r], starts[r] + lengths[r])``, clipped to ``data_size``
    (``starts``, ``lengths``: ``(U,) int64`` out). Returns the number of runs."""
    n = 0
    i = 0
    while i < units.shape[0]:
        j = i
        while j + 1 < units.shape[0] and units[j + 1] == units[j] + 1:
            j += 1
        start = units[i] * unit
        stop = min((units[j] + 1) * unit, data_size)
        if stop > start:
            starts[n] = start
            lengths[n] = stop - start
            n += 1
        i = j + 1
    return n


@njit(nogil=True, cache=True)
def sampled_resident(address, starts, probes, vec, vec_address):
    """Whether the first page of each of ``probes`` evenly spread runs (byte offsets ``starts``,
    ``(R,) int64``, page multiples, into the mapping at ``address``) is in the page cache
    (``mincore``; ``vec``: a ``(1,) uint8`` array at ``vec_address``). False when there is no run or
    a call fails."""
    n = starts.shape[0]
    if n == 0:
        return False
    step = max(1, n // probes)
    for r in range(0, n, step):
        if _mincore(address + starts[r], ADVISE_PAGE, vec_address) != 0 or (vec[0] & 1) == 0:
            return False
    return True


@njit(nogil=True, cache=True)
def _pages_resident(address, first, last, pages, pages_address):
    """Whether pages ``first..last`` (inclusive) of the mapping at ``address`` are all in the page
    cache: ``mincore`` over chunks of ``pages.shape[0]`` pages; False when a call fails."""
    p = first
    while p <= last:
        n = min(last - p + 1, pages.shape[0])
        if _mincore(address + p * ADVISE_PAGE, n * ADVISE_PAGE, pages_address) != 0:
            return False
        for i in range(n):
            if (pages[i] & 1) == 0:
                return False
        p += n
    return True


@njit(nogil=True, cache=True)
def runs_resident(address, starts, lengths, pages, pages_address):
    """Whether every page of the byte runs ``[starts[r], starts[r] + lengths[r])`` (``(R,) int64``
    each, offsets into the mapping at ``address``) is in the page cache (:func:`_pages_resident`);
    True for no run."""
    for r in range(starts.shape[0]):
        if lengths[r] > 0:
            first = starts[r] // ADVISE_PAGE
            last = (starts[r] + lengths[r] - 1) // ADVISE_PAGE
            if not _pages_resident(address, first, last, pages, pages_address):
                return False
    return True


@njit(nogil=True, cache=True)
def payload_page_runs(indices, ptrs, sizes, data_size, starts, lengths):
    """Merge the pages that the payloads ``[ptrs[s], ptrs[s] + sizes[s])`` of the samples
    ``indices`` (``(B,) int64``, repeats allowed; ``ptrs``, ``sizes``: ``(N,) uint64`` bytes) span,
    within ``data_size`` bytes, into runs of consecutive pages, in file order: run ``r`` is bytes
    ``[starts[r], starts[r] + lengths[r])`` (page multiples; ``starts``, ``lengths``: ``(B,) int64``
    out). Returns the number of runs. Pages no payload touches (a page's unused tail, other
    fields) are in none. One sort of ``B`` offsets, whatever the payloads' sizes."""
    at = np.empty(indices.shape[0], np.int64)
    for b in range(indices.shape[0]):
        at[b] = np.int64(ptrs[indices[b]])
    last_page = (data_size - 1) // ADVISE_PAGE
    n = 0
    lo = np.int64(-1)
    hi = np.int64(-2)
    for b in np.argsort(at):
        size = np.int64(sizes[indices[b]])
        if size <= 0:
            continue
        first = at[b] // ADVISE_PAGE
        last = min((at[b] + size - 1) // ADVISE_PAGE, last_page)
        if first <= hi + 1:
            hi = max(hi, last)
            continue
        if lo >= 0:
            starts[n], lengths[n] = lo * ADVISE_PAGE, (hi - lo + 1) * ADVISE_PAGE
            n += 1
        lo, hi = first, last
    if lo >= 0:
        starts[n], lengths[n] = lo * ADVISE_PAGE, (hi - lo + 1) * ADVISE_PAGE
        n += 1
    return n


@njit(nogil=True, cache=True)
def payloads_resident(address, indices, ptrs, sizes, data_size, pages, pages_address):
    """Whether every page that the payloads of the samples ``indices`` span (:func:`payload_page_runs`,
    arguments as there), within the ``data_size`` bytes mapped at ``address`` (page-aligned), is in
    the page cache (:func:`runs_resident`; ``pages``: ``(P,) uint8`` scratch at ``pages_address``);
    stops at the first missing page."""
    starts = np.empty(indices.shape[0], np.int64)
    lengths = np.empty(indices.shape[0], np.int64)
    n = payload_page_runs(indices, ptrs, sizes, data_size, starts, lengths)
    return runs_resident(address, starts[:n], lengths[:n], pages, pages_address)


@njit(nogil=True, cache=True)
def advise_runs(address, starts, lengths, advice):
    """``madvise(address + start, length, advice)`` for each run (bytes; ``address`` the
    page-aligned start of a mapping of the data region, the starts multiples of the page),
    one system call per run, without the GIL. Returns the number of calls that failed."""
    failed = 0
    for r in range(starts.shape[0]):
        if _madvise(address + starts[r], lengths[r], advice) != 0:
            failed += 1
    return failed
