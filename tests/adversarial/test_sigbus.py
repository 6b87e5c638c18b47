"""A mapped data file truncated while it is read (``os_cache=True``, ``verify``, ``inspect``): a
clean error naming the file, never SIGBUS (``ffload.formats.mapguard``); and the guard leaves
every other SIGBUS to the handler that was there before it.

Each case runs in a child process, so that a signal death fails the test (``returncode == -7``)
instead of killing pytest."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from ffload.formats import mapguard

pytestmark = pytest.mark.skipif(not mapguard.SUPPORTED, reason="the SIGBUS guard is Linux x86-64/aarch64 only")

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _child(code: str, *args: str, faulthandler: bool = False) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONFAULTHANDLER"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.path.dirname(TESTS), os.environ.get("PYTHONPATH")]))
    flags = ["-X", "faulthandler"] if faulthandler else []
    return subprocess.run(
        [sys.executable, *flags, "-c", code, *args], capture_output=True, text=True, timeout=300, env=env
    )


_WRITE = """
import glob, os, sys
import numpy as np
from ffload.convert import convert_dataset
from ffload.convert.sources.arrays import ArraySource

def write(path, first=None, **kw):
    # 400 raw 64x64 images of value 7 (4.9 MB); the data file (or the middle shard) to truncate
    images = np.full((400, 64, 64, 3), 7, np.uint8)
    convert_dataset(ArraySource(images, np.arange(400) % 3), path, write_mode="raw", num_workers=0,
                    progress=False, **kw)
    if path.endswith(".lmdb"):
        return os.path.join(path, "data.mdb")
    if path.endswith(".shards"):
        return sorted(glob.glob(os.path.join(path, "*.beton")))[1]
    return path
"""

_BUSY = (
    _WRITE
    + """
import ffload
from ffload.errors import LoaderError

