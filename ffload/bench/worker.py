"""The measurement subprocess' entry: ``main([config JSON, spawn time])`` runs
:func:`ffload.bench.runners.run_worker` and writes its result as one tagged JSON line.

:func:`ffload.bench.harness.measure` loads this package by path under another name (see
``BOOTSTRAP``), without importing ``ffload`` first; this module and the ones it imports must
therefore use relative imports and import ``ffload`` only inside functions.
"""

from __future__ import annotations

import json
import sys

from .config import BenchConfig
from .runners import run_worker

RESULT_TAG = "FFLOAD_BENCH_RESULT "
"""Prefix of the stdout line that carries the result's JSON."""

BOOTSTRAP = """
import importlib, sys, types
package = types.ModuleType("_ffload_bench")
package.__path__ = [sys.argv[1]]
sys.modules[package.__name__] = package
importlib.import_module("_ffload_bench.worker").main(sys.argv[2:])
"""
"""``python -c BOOTSTRAP <folder of ffload/bench> <config JSON> <spawn time>``: registers the
folder as the package ``_ffload_bench`` (its ``__init__`` is not run) and calls :func:`main`."""


def main(argv: list[str]) -> None:
    """``argv = [BenchConfig JSON, time.time() at spawn]``: measure and write
    ``RESULT_TAG + JSON`` on its own stdout line. Raises what :func:`run_worker` raises."""
    result = run_worker(BenchConfig.from_dict(json.loads(argv[0])), float(argv[1]))
    sys.stdout.write("\n" + RESULT_TAG + json.dumps(result.to_dict()) + "\n")
