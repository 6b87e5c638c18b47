"""Conversion on Ray vs local, side by side, one file and sharded, and the driver's assembly rate.

    flock /tmp/ffload-bench.lock python scripts/bench_ray_convert.py [--repeats 3] [--per-class 40]

Converts the same ImageFolder of real photos (``build_photos_folder``: 300-500 px, ImageNet-like)
with ``--write-mode jpg --reencode`` (every image decoded and JPEG-encoded: the per-core cost of a
FFCV-style ImageNet conversion) four ways, alternating runs in fresh subprocesses:
``local`` with 1 and 2 worker processes, ``ray`` on a local Ray instance with 1 and 2 CPUs (Ray's
own processes - GCS, raylet - run on the same cores); then the same four with ``--shard-size``
(``local shards``: one process writes every shard; ``ray shards``: each Ray task writes its own,
:mod:`ffload.convert.ray_shards`). Each run is timed from the first chunk
submitted to the file closed (the Ray instance and its worker processes, with ffload imported,
are started before the clock: a long conversion amortizes them; that start time is reported apart). Then the *assembly* step alone: chunks encoded beforehand and held in Ray's object
store are fetched (``ray.get``) and written through the writer, as the driver does: its bytes/s
bounds any cluster's one-file conversion rate (a sharded one on Ray is bounded by the encoding
alone). Every output's samples (metadata without pointers, payload bytes) are compared. Prints a
markdown table with ratios and the ImageNet projection from the measured per-core rate.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from ffload.bench.conditions import format_conditions, measurement_conditions

IMAGENET_TRAIN = 1_281_167

RUNNER = r"""
import json, sys, time
from ffload.convert import convert_dataset
from ffload.convert.sources import ImageFolderSource
engine, folder, dst, workers, shard_size = sys.argv[1:6]
workers, shard_size = int(workers), (None if shard_size == "-" else shard_size)
src = ImageFolderSource(folder)
ray_start = 0.0
if engine == "ray":
    import ray
    t = time.perf_counter()
    ray.init(num_cpus=workers, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False)

    @ray.remote(num_cpus=1)
    def warm():  # start each worker process and import the encoder, as a long conversion has long done
        import ffload.convert.encode  # noqa: F401
        time.sleep(1.0)

    ray.get([warm.remote() for _ in range(workers)])
    ray_start = time.perf_counter() - t
t0 = time.perf_counter()
r = convert_dataset(src, dst, write_mode="jpg", reencode=True, num_workers=workers, engine=engine, progress=False,
                    shard_size=shard_size, page_size=1 << 21 if shard_size else None)
print(json.dumps({"seconds": time.perf_counter() - t0, "samples": r.samples, "bytes": r.bytes,
                  "ray_start": ray_start}))
"""

ASSEMBLY = r"""
import json, sys, time
import ray
from ffload.convert.options import image_fields
from ffload.convert.encode import SampleEncoder, encoded_chunks
from ffload.convert.sources import ImageFolderSource
from ffload.formats import dataset_writer
folder, dst = sys.argv[1:3]
src = ImageFolderSource(folder)
fields = image_fields("jpg")
flist = list(fields.values())
chunks = [c for c, _ in encoded_chunks(SampleEncoder(src, flist, passthrough=False), 0)]
ray.init(num_cpus=1, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False)
refs = [ray.put(c) for c in chunks]
del chunks
payload = 0
t0 = time.perf_counter()
with dataset_writer(dst, fields, len(src)) as writer:
    i = 0
    for ref in refs:
        chunk = ray.get(ref)
        payload += int(chunk.sizes.sum())
        for _, metas, payloads in chunk.samples(flist, None):
            writer.add(i, metas, payloads)
            i += 1
