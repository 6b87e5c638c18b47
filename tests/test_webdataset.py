"""WebDataset shards: read as a conversion source (brace patterns, WebDataset's key/extension
layout, cls/json labels) and written by ``export_webdataset``, round-trip tested."""

from __future__ import annotations

import io
import json
import os
import tarfile

import cv2
import numpy as np
import pytest
from skimage import data

from ffload.convert import convert_dataset
from ffload.convert.export import export_webdataset
from ffload.convert.sources import SourceError
from ffload.convert.sources.webdataset import WebDatasetSource, expand_shards
from ffload.formats import IntField, JSONField, RGBImageField, open_dataset, write_dataset


def _photos(n=10):
    img = data.astronaut()
    return [np.ascontiguousarray(img[8 * k : 8 * k + 40 + k, 5 * k : 5 * k + 32]) for k in range(n)]


def _add(tar, name, blob):
    info = tarfile.TarInfo(name)
    info.size = len(blob)
    tar.addfile(info, io.BytesIO(blob))


def _png(rgb):
    return cv2.imencode(".png", cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR))[1].tobytes()


def test_hand_written_shards_in_webdatasets_layout(tmp_path):
    photos = _photos(6)
    for s in range(2):
        with tarfile.open(tmp_path / f"train-{s:06d}.tar", "w") as tar:
            _add(tar, "._hidden.jpg", b"junk")  # macOS resource fork: ignored
            for k in range(3 * s, 3 * s + 3):
                key = f"n01/img_{k:04d}"
                _add(tar, f"{key}.PNG", _png(photos[k]))  # extensions compare lower-case
                if k % 2:
                    _add(tar, f"{key}.json", json.dumps({"label": k % 3, "w": 1}).encode())
                else:
                    _add(tar, f"{key}.cls", f"{k % 3}\n".encode())
                _add(tar, f"{key}.txt", b"a caption, ignored")
    (tmp_path / "classes.txt").write_text("a\nb\nc\n")
    src = WebDatasetSource(str(tmp_path / "train-{000000..000001}.tar"))
    assert len(src) == 6 and src.classes == ["a", "b", "c"]
    assert src.labels.tolist() == [k % 3 for k in range(6)]
    for k in range(6):
        image, label = src[k]
        np.testing.assert_array_equal(image, photos[k])
        assert label == k % 3
    assert src.describe(4).endswith("train-000001.tar:n01/img_0004")
    out = convert_dataset(src, str(tmp_path / "w.beton"), write_mode="raw", num_workers=2, progress=False)
    assert out.samples == 6 and out.classes == 3
    view = open_dataset(str(tmp_path / "w.beton"))
    assert view.metadata["label"].tolist() == [k % 3 for k in range(6)]


def test_missing_label_and_compressed_shards_are_named(tmp_path):
    with tarfile.open(tmp_path / "a.tar", "w") as tar:
        _add(tar, "x1.jpg", b"")
    with pytest.raises(SourceError, match=r"a\.tar:x1: no label member"):
        WebDatasetSource(str(tmp_path / "a.tar"))
    (tmp_path / "b.tar").write_bytes(b"not a tar at all" * 64)
    with pytest.raises(SourceError, match=r"b\.tar: not a tar archive, nor a gzipped one"):
        WebDatasetSource(str(tmp_path / "b.tar"))
    with pytest.raises(SourceError, match="missing"):
        expand_shards(str(tmp_path / "c-{0..3}.tar"))


def _gz_shards(folder, photos, suffix):
    """Two gzipped shards of ``photos`` (keys ``s<shard>/<k>``, label ``k % 3``), written by tarfile."""
    paths = []
    for s in range(2):
        path = folder / f"part-{s}{suffix}"
        with tarfile.open(path, "w:gz") as tar:
            for k in range(3 * s, 3 * s + 3):
                _add(tar, f"s{s}/{k:03d}.png", _png(photos[k]))
                _add(tar, f"s{s}/{k:03d}.cls", str(k % 3).encode())
        paths.append(str(path))
    return paths


