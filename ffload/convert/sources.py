"""Dataset sources: where ``convert`` reads ``(image, label)`` samples from.

A source is anything following the :class:`Source` protocol. Sources are sent to worker processes, so they keep
only file lists and arrays (no open handles) and decode lazily in ``__getitem__``. Provided:

* :class:`ImageFolderSource` -- ``root/<class>/**/<image>``, classes and sample order as torchvision's
  ``ImageFolder``;
* :class:`~ffload.convert.cifar.CIFARSource` -- the official CIFAR-10/100 python archives (re-exported here);
* :class:`ArraySource` -- in-memory arrays;
* :class:`IndexableSource` -- any ``dataset[i] -> (image, label)`` object (a torch ``Dataset`` without
  ``ToTensor``);
* :func:`detect_source` -- a path to the right source.

Every image goes through :mod:`ffload.convert.images`, so ``src[i][0]`` is always ``(H, W, 3) uint8`` RGB.
"""
from __future__ import annotations

import logging
import operator
import os
from typing import Protocol, runtime_checkable

import numpy as np

from .images import IMAGE_EXTENSIONS, has_image_extension, load_image, to_rgb_uint8

__all__ = ["Source", "SourceError", "ImageFolderSource", "CIFARSource", "ArraySource", "IndexableSource",
           "detect_source", "is_cifar_folder", "check_index"]

logger = logging.getLogger(__name__)

_SPLIT_NAMES = {"train", "test", "val", "valid", "validation"}


class SourceError(ValueError):
    """A dataset that cannot be read as asked (bad folder layout, corrupt archive, bad arguments); the message
    names the path or sample and the cause."""


@runtime_checkable
class Source(Protocol):
    """What ``convert`` needs from a dataset.

    * ``len(src)`` -- number of samples ``N``.
    * ``src[i]`` -- ``(image (H, W, 3) uint8 RGB C-contiguous, label int)`` for ``0 <= i < N`` (negative indices
      as for sequences, IndexError outside); decoding happens here, lazily. Bad images raise
      :class:`~ffload.convert.images.ImageDecodeError` naming ``src.describe(i)``.
    * ``src.describe(i)`` -- the file path, or ``"sample i of <name>"``, for error messages.
    * ``src.classes`` -- class names indexed by label, or ``None`` when unknown.
    * ``src.labels`` -- ``(N,) int64``, cheap (no image decoded), for label histograms.
    * ``src.name`` -- a short name of the dataset.

    Sources must pickle cheaply: they are sent to worker processes.
    """

    name: str
    classes: list[str] | None

    @property
    def labels(self) -> np.ndarray: ...

    def __len__(self) -> int: ...

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]: ...

    def describe(self, i: int) -> str: ...


def check_index(i, n: int, name: str) -> int:
    """Validate a sample index like a Python sequence does.

    Args:
        i: an integer (Python or numpy); negative counts from the end.
        n: the number of samples.
        name: the dataset name for the error message.
    Returns:
        the index in ``[0, n)`` as ``int``.
    Raises:
        TypeError: ``i`` is not an integer. IndexError: ``i`` outside ``[-n, n)``.
    """
    k = operator.index(i)
    if k < 0:
        k += n
    if not 0 <= k < n:
        raise IndexError(f"sample index {i} out of range for {name} ({n} samples)")
    return k


