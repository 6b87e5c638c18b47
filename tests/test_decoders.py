"""Decoders (ffload.loaders.decoders.rgb, .basics) and crop geometry (ffload.loaders.decoders.crops).

Datasets are written with ffload.formats from real photos (scikit-image, scikit-learn); decoded
pixels are compared with OpenCV reference decodes of the same payloads.
"""

from __future__ import annotations

import math
import random

import cv2
import numpy as np
import pytest
from skimage import data
from sklearn.datasets import load_sample_images

from ffload.codecs.jpeg import scale_numerator
from ffload.formats import (
    BytesField,
    FloatField,
    IntField,
    JSONField,
    NDArrayField,
    RGBImageField,
    open_dataset,
    write_dataset,
)
from ffload.loaders.decoders.basics import BytesDecoder, FloatDecoder, IntDecoder, NDArrayDecoder
from ffload.loaders.decoders.crops import center_crop_boxes, random_resized_crop_boxes
from ffload.loaders.decoders.rgb import (
    CenterCropRGBImageDecoder,
    RandomResizedCropRGBImageDecoder,
    ResizeRGBImageDecoder,
    SimpleRGBImageDecoder,
)
from ffload.loaders.pipeline.operation import BatchContext
from ffload.loaders.rng import op_salt, sample_seeds


def _resize(image, long_side):
    h, w = image.shape[:2]
    r = long_side / max(h, w)
    return cv2.resize(image, (max(1, round(w * r)), max(1, round(h * r))), interpolation=cv2.INTER_AREA)


@pytest.fixture(scope="module")
def photos():
    """Seven RGB photos of assorted sizes (long side 60..512 pixels)."""
    china, flower = load_sample_images().images
    return [
        _resize(china, 160),
        _resize(flower, 120),
        data.astronaut(),
        _resize(data.chelsea(), 150),
        _resize(data.coffee(), 140),
        _resize(data.rocket(), 60),
        _resize(data.chelsea()[:, :120], 90),
    ]


@pytest.fixture(scope="module")
def tiles(photos):
    """Twelve 40 x 56 RGB tiles cut from the photos (fixed-size images)."""
    out = []
    for k in range(12):
        p = photos[k % 5]
        y, x = (7 * k) % (p.shape[0] - 40), (11 * k) % (p.shape[1] - 56)
        out.append(np.ascontiguousarray(p[y : y + 40, x : x + 56]))
    return out


def write(path, fields, rows):
    write_dataset(str(path), fields, rows, len(rows))
    return open_dataset(str(path))


def decode(op, view, name, indices, epoch=0, seed=0, region=None):
    """Run a decoder as the loader does: declare, allocate from buffer_spec, call on a batch. A ``region``
    given (a test's altered copy) is made read-only, as every memory manager's is, so that the compiled
    kernels see the loader's argument types and are not compiled again for a writable one."""
    if region is not None:
        region = region.view()
        region.flags.writeable = False
    spec = op.declare(None, view.fields[name], view)
    bspec = op.buffer_spec(spec, 16)
    buf = np.empty(bspec.shape, bspec.dtype)
    indices = np.asarray(indices, dtype=np.int64)
    ctx = BatchContext(
        indices,
        sample_seeds(seed, epoch, indices),
        view.open_region() if region is None else region,
        view.metadata[name],
        view.ptrs.get(name),
        view.sizes.get(name),
        epoch,
    )
    out = op(None, buf, ctx)
    assert out.shape == (len(indices),) + bspec.shape[1:]
    return np.array(out)


def payload(view, name, i):
    return np.array(view.payload(name, i))


def reference_resize(image, box, out_hw):
    """OpenCV crop + resize with the documented rule: INTER_AREA when no side grows, else
    INTER_LINEAR."""
    top, left, h, w = box
    oh, ow = out_hw
    interp = cv2.INTER_AREA if h >= oh and w >= ow else cv2.INTER_LINEAR
    return cv2.resize(image[top : top + h, left : left + w], (ow, oh), interpolation=interp)


def assert_resize_close(row, ref):
    """The compiled resize is OpenCV's up to one grey level (float vs fixed-point rounding)."""
    assert row.shape == ref.shape
    diff = np.abs(row.astype(int) - ref)
    assert diff.max() <= 1 and diff.mean() < 0.2


# ---------------------------------------------------------------- SimpleRGBImageDecoder


