"""ffload's LMDB schema, both directions. Readable with plain ``lmdb`` + ``numpy`` (no pickle).

Schema, version 2 (also in README.md, "LMDB schema"):

* An LMDB environment directory (``data.mdb``, ``lock.mdb``), one unnamed database.
* Key ``b"__ffload__"``: the metadata record, UTF-8 JSON::

      {"format": "ffload-lmdb", "version": 2, "num_samples": N,
       "fields": [{"name": "image", "type": "RGBImageField", "type_id": 2,
                   "arguments": {...}}, {"name": "label", "type": "IntField", ...}],
       "record_dtype": {"names": ["image", "label"],
                        "formats": [[["mode", "|u1"], ["width", "<u2"], ["height", "<u2"],
                                     ["data_ptr", "<u8"]], "<i8"],
                        "offsets": [0, 16], "itemsize": 24},
       "record_size": 24}

  ``record_dtype`` is numpy's dict form of the record dtype (a packed nested record is a list
  of ``[name, type]`` pairs, a scalar a numpy type string).

* Keys ``b"%010d" % i`` for samples ``i = 0..N-1`` (10 ASCII digits: fixed width, so LMDB's
  byte order is sample order). Each value is::

      record   record_size bytes: the sample's metadata record (numpy structured dtype
               ``record_dtype``, identical to the .beton metadata row), whose pointer sub-fields
               (``data_ptr``, ``ptr``, the NDArray offset) hold the payload's offset from the
               start of the value
      payloads the fields' payloads (same encodings as .beton) concatenated in field order; a
               payload's size is the distance to the next payload's offset (or to the value end)

* Key ``b"__ffload_records__"`` (new in version 2): the ``N`` records of the sample values,
  end to end (``N * record_size`` bytes, sample order), byte for byte the first
  ``record_size`` bytes of each value. Reading them from here costs one contiguous read at
  open; reading them from the values costs one random page per sample, which on a cold disk
  (a ``data.mdb`` larger than RAM) takes minutes. A version-1 database (no such key) is still
  read, through the values.
* Key ``b"__ffload_places__"`` (new in version 2): ``(N, 2) <u8``, per sample the offset of
  its value in ``data.mdb`` and the value's length in bytes, or offset ``2**64 - 1`` where not
  recorded (values shorter than one LMDB page, which LMDB may move inside the file as later
  writes copy leaf pages; a value of a page or more lives in overflow pages LMDB never moves).
  With it, opening reads no sample value: LMDB itself reads each value's first page when asked
  where the value is. The reader spot-checks a few recorded places against LMDB's answer and,
  when ``data.mdb`` was rewritten (``mdb_copy -c``), warns and asks LMDB for every value.

Reading a sample with nothing but lmdb and numpy (either version)::

    def to_dtype(t):
        if isinstance(t, str):
            return np.dtype(t)
        if isinstance(t, list):
            return np.dtype([(n, to_dtype(s)) for n, s in t])
        return np.dtype({**t, "formats": [to_dtype(f) for f in t["formats"]]})

    env = lmdb.open(path, readonly=True, lock=False)
    with env.begin() as txn:
        meta = json.loads(txn.get(b"__ffload__"))
        dt = to_dtype(meta["record_dtype"])
        value = txn.get(b"%010d" % 0)
        rec = np.frombuffer(value[:meta["record_size"]], dtype=dt)[0]
        jpeg_or_pixels = value[rec["image"]["data_ptr"]:]    # image is the only payload here

``map_size`` grows by itself while writing (doubling on ``MapFullError``).

Layout on disk: ``data.mdb`` is written as it is, with no preallocation (the file holds LMDB's
used pages, ``(last_pgno + 1) * psize`` bytes) and no sequential rewrite at the end. Each commit
writes its dirty pages in page order and appending puts the values at the end of the file, so
the file system lays the file out as contiguously as a ``cp`` copy. Measured on ext4 (this VM):
6.1 GiB of 192 KiB values gave 54 extents, a ``cp`` copy 59. 26.6 GiB gave 238 extents,
nearly all 120 MiB long and in file order. Cold ``O_DIRECT`` reads of the original ran at the
copy's rate (sequential and 16-in-flight random). ffload's loader on a 22 GiB database ran
0.71-1.03x as fast on a ``cp`` copy as on the original in all four cells (RANDOM/QUASI_RANDOM x
``os_cache``, two interleaved runs each). That is within the disk's run-to-run swing, so
neither preallocation nor a rewrite could gain anything. At 27.4 GiB, a ``data.mdb`` (246
extents) and a ``.beton`` (250) holding the same samples were read at the same rates: median
536 vs 553 MiB/s sequential, 618 vs 608 MiB/s random (four interleaved rounds).

Reading zero-copy: the reader finds LMDB's own mapping of ``data.mdb`` in ``/proc/self/maps``
and subtracts its start from the address of a value (``buffers=True``): the result is the
value's offset inside ``data.mdb``. The writer records these offsets as it commits (the places
table), the reader takes them from there (version 1: one pass over every value at open), and
LMDB samples then go through the same memory-mapped gather as ``.beton``. Where no such
mapping is visible, values are copied into process memory instead.
"""
from __future__ import annotations

