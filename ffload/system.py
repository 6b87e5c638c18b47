"""Facts about the machine and the file system that several modules need."""

from __future__ import annotations

import os


def available_cpus() -> int:
    """The CPUs this process may run on (its affinity mask on Linux, else ``os.cpu_count()``)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def path_bytes(path: str) -> int:
    """Bytes on disk of a file, or of the files directly inside a directory (an LMDB)."""
    if os.path.isdir(path):
        return sum(e.stat().st_size for e in os.scandir(path) if e.is_file())
    return os.path.getsize(path)


def available_memory() -> int:
    """Bytes of memory available to new allocations without swapping (``MemAvailable`` of
    ``/proc/meminfo``; elsewhere ``os.sysconf`` physical pages times page size)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