@pytest.mark.parametrize("suffix", [".beton", ".lmdb"])
def test_simple_raw_equals_source(tmp_path, tiles, suffix):
    view = write(tmp_path / f"d{suffix}", {"image": RGBImageField("raw")}, [(t,) for t in tiles])
    order = [5, 0, 11, 3, 3, 7]
    out = decode(SimpleRGBImageDecoder(), view, "image", order)
    assert out.dtype == np.uint8 and out.shape == (6, 40, 56, 3)
    for row, i in zip(out, order):
        assert np.array_equal(row, tiles[i])


def test_simple_decoder_keeps_whole_image_boxes_across_batch_lengths(tmp_path, tiles, photos):
    """One declared decoder over batches of growing and shrinking length (a job of several
    batches, an epoch's short last batch), then declared for images of another size: every batch
    is exact."""

    def run(op, view, orders):
        spec = op.declare(None, view.fields["image"], view)
        buf = np.empty(op.buffer_spec(spec, 16).shape, np.uint8)
        region, column = view.open_region(), view.metadata["image"]
        for order in orders:
            indices = np.asarray(order, dtype=np.int64)
            ctx = BatchContext(
                indices, sample_seeds(0, 0, indices), region, column, view.ptrs["image"], view.sizes["image"], 0
            )
            yield order, np.array(op(None, buf, ctx))

    view = write(tmp_path / "d.beton", {"image": RGBImageField("raw")}, [(t,) for t in tiles])
    op = SimpleRGBImageDecoder()
    for order, out in run(op, view, ([1, 2], [0, 5, 11, 3, 7], [4], [9, 8, 6])):
        assert out.shape == (len(order), 40, 56, 3)
        for row, i in zip(out, order):
            assert np.array_equal(row, tiles[i])
    small = [np.ascontiguousarray(p[:30, :20]) for p in photos[:3]]
    other = write(tmp_path / "o.beton", {"image": RGBImageField("raw")}, [(t,) for t in small])
    for order, out in run(op, other, ([2, 0, 1], [1])):
        assert out.shape == (len(order), 30, 20, 3)
        for row, i in zip(out, order):
            assert np.array_equal(row, small[i])


@pytest.mark.smoke
def test_simple_jpg_equals_opencv_decode(tmp_path, tiles):
    view = write(tmp_path / "d.beton", {"image": RGBImageField("jpg", jpeg_quality=90)}, [(t,) for t in tiles])
    order = [2, 9, 4]
    out = decode(SimpleRGBImageDecoder(), view, "image", order)
    for row, i in zip(out, order):
        assert np.array_equal(row, cv2.imdecode(payload(view, "image", i), cv2.IMREAD_COLOR_RGB))
        assert np.abs(row.astype(int) - tiles[i]).mean() < 8  # and it is the photo, JPEG-close


def test_simple_mixed_jpg_and_raw(tmp_path, tiles):
    view = write(
        tmp_path / "d.beton", {"image": RGBImageField("proportion", compress_probability=0.5)}, [(t,) for t in tiles]
    )
    modes = view.metadata["image"]["mode"]
    assert set(modes.tolist()) == {0, 1}
    order = list(range(12))[::-1]
    out = decode(SimpleRGBImageDecoder(), view, "image", order)
    for row, i in zip(out, order):
        ref = tiles[i] if modes[i] == 1 else cv2.imdecode(payload(view, "image", i), cv2.IMREAD_COLOR_RGB)
        assert np.array_equal(row, ref)


def test_simple_rejects_variable_sizes(tmp_path, photos):
    view = write(tmp_path / "d.beton", {"image": RGBImageField("raw")}, [(p,) for p in photos[:3]])
    with pytest.raises(TypeError, match="CenterCropRGBImageDecoder"):
        SimpleRGBImageDecoder().declare(None, view.fields["image"], view)


def _corrupt(view, name, index):
    region = np.array(view.open_region())
    p, n = int(view.ptrs[name][index]), int(view.sizes[name][index])
    region[p : p + n] = np.random.default_rng(0).integers(0, 256, n, dtype=np.uint8)
    return region


@pytest.mark.parametrize(
    "make", [SimpleRGBImageDecoder, lambda: CenterCropRGBImageDecoder(16), lambda: RandomResizedCropRGBImageDecoder(16)]
)
def test_corrupt_jpeg_names_the_sample(tmp_path, tiles, make):
    view = write(tmp_path / "d.beton", {"image": RGBImageField("jpg")}, [(t,) for t in tiles])
    region = _corrupt(view, "image", 7)
    assert decode(make(), view, "image", [1, 2], region=region).shape[0] == 2
    with pytest.raises(ValueError, match=r"'image', sample 7\b.*JPEG"):
        decode(make(), view, "image", [1, 7, 2], region=region)


