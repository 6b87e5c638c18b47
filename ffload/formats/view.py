"""The one view of a dataset that the loader sees, whichever container holds it."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ffload.errors import ConfigurationError, DatasetError
from ffload.formats.fields.base import Field
from ffload.formats.shardio import map_file, map_shards
from ffload.system import path_bytes


def dataset_error(path: str, cause: str) -> DatasetError:
    """``DatasetError("<path>: <cause>", path=path)`` (``DatasetError`` is ``ffload.errors.FormatError``)."""
    return DatasetError(f"{path}: {cause}", path=path)


def check_field_values(path: str, fields: dict[str, Field], metadata: np.ndarray) -> None:
    """Run every field's :meth:`~.fields.Field.check_values` on its metadata column (open time):
    DatasetError naming the field when its values cannot be its type's (a flipped type id)."""
    for name, f in fields.items():
        problem = f.check_values(metadata[name])
        if problem:
            raise dataset_error(path, f"field {name!r} ({type(f).__name__}): {problem}")


@dataclass
class DatasetView:
    """A dataset opened for reading: per-sample metadata plus payload offsets into one data file.

    Attributes:
        path: what was opened (a ``.beton`` file or an LMDB directory).
        format: ``'beton'`` or ``'lmdb'``.
        num_samples: number of samples N.
        fields: field name -> :class:`Field`, in field order.
        metadata: ``(N,)`` structured array; ``metadata[name]`` is that field's column (pointer
            sub-fields hold absolute offsets into ``data_path``).
        ptrs: field name -> ``(N,) uint64`` absolute byte offsets of payloads in ``data_path``
            (fields with payloads only).
        sizes: field name -> ``(N,) uint64`` payload sizes in bytes. Every ``ptr + size`` was
            checked to be ``<= data_size`` at open, so compiled code may index without checks.
        data_path: the file the offsets index (the ``.beton`` itself, LMDB's ``data.mdb``), or
            ``None`` when payloads live in ``memory`` (LMDB without a visible memory map).
        data_size: bytes in the data file (or in ``memory``).
        page_size: bytes; the ``.beton`` page size, for LMDB the process-cache granularity.
        memory: the payload bytes held in process memory when ``data_path`` is None.
        snapshot: what keeps the offsets valid while the view lives (LMDB: an open read
            transaction, so that concurrent writers do not reuse its pages), or None.
        info: the dataset-level JSON object its writer stored (``info["classes"]``: class names
            indexed by label, when the source had them); ``{}`` when none (e.g. ffcv's files).
        remote: for a ``.beton`` on object storage (``path`` is its URL), the
            :class:`ffload.storage.RemoteObject` its payloads are read from (by the Loader's page
            cache, :mod:`ffload.loaders.memory.pagepool`); ``data_path`` and ``memory`` are then None.
            For a remote sharded dataset, a :class:`~.shardio.ShardedRemote` (same interface).
        shards: for a sharded dataset (``format == 'shards'``, :mod:`.shards`), the
            :class:`~.shardio.ShardLayout` of its shards in the virtual data region the offsets
            index (``data_path`` is then None); None otherwise.
        selection: ``(M,) int64`` dataset indices, the only samples that will be read through
            this view (a Loader's ``indices``, one sample to decode alone), or None for all.
            The arrays above still hold every sample (batches index them by dataset index);
            a pipeline's declare-time checks look at :meth:`selected` only.
        origin_blocks: for a ``.beton`` (one entry) or a sharded dataset (one per shard), where
            each file's origin block would start and the byte it must end by, ``(offset, limit)``
            in that file (:mod:`.origins`; found at open, so that reading the origins needs no
            header), or None for a file without an info block (then it has no origin block);
            None for LMDB.
    """

    path: str
    format: str
    num_samples: int
    fields: dict[str, Field]
    metadata: np.ndarray
    ptrs: dict[str, np.ndarray]
    sizes: dict[str, np.ndarray]
    data_path: str | None
    data_size: int
    page_size: int
    memory: np.ndarray | None = None
    snapshot: object | None = None
    info: dict = field(default_factory=dict)
    remote: object | None = None
    shards: object | None = None
    selection: np.ndarray | None = None
    origin_blocks: list[tuple[int, int] | None] | None = None

    def selected(self) -> np.ndarray:
        """``(M,) int64``: the dataset indices that will be read, :attr:`selection` or every sample
        ``0..N-1``."""
        if self.selection is None:
            return np.arange(self.num_samples, dtype=np.int64)
        return np.asarray(self.selection, dtype=np.int64)

    @property
    def sample_pages(self) -> np.ndarray:
        """``(N,) int64``: the page (``ptr // page_size``) holding each sample's first payload,
        -1 for samples without payloads (used by the quasi-random order and the process cache)."""
        if not self.ptrs:
            return np.full(self.num_samples, -1, dtype=np.int64)
        first = np.min(np.stack(list(self.ptrs.values())), axis=0)
        return (first // np.uint64(self.page_size)).astype(np.int64)

    def open_region(self) -> np.ndarray:
        """A read-only ``uint8`` 1-D view of the data file, memory-mapped so that the OS page
        cache serves it (several processes share one copy; :func:`~.shardio.map_file`), or the
        in-memory payloads. For a sharded dataset every shard mapped into one contiguous range
        (:func:`~.shardio.map_shards`). A mapped file that shrinks while it is read does not kill
        the process (SIGBUS) on Linux: the lost bytes read as zeros and
        :func:`~.shardio.check_mapping` of the region raises FormatError naming the file; readers
        call it before they hand on what they read.

        Raises:
            OSError: the file or a shard cannot be mapped (named).
            ConfigurationError: a remote dataset (its payloads are read through ``ffload.Loader``'s
                page cache, not mapped).
        """
        if self.remote is not None:
            raise ConfigurationError(
                f"{self.path}: a dataset on object storage is read through ffload.Loader "
                "(its page cache); download it to map it",
                path=self.path,
            )
        if self.shards is not None:
            return map_shards(self.shards)
        if self.data_path is None:
            return self.memory
        if self.data_size == 0:
            return np.zeros(0, dtype=np.uint8)
        return map_file(self.data_path, self.data_size)

    def payload(self, name: str, index: int, region: np.ndarray | None = None) -> np.ndarray:
        """The raw payload bytes of field ``name`` of sample ``index`` (a view when possible)."""
        region = self.open_region() if region is None else region
        p, s = int(self.ptrs[name][index]), int(self.sizes[name][index])
        return region[p : p + s]

    def file_bytes(self) -> int:
        """Total bytes on disk (the .beton file, or the LMDB directory's files; a remote object's
        size; a sharded dataset's shards)."""
        if self.shards is not None:
            return int(self.shards.sizes.sum())
        if self.remote is not None:
            return int(self.data_size)
        return path_bytes(self.path)
