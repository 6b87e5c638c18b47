"""The compiled resize (ffload.codecs.resize) against cv2.resize of the same crop, cut out."""

from __future__ import annotations

import ctypes
import mmap

import cv2
import numpy as np
import pytest
from numba import njit
from skimage import data

from ffload._jit.simd import narrow_rgb, transpose8_u16, transpose16_u8, widen_rgb
from ffload.codecs.resize import AREA, LINEAR, interpolation, resize_rgb, scratch_size


@pytest.mark.parametrize(
    "box,out,mode",
    [
        ((50, 60, 107, 123), (224, 224), LINEAR),  # enlarged: border taps would fall outside the box
        ((0, 0, 150, 90), (224, 200), LINEAR),  # at the image's top-left corner
        ((40, 30, 201, 260), (224, 224), LINEAR),  # one side grows, the other shrinks
        ((17, 33, 300, 380), (224, 224), AREA),
        ((80, 70, 300, 380), (160, 128), AREA),  # at the image's bottom-right corner
        ((5, 9, 101, 77), (37, 29), AREA),  # no side a multiple of the transpose blocks
        ((100, 3, 30, 250), (33, 250), LINEAR),
    ],
)
def test_a_window_resizes_as_cv2_resizes_the_cut_out_crop(box, out, mode):
    img = np.ascontiguousarray(data.astronaut()[:380, :450])
    top, left, h, w = box
    oh, ow = out
    assert interpolation(h, w, oh, ow) == mode
    ref = cv2.resize(
        np.ascontiguousarray(img[top : top + h, left : left + w]),
        (ow, oh),
        interpolation=cv2.INTER_AREA if mode == AREA else cv2.INTER_LINEAR,
    )
    guard = 40  # bytes either side of the output row: never written
    dst = np.full(oh * ow * 3 + 2 * guard, 7, np.uint8)
    resize_rgb(
        img.reshape(-1),
        0,
        img.shape[1] * 3,
        img.shape[0],
        img.shape[1],
        float(top),
        float(left),
        float(h),
        float(w),
        mode,
        dst,
        guard,
        oh,
        ow,
        False,
        np.empty(scratch_size(oh, ow, img.shape[1]), np.uint16),
    )
    diff = np.abs(dst[guard:-guard].reshape(oh, ow, 3).astype(int) - ref)
    assert diff.max() <= 1, diff.max()  # fixed-point rounding: one level at most
    assert (dst[:guard] == 7).all() and (dst[-guard:] == 7).all()


@pytest.mark.parametrize(
    "src_hw,out",
    [
        ((1, 1), (1, 1)),
        ((3, 2), (1, 5)),
        ((2, 3), (17, 1)),
        ((40, 33), (15, 7)),
        ((9, 70), (3, 70)),
        ((64, 64), (16, 16)),
    ],
)
@pytest.mark.parametrize("flip", [False, True])
def test_small_and_odd_shapes_in_an_exact_scratch(src_hw, out, flip):
    """The whole source resized (its window uses every column, so the scratch is used to its
    last element): as cv2.resize (mirrored when flipped), and nothing written around the output
    row or the exact-size scratch."""
    (h, w), (oh, ow) = src_hw, out
    src = np.ascontiguousarray(data.astronaut()[100 : 100 + h, 200 : 200 + w])
    mode = interpolation(h, w, oh, ow)
    ref = cv2.resize(src, (ow, oh), interpolation=cv2.INTER_AREA if mode == AREA else cv2.INTER_LINEAR)
    if flip:
        ref = ref[:, ::-1]
    guard = 24
    need = scratch_size(oh, ow, w)
    scratch = np.full(need + 2 * guard, 0xABCD, np.uint16)
    dst = np.full(oh * ow * 3 + 2 * guard, 7, np.uint8)
    resize_rgb(
        src.reshape(-1),
        0,
        w * 3,
        h,
        w,
        0.0,
        0.0,
        float(h),
        float(w),
        mode,
        dst,
        guard,
        oh,
        ow,
        flip,
        scratch[guard : guard + need],
    )
    assert np.abs(dst[guard:-guard].reshape(ref.shape).astype(int) - ref).max() <= 1
    assert (dst[:guard] == 7).all() and (dst[-guard:] == 7).all()
    assert (scratch[:guard] == 0xABCD).all() and (scratch[-guard:] == 0xABCD).all()


@pytest.mark.parametrize("side,out,mode", [(1500, 4, AREA), (1500, 12, AREA), (12, 300, LINEAR), (3, 40, LINEAR)])
def test_long_tap_sums_keep_constant_images_constant_and_follow_cv2(side, out, mode):
    """Up to hundreds of taps per output pixel: a 1500-pixel window to 4 pixels (377 taps a side,
    past the 16-bit lanes' limit: exact products) and to 12 (127 taps a side, the most the lanes
    take), and enlargements whose taps weigh up to one (the lanes, and a window narrower than one
    32-byte run). A constant image comes back exactly at the extreme grey levels and around the
    middle, and a photo within one level of cv2.resize."""
    scratch = np.empty(scratch_size(out, out, side), np.uint16)
    dst = np.empty(out * out * 3, np.uint8)
    for level in (0, 1, 127, 128, 254, 255):
        src = np.full((side, side, 3), level, np.uint8)
        resize_rgb(
            src.reshape(-1),
            0,
            side * 3,
            side,
            side,
            0.0,
            0.0,
            float(side),
            float(side),
            mode,
            dst,
            0,
            out,
            out,
            False,
            scratch,
        )
        assert (dst == level).all(), level
    photo = cv2.resize(data.astronaut(), (side, side), interpolation=cv2.INTER_LINEAR)
    ref = cv2.resize(photo, (out, out), interpolation=cv2.INTER_AREA if mode == AREA else cv2.INTER_LINEAR)
    resize_rgb(
        photo.reshape(-1),
        0,
        side * 3,
        side,
        side,
        0.0,
        0.0,
        float(side),
        float(side),
        mode,
        dst,
        0,
        out,
        out,
        False,
        scratch,
    )
    assert np.abs(dst.reshape(ref.shape).astype(int) - ref).max() <= 1


