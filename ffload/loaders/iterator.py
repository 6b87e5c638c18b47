"""The epoch iterator and the worker pool that fills batch slots.

:class:`BatchRunner` belongs to one :class:`~ffload.Loader`: a persistent thread pool of
``num_workers`` threads and ``num_slots`` slots, each holding every operation's buffer
(allocated once). A job computes one whole batch (every field) into one slot, or, with
``batches_per_job`` above 1 (rowwise pipelines only), several consecutive batches as one call of
each pipeline on their concatenated rows, handed out as row ranges of the slot's buffers; the
operations are nogil numba kernels or GIL-releasing OpenCV/torch calls, so the threads run in
parallel.

:class:`EpochIterator` submits jobs ``ahead`` jobs in advance, yields batches in order and
recycles slots under this rule (FFCV's, made explicit):

    a yielded batch stays valid while the consumer handles it and the next one; requesting the
    batch after that (``next()`` for batch ``k + 2``) lets the loader overwrite batch ``k``.

With ``num_slots = ahead + 2`` the jobs of batches ``k - 1``, ``k`` and the ``ahead`` jobs after
``k``'s have distinct slots while the consumer waits for batch ``k``. Slots come from a free list:
the runner holds the slots of the last two batches yielded (across epochs) and frees the older
one when the next batch is requested, unless the newer batch is in the same slot (one job). The
:class:`~.autotune.AutoTuner` may change ``ahead`` and the workers admitted at any batch: a new slot is allocated when the free list is empty and fewer than ``ahead + 2``
slots exist, and a slot coming back while more than ``ahead + 2`` exist is dropped (its
buffers are released; a batch the consumer still references keeps its memory alive). When the batches end on a CUDA device, each slot has its own CUDA
stream: the consumer's stream waits for the slot's work before a batch is handed over, the slot's
next job waits (on the GPU) for the consumer's work recorded when the batch was retired, and the
host waits for the slot's previous host-to-device copies before overwriting pinned buffers.
Returned CUDA tensors are marked with ``record_stream`` so the caching allocator does not reuse
their memory while the consumer's stream may still read it.

A runner's first job runs alone: the others wait until it has finished (or was cancelled). numba
compiles a kernel, or loads it from its on-disk cache, on its first call; the first job makes
every first call of the pipelines, so no worker loads code into the process while another runs
compiled code (a read-ahead thread loading a kernel while two workers decoded crashed a process,
see :class:`~.memory.readahead.ReadAhead`, which compiles its own kernels in its constructor).
"""

from __future__ import annotations

import collections
import concurrent.futures
import threading
import time
from collections.abc import Callable, Sequence

import numpy as np
import torch

from ffload.errors import LoaderClosedError, LoaderError
from ffload.loaders.autotune import AutoTuner, Observation
from ffload.loaders.memory.schedule import LATER_EPOCH
from ffload.loaders.orders import EpochBatches
from ffload.loaders.pipeline.geometry import shared_rows
from ffload.loaders.pipeline.operation import BatchContext
from ffload.loaders.rng import sample_seeds


