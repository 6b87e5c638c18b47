"""Read the official CIFAR-10 / CIFAR-100 "python version" archives, once extracted, without trusting pickle.

Layouts (https://www.cs.toronto.edu/~kriz/cifar.html):

* CIFAR-10 (``cifar-10-batches-py/``): ``data_batch_1`` .. ``data_batch_5`` (train, 10000 each), ``test_batch``,
  ``batches.meta`` (``label_names``, ``num_cases_per_batch``, ``num_vis``). Batches hold ``batch_label``,
  ``labels``, ``data``, ``filenames``.
* CIFAR-100 (``cifar-100-python/``): ``train``, ``test``, ``meta`` (``fine_label_names``, ``coarse_label_names``).
  Batches hold ``fine_labels`` and ``coarse_labels`` instead of ``labels``.

Every batch is a Python 2 pickle (protocol 2) of a dict; ``data`` is an ``(N, 3072) uint8`` numpy array, each row
the 1024 red, then 1024 green, then 1024 blue values of a 32x32 image in row-major order. The files are read with
``encoding='bytes'`` (as the dataset page says) by an unpickler that resolves exactly these globals:
``numpy.core.multiarray._reconstruct`` (also under its numpy 2 name ``numpy._core.multiarray``, for archives
re-pickled by numpy 2), ``numpy.ndarray`` and ``numpy.dtype``; any other global (``os.system``,
``builtins.eval``, ...) is refused, so a malicious file cannot run code.
"""

from __future__ import annotations

import importlib
import os
import pickle

import numpy as np

from ffload.convert.sources.base import SourceError, check_index

__all__ = [
    "CIFARSource",
    "is_cifar_folder",
    "cifar_variant",
    "find_cifar_folder",
    "missing_cifar_files",
    "read_cifar_pickle",
]

CIFAR10_TRAIN_FILES = tuple(f"data_batch_{i}" for i in range(1, 6))
CIFAR10_TEST_FILES = ("test_batch",)
CIFAR10_META_FILE = "batches.meta"
CIFAR100_TRAIN_FILES = ("train",)
CIFAR100_TEST_FILES = ("test",)
CIFAR100_META_FILE = "meta"
TORCHVISION_FOLDERS = {"cifar10": "cifar-10-batches-py", "cifar100": "cifar-100-python"}
"""Folder names that torchvision's ``CIFAR10(root)`` / ``CIFAR100(root)`` extract under ``root``."""

_IMAGE_BYTES = 32 * 32 * 3


def _numpy_core_multiarray():
    """The module that holds ``_reconstruct``: ``numpy._core.multiarray`` on numpy 2, ``numpy.core.multiarray`` on
    numpy 1 (importing ``numpy.core`` on numpy 2 warns)."""
    major = int(np.__version__.split(".")[0])
    return importlib.import_module("numpy._core.multiarray" if major >= 2 else "numpy.core.multiarray")


_ALLOWED_GLOBALS = {
    ("numpy.core.multiarray", "_reconstruct"): lambda: _numpy_core_multiarray()._reconstruct,
    ("numpy._core.multiarray", "_reconstruct"): lambda: _numpy_core_multiarray()._reconstruct,
    ("numpy", "ndarray"): lambda: np.ndarray,
    ("numpy", "dtype"): lambda: np.dtype,
}


class _ForbiddenGlobal(pickle.UnpicklingError):
    """The pickle names a global outside ``_ALLOWED_GLOBALS``."""


class _CIFARUnpickler(pickle.Unpickler):
    """``pickle.Unpickler`` whose ``find_class`` admits only the three numpy globals of the official files."""

    def find_class(self, module, name):
        resolve = _ALLOWED_GLOBALS.get((module, name))
        if resolve is None:
            raise _ForbiddenGlobal(f"{module}.{name}")
        return resolve()


def read_cifar_pickle(path: str | os.PathLike) -> dict:
    """Load one CIFAR batch or meta file with the restricted unpickler.

    Args:
        path: the file (``data_batch_1``, ``test_batch``, ``batches.meta``, ``train``, ``test``, ``meta``).
    Returns:
        the dict it holds, keys decoded to ``str`` (``'data'``, ``'labels'``, ...); values as stored (``bytes``
        strings, ints, lists, numpy arrays).
    Raises:
        SourceError: the file is missing or unreadable, references a forbidden global (a malicious or foreign
            pickle), is corrupt/truncated, or does not hold a dict. The message names the file.
    """
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            obj = _CIFARUnpickler(f, encoding="bytes").load()
    except FileNotFoundError as e:
        raise SourceError(f"{path}: CIFAR file is missing", path=path) from e
    except OSError as e:
        raise SourceError(f"{path}: cannot read the CIFAR file ({e.strerror or e})", path=path) from e
    except _ForbiddenGlobal as e:
        raise SourceError(
            f"{path}: refusing to unpickle: the file references {e}, but a CIFAR archive may only "
            f"contain numpy arrays, lists, dicts, strings and numbers",
            path=path,
        ) from e
    except Exception as e:  # a corrupt pickle can raise almost anything (EOFError, UnpicklingError, ValueError...)
        raise SourceError(f"{path}: corrupt CIFAR file ({type(e).__name__}: {e})", path=path) from e
    if not isinstance(obj, dict):
        raise SourceError(
            f"{path}: corrupt CIFAR file (expected a pickled dict, found {type(obj).__name__})", path=path
        )
    return {k.decode("latin-1") if isinstance(k, bytes) else k: v for k, v in obj.items()}


