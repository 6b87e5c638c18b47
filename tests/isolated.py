"""Run a test module's function in a fresh Python process.

Why: ffcv 1.0.2 corrupts numba's type cache for the whole process. ``OSCacheManager.state_type``
(``ffcv/memory_managers/os_cache.py``) takes numba's interned ``uint8[::1]`` type and sets
``mutable = False`` on it (after a typo, ``multable``), so every dispatcher that had compiled an
overload for a writable 1-D uint8 array now holds a key whose hash changed: the next compilation
that lists those overloads fails with ``KeyError`` in ``Dispatcher.nopython_signatures``. Any test
that builds an ``ffcv.loader.Loader`` must therefore run it here, never in the pytest process
(ffload's own benchmarks measure every loader in a fresh subprocess for the same reason).
"""

from __future__ import annotations

import os
import subprocess
import sys

TESTS = os.path.dirname(os.path.abspath(__file__))


def run_isolated(module: str, function: str, *args: str, timeout: float = 600) -> None:
    """Call ``module.function(*args)`` (``args`` strings, e.g. a ``tmp_path``) in a fresh
    interpreter with ``tests/`` on ``sys.path``.

    Raises:
        AssertionError: the call raised (its traceback, the child's stderr, is the message).
    """
    code = f"import sys; sys.path.insert(0, {TESTS!r}); import {module}; {module}.{function}(*sys.argv[1:])"
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(filter(None, [os.path.dirname(TESTS), os.environ.get("PYTHONPATH")]))
    )
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=timeout, env=env)
    assert proc.returncode == 0, f"{module}.{function} failed in its own process:\n{proc.stderr[-6000:]}"