import errno
import json
import mmap
import os
import threading
import warnings

import numpy as np

from ffload.formats.fields.base import Field, named_metadata_dtype
from ffload.formats.fields.registry import FIELD_CLASSES
from ffload.formats.lmdb.pages import check_tree
from ffload.formats.origins import ORIGINS_KEY, OriginLog
from ffload.formats.schema import Schema, Value, check_document, check_field_specs
from ffload.formats.shardio import shrank
from ffload.formats.view import DatasetView, check_field_values, dataset_error
from ffload.formats.writer import DatasetWriter

META_KEY = b"__ffload__"
RECORDS_KEY = b"__ffload_records__"
PLACES_KEY = b"__ffload_places__"
UNPLACED = np.uint64(2 ** 64 - 1)
"""The offset in the places table of a value whose place in ``data.mdb`` is not recorded."""
_TABLE_KEYS = (META_KEY, ORIGINS_KEY, RECORDS_KEY, PLACES_KEY)  # sort after the sample keys, written last
FORMAT_NAME = "ffload-lmdb"
VERSION = 2
READABLE_VERSIONS = (1, 2)
KEY_FORMAT = b"%010d"
PROCESS_CACHE_PAGE = 1 << 23
"""An LMDB view's nominal page size (bytes; ``data.mdb`` has no pages of its own at this scale):
the QUASI_RANDOM order's groups and the ``os_cache=False`` page pool's slots. The ``.beton``'s
default (FFCV's), so that both formats shuffle at the same granularity; and large against a
record, because each pool slot also reads the bytes by which records overhang its page: with
2 MiB pages and 192 KiB records that was 10 % read twice, and the page pool ran at 0.83x the
``.beton``'s rate on warm data, 0.98x with 8 MiB (``/tmp`` check, 3 GiB, 2 workers)."""


def sample_key(index: int) -> bytes:
    """The LMDB key of sample ``index``: 10 ASCII digits."""
    return KEY_FORMAT % index


def _dtype_to_json(dt: np.dtype):
    """numpy's dict form of a record dtype (names, formats, offsets, itemsize) as JSON; nested
    records (packed, as the image record) become ``[[name, type], ...]`` lists."""
    if not dt.names:
        return dt.str
    fmts = [dt.fields[n][0] for n in dt.names]
    offsets = [dt.fields[n][1] for n in dt.names]
    packed = offsets == list(np.cumsum([0] + [f.itemsize for f in fmts[:-1]])) and \
        dt.itemsize == sum(f.itemsize for f in fmts)
    if packed:
        return [[n, _dtype_to_json(f)] for n, f in zip(dt.names, fmts)]
    return {"names": list(dt.names), "formats": [_dtype_to_json(f) for f in fmts],
            "offsets": offsets, "itemsize": dt.itemsize}


