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


def spanned(ptrs: np.ndarray, sizes: np.ndarray, page_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Every (page, payload) pair of the payloads ``[ptr, ptr + size)``.

    Args:
        ptrs, sizes: ``(K,) uint64`` byte offsets and sizes (bytes); empty payloads touch nothing.
        page_size: bytes per page.

    Returns:
        ``(pages, owners)``: two ``(P,) int64`` arrays, the page numbers (``offset // page_size``)
        each payload touches and the position in ``ptrs`` of the payload touching it.
    """
    keep = np.flatnonzero(sizes > 0)
    ptrs = ptrs[keep].astype(np.int64)
    ends = ptrs + sizes[keep].astype(np.int64)
    first = ptrs // page_size
    counts = (ends - 1) // page_size - first + 1
    starts_in_output = np.cumsum(counts) - counts
    steps = np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(starts_in_output, counts)
    return np.repeat(first, counts) + steps, np.repeat(keep, counts)


def sorted_unique(values: np.ndarray) -> np.ndarray:
    """The sorted distinct values of a 1-D integer array: ``np.unique`` without its hash table
    (NumPy 2.4's ``np.unique`` hashes integers before sorting the result, far slower than a sort
    on an epoch's millions of block uses; see ``docs/developer-notes.md``)."""
    values = np.sort(values, axis=None)
    keep = np.ones(values.size, dtype=bool)
    np.not_equal(values[1:], values[:-1], out=keep[1:])
    return values[keep]


def pages_spanned(ptrs: np.ndarray, sizes: np.ndarray, page_size: int) -> np.ndarray:
    """``(P,) int64`` sorted unique pages touched by the payloads (see :func:`spanned`)."""
    return sorted_unique(spanned(ptrs, sizes, page_size)[0])


def payload_columns(view, field_names: Sequence[str]) -> list[tuple[np.ndarray, np.ndarray]]:
    """``[(ptrs, sizes), ...]`` of the listed fields that have payloads (``(N,) uint64`` each)."""
    return [(view.ptrs[n], view.sizes[n]) for n in field_names if n in view.ptrs]


def batch_blocks(columns, indices: np.ndarray, block: int) -> np.ndarray:
    """``(P,) int64`` sorted block numbers spanned by the payloads of samples ``indices``."""
    if not columns:
        return np.zeros(0, np.int64)
    return sorted_unique(
        np.concatenate([spanned(p[indices], s[indices], block)[0] for p, s in columns])
    )  # one sort for all fields


@njit(nogil=True, cache=True)
def _next_uses(units, starts, batches, low, out):
    """``out[i]``: the first of unit ``units[i]``'s batches (``batches[starts[u]:starts[u + 1]]``,
    ascending) that is ``>= low``; left as is when there is none."""
    for i in range(units.shape[0]):
        u = units[i]
        if u + 1 < starts.shape[0]:
            for k in range(starts[u], starts[u + 1]):
                if batches[k] >= low:
                    out[i] = batches[k]
                    break


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

    def set(self, batches: Sequence[np.ndarray], start: int) -> None:
        """A new epoch: ``batches`` (each ``(B,) int64`` sample ids), ``start`` onwards to come."""
        nb = len(batches)
        uses = np.zeros(0, np.int64)
        if nb and self._columns:
            samples = np.concatenate(batches)
            batch_of = np.repeat(np.arange(nb, dtype=np.int64), [len(b) for b in batches])
            uses = sorted_unique(
                np.concatenate(
                    [
                        units * nb + batch_of[owners]
                        for units, owners in (spanned(p[samples], s[samples], self._unit) for p, s in self._columns)
                    ]
                )
            )
        unit_of = uses // max(nb, 1)
        index = np.int32 if uses.size < 2**31 else np.int64  # 4 bytes per block and use
        self._starts = np.zeros(int(unit_of[-1]) + 2 if uses.size else 1, index)
        np.cumsum(np.bincount(unit_of), out=self._starts[1:])
        self._batches = (uses - unit_of * nb).astype(index)
        self._prepared = np.zeros(nb, dtype=bool)
        self._prepared[:start] = True
        self._low = min(start, nb)

    def prepared(self, batch: int | None) -> None:
        """Batch ``batch``'s units are pinned (``None``: a batch outside the schedule)."""
        if batch is not None and 0 <= batch < self._prepared.size:
            self._prepared[batch] = True
            while self._low < self._prepared.size and self._prepared[self._low]:
                self._low += 1

    def next_use(self, units: np.ndarray, batch: int | None) -> np.ndarray:
        """``(C,) int64`` the first scheduled batch ``>= min(batch, oldest unprepared)`` using
        each of ``units`` (``(C,) int64``; :data:`NEVER` when none, or without a schedule)."""
        out = np.full(units.size, NEVER, np.int64)
        if batch is not None and self._batches.size:
            _next_uses(units, self._starts, self._batches, min(batch, self._low), out)
        return out
