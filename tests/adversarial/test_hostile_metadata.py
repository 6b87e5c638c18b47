"""Metadata that ffload wrote, edited by someone: every value of the wrong JSON type or range (LMDB's
``__ffload__`` record, a sharded dataset's manifest) and every field type or descriptor that does not fit the
data (``.beton``) is refused at open with one FormatError naming the file and the cause, never a Python
traceback, and ``inspect`` / ``verify`` print that one line and exit with status 1."""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys

import lmdb
import numpy as np
import pytest

from ffload.errors import FormatError
from ffload.formats import IntField, RGBImageField, open_dataset, write_dataset
from ffload.formats.beton import FIELD_DESC_TYPE, HEADER_TYPE
from ffload.formats.shards import MANIFEST

ENV = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
FIXTURES = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures")


def _images(n: int = 4):
    return [(np.full((4, 5, 3), 10 * i, np.uint8), i) for i in range(n)]


def _lmdb(tmp_path, edit) -> str:
    """An image + label LMDB whose metadata record ``edit(record)`` returned (or edited in place)."""
    path = str(tmp_path / "d.lmdb")
    write_dataset(path, {"image": RGBImageField("raw"), "label": IntField()}, _images(), 4)
    env = lmdb.open(path, subdir=True)
    with env.begin(write=True) as txn:
        meta = json.loads(bytes(txn.get(b"__ffload__")))
        meta = edit(meta) or meta
        txn.put(b"__ffload__", json.dumps(meta).encode())
    env.close()
    return path


def _field(k: int, **values):
    return lambda meta: meta["fields"][k].update(values)


def _argument(k: int, **values):
    return lambda meta: meta["fields"][k]["arguments"].update(values)


def _drop(key: str):
    def edit(meta):
        del meta[key]

    return edit


LMDB_CASES = {
    "record a list": (lambda meta: [meta], "metadata record is an array, expected an object"),
    "record_size a string": (
        lambda meta: meta.update(record_size="24"),
        r"'record_size' is '24', expected an integer >= 1",
    ),
    "record_size a bool": (lambda meta: meta.update(record_size=True), r"'record_size' is True, expected an integer"),
    "record_size negative": (lambda meta: meta.update(record_size=-24), r"'record_size' is -24"),
    "record_size wrong": (lambda meta: meta.update(record_size=16), r"record_size 16 .* do not match .*corrupt layout"),
    "record_size missing": (_drop("record_size"), "lacks 'record_size'"),
    "num_samples a string": (lambda meta: meta.update(num_samples="4"), r"'num_samples' is '4', expected an integer"),
    "num_samples a float": (lambda meta: meta.update(num_samples=4.0), r"'num_samples' is 4.0"),
    "num_samples negative": (
        lambda meta: meta.update(num_samples=-1),
        r"'num_samples' is -1, expected an integer >= 0",
    ),
    "num_samples missing": (_drop("num_samples"), "lacks 'num_samples'"),
    "version a string": (lambda meta: meta.update(version="2"), "unsupported ffload LMDB version '2'"),
    "version a bool": (lambda meta: meta.update(version=True), "unsupported ffload LMDB version True"),
    "format missing": (_drop("format"), "lacks 'format'"),
    "fields an object": (
        lambda meta: meta.update(fields={"image": {}}),
        r"'fields' is \{'image': \{\}\}, expected a non-empty array",
    ),
    "fields empty": (lambda meta: meta.update(fields=[]), r"'fields' is \[\], expected a non-empty"),
    "fields missing": (_drop("fields"), "lacks 'fields'"),
    "field a list": (lambda meta: meta["fields"].__setitem__(0, ["image"]), "field 0 is an array, expected an object"),
    "field name a number": (_field(0, name=7), r"field 0: 'name' is 7, expected a non-empty string"),
    "field name empty": (_field(1, name=""), r"field 1: 'name' is '', expected a non-empty string"),
    "field name duplicate": (_field(1, name="image"), "field 1: duplicate name 'image'"),
    "field type unknown": (_field(1, type="LongField"), r"field 1: 'type' is 'LongField', expected 'FloatField' or"),
    "field type_id a string": (_field(0, type_id="2"), r"field 0: 'type_id' is '2', expected an integer in 0..255"),
    "field type_id of another type": (_field(0, type_id=0), r"type_id 0 is not the one of RGBImageField \(2\)"),
    "field arguments a list": (_field(0, arguments=[]), r"field 0: 'arguments' is \[\], expected an object"),
    "argument of the wrong type": (_argument(0, max_resolution="12"), r"argument 'max_resolution' is '12'"),
    "argument a bool": (_argument(0, jpeg_quality=True), r"argument 'jpeg_quality' is True"),
    "argument out of range": (_argument(0, jpeg_quality=101), r"invalid arguments .*jpeg_quality must be in 1..100"),
    "argument unknown": (_argument(1, bits=64), r"field 'label': invalid arguments \{'bits': 64\}"),
    "record_dtype a number": (lambda meta: meta.update(record_dtype=24), r"'record_dtype' is 24, expected a string or"),
    "record_dtype describes nothing": (
        lambda meta: meta.update(record_dtype={"names": ["x"]}),
        "'record_dtype' describes no record",
    ),
    "record_dtype of another size": (
        lambda meta: meta.update(record_dtype=[["image", "<u8"]]),
        r"record_dtype \(8 bytes\) do not match .* 24-byte record",
    ),
    "info a list": (lambda meta: meta.update(info=["cat"]), r"'info' is \['cat'\], expected an object"),
}


