"""``convert_dataset``: an image source in, one complete ``.beton`` file or LMDB directory out."""
from __future__ import annotations

import contextlib
import contextvars
import copy
import errno
import inspect
import os
import time
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from ffload.convert.encode import SampleEncoder, encoded_chunks
from ffload.convert.provenance import left_out_origin, origin_room, source_origins
from ffload.errors import ConfigurationError, ConvertError
from ffload.formats import dataset_writer, format_for_path
from ffload.formats.fields.base import Field
from ffload.formats.fields.image import RGBImageField
from ffload.formats.fields.scalars import IntField
from ffload.formats.shards import MANIFEST, check_shard_size_arguments
from ffload.limits import DEFAULT_MAX_PIXELS
from ffload.storage import is_remote
from ffload.system import available_cpus, path_bytes

_SHARD_URL: contextvars.ContextVar[str | None] = contextvars.ContextVar("shard_url", default=None)
"""Set by :func:`_convert_to_remote_shards` for a Ray conversion: the URL prefix its tasks upload
the shards to (the local directory then gets only the manifest)."""


@dataclass
class ConvertReport:
    """What a conversion wrote.

    Attributes:
        dst: the output path; format: ``'beton'``, ``'lmdb'`` or ``'shards'`` (a sharded directory).
        samples: samples written; classes: number of classes (None if the source has no names).
        bytes: size of the output on disk (bytes); seconds: wall time of the conversion.
        skipped: ``(input, cause)`` for every input skipped under ``on_error='skip'``.
        skipped_origins: the origin of each of them, in the same order (an ImageFolder's path
            relative to its root, a WebDataset ``shard:key``, ...: :mod:`.provenance`), or None.
        label_counts: ``(C,) int64`` samples per label written (the class histogram).
        workers: worker processes used.
        passed_through: images stored as their source JPEG's bytes (no decode, no encode).
        reencoded: images decoded and re-encoded to JPEG, counted per reason (a key of
            :data:`ffload.convert.passthrough.REASONS`); images stored raw count in neither.
        resumed_from: source samples an interrupted run had converted already (``resume``); the
            counts above include them, ``seconds`` does not.
    """

    dst: str
    format: str
    samples: int
    classes: int | None
    bytes: int
    seconds: float
    skipped: list[tuple[str, str]] = field(default_factory=list)
    label_counts: np.ndarray | None = None
    workers: int = 0
    passed_through: int = 0
    reencoded: dict[str, int] = field(default_factory=dict)
    resumed_from: int = 0
    skipped_origins: list[str | None] = field(default_factory=list)

    @property
    def bytes_per_sample(self) -> float:
        return self.bytes / self.samples if self.samples else 0.0

    def as_dict(self) -> dict:
        """JSON-able summary."""
        return {"dst": self.dst, "format": self.format, "samples": self.samples,
                "classes": self.classes, "bytes": self.bytes,
                "bytes_per_sample": round(self.bytes_per_sample, 1), "seconds": round(self.seconds, 3),
                "images_per_second": round(self.samples / self.seconds, 1) if self.seconds else None,
                "workers": self.workers, "passed_through": self.passed_through,
                "reencoded": sum(self.reencoded.values()), "reencode_reasons": dict(self.reencoded),
                "resumed_from": self.resumed_from,
                "label_counts": None if self.label_counts is None else self.label_counts.tolist(),
                "skipped": [{"input": i, "cause": c, "origin": o} for (i, c), o in
                            zip(self.skipped, self.skipped_origins + [None] * len(self.skipped))]}


def image_fields(write_mode: str = "raw", max_resolution: int | None = None, jpeg_quality: int = 90,
                 smart_threshold: int | None = None,
                 compress_probability: float = 0.5,
                 jpeg_restart_interval: int | None = None) -> dict[str, Field]:
    """The fields of an image-classification dataset: ``image`` (RGBImageField) then ``label``
    (IntField), the order of FFCV's examples."""
    return {"image": RGBImageField(write_mode, max_resolution, smart_threshold, jpeg_quality,
                                   compress_probability, jpeg_restart_interval),
            "label": IntField()}


