"""``os_cache=True``: the data file memory-mapped read-only (FFCV's ``os_cache``).

:class:`OSCacheMemory`'s ``region`` is a read-only memory map of the data file; the kernel's page
cache serves (and shares across processes) the bytes, so there is nothing to read, pin or evict.
A sharded dataset (``ffload.formats.shards``) is mapped as one contiguous region of all its
shards. Its real work is keeping a file that shrinks under the loader an error rather than a
SIGBUS (see the class). The hooks it implements are those of
:class:`~ffload.loaders.memory.base.MemoryManager`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ffload.formats.shardio import mapping_of, open_data_files


class OSCacheMemory:
    """``os_cache=True``: the data file memory-mapped read-only (``view.open_region()``).

    A mapped file that another process truncates raises SIGBUS in whoever touches the lost pages,
    which would kill the training process. Two checks make it an error instead: before each
    batch's reads :meth:`prepare` checks the file's size (one ``fstat``) and refuses a file that
    shrank, so a dataset truncated between batches is never touched; a truncation *during* a
    batch's reads is caught by the mapping's SIGBUS guard (:mod:`ffload.formats.mapguard`: the
    lost pages read as zeros and the mapping is marked), and :meth:`check`, which the worker calls
    after the batch's reads and before the batch is handed on, raises. Either way the epoch ends
    with a :class:`LoaderError` whose cause names the file and how it shrank, and no zero byte
    reaches the user. Where the guard is not available (not Linux x86-64/aarch64) the
    during-a-batch window (milliseconds) still kills the process. ffload's own writers never
    truncate in place (they replace files atomically).

    Args:
        view: the :class:`ffload.formats.DatasetView`.
    """

    def __init__(self, view):
        self.region, self.ptrs = view.open_region(), view.ptrs
        self._mapping = mapping_of(self.region)  # its guard's record, asked after each job's reads
        self.path, self.data_size = view.data_path or view.path, int(view.data_size)
        self._files = open_data_files(view)
        self._sharded = view.shards is not None

    def prepare(self, indices: np.ndarray, batch: int | None = None, batches: int = 1) -> None:
        """Check that the file (for a sharded dataset: the shards the batch's payloads lie in)
        still holds the mapped bytes (the page cache faults them in as the decoders read them).
        Raises FormatError naming the file when it shrank."""
        if self._files is not None:
            self._files.check_size(self._files.shards_of(indices) if self._sharded else None)

    def check(self, indices: np.ndarray) -> None:
        """After the reads of a batch of samples ``indices`` (``(B,) int64``): raise FormatError
        naming the file when a read found no data (the file shrank during the reads; what was read
        there is zeros: the mapping's guard recorded the fault) or the file is shorter now than
        the mapped bytes (:meth:`prepare`): a file rewritten in place (``cp`` over it, opened
        with ``O_TRUNC``) shows its new bytes below its new end without a fault."""
        mapping = self._mapping
        if mapping is not None:
            mapping.check()
        self.prepare(indices)

    def schedule(self, batches: Sequence[np.ndarray], start: int = 0) -> None:
        """Nothing to do (see :meth:`prepare`)."""

    def release(self, lease) -> None:
        """Nothing to do (see :meth:`prepare`)."""

    def close(self) -> None:
        """Drop the mapping (unmapped once no batch references it)."""
        self.region = self._mapping = None
        if self._files is not None:
            self._files.close()
            self._files = None
