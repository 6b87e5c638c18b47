"""Loader benchmark: ffload's ``Loader`` against ffcv's ``Loader``, two PyTorch ``DataLoader``
baselines and the measured JPEG decode ceiling, on the same file and pipeline
(``ffload bench PATH``).

Loader kinds (:data:`KINDS`), each measured in a fresh subprocess (:func:`measure`), so that
imports, JIT compilation, threads and memory of one measurement do not leak into the next:

* ``ffload``: ``ffload.Loader`` with ``[decoder, RandomHorizontalFlip(), ToTensor(),
  ToTorchImage()]`` for the image field and ``[IntDecoder(), ToTensor()]`` for the label.
* ``ffcv``: ``ffcv.loader.Loader`` with ffcv's classes of the same names, on the same ``.beton``.
* ``dataloader_arrays``: ``torch.utils.data.DataLoader`` over the dataset's images decoded once
  into one in-memory ``(N, H, W, 3) uint8`` array (a ``TensorDataset``-like dataset with a
  per-sample flip); ``simple`` pipeline only.
* ``dataloader_pil``: ``DataLoader`` over the source ImageFolder: PIL decode
  (``convert('RGB')``, torchvision's ``pil_loader``), a per-sample crop (torchvision's
  ``RandomResizedCrop`` rule for ``rrc``, FFCV's centre-crop box for ``center``) resized with
  PIL's antialiased bilinear filter (torchvision's ``resized_crop`` on PIL images), flip with
  probability 0.5, ``uint8`` HWC tensors (torchvision's ``PILToTensor`` without the transpose).
* ``decode_ceiling``: the dataset's JPEG payloads, held in memory, decoded at full size by the
  fastest decoder available (TurboJPEG into a reused buffer, else ``cv2.imdecode``;
  :func:`ffload.bench.peers.ceiling.default_decoder`),
  measured twice in the same process: by ``num_workers`` threads at once (the row's ``img_s``,
  the ceiling the ratios use) and by one thread (the row ``<name> (1 thread)``).

All loaders use ``order=RANDOM``, ``os_cache=True`` (ffload/ffcv), ``drop_last=False``
(explicit: ffcv's default is True), ``batches_ahead=3`` and the same ``batch_size`` and
``num_workers`` (threads for ffload/ffcv, worker processes for ``DataLoader``). Batches are
consumed and dropped (nothing is trained). What one measurement reports:
:class:`~ffload.bench.measurement.Measurement`. Rounds (:func:`run_rounds`) interleave the
kinds (ffload, ffcv, dataloader, ffload, ...) so that machine noise hits all alike;
:func:`summarize` takes medians over rounds and :func:`compute_ratios` divides medians of the
same invocation. Every report records its conditions (:func:`measurement_conditions`).

Modules, the harness of ``ffload bench`` first:

* ``cli``: the command.
* ``plan``: what one invocation measures (dataset, pipeline, configs).
* ``config``: :class:`BenchConfig`, the loader kinds and the pipelines.
* ``pipelines``: the operation lists every loader runs, the PIL baseline's crop boxes.
* ``harness``: a subprocess per measurement, interleaved rounds.
* ``worker``: the measurement subprocess' entry.
* ``runners``: one measurement in-process (the ffload ``Loader``, dispatch to the peers).
* ``measurement``: result types, the epoch clock, RSS.
* ``summary``: medians over rounds, ratios.
* ``report``: markdown tables, the plot, the results files.
* ``conditions``: versions, git commit, CPUs, device.
* ``datasets``: the ImageNet-sized photo folder and CIFAR-sized crops the bench scripts build.
* ``peers/baselines``: ffcv's ``Loader`` and the ``DataLoader`` baselines.
* ``peers/ceiling``: the measured JPEG decode ceiling and its decoders.
"""

from __future__ import annotations

from .cli import bench_command
from .conditions import format_conditions, measurement_conditions
from .config import CENTER_RATIO, DEFAULT_BATCH_SIZE, KINDS, PIPELINES, BenchConfig
from .harness import measure, run_rounds
from .measurement import Measurement
from .peers.baselines import ArrayImages, PILImageFolder
from .peers.ceiling import DECODERS, measure_decode_ceiling
from .pipelines import center_box, rrc_box
from .plan import choose_pipeline, describe_dataset, ffcv_available, plan_configs
from .report import format_ratios, format_rows, plot_throughput, write_results
from .runners import run_worker
from .summary import RATIO_PAIRS, compute_ratios, summarize

__all__ = [
    "ArrayImages",
    "BenchConfig",
    "CENTER_RATIO",
    "DECODERS",
    "DEFAULT_BATCH_SIZE",
    "KINDS",
    "Measurement",
    "PILImageFolder",
    "PIPELINES",
    "RATIO_PAIRS",
    "bench_command",
    "center_box",
    "choose_pipeline",
    "compute_ratios",
    "describe_dataset",
    "ffcv_available",
    "format_conditions",
    "format_ratios",
    "format_rows",
    "measure",
    "measure_decode_ceiling",
    "measurement_conditions",
    "plan_configs",
    "plot_throughput",
    "rrc_box",
    "run_rounds",
    "run_worker",
    "summarize",
    "write_results",
]
