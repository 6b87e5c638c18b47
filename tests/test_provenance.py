"""Provenance: every stored sample records where it came from (ImageFolder path, WebDataset shard
and key, CIFAR file and row, array index), skipped inputs do not shift it, ``inspect`` shows it and
``export`` keeps it as the WebDataset key, in .beton, LMDB and sharded outputs."""

from __future__ import annotations

import io
import json
import os
import tarfile

import cv2
import numpy as np
import pytest
from click.testing import CliRunner
from skimage import data

from ffload.cli import main
from ffload.convert import convert_dataset
from ffload.convert.export import export_webdataset
from ffload.convert.sources import ArraySource, WebDatasetSource
from ffload.formats import open_dataset
from ffload.formats.dataset_origins import dataset_origins
from ffload.formats.origins import OriginBlock, OriginLog, origin_fields, origin_key

OUTPUTS = ["x.beton", "x.lmdb", "x.shards"]


def _png(rgb):
    return cv2.imencode(".png", cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR))[1].tobytes()


def _crops(n):
    img = data.astronaut()
    return [np.ascontiguousarray(img[9 * k % 480 : 9 * k % 480 + 24, 7 * k % 480 : 7 * k % 480 + 20]) for k in range(n)]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """An ImageFolder with a corrupt file in the middle of class ``b`` and a nested folder;
    ``(root, relative paths of the good files in sample order)``."""
    root = tmp_path_factory.mktemp("prov") / "src"
    crops = iter(_crops(9))
    good = []
    for rel in ["a/0.png", "a/1.png", "a/sub/2.png", "b/0.png", "b/1 bad.png", "b/2.png", "b/x.y.png", "c/0.png"]:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if "bad" in rel:
            path.write_bytes(b"\x89PNG\r\n\x1a\n but truncated")
            continue
        path.write_bytes(_png(next(crops)))
        good.append(rel)
    return root, good


def _convert(root, dst, **kwargs):
    shard = {"shard_size": 1 << 22, "page_size": 1 << 21} if dst.endswith(".shards") else {}
    return convert_dataset(
        str(root), dst, on_error="skip", progress=False, num_workers=2, chunk_size=2, **shard, **kwargs
    )


@pytest.mark.parametrize("name", OUTPUTS)
def test_skipped_inputs_do_not_shift_origins(tmp_path, folder, name):
    root, good = folder
    report = _convert(root, str(tmp_path / name))
    assert report.samples == len(good) and report.skipped_origins == ["b/1 bad.png"]
    assert report.as_dict()["skipped"][0]["origin"] == "b/1 bad.png"
    view = open_dataset(str(tmp_path / name))
    origins = dataset_origins(view)
    assert origins.descriptor == {"source": "imagefolder", "id": "path"}
    assert origins.strings(0, len(good)) == good and [origins[i] for i in range(len(good))] == good
    assert origins.describe(3) == {"path": "b/0.png"}
    assert view.metadata["label"].tolist() == [0, 0, 0, 1, 1, 1, 2]


def test_sharded_origins_span_several_shards(tmp_path):
    """Shards holding two 512x512 raw images each: every shard has its own origin block."""
    names = [f"k{k % 2}/img {k}.png" for k in range(6)]
    for k, rel in enumerate(names):
        (tmp_path / "src" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "src" / rel).write_bytes(_png(np.roll(data.astronaut(), 8 * k, axis=1)))
    good = sorted(names, key=lambda rel: (rel.split("/")[0], rel))
    dst = str(tmp_path / "tiny.shards")
    convert_dataset(str(tmp_path / "src"), dst, progress=False, num_workers=0, page_size=1 << 21, shard_size="5MB")
    view = open_dataset(dst)
    assert len(view.shards.paths) == 3
    assert dataset_origins(view).strings(0, 6) == good
    for k, path in enumerate(view.shards.paths):  # each shard alone: a standalone .beton with its part
        alone = dataset_origins(open_dataset(path))
        assert alone.strings(0, len(alone)) == good[2 * k : 2 * k + 2]


def test_cli_inspect_shows_origins_and_skips_name_relative_paths(tmp_path, folder):
    root, good = folder
    dst = str(tmp_path / "c.beton")
    runner = CliRunner()
    out = runner.invoke(
        main, ["convert", str(root), dst, "--on-error", "skip", "--json", "--quiet", "--num-workers", "1"]
    )
    assert out.exit_code == 0, out.output
    skipped = json.loads(out.output)["skipped"]
    assert [(s["origin"], s["input"]) for s in skipped] == [("b/1 bad.png", str(root / "b" / "1 bad.png"))]
    out = runner.invoke(main, ["inspect", dst, "--json", "--sample", "4", "--sample", "6"])
    assert out.exit_code == 0, out.output
    info = json.loads(out.output)
    assert info["origins"]["source"]["source"] == "imagefolder"
    assert [e["origin"]["path"] for e in info["origins"]["first"]] == good[:3]
    assert info["samples_asked"] == [
        {"index": 4, "origin": {"path": "b/2.png"}, "label": 1},
        {"index": 6, "origin": {"path": "c/0.png"}, "label": 2},
    ]
    text = runner.invoke(main, ["inspect", dst, "--sample", "5"]).output
    assert "sample 5: path b/x.y.png (label 1)" in text
    bad = runner.invoke(main, ["inspect", dst, "--sample", "7"])
    assert bad.exit_code == 1 and "no sample 7 (the dataset has 7)" in bad.output


