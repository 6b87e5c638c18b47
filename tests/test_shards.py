"""Sharded datasets (issue 13): ``convert --shard-size`` writes standalone .beton shards and a
manifest; ``open_dataset`` / ``ffload.Loader`` read the directory as one dataset.

The data: an ImageFolder of 300 real photo crops (sklearn's two sample photos, 96x96 PNG, raw
27 KiB each, 2 MiB pages: 75 samples a page), converted once unsharded and once with a shard size
that gives several shards; every sharded result is compared with the unsharded one.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import time
from pathlib import Path

import cv2
import numpy as np
import pytest
from click.testing import CliRunner
from interrupt import start_slow_conversion

import ffload
from ffload.cli import main
from ffload.convert import convert_dataset
from ffload.errors import ConfigurationError, FormatError, LoaderError
from ffload.formats import BytesField, IntField, open_dataset, write_dataset
from ffload.formats.shards import MANIFEST, parse_size

N, SIDE, PAGE = 300, 96, 1 << 21
SHARD = "5MB"  # a 2 MiB header page, one 2 MiB data page and the table fit; two data pages do not
ORDERS = ("sequential", "random", "quasi_random")


def photo_folder(root: Path) -> tuple[list[np.ndarray], list[int]]:
    """``root/<class>/NNNN.png``: N crops of sklearn's sample photos (class 0: china, 1: flower),
    in ImageFolder order. Returns the crops (RGB) and labels in that order."""
    from sklearn.datasets import load_sample_images

    photos = load_sample_images().images
    rng = np.random.default_rng(0)
    images, labels = [], []
    for i in range(N):
        label = i * 2 // N
        photo = photos[label]
        y, x = rng.integers(0, photo.shape[0] - SIDE), rng.integers(0, photo.shape[1] - SIDE)
        crop = np.ascontiguousarray(photo[y : y + SIDE, x : x + SIDE])
        folder = root / str(label)
        folder.mkdir(parents=True, exist_ok=True)
        cv2.imwrite(str(folder / f"{i:04d}.png"), cv2.cvtColor(crop, cv2.COLOR_RGB2BGR))
        images.append(crop)
        labels.append(label)
    return images, labels


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """``(unsharded .beton, sharded directory, images, labels)``, both converted by the CLI."""
    tmp = tmp_path_factory.mktemp("shards")
    images, labels = photo_folder(tmp / "src")
    one, sharded = tmp / "one.beton", tmp / "train.shards"
    for dst, extra in ((one, []), (sharded, ["--shard-size", SHARD])):
        result = CliRunner().invoke(
            main,
            ["convert", str(tmp / "src"), str(dst), "--num-workers", "2", "--quiet", "--page-size", str(PAGE), *extra],
        )
        assert result.exit_code == 0, result.output
    return str(one), str(sharded), images, labels


def test_manifest_and_standalone_shards(converted):
    one, sharded, images, labels = converted
    manifest = json.loads(Path(sharded, MANIFEST).read_text("utf8"))
    assert manifest["format"] == "ffload-shards" and manifest["version"] == 1
    assert manifest["num_samples"] == N and manifest["info"] == {
        "classes": ["0", "1"],
        "origin": {"source": "imagefolder", "id": "path"},
    }
    assert [f["name"] for f in manifest["fields"]] == ["image", "label"]
    shards = manifest["shards"]
    assert len(shards) >= 3 and sorted(os.listdir(sharded)) == sorted([MANIFEST] + [s["path"] for s in shards])
    assert sum(s["num_samples"] for s in shards) == N
    start = 0
    for s in shards:
        path = os.path.join(sharded, s["path"])
        data = Path(path).read_bytes()
        assert s["bytes"] == len(data) <= parse_size(SHARD)
        assert s["sha256"] == hashlib.sha256(data).hexdigest()
        view = open_dataset(path)  # a complete .beton on its own
        assert view.format == "beton" and view.num_samples == s["num_samples"] and view.info == manifest["info"]
        region = view.open_region()
        for j in range(view.num_samples):
            assert bytes(view.payload("image", j, region)) == images[start + j].tobytes()
        assert view.metadata["label"].tolist() == labels[start : start + view.num_samples]
        start += view.num_samples
    # the whole dataset: the same fields, metadata and payload bytes as the unsharded file
    a, b = open_dataset(one), open_dataset(sharded)
    assert b.format == "shards" and b.num_samples == N and list(b.fields) == list(a.fields)
    assert b.info == a.info and b.page_size == a.page_size
    assert np.array_equal(a.metadata["label"], b.metadata["label"])
    assert np.array_equal(b.metadata["image"]["data_ptr"], b.ptrs["image"])  # pointers moved into the region
    ra, rb = a.open_region(), b.open_region()
    for i in range(N):
        assert bytes(a.payload("image", i, ra)) == bytes(b.payload("image", i, rb))
    # the gaps between shards read as zeros (a stray read there does not kill the process)
    layout = b.shards
    gap = slice(int(layout.bases[0] + layout.sizes[0]), int(layout.bases[1]))
    assert gap.stop > gap.start and not np.asarray(rb[gap]).any()
    head = open(layout.paths[1], "rb").read(4096)
    assert bytes(rb[int(layout.bases[1]) : int(layout.bases[1]) + 4096]) == head
    assert open_dataset(os.path.join(sharded, MANIFEST)).num_samples == N  # the manifest opens it too


def test_inspect_and_verify_go_through_the_sharded_view(converted):
    sharded = converted[1]
    count = len(json.loads(Path(sharded, MANIFEST).read_text("utf8"))["shards"])
    result = CliRunner().invoke(main, ["inspect", sharded, "--json"])
    assert result.exit_code == 0, result.output
    info = json.loads(result.output)
    assert info["format"] == "shards" and info["samples"] == N and len(info["shards"]) == count
    assert sum(s["samples"] for s in info["shards"]) == N
    text = CliRunner().invoke(main, ["inspect", sharded]).output
    assert f"shards    {count} " in text
    result = CliRunner().invoke(main, ["verify", sharded, "--quiet"])
    assert result.exit_code == 0 and f"all {N} samples decode" in result.output


def _epochs(path, order, os_cache, epochs=2, **kw):
    out = []
    with ffload.Loader(path, batch_size=16, num_workers=2, order=order, seed=5, os_cache=os_cache, **kw) as loader:
        for _ in range(epochs):
            out.append([(image.numpy().copy(), label.numpy().copy()) for image, label in loader])
    return out


def _page_groups(view) -> np.ndarray:
    """Each sample's page, renumbered 0, 1, ... in order of appearance (what the grouping is)."""
    return np.unique(view.sample_pages, return_inverse=True)[1]


