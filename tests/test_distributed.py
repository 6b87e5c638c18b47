"""distributed=True with two gloo processes on CPU: ranks see disjoint shares that together cover
the epoch (DistributedSampler semantics), and each share matches the single-process order."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch.distributed as dist
import torch.multiprocessing as mp

import ffload
from ffload.formats import BytesField, IntField, write_dataset

N = 23  # odd: padding needed for two ranks
WORLD = 2
CASES = [(order, drop_last) for order in ("sequential", "random", "quasi_random") for drop_last in (False, True)]


def _rank_main(rank, path, init_file, out_dir):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        for order, drop_last in CASES:
            loader = ffload.Loader(
                path,
                batch_size=4,
                num_workers=1,
                order=order,
                drop_last=drop_last,
                distributed=True,
                seed=9,
                pipelines={"tag": None},
            )
            epochs = [np.concatenate([b[0].numpy().copy() for b in loader]) for _ in range(2)]
            np.save(os.path.join(out_dir, f"{order}-{drop_last}-{rank}.npy"), np.stack(epochs))
            np.save(os.path.join(out_dir, f"{order}-{drop_last}-{rank}-len.npy"), len(loader))
            loader.close()
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def shares(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dist")
    path = write_dataset(
        str(tmp / "ints.beton"), {"index": IntField(), "tag": BytesField()}, ((i, bytes([i])) for i in range(N)), N
    )
    mp.spawn(_rank_main, args=(path, str(tmp / "init"), str(tmp)), nprocs=WORLD, join=True)

    def load(order, drop_last):
        return (
            [np.load(tmp / f"{order}-{drop_last}-{r}.npy") for r in range(WORLD)],
            [int(np.load(tmp / f"{order}-{drop_last}-{r}-len.npy")) for r in range(WORLD)],
        )

    return path, load


@pytest.mark.parametrize("order,drop_last", CASES)
def test_ranks_are_disjoint_and_complete(shares, order, drop_last):
    path, load = shares
    per_rank, lengths = load(order, drop_last)
    per_rank_samples = N // WORLD if drop_last else -(-N // WORLD)
    single = ffload.Loader(path, batch_size=4, num_workers=1, order=order, seed=9)
    for epoch in range(2):
        a, b = per_rank[0][epoch], per_rank[1][epoch]
        if drop_last:  # truncated to a multiple of 4 per rank, disjoint
            assert len(a) == len(b) == (per_rank_samples // 4) * 4
            assert not set(a) & set(b)
        else:  # padded by repeating the order's start: together they cover everything
            assert len(a) == len(b) == per_rank_samples
            assert set(a) | set(b) == set(range(N))
            assert len(a) + len(b) - N == 1  # exactly one padded sample
        # the same global order as a single process, split rank r -> order[r::2]
        full = single.epoch_order(epoch)
        padded = np.resize(full, 2 * per_rank_samples)
        np.testing.assert_array_equal(a, padded[0::2][: len(a)])
        np.testing.assert_array_equal(b, padded[1::2][: len(b)])
    assert lengths[0] == lengths[1] == (per_rank_samples // 4 if drop_last else -(-per_rank_samples // 4))
    single.close()
