"""Reading an ffload LMDB database (the schema: :mod:`ffload.formats.lmdb`): :func:`open_lmdb` checks
the database in named steps (its B-tree, :mod:`.pages`; the metadata record; the records table; the
values' places) and builds the :class:`~ffload.formats.view.DatasetView` the loader reads;
:func:`read_origins_value` reads the samples' origin block."""

from __future__ import annotations

import json
import mmap
import os
import warnings

import numpy as np

from ffload.formats.fields.base import Field, named_metadata_dtype
from ffload.formats.lmdb.descriptors import fields_from_specs
from ffload.formats.lmdb.env import Snapshot, open_env, release_env
from ffload.formats.lmdb.layout import (
    FORMAT_NAME,
    META_KEY,
    PLACES_KEY,
    READABLE_VERSIONS,
    RECORDS_KEY,
    UNPLACED,
    sample_key,
)
from ffload.formats.lmdb.mapping import address, lmdb_map_base
from ffload.formats.lmdb.pages import check_tree
from ffload.formats.origins import ORIGINS_KEY
from ffload.formats.schema import Schema, Value, check_document
from ffload.formats.shardio import shrank
from ffload.formats.view import DatasetView, check_field_values, dataset_error

__all__ = ["open_lmdb", "read_origins_value", "PROCESS_CACHE_PAGE", "SPOT_CHECKS", "META_SCHEMA"]

PROCESS_CACHE_PAGE = 1 << 23
"""An LMDB view's nominal page size (bytes; ``data.mdb`` has no pages of its own at this scale):
the QUASI_RANDOM order's groups and the ``os_cache=False`` page pool's slots. The ``.beton``'s
default (FFCV's), so that both formats shuffle at the same granularity; and large against a
record, because each pool slot also reads the bytes by which records overhang its page (measured:
``docs/developer-notes.md``, ``ffload.formats.lmdb.reader``)."""
SPOT_CHECKS = 17
"""Placed values whose recorded place :func:`_placed_values` compares with LMDB's at open."""


def open_lmdb(path: str) -> DatasetView:
    """Open an ffload LMDB directory: validate the schema and build the offset table.

    Raises:
        DatasetError: not an LMDB environment, no/invalid metadata record, missing or malformed
            sample records, or ``data.mdb`` shrank while it was read (from the first record
            found on: LMDB's own map is guarded against SIGBUS, :mod:`ffload.formats.mapguard`,
            once its address is known).
    """
    import lmdb

    data_path = os.path.join(path, "data.mdb")
    if not os.path.isfile(data_path):
        raise dataset_error(path, "not an LMDB database (no data.mdb)")
    env, env_key = open_env(path)
    try:
        check_tree(path, data_path)  # LMDB trusts its pages: refuse any that would make it read outside the file
    except BaseException:
        release_env(env_key)
        raise
    # The read transaction stays open for the view's lifetime: LMDB then never reuses the pages
    # of this snapshot, so a process writing to the database meanwhile cannot change the bytes
    # the offsets below point at (with lock=False, on read-only media, nobody can write anyway).
    txn = env.begin(buffers=True)
    guard, data_size = None, 0
    try:
        probe = txn.get(META_KEY)
        base = None if probe is None else lmdb_map_base(data_path, address(probe))
        data_size = os.path.getsize(data_path)
        guard = _guard_map(env, base)
        view = _read_view(path, txn, data_path, data_size, base)
        _check_guard(guard, data_path, data_size)
    except BaseException as e:
        txn.abort()
        release_env(env_key)
        _check_guard(guard, data_path, data_size)  # the file shrank under LMDB: that explains e
        if isinstance(e, lmdb.Error):
            raise dataset_error(path, f"corrupt LMDB database ({type(e).__name__}: {e})") from e
        raise
    finally:
        if guard is not None:
            guard.close()  # after the open, only ffload's own mapping of data.mdb is read
    if base is None:  # everything was copied: the snapshot is not needed
        txn.abort()
        release_env(env_key)
    else:
        view.snapshot = Snapshot(env_key, env, txn)
    return view


def _guard_map(env, base: int | None):
    """LMDB's own map of ``data.mdb`` (at ``base``; None: not visible, nothing to guard) registered
    with :mod:`ffload.formats.mapguard`, so that a read past a shrunk end reads zeros instead of
    faulting; the guard (None where :func:`~ffload.formats.mapguard.register` gives none)."""
    if base is None:
        return None
    from ffload.formats import mapguard  # numba: imported when a database is first opened

    return mapguard.register(base, int(env.info()["map_size"]))


