"""FFCV's ``.beton`` v2 container, both directions, byte-compatible with ffcv 1.0.2.

Layout (all little-endian; the dtypes below are FFCV's ``ffcv/types.py``)::

    header            HeaderType: version <u2 (=2), num_fields <u2, page_size <u4,
                      num_samples <u8, alloc_table_ptr <u8            (aligned: 24 bytes)
    field descriptors num_fields x FieldDescType: type_id <u1, name 16 x u1 (NUL padded ASCII),
                      arguments 1024 x u1                             (1041 bytes each)
    metadata          num_samples x metadata_dtype(fields)            (aligned struct of the
                      fields' metadata records)
    info (ffload)     optional: INFO_MAGIC, JSON length <u8, UTF-8 JSON object (the dataset's
                      ``info``, e.g. class names), in the padding that precedes the first page
    origins (ffload)  optional, after the info block: the samples' origin block (provenance:
                      each sample's source file, key or row; layout in :mod:`.origins`)
    zero padding      to a multiple of page_size
    data pages        page_size bytes each; a sample's payloads never straddle a page; the last
                      page is written in full (zero padded)
    allocation table  one (sample_id <u8, ptr <u8, size <u8) per payload, up to end of file

ffload differs from ffcv's writer only where ffcv fails: a sample larger than the page size gets
a larger (power-of-two) page size instead of "Tried allocating ... but page size is ...", which
ffcv's reader and loader accept as any other page size; an empty payload is followed by one zero
byte, so that its offset is its own (ffcv's writer gives it the next payload's offset, and ffcv's
reader, which finds a payload's size by offset, may then read either with the other's size).
Pages are filled in sample order. The dataset-level ``info`` (class names) and the origin block
live in the padding between the metadata and the first page, which ffcv's reader never reads (it
finds the metadata right after the field descriptors and the pages through the allocation table),
so ffcv reads such files unchanged; a file without them has zeros there and ``info`` is ``{}``.
"""

from __future__ import annotations

import io
import json
import os

import numpy as np

from ffload.errors import ConfigurationError, FieldError
from ffload.formats.byteranges import LocalBytes
from ffload.formats.fields.base import Field, metadata_dtype, named_metadata_dtype
from ffload.formats.fields.registry import FIELD_TYPES
from ffload.formats.origins import OriginLog
from ffload.formats.view import DatasetView, check_field_values, dataset_error
from ffload.formats.writer import DatasetWriter

VERSION = 2
HEADER_TYPE = np.dtype(
    [
        ("version", "<u2"),
        ("num_fields", "<u2"),
        ("page_size", "<u4"),
        ("num_samples", "<u8"),
        ("alloc_table_ptr", "<u8"),
    ],
    align=True,
)
FIELD_DESC_TYPE = np.dtype([("type_id", "<u1"), ("name", ("<u1", 16)), ("arguments", ("<u1", (1024,)))], align=True)
ALLOC_TYPE = np.dtype([("sample_id", "<u8"), ("ptr", "<u8"), ("size", "<u8")])

MIN_PAGE_SIZE = 1 << 21  # 2 MiB, ffcv's minimum
INFO_MAGIC = b"ffload-info\0"  # 12 bytes, then the JSON length <u8, then the JSON
DEFAULT_PAGE_SIZE = 1 << 23  # 8 MiB, ffcv's default (4 * MIN_PAGE_SIZE)
MAX_PAGE_SIZE = 1 << 31  # the largest power of two below ffcv's uint32 limit
NAME_LEN = 16


def _align(x: int, a: int) -> int:
    return (x + a - 1) // a * a


def _next_pow2(x: int) -> int:
    return 1 << max(0, int(x - 1).bit_length())


def check_page_size(page_size: int) -> int:
    """Validate a user page size (bytes): a power of two in [2 MiB, 2 GiB]. Raises ConfigurationError."""
    page_size = int(page_size)
    if page_size & (page_size - 1) or not MIN_PAGE_SIZE <= page_size <= MAX_PAGE_SIZE:
        raise ConfigurationError(
            f"page_size must be a power of two between {MIN_PAGE_SIZE} and {MAX_PAGE_SIZE} bytes, got {page_size}"
        )
    return page_size


