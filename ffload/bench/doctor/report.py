"""The doctor's report as text, and its plot (matplotlib): the loader's rate per worker count
against each measured limit."""

from __future__ import annotations

from .verdict import LIMIT_NAMES


def _rate(x) -> str:
    return "-" if x is None else f"{x:,.0f}"


def _run_line(run: dict | None) -> str:
    if run is None:
        return "not measured (--startup)"
    if "error" in run:
        return f"FAILED: {run['error']}"
    return f"{run['first_batch_s']:.1f} s (import {run['import_s']:.1f} s)"


def format_report(report: dict) -> str:
    """The report (:func:`~.run.diagnose`'s dict) as lines of text."""
    d, v, s = report["dataset"], report["verdict"], report["startup"]
    lines = [
        f"{d['path']} ({d['format']}, {d['samples']} samples, {d['file_bytes'] / 2**20:.0f} MiB, "
        f"{d['jpeg_fraction']:.0%} JPEG, payload {d['payload_mean_bytes']:.0f} B): pipeline {d['pipeline']}, "
        f"batch {d['batch_size']}, {report['machine']['usable_cpus']} usable CPUs",
        "",
        f"{'limit':<16} {'img/s':>12} {'loader at':>10}  applies  note",
    ]
    for name in LIMIT_NAMES:
        rec = report["limits"][name]
        fraction = v["fractions"].get(name)
        at = "-" if fraction is None else f"{fraction:.0%}"
        lines.append(
            f"{name:<16} {_rate(rec['img_s']):>12} {at:>10}  {'yes' if rec['applies'] else 'no':<7}  {rec['note']}"
        )
    lines += ["", "loader (order random, os_cache, batches_ahead 3):"]
    for run in report["loader"]["runs"]:
        lines.append(
            f"  {run['num_workers']:>3} worker(s): {_rate(run['img_s'])} img/s "
            f"({run['batches']} batches; first batch {run['first_batch_s']:.1f} s)"
        )
    consumer = report["loader"]["with_consumer"]
    if consumer is not None:
        lines.append(
            f"  with the consumer's step, {consumer['num_workers']} worker(s): {_rate(consumer['img_s'])} img/s, "
            f"consumer waiting {consumer['wait_fraction']:.0%} of the time"
        )
    lines += ["", f"binding: {v['binding']} ({v['binding_reason']})", "recommended:"]
    for key, value in v["recommended"].items():
        lines.append(f"  {key}={value}  ({v['reasons'][key]})")
    cache = s["cache"]
    lines += [
        "",
        "time to the first batch (fresh process: import torch + ffload, build, first batch):",
        f"  warm (on-disk cache): {_run_line(s['warm'])}",
        f"  cold (empty NUMBA_CACHE_DIR): {_run_line(s['cold'])}",
    ]
    if s["ranks"] is not None:
        r = s["ranks"]
        slowest = "-" if r["max_first_batch_s"] is None else f"{r['max_first_batch_s']:.1f} s"
        failed = sum("error" in run for run in r["runs"])
        lines.append(
            f"  {r['count']} ranks at once, one empty cache: slowest {slowest}, {failed} failed, "
            f"{r['cache_files']} index files"
        )
    if s["read_only"] is not None:
        ro = s["read_only"]
        lines.append(
            f"  read-only package ({ro['mode']}): cold {_run_line(ro['runs'][0])}, then {_run_line(ro['runs'][1])}; "
            f"the cache went to the {ro['cache_went_to']}"
        )
    lines.append(
        f"  numba caches ffload's kernels in {cache['path']} ({cache['locator']}); with a read-only package: "
        f"{cache['read_only_fallback']} ({'writable' if cache['fallback_writable'] else 'NOT writable: no cache'})"
    )
    lines.append(f"({report['seconds']:.0f} s)")
    return "\n".join(lines)


def plot_report(report: dict, path: str) -> None:
    """Write a PNG to ``path``: the loader's images/s per worker count, each measured limit a line.

    Raises:
        OSError: the file cannot be written.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [r for r in report["loader"]["runs"] if r["img_s"]]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot([r["num_workers"] for r in runs], [r["img_s"] for r in runs], "o-", color="tab:blue", label="loader")
    styles = ["--", ":", "-.", (0, (5, 1)), (0, (1, 3))]
    for name, style in zip(LIMIT_NAMES, styles):
        rec = report["limits"][name]
        if rec["img_s"]:
            label = f"{name}{'' if rec['applies'] else ' (does not apply)'}"
            ax.axhline(rec["img_s"], linestyle=style, color="k" if rec["applies"] else "0.6", label=label)
    ax.set_yscale("log")
    ax.set_xlabel("num_workers")
    ax.set_ylabel("images/s")
    ax.set_title(f"{report['dataset']['pipeline']}: binding {report['verdict']['binding']}", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
