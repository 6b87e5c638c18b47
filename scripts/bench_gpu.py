"""One run on a GPU node: the device decoders against nvJPEG alone, ResNet-50 fed by ffload against
the model on GPU-resident data and against torchvision's DataLoader, the ResNet-9 recipe's
data wait, a profiler trace of copy/compute overlap, then the CPU loader's scaling from 1 to all
cores. Every section writes into ``--out/results.json`` as it finishes, so a run cut short keeps
what it measured.

    # on the GPU machine (no package index: the wheels and photos come along, see --wheels, --photos;
    # scripts/bench_gpu_assets.sh builds .bench_gpu/ beforehand, where an index is reachable)
    python scripts/bench_gpu.py --out $OUT --wheels .bench_gpu/wheels --photos .bench_gpu/photos
    # anywhere, a CPU-only dry run of the same code (sections that need CUDA say so and skip)
    python scripts/bench_gpu.py --out runs/bench_gpu --quick

Sections (``--sections``, in this order; ``--budget`` seconds for the whole run, each section
capped so that the later ones still run):

``env``      versions, CPUs (affinity), GPU, which device JPEG backends initialise.
``data``     ``--images`` ImageNet-sized JPEGs (q90, sides 300-560 px, mean about 110 KB, like
             ImageNet's train set) cut and scaled from ``--photos``, written as a ``.beton``.
``decode``   nvJPEG (``torchvision.io.decode_jpeg(list, device='cuda')``) and nvImageCodec batch
             decode alone, full images, batches of 256: the decoder's own rate, the limit the
             loader's device path is measured against.
``loader``   the loader alone, ``RandomResizedCropRGBImageDecoder(224)`` + flip, batch 256, output
             ``(B, 3, 224, 224) float16`` channels_last on the GPU: CPU path (all cores), device
             path (each backend), hybrid (``device_share='auto'``); and the device path's pixels
             against the CPU path's for the same seed (mean absolute difference, grey levels).
``train``    ResNet-50, 224 px, bf16 autocast, channels_last, batch 256, SGD: img/s on one batch
             resident on the GPU, fed by ffload (CPU path; hybrid with all cores and with 8),
             fed by torchvision's ``DataLoader`` (PIL decode, ``RandomResizedCrop``, all cores).
``profile``  a ``torch.profiler`` trace of six fed steps (``trace.json.gz``) and the share of the
             loader's GPU work that overlapped the model's.
``recipe``   the ResNet-9 CIFAR recipe (``ffload.recipes.run.run_recipe``, 3 epochs, CIFAR-shaped
             images cut from the photos): epoch time and data-wait fraction.
``scale``    the CPU loader at 1, 2, 4, 8, 12, 16 (up to the usable CPUs) workers: raw 32x32
             (random order + flip, batch 256, ImageNet-1k-length epochs, 5,005 batches, samples
             repeated: the job limits, not the epoch, bound auto's size, 42 at 16 workers, 170
             from the second epoch once its jobs are measured fast) with ``batches_per_job``
             "auto" and each of ``--scale-jobs`` (the job size is what limits raw at many
             workers; every slot filled once before timing); the same in
             CIFAR-10-length epochs (50,000 samples, 196 batches) with "auto" and each of
             ``--scale-cifar-jobs`` (auto's epoch rule: 6 per job at 16 workers before its jobs
             are measured, 10 once they are measured fast; each run's last size is recorded), and
             "auto" through the process cache (``os_cache=False``); JPEG
             ``RandomResizedCrop(224)`` + flip; each against linear scaling of its 1-worker rate.

The ratios the issue's goals name are in ``results.json["goals"]``.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import io
import json
import os
import platform
import sys
import tempfile
import time
import traceback
import zipfile
from pathlib import Path

SECTIONS = ("env", "data", "decode", "loader", "train", "profile", "recipe", "scale")


def install_wheels(folder: str, target: str) -> list[str]:
    """Unpack the wheels in ``folder`` into ``target`` and put it first on ``sys.path`` (a wheel is
    a zip of its installed tree; no pip or index needed). Returns the wheel names."""
    names = sorted(p for p in os.listdir(folder) if p.endswith(".whl"))
    for name in names:
        with zipfile.ZipFile(os.path.join(folder, name)) as z:
            z.extractall(target)
    sys.path.insert(0, target)
    return names


class Run:
    """The run's results, deadline and log: ``results.json`` rewritten after every section."""

    def __init__(self, out: Path, budget: float):
        self.out, self.start, self.budget = out, time.perf_counter(), budget
        self.results: dict = {"sections": {}, "goals": {}, "errors": {}}
        out.mkdir(parents=True, exist_ok=True)

    def left(self) -> float:
        return self.budget - (time.perf_counter() - self.start)

    def log(self, line: str) -> None:
        print(f"[{time.perf_counter() - self.start:6.1f}s] {line}", flush=True)

    def save(self) -> None:
        tmp = self.out / "results.json.tmp"
        tmp.write_text(json.dumps(self.results, indent=2, default=str))
        os.replace(tmp, self.out / "results.json")

    def section(self, name: str, fn, *args):
        self.log(f"== {name} ({self.left():.0f} s left)")
        t0 = time.perf_counter()
        try:
            value = fn(*args)
        except Exception as e:  # a section that fails leaves the others their time
            self.results["errors"][name] = f"{type(e).__name__}: {e}\n{traceback.format_exc()[-3000:]}"
            self.log(f"{name} failed: {type(e).__name__}: {e}")
            value = None
        self.results["sections"][name] = {"seconds": round(time.perf_counter() - t0, 1), "result": value}
        self.save()
        return value


