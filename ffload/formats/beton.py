"""FFCV's ``.beton`` v2 container, both directions, byte-compatible with ffcv 1.0.2.

Layout (all little-endian; the dtypes below are FFCV's ``ffcv/types.py``)::

    header            HeaderType: version <u2 (=2), num_fields <u2, page_size <u4,
                      num_samples <u8, alloc_table_ptr <u8            (aligned: 24 bytes)
    field descriptors num_fields x FieldDescType: type_id <u1, name 16 x u1 (NUL padded ASCII),
                      arguments 1024 x u1                             (1041 bytes each)
    metadata          num_samples x metadata_dtype(fields)            (aligned struct of the
                      fields' metadata records)
    zero padding      to a multiple of page_size
    data pages        page_size bytes each; a sample's payloads never straddle a page; the last
                      page is written in full (zero padded)
    allocation table  one (sample_id <u8, ptr <u8, size <u8) per payload, up to end of file

ffload differs from ffcv's writer only where ffcv fails: a sample larger than the page size gets
a larger (power-of-two) page size instead of "Tried allocating ... but page size is ...", which
ffcv's reader and loader accept as any other page size. Pages are filled in sample order.
"""
from __future__ import annotations

import io
import os
from typing import Dict, List, Optional, Sequence

import numpy as np

from .fields import FIELD_TYPES, Field, metadata_dtype, named_metadata_dtype
from .view import DatasetView, dataset_error

VERSION = 2
HEADER_TYPE = np.dtype([("version", "<u2"), ("num_fields", "<u2"), ("page_size", "<u4"),
                        ("num_samples", "<u8"), ("alloc_table_ptr", "<u8")], align=True)
FIELD_DESC_TYPE = np.dtype([("type_id", "<u1"), ("name", ("<u1", 16)),
                            ("arguments", ("<u1", (1024,)))], align=True)
ALLOC_TYPE = np.dtype([("sample_id", "<u8"), ("ptr", "<u8"), ("size", "<u8")])

MIN_PAGE_SIZE = 1 << 21  # 2 MiB, ffcv's minimum
DEFAULT_PAGE_SIZE = 1 << 23  # 8 MiB, ffcv's default (4 * MIN_PAGE_SIZE)
MAX_PAGE_SIZE = 1 << 31  # the largest power of two below ffcv's uint32 limit
NAME_LEN = 16


def _align(x: int, a: int) -> int:
    return (x + a - 1) // a * a


def _next_pow2(x: int) -> int:
    return 1 << max(0, int(x - 1).bit_length())


def check_page_size(page_size: int) -> int:
    """Validate a user page size (bytes): a power of two in [2 MiB, 2 GiB]. Raises ValueError."""
    page_size = int(page_size)
    if page_size & (page_size - 1) or not MIN_PAGE_SIZE <= page_size <= MAX_PAGE_SIZE:
        raise ValueError(f"page_size must be a power of two between {MIN_PAGE_SIZE} and "
                         f"{MAX_PAGE_SIZE} bytes, got {page_size}")
    return page_size


def field_descriptors(fields: Dict[str, Field]) -> np.ndarray:
    """The ``(num_fields,) FIELD_DESC_TYPE`` array describing ``fields`` (names <= 16 ASCII bytes)."""
    desc = np.zeros(len(fields), dtype=FIELD_DESC_TYPE)
    for i, (name, f) in enumerate(fields.items()):
        try:
            encoded = name.encode("ascii")
        except UnicodeEncodeError:
            raise ValueError(f"field name {name!r} must be ASCII (.beton stores 16 ASCII bytes)")
        if not 0 < len(encoded) <= NAME_LEN or b"\0" in encoded:
            raise ValueError(f"field name {name!r} must be 1..{NAME_LEN} ASCII characters")
        desc[i]["type_id"] = f.type_id
        desc[i]["name"][: len(encoded)] = np.frombuffer(encoded, dtype=np.uint8)
        desc[i]["arguments"][:] = f.to_binary()
    return desc


