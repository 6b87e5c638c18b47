"""ffload.Loader: contents, epochs and orders, determinism across workers, memory managers, buffer
reuse, thread hygiene, error propagation and construction errors."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest
import torch

import ffload
from ffload.errors import ConfigurationError, FormatError, PipelineError, UnavailableError
from ffload.formats import BytesField, FloatField, IntField, NDArrayField, RGBImageField, open_dataset, write_dataset
from ffload.loaders import (
    CenterCropRGBImageDecoder,
    Cutout,
    IntDecoder,
    LoaderError,
    RandomHorizontalFlip,
    RandomResizedCropRGBImageDecoder,
    SimpleRGBImageDecoder,
    ToDevice,
    ToTensor,
    ToTorchImage,
)
from ffload.loaders.memory.os_cache import OSCacheMemory
from ffload.loaders.memory.process_cache import ProcessCacheMemory
from ffload.loaders.memory.schedule import batch_blocks

N = 101  # not a multiple of any batch size used below


def digit_images(n):
    """(n, 8, 8, 3) uint8 RGB images from sklearn's handwritten digits, and their labels."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    gray = (digits.images[:n] * 15).astype(np.uint8)
    return np.repeat(gray[..., None], 3, axis=3), digits.target[:n].astype(np.int64)


@pytest.fixture(scope="module")
def digits():
    return digit_images(N)


def write_digits(path, images, labels, write_mode="raw"):
    n = len(images)
    fields = {
        "image": RGBImageField(write_mode),
        "label": IntField(),
        "index": IntField(),
        "weight": FloatField(),
        "vec": NDArrayField(np.dtype("<f4"), (2,)),
    }
    samples = ((images[i], labels[i], i, i / 4, np.array([i, -i], np.float32)) for i in range(n))
    return write_dataset(str(path), fields, samples, n)


@pytest.fixture(scope="module", params=["beton", "lmdb"])
def dataset(request, tmp_path_factory, digits):
    path = tmp_path_factory.mktemp("ds") / f"digits.{request.param}"
    return write_digits(path, *digits)


def epoch_indices(loader):
    """Sample ids of one epoch, batch by batch (the 'index' field)."""
    return [b[loader.field_names.index("index")].numpy().copy() for b in loader]


def indices_only():
    return {"image": None, "label": None, "weight": None, "vec": None}


# ------------------------------------------------------------------ contents
@pytest.mark.smoke
def test_default_pipelines_decode_every_field(dataset, digits):
    images, labels = digits
    with ffload.Loader(dataset, batch_size=16, num_workers=2, order="sequential") as loader:
        assert loader.field_names == ["image", "label", "index", "weight", "vec"]
        seen = 0
        for image, label, index, weight, vec in loader:
            rows = slice(seen, seen + len(index))
            assert image.dtype == torch.uint8 and image.shape[1:] == (8, 8, 3)
            np.testing.assert_array_equal(image.numpy(), images[rows])
            np.testing.assert_array_equal(label.numpy(), labels[rows])
            assert label.dtype == torch.int64 and weight.dtype == torch.float64
            np.testing.assert_array_equal(index.numpy(), np.arange(N)[rows])
            np.testing.assert_array_equal(weight.numpy(), np.arange(N)[rows] / 4)
            assert vec.dtype == torch.float32
            np.testing.assert_array_equal(vec[:, 1].numpy(), -np.arange(N)[rows])
            seen += len(index)
        assert seen == N


class Negative(torch.nn.Module):
    """255 - x on a uint8 batch: a module whose effect shows in every pixel."""

    def forward(self, x):
        return 255 - x


def test_disabled_fields_and_custom_pipeline(dataset, digits):
    import cv2

    images, _ = digits
    pipelines = {
        "label": None,
        "weight": None,
        "vec": None,
        "image": [CenterCropRGBImageDecoder((4, 4), ratio=1.0), ToTensor(), ToTorchImage(), Negative()],
    }
    loader = ffload.Loader(dataset, batch_size=10, num_workers=1, order="sequential", pipelines=pipelines)
    assert loader.field_names == ["image", "index"]
    assert [type(op) for op in loader.pipelines["index"]] == [IntDecoder, ToTensor]
    image, index = next(iter(loader))
    assert image.shape == (10, 3, 4, 4) and index.shape == (10,)
    np.testing.assert_array_equal(index.numpy(), np.arange(10))
    # the whole 8x8 image halved (INTER_AREA), channels first, then the module's 255 - x
    crops = np.stack([cv2.resize(im, (4, 4), interpolation=cv2.INTER_AREA) for im in images[:10]])
    assert image.dtype == torch.uint8
    np.testing.assert_array_equal(image.numpy(), 255 - crops.transpose(0, 3, 1, 2))
    loader.close()


def test_loads_bytes_fields(tmp_path):
    blobs = [np.arange(i % 7 + 1, dtype=np.uint8) + 1 for i in range(20)]
    path = write_dataset(
        str(tmp_path / "b.beton"), {"blob": BytesField(), "i": IntField()}, ((b, i) for i, b in enumerate(blobs)), 20
    )
    loader = ffload.Loader(path, batch_size=6, num_workers=2, order="random")
    for blob, i in loader:
        assert blob.shape[1] == 7
        for row, k in zip(blob.numpy(), i.numpy()):
            np.testing.assert_array_equal(row[: len(blobs[k])], blobs[k])
            assert not row[len(blobs[k]) :].any()


# ------------------------------------------------------------ epochs / orders
@pytest.mark.parametrize("order", ["sequential", "random", "quasi_random"])
@pytest.mark.parametrize("batch_size", [1, 7, N, 2 * N])
@pytest.mark.parametrize("drop_last", [False, True])
def test_every_sample_once_per_epoch(dataset, order, batch_size, drop_last):
    loader = ffload.Loader(
        dataset, batch_size=batch_size, num_workers=2, order=order, drop_last=drop_last, pipelines=indices_only()
    )
    expected_len = N // batch_size if drop_last else -(-N // batch_size)
    assert len(loader) == expected_len
    for _ in range(2):
        batches = epoch_indices(loader)
        assert len(batches) == expected_len
        assert all(len(b) == batch_size for b in batches[:-1])
        got = np.concatenate(batches) if batches else np.empty(0, np.int64)
        assert len(np.unique(got)) == len(got)  # nothing twice
        if drop_last:
            assert len(got) == expected_len * batch_size
        else:
            np.testing.assert_array_equal(np.sort(got), np.arange(N))
        if order == "sequential":
            np.testing.assert_array_equal(got, np.arange(len(got)))
    loader.close()