def test_export_keeps_file_stems_as_keys_and_keeps_them_unique(tmp_path, folder):
    root, good = folder
    (root / "c" / "0.jpg").write_bytes(cv2.imencode(".jpg", _crops(1)[0])[1].tobytes())  # same stem as c/0.png
    try:
        convert_dataset(str(root), str(tmp_path / "e.beton"), on_error="skip", progress=False, num_workers=0)
    finally:
        os.unlink(root / "c" / "0.jpg")
    shards = export_webdataset(open_dataset(str(tmp_path / "e.beton")), str(tmp_path / "out" / "p-%02d.tar"))
    with tarfile.open(shards[0]) as tar:
        keys = [name.rsplit(".", 1)[0] for name in tar.getnames() if name.endswith(".cls")]
    assert keys == ["a/0", "a/1", "a/sub/2", "b/0", "b/2", "b/x_y", "c/0-00000006", "c/0-00000007"]
    back = WebDatasetSource(shards[0])
    assert len(back) == 8 and back.labels.tolist() == [0, 0, 0, 1, 1, 1, 2, 2]


def _shards_with_keys(folder, keys_per_shard):
    photos = iter(_crops(sum(len(k) for k in keys_per_shard)))
    paths = []
    for s, keys in enumerate(keys_per_shard):
        path = folder / f"shard-{s}.tar.gz"
        with tarfile.open(path, "w:gz") as tar:
            for key in keys:
                for ext, blob in (("png", _png(next(photos))), ("cls", str(int(key) % 2).encode())):
                    info = tarfile.TarInfo(f"{key}.{ext}")
                    info.size = len(blob)
                    tar.addfile(info, io.BytesIO(blob))
        paths.append(str(path))
    return paths


def test_webdataset_keys_survive_convert_and_export(tmp_path):
    """Keys 10..99 of the source come back as 10..99 (not 00000000..), shard by shard."""
    (tmp_path / "in").mkdir()
    keys = [[str(k) for k in range(10, 40)], [str(k) for k in range(40, 100)]]
    _shards_with_keys(tmp_path / "in", keys)
    dst = str(tmp_path / "w.lmdb")
    convert_dataset(str(tmp_path / "in"), dst, progress=False, num_workers=0)
    origins = dataset_origins(open_dataset(dst))
    assert origins.descriptor["parts"] == ["shard-0.tar.gz", "shard-1.tar.gz"]
    assert origins.describe(0) == {"shard": "shard-0.tar.gz", "key": "10"}
    assert origins.describe(89) == {"shard": "shard-1.tar.gz", "key": "99"}
    shards = export_webdataset(open_dataset(dst), str(tmp_path / "out" / "e-%02d.tar"), maxcount=50)
    back = WebDatasetSource(str(tmp_path / "out"))
    assert [back.describe(i).rsplit(":", 1)[1] for i in range(len(back))] == [str(k) for k in range(10, 100)]
    assert len(shards) == 2


def test_cifar_and_array_origins(tmp_path):
    from cifar_fixture import write_cifar10_folder

    images = np.stack([np.full((32, 32, 3), k, np.uint8) for k in range(15)])
    folder = write_cifar10_folder(tmp_path / "cifar-10-batches-py", images, np.arange(15) % 10, images[:2], [0, 1])
    convert_dataset(folder, str(tmp_path / "c.beton"), progress=False, num_workers=0)  # 5 batches of 3
    origins = dataset_origins(open_dataset(str(tmp_path / "c.beton")))
    assert origins.describe(0) == {"file": "data_batch_1", "row": 0}
    assert origins.describe(7) == {"file": "data_batch_3", "row": 1}
    assert origin_key(origins.descriptor, origins[7]) == "data_batch_3/00000001"
    convert_dataset(
        ArraySource(images[:4], [0, 1, 0, 1], name="mine"), str(tmp_path / "a.beton"), progress=False, num_workers=0
    )
    origins = dataset_origins(open_dataset(str(tmp_path / "a.beton")))
    assert origins.descriptor["source"] == "ArraySource" and origins.describe(3) == {"index": 3}
    assert origin_key(origins.descriptor, origins[3]) == "00000003"


class _Memory:
    """Bytes with the ``size`` / ``read(start, stop)`` interface of a file."""

    def __init__(self, data: bytes):
        self.data, self.size = data, len(data)

    def read(self, a, b):
        return self.data[a:b]


