"""ImageArrayField(compression="png"): lossless round trips (uint8 / uint16, 1, 3, 4 channels),
loader batches identical to the raw field's, corrupt PNGs named by sample and field (loader and
`ffload verify`), the argument block, and ffcv reading the other fields."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from isolated import run_isolated
from PIL import Image

from ffload.errors import ConfigurationError
from ffload.formats import (
    BytesField,
    DatasetError,
    ImageArrayField,
    IntField,
    RaggedArrayField,
    RGBImageField,
    open_dataset,
    write_dataset,
)
from ffload.loaders import (
    CenterCropImageArrayDecoder,
    FollowBoxes,
    ImageArrayDecoder,
    IntDecoder,
    Loader,
    LoaderError,
    MaskDecoder,
    OrderOption,
    RaggedArrayDecoder,
    RandomAffine,
    RandomCropImageArrayDecoder,
    RandomHorizontalFlip,
    RandomResizedCropRGBImageDecoder,
    RandomTranslate,
    RandomVerticalFlip,
    TransformBoxes,
)

N = 8
KINDS = [("uint8", 1), ("uint16", 1), ("uint8", 3), ("uint16", 4)]


def arrays(dtype, channels, n=N, seed=0, size=None):
    """Random full-range pixels, ``(H, W, C)`` of sizes varying per sample (or all ``size``)."""
    rng = np.random.default_rng(seed)
    top = np.iinfo(dtype).max
    return [
        rng.integers(0, top, (size or (9 + i, 13 + 2 * i)) + (channels,), dtype=dtype, endpoint=True) for i in range(n)
    ]


@pytest.mark.parametrize("suffix", [".beton", ".lmdb"])
def test_round_trip_is_bit_exact(tmp_path, suffix):
    fields = {f"{d}x{c}": ImageArrayField(d, c, compression="png") for d, c in KINDS}
    values = [arrays(d, c, seed=k) for k, (d, c) in enumerate(KINDS)]
    dst = write_dataset(str(tmp_path / f"p{suffix}"), fields, list(zip(*values)), N)
    view = open_dataset(dst)
    assert view.fields == fields and all(f.compression == "png" for f in view.fields.values())
    for (name, field), stored in zip(fields.items(), values):
        for i in range(N):
            payload = np.asarray(view.payload(name, i)).tobytes()
            assert payload.startswith(b"\x89PNG\r\n\x1a\n")  # the payload is a PNG file
            np.testing.assert_array_equal(field.to_array(payload), stored[i])
            if field.channels != 1 and field.dtype == np.uint8:  # another reader sees RGB, not BGR
                np.testing.assert_array_equal(np.asarray(Image.open(io.BytesIO(payload))), stored[i])
    # one image size: ImageArrayDecoder's batches are the stored arrays, decoded in the loader
    same = [arrays("uint16", 1, n=5, seed=9, size=(7, 11))]
    one = write_dataset(
        str(tmp_path / f"s{suffix}"), {"d": ImageArrayField("uint16", 1, compression="png")}, list(zip(*same)), 5
    )
    (batch,) = Loader(
        one, batch_size=5, num_workers=1, order=OrderOption.SEQUENTIAL, pipelines={"d": [ImageArrayDecoder()]}
    )
    np.testing.assert_array_equal(batch[0], np.stack(same[0]))


def test_png_is_refused_for_float_and_two_channels():
    with pytest.raises(ConfigurationError, match="stores uint8 or uint16 pixels of 1, 3 or 4 channels"):
        ImageArrayField("float32", 1, compression="png")
    with pytest.raises(ConfigurationError, match="got 2 x uint8"):
        ImageArrayField("uint8", 2, compression="png")
    with pytest.raises(ConfigurationError, match="compression must be one of"):
        ImageArrayField("uint8", 1, compression="jpeg")


def test_argument_blocks():
    raw, png = ImageArrayField("uint16", 1), ImageArrayField("uint16", 1, compression="png")
    # a raw field's block is the one written before PNG existed: datasets of either read alike
    assert bytes(raw.to_binary()).rstrip(b"\0") == b'ffload-field:{"kind":"image","dtype":"<u2","channels":1}'
    assert (
        bytes(png.to_binary()).rstrip(b"\0")
        == b'ffload-field:{"kind":"image","dtype":"<u2","channels":1,"compression":"png"}'
    )
    assert BytesField.from_binary(raw.to_binary()) == raw and BytesField.from_binary(png.to_binary()) == png
    assert raw != png


def mask_rows(n=12, seed=3):
    """Images of several sizes with label maps (uint8 classes, uint16 instance ids) and boxes."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        h, w = int(rng.integers(40, 90)), int(rng.integers(40, 100))
        image = rng.integers(0, 255, (h, w, 3), dtype=np.uint8)
        classes = rng.integers(0, 21, (h, w, 1), dtype=np.uint8)
        instances = rng.integers(0, 65535, (h, w, 1), dtype=np.uint16, endpoint=True)
        k = int(rng.integers(0, 4))
        xy = rng.uniform(0, [w - 5, h - 5], (k, 2))
        boxes = np.concatenate([xy, xy + rng.uniform(2, 30, (k, 2))], 1).astype(np.float32)
        rows.append((image, classes, instances, boxes, np.arange(k) + 10 * i, i))
    return rows