CACHES = {
    "os": (True, None),  # the shards mapped into one range
    "blocks": (False, 3 * PAGE),  # a small block cache: blocks evicted
    "pool": (False, 16 * PAGE),
}  # quasi_random: the page pool (each page inside one shard)


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("cache", list(CACHES))
def test_sharded_loader_yields_the_unsharded_batches(converted, order, cache):
    from ffload.loaders.memory.os_cache import OSCacheMemory
    from ffload.loaders.memory.pagepool import PagePoolMemory
    from ffload.loaders.memory.process_cache import ProcessCacheMemory

    one, sharded, images, _ = converted
    os_cache, limit = CACHES[cache]
    with ffload.Loader(
        sharded, batch_size=16, num_workers=1, order=order, os_cache=os_cache, cache_limit=limit
    ) as loader:
        kind = {
            "os": OSCacheMemory,
            "blocks": ProcessCacheMemory,
            "pool": PagePoolMemory if order == "quasi_random" else ProcessCacheMemory,
        }[cache]
        assert type(loader.memory) is kind
    a = _epochs(one, order, os_cache, cache_limit=limit)
    b = _epochs(sharded, order, os_cache, cache_limit=limit)
    same_pages = np.array_equal(_page_groups(open_dataset(one)), _page_groups(open_dataset(sharded)))
    for epoch_a, epoch_b in zip(a, b):
        # every sample once per epoch, with its own bytes
        labels_b = np.concatenate([x for _, x in epoch_b])
        assert len(labels_b) == N
        for image, _ in epoch_b:
            assert image.shape == (len(image), SIDE, SIDE, 3)
        seen_b = sorted(bytes(img.tobytes()) for batch, _ in epoch_b for img in batch)
        seen_a = sorted(bytes(img.tobytes()) for batch, _ in epoch_a for img in batch)
        assert seen_a == seen_b == sorted(im.tobytes() for im in images)
        # SEQUENTIAL and RANDOM: the same batches; QUASI_RANDOM draws by page, and shards split
        # where the unsharded file starts a page, so the pages group the samples alike: the same too
        if order != "quasi_random" or same_pages:
            for (ia, la), (ib, lb) in zip(epoch_a, epoch_b):
                assert np.array_equal(ia, ib) and np.array_equal(la, lb)
    if order == "quasi_random":
        assert same_pages  # (the shard size of this dataset closes shards at page breaks)