@pytest.mark.parametrize("case", list(LMDB_CASES))
def test_lmdb_metadata_of_the_wrong_json_type_or_range_is_one_format_error(tmp_path, case):
    edit, cause = LMDB_CASES[case]
    path = _lmdb(tmp_path, edit)
    with pytest.raises(FormatError, match=cause) as caught:
        open_dataset(path)
    assert str(caught.value).startswith(f"{path}: ") and "\n" not in str(caught.value)


@pytest.mark.parametrize("case", ["record_size a string", "record a list", "field a list"])
def test_inspect_and_verify_print_one_line_for_bad_lmdb_metadata(tmp_path, case):
    path = _lmdb(tmp_path, LMDB_CASES[case][0])
    for command in (["inspect", path], ["verify", path, "--quiet"]):
        run = subprocess.run(
            [sys.executable, "-m", "ffload.cli", *command], capture_output=True, text=True, env=ENV, timeout=120
        )
        assert run.returncode == 1 and run.stdout == "", run.stderr
        (line,) = run.stderr.strip().splitlines()
        assert line.startswith(f"ffload: error: {path}: metadata record"), line


def _sharded(tmp_path):
    dst = write_dataset(str(tmp_path / "s"), {"label": IntField()}, [(i,) for i in range(5)], 5, shard_size="1GB")
    return dst, json.loads(open(os.path.join(dst, MANIFEST)).read())


def _shard(**values):
    return lambda m: m["shards"][0].update(values)


MANIFEST_CASES = {
    "num_samples a string": (
        lambda m: m.update(num_samples="5"),
        r"manifest: 'num_samples' is '5', expected an integer",
    ),
    "version a bool": (lambda m: m.update(version=True), "unsupported sharded dataset version True"),
    "shards an object": (lambda m: m.update(shards={}), r"manifest: 'shards' is \{\}, expected an array"),
    "shards missing": (_drop("shards"), "manifest lacks 'shards'"),
    "shard a string": (lambda m: m.update(shards=["shard-00000.beton"]), "shard 0 is a string, expected an object"),
    "shard bytes a string": (_shard(bytes="12"), r"shard 0: 'bytes' is '12', expected an integer"),
    "shard bytes a bool": (_shard(bytes=True), r"shard 0: 'bytes' is True"),
    "shard num_samples negative": (_shard(num_samples=-5), r"shard 0: 'num_samples' is -5"),
    "shard path a number": (_shard(path=3), r"shard 0: 'path' is 3, expected a non-empty string"),
    "shard path missing": (lambda m: m["shards"][0].__delitem__("path"), "shard 0 lacks 'path'"),
    "shard sha256 not hex": (_shard(sha256="x" * 64), r"shard 0: 'sha256' is 'xxx.*64 lowercase hexadecimal"),
    "fields a string": (lambda m: m.update(fields="label"), r"'fields' is 'label', expected a non-empty array"),
    "field type_id of another type": (_field(0, type_id=0), r"type_id 0 is not the one of IntField \(1\)"),
    "info a string": (lambda m: m.update(info="x"), r"manifest: 'info' is 'x', expected an object"),
}


@pytest.mark.parametrize("case", list(MANIFEST_CASES))
def test_manifest_values_of_the_wrong_json_type_or_range_are_one_format_error(tmp_path, case):
    dst, manifest = _sharded(tmp_path)
    edit, cause = MANIFEST_CASES[case]
    manifest = edit(manifest) or manifest
    with open(os.path.join(dst, MANIFEST), "w") as fp:
        json.dump(manifest, fp)
    with pytest.raises(FormatError, match=cause) as caught:
        open_dataset(dst)
    assert MANIFEST in str(caught.value).split(": ")[0]


