"""``ffload convert SRC s3://.../x.beton --resume``: a conversion to a URL killed with SIGKILL (twice)
and resumed uploads the bytes of an uninterrupted local conversion, and nothing before it is
complete. The conversion runs in a child process (tests/test_resume.py's ``run``), against a real
S3 server (moto on 127.0.0.1)."""

from __future__ import annotations

import json
import os

import pytest

pytest.importorskip("s3fs")
pytest.importorskip("moto.server")

from click.testing import CliRunner  # noqa: E402
from s3_server import s3_environment  # noqa: E402
from test_resume import photos, run  # noqa: E402, F401  (the photos fixture, the killable child)

from ffload.cli import main  # noqa: E402
from ffload.convert.convert import remote_staging_dir  # noqa: E402
from ffload.convert.sources import ImageFolderSource  # noqa: E402
from ffload.storage import open_filesystem, remote_exists  # noqa: E402


@pytest.fixture(scope="module")
def s3():
    with s3_environment("bkt") as server:
        yield server


def _staged(dst: str) -> tuple[str, str]:
    folder = remote_staging_dir(dst)
    name = os.path.basename(dst)
    return folder, os.path.join(folder, f".{name}.partial.json")


def test_killed_conversion_to_s3_resumes_to_the_same_bytes(s3, tmp_path, photos, monkeypatch):  # noqa: F811
    monkeypatch.setenv("FFLOAD_CACHE_DIR", str(tmp_path / "cache"))  # the child inherits it
    reference = tmp_path / "reference.beton"
    run(photos, reference, resume=False)
    n = len(ImageFolderSource(photos))
    dst = "s3://bkt/resume/x.beton"
    folder, journal = _staged(dst)
    assert folder.startswith(str(tmp_path / "cache" / "convert"))
    first = run(photos, dst, resume=False, kill_after=2, journal=journal)
    assert not remote_exists(dst) and os.path.exists(os.path.join(folder, ".x.beton.partial"))
    second = run(photos, dst, resume=True, kill_after=n // 2, journal=journal)  # a resumed run killed too
    assert first < second < n and not remote_exists(dst)
    run(photos, dst, resume=True, journal=journal)
    fs, path = open_filesystem(dst)
    assert fs.cat_file(path) == reference.read_bytes()
    assert not os.path.exists(folder)  # the staged output and journal are gone once uploaded


def test_cli_resume_to_a_url_reports_where_it_resumed(s3, tmp_path, photos, monkeypatch):  # noqa: F811
    monkeypatch.setenv("FFLOAD_CACHE_DIR", str(tmp_path / "cache"))
    reference = tmp_path / "reference.beton"
    run(photos, reference, resume=False)
    dst = "s3://bkt/resume/cli.beton"
    folder, journal = _staged(dst)
    killed_at = run(photos, dst, resume=False, kill_after=4, journal=journal)
    result = CliRunner().invoke(
        main,
        [
            "convert",
            str(photos),
            dst,
            "--write-mode",
            "proportion",
            "--resume",
            "--num-workers",
            "0",
            "--quiet",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["dst"] == dst and report["resumed_from"] >= killed_at > 0
    fs, path = open_filesystem(dst)
    assert fs.cat_file(path) == reference.read_bytes() and not os.path.exists(folder)
    again = CliRunner().invoke(main, ["convert", str(photos), dst, "--resume", "--quiet"])
    assert again.exit_code == 1 and "already exists" in again.output  # nothing to resume: DST exists