def _read_view(path: str, txn, data_path: str, data_size: int, base: int | None) -> DatasetView:
    """The steps of :func:`open_lmdb` inside its read transaction ``txn``: the metadata record, the
    records table (version 2), where each value lies (the places table, or a walk over the values),
    then the view, over ``data.mdb`` or (``base`` None) over a copy of the values."""
    meta, fields, rec_dtype = _read_meta(path, _get_inside(path, txn, META_KEY, base, data_size))
    n = meta["num_samples"]
    records = _records_table(path, txn, meta, n, rec_dtype.itemsize, base, data_size)
    located = None if records is None or base is None else _placed_values(path, txn, n, base, data_size)
    offsets, lengths = _scan_values(path, txn, n, base) if located is None else located
    _check_inside(path, offsets, lengths, data_size)
    if base is None:
        memory, offsets, lengths = _copy_values(txn, n, offsets)
        view = _build_view(path, fields, rec_dtype, offsets, lengths, None, int(memory.size), memory, records)
    else:
        view = _build_view(path, fields, rec_dtype, offsets, lengths, data_path, data_size, None, records)
    view.info = meta.get("info", {})
    return view


def _copy_values(txn, n: int, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """No visible map of ``data.mdb``: every sample value copied into one in-memory region.
    Returns ``(memory, offsets, lengths)``: ``(total,) uint8`` and the values' ``(n,) uint64``
    offsets in it and lengths (``offsets`` as given when ``n`` is 0)."""
    values = [bytes(txn.get(sample_key(k))) for k in range(n)]
    lengths = np.array([len(v) for v in values], dtype=np.uint64)
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.uint64) if n else offsets
    memory = np.frombuffer(b"".join(values), dtype=np.uint8) if n else np.zeros(0, np.uint8)
    return memory, offsets, lengths


def _get_inside(path: str, txn, key: bytes, base: int | None, data_size: int):
    """``txn.get(key)`` (a buffer into LMDB's map, or None), checked to lie inside ``data.mdb``
    before anything reads it: a corrupt length or page number in a leaf would otherwise make the
    read run past the file's end (SIGBUS). Unchecked where LMDB's map is not visible (``base``
    None)."""
    value = txn.get(key)
    if value is not None and base is not None:
        start = address(value) - base
        if start < 0 or start + len(value) > data_size:
            raise dataset_error(
                path,
                f"record {key.decode()!r} of {len(value)} bytes at offset {start} lies "
                f"outside data.mdb ({data_size} bytes): corrupt or truncated database",
            )
    return value


META_SCHEMA: Schema = {
    "format": Value((str,), choices=(FORMAT_NAME,)),
    "version": Value((int,), choices=READABLE_VERSIONS),
    "num_samples": Value((int,), low=0),
    "fields": Value((list,), non_empty=True),
    "record_dtype": Value((str, list, dict)),
    "record_size": Value((int,), low=1),
    "info": Value((dict,), required=False),
}
"""What each key of the metadata record holds (the schema, :mod:`ffload.formats.lmdb`): :func:`_read_meta` checks it."""


def _record_dtype(value) -> np.dtype:
    """The numpy dtype of a ``record_dtype`` JSON value (the schema's ``to_dtype``, :mod:`ffload.formats.lmdb`); ValueError,
    TypeError or KeyError for a value that describes none."""
    if isinstance(value, str):
        return np.dtype(value)
    if isinstance(value, list):
        return np.dtype([(name, _record_dtype(sub)) for name, sub in value])
    return np.dtype({**value, "formats": [_record_dtype(f) for f in value["formats"]]})


