"""Cost of one ResNet-9 recipe run with three loaders: vanilla PyTorch, ffload on LMDB, ffload on
.beton.

    python scripts/cost_benchmark.py --data ~/data/cifar-10-batches-py --out runs/cost \
        --price-per-hour 2.50
    python scripts/cost_benchmark.py --demo --out runs/cost-demo --device cpu --epochs 3

Every run uses the same model (``ffload.recipes.resnet9.resnet9``), hyperparameters, seed and
epochs (``ffload.recipes.training.train_model``); only the loader differs:

* ``vanilla``: ``ffload.recipes.vanilla.VanillaLoader``, a ``torch.utils.data.DataLoader`` over
  a PNG ImageFolder (PIL decode, per-sample numpy augmentation and normalisation). The script
  writes that folder (``<out>/png``) from the converted .beton, so all three read the same pixels
  and labels.
* ``lmdb`` / ``beton``: ``ffload.recipes.data.make_loaders`` over the cached
  conversions (``prepare_data``).

Writes ``cost_benchmark.md`` (table), ``cost_benchmark.json`` (all rows) and
``cost_benchmark.png`` (bar charts) to ``--out`` and prints the table. Per loader: median epoch
seconds, data-wait fraction (seconds waiting on the loader / training seconds), total seconds
(training + per-epoch evaluation), final test accuracy, cost at ``--price-per-hour`` and the
savings ratio = vanilla total seconds / this loader's total seconds. The one-time conversion
seconds are reported separately (they are paid once per dataset, not per run).

``OMP_WAIT_POLICY`` defaults to ``PASSIVE`` here (set before torch loads; an explicit value is
kept). With OpenMP's default busy-waiting, PyTorch's intra-op threads spin between parallel
regions; on a small or shared CPU the vanilla loader's per-sample work then competes with them
and CPU training slowed several-fold in our runs (2 shared cores), which would overstate
ffload's advantage. GPU runs are unaffected either way.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from dataclasses import asdict
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import click  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from ffload.bench.conditions import format_conditions, measurement_conditions  # noqa: E402
from ffload.formats import open_dataset  # noqa: E402
from ffload.recipes.data import CIFAR_MEAN, CIFAR_STD, demo_folder, make_loaders, prepare_data
from ffload.recipes.report import cost_usd, format_header, format_row, rows_to_dicts, write_json
from ffload.recipes.resnet9 import resnet9
from ffload.recipes.run import ensure_writable
from ffload.recipes.training import RecipeConfig, resolve_device, train_model
from ffload.recipes.vanilla import VanillaLoader, write_image_folder

LOADERS = ("vanilla", "lmdb", "beton")


class _RawImages:
    """``(image (H, W, 3) uint8, label int)`` samples of a converted dataset with raw images."""

    def __init__(self, path: str):
        self.view = open_dataset(path)
        self.region = self.view.open_region()
        self.meta = self.view.metadata

    def __len__(self) -> int:
        return self.view.num_samples

    def __getitem__(self, i: int):
        m = self.meta["image"][i]
        if m["mode"] != 1:
            raise ValueError(f"{self.view.path}: sample {i} is not stored raw")
        pixels = self.view.payload("image", i, self.region)
        image = np.array(pixels).reshape(int(m["height"]), int(m["width"]), 3)
        return image, int(self.meta["label"][i])


def write_png_folder(train_path: str, test_path: str, num_classes: int, root: Path) -> Path:
    """Write ``root/{train,test}/<label>/<index>.png`` from two converted datasets (skipped when
    ``root/complete.json`` names the same datasets). Returns ``root``."""
    marker = root / "complete.json"
    key = {
        "train": os.path.abspath(train_path),
        "test": os.path.abspath(test_path),
        "mtimes": [os.stat(train_path).st_mtime_ns, os.stat(test_path).st_mtime_ns],
    }
    if marker.is_file() and json.loads(marker.read_text()) == key:
        return root
    for split, path in (("train", train_path), ("test", test_path)):
        write_image_folder(_RawImages(path), root / split, num_classes)
    write_json(marker, key)
    return root


def train_label_counts(loader, num_classes: int) -> list[int]:
    """Samples per class of the training set ``loader`` reads (``(num_classes,)`` counts): of
    the PNG folder's listing for ``VanillaLoader``, of the dataset's labels at the loader's
    ``indices`` for an ffload ``Loader``."""
    if isinstance(loader, VanillaLoader):
        labels = np.array([label for _, label in loader.dataset.samples], dtype=np.int64)
    else:
        labels = np.asarray(loader.view.metadata["label"][loader.indices], dtype=np.int64)
    return np.bincount(labels, minlength=num_classes).tolist()


def run_one(
    name: str, train_loader, test_loader, config: RecipeConfig, device: torch.device, num_classes: int, echo
) -> dict:
    """Train a fresh seeded ResNet-9 with one loader pair; returns that loader's result row
    (``train_label_counts``: what the training set holds, to check that every loader reads the
    same samples)."""
    torch.manual_seed(config.seed)
    model = resnet9(num_classes, config.width).to(device=device, memory_format=torch.channels_last)
    echo(f"\n== {name}")
    echo(format_header())
    t0 = time.perf_counter()
    rows, _ = train_model(model, train_loader, test_loader, config, device, on_epoch=lambda r: echo(format_row(r)))
    total = time.perf_counter() - t0
    train_seconds = sum(r.epoch_seconds for r in rows)
    return {
        "loader": name,
        "median_epoch_seconds": statistics.median(r.epoch_seconds for r in rows),
        "data_wait_fraction": sum(r.data_wait_seconds for r in rows) / train_seconds,
        "train_seconds": train_seconds,
        "total_seconds": total,
        "final_test_accuracy": rows[-1].test_accuracy,
        "train_label_counts": train_label_counts(train_loader, num_classes),
        "epochs": rows_to_dicts(rows),
    }


def format_markdown(
    results: list[dict], price_per_hour: float, convert_seconds: dict[str, float | None], header: str
) -> str:
    """The results as a markdown table (one row per loader) with the savings ratios;
    ``convert_seconds[fmt]`` is None when that conversion came from the cache."""
    vanilla = next((r for r in results if r["loader"] == "vanilla"), None)
    lines = [
        header,
        "",
        "| loader | median epoch (s) | data wait | total (s) | test accuracy | "
        f"cost (USD at ${price_per_hour:.2f}/h) | savings vs vanilla |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        ratio = f"{vanilla['total_seconds'] / r['total_seconds']:.2f}x" if vanilla else "n/a"
        lines.append(
            f"| {r['loader']} | {r['median_epoch_seconds']:.2f} | "
            f"{100 * r['data_wait_fraction']:.1f}% | {r['total_seconds']:.1f} | "
            f"{100 * r['final_test_accuracy']:.2f}% | {r['cost_usd']:.4f} | {ratio} |"
        )
    lines += [
        "",
        "One-time conversion (not in the totals): "
        + ", ".join(
            f"{fmt} {s:.1f} s" if s is not None else f"{fmt} cached by an earlier run"
            for fmt, s in convert_seconds.items()
        )
        + ".",
    ]
    return "\n".join(lines) + "\n"


COLORS = {"vanilla": "#888888", "lmdb": "#4c72b0", "beton": "#55a868"}


def plot_bars(results: list[dict], path: Path) -> None:
    """PNG with four bar charts, one bar per loader: median epoch seconds, data-wait percent,
    total seconds (labelled with the cost) and final test accuracy."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(13, 3.6), dpi=100)
    FigureCanvasAgg(fig)
    names = [r["loader"] for r in results]
    panels = (
        (
            "median epoch (s)",
            [r["median_epoch_seconds"] for r in results],
            [f"{r['median_epoch_seconds']:.2f}" for r in results],
        ),
        (
            "data wait (%)",
            [100 * r["data_wait_fraction"] for r in results],
            [f"{100 * r['data_wait_fraction']:.1f}" for r in results],
        ),
        (
            "total time (s) and cost",
            [r["total_seconds"] for r in results],
            [f"{r['total_seconds']:.1f}\n${r['cost_usd']:.4f}" for r in results],
        ),
        (
            "test accuracy (%)",
            [100 * r["final_test_accuracy"] for r in results],
            [f"{100 * r['final_test_accuracy']:.2f}" for r in results],
        ),
    )
    for k, (title, values, labels) in enumerate(panels):
        ax = fig.add_subplot(1, len(panels), k + 1)
        bars = ax.bar(names, values, color=[COLORS[n] for n in names])
        ax.bar_label(bars, labels=labels, fontsize=8)
        ax.set_title(title)
        ax.margins(y=0.2)
    fig.tight_layout()
    fig.savefig(os.fspath(path), format="png")