root = sys.argv[1]
for name, kw in [("d.beton", {}), ("d.lmdb", {}), ("d.shards", {"shard_size": "6MiB", "page_size": 2 << 20})]:
    victim = write(os.path.join(root, name), **kw)
    loader = ffload.Loader(os.path.join(root, name), batch_size=10, num_workers=2, batches_ahead=4,
                           order="random", os_cache=True)
    it = iter(loader)
    next(it)
    os.truncate(victim, os.path.getsize(victim) // 3)  # while the workers decode the next batches
    try:
        for images, labels in it:
            if not bool((images == 7).all()):
                print(name, "ZEROS reached the user")
        print(name, "no error")
    except LoaderError as e:
        print(name, "LoaderError", e)
    loader.close()
    print(name, "closed")
"""
)


def test_truncating_the_data_file_under_a_busy_loader_is_a_loader_error(tmp_path):
    """``.beton``, LMDB's ``data.mdb`` and one shard of a sharded dataset, each truncated to a third
    while two workers read it: the epoch ends with a LoaderError naming the file and how it
    shrank (whether the truncation landed between or during a batch's reads), no batch of zeros
    is handed out, the loader closes, and the process lives."""
    run = _child(_BUSY, str(tmp_path))
    assert run.returncode == 0, (run.returncode, run.stderr[-3000:])  # SIGBUS: -7
    lines = run.stdout.splitlines()
    assert "ZEROS" not in run.stdout, run.stdout
    for name, victim in [("d.beton", "d.beton"), ("d.lmdb", "data.mdb"), ("d.shards", "shard-00001.beton")]:
        error = next(line for line in lines if line.startswith(f"{name} LoaderError"))
        assert f"{victim}: the file shrank from " in error and " bytes while it was being read" in error, error
        assert f"{name} closed" in lines


_DURING = (
    _WRITE
    + """
import ffload
from ffload.convert.export import export_webdataset
from ffload.errors import FormatError, LoaderError
from ffload.formats import open_dataset
from ffload.loaders.memory.os_cache import OSCacheMemory
from ffload.loaders.samples import SampleDecoder
from ffload.verify import verify_dataset

root = sys.argv[1]
path = write(os.path.join(root, "d.beton"))
checked = OSCacheMemory.prepare

def prepare_then_truncate(self, indices, batch=None, batches=1):  # the size check passes, then the file shrinks
    checked(self, indices, batch, batches)
    if batch == 2:
        os.truncate(path, 4096)  # every payload now lies past the end

OSCacheMemory.prepare = prepare_then_truncate
loader = ffload.Loader(
    path, batch_size=10, num_workers=1, batches_ahead=0, order="sequential", os_cache=True, batches_per_job=1
)
try:
    for b, (images, labels) in enumerate(loader):
        print("batch", b, "all 7:", bool((images == 7).all()))
except LoaderError as e:
    print("LoaderError", e)
loader.close()
OSCacheMemory.prepare = checked

def fails(what, call):
    try:
        call()
        print(what, "no error")
    except FormatError as e:
        print(what, "FormatError", e)

path = write(os.path.join(root, "e.beton"))
view = open_dataset(path)
region = view.open_region()
os.truncate(path, 4096)
print("region sum", int(region[view.data_size // 2:].sum()))  # main thread, past the end: zeros
fails("decode", lambda: SampleDecoder(view, "image", region)(100))
fails("verify", lambda: verify_dataset(view, num_workers=2))
os.mkdir(os.path.join(root, "out"))
fails("export", lambda: export_webdataset(view, os.path.join(root, "out", "s-%03d.tar")))
print("exported", sorted(os.listdir(os.path.join(root, "out"))))

from ffload.formats.lmdb import reader
data = write(os.path.join(root, "f.lmdb"))
records_table = reader._records_table

def truncate_then_read(*args):  # LMDB's own map is read after its pages were checked
    os.truncate(data, 8192)  # the two meta pages stay
    return records_table(*args)

reader._records_table = truncate_then_read
fails("lmdb open", lambda: open_dataset(os.path.join(root, "f.lmdb")))
"""
)


def test_a_truncation_during_a_batch_and_on_the_main_thread_is_an_error_and_zeros_never_pass(tmp_path):
    """The file shrinks after a batch's size check and before its reads (deterministic: a hook in
    ``prepare``): the reads fault, the guard maps zeros, the batch is refused with the file named
    and the faulting offset; the batches before are whole. On the main thread, a region read past
    the new end gives zeros (no signal), and ``SampleDecoder``, ``verify_dataset`` and
    ``export_webdataset`` raise FormatError (export leaves no shard); so does opening an LMDB
    database whose ``data.mdb`` shrinks while LMDB itself reads it."""
    run = _child(_DURING, str(tmp_path))
    assert run.returncode == 0, (run.returncode, run.stderr[-3000:])
    lines = run.stdout.splitlines()
    assert lines[:2] == ["batch 0 all 7: True", "batch 1 all 7: True"], run.stdout
    error = lines[2]
    assert error.startswith("LoaderError epoch 0, batch 2 ") and "FormatError" in error, error
    assert (
        "d.beton: the file shrank from " in error and " to 4096 bytes while it was being read; reading byte " in error
    )
    assert "found no data" in error  # the guard's path, not the size check's
    assert lines[3] == "region sum 0"
    for what in ("decode", "verify", "export"):
        line = next(x for x in lines if x.startswith(what + " "))
        assert line.startswith(f"{what} FormatError ") and "e.beton: the file shrank from " in line, line
    assert "exported []" in lines
    line = next(x for x in lines if x.startswith("lmdb open "))  # py-lmdb's map, guarded while the dataset opens
    assert line.startswith("lmdb open FormatError ") and "data.mdb: the file shrank from " in line, line
    assert " to 8192 bytes while it was being read; reading byte " in line, line


_FOREIGN = """
import mmap, os, sys
import numpy as np
from ffload.formats import write_dataset, IntField, BytesField, open_dataset

root = sys.argv[1]
guarded = os.path.join(root, "d.beton")
write_dataset(guarded, {"blob": BytesField(), "label": IntField()}, [(bytes(5000), i) for i in range(50)], 50)
region = open_dataset(guarded).open_region()  # installs the guard
other = os.path.join(root, "other.bin")
with open(other, "wb") as f:
    f.write(bytes(1 << 20))
with open(other, "rb") as f:
    unguarded = np.frombuffer(mmap.mmap(f.fileno(), 1 << 20, prot=mmap.PROT_READ), np.uint8)
os.truncate(other, 0)
print("touching", flush=True)
print(int(unguarded[-1]))  # a genuine SIGBUS, outside ffload's mappings
print("survived")
"""


@pytest.mark.parametrize("faulthandler", [True, False])
def test_a_sigbus_outside_ffloads_mappings_still_reaches_the_previous_handler(tmp_path, faulthandler):
    """A fault in a mapping ffload did not register goes to what was installed before the guard:
    faulthandler's traceback dump, or without it the default action; either way the process dies
    of SIGBUS as it would without ffload."""
    run = _child(_FOREIGN, str(tmp_path), faulthandler=faulthandler)
    assert run.returncode == -signal.SIGBUS, (run.returncode, run.stdout, run.stderr[-3000:])
    assert "touching" in run.stdout and "survived" not in run.stdout
    assert ("Fatal Python error: Bus error" in run.stderr) == faulthandler, run.stderr[-3000:]
    if faulthandler:
        line = (
            _FOREIGN.splitlines().index("print(int(unguarded[-1]))  # a genuine SIGBUS, outside ffload's mappings") + 1
        )
        assert f'File "<string>", line {line}' in run.stderr  # the Python line that touched the lost page


_SENT = """
import os, signal, sys
from ffload.formats import write_dataset, IntField, BytesField, open_dataset
from ffload.formats.shardio import check_mapping

root = sys.argv[1]
path = os.path.join(root, "d.beton")
write_dataset(path, {"blob": BytesField(), "label": IntField()}, [(bytes(5000), i) for i in range(50)], 50)
signal.signal(signal.SIGBUS, lambda signum, frame: print("python handler", signum == signal.SIGBUS))
view = open_dataset(path)
region = view.open_region()  # the guard goes in front of Python's handler
signal.raise_signal(signal.SIGBUS)  # sent, not a fault: Python's handler gets it
region = view.open_region()  # puts the guard back in front
os.truncate(path, 4096)
print("sum", int(region[-100:].sum()))
try:
    check_mapping(region)
except Exception as e:
    print(type(e).__name__, e)
"""


def test_a_sent_sigbus_goes_to_the_previous_handler_and_the_guard_comes_back(tmp_path):
    """``raise(SIGBUS)`` (``si_code <= 0``) is not a fault: the guard hands it to the handler
    installed before it (here Python's), and the next mapping puts the guard back in front, so a
    truncation afterwards is still caught."""
    run = _child(_SENT, str(tmp_path))
    assert run.returncode == 0, (run.returncode, run.stderr[-3000:])
    lines = run.stdout.splitlines()
    assert lines[0] == "python handler True", run.stdout
    assert lines[1] == "sum 0"
    assert lines[2].startswith("FormatError ") and "d.beton: the file shrank from " in lines[2], lines[2]
