"""Loader benchmark: ffload's ``Loader`` against ffcv's ``Loader``, two PyTorch ``DataLoader``
baselines and the JPEG decode ceiling, on the same file and pipeline (``ffload bench PATH``).

Loader kinds (:data:`KINDS`), each measured by :func:`run_worker` in a fresh subprocess
(:func:`measure`), so that imports, JIT compilation, threads and memory of one measurement do
not leak into the next:

* ``ffload``: ``ffload.Loader`` with ``[decoder, RandomHorizontalFlip(), ToTensor(),
  ToTorchImage()]`` for the image field and ``[IntDecoder(), ToTensor()]`` for the label.
* ``ffcv``: ``ffcv.loader.Loader`` with ffcv's classes of the same names, on the same ``.beton``.
* ``dataloader_arrays``: ``torch.utils.data.DataLoader`` over the dataset's images decoded once
  into one in-memory ``(N, H, W, 3) uint8`` array (a ``TensorDataset``-like dataset with a
  per-sample flip); ``simple`` pipeline only.
* ``dataloader_pil``: ``DataLoader`` over the source ImageFolder: PIL decode
  (``convert('RGB')``, torchvision's ``pil_loader``), a per-sample crop (torchvision's
  ``RandomResizedCrop`` rule for ``rrc``, FFCV's centre-crop box for ``center``) resized with
  PIL's antialiased bilinear filter (torchvision's ``resized_crop`` on PIL images), flip with
  probability 0.5, ``uint8`` HWC tensors (torchvision's ``PILToTensor`` without the transpose).
* ``decode_ceiling``: the single-thread full-size ``cv2.imdecode(IMREAD_COLOR_RGB)`` rate over
  the dataset's JPEG payloads (held in memory), times ``num_workers``. The same process also
  measures ``num_workers`` threads decoding those payloads at once (``threads_img_s``, the row
  ``<name> (threads)`` of :func:`summarize`): on a shared or throttled machine the threads get
  less than ``num_workers`` cores, and that measured rate is the ceiling the loaders really face.

All loaders use ``order=RANDOM``, ``os_cache=True`` (ffload/ffcv), ``drop_last=False``
(explicit: ffcv's default is True), ``batches_ahead=3`` and the same ``batch_size`` and
``num_workers`` (threads for ffload/ffcv, worker processes for ``DataLoader``, whose
``pin_memory`` is on only when CUDA is available and whose workers are not persistent, the
defaults). Batches are consumed and dropped (nothing is trained).

What one measurement reports (:func:`run_worker`): per epoch seconds, samples and images/s;
``img_s`` = the median images/s of epochs 1.. (epoch 0 includes JIT compilation and warm-up
and is reported on its own, as ``epoch0_s``); ``first_batch_s`` = seconds from the start of
the loader library's import (torch already imported) to the first batch; ``first_batch_total_s``
= wall seconds from the subprocess' spawn to the first batch (interpreter start and
``import torch`` included; for the ``DataLoader`` baselines minus their untimed setup: reading
the images into memory, listing the files); peak RSS of the process and of its reaped
children (``DataLoader`` workers); ``rss_growth_mb`` = RSS after the last epoch minus RSS after epoch 1 (epoch 0 when
there are fewer than 3 epochs). RSS counts the pages of a memory-mapped file that the process
touched (they are shared page-cache pages).

Rounds (:func:`run_rounds`) interleave the kinds (ffload, ffcv, dataloader, ffload, ...) so that
machine noise hits all alike; :func:`summarize` takes medians over rounds and
:func:`compute_ratios` divides medians of the same invocation.
"""
from __future__ import annotations

import importlib.util
import json
import math
import os
import random
import statistics
import subprocess
import sys
import textwrap
import time
from dataclasses import asdict, dataclass, fields
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import click

KINDS = {
    "ffload": "ffload Loader",
    "ffcv": "ffcv Loader",
    "dataloader_arrays": "DataLoader, in-memory arrays",
    "dataloader_pil": "DataLoader + PIL, ImageFolder",
    "decode_ceiling": "decode ceiling (1-thread cv2.imdecode x workers)",
}
"""Loader kinds and their display names (see the module docstring)."""

PIPELINES = ("simple", "rrc", "center")
"""``simple``: images of one size as stored; ``rrc``: ``RandomResizedCrop(size)`` (scale
(0.08, 1), ratio (3/4, 4/3)); ``center``: ``CenterCrop(size, ratio=224/256)``. All add a
horizontal flip with probability 0.5."""

