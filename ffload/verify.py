"""Check that every sample of a dataset decodes: what `ffload verify` runs before a long training.

Images are decoded by the Loader's own default pipeline (:class:`ffload.loaders.samples.SampleDecoder`:
batches of one image size, one-sample batches to name each bad sample), so verify exercises
exactly the decoder that training runs; JSON payloads are parsed, ImageArrayField headers checked
against their payload sizes and PNG-compressed ImageArrayFields decoded (their depth and channels
checked against the field's). A dataset on object storage is read through the Loader's page
pool (:mod:`ffload.loaders.pagedsamples`).
"""

from __future__ import annotations

import contextlib
import json
import os
from concurrent.futures import ThreadPoolExecutor

from ffload.errors import FormatError
from ffload.formats import DatasetView
from ffload.formats.fields.bytes import JSONField
from ffload.formats.fields.image import ImageArrayField, RGBImageField
from ffload.formats.shardio import check_mapping
from ffload.loaders.samples import SampleDecoder


def _parse_json(raw: bytes) -> None:
    if not raw.endswith(b"\0"):
        raise FormatError("JSON payload lacks its NUL terminator")
    json.loads(raw[:-1].decode("utf8"))


def _payload_failures(view: DatasetView, name: str, check, indices: range, region) -> list[tuple[int, Exception]]:
    """``(sample, error)`` for each sample whose payload bytes ``check`` refuses (ValueError)."""
    failed = []
    for i in indices:
        try:
            check(bytes(view.payload(name, i, region)))
        except ValueError as e:
            failed.append((i, e))
    return failed


def _check_range(view: DatasetView, start: int, stop: int, region) -> list[tuple[int, str, str]]:
    problems = []
    for name, f in view.fields.items():
        if isinstance(f, RGBImageField):
            failed = SampleDecoder(view, name, region).failures(range(start, stop))
        elif isinstance(f, JSONField):
            failed = _payload_failures(view, name, _parse_json, range(start, stop), region)
        elif isinstance(f, ImageArrayField):  # its header (sizes were checked at open), or its PNG decoded
            failed = _payload_failures(view, name, f.to_array, range(start, stop), region)
        else:
            continue
        for i, e in failed:
            cause = str(e).removeprefix(f"field '{name}', sample {i}: ")  # the CLI names both
            problems.append((i, name, cause if isinstance(e, ValueError) else f"{type(e).__name__}: {cause}"))
    check_mapping(region)  # the file shrank while it was read: its lost bytes read as zeros
    return problems


def verify_dataset(
    view: DatasetView,
    num_workers: int = 0,
    progress: bool = False,
    cache_dir: str | None = None,
    max_requests: int | None = None,
) -> list[tuple[int, str, str]]:
    """Decode every image of ``view`` with the Loader's default decoder (see
    :mod:`ffload.loaders.samples`) and parse every JSON payload; offsets and sizes were already
    validated when it was opened. Goes on after a bad sample: every bad one is reported.

    A remote ``.beton`` (``view.remote``: opened from an ``s3://`` / ``https://`` URL) is read
    as the Loader reads it: whole pages by range GETs into a page pool
    (:class:`ffload.loaders.pagedsamples.PagedSamples`), samples in file order in batches of a few
    pages, so that each page is fetched once.

    Args:
        num_workers: threads (the decoders release the GIL); 0: all cores.
        progress: show a tqdm bar.
        cache_dir: a remote dataset's page cache folder (``None``: the Loader's default).
        max_requests: a remote dataset's range GETs in flight at most (``None``: the Loader's
            default for a remote dataset).

    Returns:
        ``(sample index, field name, cause)`` for every sample that does not decode, sorted
        (empty: all good).

    Raises:
        StorageError: a remote page could not be read (the object and range named).
        FormatError: the data file shrank while it was read (named; not a bad sample).
    """
    n = view.num_samples
    workers = num_workers or os.cpu_count() or 1
    chunk = max(1, min(1024, n // (4 * workers) or 1))
    with contextlib.ExitStack() as stack:
        if view.remote is None:
            bounds = [(s, min(n, s + chunk)) for s in range(0, n, chunk)]
            region = view.open_region()

            def check(k: int) -> list[tuple[int, str, str]]:
                return _check_range(view, *bounds[k], region)
        else:
            from ffload.loaders.pagedsamples import PagedSamples, page_batches  # imports the loaders

            batches = page_batches(view, chunk)
            bounds = [(int(b[0]), int(b[-1]) + 1) for b in batches]  # consecutive samples
            paged = stack.enter_context(PagedSamples(view, batches, workers, cache_dir, max_requests))

            def check(k: int) -> list[tuple[int, str, str]]:
                with paged.holding(k):
                    return _check_range(paged.view, *bounds[k], paged.region)

        problems: list[tuple[int, str, str]] = []
        bar = None
        if progress:
            from tqdm import tqdm

            bar = stack.enter_context(tqdm(total=n, unit="sample", desc=f"verify {os.path.basename(view.path)}"))
        with ThreadPoolExecutor(workers) as pool:
            for (start, stop), found in zip(bounds, pool.map(check, range(len(bounds)))):
                problems.extend(found)
                if bar is not None:
                    bar.update(stop - start)
    return sorted(problems)
