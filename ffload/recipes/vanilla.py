"""The vanilla baseline loader: a PNG ImageFolder read by ``torch.utils.data.DataLoader``.

This is what a typical PyTorch CIFAR script does without ffload (torchvision's ``ImageFolder`` +
``RandomHorizontalFlip`` / ``RandomCrop(padding)`` / Cutout + ``ToTensor`` + ``Normalize``),
written with numpy/torch only (no torchvision): every sample is opened and decoded with PIL in
a worker process, augmented and normalised per sample in numpy/torch, collated, pinned (on CUDA)
and copied to the device. The augmentations follow FFCV's semantics so that the comparison in
``scripts/cost_benchmark.py`` trains on the same distribution:

* flip: horizontal, probability 0.5 (``ffcv.transforms.RandomHorizontalFlip``);
* translate: pad by ``padding`` pixels with ``fill`` and crop the original size at an offset
  drawn uniformly from ``[0, 2 * padding]`` on each axis (``ffcv.transforms.RandomTranslate``);
* cutout: fill a ``crop_size`` square whose top-left corner is uniform in
  ``[0, H - crop_size] x [0, W - crop_size]`` (``ffcv.transforms.Cutout``).

Randomness comes from ``numpy.random.default_rng((seed, epoch, index))`` per sample, so batches
do not depend on ``num_workers``. Pillow is imported lazily (it is the baseline's decoder, not a
dependency of ffload's own loader).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from ffload.convert.sources import ImageFolderSource, SourceError

__all__ = ["ImageFolderDataset", "EpochSampler", "VanillaLoader", "write_image_folder", "augment"]


def augment(
    image: np.ndarray, rng: np.random.Generator, padding: int, crop_size: int, fill: Sequence[int]
) -> np.ndarray:
    """Flip, translate and cut out one image, FFCV's semantics (see the module docstring).

    Args:
        image: ``(H, W, 3) uint8`` RGB.
        rng: the sample's generator.
        padding: translation range in pixels (0 disables translation).
        crop_size: cutout side in pixels (0 disables cutout); must be ``<= min(H, W)``.
        fill: ``(3,)`` RGB value of the padding and the cutout square.

    Returns:
        a new ``(H, W, 3) uint8`` array.
    """
    h, w, _ = image.shape
    fill = np.asarray(fill, dtype=np.uint8)
    if rng.random() < 0.5:
        image = image[:, ::-1]
    if padding > 0:
        padded = np.empty((h + 2 * padding, w + 2 * padding, 3), dtype=np.uint8)
        padded[:] = fill
        padded[padding : padding + h, padding : padding + w] = image
        y, x = rng.integers(0, 2 * padding + 1, size=2)
        image = padded[y : y + h, x : x + w]
    image = np.array(image)  # contiguous, writable copy
    if crop_size > 0:
        y = rng.integers(0, h - crop_size + 1)
        x = rng.integers(0, w - crop_size + 1)
        image[y : y + crop_size, x : x + crop_size] = fill
    return image


class ImageFolderDataset(Dataset):
    """``root/<class>/**/<image>`` read with PIL, one sample at a time. The files, classes and
    labels are ffload's one ImageFolder listing, ``ffload.convert.sources.ImageFolderSource``
    (torchvision ``ImageFolder`` semantics: class folders sorted by name give labels
    ``0..C-1``, files in torchvision's order, nested folders included), so this baseline reads
    exactly the samples ``ffload convert`` writes.

    Args:
        root: the folder.
        mean, std: ``(3,)`` per-channel normalisation in 0-255 units.
        train: apply :func:`augment` (flip, translate ``padding``, cutout ``crop_size``).
        seed: base of the per-sample random generators.
        padding, crop_size: augmentation sizes in pixels.

    Items: ``dataset[(epoch, index)]`` (what :class:`EpochSampler` yields) or ``dataset[index]``
    (epoch 0) -> ``(image (3, H, W) float32 normalised, label int)``.

    Raises:
        ffload.convert.sources.SourceError: (a ``ValueError``) ``root`` missing, without class
            folders, or a class folder without images (named in the message).
        OSError: an image cannot be decoded (names the file) when it is read.
    """

    def __init__(
        self,
        root: os.PathLike,
        mean: Sequence[float],
        std: Sequence[float],
        train: bool,
        seed: int = 0,
        padding: int = 2,
        crop_size: int = 4,
    ):
        source = ImageFolderSource(root)
        self.classes: list[str] = list(source.classes)
        self.samples: list[tuple[str, int]] = [(source.path(i), int(source.labels[i])) for i in range(len(source))]
        self.mean = torch.tensor(mean, dtype=torch.float32).view(3, 1, 1)
        self.std = torch.tensor(std, dtype=torch.float32).view(3, 1, 1)
        self.fill = tuple(int(round(m)) for m in mean)
        self.train = train
        self.seed = seed
        self.padding = padding
        self.crop_size = crop_size

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, key) -> tuple[torch.Tensor, int]:
        epoch, index = key if isinstance(key, tuple) else (0, key)
        path, label = self.samples[index]
        from PIL import Image

        try:
            with Image.open(path) as im:
                image = np.array(im.convert("RGB"))
        except OSError as e:
            raise OSError(f"{path}: cannot decode image: {e}") from e
        if self.train:
            rng = np.random.default_rng((self.seed, epoch, index))
            image = augment(image, rng, self.padding, self.crop_size, self.fill)
        x = torch.from_numpy(image).permute(2, 0, 1).float()
        return (x - self.mean) / self.std, label


class EpochSampler(Sampler):
    """Yields ``(epoch, index)`` keys: a permutation from ``default_rng((seed, epoch))`` when
    ``shuffle``, else ``0..n-1``. Call :meth:`set_epoch` before each epoch (like
    ``DistributedSampler``)."""

    def __init__(self, n: int, shuffle: bool, seed: int = 0):
        self.n = n
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose order (and per-sample augmentation) the next pass yields."""
        self.epoch = epoch

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[tuple[int, int]]:
        order = (
            np.random.default_rng((self.seed, self.epoch)).permutation(self.n) if self.shuffle else np.arange(self.n)
        )
        return ((self.epoch, int(i)) for i in order)


class VanillaLoader:
    """The baseline's batches on the training device, epoch after epoch.

    ``DataLoader(num_workers, pin_memory=<device is CUDA>, persistent_workers=num_workers > 0)``
    over :class:`ImageFolderDataset`; each batch is then copied with
    ``.to(device, non_blocking=True)`` (images in ``channels_last``), inside the iterator so
    that the training loop's measured data wait includes the copy.

    Args:
        root: PNG ImageFolder (``root/<class>/*.png``).
        batch_size, num_workers: as ``DataLoader``'s.
        device: ``torch.device`` to deliver to.
        train: shuffle, augment and drop the last partial batch; else sequential, unaugmented,
            all samples.
        mean, std: ``(3,)`` normalisation, 0-255 units.
        seed: order and augmentation seed.

    Iterating yields ``(images (B, 3, H, W) float32, labels (B,) int64)`` on ``device``; each
    ``iter()`` is the next epoch. ``len()`` is the number of batches per epoch.
    """

    def __init__(
        self,
        root: os.PathLike,
        batch_size: int,
        num_workers: int,
        device: torch.device,
        train: bool,
        mean: Sequence[float],
        std: Sequence[float],
        seed: int = 0,
    ):
        self.dataset = ImageFolderDataset(root, mean, std, train=train, seed=seed)
        self.sampler = EpochSampler(len(self.dataset), shuffle=train, seed=seed)
        self.device = torch.device(device)
        self.loader = DataLoader(
            self.dataset,
            batch_size=batch_size,
            sampler=self.sampler,
            num_workers=num_workers,
            pin_memory=self.device.type == "cuda",
            drop_last=train,
            persistent_workers=num_workers > 0,
        )
        self.epoch = 0

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        self.sampler.set_epoch(self.epoch)
        self.epoch += 1
        for images, labels in self.loader:
            yield (
                images.to(self.device, non_blocking=True, memory_format=torch.channels_last),
                labels.to(self.device, non_blocking=True),
            )


def write_image_folder(source, root: os.PathLike, num_classes: int) -> int:
    """Write every sample of ``source`` as ``root/<label>/<index>.png`` (lossless).

    Class folders are named by the label zero-padded to the width of ``num_classes - 1`` so
    that their sorted order is the label order (so :class:`ImageFolderDataset` and ffload's
    ``ImageFolderSource`` give back the same labels).

    Args:
        source: indexable, ``len(source)`` samples, ``source[i] -> (image (H, W, 3) uint8 RGB,
            label int in [0, num_classes))`` (e.g. ``ffload.convert.sources.CIFARSource``).
        root: output folder (created; existing files of the same names are replaced).
        num_classes: number of classes.

    Returns:
        the number of images written.

    Raises:
        ffload.convert.sources.SourceError: a label outside ``[0, num_classes)`` (names the sample).
        OSError: a file cannot be written.
    """
    from PIL import Image

    root = Path(root)
    digits = len(str(max(num_classes - 1, 0)))
    for label in range(num_classes):
        (root / f"{label:0{digits}d}").mkdir(parents=True, exist_ok=True)
    index_digits = len(str(max(len(source) - 1, 0)))
    for i in range(len(source)):
        image, label = source[i]
        label = int(label)
        if not 0 <= label < num_classes:
            raise SourceError(f"sample {i}: label {label} outside [0, {num_classes})")
        Image.fromarray(np.ascontiguousarray(image, dtype=np.uint8)).save(
            root / f"{label:0{digits}d}" / f"{i:0{index_digits}d}.png"
        )
    return len(source)