CENTER_RATIO = 224 / 256
DEFAULT_BATCH_SIZE = {"simple": 512, "rrc": 128, "center": 128}
_MB = 1024.0 * 1024.0
_RESULT_TAG = "FFLOAD_BENCH_RESULT "
_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass(frozen=True)
class BenchConfig:
    """One measurement: a loader kind on a dataset with a pipeline.

    Args:
        kind: a key of :data:`KINDS`.
        path: the dataset (``.beton`` file or ``.lmdb`` directory); for ``dataloader_pil`` the
            ImageFolder root.
        pipeline: one of :data:`PIPELINES`.
        batch_size: samples per batch (>= 1).
        num_workers: loader threads / DataLoader processes (>= 1); for ``decode_ceiling`` the
            multiplier of the single-thread rate.
        epochs: epochs (>= 1); for ``decode_ceiling`` passes over the payloads.
        size: output side of the crop pipelines, pixels.
        image_field, label_field: field names (``label_field`` may be ``None``).
        disabled_fields: other fields of the dataset, disabled in the ffload/ffcv pipelines.
        seed: the loaders' seed.
        limit: visit only the first ``limit`` samples (``indices``), or all when ``None``.
        name: the row label (default: ``kind``); rows with equal names and worker counts are
            aggregated over rounds.

    Raises:
        ValueError: an unknown kind or pipeline, a non-positive count.
    """

    kind: str
    path: str
    pipeline: str
    batch_size: int
    num_workers: int
    epochs: int
    size: int = 224
    image_field: str = "image"
    label_field: Optional[str] = "label"
    disabled_fields: Tuple[str, ...] = ()
    seed: int = 0
    limit: Optional[int] = None
    name: str = ""

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"unknown loader kind {self.kind!r}; expected one of {', '.join(KINDS)}")
        if self.pipeline not in PIPELINES:
            raise ValueError(f"unknown pipeline {self.pipeline!r}; expected one of {', '.join(PIPELINES)}")
        for key in ("batch_size", "num_workers", "epochs", "size"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{key} must be an integer >= 1, got {value!r}")
        if self.limit is not None and (not isinstance(self.limit, int) or self.limit < 1):
            raise ValueError(f"limit must be None or an integer >= 1, got {self.limit!r}")
        if self.kind == "dataloader_arrays" and self.pipeline != "simple":
            raise ValueError("dataloader_arrays holds images of one size: it runs the 'simple' pipeline only")
        object.__setattr__(self, "disabled_fields", tuple(self.disabled_fields))
        if not self.name:
            object.__setattr__(self, "name", self.kind)

    def to_dict(self) -> dict:
        """A JSON-serialisable dict (the inverse of :meth:`from_dict`)."""
        d = asdict(self)
        d["disabled_fields"] = list(self.disabled_fields)
        return d

    @classmethod
    def from_dict(cls, d: Mapping) -> "BenchConfig":
        """Build from :meth:`to_dict`'s output. Raises ValueError on unknown keys."""
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown BenchConfig keys: {', '.join(sorted(unknown))}")
        return cls(**dict(d))


# --------------------------------------------------------------------------- in the subprocess
def _rss_mb() -> float:
    """Current resident set size of this process, MiB (Linux ``/proc``; else the peak)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / _MB
    except (OSError, ValueError, IndexError):
        return _peak_rss_mb(children=False)


def _peak_rss_mb(children: bool) -> float:
    """Peak RSS, MiB: of this process (``VmHWM``: since its ``exec``; ``ru_maxrss`` would start
    from the parent's RSS at fork), or of its largest reaped child (``ru_maxrss`` of
    ``RUSAGE_CHILDREN``: ``DataLoader`` workers, whose shared pages count in full)."""
    import resource

    if not children:
        try:
            with open("/proc/self/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1]) / 1024.0
        except (OSError, ValueError, IndexError):
            pass
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024.0


def _time_epochs(loader: Iterable, epochs: int) -> Tuple[List[dict], Optional[float], Optional[dict]]:
    """Iterate ``loader`` ``epochs`` times (``iter(loader)`` starts an epoch), counting samples
    from the batch's first entry. Returns ``(per-epoch records, perf_counter at the first batch,
    {'shape', 'dtype'} of the first batch's first entry)``."""
    records, first, described = [], None, None
    for epoch in range(epochs):
        t0 = time.perf_counter()
        n = 0
        for batch in loader:
            if first is None:
                first = time.perf_counter()
                described = {"shape": list(batch[0].shape), "dtype": str(batch[0].dtype)}
            n += int(batch[0].shape[0])
        dt = time.perf_counter() - t0
        records.append({"epoch": epoch, "seconds": dt, "samples": n, "img_s": n / dt if dt > 0 else math.inf,
                        "rss_mb": _rss_mb()})
    return records, first, described


def _pipelines(cfg: BenchConfig, ops: Mapping) -> dict:
    """The benchmark's pipelines built from ``ops``, a mapping of FFCV's operation names to
    classes (ffload's or ffcv's): ``[decoder, RandomHorizontalFlip(), ToTensor(),
    ToTorchImage()]`` for the image, ``[IntDecoder(), ToTensor()]`` for the label, ``None``
    (disabled) for the other fields."""
    size = (cfg.size, cfg.size)
    decoder = {"simple": lambda: ops["SimpleRGBImageDecoder"](),
               "rrc": lambda: ops["RandomResizedCropRGBImageDecoder"](size),
               "center": lambda: ops["CenterCropRGBImageDecoder"](size, ratio=CENTER_RATIO)}[cfg.pipeline]
    pipes = {cfg.image_field: [decoder(), ops["RandomHorizontalFlip"](), ops["ToTensor"](), ops["ToTorchImage"]()]}
    if cfg.label_field:
        pipes[cfg.label_field] = [ops["IntDecoder"](), ops["ToTensor"]()]
    pipes.update({name: None for name in cfg.disabled_fields})
    return pipes


def _run_ffload(cfg: BenchConfig, out: dict) -> Tuple[Iterable, Callable[[], None]]:
    t0 = out["start"] = time.perf_counter()
    import ffload  # the import being timed
    import ffload.loaders

    out["import_s"] = time.perf_counter() - t0
    t1 = time.perf_counter()
    indices = None if cfg.limit is None else list(range(cfg.limit))
    loader = ffload.Loader(cfg.path, batch_size=cfg.batch_size, num_workers=cfg.num_workers,
                           order="random", os_cache=True, pipelines=_pipelines(cfg, vars(ffload.loaders)),
                           drop_last=False, seed=cfg.seed, indices=indices, batches_ahead=3)
    out["build_s"] = time.perf_counter() - t1
    out["dataset_samples"] = len(loader.indices)
    return loader, loader.close


def _run_ffcv(cfg: BenchConfig, out: dict) -> Tuple[Iterable, Callable[[], None]]:
    t0 = out["start"] = time.perf_counter()
    from ffcv import transforms
    from ffcv.fields import decoders
    from ffcv.loader import Loader, OrderOption

    pipelines = _pipelines(cfg, {**vars(decoders), **vars(transforms)})
    out["import_s"] = time.perf_counter() - t0
    t1 = time.perf_counter()
    indices = None if cfg.limit is None else list(range(cfg.limit))
    loader = Loader(cfg.path, batch_size=cfg.batch_size, num_workers=cfg.num_workers,
                    order=OrderOption.RANDOM, os_cache=True, pipelines=pipelines, drop_last=False,
                    seed=cfg.seed, indices=indices, batches_ahead=3)
    out["build_s"] = time.perf_counter() - t1
    out["dataset_samples"] = len(loader.indices)
    return loader, lambda: None


class ArrayImages:
    """Map-style dataset over in-memory images: the ``TensorDataset`` baseline.

    Args:
        images: ``(N, H, W, 3) uint8``.
        labels: ``(N,) int64``.

    ``ds[i]`` -> ``(image (H, W, 3) uint8 tensor, label int)``, flipped horizontally with
    probability 0.5 (Python's ``random``, which ``DataLoader`` seeds per worker).
    """

    def __init__(self, images, labels):
        self.images, self.labels = images, labels

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int):
        import numpy as np
        import torch

        image = self.images[i]
        if random.random() < 0.5:
            image = np.ascontiguousarray(image[:, ::-1])
        return torch.from_numpy(image), int(self.labels[i])


