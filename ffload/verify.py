"""Check that every sample of a dataset decodes: what `ffload verify` runs before a long training."""
from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from typing import List, Tuple

from .formats import DatasetView
from .formats.fields import JSONField, RGBImageField
from .inspect import decode_image


def _check_range(view: DatasetView, start: int, stop: int, region) -> List[Tuple[int, str, str]]:
    problems = []
    for name, f in view.fields.items():
        for i in range(start, stop):
            try:
                if isinstance(f, RGBImageField):
                    decode_image(view, name, i, region)
                elif isinstance(f, JSONField):
                    raw = bytes(view.payload(name, i, region))
                    if not raw.endswith(b"\0"):
                        raise ValueError("JSON payload lacks its NUL terminator")
                    json.loads(raw[:-1].decode("utf8"))
            except ValueError as e:
                problems.append((i, name, str(e)))
    return problems


def verify_dataset(view: DatasetView, num_workers: int = 0, progress: bool = False) -> List[Tuple[int, str, str]]:
    """Decode every image (JPEG payloads through OpenCV, raw ones by shape) and parse every JSON
    payload of ``view``; offsets and sizes were already validated when it was opened.

    Args:
        num_workers: threads (OpenCV releases the GIL); 0: all cores.
        progress: show a tqdm bar.

    Returns:
        ``(sample index, field name, cause)`` for every sample that does not decode (empty: all good).
    """
    n = view.num_samples
    workers = num_workers or os.cpu_count() or 1
    chunk = max(1, min(1024, n // (4 * workers) or 1))
    bounds = [(s, min(n, s + chunk)) for s in range(0, n, chunk)]
    region = view.open_region()
    problems: List[Tuple[int, str, str]] = []
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=n, unit="sample", desc=f"verify {os.path.basename(view.path)}")
    with ThreadPoolExecutor(workers) as pool:
        for (start, stop), found in zip(bounds, pool.map(lambda b: _check_range(view, *b, region), bounds)):
            problems.extend(found)
            if bar is not None:
                bar.update(stop - start)
    if bar is not None:
        bar.close()
    return sorted(problems)