# ---------------------------------------------------------------- data


def load_photos(folder: str | None):
    """RGB ``uint8`` photos: from ``folder`` (any image Pillow reads), else the ones scikit-image
    and scikit-learn ship."""
    import numpy as np
    from PIL import Image

    if folder:
        return [np.asarray(Image.open(os.path.join(folder, f)).convert("RGB")) for f in sorted(os.listdir(folder))]
    from skimage import data
    from sklearn.datasets import load_sample_images

    return [*load_sample_images().images, data.astronaut(), data.chelsea(), data.coffee(), data.rocket()]


def imagenet_like(photos, n: int, seed: int = 0):
    """``n`` RGB images with sides 300-560 px: random crops of the photos, scaled, each a little
    different in colour so that the JPEGs differ."""
    import cv2
    import numpy as np

    rng = np.random.default_rng(seed)
    out = []
    for k in range(n):
        p = photos[k % len(photos)]
        h, w = p.shape[:2]
        ch, cw = int(rng.integers(h // 2, h + 1)), int(rng.integers(w // 2, w + 1))
        y, x = int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1))
        th, tw = int(rng.integers(300, 561)), int(rng.integers(300, 561))
        img = cv2.resize(p[y : y + ch, x : x + cw], (tw, th), interpolation=cv2.INTER_LINEAR)
        gain = rng.uniform(0.85, 1.15, size=3)
        out.append(np.clip(img * gain, 0, 255).astype(np.uint8))
    return out


