"""ffload convert with s3:// SRC and DST against a real S3 server (moto on 127.0.0.1)."""

from __future__ import annotations

import json
import logging
import os
import tempfile

import cv2
import numpy as np
import pytest

pytest.importorskip("s3fs")
pytest.importorskip("moto.server")

from click.testing import CliRunner  # noqa: E402
from s3_server import s3_environment  # noqa: E402

from ffload.cli import main  # noqa: E402
from ffload.convert import convert_dataset  # noqa: E402
from ffload.convert.sources import ImageFolderSource, detect_source  # noqa: E402
from ffload.errors import ConfigurationError, ConvertError, SourceError, StorageError  # noqa: E402
from ffload.formats import open_dataset  # noqa: E402
from ffload.storage import open_filesystem, remote_exists  # noqa: E402

CLASSES = {"cat": 7, "dog": 5, "emu": 6}


def _make_folder(root, corrupt: str | None = None) -> None:
    rng = np.random.default_rng(1)
    for cls, count in CLASSES.items():
        for k in range(count):
            sub = root / cls / ("nested" if k % 3 == 2 else "")
            sub.mkdir(parents=True, exist_ok=True)
            rgb = rng.integers(0, 256, (24 + k, 32, 3), dtype=np.uint8)
            ext = ".jpg" if k % 2 else ".png"
            cv2.imwrite(str(sub / f"im{k:02d}{ext}"), cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR))
    (root / "cat" / "notes.txt").write_text("not an image")
    (root / "dog" / ".hidden.png").write_bytes(b"skipped")
    if corrupt:
        (root / corrupt).write_bytes(b"\xff\xd8\xff\xe0 truncated jpeg")


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    root = tmp_path_factory.mktemp("folder") / "imgs"
    bad = tmp_path_factory.mktemp("bad") / "imgs"
    _make_folder(root)
    _make_folder(bad, corrupt="dog/im01b.jpg")
    with s3_environment("bkt") as server:
        fs, _ = open_filesystem("s3://bkt/x")
        fs.put(str(root), "bkt/folder", recursive=True)
        fs.put(str(bad), "bkt/badfolder", recursive=True)
        server.root, server.bad = root, bad
        yield server


def test_remote_image_folder_lists_once_in_torchvision_order(s3):
    lists = s3.lists
    remote = detect_source("s3://bkt/folder")
    assert s3.lists - lists == 1
    local = ImageFolderSource(s3.root)
    assert remote.classes == local.classes and np.array_equal(remote.labels, local.labels)
    assert [remote.describe(i)[len("s3://bkt/folder/") :] for i in range(len(remote))] == [
        os.path.relpath(p, s3.root) for p, _ in local.samples
    ]
    for i in (0, 6, len(local) - 1):
        assert remote.encoded(i) == local.encoded(i)
        assert np.array_equal(remote[i][0], local[i][0]) and remote[i][1] == local[i][1]


def test_remote_source_errors(s3):
    with pytest.raises(SourceError, match=r"s3://bkt/nothing: no objects"):
        detect_source("s3://bkt/nothing")
    with pytest.raises(ConfigurationError, match="only ImageFolder"):
        detect_source("s3://bkt/folder", kind="cifar10")
    with pytest.raises(StorageError, match=r"s3://no-such-bucket/x: cannot list it: no such object or bucket"):
        detect_source("s3://no-such-bucket/x")


@pytest.mark.parametrize("workers", [0, 2])
def test_convert_remote_to_remote_is_the_local_conversion(s3, tmp_path, workers):
    dst = f"s3://bkt/out/w{workers}/train.beton"
    options = json.dumps(s3.storage_options())
    result = CliRunner().invoke(
        main,
        [
            "convert",
            "s3://bkt/folder",
            dst,
            "--write-mode",
            "jpg",
            "--quiet",
            "--num-workers",
            str(workers),
            "--storage-options",
            options,
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["samples"] == sum(CLASSES.values())
    convert_dataset(str(s3.root), str(tmp_path / "local.beton"), write_mode="jpg", num_workers=0, progress=False)
    fs, path = open_filesystem(dst)
    assert fs.cat_file(path) == (tmp_path / "local.beton").read_bytes()
    assert open_dataset(dst).info.get("classes") == sorted(CLASSES)  # the info block, read remotely
    again = CliRunner().invoke(main, ["convert", "s3://bkt/folder", dst, "--quiet", "--num-workers", "0"])
    assert again.exit_code == 1 and "already exists" in again.output


def test_convert_remote_source_to_local(s3, tmp_path):
    report = convert_dataset("s3://bkt/folder", str(tmp_path / "a.beton"), num_workers=0, progress=False)
    convert_dataset(str(s3.root), str(tmp_path / "b.beton"), num_workers=0, progress=False)
    assert report.samples == sum(CLASSES.values())
    assert (tmp_path / "a.beton").read_bytes() == (tmp_path / "b.beton").read_bytes()


def test_failed_conversion_leaves_no_object(s3, tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dst = "s3://bkt/out/failed.beton"
    with pytest.raises(ConvertError, match=r"s3://bkt/badfolder/dog/im01b\.jpg"):
        convert_dataset("s3://bkt/badfolder", dst, num_workers=0, progress=False)
    assert not remote_exists(dst)
    with pytest.raises(StorageError, match=r"s3://no-such-bucket/x\.beton: cannot upload"):
        convert_dataset("s3://bkt/folder", "s3://no-such-bucket/x.beton", num_workers=0, progress=False)
    assert os.listdir(tmp_path) == []  # the local temporary output is gone too
    with pytest.raises(ConfigurationError, match="only .beton outputs"):
        convert_dataset("s3://bkt/folder", "s3://bkt/out/x.lmdb", num_workers=0, progress=False)
    report = convert_dataset("s3://bkt/badfolder", dst, num_workers=0, progress=False, on_error="skip")
    assert report.skipped[0][0] == "s3://bkt/badfolder/dog/im01b.jpg" and remote_exists(dst)


def test_storage_options_must_be_a_json_object():
    result = CliRunner().invoke(main, ["convert", "s3://bkt/folder", "x.beton", "--storage-options", "[1]"])
    assert result.exit_code == 2 and "JSON object" in result.output