seconds = time.perf_counter() - t0
print(json.dumps({"seconds": seconds, "samples": i, "payload_bytes": payload}))
"""


def run(code: str, *args) -> dict:
    out = subprocess.run([sys.executable, "-c", code, *map(str, args)], check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def content_digest(path: str) -> str:
    """sha256 of a dataset's samples: metadata rows with payload pointers zeroed, then payloads."""
    import hashlib

    from ffload.formats import open_dataset

    view = open_dataset(path)
    region, meta = view.open_region(), view.metadata.copy()
    names = [name for name, f in view.fields.items() if f.has_payload]
    for name in names:
        view.fields[name].get_pointer(meta[name])[...] = 0
    digest = hashlib.sha256(repr(meta.tolist()).encode())  # values: the two layouts' dtypes pad differently
    for i in range(view.num_samples):
        for name in names:
            digest.update(view.payload(name, i, region))
    return digest.hexdigest()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--folder", help="ImageFolder to convert (default: build the demo photos)")
    ap.add_argument("--per-class", type=int, default=40, help="demo photos per class (without --folder)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--nodes", type=int, nargs="+", default=[1, 4, 16, 64])
    ap.add_argument("--cores-per-node", type=int, default=32)
    ap.add_argument(
        "--imagenet-kib",
        type=float,
        default=110.0,
        help="stored KiB per ImageNet image (its JPEGs kept as they are: ~138 GB / 1.28 M)",
    )
    ap.add_argument("--shard-size", default="16MB", help="shard size of the sharded runs (2 MiB pages)")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="bench_ray_convert_")
    folder = args.folder
    if folder is None:
        from ffload.convert.demo_data import build_photos_folder

        folder = os.path.join(work, "photos")
        build_photos_folder(folder, n_per_class=args.per_class)
    configs = [(e, w, s) for s in ("", " shards") for w in (1, 2) for e in ("local", "ray")]

    def output(engine, workers, sharded):
        return os.path.join(work, f"{engine}{workers}{'.shards' if sharded else '.beton'}")

    runs = {c: [] for c in configs}
    for _ in range(args.repeats):
        for engine, workers, sharded in configs:
            dst = output(engine, workers, sharded)
            subprocess.run(["rm", "-rf", dst], check=True)
            runs[(engine, workers, sharded)].append(
                run(RUNNER, engine, folder, dst, workers, args.shard_size if sharded else "-")
            )
    n = runs[configs[0]][0]["samples"]
    rate = {c: n / statistics.median(r["seconds"] for r in v) for c, v in runs.items()}
    same = len({open(output(e, w, s), "rb").read() for e, w, s in configs if not s}) == 1
    same_samples = len({content_digest(output(*c)) for c in configs}) == 1
    assembly = [run(ASSEMBLY, folder, os.path.join(work, f"asm{k}.beton")) for k in range(args.repeats)]
    asm = min(assembly, key=lambda a: a["seconds"])
    asm_bps = asm["payload_bytes"] / asm["seconds"]
    bytes_per_image = asm["payload_bytes"] / asm["samples"]
    per_core = rate[("ray", 1, "")]

    conditions = measurement_conditions()
    print(f"\nconvert {folder} ({n} photos, write-mode jpg --reencode), median of {args.repeats} alternating runs")
    print(format_conditions(conditions))
    print(f"one-file outputs byte-identical: {same}; all 8 outputs hold the same samples: {same_samples}")
    print(
        "| engine | processes | img/s | vs local same processes | vs same engine, 1 process | ray start + warm workers s |"
    )
    print("|---|---|---|---|---|---|")
    for c in configs:
        engine, workers, sharded = c
        starts = [r["ray_start"] for r in runs[c]]
        print(
            f"| {engine}{sharded} | {workers} | {rate[c]:.1f} | "
            f"{rate[c] / rate[('local', workers, sharded)]:.2f}x | "
            f"{rate[c] / rate[(engine, 1, sharded)]:.2f}x | "
            f"{statistics.median(starts):.1f} |"
        )
    driver_img_s = asm_bps / bytes_per_image
    print(
        f"\nassembly (ray.get + writer, best of {args.repeats}): {asm_bps / 2**20:.0f} MiB/s of payload "
        f"= {driver_img_s:.0f} img/s at {bytes_per_image / 1024:.0f} KiB/img"
    )
    imagenet_img_s = asm_bps / (args.imagenet_kib * 1024)
    print(
        f"\nImageNet-1k train ({IMAGENET_TRAIN} images, similar pixel counts) at {per_core:.1f} img/s per core "
        f"(ray, 1 CPU), {args.cores_per_node} cores/node; driver cap {imagenet_img_s:.0f} img/s at "
        f"{args.imagenet_kib:.0f} KiB/img:"
    )
    print("| nodes | encode-bound min | driver-bound min | projected min, one file | projected min, sharded |")
    print("|---|---|---|---|---|")
    projection = []
    for nodes in args.nodes:
        encode_min = IMAGENET_TRAIN / (per_core * nodes * args.cores_per_node) / 60
        driver_min = IMAGENET_TRAIN / imagenet_img_s / 60
        projection.append({"nodes": nodes, "encode_min": encode_min, "driver_min": driver_min})
        print(
            f"| {nodes} | {encode_min:.1f} | {driver_min:.1f} | {max(encode_min, driver_min):.1f} | {encode_min:.1f} |"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "conditions": conditions,
                    "samples": n,
                    "identical": same,
                    "same_samples": same_samples,
                    "img_s": {f"{e}{w}{s}": v for (e, w, s), v in rate.items()},
                    "runs": {f"{e}{w}{s}": v for (e, w, s), v in runs.items()},
                    "assembly": assembly,
                    "projection": projection,
                },
                f,
                indent=2,
            )
    subprocess.run(["rm", "-rf", work])


if __name__ == "__main__":
    main()