def cifar_like(photos, n: int, seed: int = 1):
    """``(n, 32, 32, 3) uint8`` crops of the photos, and labels 0..9."""
    import cv2
    import numpy as np

    rng = np.random.default_rng(seed)
    images = np.empty((n, 32, 32, 3), np.uint8)
    for k in range(n):
        p = photos[k % len(photos)]
        h, w = p.shape[:2]
        side = int(rng.integers(32, min(h, w) // 2))
        y, x = int(rng.integers(0, h - side + 1)), int(rng.integers(0, w - side + 1))
        images[k] = cv2.resize(p[y : y + side, x : x + side], (32, 32), interpolation=cv2.INTER_AREA)
    return images, rng.integers(0, 10, n)


def build_data(run: Run, args, work: Path) -> dict:
    import numpy as np

    from ffload.formats import IntField, RGBImageField, open_dataset, write_dataset

    photos = load_photos(args.photos)
    images = imagenet_like(photos, args.images)
    path = work / "imagenet_like.beton"
    t0 = time.perf_counter()
    rows = ((img, k % 1000) for k, img in enumerate(images))
    write_dataset(
        str(path), {"image": RGBImageField(write_mode="jpg", jpeg_quality=90), "label": IntField()}, rows, len(images)
    )
    view = open_dataset(str(path))
    sizes = np.asarray(view.sizes["image"], np.float64)
    small, labels = cifar_like(photos, args.cifar)
    raw = work / "raw32.beton"
    write_dataset(
        str(raw),
        {"image": RGBImageField(write_mode="raw"), "label": IntField()},
        zip(small, labels.tolist()),
        len(small),
    )
    run.data = {"jpeg": str(path), "raw": str(raw), "photos": photos, "cifar": (small, labels)}
    run.payloads = [np.array(view.payload("image", i)) for i in range(len(images))]
    return {
        "images": len(images),
        "mean_kb": round(sizes.mean() / 1e3, 1),
        "mean_pixels": int(np.mean([i.shape[0] * i.shape[1] for i in images])),
        "raw32_images": len(small),
        "write_seconds": round(time.perf_counter() - t0, 1),
    }


# ---------------------------------------------------------------- environment


def environment(run: Run) -> dict:
    import numba
    import numpy as np
    import torch

    from ffload.loaders.device import codecs

    info = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "numba": numba.__version__,
        "cpus_affinity": len(os.sched_getaffinity(0)),
        "cpu_count": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "cuda": torch.cuda.is_available(),
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
        info["cuda_version"] = torch.version.cuda
    backends = {}
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    for name in codecs.BACKENDS:
        try:
            codecs.select(device, name)
            backends[name] = "ok"
        except Exception as e:
            backends[name] = f"{type(e).__name__}: {e}"
    info["device_backends"] = backends
    with contextlib.suppress(ImportError):
        import torchvision

        info["torchvision"] = torchvision.__version__
    with contextlib.suppress(ImportError):
        from nvidia import nvimgcodec

        info["nvimgcodec"] = nvimgcodec.__version__
    return info


def _cpu_model() -> str:
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor()


# ---------------------------------------------------------------- measuring helpers


def sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def loader_rate(loader, seconds: float, min_batches: int = 4) -> float:
    """Images per second for ``seconds`` (at least ``min_batches``), over as many epochs as that
    takes, after a warm-up: the first batch, then as many as fill every job slot once (``slots``
    times ``batches_per_job`` of ``loader.stats()``, at most an epoch), so that no slot's first
    touch of its buffers (134 MB for a job of 170 raw 32x32 batches) is timed; the device
    synchronised at both ends."""
    n, t0, warm = 0, None, None
    while True:
        for batch in loader:
            if warm is None:
                stats = loader.stats()
                warm = min(stats["slots"] * stats["batches_per_job"], len(loader) - 1)
            if t0 is None:
                if warm > 0:
                    warm -= 1
                    continue
                sync()
                t0 = time.perf_counter()
                done = 0
                continue
            n += len(batch[0])
            done += 1
            if done >= min_batches and time.perf_counter() - t0 >= seconds:
                sync()
                return n / (time.perf_counter() - t0)


def jpeg_pipeline(device: str | None, share="auto", backend="auto", flip: bool = True):
    """RandomResizedCrop(224) + flip -> ``(B, 3, 224, 224) float16`` channels_last (on the GPU when
    there is one), either decoded on the CPU (``device=None``) or on ``device``."""
    import numpy as np
    import torch

    from ffload.loaders import (
        NormalizeImage,
        RandomHorizontalFlip,
        RandomResizedCropRGBImageDecoder,
        ToDevice,
        ToTensor,
        ToTorchImage,
    )

    mean, std = np.array([0.485, 0.456, 0.406]) * 255, np.array([0.229, 0.224, 0.225]) * 255
    flips = [RandomHorizontalFlip()] if flip else []
    if device is None:
        target = "cuda" if torch.cuda.is_available() else "cpu"
        ops = [RandomResizedCropRGBImageDecoder(224), *flips, ToTensor(), ToDevice(target)]
    else:
        ops = [
            RandomResizedCropRGBImageDecoder(224, device=device, device_share=share, device_backend=backend),
            *flips,
        ]
    return [*ops, ToTorchImage(channels_last=True), NormalizeImage(mean, std, np.float16)]


def label_pipeline():
    import torch

    from ffload.loaders import IntDecoder, Squeeze, ToDevice, ToTensor

    return [IntDecoder(), ToTensor(), ToDevice("cuda" if torch.cuda.is_available() else "cpu"), Squeeze()]


def make_loader(path, image_ops, num_workers, batch_size=256, **kwargs):
    from ffload import Loader

    return Loader(
        path,
        batch_size=batch_size,
        num_workers=num_workers,
        order="random",
        drop_last=True,
        seed=0,
        pipelines={"image": image_ops, "label": label_pipeline()},
        **kwargs,
    )


def flip_supported(run: Run) -> bool:
    """Whether a flip may follow a device decoder here (it is fused into the decoder)."""
    if getattr(run, "_flip", None) is None:
        try:
            make_loader(run.data["jpeg"], jpeg_pipeline("cpu", share=1.0), 1).close()
            run._flip = True
        except Exception as e:
            run.log(f"flip after a device decoder refused ({e}); device pipelines run without it, and so do all")
            run._flip = False
    return run._flip


# ---------------------------------------------------------------- decode alone


def decode_alone(run: Run, args) -> dict:
    import torch

    if not torch.cuda.is_available():
        return {"skipped": "needs CUDA"}
    payloads = [torch.from_numpy(p) for p in run.payloads]
    out = {}
    with contextlib.suppress(ImportError):
        from torchvision.io import ImageReadMode, decode_jpeg

        def nvjpeg(batch):
            return decode_jpeg(batch, device="cuda", mode=ImageReadMode.RGB)

        out["nvjpeg_torchvision"] = _decode_rate(nvjpeg, payloads, args.decode_seconds)
    with contextlib.suppress(ImportError):
        from nvidia import nvimgcodec

        decoder = nvimgcodec.Decoder(device_id=0)
        params = nvimgcodec.DecodeParams(apply_exif_orientation=False, color_spec=nvimgcodec.ColorSpec.SRGB)

        def nvimg(batch):
            stream = torch.cuda.current_stream().cuda_stream
            return decoder.decode([nvimgcodec.CodeStream(p.numpy()) for p in batch], params=params, cuda_stream=stream)

        out["nvimgcodec"] = _decode_rate(nvimg, payloads, args.decode_seconds)
    return out


def _decode_rate(fn, payloads, seconds: float, batch: int = 256) -> float:
    fn(payloads[:batch])  # warm-up: the decoder's state and buffers
    sync()
    n, k, t0 = 0, 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds or n < 4 * batch:
        chunk = payloads[k : k + batch] if k + batch <= len(payloads) else payloads[:batch]
        k = (k + batch) % max(1, len(payloads) - batch)
        fn(chunk)
        n += len(chunk)
    sync()
    return round(n / (time.perf_counter() - t0), 1)


# ---------------------------------------------------------------- loader alone


def parse_cases(text: str, cores: int) -> list[tuple[str, str, int, int]]:
    """``"kind:workers[:cpus],..."`` -> ``[(name, kind, workers, cpus)]``. ``kind``: ``cpu`` (the
    compiled CPU path), ``torchvision`` / ``nvimgcodec`` (all rows on the GPU with that backend),
    ``hybrid`` (``device_share='auto'``, the best backend), ``dataloader`` (training only);
    ``workers`` may be ``all`` or ``auto`` (``num_workers="auto"``), ``cpus`` ``all``; ``cpus`` restricts the process's affinity for the case."""
    out = []
    for item in filter(None, text.split(",")):
        kind, *rest = item.split(":")
        workers = cores if not rest or rest[0] == "all" else rest[0] if rest[0] == "auto" else min(cores, int(rest[0]))
        n_cpus = cores if len(rest) < 2 or rest[1] == "all" else min(cores, int(rest[1]))
        name = f"{kind}_{workers}w" + (f"_{n_cpus}cpu" if n_cpus != cores else "")
        out.append((name, kind, workers, n_cpus))
    return out


def image_ops(kind: str, flip: bool):
    """The case's image pipeline (:func:`jpeg_pipeline`)."""
    if kind == "cpu":
        return jpeg_pipeline(None, flip=flip)
    if kind == "hybrid":
        return jpeg_pipeline("cuda", "auto", "auto", flip)
    return jpeg_pipeline("cuda", 1.0, kind, flip)


@contextlib.contextmanager
def cpus(n: int):
    """Restrict the process to its first ``n`` CPUs for the block."""
    affinity = os.sched_getaffinity(0)
    os.sched_setaffinity(0, sorted(affinity)[:n])
    try:
        yield
    finally:
        os.sched_setaffinity(0, affinity)


def loader_alone(run: Run, args) -> dict:
    import torch

    cores = len(os.sched_getaffinity(0))
    flip = flip_supported(run)
    out: dict = {"flip": flip, "cases": {}}
    for name, kind, workers, n_cpus in parse_cases(args.loader_cases, cores):
        if kind != "cpu" and not torch.cuda.is_available():
            continue
        if run.left() < 30:
            out["cases"][name] = {"skipped": "out of time"}
            continue
        try:
            with cpus(n_cpus), make_loader(run.data["jpeg"], image_ops(kind, flip), workers) as loader:
                rate = loader_rate(loader, args.loader_seconds)
                stats = _stage_stats(loader)
        except Exception as e:
            out["cases"][name] = {"error": f"{type(e).__name__}: {e}"}
            continue
        out["cases"][name] = {"img_s": round(rate, 1), "kind": kind, "num_workers": workers, "cpus": n_cpus, **stats}
        run.log(f"loader {name}: {rate:,.0f} img/s {stats}")
    out["pixels_vs_cpu"] = _pixel_check(run, flip)
    decode = (run.results["sections"].get("decode") or {}).get("result") or {}
    best: dict = {}
    for case in out["cases"].values():
        if "img_s" in case:
            best[case["kind"]] = max(best.get(case["kind"], 0.0), case["img_s"])
    device = max(best.get("torchvision", 0.0), best.get("nvimgcodec", 0.0))
    rates = [v for v in decode.values() if isinstance(v, (int, float))]
    if rates and device:
        run.results["goals"]["loader_gpu_vs_decode_alone (goal >= 0.9)"] = round(device / max(rates), 3)
    if "hybrid" in best and (device or "cpu" in best):
        run.results["goals"]["hybrid_vs_better_single (goal >= 1.3)"] = round(
            best["hybrid"] / max(device, best.get("cpu", 0.0)), 3
        )
    return out


def _stage_stats(loader) -> dict:
    """The image decoder's device stage report (backend, share, per-phase times), if it has one."""
    return loader.stats()["devices"].get("image", {})


def _pixel_check(run: Run, flip: bool) -> dict:
    """One batch of 64, same seed: the device path's uint8 output against the CPU path's."""
    import torch

    from ffload import Loader
    from ffload.loaders import IntDecoder, RandomHorizontalFlip, RandomResizedCropRGBImageDecoder, ToTensor

    device = "cuda" if torch.cuda.is_available() else "cpu"
    flips = [RandomHorizontalFlip()] if flip else []

    def first(ops):
        pipes = {"image": ops, "label": [IntDecoder()]}
        with Loader(run.data["jpeg"], batch_size=64, num_workers=2, order="random", seed=5, pipelines=pipes) as ld:
            image, _ = next(iter(ld))
            return torch.as_tensor(image).to("cpu", torch.int16)

    cpu = first([RandomResizedCropRGBImageDecoder(224), *flips, ToTensor()])
    out = {}
    backends = ("nvimgcodec", "torchvision", "host") if device == "cuda" else ("host",)
    for backend in backends:
        try:
            dev = first(
                [RandomResizedCropRGBImageDecoder(224, device=device, device_share=1.0, device_backend=backend), *flips]
            )
        except Exception as e:
            out[backend] = f"{type(e).__name__}: {e}"
            continue
        diff = (dev - cpu).abs().float()
        out[backend] = {"mean_abs": round(float(diff.mean()), 3), "p99_abs": float(diff.flatten().quantile(0.99))}
    return out


# ---------------------------------------------------------------- training


def training(run: Run, args) -> dict:
    import torch

    if not torch.cuda.is_available():
        return {"skipped": "needs CUDA"}
    import torchvision

    torch.backends.cudnn.benchmark = True
    model = torchvision.models.resnet50().cuda().to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step(x, y):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_fn(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    cores = len(os.sched_getaffinity(0))
    out = {}
    x = torch.randn(256, 3, 224, 224, device="cuda").to(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (256,), device="cuda")
    out["resident"] = _train_rate(step, iter(lambda: (x, y), None), args.train_steps)
    run.log(f"train resident: {out['resident']}")
    flip = flip_supported(run)
    for name, kind, workers, n_cpus in parse_cases(args.train_cases, cores):
        if run.left() < 25:
            out[name] = {"skipped": "out of time"}
            continue
        try:
            with cpus(n_cpus):
                if kind == "dataloader":
                    out[name] = _train_rate(step, _dataloader_batches(run, workers), args.train_steps)
                else:
                    with make_loader(run.data["jpeg"], image_ops(kind, flip), workers) as loader:
                        out[name] = _train_rate(step, _epochs(loader), args.train_steps)
                        out[name].update(_stage_stats(loader))
        except Exception as e:
            out[name] = {"error": f"{type(e).__name__}: {e}"}
            continue
        ratio = round(out[name]["img_s"] / out["resident"]["img_s"], 3)
        out[name].update(kind=kind, num_workers=workers, cpus=n_cpus, vs_resident=ratio)
        run.log(f"train {name}: {out[name]}")
    fed = [v for v in out.values() if v.get("kind") not in (None, "dataloader") and "vs_resident" in v]
    for n_cpus, goal in ((cores, 0.98), (8, 0.95)):
        ratios = [v["vs_resident"] for v in fed if v["cpus"] == n_cpus]
        if ratios:
            run.results["goals"][f"resnet50_fed_{n_cpus}cpu_vs_resident (goal >= {goal})"] = max(ratios)
    run.train_step = step
    return out


def _epochs(loader):
    while True:
        yield from loader


def _train_rate(step, batches, steps: int, warmup: int = 6) -> dict:
    """img/s of ``steps`` training steps after ``warmup``, and the share of the time spent waiting
    for the next batch on the host."""
    wait = 0.0
    for _ in range(warmup):
        x, y = next(batches)
        step(x, y)
    sync()
    t0 = time.perf_counter()
    n = 0
    for _ in range(steps):
        w0 = time.perf_counter()
        x, y = next(batches)
        wait += time.perf_counter() - w0
        step(x, y)
        n += x.shape[0]
    sync()
    elapsed = time.perf_counter() - t0
    return {"img_s": round(n / elapsed, 1), "host_wait_fraction": round(wait / elapsed, 3)}


def _dataloader_batches(run: Run, workers: int):
    """torchvision's DataLoader on the same JPEGs: PIL decode, RandomResizedCrop(224), flip, as
    uint8 batches (pinned) normalised on the GPU."""
    import torch
    from PIL import Image
    from torchvision import transforms

    payloads = run.payloads
    tf = transforms.Compose(
        [transforms.RandomResizedCrop(224), transforms.RandomHorizontalFlip(), transforms.PILToTensor()]
    )

    class Jpegs(torch.utils.data.Dataset):
        def __len__(self):
            return len(payloads)

        def __getitem__(self, i):
            return tf(Image.open(io.BytesIO(payloads[i].tobytes())).convert("RGB")), i % 1000

    loader = torch.utils.data.DataLoader(
        Jpegs(),
        batch_size=256,
        shuffle=True,
        num_workers=workers,
        pin_memory=True,
        drop_last=True,
        persistent_workers=True,
        prefetch_factor=4,
    )
    mean = torch.tensor([0.485, 0.456, 0.406], device="cuda").reshape(1, 3, 1, 1) * 255
    std = torch.tensor([0.229, 0.224, 0.225], device="cuda").reshape(1, 3, 1, 1) * 255
    while True:
        for x, y in loader:
            x = x.cuda(non_blocking=True).contiguous(memory_format=torch.channels_last)
            yield ((x - mean) / std).half(), y.cuda(non_blocking=True)


# ---------------------------------------------------------------- profile


def profile(run: Run, args) -> dict:
    import torch

    if not torch.cuda.is_available() or getattr(run, "train_step", None) is None:
        return {"skipped": "needs CUDA and the train section"}
    from torch.profiler import ProfilerActivity

    cores = len(os.sched_getaffinity(0))
    with make_loader(run.data["jpeg"], jpeg_pipeline("cuda", flip=flip_supported(run)), cores) as loader:
        batches = _epochs(loader)
        for _ in range(4):
            run.train_step(*next(batches))
        sync()
        with torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(6):
                run.train_step(*next(batches))
            sync()
    raw = run.out / "trace.json"
    prof.export_chrome_trace(str(raw))
    trace = json.loads(raw.read_text())
    with gzip.open(run.out / "trace.json.gz", "wt") as f:
        json.dump(trace, f)
    raw.unlink()
    return _overlap(trace)


def _overlap(trace: dict) -> dict:
    """Busy time per CUDA stream in the trace, the model's stream (the one with most kernel time)
    against all others (the loader's slots), and the share of the others' time that overlaps it."""
    busy: dict = {}
    for e in trace.get("traceEvents", []):
        if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and "dur" in e:
            stream = e.get("args", {}).get("stream", e.get("tid"))
            busy.setdefault(stream, []).append((float(e["ts"]), float(e["ts"]) + float(e["dur"])))
    if not busy:
        return {"streams": 0}
    merged = {s: _merge(v) for s, v in busy.items()}
    total = {s: sum(b - a for a, b in v) for s, v in merged.items()}
    model = max(total, key=total.get)
    others = _merge([iv for s, v in merged.items() if s != model for iv in v])
    other_time = sum(b - a for a, b in others)
    overlap = _intersect(merged[model], others)
    return {
        "streams": {str(s): round(t / 1e3, 2) for s, t in total.items()},  # ms
        "model_stream": str(model),
        "loader_ms": round(other_time / 1e3, 2),
        "loader_overlapping_model_fraction": round(overlap / other_time, 3) if other_time else None,
    }


def _merge(intervals):
    out = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def _intersect(xs, ys) -> float:
    i = j = 0
    total = 0.0
    while i < len(xs) and j < len(ys):
        lo, hi = max(xs[i][0], ys[j][0]), min(xs[i][1], ys[j][1])
        total += max(0.0, hi - lo)
        if xs[i][1] < ys[j][1]:
            i += 1
        else:
            j += 1
    return total


# ---------------------------------------------------------------- recipe


def recipe(run: Run, args) -> dict:
    import torch

    if not torch.cuda.is_available() and not args.quick:
        return {"skipped": "needs CUDA"}
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from cifar_fixture import write_cifar10_folder

    from ffload.recipes.config import RecipeConfig
    from ffload.recipes.run import run_recipe

    small, labels = run.data["cifar"]
    work = Path(tempfile.mkdtemp(prefix="recipe-", dir=run.work))
    split = len(small) * 5 // 6
    folder = write_cifar10_folder(work / "cifar", small[:split], labels[:split], small[split:], labels[split:])
    metrics = run_recipe(
        folder,
        work / "report",
        RecipeConfig(epochs=args.recipe_epochs),
        device="cuda" if torch.cuda.is_available() else "cpu",
        num_workers=min(16, len(os.sched_getaffinity(0))),
        progress=False,
    )
    epochs = [
        {k: round(e[k], 4) for k in ("epoch_seconds", "images_per_second", "data_wait_fraction")}
        for e in metrics["epochs"]
    ]
    later = [e["data_wait_fraction"] for e in epochs[1:]] or [epochs[0]["data_wait_fraction"]]
    run.results["goals"]["recipe_data_wait_after_epoch_0 (goal <= 0.01)"] = round(max(later), 4)
    return {"epochs": epochs, "convert_seconds": round(metrics["convert_seconds"], 1)}


# ---------------------------------------------------------------- scaling


def scaling(run: Run, args) -> dict:
    import numpy as np

    from ffload import Loader
    from ffload.formats import open_dataset
    from ffload.loaders import (
        IntDecoder,
        RandomHorizontalFlip,
        RandomResizedCropRGBImageDecoder,
        SimpleRGBImageDecoder,
    )

    cores = len(os.sched_getaffinity(0))
    counts = [w for w in (1, 2, 4, 8, 12, 16, 24, 32) if w <= cores]
    if args.quick:
        counts = counts[:2]

    def raw_ops():
        return [SimpleRGBImageDecoder(), RandomHorizontalFlip()]

    samples = open_dataset(run.data["raw"]).num_samples
    epochs = {
        "": (np.resize(np.arange(samples), 1281167), args.scale_jobs),  # 5,005 batches
        "_cifar": (np.resize(np.arange(samples), 50000), args.scale_cifar_jobs),  # 196 batches
    }
    cases = {}
    for tag, (indices, sizes) in epochs.items():
        for jobs in ["auto"] + [int(j) for j in sizes.split(",") if j]:
            name = f"raw32_flip{tag}" + ("" if jobs == "auto" else f"_jobs{jobs}")
            cases[name] = (run.data["raw"], raw_ops, args.scale_seconds, indices, jobs, {})
        if not tag:  # JPEG before the CIFAR-length cases, which the budget may cut
            cases["jpeg_rrc224_flip"] = (
                run.data["jpeg"],
                lambda: [RandomResizedCropRGBImageDecoder(224), RandomHorizontalFlip()],
                args.scale_seconds * 1.5,
                None,
                "auto",
                {},
            )
    # the process cache (what a dataset larger than RAM is read through), CIFAR-length epochs
    cases["raw32_flip_cifar_process_cache"] = (*cases["raw32_flip_cifar"][:5], {"os_cache": False})
    out = {}
    for name, (path, ops, seconds, indices, per_job, memory) in cases.items():
        rows, sizes = {}, {}
        for workers in counts:
            if run.left() < 20:
                rows[str(workers)] = "skipped: out of time"
                continue
            pipes = {"image": ops(), "label": [IntDecoder()]}
            kw = dict(order="random", seed=0, pipelines=pipes, indices=indices, batches_per_job=per_job, **memory)
            with Loader(path, batch_size=256, num_workers=workers, **kw) as ld:
                rows[str(workers)] = round(loader_rate(ld, seconds), 1)
                sizes[str(workers)] = ld.stats()["batches_per_job"]
            run.log(f"scale {name} {workers} workers: {rows[str(workers)]:,.0f} img/s")
        one = rows.get("1")
        out[name] = {
            "img_s": rows,
            "batches_per_job": sizes,
            "vs_linear": {w: round(r / (int(w) * one), 3) for w, r in rows.items() if isinstance(r, float) and one},
        }
    return out


# ---------------------------------------------------------------- main


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/bench_gpu")
    ap.add_argument("--wheels", help="a folder of wheels to unpack and import first (no pip needed)")
    ap.add_argument("--photos", help="a folder of photos (default: scikit-image's and scikit-learn's)")
    ap.add_argument("--sections", default=",".join(SECTIONS))
    ap.add_argument("--budget", type=float, default=420.0, help="seconds for the whole run")
    ap.add_argument("--images", type=int, default=3072, help="ImageNet-sized JPEGs")
    ap.add_argument("--cifar", type=int, default=30000, help="32x32 images (recipe and raw scaling)")
    ap.add_argument("--decode-seconds", type=float, default=3.0)
    ap.add_argument("--loader-seconds", type=float, default=4.0)
    ap.add_argument("--train-steps", type=int, default=30)
    ap.add_argument("--recipe-epochs", type=int, default=3)
    ap.add_argument("--scale-seconds", type=float, default=2.0)
    ap.add_argument("--scale-jobs", default="10,42,170", help="fixed batches_per_job values for raw in 'scale'")
    ap.add_argument(
        "--scale-cifar-jobs",
        default="6,10,20",
        help="fixed batches_per_job values for raw in CIFAR-10-length epochs (196 batches) in 'scale'",
    )
    ap.add_argument(
        "--loader-cases",
        default="cpu:all,torchvision:4,nvimgcodec:4,hybrid:all",
        help="loader-alone cases, kind:workers[:cpus],... (see parse_cases)",
    )
    ap.add_argument(
        "--train-cases",
        default="cpu:all,cpu:auto,hybrid:all,hybrid:8:8,dataloader:all",
        help="ResNet-50 feeds, kind:workers[:cpus],... (kinds as --loader-cases, and dataloader)",
    )
    ap.add_argument("--quick", action="store_true", help="small sizes: a dry run of the code paths")
    args = ap.parse_args(argv)
    if args.quick:
        args.images, args.cifar, args.decode_seconds, args.loader_seconds = 256, 2048, 0.5, 0.5
        args.train_steps, args.recipe_epochs, args.scale_seconds = 4, 1, 0.5
    run = Run(Path(args.out), args.budget)
    work = Path(tempfile.mkdtemp(prefix="bench_gpu-"))
    run.work = work
    os.environ.setdefault("NUMBA_CACHE_DIR", str(work / "numba"))
    if args.wheels:
        run.results["wheels"] = install_wheels(args.wheels, str(work / "site"))
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    wanted = [s for s in args.sections.split(",") if s]
    unknown = set(wanted) - set(SECTIONS)
    if unknown:
        ap.error(f"unknown sections {sorted(unknown)}; choose from {SECTIONS}")
    steps = {
        "env": lambda: environment(run),
        "data": lambda: build_data(run, args, work),
        "decode": lambda: decode_alone(run, args),
        "loader": lambda: loader_alone(run, args),
        "train": lambda: training(run, args),
        "profile": lambda: profile(run, args),
        "recipe": lambda: recipe(run, args),
        "scale": lambda: scaling(run, args),
    }
    for name in SECTIONS:
        if name not in wanted:
            continue
        if name != "data" and name != "env" and getattr(run, "data", None) is None:
            run.results["sections"][name] = {"result": {"skipped": "no data"}}
            continue
        if run.left() < 10:
            run.results["sections"][name] = {"result": {"skipped": "out of time"}}
            continue
        run.section(name, steps[name])
    run.results["total_seconds"] = round(time.perf_counter() - run.start, 1)
    run.save()
    print(json.dumps({"goals": run.results["goals"], "errors": list(run.results["errors"])}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
