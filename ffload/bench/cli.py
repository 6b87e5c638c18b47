"""``ffload bench PATH``: the click command (registered lazily by :mod:`ffload.cli`)."""

from __future__ import annotations

import json

import click

from ffload.commands import FfloadCommand

from .conditions import format_conditions, measurement_conditions
from .config import DEFAULT_BATCH_SIZE, PIPELINES
from .harness import run_rounds
from .plan import choose_pipeline, describe_dataset, plan_configs
from .report import format_ratios, format_rows, plot_throughput
from .summary import RATIO_PAIRS, compute_ratios, summarize


def _parse_workers(text: str) -> list[int]:
    """``'1,2'`` -> ``[1, 2]`` (sorted, unique); click.BadParameter otherwise."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise click.BadParameter(
            f"expected comma-separated integers, got {text!r}", param_hint="--workers-list"
        ) from None
    if not values or min(values) < 1:
        raise click.BadParameter(f"expected integers >= 1, got {text!r}", param_hint="--workers-list") from None
    return sorted(set(values))


def _header(path: str, info: dict, pipeline: str, size: int, batch_size: int, epochs: int, repeats: int) -> str:
    """The report's first line: the dataset, the pipeline and the protocol."""
    shape = f"{info['size'][1]}x{info['size'][0]}" if info["one_size"] and pipeline == "simple" else f"{size}x{size}"
    return (
        f"{path} ({info['format']}, {info['num_samples']} samples, {info['jpeg_samples']} JPEG): pipeline "
        f"{pipeline} -> {shape} + flip, batch {batch_size}, {epochs} epochs (epoch 0 reported apart), "
        f"{repeats} round(s)"
    )


