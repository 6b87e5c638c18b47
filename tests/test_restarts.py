"""Crops decoded from a JPEG's restart segments (ffload.codecs.restarts through jpeg.decode_rows)
on real photos: the same pixels as the usual path and as a full decode, only the box's segments
read, and anything unusual left to the usual path."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from ffload.codecs import jpeg, restarts
from ffload.codecs.resize import scratch_size
from ffload.formats import RGBImageField
from ffload.loaders.decoders.rgb import RandomResizedCropRGBImageDecoder
from tests import test_jpeg
from tests.test_decoders import decode, write

pytestmark = pytest.mark.skipif(
    jpeg.backend() != "turbojpeg" or not restarts.AVAILABLE, reason="no TurboJPEG 3 library or no memchr"
)

photos = test_jpeg.photos  # the fixture: five ImageNet-sized photos (long side 430 px)

SAMPLING = {"4:2:0": 0x221111, "4:2:2": 0x211111, "4:4:4": 0x111111, "4:4:0": 0x121111, "4:1:1": 0x411111}


def encode(rgb, interval, sampling="4:2:0", progressive=False):
    params = [
        cv2.IMWRITE_JPEG_QUALITY,
        90,
        cv2.IMWRITE_JPEG_RST_INTERVAL,
        interval,
        cv2.IMWRITE_JPEG_SAMPLING_FACTOR,
        SAMPLING[sampling],
        cv2.IMWRITE_JPEG_PROGRESSIVE,
        int(progressive),
    ]
    return cv2.imencode(".jpg", np.ascontiguousarray(rgb[..., ::-1]), params)[1].ravel()


def decode_boxes(payloads, boxes, out_hw, cut=True):
    """``jpeg.decode_rows`` of JPEG ``payloads`` with crop ``boxes`` into ``out_hw``: with the
    restart path's buffers sized as ``decode_batch`` sizes them, or (``cut=False``) without any,
    which turns the path off. Returns ``(failed row, status, output)``."""
    hw = np.array([cv2.imdecode(p, cv2.IMREAD_UNCHANGED).shape[:2] for p in payloads], np.int64)
    region = np.concatenate(payloads)
    sizes = np.array([len(p) for p in payloads], np.uint64)
    ptrs = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.uint64)
    b = len(payloads)
    out = np.zeros((b, *out_hw, 3), np.uint8)
    h, w = hw[:, 0], hw[:, 1]
    cut_buf = np.empty(int(sizes.max()) + 16 if cut else 0, np.uint8)
    starts = np.empty(restarts.starts_size(h, w) if cut else 0, np.int64)
    status = np.zeros(b, np.int64)
    meta, region = test_jpeg.loader_typed(b, region)
    meta["height"][:b], meta["width"][:b] = h, w
    bad = jpeg.decode_rows(
        jpeg.thread_handle(),
        np.arange(b, dtype=np.int64),
        meta["mode"],
        meta["height"],
        meta["width"],
        ptrs,
        sizes,
        region,
        np.asarray(boxes, np.int64),
        np.asarray(boxes, np.float64),
        jpeg.AUTO,
        np.zeros(b, bool),
        out.reshape(-1),
        out_hw[0],
        out_hw[1],
        np.empty(int((h * w).max()) * 3, np.uint8),
        cut_buf,
        starts,
        np.empty(scratch_size(out_hw[0], out_hw[1], int(w.max())), np.uint16),
        status,
        np.zeros(2, np.int64),
    )
    return bad, status, out


@pytest.mark.parametrize("sampling", list(SAMPLING))
@pytest.mark.parametrize("interval", [1, 3, 5])
def test_boxes_from_restart_segments_have_the_full_decodes_pixels(photos, sampling, interval):
    """Boxes at random offsets, a third of them on an image edge (top or bottom, left or right):
    copied boxes equal the full decode's pixels exactly; resized ones (full and half DCT scale)
    equal the usual path's. Intervals 3 and 5 divide the MCUs per row of some photos and not of
    others (the usual path). That the segments are used at all is
    :func:`test_only_the_boxs_segments_are_read`'s subject."""
    rng = np.random.default_rng(sum(map(ord, sampling)) + interval)
    payloads = [encode(p, interval, sampling) for p in photos]
    fulls = [cv2.imdecode(p, cv2.IMREAD_COLOR_RGB) for p in payloads]
    for out_hw, (lo, hi) in [((48, 40), (0, None)), ((40, 40), (40, 400)), ((24, 24), (96, 400))]:
        boxes = []  # copied (box = output), resized at full scale, at half scale (box >= 4x output)
        for full in fulls:
            h, w = full.shape[:2]
            bh, bw = out_hw if hi is None else (int(rng.integers(lo, min(hi, s) + 1)) for s in (h, w))
            y = int(rng.choice([0, h - bh, int(rng.integers(0, h - bh + 1))]))
            x = int(rng.choice([0, w - bw, int(rng.integers(0, w - bw + 1))]))
            boxes.append([y, x, bh, bw])
        bad, _, out = decode_boxes(payloads, boxes, out_hw)
        assert bad == -1
        if hi is None:
            for row, full, (y, x, bh, bw) in zip(out, fulls, boxes):
                np.testing.assert_array_equal(row, full[y : y + bh, x : x + bw])
        else:
            np.testing.assert_array_equal(out, decode_boxes(payloads, boxes, out_hw, cut=False)[2])