def _read_meta(path: str, raw) -> tuple[dict, dict[str, Field], np.dtype]:
    """The metadata record ``raw`` (the value of ``META_KEY``, or None), parsed and checked, every value's
    JSON type and range (:data:`META_SCHEMA`, the fields' descriptors and arguments) and the record layout
    it states against its fields': ``(record, fields, record dtype)``. Raises DatasetError naming the cause."""
    if raw is None:
        raise dataset_error(
            path, f"an LMDB database without ffload's metadata record ({META_KEY!r}): not written by ffload"
        )
    try:
        meta = json.loads(bytes(raw).decode("utf8"))
    except ValueError as e:
        raise dataset_error(path, f"corrupt metadata record: {e}") from e
    check_document(path, meta, {"format": META_SCHEMA["format"]}, "metadata record")  # what it is, first
    version = meta.get("version")
    if type(version) is not int or version not in READABLE_VERSIONS:
        raise dataset_error(
            path,
            f"unsupported ffload LMDB version {version!r} (this ffload "
            f"reads versions {', '.join(map(str, READABLE_VERSIONS))})",
        )
    check_document(path, meta, META_SCHEMA, "metadata record")
    fields = fields_from_specs(path, meta, "metadata record")
    rec_dtype = named_metadata_dtype(fields)
    try:
        stated = _record_dtype(meta["record_dtype"])
    except (ValueError, TypeError, KeyError) as e:
        raise dataset_error(path, f"metadata record: 'record_dtype' describes no record ({e})") from e
    if meta["record_size"] != rec_dtype.itemsize or stated.itemsize != rec_dtype.itemsize:
        raise dataset_error(
            path,
            f"metadata record: record_size {meta['record_size']} and record_dtype "
            f"({stated.itemsize} bytes) do not match its fields' {rec_dtype.itemsize}-byte "
            "record: corrupt layout",
        )
    return meta, fields, rec_dtype


def read_origins_value(path: str) -> bytes | None:
    """The value of :data:`~ffload.formats.origins.ORIGINS_KEY` (the samples' origin block, :mod:`ffload.formats.origins`) in the
    LMDB database at ``path``, or None when it has none."""
    env, key = open_env(path)
    try:
        with env.begin() as txn:
            raw = txn.get(ORIGINS_KEY)
    finally:
        release_env(key)
    return None if raw is None else bytes(raw)


def _check_guard(guard, data_path: str, data_size: int) -> None:
    """Raise FormatError (:func:`~ffload.formats.shardio.shrank`) when a read of LMDB's map under ``guard``
    (:mod:`ffload.formats.mapguard`; None: unguarded) found no data: ``data.mdb`` shrank while it was opened.
    The rest of that map reads zeros while the process's environment lives (see
    :func:`~.env.open_env`); a later open of the file is refused by :func:`~.pages.check_tree`
    while it is short."""
    offset = None if guard is None else guard.faulted()
    if offset is not None:
        now = os.path.getsize(data_path) if os.path.exists(data_path) else None
        raise shrank(data_path, data_size, now, offset)


def _scan_values(path: str, txn, n: int, base: int | None) -> tuple[np.ndarray, np.ndarray]:
    """``(offsets, lengths)``, ``(n,) uint64`` each, of the sample values in ``data.mdb``, by
    walking every sample key in order (checking that the keys are exactly ``0 .. n-1``). LMDB
    reads the first page of each value on the way: one page per sample. ``base`` None: the
    offsets are left 0 (the caller copies the values)."""
    offsets = np.zeros(n, dtype=np.uint64)
    lengths = np.zeros(n, dtype=np.uint64)
    cursor = txn.cursor()
    i = 0
    if n and not cursor.set_key(sample_key(0)):
        raise dataset_error(path, "sample 0 is missing")
    if not n and cursor.first() and bytes(cursor.key()) != META_KEY:
        raise dataset_error(
            path, f"num_samples is 0 but the database holds record {bytes(cursor.key())!r} (corrupt metadata record)"
        )
    for key, value in cursor if n else ():
        if i == n:  # the records end with sample n - 1, then the metadata key sorts last
            _check_no_more(path, n, key)
            break
        if bytes(key) != sample_key(i):
            raise dataset_error(path, f"sample {i} is missing (found key {bytes(key)!r})")
        lengths[i] = len(value)
        if base is not None:
            offsets[i] = _offset(path, i, value, base)
        i += 1
    if i != n:
        raise dataset_error(path, f"sample {i} is missing ({i} of {n} records)")
    return offsets, lengths


def _check_no_more(path: str, n: int, key) -> None:
    """``key``, the first key after sample ``n - 1``, must be ffload's metadata key."""
    if bytes(key) != META_KEY:
        raise dataset_error(
            path,
            f"more records than num_samples={n} (found key {bytes(key)!r}): "
            "corrupt metadata record, samples would be dropped",
        )


