"""Parallel encoding: worker processes decode and encode chunks of samples; the parent writes.

Workers are forked (on Linux) so that the source and the fields are inherited, not pickled. Each
task is a chunk of consecutive samples plus a *slab*: a block of anonymous shared memory
(``mmap``, ``MAP_SHARED``, created before the fork) into which the worker writes the chunk's
payloads, so that image bytes cross from worker to parent without pickling or pipes (the pipe
carries only the metadata records, payload sizes and errors). Payloads that do not fit the slab
travel in the message instead. The parent receives chunks in order, so the output keeps the
source's sample order, and returns each slab to the pool once its samples are written. Chunks are
sized from the bytes per sample seen so far, so that a chunk fills about half a slab.
"""
from __future__ import annotations

import mmap
import multiprocessing as mp
from collections import deque
from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from ..formats.fields import Field, metadata_dtype
from ..system import available_cpus

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
    errors: List[Tuple[int, str, str]]

    def samples(self, fields: Sequence[Field], slab: Optional[memoryview]) -> Iterator[Tuple[int, list, list]]:
        """Yield ``(source index, metadata records, payload arrays or None)`` per good sample;
        payloads are views of ``slab`` (the chunk's slab buffer) or of :attr:`tail`."""
        head = np.frombuffer(slab, dtype=np.uint8, count=self.slab_used) if self.slab_used else None
        tail = np.frombuffer(self.tail, dtype=np.uint8)
        offsets = np.concatenate([[0], np.cumsum(self.sizes.reshape(-1))]).astype(np.int64)
        has = [f.ptr_name is not None for f in fields]
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
                    payloads.append(tail[lo - self.slab_used:hi - self.slab_used])
            yield int(idx), metas, payloads


def encode_chunk(source, fields: Sequence[Field], start: int, stop: int,
                 slab: Optional[memoryview] = None, slab_index: int = -1) -> EncodedChunk:
    """Read and encode source samples ``start..stop-1``; errors are collected, not raised.

    Payloads are written into ``slab`` while they fit (in stream order), the rest into the
    chunk's ``tail`` bytes.
    """
    mtype = metadata_dtype(fields)
    meta = np.zeros(stop - start, dtype=mtype)
    sizes = np.zeros((stop - start, len(fields)), dtype=np.int64)
    room = 0 if slab is None else len(slab)
    used = 0
    ok, tail, errors = [], [], []
    for i in range(start, stop):
        try:
            values = source[i]
            if len(values) != len(fields):
                raise ValueError(f"{len(values)} values for {len(fields)} fields")
            encoded = [f.encode(v, i) for f, v in zip(fields, values)]
        except (KeyboardInterrupt, SystemExit):
            raise
        except Exception as e:  # any failure of one input is reported with its name
            errors.append((i, source.describe(i), f"{type(e).__name__}: {e}"))
            continue
        j = len(ok)
        ok.append(i)
        for k, (m, p) in enumerate(encoded):
            meta[f"f{k}"][j] = m
            if p is None:
                continue
            n = p.nbytes
            sizes[j, k] = n
            if not tail and used + n <= room:  # keep the stream order: slab first, then tail
                slab[used:used + n] = memoryview(np.ascontiguousarray(p)).cast("B")
                used += n
            else:
                tail.append(p.tobytes())
    k = len(ok)
    return EncodedChunk(start, stop, np.asarray(ok, dtype=np.int64), meta[:k], sizes[:k],
                        slab_index, used, b"".join(tail), errors)


def _worker_encode(task: Tuple[int, int, int]) -> EncodedChunk:
    start, stop, slab = task
    return encode_chunk(_STATE["source"], _STATE["fields"], start, stop,
                        memoryview(_STATE["slabs"][slab]), slab)


class _ChunkSizer:
    """Next chunk's size: about half a slab of payload, from the bytes per sample seen so far
    (memory in flight stays bounded in bytes, not samples)."""

    def __init__(self, n: int, initial: int, fixed: bool):
        self.n, self.size, self.fixed, self.next_start = n, initial, fixed, 0
        self.bytes, self.samples = 0, 0

    def observe(self, chunk: EncodedChunk) -> None:
        self.bytes += int(chunk.sizes.sum())
        self.samples += max(len(chunk.ok), 1)
        if not self.fixed and self.bytes:
            per_sample = self.bytes / self.samples
            self.size = int(np.clip(SLAB_BYTES // 2 // per_sample, 1, MAX_CHUNK))

    def take(self) -> Optional[Tuple[int, int]]:
        if self.next_start >= self.n:
            return None
        start = self.next_start
        self.next_start = min(self.n, start + self.size)
        return start, self.next_start


def encoded_chunks(source, fields: Dict[str, Field], num_workers: Optional[int],
                   chunk_size: Optional[int] = None) -> Iterator[Tuple[EncodedChunk, Optional[memoryview]]]:
    """Encode all of ``source`` with ``num_workers`` processes (0: in this process), yielding
    ``(chunk, slab buffer)`` in source order; the slab is valid until the next chunk is requested.
    The pool is terminated and the slabs released when the generator is closed (errors, Ctrl-C).

    Args:
        chunk_size: samples per chunk; None sizes chunks from the bytes per sample.
    """
    flist = list(fields.values())
    n = len(source)
    workers = available_cpus() if num_workers is None else int(num_workers)
    # Until a chunk has come back, sizes are unknown: start with single samples, so that the
    # first chunks in flight stay small however large the images are.
    sizer = _ChunkSizer(n, chunk_size or 1, fixed=chunk_size is not None)
    if workers <= 0 or "fork" not in mp.get_all_start_methods():
        # in this process (also where workers cannot inherit the slabs: no fork)
        while (bounds := sizer.take()) is not None:
            chunk = encode_chunk(source, flist, *bounds)
            sizer.observe(chunk)
            yield chunk, None
        return
    slabs = [mmap.mmap(-1, SLAB_BYTES) for _ in range(SLABS_PER_WORKER * workers)]
    _STATE.update(source=source, fields=flist, slabs=slabs)
    pool = mp.get_context("fork").Pool(workers)
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

