"""The README's install path on a Python that refuses ``pip install`` (PEP 668).

A fake "system" Python is assembled in a temporary directory: a copy of this interpreter's
binary beside a stdlib made of links to the real one plus an ``EXTERNALLY-MANAGED`` marker —
exactly how Debian marks its Python (pip reads the marker from ``sysconfig``'s stdlib path). The
test first proves that this Python refuses ``pip install`` as Debian's does, then runs
``scripts/install.sh`` from a clean copy of the repository under ``env -i`` with that Python
first on a minimal PATH, and checks that ffload imports and its CLI runs from ``.venv``, that the
script says which torch build it installed and why, and that it keeps the torch of an active
virtualenv instead of installing one.
No extra is installed (``FFLOAD_EXTRAS=``): ffload itself is what these tests need, and CI's own step runs
the README's first command with the test and ffcv extras from a clean clone under ``env -i``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(
    sys.platform != "linux" or not shutil.which("git") or not (REPO / ".git").exists(),
    reason="a git checkout on Linux only",
)


def _fake_system_python(root: Path, *, with_venv: bool = True) -> Path:
    """An interpreter at ``root/bin/python3`` whose stdlib carries ``EXTERNALLY-MANAGED``.
    ``with_venv=False`` leaves ``ensurepip`` out, as Debian does without ``python3-venv``."""
    stdlib = Path(sysconfig.get_path("stdlib"))
    version = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    (root / "bin").mkdir(parents=True)
    lib = root / "lib" / version
    lib.mkdir(parents=True)
    base = Path(getattr(sys, "_base_executable", sys.executable)).resolve()
    shutil.copy2(base, root / "bin" / "python3")
    for entry in stdlib.iterdir():
        if entry.name == "site-packages" or (entry.name == "ensurepip" and not with_venv):
            continue
        (lib / entry.name).symlink_to(entry)
    (lib / "site-packages").mkdir()
    pip = Path(sysconfig.get_path("purelib")) / "pip"
    if pip.is_dir():  # the system pip, so that the refusal below is pip's own
        (lib / "site-packages" / "pip").symlink_to(pip)
    (lib / "EXTERNALLY-MANAGED").write_text(
        "[externally-managed]\nError=This Python is managed by the system (test marker).\n"
    )
    return root / "bin" / "python3"


def _has_nvidia_gpu() -> bool:
    """What ``install.sh`` checks before choosing PyTorch's CPU-only index."""
    return os.path.exists("/proc/driver/nvidia/version") or (
        shutil.which("nvidia-smi") is not None
        and subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode == 0
    )


def _clean_copy(dst: Path) -> Path:
    """The repository's tracked and untracked-but-not-ignored files, as a fresh clone has them."""
    files = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        check=True,
        capture_output=True,
    ).stdout.split(b"\0")
    for name in filter(None, files):
        src = REPO / os.fsdecode(name)
        if src.is_file():
            (dst / os.fsdecode(name)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst / os.fsdecode(name))
    return dst


def _env(bindir: Path, **extra: str) -> dict:
    """``env -i``-like: a minimal PATH with the fake Python first, HOME kept for pip's cache."""
    env = {
        "PATH": f"{bindir}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": os.environ.get("HOME", "/root"),
        "LANG": "C.UTF-8",
    }
    env.update(extra)
    return env


