"""The distributions a user installs: ``python -m build`` gives a wheel and an sdist that ``twine check``
accepts; the wheel holds the package only, the sdist also what its tests need; the metadata (PEP 621 in
``pyproject.toml``) carries the one version (``ffload.__version__``), the license and the Python range."""

from __future__ import annotations

import email
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

import ffload

REPO = Path(__file__).resolve().parents[1]
pytest.importorskip("build")
pytest.importorskip("twine")


@pytest.fixture(scope="module")
def dists(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("dist")
    # --no-isolation: the build backend (setuptools) of this environment, no download
    subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(REPO)],
        check=True,
        capture_output=True,
        timeout=600,
    )
    return {"wheel": next(out.glob("*.whl")), "sdist": next(out.glob("*.tar.gz"))}


def test_twine_accepts_both(dists):
    check = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", *map(str, dists.values())],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    assert check.stdout.count("PASSED") == 2


def test_wheel_holds_the_package_and_its_metadata(dists):
    with zipfile.ZipFile(dists["wheel"]) as wheel:
        names = wheel.namelist()
        info = f"ffload-{ffload.__version__}.dist-info"
        meta = email.message_from_bytes(wheel.read(f"{info}/METADATA"))
        entry_points = wheel.read(f"{info}/entry_points.txt").decode()
    assert dists["wheel"].name == f"ffload-{ffload.__version__}-py3-none-any.whl"
    assert {name.split("/")[0] for name in names} == {"ffload", info}
    assert "ffload/__init__.py" in names and "ffload/loaders/loader.py" in names
    assert "ffload/py.typed" in names  # PEP 561: checkers use the annotations of the installed package
    assert f"{info}/licenses/LICENSE" in names
    assert meta["Version"] == ffload.__version__ and meta["License-Expression"] == "Apache-2.0"
    assert meta["Requires-Python"] == ">=3.10"
    requires = meta.get_all("Requires-Dist")
    assert any(r.startswith("torch>=") for r in requires) and any(r.startswith("numba>=") for r in requires)
    assert "ffload = ffload.cli:main" in entry_points


def test_sdist_holds_what_its_tests_need(dists):
    root = f"ffload-{ffload.__version__}"
    with tarfile.open(dists["sdist"]) as sdist:
        names = set(sdist.getnames())
    tracked = subprocess.run(["git", "ls-files", "tests", "scripts", "docs"], cwd=REPO, capture_output=True, text=True)
    if tracked.returncode != 0:
        pytest.skip("not a git checkout")
    expected = {f"{root}/{name}" for name in tracked.stdout.split()}
    assert expected <= names, sorted(expected - names)[:10]
    for name in ("LICENSE", "README.md", "CHANGELOG.md", "pyproject.toml", "ffload/__init__.py"):
        assert f"{root}/{name}" in names
    assert not any("__pycache__" in name for name in names)