def test_jpeg_of_another_size_names_the_sample(tmp_path, tiles):
    view = write(tmp_path / "d.beton", {"image": RGBImageField("jpg")}, [(t,) for t in tiles])
    region = np.array(view.open_region())
    small = cv2.imencode(".jpg", tiles[0][:20, :30])[1].reshape(-1)  # fits in sample 4's payload
    p = int(view.ptrs["image"][4])
    assert small.size <= int(view.sizes["image"][4])
    region[p : p + small.size] = small
    with pytest.raises(ValueError, match=r"sample 4: JPEG decodes to 30x20, metadata says 56x40"):
        decode(SimpleRGBImageDecoder(), view, "image", [0, 4], region=region)


# ---------------------------------------------------------------- field type checks


@pytest.mark.parametrize(
    "op, wrong",
    [
        (SimpleRGBImageDecoder(), "label"),
        (CenterCropRGBImageDecoder(8), "score"),
        (RandomResizedCropRGBImageDecoder(8), "blob"),
        (IntDecoder(), "image"),
        (FloatDecoder(), "label"),
        (NDArrayDecoder(), "blob"),
        (BytesDecoder(), "array"),
    ],
)
def test_wrong_field_type_names_the_field(tmp_path, tiles, op, wrong):
    fields = {
        "image": RGBImageField(),
        "label": IntField(),
        "score": FloatField(),
        "array": NDArrayField(np.float32, (2,)),
        "blob": BytesField(),
    }
    view = write(tmp_path / "d.beton", fields, [(tiles[0], 1, 0.5, np.zeros(2, np.float32), b"xy")])
    with pytest.raises(TypeError, match=f"field '{wrong}' is a {type(fields[wrong]).__name__}"):
        op.declare(None, view.fields[wrong], view)


# ---------------------------------------------------------------- CenterCropRGBImageDecoder


def center_box(h, w, ratio):
    side = int(ratio * min(h, w))
    return (h - side) // 2, (w - side) // 2, side, side


@pytest.mark.parametrize("out_hw", [(48, 48), (64, 40), (150, 150)])
def test_center_crop_raw_equals_reference(tmp_path, photos, out_hw):
    view = write(tmp_path / "d.beton", {"image": RGBImageField("raw")}, [(p,) for p in photos])
    order = [6, 2, 0, 5, 1, 3, 4]
    out = decode(CenterCropRGBImageDecoder(out_hw, ratio=0.8), view, "image", order)
    for row, i in zip(out, order):
        ref = reference_resize(photos[i], center_box(*photos[i].shape[:2], 0.8), out_hw)
        assert_resize_close(row, ref)


def test_center_crop_jpg_equals_full_decode_reference_when_enlarging(tmp_path, photos):
    view = write(tmp_path / "d.beton", {"image": RGBImageField("jpg")}, [(p,) for p in photos])
    order = [0, 3, 5, 6]
    out = decode(CenterCropRGBImageDecoder((110, 120)), view, "image", order)
    for row, i in zip(out, order):
        full = cv2.imdecode(payload(view, "image", i), cv2.IMREAD_COLOR_RGB)
        box = center_box(*full.shape[:2], 224 / 256)
        assert box[2] < 110  # no DCT scaling when enlarging: a full-scale decode of the box
        diff = np.abs(row.astype(int) - reference_resize(full, box, (110, 120)))
        # OpenCV's resize up to one level, but libjpeg-turbo upsamples the chroma of a cropped
        # decode with the crop's edge pixels (a few levels on the crop's border)
        assert diff.mean() < 0.3 and np.abs(diff[4:-4, 4:-4]).max() <= 1


@pytest.mark.parametrize("out", [112, 100, 48])
def test_center_crop_jpg_scaled_decoding_is_close_to_full_decode(tmp_path, photos, out):
    astronaut = photos[2]  # 512 x 512: centre box 448 >= 4 * out, decoded at half size
    view = write(tmp_path / "d.beton", {"image": RGBImageField("jpg", jpeg_quality=90)}, [(astronaut,)])
    row = decode(CenterCropRGBImageDecoder(out), view, "image", [0])[0]
    full = cv2.imdecode(payload(view, "image", 0), cv2.IMREAD_COLOR_RGB)
    box = center_box(512, 512, 224 / 256)
    ref = reference_resize(full, box, (out, out))
    diff = np.abs(row.astype(int) - ref)
    assert diff.mean() <= 2  # the rule: within 2 grey levels, mean absolute difference
    assert scale_numerator(448, 448, out, out) == 4 and not np.array_equal(row, ref)  # a half-size decode
    # a different image would be far: the tolerance is meaningful
    other = reference_resize(full[::-1], box, (out, out))
    assert np.abs(row.astype(int) - other).mean() > 20


