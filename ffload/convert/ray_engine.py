"""Encoding on a Ray cluster: Ray tasks encode chunks of samples, the driver gets them in order.

The counterpart of :func:`~ffload.convert.encode.encoded_chunks` for ``engine='ray'``: the same
:class:`~ffload.convert.encode.SampleEncoder` (put once in Ray's object store) and the same
:func:`~ffload.convert.encode.encode_chunk`, run as Ray tasks (``ray.remote``) on any node of the
cluster; each task returns its :class:`~ffload.convert.encode.EncodedChunk` (payloads in its
``tail`` bytes) through the object store. The driver takes the chunks in source order and the
caller writes them through the same writer as a local conversion, so the output is the same bytes.

At most ``max_in_flight`` chunks are submitted and not yet consumed (backpressure: the driver holds
one chunk, the object store at most ``max_in_flight``). A task whose worker dies is retried by Ray
(``max_retries``); a chunk that still fails comes back as a chunk whose every sample is an error
naming its source file, so that ``on_error`` applies to it as to any bad input.

Every node needs ffload (and the source's files, at the same paths) installed; Ray ships the
task's arguments, not the package. Follows Ray's task API (``ray.remote``, ``ray.put``, ``ray.get``).
A sharded conversion skips the driver's writing altogether: :mod:`.ray_shards`.
"""

from __future__ import annotations

import contextlib
from collections import Counter, deque
from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np

from ffload.convert.encode import ChunkSizer, EncodedChunk, SampleEncoder, encode_chunk
from ffload.errors import ConfigurationError
from ffload.formats.fields.base import metadata_dtype

if TYPE_CHECKING:
    from ffload.convert.conversion import Conversion

INSTALL_HINT = "engine='ray' needs Ray: pip install 'ffload[ray]' (or pip install ray)"
CHUNKS_PER_CPU = 2  # chunks in flight per cluster CPU (default max_in_flight)
MAX_RETRIES = 3  # Ray retries of a task whose worker or node died


def import_ray():
    """The ``ray`` module; ConfigurationError with the install hint when it is not installed."""
    try:
        import ray
    except ImportError as e:
        raise ConfigurationError(INSTALL_HINT) from e
    return ray


@contextlib.contextmanager
def joined_cluster(address: str | None = None) -> Iterator:
    """The ``ray`` module, within a Ray cluster for the ``with`` block: this process's own when it
    called ``ray.init`` already, else the one at ``address`` (``'auto'``, ``'ray://host:port'``:
    ``ray.init``'s address; None: ``RAY_ADDRESS`` or a new local instance), left
    (``ray.shutdown``) at the end.

    Raises:
        ConfigurationError: Ray is not installed (the message gives the install command).
        Errors of ``ray.init`` (an unreachable ``address``).
    """
    ray = import_ray()
    started = not ray.is_initialized()
    if started:
        ray.init(address=address, log_to_driver=False, configure_logging=False)
    try:
        yield ray
    finally:
        if started:
            ray.shutdown()


def task_result(ray, ref):
    """``ray.get(ref)``. An exception the task's own code raised (Ray wraps it in
    ``RayTaskError``) is raised again as itself: an ``OSError`` of a full disk, a
    ``StorageError`` of an upload, not a bad input. Ray's own errors (a worker or node lost after
    the retries: ``WorkerCrashedError``, ``NodeDiedError``, ``OutOfMemoryError``) propagate as
    ``ray.exceptions.RayError``, which the callers turn into errors of the task's samples."""
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as e:
        if isinstance(e.cause, BaseException):
            raise e.cause from None
        raise


def failure_errors(encoder: SampleEncoder, start: int, stop: int, error: BaseException) -> list[tuple[int, str, str]]:
    """``(index, input, cause)`` for each of samples ``start..stop-1``, whose Ray task failed
    with ``error`` after its retries: the cause names the task's range and first and last inputs."""
    cause = f"{type(error).__name__}: {error}".splitlines()[0]
    first, last = encoder.describe(start), encoder.describe(stop - 1)
    where = f"Ray task for samples {start}..{stop - 1} ({first} .. {last}) failed: {cause}"
    return [(i, encoder.describe(i), where) for i in range(start, stop)]


def _failed_chunk(encoder: SampleEncoder, start: int, stop: int, error: BaseException) -> EncodedChunk:
    """A chunk whose samples ``start..stop-1`` all failed (:func:`failure_errors`)."""
    return EncodedChunk(
        start,
        stop,
        np.zeros(0, np.int64),
        np.zeros(0, metadata_dtype(encoder.fields)),
        np.zeros((0, len(encoder.fields)), np.int64),
        -1,
        0,
        b"",
        failure_errors(encoder, start, stop, error),
        Counter(),
    )


def ray_encoded_chunks(
    encoder: SampleEncoder,
    chunk_size: int | None = None,
    start: int = 0,
    address: str | None = None,
    max_in_flight: int | None = None,
    max_retries: int = MAX_RETRIES,
) -> Iterator[tuple[EncodedChunk, None]]:
    """Encode samples ``start..N-1`` of ``encoder``'s source with Ray tasks, yielding
    ``(chunk, None)`` in source order (the interface of ``encoded_chunks``; payloads in ``tail``).

    Args:
        chunk_size: samples per task; None sizes chunks from the bytes per sample seen so far
            (about 16 MiB per chunk, at most 256 samples, as locally).
        start: the first source index to encode (a resumed conversion).
        address: the cluster (:func:`joined_cluster`).
        max_in_flight: chunks submitted and not yet consumed (default: 2 per cluster CPU).
        max_retries: Ray retries of a task whose worker process or node died.

    Raises:
        ConfigurationError: Ray is not installed (the message gives the install command).
        Errors of ``ray.init`` (an unreachable ``address``).
    """
    with joined_cluster(address) as ray:
        cpus = int(ray.cluster_resources().get("CPU", 1))
        limit = max(1, max_in_flight or CHUNKS_PER_CPU * cpus)
        task = ray.remote(num_cpus=1, max_retries=max_retries)(encode_chunk)
        shared = ray.put(encoder)
        sizer = ChunkSizer(len(encoder), chunk_size or 1, fixed=chunk_size is not None, start=start)
        pending: deque = deque()
        try:
            while True:
                while len(pending) < limit and (bounds := sizer.take()) is not None:
                    pending.append((bounds, task.remote(shared, *bounds)))
                if not pending:
                    return
                bounds, ref = pending.popleft()
                try:
                    chunk = task_result(ray, ref)
                except ray.exceptions.RayError as e:  # its worker or node was lost, past the retries
                    chunk = _failed_chunk(encoder, *bounds, e)
                sizer.observe(chunk)
                yield chunk, None
        finally:
            for _, ref in pending:  # closed early (an error, Ctrl-C): stop the work still queued
                ray.cancel(ref, force=True)


def write_ray_chunks(conversion: Conversion, writer) -> None:
    """The Ray one-file engine (``engine='ray'`` without ``shard_size``): Ray tasks at
    ``options.ray_address`` encode chunks (:func:`ray_encoded_chunks`, ``options.chunk_size``),
    written here in source order through ``writer``: the bytes of a local conversion."""
    options = conversion.options
    conversion.write_chunks(
        writer,
        ray_encoded_chunks(conversion.encoder, options.chunk_size, start=conversion.start, address=options.ray_address),
    )
