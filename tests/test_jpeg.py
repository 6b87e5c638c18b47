"""The compiled JPEG path (ffload.codecs.jpeg, .turbojpeg, .resize) on real photos.

References are OpenCV's: ``cv2.imdecode`` (libjpeg-turbo, full size) then ``cv2.resize`` of the
same crop box (INTER_AREA when shrinking, INTER_LINEAR when enlarging).
"""

from __future__ import annotations

import threading
import warnings

import cv2
import numpy as np
import pytest
from skimage import data
from sklearn.datasets import load_sample_images

from ffload.bench.datasets import GRAIN_SIGMA
from ffload.codecs import jpeg, restarts, turbojpeg
from ffload.codecs.resize import interpolation, resize_rgb, scratch_size
from ffload.formats import RGBImageField
from ffload.loaders.decoders.crops import random_resized_crop_boxes
from ffload.loaders.decoders.rgb import (
    CenterCropRGBImageDecoder,
    RandomResizedCropRGBImageDecoder,
    SimpleRGBImageDecoder,
)
from ffload.loaders.rng import sample_seeds
from tests.test_decoders import decode, payload, reference_resize, write

pytestmark = pytest.mark.skipif(jpeg.backend() != "turbojpeg", reason="no TurboJPEG 3 library")


@pytest.fixture(scope="module")
def photos():
    """Five ImageNet-sized RGB photos (long side ~430 pixels)."""
    out = []
    for p in [data.astronaut(), data.chelsea(), data.coffee(), *load_sample_images().images]:
        r = 430 / max(p.shape[:2])
        out.append(cv2.resize(p, (round(p.shape[1] * r), round(p.shape[0] * r)), interpolation=cv2.INTER_AREA))
    return out


@pytest.mark.parametrize("suffix", [".beton", ".lmdb"])
def test_random_resized_crop_within_two_grey_levels_of_full_decode(tmp_path, photos, suffix):
    view = write(tmp_path / f"d{suffix}", {"image": RGBImageField("jpg", jpeg_quality=90)}, [(p,) for p in photos] * 3)
    op = RandomResizedCropRGBImageDecoder(224)
    order = np.arange(15, dtype=np.int64)[::-1].copy()
    out = decode(op, view, "image", order, epoch=1, seed=3)
    col = view.metadata["image"]
    boxes = np.empty((15, 4), np.int64)  # the boxes of crops.py, same seed: the same as before
    random_resized_crop_boxes(
        order, col["height"], col["width"], sample_seeds(3, 1, order), op.salt, 0.08, 1.0, 3 / 4, 4 / 3, boxes
    )
    maes = []
    for row, i, box in zip(out, order, boxes):
        full = cv2.imdecode(payload(view, "image", int(i)), cv2.IMREAD_COLOR_RGB)
        ref = reference_resize(full, box, (224, 224))
        maes.append(np.abs(row.astype(int) - ref).mean())
        other = reference_resize(full, box, (224, 224))[::-1]
        assert np.abs(row.astype(int) - other).mean() > 4 * max(maes[-1], 1)
    assert np.mean(maes) <= 2 and max(maes) <= 2.5, maes  # the issue's +-2 levels rule


def test_center_crop_beton_and_lmdb_agree(tmp_path, photos):
    rows = [(p,) for p in photos]
    a = decode(
        CenterCropRGBImageDecoder(160),
        write(tmp_path / "d.beton", {"image": RGBImageField("jpg")}, rows),
        "image",
        [4, 0, 2],
    )
    b = decode(
        CenterCropRGBImageDecoder(160),
        write(tmp_path / "d.lmdb", {"image": RGBImageField("jpg")}, rows),
        "image",
        [4, 0, 2],
    )
    assert np.array_equal(a, b)


