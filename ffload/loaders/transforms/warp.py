"""Bilinear warps of ``(H, W, C) uint8`` images into a buffer of the same shape: torchvision's
:class:`RandomAffine`, :class:`RandomRotation` and :class:`RandomPerspective` (tensor semantics,
rounding included; the parameter distributions are torchvision's, drawn from ffload's generator).

They share one kernel: output pixel ``(x, y)`` samples the input at ``H @ (x + 0.5, y + 0.5, 1)``
(projective, pixel-corner coordinates) minus 0.5, where ``H`` is torchvision's inverse matrix;
taps outside the image count as zero and the sampled coverage ``m`` blends in ``fill`` as
torchvision's ``_apply_grid_transform`` does: ``out = round(v * m + (1 - m) * fill)``.
``_warp_rgb`` is the kernel for 3 channels, ``_warp`` for any other count. A torch ``uint8`` batch
(after ``ToTensor``, any device) is warped with the same matrices and ``_warp_rgb``'s arithmetic by
:func:`ffload.loaders.transforms.batch_torch.warp` (a gather of the four taps per pixel, not
``grid_sample``, whose normalised coordinates round differently).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
from numba import njit

from ffload._jit.simd import narrow_rgb, widen_rgb
from ffload.errors import ConfigurationError, PipelineError
from ffload.loaders.pipeline.operation import Operation
from ffload.loaders.rng import randint, seed_state, uniform, uniform_range
from ffload.loaders.transforms import batch_torch
from ffload.loaders.transforms.base import FilledTransform, range_pair


@njit(nogil=True, cache=True)
def _inverse_affine(angle, tx, ty, scale, shear_x, shear_y, cx, cy, out):
    # torchvision's _get_inverse_affine_matrix (pixel-corner coordinates, centre (cx, cy))
    rot = math.radians(angle)
    sx = math.radians(shear_x)
    sy = math.radians(shear_y)
    a = math.cos(rot - sy) / math.cos(sy)
    b = -math.cos(rot - sy) * math.tan(sx) / math.cos(sy) - math.sin(rot)
    c = math.sin(rot - sy) / math.cos(sy)
    d = -math.sin(rot - sy) * math.tan(sx) / math.cos(sy) + math.cos(rot)
    m0, m1, m3, m4 = d / scale, -b / scale, -c / scale, a / scale
    out[0, 0], out[0, 1] = m0, m1
    out[0, 2] = m0 * (-cx - tx) + m1 * (-cy - ty) + cx
    out[1, 0], out[1, 1] = m3, m4
    out[1, 2] = m3 * (-cx - tx) + m4 * (-cy - ty) + cy
    out[2, 0], out[2, 1], out[2, 2] = 0.0, 0.0, 1.0


@njit(nogil=True, cache=True)
def _affine_params(seeds, salt, height, width, ranges, translate, apply_prob, out):
    # ranges (4, 2): degrees, scale, shear_x, shear_y; translate (2,) fractions; out (B, 3, 3)
    for b in range(seeds.shape[0]):
        state = seed_state(seeds[b], salt)
        u, state = uniform(state)
        if u >= apply_prob:
            _inverse_affine(0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, out[b])
            continue
        angle, state = uniform_range(state, ranges[0, 0], ranges[0, 1])
        dx, state = uniform_range(state, -translate[0] * width, translate[0] * width)
        dy, state = uniform_range(state, -translate[1] * height, translate[1] * height)
        scale, state = uniform_range(state, ranges[1, 0], ranges[1, 1])
        shx, state = uniform_range(state, ranges[2, 0], ranges[2, 1])
        shy, state = uniform_range(state, ranges[3, 0], ranges[3, 1])
        _inverse_affine(angle, np.round(dx), np.round(dy), scale, shx, shy, width * 0.5, height * 0.5, out[b])


@njit(nogil=True, cache=True)
def _warp_border(s, x, y, sx, sy, fill, out):
    # a pixel whose taps are partly outside: zero-padded taps, torchvision's coverage blend
    height, width, channels = s.shape
    x0, y0 = int(math.floor(sx)), int(math.floor(sy))
    fx, fy = sx - x0, sy - y0
    cover = 0.0
    for c in range(channels):
        out[c] = 0.0
    for ty in range(2):
        yy = y0 + ty
        wy = fy if ty else 1.0 - fy
        if 0 <= yy < height:
            for tx in range(2):
                xx = x0 + tx
                wx = fx if tx else 1.0 - fx
                if 0 <= xx < width:
                    cover += wx * wy
                    for c in range(channels):
                        out[c] += wx * wy * s[yy, xx, c]
    for c in range(channels):
        out[c] = min(max(np.round(out[c] * cover + (1.0 - cover) * fill[c]), 0.0), 255.0)


@njit(nogil=True, cache=True)
def _is_identity(m):
    return (
        m[0, 0] == 1.0
        and m[0, 1] == 0.0
        and m[0, 2] == 0.0
        and m[1, 0] == 0.0
        and m[1, 1] == 1.0
        and m[1, 2] == 0.0
        and m[2, 0] == 0.0
        and m[2, 1] == 0.0
        and m[2, 2] == 1.0
    )


@njit(nogil=True, cache=True)
def _copy_flat(src, dst):
    # dst[:] = src for 1-D arrays, a vectorised loop (numba's copy of an (H, W, C) image walks it
    # element by element; see docs/developer-notes.md)
    for k in range(np.uint64(src.shape[0])):
        dst[k] = src[k]


@njit(nogil=True, cache=True)
def _warp(src, dst, mats, fill):
    # dst[b, y, x] = bilinear src at mats[b] @ (x + .5, y + .5, 1) - .5, torchvision's fill blend.
    # Coordinates advance incrementally along a row; pixels whose four taps are inside (almost
    # all of them) take the branch-free path on flat rows (3 channels unrolled), the rest
    # _warp_border; an identity matrix (a sample the op leaves alone) is a copy.
    batch, height, width, channels = src.shape
    out_h, out_w = dst.shape[1], dst.shape[2]
    border = np.empty(channels, dtype=np.float64)
    x_max, y_max = width - 1.0, height - 1.0
    row = width * channels
    for b in range(batch):
        s, d, m = src[b], dst[b], mats[b]
        if _is_identity(m) and out_h == height and out_w == width:
            _copy_flat(s.reshape(-1), d.reshape(-1))
            continue
        sf = s.reshape(-1)
        for y in range(out_h):
            py = y + 0.5
            nx = m[0, 0] * 0.5 + m[0, 1] * py + m[0, 2]
            ny = m[1, 0] * 0.5 + m[1, 1] * py + m[1, 2]
            nw = m[2, 0] * 0.5 + m[2, 1] * py + m[2, 2]
            for x in range(out_w):
                inv = 1.0 / nw
                sx, sy = nx * inv - 0.5, ny * inv - 0.5
                nx += m[0, 0]
                ny += m[1, 0]
                nw += m[2, 0]
                if 0.0 <= sx < x_max and 0.0 <= sy < y_max:
                    x0, y0 = int(sx), int(sy)
                    fx, fy = sx - x0, sy - y0
                    w00, w01 = (1.0 - fx) * (1.0 - fy), fx * (1.0 - fy)
                    w10, w11 = (1.0 - fx) * fy, fx * fy
                    i = np.uint64(y0 * row + x0 * channels)
                    j = i + np.uint64(row)
                    if channels == 3:
                        u1, u2, u3, u4, u5 = np.uint64(1), np.uint64(2), np.uint64(3), np.uint64(4), np.uint64(5)
                        d[y, x, 0] = np.uint8(w00 * sf[i] + w01 * sf[i + u3] + w10 * sf[j] + w11 * sf[j + u3] + 0.5)
                        d[y, x, 1] = np.uint8(
                            w00 * sf[i + u1] + w01 * sf[i + u4] + w10 * sf[j + u1] + w11 * sf[j + u4] + 0.5
                        )
                        d[y, x, 2] = np.uint8(
                            w00 * sf[i + u2] + w01 * sf[i + u5] + w10 * sf[j + u2] + w11 * sf[j + u5] + 0.5
                        )
                    else:
                        for c in range(channels):
                            v = (
                                w00 * s[y0, x0, c]
                                + w01 * s[y0, x0 + 1, c]
                                + w10 * s[y0 + 1, x0, c]
                                + w11 * s[y0 + 1, x0 + 1, c]
                            )
                            d[y, x, c] = np.uint8(v + 0.5)
                elif -1.0 < sx < width and -1.0 < sy < height:
                    _warp_border(s, x, y, sx, sy, fill, border)
                    for c in range(channels):
                        d[y, x, c] = np.uint8(border[c])
                else:
                    for c in range(channels):
                        d[y, x, c] = np.uint8(fill[c])


@njit(nogil=True, cache=True, error_model="numpy")  # no ZeroDivisionError branch: vectorises
def _warp_row_coords(m, y, pxs, sxs, sys_, n):
    # the source coordinates of output row y: m @ (x + .5, y + .5, 1), projected, minus .5, with
    # pxs[x] = x + .5 (one vectorised loop; affine matrices skip the division)
    py = y + 0.5
    bx, by, bw = m[0, 1] * py + m[0, 2], m[1, 1] * py + m[1, 2], m[2, 1] * py + m[2, 2]
    m00, m10, m20 = m[0, 0], m[1, 0], m[2, 0]
    if m20 == 0.0 and bw == 1.0:
        for x in range(n):
            px = pxs[x]
            sxs[x] = m00 * px + bx - 0.5
            sys_[x] = m10 * px + by - 0.5
    else:
        for x in range(n):
            px = pxs[x]
            inv = 1.0 / (m20 * px + bw)
            sxs[x] = (m00 * px + bx) * inv - 0.5
            sys_[x] = (m10 * px + by) * inv - 0.5


@njit(nogil=True, cache=True)
def _row_taps(sxs, sys_, height, width, idx, fxs, fys, covers, n):
    # per pixel of a row, from its source coordinates (float64): the index of its top-left tap in
    # the zero-bordered packed image (clamped so that all four taps lie inside it), the fractions
    # (float32) and the coverage, the bilinear weight of the taps inside the image (float32; exactly
    # 1 when all four are, 0 when none is). Coordinates are clamped to [-2, side + 1] first (NaN or
    # infinity from a zero denominator too: they sample only fill). Branch-free: vectorises.
    pw = np.int32(width + 2)
    one, zero = np.float32(1.0), np.float32(0.0)
    x_hi, y_hi = width + 1.0, height + 1.0
    w1, h1 = np.int32(width - 1), np.int32(height - 1)
    for x in range(n):
        sx, sy = sxs[x], sys_[x]
        sx = sx if sx > -2.0 else -2.0
        sx = sx if sx < x_hi else x_hi
        sy = sy if sy > -2.0 else -2.0
        sy = sy if sy < y_hi else y_hi
        fx0, fy0 = math.floor(sx), math.floor(sy)
        x0, y0 = np.int32(fx0), np.int32(fy0)
        fx, fy = np.float32(sx - fx0), np.float32(sy - fy0)
        lx, rx = (x0 >= 0) & (x0 <= w1), (x0 >= -1) & (x0 < w1)
        ty, by = (y0 >= 0) & (y0 <= h1), (y0 >= -1) & (y0 < h1)
        cx = one if lx & rx else (one - fx if lx else (fx if rx else zero))
        cy = one if ty & by else (one - fy if ty else (fy if by else zero))
        xi = x0 if x0 > -1 else np.int32(-1)
        xi = xi if xi < w1 else w1
        yi = y0 if y0 > -1 else np.int32(-1)
        yi = yi if yi < h1 else h1
        idx[x] = (yi + 1) * pw + xi + 1
        fxs[x], fys[x], covers[x] = fx, fy, cx * cy


@njit(nogil=True, cache=True)
def _blend_channel(t00, t01, t10, t11, shift, fx, fy, cover, fill):
    # one channel (bits shift.. of the packed taps) bilinear in float32, the fill blended in by
    # coverage (torchvision's v * m + (1 - m) * fill), rounded half up
    byte = np.uint32(255)
    a, b = np.float32(np.int32((t00 >> shift) & byte)), np.float32(np.int32((t01 >> shift) & byte))
    c, d = np.float32(np.int32((t10 >> shift) & byte)), np.float32(np.int32((t11 >> shift) & byte))
    top = a + fx * (b - a)
    v = top + fy * ((c + fx * (d - c)) - top)
    v = v if cover == np.float32(1.0) else v * cover + (np.float32(1.0) - cover) * fill
    return np.uint32(np.int32(v + np.float32(0.5)))


@njit(nogil=True, cache=True)
def _warp_rgb(src, dst, mats, fill):
    # _warp for 3 channels, row by row in vectorised passes: the image widened once to one uint32
    # per pixel (R | G << 8 | B << 16, simd.widen_rgb) inside a border of zero pixels, then per
    # output row its source coordinates (float64, computed directly rather than incrementally),
    # the taps' index, fractions and coverage (_row_taps), the four taps of every pixel (four
    # uint32 loads), the float32 blend per channel (_blend_channel: torchvision's own precision for
    # tensors, so a value may differ from _warp's by one where it lies within ~1e-4 of a rounding
    # boundary), narrowed back to RGB (simd.narrow_rgb). Taps outside the image read the zero
    # border, so partly covered and outside pixels need no separate path; a zero denominator
    # samples the fill instead of raising ZeroDivisionError. An identity matrix is a copy.
    batch, height, width = src.shape[0], src.shape[1], src.shape[2]
    out_h, out_w = dst.shape[1], dst.shape[2]
    pw = width + 2
    sxs, sys_ = np.empty(out_w), np.empty(out_w)
    pxs = np.arange(out_w) + 0.5
    fxs, fys, covers = np.empty(out_w, np.float32), np.empty(out_w, np.float32), np.empty(out_w, np.float32)
    idx = np.empty(out_w, np.int32)
    taps = np.empty((4, out_w), np.uint32)
    packed = np.zeros((height + 2) * pw, np.uint32)
    rgbx = np.empty(out_w, np.uint32)
    f0, f1, f2 = np.float32(fill[0]), np.float32(fill[1]), np.float32(fill[2])
    u1, row = np.uint64(1), np.uint64(pw)
    flat, flat_out = src.reshape(-1), dst.reshape(-1)
    for b in range(batch):
        m = mats[b]
        if _is_identity(m) and out_h == height and out_w == width:
            _copy_flat(src[b].reshape(-1), dst[b].reshape(-1))
            continue
        for y in range(height):
            widen_rgb(flat, (b * height + y) * width * 3, width, packed, (y + 1) * pw + 1)
        for y in range(out_h):
            _warp_row_coords(m, y, pxs, sxs, sys_, out_w)
            _row_taps(sxs, sys_, height, width, idx, fxs, fys, covers, out_w)
            t00, t01, t10, t11 = taps[0], taps[1], taps[2], taps[3]
            for x in range(out_w):
                i = np.uint64(idx[x])
                t00[x], t01[x] = packed[i], packed[i + u1]
                t10[x], t11[x] = packed[i + row], packed[i + row + u1]
            for x in range(out_w):
                fx, fy, cover = fxs[x], fys[x], covers[x]
                a00, a01, a10, a11 = t00[x], t01[x], t10[x], t11[x]
                rgbx[x] = (
                    _blend_channel(a00, a01, a10, a11, 0, fx, fy, cover, f0)
                    | (_blend_channel(a00, a01, a10, a11, 8, fx, fy, cover, f1) << 8)
                    | (_blend_channel(a00, a01, a10, a11, 16, fx, fy, cover, f2) << 16)
                )
            narrow_rgb(rgbx, 0, out_w, flat_out, (b * out_h + y) * out_w * 3)


class _Warp(FilledTransform):
    """Base of the bilinear warps: ``(H, W, C) uint8`` in, the same shape out (into a buffer; a new
    tensor for a torch batch, NHWC or NCHW, any device); subclasses implement ``params(seeds,
    height, width) -> (B, 3, 3) float64`` inverse matrices."""

    torch_impl = True

    def declare(self, spec, field, view):
        spec = super().declare(spec, field, view)
        if spec.dtype != (torch.uint8 if spec.on_torch else np.uint8):
            raise PipelineError(f"{type(self).__name__} (field '{self.field_name}') needs uint8 images, got {spec}")
        return spec

    def buffer_spec(self, spec_out, batch_size):
        return Operation.buffer_spec(self, spec_out, batch_size)

    def __call__(self, src, dst, ctx):
        if self.on_torch:
            x = batch_torch.to_nhwc(src, self.channels_first)
            matrices = self.params(ctx.seeds, x.shape[1], x.shape[2])
            return batch_torch.from_nhwc(batch_torch.warp(x, matrices, self.fill_bits), self.channels_first)
        out = dst[: src.shape[0]]
        warp = _warp_rgb if src.shape[3] == 3 else _warp
        warp(
            np.ascontiguousarray(src),
            out,
            self.params(ctx.seeds, src.shape[1], src.shape[2]),
            self.fill_bits.astype(np.float64),
        )
        return out


class RandomAffine(_Warp):
    """Random rotation, translation, scale and shear, bilinear (torchvision's ``RandomAffine``).

    About the image centre, as torchvision's ``RandomAffine`` on tensors.

    Per sample: angle uniform in ``degrees`` (a number d means ``(-d, d)``; clockwise, as
    torchvision's ``affine``), translation ``round(uniform(-t_x W, t_x W))`` then the same in y,
    scale uniform in ``scale``, shear x uniform in ``shear[:2]`` and y in ``shear[2:]`` (a number s
    means x shear in ``(-s, s)``). ``params(seeds, height, width)``: ``(B, 3, 3) float64`` inverse
    matrices in pixel-corner coordinates (torchvision's ``_get_inverse_affine_matrix``).

    Args:
        degrees: rotation range in degrees, ``d`` for ``(-d, d)`` or ``(min, max)``.
        translate: ``(t_x, t_y)``, the largest shift as a fraction of the width and height; None: no shift.
        scale: ``(min, max)`` scale factor; None: 1.
        shear: degrees, ``s`` for x in ``(-s, s)``, ``(min, max)`` for x, or 4 values for x then y; None: none.
        fill: per-channel value of the pixels that come from outside the image, 0-255.

    Raises:
        ConfigurationError: bad ranges or fill.
        PipelineError: (building the pipeline) input not an (H, W, C) uint8 image (numpy, or a torch batch
            after ``ToTensor``: warped by ``batch_torch.warp``).
    """

    _apply_prob = 1.0

    def __init__(
        self,
        degrees: float | Sequence[float],
        translate: Sequence[float] | None = None,
        scale: Sequence[float] | None = None,
        shear: float | Sequence[float] | None = None,
        fill: Sequence[float] = (0, 0, 0),
    ):
        shear = (0.0, 0.0) if shear is None else shear
        shear4 = (
            (range_pair(shear, "shear") + (0.0, 0.0))
            if isinstance(shear, (int, float)) or len(shear) == 2
            else (range_pair(shear[:2], "shear") + range_pair(shear[2:], "shear"))
        )
        self.ranges = np.array(
            [range_pair(degrees, "degrees"), range_pair(scale or (1.0, 1.0), "scale"), shear4[:2], shear4[2:]],
            dtype=np.float64,
        )
        self.translate = np.array(translate or (0.0, 0.0), dtype=np.float64)
        if self.translate.shape != (2,) or not np.all((0 <= self.translate) & (self.translate <= 1)):
            raise ConfigurationError(f"translate must be two fractions in [0, 1], got {translate}")
        if self.ranges[1, 0] <= 0:
            raise ConfigurationError(f"scale must be > 0, got {scale}")
        self.fill = tuple(fill)

    def params(self, seeds: np.ndarray, height: int, width: int) -> np.ndarray:
        """``(B, 3, 3) float64`` inverse matrices for images of ``height x width`` pixels."""
        out = np.empty((len(seeds), 3, 3), dtype=np.float64)
        _affine_params(
            np.asarray(seeds, dtype=np.uint64),
            self.salt,
            height,
            width,
            self.ranges,
            self.translate,
            self._apply_prob,
            out,
        )
        return out

    def record_geometry(self, geometry, ctx):
        """Append this batch's warps to ``geometry`` (:mod:`ffload.loaders.pipeline.geometry`): the
        inverse matrices the image is sampled with (pixel-edge coordinates, see :meth:`params`) and
        their inverses."""
        height, width = geometry.out_size
        inverse = self.params(ctx.seeds, height, width)
        geometry.add_step(np.linalg.inv(inverse), inverse)


class RandomRotation(RandomAffine):
    """Rotate images by a random angle about the centre, bilinear (torchvision's ``RandomRotation``).

    The angle is uniform in ``degrees``; the size is kept (torchvision's ``RandomRotation``
    without ``expand``; its angle is counter-clockwise, which for a symmetric range is the same
    distribution).

    Args:
        degrees: angle range in degrees, ``d`` for ``(-d, d)`` or ``(min, max)``.
        fill: per-channel value of the pixels that come from outside the image, 0-255.

    Raises:
        ConfigurationError: bad degrees or fill.
        PipelineError: (building the pipeline) input not an (H, W, C) uint8 image (numpy or torch, as for
            :class:`RandomAffine`).
    """

    def __init__(self, degrees: float | Sequence[float], fill: Sequence[float] = (0, 0, 0)):
        super().__init__(degrees, fill=fill)
        self.ranges[0] = -self.ranges[0, ::-1]


@njit(nogil=True, cache=True)
def _solve8(a, rhs):
    # Gaussian elimination with partial pivoting of an 8x8 system (torch.linalg.lstsq of a square
    # full-rank system gives the same solution)
    n = 8
    for col in range(n):
        piv = col
        for r in range(col + 1, n):
            if abs(a[r, col]) > abs(a[piv, col]):
                piv = r
        if piv != col:
            for k in range(n):
                a[col, k], a[piv, k] = a[piv, k], a[col, k]
            rhs[col], rhs[piv] = rhs[piv], rhs[col]
        for r in range(col + 1, n):
            f = a[r, col] / a[col, col]
            for k in range(col, n):
                a[r, k] -= f * a[col, k]
            rhs[r] -= f * rhs[col]
    x = np.zeros(n)
    for r in range(n - 1, -1, -1):
        s = rhs[r]
        for k in range(r + 1, n):
            s -= a[r, k] * x[k]
        x[r] = s / a[r, r]
    return x


@njit(nogil=True, cache=True)
def _perspective_params(seeds, salt, height, width, distortion, prob, out, corners):
    # out (B, 3, 3) inverse homographies; corners (B, 4, 2) end points (identity when not applied)
    half_h, half_w = height // 2, width // 2
    dw, dh = int(distortion * half_w), int(distortion * half_h)
    start = np.array([[0.0, 0.0], [width - 1.0, 0.0], [width - 1.0, height - 1.0], [0.0, height - 1.0]])
    for b in range(seeds.shape[0]):
        state = seed_state(seeds[b], salt)
        u, state = uniform(state)
        if u >= prob:
            corners[b] = start
            out[b] = np.eye(3)
            continue
        x, state = randint(state, dw + 1)
        y, state = randint(state, dh + 1)
        corners[b, 0, 0], corners[b, 0, 1] = x, y
        x, state = randint(state, dw + 1)
        y, state = randint(state, dh + 1)
        corners[b, 1, 0], corners[b, 1, 1] = width - 1 - x, y
        x, state = randint(state, dw + 1)
        y, state = randint(state, dh + 1)
        corners[b, 2, 0], corners[b, 2, 1] = width - 1 - x, height - 1 - y
        x, state = randint(state, dw + 1)
        y, state = randint(state, dh + 1)
        corners[b, 3, 0], corners[b, 3, 1] = x, height - 1 - y
        a = np.zeros((8, 8))
        rhs = np.zeros(8)
        for i in range(4):  # torchvision's _get_perspective_coeffs: end points -> start points
            ex, ey = corners[b, i, 0], corners[b, i, 1]
            sx, sy = start[i, 0], start[i, 1]
            a[2 * i, 0], a[2 * i, 1], a[2 * i, 2] = ex, ey, 1.0
            a[2 * i, 6], a[2 * i, 7] = -sx * ex, -sx * ey
            a[2 * i + 1, 3], a[2 * i + 1, 4], a[2 * i + 1, 5] = ex, ey, 1.0
            a[2 * i + 1, 6], a[2 * i + 1, 7] = -sy * ex, -sy * ey
            rhs[2 * i], rhs[2 * i + 1] = sx, sy
        c = _solve8(a, rhs)
        out[b, 0, 0], out[b, 0, 1], out[b, 0, 2] = c[0], c[1], c[2]
        out[b, 1, 0], out[b, 1, 1], out[b, 1, 2] = c[3], c[4], c[5]
        out[b, 2, 0], out[b, 2, 1], out[b, 2, 2] = c[6], c[7], 1.0


class RandomPerspective(_Warp):
    """A random perspective distortion with probability ``p``, bilinear (torchvision's ``RandomPerspective``).

    Per distorted sample, each corner moves inwards by integers uniform in
    ``0 .. int(distortion_scale * W // 2)`` (x) and ``0 .. int(distortion_scale * H // 2)`` (y),
    top-left, top-right, bottom-right, bottom-left, x before y, as torchvision's ``get_params``;
    the homography maps those end points to the original corners (torchvision's
    ``_get_perspective_coeffs``, solved exactly in float64). ``params(seeds, height, width)``:
    ``(B, 3, 3) float64`` inverse homographies; ``corners(seeds, height, width)``: the end points.

    Args:
        distortion_scale: how far corners may move, as a fraction of half the width / height, in [0, 1].
        p: probability that a sample is distorted, in [0, 1].
        fill: per-channel value of the pixels that come from outside the image, 0-255.

    Raises:
        ConfigurationError: ``distortion_scale`` or ``p`` outside [0, 1], bad fill.
        PipelineError: (building the pipeline) input not an (H, W, C) uint8 image (numpy or torch, as for
            :class:`RandomAffine`).
    """

    def __init__(self, distortion_scale: float = 0.5, p: float = 0.5, fill: Sequence[float] = (0, 0, 0)):
        if not 0.0 <= distortion_scale <= 1.0 or not 0.0 <= p <= 1.0:
            raise ConfigurationError(f"distortion_scale and p must be in [0, 1], got {distortion_scale}, {p}")
        self.distortion_scale = float(distortion_scale)
        self.p = float(p)
        self.fill = tuple(fill)

    def _draw(self, seeds, height, width):
        out = np.empty((len(seeds), 3, 3), dtype=np.float64)
        corners = np.empty((len(seeds), 4, 2), dtype=np.float64)
        _perspective_params(
            np.asarray(seeds, dtype=np.uint64), self.salt, height, width, self.distortion_scale, self.p, out, corners
        )
        return out, corners

    def params(self, seeds: np.ndarray, height: int, width: int) -> np.ndarray:
        """``(B, 3, 3) float64`` inverse homographies (pixel-corner coordinates)."""
        return self._draw(seeds, height, width)[0]

    def corners(self, seeds: np.ndarray, height: int, width: int) -> np.ndarray:
        """``(B, 4, 2) float64`` end points of the corners (x, y), torchvision's ``endpoints``."""
        return self._draw(seeds, height, width)[1]
