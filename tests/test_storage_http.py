"""ffload.storage over http(s):// against a real HTTP server on 127.0.0.1 (tests/http_server.py)."""

from __future__ import annotations

import os
import threading

import pytest

pytest.importorskip("aiohttp")
pytest.importorskip("fsspec")

from http_server import http_server  # noqa: E402

from ffload.errors import StorageError  # noqa: E402
from ffload.storage import RemoteObject, RetryPolicy, classify_error  # noqa: E402

FAST = RetryPolicy(attempts=12, base_delay=0.05, max_delay=0.5)
DATA = os.urandom(100_000)


@pytest.fixture(scope="module")
def http(tmp_path_factory):
    root = tmp_path_factory.mktemp("www")
    (root / "data.bin").write_bytes(DATA)
    with http_server(str(root)) as server:
        yield server


@pytest.fixture(autouse=True)
def _healthy(http):
    yield
    http.fail_next(0)
    http.drop_next(0)
    http.stall_next(0, 0)
    http.ranges = "bytes"


def test_range_reads_are_206_gets(http):
    obj = RemoteObject(http.url("data.bin"), retry=FAST)
    assert obj.size == len(DATA)
    before = http.gets
    assert obj.read(10, 5000) == DATA[10:5000]
    assert obj.read(99_000, 100_000) == DATA[99_000:]
    assert obj.read(0, len(DATA)) == DATA
    assert obj.requests == 3 and http.gets - before == 3 and obj.bytes_read == 5990 + len(DATA)


def test_5xx_and_dropped_connections_are_retried(http):
    obj = RemoteObject(http.url("data.bin"), retry=FAST)
    http.fail_next(3, 503)
    assert obj.read(2, 6) == DATA[2:6] and obj.requests == 4 and obj.retried == 3
    http.fail_next(2, 429)
    assert obj.read(0, 3) == DATA[:3] and obj.retried == 5
    http.drop_next(2)  # the connection closed without an answer: ServerDisconnectedError
    assert obj.read(7, 70) == DATA[7:70] and obj.retried >= 6
    http.fail_next(2, 502)  # the HEAD too (fsspec then tries a GET: both fail, both retried)
    assert RemoteObject(http.url("data.bin"), retry=FAST).size == len(DATA)
    impatient = RemoteObject(http.url("data.bin"), retry=RetryPolicy(attempts=3, base_delay=0.01))
    http.fail_next(50, 500)
    with pytest.raises(StorageError, match=r"data\.bin: cannot read bytes 0\.\.3 after 3 attempts: .*HTTP 500") as info:
        impatient.read(0, 3)
    assert info.value.transient


@pytest.mark.parametrize(
    "status, cause", [(404, "no such object"), (401, r"access denied \(401\)"), (403, r"access denied \(403\)")]
)
def test_permanent_statuses_name_the_url(http, status, cause):
    obj = RemoteObject(http.url("data.bin"), retry=FAST)
    before = http.requests
    http.fail_next(1, status)
    with pytest.raises(
        StorageError, match=rf"^http://127\.0\.0\.1:\d+/data\.bin: cannot read bytes 0\.\.3: {cause}"
    ) as info:
        obj.read(0, 3)
    assert not info.value.transient and info.value.path == http.url("data.bin")
    assert http.requests - before == 1  # not retried


def test_missing_object(http):
    before = http.requests
    with pytest.raises(StorageError, match=r"/nothing\.beton: cannot read its size: no such object") as info:
        RemoteObject(http.url("nothing.beton"), retry=FAST)
    assert not info.value.transient and http.requests - before == 2  # HEAD, then fsspec's GET fallback


def test_server_ignoring_ranges_is_refused(http):
    obj = RemoteObject(http.url("data.bin"), retry=FAST)
    http.ranges = "ignore"  # 200 and the whole file for every GET, like python -m http.server
    assert obj.read(0, len(DATA)) == DATA  # the whole object is what a 200 holds
    before = http.requests
    with pytest.raises(
        StorageError,
        match=r"data\.bin: the server answered a request for bytes 0\.\.3 .*HTTP 200 "
        r"and the whole object: it does not support HTTP range requests",
    ) as info:
        obj.read(0, 3)  # the first bytes of the object would be right here: still refused
    assert not info.value.transient and http.requests - before == 1
    http.ranges = "none"  # and says so: refused at open
    with pytest.raises(StorageError, match=r"data\.bin: the server declares 'Accept-Ranges: none'"):
        RemoteObject(http.url("data.bin"), retry=FAST)


def test_connection_refused_is_transient(http):
    obj = RemoteObject(http.url("data.bin"), retry=FAST)
    impatient = RemoteObject(http.url("data.bin"), retry=RetryPolicy(attempts=2, base_delay=0.01))
    http.kill()
    try:
        with pytest.raises(
            StorageError,
            match=r"cannot read bytes 0\.\.3 after 2 attempts: connection failed "
            r"\(ClientConnectorError",
        ) as info:
            impatient.read(0, 3)
        assert info.value.transient
        with pytest.raises(StorageError, match=r"cannot read its size after 2 attempts: connection failed"):
            RemoteObject(http.url("data.bin"), retry=impatient.retry)
        restart = threading.Timer(0.5, http.start)
        restart.start()
        assert obj.read(0, 8) == DATA[:8]  # retried through the outage
        restart.join()
    finally:
        if http._server is None:
            http.start()
    assert obj.retried >= 1


def test_stalled_server_times_out_and_is_retried(http):
    import aiohttp

    patient = RemoteObject(http.url("data.bin"), retry=FAST)
    assert patient.fs.client_kwargs["timeout"].sock_read == 60  # ffload's default: 60 s without a byte
    options = {"client_kwargs": {"timeout": aiohttp.ClientTimeout(total=None, sock_read=0.3)}}
    obj = RemoteObject(http.url("data.bin"), options, retry=FAST)
    http.stall_next(2, 1.0)
    assert obj.read(3, 300) == DATA[3:300]
    assert obj.retried == 2 and obj.requests == 3


def test_classify_timeouts():
    import asyncio

    import aiohttp

    assert classify_error(aiohttp.ServerTimeoutError("read timed out"))[0]
    assert classify_error(asyncio.TimeoutError())[0]
    assert not classify_error(ValueError("bad"))[0]
