"""Conversion with ``engine='ray'``: the same output as a local conversion, bad inputs and failed
Ray tasks reported by file. A local Ray instance (2 CPUs, loopback, no dashboard) per module."""
from __future__ import annotations

import importlib.util
import os
import shutil
import sys

import lmdb
import numpy as np
import pytest
from click.testing import CliRunner

from ffload.cli import main
from ffload.convert import ConvertError, convert_dataset
from ffload.convert.sources import ImageFolderSource, IndexableSource
from ffload.errors import ConfigurationError

needs_ray = pytest.mark.skipif(importlib.util.find_spec("ray") is None,
                               reason="ray is not installed (pip install 'ffload[ray]')")


@pytest.fixture(scope="module")
def ray_instance():
    import ray
    ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1",
             log_to_driver=False, configure_logging=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """The demo ImageFolder (crops of scikit-image / scikit-learn photos; JPEG, grayscale JPEG, PNG)
    plus one corrupt JPEG."""
    from ffload.convert.demo_data import build_photos_folder
    root = tmp_path_factory.mktemp("ray") / "photos"
    build_photos_folder(root, n_per_class=4)
    bad = root / "camera" / "camera_0001b.JPEG"
    bad.write_bytes(b"\xff\xd8\xff\xe0 not a jpeg")
    return root


def lmdb_items(path) -> dict[bytes, bytes]:
    env = lmdb.open(str(path), readonly=True, lock=False, subdir=True)
    with env.begin() as txn:
        items = dict(txn.cursor())
    env.close()
    return items


def same_output(a, b) -> bool:
    if str(a).endswith(".lmdb"):
        items = lmdb_items(a)
        return len(items) > 0 and items == lmdb_items(b)
    return a.read_bytes() == b.read_bytes()


@needs_ray
@pytest.mark.parametrize("suffix,write_mode", [(".beton", "jpg"), (".beton", "raw"), (".lmdb", "smart")])
def test_ray_output_is_the_local_output(tmp_path, photos, ray_instance, suffix, write_mode):
    local, remote = tmp_path / f"local{suffix}", tmp_path / f"ray{suffix}"
    kw = dict(write_mode=write_mode, smart_threshold=20_000, on_error="skip", progress=False)
    a = convert_dataset(photos, str(local), num_workers=2, **kw)
    b = convert_dataset(photos, str(remote), engine="ray", chunk_size=5, **kw)
    assert same_output(local, remote)
    assert b.samples == a.samples == 44
    assert (b.label_counts == a.label_counts).all()
    assert (b.passed_through, b.reencoded) == (a.passed_through, a.reencoded)
    assert b.skipped == a.skipped
    assert len(b.skipped) == 1 and b.skipped[0][0].endswith("camera_0001b.JPEG")


@needs_ray
def test_bad_input_fails_by_name(tmp_path, photos, ray_instance):
    with pytest.raises(ConvertError, match="camera_0001b.JPEG"):
        convert_dataset(photos, str(tmp_path / "x.beton"), engine="ray", progress=False)
    assert not (tmp_path / "x.beton").exists()


class _Images:
    """Eight 8x8 images; ``__getitem__(crash)`` kills the process it runs in unless that is ``driver``
    (every time, or with ``once`` a path: only while that file does not exist yet)."""

    def __init__(self, crash: int, driver: int, once: str | None = None):
        self.crash, self.driver, self.once, self.targets = crash, driver, once, [i % 2 for i in range(8)]

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i):
        if i == self.crash and os.getpid() != self.driver:
            if self.once is None:
                os._exit(1)
            if not os.path.exists(self.once):
                open(self.once, "w").close()
                os._exit(1)
        return np.full((8, 8, 3), i, np.uint8), self.targets[i]


@needs_ray
def test_a_task_whose_worker_died_once_is_retried(tmp_path, ray_instance):
    ray_instance.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import this test
    marker = tmp_path / "died"
    source = IndexableSource(_Images(crash=5, driver=os.getpid(), once=str(marker)), name="images")
    report = convert_dataset(source, str(tmp_path / "ray.beton"), engine="ray", chunk_size=4, progress=False)
    assert marker.exists() and report.samples == 8 and not report.skipped
    convert_dataset(source, str(tmp_path / "local.beton"), num_workers=0, progress=False)
    assert same_output(tmp_path / "local.beton", tmp_path / "ray.beton")


@needs_ray
def test_chunks_in_flight_are_bounded(photos, ray_instance, monkeypatch):
    from ffload.convert.encode import SampleEncoder
    from ffload.convert.ray_engine import ray_encoded_chunks
    from ffload.formats.fields import IntField, RGBImageField

    submitted = []
    remote = ray_instance.remote

    class Counted:  # a remote function that logs each submission
        def __init__(self, function, options):
            self.inner = remote(**options)(function)

        def remote(self, *args):
            submitted.append(args[1:])
            return self.inner.remote(*args)

    monkeypatch.setattr(ray_instance, "remote", lambda **options: lambda function: Counted(function, options))
    encoder = SampleEncoder(ImageFolderSource(photos), [RGBImageField(), IntField()])
    starts = []
    for consumed, (chunk, _) in enumerate(ray_encoded_chunks(encoder, chunk_size=3, max_in_flight=2), start=1):
        assert len(submitted) <= consumed + 1  # the one consumed, and at most 2 in flight with it
        starts.append(chunk.start)
    assert starts == list(range(0, 45, 3)) and len(submitted) == 15


@needs_ray
def test_a_task_that_keeps_dying_is_reported_by_its_samples(tmp_path, ray_instance):
    ray_instance.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import this test
    source = IndexableSource(_Images(crash=5, driver=os.getpid()), name="images")
    report = convert_dataset(source, str(tmp_path / "x.beton"), engine="ray", chunk_size=4, on_error="skip",
                             progress=False)
    assert report.samples == 4  # the chunk 4..7 is left out
    assert [name for name, _ in report.skipped] == [source.describe(i) for i in range(4, 8)]
    assert "Ray task for samples 4..7" in report.skipped[0][1]
    with pytest.raises(ConvertError, match="Ray task for samples 4..7"):
        convert_dataset(source, str(tmp_path / "y.beton"), engine="ray", chunk_size=4, progress=False)


@needs_ray
def test_cli_engine_ray(tmp_path, photos, ray_instance):
    good = tmp_path / "good"
    shutil.copytree(photos, good)
    (good / "camera" / "camera_0001b.JPEG").unlink()
    runner = CliRunner()
    for name, extra in (("local.beton", []), ("ray.beton", ["--engine", "ray"])):
        result = runner.invoke(main, ["convert", str(good), str(tmp_path / name), "--quiet", "--write-mode", "jpg",
                                      *extra])
        assert result.exit_code == 0, result.output
    assert same_output(tmp_path / "local.beton", tmp_path / "ray.beton")
    result = runner.invoke(main, ["convert", str(good), str(tmp_path / "z.beton"), "--address", "auto"])
    assert result.exit_code == 2 and "--engine ray" in result.output


def test_missing_ray_names_the_install(tmp_path, photos, monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "ray", None)  # import ray raises ImportError
    with pytest.raises(ConfigurationError, match=r"pip install 'ffload\[ray\]'"):
        convert_dataset(ImageFolderSource(photos), str(tmp_path / "x.beton"), engine="ray", progress=False)
    assert not (tmp_path / "x.beton").exists()
