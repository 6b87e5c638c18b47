"""Traversal orders: which samples an epoch visits, in which order, on which rank.

An order maps ``epoch -> (M,) int64`` sample ids. Three orders follow FFCV's ``OrderOption``:

* ``SEQUENTIAL``: the ``indices`` as given, every epoch.
* ``RANDOM``: a full permutation of ``indices`` per epoch, from
  ``np.random.default_rng([seed, epoch, 0])``.
* ``QUASI_RANDOM``: a page-aware shuffle (FFCV's ``QuasiRandom`` idea): the data pages are
  shuffled, consecutive shuffled pages are grouped into windows of a few pages' samples, and
  samples are shuffled within each window only, so that each batch reads few pages. Useful with
  ``os_cache=False`` on datasets larger than RAM.

Distributed training splits the epoch order across ranks as ``torch.utils.data.DistributedSampler``
does: every rank computes the same order, pads it by repeating it from the start up to a multiple
of ``world_size`` (or truncates it to one when ``drop_last``), and rank ``r`` takes
``order[r::world_size]``.

Everything here is plain numpy but QUASI_RANDOM's shuffle within windows (:func:`window_order`,
compiled, a counting sort of the windows and a sort of each window's keys: NumPy's ``lexsort`` of
the whole epoch took longer per batch than many workers take to make a batch of small images).
:class:`EpochsAhead` computes the next epoch's batches on a helper thread while the current
epoch runs, so that an epoch starts without its permutation on the consumer's critical path.
"""

from __future__ import annotations

import concurrent.futures
import enum
import operator
from collections.abc import Callable, Sequence

import numpy as np
from numba import njit

from ffload.errors import ConfigurationError


class OrderOption(enum.Enum):
    """The traversal orders (FFCV's ``ffcv.loader.OrderOption`` names)."""

    SEQUENTIAL = "sequential"
    RANDOM = "random"
    QUASI_RANDOM = "quasi_random"


def parse_order(order: str | OrderOption) -> OrderOption:
    """Accept an :class:`OrderOption` or its name (``'random'``, ``'RANDOM'``, ...).

    Raises:
        ffload.errors.ConfigurationError: unknown order name or type.
    """
    if isinstance(order, OrderOption):
        return order
    if isinstance(order, str):
        key = order.strip().lower()
        for option in OrderOption:
            if option.value == key:
                return option
    choices = ", ".join(repr(o.value) for o in OrderOption)
    raise ConfigurationError(f"unknown order {order!r}; use one of {choices} or an ffload.OrderOption")


class TraversalOrder:
    """Base class: the order of the samples of one epoch (before the distributed split).

    Args:
        indices: ``(M,) int64`` sample ids the epochs visit (a subset of the dataset, possibly
            with repeats), already validated against the dataset size.
        seed: non-negative int, the loader's seed.
    """

    def __init__(self, indices: np.ndarray, seed: int):
        self.indices = indices
        self.seed = int(seed)

    def sample_order(self, epoch: int) -> np.ndarray:
        """The ``(M,) int64`` sample ids of ``epoch`` in visiting order (deterministic)."""
        raise NotImplementedError


class Sequential(TraversalOrder):
    """The indices in the given order, the same every epoch (FFCV ``Sequential``)."""

    def sample_order(self, epoch: int) -> np.ndarray:
        return self.indices.copy()


class Random(TraversalOrder):
    """A uniform permutation of the indices per epoch from ``default_rng([seed, epoch, 0])``.

    The same ``(seed, epoch)`` gives the same permutation on every rank and in every process.
    """

    def sample_order(self, epoch: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, int(epoch), 0])
        return rng.permutation(self.indices)


@njit(nogil=True, cache=True)
def window_order(window, keys):
    """The positions ``0 .. n-1`` ordered by ``window`` (``(n,) int64``, values ``>= 0``), then
    by ``keys`` (``(n,) float64``), then by position: ``np.lexsort((keys, window))``, in linear
    time for the windows (a counting sort) and a sort of each window's keys alone."""
    n = window.shape[0]
    starts = np.zeros(window.max() + 2 if n else 1, np.int64)
    for i in range(n):
        starts[window[i] + 1] += 1
    for w in range(1, starts.shape[0]):
        starts[w] += starts[w - 1]
    fill = starts[:-1].copy()
    positions = np.empty(n, np.int64)
    for i in range(n):
        positions[fill[window[i]]] = i
        fill[window[i]] += 1
    for w in range(starts.shape[0] - 1):
        segment = positions[starts[w] : starts[w + 1]]
        segment[:] = segment[np.argsort(keys[segment], kind="mergesort")]
    return positions


