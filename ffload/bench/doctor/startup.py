"""Time to the first batch, and where numba's compiled code goes.

ffload's kernels are compiled by numba with ``cache=True``. numba picks the cache directory per
function, first that works (``numba.core.caching._CacheImpl._locator_classes``):

1. ``$NUMBA_CACHE_DIR/<the source file's folder path>`` when ``NUMBA_CACHE_DIR`` is set;
2. ``__pycache__`` beside the source file, when numba can create a file there;
3. the user-wide cache, ``$XDG_CACHE_HOME/numba/...`` (``~/.cache/numba``), when writable;
4. none: every process compiles again.

A read-only package directory (a container image, a shared install) therefore falls to 3, or to 4
when the home is read-only too. Index and data files are written to a temporary name then
``os.replace``-d, so ranks that start at once with one cache directory do not corrupt it, but each
compiles what it finds missing: N ranks starting cold do N times the work at once.

This module measures, each in fresh subprocesses (:func:`first_batch`): the warm start (the cache
this environment uses), the cold start (an empty ``NUMBA_CACHE_DIR``), ``ranks`` processes starting
at once on one empty cache directory, and a read-only copy of the package (where its cache then
goes). As root, permissions do not apply; the read-only case is then simulated by making numba's
step 2 fail for the copy (what numba does when it cannot write there).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

_CHILD = r"""
import json, os, sys, time
t0 = time.perf_counter()
spec = json.loads(sys.argv[1])
if spec.get("read_only_root"):  # simulate an unwritable package folder (we run as root)
    import numba.core.caching as caching
    real = caching.InTreeCacheLocator.from_function.__func__
    def from_function(cls, py_func, py_file):
        if os.path.realpath(py_file).startswith(spec["read_only_root"]):
            return None
        return real(cls, py_func, py_file)
    caching.InTreeCacheLocator.from_function = classmethod(from_function)
import torch
import ffload
from ffload.bench.config import BenchConfig
from ffload.bench.doctor.run import make_loader
imported = time.perf_counter() - t0
loader = make_loader(BenchConfig(**spec["config"]), 1)
next(iter(loader))
loader.close()
sys.stdout.write(json.dumps({"import_s": imported, "first_batch_s": time.perf_counter() - t0,
                             "ffload": os.path.dirname(ffload.__file__)}) + "\n")