def test_origin_block_round_trip_and_corruption():
    from ffload.formats import DatasetError

    log = OriginLog()
    for origin in ["a/1.png", "", "caf\u00e9/\udcff.png", "z"]:  # a non-UTF-8 file name keeps its byte
        log.append(origin)
    block = log.block()
    assert len(block) == log.block_size()
    read = OriginBlock.find("mem", _Memory(block), 0, len(block))
    assert read.strings(0, 4) == ["a/1.png", "", "caf\u00e9/\udcff.png", "z"] and read.strings(1, 2) == [""]
    assert os.fsencode(read.strings(2, 3)[0]) == "caf\u00e9/".encode() + b"\xff.png"  # the file name's bytes
    assert OriginBlock.find("mem", _Memory(b"\0" * 64 + block), 0, 64 + len(block)) is None  # no magic: none
    with pytest.raises(DatasetError, match="origin block at 0 .* runs past byte"):
        OriginBlock.find("mem", _Memory(block), 0, len(block) - 1)
    broken = bytearray(block)
    broken[32:40] = (100).to_bytes(8, "little")  # the first string's end beyond the blob
    with pytest.raises(DatasetError, match="offsets out of order"):
        OriginBlock.find("mem", _Memory(bytes(broken)), 0, len(block)).strings(0, 1)
    assert origin_fields({"id": "key", "part": "shard", "parts": ["a"]}, "7:x") == {"origin": "7:x"}
    assert OriginLog().block() == b"" and OriginLog().block_size() == 0  # nothing given: no block


def test_ffcv_style_reading_of_a_file_with_grown_origin_room_and_pages(tmp_path):
    """Read the file as ffcv 1.0.2's reader does (no ffcv needed): the header, the field descriptors
    right after it, exactly num_samples metadata rows after them, the allocation table from
    alloc_table_ptr to EOF, each payload found only through its allocation (by pointer); every
    payload equals what was written, although the origin room and the page size grew."""
    from ffload.formats.beton import ALLOC_TYPE, FIELD_DESC_TYPE, HEADER_TYPE, BetonWriter
    from ffload.formats.fields.base import metadata_dtype
    from ffload.formats.fields.bytes import BytesField
    from ffload.formats.fields.scalars import IntField

    fields = {"blob": BytesField(), "label": IntField()}
    rng = np.random.default_rng(3)
    blobs = [rng.integers(0, 256, size, np.uint8) for size in (1000, 0, 3 << 20, 70, 5 << 20, 12)]
    path = str(tmp_path / "grown.beton")
    writer = BetonWriter(
        path,
        fields,
        len(blobs),
        page_size=2 << 20,
        reserve=1,
        origin_room=1,
        info={"origin": {"source": "imagefolder", "id": "path"}},
    )
    moves = []
    writer.before_grow = lambda: moves.append(writer.count)
    with writer:
        for i, blob in enumerate(blobs):
            encoded = [f.encode(v, i) for f, v in zip(fields.values(), (blob, 7 * i))]
            writer.add(i, [m for m, _ in encoded], [p for _, p in encoded], origin=f"folder/{i:04d}-" + "x" * 300)
    assert moves and writer.page_size == 8 << 20  # the origin room and the page size both grew
    raw = np.fromfile(path, np.uint8)
    header = raw[: HEADER_TYPE.itemsize].view(HEADER_TYPE)[0]
    n, table_ptr = int(header["num_samples"]), int(header["alloc_table_ptr"])
    assert (int(header["version"]), int(header["num_fields"]), n) == (2, 2, len(blobs))
    desc_end = HEADER_TYPE.itemsize + 2 * FIELD_DESC_TYPE.itemsize
    desc = raw[HEADER_TYPE.itemsize : desc_end].view(FIELD_DESC_TYPE)
    assert [int(d["type_id"]) for d in desc] == [3, 1]
    mtype = metadata_dtype(list(fields.values()))
    metadata = raw[desc_end : desc_end + n * mtype.itemsize].view(mtype)
    table = raw[table_ptr:].view(ALLOC_TYPE)
    assert len(table) == n and int(header["page_size"]) == writer.page_size
    by_ptr = {int(ptr): int(size) for ptr, size in zip(table["ptr"], table["size"])}  # ffcv: size by offset
    for i, blob in enumerate(blobs):
        ptr = int(metadata["f0"]["ptr"][i])
        assert int(metadata["f1"][i]) == 7 * i and int(metadata["f0"]["size"][i]) == blob.size
        assert np.array_equal(raw[ptr : ptr + by_ptr[ptr]], blob)
        assert ptr // writer.page_size == (ptr + max(blob.size, 1) - 1) // writer.page_size  # within one page
    origins = dataset_origins(open_dataset(path))
    assert origins.strings(0, n) == [f"folder/{i:04d}-" + "x" * 300 for i in range(n)]


def test_left_out_origin_takes_folders_named_dot_dot_something_as_inside_the_root(tmp_path):
    from types import SimpleNamespace

    from ffload.convert.provenance import left_out_origin

    source = SimpleNamespace(root=str(tmp_path / "root"))
    assert left_out_origin(source, str(tmp_path / "root" / "..foo" / "x.png")) == "..foo/x.png"
    assert left_out_origin(source, str(tmp_path / "root" / "...")) == "..."
    assert left_out_origin(source, str(tmp_path / "elsewhere" / "x.png")) is None
    assert left_out_origin(source, str(tmp_path)) is None
