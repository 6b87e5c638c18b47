"""Boxes and masks under RandomTranslate, RandomAffine and RandomRotation of their image, and
per-box labels that follow the boxes TransformBoxes drops (FollowBoxes).

References are independent of the kernels: the image's own pixels (a white rectangle warped by
the image pipeline, whose extent must be the transformed box within one pixel), and a numpy
re-computation of the documented rule (corners through the drawn matrices, enclosing box, clip).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ffload.errors import ConfigurationError
from ffload.formats import ImageArrayField, IntField, RaggedArrayField, RGBImageField, write_dataset
from ffload.loaders import (
    BoxCountDecoder,
    FollowBoxes,
    IntDecoder,
    Loader,
    LoaderError,
    MaskDecoder,
    OrderOption,
    RaggedArrayDecoder,
    RandomAffine,
    RandomHorizontalFlip,
    RandomResizedCropRGBImageDecoder,
    RandomRotation,
    RandomTranslate,
    ResizeRGBImageDecoder,
    ToTensor,
    TransformBoxes,
)
from ffload.loaders.rng import sample_seeds

FIELDS = {
    "image": RGBImageField("raw"),
    "boxes": RaggedArrayField("float32", (4,)),
    "labels": RaggedArrayField("int64"),
    "mask": ImageArrayField("uint8", 1),
    "index": IntField(),
}
H, W = 72, 96


def rectangles(n, seed=0, margin=0):
    """One white rectangle per ``H x W`` image (``margin`` pixels away from every border), the
    same rectangle as mask label 3 and as its box, label ``10 * i``."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        rh, rw = int(rng.integers(12, 30)), int(rng.integers(12, 36))
        y0, x0 = int(rng.integers(margin, H - rh - margin + 1)), int(rng.integers(margin, W - rw - margin + 1))
        image = np.zeros((H, W, 3), np.uint8)
        image[y0 : y0 + rh, x0 : x0 + rw] = 255
        mask = np.zeros((H, W, 1), np.uint8)
        mask[y0 : y0 + rh, x0 : x0 + rw] = 3
        rows.append((image, np.array([[x0, y0, x0 + rw, y0 + rh]], np.float32), [10 * i], mask, i))
    return rows


def extent(on):
    """(x0, y0, x1, y1) of the True pixels (pixel edges), or None."""
    ys, xs = np.nonzero(on)
    return None if ys.size == 0 else np.array([xs.min(), ys.min(), xs.max() + 1, ys.max() + 1], np.float64)


def load(dst, pipelines, mapper=None, batch_size=8, seed=5):
    loader = Loader(
        dst,
        batch_size=batch_size,
        num_workers=1,
        order=OrderOption.SEQUENTIAL,
        seed=seed,
        pipelines=pipelines,
        custom_field_mapper=mapper,
    )
    return loader, list(loader)


@pytest.mark.parametrize("suffix", [".beton", ".lmdb"])
def test_translate_moves_boxes_and_masks_exactly(tmp_path, suffix):
    n = 24
    rows = rectangles(n, seed=1)
    dst = write_dataset(str(tmp_path / f"t{suffix}"), FIELDS, rows, n)
    loader, out = load(
        dst,
        {
            "image": [ResizeRGBImageDecoder((H, W)), RandomTranslate(40), RandomHorizontalFlip()],
            "boxes": [RaggedArrayDecoder(), TransformBoxes("image", min_size=1)],
            "labels": [RaggedArrayDecoder(fill=-1), FollowBoxes("boxes", fill=-1)],
            "mask": [MaskDecoder("image", fill=255)],
            "index": [IntDecoder()],
            "count": [BoxCountDecoder("boxes")],
        },
        {"count": "boxes"},
    )
    dropped = clipped = 0
    for image, boxes, labels, mask, index, count in out:
        for j in range(len(index)):
            seen = extent(image[j, :, :, 0] == 255)  # an integer shift: the rectangle's pixels are exact
            on_mask = extent(mask[j, :, :, 0] == 3)
            if seen is None or min(seen[2] - seen[0], seen[3] - seen[1]) < 1:
                assert count[j] == 0 and on_mask is None and labels[j, 0] == -1
                dropped += 1
                continue
            assert count[j] == 1 and labels[j, 0] == 10 * index[j]
            np.testing.assert_array_equal(boxes[j, 0], seen)
            np.testing.assert_array_equal(on_mask, seen)
            np.testing.assert_array_equal(mask[j, :, :, 0] == 3, image[j, :, :, 0] == 255)
            shifted_in = image[j].max(axis=2) == 0  # black: the image's own pixels or its fill
            assert np.all(mask[j, :, :, 0][shifted_in] != 3)
            x0, y0, x1, y1 = rows[int(index[j])][1][0]
            clipped += bool((seen[2] - seen[0], seen[3] - seen[1]) != (x1 - x0, y1 - y0))
    assert dropped >= 1 and clipped >= 1  # padding 40 moves some rectangles out, cuts others
    # where the translation uncovered pixels, the mask holds its fill, as the image its fill
    image, _, _, mask, _, _ = out[0]
    assert np.any(mask == 255) and np.all((mask == 255) <= (image.max(axis=3, keepdims=True) == 0))


