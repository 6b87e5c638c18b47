"""The compiled JPEG path against ffcv 1.0.2, side by side on the same ffcv-written .beton files.

    flock /tmp/ffload-bench.lock python scripts/bench_jpeg.py --workers 1,2 --out runs/bench_jpeg
    # a machine without ffcv or a package index (a GPU node): ffload and the decode ceilings alone
    python scripts/bench_jpeg.py --workers 1,4,8,16 --photos .bench_gpu/photos --groups rrc,center

Datasets (written by ffcv's ``DatasetWriter``, ``RGBImageField(write_mode='jpg', jpeg_quality=90)``,
built in ``--data`` and reused while their parameters match; where ffcv is not installed, the same
images written by ffload's writer, JPEG q90 without restart markers, and the ffcv rows left out):

* ``cifar_jpg.beton``: ``--cifar-samples`` 32x32 JPEGs, random square crops (30-100 % of the
  shorter side, INTER_AREA) of the scikit-image / scikit-learn photos (or of the images in
  ``--photos``, e.g. the PNGs ``scripts/bench_gpu_assets.sh`` writes).
* ``photos.beton``: ``--photo-samples`` ImageNet-sized JPEGs: random crops (50-100 % of each side)
  of the same photos, resized to a longer side drawn from [360, 500] px (mean ~430).
* ``photos_rst.beton``: the same images written by ffload's writer with a restart marker per MCU
  (``RGBImageField(write_mode='jpg', jpeg_quality=90, jpeg_restart_interval=1)``, ffload's
  default for images this size; otherwise the same libjpeg encode), read by all three.

Groups (each measurement in its own subprocess, rounds interleaved, ratios of medians of this run;
``ffload.bench``'s harness):

1. CIFAR-sized, ``SimpleRGBImageDecoder`` + flip, batch 512, every worker count of ``--workers``.
2. ImageNet-sized, ``RandomResizedCrop(224)`` + flip, batch 128, with the measured full-decode
   ceiling: that many threads decoding the same bytes at full size at once, same run, with the
   fastest decoder available (``decode ceiling (turbojpeg)``: TurboJPEG into a reused buffer,
   :func:`ffload.bench.peers.ceiling.turbojpeg_decoder`) and with ``cv2.imdecode`` (``decode ceiling
   (opencv)``, the ceiling of earlier runs), each with its one-thread rate.
3. ImageNet-sized, ``CenterCrop(224, ratio=224/256)`` + flip, batch 128.
4. and 5. (``rrc_rst``, ``center_rst``): groups 2 and 3 on ``photos_rst.beton``, both with the
   ceiling, which here decodes the files with restart markers (libjpeg-turbo's slower Huffman
   path); the ratio to group 2's ceiling on the files without markers is in the same run when
   both groups run.

With ``--fast-dct`` every group also runs ffload with ``fast_dct=True`` (libjpeg-turbo's fast
integer IDCT, the one ffcv 1.0.2 decodes with: ``TJFLAG_FASTDCT``), against ffcv and against
ffload's default accurate IDCT.

Then a per-image profile of the compiled path (one thread, in this process, CPU time): header,
scaled and cropped decode, resize (with the fused flip), the whole compiled call, and the process
CPU time per image of a one-worker Loader (the compiled call plus everything around it); and the
cost of a whole-image decode at each DCT scaling factor M/8 relative to 8/8 (what
``ffload.codecs.jpeg`` chooses its factors by).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import cv2
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))

from ffload.bench import (  # noqa: E402
    BenchConfig,
    compute_ratios,
    format_ratios,
    format_rows,
    run_rounds,
    summarize,
    write_results,
)
from ffload.bench.peers.ceiling import DECODERS, available_decoders, default_decoder  # noqa: E402
from ffload.bench.plan import ffcv_available  # noqa: E402

CIFAR_BATCH, PHOTO_BATCH, CROP, QUALITY = 512, 128, 224, 90
NO_MARKERS = " [photos.beton, no markers]"
"""Suffix of the rows that read the files without restart markers within a restart-marker group."""


def photos(folder: str | None = None) -> list:
    """The RGB photos of scikit-image and scikit-learn (300..640 px), or the images in ``folder``
    (sorted by name). Raises OSError naming a file OpenCV cannot read."""
    if folder is None:
        from skimage import data
        from sklearn.datasets import load_sample_images

        return [data.astronaut(), data.chelsea(), data.coffee(), data.rocket(), *load_sample_images().images]
    out = []
    for name in sorted(os.listdir(folder)):
        bgr = cv2.imread(os.path.join(folder, name), cv2.IMREAD_COLOR)
        if bgr is None:
            raise OSError(f"{os.path.join(folder, name)}: OpenCV cannot read it as an image")
        out.append(cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB))
    return out


def make_images(n: int, kind: str, folder: str | None = None, seed: int = 0):
    """``n`` images from :func:`photos` (``kind`` 'cifar': 32x32 crops; 'photos': ~430 px crops)."""
    rng = np.random.default_rng(seed)
    src = photos(folder)
    for k in range(n):
        p = src[k % len(src)]
        h, w = p.shape[:2]
        if kind == "cifar":
            c = int(min(h, w) * rng.uniform(0.3, 1.0))
            y, x = int(rng.integers(0, h - c + 1)), int(rng.integers(0, w - c + 1))
            yield cv2.resize(p[y : y + c, x : x + c], (32, 32), interpolation=cv2.INTER_AREA), k % 10
        else:
            ch, cw = int(h * rng.uniform(0.5, 1.0)), int(w * rng.uniform(0.5, 1.0))
            y, x = int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1))
            r = int(rng.integers(360, 501)) / max(ch, cw)
            size = (max(1, round(cw * r)), max(1, round(ch * r)))
            crop = p[y : y + ch, x : x + cw]
            yield cv2.resize(crop, size, interpolation=cv2.INTER_AREA if r < 1 else cv2.INTER_CUBIC), k % 10


class _Images:
    """An indexable ``(image, label)`` dataset for ffcv's writer."""

    def __init__(self, items):
        self.items = list(items)

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def write_beton(path: str, n: int, kind: str, folder: str | None) -> None:
    """Write ``n`` images of ``kind`` with ffcv's own writer (JPEG q90, label IntField), or where
    ffcv is not installed with ffload's, without restart markers."""
    if not ffcv_available():
        write_ffload_beton(path, n, kind, folder, restart_interval=0)
        return
    from ffcv.fields import IntField, RGBImageField
    from ffcv.writer import DatasetWriter

    writer = DatasetWriter(
        path, {"image": RGBImageField(write_mode="jpg", jpeg_quality=QUALITY), "label": IntField()}, num_workers=2
    )
    writer.from_indexed_dataset(_Images(make_images(n, kind, folder)), chunksize=256)