class LMDBWriter(DatasetWriter):
    """Writes samples, in index order, into a new LMDB environment directory at ``path`` (see
    :class:`~.writer.DatasetWriter` for the protocol: ``add`` in order, then ``close``).

    Args:
        path: directory to create (the caller renames it into place when complete).
        fields: name -> Field, in order.
        num_samples: at most this many samples will be added (fewer when inputs are skipped).
        txn_bytes: commit a write transaction every this many bytes (and at close).
        initial_map_size: bytes; LMDB's map size to start with (it doubles when full).
        info: dataset-level JSON object (see :class:`~.writer.DatasetWriter`), stored under
            ``"info"`` in the metadata record.

    The samples' origins (``add(..., origin=)``) are stored as one origin block
    (:mod:`.origins`) under :data:`~.origins.ORIGINS_KEY`, when any was given.
    """

    def __init__(self, path: str, fields: dict[str, Field], num_samples: int,
                 txn_bytes: int = 64 << 20, initial_map_size: int = 64 << 20, info: dict | None = None):
        import lmdb

        super().__init__(path, fields, num_samples, info)
        self._lmdb = lmdb
        self.record_dtype = named_metadata_dtype(self.fields)
        self.map_size = int(initial_map_size)
        self.env = self._handle = lmdb.open(path, map_size=self.map_size, subdir=True,
                                            sync=False, metasync=False, readahead=False, max_dbs=0)
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
                        last = key in _TABLE_KEYS
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
            base = _lmdb_map_base(os.path.join(self.path, "data.mdb"), _address(probe))
            for i in range(first, first + count):
                value = txn.get(sample_key(i))
                place = UNPLACED if base is None or len(value) < psize else _address(value) - base
                self._places[i] = place, len(value)

    def _finalize(self) -> None:
        """Write the pending samples, the records and places tables and the metadata record;
        sync to disk."""
        self._flush()
        meta = {"format": FORMAT_NAME, "version": VERSION, "num_samples": self.count,
                "fields": field_specs(self.fields),
                "record_dtype": _dtype_to_json(self.record_dtype),
                "record_size": self.record_dtype.itemsize}
        if self.info:
            meta["info"] = self.info
        tables = [(RECORDS_KEY, bytes(self._records)), (PLACES_KEY, self._places[:self.count].tobytes()),
                  (META_KEY, json.dumps(meta).encode("utf8"))]
        if self.origins.given:
            tables.append((ORIGINS_KEY, self.origins.block()))
        self._put_all(tables)
        self.env.sync(True)


def _get_inside(path: str, txn, key: bytes, base: int | None, data_size: int):
    """``txn.get(key)`` (a buffer into LMDB's map, or None), checked to lie inside ``data.mdb``
    before anything reads it: a corrupt length or page number in a leaf would otherwise make the
    read run past the file's end (SIGBUS). Unchecked where LMDB's map is not visible (``base``
    None)."""
    value = txn.get(key)
    if value is not None and base is not None:
        start = _address(value) - base
        if start < 0 or start + len(value) > data_size:
            raise dataset_error(path, f"record {key.decode()!r} of {len(value)} bytes at offset {start} lies "
                                      f"outside data.mdb ({data_size} bytes): corrupt or truncated database")
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
"""What each key of the metadata record holds (the module docstring's schema): :func:`_read_meta` checks it."""


