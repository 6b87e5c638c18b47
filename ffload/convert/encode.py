"""Parallel encoding: worker processes decode and encode chunks of samples; the parent writes.

Workers are forked (on Linux) so that the source and the fields are inherited, not pickled; each
returns a chunk as one compact message (metadata records, one payload blob, payload sizes, and
the errors it met), which keeps inter-process overhead per chunk, not per sample. The parent
receives chunks in order, so the output keeps the source's sample order.
"""
from __future__ import annotations

import multiprocessing as mp
import os
from collections import deque
from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from ..formats.fields import Field, metadata_dtype

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
        blob: the payloads of the chunk concatenated, sample by sample, field by field.
        errors: ``(source index, description, cause)`` for samples that failed.
    """

    start: int
    stop: int
    ok: np.ndarray
    metadata: np.ndarray
    sizes: np.ndarray
    blob: bytes
    errors: List[Tuple[int, str, str]]

    def samples(self, fields: Sequence[Field]) -> Iterator[Tuple[int, list, list]]:
        """Yield ``(source index, metadata records, payload arrays or None)`` per good sample."""
        buf = np.frombuffer(self.blob, dtype=np.uint8)
        offsets = np.concatenate([[0], np.cumsum(self.sizes.reshape(-1))]).astype(np.int64)
        has = [f.ptr_name is not None for f in fields]
        nf = len(fields)
        for j, idx in enumerate(self.ok):
            rec = self.metadata[j]
            metas, payloads = [], []
            for k in range(nf):
                metas.append(rec[k])
                if has[k]:
                    o = offsets[j * nf + k]
                    payloads.append(buf[o:offsets[j * nf + k + 1]])
                else:
                    payloads.append(None)
            yield int(idx), metas, payloads


def encode_chunk(source, fields: Sequence[Field], start: int, stop: int) -> EncodedChunk:
    """Read and encode source samples ``start..stop-1``; errors are collected, not raised."""
    mtype = metadata_dtype(fields)
    meta = np.zeros(stop - start, dtype=mtype)
    sizes = np.zeros((stop - start, len(fields)), dtype=np.int64)
    ok, parts, errors = [], [], []
    for i in range(start, stop):
        try:
            values = source[i]
            if len(values) != len(fields):
                raise ValueError(f"{len(values)} values for {len(fields)} fields")
            row_parts = []
            j = len(ok)
            for k, (f, v) in enumerate(zip(fields, values)):
                m, p = f.encode(v, i)
                meta[f"f{k}"][j] = m
                if p is not None:
                    sizes[j, k] = p.nbytes
                    row_parts.append(p.tobytes())
        except (KeyboardInterrupt, SystemExit):
            raise
        except Exception as e:  # any failure of one input is reported with its name
            errors.append((i, source.describe(i), f"{type(e).__name__}: {e}"))
            continue
        ok.append(i)
        parts.extend(row_parts)
    n = len(ok)
    return EncodedChunk(start, stop, np.asarray(ok, dtype=np.int64), meta[:n], sizes[:n],
                        b"".join(parts), errors)


def _worker_encode(bounds: Tuple[int, int]) -> EncodedChunk:
    return encode_chunk(_STATE["source"], _STATE["fields"], *bounds)


def chunk_bounds(n: int, chunk_size: int) -> List[Tuple[int, int]]:
    """``[(start, stop), ...]`` covering ``0..n-1`` in chunks of ``chunk_size``."""
    return [(s, min(n, s + chunk_size)) for s in range(0, n, chunk_size)]


def default_workers() -> int:
    """All cores this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def encoded_chunks(source, fields: Dict[str, Field], num_workers: Optional[int],
                   chunk_size: int) -> Iterator[EncodedChunk]:
    """Encode all of ``source`` with ``num_workers`` processes (0: in this process), yielding
    chunks in source order. The pool is terminated when the generator is closed (errors,
    Ctrl-C)."""
    flist = list(fields.values())
    bounds = chunk_bounds(len(source), chunk_size)
    workers = default_workers() if num_workers is None else int(num_workers)
    if workers <= 0 or len(bounds) <= 1:
        for b in bounds:
            yield encode_chunk(source, flist, *b)
        return
    method = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
    ctx = mp.get_context(method)
    _STATE.update(source=source, fields=flist)
    if method == "spawn":  # no inheritance: ship the state once per worker
        pool = ctx.Pool(workers, initializer=_STATE.update, initargs=({"source": source, "fields": flist},))
    else:
        pool = ctx.Pool(workers)
    try:
        # A bounded window of chunks in flight (4 per worker) keeps workers busy while the
        # parent's memory stays bounded however slow the disk is; results come back in order.
        pending: deque = deque()
        todo = iter(bounds)
        for b in todo:
            pending.append(pool.apply_async(_worker_encode, (b,)))
            if len(pending) >= 4 * workers:
                break
        while pending:
            chunk = pending.popleft().get()
            nxt = next(todo, None)
            if nxt is not None:
                pending.append(pool.apply_async(_worker_encode, (nxt,)))
            yield chunk
        pool.close()
        pool.join()
    finally:
        pool.terminate()
        _STATE.clear()