def _placed_values(path: str, txn, n: int, base: int, data_size: int) -> tuple[np.ndarray, np.ndarray] | None:
    """``(offsets, lengths)`` of the sample values from the version-2 places table: no value is
    read, except the :data:`UNPLACED` ones (small values, found through LMDB) and
    :data:`SPOT_CHECKS` evenly spaced placed ones, compared with where LMDB finds them. ``None``
    (with a warning) when a recorded place is wrong: ``data.mdb`` was rewritten since ffload wrote
    it (``mdb_copy -c`` renumbers pages), and the caller walks every value instead."""
    table = _get_inside(path, txn, PLACES_KEY, base, data_size)
    if table is None or len(table) != 16 * n:
        found = "missing" if table is None else f"{len(table)} bytes"
        raise dataset_error(
            path, f"places table {PLACES_KEY.decode()!r} is {found}, not {n} entries of 16 bytes: corrupt database"
        )
    places = np.frombuffer(table, dtype="<u8").reshape(n, 2).astype(np.uint64)
    offsets, lengths = places[:, 0].copy(), places[:, 1].copy()
    unplaced = np.flatnonzero(offsets == UNPLACED)
    placed = np.flatnonzero(offsets != UNPLACED)
    checked = (
        placed[np.unique(np.linspace(0, placed.size - 1, SPOT_CHECKS).astype(np.int64))] if placed.size else placed
    )
    for i in np.concatenate([unplaced, checked]).tolist():
        value = txn.get(sample_key(i))
        if value is None:
            raise dataset_error(path, f"sample {i} is missing")
        where = _offset(path, i, value, base), len(value)
        if offsets[i] == UNPLACED:
            offsets[i], lengths[i] = where
        elif (int(offsets[i]), int(lengths[i])) != where:
            warnings.warn(
                f"{path}: data.mdb was rewritten after ffload wrote it (sample {i} has moved): "
                "opening walks every value, one page read per sample",
                stacklevel=3,
            )
            return None
    cursor = txn.cursor()
    if cursor.set_range(sample_key(n)):
        _check_no_more(path, n, cursor.key())
    return offsets, lengths


def _offset(path: str, i: int, value, base: int) -> int:
    """Offset in ``data.mdb`` of sample ``i``'s ``value`` (a buffer into LMDB's map at ``base``)."""
    offset = address(value) - base
    if offset < 0:
        raise dataset_error(path, f"sample {i}: value lies before LMDB's map of data.mdb: corrupt database")
    return offset


def _check_inside(path: str, offsets: np.ndarray, lengths: np.ndarray, data_size: int) -> None:
    """Every value lies inside ``data.mdb`` (reading one outside would fault: SIGBUS)."""
    bad = np.flatnonzero((offsets > data_size) | (lengths > data_size - np.minimum(offsets, data_size)))
    if bad.size:
        i = int(bad[0])
        raise dataset_error(
            path,
            f"sample {i}: record of {int(lengths[i])} bytes at offset {int(offsets[i])} "
            f"lies outside data.mdb ({data_size} bytes): corrupt or truncated database",
        )


def _records_table(
    path: str, txn, meta: dict, n: int, record_size: int, base: int | None, data_size: int
) -> bytes | None:
    """The version-2 records table (``RECORDS_KEY``: ``n * record_size`` bytes), checked against
    the records at the start of the first and last sample values; ``None`` for version 1 (the
    records are then read from the values)."""
    if meta["version"] < 2:
        return None
    table = _get_inside(path, txn, RECORDS_KEY, base, data_size)
    if table is not None and record_size and len(table) % record_size == 0 and len(table) != n * record_size:
        raise dataset_error(
            path,
            f"the metadata record says num_samples={n}, the records table holds "
            f"{len(table) // record_size} records: corrupt metadata record",
        )
    if table is None or len(table) != n * record_size:
        found = "missing" if table is None else f"{len(table)} bytes"
        raise dataset_error(
            path,
            f"records table {RECORDS_KEY.decode()!r} is {found}, not {n} records of "
            f"{record_size} bytes: corrupt database",
        )
    table = bytes(table)
    for i in {0, n - 1} if n else ():
        if bytes(txn.get(sample_key(i))[:record_size]) != table[i * record_size : (i + 1) * record_size]:
            raise dataset_error(
                path,
                f"sample {i}: its record differs from the records table {RECORDS_KEY.decode()!r}: corrupt database",
            )
    return table


