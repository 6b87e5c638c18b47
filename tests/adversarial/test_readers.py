"""Readers facing files that changed or broke: a dataset replaced on disk while an older loader
still holds it, a truncated LMDB, a corrupt LMDB page, and payload layouts that are legal but
unusual (an empty payload sharing its offset with the next field's)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import ffload
from ffload.errors import FfloadError
from ffload.formats import BytesField, IntField, JSONField, RGBImageField, open_dataset, write_dataset


def _write(path, value, n=12):
    imgs = np.full((n, 8, 8, 3), value, dtype=np.uint8)
    write_dataset(path, {"image": RGBImageField("raw"), "label": IntField()}, [(imgs[i], i) for i in range(n)], n)


def test_a_replaced_lmdb_is_read_anew_while_an_old_loader_holds_the_old_one(tmp_path):
    path = str(tmp_path / "d.lmdb")
    _write(path, 10)
    with ffload.Loader(path, batch_size=4, num_workers=1, order="sequential") as old:
        assert int(next(iter(old))[0].max()) == 10
        shutil.rmtree(path)
        _write(path, 200)
        with ffload.Loader(path, batch_size=4, num_workers=1, order="sequential") as new:
            assert {int(im.max()) for im, _ in new} == {200}
        assert {int(im.max()) for im, _ in old} == {10}  # the old snapshot stays readable


@pytest.mark.parametrize("keep", [0.3, 0.6, 0.95])
def test_a_truncated_lmdb_is_refused_without_a_signal(tmp_path, keep):
    path = str(tmp_path / "d.lmdb")
    _write(path, 7, n=40)
    data = os.path.join(path, "data.mdb")
    os.truncate(data, int(os.path.getsize(data) * keep) // 4096 * 4096)
    code = (
        "import sys; from ffload.formats import open_dataset\n"
        "try:\n    open_dataset(sys.argv[1])\nexcept Exception as e:\n    print(type(e).__name__, e)\n"
    )
    run = subprocess.run([sys.executable, "-c", code, path], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr  # a SIGBUS would make it negative
    assert run.stdout.startswith(("DatasetError", "FormatError")) and "d.lmdb" in run.stdout, run.stdout


def test_empty_payload_before_another_payload_of_the_same_sample(tmp_path):
    fields = {"blob": BytesField(), "meta": JSONField(), "label": IntField()}
    samples = [(b"" if i % 2 == 0 else bytes([i]) * i, {"i": i}, i) for i in range(6)]
    for suffix in (".beton", ".lmdb"):
        path = str(tmp_path / f"e{suffix}")
        write_dataset(path, fields, samples, len(samples))
        view = open_dataset(path)
        region = view.open_region()
        for i, (blob, _meta, _) in enumerate(samples):
            assert view.payload("blob", i, region).tobytes() == blob
            assert view.payload("meta", i, region).tobytes() == f'{{"i": {i}}}\0'.encode()


def test_corrupt_lmdb_pages_raise_one_error_class(tmp_path):
    path = str(tmp_path / "d.lmdb")
    _write(path, 3, n=40)
    data = os.path.join(path, "data.mdb")
    raw = bytearray(open(data, "rb").read())
    raw[3 * 4096 : 3 * 4096 + 64] = b"\xff" * 64  # smash the header of a tree page
    open(data, "wb").write(bytes(raw))
    try:
        view = open_dataset(path)
    except FfloadError as e:
        assert "d.lmdb" in str(e)
    else:  # the smashed page was not on the path to any record: reading must still work
        assert view.num_samples == 40


@pytest.mark.parametrize("suffix", [".beton", ".lmdb"])
def test_a_file_truncated_between_batches_ends_the_epoch_with_an_error(tmp_path, suffix):
    """No SIGBUS: a truncation between batches is seen by the size check before the next batch
    touches the mapping (in a child, so that a signal death fails the test instead of killing
    pytest). The workers are let finish the batch in flight first; a truncation *during* a batch's
    reads is ``test_sigbus.py``'s."""
    path = str(tmp_path / f"d{suffix}")
    imgs = np.full((400, 64, 64, 3), 7, np.uint8)
    write_dataset(path, {"image": RGBImageField("raw"), "label": IntField()}, [(imgs[i], i) for i in range(400)], 400)
    data = os.path.join(path, "data.mdb") if suffix == ".lmdb" else path
    code = f"""
import os, ffload
from ffload.loaders import LoaderError
loader = ffload.Loader({path!r}, batch_size=20, num_workers=1, batches_ahead=0, order="sequential", batches_per_job=1)
it = iter(loader)
next(it)
loader._get_runner().wait_idle()  # the prefetched batch is decoded: no worker reads the mapping now
os.truncate({data!r}, os.path.getsize({data!r}) // 3)
try:
    for _ in it:
        pass
except LoaderError as e:
    print("LoaderError", e)
"""
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, (run.returncode, run.stderr[-2000:])
    assert run.stdout.startswith("LoaderError") and "the file shrank from" in run.stdout, run.stdout
    assert "found no data" not in run.stdout  # the size check's error: nothing was read past the end