def test_state_dict_resume_on_shards(converted):
    sharded = converted[1]
    reference = _epochs(sharded, "random", True, epochs=2)
    loader = ffload.Loader(sharded, batch_size=16, num_workers=2, order="random", seed=5)
    list(loader)
    it = iter(loader)
    for _ in range(5):
        next(it)
    state = loader.state_dict()
    loader.close()
    resumed = ffload.Loader(sharded, batch_size=16, num_workers=1, order="random", seed=5, os_cache=False)
    resumed.load_state_dict(state)
    rest = [(i.numpy().copy(), label.numpy().copy()) for i, label in resumed]
    resumed.close()
    assert len(rest) == len(reference[1]) - 5
    for (ia, la), (ib, lb) in zip(rest, reference[1][5:]):
        assert np.array_equal(ia, ib) and np.array_equal(la, lb)


def _rank_main(rank, path, init_file, out_dir):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        for order in ORDERS:
            with ffload.Loader(path, batch_size=8, num_workers=1, order=order, distributed=True, seed=3) as loader:
                seen = []
                for index, blob in loader:  # each sample's payload read from its shard
                    assert (blob.numpy() == index.numpy()[:, None].astype(np.uint8)).all()
                    seen.append(index.numpy().copy())
                np.save(os.path.join(out_dir, f"{order}-{rank}.npy"), np.concatenate(seen))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def test_distributed_split_covers_each_index_once(tmp_path):
    import torch.multiprocessing as mp

    n = 45  # odd: DistributedSampler pads one rank by one sample
    path = write_dataset(
        str(tmp_path / "ints"),
        {"index": IntField(), "blob": BytesField()},
        ((i, np.full(300_000, i, np.uint8)) for i in range(n)),
        n,
        page_size=PAGE,
        shard_size="5MiB",
    )
    assert len(open_dataset(path).shards.paths) >= 3
    mp.spawn(_rank_main, args=(path, str(tmp_path / "init"), str(tmp_path)), nprocs=2, join=True)
    for order in ORDERS:
        a, b = (np.load(tmp_path / f"{order}-{r}.npy") for r in range(2))
        assert len(a) == len(b) == -(-n // 2)
        together = np.concatenate([a, b])
        assert sorted(set(together.tolist())) == list(range(n))  # every index, and only the padding twice
        assert len(together) - len(set(together.tolist())) == 1


def test_a_sample_larger_than_the_shard_size_gets_its_own_shard(tmp_path):
    sizes = [1000, 3_000_000, 1000, 1000]
    dst = write_dataset(
        str(tmp_path / "big"),
        {"blob": BytesField()},
        ((np.full(s, i, np.uint8),) for i, s in enumerate(sizes)),
        len(sizes),
        page_size=PAGE,
        shard_size=5 << 20,
    )
    shards = json.loads(Path(dst, MANIFEST).read_text())["shards"]
    assert [s["num_samples"] for s in shards] == [1, 1, 2]
    assert shards[1]["bytes"] > 5 << 20  # its page grew to 4 MiB: alone, over the size
    view = open_dataset(dst)
    region = view.open_region()
    for i, s in enumerate(sizes):
        assert np.array_equal(view.payload("blob", i, region), np.full(s, i, np.uint8))


def test_metadata_rows_grow_past_the_first_page(tmp_path):
    """A shard reserves the rows its first page's padding holds; more samples double the room and
    move the data once (BetonWriter(reserve=...)); the file reads back whole."""
    from ffload.formats.beton import BetonWriter

    path = str(tmp_path / "grown.beton")
    with BetonWriter(path, {"label": IntField(), "blob": BytesField()}, 10, PAGE, reserve=3) as writer:
        for i in range(10):
            m1, _ = IntField().encode(i, i)
            m2, p2 = BytesField().encode(np.full(5 + i, i, np.uint8), i)
            assert writer.file_bytes_with([None, p2]) >= os.path.getsize(path)
            writer.add(i, [m1, m2], [None, p2])
    view = open_dataset(path)
    assert view.metadata["label"].tolist() == list(range(10))
    for i in range(10):
        assert np.array_equal(view.payload("blob", i), np.full(5 + i, i, np.uint8))


def test_truncated_missing_and_corrupt_shards(converted, tmp_path):
    import shutil

    sharded = str(tmp_path / "copy")
    shutil.copytree(converted[1], sharded)
    victim = os.path.join(sharded, "shard-00001.beton")
    good = Path(victim).read_bytes()
    # a flipped byte in a payload: the open (sizes) passes, verify's checksum names the shard
    bad = bytearray(good)
    view = open_dataset(victim)
    at = int(view.ptrs["image"][3]) + 10
    bad[at] ^= 0xFF
    Path(victim).write_bytes(bytes(bad))
    open_dataset(sharded)
    result = CliRunner().invoke(main, ["verify", sharded, "--quiet"])
    assert result.exit_code == 1
    assert "shard-00001.beton" in result.output and "sha256" in result.output
    # truncated: the open refuses it, naming the shard and both sizes
    Path(victim).write_bytes(good[:-100])
    with pytest.raises(FormatError, match=r"shard-00001\.beton.*truncated: .* the manifest says"):
        open_dataset(sharded)
    with pytest.raises(FormatError, match=r"shard-00001\.beton.*truncated"):
        ffload.Loader(sharded, batch_size=4)
    os.remove(victim)
    with pytest.raises(FormatError, match=r"shard-00001\.beton.*missing"):
        open_dataset(sharded)
    os.remove(os.path.join(sharded, MANIFEST))
    with pytest.raises(FormatError, match="no manifest.json"):
        open_dataset(sharded)


@pytest.mark.parametrize("os_cache", [True, False])
def test_a_shard_truncated_under_the_loader_is_named(converted, tmp_path, os_cache):
    import shutil

    sharded = str(tmp_path / "copy")
    shutil.copytree(converted[1], sharded)
    loader = ffload.Loader(sharded, batch_size=N, num_workers=1, order="sequential", os_cache=os_cache)
    victim = os.path.join(sharded, "shard-00002.beton")
    os.truncate(victim, os.path.getsize(victim) // 2)
    cause = (
        "the file shrank from .* bytes while it was being read"
        if os_cache
        else "shard ends at byte .* its manifest says"
    )
    with pytest.raises(LoaderError, match=rf"shard-00002\.beton:? {cause}"):
        next(iter(loader))
    loader.close()


def test_refusals(tmp_path):
    fields = {"label": IntField()}
    with pytest.raises(ConfigurationError, match="LMDB"):
        write_dataset(str(tmp_path / "x.lmdb"), fields, [(1,)], 1, shard_size="1GB")
    with pytest.raises(ConfigurationError, match="directory of .beton shards"):
        write_dataset(str(tmp_path / "x.beton"), fields, [(1,)], 1, shard_size="1GB")
    with pytest.raises(ConfigurationError, match="not a size"):
        write_dataset(str(tmp_path / "x"), fields, [(1,)], 1, shard_size="1 parsec")
    with pytest.raises(ConfigurationError, match="below two pages"):  # 8 MiB pages: 16 MiB at least
        write_dataset(str(tmp_path / "x"), fields, [(1,)], 1, shard_size="16MB")
    src = ffload.convert.sources.ArraySource(np.zeros((2, 8, 8, 3), np.uint8), np.arange(2))
    with pytest.raises(ConfigurationError, match="--resume .* not supported with --shard-size"):
        convert_dataset(src, str(tmp_path / "y"), shard_size="1GB", resume=True, progress=False)
    assert os.listdir(tmp_path) == []
    assert parse_size("1GB") == 10**9 and parse_size("512MiB") == 512 << 20 and parse_size(4096) == 4096
    assert parse_size("1.5 GiB") == 3 << 29


def test_interrupted_convert_leaves_no_destination(tmp_path):
    proc = start_slow_conversion(
        tmp_path / "out", "np.full((300, 300, 3), i % 256, np.uint8)", shard_size="5MB", page_size=PAGE
    )
    deadline = time.monotonic() + 30
    while not any(".tmp-" in n and os.listdir(tmp_path / n) for n in os.listdir(tmp_path)):
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.05)  # until the temporary directory holds a shard
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=30)
    assert proc.returncode != 0
    assert os.listdir(tmp_path) == []


