"""Anonymous memory for the process caches: the ``mmap`` flags they reserve it with and the
advice that allocates it in one call.

:class:`~ffload.loaders.memory.process_cache.ProcessCacheMemory` and
:class:`~ffload.loaders.memory.pagepool.PagePoolMemory` reserve address space as long as their
region without committing memory (``MAP_NORESERVE``), then allocate each run they fill with one
``madvise(MADV_POPULATE_WRITE)`` instead of one page fault per 4 KiB page.
"""

from __future__ import annotations

import mmap
import sys

import numpy as np

MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)  # Linux >= 5.14
"""``madvise`` advice that allocates (and zeroes) a range's pages in one call."""

MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000 if sys.platform.startswith("linux") else 0)
"""``mmap`` flag: reserve address space only. Python < 3.13 lacks ``mmap.MAP_NORESERVE``; without
it a mapping larger than RAM + swap fails with ENOMEM under Linux's default overcommit heuristic."""

CAN_POPULATE = sys.platform.startswith("linux")
"""Whether to try :data:`MADV_POPULATE_WRITE` at all (Linux only)."""


def populate(buffer: mmap.mmap, start: int, length: int) -> bool:
    """Allocate the pages of bytes ``[start, start + length)`` of ``buffer`` in one call.

    Returns:
        False when the kernel does not support it (< 5.14: the caller stops asking, and its
        reads fault the pages in), else True.
    """
    try:
        buffer.madvise(MADV_POPULATE_WRITE, start, length)
    except OSError:
        return False
    return True


def region_view(buffer: mmap.mmap) -> np.ndarray:
    """The ``(R,) uint8`` region the decoders read from ``buffer``, read-only like a mapped data file's
    (:meth:`ffload.formats.view.DatasetView.open_region`); the caches fill ``buffer`` itself.

    numba types a read-only array apart from a writable one, so every kernel taking the region would
    otherwise be compiled (and cached) once for ``os_cache=True`` and again for the process caches:
    about 30 s for the JPEG decoder on a 2-core machine."""
    region = np.frombuffer(buffer, dtype=np.uint8)
    region.flags.writeable = False
    return region
