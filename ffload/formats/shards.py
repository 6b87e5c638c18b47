"""Sharded datasets: a directory of standalone ``.beton`` shards and a JSON manifest.

Layout of a dataset directory ``DST/``::

    DST/manifest.json        the manifest (UTF-8 JSON, below), written last
    DST/shard-00000.beton    samples 0 .. n0-1, a complete .beton (ffcv 1.0.2 reads it alone)
    DST/shard-00001.beton    samples n0 .. n0+n1-1
    ...

Shards split the samples at sample boundaries, in sample order. The writer
(:class:`ShardedWriter`, ``convert(..., shard_size=...)``, ``ffload convert --shard-size 1GB``)
closes a shard when adding the next sample would make its file larger than the shard size (a
sample larger than that alone gets a shard of its own). The manifest::

    {"format": "ffload-shards", "version": 1, "num_samples": N,
     "fields": [{"name": "image", "type": "RGBImageField", "type_id": 2, "arguments": {...}}, ...],
     "info": {"classes": [...]},
     "shards": [{"path": "shard-00000.beton", "num_samples": n0, "bytes": b0, "sha256": "..."}, ...]}

``fields`` are the descriptors LMDB's metadata record holds (:func:`.lmdb.descriptors.field_specs`);
``info`` is the dataset-level object (also stored in every shard); ``path`` is relative to the
manifest's directory; ``bytes`` and ``sha256`` are the shard file's size and checksum. The whole
directory is written under a temporary name and renamed into place once complete (see
:mod:`.atomic`), so ``DST`` never names a partial dataset.

Reading (:func:`open_sharded`, reached through :func:`ffload.formats.open_dataset` with the
directory, its ``manifest.json``, or a URL of either) gives one :class:`~.view.DatasetView` with
global indices ``0..N-1``: shard ``k`` occupies ``[bases[k], bases[k] + bytes_k)`` of one virtual
data region (bases aligned to the largest shard page size), and its payload offsets are moved by
``bases[k]`` at open, so the loaders read it as they read one ``.beton`` (see :mod:`.shardio`). The
open checks each shard's size against the manifest (cheap); :func:`check_checksums` (``ffload
verify``) hashes every shard against its ``sha256``.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import re
import uuid
from collections.abc import Callable

import numpy as np

from ffload.errors import ConfigurationError
from ffload.formats.beton import (
    DEFAULT_PAGE_SIZE,
    FIELD_DESC_TYPE,
    HEADER_TYPE,
    INFO_MAGIC,
    BetonWriter,
    check_page_size,
    open_beton,
)
from ffload.formats.fields.base import Field, metadata_dtype
from ffload.formats.lmdb.descriptors import field_specs, fields_from_specs
from ffload.formats.origins import BLOCK_HEAD
from ffload.formats.schema import Schema, Value, check_document
from ffload.formats.shardio import ShardedRemote, ShardLayout
from ffload.formats.view import DatasetView, dataset_error
from ffload.formats.writer import DatasetWriter

FORMAT_NAME = "ffload-shards"
VERSION = 1
MANIFEST = "manifest.json"
PARTIAL = ".partial"  # suffix of a shard file being written (hidden: named .NAME.partial)
_HASH_CHUNK = 1 << 22

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1 << 10,
    "kb": 10**3,
    "kib": 1 << 10,
    "m": 1 << 20,
    "mb": 10**6,
    "mib": 1 << 20,
    "g": 1 << 30,
    "gb": 10**9,
    "gib": 1 << 30,
    "t": 1 << 40,
    "tb": 10**12,
    "tib": 1 << 40,
}


def parse_size(value) -> int:
    """A byte count from an int or a size string: ``"1GB"`` (10**9), ``"512MiB"`` (2**29),
    ``"1.5G"`` (binary for a bare letter), ``"4096"``; case and spaces ignored.

    Raises:
        ConfigurationError: not a positive size (the text named).
    """
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        size = int(value)
    else:
        match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?)\s*([a-zA-Z]*)\s*", str(value))
        unit = match.group(2).lower() if match else None
        if match is None or unit not in _UNITS:
            raise ConfigurationError(
                f"shard size {value!r} is not a size: give bytes or a number with a unit "
                "(B, KB, MB, GB, TB; KiB, MiB, GiB, TiB), e.g. 1GB or 512MiB"
            )
        size = int(float(match.group(1)) * _UNITS[unit])
    if size <= 0:
        raise ConfigurationError(f"shard size must be positive, got {value!r}")
    return size


def check_destination(dst: str) -> None:
    """Refuse a sharded destination named like a single-file or LMDB dataset: it is a directory
    of ``.beton`` shards (ConfigurationError saying why)."""
    suffix = os.path.splitext(os.path.normpath(str(dst)).rstrip("/"))[1].lower()
    if suffix == ".lmdb":
        raise ConfigurationError(
            f"{dst}: --shard-size / shard_size writes .beton shards; an LMDB database is "
            "one memory-mapped file and is not sharded",
            path=str(dst),
            hint="give a directory name without the .lmdb suffix, e.g. train.shards",
        )
    if suffix == ".beton":
        raise ConfigurationError(
            f"{dst}: with --shard-size / shard_size DST is a directory of .beton shards "
            "and a manifest, not one .beton file",
            path=str(dst),
            hint="name it without the .beton suffix, e.g. train.shards",
        )


def shard_name(k: int) -> str:
    """The file name of shard ``k`` (``shard-00000.beton``)."""
    return f"shard-{k:05d}.beton"


def file_sha256(path: str) -> str:
    """The sha256 (hex) of the file at ``path`` (read in 4 MiB chunks)."""
    digest = hashlib.sha256()
    with open(path, "rb") as fp:
        while chunk := fp.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


ORIGIN_GUESS = 56
"""Bytes of origin room a shard reserves per metadata row up front: 8 for its offset, 48 for its
string (an ImageNet path ``n01440764/n01440764_10026.JPEG`` is 30)."""


class ShardFiles(DatasetWriter):
    """Streams samples, in index order, into ``.beton`` shard files in the existing folder
    ``path`` (the :class:`~.writer.DatasetWriter` protocol: ``add`` in order, then ``close``):
    the shards of a :class:`ShardedWriter`, or those one Ray task writes for its range of samples
    (:mod:`ffload.convert.ray_shards`). No manifest.

    Each shard is a :class:`~.beton.BetonWriter` that reserves the metadata rows its first page's
    padding holds (more double it); before a sample is added, :meth:`BetonWriter.file_bytes_with`
    tells whether the shard would exceed ``shard_size``, and if so (and the shard is not empty)
    the shard is closed (synced, hashed) and the next one opened. A shard is written under a
    hidden name of its own (``.NAME.<pid>-<random>`` + :data:`PARTIAL`) and renamed to ``NAME``
    once closed, so a shard file is always complete, also when a killed writer is started again
    (a retried Ray task) while the first one still runs.

    Args:
        path: the folder to write into (it must exist).
        fields, num_samples, info: as for :class:`~.writer.DatasetWriter` (``info`` goes into
            every shard).
        shard_size: bytes per shard file at most (int or a size string, :func:`parse_size`).
        page_size: every shard's page size (bytes, power of two >= 2 MiB; a shard's grows for a
            larger sample, as a .beton's does: the next shard starts at ``page_size`` again).
        name: shard ``k``'s file name (default :func:`shard_name`).
        on_close: called with each shard's manifest entry once it is complete (and renamed), as
            :attr:`shards` gets it: a Ray task uploads it there, then deletes the local file.

    Attributes:
        shards: the manifest entries (``path``, ``num_samples``, ``bytes``, ``sha256``) of the
            shards closed so far.

    Raises:
        ConfigurationError: a bad ``shard_size`` or ``page_size``, or a shard size below two
            pages (a shard file's least size: each sample would get a shard of its own).
    """

    def __init__(
        self,
        path: str,
        fields: dict[str, Field],
        num_samples: int,
        shard_size,
        page_size: int = DEFAULT_PAGE_SIZE,
        info: dict | None = None,
        name=shard_name,
        on_close: Callable[[dict], None] | None = None,
    ):
        super().__init__(path, fields, num_samples, info)
        self.shard_size = parse_size(shard_size)
        self.page_size = check_page_size(page_size)
        if self.shard_size < 2 * self.page_size:
            raise ConfigurationError(
                f"shard size {self.shard_size} bytes is below two pages ({2 * self.page_size} "
                f"bytes): every shard file holds a header page and a data page at least, so "
                "each sample would get a shard of its own; give a larger --shard-size or a "
                "smaller --page-size (a power of two >= 2 MiB)"
            )
        self.shards: list[dict] = []
        self._name, self._on_close = name, on_close
        self._current: BetonWriter | None = None

    def _first_page_rows(self) -> int:
        """Metadata rows the padding before a shard's first data page holds (at least 1), each
        with :data:`ORIGIN_GUESS` bytes of origin room beside it (see :meth:`_first_page_origins`)."""
        info = len(INFO_MAGIC) + 8 + len(self._info_json) if self._info_json else 0
        fixed = HEADER_TYPE.itemsize + len(self.fields) * FIELD_DESC_TYPE.itemsize + info + BLOCK_HEAD
        room = -fixed % self.page_size
        return max(1, room // (metadata_dtype(self._field_list).itemsize + ORIGIN_GUESS))

    def _first_page_origins(self) -> int:
        """The origin room a shard reserves: :data:`ORIGIN_GUESS` bytes per row of
        :meth:`_first_page_rows` (more origin bytes grow it, as more rows do)."""
        return BLOCK_HEAD + ORIGIN_GUESS * self._first_page_rows()

    def _write_sample(self, index, metas, payloads, origin):
        shard = self._current
        if shard is not None and shard.count and shard.file_bytes_with(payloads, origin) > self.shard_size:
            self._close_shard()
            shard = None
        if shard is None:
            attempt = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
            partial = os.path.join(self.path, f".{self._name(len(self.shards))}.{attempt}{PARTIAL}")
            shard = self._current = BetonWriter(
                partial,
                self.fields,
                self.num_samples - self.count,
                self.page_size,
                info=self.info,
                reserve=self._first_page_rows(),
                origin_room=self._first_page_origins(),
            )
        shard.add(shard.count, metas, payloads, origin)

    def _close_shard(self) -> None:
        shard, self._current = self._current, None
        shard.close()
        name = self._name(len(self.shards))
        target = os.path.join(self.path, name)
        os.replace(shard.path, target)
        entry = {
            "path": name,
            "num_samples": shard.count,
            "bytes": os.path.getsize(target),
            "sha256": file_sha256(target),
        }
        self.shards.append(entry)
        if self._on_close is not None:
            self._on_close(entry)

    def _finalize(self) -> None:
        """Close the last shard."""
        if self._current is not None:
            self._close_shard()

    def close(self) -> None:
        """Finish the last shard (and, for a :class:`ShardedWriter`, write the manifest); on
        failure abort, and re-raise."""
        try:
            self._finalize()
        except BaseException:
            self.abort()
            raise

    def abort(self) -> None:
        """Close the shard being written without finishing it (its partial file is left to the
        caller, who deletes the folder); never raises."""
        if self._current is not None:
            self._current.abort()
            self._current = None


class ShardedWriter(ShardFiles):
    """Streams samples, in index order, into a new directory of ``.beton`` shards and its
    manifest (:class:`ShardFiles`, then ``manifest.json`` at ``close``; ``abort`` leaves the
    directory to the caller, who deletes it: see :mod:`.atomic`).

    Alternatively, shards written elsewhere into the same directory (by Ray tasks, each for a
    range of samples) make up the dataset through :meth:`adopt`, in sample order; at ``close``
    every other file in the directory (a failed task's shards and partial files) is removed.

    Args:
        path: the directory to create (must not exist); the other arguments as :class:`ShardFiles`.

    Raises:
        ConfigurationError: as :class:`ShardFiles`.
        FileExistsError: ``path`` exists.
    """

    def __init__(
        self,
        path: str,
        fields: dict[str, Field],
        num_samples: int,
        shard_size,
        page_size: int = DEFAULT_PAGE_SIZE,
        info: dict | None = None,
    ):
        super().__init__(path, fields, num_samples, shard_size, page_size, info)
        os.mkdir(path)

    def adopt(self, shards: list[dict]) -> None:
        """Append shards already complete in the directory (or, for a dataset on object storage,
        under its prefix): their manifest entries, as :attr:`ShardFiles.shards` holds them, in
        sample order. A writer's samples are either all added or all adopted.

        Raises:
            ConfigurationError: samples were added with ``add``, or the entries add up to more
                than ``num_samples``.
        """
        if self._current is not None:
            raise ConfigurationError("adopt() on a writer whose samples are added with add()")
        samples = sum(entry["num_samples"] for entry in shards)
        if self.count + samples > self.num_samples:
            raise ConfigurationError(
                f"adopted shards bring {self.count + samples} samples, more than the {self.num_samples} declared"
            )
        self.shards.extend(shards)
        self.count += samples

    def _finalize(self) -> None:
        """Close the last shard, remove every file the manifest will not name (partial files of
        killed writers, shards of a Ray task that failed after its retries), write
        ``manifest.json`` (last), sync the directory."""
        super()._finalize()
        named = {entry["path"] for entry in self.shards}
        for entry in os.listdir(self.path):
            if entry not in named:
                os.remove(os.path.join(self.path, entry))
        write_manifest(os.path.join(self.path, MANIFEST), self.fields, self.info, self.count, self.shards)
        fd = os.open(self.path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_manifest(target: str, fields: dict[str, Field], info: dict, num_samples: int, shards: list[dict]) -> None:
    """Write (and fsync) the manifest of a dataset of ``num_samples`` samples in ``shards`` (their
    entries, in sample order) to the local file ``target``."""
    manifest = {
        "format": FORMAT_NAME,
        "version": VERSION,
        "num_samples": num_samples,
        "fields": field_specs(fields),
        "info": info,
        "shards": shards,
    }
    with open(target, "w", encoding="utf8") as fp:
        json.dump(manifest, fp, ensure_ascii=False, indent=1)
        fp.flush()
        os.fsync(fp.fileno())


# ---------------------------------------------------------------------------------- reading


def manifest_location(path: str, remote: bool) -> tuple[str, str]:
    """``(manifest path or URL, the directory it sits in)`` for a dataset directory or its
    manifest (local path or URL)."""
    join, dirname = (posixpath.join, posixpath.dirname) if remote else (os.path.join, os.path.dirname)
    trimmed = path.rstrip("/") if remote else os.path.normpath(path)
    if trimmed.endswith("/" + MANIFEST) or os.path.basename(trimmed) == MANIFEST:
        return trimmed, dirname(trimmed)
    return join(trimmed, MANIFEST), trimmed


def is_sharded(path: str) -> bool:
    """Whether the local ``path`` is a sharded dataset directory or its manifest."""
    if os.path.isdir(path):
        return os.path.isfile(os.path.join(path, MANIFEST))
    return os.path.basename(os.path.normpath(path)) == MANIFEST and os.path.isfile(path)


MANIFEST_SCHEMA: Schema = {
    "format": Value((str,), choices=(FORMAT_NAME,)),
    "version": Value((int,), choices=(VERSION,)),
    "num_samples": Value((int,), low=0),
    "fields": Value((list,), non_empty=True),
    "info": Value((dict,), required=False),
    "shards": Value((list,)),
}
"""What each key of the manifest holds (the module docstring): :func:`_load_manifest` checks it."""

SHARD_SCHEMA: Schema = {
    "path": Value((str,), non_empty=True),
    "num_samples": Value((int,), low=0),
    "bytes": Value((int,), low=0),
    "sha256": Value((str,)),
}
"""What each entry of the manifest's ``shards`` array holds."""


def _load_manifest(where: str, raw: bytes) -> dict:
    """The manifest's JSON object, every value's JSON type and range checked (:data:`MANIFEST_SCHEMA`,
    :data:`SHARD_SCHEMA`, the fields by :func:`.lmdb.descriptors.fields_from_specs` when the caller builds them);
    DatasetError naming the cause."""
    try:
        manifest = json.loads(raw.decode("utf8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise dataset_error(where, f"not a sharded dataset manifest: not UTF-8 JSON ({e})") from e
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_NAME:
        raise dataset_error(where, f'not a sharded dataset manifest (its "format" is not {FORMAT_NAME!r})')
    if type(manifest.get("version")) is not int or manifest["version"] != VERSION:
        raise dataset_error(
            where,
            f"unsupported sharded dataset version {manifest.get('version')!r} (this ffload reads version {VERSION})",
        )
    check_document(where, manifest, MANIFEST_SCHEMA, "manifest")
    shards, n = manifest["shards"], manifest["num_samples"]
    for k, entry in enumerate(shards):
        check_document(where, entry, SHARD_SCHEMA, f"manifest: shard {k}")
        name = entry["path"]
        if name.startswith("/") or ".." in name.split("/") or "\\" in name:
            raise dataset_error(where, f"shard {k}: path {name!r} must be relative to the manifest's directory")
        if not re.fullmatch("[0-9a-f]{64}", entry["sha256"]):
            raise dataset_error(
                where,
                f"manifest: shard {k}: 'sha256' is {entry['sha256'][:70]!r}, expected 64 lowercase hexadecimal digits",
            )
    if sum(entry["num_samples"] for entry in shards) != n:
        raise dataset_error(
            where, f"manifest says {n} samples but its shards add up to {sum(e['num_samples'] for e in shards)}"
        )
    return manifest


def _open_shard(where: str, entry: dict, path: str, remote_options) -> tuple[DatasetView, object]:
    """One shard's view (and its RemoteObject, for a URL); DatasetError naming the shard file
    when it is missing, of another size than the manifest's, or not a .beton."""
    from ffload.storage import RemoteObject, is_remote

    if is_remote(path):
        from ffload.errors import StorageError

        try:
            source = RemoteObject(path, remote_options)
        except StorageError as e:
            raise dataset_error(path, f"shard of {where} cannot be read: {e}") from e
        size = source.size
    else:
        source = None
        if not os.path.isfile(path):
            raise dataset_error(path, f"shard of {where} is missing")
        size = os.path.getsize(path)
    if size != entry["bytes"]:
        what = "truncated" if size < entry["bytes"] else "changed"
        raise dataset_error(path, f"shard of {where} is {what}: {size} bytes, the manifest says {entry['bytes']}")
    view = open_beton(path, source=source)
    if view.num_samples != entry["num_samples"]:
        raise dataset_error(
            path, f"shard of {where} holds {view.num_samples} samples, the manifest says {entry['num_samples']}"
        )
    return view, source


def open_sharded(path: str, storage_options: dict | None = None) -> DatasetView:
    """Open a sharded dataset (its directory or ``manifest.json``, a local path or a URL) as one
    :class:`~.view.DatasetView` (see the module docstring).

    The view has ``format == 'shards'``, ``path`` the directory (or its URL), ``shards`` the
    :class:`~.shardio.ShardLayout`, ``data_size`` the virtual region's bytes, ``page_size`` the
    largest shard page size, ``ptrs`` and the metadata's pointers global offsets; ``data_path``
    is None, and for a URL ``remote`` is a :class:`~.shardio.ShardedRemote` (one GET for the
    manifest, a HEAD and the few range reads of :func:`.beton.open_beton` per shard).

    Raises:
        DatasetError: a bad manifest, or a shard that is missing, truncated (its size differs from
            the manifest's), not a .beton, or whose fields or sample count differ from the
            manifest's (the shard file named).
        StorageError: the manifest object cannot be read.
    """
    from ffload.storage import RemoteObject, is_remote

    remote = is_remote(path)
    where, root = manifest_location(path, remote)
    if remote:
        opening = RemoteObject(where, storage_options)
        raw = opening.read(0, opening.size)
    else:
        opening = None
        if not os.path.isfile(where):
            raise dataset_error(path, f"no {MANIFEST} (not a sharded dataset directory)")
        with open(where, "rb") as fp:
            raw = fp.read()
    manifest = _load_manifest(where, raw)
    fields = fields_from_specs(where, manifest)
    join = posixpath.join if remote else os.path.join
    paths = [join(root, e["path"]) for e in manifest["shards"]]
    views, remotes = [], []
    for entry, shard_path in zip(manifest["shards"], paths):
        view, source = _open_shard(where, entry, shard_path, storage_options)
        if list(view.fields) != list(fields) or any(view.fields[n] != f for n, f in fields.items()):
            raise dataset_error(shard_path, f"shard's fields {view.fields} differ from the manifest's {fields}")
        views.append(view)
        remotes.append(source)
    page = max([v.page_size for v in views], default=DEFAULT_PAGE_SIZE)
    sizes = np.array([v.data_size for v in views], dtype=np.int64)
    bases = np.zeros(len(views), dtype=np.int64)
    for k in range(1, len(views)):
        end = int(bases[k - 1] + sizes[k - 1])
        bases[k] = -(-end // page) * page
    layout = ShardLayout(
        paths=paths,
        names=[e["path"] for e in manifest["shards"]],
        bases=bases,
        sizes=sizes,
        sha256=[e["sha256"] for e in manifest["shards"]],
        align=page,
        num_samples=np.array([v.num_samples for v in views], dtype=np.int64),
    )
    n = manifest["num_samples"]
    metadata = (
        np.concatenate([v.metadata for v in views])
        if views
        else np.zeros(0, dtype=metadata_dtype(list(fields.values())))
    )
    ptrs, sizes_out = {}, {}
    first = 0
    for view, base in zip(views, bases.tolist()):
        rows = slice(first, first + view.num_samples)
        for name, f in fields.items():
            if f.has_payload:
                f.get_pointer(metadata[name][rows])[...] += np.uint64(base)
        first += view.num_samples
    for name, f in fields.items():
        if f.has_payload:
            ptrs[name] = (
                np.concatenate([v.ptrs[name].astype(np.uint64) + np.uint64(b) for v, b in zip(views, bases.tolist())])
                if views
                else np.zeros(0, np.uint64)
            )
            sizes_out[name] = (
                np.concatenate([v.sizes[name] for v in views]) if views else np.zeros(0, np.uint64)
            ).astype(np.uint64)
    sharded_remote = ShardedRemote(layout, remotes, opening) if remote else None
    return DatasetView(
        path=root,
        format="shards",
        num_samples=n,
        fields=fields,
        metadata=metadata,
        ptrs=ptrs,
        sizes=sizes_out,
        data_path=None,
        data_size=layout.data_size,
        page_size=page,
        info=dict(manifest.get("info") or {}),
        remote=sharded_remote,
        shards=layout,
        origin_blocks=[v.origin_blocks[0] if v.origin_blocks else None for v in views],
    )


def check_checksums(view: DatasetView, progress: bool = False) -> list[tuple[str, str]]:
    """Hash every shard of a sharded ``view`` and compare with the manifest's ``sha256``.

    Returns:
        ``(shard path, cause)`` for every shard whose checksum differs (empty: all match; and for
        a view that is not sharded).

    Raises:
        OSError: a local shard cannot be read. StorageError: a remote one cannot.
    """
    layout = getattr(view, "shards", None)
    if layout is None:
        return []
    bad = []
    for k, (path, want) in enumerate(zip(layout.paths, layout.sha256)):
        if view.remote is not None:
            remote, digest = view.remote.remotes[k], hashlib.sha256()
            for start in range(0, remote.size, 1 << 24):
                digest.update(remote.read(start, min(remote.size, start + (1 << 24))))
            got = digest.hexdigest()
        else:
            got = file_sha256(path)
        if got != want:
            bad.append((path, f"sha256 {got} differs from the manifest's {want} (corrupt shard)"))
    return bad


def check_shard_size_arguments(dst: str, shard_size, resume: bool = False) -> int:
    """Validate a sharded conversion's destination and size (ConfigurationError saying why; a
    ``resume`` is refused: a sharded conversion keeps no journal). Returns the size in bytes."""
    size = parse_size(shard_size)
    check_destination(dst)
    if resume:
        raise ConfigurationError(
            f"{dst}: --resume / resume=True is not supported with --shard-size: a sharded "
            "conversion keeps no journal (its shards are closed and hashed one by one); "
            "run it again from the start",
            path=str(dst),
        )
    return size
