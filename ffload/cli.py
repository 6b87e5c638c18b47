"""The ``ffload`` command line: ``convert``, ``inspect``, ``verify``, ``export``, ``bench``, ``doctor``, ``recipe``.

Errors: any :class:`~ffload.errors.FfloadError` (and an ``OSError`` on a user's path) is one line
on stderr, ``ffload: error: <message>``, with exit status 1; usage errors exit with 2;
``ffload --debug`` shows the traceback (see :mod:`ffload.commands`).
"""

from __future__ import annotations

import functools
import json
import sys

import click

from ffload.commands import DEBUG_KEY, FfloadGroup, terminate_like_ctrl_c
from ffload.convert.sources.detect import SOURCE_KINDS
from ffload.errors import FormatError
from ffload.limits import DEFAULT_MAX_PIXELS


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return str(n)


def _num_workers_option(what: str):
    """``--num-workers N`` with one meaning in every command: ``what`` (default: all cores; 0: in
    this process), passed to the command as ``num_workers`` (None: all cores). ``--workers`` is
    its hidden, deprecated alias (one warning line on stderr)."""

    def decorate(command):
        @functools.wraps(command)
        def run(*args, num_workers, workers, **kwargs):
            if workers is not None:
                if num_workers is not None:
                    raise click.UsageError("--workers is the old name of --num-workers; give only --num-workers")
                click.echo(
                    "ffload: warning: --workers is deprecated; use --num-workers "
                    "(default: all cores; 0: in this process)",
                    err=True,
                )
                num_workers = workers
            return command(*args, num_workers=num_workers, **kwargs)

        run = click.option("--workers", type=click.IntRange(min=0), default=None, hidden=True)(run)
        return click.option(
            "--num-workers",
            type=click.IntRange(min=0),
            default=None,
            help=f"{what} (default: all cores; 0: in this process).",
        )(run)

    return decorate


@click.group(
    cls=FfloadGroup,
    lazy={"bench": ("ffload.bench", "bench_command"), "doctor": ("ffload.bench.doctor", "doctor_command")},
    context_settings={"help_option_names": ["-h", "--help"]},
)
@click.version_option(package_name="ffload")
@click.option("--debug", is_flag=True, help="Show the traceback of an error.")
@click.pass_context
def main(ctx, debug):
    """ffload: convert image datasets once into memory-mapped files (.beton, LMDB), then train
    from them with compiled loading pipelines."""
    ctx.meta[DEBUG_KEY] = debug
    terminate_like_ctrl_c()


def _max_pixels_option(what: str):
    """``--max-pixels N`` (0: no limit), passed as ``max_pixels`` (None: no limit)."""

    def decorate(command):
        @functools.wraps(command)
        def run(*args, max_pixels, **kwargs):
            return command(*args, max_pixels=max_pixels or None, **kwargs)

        return click.option(
            "--max-pixels",
            type=click.IntRange(min=0),
            default=DEFAULT_MAX_PIXELS,
            show_default=True,
            help=f"Refuse {what} whose header declares more pixels (a decompression bomb); "
            f"0: no limit. Above half of it a warning is logged.",
        )(run)

    return decorate


def _parse_storage_options(ctx, param, value):
    if value is None:
        return None
    try:
        options = json.loads(value)
    except json.JSONDecodeError as e:
        raise click.BadParameter(f"not JSON ({e})") from None
    if not isinstance(options, dict):
        raise click.BadParameter("must be a JSON object ({...})")
    return options


def _storage_options_option(what: str):
    """``--storage-options JSON``: the filesystem options of ``what`` when it is a URL (``s3://``,
    ``http(s)://``; :func:`ffload.storage.open_filesystem`), passed as ``storage_options`` (a
    dict, or None)."""
    return click.option(
        "--storage-options",
        "storage_options",
        default=None,
        metavar="JSON",
        callback=_parse_storage_options,
        help=f"For {what} on object storage (s3://, http(s)://): the filesystem's options as a JSON object, e.g. "
        '\'{"endpoint_url": "http://127.0.0.1:9000", "key": ..., "secret": ...}\' for s3://, '
        '\'{"headers": {"Authorization": ...}}\' for https:// (default: credentials and endpoint from the '
        "environment and ~/.aws).",
    )