@pytest.mark.install
@pytest.mark.skipif(
    os.environ.get("FFLOAD_INSTALL_TESTS") != "1",
    reason="installs a fresh environment with torch (minutes): set FFLOAD_INSTALL_TESTS=1; .ci/run runs it in its "
    "env -i environment, beside the main suite",
)
def test_install_script_on_an_externally_managed_python(tmp_path):
    python = _fake_system_python(tmp_path / "py")
    refused = subprocess.run(
        [str(python), "-m", "pip", "install", "--dry-run", "six"],
        env=_env(python.parent),
        capture_output=True,
        text=True,
    )
    if "No module named pip" not in refused.stderr:  # the system has a pip: it must refuse
        assert refused.returncode != 0
        assert "externally-managed-environment" in refused.stderr + refused.stdout

    repo = _clean_copy(tmp_path / "repo")
    # No torch in the new venv and no GPU here: the script tries PyTorch's CPU-only index (not reachable from
    # these machines), then the default index. A user's pip constraint (this torch's release, which pip finds
    # in its cache) keeps the fallback from installing a multi-GB CUDA build in a test.
    constraint = tmp_path / "constraints.txt"
    constraint.write_text(f"torch=={torch.__version__.split('+')[0]}\n")
    run = subprocess.run(
        ["bash", "scripts/install.sh"],
        cwd=repo,
        capture_output=True,
        text=True,
        env=_env(python.parent, FFLOAD_EXTRAS="", PIP_CONSTRAINT=str(constraint)),
        timeout=1200,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "source .venv/bin/activate" in run.stdout
    said = [line for line in run.stdout.splitlines() if "torch" in line]
    assert len(said) == 1 and said[0].startswith("install: installed torch "), run.stdout
    assert ("PyTorch's CPU-only index" in said[0]) != _has_nvidia_gpu(), said  # tried, or the index it came from
    venv_python = repo / ".venv" / "bin" / "python"
    probe = subprocess.run(
        [
            str(venv_python),
            "-c",
            "import sys, ffload, torch; print(sys.prefix != sys.base_prefix, torch.__version__, ffload.__file__)",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=_env(python.parent),
    )
    assert probe.returncode == 0, probe.stderr
    in_venv, torch_version, ffload_file = probe.stdout.split()
    assert in_venv == "True" and torch_version.split("+")[0] == torch.__version__.split("+")[0]
    assert f"installed torch {torch_version} (" in said[0]
    assert Path(ffload_file).resolve().is_relative_to(repo.resolve())  # the editable install of the copy
    cli = subprocess.run(
        [str(repo / ".venv" / "bin" / "ffload"), "--help"], capture_output=True, text=True, env=_env(python.parent)
    )
    assert cli.returncode == 0 and "convert" in cli.stdout

    # an active virtualenv is used as it is: .venv becomes a link to it, nothing new is created, and its torch is
    # kept (an index that serves nothing proves that no torch install was attempted)
    again = _clean_copy(tmp_path / "repo2")
    run = subprocess.run(
        ["bash", "scripts/install.sh"],
        cwd=again,
        capture_output=True,
        text=True,
        env=_env(
            repo / ".venv" / "bin",
            FFLOAD_EXTRAS="",
            VIRTUAL_ENV=str(repo / ".venv"),
            FFLOAD_TORCH_INDEX=(tmp_path / "no-index").as_uri(),
        ),
        timeout=1200,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert (again / ".venv").is_symlink() and (again / ".venv").resolve() == (repo / ".venv").resolve()
    assert f"install: keeping the torch {torch_version} (" in run.stdout


def test_install_script_names_the_missing_venv_package(tmp_path):
    python = _fake_system_python(tmp_path / "py", with_venv=False)
    tools = tmp_path / "tools"  # bash and the few commands the script needs, but no apt-get
    tools.mkdir()
    for name in ("dirname", "id", "rm", "ln", "pwd"):
        found = shutil.which(name)
        if found:
            (tools / name).symlink_to(found)
    repo = _clean_copy(tmp_path / "repo")
    run = subprocess.run(
        [shutil.which("bash"), "scripts/install.sh"],
        cwd=repo,
        capture_output=True,
        text=True,
        env={"PATH": f"{python.parent}:{tools}", "HOME": str(tmp_path)},
        timeout=60,
    )
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    assert run.returncode == 1
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and f"python{version}-venv" in lines[0], run.stderr
    assert not (repo / ".venv").exists()
