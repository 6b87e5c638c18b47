"""Child process of the fuzz test: opens, loads and verifies each mutated dataset named on stdin.

For every path it prints ``START <i>`` before touching the file and ``DONE <i> <outcome>`` after,
flushing each line, so that the parent can tell which input killed or hung the process. The
outcome is ``ok`` or the name of the exception class raised. Address space is capped so that a
size field mutated into terabytes raises MemoryError instead of summoning the OOM killer.
"""

from __future__ import annotations

import resource
import sys

resource.setrlimit(resource.RLIMIT_AS, (12 << 30, 12 << 30))

import ffload  # noqa: E402
from ffload.formats import open_dataset  # noqa: E402
from ffload.loaders import CenterCropRGBImageDecoder, ToTensor  # noqa: E402
from ffload.verify import verify_dataset  # noqa: E402


def exercise(path: str) -> None:
    """Open ``path``, decode every sample (images centre-cropped to 16x16, other fields by their
    default pipeline), then verify it."""
    view = open_dataset(path)
    crops = {name: [CenterCropRGBImageDecoder((16, 16)), ToTensor()] for name in ("raw", "jpg")}
    with ffload.Loader(path, batch_size=4, num_workers=2, order="random", seed=1, pipelines=crops) as loader:
        for _ in loader:
            pass
    verify_dataset(view, num_workers=2)


def main() -> None:
    for line in sys.stdin:
        i, path = line.split(maxsplit=1)
        print(f"START {i}", flush=True)
        try:
            exercise(path.strip())
            outcome = "ok"
        except Exception as e:  # the parent judges which classes are acceptable
            outcome = type(e).__name__
        print(f"DONE {i} {outcome}", flush=True)


if __name__ == "__main__":
    main()
