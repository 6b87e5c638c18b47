"""LMDB at scale (issue 10, part 5): the writer grows LMDB's map as it goes (no map sized for
the whole dataset up front), and the loader's process cache serves the grown file as .beton."""

from __future__ import annotations

import os
import warnings

import lmdb
import numpy as np

import ffload
from ffload.formats import BytesField, IntField, open_dataset
from ffload.formats.lmdb.writer import LMDBWriter

N, SAMPLE = 200, 30_000


def payload(i: int) -> bytes:
    out = np.full(SAMPLE, i % 251, np.uint8)
    out[:8] = np.frombuffer(np.int64(i).tobytes(), np.uint8)
    return out.tobytes()


def test_lmdb_writer_grows_a_small_map_several_times(tmp_path):
    path = str(tmp_path / "grown.lmdb")
    fields = {"label": IntField(), "blob": BytesField()}
    initial = 256 << 10  # 6 MB of values: the map must double at least 4 times
    with LMDBWriter(path, fields, N, txn_bytes=512 << 10, initial_map_size=initial) as writer:
        for i in range(N):
            metas, payloads = zip(fields["label"].encode(i, i), fields["blob"].encode(payload(i), i))
            writer.add(i, metas, payloads)
    data_mdb = os.path.getsize(os.path.join(path, "data.mdb"))
    assert writer.map_size >= 16 * initial and data_mdb >= N * SAMPLE
    assert writer.map_size <= 4 * data_mdb  # grown as needed, not sized far beyond the data
    env = lmdb.open(path, readonly=True, lock=False)  # plain lmdb reads every value
    psize = env.stat()["psize"]
    used = (env.info()["last_pgno"] + 1) * psize
    with env.begin() as txn:
        assert all(bytes(txn.get(b"%010d" % i))[-SAMPLE:] == payload(i) for i in range(N))
    env.close()
    assert used <= data_mdb <= used + psize  # LMDB's used pages, no preallocated tail
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the places recorded over the commits all hold (else: a warning)
        view = open_dataset(path)
    assert view.num_samples == N and list(view.metadata["label"]) == list(range(N))
    for i in (0, 1, N // 2, N - 1):
        assert bytes(view.payload("blob", i)) == payload(i)
    # the loader's process cache reads the grown data.mdb like a .beton, under its limit
    kw = dict(batch_size=8, num_workers=2, pipelines={"label": None})
    limit = 16 * 64 << 10
    for order in ("random", "quasi_random"):
        with (
            ffload.Loader(path, order=order, os_cache=False, cache_limit=limit, **kw) as cached,
            ffload.Loader(path, order=order, os_cache=True, **kw) as mapped,
        ):
            got = np.concatenate([b[0].numpy().copy() for b in cached])
            np.testing.assert_array_equal(got, np.concatenate([b[0].numpy().copy() for b in mapped]))
            np.testing.assert_array_equal(got[:, :8].copy().view(np.int64)[:, 0], cached.epoch_order(0))
            assert 0 < cached._memory.peak_resident_bytes <= limit
