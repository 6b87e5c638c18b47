"""Boxes and masks transformed with their image's geometry (ffload.loaders.pipeline.geometry / targets):
exact boxes for hand-built crops, resizes and flips; an image's rectangle, its mask and its box
agreeing after RandomResizedCrop + flips; the checks made when the loader is built."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from ffload.errors import ConfigurationError
from ffload.formats import ImageArrayField, IntField, RaggedArrayField, RGBImageField, write_dataset
from ffload.loaders import (
    BoxCountDecoder,
    CenterCropRGBImageDecoder,
    ImageArrayDecoder,
    IntDecoder,
    Loader,
    MaskDecoder,
    OrderOption,
    RaggedArrayDecoder,
    RaggedLengthDecoder,
    RandomCropImageArrayDecoder,
    RandomHorizontalFlip,
    RandomPerspective,
    RandomResizedCropRGBImageDecoder,
    RandomVerticalFlip,
    ResizeRGBImageDecoder,
    TransformBoxes,
)
from ffload.loaders.decoders.targets import transform_boxes

FIELDS = {
    "image": RGBImageField("raw"),
    "boxes": RaggedArrayField("float32", (4,)),
    "mask": ImageArrayField("uint8", 1),
    "index": IntField(),
}
# stored boxes of every hand-built sample (x0, y0, x1, y1), a 100 x 200 image
HAND_BOXES = np.array(
    [
        [60, 10, 100, 30],  # inside the centre square
        [0, 0, 40, 20],  # left of it: cut away
        [140, 80, 190, 100],  # crosses its right edge: clipped
        [149, 50, 150.5, 60],
    ],
    np.float32,
)  # 0.5 output px wide once clipped: dropped


def hand_dataset(path, n=4):
    image = np.zeros((100, 200, 3), np.uint8)
    mask = np.zeros((100, 200, 1), np.uint8)
    mask[10:30, 60:100] = 7
    rows = [(image, HAND_BOXES, mask, i) for i in range(n)]
    return write_dataset(str(path), FIELDS, rows, n)


def batches(dst, pipelines, mapper=None, batch_size=4, seed=0):
    loader = Loader(
        dst,
        batch_size=batch_size,
        num_workers=1,
        order=OrderOption.SEQUENTIAL,
        seed=seed,
        pipelines=pipelines,
        custom_field_mapper=mapper,
    )
    return list(loader)


@pytest.mark.parametrize("suffix", [".beton", ".lmdb"])
def test_center_crop_boxes_are_exact_with_and_without_flip(tmp_path, suffix):
    dst = hand_dataset(tmp_path / f"d{suffix}")
    # centre square of side 100 at left = 50, scaled by 0.5 to 50 x 50
    kept = np.array([[5, 5, 25, 15], [45, 40, 50, 50]], np.float32)
    mirrored = np.array([[25, 5, 45, 15], [0, 40, 5, 50]], np.float32)
    for flip, expected in ((0.0, kept), (1.0, mirrored)):
        ((image, boxes, mask, index, count, stored),) = batches(
            dst,
            {
                "image": [CenterCropRGBImageDecoder(50, ratio=1.0), RandomHorizontalFlip(flip)],
                "boxes": [RaggedArrayDecoder(max_length=5, fill=-1), TransformBoxes("image")],
                "mask": [MaskDecoder("image")],
                "index": [IntDecoder()],
                "count": [BoxCountDecoder("boxes")],
                "stored": [RaggedLengthDecoder()],
            },
            {"count": "boxes", "stored": "boxes"},
        )
        assert boxes.shape == (4, 5, 4) and boxes.dtype == np.float32
        for j in range(4):
            assert count[j] == 2 and stored[j] == 4  # the cut box and the 0.75 px box are dropped
            np.testing.assert_array_equal(boxes[j, :2], expected)
            assert np.all(boxes[j, 2:] == 0)  # TransformBoxes' fill (0), over the decoder's -1 padding
            m = mask[j, :, :, 0]
            ys, xs = np.nonzero(m == 7)
            x0, y0, x1, y1 = expected[0].astype(int)
            assert (xs.min(), ys.min(), xs.max() + 1, ys.max() + 1) == (x0, y0, x1, y1)
            assert np.all(m[y0:y1, x0:x1] == 7) and np.count_nonzero(m) == (x1 - x0) * (y1 - y0)


def test_keep_rule_and_resize_scale(tmp_path):
    dst = hand_dataset(tmp_path / "d.beton")
    ((boxes, count),) = [
        (b, c)
        for _, b, _, c in batches(
            dst,
            {
                "image": [ResizeRGBImageDecoder((50, 100))],
                "boxes": [RaggedArrayDecoder(), TransformBoxes("image", drop=False)],
                "mask": None,
                "index": [IntDecoder()],
                "count": [BoxCountDecoder("boxes")],
            },
            {"count": "boxes"},
        )
    ]
    # (h, w) = (50, 100) from 100 x 200: every coordinate halves, no box is dropped
    np.testing.assert_allclose(boxes[0], HAND_BOXES / 2)
    assert count.tolist() == [4] * 4


def test_transform_boxes_kernel_rules():
    boxes = np.array([[[10, 10, 30, 20], [0, 0, 5, 5], [15, 12, 15.4, 18], [np.nan, 0, 4, 4]]], np.float64)
    counts = np.array([4], np.int64)
    crop = np.array([[10.0, 10.0, 20.0, 40.0]])  # top 10, left 10, 20 x 40, to 40 x 80 (x2)
    no_steps = np.zeros((1, 0, 3, 3))
    kept = np.empty((1, 4), np.int64)
    transform_boxes(
        boxes, counts, crop, 40.0, 80.0, np.array([True]), np.array([True]), no_steps, True, 1.0, -1.0, kept
    )
    # (10, 10, 30, 20) -> (0, 0, 40, 20) -> h-mirrored (40, 0, 80, 20) -> v-mirrored (40, 20, 80, 40)
    assert counts[0] == 1 and kept.tolist() == [[0, -1, -1, -1]]
    np.testing.assert_array_equal(boxes[0, 0], [40, 20, 80, 40])
    assert np.all(boxes[0, 1:] == -1)  # outside, 0.8 px wide and NaN boxes are dropped
    boxes = np.array([[[0, 0, 5, 5], [20, 12, 24, 16]]], np.float32)
    counts = np.array([2], np.int64)
    kept = np.empty((1, 2), np.int64)
    transform_boxes(
        boxes, counts, crop, 40.0, 80.0, np.array([False]), np.array([False]), no_steps, False, 1.0, 0.0, kept
    )
    assert counts[0] == 2 and kept.tolist() == [[0, 1]]  # kept in place: the outside box is clipped to zero area
    np.testing.assert_array_equal(boxes[0], [[0, 0, 0, 0], [20, 4, 28, 12]])


def rectangles(n, seed=3):
    """Images of several sizes, each black with one white rectangle; the same rectangle as mask
    label 1 (image-sized) and as its box."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        h, w = int(rng.integers(60, 140)), int(rng.integers(60, 160))
        rh, rw = int(rng.integers(h // 3, h // 2)), int(rng.integers(w // 3, w // 2))
        y0, x0 = int(rng.integers(0, h - rh)), int(rng.integers(0, w - rw))
        image = np.zeros((h, w, 3), np.uint8)
        image[y0 : y0 + rh, x0 : x0 + rw] = 255
        mask = (image[:, :, :1] > 0).astype(np.uint8)
        rows.append((image, np.array([[x0, y0, x0 + rw, y0 + rh]], np.float32), mask, i))
    return rows


def extent(on):
    """(x0, y0, x1, y1) of the True pixels (pixel edges), or None."""
    ys, xs = np.nonzero(on)
    return None if ys.size == 0 else np.array([xs.min(), ys.min(), xs.max() + 1, ys.max() + 1])


@pytest.mark.parametrize("suffix", [".beton", ".lmdb"])
@pytest.mark.parametrize("fuse", [True, False])
def test_image_mask_and_box_agree_after_random_resized_crop_and_flips(tmp_path, suffix, fuse):
    n = 24
    dst = write_dataset(str(tmp_path / f"r{suffix}"), FIELDS, rectangles(n), n)
    crop = RandomResizedCropRGBImageDecoder(64, scale=(0.25, 1.0))
    # fused: the decoder mirrors while writing; else a vertical flip between keeps both flips stages
    image_ops = (
        [crop, RandomHorizontalFlip(0.5)] if fuse else [crop, RandomVerticalFlip(0.5), RandomHorizontalFlip(0.5)]
    )
    pipelines = {
        "image": image_ops,
        "boxes": [RaggedArrayDecoder(), TransformBoxes("image")],
        "mask": [MaskDecoder("image")],
        "index": [IntDecoder()],
        "count": [BoxCountDecoder("boxes")],
    }
    out = batches(dst, pipelines, {"count": "boxes"}, batch_size=8, seed=11)
    plain = batches(dst, {**pipelines, "image": image_ops[:1]}, {"count": "boxes"}, batch_size=8, seed=11)
    checked = flipped = 0
    for (image, boxes, mask, index, count), (image0, *_) in zip(out, plain):
        for j in range(len(index)):
            on_image = image[j].mean(axis=2) > 127
            on_mask = mask[j, :, :, 0] == 1
            if count[j] == 0:  # the crop missed the rectangle (or kept a sliver under 1 px)
                for e in (extent(on_image), extent(on_mask)):
                    assert e is None or min(e[2] - e[0], e[3] - e[1]) <= 1
                continue
            box = boxes[j, 0]
            assert np.abs(extent(on_image) - box).max() <= 1, (index[j], extent(on_image), box)
            assert np.abs(extent(on_mask) - box).max() <= 1, (index[j], extent(on_mask), box)
            assert np.count_nonzero(on_mask != on_image) <= 2 * (box[2] - box[0] + box[3] - box[1])  # edges only
            checked += 1
            flipped += not np.array_equal(image[j], image0[j])
    assert checked >= n // 2 and 0 < flipped < checked  # most rectangles seen, some flipped, some not


def test_image_array_crop_decoder_publishes_its_windows(tmp_path):
    rows = [(img, box, mask[:, :, 0].astype(np.uint16) * 300, i) for img, box, mask, i in rectangles(10, seed=5)]
    fields = {
        "image": ImageArrayField("uint8", 3),
        "boxes": FIELDS["boxes"],
        "mask": ImageArrayField("uint16", 1),
        "index": IntField(),
    }
    dst = write_dataset(str(tmp_path / "a.beton"), fields, rows, 10)
    out = batches(
        dst,
        {
            "image": [RandomCropImageArrayDecoder(48), RandomHorizontalFlip(0.5)],
            "boxes": [RaggedArrayDecoder(), TransformBoxes("image", drop=False)],
            "mask": [MaskDecoder("image")],
            "index": [IntDecoder()],
        },
        batch_size=5,
    )
    for image, boxes, mask, index in out:
        assert mask.dtype == np.uint16 and mask.shape == (5, 48, 48, 1)
        for j in range(len(index)):
            np.testing.assert_array_equal(mask[j, :, :, 0] == 300, image[j, :, :, 0] == 255)  # no resize: exact
            e = extent(image[j, :, :, 0] == 255)
            box = boxes[j, 0]
            if e is None:
                assert box[2] - box[0] == 0 or box[3] - box[1] == 0
            else:
                np.testing.assert_array_equal(e, box)


def test_mask_at_another_resolution_follows_proportionally(tmp_path):
    image = np.zeros((80, 120, 3), np.uint8)
    mask = np.zeros((40, 60, 1), np.uint8)  # half resolution
    mask[10:20, 30:45] = 5
    dst = write_dataset(str(tmp_path / "m.beton"), FIELDS, [(image, HAND_BOXES[:0], mask, 0)], 1)
    ((_, out, _),) = batches(
        dst,
        {
            "image": [ResizeRGBImageDecoder((80, 120)), RandomHorizontalFlip(1.0)],
            "boxes": None,
            "mask": [MaskDecoder("image")],
            "index": [IntDecoder()],
        },
        batch_size=1,
    )
    ref = cv2.resize(mask[:, :, 0], (120, 80), interpolation=cv2.INTER_NEAREST_EXACT)[:, ::-1]
    np.testing.assert_array_equal(out[0, :, :, 0], ref)


def test_mask_nearest_resize_equals_cv2_nearest_exact(tmp_path):
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 20, (37, 53, 1), dtype=np.uint8)
    dst = write_dataset(str(tmp_path / "m.lmdb"), FIELDS, [(np.zeros((37, 53, 3), np.uint8), HAND_BOXES, labels, 0)], 1)
    for size in ((20, 30), (90, 71)):
        ((_, out, _),) = batches(
            dst,
            {
                "image": [ResizeRGBImageDecoder(size)],
                "boxes": None,
                "mask": [MaskDecoder("image")],
                "index": [IntDecoder()],
            },
            batch_size=1,
        )
        ref = cv2.resize(labels[:, :, 0], size[::-1], interpolation=cv2.INTER_NEAREST_EXACT)
        np.testing.assert_array_equal(out[0, :, :, 0], ref)
        assert set(np.unique(out)) <= set(np.unique(labels))  # no value is invented


def test_loader_construction_checks(tmp_path):
    dst = hand_dataset(tmp_path / "d.beton")
    base = {"image": [CenterCropRGBImageDecoder(50)], "mask": None, "index": [IntDecoder()]}
    with pytest.raises(ConfigurationError, match="follows field 'picture', which is not among"):
        Loader(dst, 2, pipelines={**base, "boxes": [RaggedArrayDecoder(), TransformBoxes("picture")]})
    with pytest.raises(ConfigurationError, match="follows field 'image', which is not among"):
        Loader(dst, 2, pipelines={**base, "image": None, "boxes": [RaggedArrayDecoder(), TransformBoxes("image")]})
    with pytest.raises(ConfigurationError, match="RandomPerspective\\) moves pixels"):
        Loader(
            dst,
            2,
            pipelines={
                **base,
                "image": [CenterCropRGBImageDecoder(50), RandomPerspective()],
                "boxes": [RaggedArrayDecoder(), TransformBoxes("image")],
            },
        )
    with pytest.raises(ConfigurationError, match="whose decoder IntDecoder is not an image decoder"):
        Loader(
            dst,
            2,
            pipelines={**base, "n": [RaggedArrayDecoder(), TransformBoxes("index")]},
            custom_field_mapper={"n": "boxes"},
        )
    with pytest.raises(ConfigurationError, match="has no TransformBoxes"):
        Loader(
            dst,
            2,
            pipelines={**base, "boxes": [RaggedArrayDecoder()], "n": [BoxCountDecoder("boxes")]},
            custom_field_mapper={"n": "boxes"},
        )
    with pytest.raises(TypeError, match="TransformBoxes \\(field 'index'\\) needs"):
        Loader(dst, 2, pipelines={**base, "index": [IntDecoder(), TransformBoxes("image")]})
    with pytest.raises(ConfigurationError, match="min_size must be >= 0"):
        TransformBoxes("image", min_size=-1)
    # an image that runs after its boxes: a view of the image, boxes as a dataset field
    with pytest.raises(ConfigurationError, match="whose pipeline runs after it") as e:
        Loader(
            dst,
            2,
            pipelines={
                **base,
                "view": [CenterCropRGBImageDecoder(50)],
                "boxes": [RaggedArrayDecoder(), TransformBoxes("view")],
            },
            custom_field_mapper={"view": "image"},
        )
    assert "custom_field_mapper" in str(e.value)
    # the fix the message suggests: the boxes as a view too, after the image's view
    loader = Loader(
        dst,
        2,
        pipelines={
            **base,
            "view": [CenterCropRGBImageDecoder(50, ratio=1.0)],
            "boxes": None,
            "b2": [RaggedArrayDecoder(), TransformBoxes("view")],
        },
        custom_field_mapper={"view": "image", "b2": "boxes"},
    )
    *_, b2 = next(iter(loader))
    np.testing.assert_array_equal(b2[0, :2], [[5, 5, 25, 15], [45, 40, 50, 50]])


def test_image_array_decoder_geometry_is_the_whole_image(tmp_path):
    rows = [(np.zeros((20, 30, 3), np.uint8), HAND_BOXES / 10, np.zeros((20, 30, 1), np.uint8), i) for i in range(2)]
    fields = {**FIELDS, "image": ImageArrayField("uint8", 3)}
    dst = write_dataset(str(tmp_path / "w.beton"), fields, rows, 2)
    ((_, boxes, _, _),) = batches(
        dst,
        {
            "image": [ImageArrayDecoder(), RandomHorizontalFlip(1.0)],
            "boxes": [RaggedArrayDecoder(), TransformBoxes("image", drop=False)],
            "mask": [MaskDecoder("image")],
            "index": [IntDecoder()],
        },
        batch_size=2,
    )
    expected = HAND_BOXES / 10
    expected = np.stack([30 - expected[:, 2], expected[:, 1], 30 - expected[:, 0], expected[:, 3]], axis=1)
    np.testing.assert_allclose(boxes[1], expected, rtol=1e-6)


def test_corrupt_mask_names_the_sample_and_field(tmp_path):
    from ffload.formats import open_dataset
    from ffload.loaders import LoaderError

    rows = rectangles(4)
    dst = write_dataset(str(tmp_path / "c.beton"), FIELDS, rows, 4)
    ptr = int(open_dataset(dst).ptrs["mask"][2])
    with open(dst, "r+b") as fp:  # sample 2's header: one row more than its payload holds
        fp.seek(ptr)
        fp.write(np.array([rows[2][2].shape[0] + 1], "<u4").tobytes())
    loader = Loader(
        dst,
        batch_size=4,
        num_workers=1,
        order=OrderOption.SEQUENTIAL,
        pipelines={
            "image": [RandomResizedCropRGBImageDecoder(32), RandomHorizontalFlip()],
            "boxes": [RaggedArrayDecoder(), TransformBoxes("image")],
            "mask": [MaskDecoder("image")],
            "index": [IntDecoder()],
        },
    )
    with pytest.raises(LoaderError, match="sample 2, field 'mask'.*header and payload") as e:
        next(iter(loader))
    assert e.value.sample == 2 and e.value.field == "mask"


def test_documented_detection_pipeline(tmp_path):
    """docs/fields.md's example: torch stages after the image's flip and warp keep its geometry;
    labels follow the kept boxes; PNG masks."""
    import torch

    from ffload.loaders import FollowBoxes, NormalizeImage, RandomAffine, ToTensor, ToTorchImage

    rows = [(img, box, mask, [i]) for img, box, mask, i in rectangles(6)]
    fields = {
        "image": FIELDS["image"],
        "boxes": FIELDS["boxes"],
        "mask": ImageArrayField("uint8", 1, compression="png"),
        "labels": RaggedArrayField("int64"),
    }
    dst = write_dataset(str(tmp_path / "doc.beton"), fields, rows, 6)
    loader = Loader(
        dst,
        batch_size=3,
        num_workers=1,
        order=OrderOption.SEQUENTIAL,
        pipelines={
            "image": [
                RandomResizedCropRGBImageDecoder((40, 48)),
                RandomHorizontalFlip(),
                RandomAffine(10, translate=(0.1, 0.1)),
                ToTensor(),
                ToTorchImage(),
                NormalizeImage([0, 0, 0], [255, 255, 255], np.float32),
            ],
            "boxes": [RaggedArrayDecoder(max_length=5), TransformBoxes("image"), ToTensor()],
            "labels": [RaggedArrayDecoder(max_length=5, fill=-1), FollowBoxes("boxes", fill=-1), ToTensor()],
            "mask": [MaskDecoder("image", fill=255), ToTensor()],
            "num_boxes": [BoxCountDecoder("boxes"), ToTensor()],
        },
        custom_field_mapper={"num_boxes": "boxes"},
    )
    seen = 0
    for image, boxes, mask, labels, num_boxes in loader:
        assert image.shape == (3, 3, 40, 48) and image.dtype == torch.float32
        assert boxes.shape == (3, 5, 4) and mask.shape == (3, 40, 48, 1) and labels.shape == (3, 5)
        for b, n in enumerate(num_boxes.tolist()):
            assert labels[b].tolist() == [seen + b] * n + [-1] * (5 - n)
            if n == 0:
                continue
            on_mask = extent(mask[b, :, :, 0].numpy() == 1)
            box = boxes[b, 0].numpy()
            if on_mask is not None and min(box[2] - box[0], box[3] - box[1]) >= 2:
                assert np.abs(on_mask - box).max() <= 1.5  # a 10 degree turn of a rectangle: its enclosing box
                assert np.abs(extent(image[b].numpy().mean(axis=0) > 0.5) - box).max() <= 1.5
        assert np.any(mask.numpy() == 255)  # the warp's fill
        seen += 3


def test_boxes_do_not_depend_on_num_workers_or_batch_size(tmp_path):
    dst = write_dataset(str(tmp_path / "w.lmdb"), FIELDS, rectangles(12, seed=9), 12)
    pipelines = {
        "image": [RandomResizedCropRGBImageDecoder(32), RandomHorizontalFlip()],
        "boxes": [RaggedArrayDecoder(), TransformBoxes("image", drop=False)],
        "mask": [MaskDecoder("image")],
        "index": [IntDecoder()],
    }
    runs = []
    for workers, batch_size in ((1, 12), (2, 5)):
        loader = Loader(
            dst, batch_size=batch_size, num_workers=workers, order=OrderOption.RANDOM, seed=4, pipelines=pipelines
        )
        by_index = {}
        for _, boxes, mask, index in loader:
            for j, i in enumerate(index.tolist()):
                by_index[i] = (boxes[j].copy(), mask[j].copy())
        runs.append(by_index)
    assert sorted(runs[0]) == list(range(12))
    for i in range(12):
        np.testing.assert_array_equal(runs[0][i][0], runs[1][i][0])
        np.testing.assert_array_equal(runs[0][i][1], runs[1][i][1])


def test_declared_outside_a_loader_is_refused(tmp_path):
    from ffload.formats import open_dataset

    view = open_dataset(hand_dataset(tmp_path / "d.beton"))
    with pytest.raises(ConfigurationError, match="MaskDecoder \\(field 'mask'\\) reads pipeline 'image'"):
        MaskDecoder("image").declare(None, view.fields["mask"], view)
