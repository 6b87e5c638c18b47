"""Atomic creation and replacement of a dataset, safe against kills and concurrent writers.

The guarantees, at every instant of a conversion (Ctrl-C, SIGTERM and SIGKILL included):

* **DST names a complete dataset or nothing new.** The output is written under a temporary name in
  DST's folder, synced, and only then moved onto DST. Without an existing DST that is one
  ``rename(2)``. With ``overwrite`` a file is replaced by one ``rename(2)`` (atomic by POSIX); a
  directory (LMDB) is swapped with ``renameat2(RENAME_EXCHANGE)`` (Linux >= 3.15, through ctypes),
  so DST names the complete old dataset until the exchange and the complete new one after it. Where
  the file system refuses the exchange (EINVAL/ENOSYS), the old directory is moved aside to
  ``.<name>.old-<pid>-<hex>`` then the new one renamed in; a kill between those two renames is
  repaired by the next writer, which moves the old one back.
* **One writer per DST.** An advisory ``fcntl.flock`` on ``.<name>.lock`` next to DST (holding the
  writer's pid) is held from before the existence check to after the swap; a second writer fails at
  once with :class:`~ffload.errors.DatasetBusyError` ("DST is being written by process N"). The
  lock file is removed by its holder, which re-checks after locking that the file it locked is
  still the one at that path (so an unlink never lets two writers in).
* **No litter.** Temporary names carry the writer's pid (``.<name>.tmp-<pid>-<hex>``). On an
  exception (KeyboardInterrupt, and SIGTERM once the CLI turns it into one) they are removed on the
  way out; after a SIGKILL the next writer of DST, holding the lock, removes those whose pid is no
  longer alive. SIGINT/SIGTERM are held back during the swap itself, so a signal lands before it (old
  dataset kept) or after it (new one in place), never between two renames.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import logging
import os
import re
import shutil
import signal
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from ffload.errors import ConfigurationError, DatasetBusyError
from ffload.formats.beton import DEFAULT_PAGE_SIZE, BetonWriter
from ffload.formats.fields.base import Field
from ffload.formats.lmdb.writer import LMDBWriter
from ffload.formats.shards import ShardedWriter, check_destination
from ffload.formats.writer import DatasetWriter

logger = logging.getLogger(__name__)

FORMATS = {".beton": "beton", ".lmdb": "lmdb"}


def format_for_path(path: str) -> str:
    """``'beton'`` or ``'lmdb'`` from the destination's suffix.

    Args:
        path: a destination path ending in ``.beton`` or ``.lmdb`` (any case).

    Raises:
        ConfigurationError: (a ``ValueError``) any other suffix.
    """
    suffix = os.path.splitext(os.path.normpath(path))[1].lower()
    if suffix not in FORMATS:
        raise ConfigurationError(
            f"{path}: cannot tell the output format from the suffix {suffix!r} (use one of {', '.join(FORMATS)})"
        )
    return FORMATS[suffix]


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        os.remove(path)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (``kill(pid, 0)``; EPERM means it exists under another user)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def lock_path(dst: str) -> str:
    """The lock file of ``dst``: ``.<name>.lock`` in ``dst``'s folder."""
    parent, name = os.path.split(os.path.abspath(dst))
    return os.path.join(parent, f".{name}.lock")


@contextmanager
def writer_lock(dst: str) -> Iterator[None]:
    """Hold the advisory lock of ``dst`` (see the module docstring) for the ``with`` block.

    Raises:
        DatasetBusyError: another process holds it; the message names that process's pid.
    """
    path = lock_path(dst)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
            os.close(fd)
            raise DatasetBusyError(
                f"{dst} is being written by process {holder}",
                path=dst,
                hint="wait for it to finish, or write elsewhere",
            ) from None
        try:  # the holder before us may have unlinked the file between our open and our flock
            same = os.path.samestat(os.fstat(fd), os.stat(path))
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        try:
            os.unlink(path)  # while still locked: a waiting writer re-opens and re-checks
        except FileNotFoundError:
            pass
        os.close(fd)