class BatchRunner:
    """Thread pool plus slots; runs one batch of all fields into a slot.

    Args:
        pipelines: the enabled :class:`~.pipeline.FieldPipeline` list (output order).
        memory: the memory manager (:class:`~ffload.loaders.memory.base.MemoryManager`: ``region``,
            ``ptrs``, ``prepare(indices, batch) -> lease``, ``release(lease)``, ``check(indices)``
            after a batch's reads).
        view: the :class:`ffload.formats.DatasetView`.
        seed: the loader's seed (per-sample seeds come from :func:`~.rng.sample_seeds`).
        tuner: the :class:`~.autotune.AutoTuner` that sets the workers admitted and the batches
            ahead (``ahead + 2`` slots; buffers are allocated on first use of each slot); with
            auto workers the pool has ``tuner.max_workers`` threads, of which at most
            ``tuner.workers`` run jobs (:meth:`set_workers`).
        pin_memory: allocate the inputs of ``ToTensor`` in pinned memory.
        device: the CUDA device the batches end on, or ``None`` (no streams, no events).
        read_ahead: the :class:`~.readahead.ReadAhead` told which batch each job starts, or
            ``None``.
    """

    def __init__(
        self,
        pipelines,
        memory,
        view,
        seed: int,
        tuner: AutoTuner,
        pin_memory: bool,
        device: torch.device | None,
        read_ahead=None,
    ):
        self.memory, self.seed, self.view = memory, seed, view
        self.read_ahead = read_ahead
        self.tuner, self.pin_memory, self.device = tuner, pin_memory, device
        self._buffers: dict[int, list] = {}
        self.replace_pipelines(pipelines)
        self._threads = tuner.max_workers if tuner.auto_workers else tuner.workers
        self._pool = concurrent.futures.ThreadPoolExecutor(self._threads, "ffload-worker")
        # Jobs wait in ``_pending`` (oldest first) for one of at most ``_limit`` drain loops
        # (:meth:`_drain`), each on a pool thread, which runs them back to back: a worker goes from
        # one batch to the next without a hand-off to another thread.
        self._jobs_lock = threading.Lock()
        self._pending: collections.deque = collections.deque()  # (future, job arguments)
        self._limit = tuner.workers
        self._draining = 0  # drain loops started and not ended
        # the jobs that may still run, oldest first: submit() (the consumer's thread only) drops the
        # finished ones at the front, so it holds about the jobs in flight, with no callback per batch
        self._submitted: collections.deque = collections.deque()
        self._lock = threading.Lock()
        self._alive: set[int] = set()  # slots that exist
        self._free: list[int] = []  # existing slots no batch uses
        self._held: collections.deque = collections.deque()  # slots of the last batches yielded
        self._job_time: dict[int, float] = {}  # slot -> wall seconds of its last job
        self._tickets = 0
        self._first_done = threading.Event()  # the first job ended: later jobs may run (module docstring)
        # the epoch of the memory manager's schedule (set by the loader after ``memory.schedule``): a
        # job of a later epoch (the next one's, submitted early) prepares as LATER_EPOCH
        self.scheduled_epoch: int | None = None
        if device is not None:
            self._streams: dict[int, torch.cuda.Stream] = {}
            self._done: dict[int, torch.cuda.Event] = {}
            self._released: dict[int, torch.cuda.Event] = {}

    def replace_pipelines(self, pipelines) -> None:
        """Run ``pipelines`` from the next job on (an epoch's start, no job running: the loader
        calls it after :meth:`wait_idle`). The slots' buffers are dropped and allocated again for
        the new shapes on first use; a batch the consumer still holds keeps its own memory."""
        self.pipelines = pipelines
        self._columns = [
            (self.view.metadata[p.source], self.memory.ptrs.get(p.source), self.view.sizes.get(p.source))
            for p in pipelines
        ]
        self._buffers.clear()

    @property
    def num_slots(self) -> int:
        """Slots the runner keeps: ``tuner.ahead + 2``."""
        return self.tuner.ahead + 2

    def slots_allocated(self) -> int:
        """Slots that exist now (more than :attr:`num_slots` while a shrink drains)."""
        with self._lock:
            return len(self._alive)

    def acquire_slot(self, force: bool = False) -> int | None:
        """A free slot for the next job, a new one while fewer than :attr:`num_slots` exist (or
        with ``force``), else ``None``."""
        with self._lock:
            if self._free:
                return self._free.pop()
            if len(self._alive) < self.num_slots or force:
                slot = min(set(range(len(self._alive) + 1)) - self._alive)
                self._alive.add(slot)
                return slot
            return None

    def has_free_slot(self) -> bool:
        """Whether a released slot waits to be reused (read without the lock: a slot released
        meanwhile is seen at the next request)."""
        return bool(self._free)

    def release_slot(self, slot: int) -> None:
        """``slot``'s batch is no longer valid: reuse the slot, or drop it (and its buffers) when
        more than :attr:`num_slots` exist."""
        with self._lock:
            if len(self._alive) > self.num_slots:
                self._alive.discard(slot)
                self._buffers.pop(slot, None)
                self._job_time.pop(slot, None)
                if self.device is not None:
                    for table in (self._streams, self._done, self._released):
                        table.pop(slot, None)
            else:
                self._free.append(slot)

    def retire_held(self) -> None:
        """A batch is being requested: the batch yielded before the last one may be overwritten
        (its slot is released once no batch yielded since is in it: a job of several batches
        fills one slot)."""
        held = self._held
        while len(held) > 1:
            slot = held.popleft()
            if slot not in held:
                self.release_slot(slot)

    def hold(self, slot: int) -> None:
        """A batch in ``slot`` was yielded: it stays valid until the batch after the next one is
        requested."""
        self._held.append(slot)

    def job_time(self, slot: int) -> float:
        """Wall seconds of the last job that filled ``slot``."""
        return self._job_time.get(slot, 0.0)

    def observe(self, observation: Observation) -> None:
        """Feed the tuner; apply a change of the workers admitted."""
        if self.tuner.observe(observation) is not None and self.tuner.auto_workers:
            self.set_workers(self.tuner.workers)

    def set_workers(self, workers: int) -> None:
        """Run jobs on at most ``workers`` (>= 1, at most the pool's threads) threads at once from
        now on: more start on the queued jobs at once; above the new limit, a worker stops when its
        job ends (running jobs finish)."""
        with self._jobs_lock:
            self._limit = max(1, min(int(workers), self._threads))
        self._start_drains()

    def _start_drains(self) -> None:
        """Start a drain loop per queued job while fewer than the workers admitted run."""
        with self._jobs_lock:
            start = max(0, min(len(self._pending), self._limit - self._draining))
            self._draining += start
        for _ in range(start):
            self._pool.submit(self._drain)

    @property
    def first_job_done(self) -> bool:
        """Whether the first job has ended (finished, failed or cancelled): the pipelines' kernels
        are loaded, and other threads may run compiled code (module docstring)."""
        return self._first_done.is_set()

    @property
    def parked(self) -> int:
        """Pool threads beyond the workers admitted (auto workers: ``tuner.max_workers`` threads)."""
        return self._threads - self._limit

    def submit(
        self, slot: int, first: int, rows: np.ndarray, lengths: list[int], epoch: int, cancel: threading.Event
    ) -> concurrent.futures.Future:
        """Queue one job into ``slot``: batches ``first, first + 1, ...`` of ``epoch`` (``rows``:
        their sample ids one after the other, ``(n,) int64``, and ``lengths`` each batch's count;
        several only when every pipeline is rowwise, see :meth:`_run`). The future's result is
        ``(outputs, error)`` (:meth:`_run`), or ``None`` if ``cancel`` was set before the job
        started; a single batch's failure is the future's exception."""
        if self.device is not None:  # the consumer is done with the slot's previous batch
            if slot not in self._streams:
                self._streams[slot] = torch.cuda.Stream(device=self.device)
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(self.device))
            self._released[slot] = event
        self._tickets += 1
        future: concurrent.futures.Future = concurrent.futures.Future()
        if self._tickets == 1:  # finished, failed or cancelled
            future.add_done_callback(lambda _: self._first_done.set())
        with self._jobs_lock:
            self._pending.append((future, (slot, first, rows, lengths, epoch, cancel, self._tickets)))
        self._start_drains()
        submitted = self._submitted
        while submitted and submitted[0].done():
            submitted.popleft()
        submitted.append(future)
        return future

    def abandon(self, futures: collections.deque, cancel: threading.Event) -> None:
        """Drop the jobs ``futures`` (``(slot, first batch, future)``, emptied): a queued job is
        cancelled (``cancel`` stops one about to start), a running one finishes on its own, and
        each job's slot is released once its job has ended. A method, not a module function: an
        iterator's finalizer calls it at interpreter exit, when module globals may be gone."""
        cancel.set()
        for slot, _, future in futures:
            future.cancel()
            future.add_done_callback(lambda _, s=slot: self.release_slot(s))
        futures.clear()

    def wait_idle(self, keep: Sequence[concurrent.futures.Future] = ()) -> None:
        """Block until every submitted job but those in ``keep`` (adopted by the next iterator) has
        finished or been cancelled (their slots are free)."""
        concurrent.futures.wait([f for f in self._submitted if f not in keep])

    def _drain(self) -> None:
        """A worker: run queued jobs, oldest first, until none is left or more workers run than
        :meth:`set_workers` admits (as ``ThreadPoolExecutor``'s work items set their futures)."""
        while True:
            with self._jobs_lock:
                if not self._pending or self._draining > self._limit:
                    self._draining -= 1
                    return
                future, job = self._pending.popleft()
            if not future.set_running_or_notify_cancel():
                continue  # cancelled while queued
            try:
                future.set_result(self._job(*job))
            except BaseException as e:
                future.set_exception(e)
            del future, job  # the batch (or the error) stays referenced by its future alone

    def _job(self, slot, first, rows, lengths, epoch, cancel, ticket):
        if ticket > 1 and not self._first_done.is_set():
            self._first_done.wait()  # the first job compiles the pipelines' kernels alone
        if cancel.is_set():
            return None
        start = time.perf_counter()
        out = self._on_device(slot, first, rows, lengths, epoch)
        self._job_time[slot] = time.perf_counter() - start
        return out

    def _on_device(self, slot, first, rows, lengths, epoch):
        if self.device is None:
            return self._run(slot, first, rows, lengths, epoch)
        stream = self._streams[slot]
        if self._done.get(slot) is not None:
            self._done[slot].synchronize()  # earlier copies out of this slot's pinned buffers
        with torch.cuda.device(self.device), torch.cuda.stream(stream):
            stream.wait_event(self._released[slot])
            out = self._run(slot, first, rows, lengths, epoch)
            done = torch.cuda.Event()
            done.record(stream)
            self._done[slot] = done
        return out

    def _run(self, slot, first, rows, lengths, epoch):
        """One job: ``(outputs, error)``, the field tuple of each batch from ``first`` on and
        ``None``, or the batches before the first one that failed and its LoaderError.

        Several batches run as one call of every pipeline on their rows (the slot's
        buffers hold them all), and each batch is a row range of the result: one pass of the
        per-batch Python work (seeds, contexts, kernel dispatch) for all of them. When that call
        fails, the batches run again one by one into their rows, so that the batches before the
        failing one are handed out and the error names its batch, as with one batch per job.
        A single batch's failure raises."""
        if self.read_ahead is not None:
            self.read_ahead.started(first)
        if len(lengths) == 1:
            return [self._compute(slot, rows, epoch, first)], None
        try:
            out = self._compute(slot, rows, epoch, first, batches=len(lengths))
        except LoaderError:
            return self._one_by_one(slot, first, rows, lengths, epoch)
        return list(zip(*(_split(o, lengths) for o in out))), None

    def _one_by_one(self, slot, first, rows, lengths, epoch):
        """:meth:`_run`'s fallback: each batch into its own rows of the slot, up to the first failure."""
        outputs, row = [], 0
        for k, n in enumerate(lengths):
            try:
                outputs.append(self._compute(slot, rows[row : row + n], epoch, first + k, row))
            except LoaderError as e:
                return outputs, e
            row += n
        return outputs, None

    def _compute(self, slot, indices, epoch, batch, row=0, batches=1):
        """Every field of the samples ``indices`` (batch ``batch``, for errors; or ``batches``
        consecutive batches from it, a job's) into the slot's buffers from row ``row`` on; the
        tuple of the fields' outputs."""
        buffers = self._buffers.get(slot)
        if buffers is None:
            buffers = self._buffers[slot] = [p.allocate(self.pin_memory) for p in self.pipelines]
        if row:
            buffers = [[None if b is None else b[row:] for b in bufs] for bufs in buffers]
        try:
            seeds = sample_seeds(self.seed, epoch, indices)
            lease = self.memory.prepare(indices, batch if epoch == self.scheduled_epoch else LATER_EPOCH, batches)
        except Exception as e:
            raise self._failed(e, indices, epoch, batch) from e
        out = []
        shared: dict = {}  # what a field's pipeline publishes for later ones (crop boxes, flips)
        try:
            for p, bufs, (meta, ptrs, sizes) in zip(self.pipelines, buffers, self._columns):
                ctx = BatchContext(indices, seeds, self.memory.region, meta, ptrs, sizes, epoch, shared)
                try:
                    out.append(p.run(bufs, ctx))
                except Exception as e:
                    self._check_reads(indices, epoch, batch)  # a file that shrank explains it best
                    raise self._explain(e, p, bufs, ctx, batch) from e
            self._check_reads(indices, epoch, batch)  # before the batch is handed on
        finally:
            self.memory.release(lease)  # the decoders have copied the payloads out
        return tuple(out)

    def _check_reads(self, indices, epoch, batch) -> None:
        """Raise LoaderError when the batch's reads hit a file that shrank meanwhile (its bytes read
        as zeros: ``memory.check``; see :class:`~ffload.loaders.memory.os_cache.OSCacheMemory`)."""
        try:
            self.memory.check(indices)
        except Exception as e:
            raise self._failed(e, indices, epoch, batch) from e

    @staticmethod
    def _failed(error, indices, epoch, batch) -> LoaderError:
        """The LoaderError for reading the batch's payloads (not one field's decoding)."""
        return LoaderError(
            f"epoch {epoch}, batch {batch} (samples {_describe(indices)}): {type(error).__name__}: {error}",
            epoch,
            batch,
        )

    def _explain(self, error, pipeline, buffers, ctx, batch) -> LoaderError:
        """Find the failing sample by re-running the field on each sample alone."""
        for j in range(len(ctx.indices)):
            one = BatchContext(
                ctx.indices[j : j + 1],
                ctx.seeds[j : j + 1],
                ctx.region,
                ctx.metadata,
                ctx.ptrs,
                ctx.sizes,
                ctx.epoch,
                shared_rows(ctx.shared, j),
            )
            try:
                pipeline.run(buffers, one)
            except Exception as e:
                index = int(ctx.indices[j])
                return LoaderError(
                    f"sample {index}, field {pipeline.name!r} (epoch {ctx.epoch}, "
                    f"batch {batch}): {type(e).__name__}: {e}",
                    ctx.epoch,
                    batch,
                    pipeline.name,
                    index,
                )
        return LoaderError(
            f"field {pipeline.name!r}, epoch {ctx.epoch}, batch {batch} (samples "
            f"{_describe(ctx.indices)}): {type(error).__name__}: {error}",
            ctx.epoch,
            batch,
            pipeline.name,
        )

    def hand_over(self, slot: int, out: tuple) -> tuple:
        """Make a finished batch safe to use on the consumer's current CUDA stream."""
        if self.device is None:
            return out
        consumer = torch.cuda.current_stream(self.device)
        consumer.wait_event(self._done[slot])
        for t in out:
            if isinstance(t, torch.Tensor) and t.is_cuda:
                t.record_stream(consumer)
        return out

    def shutdown(self, wait: bool) -> None:
        """Stop the pool (queued jobs are cancelled; with ``wait``, running ones are joined)."""
        with self._jobs_lock:
            pending, self._pending = self._pending, collections.deque()
        for future, _ in pending:
            future.cancel()
        self._pool.shutdown(wait=wait, cancel_futures=True)
        if self.read_ahead is not None:
            self.read_ahead.close(wait)


