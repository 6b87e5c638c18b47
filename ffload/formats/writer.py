"""Atomic creation of a dataset file: write under a temporary name, fsync, rename into place.

The destination appears only when complete; on any error, Ctrl-C included, the temporary file
or directory is removed and the destination is left as it was.
"""
from __future__ import annotations

import os
import shutil
import uuid
from contextlib import contextmanager
from typing import Dict, Iterator, Optional

from .beton import DEFAULT_PAGE_SIZE, BetonWriter
from .fields import Field
from .lmdb_format import LMDBWriter

FORMATS = {".beton": "beton", ".lmdb": "lmdb"}


def format_for_path(path: str) -> str:
    """``'beton'`` or ``'lmdb'`` from the destination's suffix; ValueError for anything else."""
    suffix = os.path.splitext(os.path.normpath(path))[1].lower()
    if suffix not in FORMATS:
        raise ValueError(f"{path}: cannot tell the output format from the suffix {suffix!r} "
                         f"(use one of {', '.join(FORMATS)})")
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


@contextmanager
def dataset_writer(dst: str, fields: Dict[str, Field], num_samples: int, overwrite: bool = False,
                   page_size: Optional[int] = None) -> Iterator:
    """Context manager yielding a writer (``add(index, metas, payloads)``) for ``dst``.

    The format comes from ``dst``'s suffix (``.beton`` file or ``.lmdb`` directory). On normal
    exit the writer is closed, synced and renamed onto ``dst``; on an exception the temporary
    output is deleted and the exception propagates.

    Raises:
        FileExistsError: ``dst`` exists and ``overwrite`` is False (checked before writing).
        ValueError: unknown suffix or field names.
    """
    fmt = format_for_path(dst)
    dst = os.path.abspath(dst)
    if os.path.lexists(dst) and not overwrite:
        raise FileExistsError(f"{dst} already exists (pass overwrite=True / --overwrite to replace it)")
    parent = os.path.dirname(dst)
    if not os.path.isdir(parent):
        raise FileNotFoundError(f"output folder {parent} does not exist")
    tmp = os.path.join(parent, f".{os.path.basename(dst)}.tmp-{uuid.uuid4().hex[:8]}")
    writer = None
    try:
        if fmt == "beton":
            writer = BetonWriter(tmp, fields, num_samples, page_size or DEFAULT_PAGE_SIZE)
        else:
            writer = LMDBWriter(tmp, fields, num_samples)
        yield writer
        writer.close()
        writer = None
        if os.path.lexists(dst):  # overwrite: move the old one aside only now that the new one is complete
            old = tmp + ".old"
            os.rename(dst, old)
            os.rename(tmp, dst)
            _remove(old)
        else:
            os.rename(tmp, dst)
        _fsync_dir(parent)
    except BaseException:
        if writer is not None:
            writer.abort()
        _remove(tmp)
        raise