def _disk_full(e: Exception) -> bool:
    """Whether ``e`` reports a full disk or quota, by class and errno: ``OSError`` ENOSPC/EDQUOT,
    ``lmdb.DiskError`` (py-lmdb's class for ENOSPC), or an ``lmdb.Error`` whose ``code`` is EDQUOT."""
    import lmdb

    full = (errno.ENOSPC, errno.EDQUOT)
    if isinstance(e, OSError):
        return e.errno in full
    return isinstance(e, lmdb.DiskError) or (isinstance(e, lmdb.Error) and getattr(e, "code", None) in full)


def _open_journal(dst: str, fields: dict[str, Field], source, arguments: dict, resume: bool,
                  checkpoint_seconds: float):
    """``(ConversionJournal, the interrupted run's journal or None)`` for a ``.beton`` conversion;
    without ``resume`` (or with nothing to resume) an earlier run's files are removed. Raises
    ConfigurationError as :meth:`ConversionJournal.load` does, leaving the files in place."""
    from ffload.convert.journal import ConversionJournal, source_fingerprint

    journal = ConversionJournal(dst, fields, len(source), arguments, source_fingerprint(source), checkpoint_seconds)
    try:
        state = journal.load() if resume else None
    except BaseException:
        journal.release()
        raise
    if state is None:
        journal.start()
    return journal, state


