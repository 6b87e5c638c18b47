"""Writing an ffload LMDB database (the schema: :mod:`ffload.formats.lmdb`): :class:`LMDBWriter`, and
the JSON form of the record dtype that only the metadata record's writer needs."""

from __future__ import annotations

import json
import os

import numpy as np

from ffload.formats.fields.base import Field, named_metadata_dtype
from ffload.formats.lmdb.descriptors import field_specs
from ffload.formats.lmdb.layout import (
    FORMAT_NAME,
    META_KEY,
    PLACES_KEY,
    RECORDS_KEY,
    TABLE_KEYS,
    UNPLACED,
    VERSION,
    sample_key,
)
from ffload.formats.lmdb.mapping import address, lmdb_map_base
from ffload.formats.origins import ORIGINS_KEY, OriginLog
from ffload.formats.writer import DatasetWriter

__all__ = ["LMDBWriter"]


def _dtype_to_json(dt: np.dtype):
    """numpy's dict form of a record dtype (names, formats, offsets, itemsize) as JSON; nested
    records (packed, as the image record) become ``[[name, type], ...]`` lists."""
    if not dt.names:
        return dt.str
    fmts = [dt.fields[n][0] for n in dt.names]
    offsets = [dt.fields[n][1] for n in dt.names]
    packed = offsets == list(np.cumsum([0] + [f.itemsize for f in fmts[:-1]])) and dt.itemsize == sum(
        f.itemsize for f in fmts
    )
    if packed:
        return [[n, _dtype_to_json(f)] for n, f in zip(dt.names, fmts)]
    return {
        "names": list(dt.names),
        "formats": [_dtype_to_json(f) for f in fmts],
        "offsets": offsets,
        "itemsize": dt.itemsize,
    }


class LMDBWriter(DatasetWriter):
    """Writes samples, in index order, into a new LMDB environment directory at ``path`` (see
    :class:`~ffload.formats.writer.DatasetWriter` for the protocol: ``add`` in order, then ``close``).

    Args:
        path: directory to create (the caller renames it into place when complete).
        fields: name -> Field, in order.
        num_samples: at most this many samples will be added (fewer when inputs are skipped).
        txn_bytes: commit a write transaction every this many bytes (and at close).
        initial_map_size: bytes; LMDB's map size to start with (it doubles when full).
        info: dataset-level JSON object (see :class:`~ffload.formats.writer.DatasetWriter`), stored under
            ``"info"`` in the metadata record.

    The samples' origins (``add(..., origin=)``) are stored as one origin block
    (:mod:`ffload.formats.origins`) under :data:`~ffload.formats.origins.ORIGINS_KEY`, when any was given.
    """

    def __init__(
        self,
        path: str,
        fields: dict[str, Field],
        num_samples: int,
        txn_bytes: int = 64 << 20,
        initial_map_size: int = 64 << 20,
        info: dict | None = None,
    ):
        import lmdb

        super().__init__(path, fields, num_samples, info)
        self._lmdb = lmdb
        self.record_dtype = named_metadata_dtype(self.fields)
        self.map_size = int(initial_map_size)
        self.env = self._handle = lmdb.open(
            path, map_size=self.map_size, subdir=True, sync=False, metasync=False, readahead=False, max_dbs=0
        )
        self._pending: list = []
        self._pending_bytes = 0
        self._txn_bytes = txn_bytes
        self._records = bytearray()  # every value's record, end to end: the RECORDS_KEY value
        self._places = np.zeros((self.num_samples, 2), dtype="<u8")  # the PLACES_KEY value
        self.origins = OriginLog()

    def _write_sample(self, index, metas, payloads, origin):
        """One value: the record, then the payloads (offsets from the value's start)."""
        rec = np.zeros((), dtype=self.record_dtype)
        records = [rec[name] for name in self.fields]
        placed = self._lay_out(records, metas, payloads, self.record_dtype.itemsize)
        record = rec.tobytes()
        self._records += record
        self.origins.append(origin)
        value = b"".join([record] + [data for _, data in placed])
        self._pending.append((sample_key(index), value))
        self._pending_bytes += len(value)
        if self._pending_bytes >= self._txn_bytes:
            self._flush()

    def _put_all(self, items) -> None:
        while True:
            try:
                with self.env.begin(write=True) as txn:
                    for key, value in items:
                        last = key in TABLE_KEYS
                        txn.put(key, value, append=not last, overwrite=last)
                return
            except self._lmdb.MapFullError:
                self.map_size *= 2
                self.env.set_mapsize(self.map_size)

    def _flush(self) -> None:
        if self._pending:
            # grow ahead: LMDB needs room for the values plus page overhead
            need = self.env.info()["last_pgno"] * self.env.stat()["psize"] + 2 * self._pending_bytes
            while self.map_size < need:
                self.map_size *= 2
                self.env.set_mapsize(self.map_size)
            self._put_all(self._pending)
            self._place(int(self._pending[0][0]), len(self._pending))
        self._pending, self._pending_bytes = [], 0

    def _place(self, first: int, count: int) -> None:
        """Record where samples ``first .. first + count - 1``, just committed, lie in
        ``data.mdb``: ``(offset, length)`` from a read transaction's view of LMDB's map (their
        pages were just written: no disk read). Only values of at least one page are placed:
        LMDB keeps those in overflow pages of their own, which it never moves or rewrites while
        the value exists (copy-on-write touches only the tree's branch and leaf pages); smaller
        values may live in a leaf page that later writes copy elsewhere, so they are left
        :data:`UNPLACED` and found through LMDB at open."""
        psize = self.env.stat()["psize"]
        with self.env.begin(buffers=True) as txn:
            probe = txn.get(sample_key(first))
            base = lmdb_map_base(os.path.join(self.path, "data.mdb"), address(probe))
            for i in range(first, first + count):
                value = txn.get(sample_key(i))
                place = UNPLACED if base is None or len(value) < psize else address(value) - base
                self._places[i] = place, len(value)

    def _finalize(self) -> None:
        """Write the pending samples, the records and places tables and the metadata record;
        sync to disk."""
        self._flush()
        meta = {
            "format": FORMAT_NAME,
            "version": VERSION,
            "num_samples": self.count,
            "fields": field_specs(self.fields),
            "record_dtype": _dtype_to_json(self.record_dtype),
            "record_size": self.record_dtype.itemsize,
        }
        if self.info:
            meta["info"] = self.info
        tables = [
            (RECORDS_KEY, bytes(self._records)),
            (PLACES_KEY, self._places[: self.count].tobytes()),
            (META_KEY, json.dumps(meta).encode("utf8")),
        ]
        if self.origins.given:
            tables.append((ORIGINS_KEY, self.origins.block()))
        self._put_all(tables)
        self.env.sync(True)
