"""Absurd loader arguments and use after close: capped or refused with the numbers, never silent."""

from __future__ import annotations

import numpy as np
import pytest

import ffload
from ffload.errors import ConfigurationError, LoaderClosedError
from ffload.formats import IntField, RGBImageField, write_dataset
from ffload.system import available_cpus


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("limits") / "d.beton")
    imgs = np.zeros((40, 16, 16, 3), np.uint8)
    write_dataset(path, {"image": RGBImageField("raw"), "label": IntField()}, [(imgs[i], i) for i in range(40)], 40)
    return path


def test_num_workers_beyond_the_cpus_is_capped_with_a_warning(dataset):
    with pytest.warns(UserWarning, match=r"num_workers=1000 exceeds the \d+ CPUs"):
        loader = ffload.Loader(dataset, batch_size=8, num_workers=1000)
    with loader:
        assert loader.num_workers == available_cpus()
        assert sum(len(labels) for _, labels in loader) == 40


def test_buffers_that_cannot_fit_in_memory_are_refused_with_the_bytes(tmp_path):
    path = str(tmp_path / "big.beton")
    imgs = np.zeros((4, 1024, 1024, 3), np.uint8)
    write_dataset(path, {"image": RGBImageField("raw"), "label": IntField()}, [(imgs[i], i) for i in range(4)], 4)
    # a slot is 4 images of 3 MiB and 4 int64 labels; 100k batches ahead cannot fit
    with pytest.raises(ConfigurationError, match=r"needs [\d.]+ GiB of buffers, 12582944 bytes per slot"):
        ffload.Loader(path, batch_size=4, num_workers=1, batches_ahead=100_000)


def test_a_closed_loader_says_it_is_closed(dataset):
    loader = ffload.Loader(dataset, batch_size=8, num_workers=1)
    it = iter(loader)
    next(it)
    loader.close()
    with pytest.raises(LoaderClosedError, match="its loader was closed"):
        next(it)
    with pytest.raises(LoaderClosedError, match="is closed: create a new Loader"):
        iter(loader)
    loader.close()  # idempotent, silent