def _build_view(
    path, fields, rec_dtype, offsets, lengths, data_path, data_size, memory, records: bytes | None
) -> DatasetView:
    """The view of ``n`` sample values at ``offsets`` (``lengths`` bytes) of ``data.mdb`` (or of
    ``memory``, where they were copied); their records come from ``records`` (the version-2
    table) or else from the first ``record_size`` bytes of each value."""
    n = offsets.size
    if n and np.any(lengths < rec_dtype.itemsize):
        i = int(np.flatnonzero(lengths < rec_dtype.itemsize)[0])
        raise dataset_error(path, f"sample {i}: value of {int(lengths[i])} bytes is shorter than its record")
    metadata = _read_records(rec_dtype, offsets, data_path, memory, records)
    ptrs, sizes = _payload_tables(path, fields, metadata, rec_dtype.itemsize, offsets, lengths)
    check_field_values(path, fields, metadata)
    return DatasetView(
        path=path,
        format="lmdb",
        num_samples=n,
        fields=fields,
        metadata=metadata,
        ptrs=ptrs,
        sizes=sizes,
        data_path=data_path,
        data_size=data_size,
        page_size=PROCESS_CACHE_PAGE,
        memory=memory,
    )


def _read_records(
    rec_dtype: np.dtype, offsets: np.ndarray, data_path: str | None, memory: np.ndarray | None, records: bytes | None
) -> np.ndarray:
    """The ``(n,) rec_dtype`` records of the ``n`` values at ``offsets``: from ``records`` (the
    version-2 table), else from the first ``rec_dtype.itemsize`` bytes of each value, in ``memory``
    or (``memory`` None) in ``data.mdb``, mapped for the records' pages only."""
    n = offsets.size
    mapped = None
    if records is not None:  # version 2: the records table
        source = np.frombuffer(records, dtype=np.uint8)
        record_at = np.arange(n, dtype=np.int64) * rec_dtype.itemsize
    else:  # version 1: the first record_size bytes of each value
        record_at = offsets.astype(np.int64)
        if memory is None and n:
            with open(data_path, "rb") as f:
                mapped = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
            # only the records' own pages: the kernel's read-around would read most of a data.mdb
            # larger than RAM at open (records lie one value apart)
            mapped.madvise(mmap.MADV_RANDOM)
            source = np.frombuffer(mapped, dtype=np.uint8)
        else:
            source = np.zeros(0, np.uint8) if memory is None else memory
    idx = record_at[:, None] + np.arange(rec_dtype.itemsize)[None, :]
    metadata = np.ascontiguousarray(source[idx]).view(rec_dtype).reshape(n) if n else np.zeros(0, rec_dtype)
    del source
    if mapped is not None:
        mapped.close()
    return metadata


def _payload_tables(
    path: str,
    fields: dict[str, Field],
    metadata: np.ndarray,
    record_size: int,
    offsets: np.ndarray,
    lengths: np.ndarray,
) -> tuple[dict, dict]:
    """Each payload field's ``(n,) uint64`` absolute offsets and sizes, ``(ptrs, sizes)`` by field
    name: a payload runs from its offset in the value (``record_size`` or more) to the next
    payload's, or to the value's end (``lengths``). Sets the records' pointers to the absolute
    offsets and checks the payloads' sizes against the fields (DatasetError naming the sample)."""
    starts = []
    for name, f in fields.items():
        if f.has_payload:
            starts.append((name, f.get_pointer(metadata[name]).astype(np.uint64)))
    ptrs, sizes = {}, {}
    for j, (name, rel) in enumerate(starts):
        end = starts[j + 1][1] if j + 1 < len(starts) else lengths
        bad = np.flatnonzero((rel < record_size) | (rel > end) | (end > lengths))
        if bad.size:
            i = int(bad[0])
            raise dataset_error(
                path,
                f"sample {i}, field {name!r}: payload offset {int(rel[i])} outside its {int(lengths[i])}-byte value",
            )
        ptrs[name] = offsets + rel
        sizes[name] = (end - rel).astype(np.uint64)
        f = fields[name]
        f.set_pointer(metadata[name], ptrs[name])
        problem = f.check_payloads(metadata[name], sizes[name])
        if problem:
            raise dataset_error(path, f"field {name!r}: {problem}")
    return ptrs, sizes
