"""Every peer the ffload ``Loader`` is measured against, in one place: ffcv's ``Loader`` on the
same ``.beton``, PyTorch's ``DataLoader`` over the images decoded once into memory,
``DataLoader`` + PIL over the source ImageFolder (the vanilla PyTorch recipe; for the Deep Lake
augmentation stacks, the PIL calls torchvision's transforms make on PIL images), and
``DataLoader`` + OpenCV + Albumentations over the same ImageFolder.

Each ``run_*`` function builds its loader for a :class:`BenchConfig` and returns a
:class:`LoaderSetup`; :data:`BASELINES` maps the loader kinds to them. ``DataLoader``s use
``shuffle=True``, the config's ``batch_size`` / ``num_workers`` / ``seed``, ``drop_last=False``,
``pin_memory`` only when CUDA is available, non-persistent workers (the defaults) and the
``fork`` start method where there is one; their ``(B, H, W, 3)`` batches are yielded as
``(B, 3, H, W)`` views, as ``ToTorchImage`` yields them.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..config import DEEPLAKE_PARAMS, DEEPLAKE_PIPELINES, BenchConfig
from ..measurement import LoaderSetup
from ..pipelines import build_pipelines, center_box, rrc_box

if TYPE_CHECKING:
    import numpy as np


def run_ffcv(cfg: BenchConfig) -> LoaderSetup:
    """ffcv's ``Loader`` with ffcv's operations of the same names (:func:`build_pipelines`),
    ``order=RANDOM``, ``os_cache=True``, ``drop_last=False``, ``batches_ahead=3``. Raises
    ImportError without ffcv."""
    start = time.perf_counter()
    from ffcv import transforms
    from ffcv.fields import decoders
    from ffcv.loader import Loader, OrderOption

    pipelines = build_pipelines(cfg, {**vars(decoders), **vars(transforms)})
    import_s = time.perf_counter() - start
    t1 = time.perf_counter()
    indices = None if cfg.limit is None else list(range(cfg.limit))
    loader = Loader(
        cfg.path,
        batch_size=cfg.batch_size,
        num_workers=cfg.num_workers,
        order=OrderOption.RANDOM,
        os_cache=True,
        pipelines=pipelines,
        drop_last=False,
        seed=cfg.seed,
        indices=indices,
        batches_ahead=3,
    )
    return LoaderSetup(loader, start, import_s, time.perf_counter() - t1, len(loader.indices))


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
    ``DataLoader``). PIL decodes with ``convert('RGB')`` (torchvision's ``pil_loader``). Raises
    ``OSError`` naming the file when PIL cannot read it.
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
        if self.pipeline in DEEPLAKE_PIPELINES:
            return torch.from_numpy(pil_deeplake(image, self.pipeline, self.size, random)), int(self.labels[i])
        if self.pipeline != "simple":
            w, h = image.size
            box = rrc_box(w, h, random) if self.pipeline == "rrc" else center_box(w, h)
            image = image.resize((self.size, self.size), Image.BILINEAR, box=box)
        if random.random() < 0.5:
            image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        return torch.from_numpy(np.array(image)), int(self.labels[i])


def _perspective_coeffs(start, end):
    """PIL's ``PERSPECTIVE`` coefficients mapping ``end`` points to ``start`` points
    (torchvision's ``_get_perspective_coeffs``)."""
    import numpy as np

    a = np.zeros((8, 8))
    for k, ((ex, ey), (sx, sy)) in enumerate(zip(end, start)):
        a[2 * k] = [ex, ey, 1, 0, 0, 0, -sx * ex, -sx * ey]
        a[2 * k + 1] = [0, 0, 0, ex, ey, 1, -sy * ex, -sy * ey]
    return np.linalg.lstsq(a, np.asarray(start, float).reshape(8), rcond=None)[0].tolist()


def pil_deeplake(image, pipeline: str, size: int, rng) -> np.ndarray:
    """A Deep Lake stack (:data:`~ffload.bench.config.DEEPLAKE_STACKS`) with the PIL calls torchvision's
    transforms make on PIL images (``F_pil``): centre square resized (bilinear, antialiased),
    ``rotate`` (bilinear), flips by ``transpose``, ``PERSPECTIVE`` transform (torchvision's corner
    sampling), ``ImageEnhance`` brightness/contrast/colour and the uint8 HSV hue shift in a random
    order, then ``ToTensor`` + ``Normalize`` arithmetic. Returns ``(size, size, 3) float32``."""
    import numpy as np
    from PIL import Image, ImageEnhance

    p = DEEPLAKE_PARAMS
    w, h = image.size
    image = image.resize((size, size), Image.BILINEAR, box=center_box(w, h, ratio=1.0))
    image = image.rotate(rng.uniform(-p["degrees"], p["degrees"]), resample=Image.BILINEAR)
    if rng.random() < 0.5:
        image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    if pipeline == "dl_complex":
        if rng.random() < 0.5:
            image = image.transpose(Image.Transpose.FLIP_TOP_BOTTOM)
        if rng.random() < p["perspective_p"]:
            dx, dy = int(p["distortion_scale"] * (size // 2)), int(p["distortion_scale"] * (size // 2))
            end = [
                (rng.randint(0, dx), rng.randint(0, dy)),
                (size - 1 - rng.randint(0, dx), rng.randint(0, dy)),
                (size - 1 - rng.randint(0, dx), size - 1 - rng.randint(0, dy)),
                (rng.randint(0, dx), size - 1 - rng.randint(0, dy)),
            ]
            start = [(0, 0), (size - 1, 0), (size - 1, size - 1), (0, size - 1)]
            image = image.transform(image.size, Image.PERSPECTIVE, _perspective_coeffs(start, end), Image.BILINEAR)
        j = p["jitter"]
        for fn in rng.sample(range(4), 4):
            if fn == 0:
                image = ImageEnhance.Brightness(image).enhance(rng.uniform(1 - j, 1 + j))
            elif fn == 1:
                image = ImageEnhance.Contrast(image).enhance(rng.uniform(1 - j, 1 + j))
            elif fn == 2:
                image = ImageEnhance.Color(image).enhance(rng.uniform(1 - j, 1 + j))
            else:
                hue, sat, val = image.convert("HSV").split()
                shifted = np.array(hue, dtype=np.uint8) + np.uint8(int(rng.uniform(-j, j) * 255) % 256)
                image = Image.merge("HSV", (Image.fromarray(shifted, "L"), sat, val)).convert("RGB")
    x = np.asarray(image, dtype=np.float32) / 255
    return (x - np.asarray(p["mean"], np.float32)) / np.asarray(p["std"], np.float32)


class AlbumentationsImageFolder:
    """Map-style dataset over image files decoded by OpenCV and augmented by Albumentations: the
    Deep Lake stacks (:data:`~ffload.bench.config.DEEPLAKE_STACKS`) as ``A.Compose`` — ``SmallestMaxSize`` +
    ``CenterCrop`` (the centre square at ``size``), ``Affine(rotate=20)`` (bilinear),
    ``HorizontalFlip``, then for ``dl_complex`` ``VerticalFlip``, ``Perspective(scale=(0, 0.25),
    p=0.5)`` (corner offsets of up to a quarter of the side, as torchvision's distortion 0.5),
    ``ColorJitter(0.2, 0.2, 0.2, 0.2)``; ``Normalize`` last.

    ``ds[i]`` -> ``(image (size, size, 3) float32 tensor, label int)``. Raises ``OSError`` naming
    the file when OpenCV cannot read it.
    """

    def __init__(self, paths: Sequence[str], labels, pipeline: str, size: int):
        import albumentations as A
        import cv2

        p, j = DEEPLAKE_PARAMS, DEEPLAKE_PARAMS["jitter"]
        stack = [
            A.SmallestMaxSize(max_size=size, interpolation=cv2.INTER_LINEAR),
            A.CenterCrop(size, size),
            A.Affine(rotate=(-p["degrees"], p["degrees"]), interpolation=cv2.INTER_LINEAR, p=1.0),
            A.HorizontalFlip(p=0.5),
        ]
        if pipeline == "dl_complex":
            stack += [
                A.VerticalFlip(p=0.5),
                A.Perspective(scale=(0.0, p["distortion_scale"] / 2), p=p["perspective_p"]),
                A.ColorJitter(brightness=j, contrast=j, saturation=j, hue=j, p=1.0),
            ]
        self.transform = A.Compose(stack + [A.Normalize(mean=p["mean"], std=p["std"])])
        self.paths, self.labels = list(paths), labels

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int):
        import cv2
        import torch

        bgr = cv2.imread(self.paths[i], cv2.IMREAD_COLOR)
        if bgr is None:
            raise OSError(f"{self.paths[i]}: OpenCV cannot read the image")
        image = self.transform(image=cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB))["image"]
        return torch.from_numpy(image), int(self.labels[i])


class _ChannelsFirst:
    """Yields a DataLoader's ``(B, H, W, 3)`` image batches as ``(B, 3, H, W)`` views (what
    ``ToTorchImage`` yields), labels unchanged."""

    def __init__(self, loader):
        self.loader = loader

    def __iter__(self):
        for images, labels in self.loader:
            yield images.permute(0, 3, 1, 2), labels


def _data_loader_setup(dataset, cfg: BenchConfig, setup_s: float, start: float) -> LoaderSetup:
    """The ``DataLoader`` over ``dataset``; ``import_s`` counts from ``start`` (``perf_counter``,
    before the baseline's own imports; torch is imported already)."""
    import multiprocessing

    import torch
    from torch.utils.data import DataLoader

    context = "fork" if "fork" in multiprocessing.get_all_start_methods() else None
    loader = DataLoader(
        dataset,
        batch_size=cfg.batch_size,
        shuffle=True,
        num_workers=cfg.num_workers,
        pin_memory=torch.cuda.is_available(),
        drop_last=False,
        generator=torch.Generator().manual_seed(cfg.seed),
        multiprocessing_context=context,
    )
    return LoaderSetup(_ChannelsFirst(loader), start, time.perf_counter() - start, 0.0, len(dataset), setup_s)


def run_dataloader_arrays(cfg: BenchConfig) -> LoaderSetup:
    """``DataLoader`` over :class:`ArrayImages`; the untimed setup decodes the dataset's first
    samples once with ffload's ``Loader`` (``SimpleRGBImageDecoder``, sequential order) into one
    ``(N, H, W, 3) uint8`` array (the ``simple`` pipeline: images of one size)."""
    t0 = time.perf_counter()
    import numpy as np

    import ffload
    from ffload.formats import open_dataset
    from ffload.loaders import IntDecoder, SimpleRGBImageDecoder

    view = open_dataset(cfg.path)
    n = cfg.num_samples(view.num_samples)
    pipelines = {name: None for name in cfg.disabled_fields}
    pipelines[cfg.image_field] = [SimpleRGBImageDecoder()]
    if cfg.label_field:
        pipelines[cfg.label_field] = [IntDecoder()]
    reader = ffload.Loader(
        cfg.path,
        batch_size=min(n, 256),
        num_workers=1,
        order="sequential",
        indices=range(n),
        pipelines=pipelines,
        drop_last=False,
    )
    try:
        batches = [[np.array(x) for x in batch] for batch in reader]
    finally:
        reader.close()
    images = np.concatenate([b[0] for b in batches])
    labels = (
        np.concatenate([b[1] for b in batches]).reshape(n).astype(np.int64)
        if cfg.label_field
        else np.zeros(n, dtype=np.int64)
    )
    setup_s = time.perf_counter() - t0
    return _data_loader_setup(ArrayImages(images, labels), cfg, setup_s, time.perf_counter())


def _run_image_folder(cfg: BenchConfig, dataset_class, decoder_module: str) -> LoaderSetup:
    """``DataLoader`` over ``dataset_class(paths, labels, pipeline, size)``; the untimed setup
    lists the ImageFolder ``cfg.path`` with ffload's ``ImageFolderSource`` (the project's one
    ImageFolder); the import of ``decoder_module`` (the baseline's decoder) is timed."""
    import importlib

    t0 = time.perf_counter()
    from ffload.convert.sources import ImageFolderSource

    source = ImageFolderSource(cfg.path)
    n = cfg.num_samples(len(source))
    setup_s = time.perf_counter() - t0
    start = time.perf_counter()
    importlib.import_module(decoder_module)
    dataset = dataset_class([source.path(i) for i in range(n)], source.labels[:n], cfg.pipeline, cfg.size)
    return _data_loader_setup(dataset, cfg, setup_s, start)


def run_dataloader_pil(cfg: BenchConfig) -> LoaderSetup:
    """``DataLoader`` over :class:`PILImageFolder` (see :func:`_run_image_folder`)."""
    return _run_image_folder(cfg, PILImageFolder, "PIL.Image")


def run_dataloader_albumentations(cfg: BenchConfig) -> LoaderSetup:
    """``DataLoader`` over :class:`AlbumentationsImageFolder` (see :func:`_run_image_folder`).
    Raises ImportError without ``albumentations``."""
    return _run_image_folder(cfg, AlbumentationsImageFolder, "albumentations")


BASELINES = {
    "ffcv": run_ffcv,
    "dataloader_arrays": run_dataloader_arrays,
    "dataloader_pil": run_dataloader_pil,
    "dataloader_albumentations": run_dataloader_albumentations,
}
"""The peer loader kinds and their runners."""
