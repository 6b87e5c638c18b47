"""The epoch iterator and the worker pool that fills batch slots.

:class:`BatchRunner` belongs to one :class:`~ffload.Loader`: a persistent thread pool of
``num_workers`` threads and ``num_slots`` batch slots, each holding every operation's buffer
(allocated once). A job computes one whole batch (every field) into one slot; the operations are
nogil numba kernels or GIL-releasing OpenCV/torch calls, so the threads run in parallel.

:class:`EpochIterator` submits jobs ``ahead`` batches in advance, yields batches in order and
recycles slots under this rule (FFCV's, made explicit):

    a yielded batch stays valid while the consumer handles it and the next one; requesting the
    batch after that (``next()`` for batch ``k + 2``) lets the loader overwrite batch ``k``.

With ``num_slots = ahead + 2`` the batches ``k - 1 .. k + ahead`` have distinct slots while the
consumer waits for batch ``k``. When the batches end on a CUDA device, each slot has its own CUDA
stream: the consumer's stream waits for the slot's work before a batch is handed over, the slot's
next job waits (on the GPU) for the consumer's work recorded when the batch was retired, and the
host waits for the slot's previous host-to-device copies before overwriting pinned buffers.
Returned CUDA tensors are marked with ``record_stream`` so the caching allocator does not reuse
their memory while the consumer's stream may still read it.
"""

from __future__ import annotations

import collections
import concurrent.futures
import threading
from collections.abc import Sequence

import numpy as np
import torch

from ffload.errors import LoaderClosedError, LoaderError
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
        num_workers: threads.
        num_slots: batch slots (buffers are allocated on first use of each slot).
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
        num_workers: int,
        num_slots: int,
        pin_memory: bool,
        device: torch.device | None,
        read_ahead=None,
    ):
        self.pipelines, self.memory, self.seed = pipelines, memory, seed
        self.read_ahead = read_ahead
        self.num_slots, self.pin_memory, self.device = num_slots, pin_memory, device
        self._columns = [
            (view.metadata[p.source], memory.ptrs.get(p.source), view.sizes.get(p.source)) for p in pipelines
        ]
        self._buffers: list[list | None] = [None] * num_slots
        self._pool = concurrent.futures.ThreadPoolExecutor(num_workers, "ffload-worker")
        # the jobs that may still run, oldest first: submit() (the consumer's thread only) drops the
        # finished ones at the front, so it holds about the jobs in flight, with no lock or callback per batch
        self._submitted: collections.deque = collections.deque()
        self._slot_counter = 0
        if device is not None:
            self._streams = [torch.cuda.Stream(device=device) for _ in range(num_slots)]
            self._done: list[torch.cuda.Event | None] = [None] * num_slots
            self._released: list[torch.cuda.Event | None] = [None] * num_slots

    def next_slot(self) -> int:
        """The slot of the next batch submitted: round-robin over all batches ever submitted, so
        that a new epoch's first batches do not reuse the slot of the previous epoch's last batch
        (which stays valid until the batch after the next one is requested)."""
        slot = self._slot_counter % self.num_slots
        self._slot_counter += 1
        return slot

    def submit(
        self, slot: int, indices: np.ndarray, epoch: int, batch: int, cancel: threading.Event
    ) -> concurrent.futures.Future:
        """Queue batch ``batch`` (sample ids ``indices``, ``(B,) int64``) of ``epoch`` into ``slot``.
        The future's result is the tuple of field batches, or ``None`` if ``cancel`` was set
        before the job started."""
        if self.device is not None:  # the consumer is done with the slot's previous batch
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(self.device))
            self._released[slot] = event
        future = self._pool.submit(self._job, slot, indices, epoch, batch, cancel)
        submitted = self._submitted
        while submitted and submitted[0].done():
            submitted.popleft()
        submitted.append(future)
        return future

    def wait_idle(self) -> None:
        """Block until every submitted job has finished or been cancelled (slots are free)."""
        concurrent.futures.wait(list(self._submitted))

    def _job(self, slot, indices, epoch, batch, cancel):
        if cancel.is_set():
            return None
        if self.device is None:
            return self._compute(slot, indices, epoch, batch)
        stream = self._streams[slot]
        if self._done[slot] is not None:
            self._done[slot].synchronize()  # earlier copies out of this slot's pinned buffers
        with torch.cuda.device(self.device), torch.cuda.stream(stream):
            stream.wait_event(self._released[slot])
            out = self._compute(slot, indices, epoch, batch)
            done = torch.cuda.Event()
            done.record(stream)
            self._done[slot] = done
        return out

    def _compute(self, slot, indices, epoch, batch):
        if self._buffers[slot] is None:
            self._buffers[slot] = [p.allocate(self.pin_memory) for p in self.pipelines]
        buffers = self._buffers[slot]
        if self.read_ahead is not None:
            self.read_ahead.started(batch)
        try:
            seeds = sample_seeds(self.seed, epoch, indices)
            lease = self.memory.prepare(indices, batch)
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
        self._pool.shutdown(wait=wait, cancel_futures=True)
        if self.read_ahead is not None:
            self.read_ahead.close(wait)


