"""Detection / segmentation targets: what boxes and masks that follow their image cost.

    flock /tmp/ffload-bench.lock python scripts/bench_targets.py            # ~3 min on 2 cores
    python scripts/bench_targets.py --num-workers 16 --images 4096          # a many-core machine
    flock /tmp/ffload-bench.lock python scripts/bench_targets.py --mask-compression png   # PNG label maps

Data: the ImageNet-sized JPEG photos of :mod:`ffload.bench.datasets` (~430 px, q90), written once
to ``targets.beton`` with, per image, a label map ``ImageArrayField("uint8", 1)`` at the image's
size (3-6 filled rectangles; stored raw, or as PNG with ``--mask-compression png``, in
``targets<N>-png.beton``) and their boxes ``RaggedArrayField("float32", (4,))`` with labels.

Two pipelines, each measured in its own process (this script with ``--child``), alternating over
``--repeats`` rounds; the ratio divides medians of this run:

* ``image``: ``RandomResizedCropRGBImageDecoder(224)`` + ``RandomHorizontalFlip`` + ``ToTensor``,
  the other fields disabled;
* ``targets``: the same image pipeline, plus ``MaskDecoder("image")``, ``RaggedArrayDecoder`` +
  ``TransformBoxes("image")`` (dropping the boxes the crop leaves under 1 px), the labels with
  ``FollowBoxes("boxes")`` (dropped alike) and ``BoxCountDecoder`` (the pipeline of docs/fields.md).

Goal (issue "more sources, richer fields, augmentations"): ``targets`` >= 0.8x ``image`` img/s.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

CROP = 224
BATCH = 64


def prepare(data: str, n_images: int, compression: str = "raw") -> str:
    """``targets<N>.beton`` (``targets<N>-png.beton`` for PNG masks) in ``data`` (built once, reused):
    JPEG photos, masks, boxes, labels."""
    import cv2

    from ffload.bench.datasets import build_photo_jpegs
    from ffload.convert.sources import ImageFolderSource
    from ffload.formats import ImageArrayField, RaggedArrayField, RGBImageField, write_dataset

    path = os.path.join(data, f"targets{n_images}{'' if compression == 'raw' else '-' + compression}.beton")
    if os.path.isfile(path):
        return path
    folder = os.path.join(data, f"photos{n_images}")
    if not os.path.isdir(folder):
        build_photo_jpegs(folder, n_images)
    src = ImageFolderSource(folder)
    rng = np.random.default_rng(0)

    def samples():
        for i in range(len(src)):
            rgb = cv2.cvtColor(cv2.imread(os.path.join(src.root, src.describe(i))), cv2.COLOR_BGR2RGB)
            h, w = rgb.shape[:2]
            mask = np.zeros((h, w, 1), np.uint8)
            boxes = []
            for k in range(int(rng.integers(3, 7))):
                x0, y0 = int(rng.integers(0, w - 8)), int(rng.integers(0, h - 8))
                x1, y1 = int(rng.integers(x0 + 4, w + 1)), int(rng.integers(y0 + 4, h + 1))
                mask[y0:y1, x0:x1] = k + 1
                boxes.append((x0, y0, x1, y1))
            yield rgb, np.array(boxes, np.float32), np.arange(1, len(boxes) + 1), mask

    fields = {
        "image": RGBImageField("jpg", jpeg_quality=90),
        "boxes": RaggedArrayField("float32", (4,)),
        "labels": RaggedArrayField("int64"),
        "mask": ImageArrayField("uint8", 1, compression=compression),
    }
    write_dataset(path, fields, samples(), len(src))
    return path


def pipelines(kind: str) -> dict:
    """The ``image`` or ``targets`` pipelines (see the module docstring)."""
    from ffload.loaders import (
        RaggedArrayDecoder,
        RandomHorizontalFlip,
        RandomResizedCropRGBImageDecoder,
        ToTensor,
    )
    from ffload.loaders.decoders.targets import BoxCountDecoder, FollowBoxes, MaskDecoder, TransformBoxes

    image = [RandomResizedCropRGBImageDecoder((CROP, CROP)), RandomHorizontalFlip(), ToTensor()]
    if kind == "image":
        return {"image": image, "boxes": None, "labels": None, "mask": None}
    return {
        "image": image,
        "boxes": [RaggedArrayDecoder(max_length=8), TransformBoxes("image"), ToTensor()],
        "labels": [RaggedArrayDecoder(max_length=8, fill=-1), FollowBoxes("boxes", fill=-1), ToTensor()],
        "mask": [MaskDecoder("image"), ToTensor()],
        "num_boxes": [BoxCountDecoder("boxes"), ToTensor()],
    }


def child(path: str, kind: str, num_workers: int, epochs: int) -> dict:
    """img/s of ``kind`` (median of epochs 1.., epoch 0 compiles and warms up), in this process."""
    import ffload

    mapper = {"num_boxes": "boxes"} if kind == "targets" else None
    loader = ffload.Loader(
        path,
        batch_size=BATCH,
        num_workers=num_workers,
        order="random",
        seed=0,
        pipelines=pipelines(kind),
        custom_field_mapper=mapper,
    )
    rates = []
    for _ in range(epochs + 1):
        t, n = time.perf_counter(), 0
        for batch in loader:
            n += len(batch[0])
        rates.append(n / (time.perf_counter() - t))
    loader.close()
    return {"kind": kind, "img_s": statistics.median(rates[1:]), "epochs": rates}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default="runs/bench_targets_data", help="dataset folder (kept, reused)")
    ap.add_argument("--images", type=int, default=1024)
    ap.add_argument("--mask-compression", choices=["raw", "png"], default="raw", help="how the label maps are stored")
    ap.add_argument("--num-workers", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3, help="interleaved rounds")
    ap.add_argument("--epochs", type=int, default=3, help="timed epochs per run (after a warm-up one)")
    ap.add_argument("--out", default="runs/bench_targets", help="results.md and results.json go here")
    ap.add_argument("--child", nargs=2, metavar=("PATH", "KIND"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child[0], args.child[1], args.num_workers, args.epochs)))
        return
    from ffload.bench import format_conditions, measurement_conditions, write_results

    path = prepare(args.data, args.images, args.mask_compression)
    runs: dict[str, list[float]] = {"image": [], "targets": []}
    for r in range(args.repeats):
        for kind in runs:
            proc = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--child",
                    path,
                    kind,
                    "--num-workers",
                    str(args.num_workers),
                    "--epochs",
                    str(args.epochs),
                ],
                capture_output=True,
                text=True,
                check=True,
            )
            runs[kind].append(json.loads(proc.stdout.strip().splitlines()[-1])["img_s"])
            print(f"  round {r}: {kind} {runs[kind][-1]:.0f} img/s", file=sys.stderr)
    med = {k: statistics.median(v) for k, v in runs.items()}
    ratio = med["targets"] / med["image"]
    text = "\n".join(
        [
            f"# bench_targets: boxes + {args.mask_compression} masks following RandomResizedCrop(224) + flip",
            "",
            format_conditions(measurement_conditions()),
            "",
            f"{args.images} ImageNet-sized JPEGs with a label map and 3-6 boxes each; batch {BATCH}, "
            f"{args.num_workers} workers, {args.repeats} interleaved rounds of {args.epochs} timed epochs; "
            f"command: `{' '.join(sys.argv)}`",
            "",
            "| pipeline | img/s (median) | runs |",
            "|---|---|---|",
            *(f"| {k} | {med[k]:.0f} | {', '.join(f'{v:.0f}' for v in runs[k])} |" for k in runs),
            "",
            f"targets / image: **{ratio:.2f}x** (goal >= 0.8x: {'met' if ratio >= 0.8 else 'NOT met'})",
            "",
        ]
    )
    print(text)
    write_results(args.out, text, {"runs": runs, "median": med, "ratio": ratio, "conditions": measurement_conditions()})


if __name__ == "__main__":
    main()
