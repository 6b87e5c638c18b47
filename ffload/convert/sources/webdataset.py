"""WebDataset tar shards as a conversion source (https://github.com/webdataset/webdataset).

Layout (WebDataset's convention): each shard is a POSIX tar; consecutive members whose names
share a *key* form one sample, the key being the name up to the first dot of its last path
component and the *extension* the rest (``train/n0153/img_00042.jpg`` -> key
``train/n0153/img_00042``, extension ``jpg``), as ``webdataset.tariterators.base_plus_ext`` splits
them. Extensions are compared lower-case.

* Image: the first of ``jpg jpeg png webp bmp tif tiff`` present (decoded by ffload's one image
  decoder: EXIF orientation, gray/alpha/16-bit rules of :mod:`ffload.convert.images`).
* Label: ``cls`` (ASCII integer), else ``cls2``, else ``json`` (an integer, or an object with an
  integer ``"label"``); a sample without any is an error when the source is indexed.
* Class names: ``classes.txt`` (one name per line) beside the first shard, when present;
  otherwise ``None`` (labels are kept as they are).

Why ``tarfile`` and not the ``webdataset`` package: conversion encodes samples in parallel
worker processes that each need *random* access (``src[i]``) and the sample count up front;
``webdataset`` is a streaming pipeline over sequential reads. The shards are indexed once
(member headers only: data blocks are skipped by seeking) and each sample is then one ``pread``
at its member's data offset.

Gzipped shards (``.tar.gz``, ``.tgz``, or any shard whose first bytes are gzip's magic ``1f 8b``)
are decompressed once, at indexing, to an uncompressed copy in a temporary folder
(:class:`ShardCopies`: ``$TMPDIR/ffload-wds-<pid>-*``, one file per shard under a name never used
before, removed when the source is garbage collected or the process exits; a process killed before
that, by SIGKILL or the OOM killer, leaves its folder, which the next one to make copies removes
once that pid is dead), and then read at offsets like any shard. Why a copy and
not one sequential stream: indexing must read every byte of a gzip stream anyway (the headers are
inside it), so writing the bytes out costs no second decompression; the parallel workers then keep
their random access (a stream would serialise them or make each worker decompress the shard from
its start for every chunk). The price is disk: the uncompressed size of the gzipped shards, in the
temporary folder, while the source lives; a full disk or a corrupt or truncated gzip stream is a
:class:`SourceError` naming the shard. A process that does not see the copies (a Ray worker on
another node) decompresses its own on first use.
"""

from __future__ import annotations

import glob
import gzip
import json
import os
import re
import shutil
import tarfile
import tempfile
import zlib

import numpy as np

from ffload.convert.images import DEFAULT_MAX_PIXELS, decode_image_bytes
from ffload.convert.sources.base import SourceError, check_index
from ffload.formats.atomic import pid_alive

IMAGE_KEYS = ("jpg", "jpeg", "png", "webp", "bmp", "tif", "tiff")
SHARD_SUFFIXES = (".tar", ".tar.gz", ".tgz")
"""The file names taken as shards in a folder, and recognised as shards by detection."""
GZIP_MAGIC = b"\x1f\x8b"
COPIES_PREFIX = "ffload-wds-"
"""Prefix of a :class:`ShardCopies` folder in the temporary directory, followed by ``<pid>-``."""
LABEL_KEYS = ("cls", "cls2", "json")
_KEY_EXT = re.compile(r"^((?:.*/|)[^./]+)[.]([^/]*)$")


