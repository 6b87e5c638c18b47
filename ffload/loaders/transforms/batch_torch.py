"""The torch implementations of the random transforms, for batches already on the torch stage (after
``ToTensor`` / ``ToDevice``, or a device decoder): each function takes a whole ``(B, H, W, C)`` tensor
(any device, NHWC view; :func:`to_nhwc` / :func:`from_nhwc` convert an NCHW batch) and the parameters
the op's compiled ``params(seeds)`` drew on the CPU, uploads them, and applies them with a few
batched kernels (no Python loop over samples). Each returns a new tensor of the input's shape, dtype
and device.

Semantics are the compiled kernels' (:mod:`.flip`, :mod:`.erase`, :mod:`.color`, :mod:`.warp`),
arithmetic included: the colour steps and the warp evaluate the same float32 / float64 expressions
in the same order, one torch kernel per operation, so that they match the CPU path bit for bit
where the device rounds IEEE operations as the CPU does (no fused multiply-add across kernels).
"""

from __future__ import annotations

import numpy as np
import torch

# _gray_u8's coefficients, exactly as float32 (a Python float that a float32 tensor takes unrounded)
_LUMA = tuple(float(np.float32(c)) for c in (0.2989, 0.587, 0.114))


def to_nhwc(batch: torch.Tensor, channels_first: bool) -> torch.Tensor:
    """``(B, C, H, W)`` -> ``(B, H, W, C)`` as a view when ``channels_first``, else ``batch``."""
    return batch.permute(0, 2, 3, 1) if channels_first else batch


def from_nhwc(batch: torch.Tensor, channels_first: bool) -> torch.Tensor:
    """The inverse of :func:`to_nhwc`: a ``(B, C, H, W)`` view (channels_last strides) when ``channels_first``."""
    return batch.permute(0, 3, 1, 2) if channels_first else batch


def upload(array: np.ndarray, device: torch.device) -> torch.Tensor:
    """A small numpy parameter array as a tensor on ``device`` (same dtype; asynchronous where the
    copy allows)."""
    return torch.from_numpy(np.ascontiguousarray(array)).to(device, non_blocking=True)


def flip(batch: torch.Tensor, flips: np.ndarray, axis: int) -> torch.Tensor:
    """Mirror the drawn samples along ``axis`` (1: upside down, 2: left-right) of a ``(B, H, W, C)`` batch.

    Args:
        batch: ``(B, H, W, C)`` any dtype.
        flips: ``(B,) bool``, the samples that flip (the flips' ``params(seeds)``).
        axis: 1 or 2.
    """
    mask = upload(flips, batch.device).view(-1, 1, 1, 1)
    return torch.where(mask, batch.flip(axis), batch)


def erase(batch: torch.Tensor, boxes: np.ndarray, fill: torch.Tensor) -> torch.Tensor:
    """Paint one rectangle per sample with ``fill``.

    Args:
        batch: ``(B, H, W, C)`` any dtype.
        boxes: ``(B, 4) int64`` ``(top, left, h, w)``; ``h = 0`` or ``w = 0`` paints nothing
            (``RandomErasing.params``).
        fill: ``(C,)`` of the batch's dtype, on its device.
    """
    _, height, width, _ = batch.shape
    box = upload(boxes, batch.device)
    top, left, h, w = (box[:, k].view(-1, 1) for k in range(4))
    rows = torch.arange(height, device=batch.device).view(1, -1)
    cols = torch.arange(width, device=batch.device).view(1, -1)
    inside_y = (rows >= top) & (rows < top + h)  # (B, H)
    inside_x = (cols >= left) & (cols < left + w)  # (B, W)
    mask = (inside_y[:, :, None] & inside_x[:, None, :])[..., None]
    return torch.where(mask, fill, batch)


def _luma(x: torch.Tensor) -> torch.Tensor:
    # _gray_u8 / _gray_row on float32 channel values: (..., 3) -> (..., 1), truncated
    c0, c1, c2 = _LUMA
    return (x[..., 0:1] * c0 + x[..., 1:2] * c1 + x[..., 2:3] * c2).trunc()


