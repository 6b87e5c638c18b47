"""ResNet-9 on CIFAR-10 with ffload: convert once, train with FFCV's CIFAR hyperparameters.

Usage::

    ffload recipe cifar10-resnet9 --data ~/data/cifar-10-batches-py --out runs/r9
    python -m ffload.recipes.cifar10_resnet9 --data ~/data/cifar-10-batches-py --out runs/r9
    python -m ffload.recipes.cifar10_resnet9 --demo --out runs/digits --device cpu   # offline
    torchrun --nproc_per_node=2 -m ffload.recipes.cifar10_resnet9 --demo --out runs/ddp --distributed

``--data`` is either the official ``cifar-10-batches-py`` folder (``data_batch_1..5`` and
``test_batch``; the folder that contains it is accepted too) or an ImageFolder with ``train/``
and ``test/`` sub-folders (``train/<class>/<image>``; all images of one size, 32x32 for the
model as published). ffload downloads nothing: ``torchvision.datasets.CIFAR10(root,
download=True)`` (or the archive from https://www.cs.toronto.edu/~kriz/cifar.html, extracted)
produces ``root/cifar-10-batches-py``; copy that folder anywhere and point ``--data`` at it.

The data is converted once into ``.beton`` files (``--format beton``) or LMDB directories
(``--format lmdb``) in a cache next to ``--out`` (``<parent of --out>/ffload-cache``, or
``--cache-dir``), keyed by a fingerprint of the source (relative file names, sizes and
modification times) and the conversion arguments; a later run with an unchanged source reuses
it. ``convert_dataset`` writes atomically and the cache marker is written after both splits, so
an interrupted run leaves a cache entry complete or ignored.

Training follows FFCV's ``examples/cifar`` (model from KakaoBrain's torchskeleton): batch 512,
24 epochs, SGD (momentum 0.9, weight decay 5e-4 on all parameters, no Nesterov, as FFCV) with a triangular
learning rate per iteration rising linearly from 0 to ``lr * batch_size / 512`` (``lr`` = 0.5)
at epoch 5 and back to 0 at the last iteration, label smoothing 0.1, random horizontal flip +
``RandomTranslate(padding=2, fill=mean)`` + ``Cutout(4, fill=mean)``, test-time averaging of the
logits of the image and its horizontal mirror, fp16 autocast and channels_last on CUDA. Two of
that example's bugs are not reproduced: the CIFAR-10 standard deviation is the true one, (62.99,
62.09, 66.70) in 0-255 units (0.2470, 0.2435, 0.2616), not (51.59, 50.85, 51.26); the test-time
mirror flips the width axis (``torch.flip(x, dims=[3])``), not the channel axis of NCHW tensors
(``ch.fliplr`` in FFCV's tutorial). For runs shorter than 24 epochs the peak moves to
``5 * epochs / 24`` so the schedule keeps its shape.

``--demo`` needs no download: it trains on the 1797 scikit-learn digits (32x32 RGB PNGs, 80/20
split) with defaults ``--width 0.25 --epochs 8 --batch-size 64`` and reached 98.0-98.6% test
accuracy in 17-35 s of wall time on 2 shared CPU cores (``--device cpu``).

Reports (in ``--out``): the per-epoch table (train loss, train accuracy, test accuracy, epoch
seconds, images/s, data-wait fraction), ``metrics.json`` and ``accuracy.png`` (test accuracy vs
training wall time). Target on real CIFAR-10 with a GPU: >= 93.5% test accuracy, data wait
<= 2%.

This module is the command line: it imports only click and the hyperparameters' defaults
(:mod:`ffload.recipes.config`), so that ``--help`` does not import torch; the recipe itself
(:mod:`ffload.recipes.run`) is imported when the command runs.
"""

from __future__ import annotations

from pathlib import Path

import click

from ffload.commands import FfloadCommand
from ffload.recipes.config import RecipeConfig

__all__ = ["recipe_command", "main"]

HELP = "ResNet-9 on CIFAR-10 with ffload: convert once, train with FFCV's CIFAR hyperparameters."
"""The command's one-line help (the first line of this module's docstring)."""

DEMO_DEFAULTS = {"epochs": 8, "batch_size": 64, "width": 0.25}
_DEFAULTS = RecipeConfig()


