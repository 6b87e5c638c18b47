"""The ResNet-9 recipe and the Loader under ``torchrun --nproc_per_node=2`` (gloo, CPU, loopback).

The dataset is an ImageFolder with one image per class, so a sample's label is its index: the
labels each rank's training loop receives say exactly which samples it saw. The expected shares
come from ``torch.utils.data.DistributedSampler`` itself, applied to the single-process epoch
order. Each launch runs under a wall-clock limit and its whole process group is killed on
expiry, so a hung rank fails the test instead of hanging the suite; torchrun ends every rank
when one dies (checked too).

This file is also the program torchrun starts (``python -m torch.distributed.run ... this_file
MODE ...``, see ``_worker``), and the driver of the Ray Train test (which runs only where Ray
Train is installed).
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch.utils.data import DistributedSampler

import ffload
from ffload.formats import open_dataset

WORLD = 2
N = 45  # samples per split: not divisible by the world size
GLOBAL_BATCH = 8  # the recipe's --batch-size: 4 per rank
RANK_BATCH = GLOBAL_BATCH // WORLD
EPOCHS = 2
SEED = 3
LAUNCH_TIMEOUT_S = 300
ROOT = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------- launching


def _torchrun(*args: str, timeout: float = LAUNCH_TIMEOUT_S) -> tuple[int, str]:
    """Run this file under torchrun with WORLD local processes on the loopback interface;
    ``(exit status, stdout + stderr)``. Fails the test when the launch exceeds ``timeout``
    seconds (after killing torchrun and every rank)."""
    env = {
        **os.environ,
        "GLOO_SOCKET_IFNAME": "lo",
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={WORLD}",
        "--max-restarts=0",
        "--monitor-interval=0.5",
        __file__,
        *map(str, args),
    ]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True
    )
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        pytest.fail(f"torchrun {' '.join(args)} did not finish in {timeout} s:\n{output[-4000:]}")
    return proc.returncode, output


def _expected_share(order: np.ndarray, rank: int, drop_last: bool) -> np.ndarray:
    """Rank ``rank``'s samples of an epoch whose global order is ``order``: the positions
    ``DistributedSampler(shuffle=False)`` gives that rank, looked up in ``order``."""
    sampler = DistributedSampler(range(len(order)), num_replicas=WORLD, rank=rank, shuffle=False, drop_last=drop_last)
    return order[list(sampler)]


@pytest.fixture(scope="module")
def index_folder(tmp_path_factory) -> Path:
    """``train/`` and ``test/`` with N classes of one 32x32 PNG each: label == sample index."""
    root = tmp_path_factory.mktemp("index-folder")
    rng = np.random.default_rng(0)
    for split in ("train", "test"):
        for i in range(N):
            folder = root / split / f"c{i:03d}"
            folder.mkdir(parents=True)
            cv2.imwrite(str(folder / "0.png"), rng.integers(0, 256, (32, 32, 3), dtype=np.uint8))
    return root


@pytest.fixture(scope="module")
def recipe_runs(index_folder, tmp_path_factory):
    """The recipe under torchrun twice, with 1 and 2 loader threads per rank (same seed, same
    conversion cache): ``{num_workers: (out folder, torchrun output)}``."""
    tmp = tmp_path_factory.mktemp("recipe")
    runs = {}
    for workers in (1, 2):
        out = tmp / f"run-{workers}"
        rc, output = _torchrun("recipe", index_folder, out, tmp / "cache", workers)
        assert rc == 0, output[-6000:]
        runs[workers] = out, output
    return runs


# --------------------------------------------------------------------------- tests


def test_recipe_ranks_share_each_epoch_disjointly(recipe_runs):
    out, _ = recipe_runs[1]
    metrics = json.loads((out / "metrics.json").read_text())
    train_path = metrics["data"]["train_path"]
    labels = np.asarray(open_dataset(train_path).metadata["label"])
    np.testing.assert_array_equal(labels, np.arange(N))  # what the loop sees is the index
    single = ffload.Loader(
        train_path, batch_size=RANK_BATCH, order="random", seed=SEED, drop_last=True, pipelines={"image": None}
    )
    batches = N // WORLD // RANK_BATCH  # 5: drop_last keeps whole batches of the 22 per rank
    for epoch in range(EPOCHS):
        seen = [np.load(out / f"rank{r}-train.npy")[epoch] for r in range(WORLD)]
        assert len(seen[0]) == len(seen[1]) == batches * RANK_BATCH  # same batch count
        assert not set(seen[0]) & set(seen[1])  # disjoint
        order = single.epoch_order(epoch)
        for rank in range(WORLD):
            expected = _expected_share(order, rank, drop_last=True)[: batches * RANK_BATCH]
            np.testing.assert_array_equal(seen[rank], expected)
        # together: the epoch's order, less the tail that drop_last leaves out (< WORLD batches)
        assert set(seen[0]) | set(seen[1]) == set(order[: WORLD * batches * RANK_BATCH])
    single.close()


def test_recipe_evaluates_each_test_sample_once(recipe_runs):
    out, _ = recipe_runs[1]
    for epoch in range(EPOCHS):
        seen = [np.load(out / f"rank{r}-test-{epoch}.npy") for r in range(WORLD)]
        np.testing.assert_array_equal(np.sort(np.concatenate(seen)), np.arange(N))


def test_recipe_reduces_metrics_and_rank0_reports(recipe_runs):
    out, output = recipe_runs[1]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["world_size"] == WORLD
    assert metrics["config"]["batch_size"] == GLOBAL_BATCH
    steps = N // WORLD // RANK_BATCH
    assert len(metrics["iteration_losses"]) == EPOCHS * steps
    for row in metrics["epochs"]:
        # images/s and train accuracy count both ranks' samples
        assert row["images_per_second"] * row["epoch_seconds"] == pytest.approx(WORLD * steps * RANK_BATCH)
        correct = row["train_accuracy"] * WORLD * steps * RANK_BATCH
        assert correct == pytest.approx(round(correct))
        assert row["test_accuracy"] * N == pytest.approx(round(row["test_accuracy"] * N))
    assert output.count("final test accuracy") == 1  # rank 0 alone reports
    assert output.count("wrote ") == 1
    assert (out / "accuracy.png").is_file()


def test_recipe_same_seed_same_run_for_any_num_workers(recipe_runs):
    (out1, _), (out2, _) = recipe_runs[1], recipe_runs[2]
    for rank in range(WORLD):
        np.testing.assert_array_equal(np.load(out1 / f"rank{rank}-train.npy"), np.load(out2 / f"rank{rank}-train.npy"))
    m1, m2 = (json.loads((o / "metrics.json").read_text()) for o in (out1, out2))
    assert m2["data"]["cache_hit"] and m1["num_workers"] == 1 and m2["num_workers"] == 2
    assert m1["iteration_losses"] == m2["iteration_losses"]  # same batches, same augmentation


def test_mid_epoch_checkpoint_resumes_on_two_ranks(recipe_runs, tmp_path):
    out, _ = recipe_runs[1]
    train_path = json.loads((out / "metrics.json").read_text())["data"]["train_path"]
    for phase in ("resume-first", "resume-second"):  # two launches: new processes resume
        rc, output = _torchrun(phase, train_path, tmp_path)
        assert rc == 0, output[-6000:]
    single = ffload.Loader(train_path, batch_size=RANK_BATCH, order="random", seed=SEED, pipelines={"image": None})
    per_rank = -(-N // WORLD)  # 23: padded by one sample, as DistributedSampler pads
    states = [json.loads((tmp_path / f"state{rank}.json").read_text()) for rank in range(WORLD)]
    assert states[0] == states[1]  # one checkpoint (rank 0's) serves every rank
    assert states[0]["epoch"] == 1 and states[0]["batches_yielded"] == 3
    assert states[0]["world_size"] == WORLD
    for rank in range(WORLD):
        first = np.load(tmp_path / f"first{rank}.npy")
        before, after = first[per_rank:], np.load(tmp_path / f"second{rank}.npy")
        assert len(before) == 3 * RANK_BATCH
        epochs = [
            first[:per_rank],
            np.concatenate([before, after[: per_rank - len(before)]]),
            after[per_rank - len(before) :],
        ]
        for epoch, seen in enumerate(epochs):  # nothing repeated, nothing skipped
            np.testing.assert_array_equal(seen, _expected_share(single.epoch_order(epoch), rank, drop_last=False))
    single.close()


def test_closing_the_group_waits_for_every_rank(tmp_path):
    # a rank leaving straight after its last collective could abort in interpreter shutdown
    # (ProcessGroup.close); rank 0 is slow here, and rank 1 must not pass close() before it
    rc, output = _torchrun("close", tmp_path, timeout=120)
    assert rc == 0, output[-6000:]
    assert (tmp_path / "rank1-closed").read_text() == "rank 0 had finished"


def test_a_dying_rank_ends_the_launch():
    rc, output = _torchrun("die", timeout=120)  # fails the test if rank 0 is left waiting
    assert rc != 0
    assert "exitcode" in output or "ChildFailedError" in output, output[-3000:]


@pytest.mark.skipif(
    importlib.util.find_spec("ray") is None, reason="Ray Train is not installed (pip install 'ray[train]')"
)
def test_ray_train_torchtrainer_runs_the_recipe(index_folder, tmp_path):
    # Ray Train initialises the process group itself; the recipe joins it (docs/distributed.md)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    try:
        proc = subprocess.run(
            [sys.executable, __file__, "ray", index_folder, tmp_path],
            env=env,
            capture_output=True,
            text=True,
            timeout=LAUNCH_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"the Ray Train run did not finish in {LAUNCH_TIMEOUT_S} s: {e.output}")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["world_size"] == WORLD
    steps = N // WORLD // RANK_BATCH
    assert len(metrics["iteration_losses"]) == steps
    assert metrics["epochs"][0]["images_per_second"] * metrics["epochs"][0]["epoch_seconds"] == pytest.approx(
        WORLD * steps * RANK_BATCH
    )


# --------------------------------------------------------------------------- torchrun side


class _Recorder:
    """A recipe loader that keeps the labels (here: sample indices) of every batch it yields."""

    def __init__(self, loader):
        self.loader = loader
        self.epochs: list[list[np.ndarray]] = []

    def __len__(self) -> int:
        return len(self.loader)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.loader.close()

    def __iter__(self):
        batches: list[np.ndarray] = []
        self.epochs.append(batches)
        for images, labels in self.loader:
            batches.append(labels.numpy().copy())
            yield images, labels


def _run_recipe(data: str, out: str, cache: str, workers: str) -> None:
    """The recipe's command line with ``--distributed``, its loaders wrapped in recorders."""
    from ffload.recipes import run as recipe
    from ffload.recipes.cifar10_resnet9 import recipe_command

    recorders = []
    make_loaders = recipe.make_loaders

    def recording_loaders(*args, **kwargs):
        recorders[:] = [_Recorder(loader) for loader in make_loaders(*args, **kwargs)]
        return tuple(recorders)

    recipe.make_loaders = recording_loaders
    args = [
        "--data",
        data,
        "--out",
        out,
        "--cache-dir",
        cache,
        "--num-workers",
        workers,
        "--epochs",
        EPOCHS,
        "--batch-size",
        GLOBAL_BATCH,
        "--width",
        0.25,
        "--seed",
        SEED,
        "--device",
        "cpu",
        "--no-progress",
        "--distributed",
    ]
    recipe_command.main(args=list(map(str, args)), standalone_mode=False)
    rank = int(os.environ["RANK"])
    train, test = recorders
    np.save(Path(out) / f"rank{rank}-train.npy", np.stack([np.concatenate(e) for e in train.epochs]))
    for epoch, batches in enumerate(test.epochs):
        np.save(Path(out) / f"rank{rank}-test-{epoch}.npy", np.concatenate(batches))