class QuasiRandom(TraversalOrder):
    """A page-aware shuffle: shuffled pages, grouped into windows, shuffled within windows.

    Per epoch (rng ``default_rng([seed, epoch, 1])``): the distinct pages of the samples are put in
    a random order and laid out one after the other; window ``k`` holds the pages whose first
    sample lands in positions ``[k * window_size, (k + 1) * window_size)`` of that layout (a page
    is never split); the samples of each window are then shuffled. A window therefore spans about
    ``window_size`` samples from a few pages, and a batch of ``batch_size <= window_size / 2``
    consecutive samples reads the pages of one or two windows instead of ``batch_size`` pages.
    Samples without a payload (page ``-1``) count as pages of their own, so they are shuffled
    like :class:`Random` samples.

    Args:
        indices, seed: see :class:`TraversalOrder`.
        sample_pages: ``(N,) int64`` page of each dataset sample (``DatasetView.sample_pages``).
        window_size: samples per window, at least 1; the loader uses
            ``max(2 * batch_size * world_size, 4 * mean samples per page)``.

    Raises:
        ffload.errors.ConfigurationError: ``window_size < 1``.
    """

    def __init__(self, indices: np.ndarray, seed: int, sample_pages: np.ndarray, window_size: int):
        super().__init__(indices, seed)
        if window_size < 1:
            raise ConfigurationError(f"window_size must be >= 1, got {window_size}")
        self.window_size = int(window_size)
        pages = np.asarray(sample_pages, dtype=np.int64)[indices]
        no_page = pages < 0
        # Samples without a payload become single-sample pseudo pages after the real ones.
        pages = pages.copy()
        pages[no_page] = pages.max(initial=-1) + 1 + np.arange(int(no_page.sum()))
        _, self._page_of = np.unique(pages, return_inverse=True)  # dense page id per position
        self._num_pages = int(self._page_of.max(initial=-1)) + 1
        window_order(np.zeros(1, np.int64), np.zeros(1))  # compiled here, not on the epochs' helper thread

    def sample_order(self, epoch: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, int(epoch), 1])
        page_rank = rng.permutation(self._num_pages)[self._page_of]  # shuffled page position
        counts = np.bincount(page_rank, minlength=self._num_pages)
        start_of_rank = np.cumsum(counts) - counts  # samples before each page in the walk
        window = (start_of_rank // self.window_size)[page_rank]
        # Windows in walk order, samples shuffled inside each window.
        positions = window_order(window.astype(np.int64, copy=False), rng.random(len(window)))
        return self.indices[positions]


def make_order(
    option: OrderOption, indices: np.ndarray, seed: int, sample_pages: np.ndarray | None = None, window_size: int = 1
) -> TraversalOrder:
    """Build the :class:`TraversalOrder` for ``option`` (``sample_pages``/``window_size`` are
    used by ``QUASI_RANDOM`` only)."""
    if option is OrderOption.SEQUENTIAL:
        return Sequential(indices, seed)
    if option is OrderOption.RANDOM:
        return Random(indices, seed)
    return QuasiRandom(indices, seed, sample_pages, window_size)


def distributed_split(order: np.ndarray, rank: int, world_size: int, drop_last: bool) -> np.ndarray:
    """This rank's share of an epoch order, as ``torch.utils.data.DistributedSampler``.

    Args:
        order: ``(M,) int64`` the epoch order (identical on every rank).
        rank, world_size: ``0 <= rank < world_size``.
        drop_last: truncate to ``(M // world_size) * world_size`` samples instead of padding to
            ``ceil(M / world_size) * world_size`` by repeating the order from its start.

    Returns:
        ``(M_r,) int64`` ``padded[rank::world_size]``; every rank gets the same count.
    """
    n = len(order)
    if drop_last:
        total = (n // world_size) * world_size
        padded = order[:total]
    else:
        total = -(-n // world_size) * world_size
        padded = np.resize(order, total)  # repeats the order from its start
    return padded[rank:total:world_size]


def samples_per_rank(num_indices: int, world_size: int, drop_last: bool) -> int:
    """Number of samples each rank visits per epoch (see :func:`distributed_split`)."""
    if drop_last:
        return num_indices // world_size
    return -(-num_indices // world_size)


class EpochBatches(Sequence):
    """An epoch's batches: its order's consecutive ``batch_size`` views (``(B,) int64`` sample
    ids each; the last may be shorter), with the order kept. A view is made when it is asked
    for, not for every batch when the epoch starts: a job reads its rows as one view
    (:meth:`rows`), and only a cold file's read-ahead and the page pool's sizing read batches one
    by one. Making every view ran under the GIL on the ``ffload-order`` thread each epoch, time
    in which no worker's Python can run.

    Args:
        order: the epoch's ``(M,) int64`` C-contiguous sample ids (:meth:`Loader.epoch_order`).
        batch_size: samples per batch, ``>= 1``.
    """

    __slots__ = ("order", "batch_size", "_count")

    def __init__(self, order: np.ndarray, batch_size: int):
        self.order, self.batch_size = order, int(batch_size)
        self._count = -(-len(order) // self.batch_size)

    def __len__(self) -> int:
        return self._count

    def __getitem__(self, k):
        """Batch ``k`` (negative counts from the end), a ``(B,) int64`` view of the order; a slice
        gives a list of them. Raises IndexError for ``k`` out of range."""
        if isinstance(k, slice):
            return [self[i] for i in range(*k.indices(self._count))]
        k = operator.index(k)
        if k < 0:
            k += self._count
        if not 0 <= k < self._count:
            raise IndexError(f"batch {k} of an epoch of {self._count}")
        size = self.batch_size
        return self.order[k * size : (k + 1) * size]

    def rows(self, first: int, stop: int) -> tuple[np.ndarray, list[int]]:
        """Batches ``first`` to ``stop - 1`` (``0 <= first < stop <= len(self)``): their sample ids
        as one ``(n,) int64`` view of the order, and each batch's length."""
        size = self.batch_size
        lengths = [size] * (stop - first)
        end = min(stop * size, len(self.order))
        lengths[-1] = end - (stop - 1) * size
        return self.order[first * size : end], lengths


class EpochsAhead:
    """An epoch's batches computed one epoch ahead, on a helper thread.

    Starting an epoch takes its order (a permutation of ``M`` ids: about 1-2 ms per 100,000 on
    one core, QUASI_RANDOM's about 6 ms per 100,000) and its batch list. Done in
    ``iter(loader)``, that is time in which no worker has a job: the previous epoch's jobs have
    drained and the new ones wait for the order. The loader asks for epoch ``e + 1`` as epoch
    ``e`` starts (:meth:`prepare`), so it is computed while the workers run that epoch, on one
    thread named ``ffload-order`` (started on first use); at the first epoch, before any job has
    run, on the calling thread instead (QUASI_RANDOM's shuffle is compiled code, which must not
    run while the first job loads the pipelines' kernels: :mod:`ffload.loaders.iterator`). ``compute`` (``epoch -> batches``, the loader's
    :class:`EpochBatches`) must be a pure function of the epoch, so the result is
    the same as computing it when asked. It is passed to each call rather than kept: this object
    belongs to the loader, and holding the loader's method would make a reference cycle that
    keeps an abandoned loader's threads alive until the garbage collector runs.
    """

    def __init__(self):
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._pending: tuple[int, concurrent.futures.Future] | None = None

    def prepare(self, epoch: int, compute: Callable[[int], Sequence], now: bool = False) -> None:
        """Start computing ``compute(epoch)`` (replacing a prepared other epoch), or with ``now``
        compute it on the calling thread (what it raises is kept for :meth:`get`). Without a
        thread to run it (interpreter shutdown), nothing is prepared: :meth:`get` computes it."""
        if self._pending is not None:
            if self._pending[0] == epoch:
                return
            self._pending[1].cancel()
            self._pending = None
        if now:
            future: concurrent.futures.Future = concurrent.futures.Future()
            try:
                future.set_result(compute(epoch))
            except Exception as e:
                future.set_exception(e)
            self._pending = (epoch, future)
            return
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(1, "ffload-order")
        try:
            self._pending = (epoch, self._pool.submit(compute, epoch))
        except RuntimeError:  # "cannot schedule new futures after (interpreter) shutdown"
            pass

    def ready(self, epoch: int) -> Sequence | None:
        """``epoch``'s prepared batches if they are computed (the same object :meth:`get` then
        returns), else None: not asked for, still running, or failed (:meth:`get` raises it)."""
        pending = self._pending
        if pending is None or pending[0] != epoch or not pending[1].done() or pending[1].cancelled():
            return None
        return None if pending[1].exception() is not None else pending[1].result()

    def get(self, epoch: int, compute: Callable[[int], Sequence]) -> Sequence:
        """``epoch``'s batches: the prepared ones when :meth:`prepare` asked for this epoch
        (waiting for them if needed), else ``compute(epoch)`` now. What ``compute`` raised is
        raised."""
        pending, self._pending = self._pending, None
        if pending is not None:
            if pending[0] == epoch:
                return pending[1].result()
            pending[1].cancel()  # not needed (unless it already runs)
        return compute(epoch)

    def close(self, wait: bool = True) -> None:
        """Drop what was prepared and stop the thread (joined with ``wait``); later calls start
        a new one."""
        self._pending = None
        if self._pool is not None:
            self._pool.shutdown(wait=wait, cancel_futures=True)
            self._pool = None
