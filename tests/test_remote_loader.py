"""ffload.Loader over s3:// and http:// against real servers on 127.0.0.1: moto's S3
(tests/s3_server.py) and a range-serving HTTP server (tests/http_server.py).

The dataset: 600 raw 96x96 RGB images (27 KiB each, 2 MiB pages: 9 data pages) whose label is
the sample index, written once, uploaded to S3 and served over HTTP; every remote batch is
compared with the same loader over the local file. The tests taking ``remote`` run against
both servers (``remote.url``, ``remote.server``: both have ``kill``, ``start``, ``fail_next``,
``reset_max`` and ``max_in_flight``).
"""

from __future__ import annotations

import os
import threading
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("fsspec")

from remote_servers import KINDS, serving  # noqa: E402

import ffload  # noqa: E402
from ffload.errors import ConfigurationError, StorageError  # noqa: E402
from ffload.formats import IntField, RGBImageField, open_dataset, write_dataset  # noqa: E402
from ffload.storage import open_filesystem  # noqa: E402

N, PAGE = 600, 1 << 21
URL = "s3://bkt/ds/train.beton"


@pytest.fixture(scope="module")
def local(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("remote") / "train.beton")
    images = np.random.default_rng(0).integers(0, 256, (N, 96, 96, 3), dtype=np.uint8)
    write_dataset(
        path,
        {"image": RGBImageField(write_mode="raw"), "label": IntField()},
        ((images[i], i) for i in range(N)),
        N,
        page_size=PAGE,
    )
    return path


@pytest.fixture(scope="module")
def s3(local):
    with serving("s3", os.path.dirname(local)) as served:
        yield served


@pytest.fixture(scope="module")
def http(local):
    with serving("http", os.path.dirname(local)) as served:
        yield served


@pytest.fixture(scope="module", params=KINDS)
def remote(request, local):
    """The dataset on one of the servers: ``url``, ``local`` (the file), ``server``."""
    served = request.getfixturevalue(request.param)
    return SimpleNamespace(url=served.url("train.beton"), local=local, server=served.server)


def _data_pages(view) -> int:
    return int(np.unique(view.sample_pages[view.sample_pages >= 0]).size)


def test_remote_view_is_the_local_view(remote):
    view, local = open_dataset(remote.url), open_dataset(remote.local)
    assert view.path == remote.url and view.data_path is None and view.remote is not None
    assert view.format == local.format == "beton" and view.num_samples == N
    assert list(view.fields) == list(local.fields) and view.page_size == local.page_size == PAGE
    assert view.data_size == local.data_size
    assert np.array_equal(view.metadata, local.metadata)
    for name in local.ptrs:
        assert np.array_equal(view.ptrs[name], local.ptrs[name])
        assert np.array_equal(view.sizes[name], local.sizes[name])
    assert np.array_equal(view.sample_pages, local.sample_pages) and view.info == local.info
    assert view.remote.requests <= 6  # LMDB probe, header, descriptors, allocation table, metadata, info
    with pytest.raises(ConfigurationError, match="object storage"):
        view.open_region()


@pytest.mark.parametrize("order", ["random", "quasi_random"])
def test_batches_equal_local_with_a_small_cache(remote, tmp_path, order):
    limit = 5 * PAGE  # 5 of the 9 data pages
    loader = ffload.Loader(
        remote.url, batch_size=4, num_workers=2, order=order, seed=3, cache_limit=limit, cache_dir=str(tmp_path)
    )
    local = ffload.Loader(remote.local, batch_size=4, num_workers=2, order=order, seed=3)
    with loader, local:
        pool = loader.memory
        assert os.listdir(tmp_path) == []  # the cache file is unlinked at once
        bound = loader.view.data_size // PAGE + 10
        for epoch in range(2):
            seen = []
            for (image, label), (image_l, label_l) in zip(loader, local):
                assert np.array_equal(image.numpy(), image_l.numpy())
                assert np.array_equal(label.numpy(), label_l.numpy())
                seen.append(label.numpy().copy())
                assert pool.resident_bytes <= limit and pool.cache_file_bytes() <= limit
            assert sorted(np.concatenate(seen).tolist()) == list(range(N))
            if epoch == 0 and order == "quasi_random":  # cold, and a cache smaller than the data
                assert pool.source.requests <= bound, (pool.source.requests, bound)
        assert pool.peak_resident_bytes <= limit and pool.cache_file_bytes() <= limit
        assert pool.cache_file_bytes() >= 4 * PAGE  # the cache was used: a batch's pages at least
        assert pool.source.requests > _data_pages(loader.view)  # smaller than the data: pages came back


def test_cold_quasi_random_epoch_gets_each_page_once(remote, tmp_path):
    view = open_dataset(remote.url)
    bound = view.data_size // PAGE + 10
    loader = ffload.Loader(
        remote.url,
        batch_size=8,
        num_workers=2,
        order="quasi_random",
        seed=5,
        cache_limit=16 * PAGE,
        cache_dir=str(tmp_path),
    )
    with loader:
        labels = np.concatenate([label.numpy().copy() for _, label in loader])
        cold = loader.memory.source.requests  # opening reads included
        assert sorted(labels.tolist()) == list(range(N))
        assert cold <= bound, (cold, bound)
        assert cold >= _data_pages(view)
        for _ in loader:  # the data fits the cache: the second epoch reads no page again
            pass
        assert loader.memory.source.requests == cold