def _descriptor(raw: bytearray, k: int, key: str) -> int:
    """Offset in the file of field ``k``'s descriptor entry ``key``."""
    return HEADER_TYPE.itemsize + k * FIELD_DESC_TYPE.itemsize + FIELD_DESC_TYPE.fields[key][1]


def _ffcv_fixture(tmp_path, name: str) -> bytearray:
    with gzip.open(os.path.join(FIXTURES, f"{name}.beton.gz")) as fp:
        return bytearray(fp.read())


@pytest.mark.parametrize(
    "fixture,field,type_id,cause",
    [
        # ffcv writes no arguments: the allocation table's payloads tell the layouts apart
        ("ffcv_images_jpg", 0, 0, "allocation table holds 12 payloads, but 12 samples of 0 field"),
        ("ffcv_images_jpg", 0, 1, "allocation table holds 12 payloads, but 12 samples of 0 field"),
        ("ffcv_all_fields_raw", 0, 0, "allocation table holds 48 payloads, but 12 samples of 3 field"),
        ("ffcv_all_fields_raw", 2, 3, "allocation table holds 48 payloads, but 12 samples of 5 field"),
        ("ffcv_all_fields_raw", 0, 4, r"field 'image' \(type id 4\): corrupt NDArrayField arguments"),
    ],
)
def test_an_ffcv_beton_whose_field_type_changed_layout_is_refused_at_open(tmp_path, fixture, field, type_id, cause):
    path = tmp_path / "d.beton"
    raw = _ffcv_fixture(tmp_path, fixture)
    path.write_bytes(raw)
    assert open_dataset(str(path)).num_samples == 12  # the fixture as ffcv wrote it opens
    raw[_descriptor(raw, field, "type_id")] = type_id
    path.write_bytes(raw)
    with pytest.raises(FormatError, match=rf"d\.beton: .*{cause}"):
        open_dataset(str(path))


@pytest.mark.parametrize("type_id,owner", [(0, "FloatField"), (1, "IntField"), (3, "BytesField"), (5, "JSONField")])
def test_an_image_field_relabelled_as_another_type_is_refused_and_verify_says_so(tmp_path, type_id, owner):
    """One sample: too few values for the metadata heuristics (:meth:`Field.check_values`); the image's
    argument block (ffload writes ``ffload-rgb:`` + JSON there) is not the other type's."""
    path = tmp_path / "d.beton"
    write_dataset(str(path), {"image": RGBImageField("raw"), "label": IntField()}, _images(1), 1)
    raw = bytearray(path.read_bytes())
    raw[_descriptor(raw, 0, "type_id")] = type_id
    path.write_bytes(raw)
    with pytest.raises(
        FormatError,
        match=rf"field 'image' \(type id {type_id}\): {owner}'s argument block holds "
        r"b'ffload-rgb:.*corrupt field type",
    ):
        open_dataset(str(path))
    run = subprocess.run(
        [sys.executable, "-m", "ffload.cli", "verify", str(path), "--quiet"],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=120,
    )
    assert run.returncode == 1 and len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert run.stderr.startswith(f"ffload: error: {path}: field 'image'") and "all 1 samples decode" not in run.stdout


@pytest.mark.parametrize("name", [b"", b"im\0ge", b"\xffimage", b"image\n"])
def test_a_beton_field_name_that_no_writer_writes_is_refused(tmp_path, name):
    path = tmp_path / "d.beton"
    write_dataset(str(path), {"image": RGBImageField("raw"), "label": IntField()}, _images(2), 2)
    raw = bytearray(path.read_bytes())
    at = _descriptor(raw, 0, "name")
    padded = name.ljust(16, b"\0")
    raw[at : at + 16] = padded
    path.write_bytes(raw)
    cause = re.escape(f"field 0: its name {padded!r} is not")
    with pytest.raises(FormatError, match=rf"d\.beton: {cause}.*corrupt field descriptor"):
        open_dataset(str(path))


def test_rgb_arguments_out_of_range_in_a_beton_are_refused(tmp_path):
    path = tmp_path / "d.beton"
    write_dataset(str(path), {"image": RGBImageField("raw", jpeg_quality=90)}, [(im,) for im, _ in _images(2)], 2)
    raw = bytearray(path.read_bytes())
    at = raw.find(b'"jpeg_quality":90')
    raw[at : at + 17] = b'"jpeg_quality":99'.replace(b"99", b"0 ")
    path.write_bytes(raw)
    with pytest.raises(
        FormatError,
        match=r"field 'image' \(type id 2\): invalid RGBImageField arguments .*"
        r"jpeg_quality must be in 1\.\.100, got 0",
    ):
        open_dataset(str(path))
