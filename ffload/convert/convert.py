"""``convert_dataset``: an image source in, one complete ``.beton`` file, LMDB directory or
directory of shards out, locally or at a URL; :func:`write_local`, the local processes' engine.

The options are one :class:`~ffload.convert.options.ConvertOptions`; the run itself is the shared
core :class:`~ffload.convert.conversion.Conversion` with one engine: :func:`write_local`,
:func:`~ffload.convert.ray_engine.write_ray_chunks` or :func:`~ffload.convert.ray_shards.write_ray_shards`.
A URL destination is converted into a local staging file or folder, then uploaded.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import time
from typing import TYPE_CHECKING, Any

from ffload.convert.conversion import Conversion, ConvertReport
from ffload.convert.encode import encoded_chunks
from ffload.convert.options import ConvertOptions
from ffload.convert.ray_engine import import_ray, write_ray_chunks
from ffload.convert.ray_shards import write_ray_shards
from ffload.errors import ConfigurationError
from ffload.formats import format_for_path
from ffload.formats.shards import MANIFEST, check_shard_size_arguments
from ffload.storage import is_remote

if TYPE_CHECKING:
    from ffload.convert.sources.base import Source


def convert_dataset(
    source: str | os.PathLike[str] | Source, dst: str, *, options: ConvertOptions | None = None, **keywords: Any
) -> ConvertReport:
    """Convert an image source into a ``.beton`` file, an ``.lmdb`` directory or ``.beton`` shards.

    ``dst``'s suffix picks the format (``.beton`` file or ``.lmdb`` directory); with
    ``shard_size``, ``dst`` is a directory of ``.beton`` shards and a manifest.

    Args:
        source: a path (ImageFolder root or CIFAR archive folder, see ``detect_source``; or the
            URL of an ImageFolder on object storage, ``s3://bucket/prefix``) or a Source
            (``ImageFolderSource``, ``CIFARSource``, ``ArraySource``, ``IndexableSource``,
            ``RemoteImageFolderSource``).
        dst: output path; it appears only when complete (temporary name, fsync, rename). A URL
            (``s3://bucket/key.beton``, or a sharded ``s3://bucket/prefix``) is written to a
            local file in :func:`remote_staging_dir` (under ``$FFLOAD_CACHE_DIR`` or
            ``~/.cache/ffload``, keyed by the URL) and uploaded once complete, so a failed
            conversion never leaves an object there (S3 makes an object visible only when its
            upload completes); ``resume`` works for it too. Every ``.beton`` conversion keeps its
            partial output and a journal beside ``dst`` while it runs
            (:mod:`ffload.convert.journal`), so a killed one can resume.
        options: all the options at once (:class:`~ffload.convert.options.ConvertOptions`);
            ``keywords`` given with it replace its fields.
        **keywords: the fields of :class:`~ffload.convert.options.ConvertOptions`, by name, with
            its defaults and meanings: ``write_mode``, ``max_resolution``, ``jpeg_quality``,
            ``smart_threshold``, ``compress_probability``, ``jpeg_restart_interval``,
            ``num_workers``, ``on_error``, ``overwrite``, ``progress``, ``page_size``,
            ``chunk_size``, ``fields``, ``source_kind``, ``reencode``, ``strip_metadata``,
            ``verify``, ``resume``, ``checkpoint_seconds``, ``engine``, ``ray_address``,
            ``storage_options``, ``shard_size``, ``max_pixels``.

    Returns:
        ConvertReport.

    Raises:
        TypeError: a keyword that is not an option.
        ConvertError: a bad input under ``on_error='fail'`` (names the file and cause), a full
            disk, or nothing left to write.
        ConfigurationError: a bad option (named); ``engine='ray'`` without Ray installed (the
            message gives the install command); ``resume`` to LMDB, or with another source or
            other options than the interrupted run (named in the message), or while another
            conversion to ``dst`` runs; an LMDB URL.
        FileExistsError: ``dst`` exists and ``overwrite`` is False.
        SourceError: the source is invalid (before any writing); like ``ConfigurationError``, a
            ``ValueError`` subclass (:mod:`ffload.errors`).
        StorageError: the upload to a URL ``dst`` failed (nothing is left there).
    """
    options = ConvertOptions(**keywords) if options is None else dataclasses.replace(options, **keywords)
    if options.engine == "ray":
        import_ray()  # the install hint before any writing
    if is_remote(dst):
        if options.shard_size is not None:
            return _convert_to_remote_shards(source, dst, options)
        return _convert_to_remote(source, dst, options)
    return _convert_to_path(source, dst, options)


def write_local(conversion: Conversion, writer) -> None:
    """The local engine: ``conversion.workers`` forked processes encode chunks
    (:func:`~ffload.convert.encode.encoded_chunks`), written here in source order."""
    conversion.write_chunks(
        writer,
        encoded_chunks(conversion.encoder, conversion.workers, conversion.options.chunk_size, start=conversion.start),
    )


def _convert_to_path(source, dst: str, options: ConvertOptions, shard_url: str | None = None) -> ConvertReport:
    """:func:`convert_dataset` to the local path ``dst`` with the options' engine; ``shard_url``:
    the URL prefix Ray tasks upload their shards to (a sharded URL destination)."""
    if options.engine == "local":
        engine = write_local
    elif options.shard_size is None:
        engine = write_ray_chunks
    else:
        engine = functools.partial(write_ray_shards, url=shard_url)
    return Conversion(source, dst, options).run(engine)


def remote_staging_dir(dst: str) -> str:
    """The local folder where a conversion to the URL ``dst`` writes its output (and, for
    ``.beton``, its resume journal, :mod:`ffload.convert.journal`) before the upload:
    ``<cache>/convert/<sha256(dst)[:24]>`` under :func:`ffload.storage.default_cache_dir`
    (``$FFLOAD_CACHE_DIR``, ``~/.cache/ffload``). The same URL gives the same folder, so that a
    killed conversion can be resumed (``--resume``)."""
    import hashlib

    from ffload.storage import default_cache_dir

    key = hashlib.sha256(dst.encode("utf8")).hexdigest()[:24]
    return os.path.join(default_cache_dir(), "convert", key)


def _convert_to_remote(source, dst: str, options: ConvertOptions) -> ConvertReport:
    """:func:`convert_dataset` to a URL: convert into a local file in :func:`remote_staging_dir`,
    then upload it (:func:`ffload.storage.upload_file`) and remove the folder (also when the
    upload fails). A conversion that fails (a Python-level error, Ctrl-C, SIGTERM) removes its
    partial output as for a local DST; a killed one (SIGKILL, power loss) leaves its partial
    output and journal there, which ``resume`` continues from (the journal holds the staged
    path, the source's fingerprint and the options), uploading only once the output is complete.

    Raises ConfigurationError for an LMDB URL, FileExistsError when the object exists without
    ``overwrite``, StorageError when the upload fails (nothing is left at ``dst``)."""
    import posixpath
    import shutil

    from ffload.storage import remote_exists, upload_file

    if format_for_path(dst) != "beton":
        raise ConfigurationError(
            f"{dst}: only .beton outputs can be written to object storage (an LMDB directory is "
            "read through a local memory map)",
            path=dst,
            hint="convert to a .beton URL",
        )
    if not options.overwrite and remote_exists(dst, options.storage_options):
        raise FileExistsError(f"{dst} already exists (use --overwrite / overwrite=True to replace it)")
    folder = remote_staging_dir(dst)
    os.makedirs(folder, exist_ok=True)
    local = os.path.join(folder, posixpath.basename(dst))
    if os.path.lexists(local):  # complete, from a run killed during its upload: converted again
        os.remove(local)
    try:  # an error removes the partial output (a refused resume leaves it, as for a local DST)
        report = _convert_to_path(source, local, dataclasses.replace(options, overwrite=False))
    except BaseException:
        with contextlib.suppress(OSError):
            os.rmdir(folder)  # when empty
        raise
    try:
        upload_file(local, dst, options.storage_options)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    report.dst = dst
    return report


def _convert_to_remote_shards(source, dst: str, options: ConvertOptions) -> ConvertReport:
    """:func:`convert_dataset` with ``shard_size`` to a URL prefix: convert into a local temporary
    directory, upload every shard under a new version folder ``PREFIX/v-<UTC time>-<hex>/``, then
    the manifest ``PREFIX/manifest.json`` naming them (readers open the manifest: the dataset
    appears, or an older one is replaced, in that one PUT). With ``engine='ray'`` the tasks upload
    their shards into the version folder themselves (:mod:`.ray_shards`) and the local directory
    gets only the manifest. Once the new manifest is up, the shards the replaced manifest named
    are deleted; a conversion or upload that fails deletes the version folder instead, so an
    older dataset at ``dst`` stays whole either way.

    Raises as :func:`_convert_to_remote`."""
    import json
    import shutil
    import tempfile
    import uuid

    from ffload.storage import upload_file

    storage, prefix = options.storage_options, dst.rstrip("/")
    check_shard_size_arguments(prefix, options.shard_size, options.resume)
    old = _remote_manifest_shards(prefix, storage)
    if old is not None and not options.overwrite:
        raise FileExistsError(f"{dst} already holds a dataset (use --overwrite / overwrite=True to replace it)")
    version = f"v-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{uuid.uuid4().hex[:6]}"
    ray = options.engine == "ray"
    folder = tempfile.mkdtemp(prefix="ffload-upload-")
    try:
        local = os.path.join(folder, "dataset")
        report = _convert_to_path(
            source,
            local,
            dataclasses.replace(options, overwrite=False),
            shard_url=f"{prefix}/{version}" if ray else None,
        )
        with open(os.path.join(local, MANIFEST), encoding="utf8") as fp:
            manifest = json.load(fp)
        for entry in manifest["shards"]:
            if not ray:
                upload_file(os.path.join(local, entry["path"]), f"{prefix}/{version}/{entry['path']}", storage)
            entry["path"] = f"{version}/{entry['path']}"
        with open(os.path.join(local, MANIFEST), "w", encoding="utf8") as fp:
            json.dump(manifest, fp, ensure_ascii=False, indent=1)
        upload_file(os.path.join(local, MANIFEST), f"{prefix}/{MANIFEST}", storage)
        report.bytes = sum(entry["bytes"] for entry in manifest["shards"]) + os.path.getsize(
            os.path.join(local, MANIFEST)
        )
    except BaseException:
        _remove_remote([f"{prefix}/{version}"], storage, recursive=True)
        raise
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    kept = {entry["path"] for entry in manifest["shards"]}
    if ray:  # the shards of a task that failed after uploading some (on_error='skip')
        _remove_remote(_remote_listing(f"{prefix}/{version}", storage, strip=f"{prefix}/", skip=kept), storage)
    if old:
        _remove_remote([f"{prefix}/{path}" for path in old if path not in kept], storage)
    report.dst = prefix
    return report


def _remote_manifest_shards(prefix: str, options: dict | None) -> list[str] | None:
    """The shard paths the manifest at ``PREFIX/manifest.json`` names (``[]`` when it cannot be
    parsed: nothing of it will be deleted), or None when there is no manifest."""
    import json

    from ffload.storage import RemoteObject, remote_exists

    where = f"{prefix}/{MANIFEST}"
    if not remote_exists(where, options):
        return None
    remote = RemoteObject(where, options)
    try:
        shards = json.loads(remote.read(0, remote.size).decode("utf8"))["shards"]
        return [entry["path"] for entry in shards if isinstance(entry["path"], str) and ".." not in entry["path"]]
    except (ValueError, KeyError, TypeError):
        return []


def _remote_listing(url: str, options: dict | None, strip: str, skip: set[str]) -> list[str]:
    """The URLs of the objects under ``url`` whose path after ``strip`` is not in ``skip``
    (best effort: empty when the listing fails)."""
    from ffload.storage import open_filesystem

    try:
        fs, path = open_filesystem(url, options)
        protocol = url.split("://", 1)[0]
        found = [f"{protocol}://{p}" for p in fs.find(path)]
    except Exception:  # noqa: BLE001 - a cleanup listing; nothing found means nothing deleted
        return []
    return [u for u in found if u.removeprefix(strip) not in skip]


def _remove_remote(urls: list[str], options: dict | None, recursive: bool = False) -> None:
    """Delete the objects at ``urls`` (with ``recursive``, everything under those prefixes), best
    effort: cleanup that fails (the store unreachable) leaves objects no manifest names."""
    from ffload.storage import open_filesystem

    if not urls:
        return
    with contextlib.suppress(Exception):
        fs, _ = open_filesystem(urls[0], options)
        paths = [open_filesystem(url, options)[1] for url in urls]
        fs.rm([p for p in paths if fs.exists(p)], recursive=recursive)
