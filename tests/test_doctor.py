"""`ffload doctor`: the reading of injected measurements (fractions, the binding limit, the recommended
settings), the report's JSON fields, its text and plot, and the probes on small files. Behaviour only:
no assertion on any timing value."""

from __future__ import annotations

import json
import os
import sys
import time

import cv2
import numpy as np
import pytest
from click.testing import CliRunner

from ffload.bench.doctor import LIMIT_NAMES, analyse, doctor_command, limit, probes, startup
from ffload.bench.doctor.report import format_report, plot_report
from ffload.bench.doctor.run import SCHEMA, worker_counts
from ffload.bench.doctor.verdict import amdahl
from ffload.convert import convert_dataset
from ffload.convert.demo_data import digits_images
from ffload.convert.sources import ArraySource, ImageFolderSource
from ffload.errors import UnavailableError
from ffload.formats import open_dataset

GIB = 2**30


def limits(disk=1e6, decode=1e5, memory=1e7, consumer=None, disk_applies=False):
    return {
        "disk_random": limit(disk, disk_applies),
        "disk_sequential": limit(4 * disk, False),
        "decode": limit(decode, True),
        "memory": limit(memory, True),
        "consumer": limit(consumer, consumer is not None),
    }


def runs(*rates):
    """Runs at 1, 2, 4, ... workers with the given img/s."""
    return [{"num_workers": 2**k, "img_s": r} for k, r in enumerate(rates)]


def test_decode_binds_when_the_loader_is_near_it():
    v = analyse(limits(decode=1e5), runs(5e4, 8.5e4, 9e4), 4, GIB, 16 * GIB, 256)
    assert v["binding"] == "decode"
    assert v["loader_img_s"] == 9e4 and v["best_num_workers"] == 4
    assert v["fractions"]["decode"] == pytest.approx(0.9)
    assert v["fractions"]["memory"] == pytest.approx(9e-3)
    assert "consumer" not in v["fractions"]  # not measured
    assert v["recommended"] == {"num_workers": 4, "batches_ahead": 3, "os_cache": True}  # 8.5e4 < 95% of 9e4
    assert set(v["reasons"]) == {"num_workers", "batches_ahead", "os_cache"}


def test_fewest_workers_within_five_percent_of_the_best():
    assert analyse(limits(), runs(5e4, 8.5e4, 8.6e4), 4, GIB, 16 * GIB, 256)["recommended"]["num_workers"] == 2
    assert analyse(limits(), runs(5e4, 8e4, 9e4), 4, GIB, 16 * GIB, 256)["recommended"]["num_workers"] == 4


def test_the_loader_binds_when_far_from_every_limit():
    v = analyse(limits(decode=1e6), runs(1e5, 1.5e5), 2, GIB, 16 * GIB, 256)
    assert v["binding"] == "loader"
    assert "decode" in v["binding_reason"]  # the nearest limit is named


def test_a_disk_that_does_not_apply_never_binds():
    # the file fits in the page cache: a slow disk limits the first epoch only
    v = analyse(limits(disk=1e3, decode=1e6), runs(1e5), 2, GIB, 16 * GIB, 256)
    assert v["binding"] == "loader"
    assert v["fractions"]["disk_random"] == pytest.approx(100)


def test_the_disk_binds_a_file_larger_than_the_page_cache():
    v = analyse(limits(disk=1e4, disk_applies=True), runs(5e3, 9e3), 2, 40 * GIB, 16 * GIB, 256)
    assert v["binding"] == "disk_random"
    assert v["recommended"]["os_cache"] is False
    assert v["recommended"]["batches_ahead"] == 2 * v["recommended"]["num_workers"]
    assert "quasi_random" in v["reasons"]["os_cache"]


def test_the_consumer_binds_and_gets_just_enough_workers():
    # consumer 256 images per 10 ms = 25,600 img/s; 1.1x that = 28,160
    consumer = 256 / 0.010
    v = analyse(limits(consumer=consumer), runs(2e4, 3e4, 5e4, 6e4), 8, GIB, 16 * GIB, 256, step_ms=10)
    assert v["binding"] == "consumer"
    assert v["recommended"]["num_workers"] == 2
    assert v["recommended"]["batches_ahead"] == 2


