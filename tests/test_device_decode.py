"""The RGB decoders' device path (ffload.loaders.device): batched crop-resize-flip in torch, the
JPEG backends, the host/device split of a batch, and the decoders with ``device=``.

Everything runs on CPU tensors here (the device stage's torch code is the same on CUDA); tests
marked ``gpu`` need a CUDA device and skip without one.
"""

from __future__ import annotations

import cv2
import numpy as np
import pytest
import torch
from skimage import data
from sklearn.datasets import load_sample_images

from ffload import Loader
from ffload.errors import ConfigurationError, FormatError, LoaderError, UnavailableError
from ffload.formats import IntField, RGBImageField, open_dataset, write_dataset
from ffload.loaders import (
    CenterCropRGBImageDecoder,
    IntDecoder,
    RandomHorizontalFlip,
    RandomResizedCropRGBImageDecoder,
    ResizeRGBImageDecoder,
    SimpleRGBImageDecoder,
    ToTensor,
)
from ffload.loaders.device import codecs
from ffload.loaders.device.resample import axis_weights, crop_resize
from ffload.loaders.device.stage import ShareController

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture(scope="module")
def photos():
    """Six real photos, 120..512 pixels a side."""
    china, flower = load_sample_images().images
    return [china, flower[::2, ::2], data.astronaut(), data.chelsea(), data.coffee()[::3, ::3], data.rocket()]


def reference(image, box, out_hw, flip):
    """OpenCV crop + resize with the CPU path's rule (INTER_AREA when no side grows), mirrored."""
    top, left, h, w = box
    interp = cv2.INTER_AREA if h >= out_hw[0] and w >= out_hw[1] else cv2.INTER_LINEAR
    out = cv2.resize(np.ascontiguousarray(image[top : top + h, left : left + w]), out_hw[::-1], interpolation=interp)
    return out[:, ::-1] if flip else out


def random_boxes(photos, n, seed=0):
    rng = np.random.default_rng(seed)
    rows = []
    for k in range(n):
        image = photos[k % len(photos)]
        height, width = image.shape[:2]
        h, w = int(rng.integers(8, height + 1)), int(rng.integers(8, width + 1))
        rows.append((image, (int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1)), h, w)))
    return rows


# ---------------------------------------------------------------- resample


def test_axis_weights_rows_sum_to_one_and_ignore_padding():
    lengths = torch.tensor([7, 100, 300, 224])
    for area in (True, False):
        weights = axis_weights(lengths, 50, 300, torch.full((4,), area))
        assert weights.shape == (4, 50, 300)
        assert torch.allclose(weights.sum(2), torch.ones(4, 50), atol=1e-5)
        for b, n in enumerate(lengths.tolist()):
            assert float(weights[b, :, n:].abs().sum()) == 0.0


def test_crop_resize_is_opencv_within_one_grey_level(photos):
    rows = random_boxes(photos, 24)
    out_hw = (96, 128)
    flips = torch.tensor([k % 3 == 0 for k in range(len(rows))])
    boxes = [torch.from_numpy(img[t : t + h, x : x + w].copy()) for img, (t, x, h, w) in rows]
    out = torch.empty((len(rows),) + out_hw + (3,), dtype=torch.uint8)
    crop_resize(boxes, out, flips)
    for k, (image, box) in enumerate(rows):
        diff = np.abs(out[k].numpy().astype(int) - reference(image, box, out_hw, bool(flips[k])))
        assert diff.max() <= 1 and diff.mean() < 0.2, (k, box, diff.mean(), diff.max())


def test_crop_resize_in_chunks_equals_one_chunk(photos):
    rows = random_boxes(photos, 10, seed=1)
    boxes = [torch.from_numpy(img[t : t + h, x : x + w].copy()) for img, (t, x, h, w) in rows]
    flips = torch.tensor([True, False] * 5)
    whole = crop_resize(boxes, torch.empty((10, 40, 30, 3), dtype=torch.uint8), flips)
    chunked = crop_resize(boxes, torch.empty((10, 40, 30, 3), dtype=torch.uint8), flips, chunk_bytes=1)
    assert torch.equal(whole, chunked)


