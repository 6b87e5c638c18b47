"""Where the page pool's pages come from (:mod:`.pagepool`): a local file or a remote object.

A page source fills slots of the pool with whole ``.beton`` pages. Two kinds:

* :class:`FilePages`: the data file on a local disk, ``os.preadv`` straight into the slots
  (one call per run of consecutive pages), and page by page from ``max_requests`` threads for
  the read-ahead (one sequential stream per page, several pages in flight: a disk serves far
  more in parallel than one stream of large reads gets).
* :class:`RemotePages`: a ``.beton`` on object storage (:class:`ffload.storage.RemoteObject`),
  one range GET per page (the whole page, clipped to the data), at most ``max_requests`` GETs in
  flight for the whole loader (a thread pool of that size serves both the workers' reads and the
  read-ahead's prefetches), each retried on transient errors by :mod:`ffload.storage`.

Both implement ``read(pool, pages, slots, stride) -> bytes read``: file ``pages`` (sorted
``(K,) int64``) into ``slots`` (``(K,) int64``) of ``pool`` (a writable ``memoryview`` of
``slots * stride`` bytes), each page at ``slot * stride``, blocking until done;
``submit(pool, page, slot, stride, before) -> Future`` (one page, asynchronous, for the
read-ahead; ``before(slot)`` runs first); ``close()``. Page ``p`` is bytes ``[p * page_size, min(p * page_size + length, data_size))`` where
``length`` is ``stride`` (a page plus the overhang past its end, for LMDB) for :class:`FilePages`
and ``page_size`` for :class:`RemotePages` (``.beton`` only: payloads never straddle a page).
"""

from __future__ import annotations

import concurrent.futures
import os

import numpy as np

from ffload.formats.shardio import LocalFile

_RUN = 64
"""Pages read by one ``preadv`` at most (its buffer count stays far below ``IOV_MAX``)."""

DEFAULT_MAX_REQUESTS = 8
"""Range GETs in flight at most per remote loader (``Loader(max_requests=...)``)."""

DEFAULT_LOCAL_REQUESTS = 32
"""Page reads in flight at most from a local file through the page pool (``os_cache=False``,
QUASI_RANDOM): a virtual disk, like a cloud volume, serves many requests in flight better than
few (the measurements that chose 32: ``docs/developer-notes.md``)."""