def _temporary_names(parent: str, name: str) -> Iterator[tuple[str, str, int]]:
    """``(path, kind, pid)`` of the temporaries of ``name`` in ``parent`` (kind ``'tmp'`` or ``'old'``)."""
    pattern = re.compile(rf"\.{re.escape(name)}\.(tmp|old)-(\d+)-[0-9a-f]+$")
    for entry in os.listdir(parent):
        match = pattern.match(entry)
        if match:
            yield os.path.join(parent, entry), match.group(1), int(match.group(2))


def recover(dst: str) -> None:
    """Repair what dead writers of ``dst`` left (call with :func:`writer_lock` held): a ``.old-``
    directory moved aside by a writer killed mid-swap goes back to ``dst`` when ``dst`` is missing;
    every other temporary whose pid is not alive is removed (logged)."""
    parent, name = os.path.split(dst)
    for path, kind, pid in sorted(_temporary_names(parent, name), key=lambda t: t[1]):  # 'old' first
        if pid != os.getpid() and pid_alive(pid):
            continue
        if kind == "old" and not os.path.lexists(dst):
            os.rename(path, dst)
            logger.warning("%s: restored the previous dataset left aside by dead writer %d", dst, pid)
        else:
            _remove(path)
            logger.warning("%s: removed %s, left by dead writer %d", dst, os.path.basename(path), pid)


_RENAME_EXCHANGE = 2  # <linux/fs.h>
_AT_FDCWD = -100


def _exchange(a: str, b: str) -> bool:
    """Swap the names ``a`` and ``b`` in one step (``renameat2(AT_FDCWD, a, AT_FDCWD, b,
    RENAME_EXCHANGE)``); False where the kernel, libc or file system does not support it."""
    renameat2 = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if renameat2 is None:
        return False
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), a, None, b)