def corner_rule(box, crop, out_size, hflip, steps):
    """The documented rule in numpy: crop + resize, clip, flip, then per stage the four corners
    through its forward matrix, the enclosing box, clip (an empty box stays a point)."""
    (top, left, h, w), (oh, ow) = crop, out_size
    x0, x1 = np.clip((np.array([box[0], box[2]]) - left) * ow / w, 0, ow)
    y0, y1 = np.clip((np.array([box[1], box[3]]) - top) * oh / h, 0, oh)
    if hflip:
        x0, x1 = ow - x1, ow - x0
    for m in steps:
        if not (x1 > x0 and y1 > y0):
            x1, y1 = x0, y0
        corners = np.array([[x0, y0, 1], [x1, y0, 1], [x0, y1, 1], [x1, y1, 1]], np.float64) @ m.T
        x0, x1 = np.clip([corners[:, 0].min(), corners[:, 0].max()], 0, ow)
        y0, y1 = np.clip([corners[:, 1].min(), corners[:, 1].max()], 0, oh)
    return np.array([x0, y0, x1, y1])


@pytest.mark.parametrize(
    "warp",
    [RandomAffine(25, translate=(0.1, 0.1), scale=(0.8, 1.1), shear=8), RandomRotation(40)],
    ids=["affine", "rotation"],
)
def test_affine_boxes_enclose_the_warped_rectangle(tmp_path, warp):
    n = 32
    rows = rectangles(n, seed=2, margin=18)  # room to rotate and shift inside the image
    dst = write_dataset(str(tmp_path / "a.beton"), FIELDS, rows, n)
    loader, out = load(
        dst,
        {
            "image": [ResizeRGBImageDecoder((H, W)), RandomHorizontalFlip(), warp],
            "boxes": [RaggedArrayDecoder(), TransformBoxes("image", drop=False)],
            "labels": None,
            "mask": [MaskDecoder("image")],
            "index": [IntDecoder()],
        },
        batch_size=n,
    )
    ((image, boxes, mask, index),) = out
    ops = loader.pipelines["image"]
    seeds = sample_seeds(5, 0, index)
    flips = flip_draws(seeds, ops[1].salt)
    inverse = ops[2].params(seeds, H, W)
    rotated = 0
    for j in range(n):
        box = boxes[j, 0]
        expected = corner_rule(rows[int(index[j])][1][0], (0, 0, H, W), (H, W), flips[j], [np.linalg.inv(inverse[j])])
        np.testing.assert_allclose(box, expected, atol=1e-3)  # float32 boxes, float64 reference
        seen = extent(image[j].min(axis=2) > 127)
        # the enclosing box of the warped rectangle: its pixels reach the box's sides within a pixel
        assert np.abs(seen - box).max() <= 1.0, (j, seen, box)
        assert np.abs(extent(mask[j, :, :, 0] == 3) - box).max() <= 1.0
        rotated += abs(inverse[j, 0, 1]) > 0.05
    assert rotated >= n // 2


def flip_draws(seeds, salt):
    """``(B,) bool``: the samples RandomHorizontalFlip(0.5) of that salt mirrors (its own rule)."""
    from ffload.loaders.decoders.rgb import flip_draws as draws

    out = np.empty(len(seeds), np.bool_)
    draws(seeds, salt, 0.5, out)
    return out


