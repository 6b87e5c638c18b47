"""``os_cache=False``: a private, bounded block cache of the data file (FFCV's process cache).

:class:`ProcessCacheMemory`'s ``region`` is an anonymous mapping as long as the data file,
reserved with ``MAP_NORESERVE`` (address space only: no memory is committed for it), so that the
decoders index it with the dataset's own offsets. Only the blocks (:func:`cache_block`: 4-64 KiB)
that jobs need are filled (one ``pread`` per run of consecutive blocks, all of a job's runs in
one compiled call without the GIL: :func:`read_runs`; a sharded dataset's through
:class:`~ffload.formats.shardio.ShardFiles`, one ``os.preadv`` per run) and the resident blocks
never add up to more than ``cache_limit`` bytes: before reading, the cache frees blocks that no
job in progress needs, those whose next use in the epoch is furthest first
(:class:`~ffload.loaders.memory.schedule.EpochSchedule`; ``MADV_DONTNEED`` returns their memory to
the kernel, in one compiled call for all runs, one ``process_madvise`` per 1024 of them where the
kernel takes it: :func:`~ffload.loaders.memory.anonymous.advise_vectored`), and a job (one batch, or several
consecutive ones) waits while the blocks pinned by the other jobs in progress leave no room. In
QUASI_RANDOM order a ``.beton`` batch reads the whole pages it touches when only blocks no later
batch needs have to make room for them. Transparent huge pages are disabled on the mapping so that
a resident block costs its own size in RSS, not 2 MiB.

In QUASI_RANDOM order consecutive batches read the same few pages, so with a limit of a few
batches each block is read once per epoch; in RANDOM order only the blocks that hold the batch's
samples are read (16 KiB blocks for 192 KiB samples: at most 224 KiB read for one), never whole
``.beton`` pages. LMDB's ``data.mdb`` goes through the same mechanism: its records are byte
ranges of that file like ``.beton`` payloads. So does a sharded dataset (``ffload.formats.shards``):
its offsets are read through :class:`ffload.formats.shardio.ShardFiles`, which sends each read to
the shard holding it. The hooks it implements are those of
:class:`~ffload.loaders.memory.base.MemoryManager`.
"""

from __future__ import annotations

import mmap
import threading
from collections.abc import Sequence

import numpy as np
from numba import njit

from ffload._jit.cextern import extern, process_symbol
from ffload.errors import ConfigurationError
from ffload.formats.shardio import LocalFile, open_data_files
from ffload.loaders.memory.anonymous import (
    CAN_POPULATE,
    MADV_POPULATE_WRITE,
    MAP_NORESERVE,
    VECTORED,
    advise_vectored,
    region_view,
)
from ffload.loaders.memory.readahead import advise_runs, unit_runs
from ffload.loaders.memory.schedule import (
    NEVER,
    EpochSchedule,
    batch_blocks,
    first_use,
    payload_columns,
    sorted_unique,
)
from ffload.system import available_memory

_PREAD = process_symbol("pread")
_pread = extern("pread", "p", "ippp")

CACHE_BLOCK = 1 << 16
"""The largest process-cache block, bytes (64 KiB); see :func:`cache_block`."""

MIN_CACHE_BLOCK = mmap.PAGESIZE
"""The smallest process-cache block, bytes: the kernel's page (4 KiB)."""

MAX_CACHE_BLOCKS = 1 << 23
"""At most this many blocks per data file: the cache keeps about 22 bytes of state per block
(flags, pins, last use, and the epoch schedule's index and uses: 176 MiB at most), so very
large files get larger blocks."""

BLOCK_FRACTION = 8
"""A block is at most this fraction of the mean payload (see :func:`cache_block`)."""

BLOCK_TOLERANCE = 1 / 64
"""A larger block is taken only if it reads at most this fraction more bytes than 4 KiB blocks
(see :func:`cache_block`)."""