def test_ffcv_reads_each_shard(converted):
    pytest.importorskip("ffcv", reason="ffcv 1.0.2 (extra 'ffcv') is not installed")
    from isolated import run_isolated

    run_isolated("test_shards", "ffcv_reads_shards", converted[0], converted[1])  # tests/isolated.py


def ffcv_reads_shards(one: str, sharded: str):
    """The body of :func:`test_ffcv_reads_each_shard`, run in a fresh process: ffcv's Loader over
    every shard gives the unsharded file's samples, in order."""
    from ffcv.fields.basics import IntDecoder
    from ffcv.fields.rgb_image import SimpleRGBImageDecoder
    from ffcv.loader import Loader, OrderOption

    def read(path):
        loader = Loader(
            path,
            batch_size=50,
            num_workers=1,
            order=OrderOption.SEQUENTIAL,
            drop_last=False,
            pipelines={"image": [SimpleRGBImageDecoder()], "label": [IntDecoder()]},
        )
        return [(np.asarray(i).copy(), np.asarray(lab).ravel().copy()) for i, lab in loader]

    whole = read(one)
    images = np.concatenate([i for i, _ in whole])
    labels = np.concatenate([lab for _, lab in whole])
    shards = json.loads(Path(sharded, MANIFEST).read_text())["shards"]
    start = 0
    for s in shards:
        got = read(os.path.join(sharded, s["path"]))
        got_images = np.concatenate([i for i, _ in got])
        assert len(got_images) == s["num_samples"]
        assert np.array_equal(got_images, images[start : start + s["num_samples"]])
        assert np.array_equal(np.concatenate([lab for _, lab in got]), labels[start : start + s["num_samples"]])
        start += s["num_samples"]
    assert start == len(images) == N


