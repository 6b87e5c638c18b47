"""Payloads of a remote ``.beton`` for code that decodes samples outside a Loader.

``ffload verify`` and ``ffload inspect --grid`` decode samples with :class:`ffload.loaders.samples.SampleDecoder`,
which reads payloads from a data region (``view.open_region()``, a memory map of a local file). A
``.beton`` on object storage (``s3://``, ``https://``) has no such region: :class:`PagedSamples`
gives one, the Loader's own: the page pool (:class:`~ffload.loaders.memory.pagepool.PagePoolMemory`)
filled by whole-page range GETs (:class:`~ffload.loaders.memory.pagesource.RemotePages`, retried by
:mod:`ffload.storage`), built as the Loader builds it. Samples are visited in *batches* given in
advance (the pool's schedule: a page is evicted when its next use is furthest, so batches in file
order get each page once); while a batch is held (:meth:`PagedSamples.holding`), ``view.ptrs``
of its samples point into ``region``.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Sequence

import numpy as np

from ffload.errors import ConfigurationError
from ffload.formats.view import DatasetView
from ffload.loaders.memory.pagepool import remote_page_pool
from ffload.loaders.memory.pagesource import DEFAULT_MAX_REQUESTS
from ffload.loaders.memory.schedule import batch_blocks, payload_columns


def page_batches(view: DatasetView, max_samples: int, max_pages: int = 4) -> list[np.ndarray]:
    """Consecutive sample ranges (``(B,) int64`` each, in sample order, covering every sample)
    of at most ``max_samples`` samples whose first payloads start in at most ``max_pages``
    distinct pages when samples are stored in order (as ffload's and FFCV's writers store
    them; otherwise a range may span more, which :class:`PagedSamples` sizes its pool for)."""
    n = view.num_samples
    pages = view.sample_pages
    runs = np.concatenate([[0], np.cumsum(np.diff(pages) != 0)]) if n else np.zeros(0, np.int64)
    edges = np.flatnonzero(np.diff(runs // max(1, max_pages)) != 0) + 1
    out = []
    for part in np.split(np.arange(n, dtype=np.int64), edges):
        out.extend(part[i : i + max_samples] for i in range(0, part.size, max(1, max_samples)))
    return [b for b in out if b.size]


class PagedSamples:
    """The payloads of remote ``view``'s samples, batch by batch, through a page pool.

    Args:
        view: a remote ``.beton`` (``view.remote`` set; :func:`ffload.formats.open_dataset` of a URL).
        batches: the batches (``(B,) int64`` sample ids each) to be held, in the order they will
            be (:meth:`holding` takes a batch's number in this list).
        threads: batches held at once at most (the pool holds their pages together).
        cache_dir: the pool's cache file folder (``None``: the Loader's default,
            :func:`ffload.storage.default_cache_dir`).
        max_requests: range GETs in flight at most (None: the Loader's remote default, 8).

    Attributes:
        view: ``view`` whose ``ptrs`` are the pool's (valid for the samples of held batches).
        region: ``(slots * page_size,) uint8``, the pool's slots.
        source: the page source (``source.requests``: GETs so far, the dataset's opening reads included).

    Raises:
        ConfigurationError: ``view`` is not remote (a ValueError). StorageError (from
        :meth:`holding`): a page could not be read.
    """

    def __init__(
        self,
        view: DatasetView,
        batches: Sequence[np.ndarray],
        threads: int = 1,
        cache_dir: str | None = None,
        max_requests: int | None = None,
    ):
        if view.remote is None:
            raise ConfigurationError(f"{view.path}: not a remote dataset (map it with view.open_region())")
        fields = [name for name in view.fields if name in view.ptrs]
        starts = [(p, np.minimum(s, 1)) for p, s in payload_columns(view, fields)]
        page = int(view.page_size)
        pages = -(-int(view.data_size) // page)
        most = max((batch_blocks(starts, b, page).size for b in batches), default=1)
        slots = max(1, min(pages, most * (max(1, threads) + 1)))
        self._batches = list(batches)
        self._pool = remote_page_pool(
            view,
            fields,
            slots * page,
            max(1, most),
            cache_dir,
            DEFAULT_MAX_REQUESTS if max_requests is None else max_requests,
        )
        self._pool.schedule(self._batches)
        self.view = dataclasses.replace(view, ptrs={**view.ptrs, **self._pool.ptrs})
        self.region = self._pool.region
        self.source = self._pool.source

    @contextlib.contextmanager
    def holding(self, k: int) -> Iterator[np.ndarray]:
        """Load the pages of batch ``k`` (blocking; waits while other held batches fill the
        pool), and keep them while the block runs; yields the batch's sample ids."""
        batch = self._batches[k]
        lease = self._pool.prepare(batch, k)
        try:
            yield batch
        finally:
            self._pool.release(lease)

    def close(self) -> None:
        """Stop the requests and free the pool. Idempotent."""
        self._pool.close()

    def __enter__(self) -> PagedSamples:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
