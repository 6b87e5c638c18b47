"""Byte sources read by range: ``size`` (bytes) and ``read(start, stop) -> bytes``, the interface
that :func:`.beton.open_beton` and :class:`.origins.OriginBlock` read through, shared with
:class:`ffload.storage.RemoteObject` (a remote object)."""

from __future__ import annotations

import os

__all__ = ["LocalBytes", "MemoryBytes"]


class LocalBytes:
    """A local file read by byte ranges (``os.pread``), the local counterpart of
    :class:`ffload.storage.RemoteObject` for :func:`open_beton`.

    Attributes:
        size: bytes in the file (at construction).
    """

    def __init__(self, path: str):
        self.path = path
        self.size = os.path.getsize(path)

    def read(self, start: int, stop: int) -> bytes:
        """Bytes ``[start, stop)`` (fewer only at the end of the file)."""
        with open(self.path, "rb") as fp:
            return os.pread(fp.fileno(), stop - start, start) if stop > start else b""


class MemoryBytes:
    """Bytes in memory read by range, as :class:`LocalBytes` reads a file.

    Attributes:
        data: the bytes; size: their length.
    """

    def __init__(self, data: bytes):
        self.data, self.size = data, len(data)

    def read(self, start: int, stop: int) -> bytes:
        """Bytes ``[start, stop)`` (fewer only at the end)."""
        return self.data[start:stop]