def test_concurrent_requests_are_bounded(remote, tmp_path):
    remote.server.reset_max()
    with ffload.Loader(
        remote.url,
        batch_size=4,
        num_workers=2,
        order="random",
        seed=9,
        cache_limit=5 * PAGE,
        cache_dir=str(tmp_path),
        max_requests=2,
        indices=np.arange(0, N, 3),
    ) as loader:
        for _ in loader:
            pass
        assert loader.memory.source.requests > 10
    assert remote.server.max_in_flight == 2  # the read-ahead keeps both request slots busy, never more


def test_injected_503s_are_retried(remote, tmp_path):
    loader = ffload.Loader(
        remote.url,
        batch_size=4,
        num_workers=2,
        order="quasi_random",
        seed=2,
        cache_limit=4 * PAGE,
        cache_dir=str(tmp_path),
    )
    local = ffload.Loader(remote.local, batch_size=4, num_workers=2, order="quasi_random", seed=2)
    with loader, local:
        remote.server.fail_next(6, 503)  # the first page GETs answer 503 (S3's SlowDown for moto)
        for (image, label), (image_l, label_l) in zip(loader, local):
            assert np.array_equal(image.numpy(), image_l.numpy())
            assert np.array_equal(label.numpy(), label_l.numpy())
        assert loader.view.remote.retried >= 6


def test_server_killed_mid_epoch(remote, tmp_path):
    server = remote.server
    loader = ffload.Loader(
        remote.url,
        batch_size=4,
        num_workers=2,
        order="quasi_random",
        seed=7,
        cache_limit=4 * PAGE,
        cache_dir=str(tmp_path),
        read_ahead=PAGE,
    )
    local = ffload.Loader(remote.local, batch_size=4, num_workers=2, order="quasi_random", seed=7)
    restart = threading.Timer(1.5, server.start)
    seen = []
    with loader, local:
        for i, ((image, label), (image_l, label_l)) in enumerate(zip(loader, local)):
            assert np.array_equal(image.numpy(), image_l.numpy())
            assert np.array_equal(label.numpy(), label_l.numpy())
            seen.append(label.numpy().copy())
            if i == 10:
                server.kill()  # listening socket closed, open connections cut
                restart.start()
        restart.join()
        assert loader.view.remote.retried > 0  # requests failed while the server was down, and were retried
    labels = np.concatenate(seen)
    assert labels.size == N and sorted(labels.tolist()) == list(range(N))  # none lost or duplicated


def test_http_missing_object_and_no_ranges_are_clear_errors(http):
    with pytest.raises(
        StorageError,
        match=r"^http://127\.0\.0\.1:\d+/ds/missing\.beton: cannot read its size: "
        r"no such object",
    ):
        ffload.Loader(http.url("ds/missing.beton"), batch_size=4)
    http.server.ranges = "ignore"  # a server answering 200 and the whole file to a range request
    try:
        with pytest.raises(
            StorageError,
            match=r"train\.beton: the server answered a request for bytes \d+\.\.\d+ "
            r".*does not support HTTP range requests",
        ):
            ffload.Loader(http.url("train.beton"), batch_size=4)
    finally:
        http.server.ranges = "bytes"


def test_wrong_credentials_name_the_object(s3):
    user = s3.server.create_user("loader-tester")
    s3.server.require_auth(True)
    try:
        good = dict(s3.server.storage_options(), key=user["key"], secret=user["secret"])
        with ffload.Loader(URL, batch_size=4, num_workers=1, storage_options=good, cache_limit=8 * PAGE) as loader:
            assert len(next(iter(loader))[1]) == 4
        with pytest.raises(StorageError, match=r"s3://bkt/ds/train\.beton: .*credentials were refused"):
            ffload.Loader(URL, batch_size=4, storage_options=dict(good, secret="wrong"))
    finally:
        s3.server.require_auth(False)


def test_missing_object_and_remote_lmdb_refused(s3):
    with pytest.raises(StorageError, match=r"s3://bkt/ds/missing\.beton: .*no such object"):
        ffload.Loader("s3://bkt/ds/missing.beton", batch_size=4)
    with pytest.raises(ConfigurationError, match=r"LMDB .*local memory map") as info:
        ffload.Loader("s3://bkt/ds/train.lmdb", batch_size=4)
    assert ".beton" in str(info.value)
    fs, path = open_filesystem("s3://bkt/ds/renamed.beton")
    fs.pipe_file(path, bytes(16) + b"\xde\xc0\xef\xbe" + bytes(100))  # an LMDB data file, by its magic
    with pytest.raises(ConfigurationError, match="LMDB"):
        open_dataset("s3://bkt/ds/renamed.beton")


def test_cache_limit_must_hold_a_batch(s3):
    with pytest.raises(
        ConfigurationError, match=r"cache_limit=2097152 bytes cannot hold .*raise cache_limit to at least 16777216"
    ):
        ffload.Loader(URL, batch_size=8, cache_limit=PAGE)