def _record_dtype(value) -> np.dtype:
    """The numpy dtype of a ``record_dtype`` JSON value (the module docstring's ``to_dtype``); ValueError,
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
        raise dataset_error(path, f"an LMDB database without ffload's metadata record ({META_KEY!r}): "
                          "not written by ffload")
    try:
        meta = json.loads(bytes(raw).decode("utf8"))
    except ValueError as e:
        raise dataset_error(path, f"corrupt metadata record: {e}") from e
    check_document(path, meta, {"format": META_SCHEMA["format"]}, "metadata record")  # what it is, first
    version = meta.get("version")
    if type(version) is not int or version not in READABLE_VERSIONS:
        raise dataset_error(path, f"unsupported ffload LMDB version {version!r} (this ffload "
                          f"reads versions {', '.join(map(str, READABLE_VERSIONS))})")
    check_document(path, meta, META_SCHEMA, "metadata record")
    fields = fields_from_specs(path, meta, "metadata record")
    rec_dtype = named_metadata_dtype(fields)
    try:
        stated = _record_dtype(meta["record_dtype"])
    except (ValueError, TypeError, KeyError) as e:
        raise dataset_error(path, f"metadata record: 'record_dtype' describes no record ({e})") from e
    if meta["record_size"] != rec_dtype.itemsize or stated.itemsize != rec_dtype.itemsize:
        raise dataset_error(path, f"metadata record: record_size {meta['record_size']} and record_dtype "
                                  f"({stated.itemsize} bytes) do not match its fields' {rec_dtype.itemsize}-byte "
                                  "record: corrupt layout")
    return meta, fields, rec_dtype


def field_specs(fields: dict[str, Field]) -> list[dict]:
    """The JSON descriptors of ``fields`` (``name``, ``type``, ``type_id``, ``arguments``), as
    LMDB's metadata record and a sharded dataset's manifest store them."""
    return [{"name": n, "type": type(f).__name__, "type_id": f.type_id, "arguments": f.arguments()}
            for n, f in fields.items()]


def fields_from_specs(path: str, meta: dict, what: str = "manifest") -> dict[str, Field]:
    """The fields described by ``meta["fields"]`` (:func:`field_specs`), ``meta`` being ``what`` (the
    metadata record, a manifest): each descriptor checked (:func:`.schema.check_field_specs`), then its
    arguments by the field's constructor, and each argument given must read back as the same JSON value
    (``"12"`` for ``max_resolution``, ``true`` for a count, are refused rather than converted).

    Raises:
        DatasetError: naming ``path``, the field and the cause.
    """
    fields = {}
    for spec in check_field_specs(path, meta.get("fields"), what):
        name, args = spec["name"], spec.get("arguments", {})
        try:
            field = FIELD_CLASSES[spec["type"]].from_arguments(args)
        except (TypeError, ValueError, KeyError) as e:
            raise dataset_error(path, f"{what}: field {name!r}: invalid arguments {args!r} ({e})") from e
        kept = field.arguments()
        changed = [key for key in args if key in kept and not _same_json(args[key], kept[key])]
        if changed:
            raise dataset_error(path, f"{what}: field {name!r}: argument {changed[0]!r} is {args[changed[0]]!r}, "
                                      f"a {spec['type']} stores {kept[changed[0]]!r}")
        fields[name] = field
    return fields


def _same_json(a, b) -> bool:
    """``a == b`` with the same JSON types throughout (``1 != True``, ``1 != 1.0``, ``"1" != 1``)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, list):
        return len(a) == len(b) and all(_same_json(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same_json(a[k], b[k]) for k in a)
    return a == b


def _lmdb_map_base(data_path: str, probe: int) -> int | None:
    """Start address of LMDB's own mapping of ``data_path`` in this process, from /proc: the
    mapping of the file from offset 0 that holds ``probe``, the address of a value LMDB returned.
    (The process may map the file more than once: a loader's ``open_region()`` of an earlier
    view, another environment; the first mapping listed is not necessarily LMDB's.)"""
    try:
        st = os.stat(data_path)
        with open("/proc/self/maps") as maps:
            real = os.path.realpath(data_path)
            for line in maps:
                parts = line.rstrip("\n").split(maxsplit=5)  # the path (field 6) may hold spaces
                if len(parts) == 6 and int(parts[4]) == st.st_ino and parts[5] == real:
                    start, end = (int(v, 16) for v in parts[0].split("-"))
                    if int(parts[2], 16) == 0 and start <= probe < end:
                        return start
    except (OSError, ValueError):
        return None
    return None


def _address(buf) -> int:
    """Memory address of a buffer's first byte (a ``buffers=True`` LMDB value)."""
    return np.frombuffer(buf, dtype=np.uint8).ctypes.data


def read_origins_value(path: str) -> bytes | None:
    """The value of :data:`~.origins.ORIGINS_KEY` (the samples' origin block, :mod:`.origins`) in the
    LMDB database at ``path``, or None when it has none."""
    env, key = _open_env(path)
    try:
        with env.begin() as txn:
            raw = txn.get(ORIGINS_KEY)
    finally:
        _release_env(key)
    return None if raw is None else bytes(raw)


def open_lmdb(path: str) -> DatasetView:
    """Open an ffload LMDB directory: validate the schema and build the offset table.

    Raises:
        DatasetError: not an LMDB environment, no/invalid metadata record, missing or malformed
            sample records, or ``data.mdb`` shrank while it was read (from the first record
            found on: LMDB's own map is guarded against SIGBUS, :mod:`.mapguard`, once its
            address is known).
    """
    import lmdb

    data_path = os.path.join(path, "data.mdb")
    if not os.path.isfile(data_path):
        raise dataset_error(path, "not an LMDB database (no data.mdb)")
    env, env_key = _open_env(path)
    try:
        check_tree(path, data_path)  # LMDB trusts its pages: refuse any that would make it read outside the file
    except BaseException:
        _release_env(env_key)
        raise
    # The read transaction stays open for the view's lifetime: LMDB then never reuses the pages
    # of this snapshot, so a process writing to the database meanwhile cannot change the bytes
    # the offsets below point at (with lock=False, on read-only media, nobody can write anyway).
    txn = env.begin(buffers=True)
    guard, data_size = None, 0
    try:
        probe = txn.get(META_KEY)
        base = None if probe is None else _lmdb_map_base(data_path, _address(probe))
        data_size = os.path.getsize(data_path)
        if base is not None:  # LMDB's own map of data.mdb: a read past a shrunk end reads zeros
            from ffload.formats import mapguard  # numba: imported when a database is first opened

            guard = mapguard.register(base, int(env.info()["map_size"]))
        meta, fields, rec_dtype = _read_meta(path, _get_inside(path, txn, META_KEY, base, data_size))
        info, n = meta.get("info", {}), meta["num_samples"]
        records = _records_table(path, txn, meta, n, rec_dtype.itemsize, base, data_size)
        located = None if records is None or base is None else _placed_values(path, txn, n, base, data_size)
        offsets, lengths = _scan_values(path, txn, n, base) if located is None else located
        _check_inside(path, offsets, lengths, data_size)
        if base is None:
            # no visible map of data.mdb: copy every value into one in-memory region
            values = [bytes(txn.get(sample_key(k))) for k in range(n)]
            lengths = np.array([len(v) for v in values], dtype=np.uint64)
            offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.uint64) if n else offsets
            memory = np.frombuffer(b"".join(values), dtype=np.uint8) if n else np.zeros(0, np.uint8)
            view = _build_view(path, fields, rec_dtype, offsets, lengths, None, int(memory.size), memory, records)
        else:
            view = _build_view(path, fields, rec_dtype, offsets, lengths, data_path, data_size, None, records)
        view.info = info
        _check_guard(guard, data_path, data_size)
    except BaseException as e:
        txn.abort()
        _release_env(env_key)
        _check_guard(guard, data_path, data_size)  # the file shrank under LMDB: that explains e
        if isinstance(e, lmdb.Error):
            raise dataset_error(path, f"corrupt LMDB database ({type(e).__name__}: {e})") from e
        raise
    finally:
        if guard is not None:
            guard.close()  # after the open, only ffload's own mapping of data.mdb is read
    if base is None:  # everything was copied: the snapshot is not needed
        txn.abort()
        _release_env(env_key)
    else:
        view.snapshot = _Snapshot(env_key, env, txn)
    return view


