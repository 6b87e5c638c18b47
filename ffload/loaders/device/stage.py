"""The device stage of the RGB decoders: a batch whose crop boxes and flips are already drawn (on
the worker thread, by the same kernels as the CPU path) is decoded, cropped, resized and flipped
on a torch device, optionally with a share of its samples decoded by the CPU path at the same time.

Per batch, on the worker thread that runs the batch (inside the loader's per-slot CUDA stream):

1. the payloads are copied out of the dataset region (the loader may evict the region's pages
   once the decoder returns, while the device still reads the copies);
2. the device rows' JPEGs go to the device backend in one call (:mod:`.codecs`); raw images are
   uploaded as they are; then :func:`~.resample.crop_resize` makes the whole batch's output in a
   few kernels;
3. meanwhile the host rows (the hybrid split, :class:`ShareController`) are decoded by
   :func:`ffload.codecs.jpeg.decode_batch` — the CPU decoders' own compiled call, same boxes and
   flips — into a pinned buffer and copied to their rows of the output, asynchronously.

The output is ``(B, H, W, 3) uint8`` on the device, as ``[CPU decoder, ToTensor(), ToDevice(...)]``
would give, within the documented tolerance (the CPU path may decode a large box at half size by
DCT scaling; the device path always decodes full size).
"""

from __future__ import annotations

import collections
import threading
import time

import numpy as np
import torch

from ffload.codecs import jpeg
from ffload.errors import ConfigurationError, FormatError
from ffload.formats.fields.image import RAW
from ffload.loaders.device import codecs
from ffload.loaders.device.resample import crop_resize


def check_share(share: float | str) -> float | str:
    """``share`` if it is ``"auto"`` or a number in ``[0, 1]``.

    Raises:
        ConfigurationError: anything else, naming the value.
    """
    if share != "auto" and not (isinstance(share, (int, float)) and 0.0 <= float(share) <= 1.0):
        raise ConfigurationError(f"device_share must be 'auto' or a number in [0, 1], got {share!r}")
    return share


