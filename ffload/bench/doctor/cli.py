"""``ffload doctor DATASET``: the click command (registered lazily by :mod:`ffload.cli`). Nothing heavy
is imported until it runs."""

from __future__ import annotations

import json

import click

from ffload.commands import FfloadCommand

from ..config import PIPELINES


@click.command("doctor", cls=FfloadCommand)
@click.argument("dataset", type=click.Path(exists=True))
@click.option(
    "--pipeline",
    type=click.Choice(("auto",) + PIPELINES),
    default="auto",
    show_default=True,
    help="auto: simple (decode + flip) for images of one size, else rrc (RandomResizedCrop + flip).",
)
@click.option("--size", type=click.IntRange(min=1), default=224, show_default=True, help="Crop output side, pixels.")
@click.option("--batch-size", type=click.IntRange(min=1), default=None, help="Default: 512 simple, 128 crops.")
@click.option(
    "--step-ms",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="The training step per batch, ms (the consumer's limit; also runs the loader against it).",
)
@click.option(
    "--seconds",
    type=click.FloatRange(min=0.1),
    default=2.0,
    show_default=True,
    help="Per loader run and per disk probe.",
)
@click.option(
    "--startup",
    "startup_full",
    is_flag=True,
    help="Also time cold starts (empty numba cache), several ranks starting at once and a read-only "
    "package (minutes: numba compiles everything in each).",
)
@click.option("--ranks", type=click.IntRange(min=2), default=2, show_default=True, help="Ranks started at once.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON (schema ffload.doctor/1).")
@click.option("--plot", type=click.Path(dir_okay=False), default=None, help="Write a PNG: loader vs limits.")
def doctor_command(dataset, pipeline, size, batch_size, step_ms, seconds, startup_full, ranks, as_json, plot):
    """Find what limits loading DATASET on this machine: the disk's random and sequential read rates
    on its file (page cache dropped), one core's decode rate of its payloads times the usable CPUs,
    the memory bandwidth of a batch copy, the consumer's step (--step-ms); then the loader at a few
    worker counts. Prints where the loader stands as a fraction of each limit, which one binds, the
    settings to use (num_workers, batches_ahead, os_cache) and the time to the first batch."""
    from .report import format_report, plot_report
    from .run import diagnose

    progress = None if as_json else (lambda message: click.echo(f"  ... {message}", err=True))
    report = diagnose(
        dataset,
        pipeline=pipeline,
        size=size,
        batch_size=batch_size,
        step_ms=step_ms,
        seconds=seconds,
        startup_full=startup_full,
        ranks=ranks,
        progress=progress,
    )
    if plot:
        plot_report(report, plot)
        report["plot"] = plot
    click.echo(json.dumps(report, indent=2) if as_json else format_report(report))