def _check_guard(guard, data_path: str, data_size: int) -> None:
    """Raise FormatError (:func:`~.shardio.shrank`) when a read of LMDB's map under ``guard``
    (:mod:`.mapguard`; None: unguarded) found no data: ``data.mdb`` shrank while it was opened.
    The rest of that map reads zeros while the process's environment lives (see
    :func:`_open_env`); a later open of the file is refused by :func:`~.pages.check_tree`
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
        raise dataset_error(path, f"num_samples is 0 but the database holds record {bytes(cursor.key())!r} "
                                  "(corrupt metadata record)")
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
        raise dataset_error(path, f"more records than num_samples={n} (found key {bytes(key)!r}): "
                                  "corrupt metadata record, samples would be dropped")


SPOT_CHECKS = 17
"""Placed values whose recorded place :func:`_placed_values` compares with LMDB's at open."""


def _placed_values(path: str, txn, n: int, base: int, data_size: int) -> tuple[np.ndarray, np.ndarray] | None:
    """``(offsets, lengths)`` of the sample values from the version-2 places table: no value is
    read, except the :data:`UNPLACED` ones (small values, found through LMDB) and
    :data:`SPOT_CHECKS` evenly spaced placed ones, compared with where LMDB finds them. ``None``
    (with a warning) when a recorded place is wrong: ``data.mdb`` was rewritten since ffload wrote
    it (``mdb_copy -c`` renumbers pages), and the caller walks every value instead."""
    table = _get_inside(path, txn, PLACES_KEY, base, data_size)
    if table is None or len(table) != 16 * n:
        found = "missing" if table is None else f"{len(table)} bytes"
        raise dataset_error(path, f"places table {PLACES_KEY.decode()!r} is {found}, not {n} entries of "
                                  "16 bytes: corrupt database")
    places = np.frombuffer(table, dtype="<u8").reshape(n, 2).astype(np.uint64)
    offsets, lengths = places[:, 0].copy(), places[:, 1].copy()
    unplaced = np.flatnonzero(offsets == UNPLACED)
    placed = np.flatnonzero(offsets != UNPLACED)
    checked = placed[np.unique(np.linspace(0, placed.size - 1, SPOT_CHECKS).astype(np.int64))] if placed.size else placed
    for i in np.concatenate([unplaced, checked]).tolist():
        value = txn.get(sample_key(i))
        if value is None:
            raise dataset_error(path, f"sample {i} is missing")
        where = _offset(path, i, value, base), len(value)
        if offsets[i] == UNPLACED:
            offsets[i], lengths[i] = where
        elif (int(offsets[i]), int(lengths[i])) != where:
            warnings.warn(f"{path}: data.mdb was rewritten after ffload wrote it (sample {i} has moved): "
                          "opening walks every value, one page read per sample", stacklevel=3)
            return None
    cursor = txn.cursor()
    if cursor.set_range(sample_key(n)):
        _check_no_more(path, n, cursor.key())
    return offsets, lengths


