"""Multi-process side of the ResNet-9 recipe (:mod:`ffload.recipes.cifar10_resnet9`): joining
the ``torch.distributed`` process group that ``torchrun`` (or Ray Train) prepares, the rank's
device, and the collectives the training loop needs (metric sums, BatchNorm statistics).

With one process nothing here runs: :func:`global_sum` returns its argument unchanged when no
process group is initialised.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import TypeVar

import torch
import torch.distributed as dist

from ffload.errors import RecipeError

__all__ = ["ProcessGroup", "join_process_group", "global_sum", "global_mean", "broadcast_buffers"]

T = TypeVar("T")

# torchrun's environment (the ``env://`` rendezvous of torch.distributed.init_process_group)
_TORCHRUN_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class ProcessGroup:
    """This process's place in the training job.

    Attributes:
        rank: global rank, ``0 <= rank < world_size``; rank 0 writes the reports.
        local_rank: rank on this node (torchrun's ``LOCAL_RANK``): picks the CUDA device and,
            at 0, converts the data for the node.
        world_size: number of training processes.
        device: this rank's training device (``cuda:<local_rank>`` on CUDA).
        owned: the group was initialised here (and :meth:`close` destroys it); False when the
            caller (Ray Train, a test) had initialised it.
    """

    rank: int
    local_rank: int
    world_size: int
    device: torch.device
    owned: bool

    def local_zero_first(self, fn: Callable[[], T]) -> T:
        """``fn()`` on local rank 0 first, then on the node's other ranks (a barrier between):
        the first call converts the data into the cache, the later ones find it there."""
        if self.local_rank != 0:
            dist.barrier()
        result = fn()
        if self.local_rank == 0:
            dist.barrier()
        return result

    def close(self, wait_for_peers: bool = True) -> None:
        """Destroy the process group if this object initialised it.

        With ``wait_for_peers`` (the end of a run), first wait in a barrier until every rank
        has got here. A rank that exited straight after its last collective could otherwise
        abort in interpreter shutdown ("terminate called without an active exception", SIGABRT):
        ``DistributedDataParallel`` keeps the gloo process group, and so its worker threads,
        alive past ``destroy_process_group()``, and a worker that drops the last reference to a
        collective's tensor after shutdown began must take the GIL, which then ends the thread
        through a ``noexcept`` frame. Past the barrier every rank's tensor collectives are long
        complete; the barrier itself holds no Python tensor. Without it (a rank that failed),
        the group is destroyed at once: the other ranks may never reach a barrier.
        """
        if self.owned and dist.is_initialized():
            if wait_for_peers:
                dist.barrier()
            dist.destroy_process_group()


def join_process_group(device: torch.device, timeout_s: float = 600.0) -> ProcessGroup:
    """Join the job's process group: the one already initialised (Ray Train's ``TorchTrainer``
    does it before the training function runs), or a new one from torchrun's environment
    variables (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``) with
    the ``nccl`` backend on CUDA and ``gloo`` on CPU.

    Args:
        device: the device :func:`ffload.recipes.training.resolve_device` chose; on CUDA the rank
            trains on ``cuda:<LOCAL_RANK>`` instead (one GPU per process, as torchrun expects).
        timeout_s: seconds a collective may wait for the other ranks before failing.

    Raises:
        RecipeError: no process group and no torchrun environment (names the missing
            variables), or fewer CUDA devices than local ranks.
    """
    owned = not dist.is_initialized()
    if owned:
        missing = [name for name in _TORCHRUN_VARS if name not in os.environ]
        if missing:
            raise RecipeError(
                f"--distributed needs the environment torchrun sets ({', '.join(missing)} "
                f"missing): launch with `torchrun --nproc_per_node=N -m "
                f"ffload.recipes.cifar10_resnet9 ... --distributed`"
            )
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if device.type == "cuda":
        if local_rank >= torch.cuda.device_count():
            raise RecipeError(
                f"local rank {local_rank} has no CUDA device: this node has "
                f"{torch.cuda.device_count()}; use --nproc_per_node <= that"
            )
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    if owned:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", timeout=timedelta(seconds=timeout_s))
    return ProcessGroup(dist.get_rank(), local_rank, dist.get_world_size(), device, owned)


def global_sum(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` summed over the ranks (in place, ``all_reduce``) when a process group is
    initialised; ``tensor`` itself otherwise. Every rank must call it, in the same order."""
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(tensor)
    return tensor


def global_mean(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` averaged over the ranks (see :func:`global_sum`); ``tensor`` itself with one
    process. Floating-point tensors only."""
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(tensor)
        tensor /= dist.get_world_size()
    return tensor


def broadcast_buffers(module: torch.nn.Module) -> None:
    """Copy rank 0's buffers (BatchNorm running statistics) to every rank, as
    ``DistributedDataParallel(broadcast_buffers=True)`` does before each training forward, so
    that all ranks evaluate the same model."""
    for buffer in module.buffers():
        dist.broadcast(buffer, src=0)
