"""Provenance: where each stored sample came from, kept in the dataset beside its samples.

A conversion records, for every sample it writes, one *origin string* (its file path relative to
the source root, its WebDataset shard and ``__key__``, its Hugging Face row, ...), and once, in the
dataset's ``info``, a descriptor saying how to read those strings (``info["origin"]``, see
:func:`origin_fields`)::

    {"source": "imagefolder", "id": "path"}
    {"source": "webdataset", "id": "key", "part": "shard", "parts": ["a.tar", ...]}
    {"source": "cifar10", "id": "row", "int": true, "part": "file", "parts": ["data_batch_1", ...]}

With ``parts``, an origin string is ``"<part number>:<id>"``; without, it is the id.

The strings of a dataset's samples are one *origin block* (:class:`OriginLog` writes it,
:class:`OriginBlock` reads it), a compact table that costs no Python object per sample::

    ORIGIN_MAGIC (16 bytes) | count <u8 | blob bytes <u8 | ends: count x <u8 | blob (UTF-8, end to end)

sample ``i``'s string is ``blob[ends[i-1]:ends[i]]`` (``ends[-1]`` read as 0). Where it lives:

* ``.beton`` (and each shard of a sharded dataset): right after the ``info`` block, in the padding
  before the first data page, which ffcv's reader never reads (:mod:`.beton`); the file stays
  byte-compatible with ffcv 1.0.2;
* LMDB: the value of the key :data:`ORIGINS_KEY`.

:func:`dataset_origins` opens it for any dataset (lazily: the loaders never read it). Datasets
written before provenance existed, or by ffcv, have none (``None``).
"""
from __future__ import annotations

import os
from array import array

import numpy as np

from ffload.formats.view import DatasetView, dataset_error

__all__ = ["ORIGIN_MAGIC", "ORIGINS_KEY", "BLOCK_HEAD", "OriginLog", "OriginBlock", "Origins", "dataset_origins",
           "origin_fields", "origin_key"]

ORIGIN_MAGIC = b"ffload-origins\0\0"
ORIGINS_KEY = b"__ffload_origins__"
BLOCK_HEAD = len(ORIGIN_MAGIC) + 16
"""Bytes of an origin block's fixed head: the magic, the count and the blob size."""


def _encode(origin: str) -> bytes:
    """UTF-8; file names that are not UTF-8 keep their bytes (``surrogateescape``, as ``os.fsencode``)."""
    return origin.encode("utf8", "surrogateescape")


def _decode(raw: bytes) -> str:
    """The inverse of :func:`_encode`: UTF-8 with ``surrogateescape``, so a byte that is not UTF-8 comes back as
    the same lone surrogate and ``os.fsencode(origin)`` gives the file name's bytes back."""
    return raw.decode("utf8", "surrogateescape")


class OriginLog:
    """The origin strings of the samples written so far, for one container's origin block.

    Memory: the strings' UTF-8 bytes end to end plus 8 bytes per sample (no object per sample).
    ``None`` is stored as an empty string; a log that was only ever given ``None`` writes no block.
    """

    def __init__(self):
        self._blob = bytearray()
        self._ends = array("Q")
        self.given = False

    def __len__(self) -> int:
        return len(self._ends)

    def append(self, origin: str | None) -> None:
        """Add the next sample's origin (``str``, or ``None`` when unknown)."""
        if origin is not None:
            self.given = True
            self._blob += _encode(origin)
        self._ends.append(len(self._blob))

    def block_size(self, *more: str | None) -> int:
        """Bytes of :meth:`block` once the origins ``more`` are appended too (none: as it is now;
        0 while no origin was given)."""
        if not self.given and all(o is None for o in more):
            return 0
        extra = sum(len(_encode(o)) for o in more if o is not None)
        return BLOCK_HEAD + 8 * (len(self._ends) + len(more)) + len(self._blob) + extra

    def block(self) -> bytes:
        """The origin block (see the module docstring); ``b""`` when no origin was given."""
        if not self.given:
            return b""
        head = np.array([len(self._ends), len(self._blob)], "<u8").tobytes()
        return ORIGIN_MAGIC + head + np.frombuffer(self._ends, np.uint64).astype("<u8").tobytes() + bytes(self._blob)

    def records(self, start: int) -> bytes:
        """Samples ``start..`` as appendable records (``<u4`` length, then the UTF-8 bytes), for a
        journal (:mod:`ffload.convert.journal`); :meth:`extend_records` reads them back."""
        out = bytearray()
        for i in range(start, len(self._ends)):
            a = self._ends[i - 1] if i else 0
            piece = self._blob[a:self._ends[i]]
            out += len(piece).to_bytes(4, "little") + piece
        return bytes(out)

    def extend_records(self, data: bytes, given: bool) -> None:
        """Append the samples of :meth:`records`' bytes ``data``; ``given``: whether the log that
        wrote them had been given an origin. Raises ValueError for truncated records."""
        pos = 0
        while pos < len(data):
            if pos + 4 > len(data):
                raise ValueError("truncated origin record")
            size = int.from_bytes(data[pos:pos + 4], "little")
            if pos + 4 + size > len(data):
                raise ValueError("truncated origin record")
            self._blob += data[pos + 4:pos + 4 + size]
            self._ends.append(len(self._blob))
            pos += 4 + size
        self.given = self.given or given


