"""The page pool: ``os_cache=False`` in QUASI_RANDOM order (``.beton`` and LMDB).

FFCV's ``ProcessCacheManager`` design: a fixed pool of ``cache_limit // page_size`` slots of one
``.beton`` page each (``(slots * page_size,) uint8``, an anonymous mapping), whose memory is
allocated once, on the first use of each slot (``MADV_POPULATE_WRITE``: one call, not one fault
per 4 KiB page), and reused for the rest of the loader's life: a new page overwrites an evicted
one in place. No page fault and no ``MADV_DONTNEED`` per read, where the block cache of
:class:`~ffload.loaders.memory.process_cache.ProcessCacheMemory` pays a first-touch fault for
every block it reads because eviction gives the memory back.

A payload lives in the slot of the page it starts in, as one contiguous range: a ``.beton``
sample's payloads never straddle a page (FFCV's format); an LMDB record may run past the end of
its nominal page (``data.mdb`` has no pages of that size), so each slot also holds the
:func:`page_overhang` bytes after its page. The pool translates the batch's payload offsets
(``ptrs[s] -> slot * slot_bytes + ptrs[s] % page_size``) into its own ``ptrs`` arrays, which the
decoders index instead of ``DatasetView.ptrs`` (entries are written when a batch is prepared and
stay valid while the batch holds its pages). Consecutive missing pages are read with one
``os.preadv`` into their (scattered) slots (one read per page with an overhang). Eviction follows the epoch's schedule
(:class:`~ffload.loaders.memory.schedule.EpochSchedule`: furthest next use first), so each page is read once per epoch
when the pool holds the pages of the batches in flight.

In QUASI_RANDOM order the loader uses the pool when :func:`page_pool_fits`: it holds at least
``min(batch_size, pages)`` slots, so any batch fits whatever the order. Otherwise (RANDOM or
SEQUENTIAL order, a small ``cache_limit``) it uses the block cache.

Pages come from a *page source* (:mod:`.pagesource`): the local data file (``os.preadv``), or,
for a ``.beton`` on object storage, range GETs of whole pages (:class:`~.pagesource.RemotePages`;
the loader uses the pool in every order then). A remote pool's slots live in a cache file in
``cache_dir`` instead of anonymous memory: a sparse file of ``slots * page_size <= cache_limit``
bytes, mapped shared, whose blocks are allocated as slots are first used (unlinked at once, so
nothing is left behind by a crash). The kernel's page cache caches that file, the pool bounds its
size, and pages kept in slots serve later epochs without a request. :meth:`PagePoolMemory.prefetch`
loads the pages of a batch ahead of need (:class:`~.readahead.PagePoolReadAhead` walks the epoch's
schedule), only into slots whose page is needed later than that batch (Belady's rule again), with
the source's bounded concurrency.
"""

from __future__ import annotations

import logging
import mmap
import os
import tempfile
import threading
from collections.abc import Sequence

import numpy as np
from numba import njit

from ffload.errors import ConfigurationError
from ffload.formats.shardio import open_data_files
from ffload.loaders.memory.anonymous import CAN_POPULATE, MAP_NORESERVE, populate, region_view
from ffload.loaders.memory.pagesource import FilePages, RemotePages
from ffload.loaders.memory.schedule import NEVER, EpochSchedule, batch_blocks, payload_columns
from ffload.storage import default_cache_dir

logger = logging.getLogger(__name__)


