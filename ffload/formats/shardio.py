"""Reading a dataset's data region by offset, whether one file holds it or several shards do.

A sharded dataset (:mod:`.shards`) is one virtual data region: shard ``k`` occupies bytes
``[bases[k], bases[k] + sizes[k])``, each base aligned to the dataset's page size (a power of two,
so also to the OS page), and the bytes between two shards belong to none (nothing points there).
The view's payload offsets are global offsets into that region, so the loaders index it exactly
as they index a single ``.beton``. Three ways in:

* :func:`map_shards` (``os_cache=True``): every shard memory-mapped into ONE contiguous range of
  addresses. The whole range is reserved with one anonymous private mapping (``MAP_NORESERVE``:
  address space only), then each shard file is mapped over its part with ``MAP_FIXED |
  MAP_SHARED``, ``PROT_READ`` (``mmap(2)``, through ctypes: Python's ``mmap`` cannot place a
  mapping). The result is a ``(data_size,) uint8`` array; the kernel's page cache serves and
  shares the bytes as for a single mapped file. The reservation is ``PROT_READ``, not
  ``PROT_NONE``: no payload lies in the gaps between shards, but a stray read there (a slice
  across two shards, a checksum of the whole region) then reads zeros (the kernel's shared zero
  page: no memory committed) instead of killing the process with SIGSEGV. The same
  :class:`FileMapping` maps a single data file (:func:`map_file`, at base 0), and guards every
  such range against a file truncated while it is read (:mod:`.mapguard`: SIGBUS becomes the
  error :func:`check_mapping` raises, naming the file; see :func:`shrank`).
* :class:`ShardFiles` (``os_cache=False``: the process cache and the page pool): ``preadv`` at a
  global offset, dispatched to (the shard's descriptor, the offset in the shard), never across a
  shard's end in one call: a read that reaches the end returns short, and the caller's loop (as
  for any short read) continues at the next offset. :class:`LocalFile` is the same interface over
  one file.
* :class:`ShardedRemote` (object storage): ``read(start, stop)`` by global offset, dispatched to
  one :class:`ffload.storage.RemoteObject` per shard.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import sys
import threading
from dataclasses import dataclass

import numpy as np

from ffload.errors import ConfigurationError, FormatError

_MAP_FIXED = 0x10  # <asm-generic/mman-common.h> (x86-64, arm64)
_MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000)
_MAP_FAILED = ctypes.c_void_p(-1).value


@dataclass
class ShardLayout:
    """Where each shard sits in the virtual data region.

    Attributes:
        paths: the shard files (local paths) or object URLs, in sample order.
        names: each shard's path as the manifest gives it (relative to the dataset directory).
        bases: ``(K,) int64`` byte offset of each shard in the region (aligned to ``align``).
        sizes: ``(K,) int64`` bytes of each shard file.
        sha256: each shard's checksum from the manifest (hex).
        align: bytes; the alignment of the bases (the dataset's page size).
        num_samples: ``(K,) int64`` samples in each shard (shard ``k`` holds the global indices
            from ``num_samples[:k].sum()`` on).
    """

    paths: list[str]
    names: list[str]
    bases: np.ndarray
    sizes: np.ndarray
    sha256: list[str]
    align: int
    num_samples: np.ndarray

    @property
    def data_size(self) -> int:
        """Bytes of the virtual region: the last shard's end."""
        return int(self.bases[-1] + self.sizes[-1]) if len(self.paths) else 0

    def locate(self, offset: int) -> int:
        """The shard whose part of the region ``[base, base + size)`` or following gap holds byte
        ``offset`` (-1 before the first)."""
        return int(np.searchsorted(self.bases, offset, side="right")) - 1

    def pieces(self, start: int, stop: int):
        """``(k, local_start, local_stop)`` for each part of ``[start, stop)`` inside shard
        ``k`` (in order; the gaps between shards are left out)."""
        k = max(0, self.locate(start))
        while k < len(self.paths) and self.bases[k] < stop:
            lo = max(start, int(self.bases[k])) - int(self.bases[k])
            hi = min(stop, int(self.bases[k] + self.sizes[k])) - int(self.bases[k])
            if hi > lo:
                yield k, lo, hi
            k += 1


def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.restype = ctypes.c_int
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    return libc


class FileMapping:
    """Files mapped read-only into one contiguous address range, file ``k`` at byte ``bases[k]``
    (the shards of a sharded dataset, or one data file at 0), guarded against SIGBUS
    (:mod:`.mapguard`): a file that shrinks while the range is read makes :meth:`check` raise
    instead of killing the process. :meth:`array` hands out the ``(data_size,) uint8`` view.

    Lifetime: an array handed out keeps the mapping alive (it is the array's base), and the range
    is unmapped (``munmap``) when the last of them and this object are gone, as ``np.memmap``
    does; :meth:`close` unmaps at once only when no array was handed out (the read-ahead's own
    mapping), so that no array can ever point at unmapped memory.

    Args:
        paths: the files; bases: ``(K,) int`` byte offset of each in the range (multiples of
            ``mmap.PAGESIZE``, ascending); sizes: ``(K,) int`` bytes of each to map.

    Raises:
        ConfigurationError: not Linux (``MAP_FIXED`` placement is used as Linux defines it).
        OSError: the range cannot be reserved, or a file cannot be opened or mapped (the file
            and ``strerror`` named).
    """

    def __init__(self, paths: list[str], bases, sizes):
        if not sys.platform.startswith("linux"):
            raise ConfigurationError(
                "os_cache=True over a sharded dataset maps its shards with Linux's mmap "
                "semantics; use os_cache=False here"
            )
        self.paths, self.bases, self.sizes = list(paths), [int(b) for b in bases], [int(n) for n in sizes]
        self.size = self.bases[-1] + self.sizes[-1] if self.paths else 0
        self._length = max(mmap.PAGESIZE, -(-self.size // mmap.PAGESIZE) * mmap.PAGESIZE)
        self._libc = _libc()
        self._exported = False
        self._guard = None
        addr = self._libc.mmap(
            None, self._length, mmap.PROT_READ, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_NORESERVE, -1, 0
        )
        if addr in (None, _MAP_FAILED):
            err = ctypes.get_errno()
            raise OSError(
                err,
                f"cannot reserve {self._length} bytes of address space for "
                f"{self.paths[0] if len(self.paths) == 1 else _folder(self.paths)} ({os.strerror(err)})",
            )
        self.address = addr
        try:
            for path, base, size in zip(self.paths, self.bases, self.sizes):
                if size:
                    self._map_one(path, base, size)
        except BaseException:
            self._unmap()
            raise
        from ffload.formats import mapguard  # numba: imported when a file is first mapped

        self._guard = mapguard.register(self.address, self._length)

    def _map_one(self, path: str, base: int, size: int) -> None:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        try:
            got = self._libc.mmap(self.address + base, size, mmap.PROT_READ, mmap.MAP_SHARED | _MAP_FIXED, fd, 0)
            if got in (None, _MAP_FAILED) or got != self.address + base:
                err = ctypes.get_errno()
                raise OSError(
                    err,
                    f"{path}: cannot map {'the shard' if base else 'it'} at offset {base} ({os.strerror(err)})",
                    path,
                )
        finally:
            os.close(fd)  # the mapping keeps the file

    @property
    def __array_interface__(self) -> dict:
        if self.address is None:
            raise ConfigurationError("the file mapping is closed")
        return {"shape": (self.size,), "typestr": "|u1", "data": (self.address, True), "version": 3}

    def array(self) -> np.ndarray:
        """The read-only ``(data_size,) uint8`` array of the region (its base keeps the mapping)."""
        self._exported = True
        return np.asarray(self)

    def check(self) -> None:
        """Raise FormatError when a read of the range found no file data under it since it was
        mapped: a file shrank while it was being read, and the rest of the mapping, from the
        faulting page on, now reads zeros (:mod:`.mapguard`); the message names the file that
        holds the faulting byte, its size as mapped and its size now. Unguarded mappings (not
        Linux x86-64/aarch64, see :mod:`.mapguard`) never raise here."""
        offset = None if self._guard is None else self._guard.faulted()
        if offset is not None:
            k = max(0, int(np.searchsorted(self.bases, offset, side="right")) - 1)
            raise shrank(self.paths[k], self.sizes[k], _size_now(self.paths[k]), offset - self.bases[k])

    def close(self) -> None:
        """Unmap now when no :meth:`array` was handed out; else leave it to the arrays' end."""
        if not self._exported:
            self._unmap()

    def _unmap(self) -> None:
        if getattr(self, "_guard", None) is not None:
            self._guard.close()  # before the range can be reused by another mapping
            self._guard = None
        if getattr(self, "address", None) is not None:
            self._libc.munmap(self.address, self._length)
            self.address = None

    def __del__(self):
        self._unmap()


def _folder(paths: list[str]) -> str:
    return os.path.dirname(paths[0]) if paths else "?"


def _size_now(path: str) -> int | None:
    try:
        return os.stat(path).st_size
    except OSError:
        return None


def shrank(path: str, was: int, now: int | None, at: int | None = None) -> FormatError:
    """The error for a data file that shrank under a reader: ``FormatError("<path>: the file shrank
    from <was> to <now> bytes while it was being read ...")``; ``now`` None: the file is gone;
    ``at``: the offset (in the file) of a read that found no data."""
    if now is None:
        what = f"the file was truncated and removed while it was being read (it held {was} bytes)"
    elif now < was:
        what = f"the file shrank from {was} to {now} bytes while it was being read"
    else:
        what = f"the file was truncated while it was being read (it held {was} bytes, now {now})"
    where = "" if at is None else f"; reading byte {at} found no data"
    return FormatError(
        f"{path}: {what}{where}", path=path, hint="the dataset changed under the reader: reopen it once it is complete"
    )


def map_shards(layout: ShardLayout) -> np.ndarray:
    """The ``(data_size,) uint8`` read-only array over every shard mapped contiguously (see
    :class:`FileMapping`, whose errors it raises)."""
    return FileMapping(layout.paths, layout.bases, layout.sizes).array()


def map_file(path: str, size: int) -> np.ndarray:
    """The first ``size`` bytes of ``path`` as a read-only ``(size,) uint8`` array: a guarded
    :class:`FileMapping` on Linux, an ``np.memmap`` (unguarded) elsewhere.

    Raises:
        OSError: the file cannot be opened or mapped (named).
    """
    if not sys.platform.startswith("linux"):
        return np.memmap(path, dtype=np.uint8, mode="r", shape=(size,))
    return FileMapping([path], [0], [size]).array()


def mapping_of(region) -> FileMapping | None:
    """The :class:`FileMapping` under ``region`` (an array from :func:`map_file` or
    :func:`map_shards`, or a view of one), or None for any other array."""
    base = region
    while isinstance(base, np.ndarray):
        base = base.base
    return base if isinstance(base, FileMapping) else None


def check_mapping(region) -> None:
    """Raise FormatError when ``region`` (an array from :func:`map_file` or :func:`map_shards`, or a
    view of one) was read past the end of a file that shrank (see :meth:`FileMapping.check`);
    nothing for any other array."""
    mapping = mapping_of(region)
    if mapping is not None:
        mapping.check()


def _clip(views: list[memoryview], n: int) -> list[memoryview]:
    """The first ``n`` bytes of the buffers ``views``."""
    out = []
    for v in views:
        if n <= 0:
            break
        out.append(v[:n] if len(v) > n else v)
        n -= len(v)
    return out


class LocalFile:
    """One local data file read by offset (the single-file side of :class:`ShardFiles`).

    Args:
        path: the file; data_size: the bytes the view expects it to hold.

    Raises:
        OSError: the file cannot be opened.
    """

    def __init__(self, path: str, data_size: int):
        self.path, self.data_size = path, int(data_size)
        self._fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))

    def preadv(self, buffers: list, offset: int) -> int:
        """``os.preadv`` of the file into ``buffers`` at ``offset``: bytes read (0 at its end)."""
        return os.preadv(self._fd, buffers, offset)

    def fileno(self) -> int:
        """The file's descriptor (open until :meth:`close`), for compiled reads."""
        return self._fd

    def check_size(self, shards=None) -> None:
        """Raise FormatError naming the file when it holds fewer than ``data_size`` bytes now (one
        ``fstat``, :func:`shrank`; ``shards`` unused: the interface of :meth:`ShardFiles.check_size`)."""
        size = os.fstat(self._fd).st_size
        if size < self.data_size:
            raise shrank(self.path, self.data_size, size)

    def close(self) -> None:
        """Close the descriptor. Idempotent."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __del__(self, _close=os.close):  # bound here: ``os`` may be None at interpreter teardown
        fd = getattr(self, "_fd", None)
        if fd is not None:
            _close(fd)


class ShardFiles:
    """The shards of a :class:`ShardLayout` read by global offset (see the module docstring).
    Each shard's file is opened on first use and stays open until :meth:`close`.

    Args:
        layout: the shards.

    Attributes:
        path: the dataset directory (for messages); data_size: the region's bytes.
    """

    def __init__(self, layout: ShardLayout):
        self.layout, self.data_size = layout, layout.data_size
        self.path = os.path.dirname(layout.paths[0]) if layout.paths else ""
        self._fds: dict[int, int] = {}
        self._sizes = layout.sizes.tolist()
        self._lock = threading.Lock()

    def _fd(self, k: int) -> int:
        fd = self._fds.get(k)
        if fd is None:
            with self._lock:
                fd = self._fds.get(k)
                if fd is None:
                    fd = self._fds[k] = os.open(self.layout.paths[k], os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        return fd

    def preadv(self, buffers: list, offset: int) -> int:
        """Read into ``buffers`` from global ``offset``, within one shard: the bytes read, fewer
        than asked when the shard ends first; in the gap after a shard, the gap's bytes are
        skipped (counted, the buffers left as they are); 0 at the region's end.

        Raises:
            OSError: a shard file ends before the size its manifest gives (named).
        """
        layout = self.layout
        k = layout.locate(offset)
        if k < 0 or offset >= self.data_size:
            return 0
        local = offset - int(layout.bases[k])
        size = int(layout.sizes[k])
        if local >= size:  # between two shards
            nxt = int(layout.bases[k + 1]) if k + 1 < len(layout.paths) else self.data_size
            return min(nxt - offset, sum(len(b) for b in buffers))
        n = os.preadv(self._fd(k), _clip(buffers, size - local), local)
        if n == 0:
            raise OSError(f"{layout.paths[k]}: shard ends at byte {local}, its manifest says {size} bytes (truncated?)")
        return n

    def shards_of(self, indices: np.ndarray) -> np.ndarray:
        """``(S,) int64`` sorted distinct shards holding the samples ``indices`` (``(B,) int64``
        global sample indices: shard ``k`` holds a contiguous range of them)."""
        ks = np.searchsorted(self._ends, indices, side="right")
        return np.flatnonzero(np.bincount(ks, minlength=len(self.layout.paths)))

    @property
    def _ends(self) -> np.ndarray:
        ends = getattr(self, "_sample_ends", None)
        if ends is None:
            ends = self._sample_ends = np.cumsum(self.layout.num_samples)
        return ends

    def check_size(self, shards=None) -> None:
        """Raise FormatError naming the shard when one of ``shards`` (shard numbers, e.g.
        :meth:`shards_of` a batch; None: every shard) holds fewer bytes than the manifest gives
        (one ``fstat`` per shard, :func:`shrank`)."""
        fds, wants = self._fds, self._sizes
        for k in range(len(wants)) if shards is None else shards.tolist():
            fd = fds.get(k)
            size, want = os.fstat(self._fd(k) if fd is None else fd).st_size, wants[k]
            if size < want:
                raise shrank(self.layout.paths[k], want, size)

    def close(self) -> None:
        """Close the shards' descriptors. Idempotent."""
        with self._lock:
            fds, self._fds = self._fds, {}
        for fd in fds.values():
            os.close(fd)

    def __del__(self, _close=os.close):
        for fd in getattr(self, "_fds", {}).values():
            _close(fd)


def open_data_files(view) -> LocalFile | ShardFiles | None:
    """What reads ``view``'s data region by offset: :class:`ShardFiles` for a sharded dataset,
    :class:`LocalFile` for one data file, None when the payloads live in memory or remotely.

    Raises:
        OSError: the data file cannot be opened.
    """
    if getattr(view, "shards", None) is not None:
        return ShardFiles(view.shards)
    if view.data_path is not None:
        return LocalFile(view.data_path, view.data_size)
    return None


class ShardedRemote:
    """The shards of a remote sharded dataset read by global offset: the interface of
    :class:`ffload.storage.RemoteObject` (``size``, ``read``, ``requests``, ``bytes_read``) over
    one RemoteObject per shard.

    Args:
        layout: the shards (``paths`` are URLs); remotes: their RemoteObjects, in order.
        opening: the object of the manifest (its GET counts in :attr:`requests`).
    """

    def __init__(self, layout: ShardLayout, remotes: list, opening=None):
        self.layout, self.remotes, self.size = layout, remotes, layout.data_size
        self.url = os.path.dirname(layout.paths[0]) if layout.paths else ""
        self._extra = [opening] if opening is not None else []

    @property
    def requests(self) -> int:
        """GETs issued so far by every shard's object (and the manifest's)."""
        return sum(r.requests for r in self.remotes + self._extra)

    @property
    def bytes_read(self) -> int:
        return sum(r.bytes_read for r in self.remotes + self._extra)

    def read(self, start: int, stop: int) -> bytes:
        """Bytes ``[start, stop)`` of the region: one range GET when they lie in one shard (the
        loader's pages do: bases are page-aligned), the bytes up to that shard's end only;
        otherwise the shards' parts with zeros for the gaps. Raises StorageError (named)."""
        parts = list(self.layout.pieces(start, stop))
        if len(parts) == 1:
            k, lo, hi = parts[0]
            if int(self.layout.bases[k]) + lo == start:
                return self.remotes[k].read(lo, hi)
        out = bytearray(stop - start)
        end = 0
        for k, lo, hi in parts:
            at = int(self.layout.bases[k]) + lo - start
            out[at : at + hi - lo] = self.remotes[k].read(lo, hi)
            end = at + hi - lo
        return bytes(out[:end])