@main.command()
@click.argument("src", type=click.Path())
@click.argument("dst", type=click.Path())
@click.option(
    "--source",
    "source_kind",
    type=click.Choice(["auto", *SOURCE_KINDS]),
    default="auto",
    show_default=True,
    help="Source layout (detected by default).",
)
@click.option(
    "--split", default=None, help="CIFAR: 'train' (default) or 'test'. ImageFolder: convert SRC/<split> instead of SRC."
)
@click.option(
    "--write-mode",
    type=click.Choice(["raw", "jpg", "smart", "proportion"]),
    default="raw",
    show_default=True,
    help="How images are stored (FFCV's RGBImageField write_mode).",
)
@click.option(
    "--max-resolution",
    type=click.IntRange(min=1),
    default=None,
    help="Cap the longer image side at this many pixels (INTER_AREA).",
)
@click.option("--jpeg-quality", type=click.IntRange(1, 100), default=90, show_default=True)
@click.option(
    "--smart-threshold",
    type=click.IntRange(min=0),
    default=None,
    help="write-mode smart: JPEG-compress images whose raw size exceeds this many bytes.",
)
@click.option(
    "--compress-probability",
    type=click.FloatRange(0, 1),
    default=0.5,
    show_default=True,
    help="write-mode proportion: probability of JPEG-compressing an image.",
)
@click.option(
    "--jpeg-restart-interval",
    type=click.IntRange(0, 65535),
    default=None,
    help="MCUs between restart markers in the JPEGs ffload encodes (0: none; default: one per MCU for "
    "images of at least 128 px a side): crop decoders then entropy-decode only the crop's MCUs.",
)
@_num_workers_option("Encoding processes")
@click.option("--page-size", type=int, default=None, help=".beton page size in bytes (power of two >= 2 MiB).")
@click.option(
    "--shard-size",
    default=None,
    metavar="SIZE",
    help="Write DST as a directory of .beton shards of at most SIZE each (bytes, or e.g. 1GB, 512MiB) "
    "and a manifest.json; ffload.Loader(DST) reads it as one dataset. Not for LMDB, not with --resume.",
)
@click.option(
    "--overwrite",
    is_flag=True,
    help="Replace DST if it exists, atomically once the new one is complete (DST always names a "
    "complete dataset, the old or the new).",
)
@click.option(
    "--on-error",
    type=click.Choice(["fail", "skip"]),
    default="fail",
    show_default=True,
    help="fail: stop at the first bad input; skip: leave it out and list it at the end.",
)
@click.option(
    "--reencode",
    is_flag=True,
    help="Decode and re-encode every JPEG (by default a source JPEG that already is what the write "
    "mode stores is kept byte for byte).",
)
@click.option(
    "--strip-metadata",
    is_flag=True,
    help="Drop Exif/XMP/ICC/comment segments from JPEGs kept as they are (pixels unchanged).",
)
@click.option("--verify", is_flag=True, help="Decode each JPEG kept as it is once; re-encode those that fail.")
@click.option(
    "--resume",
    is_flag=True,
    help=".beton: continue an interrupted (killed) conversion to DST from its last checkpoint, with the "
    "same arguments; the result is the same bytes as an uninterrupted run. A DST URL is staged under "
    "$FFLOAD_CACHE_DIR (~/.cache/ffload) and uploaded once complete.",
)
@click.option(
    "--engine",
    type=click.Choice(["local", "ray"]),
    default="local",
    show_default=True,
    help="local: --num-workers processes here; ray: Ray tasks across a cluster (pip install 'ffload[ray]'), "
    "written here in order (the same output bytes); with --shard-size each task writes its "
    "own shards (to DST, which every node must see, or uploaded to a DST URL).",
)
@click.option(
    "--address",
    "ray_address",
    default=None,
    help="--engine ray: the cluster to join ('auto', 'ray://host:port'; default: RAY_ADDRESS or a new "
    "local Ray instance).",
)
@_storage_options_option("SRC or DST")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
@_max_pixels_option("an input image")
def convert(
    src,
    dst,
    source_kind,
    split,
    write_mode,
    max_resolution,
    jpeg_quality,
    smart_threshold,
    compress_probability,
    jpeg_restart_interval,
    num_workers,
    page_size,
    shard_size,
    overwrite,
    on_error,
    reencode,
    strip_metadata,
    verify,
    resume,
    engine,
    ray_address,
    storage_options,
    as_json,
    quiet,
    max_pixels,
):
    """Convert SRC (an ImageFolder tree or a CIFAR-10/100 python archive folder) into DST.

    The format comes from DST's suffix: .beton (FFCV v2) or .lmdb (an LMDB directory); with
    --shard-size, DST is a directory of .beton shards and a manifest. SRC (an ImageFolder) and DST
    (.beton, or a sharded prefix) may be s3:// URLs: DST is uploaded once complete.
    """
    from ffload.convert import convert_dataset  # the public name (tests replace it there)
    from ffload.convert.options import ConvertOptions
    from ffload.convert.passthrough import REASONS
    from ffload.convert.sources import detect_source

    if ray_address is not None and engine != "ray":
        raise click.UsageError("--address is the Ray cluster of --engine ray; add --engine ray")
    options = ConvertOptions(
        write_mode=write_mode,
        max_resolution=max_resolution,
        jpeg_quality=jpeg_quality,
        smart_threshold=smart_threshold,
        compress_probability=compress_probability,
        jpeg_restart_interval=jpeg_restart_interval,
        num_workers=num_workers,
        on_error=on_error,
        overwrite=overwrite,
        progress=not quiet,
        page_size=page_size,
        reencode=reencode,
        strip_metadata=strip_metadata,
        verify=verify,
        resume=resume,
        engine=engine,
        ray_address=ray_address,
        storage_options=storage_options,
        shard_size=shard_size,
        max_pixels=max_pixels,
    )
    if shard_size is not None:  # refuse a bad DST before listing SRC
        from ffload.formats.shards import check_shard_size_arguments

        check_shard_size_arguments(dst, options.shard_size, resume)
    source = detect_source(
        src,
        kind=None if source_kind == "auto" else source_kind,
        split=split,
        max_pixels=max_pixels,
        storage_options=storage_options,
    )
    report = convert_dataset(source, dst, **options.as_keywords())
    if as_json:
        click.echo(json.dumps(report.as_dict(), indent=2))
        return
    rate = report.samples / report.seconds if report.seconds else float("inf")
    click.echo(f"wrote {report.dst} ({report.format})")
    click.echo(f"  samples        {report.samples}")
    if report.resumed_from:
        click.echo(f"  resumed from   source sample {report.resumed_from}")
    if report.classes is not None:
        click.echo(f"  classes        {report.classes}")
    click.echo(f"  bytes          {report.bytes} ({_human(report.bytes)}), {report.bytes_per_sample:.0f} bytes/sample")
    click.echo(f"  seconds        {report.seconds:.2f} ({rate:.0f} images/s, {report.workers} workers)")
    if report.passed_through or report.reencoded:
        click.echo(f"  JPEG kept      {report.passed_through} (stored as in the source)")
        click.echo(f"  re-encoded     {sum(report.reencoded.values())}")
        for reason, count in report.reencoded.items():
            click.echo(f"    {reason}: {count} ({REASONS.get(reason, reason)})")
    click.echo(f"  skipped        {len(report.skipped)}")
    for name, cause in report.skipped:
        click.echo(f"    {name}: {cause}")