def test_crop_resize_in_float16_is_within_one_grey_level_of_float32(photos):
    """What CUDA computes (float16 products, float32 accumulation), checked on CPU."""
    rows = random_boxes(photos, 6, seed=2)
    boxes = [torch.from_numpy(img[t : t + h, x : x + w].copy()) for img, (t, x, h, w) in rows]
    flips = torch.tensor([True, False] * 3)
    f32 = crop_resize(boxes, torch.empty((6, 40, 30, 3), dtype=torch.uint8), flips)
    f16 = crop_resize(boxes, torch.empty((6, 40, 30, 3), dtype=torch.uint8), flips, compute_dtype=torch.float16)
    diff = (f32.to(torch.int16) - f16.to(torch.int16)).abs()
    assert int(diff.max()) <= 1 and float(diff.float().mean()) < 0.1


def test_crop_resize_identity_and_flip_are_exact(photos):
    image = photos[3][:64, :80].copy()
    box = torch.from_numpy(image)
    out = crop_resize([box, box], torch.empty((2, 64, 80, 3), dtype=torch.uint8), torch.tensor([False, True]))
    assert np.array_equal(out[0].numpy(), image)
    assert np.array_equal(out[1].numpy(), image[:, ::-1])


def test_crop_resize_rejects_bad_boxes():
    out = torch.empty((1, 8, 8, 3), dtype=torch.uint8)
    with pytest.raises(ValueError, match="box 0"):
        crop_resize([torch.zeros((0, 5, 3), dtype=torch.uint8)], out, torch.zeros(1, dtype=torch.bool))
    with pytest.raises(ValueError, match="2 boxes"):
        crop_resize([torch.zeros((4, 4, 3), dtype=torch.uint8)] * 2, out, torch.zeros(2, dtype=torch.bool))


# ---------------------------------------------------------------- share controller


def test_share_controller_balances_measured_row_times():
    c = ShareController("auto")
    assert c.rows(64) == 56  # a first host measurement
    c.observe(8, 8 * 0.004, 0, 0.0)
    assert c.rows(64) == 64  # then an all-device batch
    c.observe(0, 0.0, 64, 64 * 0.001)
    assert c.share == pytest.approx(0.004 / (0.004 + 0.001))
    assert c.rows(100) == 80
    for _ in range(50):  # the device slows down (other work): the share follows, smoothly
        c.observe(20, 20 * 0.004, 80, 80 * 0.004)
    assert c.share == pytest.approx(0.5, abs=0.01)
    stats = c.stats()
    assert stats["auto"] and stats["device_share"] == c.share and stats["host_row_ms"] == pytest.approx(4.0)


def test_share_controller_fixed_and_invalid():
    assert ShareController(0.25).rows(64) == 16
    assert ShareController(0).rows(64) == 0
    assert ShareController(1).rows(64) == 64
    for bad in (1.5, -0.1, "half"):
        with pytest.raises(ConfigurationError, match="device_share"):
            ShareController(bad)


# ---------------------------------------------------------------- backends


def test_backend_selection():
    assert codecs.select(torch.device("cpu")).name == "host"
    with pytest.raises(ConfigurationError, match="unknown device JPEG backend"):
        codecs.select(torch.device("cpu"), "libjpeg")
    if not codecs.available("torchvision"):
        with pytest.raises(UnavailableError, match="torchvision"):
            codecs.select(torch.device("cpu"), "torchvision")


@pytest.mark.skipif(not codecs.available("nvimgcodec"), reason="nvidia-nvimgcodec-cu13 is not installed")
def test_nvimgcodec_region_decode_equals_host_decode(photos):
    payloads = [cv2.imencode(".jpg", p[:, :, ::-1], [cv2.IMWRITE_JPEG_QUALITY, 90])[1].reshape(-1) for p in photos]
    boxes = np.array([[5, 7, p.shape[0] - 20, p.shape[1] - 30] for p in photos], np.int64)
    samples = np.arange(len(photos))
    cpu = torch.device("cpu")
    ours = codecs.NvImageCodecBackend(cpu).decode(payloads, boxes, samples)
    host = codecs.HostBackend(cpu).decode(payloads, boxes, samples)
    for a, b in zip(ours, host):
        assert a.shape == b.shape and torch.equal(a, b)


