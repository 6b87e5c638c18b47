"""Cold-epoch loading from object storage: ffload's remote Loader vs WebDataset, same server, same JPEGs.

    pip install webdataset   # the peer
    flock /tmp/ffload-bench.lock python scripts/bench_remote.py [--per-class 300] [--workers 2] [--batch-size 64]
        [--size 128] [--repeats 3] [--out runs/bench_remote.json]

1. Builds an ImageFolder of views of the bundled photos (``ffload.convert.demo_data``), converts it to
   ``train.beton`` with ``write_mode='jpg'`` (source JPEGs stored as they are) and exports that file as
   WebDataset tar shards (``ffload export``: the same JPEG bytes, labels as ``.cls``).
2. Starts an S3 server (moto, ``tests/s3_server.py``) in a process of its own on 127.0.0.1 and uploads both.
3. Runs, alternating and each in a fresh Python process (nothing cached: a new cache folder, a new process):

   * ``ffload``: ``Loader('s3://bench/train.beton', order='quasi_random', num_workers=W)``, decoding with
     ``CenterCropRGBImageDecoder((S, S), 224/256)``, whole 8 MiB pages by range GETs into its page cache;
   * ``webdataset``: ``DataLoader(WebDataset(shard URLs, shardshuffle=True).shuffle(1000).map(decode),
     batch_size=B, num_workers=W)``, shards streamed through fsspec (``gopen_schemes['s3']``), each JPEG
     decoded by ``cv2.imdecode`` and center-cropped/resized the same way (INTER_AREA) -- WebDataset's
     counterpart of a quasi-random order (shuffled shards, a shuffle buffer).

   Each time is the whole cold epoch: from building the loader (opening the dataset, starting workers) to its
   last batch. ffload's process first compiles its pipelines on the local copy (numba compiles per process;
   a training job pays that once, not per epoch), outside the time. The server counts the GET requests of each run; ffload's are compared with its bound, one per
   page plus 10. Reported: medians of img/s, the ratio ffload / webdataset, GETs; and, for reference, the same
   ffload loader over the local file (``ffload-local``: ``os_cache=False``, the same page pool read with
   ``preadv`` from the page cache: the rate without the network).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

RUNNER = r"""
import json, os, sys, time
kind, url, workers, batch, size, cache, warm = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6], sys.argv[7]
import numpy as np, torch
if kind.startswith("ffload"):
    import ffload
    from ffload.loaders import CenterCropRGBImageDecoder, IntDecoder, ToTensor
    def pipelines():
        return {"image": [CenterCropRGBImageDecoder((size, size), 224 / 256), ToTensor()],
                "label": [IntDecoder(), ToTensor()]}
    # compile the pipelines in this process first, on the local copy (numba's dispatchers live in memory)
    with ffload.Loader(warm, batch_size=batch, num_workers=workers, pipelines=pipelines(), os_cache=False,
                       order="quasi_random", cache_limit=1 << 30) as local:  # writable region, as remote
        next(iter(local))
t0 = time.perf_counter()
if kind.startswith("ffload"):
    if kind == "ffload-local":  # the same page pool over the local file (os_cache=False)
        url = warm
    loader = ffload.Loader(url, batch_size=batch, num_workers=workers, order="quasi_random", seed=0,
                           cache_dir=cache, cache_limit=1 << 30, pipelines=pipelines(), os_cache=False)
    n = sum(len(labels) for _, labels in loader)
    gets = loader.memory.source.requests if loader.remote else None
else:
    import cv2, fsspec, webdataset as wds
    gopen = sys.modules["webdataset.gopen"]
    gopen.gopen_schemes["s3"] = lambda u, mode="rb", bufsize=8192, **kw: fsspec.open(u, mode).open()
    def decode(sample):
        img = cv2.imdecode(np.frombuffer(sample["jpg"], np.uint8), cv2.IMREAD_COLOR_RGB)
        h, w = img.shape[:2]
        side = int(min(h, w) * 224 / 256)
        y, x = (h - side) // 2, (w - side) // 2
        out = cv2.resize(img[y:y + side, x:x + side], (size, size), interpolation=cv2.INTER_AREA)
        return torch.from_numpy(out), int(sample["cls"])
    urls = json.loads(url)
    ds = wds.WebDataset(urls, shardshuffle=len(urls), empty_check=False).shuffle(1000).map(decode)
    loader = torch.utils.data.DataLoader(ds, batch_size=batch, num_workers=workers)
    n = sum(len(labels) for _, labels in loader)
    gets = None