@pytest.mark.parametrize("sampling, interval", [("4:2:0", 1), ("4:2:0", 3), ("4:4:4", 3), ("4:2:2", 1)])
def test_only_the_boxs_segments_are_read(photos, sampling, interval):
    """Segment 0 (the top-left MCUs) filled with all-ones bits, never a valid Huffman code: the
    usual path entropy-decodes it and fails with libjpeg-turbo's warning; a box away from it is
    decoded from its own segments, with the pixels of the undamaged file. (The 430 px photo has
    27 or 54 MCUs per row: 3 divides them.)"""
    assert photos[0].shape[1] == 430
    good = encode(photos[0], interval, sampling)
    damaged = good.copy()
    sof, sos_end, *_ = restarts.headers(good, 0, good.size)
    starts = np.empty(4, np.int64)
    assert restarts.segment_starts(good, sos_end, good.size, 2, starts) == 2
    damaged[starts[0] : starts[1] - 2] = np.resize(np.array([0xFF, 0x00], np.uint8), starts[1] - 2 - starts[0])
    box = [[200, 200, 64, 64]]
    bad, status, out = decode_boxes([damaged], box, (64, 64), cut=False)
    assert (bad, status[0]) == (0, jpeg.FAILED)
    assert "Corrupt JPEG data" in jpeg.failure_message(jpeg.thread_handle())
    bad, _, out = decode_boxes([damaged], box, (64, 64))
    assert bad == -1
    np.testing.assert_array_equal(out[0], cv2.imdecode(good, cv2.IMREAD_COLOR_RGB)[200:264, 200:264])


def test_markers_out_of_sequence_are_left_to_the_usual_path(photos):
    """A restart marker renumbered (RST3 where RST2 belongs) stops the segment walk, and the box
    below it is decoded the usual way, which fails with libjpeg-turbo's warning about the marker
    (a cut JPEG, renumbered, would have decoded)."""
    data = encode(photos[1], 1)
    _, sos_end, *_ = restarts.headers(data, 0, data.size)
    starts = np.empty(8, np.int64)
    assert restarts.segment_starts(data, sos_end, data.size, 6, starts) == 6
    data[starts[3] - 1] = 0xD3
    assert restarts.segment_starts(data, sos_end, data.size, 6, starts) == 2
    bad, status, _ = decode_boxes([data], [[150, 150, 64, 64]], (64, 64))
    assert (bad, status[0]) == (0, jpeg.FAILED)
    assert "RST" in jpeg.failure_message(jpeg.thread_handle())


def test_headers_describe_what_may_be_cut(photos):
    rgb = photos[2][:100, :130]
    sof, sos_end, h, w, mcu_w, mcu_h, interval, cuttable = restarts.headers(encode(rgb, 4), 0, encode(rgb, 4).size)
    assert (h, w, mcu_w, mcu_h, interval, cuttable) == (100, 130, 16, 16, 4, True) and 0 < sof < sos_end
    assert restarts.headers(encode(rgb, 4, "4:4:4"), 0, encode(rgb, 4, "4:4:4").size)[4:] == (8, 8, 4, True)
    assert restarts.headers(encode(rgb, 0), 0, encode(rgb, 0).size)[6:] == (0, True)
    grey = cv2.imencode(".jpg", cv2.cvtColor(rgb, cv2.COLOR_RGB2GRAY), [cv2.IMWRITE_JPEG_RST_INTERVAL, 2])[1].ravel()
    assert restarts.headers(grey, 0, grey.size)[4:] == (8, 8, 2, True)
    progressive = encode(rgb, 4, progressive=True)
    assert restarts.headers(progressive, 0, progressive.size)[7] is False  # SOF2: never cut
    truncated = encode(rgb, 4)[: sof + 20]
    assert restarts.headers(truncated, 0, truncated.size)[1] == -1


def test_crop_rect_keeps_a_pixel_beside_the_box_inside_the_image():
    # 4:2:0, 400 x 320 px: 25 x 20 MCUs of 16 px; one segment per MCU
    assert restarts.crop_rect(40, 40, 100, 100, 8, 320, 400, 16, 16, 1) == (2, 7, 2, 7)
    assert restarts.crop_rect(32, 48, 96, 112, 8, 320, 400, 16, 16, 1) == (1, 7, 2, 8)  # on MCU edges
    assert restarts.crop_rect(0, 0, 320, 400, 8, 320, 400, 16, 16, 1) == (0, 20, 0, 25)  # image edges
    assert restarts.crop_rect(16, 16, 24, 24, 4, 320, 400, 16, 16, 5) == (1, 4, 0, 1)  # half scale, 5-MCU segments
    assert restarts.crop_rect(16, 16, 24, 24, 8, 320, 400, 16, 16, 3) == (-1, -1, -1, -1)  # 3 does not divide 25


def test_loader_crops_ffload_written_restart_files_like_plain_ones(tmp_path, photos):
    """The Loader's RandomResizedCrop on a file written with restart markers (the default) gives
    the pixels of the same images written without them."""
    rows = [(p,) for p in photos] * 2
    marked = write(tmp_path / "r.beton", {"image": RGBImageField("jpg")}, rows)
    plain = write(tmp_path / "p.beton", {"image": RGBImageField("jpg", jpeg_restart_interval=0)}, rows)
    payload = np.asarray(marked.payload("image", 0))
    assert restarts.headers(payload, 0, payload.size)[6] == 1
    order = np.arange(len(rows), dtype=np.int64)
    op = RandomResizedCropRGBImageDecoder(128)
    np.testing.assert_array_equal(
        decode(op, marked, "image", order, epoch=2), decode(op, plain, "image", order, epoch=2)
    )