def test_a_slow_loader_is_not_bound_by_a_faster_consumer():
    v = analyse(limits(decode=1e5, consumer=1e6), runs(9e4), 2, GIB, 16 * GIB, 256, step_ms=0.1)
    assert v["binding"] == "decode"


def test_a_consumer_keeps_one_cpu_of_many():
    v = analyse(limits(decode=1e9), runs(1, 2, 4, 8), 8, GIB, 16 * GIB, 256, step_ms=1000)
    assert v["binding"] == "loader" and v["best_num_workers"] == 8
    assert v["recommended"]["num_workers"] == 7 and "training thread" in v["reasons"]["num_workers"]


def test_no_successful_run():
    v = analyse(limits(), [{"num_workers": 1, "img_s": None}], 2, GIB, 16 * GIB, 256)
    assert v["binding"] == "unknown" and v["loader_img_s"] is None
    assert v["recommended"]["num_workers"] is None


def test_worker_counts_and_amdahl():
    assert worker_counts(1) == [1]
    assert worker_counts(2) == [1, 2]
    assert worker_counts(16) == [1, 8, 16]
    assert amdahl(0.0, 16) == pytest.approx(16)
    assert amdahl(1.0, 16) == pytest.approx(1)
    assert amdahl(0.05, 16) == pytest.approx(1 / (0.05 + 0.95 / 16))


@pytest.fixture(scope="module")
def raw_beton(tmp_path_factory):
    images, labels = digits_images(16)
    path = str(tmp_path_factory.mktemp("doctor") / "digits.beton")
    convert_dataset(ArraySource(images[:300], labels[:300]), path, write_mode="raw", num_workers=0, progress=False)
    return path


@pytest.fixture(scope="module")
def jpeg_beton(tmp_path_factory):
    root = tmp_path_factory.mktemp("doctor_jpeg")
    rng = np.random.default_rng(0)
    for k in range(12):
        (root / "src" / str(k % 2)).mkdir(parents=True, exist_ok=True)
        image = cv2.GaussianBlur(rng.integers(0, 256, (60 + k, 80, 3), dtype=np.uint8), (5, 5), 0)
        cv2.imwrite(str(root / "src" / str(k % 2) / f"{k}.jpg"), image)
    path = str(root / "photos.beton")
    convert_dataset(ImageFolderSource(str(root / "src")), path, write_mode="jpg", num_workers=0, progress=False)
    return path


def test_probes_on_small_files(raw_beton, jpeg_beton):
    view = open_dataset(raw_beton)
    disk = probes.disk_rates(probes.data_file(view), 768, seconds=0.05, in_flight=2)
    assert disk["random_mib_s"] > 0 and disk["sequential_mib_s"] > 0
    assert disk["read_bytes"] == 4096 and isinstance(disk["direct"], bool) and disk["note"]
    raw = probes.decode_rate(view, "image", samples=50, seconds=0.01)
    assert raw["decoder"] == "copy (raw payloads)" and raw["jpeg_fraction"] == 0
    assert raw["samples"] == 50 and raw["payload_mean_bytes"] == 16 * 16 * 3
    jpeg = probes.decode_rate(open_dataset(jpeg_beton), "image", seconds=0.01)
    assert jpeg["jpeg_fraction"] == 1 and jpeg["samples"] == 12 and jpeg["img_s_per_core"] > 0
    assert probes.memory_bandwidth(1 << 16, seconds=0.01)["buffer_bytes"] == 1 << 16


def test_numba_cache_location_names_a_folder():
    where = startup.numba_cache_location()
    assert set(where) == {
        "numba_cache_dir",
        "locator",
        "path",
        "package_writable",
        "read_only_fallback",
        "fallback_writable",
    }
    assert where["locator"].endswith("CacheLocator") and os.path.isabs(where["path"])
    assert where["read_only_fallback"] != where["path"] or where["numba_cache_dir"]


FAKE_START = {"wall_s": 1.0, "import_s": 0.5, "first_batch_s": 0.9, "ffload": "x"}