@main.command()
@click.argument("path", type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option(
    "--grid",
    type=click.Path(dir_okay=False),
    default=None,
    help="Write a PNG thumbnail grid of decoded samples with their labels.",
)
@click.option("--grid-count", type=click.IntRange(1, 400), default=36, show_default=True)
@click.option(
    "--sample",
    "samples",
    type=click.IntRange(min=0),
    multiple=True,
    metavar="I",
    help="Show where sample I came from (its source file, WebDataset shard and key, or row) and its "
    "label; repeat for more samples.",
)
@_max_pixels_option("a dataset with an image")
@_storage_options_option("PATH")
def inspect(path, as_json, grid, grid_count, samples, max_pixels, storage_options):
    """Describe a .beton file, an ffload LMDB database or a sharded dataset: fields, samples, sizes,
    shards, class histogram, and where the samples came from (the first few; --sample I for any).

    PATH may be the URL of a .beton on object storage (s3://bucket/key.beton, https://host/x.beton):
    only its header and tables are read (a few range requests), and --grid reads the pages of the
    samples drawn.
    """
    from ffload.describe import sample_origins, save_grid, summarize
    from ffload.formats import open_dataset

    view = open_dataset(path, max_pixels=max_pixels, storage_options=storage_options)
    info = summarize(view)
    if samples:
        info["samples_asked"] = sample_origins(view, samples)
    if grid:
        info["grid"] = {"path": grid, "images": save_grid(view, grid, count=grid_count)}
    if as_json:
        click.echo(json.dumps(info, indent=2))
        return
    click.echo(f"{info['path']}  ({info['format']})")
    click.echo(f"  samples   {info['samples']}")
    click.echo(f"  bytes     {info['bytes']} ({_human(info['bytes'])}), {info['bytes_per_sample']} bytes/sample")
    if info["format"] in ("beton", "shards"):
        click.echo(f"  page size {info['page_size']} bytes")
    if "shards" in info:
        counts = [s["samples"] for s in info["shards"]]
        sizes = [s["bytes"] for s in info["shards"]]
        click.echo(
            f"  shards    {len(counts)} (samples {min(counts, default=0)}..{max(counts, default=0)}, "
            f"{_human(min(sizes, default=0))}..{_human(max(sizes, default=0))} each)"
        )
    click.echo("  fields")
    for f in info["fields"]:
        line = f"    {f['name']:<12} {f['type']}"
        if "payload_bytes" in f and f["payload_bytes"]:
            p = f["payload_bytes"]
            line += f"  payload {p['min']}..{p['max']} bytes (mean {p['mean']})"
        if "width" in f and f["width"]:
            line += (
                f"  {f['width']['min']}..{f['width']['max']} x {f['height']['min']}..{f['height']['max']} px"
                f"  jpg {f['modes']['jpg']} / raw {f['modes']['raw']}"
            )
        click.echo(line)
    if "histogram" in info:
        click.echo(f"  classes   {info['classes']} (field {info['label_field']!r})")
        top = max(info["histogram"].values())
        names = info.get("class_names", [])
        width = min(24, max((len(n) for n in names), default=0))
        for label, count in info["histogram"].items():
            name = names[int(label)] if 0 <= int(label) < len(names) else ""
            click.echo(f"    {label:>5} {name[:width]:<{width}} {count:>8}  {'#' * max(1, round(30 * count / top))}")
    if "origins" in info:
        source = info["origins"]["source"]
        click.echo(f"  origins   {source.get('source')} ({source.get('id')} of each sample)")
        for entry in info["origins"]["first"]:
            click.echo(f"    {_origin_line(entry)}")
    for entry in info.get("samples_asked", []):
        click.echo(f"  sample {_origin_line(entry)}")
    if grid:
        click.echo(f"  grid      {grid} ({info['grid']['images']} images)")


def _origin_line(entry: dict) -> str:
    """``'12: path cat/x.jpg (label 3)'``: one sample's origin (:func:`ffload.describe.sample_origins`)."""
    origin = entry["origin"]
    where = "origin not recorded" if origin is None else "  ".join(f"{k} {v}" for k, v in origin.items())
    label = f" (label {entry['label']})" if "label" in entry else ""
    return f"{entry['index']}: {where}{label}"


@main.command()
@click.argument("path", type=click.Path())
@_num_workers_option("Decoding threads")
@click.option("--quiet", is_flag=True, help="No progress bar.")
@_max_pixels_option("a dataset with an image")
@_storage_options_option("PATH")
@click.option(
    "--cache-dir",
    type=click.Path(file_okay=False),
    default=None,
    help="A URL PATH: the folder of the page cache file (default: $FFLOAD_CACHE_DIR or ~/.cache/ffload).",
)
@click.option(
    "--max-requests",
    type=click.IntRange(min=1),
    default=None,
    help="A URL PATH: range requests in flight at most (default: the Loader's, 8).",
)
def verify(path, num_workers, quiet, max_pixels, storage_options, cache_dir, max_requests):
    """Decode every sample of PATH (.beton, LMDB, or a sharded dataset: each shard's checksum is
    checked first) and report the ones that do not decode.

    PATH may be the URL of a .beton on object storage (s3://bucket/key.beton, https://host/x.beton):
    its pages are read once each, by range requests into the Loader's page cache
    ($FFLOAD_CACHE_DIR, ~/.cache/ffload). Exits with status 1 when a sample is bad, naming each
    one and the cause.
    """
    from ffload.formats import open_dataset
    from ffload.formats.shards import check_checksums
    from ffload.system import available_cpus
    from ffload.verify import verify_dataset

    view = open_dataset(path, max_pixels=max_pixels, storage_options=storage_options)
    corrupt = check_checksums(view)  # a sharded dataset: every shard against its manifest's sha256
    if corrupt:
        for shard, cause in corrupt:
            click.echo(f"shard {shard}: {cause}", err=True)
        raise FormatError(
            f"{path}: {len(corrupt)} of {len(view.shards.paths)} shards do not match the "
            f"manifest's checksums (first: {corrupt[0][0]})",
            path=path,
        )
    # verify_dataset counts threads; "0: in this process" is one thread, decoding in order.
    threads = available_cpus() if num_workers is None else max(1, num_workers)
    problems = verify_dataset(
        view, num_workers=threads, progress=not quiet, cache_dir=cache_dir, max_requests=max_requests
    )
    if problems:
        for index, field, cause in problems:
            click.echo(f"sample {index}, field {field!r}: {cause}", err=True)
        bad = len({index for index, _, _ in problems})  # a sample with two bad fields counts once
        extra = f" ({len(problems)} problems)" if len(problems) != bad else ""
        raise FormatError(f"{path}: {bad} of {view.num_samples} samples do not decode{extra}", path=path)
    click.echo(f"{path}: all {view.num_samples} samples decode")


@main.command()
@click.argument("path", type=click.Path())
@click.argument("pattern")
@click.option(
    "--maxcount", type=click.IntRange(min=1), default=100_000, show_default=True, help="Samples per shard at most."
)
@click.option(
    "--maxsize",
    type=click.IntRange(min=1),
    default=3_000_000_000,
    show_default=True,
    help="Bytes of member data per shard at most.",
)
@click.option("--quiet", is_flag=True, help="No progress bar.")
def export(path, pattern, maxcount, maxsize, quiet):
    """Write PATH (.beton or LMDB) as WebDataset shards named PATTERN % shard_number, e.g.
    'out/train-%06d.tar' (stored JPEGs as they are, raw images as PNG, labels as .cls)."""
    from ffload.convert.export import export_webdataset
    from ffload.formats import open_dataset

    shards = export_webdataset(open_dataset(path), pattern, maxcount=maxcount, maxsize=maxsize, progress=not quiet)
    click.echo(f"{path}: {len(shards)} shard(s), {shards[0]} .. {shards[-1]}")


@main.group(cls=FfloadGroup, lazy={"cifar10-resnet9": ("ffload.recipes.cifar10_resnet9", "recipe_command")})
def recipe():
    """Training recipes built on ffload's public API."""


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
