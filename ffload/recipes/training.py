"""Training side of the ResNet-9 recipe (:mod:`ffload.recipes.cifar10_resnet9`): its
hyperparameters, FFCV's triangular learning-rate schedule, the training loop with data-wait
timing, test-time-augmented evaluation and the choice of device.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

import numpy as np
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ffload.errors import ConfigurationError
from ffload.recipes.config import RecipeConfig
from ffload.recipes.data import RecipeError
from ffload.recipes.distributed import broadcast_buffers, global_mean, global_sum
from ffload.recipes.report import EpochStats

__all__ = ["RecipeConfig", "lr_schedule", "evaluate", "train_model", "resolve_device"]


# --------------------------------------------------------------------------- training


def lr_schedule(config: RecipeConfig, iters_per_epoch: int) -> np.ndarray:
    """Per-iteration learning-rate multipliers, ``(epochs * iters_per_epoch,) float64``: linear
    from 0 at iteration 0 to 1 at ``peak * iters_per_epoch`` and back to 0 at the end (FFCV's
    ``np.interp`` triangle), with ``peak = lr_peak_epoch * min(1, epochs / 24)``: FFCV's peak
    for runs of 24 epochs or more, the same fraction of the run for shorter ones.

    Raises:
        ffload.errors.ConfigurationError: ``peak`` not in ``(0, epochs]``.
    """
    peak_epoch = config.lr_peak_epoch * min(1.0, config.epochs / 24)
    if not 0 < peak_epoch <= config.epochs:
        raise ConfigurationError(
            f"lr_peak_epoch={config.lr_peak_epoch} puts the learning-rate peak at "
            f"epoch {peak_epoch:g}, outside (0, epochs={config.epochs}]"
        )
    total = config.epochs * iters_per_epoch
    return np.interp(np.arange(total), [0, peak_epoch * iters_per_epoch, total], [0.0, 1.0, 0.0])


class _WaitClock:
    """Seconds the training loop waits for batches.

    CPU: wall time inside ``iter()`` and ``next()`` of the loader. CUDA: the device's idle time
    between finishing the work queued before those calls and the batch being usable on the
    current stream, from two CUDA events around each call; this counts time the host spent
    blocked in the loader while the device had nothing queued, and any wait of the stream on
    the (non_blocking) copy, but not host time in the loader that overlapped queued device work
    (that costs nothing).
    """

    def __init__(self, device: torch.device):
        self.stream = torch.cuda.current_stream(device) if device.type == "cuda" else None
        self.host = 0.0
        self.events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []

    def call(self, fn, arg):
        """``fn(arg)`` (``iter``/``next`` on the loader), timed."""
        if self.stream is not None:
            before = torch.cuda.Event(enable_timing=True)
            before.record(self.stream)
        t0 = time.perf_counter()
        try:
            return fn(arg)
        finally:
            self.host += time.perf_counter() - t0
            if self.stream is not None:
                after = torch.cuda.Event(enable_timing=True)
                after.record(self.stream)
                self.events.append((before, after))

    def seconds(self) -> float:
        """The epoch's total wait (call after synchronising the device)."""
        if self.stream is not None:
            return sum(b.elapsed_time(a) for b, a in self.events) / 1000.0
        return self.host


def evaluate(model: nn.Module, loader: Iterable, device: torch.device, tta: bool = True) -> float:
    """Fraction of ``loader``'s samples whose argmax logit equals the label; with ``tta`` the
    logits of the batch and its horizontal mirror (``torch.flip(x, dims=[3])``, the width of
    NCHW) are summed first. ``loader`` yields ``(images (B, 3, H, W), labels (B,))``.

    Under ``torch.distributed`` each rank evaluates its own share of the test set (its loader's
    samples) and the counts are summed over the ranks: pass the bare module, not the
    ``DistributedDataParallel`` wrapper (whose forward is a collective the shares' different
    batch counts would desynchronise)."""
    model.eval()
    correct = torch.zeros((), dtype=torch.int64, device=device)
    total = 0
    with torch.no_grad(), torch.autocast(device.type, dtype=torch.float16, enabled=device.type == "cuda"):
        for images, labels in loader:
            out = model(images)
            if tta:
                out = out + model(torch.flip(images, dims=[3]))
            correct += (out.argmax(1) == labels).sum()
            total += labels.shape[0]
    counts = global_sum(torch.stack([correct, torch.tensor(total, device=device)]))
    return counts[0].item() / max(counts[1].item(), 1)


