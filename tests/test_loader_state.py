"""Loader.state_dict / load_state_dict: resuming mid-epoch reproduces an uninterrupted run."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import ffload
from ffload.formats import IntField, RGBImageField, write_dataset
from ffload.loaders import RandomHorizontalFlip, RandomResizedCropRGBImageDecoder, RandomTranslate, ToTensor

N = 53
BATCH = 6  # 9 batches per epoch, the last one of 5 samples


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    from skimage import data

    photo = data.chelsea()  # (300, 451, 3)
    images = [np.ascontiguousarray(photo[i : i + 24 + i % 5, 2 * i : 2 * i + 20]) for i in range(N)]
    dst = tmp_path_factory.mktemp("state") / "cats.beton"
    return write_dataset(
        str(dst), {"image": RGBImageField("jpg"), "index": IntField()}, ((im, i) for i, im in enumerate(images)), N
    )


def make_loader(path, **kw):
    pipelines = {
        "image": [RandomResizedCropRGBImageDecoder((12, 12)), RandomHorizontalFlip(), RandomTranslate(2), ToTensor()]
    }
    args = dict(batch_size=BATCH, num_workers=2, order="random", seed=11, pipelines=pipelines)
    args.update(kw)
    return ffload.Loader(path, **args)


def take(iterator, count=None):
    out = []
    for batch in iterator:
        out.append(tuple(t.clone() for t in batch))
        if count is not None and len(out) == count:
            break
    return out


def assert_same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert all(torch.equal(s, t) for s, t in zip(x, y))


@pytest.mark.parametrize("stop_after", [0, 1, 4, 8])
def test_resume_mid_epoch_is_bit_identical(path, stop_after):
    reference = make_loader(path)
    epochs = [take(reference) for _ in range(3)]
    reference.close()
    assert len(epochs[1]) == 9

    first = make_loader(path)
    take(first)  # epoch 0
    it = iter(first)  # epoch 1, interrupted
    if stop_after:
        take(it, stop_after)
    state = first.state_dict()
    assert state["epoch"] == 1 and state["batches_yielded"] == stop_after
    first.close()

    resumed = make_loader(path, num_workers=1)
    resumed.load_state_dict(state)
    assert_same(take(resumed), epochs[1][stop_after:])
    assert_same(take(resumed), epochs[2])
    resumed.close()


def test_state_between_epochs_and_after_the_last_batch(path):
    loader = make_loader(path)
    assert loader.state_dict()["epoch"] == 0 and loader.state_dict()["batches_yielded"] == 0
    it = iter(loader)
    take(it, 9)  # every batch handed out, StopIteration not reached yet
    assert (loader.state_dict()["epoch"], loader.state_dict()["batches_yielded"]) == (1, 0)
    take(it)
    take(loader)
    state = loader.state_dict()
    assert (state["epoch"], state["batches_yielded"]) == (2, 0)
    assert state["seed"] == 11 and state["batch_size"] == BATCH and state["order"] == "random"
    # abandoned mid-epoch: the next iter() starts the next epoch, and so does the state
    for _ in loader:
        break
    assert loader.state_dict()["epoch"] == 3
    loader.close()


def test_completed_epoch_state_resumes_at_the_next_epoch(path):
    reference = make_loader(path)
    epochs = [take(reference) for _ in range(2)]
    resumed = make_loader(path)
    state = dict(resumed.state_dict(), epoch=0, batches_yielded=9)
    resumed.load_state_dict(state)
    assert resumed.next_epoch == 1
    assert_same(take(resumed), epochs[1])
    resumed.next_epoch = 0
    assert_same(take(resumed), epochs[0])


def test_load_state_dict_closes_the_live_iterator(path):
    loader = make_loader(path)
    it = iter(loader)
    next(it)
    loader.load_state_dict(loader.state_dict())
    with pytest.raises(RuntimeError, match="load_state_dict"):
        next(it)
    loader.close()


def test_incompatible_states_are_rejected(path):
    loader = make_loader(path)
    state = loader.state_dict()
    for key, value in [
        ("seed", 12),
        ("batch_size", 5),
        ("order", "sequential"),
        ("drop_last", True),
        ("num_indices", 10),
        ("world_size", 2),
    ]:
        with pytest.raises(ValueError, match=key):
            loader.load_state_dict(dict(state, **{key: value}))
    with pytest.raises(ValueError, match="lacks epoch"):
        loader.load_state_dict({k: v for k, v in state.items() if k != "epoch"})
    with pytest.raises(ValueError, match="exceeds the 9 batches"):
        loader.load_state_dict(dict(state, batches_yielded=10))
    with pytest.raises(ValueError, match="epoch"):
        loader.load_state_dict(dict(state, epoch=-1))
    loader.close()
