"""Run ``ffload convert`` in this process and send ourselves a signal at one chosen moment.

``python kill_child.py SRC DST SIGNAL MOMENT [WORKERS]``: MOMENT is ``add-K`` (while writing sample K),
``recover`` (just after taking the writer lock), ``swap`` (the output complete, before the swap),
``exchange`` (just after the swap syscall), ``fsync`` (syncing the folder after the swap), ``remove-old``
(deleting the replaced dataset) or ``fallback-mid`` (no RENAME_EXCHANGE: between the two renames). Used by
test_kills.py; deterministic, unlike a timer."""

from __future__ import annotations

import os
import signal
import sys

from ffload.formats import atomic

# Python leaves SIGINT ignored when this process inherits it ignored (a test run started as a
# shell's background job, `cmd &` without job control): Ctrl-C must raise KeyboardInterrupt here.
signal.signal(signal.SIGINT, signal.default_int_handler)
src, dst, signame, moment = sys.argv[1:5]
workers = sys.argv[5] if len(sys.argv) > 5 else "0"
sig = getattr(signal, signame)


fired = []


def fire():
    if not fired:  # once: the clean-up that the signal starts may call the hooked function again
        fired.append(True)
        os.kill(os.getpid(), sig)


def before(module, name):
    real = getattr(module, name)

    def wrapped(*args, **kwargs):
        fire()
        return real(*args, **kwargs)

    setattr(module, name, wrapped)


if moment.startswith("add-"):
    target = int(moment[4:])
    for cls in (atomic.BetonWriter, atomic.LMDBWriter):
        real_add = cls.add

        def add(self, index, *args, _real=real_add, **kwargs):
            if index == target:
                fire()
            return _real(self, index, *args, **kwargs)

        cls.add = add
elif moment == "exchange":
    real_exchange = atomic._exchange

    def exchange(a, b):
        done = real_exchange(a, b)
        fire()  # SIGINT/SIGTERM are held back here: delivered once the swap is complete
        return done

    atomic._exchange = exchange
elif moment == "fallback-mid":
    atomic._exchange = lambda a, b: False
    real_rename = os.rename
    renames = []

    def rename(a, b):
        real_rename(a, b)
        renames.append(a)
        if ".old-" in os.fspath(b):
            fire()

    os.rename = rename
elif moment == "fsync":  # the folder sync of the swap (the journal's checkpoints sync folders too)
    real_swap, real_fsync = atomic._swap_in, atomic._fsync_dir
    swapping = []

    def swap_in(*args, **kwargs):
        swapping.append(True)
        return real_swap(*args, **kwargs)

    def fsync_dir(path):
        if swapping:
            fire()
        return real_fsync(path)

    atomic._swap_in, atomic._fsync_dir = swap_in, fsync_dir
else:
    before(atomic, {"recover": "recover", "swap": "_swap_in", "remove-old": "_remove"}[moment])

from ffload.cli import main  # noqa: E402  (after the hooks)

main(["convert", src, dst, "--overwrite", "--quiet", "--num-workers", workers])
