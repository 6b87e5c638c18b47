"""The harness: each measurement in a fresh Python subprocess (:func:`measure`), so that
imports, JIT compilation, threads and memory of one measurement do not leak into the next, and
rounds that interleave the loaders (:func:`run_rounds`) so that machine noise hits all alike."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence

from .config import BenchConfig
from .worker import BOOTSTRAP, RESULT_TAG

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
_REPO_ROOT = os.path.dirname(os.path.dirname(_PACKAGE_DIR))


def measure(cfg: BenchConfig, timeout: float | None = None) -> dict:
    """Run ``cfg``'s measurement in a fresh Python subprocess and return its result.

    The subprocess loads :mod:`ffload.bench.worker` by path without importing the ``ffload``
    package first, so that the library import is part of the measurement (``import_s``,
    ``first_batch_s``); the ``ffload`` it then imports is this one (its folder leads
    ``PYTHONPATH``).

    Args:
        cfg: the measurement.
        timeout: seconds before the subprocess is killed, or ``None``.

    Returns:
        :meth:`Measurement.to_dict` (``round`` is left to the caller); on failure (non-zero
        exit, timeout, no result line) ``{'name', 'kind', 'config', 'error': message}`` where
        the message is the last line of the subprocess' stderr (the exception) and
        ``stderr_tail`` its last 20 lines. Never raises for a failing measurement.
    """
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_REPO_ROOT, env.get("PYTHONPATH")) if p)
    argv = [sys.executable, "-c", BOOTSTRAP, _PACKAGE_DIR, json.dumps(cfg.to_dict()), repr(time.time())]
    failed = {"name": cfg.name, "kind": cfg.kind, "config": cfg.to_dict()}
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired as e:
        return {**failed, "error": f"timed out after {timeout} s", "stderr_tail": _tail(e.stderr)}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(RESULT_TAG) and proc.returncode == 0:
            return json.loads(line[len(RESULT_TAG) :])
    tail = _tail(proc.stderr)
    last = tail[-1] if tail else "no output"
    return {**failed, "error": f"exit status {proc.returncode}: {last}", "stderr_tail": tail}


def _tail(text, lines: int = 20) -> list[str]:
    """The last ``lines`` non-empty lines of a subprocess' output (the exception comes last)."""
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return [line for line in (text or "").splitlines() if line.strip()][-lines:]


def run_rounds(
    configs: Sequence[BenchConfig],
    repeats: int = 1,
    timeout: float | None = None,
    on_result: Callable[[dict], None] | None = None,
) -> list[dict]:
    """Measure every config ``repeats`` times, interleaved: round r runs ``configs`` in order
    (ffload, ffcv, dataloader, ...) before round r + 1 starts.

    Returns the results of :func:`measure` in run order, each with ``round`` set;
    ``on_result(result)`` is called after each one (progress). Raises ConfigurationError if
    ``repeats < 1``."""
    if repeats < 1:
        from ffload.errors import ConfigurationError  # here only: the bench worker runs without ffload

        raise ConfigurationError(f"repeats must be >= 1, got {repeats}")
    results = []
    for r in range(repeats):
        for cfg in configs:
            result = measure(cfg, timeout)
            result["round"] = r
            results.append(result)
            if on_result is not None:
                on_result(result)
    return results