def expand_shards(pattern: str) -> list[str]:
    """The shard paths of ``pattern``: brace ranges as WebDataset writes them
    (``train-{000000..000146}.tar``, via the ``braceexpand`` package), then shell globs; a
    directory means every file in it whose name ends with one of :data:`SHARD_SUFFIXES`, sorted.

    Raises:
        SourceError: nothing matches, or a named shard does not exist.
    """
    if os.path.isdir(pattern):
        paths = sorted(
            entry.path for entry in os.scandir(pattern) if entry.is_file() and entry.name.endswith(SHARD_SUFFIXES)
        )
    else:
        try:
            from braceexpand import braceexpand
        except ImportError as e:  # pragma: no cover - the dependency is declared
            raise SourceError("WebDataset patterns need the 'braceexpand' package: pip install braceexpand") from e
        paths = []
        for expanded in braceexpand(pattern):
            matches = sorted(glob.glob(expanded)) if glob.has_magic(expanded) else [expanded]
            paths.extend(matches)
        missing = [p for p in paths if not os.path.isfile(p)]
        if missing:
            raise SourceError(f"{pattern}: {len(missing)} shard(s) missing, first {missing[0]}")
    if not paths:
        raise SourceError(f"{pattern}: no WebDataset shard ({', '.join(SHARD_SUFFIXES)}) matches")
    return paths


def looks_like_webdataset(path: str) -> bool:
    """True for a shard path (a name ending with one of :data:`SHARD_SUFFIXES`), a brace pattern
    or glob naming such files, or a directory holding at least one."""
    if os.path.isdir(path):
        with os.scandir(path) as entries:
            return any(e.name.endswith(SHARD_SUFFIXES) and e.is_file() for e in entries)
    if path.endswith(SHARD_SUFFIXES):
        return True
    return ("{" in path or glob.has_magic(path)) and any(suffix in path for suffix in SHARD_SUFFIXES)


def is_gzipped(path: str) -> bool:
    """Whether the file at ``path`` starts with gzip's magic bytes (``1f 8b``, RFC 1952)."""
    with open(path, "rb") as f:
        return f.read(2) == GZIP_MAGIC


class ShardCopies:
    """Uncompressed copies of gzipped shards, in a temporary folder this object owns (see the
    module docstring): ``local(shard)`` is the path to read ``shard``'s tar from.

    The folder (``tempfile.TemporaryDirectory``, prefix ``ffload-wds-<pid>-``) is created on the
    first copy and removed with everything in it when this object is garbage collected or the
    process exits; before creating it, the folders of processes that are no longer alive are
    removed (:func:`remove_dead_copies`). Each copy gets a new name (``tempfile.mkstemp``), so a
    copy made again, or a shard of the same file name in another folder, never overwrites another
    shard's copy. Pickling keeps only the mapping shard -> copy: a process that unpickles it reads
    the creator's copies where it sees them (forked or same-machine workers) and makes, and owns,
    its own where it does not.
    """

    def __init__(self):
        self.paths: dict[str, str] = {}
        self._folder: tempfile.TemporaryDirectory | None = None

    def local(self, shard: str) -> str:
        """The path of ``shard``'s uncompressed tar: ``shard`` itself unless it is gzipped.

        Raises:
            SourceError: ``shard`` cannot be read, is not a valid gzip stream (corrupt or
                truncated), or its copy cannot be created or written in the temporary folder (a
                full disk: naming the shard, the folder and ``TMPDIR``).
        """
        copy = self.paths.get(shard)
        if copy is not None and os.path.exists(copy):
            return copy
        try:
            if not is_gzipped(shard):
                return shard
        except OSError as e:
            raise SourceError(f"{shard}: {e.strerror or e}", path=shard) from None
        try:
            if self._folder is None:
                remove_dead_copies()
                self._folder = tempfile.TemporaryDirectory(prefix=f"{COPIES_PREFIX}{os.getpid()}-")
            fd, copy = tempfile.mkstemp(suffix=".tar", prefix=f"{os.path.basename(shard)}-", dir=self._folder.name)
        except OSError as e:
            raise SourceError(
                f"{shard}: cannot create its uncompressed copy in {tempfile.gettempdir()}: {e.strerror or e}",
                path=shard,
            ) from None
        try:
            with open(fd, "wb") as dst, gzip.open(shard, "rb") as src:
                shutil.copyfileobj(src, dst, 1 << 20)
        except (gzip.BadGzipFile, EOFError, zlib.error) as e:
            os.unlink(copy)
            raise SourceError(
                f"{shard}: corrupt or truncated gzip stream ({e or type(e).__name__})", path=shard
            ) from None
        except OSError as e:
            if os.path.exists(copy):
                os.unlink(copy)
            where = f"decompressing it into {self._folder.name}"
            hint = " (set TMPDIR to a folder with room for the uncompressed shards)" if e.errno == 28 else ""
            raise SourceError(f"{shard}: {where}: {e.strerror or e}{hint}", path=shard) from None
        self.paths[shard] = copy
        return copy

    def __getstate__(self):
        return {"paths": dict(self.paths)}

    def __setstate__(self, state):
        self.paths, self._folder = state["paths"], None