@pytest.mark.parametrize("order", ["random", "quasi_random"])
def test_epochs_reshuffle(dataset, order):
    loader = ffload.Loader(dataset, batch_size=10, num_workers=2, order=order, pipelines=indices_only())
    e0, e1 = (np.concatenate(epoch_indices(loader)) for _ in range(2))
    assert not np.array_equal(e0, e1)
    assert loader.next_epoch == 2
    again = ffload.Loader(dataset, batch_size=10, num_workers=1, order=order, pipelines=indices_only())
    np.testing.assert_array_equal(np.concatenate(epoch_indices(again)), e0)
    other_seed = ffload.Loader(dataset, batch_size=10, num_workers=1, order=order, seed=5, pipelines=indices_only())
    assert not np.array_equal(np.concatenate(epoch_indices(other_seed)), e0)


def test_next_epoch_is_prepared_ahead_and_matches_epoch_order(dataset):
    """The next epoch's order is computed on the ``ffload-order`` thread while the current epoch
    runs (the first epoch's next one in ``iter()``, before any job has run); the batches are those
    of ``epoch_order`` whichever thread computed them, and an epoch that was not prepared
    (``next_epoch`` moved) is computed when asked."""
    loader = ffload.Loader(dataset, batch_size=10, num_workers=2, order="random", pipelines=indices_only())
    threads = []
    sample_order = loader._order.sample_order

    def recorded(epoch):
        threads.append((epoch, threading.current_thread().name))
        return sample_order(epoch)

    loader._order.sample_order = recorded
    with loader:
        epochs = [np.concatenate(epoch_indices(loader)) for _ in range(3)]
        loader.next_epoch = 7
        epochs.append(np.concatenate(epoch_indices(loader)))
        for got, epoch in zip(epochs, [0, 1, 2, 7]):
            np.testing.assert_array_equal(got, loader.epoch_order(epoch))
    first = {}  # epoch -> the thread that computed it first (the checks above computed each again)
    for epoch, name in threads:
        first.setdefault(epoch, name)
    here = threading.current_thread().name
    assert first[0] == here and first[7] == here, threads  # nothing prepared them
    assert first[1] == here, threads  # prepared before the first job ran
    assert first[2].startswith("ffload-order") and first.get(8, "ffload-order").startswith("ffload-order"), threads
    assert first.get(3, "ffload-order").startswith("ffload-order"), threads  # prepared, then dropped


def _record_submits(monkeypatch, loader):
    """Record ``(job's epoch, the loader's current epoch)`` for every job submitted."""
    from ffload.loaders.iterator import BatchRunner

    submits = []
    submit = BatchRunner.submit

    def recorded(runner, slot, first, rows, lengths, epoch, cancel):
        submits.append((epoch, loader._next_epoch - 1))
        return submit(runner, slot, first, rows, lengths, epoch, cancel)

    monkeypatch.setattr(BatchRunner, "submit", recorded)
    return submits


def _augmented_loader(dataset, **kwargs):
    """Random crops and flips (they depend on the epoch), two batches per job."""
    pipelines = {
        "image": [RandomResizedCropRGBImageDecoder((6, 6)), RandomHorizontalFlip()],
        "label": None,
        "weight": None,
        "vec": None,
    }
    return ffload.Loader(
        dataset,
        batch_size=8,
        num_workers=2,
        order="random",
        batches_ahead=4,  # spare slots at an epoch's end for the next epoch's jobs
        batches_per_job=2,
        pipelines=pipelines,
        **kwargs,
    )


def _copied(batch) -> tuple:
    """A batch's fields as numpy copies (tensors or arrays)."""
    return tuple(t.numpy().copy() if isinstance(t, torch.Tensor) else np.array(t) for t in batch)


def next_order_ready(loader) -> None:
    """Wait for the next epoch's batch list once the loader has asked for it (its ``ffload-order``
    thread), so that the next epoch's jobs are submitted early on the next request whatever the
    machine's load. Call it after each batch."""
    pending = loader._epochs._pending
    if pending is not None:
        pending[1].result()


def _epoch_batches(loader):
    """One epoch's batches, copied, with the next epoch's jobs submitted early (:func:`next_order_ready`)."""
    out = []
    for b in loader:
        out.append(_copied(b))
        next_order_ready(loader)
    return out


