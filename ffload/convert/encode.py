"""Parallel encoding: worker processes decode and encode chunks of samples; the parent writes.

Workers are forked (on Linux) so that the source and the fields are inherited, not pickled. Each
task is a chunk of consecutive samples plus a *slab*: a block of anonymous shared memory
(``mmap``, ``MAP_SHARED``, created before the fork) into which the worker writes the chunk's
payloads, so that image bytes cross from worker to parent without pickling or pipes (the pipe
carries only the metadata records, payload sizes and errors). Payloads that do not fit the slab
travel in the message instead. The parent receives chunks in order, so the output keeps the
source's sample order, and returns each slab to the pool once its samples are written. Chunks are
sized from the bytes per sample seen so far, so that a chunk fills about half a slab.

What one sample becomes is :class:`SampleEncoder`'s job: the fields' ``encode``, or for a file-backed
source and an image field, the source JPEG's own bytes where :mod:`~ffload.convert.passthrough` allows.
"""

from __future__ import annotations

import mmap
import multiprocessing as mp
import signal
from collections import Counter, deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from ffload.convert.images import check_pixels, decode_image_bytes
from ffload.convert.passthrough import decode_problem, inspect_jpeg, strip_jpeg_metadata
from ffload.formats.fields.base import Field, metadata_dtype
from ffload.formats.fields.image import JPG, RGBImageField
from ffload.formats.fields.scalars import IntField
from ffload.limits import DEFAULT_MAX_PIXELS
from ffload.system import available_cpus

SLAB_BYTES = 32 << 20  # shared memory per chunk in flight
SLABS_PER_WORKER = 3  # chunks in flight per worker (keeps workers busy while the parent writes)
MAX_CHUNK = 256  # samples per chunk at most

# Inherited by forked workers (set by the parent right before the pool starts).
_STATE: dict = {}


@dataclass
class EncodedChunk:
    """``stop - start`` consecutive samples, encoded.

    Attributes:
        start, stop: source index range.
        ok: ``(k,) int64`` source indices that encoded successfully, ascending.
        metadata: ``(k,)`` records of ``metadata_dtype(fields)`` for those samples.
        sizes: ``(k, num_fields) int64`` payload bytes (0 where a field has none).
        slab: index of the shared slab the chunk was given (-1 in-process); it holds the first
            ``slab_used`` bytes of the payload stream.
        slab_used: bytes of the payload stream stored in the slab.
        tail: the rest of the payload stream (payloads that did not fit the slab).
        errors: ``(source index, description, cause)`` for samples that failed.
        outcomes: images passed through (``'passed_through'``) and re-encoded to JPEG (a
            :data:`~ffload.convert.passthrough.REASONS` key), counted.
    The payload stream is the chunk's payloads, sample by sample, field by field.
    """

    start: int
    stop: int
    ok: np.ndarray
    metadata: np.ndarray
    sizes: np.ndarray
    slab: int
    slab_used: int
    tail: bytes
    errors: list[tuple[int, str, str]]
    outcomes: Counter = field(default_factory=Counter)

    def samples(self, fields: Sequence[Field], slab: memoryview | None) -> Iterator[tuple[int, list, list]]:
        """Yield ``(source index, metadata records, payload arrays or None)`` per good sample;
        payloads are views of ``slab`` (the chunk's slab buffer) or of :attr:`tail`."""
        head = np.frombuffer(slab, dtype=np.uint8, count=self.slab_used) if self.slab_used else None
        tail = np.frombuffer(self.tail, dtype=np.uint8)
        offsets = np.concatenate([[0], np.cumsum(self.sizes.reshape(-1))]).astype(np.int64)
        has = [f.has_payload for f in fields]
        nf = len(fields)
        for j, idx in enumerate(self.ok):
            rec = self.metadata[j]
            metas, payloads = [], []
            for k in range(nf):
                metas.append(rec[k])
                if not has[k]:
                    payloads.append(None)
                    continue
                lo, hi = offsets[j * nf + k], offsets[j * nf + k + 1]
                if hi <= self.slab_used:
                    payloads.append(head[lo:hi])
                else:
                    payloads.append(tail[lo - self.slab_used : hi - self.slab_used])
            yield int(idx), metas, payloads