def _split(out, lengths: list[int]) -> list:
    """``out``'s leading axis cut into consecutive views of ``lengths`` rows (one call for a
    tensor: ``Tensor.split_with_sizes``, without ``Tensor.split``'s Python dispatch)."""
    if isinstance(out, torch.Tensor):
        return list(out.split_with_sizes(lengths))
    ends = np.cumsum(lengths).tolist()
    return [out[end - n : end] for n, end in zip(lengths, ends)]


def _describe(indices: np.ndarray) -> str:
    head = ", ".join(str(int(i)) for i in indices[:8])
    return f"[{head}{', ...' if len(indices) > 8 else ''}]"


class EpochIterator:
    """Iterator over one epoch's batches (what ``iter(loader)`` returns).

    Args:
        runner: the loader's :class:`BatchRunner`.
        batches: the epoch's batches (:class:`~.orders.EpochBatches`: each ``(B,) int64`` sample
            ids), all of them (batch 0 first).
        epoch: the epoch number.
        start: the first batch to produce (``> 0`` when resuming from a state dict).
        owner: the object to keep alive while iterating (the Loader).
        batches_per_job: consecutive batches each job computes (``>= 1``; more than 1 only for
            rowwise pipelines, :meth:`BatchRunner._run`). The runner's ``tuner.ahead`` counts jobs,
            and the tuner observes one job per observation.
        next_jobs: where this epoch's spare job slots go once its last job is submitted: the
            next epoch's first jobs (:class:`NextEpochJobs`), or None.
        adopted: the jobs of this epoch submitted during the previous one (its ``next_jobs``),
            taken over as this iterator's first jobs (``start`` is then 0), or None.

    Attributes:
        epoch: the epoch number.
        batches_yielded: batches of this epoch handed out so far, counting skipped ones.
        active: False once the epoch ended, failed or the iterator was closed.
    """

    def __init__(
        self,
        runner: BatchRunner,
        batches: EpochBatches,
        epoch: int,
        start: int,
        owner: object = None,
        batches_per_job: int = 1,
        next_jobs: NextEpochJobs | None = None,
        adopted: NextEpochJobs | None = None,
    ):
        # ``owner`` (the Loader) is kept alive while its iterator is: in ``for b in Loader(...)``
        # nothing else references the loader, whose finalizer would stop the workers.
        self._owner = owner
        self._runner, self._batches = runner, batches
        self._count = len(batches)  # read on every request
        self._per_job = max(1, int(batches_per_job))
        self.epoch, self.batches_yielded = epoch, start
        self._mark: tuple | None = None  # (wall, thread CPU, thread id) when the last job was taken
        self._next_submit = start  # the first batch of the next job to submit
        self._futures: collections.deque = collections.deque()  # (slot, first batch, future)
        self._current: tuple | None = None  # (slot, first batch, outputs, error) of the job handed out
        self._job_start = start  # the first batch of the job that holds the next batch
        self._cancel = threading.Event()
        self._slot_bound = False  # the last _fill stopped for want of a free slot
        if adopted is not None:
            self._futures, self._next_submit, self._cancel = adopted.futures, adopted.next_submit, adopted.cancel
        self._closed_reason: str | None = None
        self._next_jobs = next_jobs
        self.active = True
        self._fill()

    def __len__(self) -> int:
        return self._count - self.batches_yielded

    def __iter__(self):
        return self

    def _fill(self, force: bool = False) -> None:
        """Submit jobs while fewer than ``tuner.ahead`` follow the one holding the next batch."""
        per_job = self._per_job
        limit = min(self._count, self._job_start + (self._runner.tuner.ahead + 1) * per_job)
        self._slot_bound = False
        while self._next_submit < limit:
            b = self._next_submit
            slot = self._runner.acquire_slot(force=force and not self._futures)
            self._slot_bound = slot is None
            if slot is None:
                return  # the slots are in use: the next request frees one
            stop = min(b + per_job, self._count)
            future = self._runner.submit(slot, b, *self._batches.rows(b, stop), self.epoch, self._cancel)
            self._futures.append((slot, b, future))
            self._next_submit = stop
        if self._next_submit >= self._count:
            if self._next_jobs is not None:
                self._next_jobs.fill(self._runner.tuner.ahead - len(self._futures))

    def __next__(self):
        """The next batch: a tuple with one entry per enabled field (torch tensors, or what the
        pipeline returns), valid until the batch after the following one is requested.

        Raises:
            StopIteration: the epoch is over (or the iterator was closed).
            LoaderError: a worker failed (the iterator is closed first).
            ffload.errors.LoaderClosedError: the iterator was closed by its loader (a newer
                ``iter(loader)``, ``load_state_dict``, ``close``); the message says which.
        """
        job = self._current
        if job is not None and self.active:
            # A job's third batch on: the previous two came from its slot, so retiring the
            # older one frees nothing, and the batch is a row range the job already made. Jobs
            # are submitted only where that may have changed since the last request: a slot
            # freed meanwhile (an abandoned epoch's job ending) while submissions waited for
            # one, and, at the epoch's tail, the next epoch's jobs where what stopped them may
            # have changed (NextEpochJobs.may_submit).
            k = self.batches_yielded - job[1]
            outputs = job[2]
            if 2 <= k < len(outputs):
                self.batches_yielded += 1
                if k + 1 == len(outputs):
                    self._job_start = self.batches_yielded
                runner = self._runner
                if (self._slot_bound and runner.has_free_slot()) or (
                    self._next_jobs is not None and self._next_submit >= self._count and self._next_jobs.may_submit()
                ):
                    self._fill()
                return outputs[k] if runner.device is None else runner.hand_over(job[0], outputs[k])
        if self._closed_reason is not None:
            raise LoaderClosedError(self._closed_reason)
        if not self.active or self.batches_yielded >= self._count:
            self.close()
            raise StopIteration
        runner = self._runner
        runner.retire_held()
        if job is None or (self.batches_yielded >= job[1] + len(job[2]) and job[3] is None):
            job = self._take()
        else:
            self._fill()  # a slot the retired batch freed
        slot, first, outputs, error = job
        k = self.batches_yielded - first
        if k >= len(outputs):  # the job's batch k failed
            if not outputs:
                runner.release_slot(slot)
            self.close()
            raise error
        runner.hold(slot)
        self.batches_yielded += 1
        if self.batches_yielded == first + len(outputs):
            self._job_start = self.batches_yielded
        return runner.hand_over(slot, outputs[k])

    def _take(self) -> tuple:
        """Wait for the next job and feed the tuner its observation (one per job)."""
        cpu = time.thread_time()  # the consumer step's CPU ends here
        runner = self._runner
        self._fill(force=True)  # a slot of an abandoned epoch may not be back yet
        slot, first, future = self._futures.popleft()
        waiting = time.perf_counter()
        try:
            outputs, error = future.result()
        except BaseException:
            runner.release_slot(slot)
            self.close()
            raise
        now = time.perf_counter()
        waited = now - waiting
        mark, thread = self._mark, threading.get_ident()
        if mark is not None and mark[2] == thread:  # a step of this consumer thread
            job = runner.job_time(slot)
            runner.observe(Observation(waited, now - mark[0] - waited, cpu - mark[1], job, max(1, len(outputs))))
        self._mark = (time.perf_counter(), time.thread_time(), thread)
        self._current = (slot, first, outputs, error)
        return self._current

    def close(self, reason: str | None = None) -> None:
        """End the epoch: queued jobs are cancelled, running ones finish on their own (the
        loader waits for them before reusing the slots). With ``reason``, later ``next()``
        calls raise :class:`~ffload.errors.LoaderClosedError` ``(reason)`` instead of ``StopIteration``."""
        if self.active:
            self.active = False
            self._runner.abandon(self._futures, self._cancel)
            self._closed_reason = reason

    def __del__(self):
        if hasattr(self, "_cancel"):
            self.close()