@click.command("cifar10-resnet9", cls=FfloadCommand, help=HELP)
@click.option(
    "--data",
    "data_dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="cifar-10-batches-py folder, or an ImageFolder with train/ and test/.",
)
@click.option(
    "--out",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Report folder (metrics.json, accuracy.png).",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["beton", "lmdb"]),
    default="beton",
    show_default=True,
    help="Converted format.",
)
@click.option(
    "--epochs",
    type=click.IntRange(min=1),
    help=f"Epochs [default: {_DEFAULTS.epochs}; {DEMO_DEFAULTS['epochs']} with --demo].",
)
@click.option(
    "--batch-size",
    type=click.IntRange(min=1),
    help=f"Batch size [default: {_DEFAULTS.batch_size}; {DEMO_DEFAULTS['batch_size']} with --demo].",
)
@click.option(
    "--lr",
    type=click.FloatRange(min=0, min_open=True),
    default=_DEFAULTS.lr,
    show_default=True,
    help="Peak learning rate at batch 512 (scaled by batch/512).",
)
@click.option(
    "--lr-peak-epoch",
    type=click.FloatRange(min=0, min_open=True),
    default=_DEFAULTS.lr_peak_epoch,
    show_default=True,
    help="Epoch of the learning-rate peak (scaled by epochs/24 below 24 epochs).",
)
@click.option("--device", type=str, default=None, help="cuda or cpu [default: cuda if available, else cpu].")
@click.option("--num-workers", type=click.IntRange(min=1), default=None, help="Loader threads [default: min(8, CPUs)].")
@click.option(
    "--seed",
    type=click.IntRange(min=0),
    default=_DEFAULTS.seed,
    show_default=True,
    help="Initialisation, order and augmentation seed.",
)
@click.option(
    "--width",
    type=click.FloatRange(min=0, min_open=True),
    help=f"Channel multiplier [default: 1; {DEMO_DEFAULTS['width']} with --demo].",
)
@click.option(
    "--price-per-hour",
    type=click.FloatRange(min=0),
    default=0.0,
    show_default=True,
    help="USD per device-hour, for the cost line.",
)
@click.option(
    "--cache-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Conversion cache [default: ffload-cache next to --out].",
)
@click.option("--demo", is_flag=True, help="Train on the scikit-learn digits (built under --out), offline.")
@click.option("--no-progress", is_flag=True, help="No conversion progress bars.")
@click.option(
    "--distributed",
    is_flag=True,
    help="One process of a torchrun job: DistributedDataParallel, each rank its share "
    "of every epoch, --batch-size split over the ranks (docs/distributed.md).",
)
def recipe_command(
    data_dir,
    out,
    fmt,
    epochs,
    batch_size,
    lr,
    lr_peak_epoch,
    device,
    num_workers,
    seed,
    width,
    price_per_hour,
    cache_dir,
    demo,
    no_progress,
    distributed,
):
    if demo and data_dir is not None:
        raise click.UsageError("--data and --demo are mutually exclusive")
    if not demo and data_dir is None:
        raise click.UsageError("--data DIR is required (or --demo)")
    defaults = DEMO_DEFAULTS if demo else {}
    config = RecipeConfig(
        epochs=epochs or defaults.get("epochs", _DEFAULTS.epochs),
        batch_size=batch_size or defaults.get("batch_size", _DEFAULTS.batch_size),
        lr=lr,
        lr_peak_epoch=lr_peak_epoch,
        seed=seed,
        width=width or defaults.get("width", _DEFAULTS.width),
    )
    from ffload.recipes.run import run_recipe  # torch: only when the recipe runs

    run_recipe(
        data_dir,
        out,
        config,
        fmt=fmt,
        device=device,
        num_workers=num_workers,
        price_per_hour=price_per_hour,
        cache_dir=cache_dir,
        demo=demo,
        progress=not no_progress,
        echo=click.echo,
        distributed=distributed,
    )


def main(args: list[str] | None = None) -> None:
    """Run the command line (``args`` default to ``sys.argv[1:]``); exits like a click command."""
    recipe_command.main(args=args, prog_name="ffload recipe cifar10-resnet9")


if __name__ == "__main__":  # python -m ffload.recipes.cifar10_resnet9, torchrun -m ffload.recipes.cifar10_resnet9
    main()