def _resume(phase: str, path: str, out: str) -> None:
    """Phase ``first``: epoch 0, then 3 batches of epoch 1 and ``state_dict()`` saved as JSON.
    Phase ``second``: a new loader, ``load_state_dict()``, the rest of epoch 1 and epoch 2.
    Every step is a collective (as a DDP step is): unequal batch counts would hang."""
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    loader = ffload.Loader(
        path,
        batch_size=RANK_BATCH,
        order="random",
        seed=SEED,
        distributed=True,
        drop_last=False,
        num_workers=1,
        pipelines={"image": None},
    )
    seen = []

    def step(batch):
        dist.all_reduce(torch.ones(1))
        seen.append(batch[0].numpy().copy())

    state_file = Path(out) / f"state{rank}.json"
    if phase == "first":
        for batch in loader:
            step(batch)
        iterator = iter(loader)  # stays referenced: state_dict() reads the live iterator
        for _, batch in zip(range(3), iterator):
            step(batch)
        state_file.write_text(json.dumps(loader.state_dict()))
    else:
        loader.load_state_dict(json.loads(state_file.read_text()))
        for _ in range(2):
            for batch in loader:
                step(batch)
    np.save(Path(out) / f"{phase}{rank}.npy", np.concatenate(seen))
    loader.close()
    dist.destroy_process_group()


