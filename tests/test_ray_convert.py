"""Conversion with ``engine='ray'``: the same output as a local conversion, bad inputs and failed
Ray tasks reported by file. A local Ray instance (2 CPUs, loopback, no dashboard) per module."""

from __future__ import annotations

import importlib.util
import json
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

needs_ray = pytest.mark.skipif(
    importlib.util.find_spec("ray") is None, reason="ray is not installed (pip install 'ffload[ray]')"
)


@pytest.fixture(scope="module")
def ray_instance():
    import ray

    ray.init(
        num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False, configure_logging=False
    )
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
    """Eight ``side x side`` images; ``__getitem__(crash)`` kills the process it runs in unless that
    is ``driver`` (every time, or with ``once`` a path: only while that file does not exist yet)."""

    def __init__(self, crash: int, driver: int, once: str | None = None, side: int = 8):
        self.crash, self.driver, self.once, self.targets = crash, driver, once, [i % 2 for i in range(8)]
        self.side = side

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i):
        if i == self.crash and os.getpid() != self.driver:
            if self.once is None:
                os._exit(1)
            if not os.path.exists(self.once):
                open(self.once, "w").close()
                os._exit(1)
        return np.full((self.side, self.side, 3), i, np.uint8), self.targets[i]


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
    from ffload.formats.fields.image import RGBImageField
    from ffload.formats.fields.scalars import IntField

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
    report = convert_dataset(
        source, str(tmp_path / "x.beton"), engine="ray", chunk_size=4, on_error="skip", progress=False
    )
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
        result = runner.invoke(
            main, ["convert", str(good), str(tmp_path / name), "--quiet", "--write-mode", "jpg", *extra]
        )
        assert result.exit_code == 0, result.output
    assert same_output(tmp_path / "local.beton", tmp_path / "ray.beton")
    result = runner.invoke(main, ["convert", str(good), str(tmp_path / "z.beton"), "--address", "auto"])
    assert result.exit_code == 2 and "--engine ray" in result.output


def test_missing_ray_names_the_install(tmp_path, photos, monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "ray", None)  # import ray raises ImportError
    with pytest.raises(ConfigurationError, match=r"pip install 'ffload\[ray\]'"):
        convert_dataset(ImageFolderSource(photos), str(tmp_path / "x.beton"), engine="ray", progress=False)
    assert not (tmp_path / "x.beton").exists()


# ---- Ray tasks writing shards (engine='ray' with shard_size) -------------------------------------


def stored_samples(path) -> tuple[np.ndarray, list[list[bytes]]]:
    """Every sample of the dataset at ``path``: its metadata rows with the payload pointers zeroed
    (they depend on the layout), and its payloads' bytes."""
    from ffload.formats import open_dataset

    view = open_dataset(str(path))
    region = view.open_region()
    meta = view.metadata.copy()
    payload_fields = [name for name, f in view.fields.items() if f.has_payload]
    for name in payload_fields:
        view.fields[name].get_pointer(meta[name])[...] = 0
    return meta, [[bytes(view.payload(name, i, region)) for name in payload_fields] for i in range(view.num_samples)]


def same_samples(a, b) -> bool:
    (meta_a, payloads_a), (meta_b, payloads_b) = stored_samples(a), stored_samples(b)
    return len(meta_a) > 0 and np.array_equal(meta_a, meta_b) and payloads_a == payloads_b


def shard_files(path) -> list[str]:
    """The shard paths the manifest of the dataset directory ``path`` names (checked: its only files)."""
    shards = json.loads((path / "manifest.json").read_text("utf8"))["shards"]
    files = sorted(str(p.relative_to(path)) for p in path.rglob("*") if p.is_file())
    assert files == sorted(["manifest.json"] + [s["path"] for s in shards])
    return [s["path"] for s in shards]