def convert_dataset(source, dst: str, write_mode: str = "raw", max_resolution: int | None = None,
                    jpeg_quality: int = 90, smart_threshold: int | None = None,
                    compress_probability: float = 0.5, jpeg_restart_interval: int | None = None,
                    num_workers: int | None = None,
                    on_error: str = "fail", overwrite: bool = False, progress: bool = True,
                    page_size: int | None = None, chunk_size: int | None = None,
                    fields: dict[str, Field] | None = None, source_kind: str | None = None,
                    reencode: bool = False, strip_metadata: bool = False, verify: bool = False,
                    resume: bool = False, checkpoint_seconds: float = 1.0, engine: str = "local",
                    ray_address: str | None = None, storage_options: dict | None = None,
                    shard_size: int | str | None = None,
                    max_pixels: int | None = DEFAULT_MAX_PIXELS) -> ConvertReport:
    """Convert an image source into ``dst`` (``.beton`` file or ``.lmdb`` directory, by suffix;
    with ``shard_size``, a directory of ``.beton`` shards and a manifest).

    Args:
        source: a path (ImageFolder root or CIFAR archive folder, see ``detect_source``; or the
            URL of an ImageFolder on object storage, ``s3://bucket/prefix``) or a Source
            (``ImageFolderSource``, ``CIFARSource``, ``ArraySource``, ``IndexableSource``,
            ``RemoteImageFolderSource``).
        dst: output path; it appears only when complete (temporary name, fsync, rename). A URL
            (``s3://bucket/key.beton``; ``.beton`` only) is written to a local file in
            :func:`remote_staging_dir` (under ``$FFLOAD_CACHE_DIR`` or ``~/.cache/ffload``, keyed
            by the URL) and uploaded once complete, so a failed conversion never leaves an object
            there (S3 makes an object visible only when its upload completes); ``resume`` works
            for it too.
        write_mode, max_resolution, jpeg_quality, smart_threshold, compress_probability: the
            ``RGBImageField`` arguments (FFCV's meaning); jpeg_restart_interval: its restart
            markers (ffload's; ``None``: one per MCU for images of at least 128 px a side).
        num_workers: encoding processes (None: all cores; 0: in this process).
        on_error: ``'fail'`` stops at the first bad input naming it; ``'skip'`` leaves it out and
            lists it in ``ConvertReport.skipped``.
        overwrite: replace an existing ``dst`` (only once the new one is complete).
        progress: show a tqdm bar (images/s) on stderr.
        page_size: ``.beton`` page size in bytes (power of two >= 2 MiB; grows for large samples).
        chunk_size: samples per worker task (default: sized so that a task carries ~16 MiB).
        fields: override the fields (default: :func:`image_fields` from the arguments above).
        source_kind: force the source detection (``'imagefolder'``, ``'cifar10'``, ``'cifar100'``).
        reencode: decode and re-encode every JPEG (FFCV's behaviour) instead of storing a source
            JPEG's own bytes where it already is what the write mode asks for (pass-through, see
            :mod:`ffload.convert.passthrough`; file-backed sources with the default fields).
        strip_metadata: drop the APPn/COM metadata segments of passed-through JPEGs.
        verify: decode each passed-through JPEG once as the loader would; one that fails is
            re-encoded from OpenCV's decode instead.
        resume: ``.beton`` only: continue the interrupted conversion to ``dst`` from its last
            checkpoint (byte-identical to an uninterrupted run; from scratch when there is
            none). Every ``.beton`` conversion keeps its partial output and a journal beside
            ``dst`` while it runs (:mod:`ffload.convert.journal`), so a killed one can resume.
        checkpoint_seconds: at most one checkpoint (fsync + journal) per this many seconds.
        engine: ``'local'`` (``num_workers`` forked processes) or ``'ray'``: chunks encoded by Ray
            tasks across the cluster at ``ray_address`` (``'auto'``, ``'ray://host:port'``; None:
            this process's Ray instance or a new local one), written here in order: the same
            output bytes (:mod:`ffload.convert.ray_engine`; needs ``ffload[ray]``). With
            ``shard_size``, each Ray task writes its own shards (into ``dst``'s temporary
            directory, which every node must see, or uploaded under a URL ``dst``) and only the
            manifest is written here: the same samples, order and pixels, with shard boundaries
            also at task boundaries (:mod:`ffload.convert.ray_shards`).
        storage_options: for a URL ``source`` or ``dst``, the filesystem's options (credentials,
            ``endpoint_url``; :func:`ffload.storage.open_filesystem`).
        shard_size: write a sharded dataset (:mod:`ffload.formats.shards`): ``dst`` becomes a
            directory of standalone ``.beton`` shards of at most this many bytes each (an int, or
            ``"1GB"``, ``"512MiB"``; a sample larger than that gets a shard of its own) and a
            ``manifest.json``; ``Loader(dst)`` reads it as one dataset. Not with an ``.lmdb``
            (or ``.beton``) name, nor with ``resume``. A URL ``dst`` (``s3://bucket/prefix``)
            gets the shards uploaded, then the manifest.
        max_pixels: refuse an input image whose header declares more pixels (a decompression
            bomb; :func:`~ffload.convert.images.check_pixels`, which also logs a warning above half
            of it), wherever this conversion reads one: decoded by the encoders (local or Ray),
            passed through as JPEG, or decoded by the source (a path is opened with this limit; a
            Source object whose own ``max_pixels`` differs is converted through a copy holding
            this one). ``None``: no limit. Part of the arguments a ``resume`` must repeat.

    Returns:
        ConvertReport.

    Raises:
        ConvertError: a bad input under ``on_error='fail'`` (names the file and cause), a full
            disk, or nothing left to write.
        ConfigurationError: an unknown ``engine``, or ``'ray'`` without Ray installed (the message
            gives the install command); ``resume`` to LMDB, or with another source or other
            arguments than the interrupted run (named in the message), or while another
            conversion to ``dst`` runs.
        FileExistsError: ``dst`` exists and ``overwrite`` is False.
        SourceError / ConfigurationError: the source or the arguments are invalid (before any
            writing); both are ``ValueError`` subclasses (:mod:`ffload.errors`).
    """
    from ffload.convert.sources import detect_source

    if on_error not in ("fail", "skip"):
        raise ConfigurationError(f"on_error must be 'fail' or 'skip', got {on_error!r}")
    if engine not in ("local", "ray"):
        raise ConfigurationError(f"engine must be 'local' or 'ray', got {engine!r}")
    if engine == "ray":
        from ffload.convert.ray_engine import import_ray
        import_ray()  # the install hint before any writing
    if is_remote(dst):
        arguments = {name: value for name, value in locals().items() if name in _PARAMETERS}
        return _convert_to_remote(arguments.pop("dst"), arguments)
    if shard_size is not None:
        shard_size = check_shard_size_arguments(dst, shard_size, resume)
        fmt = "shards"
    else:
        fmt = format_for_path(dst)
    if os.path.lexists(dst) and not overwrite:
        raise FileExistsError(f"{dst} already exists (use --overwrite / overwrite=True to replace it)")
    if isinstance(source, (str, os.PathLike)):
        source = detect_source(os.fspath(source), kind=source_kind, storage_options=storage_options,
                               max_pixels=max_pixels)
    elif getattr(source, "max_pixels", max_pixels) != max_pixels:  # one limit for the whole conversion
        source = copy.copy(source)
        source.max_pixels = max_pixels
    if fields is None:
        fields = image_fields(write_mode, max_resolution, jpeg_quality, smart_threshold, compress_probability,
                              jpeg_restart_interval)
    n = len(source)
    if n == 0:
        raise ConvertError(f"{getattr(source, 'name', source)}: the source has no samples")
    workers = available_cpus() if num_workers is None else max(0, int(num_workers))
    flist = list(fields.values())
    label_pos = list(fields).index("label") if "label" in fields else None
    labels = np.zeros(n, dtype=np.int64)
    # entries the source left out while listing (ImageFolderSource: unreadable folders, FIFOs, loops)
    unreadable = getattr(source, "unreadable", [])
    if unreadable and on_error == "fail":
        raise ConvertError(f"{unreadable[0][0]}: {unreadable[0][1]} ({len(unreadable)} unreadable entries; "
                           f"--on-error skip lists them and goes on)", path=unreadable[0][0])
    classes = getattr(source, "classes", None)
    descriptor, origin_of = source_origins(source)
    info = {"classes": [str(c) for c in classes]} if classes else {}  # read back as view.info
    info["origin"] = descriptor  # how to read the origin strings (ffload.formats.origins)
    journal = state = None
    if fmt == "beton":
        arguments = {"fields": {k: [type(f).__name__, f.arguments()] for k, f in fields.items()},
                     "page_size": page_size, "on_error": on_error, "reencode": reencode,
                     "strip_metadata": strip_metadata, "verify": verify, "info": info, "max_pixels": max_pixels}
        journal, state = _open_journal(dst, fields, source, arguments, resume, checkpoint_seconds)
    elif resume:  # (sharded outputs refused it above, saying why)
        raise ConfigurationError(f"{dst}: resume=True / --resume works for .beton outputs only")
    start, written = (state["next_index"], state["count"]) if state else (0, 0)
    # (input, cause, origin) per skipped input
    skipped: list[tuple] = ([(tuple(s) + (None,))[:3] for s in state["skipped"]] if state else
                            [(path, cause, left_out_origin(source, path)) for path, cause in
                             getattr(source, "left_out", [])])
    outcomes: Counter = Counter(state["outcomes"] if state else {})
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=n, initial=start, unit="img", desc=f"convert -> {os.path.basename(dst)}", smoothing=0.1)
    t0 = time.perf_counter()
    try:
        with dataset_writer(dst, fields, n, overwrite=overwrite, page_size=page_size,
                            tmp=journal and journal.partial, info=info, shard_size=shard_size,
                            open_writer=journal and journal.writer(page_size, state, info,
                                                                   origin_room(n, origin_of))) as writer:
            if journal is not None:
                if label_pos is not None:
                    labels[:written] = writer.metadata[f"f{label_pos}"][:written]
                journal.commit(writer, start, skipped, outcomes, force=True)
            encoder = SampleEncoder(source, flist, passthrough=not reencode,
                                    strip_metadata=strip_metadata, verify=verify, max_pixels=max_pixels)

            def take(errors: list, done: Counter) -> None:
                """The bookkeeping of one chunk or task: ``on_error``, outcomes."""
                if errors:
                    if on_error == "fail":
                        _, name, cause = errors[0]
                        raise ConvertError(f"{name}: {cause}")
                    skipped.extend((name, cause, origin_of(i)) for i, name, cause in errors)
                outcomes.update(done)

            if engine == "ray" and fmt == "shards":  # tasks write the shards; the manifest here
                from ffload.convert.ray_shards import ray_written_shards
                url = _SHARD_URL.get()
                results = ray_written_shards(encoder, list(fields), writer.shard_size, writer.page_size, writer.info,
                                             label_pos, folder=writer.path, url=url,
                                             on_error=on_error, address=ray_address,
                                             storage_options=storage_options,
                                             on_progress=None if bar is None else bar.update)
                try:
                    for result in results:
                        take(result.errors, result.outcomes)
                        writer.adopt(result.shards)
                        labels[written:written + len(result.labels)] = result.labels
                        written += result.samples
                finally:
                    results.close()
            else:
                if engine == "ray":
                    from ffload.convert.ray_engine import ray_encoded_chunks
                    chunks = ray_encoded_chunks(encoder, chunk_size, start=start, address=ray_address)
                else:
                    chunks = encoded_chunks(encoder, workers, chunk_size, start=start)
                try:
                    for chunk, slab in chunks:
                        take(chunk.errors, chunk.outcomes)
                        for index, metas, payloads in chunk.samples(flist, slab):
                            writer.add(written, metas, payloads, origin_of(index))
                            if label_pos is not None:
                                labels[written] = int(metas[label_pos])
                            written += 1
                        if journal is not None:
                            journal.commit(writer, chunk.stop, skipped, outcomes)
                        if bar is not None:
                            bar.update(chunk.stop - chunk.start)
                finally:
                    chunks.close()
            if written == 0:
                raise ConvertError(f"{getattr(source, 'name', 'source')}: every input failed; first: "
                                   f"{skipped[0][0]}: {skipped[0][1]}")
    except Exception as e:  # OSError from our writes, lmdb.Error from LMDB's
        if _disk_full(e):
            raise ConvertError(f"{dst}: no space left on the device while writing; nothing was "
                               f"written (the partial output was removed)", path=dst) from e
        raise
    finally:
        if journal is not None:
            journal.discard()  # done, or failed: the output is atomic (a killed run leaves its journal)
        if bar is not None:
            bar.close()
    seconds = time.perf_counter() - t0
    counts = None
    if label_pos is not None and written and labels[:written].min() >= 0:
        counts = np.bincount(labels[:written], minlength=len(classes) if classes else 0)
    return ConvertReport(dst=dst, format=fmt, samples=written, classes=len(classes) if classes else None,
                         bytes=path_bytes(dst), seconds=seconds, skipped=[(name, cause) for name, cause, _ in skipped],
                         skipped_origins=[origin for _, _, origin in skipped], label_counts=counts,
                         workers=workers, passed_through=outcomes.pop("passed_through", 0),
                         reencoded=dict(sorted(outcomes.items())), resumed_from=start)


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


