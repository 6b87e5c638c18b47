"""Walking a hostile ImageFolder: symlink loops, FIFOs and sockets named like images, folders that cannot be
listed, dangling links. Nothing blocks, nothing is duplicated, nothing is dropped without a line in the report,
and every input is either written or skipped (in = written + skipped)."""

from __future__ import annotations

import os
import socket

import cv2
import numpy as np
import pytest

from ffload.convert import convert_dataset
from ffload.convert.images import load_image
from ffload.convert.sources import ImageFolderSource
from ffload.errors import ConvertError, ImageDecodeError


def _tree(root, counts=(("a", 2), ("b", 3))):
    for cls, n in counts:
        (root / cls).mkdir(parents=True)
        for i in range(n):
            cv2.imwrite(str(root / cls / f"{i}.png"), np.full((6, 6, 3), i, np.uint8))
    return root


def test_a_symlink_to_the_parent_is_not_followed_again_and_is_listed(tmp_path):
    root = _tree(tmp_path / "src")
    os.symlink("..", root / "a" / "up")  # a/up -> src: torchvision walks src/a/up/a/up/... 40 levels
    os.symlink(root / "b", root / "a" / "also_b")
    src = ImageFolderSource(root)
    assert len(src) == 5 and sorted(src.labels.tolist()) == [0, 0, 1, 1, 1]
    causes = dict(src.left_out)
    assert sorted(causes) == [str(root / "a" / "also_b"), str(root / "a" / "up")]
    assert f"already walked as {root / 'b'}" in causes[str(root / "a" / "also_b")]
    assert src.unreadable == []


def test_two_folders_linking_to_each_other_terminate(tmp_path):
    root = _tree(tmp_path / "src")
    (root / "a" / "x").mkdir()
    (root / "a" / "y").mkdir()
    os.symlink("../y", root / "a" / "x" / "to_y")
    os.symlink("../x", root / "a" / "y" / "to_x")
    cv2.imwrite(str(root / "a" / "x" / "deep.png"), np.zeros((4, 4, 3), np.uint8))
    src = ImageFolderSource(root)
    paths = [p for p, _ in src.samples]
    assert len(paths) == 6 and len({os.path.realpath(p) for p in paths}) == 6


@pytest.mark.parametrize("kind", ["fifo", "socket"])
def test_special_files_named_like_images_are_listed_never_opened(tmp_path, kind):
    root = _tree(tmp_path / "src")
    special = root / "a" / "z.jpg"
    if kind == "fifo":
        os.mkfifo(special)
    else:
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(special))
    src = ImageFolderSource(root)
    assert len(src) == 5
    assert [p for p, _ in src.left_out] == [str(special)]
    assert "not a regular file" in src.left_out[0][1]
    report = convert_dataset(src, str(tmp_path / "o.beton"), num_workers=0, progress=False)  # fail mode
    assert report.samples == 5 and [p for p, _ in report.skipped] == [str(special)]
    with pytest.raises(ImageDecodeError, match=r"z\.jpg: (not a regular file|cannot read)"):  # never waited on
        load_image(special)


def _deny(monkeypatch, denied: str):
    real = os.scandir

    def scandir(path="."):
        if os.fspath(path) == denied:
            raise PermissionError(13, "Permission denied", denied)
        return real(path)

    monkeypatch.setattr(os, "scandir", scandir)


def test_an_unreadable_subfolder_fails_under_fail_and_is_listed_under_skip(tmp_path, monkeypatch):
    root = _tree(tmp_path / "src")
    (root / "b" / "private").mkdir()
    cv2.imwrite(str(root / "b" / "private" / "p.png"), np.zeros((4, 4, 3), np.uint8))
    _deny(monkeypatch, str(root / "b" / "private"))  # as chmod 000 does for a non-root user
    src = ImageFolderSource(root)
    assert src.unreadable == [(str(root / "b" / "private"), "cannot list the folder (Permission denied)")]
    with pytest.raises(ConvertError, match=r"private: cannot list the folder \(Permission denied\)"):
        convert_dataset(src, str(tmp_path / "o.beton"), num_workers=0, progress=False)
    assert not (tmp_path / "o.beton").exists()
    report = convert_dataset(src, str(tmp_path / "o.beton"), num_workers=0, progress=False, on_error="skip")
    assert report.samples == 5 and report.skipped == src.unreadable
    assert report.as_dict()["skipped"] == [
        {
            "input": str(root / "b" / "private"),
            "cause": "cannot list the folder (Permission denied)",
            "origin": "b/private",
        }
    ]  # relative to the root, as samples


def test_an_unreadable_class_folder_is_an_error_not_an_empty_class(tmp_path, monkeypatch):
    root = _tree(tmp_path / "src")
    _deny(monkeypatch, str(root / "a"))
    src = ImageFolderSource(root)
    assert src.classes == ["a", "b"] and len(src) == 3 and src.unreadable[0][0] == str(root / "a")
    with pytest.raises(ConvertError, match="Permission denied"):
        convert_dataset(src, str(tmp_path / "o.lmdb"), num_workers=0, progress=False)


def test_dangling_link_and_unreadable_file_are_counted(tmp_path, monkeypatch):
    root = _tree(tmp_path / "src")
    os.symlink(root / "gone.png", root / "a" / "dangling.png")
    (root / "b" / "bad.png").write_bytes(b"\x89PNG\r\n\x1a\n")  # truncated: skipped at decode time
    src = ImageFolderSource(root)
    assert src.unreadable == [(str(root / "a" / "dangling.png"), "dangling symbolic link")]
    with pytest.raises(ConvertError, match="dangling symbolic link"):
        convert_dataset(src, str(tmp_path / "o.beton"), num_workers=0, progress=False)
    report = convert_dataset(src, str(tmp_path / "o.beton"), num_workers=0, progress=False, on_error="skip")
    inputs = 5 + 2  # five images, the dangling link, the truncated file
    assert report.samples + len(report.skipped) == inputs
    assert {p for p, _ in report.skipped} == {str(root / "a" / "dangling.png"), str(root / "b" / "bad.png")}