@pytest.mark.parametrize("suffix", [".tar.gz", ".tgz"])
def test_gzipped_shards_are_read(tmp_path, suffix):
    photos = _photos(6)
    paths = _gz_shards(tmp_path, photos, suffix)
    src = WebDatasetSource(str(tmp_path))  # a folder: both shards found by their suffix
    assert src.shards == paths and len(src) == 6 and src.labels.tolist() == [k % 3 for k in range(6)]
    for k in range(6):
        np.testing.assert_array_equal(src[k][0], photos[k])
    assert src.describe(4) == f"{paths[1]}:s1/004"  # messages name the shard as given
    copies = set(src.copies.paths.values())
    assert len(copies) == 2 and all(os.path.exists(c) for c in copies)
    out = convert_dataset(
        str(tmp_path / f"part-{{0..1}}{suffix}"), str(tmp_path / "w.beton"), num_workers=2, progress=False
    )  # auto-detection of a gzipped pattern, forked workers
    assert out.samples == 6
    view = open_dataset(str(tmp_path / "w.beton"))
    assert view.metadata["label"].tolist() == [k % 3 for k in range(6)]
    region = view.open_region()
    for k in range(6):
        np.testing.assert_array_equal(view.payload("image", k, region).reshape(photos[k].shape), photos[k])
    del src, out
    import gc

    gc.collect()
    assert not any(os.path.exists(c) for c in copies)  # the temporary copies go with the source


def test_gzipped_shard_copy_is_made_again_where_missing(tmp_path):
    import pickle

    photos = _photos(6)
    _gz_shards(tmp_path, photos, ".tar.gz")
    src = WebDatasetSource(str(tmp_path))
    other = pickle.loads(pickle.dumps(src))  # as a Ray worker on another node gets it
    for copy in src.copies.paths.values():
        os.unlink(copy)
    np.testing.assert_array_equal(other[5][0], photos[5])
    assert other.copies.paths[src.shards[1]] != src.copies.paths[src.shards[1]]