def rrc_box(width: int, height: int, rng: random.Random, scale=(0.08, 1.0),
            ratio=(3 / 4, 4 / 3)) -> Tuple[int, int, int, int]:
    """A ``RandomResizedCrop`` box ``(left, top, right, bottom)`` in pixels, drawn with
    torchvision's ``RandomResizedCrop.get_params`` rule (10 tries of area fraction in ``scale``
    and log-uniform aspect ratio in ``ratio``, then the centred crop clamped to ``ratio``)."""
    area = width * height
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    for _ in range(10):
        target = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(log_lo, log_hi))
        w = int(round(math.sqrt(target * aspect)))
        h = int(round(math.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            top = rng.randint(0, height - h)
            left = rng.randint(0, width - w)
            return left, top, left + w, top + h
    in_ratio = width / height
    if in_ratio < ratio[0]:
        w, h = width, int(round(width / ratio[0]))
    elif in_ratio > ratio[1]:
        w, h = int(round(height * ratio[1])), height
    else:
        w, h = width, height
    top, left = (height - h) // 2, (width - w) // 2
    return left, top, left + w, top + h


def center_box(width: int, height: int, ratio: float = CENTER_RATIO) -> Tuple[int, int, int, int]:
    """FFCV's centre-crop box ``(left, top, right, bottom)``: the centred square of side
    ``int(ratio * min(width, height))`` (``ffcv.fields.rgb_image.get_center_crop``)."""
    c = int(ratio * min(width, height))
    top, left = (height - c) // 2, (width - c) // 2
    return left, top, left + c, top + c


class PILImageFolder:
    """Map-style dataset over image files decoded with PIL: the vanilla PyTorch baseline.

    Args:
        paths: image file paths. labels: ``(N,)`` ints.
        pipeline: ``'simple'`` (as decoded), ``'rrc'`` (:func:`rrc_box`) or ``'center'``
            (:func:`center_box`), the crops resized to ``size x size`` with PIL's bilinear filter
            (antialiased when shrinking, as torchvision's ``resized_crop`` on PIL images).
        size: output side, pixels.

    ``ds[i]`` -> ``(image (size, size, 3) uint8 tensor, label int)`` (``simple``: the decoded
    size), flipped horizontally with probability 0.5 (Python's ``random``, seeded per worker by
    ``DataLoader``). Raises ``OSError`` naming the file when PIL cannot read it.
    """

    def __init__(self, paths: Sequence[str], labels, pipeline: str, size: int):
        self.paths, self.labels, self.pipeline, self.size = list(paths), labels, pipeline, size

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int):
        import numpy as np
        import torch
        from PIL import Image

        path = self.paths[i]
        try:
            with Image.open(path) as f:
                image = f.convert("RGB")
        except OSError as e:
            raise OSError(f"{path}: PIL cannot read the image: {e}") from e
        if self.pipeline != "simple":
            w, h = image.size
            box = rrc_box(w, h, random) if self.pipeline == "rrc" else center_box(w, h)
            image = image.resize((self.size, self.size), Image.BILINEAR, box=box)
        if random.random() < 0.5:
            image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        return torch.from_numpy(np.array(image)), int(self.labels[i])


def _torch_loader(dataset, cfg: BenchConfig):
    import multiprocessing

    import torch
    from torch.utils.data import DataLoader

    context = "fork" if "fork" in multiprocessing.get_all_start_methods() else None
    return DataLoader(dataset, batch_size=cfg.batch_size, shuffle=True, num_workers=cfg.num_workers,
                      pin_memory=torch.cuda.is_available(), drop_last=False,
                      generator=torch.Generator().manual_seed(cfg.seed), multiprocessing_context=context)


def _subset(n: int, cfg: BenchConfig) -> int:
    return n if cfg.limit is None else min(n, cfg.limit)


def _run_dataloader_arrays(cfg: BenchConfig, out: dict) -> Tuple[Iterable, Callable[[], None]]:
    t0 = time.perf_counter()  # setup: reading the images into memory (ffload's reader imports included)
    import numpy as np

    from ffload.formats import open_dataset
    from ffload.inspect import decode_image

    view = open_dataset(cfg.path)
    region = view.open_region()
    n = _subset(view.num_samples, cfg)
    images = np.stack([decode_image(view, cfg.image_field, i, region) for i in range(n)])
    labels = (np.asarray(view.metadata[cfg.label_field][:n], dtype=np.int64) if cfg.label_field
              else np.zeros(n, dtype=np.int64))
    del region
    out["setup_s"] = time.perf_counter() - t0
    t1 = out["start"] = time.perf_counter()
    from torch.utils.data import DataLoader  # noqa: F401  (part of torch, already imported)

    out["import_s"] = time.perf_counter() - t1
    out["build_s"] = 0.0
    out["dataset_samples"] = n
    return _PermutedImages(_torch_loader(ArrayImages(images, labels), cfg)), lambda: None


def _run_dataloader_pil(cfg: BenchConfig, out: dict) -> Tuple[Iterable, Callable[[], None]]:
    t0 = time.perf_counter()  # setup: listing the files (ffload's ImageFolderSource)
    from ffload.convert.sources import ImageFolderSource

    source = ImageFolderSource(cfg.path)
    n = _subset(len(source), cfg)
    paths = [os.path.join(source.root, source.describe(i)) for i in range(n)]
    out["setup_s"] = time.perf_counter() - t0
    t1 = out["start"] = time.perf_counter()
    import PIL.Image  # noqa: F401
    from torch.utils.data import DataLoader  # noqa: F401

    out["import_s"] = time.perf_counter() - t1
    out["build_s"] = 0.0
    out["dataset_samples"] = n
    dataset = PILImageFolder(paths, source.labels[:n], cfg.pipeline, cfg.size)
    return _PermutedImages(_torch_loader(dataset, cfg)), lambda: None


class _PermutedImages:
    """Yields a DataLoader's ``(B, H, W, 3)`` image batches as ``(B, 3, H, W)`` views (what
    ``ToTorchImage`` yields), labels unchanged."""

    def __init__(self, loader):
        self.loader = loader

    def __iter__(self):
        for images, labels in self.loader:
            yield images.permute(0, 3, 1, 2), labels


def _run_decode_ceiling(cfg: BenchConfig, out: dict) -> None:
    import cv2
    import numpy as np

    from ffload.formats import open_dataset
    from ffload.formats.fields import JPG

    t0 = time.perf_counter()
    view = open_dataset(cfg.path)
    region = view.open_region()
    n = _subset(view.num_samples, cfg)
    jpeg = np.flatnonzero(view.metadata[cfg.image_field]["mode"][:n] == JPG)
    if jpeg.size == 0:
        raise ValueError(f"{cfg.path}: field {cfg.image_field!r} has no JPEG samples; the decode "
                         "ceiling applies to JPEG datasets")
    payloads = [np.array(view.payload(cfg.image_field, int(i), region)) for i in jpeg]
    del region
    out["setup_s"] = time.perf_counter() - t0
    out["dataset_samples"] = int(jpeg.size)
    out["payload_bytes_mean"] = float(np.mean([p.size for p in payloads]))
    records = []
    for epoch in range(cfg.epochs):
        t = time.perf_counter()
        for i, p in zip(jpeg.tolist(), payloads):
            if cv2.imdecode(p, cv2.IMREAD_COLOR_RGB) is None:
                raise ValueError(f"{cfg.path}: sample {i}: the JPEG payload does not decode")
        dt = time.perf_counter() - t
        records.append({"epoch": epoch, "seconds": dt, "samples": len(payloads),
                        "img_s": len(payloads) / dt, "rss_mb": _rss_mb()})
    out["epochs"] = records
    measured = records[1:] or records
    out["single_thread_img_s"] = statistics.median(r["img_s"] for r in measured)
    out["img_s"] = out["single_thread_img_s"] * cfg.num_workers
    out["threads_img_s"] = _threaded_decode_rate(payloads, cfg.num_workers, cfg.epochs)


def _threaded_decode_rate(payloads: list, threads: int, passes: int) -> float:
    """Median images/s of ``passes`` passes (the first excluded when there are several) in
    which ``threads`` threads decode interleaved shares of ``payloads`` with ``cv2.imdecode``
    (which releases the GIL): the decode rate the machine gives right now."""
    import concurrent.futures

    import cv2

    def decode(share):
        for p in share:
            cv2.imdecode(p, cv2.IMREAD_COLOR_RGB)

    shares = [payloads[t::threads] for t in range(threads)]
    rates = []
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        for _ in range(passes):
            t = time.perf_counter()
            list(pool.map(decode, shares))
            rates.append(len(payloads) / (time.perf_counter() - t))
    return statistics.median(rates[1:] or rates)


_RUNNERS = {"ffload": _run_ffload, "ffcv": _run_ffcv, "dataloader_arrays": _run_dataloader_arrays,
            "dataloader_pil": _run_dataloader_pil}


def run_worker(cfg: BenchConfig, spawned: Optional[float] = None) -> dict:
    """Run one measurement in this process (meant for a fresh subprocess, see :func:`measure`).

    Args:
        cfg: what to measure.
        spawned: ``time.time()`` at which the parent spawned this process (for
            ``first_batch_total_s``), or ``None``.

    Returns:
        a JSON-serialisable dict: ``name``, ``kind``, ``config`` (:meth:`BenchConfig.to_dict`),
        ``dataset_samples``, ``epochs`` (list of ``{'epoch', 'seconds', 'samples', 'img_s',
        'rss_mb'}``), ``first_batch`` (``{'shape', 'dtype'}`` of the first batch's images),
        ``img_s`` (median over epochs 1..), ``epoch0_s``, ``import_torch_s``, ``import_s``,
        ``build_s``, ``first_batch_s``, ``first_batch_total_s`` (or ``None``),
        ``setup_s`` (baselines: reading the dataset into memory, untimed otherwise),
        ``peak_rss_mb``, ``peak_rss_children_mb``, ``rss_growth_mb``; ``decode_ceiling`` adds
        ``single_thread_img_s``, ``threads_img_s`` and ``payload_bytes_mean`` and has no batch
        timings.

    Raises:
        whatever the loader raises (missing ffcv: ImportError; a bad dataset: DatasetError).
    """
    out = {"name": cfg.name, "kind": cfg.kind, "config": cfg.to_dict(), "setup_s": 0.0, "first_batch": None,
           "import_torch_s": None, "import_s": None, "build_s": None, "first_batch_s": None,
           "first_batch_total_s": None, "epoch0_s": None, "rss_growth_mb": None}
    if cfg.kind == "decode_ceiling":
        _run_decode_ceiling(cfg, out)
    else:
        t0 = time.perf_counter()
        import torch  # noqa: F401  (every loader here yields torch tensors)

        out["import_torch_s"] = time.perf_counter() - t0
        loader, close = _RUNNERS[cfg.kind](cfg, out)
        start = out.pop("start")
        try:
            records, first, out["first_batch"] = _time_epochs(loader, cfg.epochs)
        finally:
            close()
        first_wall = time.time() - (time.perf_counter() - first) if first is not None else None
        out["epochs"] = records
        out["epoch0_s"] = records[0]["seconds"]
        measured = records[1:] or records
        out["img_s"] = statistics.median(r["img_s"] for r in measured)
        if first is not None:
            out["first_batch_s"] = first - start
            if spawned is not None:
                out["first_batch_total_s"] = first_wall - spawned - out["setup_s"]
        base = records[1] if len(records) >= 3 else records[0]
        out["rss_growth_mb"] = records[-1]["rss_mb"] - base["rss_mb"]
    out["peak_rss_mb"] = _peak_rss_mb(children=False)
    out["peak_rss_children_mb"] = _peak_rss_mb(children=True)
    return out


# --------------------------------------------------------------------------- in the parent
_WORKER_CODE = """
import json, sys, importlib.util
spec = importlib.util.spec_from_file_location("_ffload_bench_worker", sys.argv[1])
module = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = module
spec.loader.exec_module(module)
result = module.run_worker(module.BenchConfig.from_dict(json.loads(sys.argv[2])), float(sys.argv[3]))
sys.stdout.write("\\n" + module._RESULT_TAG + json.dumps(result) + "\\n")
"""


def measure(cfg: BenchConfig, timeout: Optional[float] = None) -> dict:
    """Run :func:`run_worker` for ``cfg`` in a fresh Python subprocess and return its dict.

    The subprocess loads this file without importing the ``ffload`` package first, so that the
    library import is part of the measurement (``import_s``, ``first_batch_s``).

    Args:
        cfg: the measurement.
        timeout: seconds before the subprocess is killed, or ``None``.

    Returns:
        :func:`run_worker`'s dict, plus ``round`` left to the caller; on failure (non-zero exit,
        timeout, no result line) ``{'name', 'kind', 'config', 'error': message}`` where the
        message is the last line of the subprocess' stderr (the exception) and ``stderr_tail``
        its last 20 lines. Never raises for a failing measurement.
    """
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_REPO_ROOT, env.get("PYTHONPATH")) if p)
    argv = [sys.executable, "-c", _WORKER_CODE, os.path.abspath(__file__), json.dumps(cfg.to_dict()),
            repr(time.time())]
    failed = {"name": cfg.name, "kind": cfg.kind, "config": cfg.to_dict()}
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired as e:
        return {**failed, "error": f"timed out after {timeout} s", "stderr_tail": _tail(e.stderr)}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(_RESULT_TAG) and proc.returncode == 0:
            return json.loads(line[len(_RESULT_TAG):])
    tail = _tail(proc.stderr)
    last = tail[-1] if tail else "no output"
    return {**failed, "error": f"exit status {proc.returncode}: {last}", "stderr_tail": tail}