class NextEpochJobs:
    """The next epoch's first jobs, submitted while the current epoch's last ones run.

    Without them, an epoch ends in a bubble. Its last round of jobs leaves workers idle one by
    one: ``J`` jobs on ``W`` workers take ``ceil(J / W)`` rounds for ``J / W`` rounds of work.
    The next epoch's jobs then start only once the consumer has taken every batch and called
    ``iter(loader)``. With many workers and short epochs (16 workers, a 50,000-sample epoch of
    small images) that is a large part of every epoch.

    Once the current epoch's last job is submitted, its :class:`EpochIterator` offers its spare
    job places to this object on every batch request (:meth:`fill`): within ``tuner.ahead`` jobs
    in flight, in free slots only, so the batches the consumer holds stay valid. The next epoch's
    jobs are submitted as soon as its batch list is ready (:meth:`~.orders.EpochsAhead.ready`),
    from its first batch on.

    ``iter(loader)`` adopts them as the new iterator's first jobs when it starts that epoch from
    its first batch with the operations' settings unchanged. Otherwise it discards them
    (:meth:`discard`) and nothing of them is seen. Their batches are the ones the epoch computes
    anyway (a sample's augmentation depends only on the seed, the epoch and the sample), so
    adopting them changes no batch.

    Args:
        runner: the loader's :class:`BatchRunner`.
        epoch: the epoch these jobs belong to.
        ready: ``() ->`` that epoch's batches once computed, else None.
        job_size: ``(batches in the epoch) ->`` batches per job.
        params: ``() ->`` the loader's snapshot of its operations' settings, taken when the first
            job is submitted (what the jobs run with) and compared when the epoch starts.

    Attributes:
        epoch: as given.
        params: the settings' snapshot, None until the first job is submitted.
        futures: the submitted jobs, ``(slot, first batch, future)``, oldest first.
        next_submit: the first batch of the next job to submit.
        cancel: set when the jobs are dropped (by :meth:`discard`, or by the adopting iterator's close).
    """

    def __init__(
        self,
        runner: BatchRunner,
        epoch: int,
        ready: Callable[[], EpochBatches | None],
        job_size: Callable[[int], int],
        params: Callable[[], object],
    ):
        self._runner, self.epoch, self.params = runner, epoch, None
        self._ready, self._job_size, self._snapshot = ready, job_size, params
        self._batches: EpochBatches | None = None
        self._per_job = 1
        self.futures: collections.deque = collections.deque()
        self.next_submit = 0
        self.cancel = threading.Event()
        self._stopped = _READY  # what ended the last fill (the _READY, _SLOT, _ROOM, _DONE constants)

    def fill(self, room: int) -> None:
        """Submit jobs while fewer than ``room`` of them are in flight and a slot is free."""
        if self.cancel.is_set():
            self._stopped = _DONE
            return
        if self._batches is None:
            self._batches = self._ready()
            if self._batches is None:
                return  # the batch list is still being computed: the next request looks again
            self._per_job = self._job_size(len(self._batches))
        batches, runner = self._batches, self._runner
        while True:
            if self.next_submit >= len(batches):
                self._stopped = _DONE
                return
            if len(self.futures) >= room:
                self._stopped = _ROOM
                return
            slot = runner.acquire_slot()
            if slot is None:
                self._stopped = _SLOT
                return
            if self.params is None:
                self.params = self._snapshot()
            b = self.next_submit
            stop = min(b + self._per_job, len(batches))
            self.futures.append((slot, b, runner.submit(slot, b, *batches.rows(b, stop), self.epoch, self.cancel)))
            self.next_submit = stop

    def may_submit(self) -> bool:
        """Whether :meth:`fill` may now submit a job that its last call could not, by what changes
        while the consumer takes batches out of a job already made: the batch list became ready,
        or a slot came free (an abandoned job ended). The room (``ahead`` less the jobs in
        flight) and the slots that may exist change only when the consumer takes a job or the
        tuner decides, and the iterator then calls :meth:`fill` anyway; asking on every batch
        of the tail would add the consumer's Python per batch for nothing."""
        stopped = self._stopped
        return stopped is _READY or (stopped is _SLOT and self._runner.has_free_slot())

    def discard(self) -> None:
        """Drop the jobs (:meth:`BatchRunner.abandon`); later :meth:`fill` calls do nothing."""
        self._runner.abandon(self.futures, self.cancel)


_READY, _SLOT, _ROOM, _DONE = "ready", "slot", "room", "done"
"""Why :meth:`NextEpochJobs.fill` stopped: the batch list was not ready, no slot was free, as many
jobs as allowed were in flight, or nothing was left to submit (every job submitted, or dropped)."""
