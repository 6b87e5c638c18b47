"""Several batches per job (``Loader(batches_per_job=)``): the batches, their buffer lifetime, a
failure inside a job, resume from inside a job, the automatic choice and the refusals."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

import ffload
import ffload.loaders.loader as loader_module
from ffload.errors import ConfigurationError
from ffload.formats import NDArrayField, RGBImageField, open_dataset, write_dataset
from ffload.loaders import (
    CenterCropRGBImageDecoder,
    Cutout,
    IntDecoder,
    LoaderError,
    NDArrayDecoder,
    PythonTransform,
    RandomHorizontalFlip,
    SimpleRGBImageDecoder,
    ToTensor,
    ToTorchImage,
)
from ffload.loaders.autotune import AutoTuner
from ffload.loaders.loader import _batches_per_job, _job_limits, _job_size_rule, _slot_bytes
from ffload.loaders.memory.pagepool import PagePoolMemory
from ffload.loaders.memory.process_cache import ProcessCacheMemory, cache_block, worst_batch_bytes
from ffload.loaders.memory.schedule import payload_columns
from ffload.system import available_cpus
from tests.test_loader import N, check_batches_stay_valid, digit_images, write_digits


@pytest.fixture(scope="module")
def digits():
    return digit_images(N)


@pytest.fixture(scope="module", params=["beton", "lmdb"])
def dataset(request, tmp_path_factory, digits):
    return write_digits(tmp_path_factory.mktemp("jobs") / f"digits.{request.param}", *digits)


def augmenting():
    """Random stages on the image (flip fused into the decoder, Cutout), the index as a tensor."""
    return {
        "image": [SimpleRGBImageDecoder(), RandomHorizontalFlip(), Cutout(3), ToTensor(), ToTorchImage()],
        "index": [IntDecoder(), ToTensor()],
        "label": None,
        "weight": None,
        "vec": None,
    }


def run(path, epochs=2, **kw):
    """Every batch of ``epochs`` epochs, copied: ``[(image, index), ...]``."""
    with ffload.Loader(path, pipelines=augmenting(), **kw) as loader:
        return [tuple(t.clone() for t in batch) for _ in range(epochs) for batch in loader]


def assert_same(expected, got):
    assert len(expected) == len(got)
    for a, b in zip(expected, got):
        assert all(torch.equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("per_job", [2, 3, 7, 30])
@pytest.mark.parametrize("drop_last", [False, True])
def test_batches_equal_one_batch_per_job(dataset, per_job, drop_last):
    """Jobs of several batches (the last one shorter, the epoch's last batch smaller) give the
    batches of one batch per job, bit for bit, epoch after epoch."""
    kw = dict(batch_size=4, num_workers=2, order="random", seed=7, drop_last=drop_last)
    expected = run(dataset, batches_per_job=1, **kw)
    with ffload.Loader(dataset, pipelines=augmenting(), batches_per_job=per_job, **kw) as loader:
        assert loader.batches_per_job == per_job and loader.stats()["batches_per_job"] == per_job
    assert_same(expected, run(dataset, batches_per_job=per_job, **kw))


def test_a_batch_stays_valid_until_the_one_after_next_is_requested(dataset, digits):
    """The buffer contract with jobs of 3 batches: batch k is intact while the consumer handles
    batch k + 1 (inside one job and across two), and the job's slot is reused afterwards."""
    images, _ = digits
    pipelines = {"image": [SimpleRGBImageDecoder(), ToTensor()], "index": [IntDecoder(), ToTensor()]}
    pipelines.update(label=None, weight=None, vec=None)
    with ffload.Loader(
        dataset, batch_size=5, num_workers=2, batches_ahead=1, order="random", pipelines=pipelines, batches_per_job=3
    ) as loader:
        slots = check_batches_stay_valid(loader, images, epochs=2)
        assert max(slots) <= loader._tuner.ahead + 2


def test_a_failing_sample_inside_a_job(tmp_path, digits):
    """A corrupt JPEG in the second batch of a 3-batch job: the batches before it arrive, equal to
    one batch per job, then the error names the sample and its batch."""
    images, labels = digits
    path = write_digits(tmp_path / "jpg.beton", images[:40], labels[:40], write_mode="jpg")
    view = open_dataset(path)
    bad = 17  # batch 4 of 4-sample batches: the second batch of the job of batches 3, 4, 5
    with open(path, "r+b") as f:
        f.seek(int(view.ptrs["image"][bad]))
        f.write(b"\0" * int(view.sizes["image"][bad]))
    pipelines = {"image": [CenterCropRGBImageDecoder(8, 1.0), ToTensor()], "label": None, "weight": None, "vec": None}
    got = {}
    for per_job in (1, 3):
        with ffload.Loader(
            path, batch_size=4, num_workers=2, order="sequential", pipelines=pipelines, batches_per_job=per_job
        ) as loader:
            it, got[per_job] = iter(loader), []
            with pytest.raises(LoaderError, match=f"sample {bad}, field 'image' \\(epoch 0, batch 4\\)") as info:
                for image, index in it:
                    got[per_job].append((image.clone(), index.clone()))
            assert (info.value.sample_index, info.value.batch) == (bad, 4)
            with pytest.raises(StopIteration):
                next(it)
    assert len(got[3]) == 4
    assert_same(got[1], got[3])


def test_resume_inside_a_job_is_bit_identical(dataset):
    """A state saved after 5 batches (inside the second job of 3) resumes with the rest of the
    epoch, equal to an uninterrupted run, and the next epoch follows."""
    kw = dict(batch_size=4, num_workers=2, order="random", seed=3, batches_per_job=3)
    whole = run(dataset, **kw)
    with ffload.Loader(dataset, pipelines=augmenting(), **kw) as loader:
        it = iter(loader)
        head = [tuple(t.clone() for t in next(it)) for _ in range(5)]
        state = loader.state_dict()
    assert state["batches_yielded"] == 5
    with ffload.Loader(dataset, pipelines=augmenting(), **kw) as resumed:
        resumed.load_state_dict(state)
        tail = [tuple(t.clone() for t in b) for _ in range(2) for b in resumed]
    assert_same(whole, head + tail)


def test_auto_takes_several_small_batches_per_job(dataset):
    """ "auto" fills a job with small batches where every stage is rowwise, keeping two jobs per
    worker in an epoch at least, with os_cache=False too (the process cache, and the page pool in
    QUASI_RANDOM order); a stage that is not rowwise or large batches keep one batch per job."""
    kw = dict(batch_size=2, num_workers=2, order="random")
    with ffload.Loader(dataset, pipelines=augmenting(), **kw) as loader:
        assert 1 < loader.batches_per_job <= len(loader) // (2 * loader._tuner.max_workers)
    python = augmenting()
    python["image"].insert(1, PythonTransform(lambda x: x, None))
    with ffload.Loader(dataset, pipelines=python, **kw) as loader:
        assert loader.batches_per_job == 1
    with ffload.Loader(dataset, pipelines=augmenting(), os_cache=False, **kw) as loader:
        assert loader.batches_per_job > 1  # the process cache pins a job's blocks
    pooled = dict(kw, order="quasi_random")
    with ffload.Loader(dataset, pipelines=augmenting(), os_cache=False, **pooled) as loader:
        assert loader.batches_per_job > 1
    with ffload.Loader(dataset, pipelines=augmenting(), batch_size=64, num_workers=1) as loader:
        assert loader.batches_per_job == 1  # an epoch of 2 batches
    with ffload.Loader(dataset, pipelines=augmenting(), batches_per_job=1, **kw) as one:
        per_batch = _slot_bytes(one._pipelines)
    workers = one._tuner.max_workers
    for slots in (workers + 2, 3 * (workers + 2)):  # a buffer_limit of that many batch slots
        with ffload.Loader(
            dataset, pipelines=augmenting(), batches_ahead="auto", buffer_limit=slots * per_batch, **kw
        ) as loader:
            assert loader.batches_per_job == slots // (workers + 2)


def test_auto_jobs_grow_with_more_workers_than_four(dataset):
    """Up to 4 workers a job fills 8 MiB in 16 batches at most; with more, both grow in proportion
    up to 16 workers (32 MiB in 64 batches, also beyond), a grown job within the budget (a quarter
    of the available memory, or buffer_limit) over twice a slot per worker and two more, never
    under 8 MiB. The epoch then caps a job at two per worker (until its jobs are measured, below)."""
    mib, plenty = 2**20, 2**40
    assert _job_limits(1, plenty) == _job_limits(4, plenty) == (8 * mib, 16)
    assert _job_limits(8, plenty) == (16 * mib, 32)
    assert _job_limits(16, plenty) == _job_limits(64, plenty) == (32 * mib, 64)  # measured up to 16
    assert _job_limits(16, 36 * 20 * mib) == (20 * mib, 64)  # 36 slots of 20 MiB fit
    assert _job_limits(16, 36 * mib) == (8 * mib, 64)
    # the slots jobs measured fast may fill: the square of the growth (16 workers: 128 MiB, 256 batches)
    assert _job_limits(4, plenty, fast=True) == (8 * mib, 16) and _job_limits(8, plenty, fast=True) == (32 * mib, 64)
    assert _job_limits(16, plenty, fast=True) == _job_limits(64, plenty, fast=True) == (128 * mib, 256)
    assert _job_limits(16, 36 * 20 * mib, fast=True) == (20 * mib, 256)
    assert _job_size_rule(True, 64, 196, 16) == 6 and _job_size_rule(True, 64, 196, 2) == 49
    assert _job_size_rule(True, 10, 5, 16) == 1 and _job_size_rule(False, 10, 5, 16) == 10
    with ffload.Loader(dataset, pipelines=augmenting(), batch_size=8, batches_per_job=1) as loader:
        pipelines, per_batch = loader._pipelines, _slot_bytes(loader._pipelines)
    for workers, limit in ((4, 8 * mib), (8, 16 * mib), (16, 32 * mib)):  # what a Loader with that many gets
        expected = min(limit // per_batch, 4 * max(4, workers))
        assert _batches_per_job("auto", pipelines, None, None, workers, plenty) == expected > 1


def test_an_epochs_jobs_grow_past_two_per_worker_only_when_measured_fast():
    """Two jobs per worker (196 batches, 16 workers: 6 per job), or, once jobs were measured and
    found fast (their time per batch times 6 under 16 ms, twice 16 workers' per-job GIL), the
    largest that leaves more than 18 jobs (10 per job, 20 jobs). Before any measurement (the
    first epoch) and for slow jobs, two per worker; 0.0 gives the largest, which sizes the slots."""
    assert _job_size_rule(True, 64, 196, 16, None) == 6
    assert _job_size_rule(True, 64, 196, 16, 0.0) == _job_size_rule(True, 64, 196, 16, 0.2e-3) == 10
    assert _job_size_rule(True, 64, 196, 16, 2.5e-3) == 10 and _job_size_rule(True, 64, 196, 16, 2.7e-3) == 6
    assert _job_size_rule(True, 64, 196, 8, 0.3e-3) == 19 and _job_size_rule(True, 64, 196, 8, 10e-3) == 12
    assert _job_size_rule(True, 64, 196, 2, 0.0) == 49  # two per worker is the larger up to 2 workers
    assert _job_size_rule(True, 8, 196, 16, 0.0) == 8 and _job_size_rule(False, 3, 196, 16, 0.0) == 3


def test_a_long_epochs_fast_jobs_fill_the_larger_slots():
    """A long epoch (5000 batches, 16 workers): ``usual`` (64) before any measure and for slow jobs;
    jobs fast at that size (under 16 ms each) grow to the slots' ``most`` (256), still more jobs
    than slots; a short epoch is sized as before, whatever ``most``."""
    assert _job_size_rule(True, 256, 5000, 16, None, 18, usual=64) == 64
    assert _job_size_rule(True, 256, 5000, 16, 1e-3, 18, usual=64) == 64  # 64 ms per job: slow
    assert _job_size_rule(True, 256, 5000, 16, 0.2e-3, 18, usual=64) == 256  # 12.8 ms: fast
    assert _job_size_rule(True, 256, 5000, 16, 0.0, 0, usual=64) == 256  # what sizes the slots
    assert _job_size_rule(True, 256, 3000, 16, 0.2e-3, 18, usual=64) == 166  # 19 jobs for 18 slots
    assert _job_size_rule(True, 256, 196, 16, 0.2e-3, 18, usual=64) == 10  # a short epoch: as before
    assert _job_size_rule(True, 256, 196, 16, None, 18, usual=64) == 6


def test_sixteen_workers_size_their_slots_for_fast_jobs(dataset, monkeypatch):
    """With 16 workers (this machine's CPUs patched) a long epoch of small batches: the slots hold
    the larger fast jobs (:func:`_job_limits` with ``fast``), the first epoch runs the usual size,
    and a measure of fast jobs grows the next epoch's to the slots; with 4 workers both sizes are
    the same (16)."""
    monkeypatch.setattr(loader_module, "available_cpus", lambda: 16)
    indices = np.tile(np.arange(N), -(-5000 // N))[:5000]
    kw = dict(batch_size=1, indices=indices, pipelines=augmenting())
    with ffload.Loader(dataset, num_workers=16, **kw) as loader:
        usual, most = loader._usual_job, loader.batches_per_job
        assert usual == 64 and most == 256  # the batch caps bind: one small image per batch
        assert loader._job_size(len(loader)) == usual
        loader._tuner.job_seconds_per_batch = 1e-5
        assert loader._job_size(len(loader)) == most
        loader._tuner.job_seconds_per_batch = 1e-3
        assert loader._job_size(len(loader)) == usual
    with ffload.Loader(dataset, num_workers=4, **kw) as loader:
        assert loader._usual_job == loader.batches_per_job == 16


def test_the_usual_job_size_stays_for_pinned_slots_and_large_batches(dataset, monkeypatch):
    """16 workers: pinned slots (committed whole) keep the usual size; so do batches of which the
    usual job holds one (``JOB_BYTES`` patched to a quarter batch: the grown limit would hold 4)."""
    monkeypatch.setattr(loader_module, "available_cpus", lambda: 16)
    kw = dict(batch_size=1, num_workers=16, indices=np.resize(np.arange(N), 5000), pipelines=augmenting())
    with monkeypatch.context() as m:
        m.setattr(torch.cuda, "is_available", lambda: True)  # pinned buffers are allocated at the first job only
        with ffload.Loader(dataset, pin_memory=True, **kw) as loader:
            assert loader.batches_per_job == loader._usual_job == 64
    with ffload.Loader(dataset, batches_per_job=1, **kw) as loader:
        pipelines, per_batch = loader._pipelines, _slot_bytes(loader._pipelines)
    monkeypatch.setattr(loader_module, "JOB_BYTES", per_batch // 4)
    assert _batches_per_job("auto", pipelines, None, None, 16, 2**40, fast=True) == 4
    with ffload.Loader(dataset, **kw) as loader:
        assert loader.batches_per_job == loader._usual_job == 1


def test_a_long_epochs_fast_jobs_grow_into_the_larger_slots(dataset, monkeypatch):
    """8 workers, 600 one-sample batches: the first epoch runs the usual job (32 batches, the two
    per worker, 37, capped), the next ones, measured fast (a job's GIL set at 10 ms), 59 (11 jobs
    for the 10 slots; the fast limit is 64), which the slots hold; every size gives the batches of
    one batch per job."""
    monkeypatch.setattr(loader_module, "available_cpus", lambda: 8)
    monkeypatch.setattr(loader_module, "JOB_PYTHON_S", 10e-3)
    indices = np.resize(np.arange(N), 600)
    kw = dict(batch_size=1, num_workers=8, order="random", seed=3, batches_ahead=3, indices=indices)
    with ffload.Loader(dataset, pipelines=augmenting(), batches_per_job=1, **kw) as loader:
        expected = [tuple(t.clone() for t in batch) for _ in range(3) for batch in loader]
    got, sizes = [], []
    with ffload.Loader(dataset, pipelines=augmenting(), **kw) as loader:
        assert (loader._usual_job, loader.batches_per_job) == (32, 59)
        for _ in range(3):
            it = iter(loader)
            sizes.append(loader.stats()["batches_per_job"])
            got += [tuple(t.clone() for t in batch) for batch in it]
    assert_same(expected, got)
    assert sizes == [32, 59, 59]


class _Sleep(ffload.loaders.Operation):
    """A rowwise stage that sleeps ``seconds`` per row and changes nothing (a slow job)."""

    keeps_geometry = rowwise = True

    def __init__(self, seconds):
        self.seconds = seconds

    def declare(self, spec, field, view):
        return spec

    def buffer_spec(self, spec_out, batch_size):
        return None

    def __call__(self, src, dst, ctx):
        time.sleep(self.seconds * len(ctx.indices))
        return src


@pytest.mark.parametrize("ahead", [3, "auto"])
@pytest.mark.parametrize("sleep", [0.0, 0.02])
def test_fast_jobs_grow_after_the_first_epoch_and_slow_ones_do_not(dataset, monkeypatch, sleep, ahead):
    """8 workers, 101 batches of one sample: the first epoch's jobs are 6 batches (two per worker;
    nothing measured yet). From the second epoch on, fast jobs take 10 (11 jobs, more than the 10
    slots; a job's GIL set at 2.5 ms, so the bound, 40 ms per 6-batch job, is far from both
    cases), measured by the tuner whatever is auto; jobs that sleep 20 ms per batch keep 6. With
    an auto depth (12 slots or more) the fast jobs stay fewer than the slots allow, so every
    epoch still runs the next one's first jobs during its last ones. Every size gives the
    batches of one batch per job."""
    monkeypatch.setattr(loader_module, "available_cpus", lambda: 8)
    monkeypatch.setattr(loader_module, "JOB_PYTHON_S", 2.5e-3)
    kw = dict(batch_size=1, num_workers=8, order="random", seed=3, batches_ahead=ahead)
    pipelines = augmenting()
    pipelines["image"].insert(2, _Sleep(sleep))
    with ffload.Loader(dataset, pipelines=pipelines, batches_per_job=1, **kw) as loader:
        expected = [tuple(t.clone() for t in batch) for _ in range(3) for batch in loader]
    got, sizes = [], []
    with ffload.Loader(dataset, pipelines=pipelines, **kw) as loader:
        for _ in range(3):
            it = iter(loader)
            sizes.append(loader.stats()["batches_per_job"])
            jobs = -(-len(loader) // sizes[-1])
            assert jobs > loader._runner.num_slots and loader._next_jobs is not None  # the overlap kept
            got += [tuple(t.clone() for t in batch) for batch in it]
        measured = loader._tuner.job_seconds_per_batch
    assert_same(expected, got)
    if sleep:
        assert sizes == [6, 6, 6] and measured >= sleep
    elif ahead == 3:
        assert sizes == [6, 10, 10]
    else:  # the depth the tuner chose sets the slots
        assert sizes[0] == 6 and min(sizes) >= 6 and max(sizes) > 6


def test_auto_workers_size_each_epochs_jobs(dataset):
    """With ``num_workers="auto"`` the slots hold the most batches a job may take with one worker,
    and each epoch's jobs are sized for the workers the tuner admits then (``_job_size_rule``): a
    tuner that parked workers gets larger jobs next epoch. The batches are those of one batch per job."""
    if available_cpus() < 2:
        pytest.skip("one CPU: the tuner admits one worker whatever is asked")
    kw = dict(batch_size=2, order="random", seed=4)
    expected = run(dataset, epochs=3, num_workers=2, batches_per_job=1, **kw)
    got = []
    with ffload.Loader(dataset, pipelines=augmenting(), num_workers="auto", **kw) as loader:
        ceiling = loader.batches_per_job
        assert 1 < ceiling <= len(loader) // 2
        sizes = []
        for workers in (4, 2, 1):
            loader._tuner.workers = min(workers, loader._tuner.max_workers)
            it = iter(loader)
            sizes.append(loader.stats()["batches_per_job"])
            measured = loader._tuner.job_seconds_per_batch
            admitted, usual = loader._tuner.workers, loader._usual_job
            assert sizes[-1] == _job_size_rule(True, ceiling, len(loader), admitted, measured, usual=usual)
            got += [tuple(t.clone() for t in batch) for batch in it]
        assert sizes[0] < sizes[-1] == ceiling  # 51 batches: 6 (or 12 with 2 CPUs) and 16
    assert_same(expected, got)


def test_a_restored_depth_is_counted_in_the_jobs_it_will_run(dataset, monkeypatch):
    """A saved auto depth (in batches) comes back in jobs of the size the restored workers get
    (12 batches for 2 workers here, against 16 for the slots): 40 batches ahead become 4 jobs,
    48 batches, not 3 jobs of 16 that then hold 12 each (36). A fixed depth likewise."""
    if available_cpus() < 2:
        pytest.skip("one CPU: one worker whatever is saved")
    monkeypatch.setattr(loader_module, "available_cpus", lambda: 4)  # auto jobs as large on any machine
    kw = dict(batch_size=2, num_workers="auto", batches_ahead="auto", pipelines=augmenting())
    with ffload.Loader(dataset, **kw) as loader:
        state = loader.state_dict()
        state["autotune"] = {"num_workers": 2, "batches_ahead": 40}
        loader.load_state_dict(state)
        assert loader.batches_per_job == 16 and _job_size_rule(True, 16, len(loader), 2) == 12
        it = iter(loader)
        assert loader.stats()["batches_per_job"] == 12 and loader.stats()["batches_ahead"] == 48
        it.close()
    # a fixed depth is kept in jobs of any size an epoch may get (slots for the smallest)
    with ffload.Loader(dataset, **dict(kw, batches_ahead=40)) as loader:
        loader._tuner.workers = 2
        it = iter(loader)
        assert loader.stats()["batches_per_job"] == 12 and loader.stats()["batches_ahead"] >= 40
        it.close()


def test_bad_batches_per_job_are_refused(dataset):
    with pytest.raises(ConfigurationError, match="batches_per_job must be an integer >= 1"):
        ffload.Loader(dataset, batch_size=4, batches_per_job=0)
    with pytest.raises(ConfigurationError, match="batches_per_job must be an integer or 'auto'"):
        ffload.Loader(dataset, batch_size=4, batches_per_job="many")
    python = augmenting()
    python["image"].insert(1, PythonTransform(lambda x: x, None))
    with pytest.raises(ConfigurationError, match="stage PythonTransform of field 'image' is not rowwise"):
        ffload.Loader(dataset, batch_size=4, pipelines=python, batches_per_job=2)


def test_page_pool_jobs_fit_the_pool_epoch_by_epoch(tmp_path, digits, monkeypatch, caplog):
    """os_cache=False in QUASI_RANDOM order (the page pool), two decoded fields with payloads: jobs
    of several batches give the batches of one batch per job on the mapped file, bit for bit; each
    epoch's jobs are halved until every job's pages (both fields' counted once) times the workers
    fit the pool's slots (auto), an asked-for size until a job fits the whole pool, with a warning
    naming both."""
    monkeypatch.setattr(loader_module, "available_cpus", lambda: 2)  # 2 workers on any machine
    images, labels = digits
    large = np.kron(images, np.ones((1, 24, 24, 1), np.uint8))  # 192 x 192: 18 samples per page, 6 pages
    page = 1 << 21
    fields = {"image": RGBImageField("raw"), "vec": NDArrayField(np.dtype("<f4"), (2,))}
    samples = ((im, np.array([i, -i], np.float32)) for i, im in enumerate(large))
    path = write_dataset(str(tmp_path / "d.beton"), fields, samples, len(large), page_size=page)
    pipelines = {
        "image": [SimpleRGBImageDecoder(), RandomHorizontalFlip(), ToTensor(), ToTorchImage()],
        "vec": [NDArrayDecoder(), ToTensor()],
    }
    kw = dict(batch_size=4, num_workers=2, order="quasi_random", seed=3, pipelines=pipelines)

    def run_pool(**more):
        with ffload.Loader(path, os_cache=False, **kw, **more) as loader:
            assert isinstance(loader._memory, PagePoolMemory)
            got, jobs = [], []
            for _ in range(2):
                it = iter(loader)
                jobs.append(it._per_job)
                got += [tuple(t.clone() for t in batch) for batch in it]
            assert loader._memory.peak_resident_bytes <= loader.cache_limit
            return got, jobs, loader._memory._page_in.size

    with ffload.Loader(path, batches_per_job=1, **kw) as loader:
        expected = [tuple(t.clone() for t in batch) for _ in range(2) for batch in loader]
    got, jobs, slots = run_pool(batches_per_job=8)
    assert jobs == [8, 8]
    assert_same(expected, got)
    view = open_dataset(path)
    starts = [np.where(view.sizes[f] > 0, view.ptrs[f].astype(np.int64) // page, -1) for f in ("image", "vec")]

    def halved(asked, share, epoch):  # the rule, counted with sets on the epoch's order
        with ffload.Loader(path, **kw) as loader:
            order = loader.epoch_order(epoch)
        per_job = asked
        while per_job > 1:
            jobs = [order[i : i + 4 * per_job] for i in range(0, len(order), 4 * per_job)]
            if max(len({int(p) for f in starts for p in f[job] if p >= 0}) for job in jobs) * share <= 4:
                break
            per_job //= 2
        return per_job

    tight = 4 * page  # 4 slots: a batch's pages fit, 2 workers' jobs of 8 batches (32 samples) do not
    got, jobs, slots = run_pool(batches_per_job="auto", cache_limit=tight)
    assert slots == 4 and jobs == [halved(8, 2, 0), halved(8, 2, 1)] and max(jobs) < 8
    assert_same(expected, got)
    with caplog.at_level("WARNING", logger="ffload.loaders.memory.pagepool"):
        got, jobs, slots = run_pool(batches_per_job=30, cache_limit=tight)  # a job of 30: all 6 pages
    assert jobs == [halved(30, 1, 0), halved(30, 1, 1)] and max(jobs) < 30
    assert_same(expected, got)
    assert "batches_per_job=30: a job of this epoch reads more pages of 2097152 bytes than the 4 that" in caplog.text


def test_most_job_pages_counts_each_page_of_a_job_once_over_its_fields():
    """The page pool's count of a job's pages against sets: jobs of ``length`` consecutive samples
    of the order from ``first`` on (the last one shorter), the pages of every field's payloads
    (-1: none) counted once per job, however many fields or jobs share them."""
    from ffload.loaders.memory.pagepool import most_job_pages

    rng = np.random.default_rng(1)
    for _ in range(200):
        n, fields, npages = int(rng.integers(1, 40)), int(rng.integers(1, 4)), int(rng.integers(1, 9))
        pages = np.where(rng.random((fields, n)) < 0.2, -1, rng.integers(0, npages, (fields, n))).astype(np.int64)
        order = rng.integers(0, n, int(rng.integers(1, 60))).astype(np.int64)
        first, length = int(rng.integers(0, order.size)), int(rng.integers(1, 12))
        jobs = [order[i : i + length] for i in range(first, order.size, length)]
        want = max(len({int(p) for p in pages[:, job].ravel() if p >= 0}) for job in jobs)
        assert most_job_pages(order, first, length, pages, np.full(npages, -1, np.int64)) == want


def test_process_cache_jobs_fit_every_workers_job_in_half_the_cache(tmp_path, digits, monkeypatch):
    """os_cache=False on a .beton: jobs of several batches give the batches of one batch per job
    on the mapped file, bit for bit, also when the cache is smaller than the data (blocks are
    evicted and read again, the limit holds); a job is only as large as lets every worker's job
    fit in half of ``cache_limit`` (auto: capped; asked for: refused, naming the limit)."""
    monkeypatch.setattr(loader_module, "available_cpus", lambda: 2)  # 2 workers on any machine
    images, labels = digits
    large = np.kron(images, np.ones((1, 12, 12, 1), np.uint8))  # 96 x 96: payloads of several blocks
    path = write_digits(tmp_path / "digits.beton", large, labels)
    view = open_dataset(path)
    kw = dict(batch_size=4, num_workers=2, order="random", seed=5)
    expected = run(path, batches_per_job=1, **kw)
    payloads = payload_columns(view, ["image"])
    per_batch = worst_batch_bytes(payloads, 4, cache_block(payloads, view.data_size))
    small = 2 * 2 * 3 * per_batch  # room for 2 workers' jobs of 3 batches in its half
    assert small < int(view.sizes["image"].sum())
    for limit, per_job in ((None, 3), (None, "auto"), (small, 3), (small, "auto")):
        with ffload.Loader(
            path, pipelines=augmenting(), os_cache=False, cache_limit=limit, batches_per_job=per_job, **kw
        ) as loader:
            assert isinstance(loader._memory, ProcessCacheMemory) and loader.batches_per_job >= 3
            got = [tuple(t.clone() for t in batch) for _ in range(2) for batch in loader]
            assert loader._memory.peak_resident_bytes <= loader.cache_limit
            if limit is not None:
                assert loader._memory.bytes_read > int(view.sizes["image"].sum())  # evicted and read again
        assert_same(expected, got)
    tight = 2 * 2 * per_batch  # 2 workers' jobs of one batch fill half of it
    with ffload.Loader(path, pipelines=augmenting(), os_cache=False, cache_limit=tight, **kw) as loader:
        assert loader.batches_per_job == 1
    with pytest.raises(
        ConfigurationError, match=f"batches_per_job=4 is more than a job can hold here \\(3\\).*cache_limit={small}"
    ):
        ffload.Loader(path, pipelines=augmenting(), os_cache=False, cache_limit=small, batches_per_job=4, **kw)
    with pytest.raises(
        ConfigurationError, match=f"needs one batch per job here: os_cache=False pins .*cache_limit={tight}"
    ):
        ffload.Loader(path, pipelines=augmenting(), os_cache=False, cache_limit=tight, batches_per_job=2, **kw)


def test_the_tuner_counts_jobs_and_reports_batches():
    """A fixed ``batches_ahead`` is rounded up to whole jobs; stats and state are in batches, and a
    saved state restores the same depth."""
    tuner = AutoTuner(max_workers=4, max_ahead=10, workers=1, batches_ahead=7, batches_per_job=3)
    assert tuner.ahead == 3  # ceil(7 / 3) jobs
    assert tuner.stats()["batches_ahead"] == 9 and tuner.stats()["batches_per_job"] == 3
    auto = AutoTuner(max_workers=4, max_ahead=10, batches_per_job=3)
    auto.workers, auto._extra = 2, 2
    state = auto.state()
    assert state == {"num_workers": 2, "batches_ahead": 12}
    again = AutoTuner(max_workers=4, max_ahead=10, batches_per_job=3)
    again.restore(state)
    assert (again.workers, again.ahead) == (2, 4)
    auto.close()
    again.close()
