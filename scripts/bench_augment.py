"""Deep Lake's augmentation stacks, side by side in one run: ffload vs PyTorch DataLoader + PIL
(the PIL calls torchvision's transforms make) vs DataLoader + OpenCV + Albumentations.

    python scripts/bench_augment.py                  # ~4 min on 2 cores
    python scripts/bench_augment.py --quick          # one round, fewer images
    python scripts/bench_augment.py --num-workers 16 # on a many-core machine
    python scripts/bench_augment.py --rows ffload,ffload_torchvision --repeats 11   # one ratio, more rounds

Data: the ImageNet-sized JPEG ImageFolder of :mod:`ffload.bench.datasets` (~430 px, ~98 KB at
q90), converted once to ``photos.beton`` (JPEG payloads as they are; ffload reads it, the
DataLoader baselines read the folder). Stacks (:data:`ffload.bench.config.DEEPLAKE_STACKS`):
``dl_simple`` at 128 px and ``dl_complex`` at 256 px, as Deep Lake's benchmark sizes them; all
peers output normalised float32 ``(B, 3, S, S)`` batches. Each measurement runs in its own
process; the kinds alternate over ``--repeats`` rounds and the ratios divide medians of this
run. Goals (issue "more sources, richer fields, augmentations"): ffload >= 3x DataLoader + PIL and
>= 2x DataLoader + Albumentations, both stacks.

The hardware limit, measured in the same rounds: ``decode_ceiling``, ``--num-workers`` threads
decoding the same JPEG bytes whole at full size with the fastest decoder available
(:func:`ffload.bench.peers.ceiling.default_decoder`), no augmentation. ``decode_ceiling /
dataloader_*`` is the most a loader that decodes every image at full size could reach over that
peer; ffload decodes the centre square only (its rows up to the square's last, its iMCU columns).

``ffload_torchvision`` is ffload with the same stack written as a torchvision ``v2.Compose`` and
compiled by :func:`ffload.transforms.from_torchvision` (goal: >= 0.95x the hand-written ``ffload``
pipeline); it runs where torchvision imports (the row is left out, saying so, elsewhere).

``ffload_rst`` reads ``photos_rst.beton``: the same images re-encoded by ffload at the same
quality with a restart marker per MCU (``ffload convert --reencode --jpeg-restart-interval 1``),
so that its decoders entropy-decode only the centre square's restart segments
(:mod:`ffload.codecs.restarts`); ``decode_ceiling_rst`` is the full decode of those bytes. The
peers keep reading the original files: this is the comparison a user who converts with
``--reencode`` gets (second-generation JPEGs, bytes per image of both files in the report).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from ffload.bench import (
    BenchConfig,
    compute_ratios,
    format_conditions,
    format_ratios,
    format_rows,
    measurement_conditions,
    run_rounds,
    summarize,
    write_results,
)
from ffload.bench.config import DEEPLAKE_STACKS
from ffload.bench.datasets import JPEG_QUALITY, build_photo_jpegs

STACKS = {"dl_simple": 128, "dl_complex": 256}
ROWS = (
    ("ffload", "ffload", "beton"),
    ("dataloader_pil", "dataloader_pil", "folder"),
    ("dataloader_albumentations", "dataloader_albumentations", "folder"),
    ("decode_ceiling", "decode_ceiling", "beton"),
    ("ffload_rst", "ffload", "rst"),
    ("decode_ceiling_rst", "decode_ceiling", "rst"),
    ("ffload_torchvision", "ffload_torchvision", "beton"),
)
"""``(row name, BenchConfig kind, data)``: what each row measures, on which copy of the data."""
TARGETS = {
    ("ffload", "dataloader_pil"): (">=", 3.0),
    ("ffload", "dataloader_albumentations"): (">=", 2.0),
    ("ffload_rst", "dataloader_pil"): (">=", 3.0),
    ("ffload_rst", "dataloader_albumentations"): (">=", 2.0),
    ("dataloader_albumentations", "dataloader_pil"): (">=", 0.0),
    ("ffload", "decode_ceiling"): (">=", 0.0),
    ("ffload_rst", "decode_ceiling_rst"): (">=", 0.0),
    ("ffload_rst", "ffload"): (">=", 0.0),
    ("ffload_torchvision", "ffload"): (">=", 0.95),
    ("decode_ceiling", "dataloader_pil"): (">=", 0.0),
    ("decode_ceiling", "dataloader_albumentations"): (">=", 0.0),
}


def prepare(data: str, n_images: int) -> dict[str, str]:
    """The photo ImageFolder, its JPEG ``.beton`` (source bytes kept) and its restart-marked
    re-encode in ``data`` (built once, reused): ``{'folder', 'beton', 'rst'}``."""
    from ffload.convert import convert_dataset
    from ffload.convert.sources import ImageFolderSource

    paths = {
        "folder": os.path.join(data, f"photos{n_images}"),
        "beton": os.path.join(data, f"photos{n_images}.beton"),
        "rst": os.path.join(data, f"photos{n_images}_rst.beton"),
    }
    if not os.path.isdir(paths["folder"]):
        build_photo_jpegs(paths["folder"], n_images)
    for key, extra in (("beton", {}), ("rst", {"reencode": True, "jpeg_restart_interval": 1})):
        if not os.path.isfile(paths[key]):
            convert_dataset(
                ImageFolderSource(paths["folder"]),
                paths[key],
                write_mode="jpg",
                jpeg_quality=JPEG_QUALITY,
                progress=False,
                overwrite=True,
                **extra,
            )
    return paths


def _mean_payload(path: str) -> float:
    """Mean bytes of the ``image`` payloads of the ``.beton`` at ``path``."""
    from ffload.formats import open_dataset

    return float(open_dataset(path).sizes["image"].mean())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default="runs/bench_augment_data")
    ap.add_argument("--out", default="runs/bench_augment")
    ap.add_argument("--n-images", type=int, default=512)
    ap.add_argument("--num-workers", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--quick", action="store_true", help="128 images, one round")
    ap.add_argument("--rows", default=None, help="comma-separated row names to run (default: all; see ROWS)")
    args = ap.parse_args()
    if args.quick:
        args.n_images, args.repeats = 128, 1
    t0 = time.perf_counter()
    os.makedirs(args.data, exist_ok=True)
    paths = prepare(args.data, args.n_images)
    env = measurement_conditions()
    rows_run = ROWS
    if args.rows:
        wanted = args.rows.split(",")
        unknown = sorted(set(wanted) - {r[0] for r in ROWS})
        if unknown:
            ap.error(f"unknown rows {unknown}; rows are {[r[0] for r in ROWS]}")
        rows_run = tuple(r for r in ROWS if r[0] in wanted)
    try:
        import torchvision  # noqa: F401  (the ffload_torchvision row compiles a torchvision Compose)
    except Exception as e:  # absent, or built for another torch (its native ops fail to load)
        rows_run = tuple(r for r in ROWS if r[1] != "ffload_torchvision")
        print(f"ffload_torchvision left out: torchvision does not import here ({e})", file=sys.stderr)
    sections = []
    for pipeline, size in STACKS.items():
        configs = [
            BenchConfig(
                kind=kind,
                path=paths[data],
                pipeline=pipeline,
                name=name,
                batch_size=args.batch_size,
                num_workers=args.num_workers,
                epochs=args.epochs,
                size=size,
            )
            for name, kind, data in rows_run
        ]
        print(f"== {pipeline} ({size} px): {DEEPLAKE_STACKS[pipeline]}", file=sys.stderr)
        rows = summarize(
            run_rounds(
                configs,
                args.repeats,
                args.timeout,
                lambda r: print(f"  {r['name']}: {r.get('img_s') or r.get('error')}", file=sys.stderr),
            )
        )
        ratios = compute_ratios(rows, list(TARGETS))
        sections.append(
            {
                "pipeline": pipeline,
                "size": size,
                "rows": rows,
                "ratios": ratios,
                "table": format_rows(rows),
                "ratio_table": format_ratios(ratios, TARGETS),
            }
        )
    md = [
        "# Augmentation stacks (Deep Lake's benchmark)",
        "",
        format_conditions(env),
        "",
        f"{args.n_images} ImageNet-sized JPEGs, {args.num_workers} workers, batch {args.batch_size}, "
        f"{args.repeats} interleaved round(s) of {args.epochs} epochs; {time.perf_counter() - t0:.0f} s in all. "
        f"Mean JPEG bytes per image: {_mean_payload(paths['beton']) / 1e3:.1f} KB in photos.beton (the "
        f"source files), {_mean_payload(paths['rst']) / 1e3:.1f} KB in photos_rst.beton (re-encoded, markers).",
        "",
    ]
    for s in sections:
        md += [
            f"## {s['pipeline']} at {s['size']} px: {DEEPLAKE_STACKS[s['pipeline']]}",
            "",
            s["table"],
            "",
            s["ratio_table"],
            "",
        ]
    text = "\n".join(md)
    print(text)
    write_results(args.out, text, {"environment": env, "sections": sections, "args": vars(args)})


if __name__ == "__main__":
    main()
