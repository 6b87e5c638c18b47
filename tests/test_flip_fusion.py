"""A RandomHorizontalFlip right after an RGB decoder is applied by the decoder while it writes
(Operation's flip-fusion hook): the batches are those of the separate flip stage."""

from __future__ import annotations

import numpy as np
import pytest
from skimage import data

from ffload.formats import RGBImageField
from ffload.loaders.decoders.rgb import (
    CenterCropRGBImageDecoder,
    RandomResizedCropRGBImageDecoder,
    SimpleRGBImageDecoder,
)
from ffload.loaders.pipeline.build import FieldPipeline
from ffload.loaders.pipeline.operation import BatchContext
from ffload.loaders.rng import sample_seeds
from ffload.loaders.transforms.crop import RandomTranslate
from ffload.loaders.transforms.flip import RandomHorizontalFlip
from tests.test_decoders import write


def run(view, ops, indices, fuse, epoch=2, seed=7):
    pipe = FieldPipeline("image", view.fields["image"], ops, view, 16, fuse=fuse)
    buffers = pipe.allocate(pin_memory=False)
    indices = np.asarray(indices, dtype=np.int64)
    ctx = BatchContext(
        indices,
        sample_seeds(seed, epoch, indices),
        view.open_region(),
        view.metadata["image"],
        view.ptrs["image"],
        view.sizes["image"],
        epoch,
    )
    return pipe, np.array(pipe.run(buffers, ctx))


@pytest.mark.parametrize("mode", ["jpg", "raw"])
@pytest.mark.parametrize(
    "decoder",
    [
        lambda: RandomResizedCropRGBImageDecoder(96),
        lambda: CenterCropRGBImageDecoder((64, 80)),
        lambda: SimpleRGBImageDecoder(),
    ],
)
def test_fused_flip_gives_the_batches_of_the_separate_flip(tmp_path, mode, decoder):
    photo = data.astronaut()[::4, ::4]  # 128 x 128
    rows = [(np.ascontiguousarray(np.roll(photo, 9 * k, axis=1)),) for k in range(12)]
    view = write(tmp_path / "d.beton", {"image": RGBImageField(mode)}, rows)
    indices = [11, 3, 0, 7, 5, 1, 9, 2, 10, 4, 6, 8]
    fused, a = run(view, [decoder(), RandomHorizontalFlip(0.5)], indices, fuse=True)
    alone, b = run(view, [decoder(), RandomHorizontalFlip(0.5)], indices, fuse=False)
    assert fused.ops[1].fused and not alone.ops[1].fused
    assert np.array_equal(a, b)
    _, plain = run(view, [decoder()], indices, fuse=True)
    flipped = [not np.array_equal(x, y) for x, y in zip(a, plain)]
    assert 2 <= sum(flipped) <= 10  # some samples flipped, some not
    for x, y, f in zip(a, plain, flipped):
        assert np.array_equal(x, y[:, ::-1] if f else y)


def test_flip_after_another_stage_is_not_fused(tmp_path):
    view = write(tmp_path / "d.beton", {"image": RGBImageField("raw")}, [(data.astronaut()[::8, ::8],)] * 4)
    pipe, _ = run(view, [SimpleRGBImageDecoder(), RandomTranslate(padding=2), RandomHorizontalFlip()], [0, 1], True)
    assert not pipe.ops[2].fused and pipe.ops[0].flip is None
