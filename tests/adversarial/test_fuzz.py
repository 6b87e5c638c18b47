"""Seeded fuzz of .beton and LMDB files: bit flips, truncations and extensions of small valid
datasets, each opened, loaded (every field decoded by its default pipeline) and verified in a
child process. Asserted: no child dies of a signal (SIGSEGV, SIGBUS, SIGABRT, the OOM killer),
none hangs, and every failure is a Python exception of ffload's documented kinds.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ffload.formats import BytesField, FloatField, IntField, JSONField, NDArrayField, RGBImageField, write_dataset

MUTATIONS = 150  # per format
SECONDS_PER_INPUT = 30  # a hang is anything slower than this for a 16-sample dataset
ACCEPTED = {
    "ok",
    "DatasetError",
    "LoaderError",
    "FieldError",
    "ValueError",
    "FormatError",
    "CorruptFileError",
    "FfloadError",
    "MemoryError",
}
CHILD = Path(__file__).with_name("fuzz_child.py")


def _samples(n: int = 16):
    rng = np.random.default_rng(0)
    for i in range(n):
        side = int(rng.integers(8, 40))
        img = rng.integers(0, 256, (side, side + 3, 3), dtype=np.uint8)
        yield (
            img,
            img,
            i,
            float(i) / 3,
            bytes(rng.integers(0, 256, i, dtype=np.uint8)),
            {"i": i, "name": f"s{i}"},
            rng.standard_normal((2, 3)).astype(np.float32),
        )


FIELDS = {
    "raw": RGBImageField("raw"),
    "jpg": RGBImageField("jpg", jpeg_quality=80),
    "label": IntField(),
    "score": FloatField(),
    "blob": BytesField(),
    "meta": JSONField(),
    "arr": NDArrayField(np.dtype("float32"), (2, 3)),
}


def _mutate(data: bytes, rng: np.random.Generator) -> bytes:
    kind = rng.integers(0, 3)
    if kind == 0:  # flip 1-8 bits
        buf = bytearray(data)
        for _ in range(int(rng.integers(1, 9))):
            pos = int(rng.integers(0, len(buf)))
            buf[pos] ^= 1 << int(rng.integers(0, 8))
        return bytes(buf)
    if kind == 1:  # truncate
        return data[: int(rng.integers(0, len(data)))]
    return data + bytes(rng.integers(0, 256, int(rng.integers(1, 70000)), dtype=np.uint8))  # extend


def _run_children(inputs: list[tuple[int, str]]) -> dict[int, str]:
    """Feed ``inputs`` to child processes; restart after a death. Returns index -> outcome, where a
    signal death is ``signal:<NAME>`` and a hang ``hang``."""
    outcomes: dict[int, str] = {}
    pending = list(inputs)
    while pending:
        feed = "".join(f"{i} {p}\n" for i, p in pending)
        proc = subprocess.Popen(
            [sys.executable, str(CHILD)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        try:
            out, _ = proc.communicate(feed, timeout=60 + SECONDS_PER_INPUT * len(pending))
            hung = False
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
            hung = True
        started = None
        for line in out.splitlines():
            words = line.split()
            if words[:1] == ["START"]:
                started = int(words[1])
            elif words[:1] == ["DONE"]:
                outcomes[int(words[1])] = words[2]
                started = None
        if started is not None:
            outcomes[started] = (
                "hang"
                if hung
                else f"signal:{signal.Signals(-proc.returncode).name}"
                if proc.returncode < 0
                else f"exit:{proc.returncode}"
            )
        elif proc.returncode != 0 and not hung:
            raise AssertionError(f"fuzz child failed before its first input (exit {proc.returncode})")
        pending = [(i, p) for i, p in pending if i not in outcomes]
    return outcomes


@pytest.mark.parametrize("suffix", [".beton", ".lmdb"])
def test_mutated_files_never_kill_or_hang_the_reader(tmp_path, suffix):
    good = tmp_path / f"good{suffix}"
    write_dataset(str(good), FIELDS, _samples(), 16)
    target = "data.mdb" if suffix == ".lmdb" else ""
    original = (good / target if target else good).read_bytes()
    rng = np.random.default_rng(1234 if suffix == ".beton" else 4321)
    inputs = []
    for k in range(MUTATIONS):
        path = tmp_path / f"m{k:03d}{suffix}"
        if target:
            shutil.copytree(good, path)
            (path / target).write_bytes(_mutate(original, rng))
        else:
            path.write_bytes(_mutate(original, rng))
        inputs.append((k, str(path)))
    outcomes = _run_children(inputs)
    assert len(outcomes) == MUTATIONS
    bad = {k: v for k, v in outcomes.items() if v not in ACCEPTED}
    assert not bad, f"{len(bad)} inputs killed, hung or raised an unexpected error: {sorted(bad.items())[:20]}"
    # the fuzz reached the readers: most mutations were refused or caught, some still load
    kinds = set(outcomes.values())
    assert "ok" in kinds and len(kinds) > 1, kinds
    for _, p in inputs:
        shutil.rmtree(p, ignore_errors=True) if os.path.isdir(p) else os.unlink(p)