def mask_fields(compression):
    return {
        "image": RGBImageField("raw"),
        "classes": ImageArrayField("uint8", 1, compression=compression),
        "instances": ImageArrayField("uint16", 1, compression=compression),
        "boxes": RaggedArrayField("float32", (4,)),
        "labels": RaggedArrayField("int64"),
        "index": IntField(),
    }


@pytest.mark.parametrize("suffix", [".beton", ".lmdb"])
def test_png_masks_load_exactly_as_raw_masks(tmp_path, suffix):
    rows = mask_rows()
    raw = write_dataset(str(tmp_path / f"raw{suffix}"), mask_fields("raw"), rows, len(rows))
    png = write_dataset(str(tmp_path / f"png{suffix}"), mask_fields("png"), rows, len(rows))
    assert open_dataset(png).sizes["classes"].sum() < open_dataset(raw).sizes["classes"].sum()  # compressed
    pipelines = {
        "image": [
            RandomResizedCropRGBImageDecoder((32, 40)),
            RandomHorizontalFlip(),
            RandomVerticalFlip(),
            RandomTranslate(5),
            RandomAffine(15),
        ],
        "classes": [MaskDecoder("image", fill=255)],
        "instances": [MaskDecoder("image")],
        "boxes": [RaggedArrayDecoder(), TransformBoxes("image")],
        "labels": [RaggedArrayDecoder(fill=-1), FollowBoxes("boxes", -1)],
        "index": [IntDecoder()],
    }
    runs = []
    for dst in (raw, png):
        loader = Loader(dst, batch_size=5, num_workers=2, order=OrderOption.RANDOM, seed=7, pipelines=pipelines)
        runs.append([[np.array(x) for x in batch] for epoch in range(2) for batch in loader])
    assert len(runs[0]) == len(runs[1]) == 6
    for a, b in zip(*runs):
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)
    assert any(np.any(b[2] > 255) for b in runs[1])  # 16-bit ids kept
    # the ImageArrayField crop decoders read PNG fields too
    for decoder in (CenterCropImageArrayDecoder(36), RandomCropImageArrayDecoder(36)):
        got = [
            [np.array(x) for x in batch]
            for dst in (raw, png)
            for batch in Loader(
                dst,
                batch_size=6,
                num_workers=1,
                order=OrderOption.SEQUENTIAL,
                seed=2,
                pipelines={
                    "image": None,
                    "boxes": None,
                    "labels": None,
                    "index": None,
                    "instances": None,
                    "classes": [decoder, RandomHorizontalFlip()],
                },
            )
        ]
        for x, y in zip(got[:2], got[2:]):
            np.testing.assert_array_equal(x[0], y[0])


