"""Transforms that move the image inside a window padded with ``fill``: :class:`RandomTranslate`
(FFCV's, in place, same size) and :class:`RandomCrop` (torchvision's, into a buffer of the crop
size). Outside the source image the window shows ``fill``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numba import njit

from ffload.errors import ConfigurationError, PipelineError
from ffload.loaders.decoders.base import flat_view
from ffload.loaders.pipeline.operation import Operation, Spec
from ffload.loaders.rng import randint, seed_state
from ffload.loaders.transforms.base import FilledTransform, bits


@njit(nogil=True, cache=True)
def _fill_pixels(flat, start, count, fill):
    # count pixels of fill from element offset start
    c_n = np.uint64(fill.shape[0])
    d = np.uint64(start)
    for _ in range(count):
        for c in range(c_n):
            flat[d + c] = fill[c]
        d += c_n


@njit(nogil=True, cache=True)
def translate_offsets(seeds, salt, padding, out):
    """``out[b] = (dy, dx)``: the shift :func:`_translate` applies to sample b (``out[r, c] =
    in[r + dy, c + dx]``), ``y`` then ``x`` uniform in ``{0..2 * padding}`` minus ``padding``."""
    for b in range(seeds.shape[0]):
        state = seed_state(seeds[b], salt)
        y, state = randint(state, 2 * padding + 1)
        x, state = randint(state, 2 * padding + 1)
        out[b, 0] = y - padding
        out[b, 1] = x - padding


@njit(nogil=True, cache=True)
def _translate(flat, batch, height, width, channels, shifts, fill):
    # flat: (B * H * W * C,); out[r, c] = in[r + dy, c + dx] where inside, else fill; shifts (B, 2) (dy, dx)
    row = width * channels
    for b in range(batch):
        dy = shifts[b, 0]
        dx = shifts[b, 1]
        lo = min(max(-dx, 0), width)  # destination columns [lo, hi) have a source
        hi = max(min(width - dx, width), lo)
        n = np.uint64((hi - lo) * channels)
        for rr in range(height):
            r = rr if dy >= 0 else height - 1 - rr  # read rows before they are overwritten
            sr = r + dy
            d_row = (b * height + r) * row
            if sr < 0 or sr >= height:
                _fill_pixels(flat, d_row, width, fill)
                continue
            d0 = np.uint64(d_row + lo * channels)
            s0 = np.uint64((b * height + sr) * row + (lo + dx) * channels)
            if dx >= 0 or sr != r:
                for k in range(n):
                    flat[d0 + k] = flat[s0 + k]
            else:  # same row, source on the left: copy right to left
                for k in range(n):
                    flat[d0 + n - 1 - k] = flat[s0 + n - 1 - k]
            _fill_pixels(flat, d_row, lo, fill)
            _fill_pixels(flat, d_row + hi * channels, width - hi, fill)


class RandomTranslate(FilledTransform):
    """Shift each image by a random offset, in place (FFCV's ``RandomTranslate``).

    FFCV semantics: the image is padded by ``padding`` pixels of ``fill`` on every side and a
    ``H x W`` window is cut at ``(y, x)``, ``y`` then ``x`` uniform in ``{0, ..., 2 * padding}``
    (drawn in that order from the sample's generator): ``out[r, c] = in[r + y - padding,
    c + x - padding]`` where inside, else ``fill``.

    Args:
        padding: pixels, >= 0.
        fill: per-channel colour (``C`` values representable in the image dtype).

    Raises:
        ConfigurationError: negative padding, bad fill.
        PipelineError: (building the pipeline) input not numpy (H, W, C).
    """

    def __init__(self, padding: int, fill: Sequence[float] = (0, 0, 0)):
        if int(padding) < 0:
            raise ConfigurationError(f"padding must be >= 0, got {padding}")
        self.padding = int(padding)
        self.fill = tuple(fill)

    def offsets(self, seeds: np.ndarray) -> np.ndarray:
        """``(B, 2) int64`` ``(dy, dx)`` per sample: ``out[r, c] = in[r + dy, c + dx]``."""
        out = np.empty((len(seeds), 2), np.int64)
        translate_offsets(np.asarray(seeds, np.uint64), self.salt, self.padding, out)
        return out

    def record_geometry(self, geometry, ctx):
        """Append this batch's shifts to ``geometry``: a point ``(x, y)`` moves to ``(x - dx, y - dy)``."""
        shift = self.offsets(ctx.seeds)
        forward = np.tile(np.eye(3), (len(shift), 1, 1))
        inverse = forward.copy()
        forward[:, 0, 2], forward[:, 1, 2] = -shift[:, 1], -shift[:, 0]
        inverse[:, 0, 2], inverse[:, 1, 2] = shift[:, 1], shift[:, 0]
        geometry.add_step(forward, inverse)

    def __call__(self, src, dst, ctx):
        _translate(flat_view(bits(src)), *src.shape, self.offsets(ctx.seeds), self.fill_bits)
        return src


@njit(nogil=True, cache=True)
def _random_crop(src, dst, seeds, salt, pad_top, pad_left, fill):
    # src (B, H, W, C) padded virtually by pad_top/pad_left (and the matching bottom/right) of fill
    batch, height, width, channels = src.shape
    out_h, out_w = dst.shape[1], dst.shape[2]
    padded_h, padded_w = height + 2 * pad_top, width + 2 * pad_left
    for b in range(batch):
        state = seed_state(seeds[b], salt)
        i, state = randint(state, padded_h - out_h + 1)
        j, state = randint(state, padded_w - out_w + 1)
        for y in range(out_h):
            sy = y + i - pad_top
            for x in range(out_w):
                sx = x + j - pad_left
                inside = 0 <= sy < height and 0 <= sx < width
                for c in range(channels):
                    dst[b, y, x, c] = src[b, sy, sx, c] if inside else fill[c]


class RandomCrop(FilledTransform):
    """Cut a random window from each padded image (torchvision's ``RandomCrop``).

    The window is ``size``; each image is first padded by ``padding`` pixels of ``fill`` on every
    side (``padding_mode='constant'``; with ``pad_if_needed`` images smaller than ``size`` are
    padded up first, as torchvision does).

    Output per sample: ``(h, w, C)`` of the input dtype. The window's top ``i`` then left ``j`` are
    uniform over the positions inside the padded image.

    Args:
        size: ``(h, w)`` of the window, or an int (square), pixels.
        padding: pixels of ``fill`` added on every side before cropping, >= 0.
        pad_if_needed: pad images smaller than ``size`` up to it first.
        fill: per-channel value of the padding, in the image's units (0-255 for uint8).

    Raises:
        ConfigurationError: non-positive size, negative padding, bad fill.
        PipelineError: (building the pipeline) input not
            numpy (H, W, C), or smaller than ``size`` without ``pad_if_needed``.
    """

    def __init__(
        self,
        size: int | Sequence[int],
        padding: int = 0,
        pad_if_needed: bool = False,
        fill: Sequence[float] = (0, 0, 0),
    ):
        h, w = (int(size), int(size)) if isinstance(size, (int, np.integer)) else (int(size[0]), int(size[1]))
        if h < 1 or w < 1 or int(padding) < 0:
            raise ConfigurationError(f"size must be >= 1 and padding >= 0, got {size}, {padding}")
        self.size = (h, w)
        self.padding = int(padding)
        self.pad_if_needed = bool(pad_if_needed)
        self.fill = tuple(fill)

    def declare(self, spec, field, view):
        spec = super().declare(spec, field, view)
        height, width = spec.shape[0] + 2 * self.padding, spec.shape[1] + 2 * self.padding
        extra_h = max(self.size[0] - height, 0) if self.pad_if_needed else 0
        extra_w = max(self.size[1] - width, 0) if self.pad_if_needed else 0
        # torchvision pads both sides by the missing amount when pad_if_needed
        self._pads = (self.padding + extra_h, self.padding + extra_w)
        if height + 2 * extra_h < self.size[0] or width + 2 * extra_w < self.size[1]:
            raise PipelineError(
                f"RandomCrop{self.size} (field '{self.field_name}'): images of {spec.shape[:2]} "
                f"padded by {self.padding} are smaller than the crop; pass pad_if_needed=True"
            )
        return Spec((*self.size, spec.shape[2]), spec.dtype)

    def buffer_spec(self, spec_out, batch_size):
        return Operation.buffer_spec(self, spec_out, batch_size)

    def __call__(self, src, dst, ctx):
        out = dst[: src.shape[0]]
        _random_crop(bits(src), bits(out), ctx.seeds, self.salt, *self._pads, self.fill_bits)
        return out