def write_ffload_beton(path: str, n: int, kind: str, folder: str | None, restart_interval: int) -> None:
    """Write ``n`` images of ``kind`` with ffload's writer: JPEG q90 with a restart marker every
    ``restart_interval`` MCUs (0: none), label IntField."""
    from ffload.formats import IntField, RGBImageField, write_dataset

    fields = {
        "image": RGBImageField(write_mode="jpg", jpeg_quality=QUALITY, jpeg_restart_interval=restart_interval),
        "label": IntField(),
    }
    write_dataset(path, fields, list(make_images(n, kind, folder)), n)


def prepare(data: str, n_cifar: int, n_photos: int, folder: str | None) -> dict:
    writer = "ffcv" if ffcv_available() else "ffload"
    params = {"cifar": n_cifar, "photos": n_photos, "quality": QUALITY, "version": 3, "writer": writer}
    params["source"] = os.path.abspath(folder) if folder else "scikit"
    marker = os.path.join(data, "bench_jpeg.json")
    paths = {
        "cifar": os.path.join(data, "cifar_jpg.beton"),
        "photos": os.path.join(data, "photos.beton"),
        "photos_rst": os.path.join(data, "photos_rst.beton"),
    }
    if os.path.isfile(marker) and json.load(open(marker)) == params:
        return paths
    os.makedirs(data, exist_ok=True)
    write_beton(paths["cifar"], n_cifar, "cifar", folder)
    write_beton(paths["photos"], n_photos, "photos", folder)
    write_ffload_beton(paths["photos_rst"], n_photos, "photos", folder, restart_interval=1)
    with open(marker, "w") as f:
        json.dump(params, f)
    return paths