# ---------------------------------------------------------------- ResizeRGBImageDecoder


@pytest.mark.parametrize("suffix", [".beton", ".lmdb"])
@pytest.mark.parametrize("out_hw", [(48, 64), (100, 37), (300, 200), (90, 600)])
def test_resize_raw_equals_cv2_resize(tmp_path, photos, suffix, out_hw):
    # (48, 64) and (100, 37) shrink both sides (INTER_AREA), (300, 200) and (90, 600) grow one (INTER_LINEAR)
    view = write(tmp_path / f"d{suffix}", {"image": RGBImageField("raw")}, [(p,) for p in photos])
    order = [6, 2, 0, 5, 1, 3, 4]
    out = decode(ResizeRGBImageDecoder(out_hw), view, "image", order)
    for row, i in zip(out, order):
        h, w = photos[i].shape[:2]
        assert_resize_close(row, reference_resize(photos[i], (0, 0, h, w), out_hw))  # the whole image, no aspect kept


@pytest.mark.parametrize("out_hw", [(64, 64), (150, 100), (400, 380)])
def test_resize_jpg_is_close_to_full_decode_and_cv2_resize(tmp_path, photos, out_hw):
    view = write(tmp_path / "d.beton", {"image": RGBImageField("jpg", jpeg_quality=90)}, [(p,) for p in photos])
    out = decode(ResizeRGBImageDecoder(out_hw), view, "image", range(len(photos)))
    for i, row in enumerate(out):
        full = cv2.imdecode(payload(view, "image", i), cv2.IMREAD_COLOR_RGB)
        ref = reference_resize(full, (0, 0) + full.shape[:2], out_hw)
        diff = np.abs(row.astype(int) - ref)
        assert diff.mean() <= 1.5, (i, diff.mean())  # half-size decodes when the image is >= 4x the output
        assert np.abs(row.astype(int) - ref[::-1]).mean() > 5 * max(diff.mean(), 1)  # the tolerance is meaningful


def test_resize_square_size_and_arguments(tmp_path, photos):
    view = write(tmp_path / "d.beton", {"image": RGBImageField("raw")}, [(p,) for p in photos])
    assert decode(ResizeRGBImageDecoder(32), view, "image", [0]).shape == (1, 32, 32, 3)
    with pytest.raises(ValueError, match="output_size must be positive"):
        ResizeRGBImageDecoder((0, 5))


# ---------------------------------------------------------------- crop geometry


def tv_get_params(rnd, height, width, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)):
    """torchvision.transforms.RandomResizedCrop.get_params, in pure Python."""
    area = height * width
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target_area = area * rnd.uniform(scale[0], scale[1])
        aspect_ratio = math.exp(rnd.uniform(log_ratio[0], log_ratio[1]))
        w = int(round(math.sqrt(target_area * aspect_ratio)))
        h = int(round(math.sqrt(target_area / aspect_ratio)))
        if 0 < w <= width and 0 < h <= height:
            i = rnd.randint(0, height - h)
            j = rnd.randint(0, width - w)
            return i, j, h, w
    in_ratio = float(width) / float(height)
    if in_ratio < min(ratio):
        w = width
        h = int(round(w / min(ratio)))
    elif in_ratio > max(ratio):
        h = height
        w = int(round(h * max(ratio)))
    else:
        w = width
        h = height
    return (height - h) // 2, (width - w) // 2, h, w


def ours(height, width, n, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3), seed=0):
    idx = np.arange(n, dtype=np.int64)
    boxes = np.empty((n, 4), dtype=np.int64)
    random_resized_crop_boxes(
        idx,
        np.full(n, height, np.uint16),
        np.full(n, width, np.uint16),
        sample_seeds(seed, 0, idx),
        op_salt("test"),
        scale[0],
        scale[1],
        ratio[0],
        ratio[1],
        boxes,
    )
    return boxes


def theirs(height, width, n, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)):
    rnd = random.Random(0)
    return np.array([tv_get_params(rnd, height, width, scale, ratio) for _ in range(n)])


