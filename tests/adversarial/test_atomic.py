"""Output atomicity and concurrent writers: --overwrite swaps in one step, a second writer of the same DST
fails at once naming the first, SIGTERM is Ctrl-C (exit 143, nothing left), and temporaries of dead writers
are removed by the next writer."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from ffload.errors import DatasetBusyError
from ffload.formats import IntField, RGBImageField, open_dataset, write_dataset
from ffload.formats.atomic import _exchange, lock_path, writer_lock

FIELDS = {"image": RGBImageField("raw"), "label": IntField()}
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))


def _write(dst, n, value=1, **kwargs):
    write_dataset(dst, FIELDS, [(np.full((4, 4, 3), value, np.uint8), i) for i in range(n)], n, **kwargs)


def _entries(folder):
    return sorted(os.listdir(folder))


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_rename_exchange_swaps_two_directories(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "in_a").touch()
    assert _exchange(str(tmp_path / "a"), str(tmp_path / "b"))  # tmpfs, ext4, xfs, btrfs support it
    assert os.listdir(tmp_path / "b") == ["in_a"] and os.listdir(tmp_path / "a") == []


@pytest.mark.parametrize("suffix", [".beton", ".lmdb"])
def test_overwrite_replaces_in_one_step_and_leaves_nothing_else(tmp_path, suffix):
    dst = str(tmp_path / f"d{suffix}")
    _write(dst, 3)
    _write(dst, 5, overwrite=True)
    assert open_dataset(dst).num_samples == 5
    assert _entries(tmp_path) == [f"d{suffix}"]  # no temporary, no lock file, no old copy


@pytest.mark.parametrize("suffix", [".beton", ".lmdb"])
def test_a_second_writer_fails_at_once_naming_the_first(tmp_path, suffix):
    dst = str(tmp_path / f"d{suffix}")
    _write(dst, 3)
    with writer_lock(dst):
        with pytest.raises(DatasetBusyError, match=rf"d\{suffix} is being written by process {os.getpid()}"):
            _write(dst, 5, overwrite=True)
        run = subprocess.run(
            [
                sys.executable,
                "-c",
                "import sys, numpy as np\n"
                "from ffload.formats import IntField, write_dataset\n"
                "write_dataset(sys.argv[1], {'label': IntField()}, [(1,)], 1, overwrite=True)",
                dst,
            ],
            capture_output=True,
            text=True,
            env=ENV,
            timeout=120,
        )
        assert run.returncode == 1 and f"being written by process {os.getpid()}" in run.stderr, run.stderr
    assert open_dataset(dst).num_samples == 3
    _write(dst, 5, overwrite=True)  # released: the next writer goes through
    assert open_dataset(dst).num_samples == 5 and not os.path.exists(lock_path(dst))


def test_two_concurrent_cli_conversions_one_wins_one_fails_cleanly(tmp_path):
    import cv2

    src = tmp_path / "src" / "c"
    src.mkdir(parents=True)
    for i in range(150):
        cv2.imwrite(str(src / f"{i}.png"), np.full((64, 64, 3), i, np.uint8))
    dst = str(tmp_path / "d.lmdb")
    command = [
        sys.executable,
        "-m",
        "ffload.cli",
        "convert",
        str(tmp_path / "src"),
        dst,
        "--overwrite",
        "--quiet",
        "--num-workers",
        "0",
    ]
    runs = [subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=ENV) for _ in range(2)]
    results = [(p.wait(timeout=120), p.stderr.read()) for p in runs]
    assert sorted(code for code, _ in results)[0] == 0, results
    for code, err in results:
        assert code == 0 or ("is being written by process" in err and "Traceback" not in err), results
    assert open_dataset(dst).num_samples == 150 and _entries(tmp_path) == ["d.lmdb", "src"]


def test_temporaries_of_dead_writers_are_removed_by_the_next_writer(tmp_path):
    dead = _dead_pid()
    (tmp_path / f".d.beton.tmp-{dead}-0badc0de").write_bytes(b"x" * 1000)
    (tmp_path / f".d.lmdb.tmp-{dead}-0badc0de").mkdir()
    (tmp_path / f".d.lmdb.tmp-{os.getppid()}-0badc0de").mkdir()  # a live process's: kept
    (tmp_path / ".d.beton.lock").write_text(f"{dead}\n")  # a SIGKILLed holder's lock file: not held
    _write(str(tmp_path / "d.beton"), 2)
    _write(str(tmp_path / "d.lmdb"), 2)
    assert _entries(tmp_path) == [f".d.lmdb.tmp-{os.getppid()}-0badc0de", "d.beton", "d.lmdb"]


def test_sigterm_is_handled_like_ctrl_c(tmp_path):
    import cv2

    src = tmp_path / "src" / "c"
    src.mkdir(parents=True)
    for i in range(8):
        cv2.imwrite(str(src / f"{i}.png"), np.random.default_rng(i).integers(0, 255, (16, 16, 3), np.uint8))
    dst = str(tmp_path / "d.beton")
    _write(dst, 3)
    child = os.path.join(os.path.dirname(__file__), "kill_child.py")  # SIGTERM while sample 4 is written
    run = subprocess.run(
        [sys.executable, child, str(tmp_path / "src"), dst, "SIGTERM", "add-4"],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=120,
    )
    assert run.returncode == 143 and "terminated (SIGTERM)" in run.stderr, run.stderr
    assert "Traceback" not in run.stderr, run.stderr
    assert open_dataset(dst).num_samples == 3 and _entries(tmp_path) == ["d.beton", "src"]