@click.command("bench", cls=FfloadCommand)
@click.argument("path", type=click.Path(exists=True))
@click.option(
    "--pipeline",
    type=click.Choice(("auto",) + PIPELINES),
    default="auto",
    show_default=True,
    help="auto: simple (decode + flip) for images of one size, else rrc (RandomResizedCrop + flip).",
)
@click.option(
    "--size",
    type=click.IntRange(min=1),
    default=224,
    show_default=True,
    help="Output side of the rrc / center pipelines, pixels.",
)
@click.option(
    "--epochs",
    type=click.IntRange(min=1),
    default=3,
    show_default=True,
    help="Epochs per measurement; epoch 0 (warm-up, compilation) is reported apart.",
)
@click.option(
    "--batch-size",
    type=click.IntRange(min=1),
    default=None,
    help="Default: 512 for the simple pipeline, 128 for the crops.",
)
@click.option("--num-workers", type=click.IntRange(min=1), default=None, help="Default: all CPUs.")
@click.option(
    "--repeats",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Interleaved rounds (medians are reported).",
)
@click.option(
    "--compare", is_flag=True, help="Also measure ffcv's Loader, PyTorch DataLoader baselines and the decode ceiling."
)
@click.option(
    "--source-folder",
    type=click.Path(exists=True, file_okay=False),
    default=None,
    help="The ImageFolder PATH was converted from, for the DataLoader + PIL baseline.",
)
@click.option(
    "--plot",
    type=click.Path(dir_okay=False),
    default=None,
    help="Write a PNG of images/s against num_workers (measures every --workers-list value).",
)
@click.option("--workers-list", default=None, help="Worker counts for --plot, e.g. 1,2 (default: 1 and --num-workers).")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="Use only the first N samples.")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True)
@click.option("--timeout", type=click.FloatRange(min=1), default=None, help="Seconds per measurement.")
@click.option(
    "--torchvision",
    "torchvision_stack",
    default=None,
    metavar="MODULE:ATTRIBUTE",
    help="A torchvision Compose ('package.module:name' or 'file.py:name'): run it compiled "
    "(ffload.transforms.from_torchvision) and through DataLoader + PIL + torchvision, print both rates "
    "and the pixel difference (instead of the pipelines above).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
def bench_command(
    path,
    pipeline,
    size,
    epochs,
    batch_size,
    num_workers,
    repeats,
    compare,
    source_folder,
    plot,
    workers_list,
    limit,
    seed,
    timeout,
    torchvision_stack,
    as_json,
):
    """Measure loading speed of PATH (a .beton file or an LMDB directory): images/s per epoch,
    time to the first batch, peak RSS; with --compare, side by side with ffcv, PyTorch
    DataLoader and the measured JPEG decode ceiling, each loader in its own process, rounds
    interleaved. The report (stdout) records the conditions: versions, git commit, CPUs, device;
    progress goes to stderr."""
    from ffload.system import available_cpus

    if torchvision_stack:
        return _bench_user_stack(path, torchvision_stack, batch_size, num_workers, epochs, limit, seed, as_json)
    info = describe_dataset(path)  # FfloadErrors become one line in ffload's command group
    pipeline = choose_pipeline(info, pipeline)
    num_workers = num_workers or available_cpus()
    batch_size = batch_size or DEFAULT_BATCH_SIZE[pipeline]
    workers = _parse_workers(workers_list) if workers_list else sorted({1, num_workers})
    if not plot:
        workers = [num_workers]
    configs, notes = plan_configs(
        path, info, pipeline, batch_size, workers, epochs, size, compare, source_folder, seed, limit
    )
    header = _header(path, info, pipeline, size, batch_size, epochs, repeats)
    conditions = measurement_conditions()

    def progress(result):
        if not as_json:
            status = f"{result['img_s']:.0f} img/s" if "error" not in result else f"FAILED: {result['error'][:300]}"
            click.echo(
                f"  [{result['round'] + 1}/{repeats}] {result['name']} ({result['config']['num_workers']} "
                f"workers): {status}",
                err=True,
            )

    if not as_json:  # the report's first lines, once, before the progress lines
        click.echo(header)
        click.echo(format_conditions(conditions))
    results = run_rounds(configs, repeats, timeout, progress)
    rows = summarize(results)
    ratios = compute_ratios(rows, RATIO_PAIRS)
    if plot:
        try:
            plot_throughput(rows, plot, header)
        except (ValueError, OSError) as e:
            raise click.ClickException(f"--plot {plot}: {e}") from e
    if as_json:
        click.echo(
            json.dumps(
                {
                    "header": header,
                    "conditions": conditions,
                    "dataset": info,
                    "rows": rows,
                    "ratios": ratios,
                    "notes": notes,
                    "runs": results,
                    "plot": plot,
                },
                indent=2,
            )
        )
    else:
        click.echo(format_rows(rows))
        if ratios:
            click.echo("")
            click.echo(format_ratios(ratios))
        for note in notes:
            click.echo(f"note: {note}")
        if plot:
            click.echo(f"plot: {plot}")
    if all(r["runs"] == 0 for r in rows if r["kind"] == "ffload"):
        raise click.ClickException("every ffload measurement failed: " + rows[0]["errors"][0])


def _bench_user_stack(path, spec, batch_size, num_workers, epochs, limit, seed, as_json) -> None:
    """``--torchvision``: :func:`ffload.bench.user_stack.compare_user_stack`, printed (or as JSON)."""
    from ffload.system import available_cpus

    from .user_stack import compare_user_stack

    result = compare_user_stack(
        path, spec, batch_size or 64, num_workers or available_cpus(), max(epochs, 2), limit, seed
    )
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    click.echo(f"{path}: {spec} -> {' -> '.join(result['stages'])} ({'x'.join(map(str, result['shape']))})")
    click.echo(f"  compiled (ffload Loader):           {result['compiled_img_s']:9.0f} img/s")
    click.echo(f"  DataLoader + PIL + torchvision:     {result['torchvision_img_s']:9.0f} img/s")
    click.echo(f"  ratio:                              {result['ratio']:9.2f}x")
    what = (
        "per-channel means of the first batches (random transforms draw differently)"
        if result["random"]
        else "same samples"
    )
    click.echo(f"  pixel difference (mean abs, grey levels, {what}): {result['pixel_diff']:.3f}")
    for message in result["warnings"]:
        click.echo(f"note: {message}")
