"""The compiled image path of the RGB decoders: one ``nogil`` numba call per batch decodes (JPEG,
through libjpeg-turbo's TurboJPEG 3 API, see :mod:`.turbojpeg`) or reads (raw) every sample,
crops it, resizes it (:mod:`.resize`) and writes it into its output row.

Per JPEG sample (libjpeg-turbo's ``tj3*`` API, one handle per worker thread):

1. ``tj3DecompressHeader``: width, height, chroma subsampling; a size other than the metadata's
   is an error (:data:`BAD_SIZE`, with the size of the data's own frame header,
   :func:`frame_size`), unless the data holds no frame header (:data:`NO_FRAME`; also a frame
   header of the right size whose scan is missing, where a TurboJPEG newer than the bundled one
   may succeed): TurboJPEG reads such data, say an SOI followed by garbage, as an abbreviated
   table specification, returns success and leaves the previous image's size in the handle.
   Skipped for an image decoded whole whose frame header gives the metadata's size
   (see :func:`_decode_jpeg`).
2. The DCT scaling factor (:func:`scale_numerator`): 1/2 (``M = 4``) when the box is at least 4x
   the output on both sides, else 8/8 (no scaling). The box keeps its fractional edges in the
   scaled image (``edge * M / 8``), so the resize that follows samples exactly the same area as a
   full-size decode would. Only 1/2, because libjpeg-turbo has SIMD inverse DCTs only for 8x8 and
   the 1/2, 1/4 and 1/8 reductions and most of a q90 decode is entropy decoding, which scaling does
   not shrink; from 4x, because there a 1/2 decode + resize lands on average within 2 grey levels
   of a full decode + the same resize, and 1/4 and 1/8 are further off at every ratio (the
   measurements: ``docs/developer-notes.md``, ffload.codecs.jpeg).
3. ``tj3SetCroppingRegion``: the scaled box's rows and columns (edges rounded outwards) and one
   more column on each side inside the image, its left edge moved down to the scaled iMCU grid
   (``ceil(MCUwidth * M / 8)`` pixels, TurboJPEG's requirement); the extra columns are skipped
   when resizing. The region's outermost columns come out of libjpeg-turbo's fancy (triangle)
   chroma upsampling as at an image edge, up to 14 grey levels off a full decode for 4:2:0 and
   4:2:2; one column further out, the box's own columns are exactly a full decode's (rows need
   nothing: libjpeg-turbo decodes the context rows itself). Unknown subsampling: no cropping
   region (the whole scaled image).
   *Restart markers.* A JPEG with restart markers that tile its MCU rows (ffload writes one per
   MCU, ``RGBImageField(jpeg_restart_interval=...)``) is first cut down to the restart segments
   that hold the box (:mod:`.restarts`), so that libjpeg-turbo entropy-decodes only
   those instead of every MCU above and beside the box; the pixels are the same.
4. ``tj3Decompress8`` to RGB into the thread's scratch buffer (or straight into the output row when
   no resize, no flip and no column offset is needed), then
   :func:`ffload.codecs.resize.resize_rgb` (or :func:`~ffload.codecs.resize.copy_rgb`).

Warnings rule: a libjpeg-turbo *warning* (e.g. "Premature end of JPEG file": truncated scan
data) is an error like a fatal one: the sample is reported with libjpeg-turbo's message, as the
OpenCV fallback (which returns no image for such data) would report it. Errors stop the batch at
that row (:data:`FAILED`) and the caller raises naming the field and sample.

Fallback: without a TurboJPEG 3 library (:func:`backend` is ``'opencv'``), JPEG rows are decoded
by ``cv2.imdecode`` at 1/k scale (k = 8 / M: the same factor as step 2) one call per sample from
Python, then resized by the same compiled resize; a ``RuntimeWarning`` says so once per process.
"""

from __future__ import annotations

import threading
import warnings

import cv2
import numpy as np
from numba import njit