def _offset(path: str, i: int, value, base: int) -> int:
    """Offset in ``data.mdb`` of sample ``i``'s ``value`` (a buffer into LMDB's map at ``base``)."""
    offset = _address(value) - base
    if offset < 0:
        raise dataset_error(path, f"sample {i}: value lies before LMDB's map of data.mdb: corrupt database")
    return offset


def _check_inside(path: str, offsets: np.ndarray, lengths: np.ndarray, data_size: int) -> None:
    """Every value lies inside ``data.mdb`` (reading one outside would fault: SIGBUS)."""
    bad = np.flatnonzero((offsets > data_size) | (lengths > data_size - np.minimum(offsets, data_size)))
    if bad.size:
        i = int(bad[0])
        raise dataset_error(path, f"sample {i}: record of {int(lengths[i])} bytes at offset {int(offsets[i])} "
                                  f"lies outside data.mdb ({data_size} bytes): corrupt or truncated database")


def _records_table(path: str, txn, meta: dict, n: int, record_size: int, base: int | None,
                   data_size: int) -> bytes | None:
    """The version-2 records table (``RECORDS_KEY``: ``n * record_size`` bytes), checked against
    the records at the start of the first and last sample values; ``None`` for version 1 (the
    records are then read from the values)."""
    if meta["version"] < 2:
        return None
    table = _get_inside(path, txn, RECORDS_KEY, base, data_size)
    if table is not None and record_size and len(table) % record_size == 0 and len(table) != n * record_size:
        raise dataset_error(path, f"the metadata record says num_samples={n}, the records table holds "
                                  f"{len(table) // record_size} records: corrupt metadata record")
    if table is None or len(table) != n * record_size:
        found = "missing" if table is None else f"{len(table)} bytes"
        raise dataset_error(path, f"records table {RECORDS_KEY.decode()!r} is {found}, not {n} records of "
                                  f"{record_size} bytes: corrupt database")
    table = bytes(table)
    for i in {0, n - 1} if n else ():
        if bytes(txn.get(sample_key(i))[:record_size]) != table[i * record_size:(i + 1) * record_size]:
            raise dataset_error(path, f"sample {i}: its record differs from the records table "
                                      f"{RECORDS_KEY.decode()!r}: corrupt database")
    return table