def train_model(
    model: nn.Module,
    train_loader,
    test_loader,
    config: RecipeConfig,
    device: torch.device,
    on_epoch: Callable[[EpochStats], None] | None = None,
) -> tuple[list[EpochStats], list[float]]:
    """Train ``model`` with the recipe's optimiser and schedule, evaluating after every epoch.

    Under ``torch.distributed`` (``model`` wrapped in ``DistributedDataParallel``, each rank's
    ``train_loader`` yielding its share of every epoch, the same number of batches on every
    rank) the losses are averaged and the accuracies and images/s summed over the ranks, and
    every rank evaluates rank 0's BatchNorm statistics on its share of the test set.

    Args:
        model: on ``device`` (channels_last on CUDA), possibly in ``DistributedDataParallel``.
        train_loader, test_loader: re-iterable, ``len()`` = batches per epoch, yielding
            ``(images (B, 3, H, W) float, labels (B,) int64)`` on ``device`` (ffload loaders from
            :func:`ffload.recipes.data.make_loaders` or
            :class:`ffload.recipes.vanilla.VanillaLoader`).
        config: hyperparameters.
        device: the training device; on CUDA the step runs under fp16 autocast with a
            ``GradScaler``.
        on_epoch: called with each epoch's :class:`EpochStats` as soon as it is measured.

    Returns:
        ``(rows, iteration_losses)``: one :class:`EpochStats` per epoch and the training loss of
        every step (floats, in order).

    Raises:
        ffload.errors.ConfigurationError: the training loader yields no batch per epoch (fewer samples than
            ``batch_size``).
    """
    iters = len(train_loader)
    if iters == 0:
        raise ConfigurationError(
            f"the training set has fewer samples than batch_size={config.batch_size}: no full batch per epoch"
        )
    schedule = lr_schedule(config, iters)
    opt = torch.optim.SGD(
        model.parameters(),
        lr=config.lr * config.batch_size / 512,
        momentum=config.momentum,
        nesterov=config.nesterov,
        weight_decay=config.weight_decay,
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: schedule[min(step, len(schedule) - 1)])
    cuda = device.type == "cuda"
    if cuda:
        torch.backends.cudnn.benchmark = True  # fixed input shapes: let cuDNN pick its kernels
    scaler = torch.amp.GradScaler("cuda", enabled=cuda)
    loss_fn = nn.CrossEntropyLoss(label_smoothing=config.label_smoothing)
    rows: list[EpochStats] = []
    all_losses: list[float] = []
    train_total = 0.0
    for epoch in range(config.epochs):
        model.train()
        clock = _WaitClock(device)
        losses, correct, seen = [], torch.zeros((), dtype=torch.int64, device=device), 0
        _sync(device)
        t0 = time.perf_counter()
        iterator = clock.call(iter, train_loader)
        while True:
            try:
                images, labels = clock.call(next, iterator)
            except StopIteration:
                break
            opt.zero_grad(set_to_none=True)
            with torch.autocast(device.type, dtype=torch.float16, enabled=cuda):
                out = model(images)
                loss = loss_fn(out, labels)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            scheduler.step()
            losses.append(loss.detach())
            correct += (out.detach().argmax(1) == labels).sum()
            seen += labels.shape[0]
        _sync(device)
        epoch_seconds = time.perf_counter() - t0
        wait = clock.seconds()
        epoch_losses = global_mean(torch.stack(losses).float()).cpu().tolist()
        counts = global_sum(torch.stack([correct, torch.tensor(seen, device=device)]))
        correct, seen = counts[0], int(counts[1].item())
        all_losses.extend(epoch_losses)
        train_total += epoch_seconds
        t1 = time.perf_counter()
        bare = model
        if isinstance(model, DistributedDataParallel):
            bare = model.module
            broadcast_buffers(bare)
        test_acc = evaluate(bare, test_loader, device, config.tta)
        row = EpochStats(
            epoch=epoch,
            train_loss=float(np.mean(epoch_losses)),
            train_accuracy=correct.item() / seen,
            test_accuracy=test_acc,
            epoch_seconds=epoch_seconds,
            eval_seconds=time.perf_counter() - t1,
            images_per_second=seen / epoch_seconds,
            data_wait_seconds=wait,
            data_wait_fraction=wait / epoch_seconds,
            train_seconds_total=train_total,
        )
        rows.append(row)
        if on_epoch is not None:
            on_epoch(row)
    return rows, all_losses


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# --------------------------------------------------------------------------- device


def resolve_device(name: str | None) -> torch.device:
    """``'cuda'`` / ``'cpu'`` / ``'cuda:N'`` / ``None`` (CUDA when available, else CPU) as a
    ``torch.device``; CUDA devices get an explicit index (``'cuda'`` is the current device).

    Raises:
        RecipeError: CUDA asked for but not available, or an unknown device name.
    """
    if name is None:
        name = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(name)
    except RuntimeError as e:
        raise RecipeError(f"--device {name}: {e}") from e
    if device.type not in ("cuda", "cpu"):
        raise RecipeError(f"--device {name}: only cuda and cpu are supported")
    if device.type == "cpu":
        return device
    if not torch.cuda.is_available():
        raise RecipeError(
            f"--device {name}: CUDA is not available on this machine (torch {torch.__version__}); use --device cpu"
        )
    index = torch.cuda.current_device() if device.index is None else device.index
    if index >= torch.cuda.device_count():
        raise RecipeError(f"--device {name}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return torch.device("cuda", index)