# ---- object storage ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def s3(converted):
    pytest.importorskip("s3fs")
    pytest.importorskip("moto.server")
    import logging

    from s3_server import s3_environment

    from ffload.storage import upload_file

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    with s3_environment("bkt") as server:
        for name in os.listdir(converted[1]):
            upload_file(os.path.join(converted[1], name), f"s3://bkt/ds/train/{name}")
        yield server


@pytest.mark.parametrize("url", ["s3://bkt/ds/train", "s3://bkt/ds/train/manifest.json"])
def test_remote_sharded_view_is_the_local_view(converted, s3, url):
    local, remote = open_dataset(converted[1]), open_dataset(url)
    assert remote.format == "shards" and remote.num_samples == N and remote.data_path is None
    assert np.array_equal(remote.metadata, local.metadata) and np.array_equal(remote.ptrs["image"], local.ptrs["image"])
    assert np.array_equal(remote.shards.bases, local.shards.bases) and remote.info == local.info
    shards = len(local.shards.paths)
    # the manifest (HEAD + GET), then per shard a HEAD and open_beton's few range reads
    assert remote.remote.requests <= 1 + 5 * shards


@pytest.mark.parametrize("order", ["random", "quasi_random"])
def test_remote_sharded_loader_equals_local(converted, s3, tmp_path, order):
    remote = ffload.Loader(
        "s3://bkt/ds/train",
        batch_size=4,
        num_workers=2,
        order=order,
        seed=5,
        cache_limit=5 * PAGE,
        cache_dir=str(tmp_path),
    )  # 5 of the data pages
    local = ffload.Loader(converted[1], batch_size=4, num_workers=2, order=order, seed=5)
    with remote, local:
        for _ in range(2):
            count = 0
            for (ia, la), (ib, lb) in zip(remote, local):
                assert np.array_equal(ia.numpy(), ib.numpy()) and np.array_equal(la.numpy(), lb.numpy())
                count += len(la)
            assert count == N