@pytest.mark.parametrize("os_cache", [True, False])
def test_next_epochs_jobs_run_during_the_last_one_and_change_no_batch(dataset, monkeypatch, os_cache):
    """Once an epoch's last job is submitted, the next epoch's first jobs are submitted in the slots
    the tail frees, and ``iter(loader)`` takes them over: no job is computed twice, and every batch
    equals the one a loader started at that epoch computes (nothing carried over); with the
    process cache too (os_cache=False), whose schedule then counts the adopted jobs as prepared."""
    loader = _augmented_loader(dataset, os_cache=os_cache)
    assert isinstance(loader.memory, OSCacheMemory if os_cache else ProcessCacheMemory)
    submits = _record_submits(monkeypatch, loader)
    with loader:
        got = [_epoch_batches(loader) for _ in range(3)]
        if not os_cache:  # every batch of the last epoch counted as prepared, the adopted ones too
            assert loader.memory._schedule._low == len(loader)
    monkeypatch.undo()
    early = {e for e, current in submits if current == e - 1}
    assert {1, 2} <= early <= {1, 2, 3}, submits  # epochs 1 and 2 (and 3, never used) started early
    jobs = -(-len(loader) // 2)
    for epoch in (1, 2):  # each job once, early or not
        assert sum(1 for e, _ in submits if e == epoch) == jobs, submits
        fresh = _augmented_loader(dataset, os_cache=os_cache)
        fresh.next_epoch = epoch
        with fresh:
            expected = _epoch_batches(fresh)
        assert len(expected) == len(got[epoch])
        for batch, other in zip(got[epoch], expected):
            assert all(np.array_equal(a, b) for a, b in zip(batch, other))
        ids = np.concatenate([b[loader.field_names.index("index")] for b in got[epoch]])
        np.testing.assert_array_equal(ids, loader.epoch_order(epoch))


def test_next_epochs_jobs_are_dropped_when_the_epoch_or_a_setting_changes(dataset):
    """Jobs submitted ahead for epoch ``e + 1`` are not handed out when the next ``iter`` starts
    another epoch (``next_epoch``, ``load_state_dict``) or an operation's setting changed in
    between (a new ``output_size``: progressive resizing)."""
    crop = RandomResizedCropRGBImageDecoder((6, 6))
    pipelines = {"image": [crop], "label": None, "weight": None, "vec": None}
    with ffload.Loader(
        dataset, batch_size=8, num_workers=2, order="random", batches_ahead=4, batches_per_job=2, pipelines=pipelines
    ) as loader:
        index = loader.field_names.index("index")
        _epoch_batches(loader)  # epoch 0; epoch 1's first jobs run
        loader.next_epoch = 5
        ids = [b[index] for b in _epoch_batches(loader)]
        np.testing.assert_array_equal(np.concatenate(ids), loader.epoch_order(5))
        state = loader.state_dict()  # epoch 6, batch 0
        _epoch_batches(loader)  # epoch 6; epoch 7's first jobs run
        loader.load_state_dict(state)
        ids = [b[index] for b in _epoch_batches(loader)]
        np.testing.assert_array_equal(np.concatenate(ids), loader.epoch_order(6))
        loader._runner.wait_idle()
        crop.output_size = (4, 4)  # epoch 7's first job was computed at 6x6
        batches = _epoch_batches(loader)
        assert {b[0].shape[1:3] for b in batches} == {(4, 4)}
        np.testing.assert_array_equal(np.concatenate([b[index] for b in batches]), loader.epoch_order(7))


def test_a_setting_changed_right_after_iter_keeps_the_next_epochs_jobs(dataset, monkeypatch):
    """``it = iter(loader); op.p = schedule(epoch)`` each epoch: the next epoch's jobs are compared with
    the settings they were submitted with (late in the epoch), not those ``iter`` saw, so they are kept,
    not computed twice every epoch."""
    loader = _augmented_loader(dataset)
    flip = loader._build[1]["image"][1]
    submits = _record_submits(monkeypatch, loader)
    with loader:
        for epoch in range(3):
            it = iter(loader)
            flip.flip_prob = 0.5 + epoch / 10
            for _ in it:
                next_order_ready(loader)
    jobs = -(-len(loader) // 2)
    assert [sum(1 for e, _ in submits if e == epoch) for epoch in (0, 1, 2)] == [jobs] * 3, submits


def test_an_epoch_that_fits_in_its_slots_keeps_what_it_yielded(dataset):
    """``list(loader)`` of an epoch with no more jobs than batch slots keeps every batch intact: no job
    of the next epoch is started early into the slots it freed (a longer epoch reuses its own slots
    anyway, as the buffer-reuse rule allows)."""
    with ffload.Loader(
        dataset,
        batch_size=32,
        num_workers=2,
        order="random",
        batches_ahead=4,
        batches_per_job=1,
        pipelines=indices_only(),
    ) as loader:
        assert len(loader) <= loader._get_runner().num_slots  # 4 batches, 6 slots
        for epoch in range(2):
            batches = list(loader)
            loader._runner.wait_idle()
            got = np.concatenate([b[loader.field_names.index("index")] for b in batches])
            np.testing.assert_array_equal(got, loader.epoch_order(epoch))


def test_an_epoch_start_that_fails_starts_that_epoch_again(dataset):
    """A resize that does not fit the pipeline (a crop larger than the new size) fails ``iter(loader)``;
    after the fix the next ``iter`` runs that same epoch, with its batches, and the jobs submitted for it
    during the last epoch are dropped, their slots back (one more epoch runs)."""
    from ffload.errors import PipelineError
    from ffload.transforms import RandomCrop

    crop = RandomResizedCropRGBImageDecoder((8, 8))
    pipelines = {"image": [crop, RandomCrop(6)], "label": None, "weight": None, "vec": None}
    with ffload.Loader(
        dataset, batch_size=8, num_workers=2, order="random", batches_ahead=4, batches_per_job=2, pipelines=pipelines
    ) as loader:
        index = loader.field_names.index("index")
        _epoch_batches(loader)  # epoch 0; epoch 1's first jobs run
        crop.output_size = (4, 4)
        with pytest.raises(PipelineError):
            iter(loader)
        assert loader.next_epoch == 1 and loader.state_dict()["epoch"] == 1
        crop.output_size = (7, 7)
        for epoch in (1, 2):
            batches = _epoch_batches(loader)
            assert {b[0].shape[1:3] for b in batches} == {(6, 6)}
            np.testing.assert_array_equal(np.concatenate([b[index] for b in batches]), loader.epoch_order(epoch))
        assert loader._runner.slots_allocated() <= loader._runner.num_slots


def test_next_epochs_jobs_leave_the_held_batches_alone(dataset):
    """The last two batches of an epoch stay valid until the next epoch's second batch is requested,
    while that epoch's first jobs fill the other slots (fewest slots: one batch ahead)."""
    with ffload.Loader(
        dataset, batch_size=8, num_workers=2, order="random", batches_ahead=1, batches_per_job=1
    ) as loader:
        index = loader.field_names.index("index")
        batches = []
        for b in loader:
            batches = [*batches[-1:], b]
            next_order_ready(loader)
        held = [_copied(b) for b in batches]
        loader._runner.wait_idle()  # the next epoch's jobs have run
        for kept, batch in zip(held, batches):
            assert all(np.array_equal(a, np.asarray(b)) for a, b in zip(kept, batch))
        first = next(iter(loader))
        assert all(np.array_equal(a, np.asarray(b)) for a, b in zip(held[1], batches[-1]))  # still valid
        np.testing.assert_array_equal(np.asarray(first[index]), loader.epoch_order(1)[:8])


def test_an_epochs_tail_offers_the_next_epochs_jobs_only_when_they_may_start(dataset, monkeypatch):
    """At an epoch's tail (every job of it submitted), a batch taken out of a job already made offers
    the next epoch's jobs a start only where what stopped them may have changed (their batch list was
    not ready, or no slot was free and one is now): here, where the jobs in flight stop them, once or
    twice per job taken instead of once per batch; and they still start during the epoch."""
    from ffload.loaders.iterator import NextEpochJobs

    calls = []
    fill = NextEpochJobs.fill

    def counted(self, room):
        calls.append(self.epoch)
        return fill(self, room)

    monkeypatch.setattr(NextEpochJobs, "fill", counted)
    with ffload.Loader(
        dataset,
        batch_size=2,
        num_workers=2,
        order="random",
        indices=np.arange(128) % 101,
        batches_ahead=32,  # 4 jobs of 8 batches: the last job is submitted as the fourth of 8 is taken
        batches_per_job=8,
        pipelines=indices_only(),
    ) as loader:
        _epoch_batches(loader)  # epoch 0
        calls.clear()
        got = _epoch_batches(loader)  # epoch 1, its tail offering epoch 2's jobs
        jobs = len(loader) // 8
        assert 0 < len(calls) <= 2 * jobs + 1, calls  # once per batch of the tail (about 36) before
        assert set(calls) == {2}
        assert loader._next_jobs is not None and loader._next_jobs.futures  # epoch 2's jobs started
        index = loader.field_names.index("index")
        np.testing.assert_array_equal(np.concatenate([b[index] for b in got]), loader.epoch_order(1))
        np.testing.assert_array_equal(np.concatenate(epoch_indices(loader)), loader.epoch_order(2))


def test_next_epochs_jobs_are_offered_again_where_what_stopped_them_changed():
    """``NextEpochJobs.may_submit``, the rule the epoch tail follows between slow requests, over a
    stand-in for the runner's slot table: after a fill stopped for want of its batch list, offer
    again; for want of a slot, only once one is free; for want of room (jobs in flight) or with
    nothing left, not (those change only where the consumer takes a job, which fills anyway)."""
    from ffload.loaders.iterator import NextEpochJobs
    from ffload.loaders.orders import EpochBatches

    class Slots:  # the part of BatchRunner that NextEpochJobs uses
        def __init__(self):
            self.free, self.submitted = 0, []

        def acquire_slot(self):
            if not self.free:
                return None
            self.free -= 1
            return 7

        def has_free_slot(self):
            return self.free > 0

        def submit(self, slot, first, rows, lengths, epoch, cancel):
            self.submitted.append(first)
            return object()

    slots, ready = Slots(), [None]
    jobs = NextEpochJobs(slots, 3, lambda: ready[0], lambda n: 2, lambda: {})
    assert jobs.may_submit()  # nothing asked yet
    jobs.fill(room=4)
    assert jobs.may_submit() and not slots.submitted  # the batch list is being computed
    ready[0] = EpochBatches(np.arange(10, dtype=np.int64), 2)  # 5 batches, jobs of 2
    jobs.fill(room=4)
    assert not jobs.may_submit() and not slots.submitted  # no slot
    slots.free = 1  # an abandoned job's slot came back
    assert jobs.may_submit()
    jobs.fill(room=4)
    assert slots.submitted == [0] and not jobs.may_submit()  # the slot taken, none free
    slots.free = 5
    jobs.fill(room=2)
    assert slots.submitted == [0, 2] and not jobs.may_submit()  # two in flight: no room, slots or not
    jobs.fill(room=4)
    assert slots.submitted == [0, 2, 4] and not jobs.may_submit()  # every batch submitted
    jobs.cancel.set()
    jobs.fill(room=4)
    assert not jobs.may_submit()


def test_indices_subset(dataset):
    subset = [40, 3, 77, 3, 12, 100]
    seq = ffload.Loader(
        dataset, batch_size=4, num_workers=1, order="sequential", indices=subset, pipelines=indices_only()
    )
    assert len(seq) == 2
    np.testing.assert_array_equal(np.concatenate(epoch_indices(seq)), subset)
    rnd = ffload.Loader(
        dataset, batch_size=4, num_workers=2, order="random", indices=np.array(subset), pipelines=indices_only()
    )
    np.testing.assert_array_equal(np.sort(np.concatenate(epoch_indices(rnd))), np.sort(subset))


def test_quasi_random_reads_few_pages_per_batch(tmp_path):
    # 2 MiB pages holding ~20 payloads of 100 kB each: 12 pages
    n = 240
    path = write_dataset(
        str(tmp_path / "pages.beton"),
        {"blob": BytesField(), "i": IntField()},
        ((np.full(100_000, i % 251, np.uint8), i) for i in range(n)),
        n,
        page_size=1 << 21,
    )
    pages = open_dataset(path).sample_pages
    assert len(np.unique(pages)) >= 12

    def pages_per_batch(order):
        loader = ffload.Loader(path, batch_size=40, num_workers=1, order=order, pipelines={"blob": None})
        got = [np.unique(pages[b[0].numpy()]).size for b in loader]
        loader.close()
        return np.mean(got)

    assert pages_per_batch("quasi_random") * 2 < pages_per_batch("random")


# --------------------------------------------------------------- determinism
def augmented():
    return {
        "image": [
            RandomResizedCropRGBImageDecoder((6, 6), scale=(0.3, 1.0)),
            RandomHorizontalFlip(),
            Cutout(2),
            ToTensor(),
        ],
        "label": None,
        "weight": None,
        "vec": None,
    }


def run_epochs(path, epochs=2, **kw):
    loader = ffload.Loader(path, pipelines=augmented(), **kw)
    out = [[tuple(t.clone() for t in b) for b in loader] for _ in range(epochs)]
    loader.close()
    return out


def assert_same_batches(a, b):
    assert len(a) == len(b)
    for ea, eb in zip(a, b):
        assert len(ea) == len(eb)
        for ba, bb in zip(ea, eb):
            for ta, tb in zip(ba, bb):
                assert torch.equal(ta, tb)


@pytest.mark.smoke
def test_same_batches_for_any_num_workers(dataset):
    runs = [run_epochs(dataset, batch_size=8, num_workers=w, seed=3, order="random") for w in (1, 2, 3)]
    assert_same_batches(runs[0], runs[1])
    assert_same_batches(runs[0], runs[2])

    # the augmentation is random: the two epochs differ for the same samples
    def by_sample(epoch):
        return {int(i): img for img, idx in epoch for i, img in zip(idx, img)}

    e0, e1 = by_sample(runs[0][0]), by_sample(runs[0][1])
    assert sum(not torch.equal(e0[i], e1[i]) for i in e0) > N // 2


def test_os_cache_and_process_cache_give_identical_batches(dataset):
    a = run_epochs(dataset, batch_size=9, num_workers=2, os_cache=True, order="quasi_random")
    b = run_epochs(dataset, batch_size=9, num_workers=2, os_cache=False, order="quasi_random")
    assert_same_batches(a, b)


def blob_dataset(tmp_path, payloads):
    """A .beton of BytesField payloads on 2 MiB pages."""
    path = write_dataset(
        str(tmp_path / "blobs.beton"),
        {"blob": BytesField()},
        ((p,) for p in payloads),
        len(payloads),
        page_size=1 << 21,
    )
    return path


def test_process_cache_reads_each_block_once(tmp_path):
    """Batches sharing samples read each block once (the compiled reads, one per run): the bytes
    read are those of the distinct blocks the payloads span, and every payload reads back."""
    n = 24
    payloads = [np.full(300_000 + 1000 * i, i, np.uint8) for i in range(n)]  # some span 2 pages
    view = open_dataset(blob_dataset(tmp_path, payloads))
    memory = ProcessCacheMemory(view, ["blob"])
    for batch in (np.array([5, 1]), np.array([1, 5]), np.arange(n), np.array([7])):
        memory.prepare(batch)
        for i in batch:
            p, s = int(view.ptrs["blob"][i]), int(view.sizes["blob"][i])
            np.testing.assert_array_equal(memory.region[p : p + s], payloads[i])
    assert_each_block_read_once(memory, view, np.arange(n))
    memory.close()


def assert_each_block_read_once(memory, view, samples):
    """The cache read the blocks the payloads of ``samples`` span, each once: its bytes read are
    theirs (the last block clipped to the data's end)."""
    blocks = batch_blocks(memory._payloads, np.unique(samples).astype(np.int64), memory.block)
    assert blocks.size and memory.bytes_read == sum(
        min(memory.block, view.data_size - b * memory.block) for b in blocks.tolist()
    )


def test_process_cache_names_a_file_that_ends_early(tmp_path):
    """A data file cut short under the loader: during an epoch, the compiled read stops at the
    file's end and the error names the file and the byte (not zeros handed out); before the
    first epoch, the read-ahead's mapping names it."""
    payloads = [np.full(50_000, i, np.uint8) for i in range(40)]
    path = blob_dataset(tmp_path, payloads)
    size = os.path.getsize(path)
    kw = dict(batch_size=8, num_workers=1, order="sequential", os_cache=False, batches_per_job=1)
    with ffload.Loader(path, **kw) as loader:
        it = iter(loader)
        next(it)
        os.truncate(path, size // 2)
        ends = r"blobs\.beton: file ends at byte \d+, expected \d+ bytes \(truncated\?\)"
        with pytest.raises(LoaderError, match=ends):
            for _ in it:
                pass
    (tmp_path / "again").mkdir()
    path = blob_dataset(tmp_path / "again", payloads)
    with ffload.Loader(path, **kw) as loader:
        os.truncate(path, size // 2)
        with pytest.raises(FormatError, match=rf"blobs\.beton: the file shrank from {size} to {size // 2} bytes"):
            iter(loader)


def test_batch_blocks():
    """The sorted distinct blocks the payloads span: empty payloads span none, a payload ending on a
    boundary stops before it, two payloads sharing a block count it once."""
    ptrs = np.array([0, 10, 95, 300, 150], np.uint64)
    sizes = np.array([5, 0, 20, 100, 10], np.uint64)
    every = np.arange(5, dtype=np.int64)
    np.testing.assert_array_equal(batch_blocks([(ptrs, sizes)], every, 100), [0, 1, 3])
    np.testing.assert_array_equal(batch_blocks([(ptrs, sizes)], every[:0], 100), [])
    np.testing.assert_array_equal(batch_blocks([(ptrs, sizes), (ptrs + 400, sizes)], every[1:2], 100), [])
    with pytest.raises(IndexError, match="out of range"):  # the compiled loops check the ids
        batch_blocks([(ptrs, sizes)], np.array([2, 5]), 100)
    with pytest.raises(TypeError, match="integers"):
        batch_blocks([(ptrs, sizes)], np.ones(5, bool), 100)


def test_wait_idle_waits_for_the_jobs_of_an_abandoned_iterator(dataset):
    """A job still running for an abandoned iterator keeps wait_idle() (and so the next iter()) waiting;
    the runner's record of submitted jobs stays about as long as the jobs in flight."""
    loader = ffload.Loader(dataset, batch_size=5, num_workers=2, batches_ahead=2, pipelines={"weight": None})
    runner = loader._get_runner()
    for _ in loader:
        pass
    assert len(runner._submitted) <= runner.num_slots
    started, release, compute = threading.Event(), threading.Event(), runner._compute
    runner._compute = lambda *args, **kw: (started.set(), release.wait(), compute(*args, **kw))[2]
    iterator = iter(loader)
    assert started.wait(30)
    iterator.close()  # abandoned while a job runs: it blocks on ``release``
    waiter = threading.Thread(target=runner.wait_idle)
    waiter.start()
    waiter.join(0.2)
    assert waiter.is_alive()
    release.set()
    waiter.join(30)
    assert not waiter.is_alive()
    loader.close()


# ------------------------------------------------------------ buffer reuse
def check_batches_stay_valid(loader, images, epochs=1) -> set[int]:
    """Iterate ``epochs`` epochs of ``(image, index)`` batches, checking each batch against
    ``images`` and the previous batch still intact while the next is handled (after every queued
    job has run: no timing luck); the slot counts seen along the way."""
    previous, slots = None, set()
    for _ in range(epochs):
        for image, index in loader:
            loader._runner.wait_idle()
            np.testing.assert_array_equal(image.numpy(), images[index.numpy()])
            if previous is not None:  # still intact while we handle the next batch
                np.testing.assert_array_equal(previous[0].numpy(), images[previous[1]])
            # the ids are copied: an overwritten slot would change both tensors consistently
            previous = (image, index.numpy().copy())
            slots.add(loader._runner.slots_allocated())
    return slots


def test_batch_valid_until_the_one_after_next_is_requested(dataset, digits):
    images, _ = digits
    loader = ffload.Loader(
        dataset,
        batch_size=5,
        num_workers=3,
        batches_ahead=1,
        order="random",
        pipelines={"label": None, "weight": None, "vec": None},
    )
    check_batches_stay_valid(loader, images)
    loader.close()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_batches_equal_cpu_batches(dataset):
    def pipelines(device):
        image = [SimpleRGBImageDecoder(), RandomHorizontalFlip(), ToTensor()]
        label = [IntDecoder(), ToTensor()]
        if device:
            image.append(ToDevice(device, non_blocking=True))
            label.append(ToDevice(device, non_blocking=True))
        return {"image": image + [ToTorchImage()], "label": label, "index": None, "weight": None, "vec": None}

    gpu = ffload.Loader(dataset, batch_size=8, num_workers=3, batches_ahead=1, seed=4, pipelines=pipelines("cuda:0"))
    cpu = ffload.Loader(dataset, batch_size=8, num_workers=1, seed=4, pipelines=pipelines(None))
    assert gpu.pin_memory and not cpu.pin_memory
    for _ in range(2):
        got = [(i.clone(), lab * 2) for i, lab in gpu]  # work on the GPU (copies: slots are reused)
        want = [(i.clone(), lab * 2) for i, lab in cpu]
        assert len(got) == len(want)
        for (gi, gl), (ci, cl) in zip(got, want):
            assert gi.is_cuda and torch.equal(gi.cpu(), ci) and torch.equal(gl.cpu(), cl)
    gpu.close()
    cpu.close()


# ------------------------------------------------------------- thread hygiene
def test_abandoned_iterators_do_not_leak_threads(dataset):
    baseline = threading.active_count()
    loader = ffload.Loader(dataset, batch_size=4, num_workers=3, order="random")
    for _ in range(50):
        it = iter(loader)
        next(it)
        del it
        assert threading.active_count() <= baseline + 3 + 2  # workers, the read-ahead and the ffload-order threads
    for _ in range(5):
        for _ in loader:
            break
    np.testing.assert_array_equal(np.sort(np.concatenate(epoch_indices(loader))), np.arange(N))
    loader.close()
    assert threading.active_count() == baseline
    with pytest.raises(RuntimeError, match="closed"):
        iter(loader)


def test_context_manager_joins_threads(dataset):
    baseline = threading.active_count()
    with ffload.Loader(dataset, batch_size=4, num_workers=2) as loader:
        next(iter(loader))
    assert threading.active_count() == baseline


def test_new_iterator_supersedes_the_previous(dataset):
    loader = ffload.Loader(dataset, batch_size=10, num_workers=2, order="sequential", pipelines=indices_only())
    first = iter(loader)
    next(first)
    second = iter(loader)
    with pytest.raises(RuntimeError, match="newer iter"):
        next(first)
    assert second.epoch == 1
    np.testing.assert_array_equal(np.concatenate([b[0].numpy().copy() for b in second]), np.arange(N))
    with pytest.raises(StopIteration):
        next(second)
    loader.close()


# ----------------------------------------------------------- worker errors
def test_worker_exception_names_the_sample(tmp_path, digits):
    images, labels = digits
    path = write_digits(tmp_path / "jpg.beton", images[:30], labels[:30], write_mode="jpg")
    view = open_dataset(path)
    bad = 17
    with open(path, "r+b") as f:  # wipe one JPEG payload (size unchanged)
        f.seek(int(view.ptrs["image"][bad]))
        f.write(b"\0" * int(view.sizes["image"][bad]))
    baseline = threading.active_count()
    loader = ffload.Loader(
        path,
        batch_size=4,
        num_workers=2,
        order="sequential",
        pipelines={"image": [CenterCropRGBImageDecoder(8, 1.0), ToTensor()]},
    )
    it = iter(loader)
    got = []
    with pytest.raises(LoaderError, match=f"sample {bad}") as info:
        for image, *_ in it:
            got.append(image)
    assert info.value.sample_index == bad and info.value.field == "image"
    assert info.value.__cause__ is not None
    assert len(got) == bad // 4  # every batch before the broken one arrived
    with pytest.raises(StopIteration):
        next(it)
    sub = ffload.Loader(path, batch_size=4, num_workers=2, indices=[i for i in range(30) if i != bad])
    assert sum(len(b[1]) for b in sub) == 29
    loader.close()
    sub.close()
    assert threading.active_count() == baseline


# ------------------------------------------------------- construction errors
ALL_FIELDS = ("image", "label", "index", "weight", "vec")
CONSTRUCTION_ERRORS = [  # (Loader keyword arguments, the specific class, a key part of the message)
    pytest.param({"batch_size": 0}, ConfigurationError, "batch_size", id="batch_size-zero"),
    pytest.param({"batch_size": -3}, ConfigurationError, "batch_size", id="batch_size-negative"),
    pytest.param({"batch_size": 2.5}, ConfigurationError, "batch_size", id="batch_size-float"),
    pytest.param({"num_workers": 0}, ConfigurationError, "num_workers", id="num_workers-zero"),
    pytest.param({"order": "shuffle"}, ConfigurationError, "unknown order", id="order-unknown"),
    pytest.param({"seed": -1}, ConfigurationError, "seed", id="seed-negative"),
    pytest.param(
        {"pipelines": lambda: {"labels": [IntDecoder(), ToTensor()]}},
        ConfigurationError,
        "'labels'.*'label'",
        id="pipelines-unknown-field",
    ),
    pytest.param(
        {"pipelines": lambda: {"label": [CenterCropRGBImageDecoder(4), ToTensor()]}},
        PipelineError,
        "field 'label'.*IntField",
        id="decoder-for-another-field-type",
    ),
    pytest.param(
        {"pipelines": lambda: {"image": [ToTensor()]}},
        PipelineError,
        "field 'image'.*must start with a decoder",
        id="pipeline-without-decoder",
    ),
    pytest.param(
        {"pipelines": lambda: {"image": [CenterCropRGBImageDecoder(4), CenterCropRGBImageDecoder(4)]}},
        PipelineError,
        "field 'image'.*only the first",
        id="two-decoders",
    ),
    pytest.param(
        {"pipelines": lambda: {"image": [CenterCropRGBImageDecoder(4), "flip"]}},
        PipelineError,
        "field 'image'.*not an ffload Operation",
        id="item-not-an-operation",
    ),
    pytest.param(
        {"pipelines": lambda: {"image": [CenterCropRGBImageDecoder(4), ToTorchImage()]}},
        PipelineError,
        "field 'image'.*ToTorchImage",
        id="operation-on-wrong-stage",
    ),
    pytest.param({"pipelines": lambda: {"label": []}}, ConfigurationError, "'label' is empty", id="pipeline-empty"),
    pytest.param(
        {"pipelines": lambda: dict.fromkeys(ALL_FIELDS)}, ConfigurationError, "disabled", id="every-field-disabled"
    ),
    pytest.param(
        {"indices": [0, N]}, ConfigurationError, r"indices\[1\] = 101 is out of range", id="indices-past-the-end"
    ),
    pytest.param({"indices": [-1]}, ConfigurationError, "out of range", id="indices-negative"),
    pytest.param({"indices": np.ones(N, bool)}, ConfigurationError, "boolean mask", id="indices-boolean-mask"),
    pytest.param({"indices": []}, ConfigurationError, "empty", id="indices-empty"),
    pytest.param({"distributed": True}, UnavailableError, "init_process_group", id="distributed-without-process-group"),
    pytest.param(
        {"pin_memory": True},
        UnavailableError,
        "pin_memory=True needs CUDA",
        id="pin_memory-without-cuda",
        marks=pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here"),
    ),
]


@pytest.mark.parametrize("kwargs,error,match", CONSTRUCTION_ERRORS)
def test_construction_errors(dataset, kwargs, error, match):
    """Each bad argument raises its specific class (a ValueError, TypeError or RuntimeError as
    before) naming the parameter and the cause."""
    args = dict(batch_size=4, num_workers=1)
    args.update({k: v() if callable(v) else v for k, v in kwargs.items()})  # fresh operations per case
    with pytest.raises(error, match=match):
        ffload.Loader(dataset, **args)


def test_a_missing_path_is_a_format_error(tmp_path):
    with pytest.raises(FormatError, match="missing.beton: no such file"):
        ffload.Loader(tmp_path / "missing.beton", batch_size=4)


def test_images_of_several_sizes_need_a_crop_decoder(tmp_path):
    from skimage import data

    photo = data.astronaut()
    images = [np.ascontiguousarray(photo[: 20 + i, :30]) for i in range(4)]
    path = write_dataset(
        str(tmp_path / "sizes.beton"),
        {"image": RGBImageField(), "i": IntField()},
        ((im, i) for i, im in enumerate(images)),
        4,
    )
    with pytest.raises(TypeError, match="field 'image'.*several sizes.*CenterCropRGBImageDecoder"):
        ffload.Loader(path, batch_size=2)
    loader = ffload.Loader(
        path,
        batch_size=2,
        num_workers=1,
        order="sequential",
        pipelines={"image": [CenterCropRGBImageDecoder((10, 10)), ToTensor()]},
    )
    assert [tuple(b[0].shape) for b in loader] == [(2, 10, 10, 3)] * 2


@pytest.mark.parametrize("suffix", [".beton", ".lmdb"])
def test_indices_of_one_image_size_load_with_the_default_decoder(tmp_path, suffix):
    """Images of two sizes: a subset of one size loads with SimpleRGBImageDecoder (its pixels,
    and the largest payload of the subset sizes the bytes field); a subset of both sizes is
    refused naming a sample of each."""
    rng = np.random.default_rng(3)
    images = [rng.integers(0, 256, (8, 6, 3) if i % 3 else (5, 7, 3), dtype=np.uint8) for i in range(9)]
    blobs = [bytes([i]) * (2 if i % 3 else 40) for i in range(9)]
    path = write_dataset(
        str(tmp_path / f"d{suffix}"), {"image": RGBImageField(), "blob": BytesField()}, list(zip(images, blobs)), 9
    )
    subset = [7, 1, 4, 5]
    loader = ffload.Loader(path, batch_size=4, num_workers=1, order="sequential", indices=subset)
    ((image, blob),) = list(loader)
    assert np.array_equal(image.numpy(), np.stack([images[i] for i in subset]))
    assert blob.shape == (4, 2) and blob[:, 0].tolist() == subset
    with pytest.raises(TypeError, match=r"several sizes \(sample 1 is 6x8 pixels, sample 3 7x5\)"):
        ffload.Loader(path, batch_size=4, indices=[1, 2, 3, 4])
    with pytest.raises(
        TypeError,
        match=r"SimpleRGBImageDecoder needs images of one size.*sample 2 is 6x8 "
        r"pixels, sample 6 7x5",
    ):
        ffload.Loader(path, batch_size=4, indices=[2, 6], pipelines={"image": [SimpleRGBImageDecoder(), ToTensor()]})


def test_two_identical_random_ops_draw_independently(dataset, digits):
    """Two flips in one pipeline must not always cancel out (each op mixes in its position)."""
    images, _ = digits
    pipelines = {
        "image": [SimpleRGBImageDecoder(), RandomHorizontalFlip(), RandomHorizontalFlip(), ToTensor()],
        "label": None,
        "weight": None,
        "vec": None,
    }
    with ffload.Loader(dataset, batch_size=N, num_workers=1, order="sequential", pipelines=pipelines) as loader:
        batch, index = next(iter(loader))
        flipped = [not np.array_equal(batch[j].numpy(), images[i]) for j, i in enumerate(index.numpy())]
    # each sample is flipped an odd number of times with probability 1/2
    assert 20 < sum(flipped) < N - 20


def test_for_loop_over_a_temporary_loader_sees_every_batch(dataset):
    """Nothing but the iterator references the loader: it must not shut down mid-epoch."""
    seen = [
        len(b[0])
        for b in ffload.Loader(
            dataset, batch_size=4, num_workers=1, batches_ahead=1, order="sequential", pipelines=indices_only()
        )
    ]
    assert sum(seen) == N and len(seen) == -(-N // 4)


def test_one_op_object_shared_by_two_pipelines(tmp_path):
    """declare() state lives on per-pipeline copies: a decoder shared by fields of different
    payload sizes decodes both correctly (no out-of-bounds writes)."""
    from ffload.loaders import BytesDecoder

    path = str(tmp_path / "two.beton")
    small = [np.arange(4, dtype=np.uint8) + i for i in range(6)]
    big = [np.full(20000, i, np.uint8) for i in range(6)]
    write_dataset(path, {"a": BytesField(), "b": BytesField()}, list(zip(small, big)), 6)
    shared = BytesDecoder()
    with ffload.Loader(
        path,
        batch_size=3,
        num_workers=2,
        order="sequential",
        pipelines={"a": [shared, ToTensor()], "b": [shared, ToTensor()]},
    ) as loader:
        rows = [(a.numpy().copy(), b.numpy().copy()) for a, b in loader]
    a = np.concatenate([r[0] for r in rows])
    b = np.concatenate([r[1] for r in rows])
    assert a.shape == (6, 4) and b.shape == (6, 20000)
    np.testing.assert_array_equal(a, np.stack(small))
    np.testing.assert_array_equal(b, np.stack(big))


def test_last_batch_of_an_epoch_survives_the_next_iter(dataset):
    """The documented rule across epochs: starting the next epoch does not overwrite the batch
    just yielded (it stays valid until the batch after the next one is requested)."""
    with ffload.Loader(dataset, batch_size=8, num_workers=2, order="sequential", pipelines=indices_only()) as loader:
        last = None
        for (index,) in loader:
            last = index
        expected = last.numpy().copy()
        it = iter(loader)
        first = next(it)[0].numpy().copy()
        loader._runner.wait_idle()  # the new epoch's queued jobs have all run (no timing luck)
        np.testing.assert_array_equal(last.numpy(), expected)
        assert first[0] == 0


def test_process_cache_concurrent_workers_read_each_page_once(tmp_path):
    """Workers preparing overlapping batches at once: every block read exactly once, in parallel
    where the blocks differ, and every payload correct."""
    import concurrent.futures

    n = 40
    payloads = [np.full(400_000 + 997 * i, i, np.uint8) for i in range(n)]
    view = open_dataset(blob_dataset(tmp_path, payloads))
    memory = ProcessCacheMemory(view, ["blob"])
    rng = np.random.default_rng(0)
    batches = [rng.choice(n, 6, replace=False) for _ in range(64)]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        list(pool.map(memory.prepare, batches))
    for i in range(n):
        p, s = int(view.ptrs["blob"][i]), int(view.sizes["blob"][i])
        if any(i in b for b in batches):
            np.testing.assert_array_equal(memory.region[p : p + s], payloads[i])
    assert_each_block_read_once(memory, view, np.concatenate(batches))
    memory.close()


def test_loader_left_alive_at_exit_exits_quietly(dataset):
    """A loader, and an iterator of it mid-epoch, still referenced when the interpreter exits must not
    print tracebacks (the iterator's finalizer then runs while module globals are torn down)."""
    import subprocess
    import sys

    code = (
        "import ffload\n"
        f"loader = ffload.Loader({str(dataset)!r}, batch_size=8, num_workers=2)\n"
        "batch = next(iter(loader))\n"
        "it = iter(loader)\n"
        "batch = next(it)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr and "Exception ignored" not in out.stderr, out.stderr


@pytest.mark.parametrize("num_workers", [2, "auto"])
def test_the_first_job_runs_alone(tmp_path, digits, num_workers):
    """No job starts before the loader's first job has ended (it makes every first kernel call,
    which compiles or loads code): the first job waits up to 0.5 s for another job to start, which
    would show in the log as a start between its start and its end."""
    images, labels = digits
    path = write_digits(tmp_path / "d.beton", images, labels)
    log: list[str] = []
    lock = threading.Lock()
    another_started = threading.Event()

    class StartLogged(SimpleRGBImageDecoder):
        def __call__(self, src, dst, ctx):
            with lock:
                first = not log
                log.append("start")
            if first:
                another_started.wait(0.5)
            else:
                another_started.set()
            return super().__call__(src, dst, ctx)

    class EndLogged(IntDecoder):
        def __call__(self, src, dst, ctx):
            out = super().__call__(src, dst, ctx)
            with lock:
                log.append("end")
            return out

    pipelines = {"image": [StartLogged(), ToTensor()], "label": [EndLogged(), ToTensor()]}
    pipelines.update(index=None, weight=None, vec=None)
    with ffload.Loader(path, batch_size=8, num_workers=num_workers, batches_ahead=4, pipelines=pipelines) as loader:
        assert sum(len(label) for _, label in loader) == N
        jobs = -(-len(loader) // loader.batches_per_job)
    assert log[:2] == ["start", "end"]
    assert log.count("start") == log.count("end") >= jobs  # and the next epoch's jobs started during this one


def test_the_next_epochs_batches_are_computed_as_an_epoch_starts(dataset):
    """``iter(loader)`` asks the helper thread for the next epoch's batches at once, not at the
    epoch's last job: they are ready while the epoch has barely begun, and equal the order
    computed when asked."""
    import time

    kw = dict(batch_size=4, num_workers=1, batches_ahead=1, batches_per_job=1)  # the last job comes late
    with ffload.Loader(dataset, order="quasi_random", seed=2, **kw) as loader:
        it = iter(loader)
        next(it)
        deadline = time.monotonic() + 30
        while loader._epochs.ready(1) is None and time.monotonic() < deadline:
            time.sleep(0.01)
        ready = loader._epochs.ready(1)
        assert ready is not None and it._next_submit < len(loader)  # the epoch's last job is not submitted yet
        np.testing.assert_array_equal(np.concatenate(ready), loader.epoch_order(1))
