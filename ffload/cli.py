"""The ``ffload`` command line: ``convert``, ``inspect``, ``verify``, ``bench``, ``recipe``."""
from __future__ import annotations

import json
import sys

import click


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return str(n)


class _LazyGroup(click.Group):
    """A group whose commands live in modules imported only when the command runs (they import
    torch, which ``ffload convert`` / ``inspect`` do not need)."""

    def __init__(self, *args, lazy=None, **kwargs):
        super().__init__(*args, **kwargs)
        self._lazy = dict(lazy or {})

    def list_commands(self, ctx):
        return sorted(set(super().list_commands(ctx)) | set(self._lazy))

    def get_command(self, ctx, name):
        if name in self._lazy:
            module, attr = self._lazy[name]
            return getattr(__import__(module, fromlist=[attr]), attr)
        return super().get_command(ctx, name)


@click.group(cls=_LazyGroup, lazy={"bench": ("ffload.bench", "bench_command")},
             context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="ffload")
def main():
    """ffload: convert image datasets once into memory-mapped files (.beton, LMDB), then train
    from them with compiled loading pipelines."""


@main.command()
@click.argument("src", type=click.Path())
@click.argument("dst", type=click.Path())
@click.option("--source", "source_kind", type=click.Choice(["auto", "imagefolder", "cifar10", "cifar100"]),
              default="auto", show_default=True, help="Source layout (detected by default).")
@click.option("--split", default=None,
              help="CIFAR: 'train' (default) or 'test'. ImageFolder: convert SRC/<split> instead of SRC.")
@click.option("--write-mode", type=click.Choice(["raw", "jpg", "smart", "proportion"]), default="raw",
              show_default=True, help="How images are stored (FFCV's RGBImageField write_mode).")
@click.option("--max-resolution", type=click.IntRange(min=1), default=None,
              help="Cap the longer image side at this many pixels (INTER_AREA).")
@click.option("--jpeg-quality", type=click.IntRange(1, 100), default=90, show_default=True)
@click.option("--smart-threshold", type=click.IntRange(min=0), default=None,
              help="write-mode smart: JPEG-compress images whose raw size exceeds this many bytes.")
@click.option("--compress-probability", type=click.FloatRange(0, 1), default=0.5, show_default=True,
              help="write-mode proportion: probability of JPEG-compressing an image.")
@click.option("--workers", type=click.IntRange(min=0), default=None,
              help="Encoding processes (default: all cores; 0: in this process).")