# ---------------------------------------------------------------- decoders with device=


@pytest.fixture(scope="module")
def dataset(tmp_path_factory, photos):
    """JPEG (q90) and raw images of several sizes, with labels."""
    path = tmp_path_factory.mktemp("device") / "photos.beton"
    rows = [(photos[k % len(photos)], k) for k in range(18)]
    fields = {"image": RGBImageField(write_mode="smart", smart_threshold=200_000, jpeg_quality=90), "label": IntField()}
    write_dataset(str(path), fields, rows, len(rows))
    return str(path)


def batches(path, image_ops, batch_size=6, **kwargs):
    loader = Loader(
        path,
        batch_size=batch_size,
        num_workers=2,
        order="random",
        seed=3,
        pipelines={"image": image_ops, "label": [IntDecoder()]},
        **kwargs,
    )
    with loader:
        return [(torch.as_tensor(img).clone(), lab.copy()) for img, lab in loader]  # a CUDA tensor stays on its device


@pytest.mark.parametrize(
    "make",
    [
        lambda **d: RandomResizedCropRGBImageDecoder((64, 72), **d),
        lambda **d: CenterCropRGBImageDecoder(80, **d),
        lambda **d: ResizeRGBImageDecoder((50, 60), **d),
    ],
    ids=["random_resized_crop", "center_crop", "resize"],
)
def test_device_decoder_matches_the_cpu_decoder(dataset, make):
    cpu = batches(dataset, [make(), RandomHorizontalFlip()])
    dev = batches(dataset, [make(device="cpu", device_share=1.0), RandomHorizontalFlip()])
    assert len(cpu) == len(dev) == 3
    for (a, la), (b, lb) in zip(cpu, dev):
        assert isinstance(b, torch.Tensor) and b.dtype == torch.uint8 and b.shape == a.shape
        assert np.array_equal(la, lb)
        diff = (a.to(torch.int16) - b.to(torch.int16)).abs().float()
        assert float(diff.mean()) <= 2.0, float(diff.mean())


def test_device_share_zero_is_the_cpu_path_bit_for_bit(dataset):
    cpu = batches(dataset, [RandomResizedCropRGBImageDecoder(48), RandomHorizontalFlip()])
    dev = batches(
        dataset, [RandomResizedCropRGBImageDecoder(48, device="cpu", device_share=0.0), RandomHorizontalFlip()]
    )
    for (a, _), (b, _) in zip(cpu, dev):
        assert torch.equal(a, b)


def test_hybrid_split_keeps_boxes_and_flips(dataset):
    """Half the rows on the host, half on the device: the host half is the CPU path exactly, the
    device half within the tolerance; the same boxes and flips for the same seed either way."""
    cpu = batches(dataset, [RandomResizedCropRGBImageDecoder(48), RandomHorizontalFlip()])
    hybrid = batches(
        dataset, [RandomResizedCropRGBImageDecoder(48, device="cpu", device_share=0.5), RandomHorizontalFlip()]
    )
    for (a, _), (b, _) in zip(cpu, hybrid):
        assert torch.equal(a[3:], b[3:])  # rows 3..5 decoded on the host
        diff = (a[:3].to(torch.int16) - b[:3].to(torch.int16)).abs().float()
        assert float(diff.mean()) <= 2.0


def test_simple_decoder_on_device_is_exact_for_raw(tmp_path, photos):
    tiles = [np.ascontiguousarray(p[:40, :56]) for p in photos]
    path = tmp_path / "tiles.beton"
    write_dataset(
        str(path),
        {"image": RGBImageField(write_mode="raw"), "label": IntField()},
        [(t, k) for k, t in enumerate(tiles)],
        len(tiles),
    )
    cpu = batches(str(path), [SimpleRGBImageDecoder(), RandomHorizontalFlip()], batch_size=3)
    dev = batches(str(path), [SimpleRGBImageDecoder(device="cpu"), RandomHorizontalFlip()], batch_size=3)
    for (a, _), (b, _) in zip(cpu, dev):
        assert torch.equal(a, b)


