"""Edge cases found in review: concurrent LMDB writers, ambiguous layouts, oversized batches,
CUDA requested without CUDA, empty epochs."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

import ffload
from ffload.formats import IntField, RGBImageField, write_dataset

WRITER = r"""
import lmdb, sys
env = lmdb.open(sys.argv[1], map_size=1 << 30)
for t in range(20):
    with env.begin(write=True) as txn:
        txn.put(b"zz_note_%d" % t, b"x" * 5000)
with env.begin(write=True) as txn:  # rewrite sample 7 with the same bytes: copy-on-write pages
    txn.put(b"0000000007", bytes(txn.get(b"0000000007")))
for t in range(20):
    with env.begin(write=True) as txn:
        txn.put(b"zz_more_%d" % t, b"y" * 9000)
env.close()
"""


def test_lmdb_written_by_another_process_while_loading(tmp_path):
    """The loader keeps a read snapshot: pages it points at are not reused by a writer."""
    path = str(tmp_path / "r.lmdb")
    imgs = np.random.default_rng(0).integers(0, 255, (50, 32, 32, 3), dtype=np.uint8)
    write_dataset(path, {"image": RGBImageField("raw"), "label": IntField()}, [(imgs[i], i) for i in range(50)], 50)
    with ffload.Loader(path, batch_size=10, num_workers=1, order="sequential") as loader:
        subprocess.run([sys.executable, "-c", WRITER, path], check=True, timeout=120)
        bad = [int(k) for ims, labs in loader for im, k in zip(ims, labs) if not np.array_equal(im.numpy(), imgs[k])]
    assert bad == []


@pytest.mark.parametrize("to_torch_image", [False, True])
def test_normalize_on_torch_finds_the_channel_axis_when_height_is_3(tmp_path, to_torch_image):
    """(3, W, 3) images: the channel axis comes from the layout, not from matching sizes."""
    from ffload.loaders import NormalizeImage, SimpleRGBImageDecoder, ToTensor, ToTorchImage

    imgs = np.random.default_rng(1).integers(0, 255, (6, 3, 10, 3), dtype=np.uint8)
    path = str(tmp_path / "h3.beton")
    write_dataset(path, {"image": RGBImageField("raw")}, [(im,) for im in imgs], 6)
    mean, std = np.array([10.0, 120.0, 250.0]), np.array([2.0, 30.0, 60.0])
    ops = [SimpleRGBImageDecoder(), ToTensor()] + ([ToTorchImage()] if to_torch_image else [])
    ops.append(NormalizeImage(mean, std, np.float32))
    with ffload.Loader(path, batch_size=6, num_workers=1, order="sequential", pipelines={"image": ops}) as loader:
        (out,) = next(iter(loader))
    expected = ((imgs - mean) / std).astype(np.float32)
    if to_torch_image:
        expected = expected.transpose(0, 3, 1, 2)
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-5, atol=1e-5)


def test_batch_buffers_hold_at_most_an_epoch(tmp_path):
    """batch_size far beyond the dataset: buffers are sized by the samples, not batch_size."""
    from ffload.loaders import SimpleRGBImageDecoder, ToTensor

    imgs = np.random.default_rng(2).integers(0, 255, (10, 224, 224, 3), dtype=np.uint8)
    path = str(tmp_path / "small.beton")
    write_dataset(path, {"image": RGBImageField("raw")}, [(im,) for im in imgs], 10)
    with ffload.Loader(
        path,
        batch_size=1_000_000,
        num_workers=1,
        order="sequential",
        pipelines={"image": [SimpleRGBImageDecoder(), ToTensor()]},
    ) as loader:
        assert loader._pipelines[0].buffer_specs[0].shape[0] == 10
        (batch,) = next(iter(loader))
    np.testing.assert_array_equal(batch.numpy(), imgs)


def test_cuda_requested_without_cuda_names_the_field(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    from ffload.loaders import IntDecoder, ToDevice, ToTensor

    path = str(tmp_path / "i.beton")
    write_dataset(path, {"label": IntField()}, [(i,) for i in range(4)], 4)
    for device in ("cuda", "cuda:0"):
        with pytest.raises(RuntimeError, match="field 'label'.*CUDA is not available"):
            ffload.Loader(
                path, batch_size=2, num_workers=1, pipelines={"label": [IntDecoder(), ToTensor(), ToDevice(device)]}
            )


def test_state_of_a_loader_without_batches_does_not_skip_epochs(tmp_path):
    path = str(tmp_path / "few.beton")
    write_dataset(path, {"label": IntField()}, [(i,) for i in range(10)], 10)
    loader = ffload.Loader(path, batch_size=64, num_workers=1, drop_last=True)
    assert len(loader) == 0
    state = loader.state_dict()
    assert (state["epoch"], state["batches_yielded"]) == (0, 0)
    loader.load_state_dict(state)
    assert loader.state_dict()["epoch"] == 0
    loader.close()
