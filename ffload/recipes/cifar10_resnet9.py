"""ResNet-9 on CIFAR-10 with ffload: convert once, train with FFCV's CIFAR hyperparameters.

Usage::

    ffload recipe cifar10-resnet9 --data ~/data/cifar-10-batches-py --out runs/r9
    python -m ffload.recipes.cifar10_resnet9 --data ~/data/cifar-10-batches-py --out runs/r9
    python -m ffload.recipes.cifar10_resnet9 --demo --out runs/digits --device cpu   # offline

``--data`` is either the official ``cifar-10-batches-py`` folder (``data_batch_1..5`` and
``test_batch``; the folder that contains it is accepted too) or an ImageFolder with ``train/``
and ``test/`` sub-folders (``train/<class>/<image>``; all images of one size, 32x32 for the
model as published). ffload downloads nothing: ``torchvision.datasets.CIFAR10(root,
download=True)`` (or the archive from https://www.cs.toronto.edu/~kriz/cifar.html, extracted)
produces ``root/cifar-10-batches-py``; copy that folder anywhere and point ``--data`` at it.

The data is converted once into ``.beton`` files (``--format beton``) or LMDB directories
(``--format lmdb``) in a cache next to ``--out`` (``<parent of --out>/ffload-cache``, or
``--cache-dir``), keyed by a fingerprint of the source (relative file names, sizes and
modification times) and the conversion arguments; a later run with an unchanged source reuses
it. ``convert_dataset`` writes atomically and the cache marker is written after both splits, so
an interrupted run leaves a cache entry complete or ignored.

Training follows FFCV's ``examples/cifar`` (model from KakaoBrain's torchskeleton): batch 512,
24 epochs, SGD (momentum 0.9, weight decay 5e-4 on all parameters, no Nesterov, as FFCV) with a triangular
learning rate per iteration rising linearly from 0 to ``lr * batch_size / 512`` (``lr`` = 0.5)
at epoch 5 and back to 0 at the last iteration, label smoothing 0.1, random horizontal flip +
``RandomTranslate(padding=2, fill=mean)`` + ``Cutout(4, fill=mean)``, test-time averaging of the
logits of the image and its horizontal mirror, fp16 autocast and channels_last on CUDA. Two of
that example's bugs are not reproduced: the CIFAR-10 standard deviation is the true one, (62.99,
62.09, 66.70) in 0-255 units (0.2470, 0.2435, 0.2616), not (51.59, 50.85, 51.26); the test-time
mirror flips the width axis (``torch.flip(x, dims=[3])``), not the channel axis of NCHW tensors
(``ch.fliplr`` in FFCV's tutorial). For runs shorter than 24 epochs the peak moves to
``5 * epochs / 24`` so the schedule keeps its shape.

``--demo`` needs no download: it trains on the 1797 scikit-learn digits (32x32 RGB PNGs, 80/20
split) with defaults ``--width 0.25 --epochs 8 --batch-size 64`` and reached 98.0-98.6% test
accuracy in 17-35 s of wall time on 2 shared CPU cores (``--device cpu``).

Reports (in ``--out``): the per-epoch table (train loss, train accuracy, test accuracy, epoch
seconds, images/s, data-wait fraction), ``metrics.json`` and ``accuracy.png`` (test accuracy vs
training wall time). Target on real CIFAR-10 with a GPU: >= 93.5% test accuracy, data wait
<= 2%.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional, Tuple

import click
import numpy as np
import torch
from torch import nn

import ffload
from ffload.recipes.report import (EpochStats, cost_usd, format_header, format_row,
                                   format_summary, plot_accuracy, rows_to_dicts, write_json)
from ffload.recipes.resnet9 import resnet9

__all__ = ["CIFAR_MEAN", "CIFAR_STD", "RecipeConfig", "RecipeError", "PreparedData",
           "detect_layout", "prepare_data", "make_loaders", "lr_schedule", "train_model",
           "evaluate", "demo_folder", "run_recipe", "recipe_command", "main"]

# CIFAR-10 training-set statistics per RGB channel, 0-255 units (std: population std of all
# training pixels of the channel; FFCV's example uses 51.59/50.85/51.26, which are wrong).
CIFAR_MEAN = (125.307, 122.950, 113.865)
CIFAR_STD = (62.993, 62.089, 66.705)

CIFAR_FILES = tuple(f"data_batch_{i}" for i in range(1, 6)) + ("test_batch", "batches.meta")
CIFAR_FOLDER = "cifar-10-batches-py"


class RecipeError(click.ClickException):
    """A problem with the recipe's inputs (data folder, output folder, device), raised before
    training starts; ``str(e)`` names the path and the cause, the CLI prints ``Error: ...`` and
    exits with status 1."""


@dataclass
class RecipeConfig:
    """Hyperparameters (FFCV's CIFAR example, see the module docstring).

    Attributes:
        epochs: passes over the training set.
        batch_size: images per step (the last partial training batch is dropped).
        lr: peak learning rate at batch size 512; the peak used is ``lr * batch_size / 512``.
        lr_peak_epoch: epoch of the triangle's peak for runs of >= 24 epochs (scaled by
            ``epochs / 24`` for shorter runs, see :func:`lr_schedule`).
        momentum, nesterov, weight_decay: SGD's.
        label_smoothing: of the cross-entropy loss.
        width: ResNet-9 channel multiplier (1 = the published model).
        seed: model initialisation, loader order and augmentation seed.
        tta: average the logits of each test image and its horizontal mirror.
    """

    epochs: int = 24
    batch_size: int = 512
    lr: float = 0.5
    lr_peak_epoch: float = 5.0
    momentum: float = 0.9
    nesterov: bool = False
    weight_decay: float = 5e-4
    label_smoothing: float = 0.1
    width: float = 1.0
    seed: int = 0
    tta: bool = True


@dataclass
class PreparedData:
    """Converted train/test datasets ready for :func:`make_loaders`.

    Attributes:
        train_path, test_path: the ``.beton`` files or LMDB directories.
        format: ``'beton'`` or ``'lmdb'``.
        layout: ``'cifar'`` or ``'imagefolder'`` (the source's).
        num_classes: ``max label + 1`` over both splits.
        image_shape: ``(H, W)`` pixels, identical for every image.
        num_train, num_test: sample counts.
        cache_hit: True when the conversion was reused.
        convert_seconds: wall seconds spent converting (0 on a cache hit).
    """

    train_path: str
    test_path: str
    format: str
    layout: str
    num_classes: int
    image_shape: Tuple[int, int]
    num_train: int
    num_test: int
    cache_hit: bool
    convert_seconds: float


# --------------------------------------------------------------------------- data preparation

def detect_layout(data_dir: os.PathLike) -> Tuple[str, Path]:
    """Which of the two accepted layouts ``data_dir`` holds.

    Returns:
        ``('cifar', folder)`` when ``folder`` (``data_dir`` or its ``cifar-10-batches-py``
        sub-folder) holds any of ``data_batch_1..5``, ``test_batch``, ``batches.meta``;
        ``('imagefolder', data_dir)`` when it has ``train/`` and ``test/`` sub-folders.

    Raises:
        RecipeError: missing folder, neither layout, or a CIFAR folder missing some of those
            files (naming them). Corrupt files are found by :func:`prepare_data`.
    """
    root = Path(data_dir)
    if not root.is_dir():
        raise RecipeError(f"--data {root}: no such directory")
    for folder in (root, root / CIFAR_FOLDER):
        present = [n for n in CIFAR_FILES if (folder / n).is_file()]
        if present:
            missing = [n for n in CIFAR_FILES if n not in present]
            if missing:
                raise RecipeError(f"--data {folder}: CIFAR-10 archive folder is missing "
                                  f"{', '.join(missing)}")
            return "cifar", folder
    if (root / "train").is_dir() and (root / "test").is_dir():
        return "imagefolder", root
    raise RecipeError(
        f"--data {root}: neither a CIFAR-10 archive folder ({CIFAR_FOLDER}: data_batch_1..5, "
        f"test_batch, batches.meta) nor an ImageFolder with train/ and test/ sub-folders")


def source_fingerprint(folder: Path, args: Dict) -> str:
    """SHA-256 (hex) of ``args`` (JSON) and every file under ``folder``: relative path, size in
    bytes and modification time in ns. Changes when a file is added, removed, resized or
    touched, or when the conversion arguments change."""
    h = hashlib.sha256(json.dumps(args, sort_keys=True).encode())
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames.sort()
        for name in sorted(filenames):
            p = Path(dirpath) / name
            st = p.stat()
            h.update(f"{p.relative_to(folder).as_posix()}\0{st.st_size}\0{st.st_mtime_ns}\n"
                     .encode())
    return h.hexdigest()


def _sources(layout: str, folder: Path):
    from ffload.convert.sources import CIFARSource, ImageFolderSource

    if layout == "cifar":
        return CIFARSource(folder, train=True), CIFARSource(folder, train=False)
    return ImageFolderSource(folder / "train"), ImageFolderSource(folder / "test")


def _inspect(path: str, split: str) -> Tuple[int, Tuple[int, int], int]:
    """``(num_samples, (H, W), max_label)`` of a converted split; RecipeError when its images
    differ in size (the batches of the recipe need one size)."""
    from ffload.formats import open_dataset

    view = open_dataset(path)
    for name in ("image", "label"):
        if name not in view.fields:
            raise RecipeError(f"{path}: no '{name}' field (fields: {list(view.fields)})")
    meta = view.metadata["image"]
    sizes = np.unique(np.stack([meta["height"], meta["width"]], axis=1), axis=0)
    if len(sizes) != 1:
        raise RecipeError(f"{split} images have {len(sizes)} different sizes (e.g. "
                          f"{', '.join(f'{h}x{w}' for h, w in sizes[:3])}); this recipe "
                          f"needs one size (32x32 for CIFAR-10)")
    labels = np.asarray(view.metadata["label"])
    if labels.min() < 0:
        raise RecipeError(f"{path}: negative label {labels.min()}")
    return view.num_samples, (int(sizes[0][0]), int(sizes[0][1])), int(labels.max())


def prepare_data(data_dir: os.PathLike, cache_dir: os.PathLike, fmt: str = "beton",
                 num_workers: Optional[int] = None, progress: bool = True) -> PreparedData:
    """Convert ``data_dir`` (see :func:`detect_layout`) once into ``cache_dir`` and return the
    converted splits; reuse them when the fingerprint (see :func:`source_fingerprint`) matches.

    The entry is ``cache_dir/<layout>-<fmt>-<fingerprint[:16]>/{train,test}.{beton,lmdb}`` and
    ``complete.json`` is written (atomically) only after both splits, so an interrupted
    conversion is redone, never half-used. Images are stored raw (lossless).

    Raises:
        RecipeError: bad layout, missing/corrupt CIFAR batch, undecodable image, images of
            several sizes, unwritable cache (the message names the path and the cause).
        ValueError: ``fmt`` not ``'beton'`` or ``'lmdb'``.
    """
    if fmt not in ("beton", "lmdb"):
        raise ValueError(f"format must be 'beton' or 'lmdb', got {fmt!r}")
    from ffload.convert import ConvertError, convert_dataset

    layout, folder = detect_layout(data_dir)
    args = {"layout": layout, "format": fmt, "write_mode": "raw", "ffload": ffload.__version__}
    fp = source_fingerprint(folder, args)
    entry = Path(cache_dir) / f"{layout}-{fmt}-{fp[:16]}"
    paths = {split: str(entry / f"{split}.{fmt}") for split in ("train", "test")}
    marker = entry / "complete.json"
    t0 = time.perf_counter()
    cache_hit = False
    try:
        if marker.is_file() and json.loads(marker.read_text()).get("fingerprint") == fp \
                and all(os.path.exists(p) for p in paths.values()):
            cache_hit = True
        else:
            train_src, test_src = _sources(layout, folder)
            if train_src.classes != test_src.classes:
                raise RecipeError(f"--data {folder}: train and test have different classes "
                                  f"({train_src.classes} vs {test_src.classes}), so their "
                                  f"labels would not match")
            entry.mkdir(parents=True, exist_ok=True)
            for split, src in (("train", train_src), ("test", test_src)):
                convert_dataset(src, paths[split], write_mode="raw", num_workers=num_workers,
                                on_error="fail", overwrite=True, progress=progress)
            write_json(marker, {"fingerprint": fp, "source": str(folder), **args})
        (num_train, shape, max_train), (num_test, shape_test, max_test) = (
            _inspect(paths["train"], "train"), _inspect(paths["test"], "test"))
    except (ValueError, OSError, ConvertError) as e:  # SourceError, DatasetError, disk errors
        raise RecipeError(f"cannot convert {folder} into {entry}: {e}") from e
    if shape != shape_test:
        raise RecipeError(f"--data {folder}: train images are {shape[0]}x{shape[1]} but test "
                          f"images are {shape_test[0]}x{shape_test[1]}")
    return PreparedData(paths["train"], paths["test"], fmt, layout, max(max_train, max_test) + 1,
                        shape, num_train, num_test, cache_hit,
                        0.0 if cache_hit else time.perf_counter() - t0)


# --------------------------------------------------------------------------- loaders

def make_loaders(data: PreparedData, batch_size: int, num_workers: int, device: torch.device,
                 seed: int = 0):
    """ffload loaders of the recipe (FFCV's CIFAR pipelines, true CIFAR std).

    Train: random order, drop_last, ``SimpleRGBImageDecoder -> RandomHorizontalFlip ->
    RandomTranslate(2, fill=mean) -> Cutout(4, fill=mean) -> ToTensor -> ToDevice ->
    ToTorchImage(channels_last) -> NormalizeImage(mean, std)``. Test: sequential, every sample,
    no augmentation. Labels: ``IntDecoder -> ToTensor -> ToDevice -> Squeeze``.

    Returns:
        ``(train_loader, test_loader)``; each yields ``(images (B, 3, H, W) float16 on CUDA /
        float32 on CPU, channels_last, labels (B,) int64)`` on ``device``.
    """
    from ffload import Loader
    from ffload.loaders import (Cutout, IntDecoder, NormalizeImage, RandomHorizontalFlip,
                                RandomTranslate, SimpleRGBImageDecoder, Squeeze, ToDevice,
                                ToTensor, ToTorchImage)

    fill = tuple(int(round(m)) for m in CIFAR_MEAN)
    dtype = torch.float16 if device.type == "cuda" else torch.float32
    loaders = []
    for path, train in ((data.train_path, True), (data.test_path, False)):
        augment = [RandomHorizontalFlip(), RandomTranslate(padding=2, fill=fill),
                   Cutout(4, fill)] if train else []
        image = [SimpleRGBImageDecoder(), *augment, ToTensor(),
                 ToDevice(device, non_blocking=True), ToTorchImage(channels_last=True),
                 NormalizeImage(np.array(CIFAR_MEAN), np.array(CIFAR_STD), dtype)]
        label = [IntDecoder(), ToTensor(), ToDevice(device, non_blocking=True), Squeeze()]
        loaders.append(Loader(path, batch_size=batch_size, num_workers=num_workers,
                              order="random" if train else "sequential",
                              pipelines={"image": image, "label": label},
                              drop_last=train, seed=seed))
    return tuple(loaders)


# --------------------------------------------------------------------------- training

def lr_schedule(config: RecipeConfig, iters_per_epoch: int) -> np.ndarray:
    """Per-iteration learning-rate multipliers, ``(epochs * iters_per_epoch,) float64``: linear
    from 0 at iteration 0 to 1 at ``peak * iters_per_epoch`` and back to 0 at the end (FFCV's
    ``np.interp`` triangle), with ``peak = lr_peak_epoch * min(1, epochs / 24)``: FFCV's peak
    for runs of 24 epochs or more, the same fraction of the run for shorter ones.

    Raises:
        ValueError: ``peak`` not in ``(0, epochs]``.
    """
    peak_epoch = config.lr_peak_epoch * min(1.0, config.epochs / 24)
    if not 0 < peak_epoch <= config.epochs:
        raise ValueError(f"lr_peak_epoch={config.lr_peak_epoch} puts the learning-rate peak at "
                         f"epoch {peak_epoch:g}, outside (0, epochs={config.epochs}]")
    total = config.epochs * iters_per_epoch
    return np.interp(np.arange(total), [0, peak_epoch * iters_per_epoch, total], [0.0, 1.0, 0.0])


class _WaitClock:
    """Seconds the training loop waits for batches.

    CPU: wall time inside ``iter()`` and ``next()`` of the loader. CUDA: the device's idle time
    between finishing the work queued before those calls and the batch being usable on the
    current stream, from two CUDA events around each call; this counts time the host spent
    blocked in the loader while the device had nothing queued, and any wait of the stream on
    the (non_blocking) copy, but not host time in the loader that overlapped queued device work
    (that costs nothing).
    """

    def __init__(self, device: torch.device):
        self.stream = torch.cuda.current_stream(device) if device.type == "cuda" else None
        self.host = 0.0
        self.events: List[Tuple[torch.cuda.Event, torch.cuda.Event]] = []

    def call(self, fn, arg):
        """``fn(arg)`` (``iter``/``next`` on the loader), timed."""
        if self.stream is not None:
            before = torch.cuda.Event(enable_timing=True)
            before.record(self.stream)
        t0 = time.perf_counter()
        try:
            return fn(arg)
        finally:
            self.host += time.perf_counter() - t0
            if self.stream is not None:
                after = torch.cuda.Event(enable_timing=True)
                after.record(self.stream)
                self.events.append((before, after))

    def seconds(self) -> float:
        """The epoch's total wait (call after synchronising the device)."""
        if self.stream is not None:
            return sum(b.elapsed_time(a) for b, a in self.events) / 1000.0
        return self.host


def evaluate(model: nn.Module, loader: Iterable, device: torch.device, tta: bool = True) -> float:
    """Fraction of ``loader``'s samples whose argmax logit equals the label; with ``tta`` the
    logits of the batch and its horizontal mirror (``torch.flip(x, dims=[3])``, the width of
    NCHW) are summed first. ``loader`` yields ``(images (B, 3, H, W), labels (B,))``."""
    model.eval()
    correct = torch.zeros((), dtype=torch.int64, device=device)
    total = 0
    with torch.no_grad(), torch.autocast(device.type, dtype=torch.float16,
                                         enabled=device.type == "cuda"):
        for images, labels in loader:
            out = model(images)
            if tta:
                out = out + model(torch.flip(images, dims=[3]))
            correct += (out.argmax(1) == labels).sum()
            total += labels.shape[0]
    return correct.item() / max(total, 1)


def train_model(model: nn.Module, train_loader, test_loader, config: RecipeConfig,
                device: torch.device,
                on_epoch: Optional[Callable[[EpochStats], None]] = None
                ) -> Tuple[List[EpochStats], List[float]]:
    """Train ``model`` with the recipe's optimiser and schedule, evaluating after every epoch.

    Args:
        model: on ``device`` (channels_last on CUDA).
        train_loader, test_loader: re-iterable, ``len()`` = batches per epoch, yielding
            ``(images (B, 3, H, W) float, labels (B,) int64)`` on ``device`` (ffload loaders from
            :func:`make_loaders` or :class:`ffload.recipes.vanilla.VanillaLoader`).
        config: hyperparameters.
        device: the training device; on CUDA the step runs under fp16 autocast with a
            ``GradScaler``.
        on_epoch: called with each epoch's :class:`EpochStats` as soon as it is measured.

    Returns:
        ``(rows, iteration_losses)``: one :class:`EpochStats` per epoch and the training loss of
        every step (floats, in order).

    Raises:
        ValueError: the training loader yields no batch per epoch (fewer samples than
            ``batch_size``).
    """
    iters = len(train_loader)
    if iters == 0:
        raise ValueError(f"the training set has fewer samples than batch_size="
                         f"{config.batch_size}: no full batch per epoch")
    schedule = lr_schedule(config, iters)
    opt = torch.optim.SGD(model.parameters(), lr=config.lr * config.batch_size / 512,
                          momentum=config.momentum, nesterov=config.nesterov,
                          weight_decay=config.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda step: schedule[min(step, len(schedule) - 1)])
    cuda = device.type == "cuda"
    if cuda:
        torch.backends.cudnn.benchmark = True  # fixed input shapes: let cuDNN pick its kernels
    scaler = torch.amp.GradScaler("cuda", enabled=cuda)
    loss_fn = nn.CrossEntropyLoss(label_smoothing=config.label_smoothing)
    rows: List[EpochStats] = []
    all_losses: List[float] = []
    train_total = 0.0
    for epoch in range(config.epochs):
        model.train()
        clock = _WaitClock(device)
        losses, correct, seen = [], torch.zeros((), dtype=torch.int64, device=device), 0
        _sync(device)
        t0 = time.perf_counter()
        iterator = clock.call(iter, train_loader)
        while True:
            try:
                images, labels = clock.call(next, iterator)
            except StopIteration:
                break
            opt.zero_grad(set_to_none=True)
            with torch.autocast(device.type, dtype=torch.float16, enabled=cuda):
                out = model(images)
                loss = loss_fn(out, labels)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            scheduler.step()
            losses.append(loss.detach())
            correct += (out.detach().argmax(1) == labels).sum()
            seen += labels.shape[0]
        _sync(device)
        epoch_seconds = time.perf_counter() - t0
        wait = clock.seconds()
        epoch_losses = torch.stack(losses).float().cpu().tolist()
        all_losses.extend(epoch_losses)
        train_total += epoch_seconds
        t1 = time.perf_counter()
        test_acc = evaluate(model, test_loader, device, config.tta)
        row = EpochStats(
            epoch=epoch, train_loss=float(np.mean(epoch_losses)),
            train_accuracy=correct.item() / seen, test_accuracy=test_acc,
            epoch_seconds=epoch_seconds, eval_seconds=time.perf_counter() - t1,
            images_per_second=seen / epoch_seconds, data_wait_seconds=wait,
            data_wait_fraction=wait / epoch_seconds, train_seconds_total=train_total)
        rows.append(row)
        if on_epoch is not None:
            on_epoch(row)
    return rows, all_losses


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# --------------------------------------------------------------------------- the run

def resolve_device(name: Optional[str]) -> torch.device:
    """``'cuda'`` / ``'cpu'`` / ``'cuda:N'`` / ``None`` (CUDA when available, else CPU) as a
    ``torch.device``; CUDA devices get an explicit index (``'cuda'`` is the current device).

    Raises:
        RecipeError: CUDA asked for but not available, or an unknown device name.
    """
    if name is None:
        name = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(name)
    except RuntimeError as e:
        raise RecipeError(f"--device {name}: {e}") from e
    if device.type not in ("cuda", "cpu"):
        raise RecipeError(f"--device {name}: only cuda and cpu are supported")
    if device.type == "cpu":
        return device
    if not torch.cuda.is_available():
        raise RecipeError(f"--device {name}: CUDA is not available on this machine "
                          f"(torch {torch.__version__}); use --device cpu")
    index = torch.cuda.current_device() if device.index is None else device.index
    if index >= torch.cuda.device_count():
        raise RecipeError(f"--device {name}: this machine has {torch.cuda.device_count()} "
                          f"CUDA device(s)")
    return torch.device("cuda", index)


def ensure_writable(out: os.PathLike) -> Path:
    """Create ``out`` (and parents) and check a file can be written in it.

    Raises:
        RecipeError: it cannot be created or written (names the path and the OS error).
    """
    out = Path(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out):
            pass
    except OSError as e:
        raise RecipeError(f"--out {out}: cannot write there ({e.strerror or e})") from e
    return out


def demo_folder(out: os.PathLike) -> Path:
    """``out/digits``: the scikit-learn digits as a 32x32 RGB PNG ImageFolder (``train/``,
    ``test/``, 80/20 stratified, :func:`ffload.convert.demo_data.build_digits_folder`), built
    once in a temporary folder and renamed into place, so it is complete or absent."""
    from ffload.convert.demo_data import build_digits_folder

    folder = Path(out) / "digits"
    if not folder.is_dir():
        tmp = tempfile.mkdtemp(prefix=".digits-", dir=out)
        try:
            build_digits_folder(tmp, size=32, test_fraction=0.2, seed=0)
            os.replace(tmp, folder)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return folder


def run_recipe(data_dir: Optional[os.PathLike], out: os.PathLike, config: RecipeConfig,
               fmt: str = "beton", device: Optional[str] = None,
               num_workers: Optional[int] = None, price_per_hour: float = 0.0,
               cache_dir: Optional[os.PathLike] = None, demo: bool = False,
               progress: bool = True,
               echo: Callable[[str], None] = lambda s: None) -> Dict:
    """The whole recipe: validate, convert (cached), train, evaluate, write the reports.

    Args:
        data_dir: CIFAR-10 archive folder or ImageFolder (see :func:`detect_layout`); ignored
            (must be ``None``) with ``demo``.
        out: report folder (``metrics.json``, ``accuracy.png``; the demo's digits too).
        config: hyperparameters.
        fmt: ``'beton'`` or ``'lmdb'``.
        device: see :func:`resolve_device`.
        num_workers: loader threads (default ``min(8, os.cpu_count())``).
        price_per_hour: USD per device-hour for the cost line.
        cache_dir: conversion cache (default ``<parent of out>/ffload-cache``).
        demo: build the scikit-learn digits as a 32x32 RGB ImageFolder under ``out/digits``
            (:func:`ffload.convert.demo_data.build_digits_folder`) and train on it.
        progress: conversion progress bars.
        echo: receives the table lines as they are produced (the CLI prints them).

    Returns:
        the ``metrics.json`` dict: ``final_test_accuracy`` (fraction), ``total_seconds`` (wall,
        conversion included), ``train_seconds``, ``eval_seconds``, ``convert_seconds``,
        ``device_hours``, ``cost_usd``, ``price_per_hour``, ``mean_data_wait_fraction``,
        ``epochs`` (rows, see :class:`EpochStats`), ``iteration_losses``, ``config``, ``data``,
        ``device``, ``num_parameters``, ``versions``.

    Raises:
        RecipeError: bad data folder, output folder or device, before any training.
        ValueError: bad ``fmt`` or hyperparameters.
    """
    start = time.perf_counter()
    if demo == (data_dir is not None):
        raise RecipeError("give exactly one of --data DIR and --demo")
    if config.epochs < 1 or config.batch_size < 1 or not config.width > 0:
        raise ValueError(f"epochs and batch_size must be >= 1 and width > 0, got {config}")
    dev = resolve_device(device)
    out = ensure_writable(out)
    cache_dir = Path(cache_dir) if cache_dir is not None else out.resolve().parent / "ffload-cache"
    num_workers = num_workers or min(8, os.cpu_count() or 1)
    if demo:
        data_dir = demo_folder(out)
    data = prepare_data(data_dir, cache_dir, fmt, num_workers, progress)
    echo(f"data: {data.layout} {data_dir} -> {data.format} "
         f"({'cached' if data.cache_hit else f'converted in {data.convert_seconds:.1f} s'}): "
         f"{data.num_train} train / {data.num_test} test images, {data.num_classes} classes")
    if data.num_train < config.batch_size:
        raise RecipeError(f"--batch-size {config.batch_size} is larger than the training set "
                          f"({data.num_train} images)")
    torch.manual_seed(config.seed)
    model = resnet9(num_classes=data.num_classes, width=config.width)
    model = model.to(device=dev, memory_format=torch.channels_last)
    train_loader, test_loader = make_loaders(data, config.batch_size, num_workers, dev,
                                             config.seed)
    echo(f"device: {dev}, {sum(p.numel() for p in model.parameters()):,} parameters, "
         f"{num_workers} loader workers")
    echo(format_header())
    rows, losses = train_model(model, train_loader, test_loader, config, dev,
                               on_epoch=lambda r: echo(format_row(r)))
    total = time.perf_counter() - start
    train_seconds = sum(r.epoch_seconds for r in rows)
    metrics = {
        "final_test_accuracy": rows[-1].test_accuracy,
        "total_seconds": total,
        "train_seconds": train_seconds,
        "eval_seconds": sum(r.eval_seconds for r in rows),
        "convert_seconds": data.convert_seconds,
        "device_hours": total / 3600.0,
        "cost_usd": cost_usd(total, price_per_hour),
        "price_per_hour": price_per_hour,
        "mean_data_wait_fraction": sum(r.data_wait_seconds for r in rows) / train_seconds,
        "epochs": rows_to_dicts(rows),
        "iteration_losses": losses,
        "config": asdict(config),
        "data": {**asdict(data), "source": str(data_dir)},
        "device": str(dev) if dev.type == "cpu" else f"{dev} ({torch.cuda.get_device_name(dev)})",
        "num_workers": num_workers,
        "num_parameters": sum(p.numel() for p in model.parameters()),
        "versions": {"ffload": ffload.__version__, "torch": torch.__version__,
                     "python": platform.python_version()},
    }
    write_json(out / "metrics.json", metrics)
    plot_accuracy(rows, out / "accuracy.png",
                  title=f"ResNet-9 (width {config.width}) on {data.layout}, {data.format}")
    echo(format_summary(metrics))
    echo(f"wrote {out / 'metrics.json'} and {out / 'accuracy.png'}")
    return metrics


# --------------------------------------------------------------------------- CLI

DEMO_DEFAULTS = {"epochs": 8, "batch_size": 64, "width": 0.25}
_DEFAULTS = RecipeConfig()


@click.command("cifar10-resnet9", help=__doc__.split("\n\n")[0])
@click.option("--data", "data_dir", type=click.Path(file_okay=False, path_type=Path),
              help="cifar-10-batches-py folder, or an ImageFolder with train/ and test/.")
@click.option("--out", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Report folder (metrics.json, accuracy.png).")
@click.option("--format", "fmt", type=click.Choice(["beton", "lmdb"]), default="beton",
              show_default=True, help="Converted format.")
@click.option("--epochs", type=click.IntRange(min=1),
              help=f"Epochs [default: {_DEFAULTS.epochs}; {DEMO_DEFAULTS['epochs']} with --demo].")
@click.option("--batch-size", type=click.IntRange(min=1),
              help=f"Batch size [default: {_DEFAULTS.batch_size}; "
                   f"{DEMO_DEFAULTS['batch_size']} with --demo].")
@click.option("--lr", type=click.FloatRange(min=0, min_open=True), default=_DEFAULTS.lr,
              show_default=True, help="Peak learning rate at batch 512 (scaled by batch/512).")
@click.option("--lr-peak-epoch", type=click.FloatRange(min=0, min_open=True),
              default=_DEFAULTS.lr_peak_epoch, show_default=True,
              help="Epoch of the learning-rate peak (scaled by epochs/24 below 24 epochs).")
@click.option("--device", type=str, default=None,
              help="cuda or cpu [default: cuda if available, else cpu].")
@click.option("--num-workers", type=click.IntRange(min=1), default=None,
              help="Loader threads [default: min(8, CPUs)].")
@click.option("--seed", type=click.IntRange(min=0), default=_DEFAULTS.seed, show_default=True,
              help="Initialisation, order and augmentation seed.")
@click.option("--width", type=click.FloatRange(min=0, min_open=True),
              help=f"Channel multiplier [default: 1; {DEMO_DEFAULTS['width']} with --demo].")
@click.option("--price-per-hour", type=click.FloatRange(min=0), default=0.0, show_default=True,
              help="USD per device-hour, for the cost line.")
@click.option("--cache-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Conversion cache [default: ffload-cache next to --out].")
@click.option("--demo", is_flag=True,
              help="Train on the scikit-learn digits (built under --out), offline.")
@click.option("--no-progress", is_flag=True, help="No conversion progress bars.")
def recipe_command(data_dir, out, fmt, epochs, batch_size, lr, lr_peak_epoch, device,
                   num_workers, seed, width, price_per_hour, cache_dir, demo, no_progress):
    if demo and data_dir is not None:
        raise click.UsageError("--data and --demo are mutually exclusive")
    if not demo and data_dir is None:
        raise click.UsageError("--data DIR is required (or --demo)")
    defaults = DEMO_DEFAULTS if demo else {}
    config = RecipeConfig(
        epochs=epochs or defaults.get("epochs", _DEFAULTS.epochs),
        batch_size=batch_size or defaults.get("batch_size", _DEFAULTS.batch_size),
        lr=lr, lr_peak_epoch=lr_peak_epoch, seed=seed,
        width=width or defaults.get("width", _DEFAULTS.width))
    run_recipe(data_dir, out, config, fmt=fmt, device=device, num_workers=num_workers,
               price_per_hour=price_per_hour, cache_dir=cache_dir, demo=demo,
               progress=not no_progress, echo=click.echo)


def main(args: Optional[List[str]] = None) -> None:
    """Run the command line (``args`` default to ``sys.argv[1:]``); exits like a click command."""
    recipe_command.main(args=args, prog_name="ffload recipe cifar10-resnet9")


if __name__ == "__main__":
    main()
