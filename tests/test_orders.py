"""Traversal orders (ffload.loaders.orders): permutations, determinism, page locality, and the
DistributedSampler split, checked against torch's own sampler."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from torch.utils.data import DistributedSampler

from ffload.loaders.orders import (
    EpochBatches,
    EpochsAhead,
    OrderOption,
    QuasiRandom,
    Random,
    Sequential,
    distributed_split,
    make_order,
    parse_order,
    samples_per_rank,
)


def test_parse_order_accepts_names_and_enum():
    assert parse_order("random") is OrderOption.RANDOM
    assert parse_order("QUASI_RANDOM") is OrderOption.QUASI_RANDOM
    assert parse_order(" Sequential ") is OrderOption.SEQUENTIAL
    assert parse_order(OrderOption.RANDOM) is OrderOption.RANDOM


@pytest.mark.parametrize("bad", ["shuffled", "", 3, None])
def test_parse_order_rejects_unknown(bad):
    with pytest.raises(ValueError, match="unknown order"):
        parse_order(bad)


def test_sequential_keeps_the_given_order():
    indices = np.array([5, 3, 9, 0], dtype=np.int64)
    order = Sequential(indices, seed=0)
    for epoch in range(3):
        np.testing.assert_array_equal(order.sample_order(epoch), indices)


def test_random_is_a_seeded_permutation_per_epoch():
    indices = np.arange(100, dtype=np.int64) * 3
    order = Random(indices, seed=7)
    e0, e1 = order.sample_order(0), order.sample_order(1)
    np.testing.assert_array_equal(np.sort(e0), indices)
    np.testing.assert_array_equal(np.sort(e1), indices)
    assert not np.array_equal(e0, e1)
    np.testing.assert_array_equal(e0, Random(indices, seed=7).sample_order(0))
    assert not np.array_equal(e0, Random(indices, seed=8).sample_order(0))


def _pages_per_batch(order, sample_pages, batch_size):
    return [len(np.unique(sample_pages[order[i : i + batch_size]])) for i in range(0, len(order), batch_size)]


def test_quasi_random_is_a_permutation_with_few_pages_per_batch():
    # 40 pages of 50 samples each, pages laid out in sample order
    sample_pages = np.repeat(np.arange(40), 50).astype(np.int64)
    indices = np.arange(len(sample_pages), dtype=np.int64)
    batch = 16
    quasi = QuasiRandom(indices, 3, sample_pages, window_size=2 * batch)
    rand = Random(indices, 3)
    seen = []
    for epoch in range(3):
        order = quasi.sample_order(epoch)
        np.testing.assert_array_equal(np.sort(order), indices)
        seen.append(order)
        q = _pages_per_batch(order, sample_pages, batch)
        r = _pages_per_batch(rand.sample_order(epoch), sample_pages, batch)
        assert max(q) <= 3  # a window of 32 samples lies within one or two 50-sample pages
        assert np.mean(q) * 3 < np.mean(r)
    assert not np.array_equal(seen[0], seen[1])
    # shuffled within pages too: not the page's samples in storage order
    assert not all(np.all(np.diff(seen[0][i : i + 50]) == 1) for i in range(0, 2000, 50))
    np.testing.assert_array_equal(seen[0], QuasiRandom(indices, 3, sample_pages, 32).sample_order(0))


def test_quasi_random_pages_follow_a_random_page_order():
    sample_pages = np.repeat(np.arange(30), 10).astype(np.int64)
    indices = np.arange(300, dtype=np.int64)
    order = QuasiRandom(indices, 0, sample_pages, window_size=10).sample_order(0)
    # window == page size: every block of 10 is exactly one page, pages not in storage order
    blocks = sample_pages[order].reshape(30, 10)
    assert (blocks == blocks[:, :1]).all()
    assert not np.array_equal(blocks[:, 0], np.arange(30))


def test_quasi_random_subset_repeats_and_samples_without_pages():
    sample_pages = np.concatenate([np.repeat(np.arange(5), 20), np.full(30, -1)]).astype(np.int64)
    indices = np.array(list(range(0, 130, 2)) + [4, 4, 127], dtype=np.int64)
    order = QuasiRandom(indices, 1, sample_pages, window_size=8).sample_order(2)
    np.testing.assert_array_equal(np.sort(order), np.sort(indices))
    only_ints = np.full(50, -1, dtype=np.int64)
    order = QuasiRandom(np.arange(50), 1, only_ints, window_size=8).sample_order(0)
    np.testing.assert_array_equal(np.sort(order), np.arange(50))
    assert not np.array_equal(order, np.arange(50))


def test_make_order_dispatches():
    idx = np.arange(10, dtype=np.int64)
    assert isinstance(make_order(OrderOption.SEQUENTIAL, idx, 0), Sequential)
    assert isinstance(make_order(OrderOption.RANDOM, idx, 0), Random)
    assert isinstance(make_order(OrderOption.QUASI_RANDOM, idx, 0, np.zeros(10, np.int64), 4), QuasiRandom)


@pytest.mark.parametrize("n", [1, 7, 12, 13])
@pytest.mark.parametrize("world_size", [1, 2, 3, 5])
@pytest.mark.parametrize("drop_last", [False, True])
def test_distributed_split_matches_torch_sampler(n, world_size, drop_last):
    order = np.random.default_rng(n).permutation(n) + 100
    for rank in range(world_size):
        sampler = DistributedSampler(range(n), num_replicas=world_size, rank=rank, shuffle=False, drop_last=drop_last)
        expected = order[np.array(list(sampler), dtype=np.int64)]
        got = distributed_split(order, rank, world_size, drop_last)
        np.testing.assert_array_equal(got, expected)
        assert len(got) == samples_per_rank(n, world_size, drop_last)


def _recording(calls):
    """An ``epoch -> batches`` function that records the thread computing each epoch."""

    def compute(epoch):
        calls.append((epoch, threading.current_thread().name))
        if epoch < 0:
            raise ValueError(f"bad epoch {epoch}")
        return [np.arange(3) + 10 * epoch]

    return compute


@pytest.mark.parametrize("n", [12, 10, 3])
def test_epoch_batches_rows_are_views_of_consecutive_batches(n):
    order = np.random.default_rng(n).permutation(n).astype(np.int64)
    batches = EpochBatches(order, 4)
    assert [b.tolist() for b in batches] == [order[i : i + 4].tolist() for i in range(0, n, 4)]
    for first in range(len(batches)):
        for stop in range(first + 1, len(batches) + 1):
            rows, lengths = batches.rows(first, stop)
            assert lengths == [len(b) for b in batches[first:stop]]
            assert rows.tolist() == np.concatenate(batches[first:stop]).tolist()
            assert np.shares_memory(rows, order)  # a view: no job copies its batches' ids
    assert len(batches) == -(-n // 4)
    assert batches[-1].tolist() == order[(len(batches) - 1) * 4 :].tolist()
    assert batches[np.int64(0)].tolist() == order[:4].tolist()
    for k in (len(batches), -len(batches) - 1):
        with pytest.raises(IndexError):
            batches[k]


def test_epoch_batches_of_an_empty_order_are_none():
    batches = EpochBatches(np.zeros(0, np.int64), 4)
    assert len(batches) == 0 and list(batches) == []


def test_epochs_ahead_computes_the_prepared_epoch_on_its_thread():
    calls = []
    compute = _recording(calls)
    ahead = EpochsAhead()
    try:
        np.testing.assert_array_equal(ahead.get(0, compute)[0], [0, 1, 2])  # nothing prepared: here
        ahead.prepare(1, compute)
        ahead.prepare(1, compute)  # already under way: not computed twice
        np.testing.assert_array_equal(ahead.get(1, compute)[0], [10, 11, 12])
        ahead.prepare(2, compute)
        np.testing.assert_array_equal(ahead.get(5, compute)[0], [50, 51, 52])  # another epoch: here
        np.testing.assert_array_equal(ahead.get(2, compute)[0], [20, 21, 22])  # the prepared one was dropped
        ahead.prepare(-1, compute)
        with pytest.raises(ValueError, match="bad epoch -1"):
            ahead.get(-1, compute)
    finally:
        ahead.close()
    here = threading.current_thread().name
    where = [(e, "here" if name == here else name.split("_")[0]) for e, name in calls]
    # the dropped epoch 2 is cancelled, unless it already ran on the thread
    if (2, "ffload-order") in where:
        where.remove((2, "ffload-order"))
    assert where == [(0, "here"), (1, "ffload-order"), (5, "here"), (2, "here"), (-1, "ffload-order")], where
    ahead.prepare(3, compute)  # a closed one starts a new thread
    assert ahead.get(3, compute)[0][0] == 30 and calls[-1][1].startswith("ffload-order")
    ahead.close()


def test_window_order_is_lexsort_by_window_then_key():
    """The compiled shuffle within windows orders positions as ``np.lexsort((keys, window))``:
    windows first, then keys, ties by position (empty input, one window, many, repeated keys);
    and QuasiRandom's epochs are the ones the NumPy formula gave."""
    from ffload.loaders.orders import window_order

    rng = np.random.default_rng(5)
    for trial in range(200):
        n = int(rng.integers(0, 400))
        window = rng.integers(0, 1 + int(rng.integers(0, 30)), n).astype(np.int64)
        keys = rng.random(n)
        if trial % 3 == 0:
            keys = np.round(keys, 1)  # ties, broken by position
        np.testing.assert_array_equal(window_order(window, keys), np.lexsort((keys, window)))
    indices = rng.permutation(1000).astype(np.int64)[:700]
    sample_pages = np.repeat(np.arange(50), 20).astype(np.int64)
    sample_pages[::37] = -1  # samples without a payload
    quasi = QuasiRandom(indices, 11, sample_pages, window_size=48)
    for epoch in range(3):  # the formula before the compiled shuffle, spelled out
        r = np.random.default_rng([11, epoch, 1])
        page_rank = r.permutation(quasi._num_pages)[quasi._page_of]
        counts = np.bincount(page_rank, minlength=quasi._num_pages)
        window = ((np.cumsum(counts) - counts) // 48)[page_rank]
        expected = indices[np.lexsort((r.random(len(window)), window))]
        np.testing.assert_array_equal(quasi.sample_order(epoch), expected)