def _close(out: str) -> None:
    """Both ranks end through ``ProcessGroup.close()``; rank 0 gets there late, after writing
    ``rank0-done``; rank 1 records whether that file existed once its ``close()`` returned."""
    from ffload.recipes.distributed import join_process_group

    group = join_process_group(torch.device("cpu"))
    done = Path(out) / "rank0-done"
    if group.rank == 0:
        time.sleep(1.0)
        done.write_text("")
    group.close()
    if group.rank == 1:
        (Path(out) / "rank1-closed").write_text("rank 0 had finished" if done.exists() else "rank 0 had not finished")


def _die() -> None:
    """Rank 1 dies after joining; rank 0 waits for it in a barrier (torchrun must end it)."""
    dist.init_process_group("gloo")
    if dist.get_rank() == 1:
        os._exit(3)
    dist.barrier()


def _ray_train(data: str, out: str) -> None:
    """Ray Train's ``TorchTrainer`` with 2 CPU workers (a local Ray instance of 2 CPUs), each
    running the recipe with ``distributed=True`` in the process group Ray sets up."""
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    def train_fn(config):
        from ffload.recipes.run import run_recipe
        from ffload.recipes.training import RecipeConfig

        run_recipe(
            config["data"],
            config["out"],
            RecipeConfig(epochs=1, batch_size=GLOBAL_BATCH, width=0.25, seed=SEED),
            device="cpu",
            num_workers=1,
            cache_dir=config["cache"],
            progress=False,
            distributed=True,
        )

    ray.init(
        num_cpus=WORLD,
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        runtime_env={"env_vars": {"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}},
    )
    try:
        config = {"data": data, "out": f"{out}/run", "cache": f"{out}/cache"}
        TorchTrainer(
            train_fn,
            train_loop_config=config,
            scaling_config=ScalingConfig(num_workers=WORLD, use_gpu=False, resources_per_worker={"CPU": 1}),
            run_config=RunConfig(storage_path=f"{out}/ray", name="recipe"),
        ).fit()
    finally:
        ray.shutdown()


def _worker(argv: list[str]) -> None:
    mode, *args = argv
    if mode == "recipe":
        _run_recipe(*args)
    elif mode.startswith("resume-"):
        _resume(mode.removeprefix("resume-"), *args)
    elif mode == "close":
        _close(*args)
    elif mode == "die":
        _die()
    elif mode == "ray":
        _ray_train(*args)
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    _worker(sys.argv[1:])