from ffload.codecs import restarts
from ffload.codecs import turbojpeg as tj
from ffload.codecs.resize import AUTO, copy_rgb, pick, resize_rgb, scratch_size
from ffload.errors import ConfigurationError

OK = 0
PENDING = 2
FAILED = -1
BAD_SIZE = -2
OUTSIDE = -3
NO_FRAME = -4
"""Row status codes written by :func:`decode_rows`."""

_RAW = 1  # the metadata's mode of raw images (ffload.formats.fields.image.RAW)
_MCU_WIDTH = np.array(tj.MCU_WIDTH, np.int64)

_lib = tj.library()
if _lib is not None:
    _init, _destroy = _lib.tj3Init, _lib.tj3Destroy  # from Python (ctypes); the rest from compiled code
    _get, _header, _scale = tj.NUMBA["tj3Get"], tj.NUMBA["tj3DecompressHeader"], tj.NUMBA["tj3SetScalingFactor"]
    _crop, _decompress = tj.NUMBA["tj3SetCroppingRegion"], tj.NUMBA["tj3Decompress8"]
else:

    @njit(nogil=True, cache=True)
    def _absent(*args):
        """Stands for the tj3 functions without a library (decode_rows never calls it: handle 0)."""
        return -1

    _get = _header = _scale = _crop = _decompress = _absent


def backend() -> str:
    """``'turbojpeg'`` (the compiled TurboJPEG 3 path) or ``'opencv'`` (the fallback)."""
    return "turbojpeg" if _lib is not None else "opencv"


_warned: list = []


def warn_if_fallback() -> None:
    """Emit, once per process, a ``RuntimeWarning`` that JPEGs decode through the OpenCV fallback."""
    if _lib is None and not _warned:
        _warned.append(True)
        warnings.warn(
            "ffload: no TurboJPEG 3 library found (pip install turbojpeg==0.0.2); JPEG "
            "images decode through the slower OpenCV fallback, one Python call per sample",
            RuntimeWarning,
            stacklevel=3,
        )


class _Handle:
    """A decompression handle of the calling thread; destroyed with the thread's local storage.
    ``fast_dct``: its ``TJPARAM_FASTDCT`` setting (libjpeg-turbo's default: off)."""

    def __init__(self):
        self.value = int(_init(tj.TJINIT_DECOMPRESS)) if _lib is not None else 0
        if _lib is not None and not self.value:
            raise RuntimeError(f"tj3Init failed: {_lib.error(0)}")
        self.fast_dct = False

    def set_fast_dct(self, on: bool) -> None:
        """Switch libjpeg-turbo's fast integer IDCT on or off (``tj3Set(TJPARAM_FASTDCT)``; kept
        by the handle across images)."""
        if self.value and on != self.fast_dct:
            if _lib.tj3Set(self.value, tj.TJPARAM_FASTDCT, int(on)) != 0:
                raise RuntimeError(f"tj3Set(TJPARAM_FASTDCT) failed: {_lib.error(self.value)}")
            self.fast_dct = on

    def __del__(self):
        if self.value and _lib is not None:
            _destroy(self.value)
            self.value = 0


_local = threading.local()


def thread_handle(fast_dct: bool = False) -> int:
    """The calling thread's TurboJPEG decompressor (``tjhandle`` as an int, created on first use,
    freed when the thread ends), set to decode with the fast IDCT or not; 0 without the library."""
    handle = getattr(_local, "handle", None)
    if handle is None:
        handle = _local.handle = _Handle()
    handle.set_fast_dct(bool(fast_dct))
    return handle.value


SCRATCH_KEPT = 1 << 22
"""Bytes up to which a thread keeps a scratch array of :func:`decode_batch` for its next batches
(larger ones, for images of more than about 1.4 megapixels, are allocated per batch: their
decoding costs far more than the allocation, and a worker does not hold on to the largest image's
size)."""

_SCRATCH_DTYPES = (np.uint8, np.uint16, np.uint8, np.int64)