def profile(path: str, restart_path: str, n: int = 512) -> dict:
    """Per-image CPU microseconds of the compiled RandomResizedCrop(224) path, one thread: header,
    scaled + cropped decode, resize (the rest of ``decode_rows``), and a full-size decode of the
    same bytes for reference; then on ``restart_path`` (the same images with restart markers):
    finding the box's segments and writing their JPEG (``restarts.segment_starts`` + ``cut``), the
    whole compiled call, and the full-size decode."""
    from numba import njit

    from ffload.codecs import jpeg, restarts
    from ffload.codecs import turbojpeg as tj
    from ffload.formats import open_dataset
    from ffload.loaders.decoders.crops import random_resized_crop_boxes
    from ffload.loaders.rng import op_salt, sample_seeds

    @njit(nogil=True)
    def headers(handle, region, ptrs, sizes, indices):
        total = 0
        for s in indices:
            jpeg._header(handle, region.ctypes.data + np.uint64(ptrs[s]), sizes[s])
            total += jpeg._get(handle, tj.TJPARAM_JPEGWIDTH)
        return total

    @njit(nogil=True)
    def decodes(handle, region, ptrs, sizes, indices, heights, widths, boxes, scratch):
        for b in range(indices.shape[0]):  # as jpeg._decode_jpeg, without the resize
            s = indices[b]
            buf = region.ctypes.data + np.uint64(ptrs[s])
            jpeg._header(handle, buf, sizes[s])
            sub = jpeg._get(handle, tj.TJPARAM_SUBSAMP)
            m, y0, x0, y1, x1 = jpeg.scaled_box(
                boxes[b, 0], boxes[b, 1], boxes[b, 2], boxes[b, 3], np.int64(heights[s]), np.int64(widths[s]), 224, 224
            )
            num, den = jpeg.scale_fraction(m)
            mcu = (jpeg._MCU_WIDTH[sub] * m + 7) // 8
            xa, cw = jpeg.crop_columns(x0, x1, mcu, (np.int64(widths[s]) * m + 7) // 8)
            if (
                jpeg._scale(handle, tj.pack2(num, den)) != 0
                or jpeg._crop(handle, tj.pack2(xa, y0), tj.pack2(cw, y1 - y0)) != 0
                or jpeg._decompress(handle, buf, sizes[s], scratch.ctypes.data, cw * 3, tj.TJPF_RGB) != 0
            ):
                return s
        return -1

    @njit(nogil=True)
    def scaled(handle, region, ptrs, sizes, indices, m, scratch):
        num, den = jpeg.scale_fraction(m)
        if jpeg._scale(handle, tj.pack2(num, den)) != 0 or jpeg._crop(handle, tj.pack2(0, 0), tj.pack2(0, 0)) != 0:
            return -2
        for s in indices:  # whole images at scale m/8
            buf = region.ctypes.data + np.uint64(ptrs[s])
            if (
                jpeg._header(handle, buf, sizes[s]) != 0
                or jpeg._decompress(handle, buf, sizes[s], scratch.ctypes.data, 0, tj.TJPF_RGB) != 0
            ):
                return s
        return -1

    @njit(nogil=True)
    def cuts(region, ptrs, sizes, indices, boxes, starts, out):
        total = 0
        for b in range(indices.shape[0]):  # as jpeg._decode_jpeg's restart path, without the decode
            s = indices[b]
            p, n = np.int64(ptrs[s]), np.int64(sizes[s])
            layout = restarts.headers(region, p, n)
            m, y0, x0, y1, x1 = jpeg.scaled_box(
                boxes[b, 0], boxes[b, 1], boxes[b, 2], boxes[b, 3], layout[2], layout[3], 224, 224
            )
            r0, r1, c0, c1, per_row, ch, cw = restarts.plan(region, p, n, layout, y0, x0, y1, x1, m, starts)
            if r0 >= 0:
                total += restarts.cut(region, p, layout[0], layout[1], starts, per_row, r0, r1, c0, c1, ch, cw, out)
        return total

    view = open_dataset(path)
    region = np.asarray(view.open_region())
    meta = view.metadata["image"]
    ptrs, sizes = view.ptrs["image"], view.sizes["image"]
    idx = np.arange(min(n, view.num_samples), dtype=np.int64)
    boxes = np.empty((len(idx), 4), np.int64)
    random_resized_crop_boxes(
        idx, meta["height"], meta["width"], sample_seeds(0, 0, idx), op_salt("p"), 0.08, 1.0, 3 / 4, 4 / 3, boxes
    )
    handle = jpeg.thread_handle()
    scratch = np.empty(int((meta["height"].astype(np.int64) * meta["width"]).max()) * 3, np.uint8)
    out = np.empty((len(idx), CROP, CROP, 3), np.uint8)

    def best(fn, reps=5):  # CPU seconds of this thread: robust to other processes on the machine
        fn()
        times = []
        for _ in range(reps):
            t = time.thread_time()
            fn()
            times.append(time.thread_time() - t)
        return min(times) / len(idx) * 1e6

    t_header = best(lambda: headers(handle, region, ptrs, sizes, idx))

    def checked(fn):  # the compiled loops return -1, or the sample whose TurboJPEG call failed
        def run():
            bad = fn()
            if bad != -1:
                raise RuntimeError(f"{path}: sample {bad}: {jpeg.failure_message(handle)}")

        return run

    t_decode = best(
        checked(lambda: decodes(handle, region, ptrs, sizes, idx, meta["height"], meta["width"], boxes, scratch))
    )
    t_all = best(lambda: jpeg.decode_batch(idx, meta, ptrs, sizes, region, boxes, np.zeros(len(idx), np.bool_), out))
    payloads = [np.ascontiguousarray(region[int(ptrs[i]) : int(ptrs[i]) + int(sizes[i])]) for i in idx]
    cv2.setNumThreads(1)
    full = {name: best(lambda d=DECODERS[name](): [d(p) for p in payloads], reps=3) for name in available_decoders()}
    scale_us = {
        m: best(checked(lambda m=m: scaled(handle, region, ptrs, sizes, idx, m, scratch)), reps=3) for m in range(1, 9)
    }
    marked = open_dataset(restart_path)
    m_region = np.asarray(marked.open_region())
    m_ptrs, m_sizes = marked.ptrs["image"], marked.sizes["image"]
    starts = np.empty(restarts.starts_size(meta["height"], meta["width"]), np.int64)
    cut_buf = np.empty(int(m_sizes.max()) + 16, np.uint8)
    t_cut = best(lambda: cuts(m_region, m_ptrs, m_sizes, idx, boxes, starts, cut_buf))
    t_all_marked = best(
        lambda: jpeg.decode_batch(
            idx, marked.metadata["image"], m_ptrs, m_sizes, m_region, boxes, np.zeros(len(idx), np.bool_), out
        )
    )
    m_payloads = [np.ascontiguousarray(m_region[int(m_ptrs[i]) : int(m_ptrs[i]) + int(m_sizes[i])]) for i in idx]
    decoder = DECODERS[default_decoder()]()
    return {
        "header_us": t_header,
        "decode_us": t_decode - t_header,
        "resize_us": t_all - t_decode,
        "compiled_total_us": t_all,
        "loader_cpu_us": loader_cpu(path),
        "full_decode_us": full,
        "restart_segments_us": t_cut,
        "restart_compiled_total_us": t_all_marked,
        "restart_full_decode_us": best(lambda: [decoder(p) for p in m_payloads], reps=3),
        "restart_bytes": float(np.mean([len(p) for p in m_payloads])),
        "bytes": float(np.mean([len(p) for p in payloads])),
        "scale_cost": {m: t / scale_us[8] for m, t in scale_us.items()},
    }


def loader_cpu(path: str, epochs: int = 3) -> float:
    """Process CPU microseconds per image of a one-worker ``ffload.Loader`` running the benchmark's
    RandomResizedCrop(224) + flip pipeline (best epoch after a warm-up one): the compiled call
    plus everything the loader does around it (boxes, flips, batching, tensors)."""
    import ffload
    import ffload.loaders as ops
    from ffload.bench import BenchConfig
    from ffload.bench.pipelines import build_pipelines

    cfg = BenchConfig(
        kind="ffload", path=path, pipeline="rrc", batch_size=PHOTO_BATCH, num_workers=1, epochs=epochs, size=CROP
    )
    loader = ffload.Loader(
        path,
        batch_size=PHOTO_BATCH,
        num_workers=1,
        order="random",
        os_cache=True,
        pipelines=build_pipelines(cfg, {n: getattr(ops, n) for n in ops.__all__}),
    )
    times = []
    for _ in range(epochs + 1):
        t = time.process_time()
        for _batch in loader:
            pass
        times.append(time.process_time() - t)
    loader.close()
    return min(times[1:]) / len(loader.indices) * 1e6


FAST = "ffload fast_dct"


def _row_name(kind: str, fast_dct: bool, decoder: str) -> str:
    if kind == "decode_ceiling":
        return f"decode ceiling ({decoder})"
    return FAST if fast_dct else kind


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", default="1,2", help="comma-separated num_workers list (default 1,2)")
    ap.add_argument("--repeats", type=int, default=3, help="interleaved rounds")
    ap.add_argument("--epochs", type=int, default=4, help="epochs per run (epoch 0 excluded)")
    ap.add_argument("--cifar-samples", type=int, default=50000)
    ap.add_argument("--photo-samples", type=int, default=1536)
    ap.add_argument("--data", default="/tmp/bench_jpeg_data", help="dataset folder (kept, reused)")
    ap.add_argument("--photos", default=None, help="a folder of images to cut the datasets from (default: scikit's)")
    ap.add_argument("--out", default="runs/bench_jpeg", help="results.md and results.json go here")
    ap.add_argument(
        "--groups", default="cifar,rrc,center,rrc_rst,center_rst", help="subset of cifar,rrc,center,rrc_rst,center_rst"
    )
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument(
        "--fast-dct",
        action="store_true",
        help="also run ffload with fast_dct=True: libjpeg-turbo's fast IDCT, which ffcv 1.0.2 uses",
    )
    args = ap.parse_args()
    workers = [int(w) for w in args.workers.split(",")]
    from ffload.codecs import jpeg

    paths = prepare(args.data, args.cifar_samples, args.photo_samples, args.photos)
    peer = ffcv_available()
    md = [
        f"# bench_jpeg: ffload (JPEG backend: {jpeg.backend()}) vs ffcv 1.0.2",
        "",
        *([] if peer else ["ffcv is not installed: files written by ffload (no restart markers), no ffcv rows.", ""]),
        f"{len(os.sched_getaffinity(0))} CPUs; workers {workers}; {args.repeats} interleaved rounds, "
        f"{args.epochs} epochs per run; command: `{' '.join(sys.argv)}`",
        "",
    ]
    plan = {
        "cifar": (
            "CIFAR-sized JPEG 32x32 q90, SimpleRGBImageDecoder + flip",
            paths["cifar"],
            "simple",
            CIFAR_BATCH,
            ["ffload", "ffcv"],
        ),
        "rrc": (
            "ImageNet-sized JPEG q90, RandomResizedCrop(224) + flip",
            paths["photos"],
            "rrc",
            PHOTO_BATCH,
            ["ffload", "ffcv", "decode_ceiling"],
        ),
        "center": (
            "ImageNet-sized JPEG q90, CenterCrop(224) + flip",
            paths["photos"],
            "center",
            PHOTO_BATCH,
            ["ffload", "ffcv"],
        ),
        "rrc_rst": (
            "ImageNet-sized JPEG q90 with restart markers, RandomResizedCrop(224) + flip",
            paths["photos_rst"],
            "rrc",
            PHOTO_BATCH,
            ["ffload", "ffcv", "decode_ceiling"],
        ),
        "center_rst": (
            "ImageNet-sized JPEG q90 with restart markers, CenterCrop(224) + flip",
            paths["photos_rst"],
            "center",
            PHOTO_BATCH,
            ["ffload", "ffcv", "decode_ceiling"],
        ),
    }
    report = {}
    for key in args.groups.split(","):
        title, path, pipeline, batch, kinds = plan[key]
        kinds = [k for k in kinds if peer or k != "ffcv"]
        variants = [
            (k, d, False)
            for k in kinds  # every decoder's ceiling; the others name the default
            for d in (available_decoders() if k == "decode_ceiling" else [default_decoder()])
        ]
        variants += [("ffload", default_decoder(), True)] if args.fast_dct else []
        configs = [
            BenchConfig(
                kind=k,
                path=path,
                pipeline=pipeline,
                batch_size=batch,
                num_workers=w,
                epochs=args.epochs,
                size=CROP,
                fast_dct=fast,
                decoder=d,
                name=_row_name(k, fast, d),
            )
            for w in workers
            for k, d, fast in variants
        ]
        if path == paths["photos_rst"]:  # the same images without markers, in the same rounds
            configs += [
                BenchConfig(
                    kind=k,
                    path=paths["photos"],
                    pipeline=pipeline,
                    batch_size=batch,
                    num_workers=w,
                    epochs=args.epochs,
                    size=CROP,
                    decoder=default_decoder(),
                    name=f"{_row_name(k, False, default_decoder())}{NO_MARKERS}",
                )
                for w in workers
                for k in ("ffload", "decode_ceiling")
            ]
        print(f"== {title}", file=sys.stderr)
        results = run_rounds(
            configs,
            args.repeats,
            args.timeout,
            lambda r: print(
                f"  {r['name']} {r['config']['num_workers']}w: {r.get('img_s', r.get('error'))}", file=sys.stderr
            ),
        )
        rows = summarize(results)
        ceilings = [f"decode ceiling ({d})" for d in available_decoders()]
        plain_ceiling = f"decode ceiling ({default_decoder()}){NO_MARKERS}"
        pairs = [
            ("ffload", "ffcv"),
            *[("ffload", c) for c in ceilings],
            *[(c, ceilings[-1]) for c in ceilings[:-1]],
            (FAST, "ffcv"),
            (FAST, "ffload"),
            ("ffload", plain_ceiling),
            ("ffload", "ffload" + NO_MARKERS),
            (f"decode ceiling ({default_decoder()})", plain_ceiling),
        ]
        ratios = compute_ratios(rows, pairs)
        scaling = {}
        for name in ("ffload", FAST):
            by_w = {r["num_workers"]: r["img_s"] for r in rows if r["name"] == name}
            scaling.update(
                {
                    f"{name} {w}w / {workers[0]}w": by_w[w] / by_w[workers[0]]
                    for w in workers[1:]
                    if by_w.get(w) and by_w.get(workers[0])
                }
            )
        md += [
            f"## {title}",
            "",
            format_rows(rows),
            "",
            format_ratios(ratios),
            "",
            "ffload scaling: " + (", ".join(f"{k} = {v:.2f}" for k, v in scaling.items()) or "-"),
            "",
        ]
        report[key] = {"rows": rows, "ratios": ratios, "scaling": scaling}
    prof = profile(paths["photos"], paths["photos_rst"])
    report["profile"] = prof
    full = prof["full_decode_us"]
    md += [
        "## Per-image profile, RandomResizedCrop(224), one thread (microseconds)",
        "",
        "| header | scaled+cropped decode | resize | compiled total | loader CPU (1 worker) | "
        + " | ".join(f"full-size decode ({name})" for name in full)
        + " |",
        "|---|---|---|---|---|" + "---|" * len(full),
        f"| {prof['header_us']:.0f} | {prof['decode_us']:.0f} | {prof['resize_us']:.0f} | "
        f"{prof['compiled_total_us']:.0f} | {prof['loader_cpu_us']:.0f} | "
        + " | ".join(f"{t:.0f}" for t in full.values())
        + " |",
        "",
        "Whole-image TurboJPEG decode at DCT scale M/8, time relative to 8/8 (same photos, one thread):",
        "",
        "| " + " | ".join(f"{m}/8" for m in prof["scale_cost"]) + " |",
        "|" + "---|" * len(prof["scale_cost"]),
        "| " + " | ".join(f"{c:.2f}" for c in prof["scale_cost"].values()) + " |",
        "",
        "The same images and boxes with a restart marker per MCU (photos_rst.beton), one thread (microseconds; "
        "bytes per image):",
        "",
        f"| finding the box's segments + writing their JPEG | compiled total | full-size decode "
        f"({default_decoder()}) | bytes (no markers) | bytes (markers) |",
        "|---|---|---|---|---|",
        f"| {prof['restart_segments_us']:.0f} | {prof['restart_compiled_total_us']:.0f} | "
        f"{prof['restart_full_decode_us']:.0f} | {prof['bytes']:.0f} | {prof['restart_bytes']:.0f} |",
        "",
    ]
    text = "\n".join(md)
    print(text)
    write_results(args.out, text, report)


if __name__ == "__main__":
    main()
