"""Crop, resize and flip a whole batch of differently sized images in a few torch kernels.

Each output image is ``Wy[b] @ X[b] @ Wx[b].T`` per channel: ``X[b]`` is the sample's crop box
(zero-padded to the largest box of the chunk), ``Wy[b]`` ``(out_h, H)`` and ``Wx[b]`` ``(out_w, W)``
are its resampling weights, built for the whole batch at once from the box sizes by broadcast
arithmetic. A horizontal flip is the reversed rows of ``Wx[b]``. So the crop, the resize of every
sample to the same output size, and the flip are two batched matrix products, whatever the
boxes: no per-sample kernel besides the copy of each box into the padded batch.

The weights are the CPU path's (:func:`ffload.codecs.resize.interpolation`, after OpenCV's
``cv2.resize``): the pixel-area average (``INTER_AREA``) when the box shrinks or keeps both sides,
bilinear with half-pixel centres and replicated edges (``INTER_LINEAR``) when a side grows. The
code is plain torch (no torchvision), so the same function runs on CUDA tensors in training and
on CPU tensors in the tests.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

#: Bytes of float32 working memory one chunk of the batch may use (padded boxes plus the
#: intermediate product); larger batches are resampled in several chunks.
CHUNK_BYTES = 512 << 20


def axis_weights(lengths: torch.Tensor, n_out: int, n_in: int, area: torch.Tensor) -> torch.Tensor:
    """Resampling weights of one axis for a batch: ``(B, n_out, n_in) float32``.

    Row ``d`` of sample ``b`` holds the weights with which input pixels ``0 .. n_in - 1`` make
    output pixel ``d`` when the sample's first ``lengths[b]`` input pixels (its crop box, starting
    at 0) are resampled to ``n_out`` pixels; pixels at or past ``lengths[b]`` (padding) weigh 0.

    Args:
        lengths: ``(B,)`` box lengths in pixels, each in ``1 .. n_in``.
        n_out: output pixels.
        n_in: padded input pixels (at least ``lengths.max()``).
        area: ``(B,) bool``; True: OpenCV's ``INTER_AREA`` (input pixel ``j`` weighs its overlap
            with ``[d * s, (d + 1) * s)`` divided by ``s = length / n_out``), False: OpenCV's
            ``INTER_LINEAR`` (the two pixels around ``(d + 0.5) * s - 0.5``, clamped to the box).
    """
    device = lengths.device
    length = lengths.to(torch.float32).reshape(-1, 1, 1)
    scale = length / n_out
    d = torch.arange(n_out, dtype=torch.float32, device=device).reshape(1, -1, 1)
    j = torch.arange(n_in, dtype=torch.float32, device=device).reshape(1, 1, -1)
    lo = d * scale
    hi = lo + scale
    overlap = (torch.minimum(j + 1, hi) - torch.maximum(j, lo)).clamp_(min=0) / scale
    centre = torch.minimum(((d + 0.5) * scale - 0.5).clamp_(min=0), length - 1)
    tent = (1 - (centre - j).abs()).clamp_(min=0)
    return torch.where(area.reshape(-1, 1, 1), overlap, tent)


def crop_resize(
    boxes: Sequence[torch.Tensor],
    out: torch.Tensor,
    flips: torch.Tensor,
    chunk_bytes: int = CHUNK_BYTES,
    compute_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """Resample every crop box to ``out``'s size, mirrored where ``flips``, into ``out``.

    The boxes are taken in order of area, so that the boxes padded together in one chunk are of
    similar sizes (less padding, fewer wasted products), and each chunk's results are scattered
    to their rows of ``out``.

    Args:
        boxes: ``B`` tensors ``(h_b, w_b, 3) uint8`` (any strides, e.g. views into decoded
            images), each the pixels of one sample's crop box, on ``out``'s device.
        out: ``(B, out_h, out_w, 3) uint8`` on the device, written in place.
        flips: ``(B,) bool`` on any device: mirror sample b left-right.
        chunk_bytes: working memory per chunk (:data:`CHUNK_BYTES`), bytes.
        compute_dtype: dtype of the matrix products; ``None``: ``float16`` on CUDA (tensor cores;
            pixels 0..255 are exact in it, weights carry 11 significant bits, products accumulate
            in float32: within half a grey level of float32), ``float32`` elsewhere.

    Returns:
        ``out``. Rounding: to the nearest integer, halves up, saturated to 0..255.

    Raises:
        ValueError: ``boxes`` and ``out`` disagree on the batch size, or a box is not
            ``(h, w, 3)`` with ``h, w >= 1``.
    """
    batch, out_h = out.shape[0], out.shape[1]
    if len(boxes) != batch:
        raise ValueError(f"crop_resize: {len(boxes)} boxes for an output batch of {batch}")
    for k, box in enumerate(boxes):
        if box.dim() != 3 or box.shape[2] != 3 or box.shape[0] < 1 or box.shape[1] < 1:
            raise ValueError(f"crop_resize: box {k} must be (h, w, 3) with h, w >= 1, got {tuple(box.shape)}")
    if compute_dtype is None:
        compute_dtype = torch.float16 if out.device.type == "cuda" else torch.float32
    heights = [int(b.shape[0]) for b in boxes]
    widths = [int(b.shape[1]) for b in boxes]
    order = sorted(range(batch), key=lambda k: heights[k] * widths[k])
    flips = flips.to(out.device, torch.bool)
    per_value = torch.empty((), dtype=compute_dtype).element_size() * 3
    start = 0
    while start < batch:
        stop, h, w = start, 0, 0
        while stop < batch:  # the longest run of boxes whose padded working set fits
            k = order[stop]
            h2, w2 = max(h, heights[k]), max(w, widths[k])
            if stop > start and (stop + 1 - start) * (h2 + out_h) * w2 * per_value > chunk_bytes:
                break
            h, w, stop = h2, w2, stop + 1
        rows = order[start:stop]
        _resample_chunk([boxes[k] for k in rows], rows, heights, widths, h, w, out, flips, compute_dtype)
        start = stop
    return out


def _resample_chunk(boxes, rows, heights, widths, h, w, out, flips, dtype) -> None:
    """Resample ``boxes`` (the rows ``rows`` of the batch, padded to ``h x w``) into those rows of ``out``."""
    device = out.device
    n, out_h, out_w = len(rows), out.shape[1], out.shape[2]
    x = torch.zeros((n, h, w, 3), dtype=dtype, device=device)
    for k, box in enumerate(boxes):
        x[k, : box.shape[0], : box.shape[1]].copy_(box)
    hs = torch.tensor([heights[k] for k in rows], dtype=torch.int64)
    ws = torch.tensor([widths[k] for k in rows], dtype=torch.int64)
    index = torch.tensor(rows, dtype=torch.int64).to(device, non_blocking=True)
    area = ((hs >= out_h) & (ws >= out_w)).to(device)
    wy = axis_weights(hs.to(device), out_h, h, area).to(dtype)
    wx = axis_weights(ws.to(device), out_w, w, area)
    wx = torch.where(flips[index].reshape(-1, 1, 1), wx.flip(1), wx).to(dtype)
    tall = torch.bmm(wy, x.reshape(n, h, w * 3)).reshape(n, out_h, w, 3)  # (n, out_h, w, 3)
    cols = torch.bmm(tall.transpose(2, 3).reshape(n, out_h * 3, w), wx.transpose(1, 2))  # (n, out_h * 3, out_w)
    result = cols.reshape(n, out_h, 3, out_w).transpose(2, 3).float()
    out.index_copy_(0, index, result.add_(0.5).floor_().clamp_(0, 255).to(torch.uint8))