def field_descriptors(fields: dict[str, Field]) -> np.ndarray:
    """The ``(num_fields,) FIELD_DESC_TYPE`` array describing ``fields`` (names <= 16 ASCII bytes)."""
    desc = np.zeros(len(fields), dtype=FIELD_DESC_TYPE)
    for i, (name, f) in enumerate(fields.items()):
        try:
            encoded = name.encode("ascii")
        except UnicodeEncodeError:
            raise ConfigurationError(
                f"field name {name!r} must be ASCII (.beton stores 16 ASCII bytes)", field=name
            ) from None
        if not 0 < len(encoded) <= NAME_LEN or b"\0" in encoded:
            raise ConfigurationError(f"field name {name!r} must be 1..{NAME_LEN} ASCII characters", field=name)
        desc[i]["type_id"] = f.type_id
        desc[i]["name"][: len(encoded)] = np.frombuffer(encoded, dtype=np.uint8)
        desc[i]["arguments"][:] = f.to_binary()
    return desc


class BetonWriter(DatasetWriter):
    """Streams samples, in index order, into a ``.beton`` file at ``path`` (see
    :class:`~.writer.DatasetWriter` for the protocol: ``add`` in order, then ``close``).

    Args:
        path: output file (created/truncated).
        fields: name -> Field, in order.
        num_samples: at most this many samples will be added (the metadata table precedes the
            data, so room is reserved up front); fewer may be (skipped inputs): the file then
            records the number actually added, and the unused room stays as padding before the
            first page.
        page_size: bytes, power of two >= 2 MiB; grows automatically for larger samples.
        resume: ``(state, metadata rows, allocation rows, origin records)`` of a :meth:`checkpoint`
            of ``path`` (all rows since the start): continue that file instead of creating one
            (with the same ``info`` and ``origin_room``).
        info: dataset-level JSON object (see :class:`~.writer.DatasetWriter`), stored after the
            metadata (see the module docstring).
        reserve: metadata rows to reserve room for up front (default ``num_samples``); when more
            samples come, the room doubles (up to ``num_samples``) and the data written so far
            moves once, as when the page size grows. A writer whose count is unknown in advance
            (a shard of :mod:`.shards`) reserves what the first page's padding holds anyway.
        origin_room: bytes to reserve up front for the origin block (``add(..., origin=)``;
            :meth:`~.origins.OriginLog.block_size` of every sample's origin: then the data never
            moves for it); a larger block grows the room (doubling), moving the data once, as rows do.
    """

    before_grow = None
    """Called (no arguments) before the page size grows, which moves the data written so far:
    a checkpoint taken before then no longer describes the file (see :meth:`checkpoint`)."""

    def __init__(
        self,
        path: str,
        fields: dict[str, Field],
        num_samples: int,
        page_size: int = DEFAULT_PAGE_SIZE,
        resume: tuple[dict, np.ndarray, np.ndarray, bytes] | None = None,
        info: dict | None = None,
        reserve: int | None = None,
        origin_room: int = 0,
    ):
        super().__init__(path, fields, num_samples, info)
        self.origins = OriginLog()
        self._origin_room = max(0, int(origin_room))
        self.page_size = check_page_size(page_size)
        self._desc = field_descriptors(self.fields)
        self._info_block = (
            INFO_MAGIC + np.uint64(len(self._info_json)).astype("<u8").tobytes() + self._info_json
            if self._info_json
            else b""
        )
        rows = self.num_samples if reserve is None else max(1, min(int(reserve), self.num_samples))
        self._reserve_rows(rows)
        self._data_start = _align(self._head_end, self.page_size)
        self._pos = 0  # bytes written into the data region; pointers are relative to it until close
        self._allocs: list[tuple[int, int, int]] = []
        self._fp = self._handle = open(path, "r+b" if resume else "w+b", buffering=0)
        if resume:
            self._restore(*resume)
        self._marks = (self.count, len(self._allocs))  # what the last checkpoint covered
        self._out = io.BufferedWriter(self._fp, buffer_size=1 << 22)
        self._out.seek(self._data_start + self._pos)

    def _reserve_rows(self, rows: int) -> None:
        """Room for ``rows`` metadata rows (the rows so far kept); sets ``_head_end``, where the
        rows reserved, the info block and the origin room end (the data starts at the next page)."""
        metadata = np.zeros(rows, dtype=metadata_dtype(self._field_list))
        if getattr(self, "metadata", None) is not None:
            metadata[: self.count] = self.metadata[: self.count]
        self.metadata = metadata
        self._columns = [self.metadata[f"f{k}"] for k in range(len(self._field_list))]
        self._head_end = (
            HEADER_TYPE.itemsize + self._desc.nbytes + self.metadata.nbytes + len(self._info_block) + self._origin_room
        )

    def _origin_room_with(self, origin: str | None) -> int:
        """The origin room needed once ``origin`` is added: the current one, or doubled (at least)."""
        need = self.origins.block_size(origin)
        return self._origin_room if need <= self._origin_room else max(need, 2 * self._origin_room)

    def file_bytes_with(self, payloads, origin: str | None = None) -> int:
        """Bytes the file would have if the sample of ``payloads`` (1-D ``uint8`` arrays, ``None``
        for fields without one, in field order) were added and the writer closed: the header and
        the metadata room (grown if the sample needs it) padded to the page, the data pages, the
        allocation table (and ``origin``'s room). What :mod:`.shards` compares with the shard size."""
        sizes = [max(int(p.nbytes), 1) for p in payloads if p is not None]
        total = sum(sizes)
        page = self.page_size if total <= self.page_size else _next_pow2(total)
        rows = self.metadata.shape[0]
        if self.count >= rows:
            rows = min(self.num_samples, 2 * rows)
        head = (
            self._head_end
            + (rows - self.metadata.shape[0]) * self.metadata.itemsize
            + self._origin_room_with(origin)
            - self._origin_room
        )
        pos = _align(self._pos, page) if page != self.page_size else self._pos
        if total > page - pos % page and pos % page:
            pos = _align(pos, page)
        pos = _align(pos + total, page)
        return _align(head, page) + pos + (len(self._allocs) + len(sizes)) * ALLOC_TYPE.itemsize

    def checkpoint(self) -> tuple[dict, np.ndarray, np.ndarray, bytes]:
        """Flush and fsync the samples added so far, and describe them so that a new writer can
        continue this file (``BetonWriter(..., resume=...)``) after this process dies.

        Returns:
            ``(state, metadata rows, allocation rows, origin records)``: ``state`` is JSON-able
            (``count``, ``page_size``, ``data_start``, ``data_bytes``: bytes of the data region in
            use; ``origins``: whether an origin was given); the rows are those added since the
            previous checkpoint (``metadata_dtype`` records, their pointers relative to the data
            region; :data:`ALLOC_TYPE` records, likewise; their origins as
            :meth:`~.origins.OriginLog.records` bytes).
        """
        self._out.flush()
        os.fsync(self._fp.fileno())
        (count, allocs), self._marks = self._marks, (self.count, len(self._allocs))
        state = {
            "count": self.count,
            "page_size": self.page_size,
            "data_start": self._data_start,
            "data_bytes": self._pos,
            "origins": self.origins.given,
        }
        return (
            state,
            self.metadata[count : self.count].copy(),
            np.array(self._allocs[allocs:], dtype=ALLOC_TYPE),
            self.origins.records(count),
        )

    def _restore(self, state: dict, metadata: np.ndarray, allocs: np.ndarray, origins: bytes) -> None:
        """Take up a file at a :meth:`checkpoint`: ``metadata``/``allocs``/``origins`` are all the
        rows so far. The data region beyond the checkpoint is cut off. Raises ConfigurationError (a
        ValueError) for a state that does not fit this writer."""
        count = int(state["count"])
        if count > self.num_samples or len(metadata) != count or metadata.dtype != self.metadata.dtype:
            raise ConfigurationError(
                f"checkpoint of {count} samples does not fit {self.num_samples} samples "
                f"of {len(metadata)} metadata rows"
            )
        self.origins.extend_records(origins, bool(state.get("origins")))
        if len(self.origins) != count or self.origins.block_size() > self._origin_room:
            raise ConfigurationError(
                f"checkpoint of {count} samples has {len(self.origins)} origins, or more than the "
                f"{self._origin_room} bytes reserved for them"
            )
        self.page_size = check_page_size(state["page_size"])
        self._data_start, self._pos = int(state["data_start"]), int(state["data_bytes"])
        if self._data_start != _align(self._head_end, self.page_size):
            raise ConfigurationError(f"checkpoint's data region starts at {self._data_start}, not at a page")
        self.metadata[:count] = metadata
        self._allocs = [tuple(int(v) for v in row) for row in allocs.tolist()]
        self.count = count
        self._fp.truncate(self._data_start + self._pos)

    def _write_sample(self, index, metas, payloads, origin):
        """Place the sample's payloads in the current page (the next one if they do not fit). An
        empty payload is followed by one zero byte: ffcv's reader looks a payload's size up by its
        offset alone, so two allocations must never share an offset."""
        total = sum(0 if p is None else max(int(p.nbytes), 1) for p in payloads)
        room = self._origin_room_with(origin)
        if index >= self.metadata.shape[0] or room != self._origin_room:  # the head's room is used up
            if room != self._origin_room and self.before_grow is not None:
                self.before_grow()
            self._origin_room = room
            rows = self.metadata.shape[0]
            self._reserve_rows(min(self.num_samples, 2 * rows) if index >= rows else rows)
            self._move_data(_align(self._head_end, self.page_size))
        self.origins.append(origin)
        if total > self.page_size:
            self._grow(total)
        page_left = self.page_size - self._pos % self.page_size
        if total > page_left and self._pos % self.page_size:
            self._pad(page_left)
        records = [column[index : index + 1] for column in self._columns]
        for pos, data in self._lay_out(records, metas, payloads, self._pos, empty_gap=1):
            self._allocs.append((index, pos, data.nbytes))
            self._out.write(data if data.nbytes else b"\0")
            self._pos = pos + max(data.nbytes, 1)

    def _pad(self, n: int) -> None:
        self._out.write(bytes(n))
        self._pos += n

    def _grow(self, sample_bytes: int) -> None:
        """Raise the page size to fit a ``sample_bytes`` sample; pages written so far nest in the
        new, larger pages, so only the data region's start moves (data shifted once)."""
        new_page = _next_pow2(sample_bytes)
        if new_page > MAX_PAGE_SIZE:
            raise FieldError(
                f"sample {self.count} needs {sample_bytes} bytes; a .beton page holds at most {MAX_PAGE_SIZE}",
                sample=self.count,
            )
        if self.before_grow is not None:
            self.before_grow()
        self.page_size = new_page
        self._move_data(_align(self._head_end, new_page))
        if self._pos % new_page:
            self._pad(new_page - self._pos % new_page)

    def _move_data(self, new_start: int) -> None:
        """Move the data written so far to start at byte ``new_start`` (``>=`` the current start);
        the bytes it leaves (now padding before the first page) are zeroed, so that no stale payload
        stays in the file."""
        self._out.flush()
        shift = new_start - self._data_start
        if shift and self._pos:
            chunk = 1 << 24
            end = self._pos
            while end > 0:  # move backwards so the regions may overlap
                start = max(0, end - chunk)
                data = os.pread(self._fp.fileno(), end - start, self._data_start + start)
                os.pwrite(self._fp.fileno(), data, new_start + start)
                end = start
            for start in range(self._data_start, min(new_start, self._data_start + self._pos), chunk):
                os.pwrite(
                    self._fp.fileno(), bytes(min(chunk, min(new_start, self._data_start + self._pos) - start)), start
                )
        self._data_start = new_start
        self._out.seek(self._data_start + self._pos)

    def _finalize(self) -> None:
        """Pad the last page, make the pointers absolute, write metadata, allocation table and
        header; fsync."""
        origins = self.origins.block()
        if self._pos == 0:  # no payloads at all: the table follows the rows written (as in ffcv), info, origins
            self._data_start = (
                HEADER_TYPE.itemsize
                + self._desc.nbytes
                + self.count * self.metadata.itemsize
                + len(self._info_block)
                + len(origins)
            )
            self._out.seek(self._data_start)
        if self._pos % self.page_size:
            self._pad(self.page_size - self._pos % self.page_size)
        base = np.uint64(self._data_start)
        for f, column in zip(self._field_list, self._columns):
            if f.has_payload:
                f.get_pointer(column[: self.count])[...] += base
        table = np.array(self._allocs, dtype=ALLOC_TYPE)
        if table.size:
            table["ptr"] += base
        self._out.write(table.tobytes())
        self._out.flush()
        header = np.zeros((), dtype=HEADER_TYPE)
        header["version"] = VERSION
        header["num_fields"] = len(self.fields)
        header["page_size"] = self.page_size
        header["num_samples"] = self.count
        header["alloc_table_ptr"] = self._data_start + self._pos
        # the info and origin blocks follow the rows written (fewer than reserved when inputs were skipped)
        head = (
            header.tobytes() + self._desc.tobytes() + self.metadata[: self.count].tobytes() + self._info_block + origins
        )
        os.pwrite(self._fp.fileno(), head, 0)
        os.fsync(self._fp.fileno())