class FilePages:
    """Pages of a local data file (``DatasetView.data_path``), or of a sharded dataset's shards.

    Args:
        path: the file, or what reads the data region by offset
            (:func:`ffload.formats.shardio.open_data_files`: a sharded dataset's
            :class:`~ffload.formats.shardio.ShardFiles`, which never reads across a shard's end:
            its short reads continue at the next shard); data_size: its bytes in use; page: bytes
            per page.
        max_requests: pages :meth:`submit` reads at once (threads, started on first use).

    Raises:
        OSError: the file cannot be opened.
    """

    def __init__(self, path, data_size: int, page: int, max_requests: int = DEFAULT_MAX_REQUESTS):
        self._file = LocalFile(path, data_size) if isinstance(path, (str, os.PathLike)) else path
        self.path, self.data_size, self.page = self._file.path, int(data_size), int(page)
        self._max_requests = max(1, int(max_requests))
        self._pool = None

    def submit(self, pool: memoryview, page: int, slot: int, stride: int, before=None) -> concurrent.futures.Future:
        """Read ``page`` into ``slot`` on a reader thread; the future's result is the bytes read
        (or the OSError). ``before(slot)`` runs before the read."""
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(self._max_requests, "ffload-pread")

        def read_one() -> int:
            if before is not None:
                before(slot)
            return self.read(pool, np.array([page], np.int64), np.array([slot], np.int64), stride)

        return self._pool.submit(read_one)

    def read(self, pool: memoryview, pages: np.ndarray, slots: np.ndarray, stride: int) -> int:
        """Read ``pages`` into ``slots``: one ``preadv`` per run of consecutive pages when slots
        hold whole pages only (``stride == page``), else one per page; returns the bytes read.

        Raises:
            OSError: a read failed or the file ends before ``data_size`` (truncated; named).
        """
        if pages.size == 0:
            return 0
        total = 0
        run = _RUN if stride == self.page else 1
        breaks = np.flatnonzero(np.diff(pages) != 1) + 1
        for first, into in (
            (r[i : i + run], s[i : i + run])
            for r, s in zip(np.split(pages, breaks), np.split(slots, breaks))
            for i in range(0, r.size, run)
        ):
            start = int(first[0]) * self.page
            stop = min(int(first[-1]) * self.page + stride, self.data_size)
            views = [pool[int(s) * stride : int(s) * stride + self.page] for s in into]
            views[-1] = pool[int(into[-1]) * stride :][: stop - int(first[-1]) * self.page]
            done = 0
            while start + done < stop:  # a short read resumes where it stopped
                n = self._file.preadv(_skip(views, done), start + done)
                if n == 0:
                    raise OSError(
                        f"{self.path}: file ends at byte {start + done}, expected {self.data_size} bytes (truncated?)"
                    )
                done += n
            total += stop - start
        return total

    def close(self) -> None:
        """Stop the reader threads (queued reads cancelled, running ones awaited), close the
        file. Idempotent."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        self._file.close()


class RemotePages:
    """Whole pages of a remote ``.beton`` (one range GET each), at most ``max_requests`` at once.

    Args:
        remote: the :class:`ffload.storage.RemoteObject` (``DatasetView.remote``).
        data_size: bytes of the object; page: bytes per page (the ``.beton`` page size).
        max_requests: range GETs in flight at most (>= 1).

    Attributes:
        requests: GETs issued so far, retries and the dataset's opening reads included
            (``remote.requests``).
    """

    def __init__(self, remote, data_size: int, page: int, max_requests: int = DEFAULT_MAX_REQUESTS):
        self.remote, self.data_size, self.page = remote, int(data_size), int(page)
        self._pool = concurrent.futures.ThreadPoolExecutor(max(1, int(max_requests)), "ffload-get")

    @property
    def requests(self) -> int:
        return self.remote.requests

    def _fetch(self, pool: memoryview, page: int, slot: int, stride: int, before=None) -> int:
        start = page * self.page
        stop = min(start + self.page, self.data_size)
        data = self.remote.read(start, stop)
        if before is not None:
            before(slot)
        pool[slot * stride : slot * stride + len(data)] = data
        return len(data)

    def submit(self, pool: memoryview, page: int, slot: int, stride: int, before=None) -> concurrent.futures.Future:
        """Fetch ``page`` into ``slot`` in the background; the future's result is the bytes read
        (or the :class:`~ffload.errors.StorageError`). ``before(slot)`` runs before the copy."""
        return self._pool.submit(self._fetch, pool, int(page), int(slot), stride, before)

    def read(self, pool: memoryview, pages: np.ndarray, slots: np.ndarray, stride: int, before=None) -> int:
        """Fetch ``pages`` into ``slots`` (concurrently, bounded) and wait; returns the bytes read.

        Raises:
            StorageError: a page could not be read (the object and range named), after the
                other requests of the call have finished.
        """
        futures = [self.submit(pool, p, s, stride, before) for p, s in zip(pages.tolist(), slots.tolist())]
        concurrent.futures.wait(futures)
        return sum(f.result() for f in futures)

    def close(self) -> None:
        """Stop the request threads (queued requests are cancelled, running ones awaited)."""
        self._pool.shutdown(wait=True, cancel_futures=True)


def _skip(views: list[memoryview], done: int) -> list[memoryview]:
    """The buffers ``views`` after their first ``done`` bytes."""
    out = []
    for v in views:
        if done >= len(v):
            done -= len(v)
            continue
        out.append(v[done:])
        done = 0
    return out
