"""``ffload recipe cifar10-resnet9``: the ResNet-9 recipe's command line (:mod:`ffload.recipes.cifar10_resnet9`).

Only click and the hyperparameters' defaults are imported here, so that ``--help`` does not import torch; the
recipe itself is imported when the command runs.
"""
from __future__ import annotations

from pathlib import Path

import click

from ffload.commands import FfloadCommand
from ffload.recipes.config import RecipeConfig

__all__ = ["recipe_command", "main"]

HELP = "ResNet-9 on CIFAR-10 with ffload: convert once, train with FFCV's CIFAR hyperparameters."
"""The command's one-line help (the first line of :mod:`ffload.recipes.cifar10_resnet9`'s docstring)."""

DEMO_DEFAULTS = {"epochs": 8, "batch_size": 64, "width": 0.25}
_DEFAULTS = RecipeConfig()


@click.command("cifar10-resnet9", cls=FfloadCommand, help=HELP)
@click.option("--data", "data_dir", type=click.Path(file_okay=False, path_type=Path),
              help="cifar-10-batches-py folder, or an ImageFolder with train/ and test/.")
@click.option("--out", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Report folder (metrics.json, accuracy.png).")
@click.option("--format", "fmt", type=click.Choice(["beton", "lmdb"]), default="beton",
              show_default=True, help="Converted format.")
@click.option("--epochs", type=click.IntRange(min=1),
              help=f"Epochs [default: {_DEFAULTS.epochs}; {DEMO_DEFAULTS['epochs']} with --demo].")
@click.option("--batch-size", type=click.IntRange(min=1),
              help=f"Batch size [default: {_DEFAULTS.batch_size}; "
                   f"{DEMO_DEFAULTS['batch_size']} with --demo].")
@click.option("--lr", type=click.FloatRange(min=0, min_open=True), default=_DEFAULTS.lr,
              show_default=True, help="Peak learning rate at batch 512 (scaled by batch/512).")
@click.option("--lr-peak-epoch", type=click.FloatRange(min=0, min_open=True),
              default=_DEFAULTS.lr_peak_epoch, show_default=True,
              help="Epoch of the learning-rate peak (scaled by epochs/24 below 24 epochs).")
@click.option("--device", type=str, default=None,
              help="cuda or cpu [default: cuda if available, else cpu].")
@click.option("--num-workers", type=click.IntRange(min=1), default=None,
              help="Loader threads [default: min(8, CPUs)].")
@click.option("--seed", type=click.IntRange(min=0), default=_DEFAULTS.seed, show_default=True,
              help="Initialisation, order and augmentation seed.")
@click.option("--width", type=click.FloatRange(min=0, min_open=True),
              help=f"Channel multiplier [default: 1; {DEMO_DEFAULTS['width']} with --demo].")
@click.option("--price-per-hour", type=click.FloatRange(min=0), default=0.0, show_default=True,
              help="USD per device-hour, for the cost line.")
@click.option("--cache-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Conversion cache [default: ffload-cache next to --out].")
@click.option("--demo", is_flag=True,
              help="Train on the scikit-learn digits (built under --out), offline.")
@click.option("--no-progress", is_flag=True, help="No conversion progress bars.")
@click.option("--distributed", is_flag=True,
              help="One process of a torchrun job: DistributedDataParallel, each rank its share "
                   "of every epoch, --batch-size split over the ranks (docs/distributed.md).")
def recipe_command(data_dir, out, fmt, epochs, batch_size, lr, lr_peak_epoch, device,
                   num_workers, seed, width, price_per_hour, cache_dir, demo, no_progress,
                   distributed):
    if demo and data_dir is not None:
        raise click.UsageError("--data and --demo are mutually exclusive")
    if not demo and data_dir is None:
        raise click.UsageError("--data DIR is required (or --demo)")
    defaults = DEMO_DEFAULTS if demo else {}
    config = RecipeConfig(
        epochs=epochs or defaults.get("epochs", _DEFAULTS.epochs),
        batch_size=batch_size or defaults.get("batch_size", _DEFAULTS.batch_size),
        lr=lr, lr_peak_epoch=lr_peak_epoch, seed=seed,
        width=width or defaults.get("width", _DEFAULTS.width))
    from ffload.recipes.cifar10_resnet9 import run_recipe  # torch: only when the recipe runs

    run_recipe(data_dir, out, config, fmt=fmt, device=device, num_workers=num_workers,
               price_per_hour=price_per_hour, cache_dir=cache_dir, demo=demo,
               progress=not no_progress, echo=click.echo, distributed=distributed)


def main(args: list[str] | None = None) -> None:
    """Run the command line (``args`` default to ``sys.argv[1:]``); exits like a click command."""
    recipe_command.main(args=args, prog_name="ffload recipe cifar10-resnet9")