def page_overhang(view, field_names: Sequence[str]) -> int:
    """Bytes (a multiple of ``mmap.PAGESIZE``) by which payloads of the listed fields reach past
    the end of the ``view.page_size`` page they start in: 0 for a ``.beton`` (payloads never
    straddle a page), up to a record's size for LMDB (``data.mdb`` has no such pages)."""
    page, over = int(view.page_size), 0
    for ptrs, sizes in payload_columns(view, field_names):
        p, n = ptrs.astype(np.int64), sizes.astype(np.int64)
        past = np.where(n > 0, p + n - (p // page + 1) * page, 0)
        over = max(over, int(past.max(initial=0)))
    return -(-over // mmap.PAGESIZE) * mmap.PAGESIZE


def page_pool_fits(view, field_names: Sequence[str], cache_limit: int, batch_size: int) -> bool:
    """Whether :class:`PagePoolMemory` can serve ``view``: a page size that is a multiple of
    ``mmap.PAGESIZE`` and ``cache_limit`` bytes holding at least ``min(batch_size, pages)`` slots
    of a page plus :func:`page_overhang` (a batch needs at most one slot per sample)."""
    page = int(view.page_size)
    if page <= 0 or page % mmap.PAGESIZE or not view.data_size:
        return False
    pages = -(-int(view.data_size) // page)
    return cache_limit // (page + page_overhang(view, field_names)) >= min(batch_size, pages)


@njit(nogil=True, cache=True)
def translate(indices, ptrs, sizes, slot_of, page, stride, out):
    """``out[s]`` for each sample ``s`` of ``indices`` (``(B,) int64``): where its payload
    (``ptrs[s]``, ``sizes[s]``: ``(N,) uint64`` bytes of the data file) lies in the pool's region,
    ``slot_of[page] * stride`` plus its offset in its page (``slot_of``: ``(pages,) int64``, the
    slot holding each file page); 0 for an empty payload. ``out``: ``(N,) uint64``."""
    for s in indices:
        if sizes[s] > 0:
            p = np.int64(ptrs[s])
            out[s] = slot_of[p // page] * stride + p % page
        else:
            out[s] = 0


@njit(nogil=True, cache=True)
def most_job_pages(order, first, length, pages, stamp):
    """The most distinct pages one job reads. Job ``j`` is the ``length`` samples of ``order``
    (``(M,) int64``) from position ``first + j * length`` on (the last one shorter); ``pages``:
    ``(F, N) int32`` the page each decoded field's payload of each sample starts in (-1: empty),
    the pool's unit; ``stamp``: ``(pages,) int64`` scratch filled with -1."""
    most = 0
    job = 0
    for start in range(first, order.shape[0], length):
        count = 0
        for i in range(start, min(start + length, order.shape[0])):
            s = order[i]
            for f in range(pages.shape[0]):
                unit = pages[f, s]
                if unit >= 0 and stamp[unit] != job:
                    stamp[unit] = job
                    count += 1
        most = max(most, count)
        job += 1
    return most


class PagePoolMemory:
    """``os_cache=False`` (and remote datasets): a fixed pool of ``cache_limit // (page_size +
    overhang)`` page slots.

    Same interface as :class:`~ffload.loaders.memory.process_cache.ProcessCacheMemory` (the hooks
    of :class:`~ffload.loaders.memory.base.MemoryManager`, the counters), plus :meth:`prefetch`. Workers claim slots under a lock, read
    their pages in parallel outside it, and wait for pages another worker (or the read-ahead) is
    reading, or for a slot when every slot holds a page of a batch in progress.

    Args:
        view: the :class:`ffload.formats.DatasetView` (checked with :func:`page_pool_fits`).
        field_names: the fields whose payloads the loader decodes.
        cache_limit: bytes the pool may occupy at most.
        batch_size: the largest batch the loader asks for.
        source: the page source (:mod:`.pagesource`); ``None``: the local data file
            (:class:`~.pagesource.FilePages`), or a sharded dataset's shards.
        cache_dir: put the slots in a cache file in this folder (created if missing) instead of
            anonymous memory (remote datasets).

    Attributes:
        resident_bytes, peak_resident_bytes: bytes of slots allocated so far (``<= cache_limit``;
            slots are never given back before :meth:`close`).
        stride: bytes per slot (``page_size`` plus :func:`page_overhang`).
        bytes_read: bytes read from the source so far.
        source: the page source (``source.requests``: GETs issued, for a remote one).

    Raises:
        ConfigurationError: the view does not fit the pool (see :func:`page_pool_fits`; a
            ValueError).
        OSError: the data file or the cache file cannot be opened, or the pool cannot be mapped
            (named).
    """

    _source = None
    _cache_fd: int | None = None

    def __init__(
        self,
        view,
        field_names: Sequence[str],
        cache_limit: int,
        batch_size: int,
        source=None,
        cache_dir: str | None = None,
    ):
        if not page_pool_fits(view, field_names, cache_limit, batch_size):
            raise ConfigurationError(
                f"{view.path}: cache_limit={cache_limit} holds fewer than {batch_size} pages of {view.page_size} bytes"
            )
        self.path, self.page = view.data_path or view.path, int(view.page_size)
        self.stride = self.page + page_overhang(view, field_names)  # bytes per slot
        self.data_size, self.cache_limit = int(view.data_size), int(cache_limit)
        self._payloads = payload_columns(view, field_names)
        self.ptrs = {name: np.zeros(view.num_samples, np.uint64) for name in field_names if name in view.ptrs}
        self._columns = [(name, view.ptrs[name], view.sizes[name]) for name in self.ptrs]
        pages = -(-self.data_size // self.page)
        slots = min(pages, self.cache_limit // self.stride)
        self._buffer = self._map(slots * self.stride, cache_dir)
        self.region = region_view(self._buffer)
        self._slot_of = np.full(pages, -1, np.int64)  # slot holding each file page
        self._page_in = np.full(slots, -1, np.int64)  # file page held by each slot
        self._pins = np.zeros(slots, np.int32)
        self._loading = np.zeros(slots, bool)
        self._allocated = np.zeros(slots, bool)  # memory populated once, kept until close()
        self._holds_file = slots >= pages  # a slot for every page: never evicts
        self._last_use = np.zeros(slots, np.int64)
        self._tick = 0
        # a payload lives in the slot of the page it starts in (its first byte is its unit)
        self._starts = [(p, np.minimum(n, 1)) for p, n in self._payloads]
        self._schedule = EpochSchedule(self._starts, self.page)
        self._cond = threading.Condition()
        self.resident_bytes = self.peak_resident_bytes = self.bytes_read = 0
        self._populate = CAN_POPULATE
        self._start_pages: np.ndarray | None = None  # (F, N) int32 for job_batches, made at its first call
        self._warned: set[tuple[int, int]] = set()  # (asked, given) job sizes job_batches warned about
        self._compile()
        self.source = self._source = (
            source if source is not None else FilePages(open_data_files(view), self.data_size, self.page)
        )

    def _compile(self) -> None:
        """Compile (or load from numba's cache) the pool's kernels on the constructing thread: the
        first batch's prepare runs on a worker while the read-ahead thread runs compiled code
        (its prefetch), and a kernel must not be compiling or loading meanwhile (see
        :class:`~ffload.loaders.memory.readahead.ReadAhead`)."""
        none = np.zeros(0, np.int64)
        batch_blocks(self._starts, none, self.page)
        for name, ptrs, sizes in self._columns:
            translate(none, ptrs, sizes, self._slot_of, self.page, self.stride, self.ptrs[name])
        most_job_pages(none, 0, 1, np.zeros((1, 0), np.int32), none)
        EpochSchedule.compile()

    def _map(self, nbytes: int, cache_dir: str | None) -> mmap.mmap:
        """The slots' memory: anonymous, or a sparse cache file in ``cache_dir`` mapped shared."""
        try:
            if cache_dir is None:
                return mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | MAP_NORESERVE)
            os.makedirs(cache_dir, exist_ok=True)
            fd, name = tempfile.mkstemp(prefix=f"ffload-pages-{os.getpid()}-", suffix=".cache", dir=cache_dir)
            os.unlink(name)  # lives while mapped and open: a crash leaves nothing behind
            self._cache_fd = fd
            os.ftruncate(fd, nbytes)  # sparse: blocks are allocated as slots are first written
            return mmap.mmap(fd, nbytes, flags=mmap.MAP_SHARED)
        except OSError as e:
            where = f"a cache file in {cache_dir}" if cache_dir else "memory"
            raise OSError(
                e.errno,
                f"{self.path}: cannot map a page pool of {nbytes} bytes in {where} ({e.strerror}); lower cache_limit",
            ) from e

    def cache_file_bytes(self) -> int:
        """Bytes of disk the cache file has allocated (``st_blocks * 512``; 0 without one)."""
        return os.fstat(self._cache_fd).st_blocks * 512 if self._cache_fd is not None else 0

    def check(self, indices: np.ndarray) -> None:
        """Nothing to check after a batch's reads: pages were read into the pool (a source that
        ends early raises), and a remote pool's cache file is unlinked, out of other processes'
        reach (see :meth:`~ffload.loaders.memory.os_cache.OSCacheMemory.check`)."""

    def close(self) -> None:
        """Stop the source (its requests), close the files; the memory is freed once no batch
        references it. Idempotent."""
        if self._source is not None:
            self._source.close()
            self._source = None
        if self._cache_fd is not None:
            os.close(self._cache_fd)
            self._cache_fd = None
        self.region = None

    def __del__(self, _close=os.close):  # bound here: ``os`` may be None at interpreter teardown
        fd = getattr(self, "_cache_fd", None)
        if fd is not None:
            _close(fd)

    def schedule(self, batches: Sequence[np.ndarray], start: int = 0) -> None:
        """The epoch's batches (each ``(B,) int64`` sample ids), ``start`` onwards to come:
        eviction frees the slots whose page's next use is furthest. A pool with a slot for every
        page of the file never evicts (a missing page always finds a never used or emptied
        slot, which :meth:`_free_slots` takes first), so it lists no uses, a sort of the epoch's
        that would run under the lock the workers take."""
        with self._cond:
            self._schedule.set(batches, start, list_uses=not self._holds_file)

    def prepare(self, indices: np.ndarray, batch: int | None = None, batches: int = 1) -> np.ndarray:
        """Load the pages the payloads of samples ``indices`` (``(B,) int64``) span, pin their
        slots and point ``ptrs[name][indices]`` at the payloads in ``region``; returns the lease
        for :meth:`release`. ``batch``: its number in the :meth:`schedule` (``batches``: how
        many consecutive batches ``indices`` holds: a job's, sized by :meth:`job_batches`).

        Raises:
            OSError: a read failed or the file is shorter than ``data_size`` (truncated).
        """
        indices = np.ascontiguousarray(indices, dtype=np.int64)  # the type the kernels were compiled for
        pages = batch_blocks(self._starts, indices, self.page)
        with self._cond:
            while True:
                held = self._slot_of[pages]
                if self._loading[held[held >= 0]].any():  # another worker is reading some
                    self._cond.wait()
                    continue
                missing = pages[held < 0]
                free = self._free_slots(missing.size, held[held >= 0], batch)
                if free is not None:
                    break
                self._cond.wait()  # every other slot holds a page of a batch in progress
            old = self._page_in[free]
            self._slot_of[old[old >= 0]] = -1
            self._page_in[free], self._slot_of[missing] = missing, free
            self._loading[free] = True
            slots = self._slot_of[pages]
            self._pins[slots] += 1
            self._schedule.prepared(batch, batches)
            self._tick += 1
            self._last_use[slots] = self._tick
        try:
            nread = self._read_pages(missing, free)  # outside the lock: workers read in parallel
        except BaseException:
            with self._cond:
                self._slot_of[missing], self._page_in[free] = -1, -1
                self._loading[free] = False
                self._pins[slots] -= 1
                self._cond.notify_all()
            raise
        with self._cond:
            self._loading[free] = False
            self.bytes_read += nread
            self._cond.notify_all()
        self._translate(indices)
        return slots

    def _free_slots(
        self, count: int, keep: np.ndarray, batch: int | None, later_only: bool = False
    ) -> np.ndarray | None:
        """``count`` unpinned slots to load pages into, never the slots ``keep``: empty ones
        first (emptied by a failed read, then never used: the pool grows to hold what it reads,
        up to ``cache_limit``, as the process cache does; a page the epoch needs no more is the
        next epoch's, and a pool that holds the data reads nothing after the first epoch), then
        those holding no page the schedule needs again, then those whose page's next scheduled
        use is furthest, least recently used first; None when fewer are free. With
        ``later_only`` (a prefetch for ``batch``), only slots whose page is next needed after
        ``batch``. Holds the lock."""
        if count == 0:  # the batch's pages are all in the pool (read ahead)
            return np.zeros(0, np.int64)
        usable = (self._pins == 0) & ~self._loading
        usable[keep] = False
        candidates = np.flatnonzero(usable)
        if candidates.size < count:
            return None
        held = self._page_in[candidates]
        next_use = self._schedule.next_use(np.maximum(held, 0), batch)
        next_use[held < 0] = NEVER
        if later_only:
            later = next_use > batch
            candidates, held, next_use = candidates[later], held[later], next_use[later]
            if candidates.size < count:
                return None
        # empty slots (emptied by a failed read, then never used), then those whose page no
        # scheduled batch needs, then the rest
        empty = np.where(self._allocated[candidates], 0, 1)
        kind = np.where(held < 0, empty, np.where(next_use == NEVER, 2, 3))
        rank = np.lexsort((self._last_use[candidates], -next_use, kind))
        return candidates[rank[:count]]

    def job_batches(self, batches, start: int, per_job: int, workers: int, explicit: bool = False) -> int:
        """How many consecutive batches of the epoch ``batches`` (an
        :class:`~ffload.loaders.orders.EpochBatches`) a job may hold, from batch ``start`` on:
        ``per_job``, halved until every job's pages, counted on this epoch's order, fit the pool's
        slots shared by ``workers`` jobs in flight (at least 1: a batch fits the pool alone, see
        :func:`page_pool_fits`). A job pins its pages until it is decoded, and one that cannot fit
        would wait for slots forever; in QUASI_RANDOM order a job of several batches draws them
        from a few pages. With ``explicit`` (the user's ``batches_per_job``), only until every job
        fits the whole pool, with a warning naming both when that lowers it (the pages depend on
        each epoch's order: a size that fits epoch 0 may not fit a later one)."""
        slots = self._page_in.size
        if per_job <= 1 or not self._payloads or self._holds_file:
            return max(1, per_job)
        asked, size = per_job, batches.batch_size
        share = 1 if explicit else max(1, workers)
        order = np.ascontiguousarray(batches.order, dtype=np.int64)  # the type _compile compiled for
        while per_job > 1 and self._most_job_pages(order, start * size, per_job * size) * share > slots:
            per_job //= 2
        if explicit and per_job < asked and (asked, per_job) not in self._warned:
            self._warned.add((asked, per_job))
            logger.warning(
                "%s: batches_per_job=%d: a job of this epoch reads more pages of %d bytes than the %d that "
                "cache_limit=%d holds; its jobs hold %d batches (raise cache_limit to keep them whole)",
                self.path,
                asked,
                self.page,
                slots,
                self.cache_limit,
                per_job,
            )
        return per_job

    def _most_job_pages(self, order: np.ndarray, first: int, length: int) -> int:
        """The most pages one job of ``length`` consecutive samples of ``order`` from position
        ``first`` on reads, every decoded field's payloads counted (:func:`most_job_pages`)."""
        if self._start_pages is None:  # what the pool's unit is: the page of each payload's first byte
            self._start_pages = np.stack(  # int32: pages of at least 2 MiB
                [np.where(n > 0, (p // np.uint64(self.page)).astype(np.int32), -1) for p, n in self._payloads]
            )
        stamp = np.full(self._slot_of.size, -1, np.int64)
        return most_job_pages(order, first, length, self._start_pages, stamp)

    def _read_pages(self, pages: np.ndarray, slots: np.ndarray) -> int:
        """Read file ``pages`` (sorted) into ``slots`` through the source (each page with the
        overhang past its end); returns the bytes read."""
        if pages.size == 0:
            return 0
        self._allocate(slots)
        with memoryview(self._buffer) as pool:
            return self._source.read(pool, pages, slots, self.stride)

    def holds(self, indices: np.ndarray) -> bool:
        """Whether every page the payloads of samples ``indices`` (``(n,)`` integer ids) start in
        is in the pool now (read, or being read): a read-ahead has nothing to ask for them."""
        pages = batch_blocks(self._starts, np.ascontiguousarray(indices, dtype=np.int64), self.page)
        with self._cond:
            return bool((self._slot_of[pages] >= 0).all())

    def prefetch(self, indices: np.ndarray, batch: int) -> int | None:
        """Start loading the pages of samples ``indices`` (batch ``batch`` of the schedule) that
        are not in the pool, in the background, without pinning them: only into slots whose page
        is needed after ``batch`` (so no batch before it loses a page). Needs a source with
        ``submit`` (both :mod:`.pagesource` kinds).

        Returns:
            bytes requested (0: every page is in the pool or on its way), or None when not every
            missing page found such a slot (nothing requested: try again once batches finish).
        """
        pages = batch_blocks(self._starts, indices, self.page)
        with self._cond:
            held = self._slot_of[pages]
            missing = pages[held < 0]
            if missing.size == 0:
                return 0
            free = self._free_slots(missing.size, held[held >= 0], batch, later_only=True)
            if free is None:
                return None
            old = self._page_in[free]
            self._slot_of[old[old >= 0]] = -1
            self._page_in[free], self._slot_of[missing] = missing, free
            self._loading[free] = True
            self._tick += 1
            self._last_use[free] = self._tick
        pool = memoryview(self._buffer)
        for page, slot in zip(missing.tolist(), free.tolist()):
            future = self._source.submit(pool, page, slot, self.stride, before=self._allocate_one)
            future.add_done_callback(lambda f, page=page, slot=slot: self._prefetched(f, page, slot))
        return int(missing.size) * self.page

    def _allocate_one(self, slot: int) -> None:
        self._allocate(np.array([slot], np.int64))

    def _prefetched(self, future, page: int, slot: int) -> None:
        """A prefetch finished: the page is in its slot, or (failed, cancelled) forgotten, so
        that the batch needing it reads it itself and reports the error."""
        failed = future.cancelled() or future.exception() is not None
        with self._cond:
            self._loading[slot] = False
            if failed:
                if self._slot_of[page] == slot:
                    self._slot_of[page] = -1
                self._page_in[slot] = -1
            else:
                self.bytes_read += future.result()
            self._cond.notify_all()

    def _allocate(self, slots: np.ndarray) -> None:
        """Populate the memory of slots used for the first time (one call per slot)."""
        fresh = slots[~self._allocated[slots]]
        for s in fresh:
            if self._populate:  # else the read faults the pages in
                self._populate = populate(self._buffer, int(s) * self.stride, self.stride)
        if fresh.size:
            with self._cond:
                self._allocated[fresh] = True
                self.resident_bytes = int(self._allocated.sum()) * self.stride
                self.peak_resident_bytes = self.resident_bytes

    def _translate(self, indices: np.ndarray) -> None:
        """``ptrs[name][indices]``: the payloads' offsets in ``region`` (0 for empty ones), one
        compiled call per field (:func:`translate`)."""
        for name, ptrs, sizes in self._columns:
            translate(indices, ptrs, sizes, self._slot_of, self.page, self.stride, self.ptrs[name])

    def release(self, lease: np.ndarray) -> None:
        """Unpin the slots of a batch (the lease :meth:`prepare` returned); their pages stay
        until the slots are needed."""
        with self._cond:
            self._pins[lease] -= 1
            self._cond.notify_all()


def remote_page_pool(
    view, fields: Sequence[str], cache_limit: int, rows: int, cache_dir: str | os.PathLike | None, max_requests: int
) -> PagePoolMemory:
    """The page pool of a remote ``.beton``: whole pages by range GETs
    (:class:`~ffload.loaders.memory.pagesource.RemotePages`) into a cache file, as the Loader and
    :class:`ffload.loaders.pagedsamples.PagedSamples` build it.

    Args:
        view: the remote :class:`ffload.formats.DatasetView` (``view.remote`` set).
        fields: the fields whose payloads are decoded.
        cache_limit: bytes the pool may occupy at most.
        rows: the largest batch, samples.
        cache_dir: the cache file's folder (``None``: :func:`ffload.storage.default_cache_dir`).
        max_requests: range GETs in flight at most (>= 1).

    Raises:
        ConfigurationError: ``cache_limit`` cannot hold a batch's pages (both named).
        OSError: the cache file cannot be created or mapped (named).
    """
    if not page_pool_fits(view, fields, cache_limit, rows):
        pages = -(-int(view.data_size) // int(view.page_size))
        need = min(rows, pages) * int(view.page_size)
        raise ConfigurationError(
            f"{view.path}: cache_limit={cache_limit} bytes cannot hold the pages one batch may need: a remote "
            f".beton is cached in whole pages of {view.page_size} bytes and a batch of {rows} samples may touch "
            f"{min(rows, pages)} of them ({need} bytes)",
            path=view.path,
            hint=f"raise cache_limit to at least {need} or lower batch_size",
        )
    cache_dir = default_cache_dir() if cache_dir is None else os.fspath(cache_dir)
    source = RemotePages(view.remote, view.data_size, view.page_size, max_requests)
    try:
        return PagePoolMemory(view, fields, cache_limit, rows, source=source, cache_dir=cache_dir)
    except BaseException:
        source.close()
        raise
