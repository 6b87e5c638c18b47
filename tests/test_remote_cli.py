"""``ffload inspect URL`` and ``ffload verify URL`` against real servers on 127.0.0.1 (moto's S3
and the range-serving HTTP server, tests/remote_servers.py).

The datasets: 360 images of three sizes in write mode ``proportion`` (raw and JPEG samples) with
a JSON field, 2 MiB pages (several data pages); ``bad.beton`` is the same file with the JPEG data
of two samples wiped. Every remote answer is compared with the local one; requests are counted
by the servers.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from click.testing import CliRunner

pytest.importorskip("fsspec")

from remote_servers import KINDS, serving  # noqa: E402

from ffload.cli import main  # noqa: E402
from ffload.formats import IntField, JSONField, RGBImageField, open_dataset, write_dataset  # noqa: E402
from ffload.formats.fields.image import JPG  # noqa: E402

N, PAGE = 360, 1 << 21
BAD = (58, 302)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("cli-remote")
    rng = np.random.default_rng(4)
    sizes = [(160, 200), (128, 128), (144, 176)]
    samples = []
    for i in range(N):
        h, w = sizes[i % 3]
        base = rng.integers(0, 256, (h // 8, w // 8, 3), dtype=np.uint8)
        image = np.kron(base, np.ones((8, 8, 1), np.uint8)) + rng.integers(0, 40, (h, w, 3), dtype=np.uint8)
        samples.append((image, i % 7, {"i": i}))
    good = str(root / "good.beton")
    write_dataset(
        good,
        {"image": RGBImageField("proportion", compress_probability=0.5), "label": IntField(), "doc": JSONField()},
        samples,
        N,
        page_size=PAGE,
    )
    shutil.copy(good, root / "bad.beton")
    view = open_dataset(good)
    assert all(view.metadata["image"]["mode"][i] == JPG for i in BAD), "BAD must be JPEG samples"
    with open(root / "bad.beton", "r+b") as f:
        for i in BAD:  # wipe the entropy-coded data and the markers after SOI
            p, n = int(view.ptrs["image"][i]), int(view.sizes["image"][i])
            f.seek(p + 2)
            f.write(b"\0" * (n - 2))
    return str(root)


@pytest.fixture(scope="module", params=KINDS)
def remote(request, folder):
    with serving(request.param, folder) as served:
        yield served


def _cli(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def _pages(view) -> int:
    return -(-int(view.data_size) // int(view.page_size))


def test_inspect_url_reads_only_the_tables(remote, folder):
    local = json.loads(_cli("inspect", f"{folder}/good.beton", "--json").output)
    before = remote.server.gets
    result = _cli("inspect", remote.url("good.beton"), "--json")
    gets = remote.server.gets - before
    assert result.exit_code == 0, result.output
    info = json.loads(result.output)
    assert info.pop("path") == remote.url("good.beton")
    local.pop("path")
    assert info == local and info["samples"] == N and info["classes"] == 7
    assert 1 <= gets <= 6, gets  # header, descriptors, allocation table, metadata, (LMDB probe, info): no page
    result = _cli("inspect", remote.url("good.beton"))
    assert result.exit_code == 0 and f"samples   {N}" in result.output


def test_inspect_grid_of_a_url(remote, folder, tmp_path):
    local_png, remote_png = tmp_path / "local.png", tmp_path / "remote.png"
    assert _cli("inspect", f"{folder}/good.beton", "--grid", str(local_png), "--grid-count", "9").exit_code == 0
    before = remote.server.gets
    result = _cli("inspect", remote.url("good.beton"), "--grid", str(remote_png), "--grid-count", "9")
    assert result.exit_code == 0, result.output
    assert remote_png.read_bytes() == local_png.read_bytes()  # the same pixels, drawn the same way
    view = open_dataset(f"{folder}/good.beton")
    shown = np.linspace(0, N - 1, 9).astype(int)
    assert remote.server.gets - before <= 6 + np.unique(view.sample_pages[shown]).size


def test_verify_url_fetches_each_page_once(remote):
    before = remote.server.gets
    result = _cli("verify", remote.url("good.beton"), "--quiet", "--num-workers", "2")
    gets = remote.server.gets - before
    assert result.exit_code == 0, result.output
    assert result.output.strip() == f"{remote.url('good.beton')}: all {N} samples decode"
    view = open_dataset(remote.url("good.beton"))
    assert _pages(view) >= 3
    assert gets <= _pages(view) + 6, (gets, _pages(view))  # the tables, then every page once


@pytest.mark.parametrize("workers", ["0", "3"])
def test_verify_url_names_the_bad_samples(remote, folder, workers):
    local = _cli("verify", f"{folder}/bad.beton", "--quiet", "--num-workers", workers)
    result = _cli("verify", remote.url("bad.beton"), "--quiet", "--num-workers", workers)
    assert result.exit_code == local.exit_code == 1
    lines = [line for line in result.output.splitlines() if line.startswith("sample ")]
    assert [int(line.split()[1].rstrip(",")) for line in lines] == list(BAD)
    assert all(line.startswith(f"sample {i}, field 'image': ") for line, i in zip(lines, BAD))
    assert f"{remote.url('bad.beton')}: 2 of {N} samples do not decode" in result.output


def test_verify_url_server_errors(remote):
    remote.server.fail_next(4, 503)  # retried
    assert _cli("verify", remote.url("good.beton"), "--quiet").exit_code == 0
    result = _cli("verify", remote.url("missing.beton"), "--quiet")
    assert result.exit_code == 1
    assert f"ffload: error: {remote.url('missing.beton')}: cannot read its size: no such object" in result.output


def test_storage_options_reach_the_filesystem(remote, monkeypatch):
    if remote.kind == "s3":  # no endpoint nor keys in the environment: only --storage-options has them
        options = remote.server.storage_options()
        for k in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            monkeypatch.delenv(k, raising=False)
    else:  # a server that wants a header
        options = {"headers": {"Authorization": "Bearer ffload-test"}}
        monkeypatch.setattr(remote.server, "required_headers", dict(options["headers"]))
        denied = _cli("inspect", remote.url("good.beton"))
        assert denied.exit_code == 1 and "access denied (401)" in denied.output
    for command in ("inspect", "verify"):
        result = _cli(
            command,
            remote.url("good.beton"),
            "--storage-options",
            json.dumps(options),
            "--quiet" if command == "verify" else "--json",
        )
        assert result.exit_code == 0, result.output
    bad = _cli("verify", remote.url("good.beton"), "--storage-options", "[1]")
    assert bad.exit_code == 2 and "JSON object" in bad.output


def test_verify_url_cache_dir_and_max_requests(remote, tmp_path, monkeypatch):
    import ffload.loaders.pagedsamples as pagedsamples_module

    pools = []
    real = pagedsamples_module.remote_page_pool
    monkeypatch.setattr(pagedsamples_module, "remote_page_pool", lambda *args: pools.append(args) or real(*args))
    blocked = tmp_path / "a-file"
    blocked.write_bytes(b"")
    result = _cli("verify", remote.url("good.beton"), "--quiet", "--cache-dir", str(blocked / "cache"))
    assert result.exit_code != 0 and str(blocked / "cache") in result.output  # the folder given is the one used
    result = _cli(
        "verify", remote.url("good.beton"), "--quiet", "--cache-dir", str(tmp_path / "cache"), "--max-requests", "1"
    )
    assert result.exit_code == 0, result.output
    assert [(args[4], args[5]) for args in pools] == [(str(blocked / "cache"), 8), (str(tmp_path / "cache"), 1)]
    assert _cli("verify", remote.url("good.beton"), "--max-requests", "0").exit_code == 2
