"""gs:// through the same code as s3:// and http(s)://, against a real GCS emulator on 127.0.0.1.

The server is ``gcp-storage-emulator`` (a Python implementation of the GCS JSON API, in memory),
reached the way a user reaches an emulator: ``STORAGE_EMULATOR_HOST`` (gcsfs's variable), or an
``endpoint_url`` in ``storage_options``. gcsfs's experimental zonal/HNS bucket probe (gRPC, which
the emulator does not serve) is turned off with its own switch before gcsfs is imported. The
emulator has no fault injection: retries and server restarts are tested against S3 and HTTP.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket

import numpy as np
import pytest

os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")  # read when gcsfs is imported
pytest.importorskip("gcsfs")
pytest.importorskip("gcp_storage_emulator")

from click.testing import CliRunner  # noqa: E402

import ffload  # noqa: E402
from ffload.cli import main  # noqa: E402
from ffload.errors import StorageError  # noqa: E402
from ffload.formats import IntField, RGBImageField, open_dataset, write_dataset  # noqa: E402
from ffload.storage import RemoteObject, upload_file  # noqa: E402

N, PAGE = 300, 1 << 21
URL = "gs://bkt/ds/train.beton"


@contextlib.contextmanager
def _emulator():
    from gcp_storage_emulator.server import create_server

    with socket.socket() as s:  # a free port (the emulator takes a number)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    logging.getLogger("gcp_storage_emulator").setLevel(logging.WARNING)
    server = create_server("127.0.0.1", port, in_memory=True, default_bucket="bkt")
    server.start()
    saved = os.environ.get("STORAGE_EMULATOR_HOST")
    os.environ["STORAGE_EMULATOR_HOST"] = f"http://127.0.0.1:{port}"
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()
        if saved is None:
            os.environ.pop("STORAGE_EMULATOR_HOST", None)
        else:
            os.environ["STORAGE_EMULATOR_HOST"] = saved


@pytest.fixture(scope="module")
def gcs(tmp_path_factory):
    local = str(tmp_path_factory.mktemp("gcs") / "train.beton")
    images = np.random.default_rng(1).integers(0, 256, (N, 96, 96, 3), dtype=np.uint8)
    write_dataset(
        local,
        {"image": RGBImageField(write_mode="raw"), "label": IntField()},
        ((images[i], i) for i in range(N)),
        N,
        page_size=PAGE,
    )
    with _emulator() as endpoint:
        upload_file(local, URL)
        yield endpoint, local


def test_range_reads(gcs):
    endpoint, local = gcs
    data = open(local, "rb").read()
    obj = RemoteObject(URL, {"endpoint_url": endpoint, "token": "anon"})
    assert obj.size == len(data)
    assert obj.read(100, 3 * PAGE // 2) == data[100 : 3 * PAGE // 2] and obj.requests == 1
    with pytest.raises(StorageError, match=r"^gs://bkt/ds/missing\.beton: cannot read its size: no such object"):
        RemoteObject("gs://bkt/ds/missing.beton")


@pytest.mark.parametrize("order", ["random", "quasi_random"])
def test_loader_batches_equal_local(gcs, tmp_path, order):
    _, local = gcs
    remote = ffload.Loader(
        URL, batch_size=4, num_workers=2, order=order, seed=1, cache_limit=4 * PAGE, cache_dir=str(tmp_path)
    )
    with remote, ffload.Loader(local, batch_size=4, num_workers=2, order=order, seed=1) as here:
        labels = []
        for (image, label), (image_l, label_l) in zip(remote, here):
            assert np.array_equal(image.numpy(), image_l.numpy())
            assert np.array_equal(label.numpy(), label_l.numpy())
            labels.append(label.numpy().copy())
        assert sorted(np.concatenate(labels).tolist()) == list(range(N))
        if order == "quasi_random":  # cold, with a cache smaller than the data
            assert remote.memory.source.requests <= remote.view.data_size // PAGE + 10


def test_inspect_and_verify(gcs):
    endpoint, local = gcs
    result = CliRunner().invoke(main, ["inspect", URL, "--json"])
    assert result.exit_code == 0, result.output
    info = json.loads(result.stdout)  # (stderr may hold the emulator's report of a connection the last test closed)
    assert info["samples"] == N and info["path"] == URL
    options = json.dumps({"endpoint_url": endpoint, "token": "anon"})
    result = CliRunner().invoke(main, ["verify", URL, "--quiet", "--storage-options", options])
    assert result.exit_code == 0 and f"all {N} samples decode" in result.output
    assert open_dataset(URL).data_size == open_dataset(local).data_size