@click.command(help=__doc__.split("\n\n")[0])
@click.option(
    "--data",
    "data_dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="cifar-10-batches-py folder, or an ImageFolder with train/ and test/.",
)
@click.option("--demo", is_flag=True, help="Use the scikit-learn digits (built under --out).")
@click.option("--out", required=True, type=click.Path(file_okay=False, path_type=Path))
@click.option("--epochs", type=click.IntRange(min=1), default=24, show_default=True)
@click.option("--batch-size", type=click.IntRange(min=1), default=512, show_default=True)
@click.option(
    "--width",
    type=click.FloatRange(min=0, min_open=True),
    default=1.0,
    show_default=True,
    help="ResNet-9 channel multiplier.",
)
@click.option("--device", default=None, help="cuda or cpu [default: cuda if available].")
@click.option(
    "--num-workers",
    type=click.IntRange(min=0),
    default=None,
    help="Loader workers (vanilla: processes, ffload: threads) [default: min(8, CPUs)].",
)
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True)
@click.option(
    "--price-per-hour", type=click.FloatRange(min=0), default=0.0, show_default=True, help="USD per device-hour."
)
@click.option(
    "--cache-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Conversion cache [default: ffload-cache next to --out].",
)
@click.option(
    "--loaders", default=",".join(LOADERS), show_default=True, help="Comma-separated subset of vanilla,lmdb,beton."
)
def cost_benchmark(
    data_dir, demo, out, epochs, batch_size, width, device, num_workers, seed, price_per_hour, cache_dir, loaders
):
    names = [n.strip() for n in loaders.split(",") if n.strip()]
    if not names or any(n not in LOADERS for n in names):
        raise click.UsageError(f"--loaders {loaders!r}: choose from {', '.join(LOADERS)}")
    if demo == (data_dir is not None):
        raise click.UsageError("give exactly one of --data DIR and --demo")
    dev = resolve_device(device)
    out = ensure_writable(out)
    cache_dir = cache_dir or out.resolve().parent / "ffload-cache"
    workers = min(8, os.cpu_count() or 1) if num_workers is None else num_workers
    if demo:
        data_dir = demo_folder(out)
    config = RecipeConfig(epochs=epochs, batch_size=batch_size, width=width, seed=seed)
    prepared = {
        fmt: prepare_data(data_dir, cache_dir, fmt, max(workers, 1), progress=True) for fmt in ("beton", "lmdb")
    }
    beton = prepared["beton"]
    if beton.num_train < batch_size:
        raise click.UsageError(f"--batch-size {batch_size} is larger than the training set ({beton.num_train} images)")
    results = []
    for name in names:
        if name == "vanilla":
            png = write_png_folder(beton.train_path, beton.test_path, beton.num_classes, out / "png")
            train_loader = VanillaLoader(png / "train", batch_size, workers, dev, True, CIFAR_MEAN, CIFAR_STD, seed)
            test_loader = VanillaLoader(png / "test", batch_size, workers, dev, False, CIFAR_MEAN, CIFAR_STD, seed)
        else:
            train_loader, test_loader = make_loaders(prepared[name], batch_size, max(workers, 1), dev, seed)
        row = run_one(name, train_loader, test_loader, config, dev, beton.num_classes, click.echo)
        row["cost_usd"] = cost_usd(row["total_seconds"], price_per_hour)
        results.append(row)
        del train_loader, test_loader  # stop worker processes / threads before the next run
    convert_seconds = {fmt: None if p.cache_hit else p.convert_seconds for fmt, p in prepared.items()}
    device_name = (
        torch.cuda.get_device_name(dev)
        if dev.type == "cuda"
        else (f"cpu, {torch.get_num_threads()} torch threads, OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}")
    )
    conditions = measurement_conditions()
    header = (
        f"# Cost benchmark: ResNet-9 (width {width}), {epochs} epochs, batch {batch_size}, "
        f"seed {seed}\n\nDevice: {device_name}; {workers} loader workers; data {data_dir}\n\n"
        f"{format_conditions(conditions)}"
    )
    markdown = format_markdown(results, price_per_hour, convert_seconds, header)
    (out / "cost_benchmark.md").write_text(markdown)
    write_json(
        out / "cost_benchmark.json",
        {
            "config": asdict(config),
            "conditions": conditions,
            "device": str(dev),
            "device_name": device_name,
            "num_workers": workers,
            "price_per_hour": price_per_hour,
            "convert_seconds": convert_seconds,
            "results": results,
        },
    )
    plot_bars(results, out / "cost_benchmark.png")
    click.echo("\n" + markdown)
    click.echo(f"wrote {out / 'cost_benchmark.md'}, cost_benchmark.json, cost_benchmark.png")


def main(argv: list[str] | None = None) -> None:
    """Run the command line (``argv`` defaults to ``sys.argv[1:]``)."""
    cost_benchmark.main(args=argv, prog_name="cost_benchmark.py")


if __name__ == "__main__":
    main(sys.argv[1:])
