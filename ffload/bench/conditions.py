"""The conditions of a measurement, recorded next to every benchmark result (as airbench states
its runtime, GPU and library versions): ffload's version and git commit, the versions of
Python and the libraries that do the work, the CPUs and the device."""

from __future__ import annotations

import os
import platform
import subprocess
from importlib import metadata

_LIBRARIES = ("numba", "numpy", "ffcv", "pillow", "lmdb")
"""Distributions whose versions are recorded from their metadata (ffcv is never imported beside ffload's numba
code). torch is recorded as ``torch.__version__``: its local label (``+cpu``, ``+cu130``) tells the build apart, and
the distribution metadata of the index's CUDA wheel carries none."""


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def _opencv_version() -> str | None:
    try:
        import cv2
    except ImportError:
        return None
    return cv2.__version__


def _git(root: str, *args: str) -> str | None:
    try:
        proc = subprocess.run(["git", "-C", root, *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _torch() -> tuple[str, str]:
    """``(torch.__version__, device)``: ``'cpu'`` or the first CUDA device's name and the device count."""
    import torch

    if torch.cuda.is_available():
        return torch.__version__, f"cuda: {torch.cuda.get_device_name(0)} ({torch.cuda.device_count()} device(s))"
    return torch.__version__, "cpu"


def measurement_conditions() -> dict:
    """What a benchmark result was measured with.

    Returns a JSON-serialisable dict: ``ffload`` (version), ``git_commit`` (of the checkout
    holding this ffload, ``None`` outside a git checkout), ``git_dirty`` (uncommitted changes,
    or ``None``), ``python``, ``torch`` (``torch.__version__``, with its build label such as ``+cpu``),
    ``numba``, ``numpy``, ``ffcv``, ``pillow``, ``lmdb`` (distribution versions, ``None`` when not installed),
    ``opencv`` (``cv2.__version__``),
    ``platform``, ``cpu_count`` (``os.cpu_count()``), ``cpus_available`` (the CPUs this process
    may run on), ``cpu_model``, ``load_avg`` (1, 5, 15 min) and ``device`` (``'cpu'`` or the CUDA
    device's name). Imports torch (for the device)."""
    from ffload import __version__
    from ffload.system import available_cpus

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    commit = _git(root, "rev-parse", "HEAD")
    status = _git(root, "status", "--porcelain", "--untracked-files=no") if commit else None
    torch_version, device = _torch()
    out = {
        "ffload": __version__,
        "git_commit": commit,
        "git_dirty": None if status is None else bool(status),
        "python": platform.python_version(),
        "torch": torch_version,
    }
    out.update({name: _version(name) for name in _LIBRARIES})
    out.update(
        {
            "opencv": _opencv_version(),
            "platform": platform.platform(),
            "cpu_count": os.cpu_count(),
            "cpus_available": available_cpus(),
            "cpu_model": _cpu_model(),
            "load_avg": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
            "device": device,
        }
    )
    return out


def format_conditions(conditions: dict) -> str:
    """One line of :func:`measurement_conditions`' dict for a text report."""
    commit = conditions["git_commit"]
    commit = "no git checkout" if commit is None else commit[:12] + (" (dirty)" if conditions["git_dirty"] else "")
    libraries = ", ".join(
        f"{name} {conditions[name]}"
        for name in ("python", "torch", "numba", "numpy", "opencv", "ffcv", "pillow")
        if conditions.get(name)
    )
    return (
        f"conditions: ffload {conditions['ffload']} ({commit}); {libraries}; {conditions['cpus_available']} of "
        f"{conditions['cpu_count']} CPUs ({conditions['cpu_model']}); device {conditions['device']}"
    )