def read_header(path: str, source) -> np.void:
    """Read the header through ``source`` (``.read(start, stop) -> bytes``, ``.size`` bytes) and check
    the range of every header field, the one place that does: the version, at least one field whose
    descriptors fit in the file, a power-of-two page size, an allocation table inside the file made
    of whole entries (``num_samples`` is checked against the file once the fields give the metadata
    row's size, in :func:`open_beton`). Raises DatasetError naming the field and the cause."""
    size = int(source.size)
    raw = source.read(0, min(HEADER_TYPE.itemsize, size))
    if len(raw) < HEADER_TYPE.itemsize:
        raise dataset_error(path, "not a .beton dataset (file shorter than the header)")
    header = np.frombuffer(raw, dtype=HEADER_TYPE)[0]
    if int(header["version"]) != VERSION:
        raise dataset_error(
            path, f"not a .beton v{VERSION} dataset (format version field reads {int(header['version'])})"
        )
    num_fields, page_size, table_ptr = (int(header[k]) for k in ("num_fields", "page_size", "alloc_table_ptr"))
    if num_fields == 0 or page_size == 0 or page_size & (page_size - 1):
        raise dataset_error(path, f"corrupt header (num_fields={num_fields}, page_size={page_size})")
    if HEADER_TYPE.itemsize + num_fields * FIELD_DESC_TYPE.itemsize > size:
        raise dataset_error(path, "truncated (field descriptors cut off)")
    if table_ptr > size:
        raise dataset_error(path, f"truncated or corrupt: allocation table at {table_ptr}, file size {size} bytes")
    if (size - table_ptr) % ALLOC_TYPE.itemsize:
        raise dataset_error(path, "truncated (allocation table is not a whole number of entries)")
    return header


