"""Data side of the ResNet-9 recipe (:mod:`ffload.recipes.cifar10_resnet9`): which layout a
``--data`` folder holds, its one-time conversion into a fingerprinted cache, the offline digits
demo folder and the ffload loaders with FFCV's CIFAR pipelines.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

import ffload
from ffload.errors import ConfigurationError, RecipeError
from ffload.recipes.report import write_json

__all__ = [
    "CIFAR_MEAN",
    "CIFAR_STD",
    "RecipeError",
    "PreparedData",
    "detect_layout",
    "source_fingerprint",
    "prepare_data",
    "demo_folder",
    "make_loaders",
]

# CIFAR-10 training-set statistics per RGB channel, 0-255 units (std: population std of all
# training pixels of the channel; FFCV's example uses 51.59/50.85/51.26, which are wrong).
CIFAR_MEAN = (125.307, 122.950, 113.865)
CIFAR_STD = (62.993, 62.089, 66.705)


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
    image_shape: tuple[int, int]
    num_train: int
    num_test: int
    cache_hit: bool
    convert_seconds: float


# --------------------------------------------------------------------------- data preparation


def detect_layout(data_dir: os.PathLike) -> tuple[str, Path]:
    """Which of the two accepted layouts ``data_dir`` holds, by ffload's one source detector
    (:func:`ffload.convert.sources.detect_kind`).

    Returns:
        ``('cifar', folder)`` when it finds a CIFAR-10 python folder at ``data_dir`` (or at
        torchvision's ``data_dir/cifar-10-batches-py``); ``('imagefolder', data_dir)`` when
        ``data_dir`` has ``train/`` and ``test/`` sub-folders.

    Raises:
        RecipeError: missing folder, neither layout, or a CIFAR folder missing some of its
            batch files (naming them). Corrupt files are found by :func:`prepare_data`.
    """
    from ffload.convert.sources import detect_kind
    from ffload.convert.sources.cifar import TORCHVISION_FOLDERS, missing_cifar_files

    root = Path(data_dir)
    if not root.is_dir():
        raise RecipeError(f"--data {root}: no such directory")
    kind, folder = detect_kind(root)
    if kind.name == "cifar10":
        missing = missing_cifar_files(folder, "cifar10")
        if missing:
            raise RecipeError(f"--data {folder}: CIFAR-10 archive folder is missing {', '.join(missing)}")
        return "cifar", Path(folder)
    if (root / "train").is_dir() and (root / "test").is_dir():
        return "imagefolder", root
    raise RecipeError(
        f"--data {root}: neither a CIFAR-10 archive folder ({TORCHVISION_FOLDERS['cifar10']}: "
        f"data_batch_1..5, test_batch, batches.meta) nor an ImageFolder with train/ and test/ sub-folders"
    )


def source_fingerprint(folder: Path, args: dict) -> str:
    """SHA-256 (hex) of ``args`` (JSON) and every file under ``folder``: relative path, size in
    bytes and modification time in ns. Changes when a file is added, removed, resized or
    touched, or when the conversion arguments change."""
    h = hashlib.sha256(json.dumps(args, sort_keys=True).encode())
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames.sort()
        for name in sorted(filenames):
            p = Path(dirpath) / name
            st = p.stat()
            h.update(f"{p.relative_to(folder).as_posix()}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def _sources(layout: str, folder: Path):
    from ffload.convert.sources import CIFARSource, ImageFolderSource

    if layout == "cifar":
        return CIFARSource(folder, train=True), CIFARSource(folder, train=False)
    return ImageFolderSource(folder / "train"), ImageFolderSource(folder / "test")


def _inspect(path: str, split: str) -> tuple[int, tuple[int, int], int]:
    """``(num_samples, (H, W), max_label)`` of a converted split; RecipeError when its images
    differ in size (the batches of the recipe need one size)."""
    from ffload.formats import image_sizes, open_dataset

    view = open_dataset(path)
    for name in ("image", "label"):
        if name not in view.fields:
            raise RecipeError(f"{path}: no '{name}' field (fields: {list(view.fields)})")
    sizes = image_sizes(view.metadata["image"])
    if len(sizes) != 1:
        raise RecipeError(
            f"{split} images have {len(sizes)} different sizes (e.g. "
            f"{', '.join(f'{h}x{w}' for h, w in sizes[:3])}); this recipe "
            f"needs one size (32x32 for CIFAR-10)"
        )
    labels = np.asarray(view.metadata["label"])
    if labels.min() < 0:
        raise RecipeError(f"{path}: negative label {labels.min()}")
    return view.num_samples, (int(sizes[0][0]), int(sizes[0][1])), int(labels.max())


def prepare_data(
    data_dir: os.PathLike,
    cache_dir: os.PathLike,
    fmt: str = "beton",
    num_workers: int | None = None,
    progress: bool = True,
) -> PreparedData:
    """Convert ``data_dir`` (see :func:`detect_layout`) once into ``cache_dir`` and return the
    converted splits; reuse them when the fingerprint (see :func:`source_fingerprint`) matches.

    The entry is ``cache_dir/<layout>-<fmt>-<fingerprint[:16]>/{train,test}.{beton,lmdb}`` and
    ``complete.json`` is written (atomically) only after both splits, so an interrupted
    conversion is redone, never half-used. Images are stored raw (lossless).

    Raises:
        RecipeError: bad layout, missing/corrupt CIFAR batch, undecodable image, images of
            several sizes, unwritable cache (the message names the path and the cause).
        ConfigurationError: ``fmt`` not ``'beton'`` or ``'lmdb'`` (a ValueError).
    """
    if fmt not in ("beton", "lmdb"):
        raise ConfigurationError(f"format must be 'beton' or 'lmdb', got {fmt!r}")
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
        if (
            marker.is_file()
            and json.loads(marker.read_text()).get("fingerprint") == fp
            and all(os.path.exists(p) for p in paths.values())
        ):
            cache_hit = True
        else:
            train_src, test_src = _sources(layout, folder)
            if train_src.classes != test_src.classes:
                raise RecipeError(
                    f"--data {folder}: train and test have different classes "
                    f"({train_src.classes} vs {test_src.classes}), so their "
                    f"labels would not match"
                )
            entry.mkdir(parents=True, exist_ok=True)
            for split, src in (("train", train_src), ("test", test_src)):
                convert_dataset(
                    src,
                    paths[split],
                    write_mode="raw",
                    num_workers=num_workers,
                    on_error="fail",
                    overwrite=True,
                    progress=progress,
                )
            write_json(marker, {"fingerprint": fp, "source": str(folder), **args})
        (num_train, shape, max_train), (num_test, shape_test, max_test) = (
            _inspect(paths["train"], "train"),
            _inspect(paths["test"], "test"),
        )
    except (ValueError, OSError, ConvertError) as e:  # SourceError, DatasetError, disk errors
        raise RecipeError(f"cannot convert {folder} into {entry}: {e}") from e
    if shape != shape_test:
        raise RecipeError(
            f"--data {folder}: train images are {shape[0]}x{shape[1]} but test "
            f"images are {shape_test[0]}x{shape_test[1]}"
        )
    return PreparedData(
        paths["train"],
        paths["test"],
        fmt,
        layout,
        max(max_train, max_test) + 1,
        shape,
        num_train,
        num_test,
        cache_hit,
        0.0 if cache_hit else time.perf_counter() - t0,
    )


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


# --------------------------------------------------------------------------- loaders


def make_loaders(
    data: PreparedData,
    batch_size: int,
    num_workers: int,
    device: torch.device,
    seed: int = 0,
    distributed: bool = False,
):
    """ffload loaders of the recipe (FFCV's CIFAR pipelines, true CIFAR std).

    Train: random order, drop_last, ``SimpleRGBImageDecoder -> RandomHorizontalFlip ->
    RandomTranslate(2, fill=mean) -> Cutout(4, fill=mean) -> ToTensor -> ToDevice ->
    ToTorchImage(channels_last) -> NormalizeImage(mean, std)``. Test: sequential, every sample,
    no augmentation. Labels: ``IntDecoder -> ToTensor -> ToDevice -> Squeeze``.

    ``distributed`` (an initialised ``torch.distributed`` process group): ``batch_size`` is
    per rank; the train loader takes this rank's share of every epoch (``Loader(...,
    distributed=True)``, the same number of batches on every rank); the test loader takes test
    samples ``rank::world_size``, each exactly once over the ranks (no padding: evaluation is no
    collective, so the shares may differ by one sample).

    Returns:
        ``(train_loader, test_loader)``; each yields ``(images (B, 3, H, W) float16 on CUDA /
        float32 on CPU, channels_last, labels (B,) int64)`` on ``device``.
    """
    from ffload import Loader
    from ffload.loaders import (
        Cutout,
        IntDecoder,
        NormalizeImage,
        RandomHorizontalFlip,
        RandomTranslate,
        SimpleRGBImageDecoder,
        Squeeze,
        ToDevice,
        ToTensor,
        ToTorchImage,
    )

    test_indices = None
    if distributed:
        test_indices = np.arange(data.num_test)[dist.get_rank() :: dist.get_world_size()]
    fill = tuple(int(round(m)) for m in CIFAR_MEAN)
    dtype = torch.float16 if device.type == "cuda" else torch.float32
    loaders = []
    for path, train in ((data.train_path, True), (data.test_path, False)):
        augment = [RandomHorizontalFlip(), RandomTranslate(padding=2, fill=fill), Cutout(4, fill)] if train else []
        image = [
            SimpleRGBImageDecoder(),
            *augment,
            ToTensor(),
            ToDevice(device, non_blocking=True),
            ToTorchImage(channels_last=True),
            NormalizeImage(np.array(CIFAR_MEAN), np.array(CIFAR_STD), dtype),
        ]
        label = [IntDecoder(), ToTensor(), ToDevice(device, non_blocking=True), Squeeze()]
        loaders.append(
            Loader(
                path,
                batch_size=batch_size,
                num_workers=num_workers,
                order="random" if train else "sequential",
                pipelines={"image": image, "label": label},
                drop_last=train,
                seed=seed,
                distributed=distributed and train,
                indices=None if train else test_indices,
            )
        )
    return tuple(loaders)
