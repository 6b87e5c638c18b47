"""Resumable ``.beton`` conversions: the partial output under a fixed temporary name, and its journal.

A conversion to ``dir/x.beton`` writes ``dir/.x.beton.partial`` (the output so far) and keeps beside it, at each
checkpoint (after a whole chunk of samples, at most every ``checkpoint_seconds``):

* ``.x.beton.partial.meta``  the metadata rows of the samples written (raw ``metadata_dtype`` records, appended);
* ``.x.beton.partial.alloc`` their allocation-table rows (raw ``ALLOC_TYPE`` records, appended);
* ``.x.beton.partial.origins`` their origins (provenance: ``<u4`` length + UTF-8 records, appended,
  :meth:`ffload.formats.origins.OriginLog.records`);
* ``.x.beton.partial.json``  the journal, JSON (never pickle), replaced atomically at each checkpoint::

      {"format": "ffload-convert-journal", "version": 2, "dst": "/abs/x.beton",
       "fingerprint": "<sha256 of the source>", "arguments": {...fields, page size, options...},
       "num_samples": N, "next_index": source index to continue from, "samples": samples committed,
       "data_bytes": bytes of the data region committed, "page_size": ..., "data_start": ...,
       "metadata_rows": ..., "alloc_rows": ..., "origin_bytes": ..., "origins": true,
       "skipped": [[input, cause, origin], ...], "outcomes": {...}}

A checkpoint first fsyncs the partial output, then appends and fsyncs the rows, then replaces the journal: whatever
point a kill (SIGKILL, OOM killer, power loss) hits, the journal describes a consistent prefix, and
``convert_dataset(..., resume=True)`` (``ffload convert --resume``) cuts the files back to it and continues from
``next_index``; the result is byte-identical to an uninterrupted run. A Python-level error or Ctrl-C still removes
everything (the output is atomic, see ``ffload.formats.atomic``). A resume is refused, naming what differs, when
the source's fingerprint (file-backed sources: every file's path, size and modification time; others: their
length, labels and classes) or an argument that changes the bytes written differs from the journal's.
The journal files are locked (``flock``) while a conversion runs: a second conversion to the same DST is refused.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import time

import numpy as np

from ffload.errors import ConfigurationError
from ffload.formats.atomic import _fsync_dir
from ffload.formats.beton import ALLOC_TYPE, DEFAULT_PAGE_SIZE, BetonWriter
from ffload.formats.fields.base import Field, metadata_dtype

__all__ = ["ConversionJournal", "source_fingerprint"]

logger = logging.getLogger(__name__)

FORMAT = "ffload-convert-journal"
VERSION = 2


def source_fingerprint(source) -> str:
    """A sha256 (hex) identifying the samples of ``source``: its type, name, length, classes and labels, and for
    file-backed sources every file's path, size and ``st_mtime_ns`` (``ImageFolderSource.path(i)``, or the shards
    of a ``WebDatasetSource``; for a remote source, each object's URL, size and ETag from its listing).
    Raises OSError when a file cannot be stat'ed."""
    digest = hashlib.sha256()
    classes = getattr(source, "classes", None)
    digest.update(
        json.dumps(
            [
                type(source).__name__,
                getattr(source, "name", None),
                len(source),
                list(classes) if classes is not None else None,
            ]
        ).encode()
    )
    labels = getattr(source, "labels", None)
    if labels is not None:
        digest.update(np.ascontiguousarray(labels, dtype=np.int64).tobytes())
    if hasattr(source, "file_entries"):  # remote sources: URL, size and ETag from their listing
        for url, size, etag in source.file_entries():
            digest.update(f"{url}\0{size}\0{etag}\n".encode())
        return digest.hexdigest()
    if hasattr(source, "path"):
        files = (source.path(i) for i in range(len(source)))
    else:
        files = iter(getattr(source, "shards", ()))
    for path in files:
        st = os.stat(path)
        digest.update(f"{path}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return digest.hexdigest()


class ConversionJournal:
    """The partial output and journal of one ``.beton`` conversion to ``dst`` (see the module docstring).

    Args:
        dst: the destination path. fields: the dataset's fields. num_samples: the source's length.
        arguments: JSON-able arguments that decide the bytes written (compared on resume).
        fingerprint: :func:`source_fingerprint` of the source.
        checkpoint_seconds: at most one checkpoint per this many seconds (0: after every chunk).
    Raises:
        ConfigurationError: another conversion to ``dst`` holds the journal's lock.
        FileNotFoundError: ``dst``'s folder does not exist.
    """

    def __init__(
        self,
        dst: str,
        fields: dict[str, Field],
        num_samples: int,
        arguments: dict,
        fingerprint: str,
        checkpoint_seconds: float = 1.0,
    ):
        self.dst = os.path.abspath(dst)
        parent, base = os.path.split(self.dst)
        if not os.path.isdir(parent):
            raise FileNotFoundError(f"output folder {parent} does not exist")
        self.partial = os.path.join(parent, f".{base}.partial")
        self.kept = False  # set when the journal's checkpoint cannot be continued: discard() keeps the files
        self.path, self.meta_path, self.alloc_path, self.origins_path = (
            self.partial + s for s in (".json", ".meta", ".alloc", ".origins")
        )
        self.fields, self.num_samples = dict(fields), int(num_samples)
        self.arguments, self.fingerprint = json.loads(json.dumps(arguments)), fingerprint
        self.checkpoint_seconds = float(checkpoint_seconds)
        self.mtype = metadata_dtype(list(self.fields.values()))
        self._last = 0.0
        self._lock = os.open(self.partial + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock)
            raise ConfigurationError(
                f"{self.dst}: another conversion to this destination is running (it holds {self.partial}.lock)",
                path=self.dst,
            ) from None

    def load(self) -> dict | None:
        """The journal of an earlier run, checked against this one; None when there is none.

        Raises:
            ConfigurationError: the journal is unreadable, or records another source, other
                arguments or another destination (the message names what differs), or its
                partial output or rows are shorter than it records.
        """
        if not os.path.exists(self.path):
            if os.path.exists(self.partial):
                raise ConfigurationError(
                    f"{self.partial}: a partial output without a journal (the run was "
                    f"killed while its pages grew); convert again without --resume"
                )
            return None
        try:
            with open(self.path, "rb") as f:
                journal = json.loads(f.read())
        except ValueError as e:
            raise ConfigurationError(f"{self.path}: unreadable journal ({e}); convert again without --resume") from e
        if journal.get("format") != FORMAT or journal.get("version") != VERSION:
            raise ConfigurationError(f"{self.path}: not an ffload conversion journal (version {VERSION})")
        for key, here, label in (
            ("dst", self.dst, "destination"),
            ("fingerprint", self.fingerprint, "source"),
            ("num_samples", self.num_samples, "number of samples"),
        ):
            if journal.get(key) != here:
                raise ConfigurationError(
                    f"{self.dst}: cannot resume: the {label} changed since the interrupted "
                    f"run (journal {journal.get(key)!r}, now {here!r}); convert again "
                    f"without --resume",
                    path=self.dst,
                )
        theirs = journal.get("arguments", {})
        changed = sorted(k for k in set(theirs) | set(self.arguments) if theirs.get(k) != self.arguments.get(k))
        if changed:
            detail = "; ".join(f"{k}: was {theirs.get(k)!r}, now {self.arguments.get(k)!r}" for k in changed)
            raise ConfigurationError(
                f"{self.dst}: cannot resume with other arguments than the interrupted run "
                f"({detail}); convert again without --resume",
                path=self.dst,
            )
        need = (
            (self.partial, journal["data_start"] + journal["data_bytes"]),
            (self.meta_path, journal["metadata_rows"] * self.mtype.itemsize),
            (self.alloc_path, journal["alloc_rows"] * ALLOC_TYPE.itemsize),
            (self.origins_path, journal.get("origin_bytes", 0)),
        )
        for path, size in need:
            if not os.path.exists(path) or os.path.getsize(path) < size:
                raise ConfigurationError(
                    f"{path}: shorter than the journal records ({size} bytes); convert again without --resume",
                    path=path,
                )
        return journal

    def start(self) -> None:
        """Begin a conversion from scratch: remove an earlier run's partial output and journal."""
        if os.path.exists(self.path):
            logger.warning(
                "%s: discarding the partial output of an interrupted conversion (use --resume to continue it)", self.dst
            )
        self._remove_files()
        for path in (self.meta_path, self.alloc_path, self.origins_path):
            open(path, "wb").close()

    def writer(self, page_size: int | None, journal: dict | None, info: dict | None = None, origin_room: int = 0):
        """``open_writer`` for :func:`ffload.formats.atomic.dataset_writer`: a new BetonWriter (storing
        ``info``, reserving ``origin_room`` bytes for the origin block) on the partial path, or one
        continuing it at ``journal``'s checkpoint; checkpoints are invalidated before pages grow."""

        def open_writer(path: str) -> BetonWriter:
            resume = None
            if journal is not None:
                meta = np.fromfile(self.meta_path, dtype=self.mtype, count=journal["metadata_rows"])
                allocs = np.fromfile(self.alloc_path, dtype=ALLOC_TYPE, count=journal["alloc_rows"])
                os.truncate(self.origins_path, journal.get("origin_bytes", 0))
                with open(self.origins_path, "rb") as f:
                    origins = f.read()
                for name, rows in ((self.meta_path, meta), (self.alloc_path, allocs)):
                    os.truncate(name, rows.nbytes)
                state = {k: journal.get(k) for k in ("count", "page_size", "data_start", "data_bytes", "origins")}
                resume = (state, meta, allocs, origins)
            try:
                writer = BetonWriter(
                    path,
                    self.fields,
                    self.num_samples,
                    page_size or DEFAULT_PAGE_SIZE,
                    resume=resume,
                    info=info,
                    origin_room=origin_room,
                )
            except ConfigurationError as e:
                if resume is None:
                    raise
                self.kept = True
                raise ConfigurationError(
                    f"{self.path}: cannot resume from this journal ({e}); convert again without --resume",
                    path=self.path,
                ) from e
            writer.before_grow = self._invalidate
            return writer

        return open_writer

    def commit(self, writer: BetonWriter, next_index: int, skipped: list, outcomes: dict, force: bool = False) -> None:
        """Checkpoint ``writer`` (everything before source index ``next_index`` is written) when
        ``checkpoint_seconds`` have passed since the last one, or ``force``."""
        now = time.monotonic()
        if not force and now - self._last < self.checkpoint_seconds:
            return
        self._last = now
        state, meta, allocs, origins = writer.checkpoint()
        for path, rows in (
            (self.meta_path, meta.tobytes()),
            (self.alloc_path, allocs.tobytes()),
            (self.origins_path, origins),
        ):
            with open(path, "ab") as f:
                f.write(rows)
                f.flush()
                os.fsync(f.fileno())
        journal = {
            "format": FORMAT,
            "version": VERSION,
            "dst": self.dst,
            "fingerprint": self.fingerprint,
            "arguments": self.arguments,
            "num_samples": self.num_samples,
            "next_index": int(next_index),
            "samples": state["count"],
            **state,
            "metadata_rows": state["count"],
            "alloc_rows": os.path.getsize(self.alloc_path) // ALLOC_TYPE.itemsize,
            "origin_bytes": os.path.getsize(self.origins_path),
            "skipped": [list(s) for s in skipped],
            "outcomes": dict(outcomes),
        }
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(journal, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        _fsync_dir(os.path.dirname(self.path))

    def _invalidate(self) -> None:
        """The partial output is about to move (pages grow): a crash before the next checkpoint leaves nothing
        to resume from, rather than a journal that misdescribes the file."""
        if os.path.exists(self.path):
            os.remove(self.path)
            _fsync_dir(os.path.dirname(self.path))
        self._last = 0.0  # checkpoint again at the next chance

    def discard(self) -> None:
        """Remove the journal files and the partial output (if still there), and release the lock; when
        the journal could not be continued (:attr:`kept`) only release the lock: its files stay, as
        its error says, for the user to look at or remove (a conversion without ``--resume``)."""
        if not self.kept:
            self._remove_files()
        self.release()

    def release(self) -> None:
        """Release the lock (the files stay)."""
        if self._lock is not None:
            os.remove(self.partial + ".lock")
            os.close(self._lock)
            self._lock = None

    def _remove_files(self) -> None:
        for path in (self.path, self.path + ".tmp", self.meta_path, self.alloc_path, self.origins_path, self.partial):
            if os.path.lexists(path):
                os.remove(path)