class BetonWriter:
    """Streams samples, in index order, into a ``.beton`` file at ``path``.

    Use :meth:`add` for samples ``0, 1, 2, ...`` in order, then :meth:`close`. The caller owns
    atomicity (write to a temporary name, rename after ``close``): see ``formats.writer``.

    Args:
        path: output file (created/truncated).
        fields: name -> Field, in order.
        num_samples: at most this many samples will be added (the metadata table precedes the
            data, so room is reserved up front); fewer may be (skipped inputs): the file then
            records the number actually added, and the unused room stays as padding before the
            first page.
        page_size: bytes, power of two >= 2 MiB; grows automatically for larger samples.
    """

    def __init__(self, path: str, fields: Dict[str, Field], num_samples: int,
                 page_size: int = DEFAULT_PAGE_SIZE):
        self.path = path
        self.fields = dict(fields)
        self._field_list = list(self.fields.values())
        self.num_samples = int(num_samples)
        self.page_size = check_page_size(page_size)
        self.metadata = np.zeros(self.num_samples, dtype=metadata_dtype(self._field_list))
        self._desc = field_descriptors(self.fields)
        self._meta_end = HEADER_TYPE.itemsize + self._desc.nbytes + self.metadata.nbytes
        self._data_start = _align(self._meta_end, self.page_size)
        self._pos = 0  # bytes written into the data region
        self._allocs: List[np.ndarray] = []
        self._rel_ptrs: List[List[int]] = [[] for _ in self._field_list]  # per field, per sample
        self._next = 0
        self._fp = open(path, "w+b", buffering=0)
        self._out = io.BufferedWriter(self._fp, buffer_size=1 << 22)
        self._out.seek(self._data_start)

    def add(self, index: int, metas: Sequence, payloads: Sequence[Optional[np.ndarray]]) -> None:
        """Append sample ``index`` (must be the next one): its metadata records and payloads."""
        if index != self._next or index >= self.num_samples:
            raise ValueError(f"samples must be added in order, at most {self.num_samples}: "
                             f"expected {self._next}, got {index}")
        sizes = [0 if p is None else int(p.nbytes) for p in payloads]
        total = sum(sizes)
        if total > self.page_size:
            self._grow(total)
        page_left = self.page_size - self._pos % self.page_size
        if total > page_left and self._pos % self.page_size:
            self._pad(page_left)
        for k, (meta, payload) in enumerate(zip(metas, payloads)):
            self.metadata[f"f{k}"][index] = meta
            if payload is None:
                self._rel_ptrs[k].append(0)
                continue
            self._rel_ptrs[k].append(self._pos)
            self._allocs.append((index, self._pos, payload.nbytes))
            self._out.write(memoryview(np.ascontiguousarray(payload)).cast("B"))
            self._pos += payload.nbytes
        self._next += 1

    def _pad(self, n: int) -> None:
        self._out.write(bytes(n))
        self._pos += n

    def _grow(self, sample_bytes: int) -> None:
        """Raise the page size to fit a ``sample_bytes`` sample; pages written so far nest in the
        new, larger pages, so only the data region's start moves (data shifted once)."""
        new_page = _next_pow2(sample_bytes)
        if new_page > MAX_PAGE_SIZE:
            raise ValueError(f"sample {self._next} needs {sample_bytes} bytes; a .beton page holds "
                             f"at most {MAX_PAGE_SIZE}")
        new_start = _align(self._meta_end, new_page)
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
        self.page_size, self._data_start = new_page, new_start
        self._out.seek(self._data_start + self._pos)
        if self._pos % new_page:
            self._pad(new_page - self._pos % new_page)

    def close(self) -> None:
        """Pad the last page, write metadata, allocation table and header; fsync."""
        if self._pos == 0:  # no payloads at all: the table follows the metadata (as in ffcv)
            self._data_start = self._meta_end
            self._out.seek(self._data_start)
        if self._pos % self.page_size:
            self._pad(self.page_size - self._pos % self.page_size)
        base = np.uint64(self._data_start)
        for k, f in enumerate(self._field_list):
            if f.ptr_name is None:
                continue
            ptrs = np.asarray(self._rel_ptrs[k], dtype=np.uint64) + base
            col = self.metadata[f"f{k}"][: self._next]
            if f.ptr_name == "":
                col[:] = ptrs
            else:
                col[f.ptr_name] = ptrs
        table = np.array(self._allocs, dtype=ALLOC_TYPE)
        if table.size:
            table["ptr"] += base
        self._out.write(table.tobytes())
        self._out.flush()
        header = np.zeros((), dtype=HEADER_TYPE)
        header["version"] = VERSION
        header["num_fields"] = len(self.fields)
        header["page_size"] = self.page_size
        header["num_samples"] = self._next
        header["alloc_table_ptr"] = self._data_start + self._pos
        head = header.tobytes() + self._desc.tobytes() + self.metadata[: self._next].tobytes()
        os.pwrite(self._fp.fileno(), head, 0)
        os.fsync(self._fp.fileno())
        self._fp.close()

    def abort(self) -> None:
        """Close the file without finishing it (the caller deletes it)."""
        try:
            self._fp.close()
        except OSError:
            pass


def read_header(path: str, fp) -> np.void:
    """Read and sanity-check the header; raises DatasetError naming the cause."""
    raw = fp.read(HEADER_TYPE.itemsize)
    if len(raw) < HEADER_TYPE.itemsize:
        raise dataset_error(path, "not a .beton dataset (file shorter than the header)")
    header = np.frombuffer(raw, dtype=HEADER_TYPE)[0]
    if int(header["version"]) != VERSION:
        raise dataset_error(path, f"not a .beton v{VERSION} dataset (format version field reads "
                          f"{int(header['version'])})")
    return header