def doctor_json(path, monkeypatch, *args):
    """The doctor's JSON report on ``path`` (the start-up subprocess replaced: it only imports)."""
    monkeypatch.setattr(startup, "first_batch", lambda *a, **k: [dict(FAKE_START)])
    result = CliRunner().invoke(doctor_command, [path, "--json", "--seconds", "0.1", *args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_json_report_fields(raw_beton, monkeypatch, tmp_path):
    plot = tmp_path / "doctor.png"
    report = doctor_json(raw_beton, monkeypatch, "--step-ms", "5", "--plot", str(plot))
    assert report["schema"] == SCHEMA
    assert set(report) == {"schema", "dataset", "machine", "limits", "loader", "startup", "verdict", "seconds", "plot"}
    d = report["dataset"]
    assert d["pipeline"] == "simple" and d["batch_size"] == 512 and d["samples"] == 300
    assert d["output_bytes_per_image"] == 16 * 16 * 3 and d["jpeg_fraction"] == 0
    assert set(report["limits"]) == set(LIMIT_NAMES)
    for rec in report["limits"].values():
        assert set(rec) == {"img_s", "applies", "note", "measured"}
    assert report["limits"]["consumer"]["img_s"] == pytest.approx(512 / 0.005)
    assert report["limits"]["consumer"]["applies"] and report["limits"]["decode"]["applies"]
    assert not report["limits"]["disk_random"]["applies"]  # a small file: the page cache holds it
    counts = [r["num_workers"] for r in report["loader"]["runs"]]
    assert counts == worker_counts(report["machine"]["usable_cpus"])
    for run in report["loader"]["runs"]:
        assert set(run) == {"num_workers", "img_s", "batches", "first_batch_s", "wait_fraction"} and run["img_s"] > 0
    v = report["verdict"]
    assert v["binding"] in LIMIT_NAMES + ("loader",)
    assert v["recommended"]["num_workers"] in counts and v["recommended"]["os_cache"] is True
    assert report["loader"]["with_consumer"]["num_workers"] == v["recommended"]["num_workers"]
    s = report["startup"]
    assert s["warm"] == FAKE_START and s["cold"] is None and s["ranks"] is None and s["read_only"] is None
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = format_report(report)
    assert "binding: " in text and "num_workers=" in text and "not measured (--startup)" in text


def test_crop_pipeline_on_jpegs(jpeg_beton, monkeypatch):
    report = doctor_json(jpeg_beton, monkeypatch, "--pipeline", "center", "--size", "32", "--batch-size", "4")
    assert report["dataset"]["pipeline"] == "center" and report["dataset"]["output_bytes_per_image"] == 32 * 32 * 3
    assert report["limits"]["decode"]["measured"]["jpeg_fraction"] == 1
    assert report["limits"]["consumer"]["img_s"] is None and report["loader"]["with_consumer"] is None


def test_text_report_of_a_full_startup(tmp_path):
    report = {
        "dataset": {
            "path": "x.beton",
            "format": "beton",
            "samples": 10,
            "file_bytes": 2**20,
            "jpeg_fraction": 1.0,
            "payload_mean_bytes": 1000.0,
            "pipeline": "rrc",
            "batch_size": 8,
        },
        "machine": {"usable_cpus": 2},
        "limits": limits(consumer=100.0),
        "loader": {
            "runs": [{**r, "batches": 3, "first_batch_s": 0.1} for r in runs(10.0, 20.0)],
            "with_consumer": None,
        },
        "verdict": analyse(limits(consumer=100.0), runs(10.0, 20.0), 2, 2**20, GIB, 8, step_ms=80),
        "startup": {
            "cache": {
                "path": "/c",
                "locator": "InTreeCacheLocator",
                "read_only_fallback": "/u",
                "fallback_writable": 0,
            },
            "warm": FAKE_START,
            "cold": {"error": "exit 1: boom", "wall_s": 1.0},
            "ranks": {"count": 3, "runs": [FAKE_START, FAKE_START], "max_first_batch_s": 0.9, "cache_files": 5},
            "read_only": {"mode": "chmod a-w", "runs": [FAKE_START, FAKE_START], "cache_went_to": "nowhere"},
        },
        "seconds": 3.0,
    }
    text = format_report(report)
    assert "FAILED: exit 1: boom" in text and "3 ranks at once" in text and "NOT writable" in text
    assert "cache went to the nowhere" in text and "binding: loader" in text
    plot_report(report, str(tmp_path / "p.png"))
    assert (tmp_path / "p.png").stat().st_size > 0


def test_bad_datasets(tmp_path):
    result = CliRunner().invoke(doctor_command, [str(tmp_path)])
    assert result.exit_code == 1 and "ffload: error:" in result.output


def test_serial_fraction_of_a_loader(raw_beton):
    """The profile finds the worker and consumer threads, splits their time, and the fraction is a share."""
    from ffload import Loader
    from ffload.bench.serial import PER_THREAD_PROFILES, serial_fraction

    if not PER_THREAD_PROFILES:
        pytest.skip("Python 3.12+: cProfile is one profiler per process (test_serial_fraction_refused_...)")
    r = serial_fraction(lambda w: Loader(raw_beton, batch_size=16, num_workers=w), 30)
    assert {"main", "worker"} <= set(r["per_batch_us"])
    assert r["per_batch_us"]["worker"]["nogil"] > 0  # the decoder's compiled kernels
    assert 0 <= r["serial_fraction"] <= r["serial_fraction_upper"] <= 1
    assert r["batches"] == 30 and r["calls_per_batch"] > 0 and r["top_held"]


def test_serial_fraction_refused_where_cprofile_is_one_per_process(monkeypatch):
    """From Python 3.12 the profiled measure would time every thread on one stack: it refuses, naming
    the measures that work there, before building a loader."""
    from ffload.bench import serial

    monkeypatch.setattr(serial, "PER_THREAD_PROFILES", False)
    built = []
    with pytest.raises(UnavailableError, match="kernel_timed_fraction or gil_sampled_fraction"):
        serial.serial_fraction(built.append, 30)
    assert not built


def test_kernel_timed_fraction_of_a_loader(raw_beton):
    """The threads' CPU clocks and the kernel timers find the worker's compiled time, the consumer's
    Python, and the dispatchers are put back afterwards."""
    from ffload import Loader
    from ffload.bench.serial import kernel_timed_fraction
    from ffload.codecs import jpeg

    decode_rows = jpeg.decode_rows
    r = kernel_timed_fraction(lambda w: Loader(raw_beton, batch_size=16, num_workers=w), 30)
    assert jpeg.decode_rows is decode_rows
    assert r["per_batch_us"]["worker"]["kernel"] > 0 and r["per_batch_us"]["main"]["kernel"] == 0
    assert r["per_batch_us"]["main"]["cpu"] > 0  # next(), the loop
    assert r["kernel_calls_per_batch"] > 0 and r["held_us"] > 0 and r["nogil_us"] > 0
    assert 0 < r["serial_fraction"] < 1


class _Stepper:
    """A stand-in loader whose batches are ``step()`` calls on the consumer's thread."""

    def __init__(self, step):
        self.step = step

    def __iter__(self):
        return self

    def __next__(self):
        return self.step()

    def close(self):
        pass


class _Counted:
    """A stand-in loader of 100-batch epochs of one-row batches, 3 slots of 5 batches, counting
    the batches it made."""

    def __init__(self):
        self.made = 0

    def __len__(self):
        return 100

    def __iter__(self):
        return self

    def __next__(self):
        self.made += 1
        return (np.zeros(1),)

    def stats(self):
        return {"slots": 3, "batches_per_job": 5}

    def close(self):
        pass


def test_loader_rate_warms_every_slot_when_asked():
    """With ``warm_slots`` the rate is timed only after the first batch and a slot's job for each
    slot (3 x 5 batches): 16 batches are made before any is counted; without it, one."""
    for warm, before in ((True, 16), (False, 1)):
        loader = _Counted()
        r = probes.loader_rate(lambda w, made=loader: made, 1, 0.05, warm_slots=warm)
        assert loader.made == before + r["batches"] and r["batches"] > 0


def _spin_steps():
    """A Python step (200 us of CPU holding the GIL) and a compiled one (nogil)."""
    from numba import njit

    def python_step():
        end = time.thread_time() + 200e-6
        while time.thread_time() < end:
            pass

    @njit(nogil=True)
    def spin(n):
        total = 0.0
        for i in range(n):
            total += (i % 7) * 0.5
        return total

    spin(10)
    return python_step, lambda: spin(200_000)


def test_gil_sampled_fraction_tells_python_from_gil_free_work():
    """py-spy's samples of the GIL's holder: a batch made of Python holds it nearly all its CPU
    time, one made by a nogil kernel nearly none; the thread is counted as the consumer."""
    from ffload.bench.serial import gil_sampled_fraction, py_spy_path

    if py_spy_path() is None:
        pytest.skip("py-spy is not installed (the test extra installs it)")
    python_step, kernel_step = _spin_steps()
    try:
        python = gil_sampled_fraction(lambda w: _Stepper(python_step), seconds=1, rate=200)
    except OSError as e:  # py-spy may not attach where ptrace is forbidden (Yama, a container's capabilities)
        pytest.skip(f"py-spy cannot sample this process here: {e}")
    kernel = gil_sampled_fraction(lambda w: _Stepper(kernel_step), seconds=1, rate=200)
    # only the consumer's thread (MainThread) does work; the kinds of other live threads may show
    main = python["per_batch_us"]["main"]
    assert python["batches"] > 0 and python["samples"]["main"] > 50
    assert main["held"] > 0.5 * main["cpu"] > 0
    assert kernel["per_batch_us"]["main"]["held"] < 0.2 * kernel["per_batch_us"]["main"]["cpu"]


def test_gil_traced_fraction_tells_python_from_gil_free_work():
    """Every hold of the GIL, traced: a batch made of Python holds it nearly all its CPU time, one
    made by a nogil kernel nearly none, and drops it at least once per batch; the probes and their
    tracing instance are gone afterwards."""
    from ffload.bench.serial import _GROUP, TRACEFS, GilTrace, _pid_namespace, gil_traced_fraction

    mine = f"{_GROUP}{_pid_namespace()}_{os.getpid()}_"  # this process's traces
    try:
        GilTrace().close()
    except UnavailableError as e:  # not root, no uprobe events, a stripped interpreter
        pytest.skip(f"the GIL cannot be traced here: {e}")
    python_step, kernel_step = _spin_steps()
    python = gil_traced_fraction(lambda w: _Stepper(python_step), seconds=0.5)
    kernel = gil_traced_fraction(lambda w: _Stepper(kernel_step), seconds=0.5)
    main = python["per_batch_us"]["main"]
    assert python["batches"] > 0 and python["probe_us"] > 0
    assert main["held"] > 0.5 * main["cpu"] > 0
    k = kernel["per_batch_us"]["main"]
    assert k["held"] < 0.2 * k["cpu"] and k["holds"] >= 1
    with open(os.path.join(TRACEFS, "uprobe_events")) as f:
        assert f"{mine}/" not in f.read()
    assert not [name for name in os.listdir(os.path.join(TRACEFS, "instances")) if name.startswith(mine)]


def test_gil_holds_pair_each_threads_events_of_this_process():
    """A trace's events paired per thread: holds summed, other processes' events left out, a
    thread's first event a drop (a hold begun before the trace) passed over, a later drop without
    its took and a took replaced by another counted as unpaired; the header's overwritten events
    are read as lost."""
    from ffload.bench.serial import _lost_events, gil_holds

    lines = [
        b"# entries-in-buffer/entries-written: 7/9   #P:2\n",
        b"          python-12     (     10) [000] d..1.  5.000000: drop: (0x7f)\n",
        b"          python-11     (     10) [001] d..1.  5.000001: took: (0x7f <- 0x7e)\n",
        b"          python-11     (     10) [001] d..1.  5.000004: drop: (0x7f)\n",
        b"          python-12     (     10) [000] d..1.  5.000005: took: (0x7f <- 0x7e)\n",
        b"          python-12     (     10) [000] d..1.  5.000006: took: (0x7f <- 0x7e)\n",
        b"          python-12     (     10) [000] d..1.  5.000008: drop: (0x7f)\n",
        b"           other-99     (     99) [001] d..1.  5.000009: took: (0x7f <- 0x7e)\n",
        b"          python-11     (     10) [001] d..1.  5.000010: drop: (0x7f)\n",
    ]
    held, unpaired = gil_holds(lines, 10)
    assert set(held) == {11, 12} and held[11][1] == held[12][1] == 1 and unpaired == 2
    assert held[11][0] == pytest.approx(3e-6) and held[12][0] == pytest.approx(2e-6)
    assert _lost_events(lines[0]) == 2 and _lost_events(b"# tracer: nop\n") == 0


def test_gil_trace_records_only_while_every_probe_is_on(monkeypatch):
    """The instance's buffer is off while the probes are switched (installing them in a busy
    process takes long enough for drops to be traced without their takes), on only once all are."""
    from ffload.bench import serial

    written = []
    monkeypatch.setattr(serial, "_tracefs_write", lambda path, value, append=False: written.append((path, value)))
    trace = object.__new__(serial.GilTrace)
    trace._instance, trace.group = "instances/g", "g"
    trace._enable(True)
    trace._enable(False)
    buffer, probes = "instances/g/tracing_on", os.path.join("instances/g", "events", "g", "enable")
    assert written == [(buffer, "0"), (probes, "1"), (buffer, "1"), (buffer, "0"), (probes, "0")]


def test_gil_trace_that_fails_to_set_up_removes_what_it_made(tmp_path, monkeypatch):
    """A tracefs where the instance cannot be sized (a stand-in directory: its files are missing):
    UnavailableError, the two probes it added are removed again, its instance directory is gone,
    and a dead process's leftovers in this PID namespace are removed first (another namespace's
    are not: its pids are not this process's to check); uprobe_events is only ever appended to."""
    from ffload.bench import serial

    dead, foreign = f"ffload_gil_{serial._pid_namespace()}_999999999_abc", "ffload_gil_1_999999999_abc"
    for name in (dead, foreign):
        (tmp_path / "instances" / name).mkdir(parents=True)
    (tmp_path / "uprobe_events").write_text(f"p:{dead}/drop /lib.so:0x10\np:{foreign}/drop /lib.so:0x10\n")
    monkeypatch.setattr(serial, "TRACEFS", str(tmp_path))
    monkeypatch.setattr(serial.sys, "platform", "linux")
    monkeypatch.setattr(serial.os, "geteuid", lambda: 0)
    monkeypatch.setattr(serial, "gil_probe_points", lambda: ("/lib.so", 0x10, 0x20))
    with pytest.raises(UnavailableError, match="uprobes on /lib.so"):
        serial.GilTrace()
    written = (tmp_path / "uprobe_events").read_text().splitlines()
    assert written[2] == f"-:{dead}/drop"
    group = written[3].split()[0].split(":", 1)[1].split("/")[0]
    assert written[3:] == [
        f"r:{group}/took /lib.so:0x10",
        f"p:{group}/drop /lib.so:0x20",
        f"-:{group}/drop",
        f"-:{group}/took",
    ]
    assert os.listdir(tmp_path / "instances") == [foreign]
    with pytest.raises(ValueError, match="never truncated"):
        serial._tracefs_write("uprobe_events", "")


def test_gil_probe_points_refuse_clones_but_not_cold_parts(monkeypatch):
    """A ``.cold`` part of take_gil is the same call (its probes see every hold); a
    ``.constprop`` clone is another entry point, whose holds the probes would miss: refused."""
    import subprocess

    from ffload.bench import serial

    listing = ["0000000000001000 t take_gil", "0000000000002000 t drop_gil", "0000000000003000 t take_gil.cold"]
    monkeypatch.setattr(serial, "_interpreter_file", lambda: "/lib.so")
    monkeypatch.setattr(serial, "_elf_file_offset", lambda path, address: address)
    monkeypatch.setattr(serial.shutil, "which", lambda name: "/usr/bin/nm")
    monkeypatch.setattr(
        serial.subprocess, "run", lambda *a, **kw: subprocess.CompletedProcess(a, 0, "\n".join(listing), "")
    )
    assert serial.gil_probe_points() == ("/lib.so", 0x1000, 0x2000)
    listing.append("0000000000004000 t drop_gil.constprop.0")
    with pytest.raises(UnavailableError, match="copies of the GIL's functions"):
        serial.gil_probe_points()


def test_gil_probe_points_are_offsets_in_the_interpreter_file():
    """Where this interpreter takes and drops the GIL: two distinct offsets inside its file; a file
    that is not ELF is refused with UnavailableError."""
    from ffload.bench import serial

    try:
        path, take, drop = serial.gil_probe_points()
    except UnavailableError as e:  # no nm, a stripped build
        pytest.skip(str(e))
    assert 0 < take < os.path.getsize(path) and 0 < drop < os.path.getsize(path) and take != drop
    with pytest.raises(UnavailableError, match="not a 64-bit little-endian ELF"):
        serial._elf_file_offset(__file__, take)


def test_job_python_after_traffic_runs_jobs_and_closes_the_loader(raw_beton):
    """One median per size copied, each a job's wall time; the loader it made is closed after."""
    from ffload import Loader
    from ffload.bench.serial import job_python_after_traffic

    made = []

    def make(w):
        made.append(Loader(raw_beton, batch_size=16, num_workers=w))
        return made[-1]

    out = job_python_after_traffic(make, mib=(0, 1), repeats=5)
    assert list(out) == [0, 1] and all(us > 0 for us in out.values())
    assert len(made) == 1 and made[0]._closed


def test_gil_samples_are_read_per_thread(tmp_path):
    """py-spy's raw output (``--threads``): counts summed per thread name, frames ignored."""
    from ffload.bench.serial import gil_samples

    raw = tmp_path / "gil.txt"
    raw.write_text(
        "thread (11): MainThread;<module> (a.py:3);f (a.py:9) 7\n"
        "thread (12): ffload-worker_0;run (b.py:1) 5\n"
        "thread (12): ffload-worker_0;run (b.py:2);g (b.py:7) 3\n"
        "thread (13) 2\n"
        "\n"
    )
    assert gil_samples(str(raw)) == {"MainThread": 7, "ffload-worker_0": 8, "thread (13)": 2}


def test_kernel_clock_times_the_calls_through_a_module(monkeypatch):
    """A nogil dispatcher named by a module is timed on the calling thread while installed, and
    restored after; a call from compiled code is its caller's time."""
    import threading
    import types

    from numba import njit

    from ffload.bench.serial import KernelClock

    @njit(nogil=True)
    def spin(n):
        total = 0
        for i in range(n):
            total += i % 7
        return total

    module = types.ModuleType("ffload_test_kernels")
    module.spin = spin
    monkeypatch.setitem(sys.modules, module.__name__, module)
    spin(10)
    clock = KernelClock()
    clock.install()
    try:
        assert module.spin is not spin
        assert module.spin(2_000_000) == spin.py_func(2_000_000)
    finally:
        clock.restore()
    assert module.spin is spin
    me = threading.get_ident()
    assert clock.calls == {me: 1} and clock.seconds[me] > 0


def test_split_profile_sorts_kernels_waits_and_python():
    import cProfile
    import pstats
    import threading

    from numba import njit

    from ffload.bench.serial import nogil_kernels, split_profile

    @njit(nogil=True)
    def kernel(x):
        return x + 1

    kernel(1)
    lock = threading.Lock()
    profiler = cProfile.Profile()
    profiler.enable()
    kernel(2)
    with lock:
        sum(range(1000))
    profiler.disable()
    code = kernel.py_func.__code__
    split = split_profile(pstats.Stats(profiler), {(code.co_filename, code.co_firstlineno, code.co_name)})
    assert split["kernel_calls"] == 1 and split["nogil"] > 0
    assert split["held"] > 0 and any("sum" in label for label, _, _ in split["top_held"])
    assert (code.co_filename, code.co_firstlineno, code.co_name) not in nogil_kernels()  # a local: not in a module