def _corrupt_png(tmp_path, suffix=".beton"):
    rows = mask_rows(6)
    dst = write_dataset(str(tmp_path / f"c{suffix}"), mask_fields("png"), rows, 6)
    view = open_dataset(dst)
    ptr, size = int(view.ptrs["instances"][4]), int(view.sizes["instances"][4])
    with open(dst, "r+b") as fp:  # a byte inside the compressed data of sample 4: zlib's check fails
        fp.seek(ptr + size // 2)
        byte = fp.read(1)
        fp.seek(ptr + size // 2)
        fp.write(bytes([byte[0] ^ 0xFF]))
    return dst


def test_corrupt_png_names_the_sample_and_field(tmp_path):
    dst = _corrupt_png(tmp_path)
    loader = Loader(
        dst,
        batch_size=6,
        num_workers=1,
        order=OrderOption.SEQUENTIAL,
        pipelines={
            "image": [RandomResizedCropRGBImageDecoder(24)],
            "classes": [MaskDecoder("image")],
            "instances": [MaskDecoder("image")],
            "boxes": None,
            "labels": None,
            "index": [IntDecoder()],
        },
    )
    with pytest.raises(LoaderError, match="sample 4, field 'instances'.*corrupt PNG") as e:
        next(iter(loader))
    assert e.value.sample == 4 and e.value.field == "instances"
    from ffload.verify import verify_dataset

    problems = verify_dataset(open_dataset(dst), num_workers=1)
    assert [(i, name) for i, name, _ in problems] == [(4, "instances")] and "corrupt PNG" in problems[0][2]


def test_cli_verify_decodes_png_fields(tmp_path):
    from click.testing import CliRunner

    from ffload.cli import main

    good = write_dataset(str(tmp_path / "g.beton"), mask_fields("png"), mask_rows(4), 4)
    assert CliRunner().invoke(main, ["verify", good, "--quiet"]).exit_code == 0
    result = CliRunner().invoke(main, ["verify", _corrupt_png(tmp_path), "--quiet"])
    assert result.exit_code != 0 and "instances" in result.output and "corrupt PNG" in result.output


def test_short_png_payload_refused_at_open(tmp_path):
    from test_ragged_fields import _patch_beton_arguments

    dst = str(tmp_path / "short.beton")
    write_dataset(dst, {"y": IntField(), "x": BytesField()}, [(0, bytes(60)), (1, bytes(20))], 2)
    _patch_beton_arguments(dst, 1, ImageArrayField("uint8", 1, compression="png"))
    with pytest.raises(DatasetError, match="sample 1: payload of 20 bytes is shorter than the smallest PNG"):
        open_dataset(dst)


def test_ffcv_reads_the_other_fields_and_png_as_bytes(tmp_path):
    run_isolated("test_png_fields", "ffcv_reads_png_fields_as_bytes", str(tmp_path))  # ffcv corrupts numba's types


def ffcv_reads_png_fields_as_bytes(tmp: str):
    """The body of :func:`test_ffcv_reads_the_other_fields_and_png_as_bytes`, run in a fresh process."""
    from ffcv.fields.basics import IntDecoder as FfcvIntDecoder
    from ffcv.fields.bytes import BytesDecoder
    from ffcv.fields.rgb_image import SimpleRGBImageDecoder
    from ffcv.loader import Loader as FfcvLoader
    from ffcv.loader import OrderOption as FfcvOrder

    images = np.random.default_rng(1).integers(0, 255, (N, 12, 10, 3), dtype=np.uint8)
    masks = arrays("uint16", 1, seed=4)
    fields = {
        "image": RGBImageField("raw"),
        "mask": ImageArrayField("uint16", 1, compression="png"),
        "label": IntField(),
    }
    dst = write_dataset(str(Path(tmp) / "mixed.beton"), fields, [(images[i], masks[i], i) for i in range(N)], N)
    loader = FfcvLoader(
        dst,
        batch_size=3,
        num_workers=1,
        order=FfcvOrder.SEQUENTIAL,
        drop_last=False,
        pipelines={"image": [SimpleRGBImageDecoder()], "mask": [BytesDecoder()], "label": [FfcvIntDecoder()]},
    )
    seen = 0
    for image, mask, label in loader:
        for j in range(len(label)):
            i = seen + j
            np.testing.assert_array_equal(np.asarray(image[j]), images[i])
            assert int(label[j][0]) == i
            decoded = np.asarray(Image.open(io.BytesIO(np.asarray(mask[j]).tobytes())))  # zero padding after IEND
            np.testing.assert_array_equal(decoded, masks[i][:, :, 0])
        seen += len(label)
    assert seen == N


def test_export_writes_decoded_png_fields_as_npy(tmp_path):
    import tarfile

    from ffload.convert.export import export_webdataset

    masks = arrays("uint16", 1, n=3, seed=6)
    dst = write_dataset(
        str(tmp_path / "e.beton"), {"mask": ImageArrayField("uint16", 1, compression="png")}, [(m,) for m in masks], 3
    )
    shards = export_webdataset(open_dataset(dst), str(tmp_path / "out" / "s-%02d.tar"))
    with tarfile.open(shards[0]) as tar:
        for i in range(3):
            got = np.load(io.BytesIO(tar.extractfile(f"{i:08d}.mask.npy").read()), allow_pickle=False)
            np.testing.assert_array_equal(got, masks[i])