def grayscale(batch: torch.Tensor, chosen: np.ndarray) -> torch.Tensor:
    """Replace the chosen samples of an RGB batch by their luma (``RandomGrayscale``'s kernel:
    ``0.2989 R + 0.587 G + 0.114 B`` in float32, truncated, in all three channels).

    Args:
        batch: ``(B, H, W, 3) uint8``.
        chosen: ``(B,) bool``, the samples replaced (``RandomGrayscale.params``).
    """
    gray = _luma(batch.to(torch.float32)).to(torch.uint8).expand(batch.shape)
    return torch.where(upload(chosen, batch.device).view(-1, 1, 1, 1), gray, batch)


def _hue(x: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    # color._hue_row on (n, H, W, 3) float32 values 0..255, shift (n, 1, 1) float32: H rotated in
    # HSV, the middle channel recomputed and truncated
    r, g, b = x.unbind(-1)
    mx = torch.maximum(torch.maximum(r, g), b)
    mn = torch.minimum(torch.minimum(r, g), b)
    chroma = mx - mn
    isr = mx == r
    isg = (mx == g) & ~isr
    num = torch.where(isr, g - b, torch.where(isg, b - r, r - g))
    base = torch.where(isr, 0.0, torch.where(isg, 2.0, 4.0))
    h = (base + num / torch.where(chroma == 0, 1.0, chroma)) / 6.0 + 1.0
    h = torch.where(h >= 1.0, h - 1.0, h) + shift
    h = torch.where(h < 0.0, h + 1.0, torch.where(h >= 1.0, h - 1.0, h))
    h6 = h * 6.0
    sector = h6.trunc()
    f = h6 - sector
    sector = torch.where(sector == 6.0, 0.0, sector)
    odd = (sector == 1.0) | (sector == 3.0) | (sector == 5.0)
    mid = torch.where(odd, (mx - chroma * f).trunc(), (mn + chroma * f).trunc())

    def channel(top_sectors, low_sectors):
        top = (sector == top_sectors[0]) | (sector == top_sectors[1])
        low = (sector == low_sectors[0]) | (sector == low_sectors[1])
        return torch.where(top, mx, torch.where(low, mn, mid))

    return torch.stack(
        [channel((0.0, 5.0), (2.0, 3.0)), channel((1.0, 2.0), (4.0, 5.0)), channel((3.0, 4.0), (0.0, 1.0))], -1
    )


def color_jitter(batch: torch.Tensor, params: np.ndarray, enabled: np.ndarray) -> torch.Tensor:
    """``ColorJitter``'s adjustments in each sample's drawn order, the whole batch per step.

    Step k applies every sample's k-th adjustment: the blends (brightness with black, contrast with
    the sample's mean truncated luma as it enters the step, saturation with the pixel's truncated
    luma) as one ``trunc(clamp(f x + (1 - f) other, 0, 255))`` in float32, a sample whose k-th
    adjustment is another one taking ``f = 1`` (exactly the identity); the hue rotation runs on the
    samples that have it at step k only. Values stay whole numbers in float32 between steps, as
    in ``color._color_jitter``.

    Args:
        batch: ``(B, H, W, 3) uint8``.
        params: ``(B, 8) float64`` from ``ColorJitter.params``: the order (4 indices: 0 brightness,
            1 contrast, 2 saturation, 3 hue), then the four factors.
        enabled: ``(4,) bool``, the adjustments the op applies (a disabled one is skipped).
    """
    device = batch.device
    n, height, width = batch.shape[0], batch.shape[1], batch.shape[2]
    order = params[:, :4].astype(np.int64)
    factors = params[:, 4:].astype(np.float32)  # the kernels' float32(f)
    kinds = np.where(enabled[order], order, -1)  # (B, 4); -1: nothing at that step
    x = batch.to(torch.float32)
    for step in range(4):
        kind = kinds[:, step]
        blend = (kind >= 0) & (kind <= 2)
        if blend.any():
            f = np.where(blend, factors[np.arange(n), np.clip(kind, 0, 3)], np.float32(1.0)).astype(np.float32)
            f = upload(f, device).view(-1, 1, 1, 1)
            other = torch.zeros((n, 1, 1, 1), dtype=torch.float32, device=device)
            if np.any((kind == 1) | (kind == 2)):
                gray = _luma(x)
                if np.any(kind == 1):
                    mean = (gray.sum(dim=(1, 2, 3), dtype=torch.float64) / (height * width)).to(torch.float32)
                    contrast = upload(kind == 1, device)
                    other = torch.where(contrast, mean, 0.0).view(-1, 1, 1, 1)
                if np.any(kind == 2):
                    other = torch.where(upload(kind == 2, device).view(-1, 1, 1, 1), gray, other)
            x = torch.clamp(f * x + (1.0 - f) * other, 0.0, 255.0).trunc()
        hue = np.flatnonzero(kind == 3)
        if hue.size:
            rows = upload(hue, device)
            shift = upload(factors[hue, 3], device).view(-1, 1, 1)
            x = x.index_copy(0, rows, _hue(x.index_select(0, rows), shift))
    return x.to(torch.uint8)


def warp(batch: torch.Tensor, matrices: np.ndarray, fill: torch.Tensor) -> torch.Tensor:
    """Bilinear warp of every sample by its inverse matrix, ``warp._warp_rgb``'s arithmetic.

    Output pixel ``(x, y)`` samples the input at ``m @ (x + .5, y + .5, 1)`` (projected) minus 0.5,
    in float64; the coordinates are clamped to ``[-2, side + 1]`` (NaN to -2); the four taps are
    read from the image inside a one-pixel zero border; the blend is float32 (``top = a + fx (b - a)``,
    ``v = top + fy ((c + fx (d - c)) - top)``), the fill blended in by coverage (``v m + (1 - m)
    fill`` where the taps inside weigh ``m < 1``), rounded half up. An identity matrix reproduces
    the sample exactly. For ``C != 3`` the CPU kernel (``warp._warp``) blends in float64: a value
    may differ by one where it lies within ~1e-4 of a rounding boundary.

    Args:
        batch: ``(B, H, W, C) uint8``.
        matrices: ``(B, 3, 3) float64`` inverse matrices (pixel-corner coordinates), ``params(seeds, H, W)``.
        fill: ``(C,)`` uint8 on the batch's device.
    """
    device = batch.device
    n, height, width, channels = batch.shape
    m = upload(matrices, device)
    px = (torch.arange(width, dtype=torch.float64, device=device) + 0.5).view(1, 1, -1)
    py = (torch.arange(height, dtype=torch.float64, device=device) + 0.5).view(1, -1, 1)

    def row(k):  # m[k, 1] * py + m[k, 2]: (B, H, 1)
        return m[:, k, 1].view(-1, 1, 1) * py + m[:, k, 2].view(-1, 1, 1)

    bx, by, bw = row(0), row(1), row(2)
    inv = 1.0 / (m[:, 2, 0].view(-1, 1, 1) * px + bw)
    sx = (m[:, 0, 0].view(-1, 1, 1) * px + bx) * inv - 0.5
    sy = (m[:, 1, 0].view(-1, 1, 1) * px + by) * inv - 0.5

    def taps(s, side):  # warp._row_taps along one axis: clamped tap index, fraction, coverage
        s = torch.where(s > -2.0, s, -2.0)
        s = torch.where(s < side + 1.0, s, side + 1.0)
        floor = torch.floor(s)
        i0 = floor.to(torch.int64)
        frac = (s - floor).to(torch.float32)
        low, high = (i0 >= 0) & (i0 <= side - 1), (i0 >= -1) & (i0 < side - 1)
        cover = torch.where(low & high, 1.0, torch.where(low, 1.0 - frac, torch.where(high, frac, 0.0)))
        return i0.clamp(-1, side - 1), frac, cover

    xi, fx, cx = taps(sx, width)
    yi, fy, cy = taps(sy, height)
    cover = (cx * cy).unsqueeze(-1)
    pw, ph = width + 2, height + 2
    padded = torch.zeros((n, ph, pw, channels), dtype=batch.dtype, device=device)
    padded[:, 1 : height + 1, 1 : width + 1] = batch
    flat = padded.view(n * ph * pw, channels)
    index = torch.arange(n, device=device).view(-1, 1, 1) * (ph * pw) + (yi + 1) * pw + xi + 1

    def tap(offset):
        return flat[index + offset].to(torch.float32)

    a, b, c, d = tap(0), tap(1), tap(pw), tap(pw + 1)
    fx, fy = fx.unsqueeze(-1), fy.unsqueeze(-1)
    top = a + fx * (b - a)
    v = top + fy * ((c + fx * (d - c)) - top)
    v = torch.where(cover == 1.0, v, v * cover + (1.0 - cover) * fill.to(torch.float32))
    return (v + 0.5).to(torch.uint8)
