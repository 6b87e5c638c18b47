"""A conversion in a child process, slow enough to be interrupted midway (tests of Ctrl-C clean-up)."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def start_slow_conversion(dst, image: str, **convert_kwargs) -> subprocess.Popen:
    """Start ``convert_dataset`` of 400 samples (20 ms each; ``image``: a Python expression of
    sample ``i``'s ``(H, W, 3) uint8`` image) into ``dst`` with 2 workers and chunks of 4, in a
    child process; return it once sample 3 has been read (its stdout said ``started``).
    ``convert_kwargs`` are more literal arguments of ``convert_dataset``."""
    script = textwrap.dedent(f"""
        import signal, time, numpy as np
        signal.signal(signal.SIGINT, signal.default_int_handler)  # even when inherited ignored (`cmd &`)
        from ffload.convert import convert_dataset
        from ffload.convert.sources import IndexableSource
        class Slow:
            def __len__(self): return 400
            def __getitem__(self, i):
                if i == 3: print("started", flush=True)
                time.sleep(0.02)
                return {image}, 0
        convert_dataset(IndexableSource(Slow()), {str(dst)!r}, num_workers=2, progress=False, chunk_size=4,
                        **{convert_kwargs!r})
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout.readline().strip() == b"started"
    return proc