def _tail(text, lines: int = 20) -> List[str]:
    """The last ``lines`` non-empty lines of a subprocess' output (the exception comes last)."""
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return [line for line in (text or "").splitlines() if line.strip()][-lines:]


def run_rounds(configs: Sequence[BenchConfig], repeats: int = 1, timeout: Optional[float] = None,
               on_result: Optional[Callable[[dict], None]] = None) -> List[dict]:
    """Measure every config ``repeats`` times, interleaved: round r runs ``configs`` in order
    (ffload, ffcv, dataloader, ...) before round r + 1 starts.

    Returns the results of :func:`measure` in run order, each with ``round`` set;
    ``on_result(result)`` is called after each one (progress). Raises ValueError if
    ``repeats < 1``."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    results = []
    for r in range(repeats):
        for cfg in configs:
            result = measure(cfg, timeout)
            result["round"] = r
            results.append(result)
            if on_result is not None:
                on_result(result)
    return results


def _median(values) -> Optional[float]:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def summarize(results: Sequence[dict]) -> List[dict]:
    """Aggregate measurements by ``(name, num_workers)`` in first-seen order.

    Returns rows: ``name``, ``kind``, ``path``, ``pipeline``, ``batch_size``, ``num_workers``,
    ``runs`` (successful), ``errors`` (messages), ``img_s`` (median over runs of the runs'
    ``img_s``), ``img_s_runs``, ``epoch0_s``, ``first_batch_s``, ``first_batch_total_s``,
    ``import_torch_s``, ``import_s``, ``build_s``, ``rss_growth_mb`` (medians), ``peak_rss_mb``,
    ``peak_rss_children_mb`` (maxima), ``samples`` (per epoch, max over runs),
    ``first_batch`` (shape and dtype, from the first successful run) and, for
    ``decode_ceiling``, ``single_thread_img_s``; each ``decode_ceiling`` row is followed by a
    ``'<name> (threads)'`` row of kind ``'decode_threads'`` whose ``img_s`` is the measured
    multi-thread decode rate. Statistics of a row without a successful run are ``None``.
    """
    groups: Dict[Tuple[str, int], List[dict]] = {}
    for res in results:
        groups.setdefault((res["name"], res["config"]["num_workers"]), []).append(res)
    rows = []
    for (name, workers), runs in groups.items():
        ok = [r for r in runs if "error" not in r]
        cfg = runs[0]["config"]
        row = {"name": name, "kind": runs[0]["kind"], "path": cfg["path"], "pipeline": cfg["pipeline"],
               "batch_size": cfg["batch_size"], "num_workers": workers, "epochs": cfg["epochs"],
               "runs": len(ok), "errors": [r["error"] for r in runs if "error" in r],
               "img_s_runs": [r["img_s"] for r in ok]}
        row["img_s"] = _median(row["img_s_runs"])
        for key in ("epoch0_s", "first_batch_s", "first_batch_total_s", "import_torch_s", "import_s",
                    "build_s", "rss_growth_mb", "single_thread_img_s"):
            row[key] = _median(r.get(key) for r in ok)
        for key in ("peak_rss_mb", "peak_rss_children_mb"):
            row[key] = max((r[key] for r in ok), default=None)
        row["samples"] = max((e["samples"] for r in ok for e in r["epochs"]), default=None)
        row["first_batch"] = ok[0].get("first_batch") if ok else None
        rows.append(row)
        if row["kind"] == "decode_ceiling":
            threads = dict(row, name=f"{name} (threads)", kind="decode_threads",
                           img_s_runs=[r["threads_img_s"] for r in ok])
            threads["img_s"] = _median(threads["img_s_runs"])
            rows.append(threads)
    return rows


def compute_ratios(rows: Sequence[dict], pairs: Sequence[Tuple[str, str]]) -> List[dict]:
    """``img_s`` ratios of rows with equal ``num_workers``: for each ``(numerator, denominator)``
    pair of row names, ``{'numerator', 'denominator', 'num_workers', 'ratio'}`` (``ratio`` is
    ``None`` when either median is missing). Pairs without both rows are left out."""
    by_key = {(r["name"], r["num_workers"]): r for r in rows}
    out = []
    for num, den in pairs:
        for (name, workers), row in by_key.items():
            if name != num or (den, workers) not in by_key:
                continue
            a, b = row["img_s"], by_key[(den, workers)]["img_s"]
            out.append({"numerator": num, "denominator": den, "num_workers": workers,
                        "ratio": a / b if a is not None and b else None})
    return out


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def format_rows(rows: Sequence[dict]) -> str:
    """A markdown table of :func:`summarize` rows (``-`` for missing values; failed rows show
    the first error)."""
    lines = ["| loader | workers | batch | img/s (epochs 1+, median) | epoch 0 s | first batch s "
             "| spawn to first batch s | peak RSS MiB | RSS growth MiB | runs |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        rss = r["peak_rss_mb"]
        if rss is not None and r["kind"].startswith("dataloader") and r["peak_rss_children_mb"]:
            rss_text = f"{rss:.0f} (+ workers {r['peak_rss_children_mb']:.0f})"
        else:
            rss_text = _fmt(rss, ".0f")
        failed = r["errors"][0][:300].replace("|", "\\|") if r["errors"] else ""
        runs = str(r["runs"]) + (f" ({len(r['errors'])} failed: {failed})" if failed else "")
        lines.append(f"| {r['name']} | {r['num_workers']} | {r['batch_size']} | {_fmt(r['img_s'], '.0f')} | "
                     f"{_fmt(r['epoch0_s'], '.2f')} | {_fmt(r['first_batch_s'], '.2f')} | "
                     f"{_fmt(r['first_batch_total_s'], '.2f')} | {rss_text} | "
                     f"{_fmt(r['rss_growth_mb'], '+.1f')} | {runs} |")
    return "\n".join(lines)


def format_ratios(ratios: Sequence[dict], targets: Optional[Mapping[Tuple[str, str], Tuple[str, float]]] = None) -> str:
    """A markdown table of :func:`compute_ratios` entries. ``targets`` maps a
    ``(numerator, denominator)`` pair to ``('>=' | '<=', value)``; the table then says whether
    each ratio meets its target."""
    targets = targets or {}
    lines = ["| ratio | workers | value | target | met |", "|---|---|---|---|---|"]
    for q in ratios:
        target = targets.get((q["numerator"], q["denominator"]))
        met = "-"
        if target is not None and q["ratio"] is not None:
            op, value = target
            met = "yes" if (q["ratio"] >= value if op == ">=" else q["ratio"] <= value) else "NO"
        lines.append(f"| {q['numerator']} / {q['denominator']} | {q['num_workers']} | "
                     f"{_fmt(q['ratio'], '.2f')}{'x' if q['ratio'] is not None else ''} | "
                     f"{f'{target[0]} {target[1]}x' if target else '-'} | {met} |")
    return "\n".join(lines)


def plot_throughput(rows: Sequence[dict], path: str, title: str = "") -> str:
    """Write a PNG of images/s against ``num_workers``, one line per row name.

    Args:
        rows: :func:`summarize` rows (rows without ``img_s`` are skipped).
        path: the PNG to write (its folder must exist).
        title: the plot title.

    Returns ``path``. Raises ValueError when no row has a value, OSError when the file cannot
    be written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series: Dict[str, List[Tuple[int, float]]] = {}
    for r in rows:
        if r["img_s"] is not None:
            series.setdefault(r["name"], []).append((r["num_workers"], r["img_s"]))
    if not series:
        raise ValueError("no successful measurement to plot")
    fig, ax = plt.subplots(figsize=(7, 4.5))
    try:
        for name, points in series.items():
            points.sort()
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=name)
        workers = sorted({p[0] for pts in series.values() for p in pts})
        ax.set_xticks(workers)
        ax.set_xlabel("num_workers")
        ax.set_ylabel("images / s (median, epochs 1+)")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        if title:
            ax.set_title(textwrap.fill(title, 90), fontsize=8)
        fig.tight_layout()
        fig.savefig(path, dpi=100)
    finally:
        plt.close(fig)
    return path