@contextmanager
def _signals_held_back() -> Iterator[None]:
    """Defer SIGINT and SIGTERM to the end of the block: their Python handlers (which raise
    KeyboardInterrupt / the CLI's Terminated) run only in the main thread, so there they are
    replaced by a recorder for the block and the recorded signals re-raised after it. Blocking
    with ``pthread_sigmask`` would not do: the kernel hands a process-directed signal to any
    thread that does not block it, and Python then runs the handler in the main thread anyway.
    Outside the main thread the handlers cannot interrupt this code, and nothing is changed."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []
    previous = {
        sig: signal.signal(sig, lambda signum, frame: pending.append(signum)) for sig in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        yield
    finally:
        for sig, handler in previous.items():  # None: a handler installed from C; the default
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
        for sig in dict.fromkeys(pending):
            signal.raise_signal(sig)


def _swap_in(tmp: str, dst: str, litter: list[str]) -> None:
    """Make ``dst`` name the complete output at ``tmp``, atomically (see the module docstring), then
    delete what ``dst`` named before. SIGINT/SIGTERM are held back during the swap (delivered after);
    the path of the replaced dataset is appended to ``litter`` once it is no longer needed, so that
    a caller interrupted later still removes it."""
    old = tmp  # after an exchange the old dataset lives under the temporary name
    with _signals_held_back():
        if not os.path.lexists(dst) or (os.path.isfile(tmp) and not os.path.isdir(dst)):
            os.rename(tmp, dst)  # new name, or a file replacing a file: one atomic rename
        elif not _exchange(tmp, dst):
            old = os.path.join(
                os.path.dirname(dst), f".{os.path.basename(dst)}.old-{os.getpid()}-{uuid.uuid4().hex[:8]}"
            )
            os.rename(dst, old)  # a SIGKILL from here to the next rename is repaired by recover()
            try:
                os.rename(tmp, dst)
            except BaseException:
                os.rename(old, dst)
                raise
            litter.append(old)
        _fsync_dir(os.path.dirname(dst))
    _remove(old)


@contextmanager
def dataset_writer(
    dst: str,
    fields: dict[str, Field],
    num_samples: int,
    overwrite: bool = False,
    page_size: int | None = None,
    tmp: str | None = None,
    open_writer: Callable[[str], DatasetWriter] | None = None,
    info: dict | None = None,
    shard_size: int | str | None = None,
) -> Iterator[DatasetWriter]:
    """Context manager yielding a :class:`~.writer.DatasetWriter` that writes ``dst`` atomically.

    The writer takes ``add(index, metas, payloads)``; the guarantees are those of the module
    docstring.

    The format comes from ``dst``'s suffix (``.beton`` file or ``.lmdb`` directory). On normal
    exit the writer is closed, synced and swapped onto ``dst``; on an exception the temporary
    output is deleted and the exception propagates. ``tmp`` names the temporary output (default:
    a fresh hidden name beside ``dst`` carrying this process's pid) and ``open_writer(tmp)`` makes
    the writer (default: a new BetonWriter / LMDBWriter storing ``info``, the dataset-level JSON
    object), as a resumed conversion does (``ffload.convert.journal``; when ``open_writer`` fails,
    ``tmp`` is kept: it is the partial output its journal describes). With ``shard_size``
    (bytes, or a size string such as ``"1GB"``) ``dst`` is a directory of ``.beton`` shards and
    its manifest (:class:`~.shards.ShardedWriter`), swapped in as a whole once complete.

    Args:
        dst: the output path, ``.beton`` or ``.lmdb`` (or a shard directory with ``shard_size``).
        fields: field name -> :class:`~ffload.formats.fields.Field`, in field order.
        num_samples: the number of samples that will be added.
        overwrite: replace an existing ``dst`` once the new one is complete.
        page_size: ``.beton`` page size in bytes; None: the default.
        tmp: the temporary output's path; None: a fresh hidden name beside ``dst``.
        open_writer: ``open_writer(tmp)`` makes the writer; None: a new one for the format.
        info: the dataset-level JSON object; None: ``{}``.
        shard_size: bytes per shard, or a size string such as ``"1GB"``; None: one file.

    Raises:
        DatasetBusyError: another process is writing ``dst`` (names its pid).
        FileExistsError: ``dst`` exists and ``overwrite`` is False (checked before writing).
        ValueError: unknown suffix or field names; with ``shard_size``, a bad size or an
            ``.lmdb`` / ``.beton`` name (ConfigurationError saying why).
    """
    if shard_size is not None:
        check_destination(dst)
        fmt = "shards"
    else:
        fmt = format_for_path(dst)
    dst = os.path.abspath(dst)
    parent = os.path.dirname(dst)
    if not os.path.isdir(parent):
        raise FileNotFoundError(f"output folder {parent} does not exist")
    with writer_lock(dst):
        recover(dst)
        if os.path.lexists(dst) and not overwrite:
            raise FileExistsError(f"{dst} already exists (pass overwrite=True / --overwrite to replace it)")
        tmp = tmp or os.path.join(parent, f".{os.path.basename(dst)}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
        # a resumed output that cannot be continued stays where it is (the error names its journal)
        writer = None if open_writer is None else open_writer(tmp)
        litter = [tmp]  # what an exception must remove
        try:
            if writer is None and fmt == "shards":
                writer = ShardedWriter(tmp, fields, num_samples, shard_size, page_size or DEFAULT_PAGE_SIZE, info=info)
            elif writer is None and fmt == "beton":
                writer = BetonWriter(tmp, fields, num_samples, page_size or DEFAULT_PAGE_SIZE, info=info)
            elif writer is None:
                writer = LMDBWriter(tmp, fields, num_samples, info=info)
            with writer:  # closes (commits) on normal exit, aborts on an exception
                yield writer
            _swap_in(tmp, dst, litter)
        except BaseException:
            for path in litter:
                _remove(path)
            raise