def test_scaled_box_halves_only_a_box_at_least_four_times_the_output():
    # box 448 x 448 at (32, 32) of a 512 x 512 image, output 100: 1/2 (224 >= 2 * 100)
    assert jpeg.scaled_box(32, 32, 448, 448, 512, 512, 100, 100) == (4, 16, 16, 240, 240)
    # output 107 from a 430-pixel box (4.02x): 1/2; edges rounded outwards
    assert jpeg.scaled_box(0, 1, 430, 430, 430, 431, 107, 107) == (4, 0, 0, 215, 216)
    # output 108 (3.98x): not scaled, though 1/2 of the box is still 2x the output
    assert jpeg.scaled_box(0, 1, 430, 430, 430, 431, 108, 108) == (8, 0, 1, 430, 431)
    # output 160: 5/8 would do (268.75 >= 160) but costs more than a full decode: none
    assert jpeg.scaled_box(0, 1, 430, 430, 430, 431, 160, 160) == (8, 0, 1, 430, 431)
    # one side under 4x is enough to decode at full size
    assert jpeg.scaled_box(0, 0, 400, 300, 400, 300, 100, 100)[0] == 8
    assert jpeg.scaled_box(5, 7, 50, 60, 100, 100, 40, 40) == (8, 5, 7, 55, 67)


def test_resize_fused_flip_mirrors_the_row(photos):
    img = photos[0]
    h, w = img.shape[:2]
    _, src = loader_typed(0, img.reshape(-1))  # the decoder's argument types: no second compilation
    for oh, ow in [(100, 120), (300, 500)]:
        rows = []
        for flip in (False, True):
            out = np.zeros(oh * ow * 3, np.uint8)
            resize_rgb(
                src,
                0,
                w * 3,
                h,
                w,
                0.0,
                0.0,
                float(h),
                float(w),
                interpolation(h, w, oh, ow),
                out,
                0,
                oh,
                ow,
                flip,
                np.empty(scratch_size(oh, ow, w), np.uint16),
            )
            rows.append(out.reshape(oh, ow, 3))
        assert np.array_equal(rows[0][:, ::-1], rows[1])


def _encoded(photo):
    return cv2.imencode(".jpg", cv2.cvtColor(photo, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, 90])[1]


def _cut(view, index, keep):
    """A copy of the region whose sample ``index`` keeps its first ``keep`` bytes, then zeros."""
    region = np.array(view.open_region())
    p, n = int(view.ptrs["image"][index]), int(view.sizes["image"][index])
    region[p + keep : p + n] = 0
    return region


def test_corrupt_jpeg_names_the_sample_with_libjpeg_turbos_message(tmp_path, photos):
    view = write(tmp_path / "d.beton", {"image": RGBImageField("jpg")}, [(p,) for p in photos])
    region = np.array(view.open_region())
    p, n = int(view.ptrs["image"][3]), int(view.sizes["image"][3])
    region[p + 2 : p + n] = np.random.default_rng(0).integers(0, 256, n - 2, dtype=np.uint8)
    for op in (CenterCropRGBImageDecoder(64), RandomResizedCropRGBImageDecoder(64)):
        with pytest.raises(ValueError, match=r"field 'image', sample 3: corrupt JPEG \(\d+ bytes\): \w"):
            decode(op, view, "image", [0, 3], region=region)
        assert decode(op, view, "image", [0, 4], region=region).shape[0] == 2