# --------------------------------------------------------------------------- planning (ffload bench)
def describe_dataset(path: str) -> dict:
    """What ``ffload bench`` needs to know about a dataset.

    Returns ``{'format', 'num_samples', 'image_field', 'label_field' (or None),
    'disabled_fields', 'one_size' (bool), 'size' ((H, W) when one_size), 'jpeg_samples'}``:
    the first RGBImageField is the image, the first IntField the label; other fields are
    disabled.

    Raises:
        ffload.formats.DatasetError: ``path`` is not a dataset.
        ValueError: the dataset has no RGBImageField, or no samples.
    """
    import numpy as np

    from ffload.formats import open_dataset
    from ffload.formats.fields import JPG, IntField, RGBImageField

    view = open_dataset(path)
    images = [n for n, f in view.fields.items() if isinstance(f, RGBImageField)]
    if not images:
        raise ValueError(f"{path}: no RGBImageField (fields: {', '.join(view.fields) or 'none'}); "
                         "the loader benchmark needs images")
    if view.num_samples == 0:
        raise ValueError(f"{path}: the dataset has no samples")
    image = images[0]
    labels = [n for n, f in view.fields.items() if isinstance(f, IntField)]
    label = labels[0] if labels else None
    meta = view.metadata[image]
    one_size = bool(meta["height"].min() == meta["height"].max() and meta["width"].min() == meta["width"].max())
    return {"format": view.format, "num_samples": view.num_samples, "image_field": image,
            "label_field": label,
            "disabled_fields": [n for n in view.fields if n not in (image, label)],
            "one_size": one_size,
            "size": (int(meta["height"][0]), int(meta["width"][0])) if one_size else None,
            "jpeg_samples": int(np.count_nonzero(meta["mode"] == JPG))}


