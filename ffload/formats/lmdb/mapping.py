"""Where an LMDB value lies in ``data.mdb``: LMDB maps the whole file, so a value's offset in it is
its address (a ``buffers=True`` value) less the start of LMDB's mapping, found in ``/proc/self/maps``.
The writer records these offsets (the places table) and the reader reads samples through them
(:mod:`ffload.formats.lmdb`, "Reading zero-copy")."""

from __future__ import annotations

import os

import numpy as np

__all__ = ["lmdb_map_base", "address"]


def lmdb_map_base(data_path: str, probe: int) -> int | None:
    """Start address of LMDB's own mapping of ``data_path`` in this process, from /proc: the
    mapping of the file from offset 0 that holds ``probe``, the address of a value LMDB returned.
    (The process may map the file more than once: a loader's ``open_region()`` of an earlier
    view, another environment; the first mapping listed is not necessarily LMDB's.)"""
    try:
        st = os.stat(data_path)
        with open("/proc/self/maps") as maps:
            real = os.path.realpath(data_path)
            for line in maps:
                parts = line.rstrip("\n").split(maxsplit=5)  # the path (field 6) may hold spaces
                if len(parts) == 6 and int(parts[4]) == st.st_ino and parts[5] == real:
                    start, end = (int(v, 16) for v in parts[0].split("-"))
                    if int(parts[2], 16) == 0 and start <= probe < end:
                        return start
    except (OSError, ValueError):
        return None
    return None


def address(buf) -> int:
    """Memory address of a buffer's first byte (a ``buffers=True`` LMDB value)."""
    return np.frombuffer(buf, dtype=np.uint8).ctypes.data
