"""Reports of a training run: the per-epoch table, ``metrics.json`` and the accuracy-vs-time plot.

Units: seconds of wall-clock time, accuracies as fractions in ``[0, 1]`` (printed as percent),
throughput in images per second, cost in USD at a given price per device-hour.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "EpochStats",
    "cost_usd",
    "format_header",
    "format_row",
    "format_summary",
    "rows_to_dicts",
    "write_json",
    "plot_accuracy",
]


@dataclass
class EpochStats:
    """What one epoch measured.

    Attributes:
        epoch: 0-based epoch number.
        train_loss: mean training loss (label-smoothed cross-entropy) over the epoch's batches.
        train_accuracy: fraction of training samples (augmented, as trained) predicted right.
        test_accuracy: fraction of test samples predicted right after this epoch (with the
            recipe's test-time flip averaging).
        epoch_seconds: wall seconds of the epoch's training loop (device synchronised at the
            end), evaluation excluded.
        eval_seconds: wall seconds of the evaluation after the epoch.
        images_per_second: training images / ``epoch_seconds``.
        data_wait_seconds: seconds the training loop waited on the loader (see
            :func:`ffload.recipes.training.train_model`).
        data_wait_fraction: ``data_wait_seconds / epoch_seconds``.
        train_seconds_total: cumulative ``epoch_seconds`` up to and including this epoch (the
            x axis of the plot).
    """

    epoch: int
    train_loss: float
    train_accuracy: float
    test_accuracy: float
    epoch_seconds: float
    eval_seconds: float
    images_per_second: float
    data_wait_seconds: float
    data_wait_fraction: float
    train_seconds_total: float


def cost_usd(seconds: float, price_per_hour: float) -> float:
    """Dollar cost of ``seconds`` of one device at ``price_per_hour`` USD per device-hour."""
    return seconds / 3600.0 * price_per_hour


_COLUMNS = (  # header, width, formatter
    ("epoch", 5, lambda r: f"{r.epoch + 1:d}"),
    ("train loss", 10, lambda r: f"{r.train_loss:.4f}"),
    ("train acc", 9, lambda r: f"{100 * r.train_accuracy:.2f}%"),
    ("test acc", 8, lambda r: f"{100 * r.test_accuracy:.2f}%"),
    ("epoch s", 8, lambda r: f"{r.epoch_seconds:.2f}"),
    ("img/s", 9, lambda r: f"{r.images_per_second:.0f}"),
    ("data wait", 9, lambda r: f"{100 * r.data_wait_fraction:.1f}%"),
)


def format_header() -> str:
    """The header line (and rule) of the per-epoch table, for printing before the first row."""
    head = "  ".join(name.rjust(width) for name, width, _ in _COLUMNS)
    return head + "\n" + "-" * len(head)


def format_row(row: EpochStats) -> str:
    """One line of the per-epoch table (columns of :func:`format_header`)."""
    return "  ".join(fmt(row).rjust(width) for _, width, fmt in _COLUMNS)


def format_summary(metrics: dict[str, Any]) -> str:
    """The end-of-run lines: final test accuracy, wall seconds, device-hours and cost.

    ``metrics`` is the dict written to ``metrics.json`` (keys ``final_test_accuracy``,
    ``total_seconds``, ``train_seconds``, ``device_hours``, ``cost_usd``, ``price_per_hour``,
    ``mean_data_wait_fraction``).
    """
    return "\n".join(
        [
            f"final test accuracy: {100 * metrics['final_test_accuracy']:.2f}%",
            f"training time: {metrics['train_seconds']:.1f} s "
            f"(data wait {100 * metrics['mean_data_wait_fraction']:.1f}%)",
            f"total wall time: {metrics['total_seconds']:.1f} s = {metrics['device_hours']:.4f} device-hours",
            f"cost: ${metrics['cost_usd']:.4f} at ${metrics['price_per_hour']:.2f}/hour",
        ]
    )


def rows_to_dicts(rows: Sequence[EpochStats]) -> list[dict[str, Any]]:
    """The rows as JSON-able dicts (the ``epochs`` entry of ``metrics.json``)."""
    return [asdict(r) for r in rows]


def write_json(path: os.PathLike, obj: dict[str, Any]) -> None:
    """Write ``obj`` as indented JSON to ``path`` atomically (temporary file in the same folder,
    fsync, rename): readers see the old file or the whole new one.

    Raises:
        OSError: the folder cannot be written.
        TypeError: a value is not JSON-serialisable.
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}-", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(obj, f, indent=2)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def plot_accuracy(rows: Sequence[EpochStats], path: os.PathLike, title: str = "") -> None:
    """Save a PNG of test accuracy (percent) against cumulative training seconds.

    Uses matplotlib's object API on the Agg canvas (no pyplot, no global backend change).

    Raises:
        OSError: ``path`` cannot be written.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 4), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    ax.plot([r.train_seconds_total for r in rows], [100 * r.test_accuracy for r in rows], marker="o")
    ax.set_xlabel("training wall time (s)")
    ax.set_ylabel("test accuracy (%)")
    ax.grid(True, alpha=0.3)
    if title:
        ax.set_title(title)
    fig.tight_layout()
    fig.savefig(os.fspath(path), format="png")