def choose_pipeline(info: dict, requested: str = "auto") -> str:
    """``'simple'`` for images of one size, ``'rrc'`` otherwise, unless ``requested`` names one
    of :data:`PIPELINES`. Raises ValueError for ``'simple'`` on images of several sizes."""
    if requested == "auto":
        return "simple" if info["one_size"] else "rrc"
    if requested not in PIPELINES:
        raise ValueError(f"unknown pipeline {requested!r}; expected auto or one of {', '.join(PIPELINES)}")
    if requested == "simple" and not info["one_size"]:
        raise ValueError("the images have several sizes: the 'simple' pipeline needs one size; use "
                         "--pipeline rrc or center")
    return requested


def ffcv_available() -> bool:
    """Whether ``ffcv`` is importable (checked without importing it)."""
    return importlib.util.find_spec("ffcv") is not None


def plan_configs(path: str, info: dict, pipeline: str, batch_size: int, workers: Sequence[int],
                 epochs: int, size: int = 224, compare: bool = False, source_folder: Optional[str] = None,
                 seed: int = 0, limit: Optional[int] = None) -> Tuple[List[BenchConfig], List[str]]:
    """The measurements of one ``ffload bench`` invocation, in interleaving order.

    ffload always; with ``compare``: ffcv (a ``.beton`` and ffcv installed), the in-memory
    ``DataLoader`` (``simple`` pipeline), ``DataLoader`` + PIL (``source_folder`` given) and the
    decode ceiling (JPEG samples present), for each worker count. Returns
    ``(configs, notes)``, the notes saying which comparisons were skipped and why."""
    notes = []
    kinds = ["ffload"]
    if compare:
        if info["format"] != "beton":
            notes.append("ffcv: skipped, ffcv reads .beton files only")
        elif not ffcv_available():
            notes.append("ffcv: skipped, not installed (pip install 'ffload[ffcv]')")
        else:
            kinds.append("ffcv")
        if pipeline == "simple":
            kinds.append("dataloader_arrays")
        if source_folder:
            kinds.append("dataloader_pil")
        else:
            notes.append("dataloader_pil: skipped, pass --source-folder (the ImageFolder the dataset was "
                         "converted from)")
        if info["jpeg_samples"]:
            kinds.append("decode_ceiling")
    common = dict(pipeline=pipeline, batch_size=batch_size, epochs=epochs, size=size,
                  image_field=info["image_field"], label_field=info["label_field"],
                  disabled_fields=tuple(info["disabled_fields"]), seed=seed, limit=limit)
    configs = []
    for w in workers:
        for kind in kinds:
            configs.append(BenchConfig(kind=kind, path=source_folder if kind == "dataloader_pil" else path,
                                       num_workers=w, **common))
    return configs, notes


