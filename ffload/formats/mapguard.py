"""A SIGBUS guard for ffload's read-only file mappings: a file truncated under a reader is an
error, not a dead process.

The problem. A process that reads a memory-mapped file another process truncates gets SIGBUS
on its next touch of a page past the new end of file, and SIGBUS kills it. The loader's
decoders read ``.beton``, ``data.mdb`` and shard mappings from numba code in worker threads
(``os_cache=True``); ``verify``, ``inspect`` and ``export`` read them on the main thread. A size
check before each batch (:meth:`~.shardio.LocalFile.check_size`) cannot close the window: the
file may shrink a microsecond after the check, in the middle of the batch's reads.

The options weighed:

* Populating or locking the mapping (``MAP_POPULATE``, ``mlock``) does not help: truncation
  drops the file's pages from every mapping whatever their state, and a later touch faults.
  Advisory locks (``flock``) bind only processes that take them; ``truncate(1)``, ``cp`` over
  the file, or a ``dd`` do not. A read lease (``F_SETLEASE``) holds a truncating process back
  only until the lease-break timeout (45 s by default), is refused for a file that any process,
  ours included, holds open for writing, and needs the file's owner or ``CAP_LEASE``.
* Reading with ``pread`` instead of through the mapping never faults (a short read is an
  ordinary error), and is what ``os_cache=False`` does; but ``os_cache=True`` *is* the mapping:
  the decoders gather payloads straight from the page cache, with no copy.
* A SIGBUS handler (this module) closes the window: on a fault inside a registered mapping it
  maps anonymous zero pages (``mmap(MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS)``, a system call,
  safe in a signal handler on Linux) over the rest of that mapping from the faulting page on,
  records the fault address, and returns; the faulting instruction runs again and reads zeros.
  The readers then ask :meth:`Guard.faulted` before handing anything on (the loader after each
  batch's reads, before the batch reaches the user; ``verify``/``inspect`` after each decode;
  ``export`` before it commits a shard), so zero bytes never reach a user as data: the reader
  raises :class:`~ffload.errors.FormatError` naming the file and how it shrank, and the mapping
  stays poisoned (every later check fails) until it is unmapped. Chosen.

The handler. A ``numba.cfunc`` of C signature ``void (int, siginfo_t *, void *)`` installed with
``sigaction(SA_SIGINFO | SA_ONSTACK)`` through ctypes (no C compiler needed). It runs in the
faulting thread (a nogil worker or the main thread alike) and uses no Python object, no lock and
no allocation: it reads ``si_code`` (offset 8) and ``si_addr`` (offset 16 of ``siginfo_t`` on
64-bit Linux), scans the range table below and calls ``mmap``, ``sigaction`` and ``raise`` from
the C library (by symbol name, :mod:`ffload._jit.cextern`, so numba caches the compiled
handler on disk). Faults outside every registered range, and a SIGBUS sent by ``kill``/``raise``
(``si_code <= 0``), go to the handler that was installed before this one: the handler puts that
disposition back and returns (a fault re-runs its instruction and reaches the previous handler
in a proper signal context, e.g. :mod:`faulthandler`'s traceback dump, or the default action that
kills the process) or, for a sent signal, raises it again. This is what :mod:`faulthandler`
itself does when it is done. The guard re-installs itself in front whenever a mapping is
registered and it is no longer the installed handler (``faulthandler.enable()`` after a mapping
was made replaces it; until the next registration faulthandler sees the faults first and a
truncation kills the process as before). At exit the previous disposition is put back.

The range table: a fixed array in C memory (``ctypes``, never freed), published to the compiled
handler as the LLVM symbol :data:`TABLE_SYMBOL`. Header words: ``[0]`` entries in use (the scan
bound), ``[1]`` the address of the saved previous ``struct sigaction``, ``[2]`` the page size.
Each entry: ``start, end, armed, fault`` (``int64``; ``fault`` is 0 or the first fault address).
Registration takes a free entry under a Python lock and writes ``start``, ``end`` and ``fault``
before ``armed``; on x86-64 other cores see the stores in that order, and everywhere the range
reaches the threads that read it through the locks of the loader's thread pool (barriers), after
its registration. Unregistration disarms the entry before the range is unmapped, so an entry
never describes memory that another mapping may reuse. At most :data:`MAX_RANGES` mappings are
guarded at once; past that a mapping is made unguarded (the previous behaviour) with a warning.

Scope: Linux on x86-64 and aarch64 (the ``siginfo_t`` layout and ``MAP_FIXED`` value assumed).
Elsewhere :func:`register` returns ``None`` and a truncation under a reader still kills it with
SIGBUS, as before (the size check before each batch narrows the window to one batch's reads).

What is guarded: every :class:`~.shardio.FileMapping` (a ``.beton``'s or ``data.mdb``'s data
region, a sharded dataset's shards: ``DatasetView.open_region()``), which the loader, ``verify``,
``inspect`` and ``export`` read; and py-lmdb's own map of ``data.mdb`` while a database is
opened (:func:`~.lmdb.reader.open_lmdb` registers it once the first record's address tells where
it is; LMDB's first lookup, of the metadata record, comes before that and stays unguarded). After
the open nothing reads LMDB's map; if it was zeroed, it stays so while the process's shared
environment of that database lives (a still-short file is refused at the next open).
"""