@needs_ray
def test_ray_tasks_write_the_shards_of_the_local_conversion(tmp_path, photos, ray_instance):
    local, remote = tmp_path / "local", tmp_path / "ray"
    kw = dict(write_mode="jpg", on_error="skip", progress=False, shard_size="5MB", page_size=1 << 21)
    a = convert_dataset(photos, str(local), num_workers=2, **kw)
    b = convert_dataset(photos, str(remote), engine="ray", **kw)
    assert b.format == "shards" and b.samples == a.samples == 44
    assert same_samples(local, remote)
    assert (b.label_counts == a.label_counts).all()
    assert (b.passed_through, b.reencoded, b.skipped) == (a.passed_through, a.reencoded, a.skipped)
    assert b.skipped_origins == a.skipped_origins and b.skipped_origins[0].endswith("camera_0001b.JPEG")
    from ffload.formats import open_dataset
    from ffload.formats.dataset_origins import dataset_origins

    ours, theirs = (dataset_origins(open_dataset(str(p))) for p in (local, remote))  # provenance per task shard
    assert theirs.strings(0, 44) == ours.strings(0, 44) and len(set(ours.strings(0, 44))) == 44
    names = shard_files(remote)  # only the manifest's shards: no partial file left
    tasks = sorted({name[: len("shard-00000")] for name in names})
    assert len(tasks) >= 2  # 2 CPUs: at least one task each
    assert all(
        name.startswith("shard-") and name.endswith(".beton") and len(name) == len("shard-00000-000.beton")
        for name in names
    )
    assert all(os.path.getsize(remote / name) <= 5_000_000 for name in names)


@needs_ray
def test_ray_shards_a_bad_input_fails_by_name_and_leaves_nothing(tmp_path, photos, ray_instance):
    with pytest.raises(ConvertError, match="camera_0001b.JPEG"):
        convert_dataset(photos, str(tmp_path / "x"), engine="ray", shard_size="1GB", progress=False)
    assert os.listdir(tmp_path) == []


@needs_ray
def test_ray_shards_a_task_that_keeps_dying_is_reported_and_the_rest_is_kept(tmp_path, ray_instance):
    ray_instance.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import this test
    source = IndexableSource(_Images(crash=5, driver=os.getpid()), name="images")
    report = convert_dataset(
        source, str(tmp_path / "x"), engine="ray", shard_size="5MB", page_size=1 << 21, on_error="skip", progress=False
    )
    # 8 samples on 2 CPUs: tasks of 4 samples; the one holding sample 5 died on every try
    assert report.samples == 4 and [name for name, _ in report.skipped] == [source.describe(i) for i in range(4, 8)]
    assert "Ray task for samples 4..7" in report.skipped[0][1]
    meta, payloads = stored_samples(tmp_path / "x")
    assert [p[0][:1] for p in payloads] == [bytes([i]) for i in range(4)]
    assert len(shard_files(tmp_path / "x")) == 1


@needs_ray
def test_ray_shards_of_a_task_that_died_after_closing_one_are_removed(tmp_path, ray_instance):
    ray_instance.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import this test
    # 880 KiB images, 2 MiB pages, 5 MB shards: two images fill a shard; the task of samples 4..7
    # closes shard-00001-000 (4, 5) when it adds 6, then dies at sample 7 on every try
    source = IndexableSource(_Images(crash=7, driver=os.getpid(), side=548), name="images")
    report = convert_dataset(
        source, str(tmp_path / "x"), engine="ray", shard_size="5MB", page_size=1 << 21, on_error="skip", progress=False
    )
    assert report.samples == 4 and len(report.skipped) == 4
    assert shard_files(tmp_path / "x") == ["shard-00000-000.beton", "shard-00000-001.beton"]  # nothing else left


@needs_ray
def test_ray_shards_a_task_whose_worker_died_once_is_retried(tmp_path, ray_instance):
    ray_instance.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import this test
    marker = tmp_path / "died"
    source = IndexableSource(_Images(crash=5, driver=os.getpid(), once=str(marker)), name="images")
    kw = dict(shard_size="5MB", page_size=1 << 21, progress=False)
    report = convert_dataset(source, str(tmp_path / "ray"), engine="ray", **kw)
    assert marker.exists() and report.samples == 8 and not report.skipped
    convert_dataset(source, str(tmp_path / "local"), num_workers=0, **kw)
    assert same_samples(tmp_path / "local", tmp_path / "ray")
    shard_files(tmp_path / "ray")  # the dead attempt's partial shard is gone


