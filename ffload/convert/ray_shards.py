"""Sharded conversion on a Ray cluster: each Ray task encodes a range of samples and writes its own
``.beton`` shards; the driver only writes the manifest.

With ``engine='ray'`` and ``shard_size`` (``ffload convert SRC DST --engine ray --shard-size
1GB``), no image byte passes through the driver: a task encodes samples ``start..stop-1`` with
the same :class:`~ffload.convert.encode.SampleEncoder` and
:func:`~ffload.convert.encode.encode_chunk` as a local conversion, writes them through
:class:`~ffload.formats.shards.ShardFiles` (shards of at most ``shard_size`` bytes, each named
``shard-TTTTT-KKK.beton`` after its task ``T`` and its rank ``K`` in the task), and returns their
manifest entries, its labels, errors and outcomes. The driver adopts them in task order
(:meth:`~ffload.formats.shards.ShardedWriter.adopt`) and writes the manifest, so the dataset has
the samples, order and pixels of a local conversion; only the shard boundaries differ (they fall
on task boundaries too). The driver's share of the work is a few hundred bytes per shard, so the
conversion rate grows with the cluster's cores (:mod:`.ray_engine`'s chunks, by contrast, all
cross the driver, which bounds its rate; ``docs/developer-notes.md``).

Where tasks write:

* a local ``dst``: into the dataset's temporary directory (:mod:`ffload.formats.atomic`),
  renamed into place once the manifest is written. Every node's tasks must see that path: a
  local Ray instance, or a filesystem every node mounts (NFS, Lustre) at the same path.
* a URL ``dst`` (``s3://bucket/prefix``): each task writes its shards into a folder of its
  node's temporary directory (named after the URL and the task, emptied when a retried task
  starts) and uploads them under the prefix (fsspec, multipart; an object appears only when
  complete): a fresh version folder ``PREFIX/v-<time>-<hex>/`` that
  :func:`ffload.convert.convert.convert_dataset` gives (a killed task's folder is
  removed by the next task that starts on its node); the driver uploads the manifest
  last, so the dataset appears only once every shard is there, and a conversion that fails
  deletes the version folder.

Task sizes: the driver encodes a few samples spread over the source to estimate the bytes per
sample, and gives each task about ``0.95 * shard_size`` of payload (one shard), but at most
``ceil(N / CPUs)`` samples, so that every CPU of the cluster gets work: a dataset smaller than
``CPUs * shard_size`` gets more, smaller shards than ``shard_size`` asks. A task whose worker or
node dies is retried by Ray (its partial shard files are hidden ``.partial`` names, replaced by
the retry and removed at the end); one that still fails comes back as errors naming its samples'
source files, so that ``on_error`` applies as to any bad input. Progress: each task reports the
samples it has encoded so far to a small Ray actor (:class:`ProgressTally`) after every chunk; the
driver polls it while it waits, so the bar moves as the cluster works, not only as whole tasks
finish (a retried task's count restarts from zero: the tally keeps each task's highest count).
"""

from __future__ import annotations

import hashlib
import math
import os
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ffload.convert.encode import ChunkSizer, SampleEncoder, encode_chunk
from ffload.convert.provenance import source_origins
from ffload.convert.ray_engine import MAX_RETRIES, failure_errors, joined_cluster, task_result
from ffload.formats.atomic import pid_alive
from ffload.formats.shards import ShardFiles

if TYPE_CHECKING:
    from ffload.convert.conversion import Conversion

SHARD_FILL = 0.95  # a task's planned payload, as a fraction of the shard size
PROBE_SAMPLES = 8  # samples the driver encodes to estimate the bytes per sample
CANCEL_WAIT = 60.0  # seconds to wait for cancelled tasks to end, at most
POLL_SECONDS = 0.5  # how often the driver asks the progress tally while it waits
TASK_FOLDER = "ffload-shards-"  # prefix of a task's local folder (uploads to a URL)


@dataclass
class ShardTaskResult:
    """What one task wrote: source samples ``start..stop-1``.

    Attributes:
        shards: manifest entries (``path``, ``num_samples``, ``bytes``, ``sha256``) of its shard
            files, in sample order (``path`` relative to the dataset's directory or prefix).
        labels: ``(k,) int64`` the label of each sample written, in order (empty without a label field).
        errors: ``(source index, description, cause)`` of the samples that failed.
        outcomes: images passed through / re-encoded, counted (as :class:`~.encode.EncodedChunk`).
    """

    start: int
    stop: int
    shards: list[dict]
    labels: np.ndarray
    errors: list[tuple[int, str, str]]
    outcomes: Counter = field(default_factory=Counter)

    @property
    def samples(self) -> int:
        """Samples written (the sum of the shards' ``num_samples``)."""
        return sum(entry["num_samples"] for entry in self.shards)


