"""Rows and ratios of one invocation: medians over rounds (:func:`summarize`) and ratios of
those medians (:func:`compute_ratios`), so that every ratio divides figures of the same run."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from .config import KINDS

RATIO_PAIRS = [("ffload", kind) for kind in KINDS if kind != "ffload"]
"""``ffload bench``'s ratios: ffload over each peer and over the measured decode ceiling."""

SINGLE_THREAD_SUFFIX = " (1 thread)"
"""Suffix of the row that follows each ``decode_ceiling`` row with its one-thread rate."""


def _median(values) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def summarize(results: Sequence[dict]) -> list[dict]:
    """Aggregate measurements (:func:`ffload.bench.measure` dicts) by ``(name, num_workers)`` in
    first-seen order.

    Returns rows: ``name``, ``kind``, ``path``, ``pipeline``, ``batch_size``, ``num_workers``,
    ``epochs``, ``runs`` (successful), ``errors`` (messages), ``img_s`` (median over runs of the
    runs' ``img_s``), ``img_s_runs``, ``epoch0_s``, ``first_batch_s``, ``first_batch_total_s``,
    ``import_torch_s``, ``import_s``, ``build_s``, ``rss_growth_mb``, ``single_thread_img_s``,
    ``threads_img_s`` (medians), ``peak_rss_mb``, ``peak_rss_children_mb`` (maxima), ``samples``
    (per epoch, max over runs), ``first_batch`` (shape and dtype, from the first successful
    run). Each ``decode_ceiling`` row (``img_s``: ``num_workers`` threads decoding at once,
    measured) is followed by a ``'<name> (1 thread)'`` row of kind ``'decode_single_thread'``
    whose ``img_s`` is the measured one-thread rate. Statistics of a row without a successful
    run are ``None``.
    """
    groups: dict[tuple[str, int], list[dict]] = {}
    for res in results:
        groups.setdefault((res["name"], res["config"]["num_workers"]), []).append(res)
    rows = []
    for (name, workers), runs in groups.items():
        ok = [r for r in runs if "error" not in r]
        cfg = runs[0]["config"]
        row = {
            "name": name,
            "kind": runs[0]["kind"],
            "path": cfg["path"],
            "pipeline": cfg["pipeline"],
            "batch_size": cfg["batch_size"],
            "num_workers": workers,
            "epochs": cfg["epochs"],
            "runs": len(ok),
            "errors": [r["error"] for r in runs if "error" in r],
            "img_s_runs": [r["img_s"] for r in ok],
        }
        row["img_s"] = _median(row["img_s_runs"])
        for key in (
            "epoch0_s",
            "first_batch_s",
            "first_batch_total_s",
            "import_torch_s",
            "import_s",
            "build_s",
            "rss_growth_mb",
            "single_thread_img_s",
            "threads_img_s",
        ):
            row[key] = _median(r.get(key) for r in ok)
        for key in ("peak_rss_mb", "peak_rss_children_mb"):
            row[key] = max((r[key] for r in ok), default=None)
        row["samples"] = max((e["samples"] for r in ok for e in r["epochs"]), default=None)
        row["first_batch"] = ok[0].get("first_batch") if ok else None
        rows.append(row)
        if row["kind"] == "decode_ceiling":
            single = dict(
                row,
                name=name + SINGLE_THREAD_SUFFIX,
                kind="decode_single_thread",
                img_s_runs=[r["single_thread_img_s"] for r in ok],
            )
            single["img_s"] = _median(single["img_s_runs"])
            rows.append(single)
    return rows


def compute_ratios(rows: Sequence[dict], pairs: Sequence[tuple[str, str]]) -> list[dict]:
    """``img_s`` ratios of rows with equal ``num_workers``: for each ``(numerator, denominator)``
    pair of row names, ``{'numerator', 'denominator', 'num_workers', 'ratio', 'paired'}``:
    ``ratio`` the ratio of the two medians (``None`` when either is missing), ``paired`` the median
    of the rounds' own ratios (run ``i`` over run ``i``: :func:`~.harness.run_rounds` runs every
    config once per round, so a machine whose speed drifts between rounds moves both alike;
    ``None`` unless both rows succeeded in every round). Pairs without both rows are left out."""
    by_key = {(r["name"], r["num_workers"]): r for r in rows}
    out = []
    for num, den in pairs:
        for (name, workers), row in by_key.items():
            if name != num or (den, workers) not in by_key:
                continue
            other = by_key[(den, workers)]
            a, b = row["img_s"], other["img_s"]
            runs_a, runs_b = row["img_s_runs"], other["img_s_runs"]
            together = not row["errors"] and not other["errors"] and runs_a and len(runs_a) == len(runs_b)
            out.append(
                {
                    "numerator": num,
                    "denominator": den,
                    "num_workers": workers,
                    "ratio": a / b if a is not None and b else None,
                    "paired": _median([x / y for x, y in zip(runs_a, runs_b)]) if together and all(runs_b) else None,
                }
            )
    return out
