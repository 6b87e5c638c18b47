"""A structural check of an LMDB ``data.mdb`` before LMDB itself reads it.

LMDB trusts its pages: a corrupt node offset, key size or page number in a branch or leaf page
makes ``mdb_get`` read past the page, and past the end of the file when the page is one of its
last, which kills the process with SIGBUS (found by ``tests/adversarial/test_fuzz.py``).
:func:`check_tree` walks the main database's B-tree from the newest meta page, page by page,
and refuses any page whose structure would make LMDB read outside the file, before ffload asks
LMDB for anything. It reads the meta pages and every branch and leaf page (about one page per
hundred sample keys of an ffload database: its values live in overflow pages, which are not
read, only their extents checked).

On-disk format followed: LMDB 0.9's ``mdb.c`` (the format py-lmdb bundles), 64-bit,
little-endian, ``PAGEBASE`` 0:

* page header (16 bytes): ``mp_pgno`` u64, ``mp_pad`` u16, ``mp_flags`` u16, ``mp_lower`` u16,
  ``mp_upper`` u16; ``mp_ptrs`` (u16 node offsets from the page start) follow it, ``(mp_lower -
  16) / 2`` of them;
* meta pages 0 and 1 (the newer ``mm_txnid`` wins): ``mm_magic`` u32 ``0xBEEFC0DE`` at 16,
  ``mm_dbs[0..1]`` (``MDB_db``, 48 bytes each: ``md_pad`` u32 (the free DB's holds the page
  size), ``md_flags`` u16, ``md_depth`` u16, four u64 counts, ``md_root`` u64) at 40, so the
  main DB's root at 128; ``mm_last_pg`` u64 at 136, ``mm_txnid`` u64 at 144;
* node (8-byte header): ``mn_lo`` u16, ``mn_hi`` u16, ``mn_flags`` u16, ``mn_ksize`` u16, then the
  key and the data; a branch node's child page is ``lo | hi << 16 | flags << 32``; a leaf's data
  size is ``lo | hi << 16``, and with ``F_BIGDATA`` its data is the u64 number of the first of
  the overflow pages holding the value (16-byte header, then the bytes).
"""

from __future__ import annotations

import mmap
import os

import numpy as np

from ffload.formats.view import dataset_error

_HEADER = 16
_MAGIC = 0xBEEFC0DE
_P_BRANCH, _P_LEAF = 0x01, 0x02
_F_BIGDATA = 0x01
_INVALID_ROOT = 2**64 - 1  # P_INVALID: an empty database


def _u(page: np.ndarray, offset: int, dtype: str) -> int:
    return int(page[offset : offset + np.dtype(dtype).itemsize].view(dtype)[0])


def check_tree(path: str, data_path: str) -> None:
    """Refuse a ``data.mdb`` whose main B-tree would make LMDB read outside the file.

    Raises:
        DatasetError: names the page and what is wrong with it (corrupt or truncated database).
    """
    with open(data_path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < 2 * 4096:
            raise dataset_error(
                path, f"corrupt LMDB database: data.mdb holds {size} bytes, less than its two meta pages"
            )
        mapped = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
    mapped.madvise(mmap.MADV_RANDOM)  # the tree's pages only: no read-around into the values
    try:
        _check_pages(path, np.frombuffer(mapped, dtype=np.uint8))
    except BaseException as e:
        e.__traceback__ = None  # its frames hold views of the mapping: let close() succeed
        raise
    finally:
        mapped.close()


def _check_pages(path: str, data: np.ndarray) -> None:
    """:func:`check_tree` on the file's bytes ``data`` (``(size,) uint8``, at least two pages)."""
    size = data.size

    def corrupt(cause: str):
        return dataset_error(path, f"corrupt LMDB database: {cause}")

    psize = _u(data, _HEADER + 24, "<u4")  # meta page 0's free DB md_pad: the page size
    if _u(data, _HEADER, "<u4") != _MAGIC or not 4096 <= psize <= 65536 or psize & (psize - 1):
        raise corrupt(f"meta page 0: magic or page size ({psize}) wrong")
    metas = []
    for k in (0, 1):
        page = data[k * psize : (k + 1) * psize]
        if page.size == psize and _u(page, _HEADER, "<u4") == _MAGIC:
            metas.append(
                (_u(page, _HEADER + 120, "<u8"), _u(page, _HEADER + 128, "<u8"), _u(page, _HEADER + 112, "<u8"))
            )
    last, _, root = max(metas, key=lambda m: m[1])  # the newest transaction's meta, as LMDB picks
    if (last + 1) * psize > size:
        raise corrupt(
            f"data.mdb is truncated: its meta page accounts for {last + 1} pages of {psize} bytes, "
            f"the file holds {size}"
        )
    if root == _INVALID_ROOT:
        return
    seen: set[int] = set()
    pending = [root]
    while pending:
        pgno = pending.pop()
        if not 2 <= pgno <= last or pgno in seen:
            raise corrupt(f"page number {pgno} out of range or reached twice (pages 2..{last})")
        seen.add(pgno)
        page = data[pgno * psize : (pgno + 1) * psize]
        flags, lower, upper = _u(page, 10, "<u2"), _u(page, 12, "<u2"), _u(page, 14, "<u2")
        kind = flags & (_P_BRANCH | _P_LEAF)
        if kind not in (_P_BRANCH, _P_LEAF) or not _HEADER <= lower <= upper <= psize or lower % 2:
            raise corrupt(f"page {pgno}: header flags {flags:#x}, lower {lower}, upper {upper}")
        ptrs = page[_HEADER:lower].view("<u2").astype(np.int64)
        if ptrs.size and (ptrs.min() < upper or ptrs.max() > psize - 8):
            raise corrupt(f"page {pgno}: a node offset outside [{upper}, {psize - 8}]")
        nodes = page[ptrs[:, None] + np.arange(8)].view("<u2").astype(np.int64)  # (K, 4) headers
        lo, hi, nflags, ksize = nodes.T
        if kind == _P_BRANCH:
            if np.any(ptrs + 8 + ksize > psize):
                raise corrupt(f"page {pgno}: a branch node's key runs past the page")
            pending.extend((lo | hi << 16 | nflags << 32).tolist())
            continue
        dsize = lo | hi << 16
        if np.any(nflags & ~_F_BIGDATA):
            raise corrupt(f"page {pgno}: leaf node flags {int(nflags.max()):#x} (ffload writes plain values)")
        inline = nflags == 0
        if np.any(inline & (ptrs + 8 + ksize + dsize > psize)):
            raise corrupt(f"page {pgno}: a value runs past the page")
        big = ~inline
        if np.any(big & (ptrs + 8 + ksize + 8 > psize)):
            raise corrupt(f"page {pgno}: a node runs past the page")
        at = (ptrs + 8 + ksize)[big]
        first = page[at[:, None] + np.arange(8)].view("<u8").ravel().astype(np.uint64) if at.size else at
        pages = -(-(_HEADER + dsize[big]) // psize)
        bad = np.flatnonzero((first < 2) | (first > last) | (first + pages.astype(np.uint64) - 1 > last))
        if bad.size:
            k = int(bad[0])
            raise corrupt(
                f"page {pgno}: a value of {int(dsize[big][k])} bytes at overflow page {int(first[k])} "
                f"runs past the last page ({last})"
            )
