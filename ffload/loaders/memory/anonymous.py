"""Anonymous memory for the process caches: the ``mmap`` flags they reserve it with, the advice
that allocates it in one call, and advice for many runs in one system call.

:class:`~ffload.loaders.memory.process_cache.ProcessCacheMemory` and
:class:`~ffload.loaders.memory.pagepool.PagePoolMemory` reserve address space as long as their
region without committing memory (``MAP_NORESERVE``), then allocate each run they fill with one
``madvise(MADV_POPULATE_WRITE)`` instead of one page fault per 4 KiB page.
:class:`~ffload.loaders.memory.process_cache.ProcessCacheMemory` allocates and frees a job's runs
(hundreds of single blocks for a batch of small random samples) with :func:`advise_vectored`:
``process_madvise`` on this process, up to :data:`IOV_MAX` runs per call. A ``madvise`` per run
freeing memory (``MADV_DONTNEED``) makes the kernel flush the TLB of every CPU running another
thread of the process, once per run; a kernel that batches the flushes of a ``process_madvise``
call does it once per call.
"""

from __future__ import annotations

import mmap
import sys

import numpy as np
from numba import njit

from ffload._jit.cextern import extern, process_symbol

MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)  # Linux >= 5.14
"""``madvise`` advice that allocates (and zeroes) a range's pages in one call."""

MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000 if sys.platform.startswith("linux") else 0)
"""``mmap`` flag: reserve address space only. Python < 3.13 lacks ``mmap.MAP_NORESERVE``; without
it a mapping larger than RAM + swap fails with ENOMEM under Linux's default overcommit heuristic."""

CAN_POPULATE = sys.platform.startswith("linux")
"""Whether to try :data:`MADV_POPULATE_WRITE` at all (Linux only)."""


VECTORED = sys.platform.startswith("linux") and process_symbol("process_madvise")
"""Whether the C library has ``process_madvise`` (glibc >= 2.36) for :func:`advise_vectored`;
whether the kernel takes it on the calling process with a given advice shows at the first call."""
_process_madvise = extern("process_madvise", "p", "ippii")

PIDFD_SELF = -10001
"""Linux's ``PIDFD_SELF_THREAD_GROUP``: the calling process, named without a descriptor (none that
a forked child would inherit, still naming its parent). Older kernels refuse it (``EBADF``)."""

IOV_MAX = 1024
"""The most runs one ``process_madvise`` call takes (Linux's ``UIO_MAXIOV``)."""

MAX_ADVISE = (2**31 - 1) & ~(mmap.PAGESIZE - 1)
"""The most bytes one ``process_madvise`` call advises (Linux's ``MAX_RW_COUNT``: a call's iovecs
are cut there); longer runs go in pieces of at most this, a multiple of the page."""


@njit(nogil=True, cache=True)
def advise_vectored(address, starts, lengths, advice):
    """Give ``advice`` to each run of bytes ``[address + starts[r], address + starts[r] +
    lengths[r])`` (``starts``, ``lengths``: ``(R,) int64``, the starts page-aligned) with
    ``process_madvise`` on this process (:data:`PIDFD_SELF`), up to :data:`IOV_MAX` pieces and
    :data:`MAX_ADVISE` bytes per call, without the GIL.

    Returns:
        ``(first, refused)``: ``first`` the first run not advised in full, or -1 when all were;
        ``refused`` when the very first call failed before advising anything (a kernel without
        ``PIDFD_SELF``, or one that takes this advice only from ``madvise``; also an allocation
        failing at once). The caller gives the runs from ``first`` on one ``madvise`` each.
    """
    iov = np.empty(2 * IOV_MAX, np.uint64)
    n = starts.shape[0]
    r = 0  # the run being packed
    into = 0  # bytes of run r already packed into an earlier call
    first_call = True
    while r < n:
        k = 0
        want = 0
        begin, begin_into = r, into
        while r < n and k < IOV_MAX and want < MAX_ADVISE:
            piece = min(lengths[r] - into, MAX_ADVISE - want)
            iov[2 * k] = address + starts[r] + into
            iov[2 * k + 1] = piece
            k += 1
            want += piece
            into += piece
            if into == lengths[r]:
                r += 1
                into = 0
        done = _process_madvise(PIDFD_SELF, iov.ctypes.data, k, advice, 0)
        if done != want:
            if done < 0:
                return begin, first_call
            # the first run the call did not finish: walk its pieces
            rr, at = begin, begin_into
            while done > 0:
                step = min(lengths[rr] - at, done)
                done -= step
                at += step
                if at == lengths[rr]:
                    rr += 1
                    at = 0
            return rr, False
        first_call = False
    return -1, False


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
