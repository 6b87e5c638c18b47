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

:func:`.dataset_origins.dataset_origins` opens it for any dataset (lazily: the loaders never read it). Datasets
written before provenance existed, or by ffcv, have none (``None``).
"""

from __future__ import annotations

import os
from array import array

import numpy as np

from ffload.errors import ConfigurationError
from ffload.formats.view import dataset_error

__all__ = [
    "ORIGIN_MAGIC",
    "ORIGINS_KEY",
    "BLOCK_HEAD",
    "OriginLog",
    "OriginBlock",
    "Origins",
    "origin_fields",
    "origin_key",
]

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
            piece = self._blob[a : self._ends[i]]
            out += len(piece).to_bytes(4, "little") + piece
        return bytes(out)

    def extend_records(self, data: bytes, given: bool) -> None:
        """Append the samples of :meth:`records`' bytes ``data``; ``given``: whether the log that
        wrote them had been given an origin. Raises ConfigurationError (a ValueError) for truncated
        records (a journal's, whose reader names it)."""
        pos = 0
        while pos < len(data):
            if pos + 4 > len(data):
                raise ConfigurationError("truncated origin record")
            size = int.from_bytes(data[pos : pos + 4], "little")
            if pos + 4 + size > len(data):
                raise ConfigurationError("truncated origin record")
            self._blob += data[pos + 4 : pos + 4 + size]
            self._ends.append(len(self._blob))
            pos += 4 + size
        self.given = self.given or given


class OriginBlock:
    """One origin block read through ``source`` (``size``, ``read(start, stop) -> bytes``: a local
    file, a remote object, or bytes in memory) at byte ``offset``; the ends are read on first use.

    Args:
        path: the file or database, for messages.
        limit: the block must end by this byte (in a ``.beton``: the first payload or the
            allocation table, whichever comes first).
    Raises:
        DatasetError: a block whose counts run past ``limit`` (corrupt file).
    """

    def __init__(self, path: str, source, offset: int, count: int, blob_bytes: int, limit: int):
        self.path, self._source, self._offset = path, source, offset
        self.count, self._blob_bytes = count, blob_bytes
        if offset + BLOCK_HEAD + 8 * count + blob_bytes > limit:
            raise dataset_error(
                path,
                f"origin block at {offset} ({count} entries, {blob_bytes} bytes) runs past byte {limit} (corrupt file)",
            )

    @classmethod
    def find(cls, path: str, source, offset: int, limit: int) -> OriginBlock | None:
        """The block at ``offset`` if one starts there (:data:`ORIGIN_MAGIC`), else None."""
        if limit - offset < BLOCK_HEAD:
            return None
        head = source.read(offset, offset + BLOCK_HEAD)
        if head[: len(ORIGIN_MAGIC)] != ORIGIN_MAGIC:
            return None
        count, blob_bytes = (int(v) for v in np.frombuffer(head[len(ORIGIN_MAGIC) :], "<u8"))
        return cls(path, source, offset, count, blob_bytes, limit)

    def ends(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """``(stop - start,) int64`` end offsets in the blob of the strings ``start..stop-1``
        (``stop`` None: to the last), with the end of string ``start - 1`` before them when
        ``start > 0``; read by one range read of only those entries, checked non-decreasing and
        within the blob.

        Raises:
            DatasetError: offsets out of order or past the blob (corrupt file).
        """
        stop = self.count if stop is None else stop
        first = max(start - 1, 0)
        at = self._offset + BLOCK_HEAD + 8 * first
        ends = np.frombuffer(self._source.read(at, at + 8 * (stop - first)), "<u8").astype(np.int64)
        if ends.size and (ends[0] < 0 or np.any(np.diff(ends) < 0) or ends[-1] > self._blob_bytes):
            raise dataset_error(self.path, f"origin block at {self._offset}: offsets out of order (corrupt file)")
        return ends

    def strings(self, start: int, stop: int) -> list[str]:
        """The origin strings of entries ``start..stop-1`` (two reads: their ends, their bytes; a name that is not
        UTF-8 keeps its bytes as lone surrogates, :func:`_decode`).

        Raises:
            DatasetError: offsets out of order or past the blob (corrupt file).
        """
        if start >= stop:
            return []
        ends = self.ends(start, stop)
        a = int(ends[0]) if start else 0
        ends = ends[1:] if start else ends
        blob0 = self._offset + BLOCK_HEAD + 8 * self.count
        raw = self._source.read(blob0 + a, blob0 + int(ends[-1]))
        cuts = (ends - a).tolist()
        return [_decode(raw[lo:hi]) for lo, hi in zip([0] + cuts[:-1], cuts)]


class Origins:
    """The origins of a dataset's samples: ``origins[i]`` is sample ``i``'s origin string,
    :meth:`describe` its parts as a dict (:func:`origin_fields`), :meth:`key` a WebDataset key.

    Args:
        descriptor: ``info["origin"]`` (see the module docstring).
        blocks: the :class:`OriginBlock` of each container (shard), in sample order, or for each
            a function of no arguments that returns it, called when one of its strings is first
            read (a sharded dataset reads only the shards asked for).
        counts: samples in each container; None: each block's ``count`` (``blocks`` are blocks).
    Attributes:
        descriptor: as given.
    Raises:
        DatasetError: (when read) a block whose count is not its container's sample count.
    """

    def __init__(self, descriptor: dict, blocks: list, counts: list[int] | None = None):
        self.descriptor, self._blocks = descriptor, list(blocks)
        self._bases = np.cumsum([0] + ([b.count for b in self._blocks] if counts is None else list(counts)))
        for k, block in enumerate(self._blocks):
            if isinstance(block, OriginBlock):
                self._check(k, block)

    def __len__(self) -> int:
        return int(self._bases[-1])

    def block(self, k: int) -> OriginBlock:
        """Container ``k``'s :class:`OriginBlock` (opened on first use)."""
        block = self._blocks[k]
        if not isinstance(block, OriginBlock):
            block = self._blocks[k] = self._check(k, block())
        return block

    def _check(self, k: int, block: OriginBlock) -> OriginBlock:
        """``block`` if its count is container ``k``'s sample count, else DatasetError naming its file."""
        count = int(self._bases[k + 1] - self._bases[k])
        if block.count != count:
            raise dataset_error(
                block.path, f"origin table holds {block.count} entries for {count} samples (corrupt file)"
            )
        return block

    def strings(self, start: int, stop: int) -> list[str]:
        """The origin strings of samples ``start..stop-1`` (two range reads per shard they span).

        Raises:
            DatasetError: a corrupt origin block.
        """
        out: list[str] = []
        first = max(int(np.searchsorted(self._bases, start, side="right")) - 1, 0)
        for k in range(first, len(self._blocks)):
            lo, hi = max(start, int(self._bases[k])), min(stop, int(self._bases[k + 1]))
            if lo >= stop:
                break
            if lo < hi:
                out += self.block(k).strings(lo - int(self._bases[k]), hi - int(self._bases[k]))
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
