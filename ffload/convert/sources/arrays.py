"""Sources over objects in memory: :class:`ArraySource` (arrays) and :class:`IndexableSource` (any
``dataset[i] -> (image, label)``, e.g. a torch ``Dataset`` without ``ToTensor``)."""

from __future__ import annotations

import logging
import operator

import numpy as np

from ffload.convert.images import to_rgb_uint8
from ffload.convert.sources.base import SourceError, check_index

__all__ = ["ArraySource", "IndexableSource"]

logger = logging.getLogger(__name__)


def _check_labels(labels, n: int, name: str, classes) -> np.ndarray:
    """``labels`` as ``(n,) int64``; SourceError when not 1-D integers of length ``n`` or outside the classes."""
    arr = np.asarray(labels)
    if arr.ndim != 1 or len(arr) != n or (n and arr.dtype.kind not in "iu"):
        raise SourceError(
            f"{name}: labels must be a 1-D integer array of length {n} (one per image), got "
            f"{arr.dtype} array of shape {arr.shape}"
        )
    arr = arr.astype(np.int64)
    if classes is not None and n and (arr.min() < 0 or arr.max() >= len(classes)):
        raise SourceError(
            f"{name}: labels outside [0, {len(classes)}) for {len(classes)} classes: [{arr.min()}, {arr.max()}]"
        )
    return arr


class ArraySource:
    """In-memory images and labels.

    Args:
        images: ``(N, H, W)``, ``(N, H, W, C)`` array (one image per leading index) or a sequence of ``N`` arrays,
            each accepted by :func:`~ffload.convert.images.to_rgb_uint8` (gray/RGB/RGBA, uint8/uint16/bool/float in
            ``[0, 1]``, RGB channel order). A ``(N, H, W, 3) uint8`` array is served without copying.
        labels: ``(N,)`` integers.
        classes: optional class names; labels must then lie in ``[0, len(classes))``.
        name: used in ``describe``.
    Raises:
        SourceError: lengths differ, labels not 1-D integers, or labels outside the classes.

    Pickling copies the arrays (pass a ``np.memmap`` to share pages between processes started by fork).
    """

    def __init__(self, images, labels, classes: list[str] | None = None, name: str = "arrays"):
        if isinstance(images, np.ndarray) and images.ndim not in (3, 4):
            raise SourceError(
                f"{name}: images must be an (N, H, W) or (N, H, W, C) array or a list of arrays, got "
                f"shape {images.shape}"
            )
        self.name = name
        self.classes = list(classes) if classes is not None else None
        self._images = images
        self.labels = _check_labels(labels, len(images), name, self.classes)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i) -> tuple[np.ndarray, int]:
        """``(image (H, W, 3) uint8 RGB, label int)``; ImageDecodeError naming the sample for a bad array."""
        i = check_index(i, len(self), self.name)
        return to_rgb_uint8(self._images[i], self.describe(i)), int(self.labels[i])

    def describe(self, i: int) -> str:
        """``'sample i of <name>'``."""
        return f"sample {i} of {self.name}"


# Pillow modes whose np.asarray() is a gray/RGB(A) array to_rgb_uint8 understands; others go through convert("RGB").
_PIL_ARRAY_MODES = {"1", "L", "LA", "RGB", "RGBA", "I;16", "I;16B", "I;16L", "F"}


class IndexableSource:
    """Wrap any object with ``__len__`` and ``__getitem__(i) -> (image, label)``, e.g. a torch ``Dataset``.

    The image may be a numpy array (RGB channel order, rules of :func:`~ffload.convert.images.to_rgb_uint8`) or a
    PIL image: modes ``1 L LA RGB RGBA I;16 F`` are taken as arrays, others (palette, CMYK, YCbCr, ...) through
    ``image.convert("RGB")``. EXIF orientation is the dataset's business (a PIL image is used as it is). Torch
    tensors are refused: drop ``ToTensor()``/``Normalize`` from the dataset's transform.

    Args:
        dataset: the object; it must pickle to be used with worker processes.
        classes: class names; default ``dataset.classes`` when it is a list of names (torchvision), else None.
        name: default ``type(dataset).__name__``.
    Attributes:
        labels: ``(N,) int64`` from ``dataset.targets`` (torchvision's convention) when it has ``N`` entries;
            otherwise computed on first access by reading every sample (slow: it decodes every image).
    Raises:
        SourceError: from ``src[i]`` when the item is not an ``(image, label)`` pair, the image is a tensor or an
            unknown type, or the label is not an integer (the sample is named).
    """

    def __init__(self, dataset, classes: list[str] | None = None, name: str | None = None):
        self.dataset = dataset
        self.name = name or type(dataset).__name__
        if classes is None:
            candidate = getattr(dataset, "classes", None)
            if isinstance(candidate, (list, tuple)) and all(isinstance(c, str) for c in candidate):
                classes = candidate
        self.classes = list(classes) if classes is not None else None
        self._labels = None

    def __len__(self) -> int:
        return len(self.dataset)

    @property
    def labels(self) -> np.ndarray:
        """``(N,) int64`` labels (see the class docstring for the cost)."""
        if self._labels is None:
            targets = getattr(self.dataset, "targets", None)
            if targets is not None and len(targets) == len(self):
                self._labels = _check_labels(targets, len(self), self.name, self.classes)
            else:
                logger.info(
                    "%s: no 'targets' attribute; reading all %d samples to collect labels", self.name, len(self)
                )
                self._labels = np.asarray([self[i][1] for i in range(len(self))], dtype=np.int64)
        return self._labels

    def __getitem__(self, i) -> tuple[np.ndarray, int]:
        """``(image (H, W, 3) uint8 RGB, label int)``; SourceError/ImageDecodeError naming the sample."""
        i = check_index(i, len(self), self.name)
        where = self.describe(i)
        item = self.dataset[i]
        if not isinstance(item, (tuple, list)) or len(item) != 2:
            raise SourceError(f"{where}: expected an (image, label) pair, got {type(item).__name__}")
        image, label = item
        if type(image).__module__.split(".")[0] == "torch":
            raise SourceError(
                f"{where}: the image is a torch tensor; return numpy (H, W, C) arrays or PIL images "
                f"(drop ToTensor()/Normalize from the transform)"
            )
        if hasattr(image, "mode") and hasattr(image, "convert"):  # a PIL image, without importing PIL
            image = np.asarray(image if image.mode in _PIL_ARRAY_MODES else image.convert("RGB"))
        elif not isinstance(image, np.ndarray):
            raise SourceError(f"{where}: the image is a {type(image).__name__}; expected a numpy array or PIL image")
        try:
            label = operator.index(label)
        except TypeError as e:
            raise SourceError(f"{where}: the label must be an integer, got {type(label).__name__} {label!r}") from e
        return to_rgb_uint8(image, where), label

    def describe(self, i: int) -> str:
        """``'sample i of <name>'``."""
        return f"sample {i} of {self.name}"
