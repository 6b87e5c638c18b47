"""Crop-sized JPEGs cut out of a JPEG's restart intervals, so that libjpeg-turbo entropy-decodes
only the MCUs of a crop box.

Why
---
A baseline JPEG's scan is one Huffman-coded bit stream: to decode an MCU, every MCU before it
must be entropy-decoded (the DC coefficients are coded as differences from the previous block).
``tj3SetCroppingRegion`` skips the inverse DCT and colour conversion outside the box and stops
after its last row, but still entropy-decodes every MCU above the box and beside it, most of a
q90 decode's time. A *restart marker* (``RSTm``, ITU-T T.81 B.2.1; ``cv2.IMWRITE_JPEG_RST_INTERVAL``,
libjpeg's ``restart_interval``) every ``Ri`` MCUs ends a byte-aligned segment and resets the DC
predictions, so each segment decodes on its own. Where the segments tile the MCU grid (``Ri``
divides the MCUs per row), the segments that cover a crop box, with their markers renumbered,
are a valid JPEG of that rectangle: the same tables, a frame header with the rectangle's size, the
same restart interval. Its pixels are the full decode's, except in the rectangle's outermost
pixel row or column on a side that is not the image's edge, where fancy chroma upsampling sees
the rectangle's edge instead of the neighbouring MCU (libjpeg-turbo's ``h2v1``/``h2v2``
upsamplers, one output pixel). :func:`crop_rect` keeps one more MCU on such a side when the box
reaches it, so the pixels of the box are exactly those of a full decode.

The same technique serves tiled JPEG readers (Bio-Formats' ``JPEGTurboService`` decodes tiles
of huge JPEGs from their restart markers).

Cost and limits
---------------
* libjpeg-turbo decodes a scan with restart markers through its slower, checked Huffman decoder
  (its fast path is off whenever ``restart_interval`` is set): a whole-image decode of such a file
  takes a little longer, and each marker adds a few bytes (measured: ``docs/developer-notes.md``,
  ffload.codecs.restarts). ``RGBImageField``'s ``jpeg_restart_interval`` says when ffload writes them.
* Only one-scan sequential Huffman JPEGs (SOF0/SOF1, all components in the scan) whose interval
  divides the MCUs per row are cut; anything else (progressive, arithmetic, a DNL height, markers
  out of sequence or missing) decodes the usual way, which also reports errors.
* Damaged data outside the box is not read, so it is not detected (as for the rows below a box
  on the usual path).

All functions are numba ``nopython``, ``nogil``, and index only within ``data[p:p + n]``;
offsets into ``data`` are absolute (the caller's ``p`` included). ``jpeg.py``'s callers are cached
on disk by numba, keyed on their own source: after editing this module, delete
``ffload/loaders/__pycache__/*.nbi`` and ``*.nbc``.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ffload._jit.cextern import extern, process_symbol

AVAILABLE = process_symbol("memchr")
"""Whether the C library's ``memchr`` was found (POSIX systems); without it :func:`segment_starts`
finds no segment and JPEGs are decoded the usual way."""
if AVAILABLE:
    _memchr = extern("memchr", "p", "pip")
else:

    @njit(nogil=True, cache=False)
    def _memchr(pointer, byte, size):
        """Stands for ``memchr`` where the C library has none: no byte found."""
        return 0


NO_LAYOUT = (-1, -1, -1, -1, 0, 0, 0, False)


@njit(nogil=True, cache=True)
def _u16(data, a):
    return (np.int64(data[a]) << 8) | np.int64(data[a + 1])


@njit(nogil=True, cache=True)
def headers(data, p, n):
    """Walk the marker segments of the JPEG ``data[p:p + n]`` (1-D uint8) from SOI to its first
    scan (ITU-T T.81 B.1.1: ``FF xx`` then a 2-byte big-endian length for all but the standalone
    markers; ``FF`` fill bytes allowed). Strict: any byte other than a marker where one must start
    ends the walk.

    Returns ``(sof, sos_end, height, width, mcu_w, mcu_h, interval, cuttable)``: the offset from
    ``p`` of the first frame header (SOFn, -1 if none comes before the first scan or the end) and
    the end of the first scan header (-1 if none), the frame's size (pixels; -1 without a frame
    header or when the data ends inside it), the MCU's size (pixels: 8 x 8 for one component,
    ``8 h_max x 8 v_max`` otherwise; meaningful only when ``cuttable``), the restart interval
    (MCUs, 0 without a DRI), and whether :func:`plan` may cut the image: a sequential Huffman
    frame (SOF0/SOF1) with a nonzero height, valid sampling factors and one scan of all its
    components.
    """
    p = np.int64(p)
    n = np.int64(n)
    if n < 4 or data[p] != 0xFF or data[p + 1] != 0xD8:
        return NO_LAYOUT
    i = np.int64(2)
    sof = np.int64(-1)
    sequential = False
    comps = np.int64(0)
    height = width = np.int64(-1)
    hmax = vmax = np.int64(1)
    interval = np.int64(0)
    while i + 4 <= n:
        a = p + i
        if data[a] != 0xFF:
            break
        marker = data[a + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker == 0xD9 or marker == 0x00:  # the end, or no marker
            break
        if 0xD0 <= marker <= 0xD7 or marker == 0x01:  # standalone: RSTn, TEM
            i += 2
            continue
        length = _u16(data, a + 2)
        is_sof = 0xC0 <= marker <= 0xCF and marker != 0xC4 and marker != 0xC8 and marker != 0xCC
        if is_sof and sof < 0:  # SOF0..SOF15 (not DHT, JPG, DAC): the first frame header
            sof = i
            if i + 9 <= n:
                height = _u16(data, a + 5)
                width = _u16(data, a + 7)
            if length >= 8 and i + 2 + length <= n:
                comps = np.int64(data[a + 9])
                sequential = (marker == 0xC0 or marker == 0xC1) and 1 <= comps <= 4 and length == 8 + 3 * comps
                for c in range(comps if sequential else 0):
                    hs = np.int64(data[a + 11 + 3 * c]) >> 4
                    vs = np.int64(data[a + 11 + 3 * c]) & 15
                    sequential &= hs >= 1 and vs >= 1
                    hmax = max(hmax, hs)
                    vmax = max(vmax, vs)
        if length < 2 or i + 2 + length > n:
            break
        if marker == 0xDA:  # SOS: the first scan
            if sof < 0:
                break
            ns = np.int64(data[a + 4]) if length >= 3 else np.int64(-1)
            cuttable = sequential and height > 0 and ns == comps and length == 6 + 2 * ns and hmax <= 4 and vmax <= 4
            mcu_w = 8 if comps == 1 else 8 * hmax
            mcu_h = 8 if comps == 1 else 8 * vmax
            return sof, i + 2 + length, height, width, mcu_w, mcu_h, interval, cuttable
        if marker == 0xDD and length == 4:  # DRI
            interval = _u16(data, a + 4)
        i += 2 + length
    return sof, np.int64(-1), height, width, np.int64(0), np.int64(0), interval, False


@njit(nogil=True, cache=True)
def _units(lo, hi, unit, count):
    """The units ``[u0, u1)`` of ``unit`` pixels (of ``count``) that hold the pixels ``[lo, hi)``,
    with one more unit on a side where ``lo`` or ``hi`` falls on a unit edge inside the image."""
    u0 = lo // unit
    u1 = min((hi + unit - 1) // unit, count)
    if u0 > 0 and lo == u0 * unit:
        u0 -= 1
    if u1 < count and hi == u1 * unit:
        u1 += 1
    return u0, u1


@njit(nogil=True, cache=True)
def crop_rect(y0, x0, y1, x1, m, height, width, mcu_w, mcu_h, interval):
    """``(r0, r1, c0, c1)``: the MCU rows ``[r0, r1)`` and restart-segment columns ``[c0, c1)`` (a
    segment is ``interval`` MCUs) whose segments hold the rows ``[y0, y1)`` and columns
    ``[x0, x1)`` of the image decoded at DCT scale ``m/8`` (pixels of that scale), with one more
    MCU on each side where the rectangle would otherwise end on the box's first or last pixel
    inside the image (fancy upsampling, see the module docstring); or ``(-1, -1, -1, -1)`` when the
    segments do not tile the MCU rows (``interval`` does not divide the MCUs per row)."""
    per_row = (width + mcu_w - 1) // mcu_w
    rows = (height + mcu_h - 1) // mcu_h
    if interval <= 0 or per_row % interval != 0:
        return -1, -1, -1, -1
    r0, r1 = _units(y0, y1, mcu_h * m // 8, rows)  # an MCU at scale m/8 (mcu sizes are multiples of 8)
    k0, k1 = _units(x0, x1, mcu_w * m // 8, per_row)
    return r0, r1, k0 // interval, (k1 + interval - 1) // interval


@njit(nogil=True, cache=AVAILABLE)
def segment_starts(data, start, end, need, starts):
    """Find the first ``need`` restart segments of the scan data ``data[start:end]``.

    ``starts[k]`` (``k < need``) is the offset of segment ``k``'s first byte; ``starts[need]`` is
    2 past the end of segment ``need - 1`` (where the next segment would start after its 2-byte
    marker; fill bytes before a marker stay in the segment). Returns ``need`` on success, or fewer
    (the number of complete segments before the scan ended or the data ran out, or before a
    restart marker out of sequence: segment ``k`` must end with ``RST(k mod 8)`` unless it is the
    scan's last). ``data`` is a contiguous 1-D uint8 array; ``start``, ``end`` and the offsets are
    indices into it. ``starts`` needs ``need + 1`` elements. Each 0xFF byte is found with the C
    library's ``memchr`` (vectorised: a q90 scan holds one every ~100 bytes)."""
    base = data.ctypes.data
    starts[0] = start
    k = 0
    i = start
    while i + 1 < end:
        at = _memchr(base + np.uint64(i), 0xFF, end - 1 - i)
        if at == 0:
            return k
        i = np.int64(np.uint64(at) - base)  # unsigned: int64 - uint64 would be float64
        nxt = data[i + 1]
        if nxt == 0x00:  # a stuffed 0xFF data byte
            i += 2
            continue
        if nxt == 0xFF:  # a fill byte before a marker
            i += 1
            continue
        if 0xD0 <= nxt <= 0xD7 and nxt - 0xD0 != (k & 7):
            return k
        k += 1
        starts[k] = i + 2
        if k == need or not 0xD0 <= nxt <= 0xD7:  # done, or the scan's end (EOI or any marker)
            return k
        i += 2
    return k


@njit(nogil=True, cache=AVAILABLE)
def plan(data, p, n, layout, y0, x0, y1, x1, m, starts):
    """Whether to decode the box from its restart segments, and which: ``(r0, r1, c0, c1,
    per_row, height, width)`` for :func:`cut` (the rectangle of :func:`crop_rect`, the segments
    per MCU row, the cut image's size in pixels), or ``r0 = -1`` for the usual path.

    ``layout`` is :func:`headers`' tuple for the JPEG ``data[p:p + n]``; the box covers the rows
    ``[y0, y1)`` and columns ``[x0, x1)`` of the image at DCT scale ``m/8``. Cut only when the
    image may be cut, its segments tile the MCU rows, the rectangle holds at most 9 in 10 of the
    segments that the usual path entropy-decodes (every one up to the box's last row), ``starts``
    has room for them, and :func:`segment_starts` finds them all, in sequence."""
    sof, sos_end, height, width, mcu_w, mcu_h, interval, cuttable = layout
    if not cuttable or interval <= 0:
        return -1, -1, -1, -1, 0, 0, 0
    r0, r1, c0, c1 = crop_rect(y0, x0, y1, x1, m, height, width, mcu_w, mcu_h, interval)
    per_row = (width + mcu_w - 1) // mcu_w // interval
    need = (r1 - 1) * per_row + c1
    if (
        r0 < 0
        or (r1 - r0) * (c1 - c0) * 10 > r1 * per_row * 9
        or need >= starts.shape[0]
        or segment_starts(data, p + sos_end, p + n, need, starts) != need
    ):
        return -1, -1, -1, -1, 0, 0, 0
    span = interval * mcu_w  # pixels per segment column
    return (
        r0,
        r1,
        c0,
        c1,
        per_row,
        min(height - r0 * mcu_h, (r1 - r0) * mcu_h),
        min(width - c0 * span, (c1 - c0) * span),
    )


def starts_size(heights, widths) -> int:
    """Elements of a ``starts`` array that holds any image of the ``heights`` x ``widths``
    (pixels, arrays) given: one per 8 x 8 block (the smallest MCU) plus two."""
    h = np.asarray(heights, np.int64)
    w = np.asarray(widths, np.int64)
    return int((((h + 7) // 8) * ((w + 7) // 8)).max()) + 2 if h.size else 0


@njit(nogil=True, cache=True)
def cut(data, p, sof, sos_end, starts, per_row, r0, r1, c0, c1, height, width, out):
    """Write into ``out`` (1-D uint8) a JPEG of the rectangle of MCU rows ``[r0, r1)`` and segment
    columns ``[c0, c1)`` (:func:`crop_rect`) of the JPEG ``data[p:]``: its headers up to the end
    of the first scan header (``sos_end``, :func:`headers`) with the frame size patched to
    ``height x width`` pixels, then per MCU row the bytes of its segments ``c0..c1-1`` as they lie
    (offsets ``starts``, :func:`segment_starts`, of a scan with ``per_row`` segments per row) with
    their restart markers renumbered from RST0, and EOI. ``starts`` must come from a
    :func:`segment_starts` that found every segment up to ``(r1 - 1) * per_row + c1`` (as
    :func:`plan` checks). Returns its length (bytes): at most that of the JPEG's own bytes up to
    the end of its last segment plus the EOI, as each row's first marker takes the place of the
    one that ended the row before it."""
    out[:sos_end] = data[p : p + sos_end]
    out[sof + 5] = height >> 8
    out[sof + 6] = height & 0xFF
    out[sof + 7] = width >> 8
    out[sof + 8] = width & 0xFF
    n = sos_end
    j = 0  # segments written
    for r in range(r0, r1):
        first = r * per_row + c0
        last = r * per_row + c1 - 1
        if j > 0:
            out[n] = 0xFF
            out[n + 1] = 0xD0 + ((j - 1) & 7)
            n += 2
        a = starts[first]
        b = starts[last + 1] - 2
        out[n : n + b - a] = data[a:b]
        for s in range(first, last):  # the markers inside the row: the byte after each 0xFF
            j += 1
            out[n + starts[s + 1] - 1 - a] = 0xD0 + ((j - 1) & 7)
        n += b - a
        j += 1
    out[n] = 0xFF
    out[n + 1] = 0xD9
    return n + 2