def cifar_variant(path: str | os.PathLike) -> str | None:
    """``'cifar10'`` or ``'cifar100'`` when ``path`` itself is an extracted CIFAR python folder (its meta file and
    at least one batch file are present), else ``None``. Only file names are checked, nothing is read."""
    path = os.fspath(path)

    def has(name):
        return os.path.isfile(os.path.join(path, name))

    if has(CIFAR10_META_FILE) and any(has(n) for n in CIFAR10_TRAIN_FILES + CIFAR10_TEST_FILES):
        return "cifar10"
    if has(CIFAR100_META_FILE) and any(has(n) for n in CIFAR100_TRAIN_FILES + CIFAR100_TEST_FILES):
        return "cifar100"
    return None


def missing_cifar_files(folder: str | os.PathLike, variant: str) -> list[str]:
    """The file names of a complete ``variant`` (``'cifar10'``/``'cifar100'``) archive folder -- train batches,
    test batches, meta file, in that order -- that are not files in ``folder``."""
    if variant == "cifar10":
        names = CIFAR10_TRAIN_FILES + CIFAR10_TEST_FILES + (CIFAR10_META_FILE,)
    else:
        names = CIFAR100_TRAIN_FILES + CIFAR100_TEST_FILES + (CIFAR100_META_FILE,)
    return [n for n in names if not os.path.isfile(os.path.join(folder, n))]


def find_cifar_folder(path: str | os.PathLike) -> tuple[str, str] | None:
    """Locate a CIFAR python folder at ``path`` or, torchvision's ``root`` layout, at
    ``path/cifar-10-batches-py`` or ``path/cifar-100-python``.

    Returns:
        ``(folder, variant)`` with ``variant`` in ``{'cifar10', 'cifar100'}``, or ``None``.
    """
    path = os.fspath(path)
    variant = cifar_variant(path)
    if variant is not None:
        return path, variant
    for variant, sub in TORCHVISION_FOLDERS.items():
        folder = os.path.join(path, sub)
        if cifar_variant(folder) == variant:
            return folder, variant
    return None


def is_cifar_folder(path: str | os.PathLike) -> bool:
    """True when :func:`find_cifar_folder` finds a CIFAR-10 or CIFAR-100 python folder at ``path``."""
    return find_cifar_folder(path) is not None