def read_info(path: str, source, start: int, end: int, head: bytes) -> tuple[dict, int | None]:
    """The dataset-level ``info`` stored at byte ``start`` (the metadata's end), if ``head`` (the
    bytes read there, up to ``len(INFO_MAGIC) + 8``) begins with :data:`INFO_MAGIC`; the block must
    end by ``end`` (the first payload or the allocation table); the JSON is read through ``source``
    (``.read(start, stop) -> bytes``).

    Returns:
        ``(info, block_end)``: the JSON object and the byte where the info block ends (where an
        origin block may follow, :mod:`.origins`); ``({}, None)`` when absent (ffcv's files, older
        ffload files).

    Raises:
        DatasetError: a block that runs past ``end`` or whose JSON is not an object.
    """
    size = len(INFO_MAGIC) + 8
    if end - start < size or len(head) < size or head[: len(INFO_MAGIC)] != INFO_MAGIC:
        return {}, None
    length = int(np.frombuffer(head[len(INFO_MAGIC) : size], "<u8")[0])
    if length > end - start - size:
        raise dataset_error(path, f"info block of {length} bytes at {start} runs past the data at {end} (corrupt file)")
    try:
        info = json.loads(source.read(start + size, start + size + length).decode("utf8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise dataset_error(path, f"info block at {start} is not UTF-8 JSON: {e}") from e
    if not isinstance(info, dict):
        raise dataset_error(path, f"info block at {start} holds a JSON {type(info).__name__}, not an object")
    return info, start + size + length


def read_fields(path: str, source, num_fields: int) -> dict[str, Field]:
    """The fields named by the ``num_fields`` field descriptors that follow the header (one read
    through ``source``), in order. Raises DatasetError for a name that is not 1..16 printable ASCII
    characters NUL padded, an unknown type id (a custom ffcv field), a duplicate name, or arguments
    its type refuses."""
    desc_end = HEADER_TYPE.itemsize + num_fields * FIELD_DESC_TYPE.itemsize
    desc = np.frombuffer(source.read(HEADER_TYPE.itemsize, desc_end), dtype=FIELD_DESC_TYPE)
    fields: dict[str, Field] = {}
    for k, d in enumerate(desc):
        raw_name = d["name"].tobytes()
        name = raw_name.split(b"\0", 1)[0].decode("ascii", "replace")
        if not name or not name.isprintable() or not name.isascii() or raw_name[len(name) :].strip(b"\0"):
            raise dataset_error(
                path,
                f"field {k}: its name {raw_name!r} is not 1..{NAME_LEN} printable ASCII "
                "characters, NUL padded (corrupt field descriptor)",
            )
        cls = FIELD_TYPES.get(int(d["type_id"]))
        if cls is None:
            raise dataset_error(path, f"field {name!r} has unknown type id {int(d['type_id'])} (a custom ffcv field)")
        if name in fields:
            raise dataset_error(path, f"duplicate field name {name!r}")
        try:
            fields[name] = cls.from_binary(d["arguments"])
        except (ValueError, TypeError) as e:
            raise dataset_error(path, f"field {name!r} (type id {int(d['type_id'])}): {e}") from e
    return fields


def read_allocation_table(path: str, source, header: np.void, fields: dict[str, Field]) -> np.ndarray:
    """The ``(P,) ALLOC_TYPE`` allocation table, from the header's ``alloc_table_ptr`` to the end of
    the file (one read). Raises DatasetError unless it holds one entry per payload, as ffcv's and
    ffload's writers write (``num_samples`` times the fields with payloads)."""
    n, table_ptr = int(header["num_samples"]), int(header["alloc_table_ptr"])
    table = np.frombuffer(source.read(table_ptr, int(source.size)), dtype=ALLOC_TYPE)
    payload_fields = [name for name, f in fields.items() if f.has_payload]
    if table.size != n * len(payload_fields):
        raise dataset_error(
            path,
            f"the allocation table holds {table.size} payloads, but {n} samples of "
            f"{len(payload_fields)} field(s) with payloads ({', '.join(payload_fields) or 'none'})"
            f" have {n * len(payload_fields)}: a field's type does not match the data "
            "(corrupt field type or table)",
        )
    return table


def check_allocations(path: str, table: np.ndarray, num_samples: int, meta_end: int, table_ptr: int) -> None:
    """Every allocation of ``table`` lies between the metadata's end ``meta_end`` and the table at
    ``table_ptr`` (bytes) and names a sample below ``num_samples``. Raises DatasetError."""
    ends = table["ptr"] + table["size"]
    if table.size and (
        ends.max() > table_ptr
        or table["ptr"].min() < meta_end
        or table["sample_id"].max() >= num_samples
        or np.any(ends < table["ptr"])
    ):
        raise dataset_error(path, "allocation table points outside the data region")


def payload_sizes(
    path: str, fields: dict[str, Field], metadata: np.ndarray, table: np.ndarray
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Each payload's offset (from the metadata) and size (from its allocation), checked by its field.

    A payload's allocation is looked up by (ptr, sample id). A zero-size payload shares its offset
    with the next payload of the same sample, so one (ptr, sample id) can hold several
    allocations: the fields sharing that offset take them in field order, zero-size ones first
    (the writer lays a sample's payloads out in field order; payloads never overlap).

    Args:
        metadata: ``(N,)`` :func:`~.fields.base.metadata_dtype` records (sub-fields f0, f1, ...).
        table: the checked allocation table (:func:`check_allocations`).
    Returns:
        ``(ptrs, sizes)``: field name -> ``(N,) uint64`` offsets, and sizes in bytes, for the fields
        with payloads.
    Raises:
        DatasetError: a payload offset with no allocation, or sizes its field's metadata refuses.
    """
    n = metadata.shape[0]
    order = np.lexsort((table["sample_id"], table["ptr"]))
    t_ptr, t_sid, t_size = table["ptr"][order], table["sample_id"][order], table["size"][order]
    pointers = {
        name: f.get_pointer(metadata[f"f{k}"]).astype(np.uint64)
        for k, (name, f) in enumerate(fields.items())
        if f.has_payload
    }
    sid = np.arange(n, dtype=np.uint64)
    ptrs, sizes = {}, {}
    for k, (name, f) in enumerate(fields.items()):
        if not f.has_payload:
            continue
        col = metadata[f"f{k}"]
        p = pointers[name]
        pos = np.searchsorted(t_ptr, p)
        pos_c = np.minimum(pos, max(len(t_ptr) - 1, 0))
        nxt = np.minimum(pos_c + 1, max(len(t_ptr) - 1, 0))
        found = (pos < len(t_ptr)) & (t_ptr[pos_c] == p) & (t_sid[pos_c] == sid) if len(t_ptr) else np.zeros(n, bool)
        shared = found & (nxt > pos_c) & (t_ptr[nxt] == p) & (t_sid[nxt] == sid) if len(t_ptr) else np.zeros(n, bool)
        for i in np.flatnonzero(~found | shared):  # rare: the offset is not first, or is shared
            lo, hi = np.searchsorted(t_ptr, p[i]), np.searchsorted(t_ptr, p[i], side="right")
            group = lo + np.flatnonzero(t_sid[lo:hi] == i)
            if group.size == 0:
                raise dataset_error(
                    path,
                    f"sample {int(i)}, field {name!r}: payload offset {int(p[i])} is "
                    "not in the allocation table (corrupt file)",
                )
            group = group[np.argsort(t_size[group], kind="stable")]
            rank = [m for m in pointers if pointers[m][i] == p[i]].index(name)
            pos_c[i] = group[min(rank, group.size - 1)]
        ptrs[name], sizes[name] = p, t_size[pos_c].astype(np.uint64)
        problem = f.check_payloads(col, sizes[name])
        if problem:
            raise dataset_error(path, f"field {name!r}: {problem}")
    return ptrs, sizes


def open_beton(path: str, source=None) -> DatasetView:
    """Open a ``.beton`` file (written by ffload or ffcv) and validate every offset: the header
    (:func:`read_header`), the field descriptors (:func:`read_fields`), the metadata table's bounds,
    the allocation table (:func:`read_allocation_table`, :func:`check_allocations`), the metadata
    with the info block (:func:`read_info`), each payload (:func:`payload_sizes`), then the fields'
    values (:func:`~.view.check_field_values`).

    Args:
        path: the file, or the URL of a remote object (``s3://bucket/key``).
        source: what to read the bytes from: ``size`` (bytes) and ``read(start, stop) -> bytes``;
            ``None``: the local file ``path`` (:class:`LocalBytes`). A remote one
            (:class:`ffload.storage.RemoteObject`) is read with four range reads (header, field
            descriptors, allocation table, metadata table with the head of the info block; a
            fifth for the info JSON when there is one) and the view gets ``remote=source``
            and no ``data_path``: its payloads are read by the Loader's page cache.

    Returns:
        the view; its ``origin_blocks`` is ``[(offset, limit)]``, where an origin block would start
        (the info block's end) and the byte it must end by (the first payload or the allocation
        table), or None for a file without an info block (:mod:`.origins` reads it from there).

    Raises:
        DatasetError: not a .beton, wrong version, truncated, unknown field type, or any payload
            or allocation pointing outside the file.
        StorageError: a remote read failed (see :mod:`ffload.storage`).
    """
    remote = source is not None
    source = LocalBytes(path) if source is None else source
    size = int(source.size)
    header = read_header(path, source)
    n, page_size, table_ptr = (int(header[k]) for k in ("num_samples", "page_size", "alloc_table_ptr"))
    fields = read_fields(path, source, int(header["num_fields"]))
    desc_end = HEADER_TYPE.itemsize + len(fields) * FIELD_DESC_TYPE.itemsize
    mtype = metadata_dtype(list(fields.values()))
    meta_end = desc_end + n * mtype.itemsize
    if meta_end > size or not meta_end <= table_ptr:
        raise dataset_error(
            path,
            f"truncated or corrupt: metadata ends at {meta_end}, allocation table "
            f"at {table_ptr}, file size {size} bytes",
        )
    table = read_allocation_table(path, source, header, fields)
    # the metadata and the head of the info block after it, in one read
    info_end = int(table["ptr"].min()) if table.size else table_ptr
    info_head = len(INFO_MAGIC) + 8 if info_end - meta_end >= len(INFO_MAGIC) + 8 else 0
    block = source.read(desc_end, meta_end + info_head)
    metadata = np.frombuffer(bytearray(block[: meta_end - desc_end]), dtype=mtype) if n else np.zeros(0, mtype)
    info, origins_at = read_info(path, source, meta_end, info_end, block[meta_end - desc_end :])
    check_allocations(path, table, n, meta_end, table_ptr)
    ptrs, sizes = payload_sizes(path, fields, metadata, table)
    named = metadata.view(named_metadata_dtype(fields))
    check_field_values(path, fields, named)
    return DatasetView(
        path=path,
        format="beton",
        num_samples=n,
        fields=fields,
        metadata=named,
        ptrs=ptrs,
        sizes=sizes,
        data_path=None if remote else path,
        data_size=size,
        page_size=page_size,
        info=info,
        remote=source if remote else None,
        origin_blocks=None if origins_at is None else [(origins_at, min(info_end, table_ptr))],
    )