def open_beton(path: str) -> DatasetView:
    """Open a ``.beton`` file (written by ffload or ffcv) and validate every offset.

    Raises:
        DatasetError: not a .beton, wrong version, truncated, unknown field type, or any payload
            or allocation pointing outside the file.
    """
    size = os.path.getsize(path)
    with open(path, "rb") as fp:
        header = read_header(path, fp)
        num_fields, n = int(header["num_fields"]), int(header["num_samples"])
        page_size, table_ptr = int(header["page_size"]), int(header["alloc_table_ptr"])
        if num_fields == 0 or page_size == 0 or page_size & (page_size - 1):
            raise dataset_error(path, f"corrupt header (num_fields={num_fields}, page_size={page_size})")
        desc_end = HEADER_TYPE.itemsize + num_fields * FIELD_DESC_TYPE.itemsize
        if desc_end > size:
            raise dataset_error(path, "truncated (field descriptors cut off)")
        desc = np.frombuffer(fp.read(num_fields * FIELD_DESC_TYPE.itemsize), dtype=FIELD_DESC_TYPE)
        fields: Dict[str, Field] = {}
        for d in desc:
            name = d["name"].tobytes().split(b"\0", 1)[0].decode("ascii", "replace")
            cls = FIELD_TYPES.get(int(d["type_id"]))
            if cls is None:
                raise dataset_error(path, f"field {name!r} has unknown type id {int(d['type_id'])} "
                                  "(a custom ffcv field)")
            if name in fields:
                raise dataset_error(path, f"duplicate field name {name!r}")
            try:
                fields[name] = cls.from_binary(d["arguments"])
            except ValueError as e:
                raise dataset_error(path, f"field {name!r}: {e}") from e
        mtype = metadata_dtype(list(fields.values()))
        meta_end = desc_end + n * mtype.itemsize
        if meta_end > size or not meta_end <= table_ptr <= size:
            raise dataset_error(path, f"truncated or corrupt: metadata ends at {meta_end}, allocation table "
                              f"at {table_ptr}, file size {size} bytes")
        if (size - table_ptr) % ALLOC_TYPE.itemsize:
            raise dataset_error(path, "truncated (allocation table is not a whole number of entries)")
        metadata = np.fromfile(fp, dtype=mtype, count=n, offset=0) if n else np.zeros(0, mtype)
        fp.seek(table_ptr)
        table = np.frombuffer(fp.read(size - table_ptr), dtype=ALLOC_TYPE)
    ends = table["ptr"] + table["size"]
    if table.size and (ends.max() > table_ptr or table["ptr"].min() < meta_end
                       or table["sample_id"].max() >= n or np.any(ends < table["ptr"])):
        raise dataset_error(path, "allocation table points outside the data region")
    # Look up each payload's allocation by (ptr, sample id): a zero-size payload shares its
    # offset with the next one, so the offset alone can be ambiguous.
    order = np.lexsort((table["sample_id"], table["ptr"]))
    t_ptr, t_sid, t_size = table["ptr"][order], table["sample_id"][order], table["size"][order]
    ptrs, sizes = {}, {}
    for k, (name, f) in enumerate(fields.items()):
        if f.ptr_name is None:
            continue
        col = metadata[f"f{k}"]
        p = (col if f.ptr_name == "" else col[f.ptr_name]).astype(np.uint64)
        pos = np.searchsorted(t_ptr, p)
        pos_c = np.minimum(pos, max(len(t_ptr) - 1, 0))
        sid = np.arange(n, dtype=np.uint64)
        found = (pos < len(t_ptr)) & (t_ptr[pos_c] == p) & (t_sid[pos_c] == sid) if len(t_ptr) \
            else np.zeros(n, bool)
        for i in np.flatnonzero(~found):  # rare: several allocations at one offset
            hi = np.searchsorted(t_ptr, p[i], side="right")
            match = np.flatnonzero(t_sid[pos[i]:hi] == i)
            if match.size == 0:
                raise dataset_error(path, f"sample {int(i)}, field {name!r}: payload offset {int(p[i])} is "
                                  "not in the allocation table (corrupt file)")
            pos_c[i] = pos[i] + match[0]
        ptrs[name], sizes[name] = p, t_size[pos_c].astype(np.uint64)
        problem = f.check_payloads(col, sizes[name])
        if problem:
            raise dataset_error(path, f"field {name!r}: {problem}")
    named = metadata.view(named_metadata_dtype(fields))
    return DatasetView(path=path, format="beton", num_samples=n, fields=fields, metadata=named,
                       ptrs=ptrs, sizes=sizes, data_path=path, data_size=size, page_size=page_size)