BLOCK_SAMPLE = 4096
""":func:`cache_block` counts the bytes read on at most this many payloads."""

EVICT_SLACK = 1 / 16
"""When the process cache must make room, it frees up to this fraction of ``cache_limit`` more than
the batch needs, in blocks no later batch of the epoch uses (never one that would be read again):
choosing the blocks to evict scans every resident block (their next uses, a sort), which is costly
with millions of resident blocks; the slack makes it once per several batches."""

DEFAULT_CACHE_FRACTION = 4
"""The default ``cache_limit`` is the available memory divided by this, at most
:data:`MAX_DEFAULT_CACHE_LIMIT`."""

MAX_DEFAULT_CACHE_LIMIT = 8 << 30
"""The largest default ``cache_limit``, bytes (8 GiB)."""


def default_cache_limit() -> int:
    """The default ``cache_limit`` in bytes: a quarter of the available memory
    (``MemAvailable``), at most 8 GiB and at least 256 MiB."""
    return int(max(256 << 20, min(MAX_DEFAULT_CACHE_LIMIT, available_memory() // DEFAULT_CACHE_FRACTION)))


def cache_block(columns, data_size: int) -> int:
    """The process cache's block, bytes: the unit it reads, accounts and evicts.

    A payload rarely starts or ends on a block boundary, so a sample costs its bytes plus the
    ends of its first and last blocks. The block is the largest power of two within
    ``[MIN_CACHE_BLOCK, CACHE_BLOCK]``, no larger than the mean payload over
    :data:`BLOCK_FRACTION`, that reads at most :data:`BLOCK_TOLERANCE` more bytes than 4 KiB
    blocks would (counted on up to :data:`BLOCK_SAMPLE` payloads spread over the file); then
    raised until the file has at most :data:`MAX_CACHE_BLOCKS` blocks. 192 KiB raw samples in a
    ``.beton`` (block-aligned): 16 KiB; the same samples in LMDB, whose values start 40 bytes
    into a 4 KiB page: 4 KiB (49 pages each; 16 KiB blocks would read 13 blocks, 8% more);
    110 KB ImageNet JPEGs: 4 KiB; CIFAR's 3 KiB: 4 KiB.

    Args:
        columns: ``[(ptrs, sizes), ...]`` of the decoded fields (:func:`payload_columns`).
        data_size: bytes of the data file.
    """
    ptrs = np.concatenate([p for p, _ in columns]) if columns else np.zeros(0, np.uint64)
    sizes = np.concatenate([s for _, s in columns]) if columns else np.zeros(0, np.uint64)
    keep = sizes > 0
    ptrs, sizes = ptrs[keep].astype(np.int64), sizes[keep].astype(np.int64)
    if not sizes.size:  # nothing to read
        return CACHE_BLOCK
    mean = float(sizes.mean())
    pick = np.linspace(0, sizes.size - 1, min(sizes.size, BLOCK_SAMPLE)).astype(np.int64)
    ptrs, ends = ptrs[pick], ptrs[pick] + sizes[pick]

    def bytes_read(b: int) -> int:
        return int(((ends - 1) // b - ptrs // b + 1).sum()) * b

    least = bytes_read(MIN_CACHE_BLOCK)
    block = MIN_CACHE_BLOCK
    while block * 2 <= min(CACHE_BLOCK, mean / BLOCK_FRACTION) and bytes_read(block * 2) <= least * (
        1 + BLOCK_TOLERANCE
    ):
        block *= 2
    while block < CACHE_BLOCK and -(-int(data_size) // block) > MAX_CACHE_BLOCKS:
        block *= 2
    return block


def worst_batch_bytes(columns, batch_size: int, block: int) -> int:
    """An upper bound (bytes) on the cache one batch of ``batch_size`` samples can need: the
    ``batch_size`` largest per-sample block spans added up (what a RANDOM batch may draw)."""
    if not columns:
        return 0
    spans = 0
    for ptrs, sizes in columns:
        p = ptrs.astype(np.int64)
        end = p + sizes.astype(np.int64)
        spans = spans + np.where(sizes > 0, (end - 1) // block - p // block + 1, 0)
    k = min(batch_size, len(spans))
    return int(np.partition(spans, len(spans) - k)[len(spans) - k :].sum()) * block


@njit(nogil=True, cache=True)
def read_runs(fd, address, starts, lengths):
    """Read each run of bytes ``[starts[r], starts[r] + lengths[r])`` of the file ``fd`` to the same
    offsets of the memory at ``address`` (``starts``, ``lengths``: ``(R,) int64``), ``pread`` after
    ``pread``, without the GIL: a batch of small random samples is hundreds of runs, and a Python
    call per run held the GIL longer than the batch takes to decode. Returns the first run not
    read whole (a read that failed, or the file's end), which the caller reads again to raise the
    error, or -1."""
    for r in range(starts.shape[0]):
        done = 0
        while done < lengths[r]:
            n = _pread(fd, address + starts[r] + done, lengths[r] - done, starts[r] + done)
            if n <= 0:
                return r
            done += n
    return -1


@njit(nogil=True, cache=True)
def evictable(resident, loading, pins, keep, last_use, starts, uses, low, count, slack, dead_only):
    """The blocks to evict to make room for ``count`` more, without the GIL: ``(E,) int64`` sorted
    block numbers, or none when fewer than ``count`` can go.

    A block can go when it is ``resident``, not ``loading``, has no ``pins`` and is not in ``keep``
    (sorted block numbers: the asking job's own); with ``dead_only``, only if no scheduled batch
    from ``low`` on uses it. Its next use is :func:`~.schedule.first_use` in the schedule's CSR
    arrays ``starts``, ``uses``. Chosen: the
    furthest next use first, then the least recently used (``last_use``), then the lowest
    number, the first of ``np.lexsort((last_use, -next_use))``; ``count`` of them, or up to
    ``slack`` more where that many are never used again (:data:`EVICT_SLACK`). Chosen by selection
    (``np.partition``), not a sort: a full cache of a few GiB holds hundreds of thousands of
    candidates. ``resident``/``loading`` ``(N,) bool``, ``pins`` ``(N,) int32``, ``last_use`` ``(N,) int64``:
    the cache's per-block state."""
    capacity = 0
    for b in range(resident.shape[0]):
        capacity += resident[b]
    blocks = np.empty(capacity, np.int64)
    next_use = np.empty(capacity, np.int64)
    c = 0
    k = 0
    for b in range(resident.shape[0]):
        if not resident[b] or loading[b] or pins[b] != 0:
            continue
        while k < keep.shape[0] and keep[k] < b:
            k += 1
        if k < keep.shape[0] and keep[k] == b:
            continue
        use = first_use(starts, uses, b, low)
        if dead_only and use != NEVER:
            continue
        blocks[c] = b
        next_use[c] = use
        c += 1
    if c < count:
        return blocks[:0]
    dead = 0
    for i in range(c):
        dead += next_use[i] == NEVER
    target = max(count, min(dead, count + slack))
    if c <= target:
        return blocks[:c]
    # Selection, not a sort (a full cache holds millions of blocks): the target-th furthest next
    # use ``t`` goes in with all further ones, and of the blocks next used at ``t`` the least
    # recently used, the lowest numbers among equals (the scan's order).
    t = NEVER if dead >= target else np.partition(next_use[:c], c - target)[c - target]
    need = target
    ties = 0
    for i in range(c):
        need -= next_use[i] > t
        ties += next_use[i] == t
    recency = np.empty(ties, np.int64)
    k = 0
    for i in range(c):
        if next_use[i] == t:
            recency[k] = last_use[blocks[i]]
            k += 1
    newest = np.partition(recency, need - 1)[need - 1]  # the last use the chosen ties reach
    equal = need
    for i in range(ties):
        equal -= recency[i] < newest
    out = np.empty(target, np.int64)
    k = 0
    for i in range(c):
        u = next_use[i]
        if u == t:
            r = last_use[blocks[i]]
            if r > newest or (r == newest and equal == 0):
                continue
            equal -= r == newest
        elif u < t:
            continue
        out[k] = blocks[i]
        k += 1
    return out


class _FileBackedCache:
    """What the process caches share: the data file (or shards) they read by offset, ``_file``
    (:func:`ffload.formats.shardio.open_data_files`), and the ``region`` they serve, released by
    :meth:`close`."""

    _file = None
    _fd: int | None = None  # the file's descriptor where compiled reads use it

    def check(self, indices: np.ndarray) -> None:
        """Nothing to check after a batch's reads: they were reads (``pread``) into the cache, which
        raise when the file ends early (see :meth:`OSCacheMemory.check`)."""

    def close(self) -> None:
        """Close the file(s); the memory is freed once no batch references it."""
        self._fd = None  # a descriptor number the system may give to another file
        if self._file is not None:
            self._file.close()
            self._file = None
        self.region = None


class ProcessCacheMemory(_FileBackedCache):
    """``os_cache=False``: a private cache of at most ``cache_limit`` resident bytes.

    :meth:`prepare` pins the blocks (:func:`cache_block` bytes) that a job's payloads span (one
    batch's or several consecutive ones'; the given fields only) and reads the missing ones:
    workers claim blocks under a lock, read them in parallel outside it, then wait for those of
    their blocks another worker was reading (and claim them again if that read failed); when the
    blocks would exceed the limit, unpinned blocks are evicted (furthest next use in the epoch's
    :meth:`schedule` first, then least recently used), or the worker waits for other jobs to
    :meth:`release` theirs.

    Args:
        view: the :class:`ffload.formats.DatasetView`.
        field_names: the fields whose payloads the loader decodes (fields without a payload are
            ignored).
        cache_limit: bytes the resident blocks may occupy at most (``None``:
            :func:`default_cache_limit`).
        batch_size: the most samples the loader asks for at once (a batch, or a job of several
            batches: :meth:`prepare`), to check at open that they fit.
        whole_pages: read every block of the ``view.page_size`` pages a batch touches, when
            they fit without evicting blocks of the batch (the loader sets it in QUASI_RANDOM
            order, where the next batches draw from the same pages: one large read per page
            instead of many small ones).

    Attributes:
        resident_bytes: bytes of blocks currently resident or being read.
        peak_resident_bytes: the most ``resident_bytes`` has ever been (``<= cache_limit``).
        bytes_read: bytes read from the file so far.

    Raises:
        ConfigurationError: ``batch_size`` samples may need more than ``cache_limit`` bytes (both
            named; a ValueError).
        OSError: the data file cannot be opened or mapped (named in the message).
    """

    def __init__(
        self,
        view,
        field_names: Sequence[str],
        cache_limit: int | None = None,
        batch_size: int = 1,
        whole_pages: bool = False,
    ):
        self.path, self.ptrs = view.data_path or view.path, view.ptrs
        self.data_size = int(view.data_size)
        self.cache_limit = default_cache_limit() if cache_limit is None else int(cache_limit)
        self._payloads = payload_columns(view, field_names)
        self.block = cache_block(self._payloads, self.data_size)
        self.blocks_per_page = max(1, int(view.page_size) // self.block) if whole_pages else 1
        need = worst_batch_bytes(self._payloads, batch_size, self.block)
        if need > self.cache_limit:
            raise ConfigurationError(
                f"{view.path}: a batch (or job) of {batch_size} samples may need {need} bytes of process "
                f"cache ({self.block}-byte blocks), more than cache_limit={self.cache_limit} "
                f"bytes; raise cache_limit, lower batch_size, or use os_cache=True"
            )
        if self.data_size:
            flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | MAP_NORESERVE
            try:
                self._buffer = mmap.mmap(-1, self.data_size, flags=flags)
            except OSError as e:
                raise OSError(
                    e.errno,
                    f"{self.path}: cannot reserve {self.data_size} bytes of "
                    f"address space for the process cache ({e.strerror}; "
                    f"vm.overcommit_memory=2?); use os_cache=True",
                ) from e
            if hasattr(mmap, "MADV_NOHUGEPAGE"):
                self._buffer.madvise(mmap.MADV_NOHUGEPAGE)
            self.region = region_view(self._buffer)
        else:
            self._buffer = None
            self.region = np.empty(0, dtype=np.uint8)
            self.region.flags.writeable = False  # as region_view's: one array type for the kernels
        blocks = -(-self.data_size // self.block)
        self._resident = np.zeros(blocks, dtype=bool)  # filled, or being read
        self._holds_file = blocks * self.block <= self.cache_limit  # every block fits: never evicts
        self._loading = np.zeros(blocks, dtype=bool)
        self._pins = np.zeros(blocks, dtype=np.int32)
        self._last_use = np.zeros(blocks, dtype=np.int64)
        self._tick = 0
        self._schedule = EpochSchedule(self._payloads, self.block)
        self._cond = threading.Condition()
        self.resident_bytes = self.peak_resident_bytes = self.bytes_read = 0
        self._populate = CAN_POPULATE
        self._vectored: dict[int, bool] = {}  # per advice: whether process_madvise took it (see _advise)
        self._address = self.region.ctypes.data  # madvise and the compiled reads write there
        self._compile()
        self._file = open_data_files(view)
        self._fd = self._file.fileno() if _PREAD and isinstance(self._file, LocalFile) else None

    def _compile(self) -> None:
        """Compile (or load from numba's cache) the eviction's kernels on the constructing thread:
        the first eviction, or the first fallback to one ``madvise`` per run, comes in a worker's
        job while other workers run compiled code, which must not be compiling meanwhile (see
        :class:`~ffload.loaders.memory.readahead.ReadAhead`); so do the reads' (:func:`read_runs`,
        the runs of blocks). :func:`evictable` for both index types of the schedule
        (:meth:`EpochSchedule.uses`)."""
        none = np.zeros(0, np.int64)
        if VECTORED:
            advise_vectored(self._address, none, none, mmap.MADV_DONTNEED)
        advise_runs(self._address, none, none, mmap.MADV_DONTNEED)
        unit_runs(none, self.block, self.data_size, none, none)
        if _PREAD:
            read_runs(-1, self._address, none, none)  # no runs: no call
        state = (self._resident[:0], self._loading[:0], self._pins[:0], none, self._last_use[:0])
        for index in (np.int32, np.int64):
            evictable(*state, np.zeros(1, index), np.zeros(0, index), 0, 1, 0, False)

    def schedule(self, batches: Sequence[np.ndarray], start: int = 0) -> None:
        """The epoch's batches (each ``(B,) int64`` sample ids), of which ``start`` onwards will
        be prepared: eviction then frees the blocks whose next use is furthest (never used again
        first), instead of the least recently used (see :class:`EpochSchedule`). A cache that
        holds every block of the file never evicts (:meth:`_make_room` consults the schedule only
        above ``cache_limit``), so it lists no uses, a sort of the epoch's that would run under
        the lock the workers take."""
        with self._cond:
            self._schedule.set(batches, start, list_uses=not self._holds_file)

    def prepare(self, indices: np.ndarray, batch: int | None = None, batches: int = 1) -> np.ndarray:
        """Make the blocks spanned by the payloads of samples ``indices`` (``(B,) int64``: a
        batch's, or a job's ``batches`` consecutive batches one after the other) resident and
        pin them; returns the lease to pass to :meth:`release` once they have been decoded.
        ``batch``: the (first) batch's number in the :meth:`schedule` (for eviction).

        Raises:
            OSError: a read failed or the file is shorter than ``data_size`` (truncated).
        """
        blocks = batch_blocks(self._payloads, indices, self.block)
        while True:
            with self._cond:
                while True:
                    mine = blocks[~self._resident[blocks]]  # neither resident nor being read by another job
                    extra = self._rest_of_pages(mine)
                    room = (mine.size + extra.size) * self.block
                    if extra.size and self._make_room(room, blocks, batch, dead_only=True):
                        mine = np.union1d(mine, extra)
                        break
                    if self._make_room(mine.size * self.block, blocks, batch):
                        break
                    self._cond.wait()  # every other block is pinned by a job in progress
                self._pins[blocks] += 1
                self._schedule.prepared(batch, batches)
                self._tick += 1
                self._last_use[blocks] = self._tick
                self._resident[mine] = self._loading[mine] = True
                self.resident_bytes += mine.size * self.block
                self.peak_resident_bytes = max(self.peak_resident_bytes, self.resident_bytes)
            try:
                nread = self._read_blocks(mine)  # outside the lock: workers read in parallel
            except BaseException:
                with self._cond:
                    self._evict(mine)  # their memory was allocated for the reads
                    self._loading[mine] = False
                    self._pins[blocks] -= 1
                    self._cond.notify_all()
                raise
            with self._cond:
                self._loading[mine] = False
                self.bytes_read += nread
                self._cond.notify_all()
                # then the blocks another job was reading when this one claimed its own: waiting for
                # them first would run the two jobs' reads one after the other (jobs of many random
                # samples nearly always share a block)
                try:
                    while self._loading[blocks].any():
                        self._cond.wait()
                except BaseException:  # an interrupt while waiting: the job does not go on
                    self._pins[blocks] -= 1
                    self._cond.notify_all()
                    raise
                if self._resident[blocks].all():
                    return blocks
                self._pins[blocks] -= 1  # that job's read failed and dropped them: claim them again
                self._cond.notify_all()

    def _rest_of_pages(self, blocks: np.ndarray) -> np.ndarray:
        """The blocks, neither resident nor in ``blocks``, of the pages ``blocks`` fall in
        (empty unless ``whole_pages``). Holds the lock."""
        if self.blocks_per_page == 1 or blocks.size == 0:
            return blocks[:0]
        pages = sorted_unique(blocks // self.blocks_per_page)
        every = (pages[:, None] * self.blocks_per_page + np.arange(self.blocks_per_page)).ravel()
        every = every[every < self._resident.size]
        every = every[~self._resident[every]]
        return np.setdiff1d(every, blocks, assume_unique=True)

    def release(self, lease: np.ndarray) -> None:
        """Unpin the blocks of a batch (the lease :meth:`prepare` returned); they stay resident
        until the room is needed."""
        with self._cond:
            self._pins[lease] -= 1
            self._cond.notify_all()

    def _make_room(self, nbytes: int, keep: np.ndarray, batch: int | None, dead_only: bool = False) -> bool:
        """Evict unpinned blocks (the furthest next use after ``batch`` first, then the least
        recently used; never ``keep``; with ``dead_only``, only blocks the schedule never uses
        again) until ``nbytes`` more fit under the limit, plus up to :data:`EVICT_SLACK` of it
        in blocks the schedule never uses again; False (nothing evicted) when they cannot. The
        choice scans every block of the file: one compiled call without the GIL
        (:func:`evictable`). Holds the lock."""
        excess = self.resident_bytes + nbytes - self.cache_limit
        if excess <= 0:
            return True
        starts, uses, low = self._schedule.uses(batch)
        victims = evictable(
            self._resident,
            self._loading,
            self._pins,
            keep,
            self._last_use,
            starts,
            uses,
            low,
            -(-excess // self.block),
            int(self.cache_limit * EVICT_SLACK) // self.block,
            dead_only,
        )
        if victims.size == 0:
            return False
        self._evict(victims)
        return True

    def _runs(self, blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(starts, lengths)``, ``(R,) int64`` bytes: the runs of consecutive ``blocks`` (sorted
        distinct block numbers), the last clipped to the data's end."""
        starts = np.empty(blocks.size, np.int64)
        lengths = np.empty(blocks.size, np.int64)
        n = unit_runs(blocks, self.block, self.data_size, starts, lengths)
        return starts[:n], lengths[:n]

    def _evict(self, blocks: np.ndarray) -> None:
        """Return the memory of ``blocks`` (sorted block numbers) to the kernel:
        ``MADV_DONTNEED`` on their runs (:meth:`_advise`). They count as gone whatever it answers
        (a block read again is always safe, a freed one taken as resident would read as zeros; a
        run the kernel kept only costs its memory). Holds the lock."""
        starts, lengths = self._runs(blocks)
        self._advise(starts, lengths, mmap.MADV_DONTNEED)
        self._resident[blocks] = False
        self.resident_bytes -= blocks.size * self.block

    def _advise(self, starts: np.ndarray, lengths: np.ndarray, advice: int) -> int:
        """Give ``advice`` to the runs ``(starts, lengths)`` (bytes of the region), without the GIL:
        as many as one ``process_madvise`` call takes at once (:func:`advise_vectored`: for
        ``MADV_DONTNEED``, one flush of the other CPUs' TLBs per call instead of one per run, on a
        kernel that batches them), one ``madvise`` each from the first run that call did not
        advise (:func:`~ffload.loaders.memory.readahead.advise_runs`). An advice that
        ``process_madvise`` refused before it ever took it is not asked that way again (a kernel
        without ``PIDFD_SELF``, or one that takes that advice only from ``madvise``; an
        allocation failing at the very first call is taken for that too, which costs speed
        only). Returns the runs ``madvise`` refused."""
        first = 0
        if self._vectored.get(advice, VECTORED):
            first, refused = advise_vectored(self._address, starts, lengths, advice)
            if refused:
                self._vectored.setdefault(advice, False)  # one call: atomic against other workers
            else:
                self._vectored[advice] = True
            if first < 0:
                return 0
        return advise_runs(self._address, starts[first:], lengths[first:], advice)

    def _read_blocks(self, blocks: np.ndarray) -> int:
        """Read ``blocks`` (sorted block numbers), one read per run of consecutive blocks (a
        local file's all in one compiled call: :func:`read_runs`), after allocating the runs'
        memory (``MADV_POPULATE_WRITE``, :meth:`_advise`: cheaper than faulting the pages in one
        by one in the reads); returns the bytes read."""
        if blocks.size == 0:
            return 0
        if self._file is None:
            raise ValueError(f"{self.path}: the process cache is closed")
        starts, lengths = self._runs(blocks)
        if self._populate:  # stops asking where the kernel (< 5.14) refuses
            self._populate = self._advise(starts, lengths, MADV_POPULATE_WRITE) == 0
        first = 0 if self._fd is None else read_runs(self._fd, self._address, starts, lengths)
        if first >= 0:  # a sharded dataset's runs, or from a read that failed on: its error raised here
            for start, length in zip(starts[first:].tolist(), lengths[first:].tolist()):
                self._read(start, start + length)
        return int(lengths.sum())

    def _read(self, start: int, stop: int) -> None:
        with memoryview(self._buffer) as whole:
            done = 0
            while start + done < stop:
                n = self._file.preadv([whole[start + done : stop]], start + done)
                if n == 0:
                    raise OSError(
                        f"{self.path}: file ends at byte {start + done}, expected {self.data_size} bytes (truncated?)"
                    )
                done += n
