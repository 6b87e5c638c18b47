"""Memory managers: the ``uint8`` region the decoders read payloads from (FFCV's ``os_cache``).

* :class:`OSCacheMemory` (``os_cache=True``): a read-only ``np.memmap`` of the data file; the
  kernel's page cache serves (and shares across processes) the bytes.
* :class:`ProcessCacheMemory` (``os_cache=False``): an anonymous buffer of the file's size that
  this process fills page by page, on demand, just before a batch needs the pages, with
  ``os.preadv``; each page is read once per loader. Pages are never evicted, so the dataset's
  touched bytes must fit in RAM (the buffer is reserved lazily: untouched pages cost nothing).

Both expose ``region`` (``(data_size,) uint8``, indexed by ``DatasetView.ptrs``) and
``prepare(indices)``, which the loader calls on a worker thread before running a batch.
"""
from __future__ import annotations

import mmap
import os
import threading
from typing import Sequence

import numpy as np


def pages_spanned(ptrs: np.ndarray, sizes: np.ndarray, page_size: int) -> np.ndarray:
    """Every page touched by the payloads ``[ptr, ptr + size)``.

    Args:
        ptrs, sizes: ``(K,) uint64`` byte offsets and sizes (bytes); empty payloads touch nothing.
        page_size: bytes per page.

    Returns:
        ``(P,) int64`` sorted unique page numbers (``offset // page_size``).
    """
    keep = sizes > 0
    ptrs = ptrs[keep].astype(np.int64)
    ends = ptrs + sizes[keep].astype(np.int64)
    first = ptrs // page_size
    counts = (ends - 1) // page_size - first + 1
    starts_in_output = np.cumsum(counts) - counts
    steps = np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(starts_in_output, counts)
    return np.unique(np.repeat(first, counts) + steps)


class OSCacheMemory:
    """``os_cache=True``: the data file memory-mapped read-only (``view.open_region()``).

    Args:
        view: the :class:`ffload.formats.DatasetView`.
    """

    def __init__(self, view):
        self.region = view.open_region()

    def prepare(self, indices: np.ndarray) -> None:
        """Nothing to do: the page cache faults the bytes in as the decoders read them."""

    def close(self) -> None:
        """Drop the mapping (unmapped once no batch references it)."""
        self.region = None


class ProcessCacheMemory:
    """``os_cache=False``: a private buffer of ``view.data_size`` bytes filled on demand.

    Before a batch runs, :meth:`prepare` reads every page of ``view.page_size`` bytes that the
    batch's payloads span, for the given fields only, each page once: workers claim the pages
    they read under a lock, read them in parallel outside it, and wait for pages claimed by
    another worker.

    Args:
        view: the :class:`ffload.formats.DatasetView`.
        field_names: the fields whose payloads the loader decodes (fields without a payload are
            ignored).

    Raises:
        OSError: the data file cannot be opened or read (named in the message).
    """

    def __init__(self, view, field_names: Sequence[str]):
        self.path = view.data_path
        self.data_size = int(view.data_size)
        self.page_size = int(view.page_size)
        self._payloads = [(view.ptrs[n], view.sizes[n]) for n in field_names if n in view.ptrs]
        if self.data_size:
            flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_NORESERVE", 0)
            self._buffer = mmap.mmap(-1, self.data_size, flags=flags)
            self.region = np.frombuffer(self._buffer, dtype=np.uint8)
        else:
            self._buffer = None
            self.region = np.empty(0, dtype=np.uint8)
        self._loaded = np.zeros(-(-self.data_size // self.page_size), dtype=bool)
        self._lock = threading.Lock()
        self._in_flight: dict = {}  # page -> Event set when the worker reading it is done
        self._fd = os.open(self.path, os.O_RDONLY)

    def prepare(self, indices: np.ndarray) -> None:
        """Make the pages spanned by the payloads of samples ``indices`` (``(B,) int64``) resident.

        Raises:
            OSError: a read failed or the file is shorter than ``data_size`` (truncated).
        """
        if not self._payloads:
            return
        pages = np.unique(np.concatenate([
            pages_spanned(ptrs[indices], sizes[indices], self.page_size)
            for ptrs, sizes in self._payloads]))
        while not self._loaded[pages].all():
            with self._lock:
                missing = pages[~self._loaded[pages]]
                others = {self._in_flight[p] for p in missing.tolist() if p in self._in_flight}
                mine = np.array([p for p in missing.tolist() if p not in self._in_flight], np.int64)
                done = threading.Event()
                for p in mine.tolist():
                    self._in_flight[p] = done
            # Read outside the lock, so that workers needing other pages read in parallel;
            # pages another worker is reading are awaited instead of read twice.
            try:
                self._read_pages(mine)
                self._loaded[mine] = True
            finally:
                with self._lock:
                    for p in mine.tolist():
                        del self._in_flight[p]
                done.set()
            for event in others:
                event.wait()  # if that read failed, the loop finds the pages missing and retries

    def _read_pages(self, pages: np.ndarray) -> None:
        """Read ``pages`` (sorted page numbers), one call per run of consecutive pages."""
        if pages.size == 0:
            return
        breaks = np.flatnonzero(np.diff(pages) != 1) + 1
        for run in np.split(pages, breaks):
            start = int(run[0]) * self.page_size
            stop = min((int(run[-1]) + 1) * self.page_size, self.data_size)
            self._read(start, stop)

    def _read(self, start: int, stop: int) -> None:
        with memoryview(self._buffer) as whole:
            done = 0
            while start + done < stop:
                n = os.preadv(self._fd, [whole[start + done:stop]], start + done)
                if n == 0:
                    raise OSError(f"{self.path}: file ends at byte {start + done}, expected "
                                  f"{self.data_size} bytes (truncated?)")
                done += n

    def close(self) -> None:
        """Close the file descriptor; the buffer is freed once no batch references it."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self.region = None

    def __del__(self):
        fd = getattr(self, "_fd", None)
        if fd is not None:
            os.close(fd)