def _convert_to_remote(dst: str, arguments: dict) -> ConvertReport:
    """:func:`convert_dataset` to a URL: convert into a local file in :func:`remote_staging_dir`,
    then upload it (:func:`ffload.storage.upload_file`) and remove the folder (also when the
    upload fails). A conversion that fails (a Python-level error, Ctrl-C, SIGTERM) removes its
    partial output as for a local DST; a killed one (SIGKILL, power loss) leaves its partial
    output and journal there, which ``resume`` continues from (the journal holds the staged
    path, the source's fingerprint and the arguments), uploading only once the output is complete.

    Raises ConfigurationError for an LMDB URL, FileExistsError when the object exists without
    ``overwrite``, StorageError when the upload fails (nothing is left at ``dst``)."""
    import posixpath
    import shutil

    from ffload.storage import remote_exists, upload_file

    options = arguments["storage_options"]
    if arguments["shard_size"] is not None:
        return _convert_to_remote_shards(dst, arguments)
    if format_for_path(dst) != "beton":
        raise ConfigurationError(f"{dst}: only .beton outputs can be written to object storage (an LMDB directory is "
                                 "read through a local memory map)", path=dst, hint="convert to a .beton URL")
    if not arguments["overwrite"] and remote_exists(dst, options):
        raise FileExistsError(f"{dst} already exists (use --overwrite / overwrite=True to replace it)")
    folder = remote_staging_dir(dst)
    os.makedirs(folder, exist_ok=True)
    local = os.path.join(folder, posixpath.basename(dst))
    if os.path.lexists(local):  # complete, from a run killed during its upload: converted again
        os.remove(local)
    try:  # an error removes the partial output (a refused resume leaves it, as for a local DST)
        report = convert_dataset(dst=local, **dict(arguments, overwrite=False))
    except BaseException:
        with contextlib.suppress(OSError):
            os.rmdir(folder)  # when empty
        raise
    try:
        upload_file(local, dst, options)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    report.dst = dst
    return report