def test_unusable_buffers_are_refused():
    """Strided or short outputs, a scratch of the wrong dtype: refused before anything is written."""
    img = np.zeros((50, 60, 3), np.uint8)
    tmp = np.empty(scratch_size(20, 30, 60), np.uint16)
    row = np.zeros(2 * 20 * 30 * 3, np.uint8)
    for dst, scratch in [(row[::2], tmp), (row[: 20 * 30 * 3 - 1], tmp), (row, tmp.view(np.uint8)[: tmp.shape[0]])]:
        with pytest.raises(ValueError, match="unit-stride"):
            resize_rgb(img.reshape(-1), 0, 180, 50, 60, 0.0, 0.0, 50.0, 60.0, AREA, dst, 0, 20, 30, False, scratch)
    assert not row.any()


def test_a_scratch_buffer_too_small_is_refused():
    img = np.zeros((50, 60, 3), np.uint8)
    need = scratch_size(20, 30, 60)
    with pytest.raises(ValueError, match="scratch"):
        resize_rgb(
            img.reshape(-1),
            0,
            180,
            50,
            60,
            0.0,
            0.0,
            50.0,
            60.0,
            AREA,
            np.zeros(20 * 30 * 3, np.uint8),
            0,
            20,
            30,
            False,
            np.empty(need - 1, np.uint16),
        )


def _runner(transpose):
    """Compiled code calling ``transpose`` on the block at row 2, column 1 of ``src`` into row 1,
    column 2 of ``dst``."""

    @njit
    def run(src, dst):
        item = np.uint64(src.itemsize)
        s_row = np.uint64(src.shape[1]) * item
        d_row = np.uint64(dst.shape[1]) * item
        transpose(
            np.uint64(src.ctypes.data) + np.uint64(2) * s_row + item,
            s_row,
            np.uint64(dst.ctypes.data) + d_row + np.uint64(2) * item,
            d_row,
        )

    return run


@pytest.mark.parametrize("dtype,n", [(np.uint16, 8), (np.uint8, 16)])
def test_simd_block_transposes(dtype, n):
    """A block inside larger strided buffers: transposed into place, nothing around it touched."""
    rng = np.random.default_rng(n)
    src = rng.integers(0, np.iinfo(dtype).max, (n + 3, n + 5), dtype=dtype)
    dst = np.zeros((n + 2, n + 7), dtype)
    _runner(transpose8_u16 if n == 8 else transpose16_u8)(src, dst)
    want = np.zeros_like(dst)
    want[1 : 1 + n, 2 : 2 + n] = src[2 : 2 + n, 1 : 1 + n].T
    assert np.array_equal(dst, want)


def _before_guard_page(size: int) -> np.ndarray:
    """A writable ``(size,) uint8`` array whose last byte is the last before an inaccessible
    page: a read or write past its end faults (the test process dies) instead of going unseen."""
    page = mmap.PAGESIZE
    pages = (size + page - 1) // page + 1
    buf = mmap.mmap(-1, pages * page)
    base = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    assert libc.mprotect(base + (pages - 1) * page, page, 0) == 0  # PROT_NONE
    return np.frombuffer(buf, np.uint8, count=(pages - 1) * page)[-size:]


@pytest.mark.parametrize("n", [1, 3, 4, 5, 8, 13, 16, 21])
@pytest.mark.parametrize("at_end", [False, True])
def test_rgb_widen_and_narrow_round_trip_inside_their_ranges(n, at_end):
    """``n`` RGB pixels widened to ``R | G << 8 | B << 16`` and narrowed back: exact, for counts
    with and without a per-pixel tail, with nothing outside the written ranges touched (a shuffle
    writes 16 bytes) and, ``at_end``, for pixels that end their array just before an
    inaccessible page (no shuffle may read or write past them)."""
    rng = np.random.default_rng(n)
    start, after = 5, 0 if at_end else 7
    src = _before_guard_page(start + 3 * n + after)
    src[:] = rng.integers(0, 256, src.size, dtype=np.uint8)
    pixels = src[start : start + 3 * n].reshape(n, 3).astype(np.uint32)
    wide = np.full(n + 6, 0xDEADBEEF, np.uint32)
    widen_rgb(src, start, n, wide, 2)
    assert np.array_equal(wide[2 : 2 + n], pixels[:, 0] | pixels[:, 1] << 8 | pixels[:, 2] << 16)
    assert np.all(wide[:2] == 0xDEADBEEF) and np.all(wide[2 + n :] == 0xDEADBEEF)
    wide[2 : 2 + n] |= np.uint32(0xAB000000)  # the high byte is dropped
    out = _before_guard_page(9 + 3 * n + after)
    out[:] = 77
    narrow_rgb(wide, 2, n, out, 9)
    assert np.array_equal(out[9 : 9 + 3 * n], src[start : start + 3 * n])
    assert np.all(out[:9] == 77) and np.all(out[9 + 3 * n :] == 77)