class OriginBlock:
    """One origin block read through ``source`` (``size``, ``read(start, stop) -> bytes``: a local
    file, a remote object, or bytes in memory) at byte ``offset``; the ends are read on first use.

    Args:
        path: the file or database, for messages.
        limit: the block must end by this byte (the first data page).
    Raises:
        DatasetError: a block whose counts run past ``limit`` (corrupt file).
    """

    def __init__(self, path: str, source, offset: int, count: int, blob_bytes: int, limit: int):
        self.path, self._source, self._offset = path, source, offset
        self.count, self._blob_bytes = count, blob_bytes
        if offset + BLOCK_HEAD + 8 * count + blob_bytes > limit:
            raise dataset_error(path, f"origin block at {offset} ({count} entries, {blob_bytes} bytes) runs past "
                                      f"byte {limit} (corrupt file)")
        self._ends: np.ndarray | None = None

    @classmethod
    def find(cls, path: str, source, offset: int, limit: int) -> OriginBlock | None:
        """The block at ``offset`` if one starts there (:data:`ORIGIN_MAGIC`), else None."""
        if limit - offset < BLOCK_HEAD:
            return None
        head = source.read(offset, offset + BLOCK_HEAD)
        if head[:len(ORIGIN_MAGIC)] != ORIGIN_MAGIC:
            return None
        count, blob_bytes = (int(v) for v in np.frombuffer(head[len(ORIGIN_MAGIC):], "<u8"))
        return cls(path, source, offset, count, blob_bytes, limit)

    def ends(self) -> np.ndarray:
        """``(count,) int64`` end offsets of the strings in the blob (checked non-decreasing)."""
        if self._ends is None:
            start = self._offset + BLOCK_HEAD
            ends = np.frombuffer(self._source.read(start, start + 8 * self.count), "<u8").astype(np.int64)
            if ends.size and (ends[0] < 0 or np.any(np.diff(ends) < 0) or ends[-1] > self._blob_bytes):
                raise dataset_error(self.path, f"origin block at {self._offset}: offsets out of order (corrupt file)")
            self._ends = ends
        return self._ends

    def strings(self, start: int, stop: int) -> list[str]:
        """The origin strings of entries ``start..stop-1`` (one read; a name that is not UTF-8 keeps its bytes as
        lone surrogates, :func:`_decode`).

        Raises:
            DatasetError: the block's end offsets are out of order or run past its blob (corrupt file).
        """
        ends = self.ends()
        if start >= stop:
            return []
        a = int(ends[start - 1]) if start else 0
        blob0 = self._offset + BLOCK_HEAD + 8 * self.count
        raw = self._source.read(blob0 + a, blob0 + int(ends[stop - 1]))
        cuts = (ends[start:stop] - a).tolist()
        return [_decode(raw[lo:hi]) for lo, hi in zip([0] + cuts[:-1], cuts)]


class _Bytes:
    """Bytes in memory with the ``size`` / ``read(start, stop)`` interface of :class:`OriginBlock`."""

    def __init__(self, data: bytes):
        self.data, self.size = data, len(data)

    def read(self, start: int, stop: int) -> bytes:
        return self.data[start:stop]


class Origins:
    """The origins of a dataset's samples: ``origins[i]`` is sample ``i``'s origin string,
    :meth:`describe` its parts as a dict (:func:`origin_fields`), :meth:`key` a WebDataset key.

    Attributes:
        descriptor: ``info["origin"]`` (see the module docstring).
        blocks: the :class:`OriginBlock` of each container (shard), in sample order.
    """

    def __init__(self, descriptor: dict, blocks: list[OriginBlock]):
        self.descriptor, self.blocks = descriptor, blocks
        self._bases = np.cumsum([0] + [b.count for b in blocks])

    def __len__(self) -> int:
        return int(self._bases[-1])

    def strings(self, start: int, stop: int) -> list[str]:
        """The origin strings of samples ``start..stop-1`` (reads at most one range per shard).

        Raises:
            DatasetError: a shard's block is corrupt (:meth:`OriginBlock.strings`).
        """
        out: list[str] = []
        for k, block in enumerate(self.blocks):
            lo, hi = max(start, int(self._bases[k])), min(stop, int(self._bases[k + 1]))
            if lo < hi:
                out += block.strings(lo - int(self._bases[k]), hi - int(self._bases[k]))
        return out

    def __getitem__(self, i: int) -> str:
        if not 0 <= i < len(self):
            raise IndexError(f"sample {i} out of range ({len(self)} samples)")
        return self.strings(i, i + 1)[0]

    def describe(self, i: int) -> dict:
        """Sample ``i``'s origin as a dict (:func:`origin_fields`)."""
        return origin_fields(self.descriptor, self[i])


