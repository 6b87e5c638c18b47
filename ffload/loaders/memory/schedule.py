"""The epoch's schedule and the page/block arithmetic every memory manager shares.

A payload is the byte range ``[ptr, ptr + size)`` of one sample's field in the data region; a
*unit* is a fixed-size byte range of that region (a kernel page, a process-cache block, a
``.beton`` page). The helpers here turn a batch's payloads into the sorted units they span, and
:class:`EpochSchedule` records, for a whole epoch, which batches use each unit, so that the
caches evict the unit whose next use is furthest (Belady's rule) and the read-ahead requests
exactly what a batch will read.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numba import njit

NEVER = np.iinfo(np.int64).max
"""The next use (:meth:`EpochSchedule.next_use`) of a unit that no scheduled batch needs."""

LATER_EPOCH = NEVER
"""The batch number a job of a later epoch than the scheduled one passes to ``prepare`` (the next
epoch's first jobs, submitted while this epoch's last ones run): after every scheduled batch, so
its room is made from the units this epoch no longer needs first, and the batches still to come
keep theirs (:meth:`EpochSchedule.next_use` counts from the oldest unprepared batch)."""


def sorted_unique(values: np.ndarray) -> np.ndarray:
    """The sorted distinct values of a 1-D integer array: ``np.unique`` without its hash table
    (NumPy 2.4's ``np.unique`` hashes integers before sorting the result, far slower than a sort
    on an epoch's millions of block uses; see ``docs/developer-notes.md``)."""
    values = np.sort(values, axis=None)
    keep = np.ones(values.size, dtype=bool)
    np.not_equal(values[1:], values[:-1], out=keep[1:])
    return values[keep]


def payload_columns(view, field_names: Sequence[str]) -> list[tuple[np.ndarray, np.ndarray]]:
    """``[(ptrs, sizes), ...]`` of the listed fields that have payloads (``(N,) uint64`` each)."""
    return [(view.ptrs[n], view.sizes[n]) for n in field_names if n in view.ptrs]


@njit(nogil=True, cache=True)
def spanned_units(indices, ptrs, sizes, unit):
    """``(U,) int64`` the unit numbers (``offset // unit``) the payloads ``[ptrs[s], ptrs[s] +
    sizes[s])`` of the samples ``indices`` (``(B,) int64``) span, payload by payload (unsorted,
    repeats kept; empty payloads span none); ``ptrs``, ``sizes``: ``(N,) uint64`` bytes. Raises
    IndexError for an id outside ``[0, N)``. :func:`_epoch_uses` with the samples as one batch."""
    bounds = np.zeros(2, np.int64)
    bounds[1] = indices.shape[0]
    return _epoch_uses(indices, bounds, ptrs, sizes, unit)


@njit(nogil=True, cache=True)
def sort_unique(values):
    """Sort the 1-D ``int64`` array ``values`` in place and move its distinct values to the front;
    returns their count (``values[:count]`` is :func:`~.schedule.sorted_unique` of the input)."""
    values.sort()
    n = 0
    for i in range(values.shape[0]):
        if n == 0 or values[i] != values[n - 1]:
            values[n] = values[i]
            n += 1
    return n


def batch_blocks(columns, indices: np.ndarray, block: int) -> np.ndarray:
    """``(P,) int64`` sorted block numbers spanned by the payloads of samples ``indices`` (``(B,)
    int64``) in the columns ``[(ptrs, sizes), ...]``: compiled calls without the GIL
    (:func:`spanned_units`, :func:`sort_unique`), which every worker makes per job and the
    read-ahead per batch; NumPy's gathers and repeats held the GIL about as long as a small-image
    batch's decoding. Raises TypeError for ids that are not integers, IndexError for one out of
    range."""
    if not columns:
        return np.zeros(0, np.int64)
    indices = np.asarray(indices)
    if indices.dtype.kind not in "iu":
        raise TypeError(f"sample ids must be integers, got {indices.dtype}")
    indices = np.ascontiguousarray(indices, dtype=np.int64)
    parts = [spanned_units(indices, p, s, block) for p, s in columns]
    units = parts[0] if len(parts) == 1 else np.concatenate(parts)  # one sort for all fields
    return units[: sort_unique(units)]


@njit(nogil=True, cache=True)
def _epoch_uses(samples, bounds, ptrs, sizes, unit):
    """``(U,) int64`` one ``unit_number * nb + b`` per unit that a payload of batch ``b`` spans
    (repeats kept), batch ``b`` being ``samples[bounds[b]:bounds[b + 1]]`` and ``nb`` the
    ``bounds.size - 1`` batches; ``ptrs``, ``sizes``: ``(N,) uint64`` bytes. Raises IndexError for
    an id outside ``[0, N)``."""
    nb = bounds.shape[0] - 1
    n = 0
    for i in range(samples.shape[0]):
        s = samples[i]
        if s < 0 or s >= sizes.shape[0]:
            raise IndexError("sample id out of range")
        size = np.int64(sizes[s])
        if size > 0:
            p = np.int64(ptrs[s])
            n += (p + size - 1) // unit - p // unit + 1
    out = np.empty(n, np.int64)
    k = 0
    for b in range(nb):
        for i in range(bounds[b], bounds[b + 1]):
            s = samples[i]
            size = np.int64(sizes[s])
            if size > 0:
                p = np.int64(ptrs[s])
                for u in range(p // unit, (p + size - 1) // unit + 1):
                    out[k] = u * nb + b
                    k += 1
    return out


@njit(nogil=True, cache=True)
def first_use(starts, uses, unit, low):
    """The first of unit ``unit``'s scheduled batches (``uses[starts[unit]:starts[unit + 1]]``,
    ascending; the schedule's CSR arrays, :meth:`EpochSchedule.uses`) that is ``>= low``, or
    :data:`NEVER` when there is none."""
    if unit + 1 < starts.shape[0]:
        for k in range(starts[unit], starts[unit + 1]):
            if uses[k] >= low:
                return np.int64(uses[k])
    return NEVER


@njit(nogil=True, cache=True)
def _next_uses(units, starts, batches, low, out):
    """``out[i]``: the first of unit ``units[i]``'s batches (``batches[starts[u]:starts[u + 1]]``,
    ascending) that is ``>= low``; left as is when there is none (:func:`first_use`)."""
    for i in range(units.shape[0]):
        use = first_use(starts, batches, units[i], low)
        if use != NEVER:
            out[i] = use


class EpochSchedule:
    """When each cache unit (a byte range of ``unit`` bytes of the data file) is next needed in
    the epoch: the eviction order of the process caches (Belady's rule: the furthest next use,
    never-again first). Not thread-safe: its owner calls it under its own lock.

    "Next use" counts from the oldest batch not yet prepared, not from the batch asking for
    room: workers run batches out of order, and a unit a slower worker's earlier batch still
    needs must not look free.

    Args:
        columns: ``[(ptrs, sizes), ...]`` of the decoded fields (:func:`payload_columns`).
        unit: bytes per unit (the cache's block or page).
    """

    def __init__(self, columns, unit: int):
        self._columns, self._unit = columns, unit
        # the epoch's uses by unit (CSR): unit u is used by batches _batches[_starts[u]:_starts[u + 1]]
        # (ascending); units past the end of _starts by none
        self._starts = np.zeros(1, np.int64)
        self._batches = np.zeros(0, np.int64)
        self._prepared = np.zeros(0, dtype=bool)  # batches of the epoch whose units were pinned
        self._low = 0  # the first batch not prepared yet: units it or later batches need are in use

    def set(self, batches: Sequence[np.ndarray], start: int, list_uses: bool = True) -> None:
        """A new epoch: ``batches`` (each ``(B,) int64`` sample ids; an
        :class:`~ffload.loaders.orders.EpochBatches` is read through its order, without a copy),
        ``start`` onwards to come. Runs on the consumer's thread at each ``iter(loader)``: the
        units are listed by a compiled call without the GIL (:func:`_epoch_uses`) and sorted by
        NumPy, which lets the GIL go while it sorts. With ``list_uses=False`` (a cache that holds the
        whole file and never evicts) the batches are tracked (:meth:`prepared`) but no unit's
        uses are listed: every :meth:`next_use` is :data:`NEVER`."""
        nb = len(batches)
        uses = np.zeros(0, np.int64)
        if nb and self._columns and list_uses:
            order = getattr(batches, "order", None)
            if order is None:
                samples = np.concatenate(batches).astype(np.int64, copy=False)
                bounds = np.concatenate([[0], np.cumsum([len(b) for b in batches])]).astype(np.int64)
            else:  # consecutive batch_size views of the order (the last may be shorter)
                samples = order
                bounds = np.minimum(np.arange(nb + 1, dtype=np.int64) * batches.batch_size, order.size)
            uses = sorted_unique(
                np.concatenate([_epoch_uses(samples, bounds, p, s, self._unit) for p, s in self._columns])
            )
        unit_of = uses // max(nb, 1)
        index = np.int32 if uses.size < 2**31 else np.int64  # 4 bytes per block and use
        self._starts = np.zeros(int(unit_of[-1]) + 2 if uses.size else 1, index)
        np.cumsum(np.bincount(unit_of), out=self._starts[1:])
        self._batches = (uses - unit_of * nb).astype(index)
        self._prepared = np.zeros(nb, dtype=bool)
        self._prepared[:start] = True
        self._low = min(start, nb)

    def prepared(self, batch: int | None, batches: int = 1) -> None:
        """The units of batches ``batch`` to ``batch + batches - 1`` (a job's) are pinned
        (``None``: batches outside the schedule)."""
        if batch is not None:
            self._prepared[max(0, batch) : max(0, batch + batches)] = True
            while self._low < self._prepared.size and self._prepared[self._low]:
                self._low += 1

    @staticmethod
    def compile() -> None:
        """Compile (or load from numba's cache) :meth:`next_use`'s kernel for both index types of
        the schedule, on the calling thread: a cache calls it while constructed, so that no worker
        or IO thread compiles it while others run compiled code (see
        :class:`~ffload.loaders.memory.readahead.ReadAhead`)."""
        none = np.zeros(0, np.int64)
        for index in (np.int32, np.int64):
            _next_uses(none, np.zeros(1, index), np.zeros(0, index), 0, none)

    def uses(self, batch: int | None) -> tuple[np.ndarray, np.ndarray, int]:
        """``(starts, uses, low)``: unit ``u``'s scheduled batches are ``uses[starts[u]:starts[u +
        1]]`` (ascending; ``int32``, or ``int64`` past 2**31 uses), and its next use the first of them
        ``>= low`` (``min(batch, oldest unprepared)``), for compiled callers. Without a schedule or
        ``batch`` (``None``), no unit has a next use."""
        if batch is None or not self._batches.size:
            return self._starts[:1], self._batches[:0], 0
        return self._starts, self._batches, min(batch, self._low)

    def next_use(self, units: np.ndarray, batch: int | None) -> np.ndarray:
        """``(C,) int64`` the first scheduled batch ``>= min(batch, oldest unprepared)`` using
        each of ``units`` (``(C,) int64``; :data:`NEVER` when none, or without a schedule)."""
        out = np.full(units.size, NEVER, np.int64)
        if batch is not None and self._batches.size:
            _next_uses(units, self._starts, self._batches, min(batch, self._low), out)
        return out