class ProgressTally:
    """Samples encoded so far per task (a Ray actor, ``num_cpus=0``): tasks :meth:`report` their
    own running count; a retried task's lower count does not move the tally back."""

    def __init__(self):
        self.done: dict[int, int] = {}

    def report(self, task: int, done: int) -> None:
        self.done[task] = max(done, self.done.get(task, 0))

    def counts(self) -> dict[int, int]:
        return self.done


def task_shard_name(task: int, k: int) -> str:
    """The file name of task ``task``'s shard ``k`` (``shard-00003-000.beton``)."""
    return f"shard-{task:05d}-{k:03d}.beton"


def _task_folder(url: str, task: int) -> str:
    """A new local folder for the shard a task writes before its upload (one at a time):
    ``ffload-shards-<url hash>-<task>-<pid>`` in the temporary directory. Folders of such tasks
    whose process is gone (killed: a retried or cancelled task) are removed first."""
    tmp = tempfile.gettempdir()
    for entry in os.listdir(tmp):
        pid = entry.rpartition("-")[2]
        if entry.startswith(TASK_FOLDER) and pid.isdigit() and not pid_alive(int(pid)):
            shutil.rmtree(os.path.join(tmp, entry), ignore_errors=True)
    key = hashlib.sha256(url.encode("utf8")).hexdigest()[:16]
    folder = os.path.join(tmp, f"{TASK_FOLDER}{key}-{task:05d}-{os.getpid()}")
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    return folder


def write_task_shards(
    encoder: SampleEncoder,
    names: list[str],
    start: int,
    stop: int,
    task: int,
    folder: str | None,
    url: str | None,
    shard_size: int,
    page_size: int,
    info: dict,
    label_pos: int | None,
    stop_at_error: bool,
    storage_options: dict | None = None,
    tally=None,
) -> ShardTaskResult:
    """The Ray task: encode source samples ``start..stop-1`` and write them as shards named
    :func:`task_shard_name` ``(task, k)`` into ``folder`` (a local dataset's temporary
    directory) or, with ``url``, upload each under that prefix as soon as it is complete (then
    delete it here: a task holds one shard on its node's disk at a time).

    Args:
        names: the fields' names, in the order of ``encoder.fields``.
        shard_size, page_size: bytes per shard at most; the shards' page size (bytes).
        info: the dataset-level JSON object stored in every shard.
        label_pos: the label field's position among the fields (None: no label field).
        stop_at_error: return at the first bad sample (``on_error='fail'``: the driver stops and
            removes the output); the shard being written is abandoned (not completed, not uploaded).
        tally: a :class:`ProgressTally` actor to report the samples encoded to, after each chunk.

    Raises:
        OSError: a local write failed. StorageError: an upload failed (after its retries).
    """
    from ffload.storage import upload_file

    fields = encoder.fields
    origin_of = source_origins(encoder.source)[1]
    target = folder if url is None else _task_folder(url, task)

    def upload(entry: dict) -> None:
        local = os.path.join(target, entry["path"])
        upload_file(local, f"{url}/{entry['path']}", storage_options)
        os.remove(local)

    writer = ShardFiles(
        target,
        dict(zip(names, fields)),
        stop - start,
        shard_size,
        page_size,
        info=info,
        name=lambda k: task_shard_name(task, k),
        on_close=None if url is None else upload,
    )
    labels, errors, outcomes = [], [], Counter()
    try:
        sizer = ChunkSizer(stop, 1, fixed=False, start=start)
        while (bounds := sizer.take()) is not None:
            chunk = encode_chunk(encoder, *bounds)
            sizer.observe(chunk)
            errors += chunk.errors
            outcomes.update(chunk.outcomes)
            for index, metas, payloads in chunk.samples(fields, None):
                writer.add(writer.count, metas, payloads, origin=origin_of(index))
                if label_pos is not None:
                    labels.append(int(metas[label_pos]))
            if tally is not None:
                tally.report.remote(task, bounds[1] - start)
            if errors and stop_at_error:
                writer.abort()
                break
        else:
            writer.close()
    except BaseException:
        writer.abort()
        raise
    finally:
        if url is not None:
            shutil.rmtree(target, ignore_errors=True)
    return ShardTaskResult(start, stop, writer.shards, np.asarray(labels, dtype=np.int64), errors, outcomes)