def _read_batch(path: str, label_key: str, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """One batch file -> ``(images (n, 32, 32, 3) uint8 HWC RGB, labels (n,) int64)``; SourceError if malformed."""
    batch = read_cifar_pickle(path)
    data, labels = batch.get("data"), batch.get(label_key)
    if data is None or labels is None:
        raise SourceError(
            f"{path}: corrupt CIFAR batch (keys {sorted(batch)}, expected 'data' and {label_key!r})", path=path
        )
    if not (
        isinstance(data, np.ndarray) and data.dtype == np.uint8 and data.ndim == 2 and data.shape[1] == _IMAGE_BYTES
    ):
        desc = f"{data.dtype} array of shape {data.shape}" if isinstance(data, np.ndarray) else type(data).__name__
        raise SourceError(
            f"{path}: corrupt CIFAR batch ('data' must be an (N, 3072) uint8 array, found {desc})", path=path
        )
    try:
        labels = np.asarray(labels)
    except (TypeError, ValueError) as e:
        raise SourceError(f"{path}: corrupt CIFAR batch ({label_key!r} is not a list of integers)", path=path) from e
    if labels.ndim != 1 or labels.dtype.kind not in "iu" or len(labels) != len(data):
        raise SourceError(
            f"{path}: corrupt CIFAR batch ({label_key!r} must hold {len(data)} integers, found "
            f"{labels.dtype} array of shape {labels.shape})",
            path=path,
        )
    if len(labels) and (labels.min() < 0 or labels.max() >= num_classes):
        raise SourceError(
            f"{path}: corrupt CIFAR batch ({label_key!r} outside [0, {num_classes}): [{labels.min()}, {labels.max()}])",
            path=path,
        )
    images = data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
    return np.ascontiguousarray(images), labels.astype(np.int64)


def _decode_names(path: str, meta: dict, key: str) -> list[str]:
    names = meta.get(key)
    if not isinstance(names, list) or not names or not all(isinstance(n, (bytes, str)) for n in names):
        raise SourceError(f"{path}: corrupt CIFAR meta file ({key!r} must be a non-empty list of names)", path=path)
    return [n.decode("utf-8", errors="replace") if isinstance(n, bytes) else n for n in names]


class CIFARSource:
    """The train or test split of an extracted CIFAR-10/100 python archive, as a ``Source``.

    Samples are in file order (``data_batch_1`` .. ``data_batch_5`` for CIFAR-10 train), as torchvision's
    ``CIFAR10``/``CIFAR100`` datasets, so index ``i`` here is index ``i`` there with the same label.

    Args:
        folder: ``cifar-10-batches-py`` / ``cifar-100-python``, or their parent (torchvision's ``root``).
        train: the train split (50000 images) if True, else the test split (10000).
        label_kind: CIFAR-100 only: ``'fine'`` (100 classes, ``fine_labels``) or ``'coarse'`` (20 superclasses,
            ``coarse_labels``). CIFAR-10 accepts only ``'fine'``.
    Attributes:
        variant: ``'cifar10'`` or ``'cifar100'``.
        classes: the label names from the meta file, ``list[str]``.
        labels: ``(N,) int64``.
        name: e.g. ``'cifar10-train'``.
    Raises:
        SourceError: no CIFAR folder at ``folder``, a bad ``label_kind``, or a missing/corrupt/malicious batch or
            meta file (named in the message). Every batch is read and checked here.

    ``src[i]`` returns ``(image (32, 32, 3) uint8 RGB, label int)``. Pickling the source (to send it to worker
    processes) drops the pixel array; a worker reads the batch files again on its first ``src[i]``.
    """

    def __init__(self, folder: str | os.PathLike, train: bool = True, label_kind: str = "fine"):
        found = find_cifar_folder(folder)
        if found is None:
            raise SourceError(
                f"{os.fspath(folder)}: not a CIFAR python folder (expected {CIFAR10_META_FILE} + "
                f"data_batch_1..5 + test_batch, or {CIFAR100_META_FILE} + train + test, directly or "
                f"under {' or '.join(TORCHVISION_FOLDERS.values())})",
                path=os.fspath(folder),
            )
        self.folder, self.variant = os.path.abspath(found[0]), found[1]
        if label_kind not in ("fine", "coarse") or (self.variant == "cifar10" and label_kind != "fine"):
            allowed = "'fine' or 'coarse'" if self.variant == "cifar100" else "'fine' (CIFAR-10 has one label kind)"
            raise SourceError(f"{self.folder}: label_kind must be {allowed}, got {label_kind!r}", path=self.folder)
        self.train = bool(train)
        self.label_kind = label_kind
        self.name = f"{self.variant}-{'train' if self.train else 'test'}"
        if self.variant == "cifar10":
            meta_path = os.path.join(self.folder, CIFAR10_META_FILE)
            self.classes = _decode_names(meta_path, read_cifar_pickle(meta_path), "label_names")
        else:
            meta_path = os.path.join(self.folder, CIFAR100_META_FILE)
            self.classes = _decode_names(meta_path, read_cifar_pickle(meta_path), f"{label_kind}_label_names")
        self._images, self.labels = self._read_split()

    def _batch_files(self) -> list[str]:
        if self.variant == "cifar10":
            names = CIFAR10_TRAIN_FILES if self.train else CIFAR10_TEST_FILES
        else:
            names = CIFAR100_TRAIN_FILES if self.train else CIFAR100_TEST_FILES
        return [os.path.join(self.folder, n) for n in names]

    def _read_split(self) -> tuple[np.ndarray, np.ndarray]:
        label_key = "labels" if self.variant == "cifar10" else f"{self.label_kind}_labels"
        parts = [_read_batch(p, label_key, len(self.classes)) for p in self._batch_files()]
        self._batch_ends = np.cumsum([len(p[1]) for p in parts])
        return (np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]))

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i) -> tuple[np.ndarray, int]:
        """``(image (32, 32, 3) uint8 RGB, label int)``; IndexError outside ``[-N, N)``."""
        i = check_index(i, len(self), self.name)
        if self._images is None:
            images, labels = self._read_split()
            if not np.array_equal(labels, self.labels):
                raise SourceError(
                    f"{self.folder}: the CIFAR batch files changed since the source was created", path=self.folder
                )
            self._images = images
        return self._images[i], int(self.labels[i])

    def describe(self, i: int) -> str:
        """``'sample i of cifar10-train in <folder>'``, for error messages."""
        return f"sample {i} of {self.name} in {self.folder}"

    def origin(self, i: int) -> str:
        """Sample ``i``'s provenance: ``'<batch file number>:<row in that file>'`` (see :attr:`origin_info`)."""
        i = check_index(i, len(self), self.name)
        k = int(np.searchsorted(self._batch_ends, i, side="right"))
        return f"{k}:{i - (int(self._batch_ends[k - 1]) if k else 0)}"

    @property
    def origin_info(self) -> dict:
        """How :meth:`origin` reads (:mod:`ffload.formats.origins`): a batch file and a row in it."""
        return {
            "source": self.variant,
            "id": "row",
            "int": True,
            "part": "file",
            "parts": [os.path.basename(p) for p in self._batch_files()],
        }

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_images"] = None  # workers re-read the batches instead of receiving 150 MB through a pipe
        return state

    def __repr__(self) -> str:
        return f"CIFARSource({self.folder!r}, train={self.train}, label_kind={self.label_kind!r})"
