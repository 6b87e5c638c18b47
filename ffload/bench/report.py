"""Reports of :func:`ffload.bench.summarize` rows: markdown tables of the rows and of the
ratios, a PNG of images/s against ``num_workers``, and the results files every script writes."""

from __future__ import annotations

import json
import os
import textwrap
from collections.abc import Mapping, Sequence


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def format_rows(rows: Sequence[dict]) -> str:
    """A markdown table of :func:`summarize` rows (``-`` for missing values; failed rows show
    the first error)."""
    lines = [
        "| loader | workers | batch | img/s (epochs 1+, median) | epoch 0 s | first batch s "
        "| spawn to first batch s | peak RSS MiB | RSS growth MiB | runs |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        rss = r["peak_rss_mb"]
        if rss is not None and r["kind"].startswith("dataloader") and r["peak_rss_children_mb"]:
            rss_text = f"{rss:.0f} (+ workers {r['peak_rss_children_mb']:.0f})"
        else:
            rss_text = _fmt(rss, ".0f")
        failed = r["errors"][0][:300].replace("|", "\\|") if r["errors"] else ""
        runs = str(r["runs"]) + (f" ({len(r['errors'])} failed: {failed})" if failed else "")
        lines.append(
            f"| {r['name']} | {r['num_workers']} | {r['batch_size']} | {_fmt(r['img_s'], '.0f')} | "
            f"{_fmt(r['epoch0_s'], '.2f')} | {_fmt(r['first_batch_s'], '.2f')} | "
            f"{_fmt(r['first_batch_total_s'], '.2f')} | {rss_text} | "
            f"{_fmt(r['rss_growth_mb'], '+.1f')} | {runs} |"
        )
    return "\n".join(lines)


def format_ratios(ratios: Sequence[dict], targets: Mapping[tuple[str, str], tuple[str, float]] | None = None) -> str:
    """A markdown table of :func:`compute_ratios` entries: the ratio of the medians (``value``,
    which the target is checked against) and the median of the rounds' ratios. ``targets`` maps a
    ``(numerator, denominator)`` pair to ``('>=' | '<=', value)``; the table then says whether
    each ratio meets its target."""
    targets = targets or {}
    lines = ["| ratio | workers | value | rounds' median | target | met |", "|---|---|---|---|---|---|"]
    for q in ratios:
        target = targets.get((q["numerator"], q["denominator"]))
        met = "-"
        if target is not None and q["ratio"] is not None:
            op, value = target
            met = "yes" if (q["ratio"] >= value if op == ">=" else q["ratio"] <= value) else "NO"
        lines.append(
            f"| {q['numerator']} / {q['denominator']} | {q['num_workers']} | "
            f"{_fmt(q['ratio'], '.2f')}{'x' if q['ratio'] is not None else ''} | "
            f"{_fmt(q.get('paired'), '.2f')}{'x' if q.get('paired') is not None else ''} | "
            f"{f'{target[0]} {target[1]}x' if target else '-'} | {met} |"
        )
    return "\n".join(lines)


def plot_throughput(rows: Sequence[dict], path: str, title: str = "") -> str:
    """Write a PNG of images/s against ``num_workers``, one line per row name.

    Args:
        rows: :func:`summarize` rows (rows without ``img_s`` are skipped).
        path: the PNG to write (its folder must exist).
        title: the plot title.

    Returns ``path``. Raises ConfigurationError when no row has a value, OSError when the file cannot
    be written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series: dict[str, list[tuple[int, float]]] = {}
    for r in rows:
        if r["img_s"] is not None:
            series.setdefault(r["name"], []).append((r["num_workers"], r["img_s"]))
    if not series:
        from ffload.errors import ConfigurationError  # here only: the bench worker runs without ffload

        raise ConfigurationError(f"{path}: no successful measurement to plot (every row lacks img_s)")
    fig, ax = plt.subplots(figsize=(7, 4.5))
    try:
        for name, points in series.items():
            points.sort()
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=name)
        workers = sorted({p[0] for pts in series.values() for p in pts})
        ax.set_xticks(workers)
        ax.set_xlabel("num_workers")
        ax.set_ylabel("images / s (median, epochs 1+)")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        if title:
            ax.set_title(textwrap.fill(title, 90), fontsize=8)
        fig.tight_layout()
        fig.savefig(path, dpi=100)
    finally:
        plt.close(fig)
    return path


def write_results(out: str, text: str, data: Mapping) -> None:
    """Write a benchmark's report: ``out/results.md`` (``text``, the markdown printed) and
    ``out/results.json`` (``data``; values JSON cannot hold are written as ``str``), creating the
    folder ``out``. Raises OSError when it cannot be written."""
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write(text)
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(data, f, indent=2, default=str)