def remote_layout(fs, prefix: str) -> tuple[dict, list[str]]:
    """The manifest at ``prefix`` and every object under it (paths relative to ``prefix``)."""
    manifest = json.loads(fs.cat(f"{prefix}/{MANIFEST}").decode("utf8"))
    return manifest, sorted(p[len(prefix) + 1 :] for p in fs.find(prefix))


def test_remote_sharded_convert(converted, s3, tmp_path):
    src = os.path.join(os.path.dirname(converted[0]), "src")
    kw = dict(shard_size=SHARD, page_size=PAGE, num_workers=0, progress=False)
    report = convert_dataset(src, "s3://bkt/out/train", **kw)
    assert report.dst == "s3://bkt/out/train" and report.format == "shards"
    from ffload.storage import open_filesystem

    fs, _ = open_filesystem("s3://bkt/out/train")
    manifest, objects = remote_layout(fs, "bkt/out/train")
    # the shards in one version folder, the manifest naming them beside it
    version = {path.split("/")[0] for path in objects if path != MANIFEST}
    assert len(version) == 1 and version.pop().startswith("v-")
    assert objects == sorted([MANIFEST] + [entry["path"] for entry in manifest["shards"]])
    assert [os.path.basename(entry["path"]) for entry in manifest["shards"]] == sorted(
        name for name in os.listdir(converted[1]) if name != MANIFEST
    )
    remote, local = open_dataset("s3://bkt/out/train"), open_dataset(converted[1])
    assert np.array_equal(remote.metadata, local.metadata)
    with pytest.raises(FileExistsError):
        convert_dataset(src, "s3://bkt/out/train", shard_size=SHARD, progress=False)
    # a failed overwrite leaves the dataset there whole; one that succeeds deletes the old shards
    (tmp_path / "bad" / "0").mkdir(parents=True)
    (tmp_path / "bad" / "0" / "x.png").write_bytes(b"not a png")
    with pytest.raises(ffload.convert.ConvertError, match="x.png"):
        convert_dataset(str(tmp_path / "bad"), "s3://bkt/out/train", overwrite=True, **kw)
    assert remote_layout(fs, "bkt/out/train") == (manifest, objects)
    convert_dataset(src, "s3://bkt/out/train", overwrite=True, **dict(kw, shard_size="1GB"))
    new_manifest, new_objects = remote_layout(fs, "bkt/out/train")
    assert len(new_manifest["shards"]) == 1 and new_objects == sorted([MANIFEST, new_manifest["shards"][0]["path"]])
    assert np.array_equal(open_dataset("s3://bkt/out/train").metadata["label"], local.metadata["label"])