def test_truncated_jpeg_is_an_error_named_with_libjpeg_turbos_warning(tmp_path, photos):
    tile = np.ascontiguousarray(photos[1][:64, :80])
    view = write(tmp_path / "d.beton", {"image": RGBImageField("jpg")}, [(tile,), (tile,)])
    region = _cut(view, 1, int(view.sizes["image"][1]) * 2 // 3)  # scan data cut: a warning
    p, n = int(view.ptrs["image"][1]), int(view.sizes["image"][1])
    assert cv2.imdecode(region[p : p + n], cv2.IMREAD_COLOR_RGB) is None  # OpenCV refuses it too
    with pytest.raises(ValueError, match=r"field 'image', sample 1: corrupt JPEG .*[Pp]remature end"):
        decode(SimpleRGBImageDecoder(), view, "image", [0, 1], region=region)
    assert decode(SimpleRGBImageDecoder(), view, "image", [0], region=region).shape == (1, 64, 80, 3)


def test_jpeg_without_a_frame_is_corrupt_not_the_previous_images_size(tmp_path, photos):
    """SOI then zeros: TurboJPEG reads it as tables only, succeeds, and keeps the previous
    image's size in the handle; the error must say what is wrong with this sample."""
    small = np.ascontiguousarray(photos[1][:64, :80])
    view = write(tmp_path / "d.beton", {"image": RGBImageField("jpg")}, [(photos[0],), (small,)])
    region = _cut(view, 1, 2)
    for op in (CenterCropRGBImageDecoder(32), RandomResizedCropRGBImageDecoder(32)):
        # row 0 leaves photo 0's size in the thread's handle, then row 1 has no frame
        with pytest.raises(ValueError, match=r"sample 1: corrupt JPEG \(\d+ bytes\): no image: no frame header"):
            decode(op, view, "image", [0, 1], region=region)
    data = np.array(view.open_region())
    p0, n0 = int(view.ptrs["image"][0]), int(view.sizes["image"][0])
    assert jpeg.frame_offset(data, p0, n0) >= 0 and jpeg.frame_offset(region, int(view.ptrs["image"][1]), 50) < 0


def loader_typed(n: int, region: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Zeroed image metadata for ``n`` samples in the field's own layout (``RGBImageField.metadata_type``;
    at least 2 rows, the rows past ``n`` unused, so that its columns are strided views as a dataset's are)
    and ``region`` made read-only, as the loader hands them to :func:`jpeg.decode_rows`: numba compiles the
    decoder once per argument types (about 30 s on 2 cores), so tests that call it directly use the
    loader's types rather than compile it again."""
    region = region.view()
    region.flags.writeable = False
    return np.zeros(max(n, 2), RGBImageField.metadata_type), region


def _batch(payloads, sizes_hw, out_hw=(32, 32)):
    """``jpeg.decode_batch`` inputs for JPEG ``payloads`` whose metadata says ``sizes_hw``, of the types the
    loader passes (:func:`loader_typed`)."""
    region = np.concatenate(payloads)
    lengths = np.array([len(p) for p in payloads], np.uint64)
    ptrs = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.uint64)
    meta, region = loader_typed(len(payloads), region)
    meta["height"][: len(payloads)], meta["width"][: len(payloads)] = np.array(sizes_hw).T
    boxes = np.array([[0, 0, h, w] for h, w in sizes_hw], np.int64)
    out = np.full((len(payloads), *out_hw, 3), 7, np.uint8)
    return np.arange(len(payloads), dtype=np.int64), meta, ptrs, lengths, region, boxes, out


def test_whole_image_decode_reads_the_frame_header_libjpeg_turbo_reads(photos):
    """Whole-image decodes skip tj3DecompressHeader when the first frame header gives the
    metadata's size. A 32x32 frame header hidden in a comment, before the real 64x32 one, must not
    be taken for the image's: the sample is the wrong size, and nothing is written past its row
    (a decode trusting the hidden header would write 64 rows into row 1's 32, over row 2)."""
    real = _encoded(np.ascontiguousarray(photos[0][:64, :32])).ravel()
    good = _encoded(np.ascontiguousarray(photos[1][:32, :32])).ravel()
    at = int(next(i for i in range(2, len(real) - 1) if real[i] == 0xFF and real[i + 1] == 0xC0))
    sof = real[at : at + 2 + (int(real[at + 2]) << 8 | int(real[at + 3]))].copy()
    sof[5:9] = [0, 32, 0, 32]
    comment = np.concatenate([[0xFF, 0xFE, 0, len(sof) + 2], sof]).astype(np.uint8)
    hidden = np.concatenate([real[:2], comment, real[2:]])
    assert jpeg.frame_size(hidden, 0, len(hidden)) == (64, 32)
    assert cv2.imdecode(hidden, cv2.IMREAD_COLOR_RGB).shape == (64, 32, 3)
    indices, meta, ptrs, sizes, region, boxes, out = _batch([good, hidden, good], [(32, 32)] * 3)
    row, code, detail = jpeg.decode_batch(indices, meta, ptrs, sizes, region, boxes, np.zeros(3, bool), out)
    assert (row, code, detail) == (1, jpeg.BAD_SIZE, "32x64")
    assert (out[2] == 7).all()
    assert np.array_equal(out[0], cv2.imdecode(good, cv2.IMREAD_COLOR_RGB))


def test_whole_image_decode_after_a_scaled_one_is_exact(photos):
    """The handle keeps its scaling factor and cropping region between images: a whole-image
    decode after a scaled, cropped one must reset both."""
    big = _encoded(np.ascontiguousarray(photos[0][:200, :160])).ravel()
    good = _encoded(np.ascontiguousarray(photos[1][:32, :32])).ravel()
    indices, meta, ptrs, sizes, region, boxes, out = _batch([big, good, big, good], [(200, 160), (32, 32)] * 2)
    boxes[2] = [12, 8, 180, 140]
    assert jpeg.scaled_box(*boxes[2], 200, 160, 32, 32)[0] < 8  # row 2 is decoded scaled and cropped
    assert jpeg.decode_batch(indices, meta, ptrs, sizes, region, boxes, np.zeros(4, bool), out)[0] == -1
    expected = cv2.imdecode(good, cv2.IMREAD_COLOR_RGB)
    assert np.array_equal(out[1], expected) and np.array_equal(out[3], expected)


def test_a_frame_header_without_a_scan_is_named(photos):
    """SOI, tables and a frame header of the metadata's size, then the end, after a larger image:
    the error names the missing scan (libjpeg-turbo's message, or ours where its header call
    succeeds as for tables only and keeps the previous image's size), not that size."""
    good = _encoded(np.ascontiguousarray(photos[1][:64, :64])).ravel()
    at = int(next(i for i in range(2, len(good) - 1) if good[i] == 0xFF and good[i + 1] == 0xDA))
    headless = np.concatenate([good[:at], [0xFF, 0xD9]]).astype(np.uint8)
    big = _encoded(np.ascontiguousarray(photos[0][:200, :160])).ravel()
    indices, meta, ptrs, sizes, region, boxes, out = _batch([big, headless], [(200, 160), (64, 64)])
    boxes[1] = [8, 8, 48, 48]
    row, code, detail = jpeg.decode_batch(indices, meta, ptrs, sizes, region, boxes, np.zeros(2, bool), out)
    assert row == 1 and code in (jpeg.FAILED, jpeg.NO_FRAME) and "SOS" in detail, detail
    boxes[1] = [0, 0, 64, 64]
    indices, meta, ptrs, sizes, region, _, out = _batch([big, headless], [(200, 160), (64, 64)], (64, 64))
    row, code, detail = jpeg.decode_batch(indices, meta, ptrs, sizes, region, boxes, np.zeros(2, bool), out)
    assert row == 1 and code in (jpeg.FAILED, jpeg.NO_FRAME) and detail


@pytest.fixture(scope="module")
def grainy(photos):
    """The photos with film grain (Gaussian, 26 grey levels per channel), as the benchmark's
    ImageNet-sized set (``ffload.bench.datasets``): high-frequency detail, where a DCT-scaled
    decode differs most from a full-size decode + area resize."""
    rng = np.random.default_rng(0)
    return [np.clip(p + rng.normal(0, GRAIN_SIGMA, p.shape), 0, 255).astype(np.uint8) for p in photos]


@pytest.mark.parametrize("times", [4, 3.5])
def test_half_scale_only_where_it_stays_within_two_grey_levels(tmp_path, grainy, times):
    """At 4x the output the half-size decode is used and within the issue's 2 levels of a full
    decode + resize (``scripts/jpeg_scale_quality.py``: 1.7 on average at 4x, 2.8 at 3x); at 3.5x
    the box is decoded at full size: the resize alone, within a level."""
    view = write(tmp_path / "d.beton", {"image": RGBImageField("jpg", jpeg_quality=90)}, [(p,) for p in grainy])
    maes = []
    for i, p in enumerate(grainy):
        side = min(p.shape[:2])
        out = int(side // times)
        assert (jpeg.scale_numerator(side, side, out, out) == 4) == (times == 4)
        row = decode(CenterCropRGBImageDecoder(out, ratio=1.0), view, "image", [i])[0]
        full = cv2.imdecode(payload(view, "image", i), cv2.IMREAD_COLOR_RGB)
        box = ((p.shape[0] - side) // 2, (p.shape[1] - side) // 2, side, side)
        maes.append(np.abs(row.astype(int) - reference_resize(full, box, (out, out))).mean())
    if times == 4:
        assert 0.5 < np.mean(maes) <= 2 and max(maes) <= 3, maes
    else:
        assert max(maes) <= 0.5, maes


def test_decode_whole_at_half_scale_is_libjpeg_turbos_reduced_decode(photos):
    for p in photos[:3]:
        data = _encoded(p).ravel()
        (w, h), error = jpeg.header_size(data)
        out = np.empty(((h + 1) // 2, (w + 1) // 2, 3), np.uint8)
        assert error == "" and jpeg.decode_whole(data, out, 4) == ""
        assert np.array_equal(out, cv2.cvtColor(cv2.imdecode(data, cv2.IMREAD_REDUCED_COLOR_2), cv2.COLOR_BGR2RGB))


def test_scale_quality_script_measures_only_the_scaled_decode(tmp_path, grainy):
    """scripts/jpeg_scale_quality.py: 8/8 is the reference itself (0 levels), 1/2 at 4x is ~1.7
    levels off on grainy photos (the rule's measurement), an unreadable file is skipped by name."""
    import importlib.util
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "scripts" / "jpeg_scale_quality.py"
    spec = importlib.util.spec_from_file_location("jpeg_scale_quality", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for i, p in enumerate(grainy[:2]):
        assert cv2.imwrite(str(tmp_path / f"{i}.jpg"), p[..., ::-1], [cv2.IMWRITE_JPEG_QUALITY, 90])
    (tmp_path / "bad.JPEG").write_bytes(b"\xff\xd8\xff\xe0 not a jpeg")
    files = module.jpeg_files(str(tmp_path), 10)
    assert [Path(f).name for f in files] == ["0.jpg", "1.jpg", "bad.JPEG"]
    diffs, skipped = module.measure(files, [8, 4], [4.0])
    assert diffs[8, 4.0].tolist() == [0.0, 0.0]
    assert np.all((diffs[4, 4.0] > 0.5) & (diffs[4, 4.0] < 3))
    assert len(skipped) == 1 and "bad.JPEG" in skipped[0]


def test_fast_dct_is_close_to_the_accurate_decode_and_switches_back(tmp_path, photos):
    same = [(np.ascontiguousarray(p[:280, :400]),) for p in photos]
    view = write(tmp_path / "d.beton", {"image": RGBImageField("jpg", jpeg_quality=90)}, same)
    order = [3, 0, 4, 1, 2]
    refs = [cv2.imdecode(payload(view, "image", i), cv2.IMREAD_COLOR_RGB) for i in order]
    accurate = decode(SimpleRGBImageDecoder(), view, "image", order)
    fast = decode(SimpleRGBImageDecoder(fast_dct=True), view, "image", order)
    again = decode(SimpleRGBImageDecoder(), view, "image", order)  # same thread, same handle
    assert np.array_equal(accurate, np.stack(refs)) and np.array_equal(again, accurate)
    maes = [np.abs(f.astype(int) - a).mean() for f, a in zip(fast, accurate)]
    assert 0 < min(maes) and max(maes) <= 1.5, maes  # "about one grey level"
    crops = [
        decode(RandomResizedCropRGBImageDecoder(160, fast_dct=f), view, "image", order, epoch=2) for f in (False, True)
    ]
    assert 0 < np.abs(crops[0].astype(int) - crops[1]).mean() <= 1.5


def test_handles_are_per_thread():
    handles = []
    t = threading.Thread(target=lambda: handles.append(jpeg.thread_handle()))
    t.start()
    t.join()
    assert jpeg.thread_handle() == jpeg.thread_handle() != 0
    assert handles[0] != 0 and handles[0] != jpeg.thread_handle()


def test_libraries_without_the_tj3_api_are_refused(tmp_path):
    assert turbojpeg.load([str(tmp_path / "missing.so")]) is None
    system = "/usr/lib/x86_64-linux-gnu/libturbojpeg.so.0"
    import os

    if os.path.exists(system) and turbojpeg._open(system) is None:  # Debian 12: TurboJPEG 2 only
        assert turbojpeg.load([system]) is None
    assert turbojpeg.load().path == turbojpeg.library().path


def test_fallback_is_used_and_reported_without_the_library(tmp_path, photos, grainy, monkeypatch):
    view = write(tmp_path / "d.beton", {"image": RGBImageField("jpg")}, [(p,) for p in photos])
    fast = decode(RandomResizedCropRGBImageDecoder(96), view, "image", [2, 0, 4], epoch=5)
    monkeypatch.setattr(jpeg, "_lib", None)  # as when turbojpeg.library() finds nothing
    monkeypatch.setattr(jpeg, "_local", threading.local())
    monkeypatch.setattr(jpeg, "_warned", [])
    assert jpeg.backend() == "opencv"
    with pytest.warns(RuntimeWarning, match="OpenCV fallback"):
        slow = decode(RandomResizedCropRGBImageDecoder(96), view, "image", [2, 0, 4], epoch=5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per process
        decode(CenterCropRGBImageDecoder(96), view, "image", [1])
    # full-size decodes (no box is 4x the output): the compiled crop sees a pixel beside the box
    # on each side, so its pixels are exactly OpenCV's full decode + the same resize
    assert np.array_equal(slow, fast)
    # the compiled path's DCT scale: half size for a box 4x the output, so the fallback's pixels are
    # the compiled path's, and ~1.7 levels from a full decode's on grainy photos
    grain = write(tmp_path / "g.beton", {"image": RGBImageField("jpg", jpeg_quality=90)}, [(p,) for p in grainy])
    sides = [min(p.shape[:2]) for p in grainy]
    assert all(jpeg.scale_numerator(s, s, s // 4, s // 4) == 4 for s in sides)
    center = [decode(CenterCropRGBImageDecoder(s // 4, ratio=1.0), grain, "image", [i])[0] for i, s in enumerate(sides)]
    monkeypatch.setattr(jpeg, "_lib", turbojpeg.library())
    monkeypatch.setattr(jpeg, "_local", threading.local())
    for i, (row, side) in enumerate(zip(center, sides)):
        compiled = decode(CenterCropRGBImageDecoder(side // 4, ratio=1.0), grain, "image", [i])[0]
        full = cv2.imdecode(payload(grain, "image", i), cv2.IMREAD_COLOR_RGB)
        box = ((full.shape[0] - side) // 2, (full.shape[1] - side) // 2, side, side)
        ref = reference_resize(full, box, (side // 4, side // 4))
        assert np.abs(row.astype(int) - compiled).mean() <= 0.5 and np.abs(row.astype(int) - ref).mean() > 1
    region = np.array(view.open_region())
    region[int(view.ptrs["image"][0]) : int(view.ptrs["image"][0]) + 50] = 7
    with pytest.raises(ValueError, match=r"field 'image', sample 0: corrupt JPEG"):
        decode(RandomResizedCropRGBImageDecoder(96), view, "image", [1, 0], region=region)


def test_compiled_decoder_is_cached_on_disk_across_processes():
    """The TurboJPEG calls are LLVM symbols, not this process's addresses, so the decoder's machine code is
    cached: a new process loads :func:`jpeg.decode_rows` from numba's cache instead of compiling it (about
    30 s on a 2-core machine before the first batch), and the loaded code decodes. Two processes on numba's
    own cache directory: the first compiles or loads (an earlier test may have compiled it), the second must
    load. (A separate cold directory would compile the decoder once more in the suite; the script passes the
    loader's argument types, as :func:`loader_typed` does, for the same reason.)"""
    import json
    import os
    import subprocess
    import sys

    script = (
        "import json, cv2, numpy as np; from ffload.codecs import jpeg; "
        "img = np.random.default_rng(0).integers(0, 256, (16, 16, 3), dtype=np.uint8); "
        "payload = np.frombuffer(cv2.imencode('.jpg', img)[1].tobytes(), np.uint8); "
        "from ffload.formats import RGBImageField; meta = np.zeros(2, RGBImageField.metadata_type); "
        "region = payload.view(); region.flags.writeable = False; "
        "meta['height'] = meta['width'] = 16; out = np.zeros((1, 16, 16, 3), np.uint8); "
        "result = jpeg.decode_batch(np.zeros(1, np.int64), meta, np.zeros(1, np.uint64), "
        "np.array([payload.size], np.uint64), region, np.array([[0, 0, 16, 16]], np.int64), "
        "np.zeros(1, np.bool_), out); "
        "error = np.abs(out[0].astype(int) - cv2.imdecode(payload, cv2.IMREAD_COLOR)[..., ::-1]).mean(); "
        "s = jpeg.decode_rows.stats; "
        "print(json.dumps([list(result), float(error), len(s.cache_hits), len(s.cache_misses)]))"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    runs = [
        json.loads(
            subprocess.run(
                [sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True, timeout=600
            ).stdout.splitlines()[-1]
        )
        for _ in range(2)
    ]
    for result, error, _, _ in runs:
        assert result == [-1, jpeg.OK, ""] and error < 2  # decoded, as OpenCV's libjpeg does to rounding
    assert runs[0][2] + runs[0][3] == 1  # compiled or loaded once
    assert runs[1][2:] == [1, 0]  # the second process loads it from the cache


def test_batch_extents_are_the_maxima_decode_batch_sizes_its_scratch_from():
    """One compiled pass gives what the NumPy gathers gave: max pixels, width, payload bytes and 8x8 blocks."""
    rng = np.random.default_rng(3)
    heights = rng.integers(1, 700, 50).astype(np.uint32)
    widths = rng.integers(1, 700, 50).astype(np.uint32)
    sizes = rng.integers(0, 10**6, 50).astype(np.uint64)
    indices = rng.choice(50, 17, replace=False).astype(np.int64)
    out = np.zeros(4, np.int64)
    jpeg.batch_extents(indices, heights, widths, sizes, out)
    h, w = heights[indices].astype(np.int64), widths[indices].astype(np.int64)
    assert out.tolist() == [(h * w).max(), w.max(), int(sizes[indices].max()), restarts.starts_size(h, w) - 2]


def test_decode_scratch_is_kept_per_thread_up_to_its_cap():
    """A worker's batches share its scratch arrays (grown on demand), other threads get their
    own, and an array larger than ``SCRATCH_KEPT`` bytes is used once and not kept. Each check
    runs in a new thread (the test's own thread may hold scratch from earlier tests)."""

    def in_new_thread(fn):
        result = []
        thread = threading.Thread(target=lambda: result.append(fn()))
        thread.start()
        thread.join()
        return result[0]

    def one_worker():
        first = jpeg._thread_scratch(100, 10, 50, 3)
        assert [a.dtype for a in first] == [np.uint8, np.uint16, np.uint8, np.int64]
        again = jpeg._thread_scratch(80, 10, 10, 3)
        assert all(a is b for a, b in zip(first, again))
        grown = jpeg._thread_scratch(4000, 10, 50, 3)
        assert grown[0] is not first[0] and grown[0].shape[0] >= 4000 and grown[1] is first[1]
        assert jpeg._thread_scratch(10, 10, 10, 3)[0] is grown[0]
        huge = jpeg._thread_scratch(jpeg.SCRATCH_KEPT + 1, 10, 10, 3)[0]
        assert huge.shape[0] >= jpeg.SCRATCH_KEPT + 1
        assert jpeg._thread_scratch(jpeg.SCRATCH_KEPT + 1, 10, 10, 3)[0] is not huge
        assert jpeg._thread_scratch(10, 10, 10, 3)[0] is grown[0]
        return grown

    mine = in_new_thread(one_worker)
    other = in_new_thread(lambda: jpeg._thread_scratch(10, 10, 10, 3))
    assert not any(a is b for a, b in zip(other, mine))