def origin_fields(descriptor: dict, origin: str) -> dict:
    """An origin string as a dict: ``{"path": ...}``, ``{"shard": ..., "key": ...}``,
    ``{"file": ..., "row": 12}``, ``{"row": 12}``, ``{"index": 12}`` (the descriptor's ``part`` and
    ``id`` name the keys; ``int`` ids become ``int``). A string that does not fit the descriptor
    is returned as ``{"origin": string}``."""
    id_name = str(descriptor.get("id", "origin"))
    out = {}
    value = origin
    parts = descriptor.get("parts")
    if isinstance(parts, list):
        number, sep, value = origin.partition(":")
        if not sep or not number.isdigit() or int(number) >= len(parts):
            return {"origin": origin}
        out[str(descriptor.get("part", "part"))] = parts[int(number)]
    if descriptor.get("int"):
        if not value.isdigit():
            return {"origin": origin}
        value = int(value)
    out[id_name] = value
    return out


def origin_key(descriptor: dict, origin: str) -> str:
    """A WebDataset ``__key__`` for an origin: a WebDataset key as it was, a file path without its
    extension (other dots of the file name become ``_``: WebDataset splits a name at its first
    dot), an integer id as 8 digits after its part's name (``data_batch_1/00001234``)."""
    fields = origin_fields(descriptor, origin)
    if "origin" in fields:
        return _keyable(origin)
    value = fields[str(descriptor.get("id"))]
    if isinstance(value, int):
        part = descriptor.get("part")
        prefix = _keyable(os.path.splitext(str(fields[part]))[0]) + "/" if part in fields else ""
        return f"{prefix}{value:08d}"
    if descriptor.get("id") == "path":
        value = os.path.splitext(value)[0]
    return _keyable(value)


def _keyable(text: str) -> str:
    """``text`` with the dots of its last ``/`` component replaced (WebDataset's key ends there)."""
    head, sep, tail = text.replace("\\", "/").rpartition("/")
    return f"{head}{sep}{tail.replace('.', '_')}" or "_"


def dataset_origins(view: DatasetView) -> Origins | None:
    """The :class:`Origins` of ``view`` (a ``.beton``, LMDB, or sharded dataset, local or remote),
    or None when it has none (no ``info["origin"]``, or no block: ffcv's files).

    Raises:
        DatasetError: a block that is corrupt, or whose count is not the dataset's sample count.
    """
    descriptor = view.info.get("origin")
    if not isinstance(descriptor, dict):
        return None
    if view.format == "lmdb":
        blocks = [_lmdb_block(view.path)]
    elif view.shards is not None:
        blocks = [_beton_block(path, _shard_source(view, k)) for k, path in enumerate(view.shards.paths)]
    else:
        blocks = [_beton_block(view.path, view.remote)]
    if any(b is None for b in blocks):
        return None
    origins = Origins(descriptor, blocks)
    if len(origins) != view.num_samples:
        raise dataset_error(view.path, f"origin table holds {len(origins)} entries for {view.num_samples} samples "
                                       "(corrupt file)")
    return origins


def _shard_source(view: DatasetView, k: int):
    """The byte source of shard ``k`` of a sharded view: its RemoteObject, or None (a local file)."""
    return None if view.remote is None else view.remote.remotes[k]


def _beton_block(path: str, source) -> OriginBlock | None:
    """The origin block of the ``.beton`` at ``path`` (read through ``source``, None: the local
    file): after the metadata table and the info block."""
    from ffload.formats.beton import FIELD_DESC_TYPE, HEADER_TYPE, INFO_MAGIC, LocalBytes, read_header
    from ffload.formats.fields.base import FIELD_TYPES, metadata_dtype

    source = LocalBytes(path) if source is None else source
    header = read_header(path, source)
    num_fields = int(header["num_fields"])
    desc = np.frombuffer(source.read(HEADER_TYPE.itemsize, HEADER_TYPE.itemsize + num_fields *
                                     FIELD_DESC_TYPE.itemsize), FIELD_DESC_TYPE)
    fields = [FIELD_TYPES[int(d["type_id"])].from_binary(d["arguments"]) for d in desc]
    offset = HEADER_TYPE.itemsize + desc.nbytes + int(header["num_samples"]) * metadata_dtype(fields).itemsize
    head = source.read(offset, offset + len(INFO_MAGIC) + 8)
    if head[:len(INFO_MAGIC)] != INFO_MAGIC:
        return None
    offset += len(INFO_MAGIC) + 8 + int(np.frombuffer(head[len(INFO_MAGIC):], "<u8")[0])
    return OriginBlock.find(path, source, offset, int(header["alloc_table_ptr"]))


def _lmdb_block(path: str) -> OriginBlock | None:
    """The origin block stored under :data:`ORIGINS_KEY` in the LMDB database at ``path``."""
    from ffload.formats.lmdb_format import _open_env, _release_env

    env, key = _open_env(path)
    try:
        with env.begin() as txn:
            raw = txn.get(ORIGINS_KEY)
    finally:
        _release_env(key)
    return None if raw is None else OriginBlock.find(path, _Bytes(bytes(raw)), 0, len(raw))