class SampleEncoder:
    """Encodes sample ``i`` of a source into its fields' ``(metadata, payload)`` pairs.

    With the image-classification fields (:class:`RGBImageField` then :class:`IntField`) and a
    source that holds files (an ``encoded(i)`` method returning the stored image bytes, and
    ``labels``), each file is read once: a JPEG that already is what the write mode stores is
    kept as it is (see :mod:`~ffload.convert.passthrough`), anything else is decoded from those
    bytes (:func:`~ffload.convert.images.decode_image_bytes`, as the source's ``src[i]`` does)
    and encoded by the field. Other fields and sources: ``field.encode(value)`` on ``src[i]``.

    Args:
        source: a Source; fields: the fields in order.
        passthrough: False re-encodes every JPEG (``--reencode``).
        strip_metadata: drop APPn/COM metadata segments from passed-through JPEGs.
        verify: decode each passed-through JPEG once (``decode_problem``); one that fails is
            decoded again by OpenCV and re-encoded (reason ``'decode_warning'``).
        max_pixels: the pixel limit of every image read from the source's bytes, decoded or passed
            through (:func:`~ffload.convert.images.check_pixels`, from the file's header;
            ``None``: no limit). A source decoding its own ``src[i]`` applies its own ``max_pixels``.
    """

    def __init__(
        self,
        source,
        fields: Sequence[Field],
        passthrough: bool = True,
        strip_metadata: bool = False,
        verify: bool = False,
        max_pixels: int | None = DEFAULT_MAX_PIXELS,
    ):
        self.source, self.fields = source, list(fields)
        self.passthrough, self.strip_metadata, self.verify = passthrough, strip_metadata, verify
        self.max_pixels = max_pixels
        self.image_fields = (
            len(self.fields) == 2 and isinstance(self.fields[0], RGBImageField) and isinstance(self.fields[1], IntField)
        )
        self.from_bytes = self.image_fields and hasattr(source, "encoded") and hasattr(source, "labels")

    def __len__(self) -> int:
        return len(self.source)

    def describe(self, i: int) -> str:
        """The source's name for sample ``i`` (a path, ``shard:key``, ``row i of ...``)."""
        return self.source.describe(i)

    def encode(self, i: int) -> tuple[list[tuple], str | None]:
        """``([(metadata, payload or None) per field], outcome)``: outcome ``'passed_through'``,
        the reason an image stored as JPEG was re-encoded, or None (no JPEG stored).

        Raises:
            ImageDecodeError, FieldError, SourceError, ValueError: a bad sample (the caller names it);
                ImageBombError: an image above ``max_pixels``.
        """
        if not self.from_bytes:
            values = self.source[i]
            if len(values) != len(self.fields):
                raise ValueError(f"{len(values)} values for {len(self.fields)} fields")
            encoded = [f.encode(v, i) for f, v in zip(self.fields, values)]
            jpeg = self.image_fields and encoded[0][0]["mode"] == JPG
            return encoded, "no_source_bytes" if jpeg else None
        data = self.source.encoded(i)
        label = self.fields[1].encode(int(self.source.labels[i]), i)
        image_field = self.fields[0]
        if image_field.write_mode == "raw":
            header, reason = None, "raw"
        elif not self.passthrough:
            header, reason = None, "reencode_requested"
        else:
            header, reason = inspect_jpeg(data, image_field.max_resolution)
        if reason is None and not image_field.stores_jpeg(header.width * header.height * 3, i):
            reason = "raw"
        if reason is None:  # stored as it is: no decode applies the limit, so its header does here
            check_pixels(header.height, header.width, self.max_pixels, self.describe(i))
        if (
            reason is None
            and self.verify
            and decode_problem(data, header, self.describe(i), self.max_pixels) is not None
        ):
            reason = "decode_warning"
        if reason is None:
            meta = np.zeros((), dtype=image_field.metadata_type)
            meta["mode"], meta["width"], meta["height"] = JPG, header.width, header.height
            payload = strip_jpeg_metadata(data, header) if self.strip_metadata else data
            return [(meta[()], np.frombuffer(payload, np.uint8)), label], "passed_through"
        meta, payload = image_field.encode(decode_image_bytes(data, self.describe(i), self.max_pixels), i)
        return [(meta, payload), label], reason if meta["mode"] == JPG else None


def encode_chunk(
    encoder: SampleEncoder, start: int, stop: int, slab: memoryview | None = None, slab_index: int = -1
) -> EncodedChunk:
    """Read and encode source samples ``start..stop-1``; errors are collected, not raised.

    Payloads are written into ``slab`` while they fit (in stream order), the rest into the
    chunk's ``tail`` bytes.
    """
    fields = encoder.fields
    mtype = metadata_dtype(fields)
    meta = np.zeros(stop - start, dtype=mtype)
    sizes = np.zeros((stop - start, len(fields)), dtype=np.int64)
    room = 0 if slab is None else len(slab)
    used = 0
    ok, tail, errors, outcomes = [], [], [], Counter()
    prefetch = getattr(encoder.source, "prefetch", None)
    if prefetch is not None:  # remote sources: the chunk's objects, fetched concurrently (bounded)
        prefetch(range(start, stop))
    for i in range(start, stop):
        try:
            encoded, outcome = encoder.encode(i)
        except (KeyboardInterrupt, SystemExit):
            raise
        except Exception as e:  # any failure of one input is reported with its name
            errors.append((i, encoder.describe(i), f"{type(e).__name__}: {e}"))
            continue
        if outcome is not None:
            outcomes[outcome] += 1
        j = len(ok)
        ok.append(i)
        for k, (m, p) in enumerate(encoded):
            meta[f"f{k}"][j] = m
            if p is None:
                continue
            n = p.nbytes
            sizes[j, k] = n
            if not tail and used + n <= room:  # keep the stream order: slab first, then tail
                slab[used : used + n] = memoryview(np.ascontiguousarray(p)).cast("B")
                used += n
            else:
                tail.append(p.tobytes())
    k = len(ok)
    return EncodedChunk(
        start,
        stop,
        np.asarray(ok, dtype=np.int64),
        meta[:k],
        sizes[:k],
        slab_index,
        used,
        b"".join(tail),
        errors,
        outcomes,
    )


