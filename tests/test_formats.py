"""The on-disk formats: round trips, ffcv interoperability both ways, page growth, bad files."""

from __future__ import annotations

import gzip
import json
import os
import shutil
from pathlib import Path

import cv2
import numpy as np
import pytest
from isolated import run_isolated

from ffload.errors import ConfigurationError
from ffload.formats import (
    BytesField,
    DatasetError,
    FloatField,
    IntField,
    JSONField,
    NDArrayField,
    RGBImageField,
    open_dataset,
    write_dataset,
)
from ffload.formats.beton import ALLOC_TYPE, HEADER_TYPE
from ffload.formats.fields.base import named_metadata_dtype
from ffload.formats.fields.image import RESTART_MIN_SIDE
from ffload.loaders.samples import decode_image

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")


def photos():
    from skimage import data

    return [
        data.astronaut(),
        data.chelsea(),
        np.ascontiguousarray(data.coffee()[:120, :150]),
        np.ascontiguousarray(data.rocket()[::3, ::3]),
    ]


def all_field_samples():
    imgs = photos()
    fields = {
        "image": RGBImageField("raw"),
        "label": IntField(),
        "value": FloatField(),
        "blob": BytesField(),
        "array": NDArrayField(np.dtype("<f4"), (3, 4)),
        "doc": JSONField(),
    }
    samples = [
        (
            im,
            i - 1,
            i * 0.25 - 3,
            np.arange(i * 5 + 1, dtype=np.uint8),
            np.full((3, 4), i, np.float32) / 3,
            {"i": i, "s": "é" * i},
        )
        for i, im in enumerate(imgs)
    ]
    return fields, samples


def check_view(view, samples, exact_images=True):
    assert view.num_samples == len(samples)
    region = view.open_region()
    for i, (img, label, value, blob, array, doc) in enumerate(samples):
        got = decode_image(view, "image", i, region)
        if exact_images:
            np.testing.assert_array_equal(got, img)
        else:
            assert got.shape == img.shape
            assert np.abs(got.astype(int) - img).mean() < 4
        assert view.metadata["label"][i] == label
        assert view.metadata["value"][i] == value
        assert bytes(view.payload("blob", i, region)) == blob.tobytes()
        np.testing.assert_array_equal(
            np.frombuffer(view.payload("array", i, region).tobytes(), "<f4").reshape(3, 4), array
        )
        assert JSONField.unpack(np.asarray(view.payload("doc", i, region))) == doc


@pytest.mark.smoke
@pytest.mark.parametrize("suffix", [".beton", ".lmdb"])
def test_every_field_round_trips(tmp_path, suffix):
    fields, samples = all_field_samples()
    dst = str(tmp_path / f"d{suffix}")
    write_dataset(dst, fields, samples, len(samples))
    view = open_dataset(dst)
    assert view.format == suffix[1:]
    assert list(view.fields) == list(fields)
    assert view.fields == fields
    check_view(view, samples)


@pytest.mark.parametrize("suffix", [".beton", ".lmdb"])
def test_jpeg_and_mixed_modes(tmp_path, suffix):
    imgs = photos()
    for mode, expect in [("jpg", {0}), ("smart", {0, 1}), ("proportion", {0, 1})]:
        field = RGBImageField(mode, smart_threshold=100_000, compress_probability=0.5, jpeg_quality=95)
        dst = str(tmp_path / f"{mode}{suffix}")
        write_dataset(dst, {"image": field}, [(im,) for im in imgs * 4], len(imgs) * 4)
        view = open_dataset(dst)
        modes = set(view.metadata["image"]["mode"].tolist())
        assert modes == expect, mode
        for i, im in enumerate(imgs * 4):
            got = decode_image(view, "image", i)
            if view.metadata["image"]["mode"][i] == 0:  # exactly libjpeg's round trip at q95
                ref = cv2_jpeg(im, 95, 1 if min(im.shape[:2]) >= RESTART_MIN_SIDE else 0)
                np.testing.assert_array_equal(np.asarray(view.payload("image", i)), ref)
                np.testing.assert_array_equal(got, cv2.imdecode(ref, cv2.IMREAD_COLOR_RGB))
                assert np.abs(got.astype(int) - im).mean() < 6
            else:
                np.testing.assert_array_equal(got, im)
        if mode == "smart":  # FFCV's rule: JPEG exactly when the raw image exceeds the threshold
            raw_bytes = np.array([im.nbytes for im in imgs * 4])
            np.testing.assert_array_equal(view.metadata["image"]["mode"] == 0, raw_bytes > 100_000)


def cv2_jpeg(image, quality, restart_interval=0):
    """The reference JPEG file of an RGB image: OpenCV's encoder (BGR input) at ``quality``, with
    a restart marker every ``restart_interval`` MCUs (0: none)."""
    ok, data = cv2.imencode(
        ".jpg",
        cv2.cvtColor(image, cv2.COLOR_RGB2BGR),
        [int(cv2.IMWRITE_JPEG_QUALITY), quality, int(cv2.IMWRITE_JPEG_RST_INTERVAL), restart_interval],
    )
    assert ok
    return data.reshape(-1)