def _thread_scratch(*lengths: int) -> list[np.ndarray]:
    """The calling thread's scratch arrays for :func:`decode_batch`: ``(pixels,) uint8``,
    ``(resize,) uint16``, ``(payload,) uint8`` and ``(blocks,) int64`` of at least ``lengths``
    elements. Each is the thread's kept array when that is large enough, else a new one, kept for
    later batches when it has at most :data:`SCRATCH_KEPT` bytes. A worker decodes one batch at a
    time, so its batches share them instead of allocating four arrays each: for batches of small
    images that allocation is Python work under the GIL, serial across workers."""
    kept = getattr(_local, "scratch", None)
    if kept is None:
        kept = _local.scratch = [np.empty(0, d) for d in _SCRATCH_DTYPES]
    out = []
    for k, (n, dtype) in enumerate(zip(lengths, _SCRATCH_DTYPES)):
        if kept[k].shape[0] >= n:
            out.append(kept[k])
            continue
        array = np.empty(n, dtype)
        if array.nbytes <= SCRATCH_KEPT:
            kept[k] = array
        out.append(array)
    return out


def failure_message(handle: int) -> str:
    """libjpeg-turbo's message for the failed call on ``handle``, the calling thread's handle
    (``tj3GetErrorStr``), which is then replaced: in libjpeg-turbo 3.0 a handle whose
    ``tj3DecompressHeader`` failed fails every later call on it."""
    message = _lib.error(handle)
    _local.handle = _Handle()
    return message


def header_size(data: np.ndarray) -> tuple[tuple[int, int] | None, str]:
    """``((width, height), "")`` of the JPEG ``data`` (``(n,) uint8``, C-contiguous; pixels) from
    ``tj3DecompressHeader`` on the calling thread's handle, or ``(None, message)`` with
    libjpeg-turbo's message (the failed handle is replaced). Data without a frame header (tables
    only) reads as success with the handle's previous size: compare with :func:`frame_size` where
    that matters. Needs the library (:func:`backend` ``'turbojpeg'``)."""
    handle = thread_handle()
    if _lib.tj3DecompressHeader(handle, data.ctypes.data, data.size) != 0:
        return None, failure_message(handle)
    return (_lib.tj3Get(handle, tj.TJPARAM_JPEGWIDTH), _lib.tj3Get(handle, tj.TJPARAM_JPEGHEIGHT)), ""


def decode_whole(data: np.ndarray, out: np.ndarray, m: int = 8) -> str:
    """Decode the whole JPEG ``data`` (``(n,) uint8``) at DCT scale ``m/8`` (``m`` in 1..8, pixels
    ``ceil(side * m / 8)``, TurboJPEG's ``TJSCALED``) to RGB into ``out``, a C-contiguous
    ``(H, W, 3) uint8`` array of that size for the size :func:`header_size` just gave for the same
    data on this thread (``tj3Decompress8`` re-reads that header and writes ``H * W * 3`` bytes),
    with the accurate IDCT and no cropping region. Returns ``""``, or libjpeg-turbo's message for
    an error or a warning (the module's warnings rule; the failed handle is replaced)."""
    handle = thread_handle()
    if (
        _lib.tj3SetScalingFactor(handle, tj.pack2(*scale_fraction(m))) != 0
        or _lib.tj3SetCroppingRegion(handle, tj.pack2(0, 0), tj.pack2(0, 0)) != 0
        or _lib.tj3Decompress8(handle, data.ctypes.data, data.size, out.ctypes.data, out.shape[1] * 3, tj.TJPF_RGB) != 0
    ):
        return failure_message(handle)
    return ""


@njit(nogil=True, cache=True)
def scale_numerator(h, w, out_h, out_w, mode=AUTO):
    """The DCT scaling numerator ``M`` (scale ``M/8``) for an ``h x w`` crop box resized to
    ``out_h x out_w`` (pixels) with resize ``mode`` (:mod:`.resize`): 4 when the box is at least 4x
    the output on both sides (the half-size box >= 2x the output; 8x for torchvision's antialiased
    bilinear, whose parity rule is one grey level), else 8 (the module docstring says why)."""
    k = 4 if mode == AUTO else 8
    return 4 if h >= k * out_h and w >= k * out_w else 8