print(json.dumps({"seconds": time.perf_counter() - t0, "samples": n, "gets": gets}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--per-class", type=int, default=300)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--size", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    from s3_server import counters

    from ffload.bench.conditions import format_conditions, measurement_conditions
    from ffload.convert import convert_dataset
    from ffload.convert.demo_data import build_photos_folder
    from ffload.convert.export import export_webdataset
    from ffload.formats import open_dataset

    work = tempfile.mkdtemp(prefix="ffload-bench-remote-")
    folder = os.path.join(work, "photos")
    build_photos_folder(folder, n_per_class=args.per_class)
    beton = os.path.join(work, "train.beton")
    convert_dataset(folder, beton, write_mode="jpg", jpeg_quality=90, num_workers=args.workers, progress=False)
    view = open_dataset(beton)
    shards = export_webdataset(
        view, os.path.join(work, "wds", "train-%06d.tar"), maxcount=256, maxsize=64 << 20, progress=False
    )
    server = subprocess.Popen(
        [sys.executable, os.path.join(HERE, "..", "tests", "s3_server.py")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        endpoint = server.stdout.readline().strip()
        env = dict(
            os.environ,
            AWS_ACCESS_KEY_ID="bench",
            AWS_SECRET_ACCESS_KEY="bench",
            AWS_DEFAULT_REGION="us-east-1",
            AWS_ENDPOINT_URL_S3=endpoint,
            AWS_ENDPOINT_URL=endpoint,
        )
        os.environ.update(env)
        from ffload.storage import open_filesystem, upload_file

        fs, _ = open_filesystem("s3://bench/x")
        fs.mkdir("bench")
        upload_file(beton, "s3://bench/train.beton")
        urls = []
        for shard in shards:
            upload_file(shard, f"s3://bench/wds/{os.path.basename(shard)}")
            urls.append(f"s3://bench/wds/{os.path.basename(shard)}")
        results: dict[str, list[dict]] = {"ffload": [], "webdataset": [], "ffload-local": []}
        for r in range(args.repeats):
            for kind in results:
                target = "s3://bench/train.beton" if kind == "ffload" else json.dumps(urls)
                before = counters(endpoint)["gets"]
                out = subprocess.run(
                    [
                        sys.executable,
                        "-c",
                        RUNNER,
                        kind,
                        target,
                        str(args.workers),
                        str(args.batch_size),
                        str(args.size),
                        os.path.join(work, f"cache-{r}"),
                        beton,
                    ],
                    env=env,
                    capture_output=True,
                    text=True,
                )
                if out.returncode:
                    raise SystemExit(f"{kind} run failed:\n{out.stderr[-3000:]}")
                run = json.loads(out.stdout.strip().splitlines()[-1])
                run["server_gets"] = counters(endpoint)["gets"] - before
                run["img_per_s"] = run["samples"] / run["seconds"]
                results[kind].append(run)
                print(
                    f"{kind:<11} run {r}: {run['samples']} images in {run['seconds']:.2f} s = "
                    f"{run['img_per_s']:.0f} img/s, {run['server_gets']} GETs",
                    flush=True,
                )
    finally:
        server.stdin.close()
        server.wait(timeout=30)
    pages = view.data_size // view.page_size
    med = {k: statistics.median(r["img_per_s"] for r in v) for k, v in results.items()}
    summary = {
        "images": view.num_samples,
        "beton_bytes": view.data_size,
        "page_size": view.page_size,
        "shards": len(shards),
        "workers": args.workers,
        "batch_size": args.batch_size,
        "size": args.size,
        "img_per_s": med,
        "ratio_ffload_over_webdataset": med["ffload"] / med["webdataset"],
        "remote_over_local": med["ffload"] / med["ffload-local"],
        "ffload_gets": [r["server_gets"] for r in results["ffload"]],
        "ffload_get_bound": pages + 10,
        "webdataset_gets": [r["server_gets"] for r in results["webdataset"]],
        "runs": results,
        "conditions": measurement_conditions(),
    }
    print(format_conditions(summary["conditions"]))
    print(
        f"{view.num_samples} JPEGs, {view.data_size / 2**20:.1f} MiB .beton ({view.page_size >> 20} MiB pages), "
        f"{len(shards)} shards; {args.workers} workers, batch {args.batch_size}, {args.size}x{args.size}"
    )
    print(
        f"cold quasi-random epoch: ffload {med['ffload']:.0f} img/s, WebDataset {med['webdataset']:.0f} img/s, "
        f"ratio {summary['ratio_ffload_over_webdataset']:.2f}x"
    )
    print(
        f"reference, ffload on the local file (os_cache=False, page cache warm): {med['ffload-local']:.0f} img/s; "
        f"remote / local {med['ffload'] / med['ffload-local']:.2f}"
    )
    print(
        f"ffload GETs per cold epoch {summary['ffload_gets']} (bound: {pages} pages + 10 = {pages + 10}); "
        f"WebDataset GETs {summary['webdataset_gets']}"
    )
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(summary, f, indent=2)


if __name__ == "__main__":
    main()
