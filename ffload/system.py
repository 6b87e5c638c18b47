"""Facts about the machine and the file system that several modules need."""

from __future__ import annotations

import math
import os


def available_cpus(root: str = "/") -> int:
    """The CPUs this process may keep busy: its affinity mask (``os.sched_getaffinity``; elsewhere
    ``os.cpu_count()``) capped by the cgroup CPU quota rounded up (:func:`cgroup_cpu_quota`), at
    least 1. In a container limited to 2.5 CPUs of a 64-core host this is 3, not 64.

    Args:
        root: the directory that holds ``proc/`` and ``sys/`` (``"/"``; tests pass a fake tree).
    """
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    quota = cgroup_cpu_quota(root)
    if quota is not None:
        cpus = min(cpus, math.ceil(quota))
    return max(1, cpus)


def cgroup_cpu_quota(root: str = "/") -> float | None:
    """CPUs' worth of run time per period the cgroup CPU quota allows this process (``quota /
    period``, e.g. 1.5), or ``None`` when no quota applies (or none can be read).

    Reads, for this process's cgroup (``proc/self/cgroup``) and each of its ancestors, the cgroup
    v2 ``cpu.max`` (``"max 100000"``: none; ``"150000 100000"``: 1.5 CPUs) under
    ``sys/fs/cgroup/`` and the cgroup v1 ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` (quota
    ``-1``: none) under ``sys/fs/cgroup/cpu/`` (or ``cpu,cpuacct/``); the tightest quota found
    applies (a parent's limit binds its children). Missing or malformed files count as no quota.

    Args:
        root: the directory that holds ``proc/`` and ``sys/`` (``"/"``; tests pass a fake tree).
    """
    v2, v1 = "/", "/"
    try:
        with open(os.path.join(root, "proc/self/cgroup")) as f:
            for line in f:
                _, controllers, path = line.rstrip("\n").split(":", 2)
                if controllers == "":
                    v2 = path
                elif "cpu" in controllers.split(","):
                    v1 = path
    except (OSError, ValueError):
        pass
    quotas = _v2_quotas(root, v2)
    for mount in ("cpu", "cpu,cpuacct"):
        quotas += _v1_quotas(os.path.join(root, "sys/fs/cgroup", mount), v1)
    return min(quotas) if quotas else None


def _ancestors(base: str, path: str):
    """``base/path``, then each parent directory of it up to ``base``."""
    parts = [p for p in path.split("/") if p]
    for n in range(len(parts), -1, -1):
        yield os.path.join(base, *parts[:n])


def _read_numbers(path: str) -> list[str] | None:
    try:
        with open(path) as f:
            return f.read().split()
    except OSError:
        return None


def _v2_quotas(root: str, path: str) -> list[float]:
    quotas = []
    for folder in _ancestors(os.path.join(root, "sys/fs/cgroup"), path):
        words = _read_numbers(os.path.join(folder, "cpu.max"))
        if words and len(words) == 2 and words[0] != "max":
            try:
                quota, period = int(words[0]), int(words[1])
            except ValueError:
                continue
            if quota > 0 and period > 0:
                quotas.append(quota / period)
    return quotas


def _v1_quotas(mount: str, path: str) -> list[float]:
    quotas = []
    for folder in _ancestors(mount, path):
        quota = _read_numbers(os.path.join(folder, "cpu.cfs_quota_us"))
        period = _read_numbers(os.path.join(folder, "cpu.cfs_period_us"))
        try:
            q, p = int(quota[0]), int(period[0])
        except (TypeError, IndexError, ValueError):
            continue
        if q > 0 and p > 0:
            quotas.append(q / p)
    return quotas


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
