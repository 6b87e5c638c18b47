"""Ragged arrays and N-channel / 16-bit images: round trips through .beton and LMDB, Loader
batches, ffcv reading the file, and corrupt sizes refused at open."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from isolated import run_isolated

from ffload.formats import (
    BytesField,
    DatasetError,
    FieldError,
    ImageArrayField,
    IntField,
    RaggedArrayField,
    RGBImageField,
    open_dataset,
    write_dataset,
)
from ffload.formats.beton import FIELD_DESC_TYPE, HEADER_TYPE
from ffload.formats.fields.base import ARG_SIZE
from ffload.loaders import (
    CenterCropImageArrayDecoder,
    ImageArrayDecoder,
    IntDecoder,
    Loader,
    LoaderError,
    OrderOption,
    RaggedArrayDecoder,
    RaggedLengthDecoder,
    RandomCropImageArrayDecoder,
    RandomHorizontalFlip,
)

N = 9


def ragged_samples():
    """Boxes (K, 4) float32 with K = 0..3, multi-label int16 lists, keypoints (K, 5, 3) uint8,
    a 16-bit depth map, a grayscale (H, W) uint8 image and a 5-channel float32 image (sizes vary)."""
    rng = np.random.default_rng(7)
    fields = {
        "boxes": RaggedArrayField("float32", (4,)),
        "labels": RaggedArrayField("int16"),
        "points": RaggedArrayField(np.uint8, (5, 3)),
        "depth": ImageArrayField("uint16", 1),
        "gray": ImageArrayField("uint8", 1),
        "spectral": ImageArrayField("float32", 5),
        "label": IntField(),
    }
    samples = []
    for i in range(N):
        samples.append(
            (
                rng.random((i % 4, 4), dtype=np.float32),
                list(range(i % 5)),
                rng.integers(0, 255, (i % 3, 5, 3), dtype=np.uint8),
                rng.integers(0, 65535, (6 + i, 4 + i % 2, 1), dtype=np.uint16),
                rng.integers(0, 255, (8, 5 + i), dtype=np.uint8),
                rng.standard_normal((3, 2 + i, 5)).astype(np.float32),
                i,
            )
        )
    return fields, samples


def as_array(view, name, index):
    """Rebuild a stored value from its payload bytes, as docs/fields.md tells a reader without
    ffload (ffcv's BytesDecoder gives the same bytes)."""
    field, payload = view.fields[name], np.asarray(view.payload(name, index)).tobytes()
    args = json.loads(field.to_binary().tobytes().rstrip(b"\0").removeprefix(b"ffload-field:"))
    if args["kind"] == "ragged":
        return np.frombuffer(payload, args["dtype"]).reshape([-1] + args["inner_shape"])
    h, w = np.frombuffer(payload[:8], "<u4")
    return np.frombuffer(payload[8:], args["dtype"]).reshape(h, w, args["channels"])


def expected(samples, k, field):
    value = np.asarray(samples[k], dtype=field.dtype) if isinstance(field, RaggedArrayField) else samples[k]
    if isinstance(field, RaggedArrayField) and value.size == 0:
        return value.reshape((0,) + field.inner_shape)
    return value.reshape(value.shape[:2] + (-1,)) if isinstance(field, ImageArrayField) else value


@pytest.mark.parametrize("suffix", [".beton", ".lmdb"])
def test_round_trip(tmp_path, suffix):
    fields, samples = ragged_samples()
    dst = write_dataset(str(tmp_path / f"r{suffix}"), fields, samples, N)
    view = open_dataset(dst)
    assert view.fields == fields and list(view.fields) == list(fields)
    for i, sample in enumerate(samples):
        for k, (name, field) in enumerate(fields.items()):
            if field.has_payload:
                np.testing.assert_array_equal(as_array(view, name, i), expected(sample, k, field))
    np.testing.assert_array_equal(fields["boxes"].lengths(view.sizes["boxes"]), np.arange(N) % 4)
    for name in ("boxes", "points", "depth", "spectral"):  # the field's own reading agrees
        np.testing.assert_array_equal(view.fields[name].to_array(view.payload(name, 5)), as_array(view, name, 5))
    with pytest.raises(FieldError, match="header says 4x3x5 float32, payload is 244 bytes"):
        view.fields["spectral"].to_array(view.payload("spectral", 2)[:-4])


@pytest.mark.parametrize("suffix", [".beton", ".lmdb"])
def test_loader_batches_equal_stored_arrays(tmp_path, suffix):
    fields, samples = ragged_samples()
    one_size = [(s[0], s[1], s[3][:6, :4], s[5][:, :2], s[6]) for s in samples]
    dst = write_dataset(
        str(tmp_path / f"r{suffix}"),
        {k: fields[k] for k in ("boxes", "labels", "depth", "spectral", "label")},
        one_size,
        N,
    )
    loader = Loader(
        dst,
        batch_size=4,
        num_workers=1,
        order=OrderOption.RANDOM,
        seed=3,
        drop_last=False,
        pipelines={
            "boxes": [RaggedArrayDecoder()],
            "labels": [RaggedArrayDecoder(max_length=2, fill=-1)],
            "depth": [ImageArrayDecoder()],
            "spectral": [ImageArrayDecoder()],
            "label": [IntDecoder()],
            "num_boxes": [RaggedLengthDecoder()],
            "num_labels": [RaggedLengthDecoder(2)],
        },
        custom_field_mapper={"num_boxes": "boxes", "num_labels": "labels"},
    )
    seen = []
    for boxes, labels, depth, spectral, indices, num_boxes, num_labels in loader:
        assert boxes.shape[1:] == (3, 4) and boxes.dtype == np.float32  # K_max: the dataset's longest
        assert labels.shape[1:] == (2,) and labels.dtype == np.int16  # max_length
        assert depth.shape[1:] == (6, 4, 1) and depth.dtype == np.uint16
        assert spectral.shape[1:] == (3, 2, 5) and spectral.dtype == np.float32
        for j, i in enumerate(indices.tolist()):
            k = i % 4
            assert num_boxes[j] == k and num_labels[j] == min(i % 5, 2)
            np.testing.assert_array_equal(boxes[j, :k], samples[i][0])
            assert not np.any(boxes[j, k:])  # padded with the default fill 0
            kept = list(range(min(i % 5, 2)))  # the first max_length rows are kept
            assert labels[j].tolist() == kept + [-1] * (2 - len(kept))
            np.testing.assert_array_equal(depth[j], one_size[i][2])
            np.testing.assert_array_equal(spectral[j], one_size[i][3])
        seen += list(indices)
    assert sorted(seen) == list(range(N))


def test_default_pipelines_and_size_checks(tmp_path):
    fields, samples = ragged_samples()
    dst = write_dataset(str(tmp_path / "r.beton"), fields, samples, N)
    loader = Loader(
        dst,
        batch_size=N,
        num_workers=1,
        order=OrderOption.SEQUENTIAL,
        pipelines={"depth": None, "gray": None, "spectral": None},
    )
    boxes, labels, points, label = next(iter(loader))
    assert tuple(boxes.shape) == (N, 3, 4) and tuple(labels.shape) == (N, 4) and tuple(points.shape) == (N, 2, 5, 3)
    np.testing.assert_array_equal(points[4, :1].numpy(), samples[4][2])
    with pytest.raises(TypeError, match="one size; field 'gray': sample 1"):
        Loader(dst, batch_size=2, pipelines={"depth": None, "gray": [ImageArrayDecoder()], "spectral": None})
    with pytest.raises(ValueError, match="max_length must be >= 0"):
        RaggedArrayDecoder(max_length=-1)
    with pytest.raises(ValueError, match="fill 300: values 300..300 do not fit uint8"):
        Loader(
            dst,
            batch_size=2,
            pipelines={"points": [RaggedArrayDecoder(fill=300)], "depth": None, "gray": None, "spectral": None},
        )


def test_ffcv_reads_the_other_fields_and_ours_as_bytes(tmp_path):
    pytest.importorskip("ffcv", reason="ffcv 1.0.2 (extra 'ffcv') is not installed")
    run_isolated(
        "test_ragged_fields", "ffcv_reads_the_other_fields_and_ours_as_bytes", str(tmp_path)
    )  # ffcv corrupts numba's types: tests/isolated.py


def ffcv_reads_the_other_fields_and_ours_as_bytes(tmp: str):
    """The body of :func:`test_ffcv_reads_the_other_fields_and_ours_as_bytes`, run in a fresh process."""
    tmp_path = Path(tmp)
    from ffcv.fields.basics import IntDecoder as FfcvIntDecoder
    from ffcv.fields.bytes import BytesDecoder
    from ffcv.fields.rgb_image import SimpleRGBImageDecoder
    from ffcv.loader import Loader as FfcvLoader
    from ffcv.loader import OrderOption as FfcvOrder

    fields, samples = ragged_samples()
    rgb = np.random.default_rng(0).integers(0, 255, (N, 12, 10, 3), dtype=np.uint8)
    dst = write_dataset(
        str(tmp_path / "mixed.beton"),
        {"image": RGBImageField("raw"), **fields},
        [(rgb[i],) + s for i, s in enumerate(samples)],
        N,
    )
    view = open_dataset(dst)
    # samples 0, 4 and 8 hold no boxes: those empty allocations must not hide the next payload
    # from ffcv's reader, which looks sizes up by offset
    assert len(set(view.ptrs["boxes"].tolist()) & set(view.ptrs["labels"].tolist())) == 0
    ours = [n for n, f in fields.items() if f.has_payload]
    loader = FfcvLoader(
        dst,
        batch_size=4,
        num_workers=1,
        order=FfcvOrder.SEQUENTIAL,
        drop_last=False,
        pipelines={
            "image": [SimpleRGBImageDecoder()],
            "label": [FfcvIntDecoder()],
            **{n: [BytesDecoder()] for n in ours},
        },
    )
    seen = 0
    for image, *payloads, label in loader:
        for j in range(len(label)):
            i = seen + j
            np.testing.assert_array_equal(np.asarray(image[j]), rgb[i])
            assert int(label[j][0]) == i
            for name, rows in zip(ours, payloads):
                stored = np.asarray(view.payload(name, i))
                np.testing.assert_array_equal(np.asarray(rows[j][: stored.size]), stored)
        seen += len(label)
    assert seen == N
    assert view.fields == {"image": RGBImageField("raw"), **fields}  # ffload reads them as typed fields


def _patch_beton_arguments(path, position, field):
    """Overwrite the argument block of the field at ``position`` with ``field``'s."""
    offset = HEADER_TYPE.itemsize + position * FIELD_DESC_TYPE.itemsize + FIELD_DESC_TYPE.fields["arguments"][1]
    with open(path, "r+b") as fp:
        fp.seek(offset)
        fp.write(field.to_binary().tobytes())


def _patch_lmdb_field(path, position, field):
    import lmdb

    env = lmdb.open(path, subdir=True)
    with env.begin(write=True) as txn:
        meta = json.loads(txn.get(b"__ffload__"))
        meta["fields"][position].update(type=type(field).__name__, arguments=field.arguments())
        txn.put(b"__ffload__", json.dumps(meta).encode())
    env.close()


@pytest.mark.parametrize("suffix", [".beton", ".lmdb"])
@pytest.mark.parametrize(
    "field, sizes, message",
    [
        (
            RaggedArrayField("float32", (4,)),
            [16, 32, 7, 0],
            "field 'x': sample 2: payload of 7 bytes is not a whole number of 16-byte rows",
        ),
        (
            ImageArrayField("uint16", 3),
            [14, 8 + 6 * 5, 8 + 6 * 5, 8],
            "field 'x': sample 3: payload of 8 bytes is not the 8-byte header plus a positive number of 6-byte pixels",
        ),
    ],
)
def test_corrupt_sizes_refused_at_open(tmp_path, suffix, field, sizes, message):
    # payloads of the given sizes written as plain bytes, then described as `field`
    dst = str(tmp_path / f"bad{suffix}")
    write_dataset(dst, {"y": IntField(), "x": BytesField()}, [(i, bytes(n)) for i, n in enumerate(sizes)], len(sizes))
    (_patch_beton_arguments if suffix == ".beton" else _patch_lmdb_field)(dst, 1, field)
    with pytest.raises(DatasetError, match=message):
        open_dataset(dst)


def test_corrupt_image_header_named_at_decode(tmp_path):
    images = [np.full((4, 3), i, np.uint8) for i in range(5)]
    dst = write_dataset(str(tmp_path / "g.beton"), {"gray": ImageArrayField()}, [(im,) for im in images], 5)
    ptr = int(open_dataset(dst).ptrs["gray"][3])
    with open(dst, "r+b") as fp:  # sample 3 says 3x4 instead of 4x3: same byte count
        fp.seek(ptr)
        fp.write(np.array([3, 4], "<u4").tobytes())
    with pytest.raises(LoaderError, match="field 'gray', sample 3: not a 3x4 image"):
        list(Loader(dst, batch_size=5, num_workers=1))


def test_verify_names_bad_headers_and_export_writes_npy(tmp_path):
    import io
    import tarfile

    from ffload.convert.export import export_webdataset
    from ffload.verify import verify_dataset

    fields, samples = ragged_samples()
    dst = write_dataset(str(tmp_path / "r.beton"), fields, samples, N)
    view = open_dataset(dst)
    assert verify_dataset(view, num_workers=2) == []
    shards = export_webdataset(view, str(tmp_path / "out" / "s-%02d.tar"))
    with tarfile.open(shards[0]) as tar:
        for name in ("boxes", "labels", "depth", "gray"):
            member = tar.extractfile(f"00000003.{name}.npy").read()
            got = np.load(io.BytesIO(member), allow_pickle=False)
            np.testing.assert_array_equal(got, expected(samples[3], list(fields).index(name), fields[name]))
    with open(dst, "r+b") as fp:  # sample 5's depth map (11x5) now says 10x5
        fp.seek(int(view.ptrs["depth"][5]))
        fp.write(np.array([10, 5], "<u4").tobytes())
    assert verify_dataset(open_dataset(dst)) == [(5, "depth", "header says 5x10x1 uint16, payload is 118 bytes")]


@pytest.mark.parametrize("suffix", [".beton", ".lmdb"])
def test_crop_decoders_for_several_sizes(tmp_path, suffix):
    fields, samples = ragged_samples()  # depth maps (6 + i, 4 + i % 2, 1) uint16, spectral (3, 2 + i, 5)
    dst = write_dataset(str(tmp_path / f"r{suffix}"), fields, samples, N)
    off = {"depth": None, "gray": None, "spectral": None, "boxes": None, "labels": None, "points": None}

    def batch(pipelines, seed=0):
        loader = Loader(
            dst, batch_size=N, num_workers=1, order=OrderOption.SEQUENTIAL, seed=seed, pipelines=off | pipelines
        )
        return [np.asarray(x) for x in next(iter(loader))]

    centre, random, label = batch(
        {"depth": [CenterCropImageArrayDecoder((5, 3))], "spectral": [RandomCropImageArrayDecoder((3, 2))]}
    )
    assert centre.dtype == np.uint16 and centre.shape == (N, 5, 3, 1) and random.shape == (N, 3, 2, 5)
    positions = set()
    for i in range(N):
        depth = samples[i][3]
        top, left = round((depth.shape[0] - 5) / 2), round((depth.shape[1] - 3) / 2)  # torchvision's rule
        np.testing.assert_array_equal(centre[i], depth[top : top + 5, left : left + 3])
        spectral = samples[i][5]
        found = [x for x in range(spectral.shape[1] - 1) if np.array_equal(spectral[:, x : x + 2], random[i])]
        assert len(found) == 1  # a window of the stored image
        positions.add(found[0])
    assert len(positions) > 2  # not always the same place
    np.testing.assert_array_equal(batch({"spectral": [RandomCropImageArrayDecoder((3, 2))]})[0], random)  # seeded
    assert not np.array_equal(batch({"spectral": [RandomCropImageArrayDecoder((3, 2))]}, seed=1)[0], random)
    flipped = batch({"depth": [CenterCropImageArrayDecoder((5, 3)), RandomHorizontalFlip(1.0)]})[0]
    np.testing.assert_array_equal(flipped, centre[:, :, ::-1])  # NHWC transforms take any C and dtype
    with pytest.raises(LoaderError, match=r"field 'depth', sample 0: the 4x6 image is smaller than the 5x7 crop"):
        batch({"depth": [CenterCropImageArrayDecoder((7, 5))]})


def test_bad_values_and_arguments():
    boxes = RaggedArrayField("float32", (4,))
    with pytest.raises(FieldError, match=r"shape \(K,\) \+ \(4,\), got \(2, 3\)"):
        boxes.encode(np.zeros((2, 3)), 0)
    assert boxes.encode([], 0)[1].size == 0 and boxes.encode(np.zeros((0, 4)), 0)[1].size == 0
    with pytest.raises(FieldError, match="values 0..300 do not fit uint8"):
        RaggedArrayField("uint8").encode([0, 300], 0)
    with pytest.raises(FieldError, match="expects dtype int16, got float64"):
        RaggedArrayField("int16").encode([0.5], 0)
    with pytest.raises(FieldError, match="expects uint8 pixels"):
        ImageArrayField("uint8").encode(np.zeros((2, 2), np.uint16), 0)
    with pytest.raises(FieldError, match=r"expects \(H, W, 3\)"):
        ImageArrayField("uint16", 3).encode(np.zeros((2, 2), np.uint16), 0)
    assert ImageArrayField("uint16", 1).encode(np.zeros((2, 2), np.uint8), 0)[1].size == 8 + 8  # safe cast
    with pytest.raises(ValueError, match="stores uint8, uint16 or float32"):
        ImageArrayField("uint32")
    with pytest.raises(ValueError, match="inner_shape must have"):
        RaggedArrayField("float32", (0,))
    with pytest.raises(ValueError, match="plain numeric dtypes"):
        RaggedArrayField(object)


def test_argument_block_and_unknown_kinds():
    field = RaggedArrayField(">f4", (17, 3))  # stored little-endian whatever the given order
    block = field.to_binary()
    assert block.size == ARG_SIZE and bytes(block).startswith(b'ffload-field:{"kind":"ragged","dtype":"<f4"')
    assert BytesField.from_binary(block) == field
    unknown = np.zeros(ARG_SIZE, np.uint8)
    text = b'ffload-field:{"kind":"mesh","faces":3}'
    unknown[: len(text)] = np.frombuffer(text, np.uint8)
    assert type(BytesField.from_binary(unknown)) is BytesField  # a newer ffload's kind: plain bytes
    bad = ImageArrayField("uint8", 2).to_binary()
    bad[bytes(bad).index(b"2}")] = ord("0")  # channels 0
    with pytest.raises(FieldError, match="invalid ImageArrayField arguments"):
        BytesField.from_binary(bad)