def _parse_workers(text: str) -> List[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise click.BadParameter(f"expected comma-separated integers, got {text!r}", param_hint="--workers-list")
    if not values or min(values) < 1:
        raise click.BadParameter(f"expected integers >= 1, got {text!r}", param_hint="--workers-list")
    return sorted(set(values))


@click.command("bench")
@click.argument("path", type=click.Path(exists=True))
@click.option("--pipeline", type=click.Choice(("auto",) + PIPELINES), default="auto", show_default=True,
              help="auto: simple (decode + flip) for images of one size, else rrc (RandomResizedCrop + flip).")
@click.option("--size", type=click.IntRange(min=1), default=224, show_default=True,
              help="Output side of the rrc / center pipelines, pixels.")
@click.option("--epochs", type=click.IntRange(min=1), default=3, show_default=True,
              help="Epochs per measurement; epoch 0 (warm-up, compilation) is reported apart.")
@click.option("--batch-size", type=click.IntRange(min=1), default=None,
              help="Default: 512 for the simple pipeline, 128 for the crops.")
@click.option("--num-workers", type=click.IntRange(min=1), default=None, help="Default: all CPUs.")
@click.option("--repeats", type=click.IntRange(min=1), default=1, show_default=True,
              help="Interleaved rounds (medians are reported).")
@click.option("--compare", is_flag=True,
              help="Also measure ffcv's Loader, PyTorch DataLoader baselines and the decode ceiling.")
@click.option("--source-folder", type=click.Path(exists=True, file_okay=False), default=None,
              help="The ImageFolder PATH was converted from, for the DataLoader + PIL baseline.")
@click.option("--plot", type=click.Path(dir_okay=False), default=None,
              help="Write a PNG of images/s against num_workers (measures every --workers-list value).")
@click.option("--workers-list", default=None, help="Worker counts for --plot, e.g. 1,2 (default: 1 and --num-workers).")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="Use only the first N samples.")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True)
@click.option("--timeout", type=click.FloatRange(min=1), default=None, help="Seconds per measurement.")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
def bench_command(path, pipeline, size, epochs, batch_size, num_workers, repeats, compare, source_folder,
                  plot, workers_list, limit, seed, timeout, as_json):
    """Measure loading speed of PATH (a .beton file or an LMDB directory): images/s per epoch,
    time to the first batch, peak RSS; with --compare, side by side with ffcv and PyTorch
    DataLoader, each loader in its own process, rounds interleaved."""
    from ffload.formats import DatasetError

    try:
        info = describe_dataset(path)
        pipeline = choose_pipeline(info, pipeline)
    except (DatasetError, ValueError, OSError) as e:
        raise click.ClickException(str(e))
    from ffload.system import available_cpus  # here: workers load this file by path

    num_workers = num_workers or available_cpus()
    batch_size = batch_size or DEFAULT_BATCH_SIZE[pipeline]
    workers = _parse_workers(workers_list) if workers_list else sorted({1, num_workers})
    if not plot:
        workers = [num_workers]
    configs, notes = plan_configs(path, info, pipeline, batch_size, workers, epochs, size, compare,
                                  source_folder, seed, limit)
    shape = f"{info['size'][1]}x{info['size'][0]}" if info["one_size"] and pipeline == "simple" else f"{size}x{size}"
    header = (f"{path} ({info['format']}, {info['num_samples']} samples, {info['jpeg_samples']} JPEG): pipeline "
              f"{pipeline} -> {shape} + flip, batch {batch_size}, {epochs} epochs (epoch 0 reported apart), "
              f"{repeats} round(s)")

    def progress(result):
        if not as_json:
            status = (f"{result['img_s']:.0f} img/s" if "error" not in result else f"FAILED: {result['error'][:300]}")
            click.echo(f"  [{result['round'] + 1}/{repeats}] {result['name']} ({result['config']['num_workers']} "
                       f"workers): {status}", err=True)

    if not as_json:
        click.echo(header, err=True)
    results = run_rounds(configs, repeats, timeout, progress)
    rows = summarize(results)
    pairs = [("ffload", k) for k in KINDS if k != "ffload"] + [("ffload", "decode_ceiling (threads)")]
    ratios = compute_ratios(rows, pairs)
    if plot:
        try:
            plot_throughput(rows, plot, header)
        except (ValueError, OSError) as e:
            raise click.ClickException(f"--plot {plot}: {e}")
    if as_json:
        click.echo(json.dumps({"header": header, "dataset": info, "rows": rows, "ratios": ratios,
                               "notes": notes, "runs": results, "plot": plot}, indent=2))
    else:
        click.echo(header)
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


if __name__ == "__main__":  # pragma: no cover
    bench_command()