@needs_ray
def test_ray_shards_progress_counts_each_sample_once_across_retries(tmp_path, ray_instance):
    from ffload.convert.encode import SampleEncoder
    from ffload.convert.ray_shards import ray_written_shards
    from ffload.formats.fields.image import RGBImageField
    from ffload.formats.fields.scalars import IntField

    ray_instance.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import this test
    marker = tmp_path / "died"
    source = IndexableSource(_Images(crash=6, driver=os.getpid(), once=str(marker)), name="images")
    encoder = SampleEncoder(source, [RGBImageField(), IntField()])
    (tmp_path / "out").mkdir()
    steps = []
    results = list(
        ray_written_shards(
            encoder, ["image", "label"], 5 << 20, 1 << 21, {}, 1, folder=str(tmp_path / "out"), on_progress=steps.append
        )
    )
    assert marker.exists()  # the task of samples 4..7 died after reporting samples 4 and 5, and ran again
    assert sum(steps) == 8
    assert [int(label) for r in results for label in r.labels] == source.dataset.targets


def test_progress_tally_keeps_each_tasks_highest_count():
    from ffload.convert.ray_shards import ProgressTally

    tally = ProgressTally()
    tally.report(3, 40)
    tally.report(3, 10)  # a retried task starts again from zero
    tally.report(4, 5)
    assert tally.counts() == {3: 40, 4: 5}


@needs_ray
def test_ray_shards_uploaded_by_the_tasks(tmp_path, photos, ray_instance):
    pytest.importorskip("s3fs")
    pytest.importorskip("moto.server")
    from s3_server import s3_environment

    from ffload.storage import open_filesystem

    good = tmp_path / "good"
    shutil.copytree(photos, good)
    (good / "camera" / "camera_0001b.JPEG").unlink()
    kw = dict(write_mode="jpg", progress=False, shard_size="5MB", page_size=1 << 21)
    with s3_environment("bkt") as server:
        options = server.storage_options()  # explicit: Ray's workers predate the environment
        report = convert_dataset(good, "s3://bkt/ds", engine="ray", storage_options=options, **kw)
        assert report.samples == 44 and report.dst == "s3://bkt/ds"
        fs, _ = open_filesystem("s3://bkt/ds", options)
        down = tmp_path / "down"
        for path in fs.find("bkt/ds"):  # the manifest and the shards, in their version folder
            (down / path[len("bkt/ds/") :]).parent.mkdir(parents=True, exist_ok=True)
            fs.get_file(path, str(down / path[len("bkt/ds/") :]))
        (version,) = [p for p in os.listdir(down) if p != "manifest.json"]
        assert version.startswith("v-") and shard_files(down) == [
            f"{version}/{name}" for name in sorted(os.listdir(down / version))
        ]
        convert_dataset(good, str(tmp_path / "local"), num_workers=0, **kw)
        assert same_samples(tmp_path / "local", down)
        assert report.bytes == sum(p.stat().st_size for p in down.rglob("*") if p.is_file())
        assert len(shard_files(down)) >= 2
        import tempfile

        def task_folders() -> list[str]:
            return [p for p in os.listdir(tempfile.gettempdir()) if p.startswith("ffload-shards-")]

        assert task_folders() == []  # each task removed its own (and any a killed one left)
        # a task that died after uploading a shard: its shard is deleted, the rest is the dataset
        crashing = IndexableSource(_Images(crash=7, driver=os.getpid(), side=548), name="images")
        ray_instance.cloudpickle.register_pickle_by_value(sys.modules[__name__])
        report = convert_dataset(
            crashing,
            "s3://bkt/crash",
            engine="ray",
            storage_options=options,
            on_error="skip",
            shard_size="5MB",
            page_size=1 << 21,
            progress=False,
        )
        manifest = json.loads(fs.cat("bkt/crash/manifest.json"))
        assert report.samples == 4 and len(manifest["shards"]) == 2  # task 1's uploaded shard is gone
        assert sorted(p[len("bkt/crash/") :] for p in fs.find("bkt/crash")) == sorted(
            ["manifest.json"] + [entry["path"] for entry in manifest["shards"]]
        )
        assert len(task_folders()) == 1  # the killed task's; the next task on this node removes it
        convert_dataset(good, "s3://bkt/again", engine="ray", storage_options=options, **kw)
        assert task_folders() == []
        # a failed conversion removes the shards its tasks uploaded (no manifest: never a dataset)
        with pytest.raises(ConvertError, match="camera_0001b.JPEG"):
            convert_dataset(photos, "s3://bkt/bad", engine="ray", storage_options=options, **kw)
        assert not fs.exists("bkt/bad/manifest.json") and fs.glob("bkt/bad/*") == []