@pytest.mark.parametrize(
    "height, width, scale, ratio",
    [
        (300, 400, (0.08, 1.0), (3 / 4, 4 / 3)),
        (120, 45, (0.08, 1.0), (3 / 4, 4 / 3)),
        (200, 200, (0.35, 1.0), (0.5, 2.0)),
    ],
)
def test_random_resized_crop_distribution_matches_torchvision(height, width, scale, ratio):
    n = 20000
    a, b = ours(height, width, n, scale, ratio), theirs(height, width, n, scale, ratio)
    for boxes in (a, b):
        assert boxes[:, 2].min() >= 1 and boxes[:, 3].min() >= 1
    stats = {
        "area": lambda x: x[:, 2] * x[:, 3] / (height * width),
        "log_aspect": lambda x: np.log(x[:, 3] / x[:, 2]),
        "top": lambda x: (x[:, 0] + 0.5) / (height - x[:, 2] + 1),
        "left": lambda x: (x[:, 1] + 0.5) / (width - x[:, 3] + 1),
    }
    for name, f in stats.items():
        qa, qb = np.quantile(f(a), [0.1, 0.25, 0.5, 0.75, 0.9]), np.quantile(f(b), [0.1, 0.25, 0.5, 0.75, 0.9])
        spread = np.quantile(f(b), 0.9) - np.quantile(f(b), 0.1) + 1e-9
        assert abs(f(a).mean() - f(b).mean()) < 0.03 * spread, name
        assert np.all(np.abs(qa - qb) < 0.05 * spread), name

    def full(x):
        return np.mean((x[:, 2] == height) | (x[:, 3] == width))  # fallback-like boxes

    assert abs(full(a) - full(b)) < 0.02


