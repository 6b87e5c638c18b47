"""ffload.storage against a real S3 server (moto on 127.0.0.1, tests/s3_server.py)."""

from __future__ import annotations

import os
import threading

import pytest

pytest.importorskip("s3fs")
pytest.importorskip("moto.server")

from s3_server import s3_environment  # noqa: E402

from ffload.errors import ConfigurationError, StorageError  # noqa: E402
from ffload.storage import RemoteObject, RetryPolicy, is_remote, open_filesystem, remote_exists, upload_file  # noqa: E402

FAST = RetryPolicy(attempts=12, base_delay=0.05, max_delay=0.5)


@pytest.fixture(scope="module")
def s3():
    with s3_environment("bkt") as server:
        yield server


def test_is_remote():
    assert is_remote("s3://bucket/key.beton") and is_remote("gs://b/x") and is_remote("https://h/x")
    assert not is_remote("/data/train.beton") and not is_remote("train.beton")
    assert not is_remote("file:///data/train.beton") and not is_remote(None)
    assert not is_remote("C:\\data\\x.beton")


def test_range_reads_count_requests(s3):
    fs, path = open_filesystem("s3://bkt/data.bin")
    payload = os.urandom(100_000)
    fs.pipe_file(path, payload)
    obj = RemoteObject("s3://bkt/data.bin", retry=FAST)
    assert obj.size == len(payload)
    assert obj.read(10, 5000) == payload[10:5000]
    assert obj.read(99_000, 100_000) == payload[99_000:]
    assert obj.requests == 2 and obj.bytes_read == 5990


def test_explicit_storage_options(s3, monkeypatch):
    fs, path = open_filesystem("s3://bkt/opts.bin", s3.storage_options())
    fs.pipe_file(path, b"abcdef")
    for k in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(k, raising=False)
    obj = RemoteObject("s3://bkt/opts.bin", storage_options=s3.storage_options(), retry=FAST)
    assert obj.read(1, 4) == b"bcd"
    with pytest.raises(ConfigurationError, match="storage_options must be a dict"):
        open_filesystem("s3://bkt/opts.bin", "endpoint")


def test_missing_object_is_permanent_and_named(s3):
    before = s3.requests
    with pytest.raises(StorageError, match=r"s3://bkt/nothing-here\.beton: .*no such object") as info:
        RemoteObject("s3://bkt/nothing-here.beton", retry=FAST)
    assert not info.value.transient and info.value.path == "s3://bkt/nothing-here.beton"
    assert s3.requests - before <= 3  # a HEAD (and s3fs's listing fallback), no retries


def test_throttling_and_5xx_are_retried(s3):
    fs, path = open_filesystem("s3://bkt/slow.bin")
    fs.pipe_file(path, b"0123456789")
    obj = RemoteObject("s3://bkt/slow.bin", retry=FAST)
    s3.fail_next(3, 503, "SlowDown")
    assert obj.read(2, 6) == b"2345"
    assert obj.requests == 4
    s3.fail_next(2, 500, "InternalError")
    assert obj.read(0, 3) == b"012"
    impatient = RemoteObject("s3://bkt/slow.bin", retry=RetryPolicy(attempts=3, base_delay=0.01))
    s3.fail_next(50, 503, "SlowDown")
    with pytest.raises(StorageError, match=r"s3://bkt/slow\.bin: cannot read bytes 0\.\.3 after 3 attempts") as info:
        impatient.read(0, 3)
    s3.fail_next(0)
    assert info.value.transient


def test_access_denied_is_permanent(s3):
    s3.fail_next(1, 403, "AccessDenied")
    with pytest.raises(StorageError, match="access denied"):
        RemoteObject("s3://bkt/slow.bin", retry=FAST)


def test_wrong_credentials_name_the_object(s3):
    fs, path = open_filesystem("s3://bkt/secret.bin")
    fs.pipe_file(path, b"secret")
    user = s3.create_user("storage-tester")
    s3.require_auth(True)
    try:
        good = dict(s3.storage_options(), key=user["key"], secret=user["secret"])
        assert RemoteObject("s3://bkt/secret.bin", good, FAST).read(0, 6) == b"secret"
        for bad in (dict(good, secret="wrong"), dict(good, key="AKIAWRONGWRONGWRONG0")):
            with pytest.raises(StorageError, match=r"s3://bkt/secret\.bin: .*credentials were refused") as info:
                RemoteObject("s3://bkt/secret.bin", bad, FAST)
            assert not info.value.transient
    finally:
        s3.require_auth(False)


def test_credentials_from_the_aws_files(s3, tmp_path, monkeypatch):
    fs, path = open_filesystem("s3://bkt/profile.bin")
    fs.pipe_file(path, b"from ~/.aws")
    user = s3.create_user("profile-tester")
    (tmp_path / "credentials").write_text(
        f"[ffload]\naws_access_key_id = {user['key']}\naws_secret_access_key = {user['secret']}\n"
    )
    (tmp_path / "config").write_text("[profile ffload]\nregion = us-east-1\n")
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(k)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))  # where ~/.aws/credentials is
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    monkeypatch.setenv("AWS_PROFILE", "ffload")
    s3.require_auth(True)
    try:
        assert RemoteObject("s3://bkt/profile.bin", retry=FAST).read(0, 4) == b"from"
        monkeypatch.setenv("AWS_PROFILE", "default")  # no such profile in the file: botocore names it
        with pytest.raises(StorageError, match=r"s3://bkt/profile\.bin: .*profile \(default\) could not be found"):
            RemoteObject("s3://bkt/profile.bin", retry=FAST)
    finally:
        s3.require_auth(False)


def test_server_restart_keeps_objects_and_reads_retry(s3):
    fs, path = open_filesystem("s3://bkt/restart.bin")
    fs.pipe_file(path, b"survives restarts")
    obj = RemoteObject("s3://bkt/restart.bin", retry=FAST)
    port = s3.endpoint
    s3.kill()
    restart = threading.Timer(0.5, s3.start)
    restart.start()
    try:
        assert obj.read(0, 8) == b"survives"  # retried through the outage
    finally:
        restart.join()
    assert s3.endpoint == port and obj.requests >= 2


def test_upload_file(s3, tmp_path):
    local = tmp_path / "up.bin"
    data = os.urandom(300_000)
    local.write_bytes(data)
    assert not remote_exists("s3://bkt/up/up.bin")
    upload_file(str(local), "s3://bkt/up/up.bin", retry=FAST)
    assert remote_exists("s3://bkt/up/up.bin")
    assert RemoteObject("s3://bkt/up/up.bin").read(0, len(data)) == data