"""


def numba_cache_location() -> dict:
    """Where numba caches ffload's kernels in this environment, and where it would with a read-only
    package directory.

    Returns ``{'numba_cache_dir': $NUMBA_CACHE_DIR or None, 'locator': numba's locator class,
    'path': the cache folder of ffload.codecs.jpeg's kernels, 'package_writable': bool,
    'read_only_fallback': the user-wide folder (or None), 'fallback_writable': bool}``."""
    import numba.core.caching as caching

    from ffload.codecs import jpeg

    dispatcher = jpeg.decode_rows
    locator = caching.FunctionCache(dispatcher.py_func)._impl.locator
    source = dispatcher.py_func.__code__.co_filename
    user = caching.UserWideCacheLocator(dispatcher.py_func, source)
    return {
        "numba_cache_dir": os.environ.get("NUMBA_CACHE_DIR") or None,
        "locator": type(locator).__name__,
        "path": locator.get_cache_path(),
        "package_writable": _writable(os.path.join(os.path.dirname(source), "__pycache__")),
        "read_only_fallback": user.get_cache_path(),
        "fallback_writable": _writable(user.get_cache_path()),
    }


def _writable(folder: str) -> bool:
    """Whether a file can be created in ``folder`` (created if missing), as numba checks."""
    try:
        os.makedirs(folder, exist_ok=True)
        tempfile.TemporaryFile(dir=folder).close()
    except OSError:
        return False
    return True


def first_batch(config: dict, env: dict, count: int = 1, timeout: float = 600.0, read_only_root: str = "") -> list:
    """Start ``count`` fresh processes at once, each importing torch and ffload, building the loader of
    ``config`` (a :class:`~ffload.bench.config.BenchConfig` as a dict) with one worker and taking its
    first batch. ``env``: their environment.

    Returns one dict per process: ``{'wall_s' (spawn to exit), 'import_s', 'first_batch_s'
    (interpreter start to the first batch), 'ffload' (the package imported)}``, or ``{'error': the
    last line of stderr, 'wall_s'}``."""
    config = {**config, "path": os.path.abspath(config["path"])}
    arg = json.dumps({"config": config, "read_only_root": read_only_root})
    t0 = time.perf_counter()
    neutral = tempfile.gettempdir()  # not this folder: ``python -c`` would import an ffload found here first
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _CHILD, arg],
            env=env,
            cwd=neutral,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(count)
    ]
    results = []
    for proc in procs:
        try:
            out, err = proc.communicate(timeout=max(1.0, timeout - (time.perf_counter() - t0)))
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            err = (err or "") + f"\ntimed out after {timeout:.0f} s"
        wall = time.perf_counter() - t0
        lines = [line for line in out.splitlines() if line.startswith("{")]
        if proc.returncode == 0 and lines:
            results.append({"wall_s": wall, **json.loads(lines[-1])})
        else:
            tail = (err or out or "no output").strip().splitlines()[-1:] or ["no output"]
            results.append({"error": f"exit {proc.returncode}: {tail[0][:300]}", "wall_s": wall})
    return results


def _env(**changes) -> dict:
    """This process's environment with ``changes`` (None removes a variable), the folder of the
    ffload package imported here first on ``PYTHONPATH`` (so that the children import the same one)."""
    import ffload

    here = os.path.dirname(os.path.dirname(os.path.abspath(ffload.__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")])))
    for key, value in changes.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def _cache_files(folder: str) -> int:
    """numba index files (``*.nbi``) under ``folder``."""
    return sum(name.endswith(".nbi") for _, _, names in os.walk(folder) for name in names)


def measure_startup(config: dict, full: bool, ranks: int = 2, timeout: float = 600.0) -> dict:
    """The first-batch times (see the module docstring).

    Args:
        config: the loader's :class:`~ffload.bench.config.BenchConfig` as a dict.
        full: also the cold start, ``ranks`` concurrent cold starts and the read-only package;
            otherwise the warm start alone (the others are None).
        ranks: processes started at once (>= 2).
        timeout: seconds per group of processes.

    Returns:
        ``{'cache': numba_cache_location(), 'warm': run, 'cold': run or None, 'ranks': {'count',
        'runs', 'max_first_batch_s', 'cache_files'} or None, 'read_only': {'mode', 'runs' (cold then
        warm), 'cache_went_to', 'cache_files'} or None}`` with runs as :func:`first_batch` returns.
    """
    out = {"cache": numba_cache_location(), "warm": first_batch(config, _env(), timeout=timeout)[0]}
    out.update(cold=None, ranks=None, read_only=None)
    if not full:
        return out
    with tempfile.TemporaryDirectory(prefix="ffload-doctor-") as tmp:
        cold_dir = os.path.join(tmp, "cold")
        out["cold"] = first_batch(config, _env(NUMBA_CACHE_DIR=cold_dir), timeout=timeout)[0]
        ranks_dir = os.path.join(tmp, "ranks")
        runs = first_batch(config, _env(NUMBA_CACHE_DIR=ranks_dir), count=ranks, timeout=timeout)
        times = [r["first_batch_s"] for r in runs if "first_batch_s" in r]
        out["ranks"] = {
            "count": ranks,
            "runs": runs,
            "max_first_batch_s": max(times) if times else None,
            "cache_files": _cache_files(ranks_dir),
        }
        out["read_only"] = _read_only(config, tmp, timeout)
    return out


def _read_only(config: dict, tmp: str, timeout: float) -> dict:
    """A copy of the ffload package made read-only, started twice (cold, then warm) with no
    ``NUMBA_CACHE_DIR`` and a fresh ``XDG_CACHE_HOME``: where its compiled code went."""
    import ffload

    root = os.path.join(tmp, "site")
    package = os.path.join(root, "ffload")
    shutil.copytree(os.path.dirname(ffload.__file__), package, ignore=shutil.ignore_patterns("*.nbi", "*.nbc"))
    for folder, _, names in os.walk(package):
        for name in names:
            os.chmod(os.path.join(folder, name), 0o444)
        os.chmod(folder, 0o555)
    simulated = _writable(os.path.join(package, "__pycache__"))  # root: permissions do not apply
    user_cache = os.path.join(tmp, "xdg")
    env = _env(NUMBA_CACHE_DIR=None, XDG_CACHE_HOME=user_cache)
    env["PYTHONPATH"] = os.pathsep.join([root, env["PYTHONPATH"]])
    flag = os.path.realpath(package) if simulated else ""
    runs = [first_batch(config, env, timeout=timeout, read_only_root=flag)[0] for _ in range(2)]
    in_tree = sum(_cache_files(folder) for folder, _, _ in os.walk(package) if folder.endswith("__pycache__"))
    user = _cache_files(user_cache)
    for folder, _, _ in os.walk(package):
        os.chmod(folder, 0o755)  # so that the temporary folder can be removed
    went = "user-wide cache (XDG_CACHE_HOME/numba)" if user else ("package __pycache__" if in_tree else "nowhere")
    return {
        "mode": "simulated (running as root: permissions do not apply)" if simulated else "chmod a-w",
        "runs": runs,
        "cache_went_to": went,
        "cache_files": {"user_wide": user, "package": in_tree},
    }