class _Snapshot:
    """Keeps an LMDB read transaction open while a view uses its offsets; releases the shared
    environment (see :func:`_open_env`) when the view goes."""

    def __init__(self, env_key, env, txn):
        self.env_key, self.env, self.txn = env_key, env, txn

    def close(self) -> None:
        if self.txn is not None:
            self.txn.abort()
            self.txn = None
            _release_env(self.env_key)

    def __del__(self):
        self.close()


# LMDB allows one open environment per database per process: views of the same database share
# it ((real path, device, inode of data.mdb) -> [env, number of users]). The inode is part of the
# key so that a database replaced on disk (a new data.mdb) gets a new environment instead of the
# deleted file's.
_ENVS: dict[tuple[str, int, int], list] = {}
_ENVS_LOCK = threading.Lock()
_READ_ONLY_ERRNOS = (errno.EACCES, errno.EPERM, errno.EROFS)


def _open_env(path: str):
    """The process's read-only environment of ``path`` (opened on first use, shared after),
    registered as a reader in ``lock.mdb`` so that writers keep our snapshots' pages; without
    the lock where ``lock.mdb`` cannot be written (read-only media). Returns ``(env, key)``; pair
    with ``_release_env(key)``."""
    import lmdb

    real = os.path.realpath(path)
    st = os.stat(os.path.join(real, "data.mdb"))
    key = (real, st.st_dev, st.st_ino)
    with _ENVS_LOCK:
        if key in _ENVS:
            _ENVS[key][1] += 1
            return _ENVS[key][0], key
        try:
            try:
                env = lmdb.open(path, readonly=True, lock=True, subdir=True, readahead=False)
            except lmdb.Error as e:  # lock.mdb not writable: py-lmdb's ReadonlyError is EACCES
                if not (isinstance(e, lmdb.ReadonlyError) or getattr(e, "code", None) in _READ_ONLY_ERRNOS):
                    raise
                env = lmdb.open(path, readonly=True, lock=False, subdir=True, readahead=False)
        except lmdb.Error as e:
            raise dataset_error(path, f"not a readable LMDB database ({e})") from e
        _ENVS[key] = [env, 1]
        return env, key


def _release_env(key: tuple[str, int, int]) -> None:
    with _ENVS_LOCK:
        entry = _ENVS.get(key)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] == 0:
            del _ENVS[key]
            entry[0].close()


def _build_view(path, fields, rec_dtype, offsets, lengths, data_path, data_size, memory,
                records: bytes | None) -> DatasetView:
    """The view of ``n`` sample values at ``offsets`` (``lengths`` bytes) of ``data.mdb`` (or of
    ``memory``, where they were copied); their records come from ``records`` (the version-2
    table) or else from the first ``record_size`` bytes of each value."""
    n = offsets.size
    if n and np.any(lengths < rec_dtype.itemsize):
        i = int(np.flatnonzero(lengths < rec_dtype.itemsize)[0])
        raise dataset_error(path, f"sample {i}: value of {int(lengths[i])} bytes is shorter than its record")
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
    starts = []
    for name, f in fields.items():
        if f.has_payload:
            starts.append((name, f.get_pointer(metadata[name]).astype(np.uint64)))
    ptrs, sizes = {}, {}
    for j, (name, rel) in enumerate(starts):
        end = starts[j + 1][1] if j + 1 < len(starts) else lengths
        bad = np.flatnonzero((rel < rec_dtype.itemsize) | (rel > end) | (end > lengths))
        if bad.size:
            i = int(bad[0])
            raise dataset_error(path, f"sample {i}, field {name!r}: payload offset {int(rel[i])} outside "
                              f"its {int(lengths[i])}-byte value")
        ptrs[name] = offsets + rel
        sizes[name] = (end - rel).astype(np.uint64)
        f = fields[name]
        f.set_pointer(metadata[name], ptrs[name])
        problem = f.check_payloads(metadata[name], sizes[name])
        if problem:
            raise dataset_error(path, f"field {name!r}: {problem}")
    check_field_values(path, fields, metadata)
    return DatasetView(path=path, format="lmdb", num_samples=n, fields=fields, metadata=metadata,
                       ptrs=ptrs, sizes=sizes, data_path=data_path, data_size=data_size,
                       page_size=PROCESS_CACHE_PAGE, memory=memory)
