"""What a memory manager is: the hooks the loader, its workers and the read-ahead call on it.

A memory manager owns the ``uint8`` region the decoders read payloads from (FFCV's
``memory_managers/base.py``). The Loader (:mod:`ffload.loaders.loader`) builds one per loader,
calls :meth:`MemoryManager.schedule` at the start of every epoch and :meth:`MemoryManager.close`
once; each worker (:class:`ffload.loaders.iterator.BatchRunner`) calls ``prepare`` before a
batch's reads, ``check`` after them and ``release`` once the decoders have copied the payloads
out; the decoders index ``region`` with ``ptrs``. Three managers implement it:
:class:`~ffload.loaders.memory.os_cache.OSCacheMemory`,
:class:`~ffload.loaders.memory.process_cache.ProcessCacheMemory` and
:class:`~ffload.loaders.memory.pagepool.PagePoolMemory` (which also has ``prefetch``, for
:class:`~ffload.loaders.memory.readahead.PagePoolReadAhead`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class MemoryManager(Protocol):
    """The contract between the loader and where a batch's bytes come from.

    Attributes:
        region: ``(R,) uint8``, the bytes the decoders read payloads from (the data region itself,
            or a cache indexed like it, or a pool of page slots); ``None`` after :meth:`close`.
        ptrs: field name -> ``(N,) uint64`` byte offsets of each sample's payload in ``region``
            (``DatasetView.ptrs``, or the page pool's translation of them, valid for the samples of
            a batch while it is prepared and not released).
    """

    region: np.ndarray | None
    ptrs: Mapping[str, np.ndarray]

    def schedule(self, batches: Sequence[np.ndarray], start: int = 0) -> None:
        """A new epoch: its batches (each ``(B,) int64`` sample ids), of which ``start`` onwards
        will be prepared; a cache evicts by it (the furthest next use first)."""

    def prepare(self, indices: np.ndarray, batch: int | None = None, batches: int = 1) -> Any:
        """Before a job's reads: make the payloads of samples ``indices`` (``(B,) int64``: one
        batch's, or the consecutive batches of a job, one after the other) readable in
        ``region`` and keep them so until :meth:`release`; returns the lease to pass to it.
        ``batch``: the (first) batch's number in the :meth:`schedule` (``None``: outside it);
        ``batches``: how many consecutive batches ``indices`` holds. May block while other jobs
        in progress hold the room it needs.

        Raises:
            OSError or FormatError: a read failed or the data file shrank (named).
        """

    def check(self, indices: np.ndarray) -> None:
        """After the batch's reads, before it is handed on: raise FormatError naming the file
        when the reads found no data (a file that shrank during them)."""

    def release(self, lease: Any) -> None:
        """The decoders are done with a batch: its payloads (the lease :meth:`prepare` returned)
        may be evicted."""

    def close(self) -> None:
        """Release the files and the memory (freed once no batch references ``region``);
        idempotent."""