def samples_per_task(encoder: SampleEncoder, shard_size: int, cpus: int) -> int:
    """Samples per task: about ``SHARD_FILL * shard_size`` of payload, from the mean payload
    bytes of up to :data:`PROBE_SAMPLES` samples spread over the source (encoded here; ones that
    fail are left to the tasks to report), at most ``ceil(N / cpus)``."""
    n = len(encoder)
    probes = np.unique(np.linspace(0, n - 1, min(PROBE_SAMPLES, n)).astype(np.int64))
    sizes = [
        int(chunk.sizes.sum()) for chunk in (encode_chunk(encoder, int(i), int(i) + 1) for i in probes) if len(chunk.ok)
    ]
    per_sample = max(1.0, float(np.mean(sizes))) if sizes else 1.0
    by_size = int(SHARD_FILL * shard_size // per_sample)
    return int(np.clip(by_size, 1, math.ceil(n / max(1, cpus))))


def ray_written_shards(
    encoder: SampleEncoder,
    names: list[str],
    shard_size: int,
    page_size: int,
    info: dict,
    label_pos: int | None,
    folder: str | None = None,
    url: str | None = None,
    on_error: str = "fail",
    address: str | None = None,
    storage_options: dict | None = None,
    max_retries: int = MAX_RETRIES,
    on_progress: Callable[[int], None] | None = None,
) -> Iterator[ShardTaskResult]:
    """Write every sample of ``encoder``'s source as shards from Ray tasks
    (:func:`write_task_shards`), yielding each task's :class:`ShardTaskResult` in sample order.

    Args:
        names, shard_size, page_size, info, label_pos: as :func:`write_task_shards`.
        folder: the local directory the shards go to (every node must see it), or
        url: the prefix they are uploaded under (``s3://bucket/prefix``; ``storage_options`` as
            :func:`ffload.storage.open_filesystem`'s).
        on_error: ``'fail'``: tasks stop at their first bad sample (the caller raises).
        address: the cluster (:func:`.ray_engine.joined_cluster`).
        max_retries: Ray retries of a task whose worker process or node died.
        on_progress: called with the number of samples newly encoded (or given up on) by the
            cluster, as tasks report them (:class:`ProgressTally`), while results wait their turn.

    Closing the generator early (an error, Ctrl-C) cancels the tasks not yet consumed and waits
    (at most :data:`CANCEL_WAIT` seconds) until they have ended; the caller then removes what
    they wrote (the local directory, or the URL prefix: a fresh version folder).

    Raises:
        ConfigurationError: Ray is not installed. Errors of ``ray.init``.
    """
    with joined_cluster(address) as ray:
        cpus = int(ray.cluster_resources().get("CPU", 1))
        n = len(encoder)
        per_task = samples_per_task(encoder, shard_size, cpus)
        task = ray.remote(num_cpus=1, max_retries=max_retries)(write_task_shards)
        shared = ray.put(encoder)
        bounds = [(a, min(n, a + per_task)) for a in range(0, n, per_task)]
        tally = ray.remote(num_cpus=0)(ProgressTally).remote() if on_progress is not None else None
        refs = [
            task.remote(
                shared,
                names,
                a,
                b,
                t,
                folder,
                url,
                shard_size,
                page_size,
                info,
                label_pos,
                on_error == "fail",
                storage_options,
                tally,
            )
            for t, (a, b) in enumerate(bounds)
        ]
        seen: dict[int, int] = {}  # samples per task counted into on_progress so far

        def advance(counts: dict[int, int]) -> None:
            new = 0
            for t, count in counts.items():
                if count > seen.get(t, 0):
                    new += count - seen.get(t, 0)
                    seen[t] = count
            if new:
                on_progress(new)

        done = 0
        try:
            for t, ((a, b), ref) in enumerate(zip(bounds, refs)):
                while tally is not None and not ray.wait([ref], timeout=POLL_SECONDS)[0]:
                    try:
                        advance(ray.get(tally.counts.remote()))
                    except ray.exceptions.RayError:  # the tally's node was lost: progress by whole tasks
                        tally = None
                try:
                    result = task_result(ray, ref)
                except ray.exceptions.RayError as e:  # its worker or node was lost, past the retries
                    result = ShardTaskResult(a, b, [], np.zeros(0, np.int64), failure_errors(encoder, a, b, e))
                if on_progress is not None:
                    advance({t: b - a})
                done += 1
                yield result
        finally:
            left = refs[done:]
            for ref in left:
                ray.cancel(ref, force=True)
            if left:  # their workers are killed: wait until none writes any more (the caller then removes the output)
                ray.wait(left, num_returns=len(left), timeout=CANCEL_WAIT)


def write_ray_shards(conversion: Conversion, writer, url: str | None = None) -> None:
    """The Ray shards engine (``engine='ray'`` with ``shard_size``): Ray tasks at
    ``options.ray_address`` write the shards (:func:`ray_written_shards`) into ``writer``'s
    temporary directory or, with ``url``, upload them under that prefix; ``writer`` (a
    :class:`~ffload.formats.shards.ShardedWriter`) adopts them in task order and writes the manifest."""
    options = conversion.options
    bar = conversion.bar
    results = ray_written_shards(
        conversion.encoder,
        list(conversion.fields),
        writer.shard_size,
        writer.page_size,
        writer.info,
        conversion.label_pos,
        folder=writer.path,
        url=url,
        on_error=options.on_error,
        address=options.ray_address,
        storage_options=options.storage_options,
        on_progress=None if bar is None else bar.update,
    )
    try:
        for result in results:
            conversion.take(result.errors, result.outcomes)
            writer.adopt(result.shards)
            conversion.adopt_labels(result.labels, result.samples)
    finally:
        results.close()