class ImageFolderSource:
    """Images in ``root/<class>/**/<image>``, as torchvision's ``datasets.ImageFolder``.

    Classes are ``sorted(entry.name for entry in os.scandir(root) if entry.is_dir())`` with labels ``0..C-1``;
    inside a class, files are taken in torchvision's order (directories of ``os.walk(followlinks=True)`` sorted by
    path, file names sorted within a directory), nested subfolders included; a file is an image when its name ends
    with one of :data:`~ffload.convert.images.IMAGE_EXTENSIONS` in any case. Unlike torchvision, hidden entries
    (names starting with ``.``: ``.ipynb_checkpoints``, macOS ``._x.jpg``) are skipped at every level, class
    folders included. Images lying directly in ``root`` are ignored (with a warning).

    Args:
        root: the dataset folder.
    Attributes:
        root: absolute path. classes: ``list[str]``. labels: ``(N,) int64``. name: ``basename(root)``.
    Raises:
        SourceError: ``root`` missing, a file, empty or without class folders, or a class folder without images
            (named in the message).

    ``src[i]`` -> ``(load_image(path) (H, W, 3) uint8 RGB, label int)``; ``src.describe(i)`` -> the path. Paths
    are stored as one bytes buffer plus ``(N + 1,) int64`` offsets, so a million-image source pickles in one copy.
    """

    def __init__(self, root: str | os.PathLike):
        root = os.path.abspath(os.fspath(root))
        if not os.path.exists(root):
            raise SourceError(f"{root}: no such folder")
        if not os.path.isdir(root):
            raise SourceError(f"{root}: is a file; expected a folder with one subfolder per class "
                              f"(root/<class>/<image>)")
        entries = list(os.scandir(root))
        if not entries:
            raise SourceError(f"{root}: empty folder; expected one subfolder per class (root/<class>/<image>)")
        classes = sorted(e.name for e in entries if e.is_dir() and not e.name.startswith("."))
        if not classes:
            raise SourceError(f"{root}: no class subfolders (found {len(entries)} files); expected "
                              f"root/<class>/<image>")
        stray = sum(1 for e in entries if not e.is_dir() and has_image_extension(e.name))
        if stray:
            logger.warning("%s: %d image files directly in the root are ignored (images must be in class "
                           "subfolders)", root, stray)
        if set(classes) <= _SPLIT_NAMES:
            logger.warning("%s: the class folders %s look like dataset splits; pass split=... (or point at one "
                           "split) to read one split", root, classes)
        encoded, labels = [], []
        for label, cls in enumerate(classes):
            files = self._class_files(root, cls)
            encoded.extend(os.fsencode(f) for f in files)
            labels.extend([label] * len(files))
        self.root = root
        self.name = os.path.basename(root)
        self.classes = classes
        self.labels = np.asarray(labels, dtype=np.int64)
        self._offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
        np.cumsum([len(e) for e in encoded], out=self._offsets[1:])
        self._paths = b"".join(encoded)

    @staticmethod
    def _class_files(root: str, cls: str) -> list[str]:
        """Image paths of one class, relative to ``root``, in torchvision's order; SourceError if none."""
        class_dir = os.path.join(root, cls)
        walked = []
        for dirpath, dirnames, filenames in os.walk(class_dir, followlinks=True):
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            walked.append((dirpath, filenames))
        walked.sort(key=lambda entry: entry[0])
        files, others = [], 0
        for dirpath, filenames in walked:
            for fname in sorted(filenames):
                if fname.startswith("."):
                    continue
                if has_image_extension(fname):
                    files.append(os.path.relpath(os.path.join(dirpath, fname), root))
                else:
                    others += 1
        if not files:
            detail = f" ({others} files with other extensions)" if others else ""
            raise SourceError(f"{class_dir}: class folder {cls!r} holds no images{detail}; image extensions are "
                              f"{', '.join(IMAGE_EXTENSIONS)} (any case)")
        return files

    def __len__(self) -> int:
        return len(self.labels)

    def path(self, i: int) -> str:
        """Absolute path of sample ``i`` (``str``); IndexError outside ``[-N, N)``."""
        i = check_index(i, len(self), self.name)
        return os.path.join(self.root, os.fsdecode(self._paths[self._offsets[i]:self._offsets[i + 1]]))

    def __getitem__(self, i) -> tuple[np.ndarray, int]:
        """``(image (H, W, 3) uint8 RGB, label int)``; ImageDecodeError naming the file for a bad image."""
        i = check_index(i, len(self), self.name)
        return load_image(self.path(i)), int(self.labels[i])

    def describe(self, i: int) -> str:
        """The image path of sample ``i``."""
        return self.path(i)

    def __repr__(self) -> str:
        return f"ImageFolderSource({self.root!r}: {len(self)} images, {len(self.classes)} classes)"