@pytest.mark.parametrize("crop", ["warps", "random_resized_crop"])
def test_labels_follow_dropped_boxes_and_the_corner_rule(tmp_path, crop):
    """Boxes near the border, 0..4 per sample: drop=True keeps exactly the boxes of width and
    height >= min_size among drop=False's, and FollowBoxes their labels, in order; through
    resize, flip, translate and affine each box equals the numpy rule."""
    n = 40
    rng = np.random.default_rng(4)
    rows = []
    for i in range(n):
        k = int(rng.integers(0, 5))  # K = 0 samples included
        xy = rng.uniform(-10, [W, H], (k, 2))
        wh = rng.uniform(1, 40, (k, 2))
        rows.append(
            (
                np.zeros((H, W, 3), np.uint8),
                np.concatenate([xy, xy + wh], 1).astype(np.float32),
                100 * i + np.arange(k),
                np.zeros((H, W, 1), np.uint8),
                i,
            )
        )
    dst = write_dataset(str(tmp_path / "c.beton"), FIELDS, rows, n)
    image = (
        [
            ResizeRGBImageDecoder((48, 64)),
            RandomHorizontalFlip(),
            RandomTranslate(6),
            RandomAffine(30, translate=(0.1, 0.1), scale=(0.9, 1.3)),
        ]
        if crop == "warps"
        else [RandomResizedCropRGBImageDecoder((48, 64), scale=(0.1, 0.5)), RandomHorizontalFlip()]
    )
    base = {"image": image, "mask": None, "index": [IntDecoder()], "count": [BoxCountDecoder("boxes")]}
    kept_loader, kept = load(
        dst,
        {
            **base,
            "boxes": [RaggedArrayDecoder(max_length=4), TransformBoxes("image", min_size=2)],
            "labels": [RaggedArrayDecoder(max_length=4, fill=-1), FollowBoxes("boxes", -1), ToTensor()],
        },
        {"count": "boxes"},
        batch_size=16,
    )
    _, every = load(
        dst,
        {
            **base,
            "boxes": [RaggedArrayDecoder(max_length=4), TransformBoxes("image", drop=False)],
            "labels": [RaggedArrayDecoder(max_length=4, fill=-1), FollowBoxes("boxes", -1)],
        },
        {"count": "boxes"},
        batch_size=16,
    )
    total = dropped = 0
    for (_, boxes, labels, index, count), (_, all_boxes, all_labels, _, all_count) in zip(kept, every):
        assert isinstance(labels, torch.Tensor) and labels.shape == (len(index), 4)  # collated as before
        for j, i in enumerate(index.tolist()):
            stored = rows[i][1][:4]
            assert all_count[j] == len(stored)
            np.testing.assert_array_equal(all_labels[j, : len(stored)], rows[i][2][:4])  # drop=False: unmoved
            sizes = all_boxes[j, : len(stored), 2:] - all_boxes[j, : len(stored), :2]
            keep = np.flatnonzero((sizes >= 2).all(axis=1))
            assert count[j] == len(keep)
            np.testing.assert_array_equal(labels[j, : len(keep)].numpy(), rows[i][2][keep])
            np.testing.assert_array_equal(boxes[j, : len(keep)], all_boxes[j, keep])
            assert np.all(labels[j, len(keep) :].numpy() == -1) and np.all(boxes[j, len(keep) :] == 0)
            total += len(stored)
            dropped += len(stored) - len(keep)
    assert total > 40 and 0 < dropped < total
    if crop != "warps":
        return
    # the drop=False boxes against the numpy rule, with the ops' own draws
    ops = kept_loader.pipelines["image"]
    checked = 0
    for _, all_boxes, _, index, _ in every:
        seeds = sample_seeds(5, 0, index)
        flips = flip_draws(seeds, ops[1].salt)
        shifts = ops[2].offsets(seeds)  # (dy, dx): out[r, c] = in[r + dy, c + dx]
        inverse = ops[3].params(seeds, 48, 64)
        for j, i in enumerate(index.tolist()):
            translate = np.array([[1, 0, -shifts[j, 1]], [0, 1, -shifts[j, 0]], [0, 0, 1]], np.float64)
            for k, box in enumerate(rows[i][1][:4]):
                expected = corner_rule(box, (0, 0, H, W), (48, 64), flips[j], [translate, np.linalg.inv(inverse[j])])
                np.testing.assert_allclose(all_boxes[j, k], expected, atol=1e-3)
                checked += 1
    assert checked == total


def test_follow_boxes_checks(tmp_path):
    rows = rectangles(4)
    dst = write_dataset(str(tmp_path / "f.beton"), FIELDS, rows, 4)
    base = {
        "image": [ResizeRGBImageDecoder((H, W))],
        "mask": None,
        "index": [IntDecoder()],
        "boxes": [RaggedArrayDecoder(max_length=3), TransformBoxes("image")],
    }
    with pytest.raises(ConfigurationError, match="1 rows per sample, but the boxes of pipeline 'boxes' have 3"):
        Loader(dst, 2, pipelines={**base, "labels": [RaggedArrayDecoder(max_length=1), FollowBoxes("boxes")]})
    with pytest.raises(ConfigurationError, match="has no TransformBoxes"):
        Loader(
            dst,
            2,
            pipelines={
                **base,
                "boxes": [RaggedArrayDecoder(max_length=3)],
                "labels": [RaggedArrayDecoder(max_length=3), FollowBoxes("boxes")],
            },
        )
    with pytest.raises(ConfigurationError, match="whose pipeline runs after it"):  # labels view before boxes view
        Loader(
            dst,
            2,
            pipelines={
                **base,
                "boxes": None,
                "l2": [RaggedArrayDecoder(max_length=3), FollowBoxes("b2")],
                "b2": [RaggedArrayDecoder(max_length=3), TransformBoxes("image")],
            },
            custom_field_mapper={"l2": "labels", "b2": "boxes"},
        )
    with pytest.raises(ConfigurationError, match="values -1..-1 do not fit uint8"):
        Loader(dst, 2, pipelines={**base, "labels": None, "mask": [MaskDecoder("image", fill=-1)]})
    # a sample whose labels are not one per box: named with its field
    bad = [(im, box, [1, 2] if i == 2 else lab, m, i) for im, box, lab, m, i in rows]
    dst = write_dataset(str(tmp_path / "g.beton"), FIELDS, bad, 4)
    loader = Loader(
        dst,
        4,
        num_workers=1,
        order=OrderOption.SEQUENTIAL,
        pipelines={**base, "labels": [RaggedArrayDecoder(max_length=3), FollowBoxes("boxes")]},
    )
    with pytest.raises(LoaderError, match="sample 2, field 'labels'.*2 rows, but its boxes") as e:
        next(iter(loader))
    assert e.value.sample == 2 and e.value.field == "labels"
