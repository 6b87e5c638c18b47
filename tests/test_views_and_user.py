"""Two augmented views of one field from one read (``custom_field_mapper``) and user transforms
(``PythonTransform``) inside the loader."""

from __future__ import annotations

import numpy as np
import pytest
from skimage import data

import ffload
from ffload.formats import IntField, RGBImageField, write_dataset
from ffload.loaders import (
    PythonTransform,
    RandomHorizontalFlip,
    RandomResizedCropRGBImageDecoder,
    SimpleRGBImageDecoder,
    ToTensor,
)


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    img = data.astronaut()
    crops = np.stack([np.ascontiguousarray(img[9 * k : 9 * k + 64, 7 * k : 7 * k + 64]) for k in range(20)])
    path = str(tmp_path_factory.mktemp("views") / "p.beton")
    write_dataset(path, {"image": RGBImageField("raw"), "label": IntField()}, [(crops[i], i) for i in range(20)], 20)
    return path, crops


def _two_views(path, workers):
    def crop():
        return [RandomResizedCropRGBImageDecoder((32, 32)), RandomHorizontalFlip(), ToTensor()]

    with ffload.Loader(
        path,
        batch_size=6,
        num_workers=workers,
        order="random",
        seed=5,
        pipelines={"image": crop(), "image2": crop()},
        custom_field_mapper={"image2": "image"},
    ) as loader:
        assert loader.field_names == ["image", "label", "image2"]
        return [tuple(t.numpy().copy() for t in batch) for batch in loader]


def test_two_views_differ_and_do_not_depend_on_workers(photos):
    path, _ = photos
    one, two = _two_views(path, 1), _two_views(path, 2)
    for (a1, l1, b1), (a2, l2, b2) in zip(one, two):
        np.testing.assert_array_equal(a1, a2)
        np.testing.assert_array_equal(b1, b2)
        np.testing.assert_array_equal(l1, l2)
    views = [(a, b) for a, _, b in one]
    assert all(a.shape == b.shape == (len(a), 32, 32, 3) for a, b in views)
    assert not any(np.array_equal(a[k], b[k]) for a, b in views for k in range(len(a)))  # independent crops


def test_mapper_errors_name_the_problem(photos):
    path, _ = photos
    with pytest.raises(ValueError, match="custom_field_mapper 'image2' -> 'nope'"):
        ffload.Loader(
            path, batch_size=4, pipelines={"image2": [SimpleRGBImageDecoder()]}, custom_field_mapper={"image2": "nope"}
        )
    with pytest.raises(ValueError, match="needs a new name"):
        ffload.Loader(path, batch_size=4, custom_field_mapper={"image2": "image"})  # no pipeline for the view


@pytest.mark.parametrize("input_type", ["numpy", "tensor", "pil"])
def test_python_transform_receives_the_declared_type_and_a_per_sample_seed(photos, input_type):
    path, crops = photos
    seen = set()

    def fn(x, seed):
        seen.add(type(x).__name__)
        arr = np.asarray(x)[:16, :16]
        return arr[::-1] if seed % 2 else arr

    runs = []
    for workers in (1, 2):
        op = PythonTransform(fn, (16, 16, 3), np.uint8, input_type=input_type)
        with ffload.Loader(
            path,
            batch_size=8,
            num_workers=workers,
            order="random",
            seed=2,
            pipelines={"image": [SimpleRGBImageDecoder(), op, ToTensor()]},
        ) as loader:
            runs.append([(im.numpy().copy(), lab.numpy().copy()) for im, lab in loader])
    assert seen == {"numpy": {"ndarray"}, "tensor": {"Tensor"}, "pil": {"Image"}}[input_type]
    flipped = 0
    for (a, la), (b, lb) in zip(*runs):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(la, lb)
        for img, k in zip(a, la):
            top = crops[k][:16, :16]
            assert np.array_equal(img, top) or np.array_equal(img, top[::-1])
            flipped += not np.array_equal(img, top)
    assert 0 < flipped < 20


def test_python_transform_wrong_output_is_named(photos):
    path, _ = photos
    op = PythonTransform(lambda x: x, (8, 8, 3))
    with ffload.Loader(
        path, batch_size=4, num_workers=1, pipelines={"image": [SimpleRGBImageDecoder(), op, ToTensor()]}
    ) as loader:
        with pytest.raises(ffload.loaders.LoaderError, match=r"returned uint8\[64, 64, 3\], declared uint8\[8, 8, 3\]"):
            next(iter(loader))