def remove_dead_copies() -> None:
    """Remove the :class:`ShardCopies` folders (``$TMPDIR/ffload-wds-<pid>-*``) whose process is no
    longer alive (:func:`~ffload.formats.atomic.pid_alive`): what a SIGKILL or the OOM killer left.
    Folders without a pid in their name are kept; a folder that cannot be removed is left as it is."""
    tmp = tempfile.gettempdir()
    try:
        entries = os.listdir(tmp)
    except OSError:
        return
    for entry in entries:
        pid = entry[len(COPIES_PREFIX) :].partition("-")[0]
        if entry.startswith(COPIES_PREFIX) and pid.isdigit() and not pid_alive(int(pid)):
            shutil.rmtree(os.path.join(tmp, entry), ignore_errors=True)


def _label_of(ext: str, data: bytes, where: str) -> int:
    try:
        if ext in ("cls", "cls2"):
            return int(data.decode("ascii").strip())
        value = json.loads(data)
        value = value.get("label") if isinstance(value, dict) else value
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"no integer label in {data[:80]!r}")
        return value
    except (ValueError, UnicodeDecodeError) as e:
        raise SourceError(f"{where}.{ext}: not an integer label ({e})") from None


class WebDatasetSource:
    """Samples of WebDataset tar shards (see the module docstring for the layout).

    Args:
        pattern: a shard path, a brace pattern (``'shards/train-{000000..000146}.tar'``), a glob,
            or a directory of shards (``.tar``, ``.tar.gz``, ``.tgz``; gzipped ones are decompressed
            to temporary copies, see :class:`ShardCopies`).
        name: default: the first shard's directory name.
        max_pixels: images whose header declares more pixels are refused
            (:func:`~ffload.convert.images.check_pixels`); ``None``: no limit.
    Attributes:
        shards: the shard paths, in order (samples are numbered shard by shard, member order).
        copies: the :class:`ShardCopies` of the gzipped shards.
        classes: names from ``classes.txt`` beside the first shard, or ``None``.
        labels: ``(N,) int64``.
    Raises:
        SourceError: no shard, an unreadable shard or one that is not a (gzipped) tar, a sample
            without an image or a label, a label outside ``classes`` — naming the shard and member.
    """

    def __init__(self, pattern: str, name: str | None = None, max_pixels: int | None = DEFAULT_MAX_PIXELS):
        self.max_pixels = max_pixels
        self.shards = expand_shards(os.fspath(pattern))
        self.name = name or os.path.basename(os.path.dirname(os.path.abspath(self.shards[0]))) or "webdataset"
        names_file = os.path.join(os.path.dirname(self.shards[0]), "classes.txt")
        self.classes = None
        if os.path.isfile(names_file):
            with open(names_file, encoding="utf8") as f:
                self.classes = [line.strip() for line in f if line.strip()]
        self.copies = ShardCopies()
        shard_ids, offsets, sizes, labels, keys = [], [], [], [], []
        for s, shard in enumerate(self.shards):
            for key, offset, size, label in self._index(shard):
                shard_ids.append(s)
                offsets.append(offset)
                sizes.append(size)
                labels.append(label)
                keys.append(key)
        self._shard = np.asarray(shard_ids, dtype=np.int32)
        self._offset = np.asarray(offsets, dtype=np.int64)
        self._size = np.asarray(sizes, dtype=np.int64)
        self.labels = np.asarray(labels, dtype=np.int64)
        self._keys = keys
        if (
            self.classes is not None
            and len(self.labels)
            and (self.labels.min() < 0 or self.labels.max() >= len(self.classes))
        ):
            bad = int(np.flatnonzero((self.labels < 0) | (self.labels >= len(self.classes)))[0])
            raise SourceError(
                f"{self.describe(bad)}: label {self.labels[bad]} outside the {len(self.classes)} "
                f"classes of {names_file}"
            )
        self._files: dict[int, int] = {}

    def _index(self, shard: str):
        """Yield ``(key, image data offset, image size, label)`` per sample of one shard (offsets
        into its uncompressed tar, :meth:`ShardCopies.local`)."""
        try:
            tar = tarfile.open(self.copies.local(shard), mode="r:")  # members are read at offsets
        except tarfile.ReadError as e:
            raise SourceError(f"{shard}: not a tar archive, nor a gzipped one ({e})", path=shard) from None
        except OSError as e:
            raise SourceError(f"{shard}: {e.strerror or e}") from None
        with tar:
            key, members = None, {}

            def finish():
                where = f"{shard}:{key}"
                image = next((members[e] for e in IMAGE_KEYS if e in members), None)
                if image is None:
                    raise SourceError(f"{where}: no image member ({'/'.join(IMAGE_KEYS)}) among {sorted(members)}")
                ext = next((e for e in LABEL_KEYS if e in members), None)
                if ext is None:
                    raise SourceError(f"{where}: no label member ({'/'.join(LABEL_KEYS)}) among {sorted(members)}")
                label = _label_of(ext, tar.extractfile(members[ext]).read(), where)
                return key, image.offset_data, image.size, label

            for member in tar:
                if not member.isfile():
                    continue
                match = _KEY_EXT.match(member.name)
                if match is None or os.path.basename(member.name).startswith("."):
                    continue  # no extension, or hidden (e.g. macOS ._ files)
                if match.group(1) != key:
                    if key is not None:
                        yield finish()
                    key, members = match.group(1), {}
                members[match.group(2).lower()] = member
            if key is not None:
                yield finish()

    def __len__(self) -> int:
        return len(self.labels)

    def encoded(self, i) -> bytes:
        """The image member's bytes of sample ``i``, as stored in the shard."""
        i = check_index(i, len(self), self.name)
        s = int(self._shard[i])
        fd = self._files.get(s)
        if fd is None:  # one descriptor per shard and process (workers are forked after indexing)
            fd = self._files[s] = os.open(self.copies.local(self.shards[s]), os.O_RDONLY)
        data = os.pread(fd, int(self._size[i]), int(self._offset[i]))
        if len(data) != self._size[i]:
            raise SourceError(f"{self.describe(i)}: shard truncated ({len(data)} of {self._size[i]} bytes)")
        return data

    def __getitem__(self, i) -> tuple[np.ndarray, int]:
        """``(image (H, W, 3) uint8 RGB, label int)``; ImageDecodeError naming the member."""
        i = check_index(i, len(self), self.name)
        return decode_image_bytes(self.encoded(i), self.describe(i), self.max_pixels), int(self.labels[i])

    def describe(self, i: int) -> str:
        """``'<shard>:<key>'``."""
        return f"{self.shards[int(self._shard[i])]}:{self._keys[i]}"

    def origin(self, i: int) -> str:
        """Sample ``i``'s provenance: ``'<shard number>:<__key__>'`` (see :attr:`origin_info`)."""
        i = check_index(i, len(self), self.name)
        return f"{int(self._shard[i])}:{self._keys[i]}"

    @property
    def origin_info(self) -> dict:
        """How :meth:`origin` reads (:mod:`ffload.formats.origins`): the shards' paths relative to
        the folder they share, and the sample's ``__key__``."""
        common = os.path.commonpath([os.path.dirname(os.path.abspath(s)) for s in self.shards])
        parts = [os.path.relpath(os.path.abspath(s), common).replace(os.sep, "/") for s in self.shards]
        return {"source": "webdataset", "id": "key", "part": "shard", "parts": parts}

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_files"] = {}  # descriptors do not travel to other processes
        return state

    def __del__(self):
        for fd in getattr(self, "_files", {}).values():
            try:
                os.close(fd)
            except OSError:
                pass
