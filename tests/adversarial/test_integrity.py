"""Integrity at open: header fields against the file size, field type ids against their data, LMDB
``num_samples`` against the records present; and ``verify`` names every bad sample, exit status 1."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import lmdb
import numpy as np
import pytest

from ffload.errors import FormatError
from ffload.formats import FloatField, IntField, JSONField, RGBImageField, open_dataset, write_dataset
from ffload.formats.beton import FIELD_DESC_TYPE, HEADER_TYPE

ENV = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))


def _beton(path, fields, samples):
    write_dataset(str(path), fields, samples, len(samples))
    return bytearray(path.read_bytes())


def _patch_header(raw: bytearray, name: str, value: int) -> bytearray:
    offset = HEADER_TYPE.fields[name][1]
    np.frombuffer(raw, HEADER_TYPE, count=1)  # (layout check)
    size = HEADER_TYPE[name].itemsize
    raw[offset : offset + size] = int(value).to_bytes(size, "little")
    return raw


@pytest.mark.parametrize(
    "name,value,cause",
    [
        ("num_samples", 10**9, "truncated or corrupt"),
        ("alloc_table_ptr", 10**12, "truncated or corrupt"),
        ("page_size", 3 << 20, "corrupt header"),
        ("num_fields", 300, "(truncated|duplicate field name|corrupt field descriptor)"),
    ],
)
def test_header_fields_inconsistent_with_the_file_size_are_refused(tmp_path, name, value, cause):
    path = tmp_path / "d.beton"
    raw = _beton(
        path,
        {"image": RGBImageField("raw"), "label": IntField()},
        [(np.zeros((4, 4, 3), np.uint8), i) for i in range(10)],
    )
    path.write_bytes(_patch_header(raw, name, value))
    with pytest.raises(FormatError, match=rf"d\.beton: .*{cause}"):
        open_dataset(str(path))


def _flip_type(path, field_index: int, type_id: int):
    raw = bytearray(path.read_bytes())
    at = HEADER_TYPE.itemsize + field_index * FIELD_DESC_TYPE.itemsize + FIELD_DESC_TYPE.fields["type_id"][1]
    raw[at] = type_id
    path.write_bytes(bytes(raw))


def test_int_labels_under_a_float_type_id_are_refused(tmp_path):
    path = tmp_path / "d.beton"
    _beton(
        path,
        {"image": RGBImageField("raw"), "label": IntField()},
        [(np.zeros((4, 4, 3), np.uint8), i % 10) for i in range(20)],
    )
    _flip_type(path, 1, FloatField.type_id)
    with pytest.raises(FormatError, match=r"field 'label' \(FloatField\).*integer data under the FloatField"):
        open_dataset(str(path))


def test_floats_under_an_int_type_id_are_refused_and_real_ints_are_not(tmp_path):
    path = tmp_path / "d.beton"
    _beton(path, {"x": FloatField()}, [(0.25 + i,) for i in range(12)])
    _flip_type(path, 0, IntField.type_id)
    with pytest.raises(FormatError, match=r"field 'x' \(IntField\).*float data under the IntField type id"):
        open_dataset(str(path))
    big = tmp_path / "big.beton"  # large and negative integers, random 63-bit ids: plausible, accepted
    ids = np.random.default_rng(0).integers(-(2**62), 2**62, 64)
    write_dataset(str(big), {"id": IntField()}, [(int(v),) for v in ids], len(ids))
    assert open_dataset(str(big)).metadata["id"].tolist() == ids.tolist()
    zeros = tmp_path / "z.beton"
    write_dataset(str(zeros), {"x": FloatField(), "y": IntField()}, [(0.0, 0)] * 9 + [(1e-310, 2**60)], 10)
    assert open_dataset(str(zeros)).num_samples == 10  # one subnormal, one huge int: too little evidence


def _lmdb_meta(path, edit):
    env = lmdb.open(str(path), subdir=True)
    with env.begin(write=True) as txn:
        meta = json.loads(bytes(txn.get(b"__ffload__")))
        edit(meta)
        txn.put(b"__ffload__", json.dumps(meta).encode())
    env.close()


@pytest.mark.parametrize("declared", [0, 3, 5])
def test_lmdb_num_samples_smaller_than_the_records_is_refused(tmp_path, declared):
    path = tmp_path / "d.lmdb"
    write_dataset(str(path), {"label": IntField()}, [(i,) for i in range(6)], 6)
    _lmdb_meta(path, lambda meta: meta.update(num_samples=declared))
    with pytest.raises(
        FormatError, match=r"d\.lmdb: the metadata record says num_samples=\d, the records table holds 6 records"
    ):
        open_dataset(str(path))


def test_lmdb_num_samples_larger_than_the_records_is_refused(tmp_path):
    path = tmp_path / "d.lmdb"
    write_dataset(str(path), {"label": IntField()}, [(i,) for i in range(6)], 6)
    _lmdb_meta(path, lambda meta: meta.update(num_samples=7))
    with pytest.raises(FormatError, match=r"num_samples=7, the records table holds 6 records"):
        open_dataset(str(path))


def test_lmdb_int_type_flipped_to_float_is_refused(tmp_path):
    path = tmp_path / "d.lmdb"
    write_dataset(str(path), {"label": IntField()}, [(i % 3,) for i in range(6)], 6)

    def flip(meta):
        meta["fields"][0].update(type="FloatField", type_id=0)
        meta["record_dtype"] = [["label", "<f8"]]

    _lmdb_meta(path, flip)
    with pytest.raises(FormatError, match="integer data under the FloatField"):
        open_dataset(str(path))


def test_verify_lists_every_bad_json_payload_and_exits_1(tmp_path):
    path = tmp_path / "d.beton"
    samples = [({"i": i}, {"j": i}) for i in range(6)]
    raw = _beton(path, {"meta": JSONField(), "more": JSONField()}, samples)
    for text in ('{"i": 1}', '{"i": 4}', '{"j": 1}'):  # break three payloads of two samples in place
        at = raw.find(text.encode())
        raw[at] = ord("[")
    path.write_bytes(bytes(raw))
    run = subprocess.run(
        [sys.executable, "-m", "ffload.cli", "verify", str(path), "--quiet"],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=120,
    )
    assert run.returncode == 1 and "Traceback" not in run.stderr, run.stderr
    assert "sample 1, field 'meta'" in run.stderr and "sample 4, field 'meta'" in run.stderr
    assert "sample 1, field 'more'" in run.stderr and "sample 4, field 'more'" not in run.stderr
    assert "2 of 6 samples do not decode (3 problems)" in run.stderr