def test_gzipped_shard_errors_name_the_shard(tmp_path):
    photos = _photos(6)
    paths = _gz_shards(tmp_path, photos, ".tar.gz")
    whole = open(paths[1], "rb").read()
    open(paths[1], "wb").write(whole[: len(whole) // 2])
    with pytest.raises(SourceError, match=r"part-1\.tar\.gz: corrupt or truncated gzip stream"):
        WebDatasetSource(str(tmp_path))
    import gzip

    with gzip.open(paths[1], "wb") as f:
        f.write(b"gzip, but no tar inside" * 100)
    with pytest.raises(SourceError, match=r"part-1\.tar\.gz: not a tar archive, nor a gzipped one"):
        WebDatasetSource(str(tmp_path))


def test_source_kind_messages_for_shards_and_folders(tmp_path):
    from ffload.convert.sources import detect_source

    photos = _photos(6)
    paths = _gz_shards(tmp_path, photos, ".tgz")
    assert isinstance(detect_source(paths[0], kind="webdataset"), WebDatasetSource)
    assert isinstance(detect_source(paths[0]), WebDatasetSource)  # auto-detected, not "is a file"
    (tmp_path / "folder" / "cat").mkdir(parents=True)
    with pytest.raises(SourceError, match=r"asked for webdataset, but this is not WebDataset shards \(a \.tar"):
        detect_source(str(tmp_path / "folder"), kind="webdataset")
    with pytest.raises(SourceError, match="asked for cifar10, but this is WebDataset shards, not a CIFAR-10"):
        detect_source(paths[0], kind="cifar10")


def test_gzipped_shards_read_back_by_webdataset(tmp_path):
    wds = pytest.importorskip("webdataset")
    photos = _photos(6)
    paths = _gz_shards(tmp_path, photos, ".tar.gz")
    ours = WebDatasetSource(str(tmp_path))
    theirs = list(wds.WebDataset(paths, shardshuffle=False))
    assert [s["__key__"] for s in theirs] == ["s0/000", "s0/001", "s0/002", "s1/003", "s1/004", "s1/005"]
    for k, sample in enumerate(theirs):
        assert sample["png"] == ours.encoded(k) and int(sample["cls"]) == ours.labels[k]


@pytest.mark.parametrize("mode", ["raw", "jpg"])
def test_export_round_trip(tmp_path, mode):
    photos = _photos(10)
    src = str(tmp_path / "d.beton")
    write_dataset(
        src,
        {"image": RGBImageField(mode, jpeg_quality=90), "label": IntField(), "meta": JSONField()},
        [(p, k % 4, {"k": k}) for k, p in enumerate(photos)],
        len(photos),
    )
    view = open_dataset(src)
    shards = export_webdataset(view, str(tmp_path / "out" / "train-%06d.tar"), maxcount=4)
    assert [os.path.basename(s) for s in shards] == ["train-000000.tar", "train-000001.tar", "train-000002.tar"]
    assert not [f for f in os.listdir(tmp_path / "out") if ".tmp" in f]
    back = WebDatasetSource(str(tmp_path / "out" / "train-{000000..000002}.tar"))
    assert back.labels.tolist() == [k % 4 for k in range(10)]
    region = view.open_region()
    for k in range(10):
        image, _ = back[k]
        if mode == "raw":
            np.testing.assert_array_equal(image, photos[k])  # lossless
        else:  # the stored JPEG travels as it is
            assert back.encoded(k) == view.payload("image", k, region).tobytes()
    with tarfile.open(shards[0]) as tar:
        names = tar.getnames()
        assert names[:3] == ["00000000.jpg" if mode == "jpg" else "00000000.png", "00000000.cls", "00000000.meta.json"]
        assert json.loads(tar.extractfile("00000001.meta.json").read()) == {"k": 1}


def test_export_leaves_nothing_when_it_fails(tmp_path):
    photos = _photos(6)
    src = str(tmp_path / "d.beton")
    write_dataset(src, {"image": RGBImageField("raw"), "label": IntField()}, [(p, 0) for p in photos], len(photos))
    view = open_dataset(src)
    out = tmp_path / "out"
    out.mkdir()
    (out / f"train-000001.tar.tmp{os.getpid()}").mkdir()  # the second shard cannot be created
    with pytest.raises(OSError):
        export_webdataset(view, str(out / "train-%06d.tar"), maxcount=3)
    assert sorted(os.listdir(out)) == [f"train-000001.tar.tmp{os.getpid()}"]
    with pytest.raises(ValueError, match="%d"):
        export_webdataset(view, str(out / "train.tar"))


def test_cli_export_then_convert_detects_the_shards(tmp_path):
    from click.testing import CliRunner

    from ffload.cli import main

    photos = _photos(5)
    src = str(tmp_path / "d.beton")
    write_dataset(
        src, {"image": RGBImageField("raw"), "label": IntField()}, [(p, k) for k, p in enumerate(photos)], len(photos)
    )
    runner = CliRunner()
    out = runner.invoke(main, ["export", src, str(tmp_path / "s" / "part-%03d.tar"), "--maxcount", "2", "--quiet"])
    assert out.exit_code == 0, out.output
    assert "3 shard(s)" in out.output
    back = runner.invoke(
        main,
        [
            "convert",
            str(tmp_path / "s" / "part-{000..002}.tar"),
            str(tmp_path / "b.lmdb"),
            "--quiet",
            "--num-workers",
            "0",
        ],
    )
    assert back.exit_code == 0, back.output
    view = open_dataset(str(tmp_path / "b.lmdb"))
    assert view.num_samples == 5 and view.metadata["label"].tolist() == list(range(5))


def test_remade_copies_of_same_named_shards_never_share_a_path(tmp_path):
    import pickle

    photos = _photos(6)
    for s, folder in enumerate(("a", "b")):  # a/s.tar.gz and b/s.tar.gz: one file name, two shards
        (tmp_path / folder).mkdir()
        with tarfile.open(tmp_path / folder / "s.tar.gz", "w:gz") as tar:
            for k in range(3 * s, 3 * s + 3):
                _add(tar, f"{k:03d}.png", _png(photos[k]))
                _add(tar, f"{k:03d}.cls", b"0")
    src = WebDatasetSource(str(tmp_path / "{a,b}/s.tar.gz"))
    other = pickle.loads(pickle.dumps(src))  # a worker on another node: it remakes both copies
    for copy in src.copies.paths.values():
        os.unlink(copy)
    np.testing.assert_array_equal(other[0][0], photos[0])
    np.testing.assert_array_equal(other[3][0], photos[3])  # remakes b's copy after a's was remade
    other._files.clear()  # a fresh worker process: reads a's copy again
    np.testing.assert_array_equal(other[1][0], photos[1])
    assert len(set(other.copies.paths.values())) == 2


def test_copies_left_by_dead_processes_are_removed(tmp_path, monkeypatch):
    import subprocess
    import sys
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True
    ).stdout.strip()
    (tmp_path / "tmp" / f"ffload-wds-{dead}-x1y2" / "sub").mkdir(parents=True)  # SIGKILLed: left behind
    (tmp_path / "tmp" / f"ffload-wds-{os.getppid()}-k3m4").mkdir()  # its process lives: kept
    (tmp_path / "tmp" / "ffload-wds-other").mkdir()  # no pid in the name: not ours to judge
    photos = _photos(6)
    _gz_shards(tmp_path, photos, ".tar.gz")
    src = WebDatasetSource(str(tmp_path))
    left = sorted(os.listdir(tmp_path / "tmp"))
    assert f"ffload-wds-{dead}-x1y2" not in left
    assert f"ffload-wds-{os.getppid()}-k3m4" in left and "ffload-wds-other" in left
    ours = [e for e in left if e.startswith(f"ffload-wds-{os.getpid()}-")]
    assert len(ours) == 1 and all(
        os.path.dirname(c) == str(tmp_path / "tmp" / ours[0]) for c in src.copies.paths.values()
    )


def test_image_folder_with_a_stray_gzipped_tar_is_not_taken_for_shards(tmp_path):
    from ffload.convert.sources import ImageFolderSource, detect_source

    photos = _photos(6)
    (tmp_path / "cat").mkdir()
    (tmp_path / "cat" / "0.png").write_bytes(_png(photos[0]))
    _gz_shards(tmp_path, photos, ".tar.gz")  # left in the root (a backup, a download)
    with pytest.raises(
        SourceError,
        match=r"both WebDataset shards \(part-0\.tar\.gz.*\) and an ImageFolder "
        r"\(cat/.*--source webdataset or --source imagefolder",
    ):
        detect_source(str(tmp_path))
    assert isinstance(detect_source(str(tmp_path), kind="imagefolder"), ImageFolderSource)
    assert isinstance(detect_source(str(tmp_path), kind="webdataset"), WebDatasetSource)
    (tmp_path / "cat" / "0.png").unlink()  # a subfolder without images: the shards it is
    assert isinstance(detect_source(str(tmp_path)), WebDatasetSource)


def test_export_keeps_long_keys_and_never_writes_members_outside_their_folder(tmp_path):
    photos = _photos(6)
    long_key = "/".join(["d" * 120] * 3) + "/img"  # 367 bytes: more than ustar holds
    keys = [long_key, "../../evil", "/etc/x", "a/./b/../c", "x//y", "plain"]
    with tarfile.open(tmp_path / "in.tar", "w", format=tarfile.PAX_FORMAT) as tar:
        for key, photo in zip(keys, photos):
            _add(tar, f"{key}.png", _png(photo))
            _add(tar, f"{key}.cls", b"1")
    src = WebDatasetSource(str(tmp_path / "in.tar"))
    convert_dataset(src, str(tmp_path / "d.beton"), write_mode="raw", num_workers=1, progress=False)
    shards = export_webdataset(open_dataset(str(tmp_path / "d.beton")), str(tmp_path / "out" / "s-%02d.tar"))
    with tarfile.open(shards[0]) as tar:
        names = [n for n in tar.getnames() if n.endswith(".png")]
    assert names == [f"{long_key}.png", "evil.png", "etc/x.png", "a/b/c.png", "x/y.png", "plain.png"]
    back = WebDatasetSource(shards[0])
    for k in range(6):
        np.testing.assert_array_equal(back[k][0], photos[k])