def test_random_resized_crop_fallback_is_torchvisions():
    # 20 x 400 never fits an area >= 8 % at aspect <= 4/3: the fallback box every time
    a = ours(20, 400, 50)
    assert np.all(a == np.array(tv_get_params(random.Random(0), 20, 400)))
    assert tuple(a[0]) == (0, (400 - 27) // 2, 20, 27)


def test_random_resized_crop_boxes_stay_inside_images():
    rng = np.random.default_rng(0)
    n = 5000
    heights = rng.integers(1, 700, n).astype(np.uint16)
    widths = rng.integers(1, 700, n).astype(np.uint16)
    idx = np.arange(n, dtype=np.int64)
    boxes = np.empty((n, 4), dtype=np.int64)
    random_resized_crop_boxes(
        idx, heights, widths, sample_seeds(1, 0, idx), op_salt("x"), 0.08, 1.0, 0.75, 4 / 3, boxes
    )
    top, left, h, w = boxes.T
    assert np.all((top >= 0) & (left >= 0) & (h >= 1) & (w >= 1))
    assert np.all((top + h <= heights) & (left + w <= widths))
    center = np.empty((n, 4), dtype=np.int64)
    center_crop_boxes(idx, heights, widths, 224 / 256, center)
    assert np.all(center[:, 2:] >= 1) and np.all(center[:, 0] + center[:, 2] <= heights)
    assert np.all(center[:, 1] + center[:, 3] <= widths)


# ---------------------------------------------------------------- RandomResizedCropRGBImageDecoder


@pytest.mark.smoke
def test_random_resized_crop_pixels_follow_the_boxes(tmp_path, photos):
    view = write(tmp_path / "d.beton", {"image": RGBImageField("raw")}, [(p,) for p in photos])
    op = RandomResizedCropRGBImageDecoder((40, 56))
    order = np.array([3, 6, 0, 2, 5], np.int64)
    out = decode(op, view, "image", order, epoch=4, seed=9)
    col = view.metadata["image"]
    boxes = np.empty((5, 4), np.int64)
    random_resized_crop_boxes(
        order, col["height"], col["width"], sample_seeds(9, 4, order), op.salt, 0.08, 1.0, 3 / 4, 4 / 3, boxes
    )
    for row, i, box in zip(out, order, boxes):
        assert_resize_close(row, reference_resize(photos[i], box, (40, 56)))


def test_random_resized_crop_is_deterministic_per_sample(tmp_path, photos):
    view = write(tmp_path / "d.beton", {"image": RGBImageField("jpg")}, [(p,) for p in photos])
    a = decode(RandomResizedCropRGBImageDecoder(32), view, "image", [3, 1, 4], epoch=2)
    b = decode(RandomResizedCropRGBImageDecoder(32), view, "image", [3, 1, 4], epoch=2)
    c = decode(RandomResizedCropRGBImageDecoder(32), view, "image", [4, 0, 3], epoch=2)
    d = decode(RandomResizedCropRGBImageDecoder(32), view, "image", [3, 1, 4], epoch=3)
    assert np.array_equal(a, b)
    assert np.array_equal(a[0], c[2]) and np.array_equal(a[2], c[0])  # batch composition is irrelevant
    assert not np.array_equal(a, d)


def test_crop_decoder_arguments_are_checked():
    with pytest.raises(ValueError):
        CenterCropRGBImageDecoder(0)
    with pytest.raises(ValueError):
        CenterCropRGBImageDecoder(32, ratio=1.5)
    with pytest.raises(ValueError):
        RandomResizedCropRGBImageDecoder(32, scale=(0.5, 0.1))
    with pytest.raises(ValueError):
        RandomResizedCropRGBImageDecoder(32, ratio=(0, 1))


# ---------------------------------------------------------------- scalar, array and bytes fields


def test_int_float_and_ndarray_decoders(tmp_path):
    rng = np.random.default_rng(3)
    n = 20
    labels = rng.integers(-(10**12), 10**12, n)
    scores = rng.normal(size=n)
    arrays = rng.normal(size=(n, 3, 4)).astype(np.float32)
    small = rng.integers(-300, 300, (n, 2)).astype(np.int16)
    view = write(
        tmp_path / "d.beton",
        {
            "label": IntField(),
            "score": FloatField(),
            "array": NDArrayField(np.float32, (3, 4)),
            "small": NDArrayField(np.int16, (2,)),
        },
        [(labels[i], scores[i], arrays[i], small[i]) for i in range(n)],
    )
    order = np.array([19, 0, 7, 7, 3])
    got = decode(IntDecoder(), view, "label", order)
    assert got.dtype == np.int64 and np.array_equal(got, labels[order])
    got = decode(FloatDecoder(), view, "score", order)
    assert got.dtype == np.float64 and np.array_equal(got, scores[order])
    got = decode(NDArrayDecoder(), view, "array", order)
    assert got.dtype == np.float32 and np.array_equal(got, arrays[order])
    got = decode(NDArrayDecoder(), view, "small", order)
    assert got.dtype == np.int16 and np.array_equal(got, small[order])


def test_bytes_and_json_decoders_zero_pad(tmp_path):
    blobs = [b"\x05", b"hello", bytes(range(256)) * 3, b"\x00\x01"]
    docs = [{"a": 1}, ["x", 2.5], "text", {"nested": {"k": [1, 2, 3]}}]
    view = write(
        tmp_path / "d.beton", {"blob": BytesField(), "doc": JSONField()}, [(b, d) for b, d in zip(blobs, docs)]
    )
    order = [2, 0, 3, 1]
    got = decode(BytesDecoder(), view, "blob", order)
    assert got.shape == (4, 768) and got.dtype == np.uint8
    for row, i in zip(got, order):
        assert row[: len(blobs[i])].tobytes() == blobs[i] and not row[len(blobs[i]) :].any()
    # rows are reused between batches: padding must be rewritten, not left over
    op = BytesDecoder()
    spec = op.declare(None, view.fields["blob"], view)
    buf = np.full(op.buffer_spec(spec, 4).shape, 7, np.uint8)
    idx = np.array([1, 3])
    ctx = BatchContext(
        idx,
        sample_seeds(0, 0, idx),
        view.open_region(),
        view.metadata["blob"],
        view.ptrs["blob"],
        view.sizes["blob"],
        0,
    )
    out = op(None, buf, ctx)
    assert out[0, :5].tobytes() == b"hello" and not out[0, 5:].any() and not out[1, 2:].any()
    got = decode(BytesDecoder(), view, "doc", order)
    assert JSONField.unpack(got) == [docs[i] for i in order]


def test_decoders_work_with_an_in_memory_region(tmp_path, tiles):
    # the process cache hands a plain ndarray instead of a memory map
    view = write(tmp_path / "d.beton", {"image": RGBImageField("raw")}, [(t,) for t in tiles])
    region = np.array(view.open_region())
    out = decode(SimpleRGBImageDecoder(), view, "image", [4, 8], region=region)
    assert np.array_equal(out[0], tiles[4]) and np.array_equal(out[1], tiles[8])
    with pytest.raises(ValueError, match="sample 8: payload lies outside"):
        decode(SimpleRGBImageDecoder(), view, "image", [4, 8], region=region[: int(view.ptrs["image"][8]) + 10])