@njit(nogil=True, cache=True)
def scaled_box(top, left, h, w, height, width, out_h, out_w, mode=AUTO):
    """``(M, y0, x0, y1, x1)``: the DCT scaling numerator ``M`` (:func:`scale_numerator`) for a
    crop box ``(top, left, h, w)`` of a ``height x width`` JPEG and an ``out_h x out_w`` output,
    and the rows ``[y0, y1)`` and columns ``[x0, x1)`` of the scaled image that hold the box (its
    edges times ``M/8``, rounded outwards). Pixels; ``mode`` as :func:`scale_numerator`."""
    m = scale_numerator(h, w, out_h, out_w, mode)
    sh = (height * m + 7) // 8
    sw = (width * m + 7) // 8
    y0 = min(top * m // 8, sh - 1)
    x0 = min(left * m // 8, sw - 1)
    y1 = max(min(((top + h) * m + 7) // 8, sh), y0 + 1)
    x1 = max(min(((left + w) * m + 7) // 8, sw), x0 + 1)
    return m, y0, x0, y1, x1


@njit(nogil=True, cache=True)
def scale_fraction(m):
    """``(num, den)``: the DCT scale ``m/8`` in lowest terms, as TurboJPEG lists its factors
    (``tj3SetScalingFactor`` refuses 4/8 but takes 1/2)."""
    num = m
    den = 8
    while num % 2 == 0 and den > 1:
        num //= 2
        den //= 2
    return num, den


@njit(nogil=True, cache=True)
def frame_offset(data, p, n):
    """Offset from ``p`` of the first frame header (an SOFn marker) of the JPEG ``data[p:p + n]``
    (1-D uint8) before its first scan, or -1 (:func:`.restarts.headers`' strict walk of the
    marker segments). Where libjpeg-turbo reads such data without an error, it walks the same
    segments (``jdmarker.c``'s ``next_marker`` only differs by skipping non-marker bytes, refused
    here) and so takes its frame size from this same header."""
    return restarts.headers(data, p, n)[0]


@njit(nogil=True, cache=True)
def frame_size(data, p, n):
    """``(height, width)`` of the frame header :func:`frame_offset` finds (pixels); ``(-1, -1)``
    without one or when the data ends inside it."""
    _, _, height, width, _, _, _, _ = restarts.headers(data, p, n)
    return height, width


@njit(nogil=True, cache=True)
def crop_columns(x0, x1, mcu, width):
    """``(x, w)``: the columns of ``tj3SetCroppingRegion`` for a box's columns ``[x0, x1)`` of an
    image ``width`` pixels wide (at the decode's scale) whose iMCU is ``mcu`` pixels: a pixel
    beside the box on each side inside the image (fancy upsampling, step 3 of the module
    docstring), the left edge moved down to the iMCU grid."""
    x = (max(x0 - 1, 0) // mcu) * mcu
    return x, min(x1 + 1, width) - x


_CACHE = _lib is not None
"""Cache the TurboJPEG callers on disk only where the library is loaded: code compiled against
its symbols must never be loaded by a process without it (the fallback compiles ``_absent``)."""


@njit(nogil=True, cache=_CACHE)
def _decode_jpeg(
    handle,
    region,
    p,
    n,
    height,
    width,
    box,
    window,
    mode,
    out_h,
    out_w,
    scratch,
    cut_buf,
    starts,
    flip,
    out,
    d0,
    tmp,
    info,
):
    """Decode one JPEG and resize its box into ``out[d0:]``; returns a status code.

    An image decoded whole (no DCT scaling, the box is the image) whose frame header
    (:func:`frame_size`) gives the metadata's size skips ``tj3DecompressHeader``:
    ``tj3Decompress8`` reads the headers again itself (about a tenth of a CIFAR-sized image's
    decode), and it takes the same frame size (:func:`frame_offset`), so the output cannot outgrow
    the row it was sized for. That re-read happens because the handle is fresh or its last call
    ended (a handle that failed is replaced, :func:`decode_batch`). What changes for damaged data:
    a warning in the headers (say an unknown JFIF version) now fails in ``tj3Decompress8``, after
    the row was written; the sample is reported as corrupt either way.
    A TurboJPEG >= 3.1 (a system library) checks ICC profiles only in ``tj3DecompressHeader``.

    A JPEG with restart markers that tile its MCU rows, of the metadata's size, and a box that
    needs fewer of its segments than the usual path would entropy-decode (9 in 10 at most), is
    decoded from the JPEG of those segments alone (:mod:`.restarts`) written into ``cut_buf``
    (``uint8``, at least ``n + 16`` bytes), with ``starts`` (``int64``) for the segment offsets;
    the box is then taken in that smaller image's coordinates, with the same pixels.

    ``window`` ``(4,) float64`` is the area resampled, inside the box (:func:`decode_rows`); ``mode``
    the resize mode (:mod:`.resize`)."""
    top, left, h, w = box[0], box[1], box[2], box[3]
    wy, wx, wh, ww = window[0] - top, window[1] - left, window[2], window[3]  # the window, from the box's corner
    exact = wy == 0 and wx == 0 and wh == h and ww == w
    m, y0, x0, y1, x1 = scaled_box(top, left, h, w, height, width, out_h, out_w, mode)
    whole = m == 8 and top == 0 and left == 0 and h == height and w == width
    layout = restarts.headers(region, p, n)
    sof, sos_end, fh, fw, mcu_w, mcu_h, interval, _ = layout
    buf = region.ctypes.data + np.uint64(p)
    size = n
    if not whole and fh == height and fw == width and n + 16 <= cut_buf.shape[0]:
        r0, r1, c0, c1, per_row, ch, cw = restarts.plan(region, p, n, layout, y0, x0, y1, x1, m, starts)
        if r0 >= 0:
            size = restarts.cut(region, p, sof, sos_end, starts, per_row, r0, r1, c0, c1, ch, cw, cut_buf)
            buf = cut_buf.ctypes.data
            top -= r0 * mcu_h
            left -= c0 * interval * mcu_w
            height, width, fh, fw = ch, cw, ch, cw
            m, y0, x0, y1, x1 = scaled_box(top, left, h, w, height, width, out_h, out_w, mode)
    num, den = scale_fraction(m)
    sw = (width * m + 7) // 8
    sh = (height * m + 7) // 8
    rx, ry, rw, rh = 0, 0, sw, sh  # the whole (scaled) image
    if not (whole and fh == height and fw == width):
        if _header(handle, buf, size) != 0:
            return FAILED
        jw = _get(handle, tj.TJPARAM_JPEGWIDTH)
        jh = _get(handle, tj.TJPARAM_JPEGHEIGHT)
        if jw != width or jh != height:  # the handle's size may be the previous image's
            if fh < 0 or (fh == height and fw == width):
                return NO_FRAME
            info[0] = fw
            info[1] = fh
            return BAD_SIZE
        subsamp = _get(handle, tj.TJPARAM_SUBSAMP)
        if 0 <= subsamp < _MCU_WIDTH.shape[0]:
            rx, rw = crop_columns(x0, x1, (_MCU_WIDTH[subsamp] * m + 7) // 8, sw)
            ry, rh = y0, y1 - y0
    if _scale(handle, tj.pack2(num, den)) != 0:
        return FAILED
    if rx == 0 and ry == 0 and rw == sw and rh == sh:  # no cropping region (also resets the handle's)
        if _crop(handle, tj.pack2(0, 0), tj.pack2(0, 0)) != 0:
            return FAILED
    elif _crop(handle, tj.pack2(rx, ry), tj.pack2(rw, rh)) != 0:
        return FAILED
    direct = m == 8 and exact and h == out_h and w == out_w and rx == x0 and rw == w and not flip
    target = out.ctypes.data + np.uint64(d0) if direct else scratch.ctypes.data
    if _decompress(handle, buf, size, target, rw * 3, tj.TJPF_RGB) != 0:
        return FAILED  # errors and warnings alike (the module's warnings rule)
    if direct:
        return OK
    if m == 8 and exact and h == out_h and w == out_w:
        copy_rgb(scratch, ((top - ry) * rw + left - rx) * 3, rw * 3, out, d0, out_h, out_w, flip)
        return OK
    f = m / 8
    resize_rgb(
        scratch,
        0,
        rw * 3,
        rh,
        rw,
        (top + wy) * f - ry,
        (left + wx) * f - rx,
        wh * f,
        ww * f,
        pick(mode, wh, ww, out_h, out_w),
        out,
        d0,
        out_h,
        out_w,
        flip,
        tmp,
    )
    return OK


@njit(nogil=True, cache=_CACHE)
def decode_rows(
    handle,
    indices,
    modes,
    heights,
    widths,
    ptrs,
    sizes,
    region,
    boxes,
    windows,
    mode,
    flips,
    out,
    out_h,
    out_w,
    scratch,
    cut_buf,
    starts,
    tmp,
    status,
    info,
):
    """Decode, crop, resize (and flip) every row of a batch into ``out``.

    Args:
        handle: a TurboJPEG decompressor (:func:`thread_handle`), or 0: JPEG rows are then left
            :data:`PENDING` for the Python fallback.
        indices: ``(B,) int64`` sample ids; modes/heights/widths: ``(N,)`` metadata columns;
            ptrs/sizes: ``(N,) uint64`` payload offsets/sizes (bytes) into ``region`` (1-D uint8).
        boxes: ``(B, 4) int64`` crop boxes ``(top, left, height, width)``, stored-image pixels: what is
            decoded (and, for :data:`~.resize.TRIANGLE_SOURCE`, where the filter's taps may reach).
        windows: ``(B, 4) float64`` the area resampled to the output, ``(top, left, height, width)``
            in stored-image pixels inside the box (the box itself as floats, unless a resize then crop
            is decoded: then the crop's area of the image, its box widened by the filter's support).
        mode: the resize mode (:mod:`.resize`: :data:`~.resize.AUTO`, or a mode for every row).
        flips: ``(B,) bool`` mirror the row left-right.
        out: flat ``(B * out_h * out_w * 3,) uint8`` output.
        scratch: ``uint8`` of at least ``max(H * W) * 3`` bytes over the batch; tmp: ``uint16`` of
            at least :func:`~.resize.scratch_size` ``(out_h, out_w, max(W))`` elements.
        cut_buf, starts: ``uint8`` and ``int64`` scratch of the restart-segment path
            (:func:`_decode_jpeg`): ``max(size) + 16`` bytes and ``max(ceil(H/8) * ceil(W/8)) + 2``
            elements over the batch; smaller ones turn that path off.
        status: ``(B,) int64`` out: a status code per row; info: ``(2,) int64`` out: the JPEG's
            ``(width, height)`` for :data:`BAD_SIZE`.

    Returns:
        -1 when every row is done (or pending), else the row that failed (rows after it untouched).
    """
    row = out_h * out_w * 3
    for b in range(indices.shape[0]):
        s = indices[b]
        p = np.int64(ptrs[s])
        n = np.int64(sizes[s])
        height = np.int64(heights[s])
        width = np.int64(widths[s])
        if p < 0 or p + n > region.shape[0]:
            status[b] = OUTSIDE
            return b
        if modes[s] == _RAW:
            if n < height * width * 3:
                status[b] = OUTSIDE
                return b
            status[b] = OK
            top, left, h, w = boxes[b, 0], boxes[b, 1], boxes[b, 2], boxes[b, 3]
            wy, wx, wh, ww = windows[b, 0] - top, windows[b, 1] - left, windows[b, 2], windows[b, 3]
            start = p + (top * width + left) * 3
            if h == out_h and w == out_w and wy == 0 and wx == 0 and wh == h and ww == w:
                copy_rgb(region, start, width * 3, out, b * row, out_h, out_w, flips[b])
            else:
                resize_rgb(
                    region,
                    start,
                    width * 3,
                    h,
                    w,
                    wy,
                    wx,
                    wh,
                    ww,
                    pick(mode, wh, ww, out_h, out_w),
                    out,
                    b * row,
                    out_h,
                    out_w,
                    flips[b],
                    tmp,
                )
        elif handle == 0:
            status[b] = PENDING
        else:
            status[b] = _decode_jpeg(
                handle,
                region,
                p,
                n,
                height,
                width,
                boxes[b],
                windows[b],
                mode,
                out_h,
                out_w,
                scratch,
                cut_buf,
                starts,
                flips[b],
                out,
                b * row,
                tmp,
                info,
            )
            if status[b] < 0:
                return b
    return -1


def _decode_rows_opencv(
    indices, heights, widths, ptrs, sizes, region, boxes, windows, mode, flips, out, out_h, out_w, tmp, status, info
):
    """The fallback for the :data:`PENDING` rows (JPEGs): ``cv2.imdecode`` at 1/k, k = 8 / M
    (:func:`scale_numerator`, the compiled path's factor), then the compiled resize of the window's
    exact area (fractional edges in the reduced image). A frame header (:func:`frame_size`)
    declaring another size than the metadata's is :data:`BAD_SIZE` before anything is decoded (a
    hostile header would make OpenCV allocate its size), as in the compiled path. Returns -1 or
    the failing row, as :func:`decode_rows`."""
    flags = {1: cv2.IMREAD_COLOR_RGB, 2: cv2.IMREAD_REDUCED_COLOR_2}
    row = out_h * out_w * 3
    for b in np.flatnonzero(status == PENDING).tolist():
        s = int(indices[b])
        k = 8 // scale_numerator(boxes[b, 2], boxes[b, 3], out_h, out_w, mode)
        p, n = int(ptrs[s]), int(sizes[s])
        h, w = int(heights[s]), int(widths[s])
        fh, fw = frame_size(region, p, n)
        if fh >= 0 and (fh, fw) != (h, w):  # refused before OpenCV allocates the frame header's size
            info[:] = fw, fh
            status[b] = BAD_SIZE
            return b
        image = cv2.imdecode(region[p : p + n], flags[k])
        if image is None:
            status[b] = FAILED
            return b
        if k > 1:
            image = cv2.cvtColor(image, cv2.COLOR_BGR2RGB)
        if image.shape[:2] != (-(-h // k), -(-w // k)):
            info[:] = image.shape[1] * k, image.shape[0] * k
            status[b] = BAD_SIZE
            return b
        top, left, wh, ww = (float(v) for v in windows[b])
        src, stride = image.reshape(-1), image.shape[1] * 3
        if k == 1 and (wh, ww) == (out_h, out_w) and (top, left) == (int(top), int(left)):
            copy_rgb(src, (int(top) * w + int(left)) * 3, stride, out, b * row, out_h, out_w, bool(flips[b]))
        else:
            resize_rgb(
                src,
                0,
                stride,
                image.shape[0],
                image.shape[1],
                top / k,
                left / k,
                wh / k,
                ww / k,
                pick(mode, wh, ww, out_h, out_w),
                out,
                b * row,
                out_h,
                out_w,
                bool(flips[b]),
                tmp,
            )
        status[b] = OK
    return -1


@njit(nogil=True, cache=_CACHE)
def batch_extents(indices, heights, widths, sizes, out):
    """The scratch sizes of a batch, in one pass: ``out`` (``(4,) int64``, zeros in) gets the
    maxima over the rows ``indices`` (``(B,) int64``) of ``height * width`` (pixels), ``width``
    (pixels), ``sizes`` (payload bytes) and ``ceil(height / 8) * ceil(width / 8)`` (8 x 8 blocks:
    :func:`~.restarts.starts_size` less its two extra elements); ``heights``, ``widths``: ``(N,)``
    metadata columns, ``sizes``: ``(N,) uint64``."""
    for b in range(indices.shape[0]):
        s = indices[b]
        h = np.int64(heights[s])
        w = np.int64(widths[s])
        out[0] = max(out[0], h * w)
        out[1] = max(out[1], w)
        out[2] = max(out[2], np.int64(sizes[s]))
        out[3] = max(out[3], ((h + 7) // 8) * ((w + 7) // 8))


def decode_batch(indices, metadata, ptrs, sizes, region, boxes, flips, out, fast_dct=False, mode=AUTO, windows=None):
    """Decode a batch of RGB images (raw or JPEG) into ``out`` ``(B, out_h, out_w, 3) uint8``.

    One GIL-free compiled call for the batch (:func:`decode_rows`); on the fallback backend, one
    ``cv2.imdecode`` per JPEG sample besides. Arguments as :func:`decode_rows`; ``metadata`` is the
    field's structured metadata column (``mode``, ``height``, ``width``); ``fast_dct``: full-scale
    (8/8) JPEG decodes use libjpeg-turbo's fast integer IDCT (``TJPARAM_FASTDCT``; the scaled
    IDCTs of M/8 < 1 have no fast variant; the OpenCV fallback ignores it); ``mode`` the resize
    mode (:mod:`.resize`; :data:`~.resize.AUTO` picks area or linear per row); ``windows``
    ``(B, 4) float64`` the areas resampled inside the boxes (:func:`decode_rows`; None: the boxes).

    Returns:
        ``(row, status, detail)``: ``row`` is -1 when every row succeeded, else the failing row with
        its status code and a message (libjpeg-turbo's error string, or the JPEG's real size).
    """
    batch = len(indices)
    if out.shape[0] != batch or out.shape[3:] != (3,) or not out.flags.c_contiguous:
        raise ConfigurationError(f"decode_batch: out must be a C-contiguous ({batch}, H, W, 3) array, got {out.shape}")
    out_h, out_w = out.shape[1], out.shape[2]
    modes, heights, widths = metadata["mode"], metadata["height"], metadata["width"]
    extents = np.zeros(4, np.int64)
    batch_extents(indices, heights, widths, sizes, extents)  # one GIL-free pass, not five NumPy gathers
    max_pixels, max_width, max_size, max_blocks = extents.tolist()
    scratch, tmp, cut_buf, starts = _thread_scratch(
        max_pixels * 3 if batch else 0,
        scratch_size(out_h, out_w, max_width) if batch else 0,
        max_size + 16 if batch else 0,
        max_blocks + 2 if batch else 0,
    )
    status = np.zeros(batch, np.int64)
    info = np.zeros(2, np.int64)
    windows = boxes.astype(np.float64) if windows is None else np.ascontiguousarray(windows, dtype=np.float64)
    flat = out.reshape(-1)
    handle = thread_handle(fast_dct)
    bad = decode_rows(
        handle,
        indices,
        modes,
        heights,
        widths,
        ptrs,
        sizes,
        region,
        boxes,
        windows,
        mode,
        flips,
        flat,
        out_h,
        out_w,
        scratch,
        cut_buf,
        starts,
        tmp,
        status,
        info,
    )
    if bad < 0 and handle == 0:
        bad = _decode_rows_opencv(
            indices,
            heights,
            widths,
            ptrs,
            sizes,
            region,
            boxes,
            windows,
            mode,
            flips,
            flat,
            out_h,
            out_w,
            tmp,
            status,
            info,
        )
    if bad < 0:
        return -1, OK, ""
    code = int(status[bad])
    if code == FAILED:
        detail = failure_message(handle) if handle else "OpenCV could not decode it"
    elif code == BAD_SIZE:
        detail = f"{info[0]}x{info[1]}"
    elif code == NO_FRAME:
        detail = "no image: no frame header (SOF marker) and scan (SOS marker) before its end"
    else:
        detail = "payload lies outside the data region"
    return int(bad), code, detail
