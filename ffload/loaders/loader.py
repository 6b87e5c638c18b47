"""``ffload.Loader``: batches of a ``.beton`` file or an LMDB dataset as torch tensors.

The drop-in counterpart of FFCV's ``ffcv.loader.Loader`` (same argument names), with an explicit
contract for buffer reuse, no thread or memory leak per epoch, resumable ``state_dict()``, and
batches that do not depend on ``num_workers``.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import sys
import warnings
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from ffload.errors import ConfigurationError, LoaderClosedError, UnavailableError
from ffload.formats import open_dataset
from ffload.formats.shardio import open_data_files
from ffload.limits import DEFAULT_MAX_PIXELS
from ffload.loaders.autotune import PROCESS_SHARES, AutoTuner
from ffload.loaders.iterator import BatchRunner, EpochIterator, NextEpochJobs
from ffload.loaders.memory import readahead
from ffload.loaders.memory.os_cache import OSCacheMemory
from ffload.loaders.memory.pagepool import PagePoolMemory, page_pool_fits, remote_page_pool
from ffload.loaders.memory.pagesource import DEFAULT_LOCAL_REQUESTS, DEFAULT_MAX_REQUESTS, FilePages
from ffload.loaders.memory.process_cache import (
    ProcessCacheMemory,
    cache_block,
    default_cache_limit,
    worst_batch_bytes,
)
from ffload.loaders.memory.readahead import ADVISE_PAGE, DEFAULT_READ_AHEAD, PagePoolReadAhead, ReadAhead
from ffload.loaders.memory.schedule import payload_columns, sorted_unique
from ffload.loaders.orders import (
    EpochBatches,
    EpochsAhead,
    OrderOption,
    distributed_split,
    make_order,
    parse_order,
    samples_per_rank,
)
from ffload.loaders.pipeline.build import build_pipelines, cuda_device
from ffload.storage import is_remote
from ffload.system import available_cpus, available_memory

logger = logging.getLogger(__name__)

_STATE_KEYS = ("epoch", "batches_yielded", "seed", "batch_size", "order", "drop_last", "num_indices", "world_size")


def _check_int(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ConfigurationError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


class Loader:
    """Iterate over a dataset in batches of torch tensors (FFCV's ``Loader`` semantics).

    ``for image, label in Loader('train.beton', batch_size=256): ...`` yields one entry per
    enabled field, in the dataset's field order: with the default pipelines an image field gives
    ``(B, H, W, 3) uint8``, an IntField ``(B,) int64``, a FloatField ``(B,) float64``, an
    NDArrayField ``(B, *shape)`` of its dtype, a Bytes/JSONField ``(B, max_size) uint8``.

    Args:
        path: a ``.beton`` file, an LMDB directory, or a sharded dataset's directory (read as
            one dataset, :mod:`ffload.formats.shards`; see :func:`ffload.formats.open_dataset`),
            or the URL of a ``.beton`` (or of a sharded dataset) on object storage
            (``s3://bucket/key.beton``, ``https://host/x.beton``, ``gs://bucket/key.beton``, any
            fsspec protocol; ``pip install 'ffload[s3]'`` / ``[http]`` / ``[gcs]``). A remote dataset is read in whole pages (the
            ``.beton`` page size) with range GETs, at most ``max_requests`` at once, into a page
            pool backed by a sparse cache file in ``cache_dir`` of at most ``cache_limit`` bytes
            (:mod:`ffload.loaders.memory.pagepool`), ahead of need in the epoch's order; pages that stay
            in the pool serve later epochs without a request. ``os_cache`` does not apply, and
            ``cache_limit`` must hold ``min(batch_size, pages)`` pages. GETs are retried on
            transient errors (:mod:`ffload.storage`); a permanent one (missing object, denied
            access, refused credentials) raises :class:`~ffload.errors.StorageError` naming the
            object. LMDB URLs are refused (LMDB needs a local memory map).
        batch_size: samples per batch (>= 1); the last batch of an epoch may be smaller unless
            ``drop_last``.
        num_workers: worker threads (>= 1); ``None`` or ``-1``: the CPUs this process may use
            (its affinity mask and cgroup CPU quota, :func:`ffload.system.available_cpus`);
            more than those CPUs is capped at their number with a warning. ``"auto"``: chosen
            and changed while the loader runs, between 1 and those CPUs, from how long the
            consumer waits, how long jobs take and the CPU the consumer's own thread uses
            (:mod:`ffload.loaders.autotune`; the choices are in :meth:`stats` and logged at
            INFO). Batches are identical whatever the setting.
        order: ``'sequential'``, ``'random'`` or ``'quasi_random'`` (or :class:`OrderOption`), see
            :mod:`ffload.loaders.orders`.
        os_cache: True: memory-map the file (the OS page cache serves and shares it); False: read
            the blocks each batch needs into a private process cache of at most ``cache_limit``
            bytes (see :mod:`ffload.loaders.memory.process_cache`; in QUASI_RANDOM order a fixed pool of page
            slots when ``cache_limit`` holds ``batch_size`` pages, see
            :mod:`ffload.loaders.memory.pagepool`).
        pipelines: field name -> list of operations (decoder first), ``None`` to disable a field;
            unlisted fields get the default pipeline (decoder + ``ToTensor``). Images of several
            sizes have no default (pass a crop decoder).
        drop_last: drop the last incomplete batch of each epoch (and, when distributed, truncate
            the epoch to a multiple of the world size instead of padding it).
        distributed: split every epoch across the ``torch.distributed`` ranks like
            ``torch.utils.data.DistributedSampler`` (same order on every rank, rank ``r`` takes
            ``order[r::world_size]``); the process group must be initialised first.
        seed: non-negative int; fixes the epoch orders and every per-sample random choice.
        indices: ``(M,)`` dataset indices to visit (a subset, in this order for ``'sequential'``); the
            pipelines are declared on these samples only (e.g. one image size among them is enough
            for ``SimpleRGBImageDecoder``).
        batches_ahead: batches prepared in advance (>= 0). The loader keeps
            ``max(batches_ahead, num_workers)`` jobs in flight so that every worker is busy (a
            job is ``batches_per_job`` batches: ``batches_ahead`` is rounded up to whole jobs).
            ``"auto"``: the workers plus a depth that grows when the consumer waits in bursts,
            within ``buffer_limit``.
        pin_memory: place the inputs of ``ToTensor`` in pinned memory (fast asynchronous copies
            to the GPU). ``None``: True when CUDA is available and some field ends on a CUDA
            device.
        cache_limit: ``os_cache=False`` only: bytes of process cache resident at most, whatever
            the dataset's size (``None``: a quarter of the available memory, at most 8 GiB).
            One batch must fit: the loader checks at open (and sizes its jobs by it:
            ``batches_per_job``).
        read_ahead: bytes of the next batches' payload pages requested from the kernel ahead of
            the batch being decoded (``madvise(MADV_WILLNEED)`` from an IO thread, see
            :mod:`ffload.loaders.memory.readahead`); ``None``: 512 MiB; 0 disables it.
        custom_field_mapper: extra output name -> the field it decodes again, with its own
            pipeline in ``pipelines`` (FFCV's argument): several augmented views of one sample from
            one read (SimCLR, DINO multi-crop). Views follow the fields in the batch tuple.
        max_pixels: refuse a dataset whose metadata declares an image of more pixels (see
            :func:`ffload.formats.open_dataset`); ``None``: no limit.
        storage_options: a remote ``path``'s filesystem options (credentials, ``endpoint_url``,
            see :func:`ffload.storage.open_filesystem`); ``None``: the environment and ``~/.aws``.
        cache_dir: a remote ``path``'s cache folder (``None``: ``$FFLOAD_CACHE_DIR`` or
            ``~/.cache/ffload``); the cache file is unlinked as soon as it is created.
        max_requests: a remote ``path``'s range GETs in flight at most (``None``: 8); for a
            local file read through the page pool (``os_cache=False``, QUASI_RANDOM), the page
            reads its read-ahead issues at once (``None``: 32).
        buffer_limit: ``batches_ahead="auto"`` only: bytes the batch buffers (``batches_ahead +
            2`` slots) may take at most (``None``: a quarter of the available memory); it must
            hold 2 slots.
        batches_per_job: consecutive batches one worker computes in one job (>= 1): every
            pipeline runs once on their concatenated rows, into one slot whose buffers hold them
            all, and the batches are handed out as row ranges of it, in order, with the same
            contents and the same validity rule as one batch per job. This pays the per-batch
            Python work of the loader and the pipelines (seeds, contexts, kernel calls, hand-offs
            between threads) once per job: where a batch decodes in well under a millisecond
            (small images, e.g. CIFAR), that work limits the loader. ``"auto"``: as many batches
            as make 8 MiB of buffers (``JOB_BYTES``), at most 16; both times ``num_workers / 4``
            with 5 to 16 workers (with ``num_workers="auto"``: the usable CPUs), 4 times beyond
            (the GIL all workers share is then held less per batch), a grown job's bytes at most
            ``buffer_limit`` (or a quarter of the available memory) over ``2 * (workers + 2)``;
            and per epoch few enough that every worker gets two jobs of it, or, once the jobs
            were measured fast against the GIL their Python holds (196-batch epochs at 16
            workers: under about 2.7 ms per batch), few enough that the epoch has more jobs
            than slots where that allows larger jobs; in a long epoch (more than the usual
            size times ``num_workers + 2`` batches) up to that growth squared (16 workers: 128
            MiB, at most 256 batches), where the usual job holds several batches and the slots
            are not pinned (pinned ones keep the usual size, 32 MiB at 16 workers): the slots
            reserve it as address space, whose pages stay resident once fast jobs have filled
            them (``_job_size_rule``; with
            ``num_workers="auto"``, counted at the start of each epoch from the workers the
            tuner admits then; the slots hold the most a job may take, so they are sized for
            the larger jobs even where the jobs prove slow); and few enough that
            ``buffer_limit`` holds a slot per worker and two more. With ``os_cache=False`` the
            process cache pins a job's payloads until it is decoded: at most as many batches
            as let every worker's job fit in half of ``cache_limit`` (a batch counted at its
            worst case, its largest payloads), a larger value raising ConfigurationError.
            The page pool (``os_cache=False`` in QUASI_RANDOM order) pins a job's pages: each
            epoch's jobs are halved until every job's pages, counted on that epoch's order, fit
            its slots shared by the workers; an explicit value only until a job fits the whole
            pool, with a warning naming both (the pages depend on each epoch's order).
            1 where several cannot be run together: a stage that is not rowwise
            (:class:`~ffload.loaders.pipeline.operation.Operation`; e.g. ``PythonTransform``, a
            ``torch.nn.Module``, box stages), batches that end on a CUDA device, or a remote
            dataset (its page pool fetches one batch's pages per job). When a job fails, its
            batches run again one by one, so the batches before the failing one are yielded and
            the error names its batch.

    Attributes:
        memory: the memory manager; for a remote ``path`` the :class:`~.pagepool.PagePoolMemory`
            (``memory.source.requests``: GETs issued so far, the opening reads included;
            ``memory.resident_bytes`` and ``memory.cache_file_bytes()``: the cache's size).
        batches_per_job: the batches one job computes (the ``batches_per_job`` argument, or what
            ``"auto"`` chose: then the most a job of an epoch may take, and ``stats()`` gives the
            current epoch's).

    Buffer reuse (as in FFCV, batches are views of reused buffers): a yielded batch stays valid
    while you handle it and the next one; requesting the batch after that may overwrite it.
    ``.clone()`` what you keep longer. One epoch iterator is live per loader: ``iter(loader)``
    closes the previous one (further ``next()`` on it raises
    :class:`~ffload.errors.LoaderClosedError`, a ``RuntimeError``).

    Epochs: each ``iter(loader)`` starts the next epoch (0, 1, 2, ...), re-shuffled; see
    :meth:`state_dict` to resume mid-epoch. Per-sample seeds are
    ``rng.sample_seeds(seed, epoch, index)``, so batches are identical for any ``num_workers``.
    With batches on the CPU, an epoch of more jobs than batch slots and a local or mapped file
    (not the page pool), the next epoch's first jobs run while the current epoch's last ones do
    (:class:`~ffload.loaders.iterator.NextEpochJobs`), so the workers do not idle between epochs
    (an epoch that fits in the slots keeps what it yielded to its end, as before); they are
    dropped, and computed again, when the next
    ``iter`` starts another epoch or a setting of a given operation changed in between (a new
    ``output_size``, any attribute of the operation set to a new number, string, tuple or array,
    or an array of up to 1 MiB changed in place). A setting held in another object the operation
    refers to is not compared (sizes excepted: an operation's ``output_size``): change it before
    the next epoch's first jobs are submitted, shortly before the epoch's last batches, or assign
    one of the operation's own attributes.

    Raises:
        ffload.formats.DatasetError: the path is not a dataset, or declares an image above
            ``max_pixels`` (naming the sample).
        ffload.errors.ConfigurationError: (a ``ValueError``) bad ``batch_size``, ``num_workers``,
            ``batches_ahead`` (an integer or ``"auto"``), ``buffer_limit`` (under 2 slots),
            ``batches_per_job`` (an integer or ``"auto"``; above what a job can hold here, saying
            why: 1 for a stage that is not rowwise, CUDA batches or a remote dataset, the
            process cache's share of ``cache_limit`` with ``os_cache=False``),
            ``order``, ``seed``, ``indices`` (out of range, not integers, empty), unknown field
            names in ``pipelines``; with ``os_cache=False``, a batch that may need more than
            ``cache_limit`` bytes (both named); the batch buffers (``batch_size`` rows, one slot
            per batch ahead and per worker) need more bytes than the memory available (both named).
        ffload.errors.PipelineError: (a ``TypeError``) a pipeline that does not fit its field
            (the message names the field and the operation).
        ffload.errors.UnavailableError: (a ``RuntimeError``) ``distributed=True`` without an
            initialised process group; ``pin_memory=True`` without CUDA.
        ffload.errors.LoaderClosedError: ``iter()`` on a closed loader (and ``next()`` on an
            iterator whose loader was closed), saying so.
        LoaderError: (while iterating) a sample failed to decode (names the sample and field).
    """

    def __init__(
        self,
        path: str | os.PathLike,
        batch_size: int,
        num_workers: int | str | None = None,
        order: str | OrderOption = "random",
        os_cache: bool = True,
        pipelines: Mapping[str, Sequence[Any] | None] | None = None,
        drop_last: bool = False,
        distributed: bool = False,
        seed: int = 0,
        indices: Sequence[int] | None = None,
        batches_ahead: int | str = 3,
        pin_memory: bool | None = None,
        cache_limit: int | None = None,
        read_ahead: int | None = None,
        custom_field_mapper: Mapping[str, str] | None = None,
        max_pixels: int | None = DEFAULT_MAX_PIXELS,
        storage_options: Mapping[str, Any] | None = None,
        cache_dir: str | os.PathLike | None = None,
        max_requests: int | None = None,
        buffer_limit: int | None = None,
        batches_per_job: int | str = "auto",
    ):
        self.batch_size = _check_int("batch_size", batch_size, 1)
        cpus = available_cpus()
        auto_workers = _is_auto("num_workers", num_workers)
        if num_workers is None or num_workers == -1:
            num_workers = cpus
        workers = cpus if auto_workers else _check_int("num_workers", num_workers, 1)
        if workers > cpus:
            warnings.warn(
                f"num_workers={workers} exceeds the {cpus} CPUs this process may use: "
                f"capped at {cpus} (more threads than cores only contend)",
                stacklevel=2,
            )
            workers = cpus
        auto_ahead = _is_auto("batches_ahead", batches_ahead)
        self.batches_ahead = None if auto_ahead else _check_int("batches_ahead", batches_ahead, 0)
        self.seed = _check_int("seed", seed, 0)
        self.order = parse_order(order)
        self.drop_last, self.distributed, self.os_cache = bool(drop_last), bool(distributed), bool(os_cache)
        self.rank, self.world_size = _distributed_rank() if self.distributed else (0, 1)

        self.remote = is_remote(path)
        if max_requests is None:
            max_requests = DEFAULT_MAX_REQUESTS if self.remote else DEFAULT_LOCAL_REQUESTS
        max_requests = _check_int("max_requests", max_requests, 1)
        self.view = open_dataset(
            os.fspath(path),
            max_pixels=max_pixels,
            storage_options=None if storage_options is None else dict(storage_options),
        )
        self.path = self.view.path
        self.indices = _check_indices(indices, self.view)
        # buffers hold a batch: no more rows than an epoch has samples
        rows = max(1, min(self.batch_size, self._samples_per_rank()))
        # the pipelines' declare-time checks (one image size, the largest payload) see only what will be read
        declared_on = self.view if indices is None else dataclasses.replace(self.view, selection=self.indices)
        self._build = (declared_on, pipelines, rows, custom_field_mapper)
        self._pipelines = build_pipelines(*self._build)
        self._sizes = _output_sizes(pipelines)
        self.field_names: list[str] = [p.name for p in self._pipelines]
        self._read_fields = list(dict.fromkeys(p.source for p in self._pipelines))  # each field read once
        self._device = cuda_device(self._pipelines)
        if pin_memory is None:
            pin_memory = self._device is not None and torch.cuda.is_available()
        elif pin_memory and not torch.cuda.is_available():
            raise UnavailableError("pin_memory=True needs CUDA, which torch cannot use here")
        self.pin_memory = bool(pin_memory)
        self.cache_limit = default_cache_limit() if cache_limit is None else _check_int("cache_limit", cache_limit, 1)
        self.read_ahead = DEFAULT_READ_AHEAD if read_ahead is None else _check_int("read_ahead", read_ahead, 0)
        # where the payloads are read from (built below, once the job's rows are known)
        quasi = self.order is OrderOption.QUASI_RANDOM
        if self.remote:
            memory = "remote"
        elif self.os_cache or not self._local_files():
            memory = "mapped"  # OSCacheMemory, built with the runner
        elif quasi and page_pool_fits(self.view, self._read_fields, self.cache_limit, rows):
            memory = "pages"
        else:
            memory = "process"
        self._auto_job = _is_auto("batches_per_job", batches_per_job)
        limits = functools.partial(
            _batches_per_job,
            batches_per_job,
            self._pipelines,
            self._device,
            _memory_job_limit(memory, self.view, self._read_fields, self.cache_limit, rows, workers),
            workers,
            buffer_limit if auto_ahead and buffer_limit is not None else None,
        )
        self._usual_job = limits()
        # fast jobs of several batches may grow into larger slots (_job_size_rule): address space
        # until a job that grows touches it; pinned buffers are committed whole, so they keep the
        # usual size, and so do batches too large for the usual job to hold two (slow ones)
        grow = self._auto_job and not self.pin_memory and self._usual_job > 1
        most = limits(fast=True) if grow else self._usual_job
        # the slots: the largest job an epoch may get (auto workers are balanced per epoch in
        # __iter__, from one worker up; fast jobs may be larger, _job_size_rule)
        self.batches_per_job = _job_size_rule(
            self._auto_job, most, len(self), 1 if auto_workers else workers, 0.0, usual=self._usual_job
        )
        if self.batches_per_job > 1:  # the slots' buffers hold a job's rows
            self._build = (
                declared_on,
                pipelines,
                min(rows * self.batches_per_job, self._samples_per_rank()),
                custom_field_mapper,
            )
            self._pipelines = build_pipelines(*self._build)

        if self.order is OrderOption.QUASI_RANDOM:
            window = max(2 * self.batch_size * self.world_size, 4 * _samples_per_page(self.view))
            self._order = make_order(self.order, self.indices, self.seed, self.view.sample_pages, window)
        else:
            self._order = make_order(self.order, self.indices, self.seed)
        self._epochs = EpochsAhead()
        self._next_jobs: NextEpochJobs | None = None  # the next epoch's jobs submitted during this one
        per_slot = _slot_bytes(self._pipelines)
        if auto_ahead:
            max_ahead = _auto_depth(per_slot, buffer_limit, workers)
        else:
            # an epoch's jobs with every worker admitted, before they are measured (the smallest)
            smallest = _job_size_rule(self._auto_job, self.batches_per_job, len(self), workers, usual=self._usual_job)
            max_ahead = max(-(-self.batches_ahead // smallest), workers)
            _check_buffer_memory(per_slot, max_ahead + 2, self.batch_size, self.batches_ahead)
        self._tuner = AutoTuner(
            max_workers=workers,
            max_ahead=max_ahead,
            workers=None if auto_workers else workers,
            batches_ahead=self.batches_ahead,
            shares=PROCESS_SHARES,
            name=str(self.path),
            batches_per_job=self.batches_per_job,
        )
        # an epoch's job size, from the tuner's workers and measure (every epoch, its next one's
        # early jobs, a restored state)
        self._job_size = functools.partial(
            _tuned_job_size, self._auto_job, self.batches_per_job, self._usual_job, self._tuner
        )
        self._next_epoch, self._start_batch = 0, 0
        self._memory = None
        if memory == "remote":
            self._memory = remote_page_pool(
                self.view, self._read_fields, self.cache_limit, rows, cache_dir, max_requests
            )
        elif memory == "pages":
            pages = FilePages(open_data_files(self.view), self.view.data_size, self.view.page_size, max_requests)
            self._memory = PagePoolMemory(self.view, self._read_fields, self.cache_limit, rows, source=pages)
        elif memory == "process":  # checks that a job's samples fit
            # whole .beton pages hold whole samples; LMDB records straddle its nominal pages
            whole_pages = quasi and self.view.format in ("beton", "shards")
            job_rows = min(rows * self.batches_per_job, self._samples_per_rank())
            self._memory = ProcessCacheMemory(self.view, self._read_fields, self.cache_limit, job_rows, whole_pages)
        self._pool_jobs = memory == "pages" and self.batches_per_job > 1  # jobs sized per epoch (__iter__)
        self._runner: BatchRunner | None = None
        self._current: weakref.ref | None = None
        self._closed = False
        if len(self) == 0:
            logger.warning(
                "%s: the loader yields no batch (%d samples per rank, batch_size %d, drop_last=%s)",
                self.path,
                self._samples_per_rank(),
                self.batch_size,
                self.drop_last,
            )

    @property
    def memory(self):
        """The memory manager the batches are read from (see the class docstring)."""
        if self._memory is None:
            self._get_runner()
        return self._memory

    @property
    def pipelines(self) -> dict[str, list[Any]]:
        """Enabled field name -> its operations (defaults filled in), in output order."""
        return {p.name: list(p.ops) for p in self._pipelines}

    # ----------------------------------------------------------------- epochs
    def _samples_per_rank(self) -> int:
        return samples_per_rank(len(self.indices), self.world_size, self.drop_last)

    def __len__(self) -> int:
        """Batches per epoch on this rank: ``floor`` (``drop_last``) or ``ceil`` of samples per
        rank / ``batch_size``."""
        n = self._samples_per_rank()
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def epoch_order(self, epoch: int) -> np.ndarray:
        """The ``(len(self) * batch_size or fewer,) int64`` sample ids this rank visits in
        ``epoch``, in order (the concatenation of the epoch's batches)."""
        order = self._order.sample_order(epoch)
        if self.distributed:
            order = distributed_split(order, self.rank, self.world_size, self.drop_last)
        if self.drop_last:
            order = order[: len(self) * self.batch_size]
        return np.ascontiguousarray(order, dtype=np.int64)  # kernels get C-contiguous batches

    def _epoch_batches(self, epoch: int) -> EpochBatches:
        """``epoch``'s batches: :meth:`epoch_order` cut into ``batch_size`` views (the last may be
        shorter). Runs on the ``ffload-order`` thread (:class:`~.orders.EpochsAhead`): reads only
        what construction fixed."""
        return EpochBatches(self.epoch_order(epoch), self.batch_size)

    @property
    def next_epoch(self) -> int:
        """The epoch the next ``iter(loader)`` runs (FFCV's attribute); setting it starts that
        epoch from its first batch."""
        return self._next_epoch

    @next_epoch.setter
    def next_epoch(self, epoch: int) -> None:
        self._next_epoch, self._start_batch = _check_int("next_epoch", epoch, 0), 0

    def __iter__(self) -> EpochIterator:
        """Start the next epoch (closing the previous iterator); see the class docstring."""
        if self._closed:
            raise LoaderClosedError(f"the loader of {self.path} is closed: create a new Loader", path=self.path)
        self._close_current()
        runner = self._get_runner()
        epoch, start = self._next_epoch, self._start_batch
        adopted = self._adopt(epoch, start)
        try:
            # jobs of an abandoned iterator (or discarded next-epoch jobs) may still write into the slots
            runner.wait_idle(keep=[future for _, _, future in adopted.futures] if adopted is not None else ())
            self._resize_if_asked(runner)
            batches = self._epochs.get(epoch, self._epoch_batches)
            per_job = self._job_size(len(batches))
            if self._pool_jobs:  # the epoch's jobs must fit the page pool (its order decides how many pages)
                per_job = self._memory.job_batches(batches, start, per_job, self._tuner.max_workers, not self._auto_job)
        except BaseException:  # a new output size that does not fit, an interrupt: this epoch starts at the next iter()
            if adopted is not None:
                adopted.discard()
            raise
        self._next_epoch, self._start_batch = epoch + 1, 0
        # the next epoch's batches, on the helper thread during this epoch; here while no job has
        # run yet (QUASI_RANDOM's is compiled code, not to run beside the first job's loading)
        self._epochs.prepare(epoch + 1, self._epoch_batches, now=not runner.first_job_done)
        # adopted jobs pinned (or read and released) their batches' payloads: prepared already
        first = start if adopted is None else adopted.next_submit
        self._memory.schedule(batches, first)
        runner.scheduled_epoch = epoch
        if runner.read_ahead is not None:
            runner.read_ahead.schedule(batches, first)
        self._tuner.set_batches_per_job(per_job)
        # Only an epoch with more jobs than slots, which reuses its own slots anyway: one that fits
        # keeps every batch it yielded intact to its end (``list(loader)`` of a small dataset).
        jobs = -(-(len(batches) - start) // per_job)
        if (
            self._device is None
            and isinstance(self._memory, (OSCacheMemory, ProcessCacheMemory))
            and jobs > runner.num_slots
        ):
            self._next_jobs = NextEpochJobs(
                runner,
                epoch + 1,
                functools.partial(self._epochs.ready, epoch + 1),
                self._job_size,
                functools.partial(_op_params, self._build[1]),
            )
        iterator = EpochIterator(
            runner,
            batches,
            epoch,
            start,
            owner=self,
            batches_per_job=per_job,
            next_jobs=self._next_jobs,
            adopted=adopted,
        )
        self._current = weakref.ref(iterator)
        return iterator

    def _adopt(self, epoch: int, start: int) -> NextEpochJobs | None:
        """The next-epoch jobs submitted during the last epoch (:class:`~.iterator.NextEpochJobs`)
        when they are this epoch's from its first batch and no operation's setting changed since
        they were planned (a new ``output_size``, a user's new parameter); else they are
        discarded, and None."""
        jobs, self._next_jobs = self._next_jobs, None
        if jobs is None:
            return None
        ops = self._build[1]
        if (
            jobs.epoch == epoch
            and start == 0
            and jobs.futures
            and jobs.params == _op_params(ops)
            # a size an operation reads from another object escapes _op_params; no kept job may see a resize
            and _output_sizes(ops) == self._sizes
        ):
            return jobs
        jobs.discard()
        return None

    def _resize_if_asked(self, runner: BatchRunner) -> None:
        """Progressive resizing (FFCV's ImageNet recipe): when an operation given to this loader
        (a decoder's ``output_size``, or a :func:`~ffload.transforms.from_torchvision` result's) has
        a new output size, declare the pipelines again before the epoch starts. The compiled kernels
        take the size as an argument, so nothing is compiled again; the slots' buffers are
        allocated for the new shapes (the last two batches yielded keep their memory).

        Raises:
            ConfigurationError: the new size is invalid for its pipeline, or its buffers cannot fit
                in memory (named as at construction).
        """
        sizes = _output_sizes(self._build[1])
        if sizes == self._sizes:
            return
        pipelines = build_pipelines(*self._build)
        if self.batches_ahead is not None:
            _check_buffer_memory(_slot_bytes(pipelines), runner.num_slots, self.batch_size, self.batches_ahead)
        logger.info("%s: output sizes changed to %s; pipelines declared again", self.path, sizes)
        self._pipelines, self._sizes = pipelines, sizes
        runner.replace_pipelines(pipelines)
        self._tuner.job_seconds_per_batch = None  # measured at the old size: the next epoch starts unmeasured

    def _local_files(self) -> bool:
        """Whether the payloads live in local files (one data file, or a sharded dataset's shards)."""
        return self.view.remote is None and (self.view.data_path is not None or self.view.shards is not None)

    def _get_runner(self) -> BatchRunner:
        if self._runner is None:
            if self._memory is None:
                self._memory = OSCacheMemory(self.view)
            columns = payload_columns(self.view, self._read_fields)
            read_ahead = None
            if self.read_ahead and columns and isinstance(self._memory, PagePoolMemory):
                read_ahead = PagePoolReadAhead(self._memory, self.read_ahead)
            elif self.read_ahead and columns and self._local_files() and readahead.AVAILABLE:
                unit = self._memory.block if isinstance(self._memory, ProcessCacheMemory) else ADVISE_PAGE
                read_ahead = ReadAhead(
                    self.view.shards or self.view.data_path,
                    self.view.data_size,
                    columns,
                    self.read_ahead,
                    unit=unit,
                    samples=self.indices,
                )
            self._runner = BatchRunner(
                self._pipelines,
                self._memory,
                self.view,
                self.seed,
                self._tuner,
                self.pin_memory,
                self._device,
                read_ahead,
            )
        return self._runner

    @property
    def num_workers(self) -> int:
        """Worker threads running jobs now (the fixed setting, or the auto-tuner's choice)."""
        return self._tuner.workers

    def stats(self) -> dict[str, Any]:
        """The worker and prefetch choices and what they were made from.

        Returns:
            :meth:`ffload.loaders.autotune.AutoTuner.stats` (``num_workers``,
            ``batches_ahead``, ``auto_workers``, ``auto_ahead``, ``max_workers``, ``max_ahead``,
            ``cap``, ``reserve``, ``need``, ``batches_observed``, ``last_window`` with the
            medians ``step_ms`` and ``job_ms`` per batch, the mean ``wait_ms`` per batch and ``consumer_cpu`` (fraction of a
            core), ``history`` of changes, ``batches_per_job`` of the current epoch) plus ``slots``
            (job slots allocated),
            ``parked`` (worker threads beyond the workers admitted, auto workers only) and
            ``devices``: per field whose decoder runs on a device (``device=``), its stage's
            :meth:`~ffload.loaders.device.stage.DeviceImageStage.stats` (backend, share, rows and
            per-row times).
        """
        out = self._tuner.stats()
        runner = self._runner
        out["slots"] = runner.slots_allocated() if runner is not None else 0
        out["parked"] = runner.parked if runner is not None else 0
        out["devices"] = {
            p.name: p.ops[0].stage.stats() for p in self._pipelines if getattr(p.ops[0], "stage", None) is not None
        }
        return out

    def _live_iterator(self) -> EpochIterator | None:
        iterator = self._current() if self._current is not None else None
        return iterator if iterator is not None and iterator.active else None

    def _close_current(self, why: str = "by a newer iter(loader) or load_state_dict()") -> None:
        iterator = self._live_iterator()
        if iterator is not None:
            iterator.close(reason=f"this iterator over {self.path} (epoch {iterator.epoch}) was closed {why}")

    # ------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, int]:
        """Where the loader stands, to resume with :meth:`load_state_dict`.

        Returns:
            ``{'epoch', 'batches_yielded', 'seed', 'batch_size', 'order', 'drop_last',
            'num_indices', 'world_size'}`` (plain ints/str/bool), and with ``"auto"`` workers or
            depth ``'autotune': {'num_workers', 'batches_ahead'}`` (the tuner's choices, which a
            resumed loader starts from; batches do not depend on them). Inside a live epoch:
            that epoch and the batches handed out so far; otherwise the next epoch and 0.
            A finished epoch is reported as the start of the next one.
        """
        iterator = self._live_iterator()
        if iterator is not None:
            epoch, done = iterator.epoch, iterator.batches_yielded
        else:
            epoch, done = self._next_epoch, self._start_batch
        if len(self) and done >= len(self):
            epoch, done = epoch + 1, 0
        state = {
            "epoch": int(epoch),
            "batches_yielded": int(done),
            "seed": self.seed,
            "batch_size": self.batch_size,
            "order": self.order.value,
            "drop_last": self.drop_last,
            "num_indices": int(len(self.indices)),
            "world_size": self.world_size,
        }
        if self._tuner.auto_workers or self._tuner.auto_ahead:
            state["autotune"] = self._tuner.state()
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume: the next ``iter(loader)`` yields the remaining batches of ``state['epoch']``,
        bit-identical to an uninterrupted run, and later iterators continue with the following
        epochs. Closes a live iterator.

        Raises:
            ConfigurationError: missing keys, or a state saved with another seed, batch size, order,
                ``drop_last``, number of indices or world size (batches would not line up).
        """
        missing = [k for k in _STATE_KEYS if k not in state]
        if missing:
            raise ConfigurationError(f"loader state lacks {', '.join(missing)}")
        mine = self.state_dict()
        bad = [f"{k}={state[k]!r} (this loader: {mine[k]!r})" for k in _STATE_KEYS[2:] if state[k] != mine[k]]
        if bad:
            raise ConfigurationError("loader state does not match this loader: " + ", ".join(bad))
        epoch = _check_int("state['epoch']", state["epoch"], 0)
        done = _check_int("state['batches_yielded']", state["batches_yielded"], 0)
        if done > len(self):
            raise ConfigurationError(f"state['batches_yielded']={done} exceeds the {len(self)} batches per epoch")
        self._close_current()
        tuned = state.get("autotune")
        if isinstance(tuned, Mapping) and all(isinstance(tuned.get(k), int) for k in ("num_workers", "batches_ahead")):
            batches = len(self)
            self._tuner.restore(tuned, job_size=lambda workers: self._job_size(batches, workers))
            if self._runner is not None:
                self._runner.set_workers(self._tuner.workers)
        finished = len(self) and done == len(self)
        self._next_epoch, self._start_batch = (epoch + 1, 0) if finished else (epoch, done)

    # -------------------------------------------------------------- lifetime
    def close(self) -> None:
        """Stop the epoch, join the worker threads, release the file. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._close_current("because its loader was closed (loader.close())")
        if self._next_jobs is not None:
            self._next_jobs.discard()
        self._tuner.close()
        self._epochs.close()
        if self._runner is not None:
            self._runner.shutdown(wait=True)
        if self._memory is not None:
            self._memory.close()

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self, _finalizing=sys.is_finalizing):
        tuner = getattr(self, "_tuner", None)
        if tuner is not None:
            tuner.close()
        epochs = getattr(self, "_epochs", None)
        if epochs is not None and not _finalizing():
            epochs.close(wait=False)  # this may run on that thread (its job held the last reference)
        runner = getattr(self, "_runner", None)
        # At interpreter exit the executor's own atexit hook joins the threads, and the modules
        # shutdown() needs may already be torn down (``sys`` itself may be None by then: the
        # check is bound when the class is defined).
        if runner is not None and not _finalizing():
            runner.shutdown(wait=False)

    def __repr__(self) -> str:
        return (
            f"Loader({self.path!r}, batch_size={self.batch_size}, num_workers="
            f"{'auto:' if self._tuner.auto_workers else ''}{self.num_workers}, order={self.order.value!r}, "
            f"fields={self.field_names})"
        )


def _is_auto(name: str, value) -> bool:
    """Whether ``value`` is ``"auto"``; another string raises ConfigurationError naming ``name``."""
    if isinstance(value, str):
        if value != "auto":
            raise ConfigurationError(f"{name} must be an integer or 'auto', got {value!r}")
        return True
    return False


def _output_sizes(pipelines) -> dict[tuple[str, int], Any]:
    """``(field, position) -> output_size`` of every given operation that has one (the crop and
    resize decoders): what :meth:`Loader.__iter__` compares to notice a change between epochs."""
    if not pipelines:
        return {}
    return {
        (name, i): op.output_size
        for name, ops in pipelines.items()
        for i, op in enumerate(ops or ())
        if hasattr(type(op), "output_size")
    }


JOB_PYTHON_S = 0.5e-3
"""Seconds a job's Python holds the GIL, about, with 16 workers on a 16-core node (37 us per batch
of 10-batch jobs measured there, developer notes, ninth round): what :func:`_job_size_rule`
weighs a job's time against."""


def _job_size_rule(
    auto: bool,
    most: int,
    batches: int,
    workers: int,
    seconds_per_batch: float | None = None,
    slots: int = 0,
    usual: int | None = None,
) -> int:
    """The batches per job of an epoch of ``batches`` batches run by ``workers``: ``most`` (the
    loader's ``batches_per_job``), or with ``auto`` at most that (the slots hold ``most`` batches;
    a job of fewer uses part) and:

    * at most ``usual`` (the loader's usual job, from :func:`_job_limits` without ``fast``;
      default ``most``), and few enough that each worker gets two jobs of the epoch: the last
      round of jobs, where workers fall idle one by one, is then short;
    * or, where that is larger, the largest that leaves the epoch more jobs than ``slots`` (the
      runner's now, ``tuner.ahead + 2``; at least ``workers + 2``, the fewest a loader keeps with
      ``workers``, which gives the largest size), up to ``most``, when such jobs are fast:
      ``seconds_per_batch`` (the jobs' wall time per batch measured so far,
      :attr:`~.autotune.AutoTuner.job_seconds_per_batch`; ``None`` before any: the first epoch;
      ``0.0`` asks for the largest size the rule may give) times the first size is under
      twice ``workers`` times :data:`JOB_PYTHON_S`. The GIL that every job's Python holds then
      binds the workers, and it is held once per job, so fewer, larger jobs load more (raw 32x32
      on a 16-core node, 196-batch epochs at 16 workers: 10 batches per job 1.46x the 6 of two
      per worker, developer notes). A GIL-bound job's wall time stays under that bound (it is
      the workers' share of the GIL), so the measure does not hide what it looks for. Such an
      epoch still runs the next epoch's first jobs during its last ones
      (:class:`~.iterator.NextEpochJobs`). Slow jobs keep the first size: with 10 ms per batch
      the larger jobs lost 6-11 % at 8 and 16 workers (``bench_scale.py --cases wait``). In a
      long epoch the first size is ``usual`` and the second up to ``most``: the larger slots
      (:func:`_job_limits` with ``fast``) that fast jobs fill with many workers.

    Without ``usual``, with ``workers + 2`` slots, the second size is the larger from 3 workers on."""
    if not auto:
        return most
    size = min(most if usual is None else usual, batches // (2 * workers))
    if seconds_per_batch is not None and size * seconds_per_batch < 2 * workers * JOB_PYTHON_S:
        size = max(size, (batches - 1) // max(slots, workers + 2))
    return max(1, min(most, size))


def _tuned_job_size(
    auto: bool, most: int, usual: int, tuner: AutoTuner, batches: int, workers: int | None = None
) -> int:
    """:func:`_job_size_rule` for ``workers`` (default: those ``tuner`` admits now), with its
    measure of the jobs and its slots (``tuner.ahead + 2``)."""
    workers = tuner.workers if workers is None else workers
    return _job_size_rule(auto, most, batches, workers, tuner.job_seconds_per_batch, tuner.ahead + 2, usual)


_PLAIN = (bool, int, float, complex, str, bytes, type(None), np.generic)

_COMPARED_BYTES = 2**20
"""Bytes up to which :func:`_op_params` compares an array's (or a string's) contents; a larger one
is compared by identity (:class:`_Same`)."""


class _Same:
    """An attribute compared by identity (it holds the object, so its id is not reused meanwhile)."""

    def __init__(self, value: object):
        self.value = value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Same) and other.value is self.value

    __hash__ = None  # type: ignore[assignment]


def _setting(value: object) -> object:
    """A comparable copy of an operation's attribute if it is a setting (:data:`_PLAIN`, an array,
    or a tuple or list of them), else None."""
    if isinstance(value, (str, bytes)) and len(value) > _COMPARED_BYTES:
        return _Same(value)
    if isinstance(value, _PLAIN):
        return repr(value)
    if isinstance(value, np.ndarray):
        if value.nbytes > _COMPARED_BYTES:
            return _Same(value)
        return ("array", value.dtype.str, value.shape, value.tobytes())
    if isinstance(value, (tuple, list)):
        items = [_setting(v) for v in value]
        return None if any(v is None for v in items) else (type(value).__name__, *items)
    return None


def _op_params(pipelines) -> tuple:
    """A snapshot of every given operation's settings (its attributes that are numbers, strings,
    None, arrays, or tuples and lists of them; :func:`_setting`): what :meth:`Loader.__iter__`
    compares to notice that one changed between epochs (a new ``output_size``, a user's new
    probability or mean), so that next-epoch jobs computed with the old ones are not handed out."""
    snapshot = []
    for name, ops in (pipelines or {}).items():
        for i, op in enumerate(ops or ()):
            settings = {k: _setting(v) for k, v in getattr(op, "__dict__", {}).items()}
            snapshot.append((name, i, tuple(sorted((k, v) for k, v in settings.items() if v is not None))))
    return tuple(snapshot)


def _slot_bytes(pipelines) -> int:
    """Bytes of host memory one batch slot takes: every pipeline's buffers but those on CUDA."""
    per_slot = 0
    for pipeline in pipelines:
        for spec in pipeline.buffer_specs:
            if spec is None or (spec.on_torch and str(spec.device).startswith("cuda")):
                continue
            itemsize = spec.dtype.itemsize if spec.on_torch else np.dtype(spec.dtype).itemsize
            per_slot += int(np.prod(spec.shape, dtype=np.int64)) * itemsize
    return per_slot


def _auto_depth(per_slot: int, buffer_limit: int | None, cpus: int) -> int:
    """The deepest auto prefetch: ``buffer_limit`` (``None``: a quarter of the available memory)
    over ``per_slot`` bytes, less the 2 slots of the batches the consumer holds, at most ``4 *
    cpus + 8``. Raises ConfigurationError when ``buffer_limit`` holds fewer than 2 slots."""
    if buffer_limit is None:
        budget = available_memory() // 4
    else:
        budget = _check_int("buffer_limit", buffer_limit, 1)
    slots = budget // per_slot if per_slot else 4 * cpus + 10
    if slots < 2:
        raise ConfigurationError(
            f"buffer_limit={budget} bytes holds {slots} batch slot(s) of {per_slot} bytes; "
            "batches_ahead='auto' needs 2: raise buffer_limit or lower batch_size"
        )
    return min(slots - 2, 4 * cpus + 8)


JOB_BYTES = 8 * 2**20
"""``batches_per_job="auto"``: the batch buffers a job fills, at least, where batches are smaller."""
MAX_BATCHES_PER_JOB = 16
"""``batches_per_job="auto"``: the most batches one job computes with up to 4 workers (more with
more workers: :data:`JOB_WORKERS`)."""
JOB_WORKERS = (4, 16)
"""``batches_per_job="auto"``: up to the first count of workers ``JOB_BYTES`` and
``MAX_BATCHES_PER_JOB`` hold; from there to the second, both grow in proportion (:func:`_job_limits`;
16 workers: 4 times), and the slots that jobs measured fast may fill grow with its square (16
times). Every job costs about the same Python under the GIL, which all workers share, so the
more workers run, the longer each job must be for that cost to stay a small part of the GIL's
time; and each batch costs some Python of its own besides (handing it out), so with small,
fast batches the part left for the jobs shrinks as workers are added: 0.8 of linear at 16
workers needs a serial fraction under 0.017, which raw 32x32 reaches with about 168 batches per
job (developer notes, eleventh round). Beyond 16 workers (not measured) the limits stay at 16's."""


def _job_limits(workers: int, budget: int, fast: bool = False) -> tuple[int, int]:
    """``(bytes, batches)``: the most an auto job fills with ``workers`` workers, ``JOB_BYTES`` and
    ``MAX_BATCHES_PER_JOB`` times ``min(workers, 16) / 4`` where that is over 1, or with ``fast``
    (the slots that jobs measured fast may fill, :func:`_job_size_rule`) times its square
    (:data:`JOB_WORKERS`). The grown bytes stay within what lets ``2 * (workers + 2)`` slots fit in
    ``budget`` bytes (room for a slot per worker, the consumer's two, and as many again for an auto
    prefetch depth); they are never under ``JOB_BYTES``."""
    scale = max(1.0, min(workers, JOB_WORKERS[1]) / JOB_WORKERS[0]) ** (2 if fast else 1)
    grown = min(int(JOB_BYTES * scale), budget // (2 * (workers + 2)))
    return max(JOB_BYTES, grown), int(MAX_BATCHES_PER_JOB * scale)


def _memory_job_limit(memory: str, view, fields: Sequence[str], cache_limit: int, rows: int, workers: int):
    """``None`` when the memory manager ``memory`` (``"mapped"``, ``"process"``, ``"pages"`` or
    ``"remote"``, as :class:`Loader` picks it) holds a job of any size, else ``(most, why)``: the
    most batches of ``rows`` samples a job may hold and why not more.

    The process cache (``os_cache=False`` on local files) pins a job's blocks until it is decoded,
    and every worker's job is pinned at once: ``workers`` jobs must fit in half of
    ``cache_limit`` (bytes), the other half caching what later batches read again, with a batch
    counted at its worst case (:func:`~.memory.process_cache.worst_batch_bytes`: the ``rows``
    largest payloads). The local page pool (QUASI_RANDOM order with ``os_cache=False``) caps each
    epoch's jobs by the pages they read instead, once its order is known
    (:meth:`~.memory.pagepool.PagePoolMemory.job_batches`); a remote dataset's pool holds one
    batch's pages per job."""
    if memory in ("mapped", "pages"):
        return None  # the local page pool sizes each epoch's jobs by its pages (PagePoolMemory.job_batches)
    if memory == "remote":
        return 1, "a remote dataset's page pool fetches one batch's pages per job"
    payloads = payload_columns(view, fields)
    per_batch = worst_batch_bytes(payloads, rows, cache_block(payloads, view.data_size))
    if not per_batch:  # no payload is read: nothing is pinned
        return None
    most = max(1, cache_limit // (2 * workers * per_batch))
    return most, (
        f"os_cache=False pins each job's payloads in the process cache, a batch may need {per_batch} "
        f"bytes of it, and the jobs of {workers} workers must fit in half of cache_limit={cache_limit} "
        f"(raise cache_limit, or use os_cache=True)"
    )


def _batches_per_job(
    value, pipelines, device, memory_limit, workers: int, budget: int | None = None, fast: bool = False
) -> int:
    """The most batches a job of a loader holds (see :class:`Loader`): ``value`` checked, or for
    ``"auto"`` the batches whose buffers make ``JOB_BYTES``, at most ``MAX_BATCHES_PER_JOB``, both
    scaled up with more than ``JOB_WORKERS[0]`` workers (:func:`_job_limits`, ``fast`` passed on;
    the growth within a quarter of the available memory, or ``budget``) and,
    with a ``budget`` (bytes: ``buffer_limit``), at most what lets it hold a slot per worker (of
    ``workers``) and the consumer's two (``pipelines`` are built with one batch's rows); the
    epoch's length then caps an auto value (:func:`_job_size_rule`). At most what the memory
    manager holds (``memory_limit``, :func:`_memory_job_limit`: ``None``, or ``(most, why)``;
    the process cache's share of ``cache_limit``, one batch for a remote dataset's pool), and 1 where a
    job cannot hold several batches: a pipeline that is not rowwise
    (:class:`~ffload.loaders.pipeline.operation.Operation`) or batches that end on a CUDA device.
    Raises ConfigurationError for another string, an integer under 1, or an integer above what
    a job can hold here (naming why)."""
    if _is_auto("batches_per_job", value):
        per_batch = max(1, _slot_bytes(pipelines))
        job_bytes, most = _job_limits(workers, available_memory() // 4 if budget is None else budget, fast)
        fit = job_bytes // per_batch
        if budget is not None:
            fit = min(fit, budget // (per_batch * (workers + 2)))
        wanted = max(1, min(fit, most))
    else:
        wanted = _check_int("batches_per_job", value, 1)
    if wanted == 1:
        return 1
    stage = next(((p.name, op) for p in pipelines for op in p.ops if not op.rowwise), None)
    most, why = (
        (1, f"stage {type(stage[1]).__name__} of field {stage[0]!r} is not rowwise")
        if stage is not None
        else (1, f"the batches end on {device}")
        if device is not None
        else memory_limit or (wanted, None)
    )
    if wanted <= most:
        return wanted
    if value != "auto":
        raise ConfigurationError(
            f"batches_per_job={value} is more than a job can hold here ({most}): {why}"
            if most > 1
            else f"batches_per_job={value} needs one batch per job here: {why}"
        )
    return most


def _check_buffer_memory(per_slot: int, slots: int, batch_size: int, batches_ahead: int) -> None:
    """Refuse buffers that cannot fit in memory: ``slots`` batch slots of ``per_slot`` bytes
    against :func:`~ffload.system.available_memory`. Raises ConfigurationError with the
    bytes needed."""
    needed, available = per_slot * slots, available_memory()
    if needed > available:
        raise ConfigurationError(
            f"batch_size={batch_size} with {slots} batch slots (batches_ahead={batches_ahead}, "
            f"and one per worker) needs {needed / 2**30:.1f} GiB of buffers, {per_slot} bytes "
            f"per slot; {available / 2**30:.1f} GiB of memory is available: lower batch_size "
            "or batches_ahead"
        )


def _distributed_rank():
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise UnavailableError(
            "distributed=True needs torch.distributed.init_process_group() to be called before the Loader is built"
        )
    return dist.get_rank(), dist.get_world_size()


def _check_indices(indices, view) -> np.ndarray:
    n = view.num_samples
    if indices is None:
        return np.arange(n, dtype=np.int64)
    arr = np.asarray(indices)
    if arr.dtype == bool:
        raise ConfigurationError("indices is a boolean mask; pass np.flatnonzero(mask)")
    if arr.ndim != 1 or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
        raise ConfigurationError(f"indices must be a 1-D sequence of integers, got {arr.dtype} of shape {arr.shape}")
    if arr.size == 0:
        raise ConfigurationError("indices is empty")
    bad = np.flatnonzero((arr < 0) | (arr >= n))
    if bad.size:
        raise ConfigurationError(
            f"indices[{int(bad[0])}] = {int(arr[bad[0]])} is out of range: {view.path} has {n} samples"
        )
    return arr.astype(np.int64)


def _samples_per_page(view) -> int:
    pages = view.sample_pages
    pages = pages[pages >= 0]
    if pages.size == 0:
        return 1
    return -(-pages.size // sorted_unique(pages).size)