def _worker_start() -> None:
    """Pool worker initializer: SIGTERM kills the worker (``Pool.terminate``), whatever handler
    the parent had, then the signal is unblocked (:func:`_fork_pool` forks with it blocked)."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})


def _fork_pool(workers: int):
    """A fork-context ``multiprocessing.Pool`` of ``workers`` processes that ``terminate()`` always
    stops. The children are forked with SIGTERM blocked: a SIGTERM reaching a child between
    ``fork()`` and Python's after-fork reset of pending signals would otherwise be lost (the
    Python-level handler it inherits never runs) and leave it waiting for tasks forever, with
    ``terminate()`` waiting on it (seen when a conversion failed on its first sample). A SIGTERM
    for this process meanwhile stays pending and is handled when the mask is restored."""
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        return mp.get_context("fork").Pool(workers, initializer=_worker_start)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


def _worker_encode(task: tuple[int, int, int]) -> EncodedChunk:
    start, stop, slab = task
    return encode_chunk(_STATE["encoder"], start, stop, memoryview(_STATE["slabs"][slab]), slab)


class ChunkSizer:
    """The bounds of the chunks of samples ``start..n-1``, one :meth:`take` at a time: ``initial``
    samples each if ``fixed``, else about half a slab of payload from the bytes per sample
    :meth:`observe`-d so far (memory in flight stays bounded in bytes, not samples). Used by the
    local and the Ray engines."""

    def __init__(self, n: int, initial: int, fixed: bool, start: int = 0):
        self.n, self.size, self.fixed, self.next_start = n, initial, fixed, start
        self.bytes, self.samples = 0, 0

    def observe(self, chunk: EncodedChunk) -> None:
        self.bytes += int(chunk.sizes.sum())
        self.samples += max(len(chunk.ok), 1)
        if not self.fixed and self.bytes:
            per_sample = self.bytes / self.samples
            self.size = int(np.clip(SLAB_BYTES // 2 // per_sample, 1, MAX_CHUNK))

    def take(self) -> tuple[int, int] | None:
        if self.next_start >= self.n:
            return None
        start = self.next_start
        self.next_start = min(self.n, start + self.size)
        return start, self.next_start


def encoded_chunks(
    encoder: SampleEncoder, num_workers: int | None, chunk_size: int | None = None, start: int = 0
) -> Iterator[tuple[EncodedChunk, memoryview | None]]:
    """Encode samples ``start..N-1`` of ``encoder``'s source with ``num_workers`` processes (0:
    in this process), yielding ``(chunk, slab buffer)`` in source order; the slab is valid until
    the next chunk is requested. The pool is terminated and the slabs released when the
    generator is closed (errors, Ctrl-C).

    Args:
        chunk_size: samples per chunk; None sizes chunks from the bytes per sample.
        start: the first source index to encode (a resumed conversion).
    """
    n = len(encoder)
    workers = available_cpus() if num_workers is None else int(num_workers)
    # Until a chunk has come back, sizes are unknown: start with single samples, so that the
    # first chunks in flight stay small however large the images are.
    sizer = ChunkSizer(n, chunk_size or 1, fixed=chunk_size is not None, start=start)
    if workers <= 0 or "fork" not in mp.get_all_start_methods():
        # in this process (also where workers cannot inherit the slabs: no fork)
        while (bounds := sizer.take()) is not None:
            chunk = encode_chunk(encoder, *bounds)
            sizer.observe(chunk)
            yield chunk, None
        return
    slabs = [mmap.mmap(-1, SLAB_BYTES) for _ in range(SLABS_PER_WORKER * workers)]
    _STATE.update(encoder=encoder, slabs=slabs)
    pool = _fork_pool(workers)
    try:
        free = deque(range(len(slabs)))
        pending: deque = deque()

        def submit() -> bool:
            bounds = sizer.take() if free else None
            if bounds is None:
                return False
            pending.append(pool.apply_async(_worker_encode, (bounds + (free.popleft(),),)))
            return True

        while submit():
            pass
        while pending:
            chunk = pending.popleft().get()
            sizer.observe(chunk)
            yield chunk, memoryview(slabs[chunk.slab])
            free.append(chunk.slab)  # the consumer is done with the chunk: its slab is free again
            while submit():
                pass
        pool.close()
        pool.join()
    finally:
        pool.terminate()
        _STATE.clear()
        # the slabs are unmapped when the last view of them (a yielded chunk) is gone
        slabs.clear()