def test_bad_manifests_are_refused(tmp_path):
    dst = write_dataset(str(tmp_path / "d"), {"label": IntField()}, [(i,) for i in range(5)], 5, shard_size="1GB")
    path = os.path.join(dst, MANIFEST)
    good = json.loads(Path(path).read_text())
    cases = [
        ("{not json", "not UTF-8 JSON"),
        (dict(good, format="other"), "not a sharded dataset manifest"),
        (dict(good, version=2), "unsupported sharded dataset version 2"),
        (dict(good, num_samples=6), "says 6 samples but its shards add up to 5"),
        (dict(good, shards=[dict(good["shards"][0], path="../x.beton")]), "must be relative"),
        (dict(good, shards=[dict(good["shards"][0], num_samples=4)]), "says 5 samples but its shards add up to 4"),
        (
            dict(good, fields=[{"name": "label", "type": "FloatField", "type_id": 0, "arguments": {}}]),
            "fields .* differ from the manifest's",
        ),
    ]
    for content, message in cases:
        Path(path).write_text(content if isinstance(content, str) else json.dumps(content))
        with pytest.raises(FormatError, match=message):
            open_dataset(dst)


def test_overwrite_swaps_the_whole_directory_and_the_cli_refuses_lmdb(tmp_path):
    fields = {"index": IntField(), "blob": BytesField()}
    samples = [(i, np.full(300_000, i, np.uint8)) for i in range(30)]
    dst = write_dataset(str(tmp_path / "d"), fields, samples, 30, page_size=PAGE, shard_size="5MiB")
    many = len(json.loads(Path(dst, MANIFEST).read_text())["shards"])
    with pytest.raises(FileExistsError):
        write_dataset(dst, fields, samples, 30, page_size=PAGE, shard_size="1GB")
    write_dataset(dst, fields, samples, 30, page_size=PAGE, shard_size="1GB", overwrite=True)
    assert many > 1 and sorted(os.listdir(dst)) == [MANIFEST, "shard-00000.beton"]  # no shard of the old one left
    assert sorted(os.listdir(tmp_path)) == ["d"]
    view = open_dataset(dst)
    assert view.metadata["index"].tolist() == list(range(30))
    result = CliRunner().invoke(
        main, ["convert", str(tmp_path / "src"), str(tmp_path / "x.lmdb"), "--shard-size", "1GB"]
    )
    assert result.exit_code == 1 and "LMDB" in result.output


@pytest.mark.parametrize("unit", [1, 16])
def test_sharded_read_ahead_advises_inside_the_shards(converted, unit):
    """The read-ahead over the shards' one address range: the kernel takes every call (a run
    of 16-page units may reach into the reserved gap after a shard) and the runs asked for hold
    every payload of the batch."""
    from ffload.loaders.memory.readahead import ADVISE_PAGE, ReadAhead
    from ffload.loaders.memory.schedule import batch_blocks, payload_columns

    _, sharded, _, _ = converted
    view = open_dataset(sharded)
    columns = payload_columns(view, ["image"])
    for path in view.shards.paths:  # out of the page cache: a batch found there is not asked for
        fd = os.open(path, os.O_RDONLY)
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
    ahead = ReadAhead(view.shards, view.data_size, columns, 1 << 30, record=True, unit=unit * ADVISE_PAGE)
    batch = np.random.default_rng(0).permutation(view.num_samples)[:16]
    try:
        asked = ahead._request(batch, 0)  # on this thread: the IO thread has nothing scheduled
    finally:
        ahead.close()
    assert ahead.refused == 0 and asked == sum(n for _, n in ahead.requested) > 0
    covered = {u for off, n in ahead.requested for u in range(off // ahead.unit, -(-(off + n) // ahead.unit))}
    assert set(batch_blocks(columns, batch, ahead.unit).tolist()) == covered