class ShareController:
    """The share of each batch decoded on the device, from measured rates.

    A batch's host rows (decoded on its worker thread) and device rows (queued on the device,
    behind the other workers' batches) run at the same time, so a batch is ready when the slower
    half is; with per-row times ``c`` (host: the worker's wall time) and ``g`` (device: CUDA event
    time from queueing the device rows to their completion, which includes waiting behind other
    batches when the device is saturated), both halves take equal time at ``s = c / (c + g)``.
    ``c`` and ``g`` are exponential moving averages; device times are read only once their events
    have completed (never waiting for the device). Until both are measured, a first batch puts an
    eighth of its rows on the host and the next one puts all on the device.

    Args:
        share: a fixed share in ``[0, 1]``, or ``"auto"``.
        smoothing: weight of a new measurement in the moving averages.

    Raises:
        ConfigurationError: a share outside ``[0, 1]`` that is not ``"auto"``.
    """

    def __init__(self, share: float | str = "auto", smoothing: float = 0.2):
        self.auto = check_share(share) == "auto"
        self.share = 1.0 if self.auto else float(share)
        self.smoothing = smoothing
        self.host_row_s: float | None = None
        self.device_row_s: float | None = None
        self._lock = threading.Lock()

    def rows(self, batch: int) -> int:
        """How many of ``batch`` rows go to the device now (the first ones of the batch)."""
        with self._lock:
            if self.auto and self.host_row_s is None and batch > 1:
                return batch - max(1, batch // 8)  # a first host measurement
            if self.auto and self.device_row_s is None and batch > 1:
                return batch  # then a device one
            return int(round(self.share * batch))

    def observe(self, host_rows: int, host_s: float, device_rows: int, device_s: float) -> None:
        """Record a batch's measured times (seconds; rows with nothing measured pass 0)."""
        with self._lock:
            if host_rows:
                self.host_row_s = self._average(self.host_row_s, host_s / host_rows)
            if device_rows:
                self.device_row_s = self._average(self.device_row_s, device_s / device_rows)
            if self.auto and self.host_row_s is not None and self.device_row_s is not None:
                self.share = self.host_row_s / (self.host_row_s + self.device_row_s)

    def _average(self, old: float | None, new: float) -> float:
        return new if old is None else old + self.smoothing * (new - old)

    def stats(self) -> dict:
        """``{"device_share", "host_row_ms", "device_row_ms", "auto"}`` for the loader's report."""
        with self._lock:
            return {
                "device_share": self.share,
                "host_row_ms": None if self.host_row_s is None else self.host_row_s * 1e3,
                "device_row_ms": None if self.device_row_s is None else self.device_row_s * 1e3,
                "auto": self.auto,
            }


class DeviceImageStage:
    """Decode, crop, resize and flip RGB image batches on ``device`` (see the module docstring).

    Args:
        device: a torch device (``"cuda"``, ``"cuda:1"``, or ``"cpu"`` for tests).
        backend: device JPEG backend, :data:`~.codecs.BACKENDS` or ``"auto"`` (:func:`~.codecs.select`).
        device_share: share of each batch decoded on the device, in ``[0, 1]``, or ``"auto"``
            (:class:`ShareController`); the rest is decoded by the CPU path on the worker thread.
        fast_dct: the CPU path's fast IDCT for the host rows (see the CPU decoders).

    Raises:
        ConfigurationError / UnavailableError: from :func:`~.codecs.select` and
            :class:`ShareController`.
    """

    def __init__(self, device, backend: str = "auto", device_share: float | str = 1.0, fast_dct: bool = False):
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.backend = codecs.select(self.device, backend)
        self.controller = ShareController(device_share)
        self.fast_dct = fast_dct
        self._keep: collections.deque = collections.deque()  # (event, payloads) until the device is done
        self._keep_lock = threading.Lock()
        self._timings: collections.deque = collections.deque()  # (start, end, rows) CUDA events
        self._phases = {"copy": 0.0, "decode": 0.0, "resample": 0.0, "host": 0.0}  # worker seconds
        self._rows = {"device": 0, "host": 0}

    def __call__(self, indices, metadata, ptrs, sizes, region, boxes, flips, out_hw) -> torch.Tensor:
        """Decode one batch.

        Args:
            indices: ``(B,) int64`` sample ids; metadata: the field's ``(N,)`` structured column
                (``mode``, ``height``, ``width``); ptrs, sizes: ``(N,) uint64`` payload offsets
                into ``region`` and sizes (bytes); region: ``(n,) uint8``.
            boxes: ``(B, 4) int64`` ``(top, left, height, width)`` crop boxes, stored pixels.
            flips: ``(B,) bool`` mirror left-right.
            out_hw: ``(out_h, out_w)`` pixels.

        Returns:
            ``(B, out_h, out_w, 3) uint8`` on the device.

        Raises:
            FormatError: a payload neither backend decodes, naming the sample.
        """
        batch = len(indices)
        out = torch.empty((batch, out_hw[0], out_hw[1], 3), dtype=torch.uint8, device=self.device)
        n_dev = self.controller.rows(batch)
        cuda = self.device.type == "cuda"
        self._reap()
        t0 = time.perf_counter()
        payloads = [np.array(region[int(ptrs[s]) : int(ptrs[s]) + int(sizes[s])]) for s in indices[:n_dev]]
        start = torch.cuda.Event(enable_timing=True) if cuda else None
        if start is not None:
            start.record()
        t1 = time.perf_counter()
        decode_s = self._device_rows(indices[:n_dev], metadata, payloads, boxes[:n_dev], flips[:n_dev], out[:n_dev])
        device_s = time.perf_counter() - t1
        mid = torch.cuda.Event(enable_timing=True) if cuda else None
        if mid is not None:
            mid.record()
        host_s = 0.0
        if n_dev < batch:
            t1 = time.perf_counter()
            self._host_rows(indices[n_dev:], metadata, ptrs, sizes, region, boxes[n_dev:], flips[n_dev:], out[n_dev:])
            host_s = time.perf_counter() - t1
        with self._keep_lock:
            phases, rows = self._phases, self._rows
            phases["copy"] += t1 - t0
            phases["decode"] += decode_s
            phases["resample"] += device_s - decode_s
            phases["host"] += host_s
            rows["device"] += n_dev
            rows["host"] += batch - n_dev
        if cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            with self._keep_lock:
                self._keep.append((end, payloads))
                if n_dev:
                    self._timings.append((start, mid, n_dev))
            self.controller.observe(batch - n_dev, host_s, 0, 0.0)
        else:
            self.controller.observe(batch - n_dev, host_s, n_dev, device_s)
        return out

    def _device_rows(self, indices, metadata, payloads, boxes, flips, out) -> float:
        """Decode, crop, resize and flip the device rows into ``out``; returns the worker's seconds
        spent in the backend's decode call."""
        if len(indices) == 0:
            return 0.0
        raw = metadata["mode"][indices] == RAW
        crops: list = [None] * len(indices)
        jpegs = np.flatnonzero(~raw)
        t0 = time.perf_counter()
        if len(jpegs):
            decoded = self.backend.decode([payloads[k] for k in jpegs], boxes[jpegs], indices[jpegs])
            for k, tensor in zip(jpegs, decoded):
                crops[k] = tensor
        decode_s = time.perf_counter() - t0
        for k in np.flatnonzero(raw):
            s = indices[k]
            h, w = int(metadata["height"][s]), int(metadata["width"][s])
            top, left, bh, bw = (int(v) for v in boxes[k])
            image = torch.from_numpy(payloads[k]).reshape(h, w, 3)[top : top + bh, left : left + bw]
            crops[k] = image.to(self.device, non_blocking=True)
        crop_resize(crops, out, torch.from_numpy(np.ascontiguousarray(flips)))
        return decode_s

    def _host_rows(self, indices, metadata, ptrs, sizes, region, boxes, flips, out) -> None:
        host = torch.empty(tuple(out.shape), dtype=torch.uint8, pin_memory=self.device.type == "cuda")
        bad, code, detail = jpeg.decode_batch(
            indices,
            metadata,
            ptrs,
            sizes,
            region,
            np.ascontiguousarray(boxes),
            np.ascontiguousarray(flips),
            host.numpy(),
            self.fast_dct,
        )
        if bad >= 0:
            s = int(indices[bad])
            raise FormatError(f"sample {s}: {detail}", sample=s)
        out.copy_(host, non_blocking=True)
        if self.device.type == "cuda":  # the pinned buffer lives until the copy has run
            event = torch.cuda.Event()
            event.record()
            with self._keep_lock:
                self._keep.append((event, host))

    def _reap(self) -> None:
        """Drop the payload copies the device has finished with, and feed completed device
        timings to the controller (never waits on the device)."""
        with self._keep_lock:
            while self._keep and self._keep[0][0].query():
                self._keep.popleft()
            done = []
            while self._timings and self._timings[0][1].query():
                done.append(self._timings.popleft())
        for start, end, rows in done:
            self.controller.observe(0, 0.0, rows, start.elapsed_time(end) / 1e3)

    def stats(self) -> dict:
        """The backend's name, the controller's state (:meth:`ShareController.stats`), rows done on
        each side, and the worker threads' milliseconds per row in each phase (``copy``: payloads out
        of the dataset, ``decode``: the backend's call, ``resample``: crop, resize and flip kernels
        queued, ``host``: the CPU path's rows)."""
        with self._keep_lock:
            rows, phases = dict(self._rows), dict(self._phases)
        per_row = {
            f"{name}_ms_per_row": round(1e3 * secs / max(1, rows["host" if name == "host" else "device"]), 4)
            for name, secs in phases.items()
        }
        return {
            "device": str(self.device),
            "backend": self.backend.name,
            **self.controller.stats(),
            "rows": rows,
            **per_row,
        }