def _convert_to_remote_shards(dst: str, arguments: dict) -> ConvertReport:
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

    options, prefix = arguments["storage_options"], dst.rstrip("/")
    check_shard_size_arguments(prefix, arguments["shard_size"], arguments["resume"])
    old = _remote_manifest_shards(prefix, options)
    if old is not None and not arguments["overwrite"]:
        raise FileExistsError(f"{dst} already holds a dataset (use --overwrite / overwrite=True to replace it)")
    version = f"v-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{uuid.uuid4().hex[:6]}"
    ray = arguments["engine"] == "ray"
    folder = tempfile.mkdtemp(prefix="ffload-upload-")
    try:
        local = os.path.join(folder, "dataset")
        token = _SHARD_URL.set(f"{prefix}/{version}" if ray else None)
        try:
            report = convert_dataset(dst=local, **dict(arguments, overwrite=False))
        finally:
            _SHARD_URL.reset(token)
        with open(os.path.join(local, MANIFEST), encoding="utf8") as fp:
            manifest = json.load(fp)
        for entry in manifest["shards"]:
            if not ray:
                upload_file(os.path.join(local, entry["path"]), f"{prefix}/{version}/{entry['path']}", options)
            entry["path"] = f"{version}/{entry['path']}"
        with open(os.path.join(local, MANIFEST), "w", encoding="utf8") as fp:
            json.dump(manifest, fp, ensure_ascii=False, indent=1)
        upload_file(os.path.join(local, MANIFEST), f"{prefix}/{MANIFEST}", options)
        report.bytes = sum(entry["bytes"] for entry in manifest["shards"]) + os.path.getsize(
            os.path.join(local, MANIFEST))
    except BaseException:
        _remove_remote([f"{prefix}/{version}"], options, recursive=True)
        raise
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    kept = {entry["path"] for entry in manifest["shards"]}
    if ray:  # the shards of a task that failed after uploading some (on_error='skip')
        _remove_remote(_remote_listing(f"{prefix}/{version}", options, strip=f"{prefix}/", skip=kept), options)
    if old:
        _remove_remote([f"{prefix}/{path}" for path in old if path not in kept], options)
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


_PARAMETERS = frozenset(inspect.signature(convert_dataset).parameters)
"""The argument names of :func:`convert_dataset` (forwarded by :func:`_convert_to_remote`)."""