def test_jpeg_quality_is_applied(tmp_path):
    img = photos()[1]
    payloads = {}
    for quality in (95, 50):
        dst = str(tmp_path / f"q{quality}.beton")
        write_dataset(dst, {"image": RGBImageField("jpg", jpeg_quality=quality, jpeg_restart_interval=0)}, [(img,)], 1)
        payloads[quality] = np.asarray(open_dataset(dst).payload("image", 0)).copy()
        np.testing.assert_array_equal(payloads[quality], cv2_jpeg(img, quality))
    assert payloads[95].size > payloads[50].size  # a higher quality keeps more coefficients


@pytest.mark.parametrize("interval", [None, 0, 1, 3])
def test_jpeg_restart_interval_is_applied(tmp_path, interval):
    """Restart markers every ``interval`` MCUs (default: every MCU from 128 px a side, none below),
    as libjpeg writes them; the pixels are those of the file without markers; the argument is
    kept in the file."""
    big, small = photos()[1], photos()[2]  # 300 x 451, 120 x 150
    dst = str(tmp_path / "r.beton")
    field = RGBImageField("jpg", jpeg_restart_interval=interval)
    write_dataset(dst, {"image": field}, [(big,), (small,)], 2)
    view = open_dataset(dst)
    assert view.fields["image"].jpeg_restart_interval == interval
    for i, (img, default) in enumerate([(big, 1), (small, 0)]):
        expected = default if interval is None else interval
        data = np.asarray(view.payload("image", i))
        np.testing.assert_array_equal(data, cv2_jpeg(img, 90, expected))
        rst = int(np.count_nonzero((data[:-1] == 0xFF) & (data[1:] >= 0xD0) & (data[1:] <= 0xD7)))
        mcus = -(-img.shape[0] // 16) * -(-img.shape[1] // 16)
        assert rst == (-(-mcus // expected) - 1 if expected else 0)
        np.testing.assert_array_equal(
            cv2.imdecode(data, cv2.IMREAD_COLOR_RGB), cv2.imdecode(cv2_jpeg(img, 90), cv2.IMREAD_COLOR_RGB)
        )
    with pytest.raises(ConfigurationError, match="jpeg_restart_interval"):
        RGBImageField("jpg", jpeg_restart_interval=70000)


def test_max_resolution_caps_longer_side(tmp_path):
    img = photos()[0]  # 512 x 512
    wide = np.ascontiguousarray(img[:200])  # 200 x 512
    dst = str(tmp_path / "m.beton")
    write_dataset(dst, {"image": RGBImageField("raw", max_resolution=128)}, [(img,), (wide,)], 2)
    view = open_dataset(dst)
    assert tuple(view.metadata["image"][["height", "width"]][0]) == (128, 128)
    assert tuple(view.metadata["image"][["height", "width"]][1]) == (50, 128)
    expected = cv2.resize(wide, (128, 50), interpolation=cv2.INTER_AREA)
    np.testing.assert_array_equal(decode_image(view, "image", 1), expected)


def test_sample_larger_than_page_grows_page_size(tmp_path):
    small = photos()[1]
    big = np.random.default_rng(0).integers(0, 255, (1100, 1000, 3), dtype=np.uint8)  # 3.3 MB raw
    samples = [(small, 0), (big, 1), (small, 2)]
    dst = str(tmp_path / "big.beton")
    write_dataset(dst, {"image": RGBImageField("raw"), "label": IntField()}, samples, 3, page_size=1 << 21)
    view = open_dataset(dst)
    assert view.page_size == 1 << 22
    for i, (img, label) in enumerate(samples):
        np.testing.assert_array_equal(decode_image(view, "image", i), img)
        assert view.metadata["label"][i] == label
    # pages stay aligned and no payload straddles a page
    p, s = view.ptrs["image"], view.sizes["image"]
    assert np.all(p // view.page_size == (p + s - 1) // view.page_size)


def _expected_fixture_samples():
    exp = np.load(os.path.join(FIXTURES, "ffcv_fixtures_expected.npz"))
    images, pos = [], 0
    for shape in exp["shapes"]:
        n = int(np.prod(shape))
        images.append(exp["pixels"][pos : pos + n].reshape(shape))
        pos += n
    blobs, pos = [], 0
    for n in exp["blob_lengths"]:
        blobs.append(exp["blobs"][pos : pos + n])
        pos += n
    return images, exp, blobs


def _unzip_fixture(tmp_path, name):
    out = tmp_path / name
    with gzip.open(os.path.join(FIXTURES, name + ".gz"), "rb") as src, open(out, "wb") as dst:
        shutil.copyfileobj(src, dst)
    return str(out)


def test_reads_files_written_by_ffcv(tmp_path):
    images, exp, blobs = _expected_fixture_samples()
    view = open_dataset(_unzip_fixture(tmp_path, "ffcv_all_fields_raw.beton"))
    assert list(view.fields) == ["image", "label", "value", "array", "blob", "doc"]
    assert view.fields["array"] == NDArrayField(np.dtype("float32"), (2, 3))
    region = view.open_region()
    for i, img in enumerate(images):
        np.testing.assert_array_equal(decode_image(view, "image", i, region), img)
        assert view.metadata["label"][i] == exp["labels"][i]
        assert view.metadata["value"][i] == exp["floats"][i]
        arr = np.frombuffer(view.payload("array", i, region).tobytes(), np.float32).reshape(2, 3)
        np.testing.assert_array_equal(arr, exp["arrays"][i])
        np.testing.assert_array_equal(np.asarray(view.payload("blob", i, region)), blobs[i])
        doc = JSONField.unpack(np.asarray(view.payload("doc", i, region)))
        assert doc == {"index": i, "name": f"sample-{i}", "tags": list(range(i % 3))}
    jpg = open_dataset(_unzip_fixture(tmp_path, "ffcv_images_jpg.beton"))
    assert set(jpg.metadata["image"]["mode"].tolist()) == {0}
    for i, img in enumerate(images):
        got = decode_image(jpg, "image", i)
        assert got.shape == img.shape
        assert np.abs(got.astype(int) - img).mean() < 6


@pytest.mark.smoke
def test_ffcv_loader_reads_our_files(tmp_path):
    pytest.importorskip("ffcv", reason="ffcv 1.0.2 (extra 'ffcv') is not installed")
    run_isolated(
        "test_formats", "ffcv_loader_reads_our_files", str(tmp_path)
    )  # ffcv corrupts numba's types: tests/isolated.py


def ffcv_loader_reads_our_files(tmp: str):
    """The body of :func:`test_ffcv_loader_reads_our_files`, run in a fresh process."""
    tmp_path = Path(tmp)
    from ffcv.fields.basics import FloatDecoder, IntDecoder
    from ffcv.fields.bytes import BytesDecoder
    from ffcv.fields.ndarray import NDArrayDecoder
    from ffcv.fields.rgb_image import SimpleRGBImageDecoder
    from ffcv.loader import Loader, OrderOption

    rng = np.random.default_rng(1)
    imgs = [rng.integers(0, 255, (24, 20, 3), dtype=np.uint8) for _ in range(10)]
    fields = {
        "image": RGBImageField("raw"),
        "label": IntField(),
        "value": FloatField(),
        "array": NDArrayField(np.dtype("<i2"), (5,)),
        "blob": BytesField(),
        "doc": JSONField(),
    }
    samples = [
        (im, i * 3, i / 8, np.arange(5, dtype=np.int16) * i, np.arange(i + 1, dtype=np.uint8), {"i": i})
        for i, im in enumerate(imgs)
    ]
    dst = str(tmp_path / "ours.beton")
    write_dataset(dst, fields, samples, len(samples), info={"classes": ["x", "y"]})  # ffcv skips the info block
    loader = Loader(
        dst,
        batch_size=4,
        num_workers=1,
        order=OrderOption.SEQUENTIAL,
        drop_last=False,
        pipelines={
            "image": [SimpleRGBImageDecoder()],
            "label": [IntDecoder()],
            "value": [FloatDecoder()],
            "array": [NDArrayDecoder()],
            "blob": [BytesDecoder()],
            "doc": [BytesDecoder()],
        },
    )
    seen = 0
    for image, label, value, array, blob, doc in loader:
        for j in range(len(label)):
            i = seen + j
            np.testing.assert_array_equal(np.asarray(image[j]), imgs[i])
            assert int(label[j][0]) == i * 3 and float(value[j][0]) == i / 8
            np.testing.assert_array_equal(np.asarray(array[j]), samples[i][3])
            np.testing.assert_array_equal(np.asarray(blob[j][: i + 1]), samples[i][4])
            assert JSONField.unpack(np.asarray(doc[j])) == {"i": i}
        seen += len(label)
    assert seen == 10


def test_ffcv_reads_jpeg_and_grown_pages(tmp_path):
    pytest.importorskip("ffcv", reason="ffcv 1.0.2 (extra 'ffcv') is not installed")
    run_isolated(
        "test_formats", "ffcv_reads_jpeg_and_grown_pages", str(tmp_path)
    )  # ffcv corrupts numba's types: tests/isolated.py


def ffcv_reads_jpeg_and_grown_pages(tmp: str):
    """The body of :func:`test_ffcv_reads_jpeg_and_grown_pages`, run in a fresh process."""
    tmp_path = Path(tmp)
    from ffcv.fields.basics import IntDecoder
    from ffcv.fields.bytes import BytesDecoder
    from ffcv.fields.rgb_image import CenterCropRGBImageDecoder
    from ffcv.loader import Loader, OrderOption

    blob = np.random.default_rng(0).integers(0, 255, 3_000_000, dtype=np.uint8)  # > 2 MiB
    samples = [(p, i, blob[: 10 + i]) for i, p in enumerate(photos())] + [(photos()[0], 9, blob)]
    dst = str(tmp_path / "mixed.beton")
    write_dataset(
        dst,
        {"image": RGBImageField("smart", smart_threshold=500_000), "label": IntField(), "blob": BytesField()},
        samples,
        len(samples),
        page_size=1 << 21,
    )
    view = open_dataset(dst)
    assert view.page_size == 1 << 22  # the 3 MB sample did not fit 2 MiB pages
    assert set(view.metadata["image"]["mode"].tolist()) == {0, 1}
    loader = Loader(
        dst,
        batch_size=5,
        num_workers=1,
        order=OrderOption.SEQUENTIAL,
        pipelines={
            "image": [CenterCropRGBImageDecoder((64, 64), 1.0)],
            "label": [IntDecoder()],
            "blob": [BytesDecoder()],
        },
    )
    ((images, labels, blobs),) = list(loader)
    assert labels.ravel().tolist() == [0, 1, 2, 3, 9]
    assert images.shape == (5, 64, 64, 3)
    np.testing.assert_array_equal(blobs[4], blob)
    np.testing.assert_array_equal(blobs[1][:11], blob[:11])


# ---- bad files --------------------------------------------------------------------------------


def _good_beton(tmp_path):
    fields, samples = all_field_samples()
    dst = str(tmp_path / "good.beton")
    write_dataset(dst, fields, samples, len(samples))
    return dst


@pytest.mark.parametrize("suffix", [".beton", ".lmdb"])
def test_dataset_info_round_trip_and_refusals(tmp_path, suffix):
    fields, samples = all_field_samples()
    info = {"classes": ["chat", "chien", "éléphant"], "source": {"kind": "imagefolder", "n": 3}}
    dst = write_dataset(str(tmp_path / f"d{suffix}"), fields, samples, len(samples), info=info)
    view = open_dataset(dst)
    assert view.info == info
    check_view(view, samples)  # the info block moves nothing the samples need
    # fewer samples than reserved (skipped inputs): the block follows the rows actually written
    from ffload.formats.atomic import dataset_writer

    with dataset_writer(str(tmp_path / f"s{suffix}"), {"label": IntField()}, 10, info=info) as writer:
        for i in range(4):
            writer.add(i, [np.int64(i)], [None])
    short = open_dataset(str(tmp_path / f"s{suffix}"))
    assert short.num_samples == 4 and short.info == info and short.metadata["label"].tolist() == [0, 1, 2, 3]
    with pytest.raises(ConfigurationError, match="JSON values only"):
        write_dataset(str(tmp_path / f"bad{suffix}"), {"label": IntField()}, [(1,)], 1, info={"x": {1, 2}})
    with pytest.raises(ConfigurationError, match="must be a dict"):
        write_dataset(str(tmp_path / f"bad{suffix}"), {"label": IntField()}, [(1,)], 1, info=["a"])
    assert not os.path.exists(tmp_path / f"bad{suffix}")


def test_corrupt_info_block_is_refused(tmp_path):
    from ffload.formats.beton import INFO_MAGIC

    dst = write_dataset(
        str(tmp_path / "d.beton"),
        {"label": IntField(), "blob": BytesField()},
        [(i, np.arange(3, dtype=np.uint8)) for i in range(3)],
        3,
        info={"classes": ["a"]},
    )
    raw = bytearray(open(dst, "rb").read())
    at = raw.find(INFO_MAGIC) + len(INFO_MAGIC)
    good = bytes(raw)
    raw[at : at + 8] = np.uint64(1 << 40).astype("<u8").tobytes()  # a length running past the data
    open(dst, "wb").write(raw)
    with pytest.raises(DatasetError, match="runs past the data"):
        open_dataset(dst)
    raw = bytearray(good)
    raw[at + 8] = ord("[")  # '{"classes"...' becomes '["classes"...': not JSON any more
    open(dst, "wb").write(raw)
    with pytest.raises(DatasetError, match="not UTF-8 JSON"):
        open_dataset(dst)


def test_missing_and_not_a_dataset(tmp_path):
    with pytest.raises(DatasetError, match="no such file"):
        open_dataset(str(tmp_path / "nope.beton"))
    junk = tmp_path / "junk.beton"
    junk.write_bytes(b"hello, this is not a dataset at all" * 10)
    with pytest.raises(DatasetError, match="junk.beton.*version"):
        open_dataset(str(junk))
    empty = tmp_path / "empty.beton"
    empty.write_bytes(b"")
    with pytest.raises(DatasetError, match="shorter than the header"):
        open_dataset(str(empty))


def test_wrong_version(tmp_path):
    dst = _good_beton(tmp_path)
    with open(dst, "r+b") as f:
        f.write(np.array(3, "<u2").tobytes())
    with pytest.raises(DatasetError, match="version field reads 3"):
        open_dataset(dst)


@pytest.mark.parametrize("keep", [30, 2000, 0.5, -24])
def test_truncated_files_are_refused(tmp_path, keep):
    dst = _good_beton(tmp_path)
    size = os.path.getsize(dst)
    keep = int(size * keep) if isinstance(keep, float) else (size + keep if keep < 0 else keep)
    with open(dst, "r+b") as f:
        f.truncate(keep)
    with pytest.raises(DatasetError, match="good.beton"):
        open_dataset(dst)


def test_allocation_table_past_the_end_is_refused(tmp_path):
    dst = _good_beton(tmp_path)
    with open(dst, "rb") as f:
        header = np.frombuffer(f.read(HEADER_TYPE.itemsize), HEADER_TYPE)[0]
    table_ptr = int(header["alloc_table_ptr"])
    entry = np.zeros((), ALLOC_TYPE)
    with open(dst, "r+b") as f:
        f.seek(table_ptr)
        entry = np.frombuffer(f.read(ALLOC_TYPE.itemsize), ALLOC_TYPE).copy()
        entry["size"] = 1 << 40
        f.seek(table_ptr)
        f.write(entry.tobytes())
    with pytest.raises(DatasetError, match="outside the data region"):
        open_dataset(dst)


def test_metadata_pointer_not_allocated_is_refused(tmp_path):
    dst = _good_beton(tmp_path)
    view = open_dataset(dst)
    off = HEADER_TYPE.itemsize + 1041 * len(view.fields) + view.metadata.dtype.fields["image"][1] + 5
    with open(dst, "r+b") as f:  # data_ptr of sample 0's image
        f.seek(off)
        f.write(np.array(123456789, "<u8").tobytes())
    with pytest.raises(DatasetError, match="sample 0, field 'image'"):
        open_dataset(dst)


def test_lmdb_without_our_metadata_is_refused(tmp_path):
    import lmdb

    path = str(tmp_path / "foreign.lmdb")
    env = lmdb.open(path, map_size=1 << 20)
    with env.begin(write=True) as txn:
        txn.put(b"0000000000", b"something")
    env.close()
    with pytest.raises(DatasetError, match="without ffload's metadata record"):
        open_dataset(path)
    os.makedirs(tmp_path / "plain.lmdb")
    with pytest.raises(DatasetError, match="no data.mdb"):
        open_dataset(str(tmp_path / "plain.lmdb"))


def test_lmdb_schema_readable_with_plain_lmdb(tmp_path):
    """The README's recipe: json metadata + fixed-width keys + a numpy record, no ffload."""
    import lmdb

    fields, samples = all_field_samples()
    path = str(tmp_path / "s.lmdb")
    write_dataset(path, fields, samples, len(samples))
    env = lmdb.open(path, readonly=True, lock=False)
    with env.begin() as txn:
        meta = json.loads(txn.get(b"__ffload__"))
        assert meta["num_samples"] == len(samples)
        assert [f["name"] for f in meta["fields"]] == list(fields)

        def to_dtype(t):
            if isinstance(t, str):
                return np.dtype(t)
            if isinstance(t, list):
                return np.dtype([(n, to_dtype(s)) for n, s in t])
            return np.dtype({**t, "formats": [to_dtype(f) for f in t["formats"]]})

        dt = to_dtype(meta["record_dtype"])
        assert dt.itemsize == meta["record_size"]
        keys = [bytes(k) for k, _ in txn.cursor()]
        assert keys == [b"%010d" % i for i in range(len(samples))] + [
            b"__ffload__",
            b"__ffload_places__",
            b"__ffload_records__",
        ]
        table = txn.get(b"__ffload_records__")
        assert len(table) == len(samples) * dt.itemsize
        for i in range(len(samples)):  # the table repeats each value's record
            assert table[i * dt.itemsize : (i + 1) * dt.itemsize] == txn.get(b"%010d" % i)[: dt.itemsize]
        value = txn.get(b"%010d" % 2)
        rec = np.frombuffer(value[: dt.itemsize], dtype=dt)[0]
        h, w = int(rec["image"]["height"]), int(rec["image"]["width"])
        start = int(rec["image"]["data_ptr"])
        pixels = np.frombuffer(value[start : start + h * w * 3], np.uint8).reshape(h, w, 3)
        np.testing.assert_array_equal(pixels, samples[2][0])
        assert int(rec["label"]) == samples[2][1]
    env.close()


def _rewrite_lmdb(path, key, change):
    """Replace the value of ``key`` in the LMDB database at ``path`` by ``change(old bytes)``
    (``None``: delete the key)."""
    import lmdb

    env = lmdb.open(path, map_size=1 << 26)
    with env.begin(write=True) as txn:
        new = change(bytes(txn.get(key)))
        if new is None:
            assert txn.delete(key)
        else:
            txn.put(key, new)
    env.close()


def _rewrite_lmdb_meta(path, change):
    """Apply ``change`` (edits the dict in place) to the metadata record of ``path``."""

    def edit(raw):
        meta = json.loads(raw)
        change(meta)
        return json.dumps(meta).encode()

    _rewrite_lmdb(path, b"__ffload__", edit)


def _lmdb_as_version_1(path):
    """Rewrite an ffload LMDB database as schema version 1 wrote it: no records or places table."""
    _rewrite_lmdb(path, b"__ffload_records__", lambda _: None)
    _rewrite_lmdb(path, b"__ffload_places__", lambda _: None)
    _rewrite_lmdb_meta(path, lambda meta: meta.update(version=1))


def test_lmdb_version_1_still_read(tmp_path):
    fields, samples = all_field_samples()
    path = str(tmp_path / "v1.lmdb")
    write_dataset(path, fields, samples, len(samples))
    new = open_dataset(path)
    metadata, payloads = (
        new.metadata.copy(),
        {n: [new.payload(n, i).copy() for i in range(len(samples))] for n in new.ptrs},
    )
    del new
    _lmdb_as_version_1(path)
    old = open_dataset(path)
    np.testing.assert_array_equal(old.metadata, metadata)
    for name, column in payloads.items():
        for i, expected in enumerate(column):
            np.testing.assert_array_equal(old.payload(name, i), expected)


@pytest.mark.parametrize("version", [1, 2])
def test_lmdb_corrupt_record_offsets_refused(tmp_path, version):
    """An image data_ptr far outside its value: in the records table (version 2) or in the
    value's own record (version 1, where it is read from)."""
    fields, samples = all_field_samples()
    path = str(tmp_path / "c.lmdb")
    write_dataset(path, fields, samples, len(samples))
    if version == 1:
        _lmdb_as_version_1(path)
    key, at = (b"0000000001", 0) if version == 1 else (b"__ffload_records__", named_metadata_dtype(fields).itemsize)

    def far_pointer(value):
        value = bytearray(value)
        value[at + 5 : at + 13] = np.array(10**9, "<u8").tobytes()
        return bytes(value)

    _rewrite_lmdb(path, key, far_pointer)
    with pytest.raises(DatasetError, match="sample 1, field 'image'"):
        open_dataset(path)


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda table: table[:-1], r"records table .__ffload_records__. is \d+ bytes"),
        (lambda table: b"\xff" * len(table), "sample 0: its record differs from the records table"),
    ],
)
def test_lmdb_corrupt_records_table_refused(tmp_path, change, message):
    fields, samples = all_field_samples()
    path = str(tmp_path / "t.lmdb")
    write_dataset(path, fields, samples, len(samples))
    _rewrite_lmdb(path, b"__ffload_records__", change)
    with pytest.raises(DatasetError, match=message):
        open_dataset(path)


def _resident_pages(path) -> np.ndarray:
    """Which pages of ``path`` are in the page cache, ``(pages,) bool``: mincore(2) over a fresh
    read-only mapping, which reports the file's page-cache pages without faulting any in."""
    import ctypes
    import mmap

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    with open(path, "rb") as f:
        mapped = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
    pages = -(-len(mapped) // mmap.PAGESIZE)
    vec = ctypes.create_string_buffer(pages)
    region = np.frombuffer(mapped, np.uint8)
    failed = libc.mincore(ctypes.c_void_p(region.ctypes.data), len(mapped), vec)
    del region
    mapped.close()
    assert failed == 0, f"mincore: errno {ctypes.get_errno()}"
    return (np.frombuffer(vec.raw, np.uint8) & 1).astype(bool)


def _evict(path) -> None:
    """Drop ``path``'s clean pages from the page cache (no root needed)."""
    with open(path, "rb") as f:
        os.fsync(f.fileno())
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


@pytest.mark.parametrize("version", [1, 2])
def test_lmdb_open_reads_no_sample_values(tmp_path, version):
    """Opening a version-2 database reads its tables and LMDB's leaf pages, and of the sample
    values only the few it spot-checks (SPOT_CHECKS, and their neighbours where the kernel reads
    a large folio); version 1 reads the record at the start of every value, one page per sample:
    the cold-open cost on a disk."""
    import mmap

    from ffload.formats.lmdb.reader import SPOT_CHECKS

    n = 400
    rows = [(np.full((128, 170, 3), i % 251, np.uint8), i) for i in range(n)]
    path = write_dataset(str(tmp_path / "cold.lmdb"), {"image": RGBImageField("raw"), "label": IntField()}, rows, n)
    if version == 1:
        _lmdb_as_version_1(path)
    data_path = os.path.join(path, "data.mdb")
    _evict(data_path)
    if _resident_pages(data_path).sum() > 8:
        pytest.skip("posix_fadvise(DONTNEED) did not evict data.mdb here")
    view = open_dataset(path)
    resident = _resident_pages(data_path)
    assert view.metadata["label"].tolist() == list(range(n))
    start = view.ptrs["image"].astype(np.int64)
    touched = sum(bool(resident[s // mmap.PAGESIZE : (s + 128 * 170 * 3) // mmap.PAGESIZE + 1].any()) for s in start)
    if version == 2:
        assert touched <= 2 * SPOT_CHECKS, touched
    else:
        assert touched == n, touched


@pytest.mark.parametrize("suffix", [".beton", ".lmdb"])
def test_no_payload_fields_and_empty_payloads(tmp_path, suffix):
    dst = str(tmp_path / f"ints{suffix}")
    write_dataset(dst, {"a": IntField(), "b": FloatField()}, [(i, i / 2) for i in range(5)], 5)
    view = open_dataset(dst)
    assert view.metadata["a"].tolist() == list(range(5))
    dst = str(tmp_path / f"bytes{suffix}")
    blobs = [b"x", b"", b"yz", b"", b""]
    write_dataset(dst, {"b": BytesField(), "c": IntField()}, [(b, i) for i, b in enumerate(blobs)], 5)
    view = open_dataset(dst)
    assert [bytes(view.payload("b", i)) for i in range(5)] == blobs
    assert view.metadata["c"].tolist() == list(range(5))


def test_lmdb_zero_copy_in_a_path_with_spaces(tmp_path):
    fields, samples = all_field_samples()
    folder = tmp_path / "dir with space"
    folder.mkdir()
    write_dataset(str(folder / "s.lmdb"), fields, samples, len(samples))
    view = open_dataset(str(folder / "s.lmdb"))
    assert view.data_path == str(folder / "s.lmdb" / "data.mdb")  # mapped, not copied
    check_view(view, samples)


@pytest.mark.parametrize(
    "change,message",
    [
        (lambda m: m["fields"][0].update(arguments={"bogus": 1}), "invalid arguments"),
        (lambda m: m.pop("num_samples"), "metadata record lacks 'num_samples'"),
        (lambda m: m["fields"][1].pop("name"), "field 1 lacks 'name'"),
        (lambda m: m.update(version=9), "unsupported ffload LMDB version 9"),
    ],
)
def test_lmdb_corrupt_metadata_record_refused(tmp_path, change, message):
    fields, samples = all_field_samples()
    path = str(tmp_path / "m.lmdb")
    write_dataset(path, fields, samples, len(samples))
    _rewrite_lmdb_meta(path, change)
    with pytest.raises(DatasetError, match=message):
        open_dataset(path)


@pytest.mark.parametrize("suffix", [".beton", ".lmdb"])
def test_writer_commits_on_exit_and_aborts_on_error(tmp_path, suffix):
    from ffload.formats.beton import BetonWriter
    from ffload.formats.lmdb.writer import LMDBWriter

    cls = BetonWriter if suffix == ".beton" else LMDBWriter
    fields = {"label": IntField(), "blob": BytesField()}
    samples = [fields["label"].encode(7, 0), fields["blob"].encode(b"abc", 0)]
    metas, payloads = zip(*samples)
    with cls(str(tmp_path / f"ok{suffix}"), fields, 3) as writer:
        writer.add(0, metas, payloads)
        with pytest.raises(ValueError, match="expected 1, got 2"):
            writer.add(2, metas, payloads)
        writer.add(1, metas, payloads)
        assert writer.count == 2
    view = open_dataset(str(tmp_path / f"ok{suffix}"))
    assert view.num_samples == 2 and list(view.metadata["label"]) == [7, 7]
    assert bytes(view.payload("blob", 1)) == b"abc"
    with pytest.raises(RuntimeError, match="boom"):
        with cls(str(tmp_path / f"bad{suffix}"), fields, 3) as writer:
            writer.add(0, metas, payloads)
            raise RuntimeError("boom")
    with pytest.raises(DatasetError):  # aborted: never finished into a dataset
        open_dataset(str(tmp_path / f"bad{suffix}"))
    with cls(str(tmp_path / f"full{suffix}"), fields, 1) as writer:
        writer.add(0, metas, payloads)
        with pytest.raises(ValueError, match="at most 1"):
            writer.add(1, metas, payloads)


def test_field_pointer_accessors():
    image, array, label = RGBImageField(), NDArrayField(np.uint8, (2,)), IntField()
    assert image.has_payload and array.has_payload and not label.has_payload
    records = np.zeros(3, dtype=image.metadata_type)
    image.set_pointer(records, [10, 20, 30])
    np.testing.assert_array_equal(image.get_pointer(records), [10, 20, 30])
    assert list(records["data_ptr"]) == [10, 20, 30] and list(records["width"]) == [0, 0, 0]
    offsets = np.zeros((), dtype=array.metadata_type)  # one record, 0-d: the record is the offset
    array.set_pointer(offsets, 99)
    assert int(array.get_pointer(offsets)) == 99
    with pytest.raises(TypeError, match="no payload"):
        label.get_pointer(np.zeros(1, dtype=label.metadata_type))


def test_image_sizes_from_metadata():
    from ffload.formats import image_sizes

    column = np.zeros(5, dtype=RGBImageField.metadata_type)
    column["height"], column["width"] = [32, 32, 32, 32, 32], [48] * 5
    np.testing.assert_array_equal(image_sizes(column), [[32, 48]])
    column["height"][3], column["width"][1] = 65535, 7
    np.testing.assert_array_equal(image_sizes(column), [[32, 7], [32, 48], [65535, 48]])
    assert image_sizes(column[:0]).shape == (0, 2)
    np.testing.assert_array_equal(image_sizes(column[1:4], distinct=False), [[32, 7], [32, 48], [65535, 48]])


def test_lmdb_offsets_come_from_lmdbs_own_mapping_when_the_file_is_mapped_twice(tmp_path):
    """A process may map data.mdb more than once (an earlier view's open_region()); the record
    offsets must be taken against LMDB's mapping, the one holding the values it returns."""
    import lmdb

    from ffload.formats.lmdb.mapping import address, lmdb_map_base

    rows = [(np.full((8, 8, 3), i, np.uint8), i) for i in range(5)]
    dst = write_dataset(str(tmp_path / "twice.lmdb"), {"image": RGBImageField("raw"), "label": IntField()}, rows, 5)
    data_path = os.path.join(dst, "data.mdb")
    other = np.memmap(data_path, dtype=np.uint8, mode="r")  # a second mapping of the file, offset 0
    env = lmdb.open(dst, readonly=True, lock=False)
    with env.begin(buffers=True) as txn:
        value = txn.get(b"__ffload__")
        lmdb_base = lmdb_map_base(data_path, address(value))
        assert lmdb_base is not None and lmdb_base != other.ctypes.data
        assert lmdb_map_base(data_path, other.ctypes.data + 10) == other.ctypes.data
        assert bytes(value) == bytes(np.asarray(other[address(value) - lmdb_base :][: len(value)]))
    env.close()
    view = open_dataset(dst)
    for i in range(5):
        assert view.payload("image", i)[:4].tolist() == [i] * 4
    del other


def test_lmdb_writes_the_same_bytes_every_time_and_nothing_of_the_process_memory(tmp_path):
    """LMDB copies pages from malloc'd buffers: unless it zeroes them (``meminit``), the unused
    part of each page carries whatever the process freed before (here, a marker), so the file
    would leak memory and differ run to run. Two conversions of the same rows are byte-equal."""
    rows = [(np.full((40, 50 + i, 3), i, np.uint8), i) for i in range(6)]
    fields = {"image": RGBImageField("raw"), "label": IntField()}
    written = []
    for name in ("a.lmdb", "b.lmdb"):
        junk = [b"MARKER-freed-by-the-process-" * 150 for _ in range(200)]
        del junk
        path = write_dataset(str(tmp_path / name), fields, rows, len(rows))
        written.append(Path(path, "data.mdb").read_bytes())
    assert b"MARKER-freed" not in written[0] + written[1]
    assert written[0] == written[1]


def test_lmdb_compacted_copy_read_correctly(tmp_path):
    """``mdb_copy -c`` (py-lmdb's ``Environment.copy(compact=True)``) renumbers pages: the places
    recorded at writing no longer hold, the reader notices (spot checks), warns, and finds every
    value through LMDB instead; the samples read are the same."""
    import lmdb

    n = 60
    rows = [(np.full((40 + i, 50, 3), i, np.uint8), i) for i in range(n)]
    path = write_dataset(str(tmp_path / "w.lmdb"), {"image": RGBImageField("raw"), "label": IntField()}, rows, n)
    env = lmdb.open(path, readonly=True, lock=False)
    os.makedirs(tmp_path / "c.lmdb")
    env.copy(str(tmp_path / "c.lmdb"), compact=True)
    env.close()
    with pytest.warns(UserWarning, match="rewritten after ffload wrote it"):
        view = open_dataset(str(tmp_path / "c.lmdb"))
    for i in range(n):
        np.testing.assert_array_equal(view.payload("image", i).reshape(40 + i, 50, 3), rows[i][0])
    assert view.metadata["label"].tolist() == list(range(n))


def test_lmdb_leaf_node_pointing_past_the_file_is_refused_before_lmdb_reads_it(tmp_path):
    """A value's size in its leaf node made huge: LMDB would read past the end of data.mdb
    (SIGBUS, found by the fuzz test); the page check refuses the database first, naming it."""
    n = 6
    rows = [(np.full((40, 50, 3), i, np.uint8), i) for i in range(n)]
    path = write_dataset(str(tmp_path / "n.lmdb"), {"image": RGBImageField("raw"), "label": IntField()}, rows, n)
    import lmdb

    from ffload.formats.lmdb.layout import PLACES_KEY
    from ffload.formats.lmdb.mapping import address, lmdb_map_base

    data_path = os.path.join(path, "data.mdb")
    env = lmdb.open(path, readonly=True, lock=False)
    with env.begin(buffers=True) as txn:  # the live leaf node: its key lies just before its value
        value = txn.get(PLACES_KEY)
        key = address(value) - lmdb_map_base(data_path, address(value)) - len(PLACES_KEY)
    env.close()
    raw = bytearray(Path(data_path).read_bytes())
    assert raw[key : key + len(PLACES_KEY)] == PLACES_KEY
    raw[key - 8 : key - 4] = b"\xff\xff\xff\x7f"  # mn_lo, mn_hi: the data size
    Path(data_path).write_bytes(bytes(raw))
    with pytest.raises(DatasetError, match=r"corrupt LMDB database: page \d+: a value .*runs past"):
        open_dataset(path)
