"""Resumable .beton conversion: a conversion killed with SIGKILL and resumed gives the bytes of an
uninterrupted one; a resume with other arguments or a changed source is refused."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from click.testing import CliRunner

from ffload.cli import main
from ffload.convert import convert_dataset
from ffload.convert.sources import ImageFolderSource
from ffload.errors import ConfigurationError
from ffload.formats.beton import BetonWriter
from ffload.formats.fields.bytes import BytesField
from ffload.formats.fields.scalars import IntField

# Converts argv[1] to argv[2] (resume when argv[3] == "1") in this process, a few samples per
# chunk, a checkpoint after every chunk; the source sleeps a little per sample so that a kill
# lands mid-run.
RUNNER = textwrap.dedent("""
    import sys, time
    from ffload.convert import convert_dataset
    from ffload.convert.sources import ImageFolderSource

    read = ImageFolderSource.encoded

    def slow(self, i):
        time.sleep(0.02)
        return read(self, i)

    ImageFolderSource.encoded = slow
    convert_dataset(ImageFolderSource(sys.argv[1]), sys.argv[2], write_mode="proportion", num_workers=0, progress=False,
                    chunk_size=3, checkpoint_seconds=0, resume=sys.argv[3] == "1")
""")


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    from ffload.convert.demo_data import build_photos_folder

    root = tmp_path_factory.mktemp("resume") / "photos"
    build_photos_folder(root, n_per_class=4)
    return root


def run(src, dst, resume: bool, kill_after: int | None = None, journal: str | None = None) -> int | None:
    """Run RUNNER (with this process's environment); with ``kill_after``, SIGKILL it once its
    journal (``journal``, default: beside ``dst``) records that many samples. Returns the samples
    the journal recorded at the kill (None when it ran to the end)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.Popen(
        [sys.executable, "-c", RUNNER, str(src), str(dst), "1" if resume else "0"], env=env, stderr=subprocess.PIPE
    )
    if journal is None:
        journal = os.path.join(os.path.dirname(dst), f".{os.path.basename(dst)}.partial.json")
    if kill_after is None:
        assert proc.wait(timeout=120) == 0, proc.stderr.read().decode()
        return None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            with open(journal) as f:
                samples = json.load(f)["samples"]
        except (OSError, ValueError):
            samples = -1
        if samples >= kill_after:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            return samples
        assert proc.poll() is None, "the conversion ended before the kill: " + proc.stderr.read().decode()
        time.sleep(0.002)
    proc.kill()
    raise AssertionError("no checkpoint reached")


def test_killed_and_resumed_conversions_give_the_same_bytes(tmp_path, photos):
    reference = tmp_path / "reference.beton"
    run(photos, reference, resume=False)
    n = len(ImageFolderSource(photos))
    dst = tmp_path / "out" / "x.beton"
    dst.parent.mkdir()
    first = run(photos, dst, resume=False, kill_after=2)
    assert not dst.exists() and (dst.parent / ".x.beton.partial").exists()
    second = run(photos, dst, resume=True, kill_after=n // 2)  # a resumed run killed too
    assert first < second < n
    run(photos, dst, resume=True)
    assert dst.read_bytes() == reference.read_bytes()
    assert sorted(os.listdir(dst.parent)) == ["x.beton"]  # journal and partial output gone
    # the provenance written before each kill survived in the journal: every sample names its file
    from ffload.formats import open_dataset
    from ffload.formats.dataset_origins import dataset_origins

    origins = dataset_origins(open_dataset(str(dst)))
    source = ImageFolderSource(photos)
    assert origins.strings(0, n) == [os.path.relpath(path, photos) for path, _ in source.samples]


def test_resume_late_kill_and_cli_report(tmp_path, photos):
    n = len(ImageFolderSource(photos))
    reference = tmp_path / "reference.beton"
    run(photos, reference, resume=False)
    dst = tmp_path / "y.beton"
    killed_at = run(photos, dst, resume=False, kill_after=n - 4)
    out = CliRunner().invoke(
        main,
        [
            "convert",
            str(photos),
            str(dst),
            "--write-mode",
            "proportion",
            "--resume",
            "--num-workers",
            "0",
            "--quiet",
            "--json",
        ],
    )
    assert out.exit_code == 0, out.output
    summary = json.loads(out.output)
    assert summary["samples"] == n and 0 < summary["resumed_from"] <= n
    assert summary["passed_through"] > 0 and killed_at >= n - 4
    assert dst.read_bytes() == reference.read_bytes()


def killed_partial(photos, dst) -> None:
    run(photos, dst, resume=False, kill_after=3)


def test_resume_refuses_other_arguments_a_changed_source_and_lmdb(tmp_path, photos):
    import shutil

    src = tmp_path / "src"
    shutil.copytree(photos, src)
    dst = tmp_path / "z.beton"
    killed_partial(src, dst)
    with pytest.raises(ConfigurationError, match="other arguments.*fields"):
        convert_dataset(ImageFolderSource(src), str(dst), write_mode="jpg", num_workers=0, progress=False, resume=True)
    with pytest.raises(ConfigurationError, match="other arguments.*reencode: was False, now True"):
        convert_dataset(
            ImageFolderSource(src),
            str(dst),
            write_mode="proportion",
            num_workers=0,
            progress=False,
            resume=True,
            reencode=True,
        )
    victim = sorted((src / "chelsea").iterdir())[0]
    victim.write_bytes(victim.read_bytes() + b"\0")  # same path, other content
    with pytest.raises(ConfigurationError, match="the source changed"):
        convert_dataset(
            ImageFolderSource(src), str(dst), write_mode="proportion", num_workers=0, progress=False, resume=True
        )
    assert (tmp_path / ".z.beton.partial").exists()  # a refused resume leaves the partial output
    with pytest.raises(ConfigurationError, match=".beton outputs only"):
        convert_dataset(ImageFolderSource(src), str(tmp_path / "z.lmdb"), num_workers=0, progress=False, resume=True)
    # without --resume, a new conversion starts over and cleans up
    convert_dataset(ImageFolderSource(src), str(dst), write_mode="proportion", num_workers=0, progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src", "z.beton"]


def test_checkpoint_then_resume_with_grown_pages(tmp_path):
    """The writer's own checkpoint/resume across a page-size growth (a sample larger than a page)."""
    fields = {"blob": BytesField(), "label": IntField()}
    rng = np.random.default_rng(0)
    samples = [(rng.integers(0, 256, size, np.uint8), i) for i, size in enumerate([1000, 3 << 20, 5000, 9 << 20, 10])]
    encoded = [[f.encode(v, i) for f, v in zip(fields.values(), s)] for i, s in enumerate(samples)]

    def add(writer, i):
        writer.add(i, [m for m, _ in encoded[i]], [p for _, p in encoded[i]], origin=f"class/{i}.bin")

    room = 1 << 10  # the origin block's room, reserved up front: only page growth moves the data
    ref = str(tmp_path / "ref.beton")
    with BetonWriter(ref, fields, 5, page_size=2 << 20, origin_room=room) as w:
        for i in range(5):
            add(w, i)
    part = str(tmp_path / "part.beton")
    w = BetonWriter(part, fields, 5, page_size=2 << 20, origin_room=room)
    grown = []
    w.before_grow = lambda: grown.append(w.count)
    metas, allocs, origins = [], [], []
    for i in range(4):
        add(w, i)
        state, m, a, o = w.checkpoint()
        metas.append(m)
        allocs.append(a)
        origins.append(o)
    with open(part, "ab") as f:
        f.write(b"garbage after the checkpoint")
    w.abort()
    assert grown == [1, 3]
    resumed = BetonWriter(
        part,
        fields,
        5,
        origin_room=room,
        resume=(state, np.concatenate(metas), np.concatenate(allocs), b"".join(origins)),
    )
    with resumed:
        add(resumed, 4)
    assert open(part, "rb").read() == open(ref, "rb").read()


def test_a_journal_that_cannot_be_continued_is_named_and_its_partial_output_kept(tmp_path, photos):
    dst = tmp_path / "z.beton"
    killed_partial(photos, dst)
    journal_path = tmp_path / ".z.beton.partial.json"
    origins_path = tmp_path / ".z.beton.partial.origins"
    journal = json.loads(journal_path.read_text())
    assert journal["version"] == 2 and journal["origin_bytes"] > 4
    records = bytearray(origins_path.read_bytes())
    records[:4] = (1 << 30).to_bytes(4, "little")  # the first origin record now runs past the file
    origins_path.write_bytes(bytes(records))
    with pytest.raises(
        ConfigurationError,
        match=r"\.z\.beton\.partial\.json: cannot resume from this journal "
        r"\(truncated origin record\)",
    ):
        convert_dataset(
            ImageFolderSource(photos), str(dst), write_mode="proportion", num_workers=0, progress=False, resume=True
        )
    assert (tmp_path / ".z.beton.partial").stat().st_size >= journal["data_start"] + journal["data_bytes"]
    journal_path.write_text(json.dumps(dict(journal, version=1)))  # a journal of the earlier layout
    out = CliRunner().invoke(
        main,
        ["convert", str(photos), str(dst), "--write-mode", "proportion", "--resume", "--num-workers", "0", "--quiet"],
    )
    assert out.exit_code == 1 and "not an ffload conversion journal (version 2)" in out.output, out.output
    assert "Traceback" not in out.output and (tmp_path / ".z.beton.partial").exists()
