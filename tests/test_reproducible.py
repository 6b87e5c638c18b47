"""Reproducible conversions: the same source folder and arguments give the same bytes, whatever
``num_workers``, on every run — a ``.beton`` byte for byte, an LMDB database key for key and value
for value as read back (``lock.mdb`` and ``data.mdb``'s free pages aside), a sharded dataset file for
file (shards and manifest).

Each corpus is converted three times per output kind: one worker, one worker again, two workers
(in their own processes, so that per-process state, such as uninitialised buffers a decoder leaves,
would show). The corpora are listed in :data:`CORPORA`: ordinary photos from ``skimage.data`` and
scikit-learn in common formats, and the odd files of :mod:`odd_images` (palette / planar / 16-bit
TIFFs, APNG, WebP with EXIF, BMP variants, broken files), converted with ``on_error='skip'``.
"""

from __future__ import annotations

import os

import cv2
import numpy as np
import pytest
from PIL import Image
from skimage import data

from ffload.convert import convert_dataset


def write_photos(root) -> None:
    """Ordinary photos: skimage's and scikit-learn's, as JPEG, PNG (RGB, grey, RGBA), BMP, TIFF, WebP."""
    from sklearn.datasets import load_sample_images

    china, flower = (np.ascontiguousarray(im[::4, ::4]) for im in load_sample_images().images)
    photos = {
        "astronaut": data.astronaut()[::3, ::3],
        "coffee": data.coffee()[::3, ::3],
        "chelsea": data.chelsea()[::2, ::2],
        "china": china,
        "flower": flower,
    }
    gray = {"camera": data.camera()[::4, ::4], "moon": data.moon()[::4, ::4]}
    for k, (name, rgb) in enumerate(photos.items()):
        folder = os.path.join(root, f"c{k % 2}")
        os.makedirs(folder, exist_ok=True)
        Image.fromarray(rgb).save(os.path.join(folder, f"{name}.jpg"), quality=85)
        Image.fromarray(rgb).save(os.path.join(folder, f"{name}.png"))
        Image.fromarray(np.dstack([rgb, rgb[..., :1]])).save(os.path.join(folder, f"{name}_alpha.png"))
        cv2.imwrite(os.path.join(folder, f"{name}.bmp"), rgb[..., ::-1])
        Image.fromarray(rgb).save(os.path.join(folder, f"{name}.tif"))
        Image.fromarray(rgb).save(os.path.join(folder, f"{name}.webp"), quality=80)
    for name, g in gray.items():
        Image.fromarray(g).save(os.path.join(root, "c0", f"{name}.png"))
        Image.fromarray(g).save(os.path.join(root, "c1", f"{name}.jpg"), quality=90)


def write_odd(root) -> None:
    """The odd files of :func:`odd_images.write_odd_corpus` (engineer A's corpus, tests/odd_images.py)."""
    from odd_images import write_odd_corpus

    write_odd_corpus(root)


CORPORA = {"photos": write_photos, "odd": write_odd}
"""Corpus name -> ``write(root)`` filling an ImageFolder: the folders every test below converts (a new
corpus: one entry here and in the fixture's params)."""

OUTPUTS = {  # output name -> convert_dataset arguments (each kind with another write mode)
    "x.beton": {"write_mode": "proportion", "jpeg_quality": 80},
    "x.lmdb": {"write_mode": "raw"},
    "x.shards": {"write_mode": "smart", "smart_threshold": 20000, "shard_size": "5MB", "page_size": 1 << 21},
}


@pytest.fixture(scope="module", params=["photos", "odd"])
def corpus(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(f"corpus-{request.param}") / "src"
    os.makedirs(root)
    CORPORA[request.param](str(root))
    return str(root)


def contents(path: str) -> dict[str, bytes]:
    """What must be identical: a file's bytes; an LMDB database's key -> value pairs as read back
    (prefixed ``lmdb:``); a directory's files (shards and manifest), by name."""
    if os.path.isfile(path):
        with open(path, "rb") as f:
            return {"": f.read()}
    if os.path.exists(os.path.join(path, "data.mdb")):
        import lmdb

        with lmdb.open(path, readonly=True, lock=False, subdir=True) as env, env.begin() as txn:
            return {f"lmdb:{bytes(k)!r}": bytes(v) for k, v in txn.cursor()}
    out = {}
    for name in sorted(os.listdir(path)):
        with open(os.path.join(path, name), "rb") as f:
            out[name] = f.read()
    return out


@pytest.mark.parametrize("output", sorted(OUTPUTS))
def test_same_bytes_on_every_run_and_worker_count(tmp_path, corpus, output):
    results, reports = [], []
    for run, workers in enumerate((1, 1, 2)):
        dst = str(tmp_path / f"run{run}-{output}")
        report = convert_dataset(corpus, dst, num_workers=workers, on_error="skip", progress=False, **OUTPUTS[output])
        results.append(contents(dst))
        reports.append((report.samples, report.skipped, report.skipped_origins))
    assert reports[0][0] > 0 and reports[0] == reports[1] == reports[2]
    assert sorted(results[0]) == sorted(results[1]) == sorted(results[2])
    for key in results[0]:
        same = [results[0][key] == results[k][key] for k in (1, 2)]
        assert all(same), f"{output} {key or 'file'}: run 2 same as run 1: {same[0]}; 2 workers same: {same[1]}"


def test_no_stale_bytes_where_the_data_moved(tmp_path):
    """A sample larger than the page grows the page size and moves the data: the bytes it leaves,
    now padding before the first page, are zeros (no payload left behind, whatever ran before)."""
    from ffload.formats import BytesField, IntField, open_dataset, write_dataset

    rng = np.random.default_rng(0)
    blobs = [rng.integers(1, 256, size, np.uint8) for size in (300_000, 3 << 20, 1000)]
    dst = str(tmp_path / "g.beton")
    write_dataset(
        dst, {"blob": BytesField(), "label": IntField()}, [(b, k) for k, b in enumerate(blobs)], 3, page_size=2 << 20
    )
    view = open_dataset(dst)
    first = int(min(view.ptrs["blob"]))
    assert view.page_size == 4 << 20 and first == 4 << 20  # grown once: the data moved from 2 MiB to 4 MiB
    with open(dst, "rb") as f:
        head = f.read(first)
    assert not any(head[2 << 20 :])  # the old data region is zeros
    for k, b in enumerate(blobs):
        assert np.array_equal(view.payload("blob", k), b)