from __future__ import annotations

import atexit
import ctypes
import logging
import mmap
import platform
import signal
import sys
import threading

import numpy as np
from llvmlite import binding as llvm_binding
from llvmlite import ir
from numba import carray, cfunc, types
from numba.extending import intrinsic

from ffload._jit.cextern import extern, process_symbol

logger = logging.getLogger(__name__)

TABLE_SYMBOL = "ffload_mapguard_ranges"
"""The LLVM symbol under which the compiled handler finds the range table."""

MAX_RANGES = 1024
"""Mappings guarded at once at most (each entry costs 32 bytes; the handler scans the entries in use)."""

SUPPORTED = (
    sys.platform.startswith("linux")
    and platform.machine() in ("x86_64", "aarch64")
    and all(process_symbol(s) for s in ("mmap", "sigaction", "raise"))
)
"""Whether the guard can be installed here (see the module docstring)."""

_HEADER = 4  # words before the first entry
_ENTRY = 4  # words per entry: start, end, armed, fault
_WORDS = _HEADER + _ENTRY * MAX_RANGES
_SA_SIGINFO, _SA_ONSTACK = 0x4, 0x08000000  # <asm-generic/signal-defs.h> (x86-64, arm64)
_MAP_FIXED = 0x10
_PROT_READ = mmap.PROT_READ
_ZEROS = mmap.MAP_PRIVATE | getattr(mmap, "MAP_ANONYMOUS", 0x20) | _MAP_FIXED


class _Sigaction(ctypes.Structure):
    """glibc's (and musl's) ``struct sigaction`` on 64-bit Linux: 152 bytes."""

    _fields_ = [
        ("handler", ctypes.c_void_p),
        ("mask", ctypes.c_ulong * 16),
        ("flags", ctypes.c_int),
        ("restorer", ctypes.c_void_p),
    ]


_table = (ctypes.c_int64 * _WORDS)()
_table[2] = mmap.PAGESIZE
llvm_binding.add_symbol(TABLE_SYMBOL, ctypes.addressof(_table))
_saved: list[_Sigaction] = []  # every previous disposition saved (kept alive: the handler may read an older one)
_lock = threading.Lock()
_state: dict = {}  # "compiled": the handler (numba CFunc), "handler": its address, "libc": ctypes' C library,
#                    "error": why it could not be compiled


@intrinsic
def _table_address(typingctx):
    """The range table's address (``void *``), through the external symbol :data:`TABLE_SYMBOL`."""

    def codegen(context, builder, sig, args):
        var = builder.module.globals.get(TABLE_SYMBOL)
        if var is None:
            var = ir.GlobalVariable(builder.module, ir.IntType(8), TABLE_SYMBOL)
            var.linkage = "external"
        return builder.bitcast(var, ir.IntType(8).as_pointer())

    return types.voidptr(), codegen


_c_mmap = extern("mmap", "p", "ppiiip")
_c_sigaction = extern("sigaction", "i", "ipp")
_c_raise = extern("raise", "i", "i")


def _handle(signum, info, context):  # pragma: no cover (compiled by _install, runs as a signal handler)
    """The SIGBUS handler (see the module docstring): compiled as a C function by :func:`_install`."""
    t = carray(_table_address(), _WORDS, np.int64)
    code = carray(info, 4, np.int32)[2]  # si_code; > 0: raised by the kernel for a fault
    address = carray(info, 4, np.int64)[2]  # si_addr
    if code > 0:
        for i in range(t[0]):
            e = _HEADER + _ENTRY * i
            if t[e + 2] == 1 and t[e] <= address and address < t[e + 1]:
                if t[e + 3] == 0:
                    t[e + 3] = address  # before the zeros: a thread that reads them sees the mark after
                page = address & ~(t[2] - 1)
                if _c_mmap(page, t[e + 1] - page, _PROT_READ, _ZEROS, -1, 0) == page:
                    return  # the instruction runs again and reads zeros
                break  # no memory for the zeros: the previous handler (death, as without the guard)
    _c_sigaction(signum, t[1], 0)  # not ours: the previous disposition takes it
    if code <= 0:
        _c_raise(signum)  # delivered once this handler returns (SIGBUS is blocked in it)