@click.option("--page-size", type=int, default=None, help=".beton page size in bytes (power of two >= 2 MiB).")
@click.option("--overwrite", is_flag=True, help="Replace DST if it exists (only once the new one is complete).")
@click.option("--on-error", type=click.Choice(["fail", "skip"]), default="fail", show_default=True,
              help="fail: stop at the first bad input; skip: leave it out and list it at the end.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
def convert(src, dst, source_kind, split, write_mode, max_resolution, jpeg_quality, smart_threshold,
            compress_probability, workers, page_size, overwrite, on_error, as_json, quiet):
    """Convert SRC (an ImageFolder tree or a CIFAR-10/100 python archive folder) into DST.

    The format comes from DST's suffix: .beton (FFCV v2) or .lmdb (an LMDB directory).
    """
    from .convert import ConvertError, convert_dataset
    from .convert.sources import SourceError, detect_source

    try:
        source = detect_source(src, kind=None if source_kind == "auto" else source_kind, split=split)
        report = convert_dataset(source, dst, write_mode=write_mode, max_resolution=max_resolution,
                                 jpeg_quality=jpeg_quality, smart_threshold=smart_threshold,
                                 compress_probability=compress_probability, num_workers=workers,
                                 on_error=on_error, overwrite=overwrite, progress=not quiet,
                                 page_size=page_size)
    except (ConvertError, SourceError, FileExistsError, FileNotFoundError, ValueError) as e:
        raise click.ClickException(str(e))
    if as_json:
        click.echo(json.dumps(report.as_dict(), indent=2))
        return
    rate = report.samples / report.seconds if report.seconds else float("inf")
    click.echo(f"wrote {report.dst} ({report.format})")
    click.echo(f"  samples        {report.samples}")
    if report.classes is not None:
        click.echo(f"  classes        {report.classes}")
    click.echo(f"  bytes          {report.bytes} ({_human(report.bytes)}), "
               f"{report.bytes_per_sample:.0f} bytes/sample")
    click.echo(f"  seconds        {report.seconds:.2f} ({rate:.0f} images/s, {report.workers} workers)")
    click.echo(f"  skipped        {len(report.skipped)}")
    for name, cause in report.skipped:
        click.echo(f"    {name}: {cause}")


@main.command()
@click.argument("path", type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--grid", type=click.Path(dir_okay=False), default=None,
              help="Write a PNG thumbnail grid of decoded samples with their labels.")
@click.option("--grid-count", type=click.IntRange(1, 400), default=36, show_default=True)
def inspect(path, as_json, grid, grid_count):
    """Describe a .beton file or an ffload LMDB database: fields, samples, sizes, class histogram."""
    from .formats import DatasetError, open_dataset
    from .inspect import save_grid, summarize

    try:
        view = open_dataset(path)
        info = summarize(view)
        if grid:
            info["grid"] = {"path": grid, "images": save_grid(view, grid, count=grid_count)}
    except (DatasetError, ValueError, OSError) as e:
        raise click.ClickException(str(e))
    if as_json:
        click.echo(json.dumps(info, indent=2))
        return
    click.echo(f"{info['path']}  ({info['format']})")
    click.echo(f"  samples   {info['samples']}")
    click.echo(f"  bytes     {info['bytes']} ({_human(info['bytes'])}), {info['bytes_per_sample']} bytes/sample")
    if info["format"] == "beton":
        click.echo(f"  page size {info['page_size']} bytes")
    click.echo("  fields")
    for f in info["fields"]:
        line = f"    {f['name']:<12} {f['type']}"
        if "payload_bytes" in f and f["payload_bytes"]:
            p = f["payload_bytes"]
            line += f"  payload {p['min']}..{p['max']} bytes (mean {p['mean']})"
        if "width" in f and f["width"]:
            line += (f"  {f['width']['min']}..{f['width']['max']} x {f['height']['min']}..{f['height']['max']} px"
                     f"  jpg {f['modes']['jpg']} / raw {f['modes']['raw']}")
        click.echo(line)
    if "histogram" in info:
        click.echo(f"  classes   {info['classes']} (field {info['label_field']!r})")
        top = max(info["histogram"].values())
        for label, count in info["histogram"].items():
            click.echo(f"    {label:>5} {count:>8}  {'#' * max(1, round(30 * count / top))}")
    if grid:
        click.echo(f"  grid      {grid} ({info['grid']['images']} images)")


@main.command()
@click.argument("path", type=click.Path())
@click.option("--workers", type=click.IntRange(min=0), default=0, help="Threads (0: all cores).")
@click.option("--quiet", is_flag=True, help="No progress bar.")
def verify(path, workers, quiet):
    """Decode every sample of PATH (.beton or LMDB) and report the ones that do not decode.

    Exits with status 1 when a sample is bad, naming each one and the cause.
    """
    from .formats import DatasetError, open_dataset
    from .verify import verify_dataset

    try:
        view = open_dataset(path)
    except DatasetError as e:
        raise click.ClickException(str(e))
    problems = verify_dataset(view, num_workers=workers, progress=not quiet)
    if problems:
        for index, field, cause in problems:
            click.echo(f"sample {index}, field {field!r}: {cause}", err=True)
        raise click.ClickException(f"{path}: {len(problems)} of {view.num_samples} samples do not decode")
    click.echo(f"{path}: all {view.num_samples} samples decode")


@main.group(cls=_LazyGroup, lazy={"cifar10-resnet9": ("ffload.recipes.cifar10_resnet9", "recipe_command")})
def recipe():
    """Training recipes built on ffload's public API."""


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