def _check_labels(labels, n: int, name: str, classes) -> np.ndarray:
    """``labels`` as ``(n,) int64``; SourceError when not 1-D integers of length ``n`` or outside the classes."""
    arr = np.asarray(labels)
    if arr.ndim != 1 or len(arr) != n or (n and arr.dtype.kind not in "iu"):
        raise SourceError(f"{name}: labels must be a 1-D integer array of length {n} (one per image), got "
                          f"{arr.dtype} array of shape {arr.shape}")
    arr = arr.astype(np.int64)
    if classes is not None and n and (arr.min() < 0 or arr.max() >= len(classes)):
        raise SourceError(f"{name}: labels outside [0, {len(classes)}) for {len(classes)} classes: "
                          f"[{arr.min()}, {arr.max()}]")
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
            raise SourceError(f"{name}: images must be an (N, H, W) or (N, H, W, C) array or a list of arrays, got "
                              f"shape {images.shape}")
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
                logger.info("%s: no 'targets' attribute; reading all %d samples to collect labels", self.name,
                            len(self))
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
            raise SourceError(f"{where}: the image is a torch tensor; return numpy (H, W, C) arrays or PIL images "
                              f"(drop ToTensor()/Normalize from the transform)")
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


def detect_source(path: str | os.PathLike, kind: str | None = None, split: str | None = None,
                  label_kind: str = "fine") -> Source:
    """Open a dataset folder as the right source.

    Args:
        path: a CIFAR python folder (or torchvision's root holding one), or an ImageFolder root.
        kind: ``None`` (auto: a CIFAR folder if :func:`~ffload.convert.cifar.find_cifar_folder` finds one, else an
            ImageFolder), ``'imagefolder'``, ``'cifar10'`` or ``'cifar100'``.
        split: CIFAR: ``'train'`` (default) or ``'test'``. ImageFolder: ``None`` reads ``path`` itself, any other
            value reads the subfolder ``path/<split>`` (``'train'``, ``'val'``, ...).
        label_kind: CIFAR-100 ``'fine'`` (default) or ``'coarse'``.
    Returns:
        an :class:`ImageFolderSource` or :class:`~ffload.convert.cifar.CIFARSource`.
    Raises:
        SourceError: ``path`` missing, unknown ``kind``/``split``, a CIFAR ``kind`` that does not match the
            folder, or any error of the chosen source.
    """
    from .cifar import CIFARSource, find_cifar_folder

    path = os.fspath(path)
    if not os.path.exists(path):
        raise SourceError(f"{path}: no such file or folder")
    if kind not in (None, "imagefolder", "cifar10", "cifar100"):
        raise SourceError(f"unknown dataset kind {kind!r}; expected 'imagefolder', 'cifar10', 'cifar100' or None")
    found = find_cifar_folder(path) if kind != "imagefolder" else None
    if kind in ("cifar10", "cifar100") and (found is None or found[1] != kind):
        what = f"a {found[1]} folder" if found else "not a CIFAR python folder"
        raise SourceError(f"{path}: asked for {kind}, but this is {what}")
    if found is not None:
        if split not in (None, "train", "test"):
            raise SourceError(f"{path}: CIFAR split must be 'train' or 'test', got {split!r}")
        return CIFARSource(found[0], train=split != "test", label_kind=label_kind)
    if split is not None:
        split_dir = os.path.join(path, split)
        if not os.path.isdir(split_dir):
            raise SourceError(f"{split_dir}: no split folder {split!r} in {path}")
        path = split_dir
    return ImageFolderSource(path)


def __getattr__(name):
    # CIFARSource lives in .cifar, which imports this module; resolve the re-export lazily to avoid the cycle.
    if name in ("CIFARSource", "is_cifar_folder"):
        from . import cifar

        return getattr(cifar, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