def _install() -> bool:
    """Install the handler in front of the current SIGBUS disposition unless it is there already.
    Holds the lock. Returns whether the guard is installed."""
    if "error" in _state:
        return False
    if "handler" not in _state:
        try:
            compiled = cfunc(types.void(types.int32, types.voidptr, types.voidptr), cache=True)(_handle)
            libc = ctypes.CDLL(None, use_errno=True)
            libc.sigaction.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
            _state.update(compiled=compiled, handler=compiled.address, libc=libc)  # kept: the code lives as long
        except Exception as e:  # the compilation failed: unguarded, as before
            _state["error"] = f"{type(e).__name__}: {e}"
            logger.warning(
                "the SIGBUS guard of mapped files is off (%s): a file truncated while it is read kills the process",
                _state["error"],
            )
            return False
        atexit.register(_uninstall)
    libc, address = _state["libc"], _state["handler"]
    current = _Sigaction()
    libc.sigaction(signal.SIGBUS, None, ctypes.byref(current))
    if current.handler == address:
        return True
    ours = _Sigaction(handler=address, flags=_SA_SIGINFO | _SA_ONSTACK)  # empty mask; SIGBUS blocked while it runs
    previous = _Sigaction()
    if libc.sigaction(signal.SIGBUS, ctypes.byref(ours), ctypes.byref(previous)) != 0:
        logger.warning("the SIGBUS guard of mapped files is off (sigaction: %s)", ctypes.get_errno())
        return False
    _saved.append(previous)
    _table[1] = ctypes.addressof(previous)
    return True


def _uninstall() -> None:
    """Put the previous disposition back if the handler is still installed (at exit: numba's code
    may be freed while the interpreter shuts down)."""
    with _lock:
        libc, address = _state.get("libc"), _state.get("handler")
        if libc is None or not _saved:
            return
        current = _Sigaction()
        libc.sigaction(signal.SIGBUS, None, ctypes.byref(current))
        if current.handler == address:
            libc.sigaction(signal.SIGBUS, ctypes.byref(_saved[-1]), None)


class Guard:
    """One registered mapping ``[start, end)`` (see the module docstring); made by :func:`register`.

    Attributes:
        start, end: the range's addresses (``end`` page-aligned).
    """

    def __init__(self, entry: int, start: int, end: int):
        self.start, self.end = start, end
        self._words: int | None = _HEADER + _ENTRY * entry  # its entry's first word in the table
        self._table = _table  # held: __del__ of a mapping may run after module teardown

    def faulted(self) -> int | None:
        """The offset from ``start`` of the first read that found no file data under it (the file
        shrank; the rest of the mapping now reads zeros), or None when none did."""
        if self._words is None:
            return None
        address = self._table[self._words + 3]
        return None if address == 0 else address - self.start

    def close(self) -> None:
        """Unregister the range (call before unmapping it): one store disarms the entry, which
        :func:`register` may then reuse. Idempotent."""
        if self._words is not None:
            self._table[self._words + 2] = 0
            self._words = None


def register(start: int, length: int) -> Guard | None:
    """Guard the read-only file mapping at ``start`` (an address, page-aligned), ``length`` bytes:
    a read in it past the file's end then reads zeros and marks the guard (:meth:`Guard.faulted`)
    instead of killing the process. Installs the handler on first use.

    Returns:
        The :class:`Guard` (close it before unmapping), or None where the guard cannot work
        (not :data:`SUPPORTED`, the handler could not be compiled or installed, or
        :data:`MAX_RANGES` guards open; logged once): the mapping then behaves as an unguarded one.
    """
    if not SUPPORTED or length <= 0:
        return None
    end = start + -(-length // mmap.PAGESIZE) * mmap.PAGESIZE
    with _lock:
        if not _install():
            return None
        used = _table[0]
        entry = next((i for i in range(used) if _table[_HEADER + _ENTRY * i + 2] == 0), used)
        if entry >= MAX_RANGES:
            if not _state.get("full"):
                _state["full"] = True
                logger.warning(
                    "more than %d mapped files are open at once: the next ones are not guarded "
                    "against SIGBUS (a file truncated while it is read kills the process)",
                    MAX_RANGES,
                )
            return None
        base = _HEADER + _ENTRY * entry
        _table[base], _table[base + 1], _table[base + 3] = start, end, 0
        _table[base + 2] = 1  # armed last
        _table[0] = max(used, entry + 1)
    return Guard(entry, start, end)
