"""Hugging Face ``datasets`` as a conversion source: a ``Dataset`` object, a ``save_to_disk``
folder, or Parquet files (https://huggingface.co/docs/datasets).

The image column is the first column whose feature is ``datasets.Image`` (or the one named);
the label column the first ``ClassLabel`` column, else an integer column named ``label`` or
``labels`` (or the one named). Images are read undecoded (``Image(decode=False)``: the stored
bytes, or the file the row points at) and decoded by ffload's one image decoder
(:func:`ffload.convert.images.decode_image_bytes`: EXIF orientation, gray/alpha/16-bit rules), so
a JPEG converts exactly as the same file would from an ImageFolder. ``ClassLabel.names`` become
the class names. Nothing is downloaded: paths must be local (remote datasets: ``load_dataset``
them first and pass the object).

``datasets`` is an optional dependency (``pip install 'ffload[hf]'``), imported on first use.
"""

from __future__ import annotations

import glob
import os

import numpy as np

from ffload.convert.images import DEFAULT_MAX_PIXELS, decode_image_bytes
from ffload.convert.sources.base import SourceError, check_index


def _datasets():
    try:
        import datasets
    except ImportError as e:
        raise SourceError("Hugging Face sources need the 'datasets' package: pip install 'ffload[hf]'") from e
    return datasets


def looks_like_hf(path: str) -> bool:
    """True for a ``save_to_disk`` folder (``state.json`` or ``dataset_dict.json``) or Parquet path."""
    if os.path.isdir(path):
        return any(os.path.isfile(os.path.join(path, f)) for f in ("state.json", "dataset_dict.json")) or bool(
            glob.glob(os.path.join(path, "*.parquet"))
        )
    return path.endswith(".parquet") or (glob.has_magic(path) and ".parquet" in path)


def _load(obj, split: str | None):
    """A ``datasets.Dataset`` from an object or a local path (see :class:`HFSource`)."""
    datasets = _datasets()
    if isinstance(obj, (str, os.PathLike)):
        path = os.fspath(obj)
        if os.path.isdir(path) and not glob.glob(os.path.join(path, "*.parquet")):
            try:
                obj = datasets.load_from_disk(path)
            except (FileNotFoundError, ValueError) as e:
                raise SourceError(f"{path}: not a Hugging Face save_to_disk folder ({e})") from None
        else:
            files = (
                sorted(glob.glob(os.path.join(path, "*.parquet")))
                if os.path.isdir(path)
                else sorted(glob.glob(path))
                if glob.has_magic(path)
                else [path]
            )
            if not files or not all(os.path.isfile(f) for f in files):
                raise SourceError(f"{path}: no Parquet file")
            obj = datasets.Dataset.from_parquet(files)
    if isinstance(obj, datasets.DatasetDict):
        split = split or "train"
        if split not in obj:
            raise SourceError(f"split {split!r} not in this DatasetDict; it has {', '.join(obj)}")
        obj = obj[split]
    if not isinstance(obj, datasets.Dataset):
        raise SourceError(
            f"expected a datasets.Dataset, a save_to_disk folder or Parquet files, got {type(obj).__name__}"
        )
    return obj


class HFSource:
    """Samples of a Hugging Face dataset (see the module docstring for the column rules).

    Args:
        dataset: a ``datasets.Dataset`` or ``DatasetDict``, a ``save_to_disk`` folder, or a Parquet
            file / glob / folder of ``*.parquet``.
        split: for a ``DatasetDict`` (default ``'train'``).
        image_column, label_column: override the detected columns.
        name: default: the path's base name, or the dataset's ``info.dataset_name``.
        max_pixels: images whose header declares more pixels are refused
            (:func:`~ffload.convert.images.check_pixels`); ``None``: no limit.
    Attributes:
        classes: ``ClassLabel.names``, or ``None`` for a plain integer label.
        labels: ``(N,) int64``.
    Raises:
        SourceError: ``datasets`` missing, no image or label column, a label that is not an
            integer, a missing split; ``src[i]``: a row without image bytes or file.
    """

    def __init__(
        self,
        dataset,
        split: str | None = None,
        image_column: str | None = None,
        label_column: str | None = None,
        name: str | None = None,
        max_pixels: int | None = DEFAULT_MAX_PIXELS,
    ):
        datasets = _datasets()
        self.max_pixels = max_pixels
        ds = _load(dataset, split)
        features = ds.features
        self.name = name or (
            os.path.basename(os.path.normpath(os.fspath(dataset)))
            if isinstance(dataset, (str, os.PathLike))
            else ds.info.dataset_name or "hf"
        )
        image_column = image_column or next((c for c, f in features.items() if isinstance(f, datasets.Image)), None)
        if image_column not in features or not isinstance(features[image_column], datasets.Image):
            raise SourceError(f"{self.name}: no Image column (columns: {', '.join(features)})")
        if label_column is None:
            label_column = next(
                (c for c, f in features.items() if isinstance(f, datasets.ClassLabel)),
                next((c for c in ("label", "labels") if c in features), None),
            )
        if label_column not in features:
            raise SourceError(
                f"{self.name}: no label column (a ClassLabel, or 'label'; columns: {', '.join(features)})"
            )
        label_feature = features[label_column]
        self.classes = list(label_feature.names) if isinstance(label_feature, datasets.ClassLabel) else None
        labels = np.asarray(ds.select_columns([label_column]).with_format("numpy")[label_column])
        if labels.ndim != 1 or labels.dtype.kind not in "iu":
            raise SourceError(
                f"{self.name}: label column {label_column!r} holds {labels.dtype} {labels.shape[1:]}, "
                "not one integer per row"
            )
        self.labels = labels.astype(np.int64)
        self.image_column, self.label_column = image_column, label_column
        self._images = ds.select_columns([image_column]).cast_column(image_column, datasets.Image(decode=False))

    def __len__(self) -> int:
        return len(self.labels)

    def encoded(self, i) -> bytes:
        """The stored image bytes of row ``i`` (or the bytes of the file it points at)."""
        i = check_index(i, len(self), self.name)
        cell = self._images[i][self.image_column]
        if cell.get("bytes"):
            return cell["bytes"]
        path = cell.get("path")
        if not path or not os.path.isfile(path):
            raise SourceError(f"{self.describe(i)}: no image bytes and no local file ({path!r})")
        with open(path, "rb") as f:
            return f.read()

    def __getitem__(self, i) -> tuple[np.ndarray, int]:
        """``(image (H, W, 3) uint8 RGB, label int)``; ImageDecodeError naming the row."""
        i = check_index(i, len(self), self.name)
        return decode_image_bytes(self.encoded(i), self.describe(i), self.max_pixels), int(self.labels[i])

    def describe(self, i: int) -> str:
        """``'row i of <name>'``."""
        return f"row {i} of {self.name}"

    def origin(self, i: int) -> str:
        """Sample ``i``'s provenance: its row number in the dataset (``str``)."""
        return str(check_index(i, len(self), self.name))

    @property
    def origin_info(self) -> dict:
        """How :meth:`origin` reads (:mod:`ffload.formats.origins`): a row number of the dataset."""
        return {"source": "hf", "id": "row", "int": True}