def _describe(indices: np.ndarray) -> str:
    head = ", ".join(str(int(i)) for i in indices[:8])
    return f"[{head}{', ...' if len(indices) > 8 else ''}]"


class EpochIterator:
    """Iterator over one epoch's batches (what ``iter(loader)`` returns).

    Args:
        runner: the loader's :class:`BatchRunner`.
        batches: the epoch's batches, each ``(B,) int64`` sample ids, all of them (batch 0 first).
        epoch: the epoch number.
        start: the first batch to produce (``> 0`` when resuming from a state dict).
        ahead: jobs kept queued beyond the batch being consumed (``runner.num_slots - 2``).
        owner: the object to keep alive while iterating (the Loader).

    Attributes:
        epoch: the epoch number.
        batches_yielded: batches of this epoch handed out so far, counting skipped ones.
        active: False once the epoch ended, failed or the iterator was closed.
    """

    def __init__(
        self,
        runner: BatchRunner,
        batches: Sequence[np.ndarray],
        epoch: int,
        start: int,
        ahead: int,
        owner: object = None,
    ):
        # ``owner`` (the Loader) is kept alive while its iterator is: in ``for b in Loader(...)``
        # nothing else references the loader, whose finalizer would stop the workers.
        self._owner = owner
        self._runner, self._batches = runner, batches
        self.epoch, self.batches_yielded, self._ahead = epoch, start, ahead
        self._next_submit = start
        self._futures: collections.deque = collections.deque()
        self._cancel = threading.Event()
        self._closed_reason: str | None = None
        self.active = True
        self._fill()

    def __len__(self) -> int:
        return len(self._batches) - self.batches_yielded

    def __iter__(self):
        return self

    def _fill(self) -> None:
        limit = min(len(self._batches), self.batches_yielded + self._ahead + 1)
        while self._next_submit < limit:
            b = self._next_submit
            slot = self._runner.next_slot()
            future = self._runner.submit(slot, self._batches[b], self.epoch, b, self._cancel)
            self._futures.append((slot, future))
            self._next_submit += 1

    def __next__(self):
        """The next batch: a tuple with one entry per enabled field (torch tensors, or what the
        pipeline returns), valid until the batch after the following one is requested.

        Raises:
            StopIteration: the epoch is over (or the iterator was closed).
            LoaderError: a worker failed (the iterator is closed first).
            ffload.errors.LoaderClosedError: the iterator was closed by its loader (a newer
                ``iter(loader)``, ``load_state_dict``, ``close``); the message says which.
        """
        if self._closed_reason is not None:
            raise LoaderClosedError(self._closed_reason)
        if not self.active or self.batches_yielded >= len(self._batches):
            self.close()
            raise StopIteration
        self._fill()
        slot, future = self._futures.popleft()
        try:
            out = future.result()
        except BaseException:
            self.close()
            raise
        self.batches_yielded += 1
        return self._runner.hand_over(slot, out)

    def close(self, reason: str | None = None) -> None:
        """End the epoch: queued jobs are cancelled, running ones finish on their own (the
        loader waits for them before reusing the slots). With ``reason``, later ``next()``
        calls raise :class:`~ffload.errors.LoaderClosedError` ``(reason)`` instead of ``StopIteration``."""
        if self.active:
            self.active = False
            self._cancel.set()
            for _, future in self._futures:
                future.cancel()
            self._futures.clear()
            self._closed_reason = reason

    def __del__(self):
        if hasattr(self, "_cancel"):
            self.close()
