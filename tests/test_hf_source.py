"""Hugging Face ``datasets`` sources, from datasets written in the test (no download): a Dataset
object, a DatasetDict, a save_to_disk folder and Parquet files, each converted and compared."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image as PILImage
from skimage import data

from ffload.convert import convert_dataset
from ffload.convert.sources import SourceError
from ffload.formats import open_dataset

datasets = pytest.importorskip("datasets")


def _photos(n=8):
    img = data.coffee()
    return [np.ascontiguousarray(img[10 * k : 10 * k + 30, 7 * k : 7 * k + 36]) for k in range(n)]


def _png(rgb) -> bytes:
    buf = io.BytesIO()
    PILImage.fromarray(rgb).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def hf():
    photos = _photos()
    features = datasets.Features(
        {
            "img": datasets.Image(),
            "caption": datasets.Value("string"),
            "fine_label": datasets.ClassLabel(names=["cup", "bean", "saucer"]),
        }
    )
    ds = datasets.Dataset.from_dict(
        {
            "img": [{"bytes": _png(p), "path": None} for p in photos],
            "caption": [f"c{k}" for k in range(len(photos))],
            "fine_label": [k % 3 for k in range(len(photos))],
        },
        features=features,
    )
    return ds, photos


def _check(src, photos):
    from ffload.convert.sources.hf import HFSource

    assert isinstance(src, HFSource)
    assert len(src) == len(photos) and src.classes == ["cup", "bean", "saucer"]
    assert src.labels.tolist() == [k % 3 for k in range(len(photos))]
    for k, p in enumerate(photos):
        image, label = src[k]
        np.testing.assert_array_equal(image, p)
        assert label == k % 3


def test_dataset_object_dict_disk_and_parquet(tmp_path, hf):
    from ffload.convert.sources.hf import HFSource

    ds, photos = hf
    _check(HFSource(ds), photos)
    _check(HFSource(datasets.DatasetDict({"train": ds, "test": ds.select([0])})), photos)
    ds.save_to_disk(str(tmp_path / "saved"))
    _check(HFSource(str(tmp_path / "saved")), photos)
    ds.to_parquet(str(tmp_path / "part-0.parquet"))
    _check(HFSource(str(tmp_path / "part-0.parquet")), photos)
    src = HFSource(str(tmp_path / "saved"))
    report = convert_dataset(src, str(tmp_path / "out.lmdb"), write_mode="raw", num_workers=2, progress=False)
    assert report.samples == len(photos) and report.classes == 3
    view = open_dataset(str(tmp_path / "out.lmdb"))
    assert view.metadata["label"].tolist() == src.labels.tolist()


def test_plain_int_label_and_errors(tmp_path, hf):
    from ffload.convert.sources.hf import HFSource

    ds, photos = hf
    plain = ds.rename_column("fine_label", "label").cast_column("label", datasets.Value("int64"))
    src = HFSource(plain)
    assert src.classes is None and src.labels.tolist() == [k % 3 for k in range(len(photos))]
    with pytest.raises(SourceError, match="no label column"):
        HFSource(ds.remove_columns(["fine_label"]))
    with pytest.raises(SourceError, match="no Image column"):
        HFSource(ds.remove_columns(["img"]))
    with pytest.raises(SourceError, match="split 'val'"):
        HFSource(datasets.DatasetDict({"train": ds}), split="val")
    with pytest.raises(SourceError, match="not one integer"):
        HFSource(ds, label_column="caption")