def test_loader_stats_report_the_device_stage(dataset):
    loader = Loader(
        dataset,
        batch_size=6,
        num_workers=1,
        pipelines={"image": [CenterCropRGBImageDecoder(32, device="cpu", device_share=0.5)], "label": [IntDecoder()]},
    )
    with loader:
        assert len(list(loader)) == 3
        stats = loader.stats()["devices"]["image"]
    assert stats["backend"] == "host" and stats["device_share"] == 0.5
    assert stats["rows"] == {"device": 9, "host": 9}
    assert stats["decode_ms_per_row"] > 0 and stats["host_ms_per_row"] > 0


def test_device_decoder_output_spec_and_stats(dataset):
    op = RandomResizedCropRGBImageDecoder(32, device="cpu")
    view = open_dataset(dataset)
    spec = op.declare(None, view.fields["image"], view)
    assert spec.on_torch and spec.dtype == torch.uint8 and spec.shape == (32, 32, 3) and spec.device == "cpu"
    assert op.buffer_spec(spec, 8) is None
    stats = op.stage.stats()
    assert stats["backend"] == "host" and stats["device"] == "cpu" and not stats["auto"]
    assert stats["device_share"] == 1.0 and stats["rows"] == {"device": 0, "host": 0}


def test_corrupt_jpeg_on_the_device_path_names_field_and_sample(tmp_path, photos):
    path = tmp_path / "bad.beton"
    rows = [(p, k) for k, p in enumerate(photos)]
    write_dataset(str(path), {"image": RGBImageField(write_mode="jpg"), "label": IntField()}, rows, len(rows))
    view = open_dataset(str(path))
    start = int(view.ptrs["image"][2])
    with open(path, "r+b") as f:  # scramble the entropy-coded data of sample 2
        f.seek(start + int(view.sizes["image"][2]) // 2)
        f.write(b"\xff\xd9" * 64)
    loader = Loader(
        str(path),
        batch_size=6,
        num_workers=1,
        pipelines={"image": [CenterCropRGBImageDecoder(32, device="cpu", device_share=1.0)], "label": [IntDecoder()]},
    )
    with loader, pytest.raises(LoaderError, match="sample 2") as info:
        list(loader)
    assert "image" in str(info.value)


def test_device_decoder_rejects_a_bad_share_when_built():
    with pytest.raises(ConfigurationError, match="device_share"):
        CenterCropRGBImageDecoder(32, device="cpu", device_share=2)


@cuda
@pytest.mark.gpu
def test_cuda_device_decoder_matches_the_cpu_decoder(dataset):
    cpu = batches(dataset, [RandomResizedCropRGBImageDecoder(64), RandomHorizontalFlip()])
    dev = batches(dataset, [RandomResizedCropRGBImageDecoder(64, device="cuda"), RandomHorizontalFlip()])
    for (a, _), (b, _) in zip(cpu, dev):
        assert b.is_cuda
        diff = (a.to(torch.int16) - b.cpu().to(torch.int16)).abs().float()
        assert float(diff.mean()) <= 2.0


def test_to_tensor_after_a_device_decoder_is_refused(dataset):
    with pytest.raises(Exception, match="ToTensor"):
        Loader(dataset, batch_size=4, pipelines={"image": [CenterCropRGBImageDecoder(32, device="cpu"), ToTensor()]})


def test_corrupt_payload_is_a_format_error_from_the_host_backend():
    with pytest.raises(FormatError, match="sample 7"):
        codecs.HostBackend(torch.device("cpu")).decode(
            [np.frombuffer(b"not a jpeg at all", np.uint8)], np.array([[0, 0, 1, 1]]), np.array([7])
        )


def test_antialias_has_no_device_path_yet():
    with pytest.raises(ConfigurationError, match="antialias"):
        RandomResizedCropRGBImageDecoder(32, antialias=True, device="cpu")
