"""Transforms (ffload.loaders.transforms: flip, crop, erase, normalize) and torch-stage operations
(ffload.loaders.transforms.torch_ops), checked against numpy references that draw from the same per-sample generators."""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch
from skimage import data

from ffload.errors import ConfigurationError
from ffload.formats import IntField, RGBImageField
from ffload.loaders.pipeline.operation import BatchContext, Spec
from ffload.loaders.rng import randint, sample_seeds, seed_state, uniform
from ffload.loaders.transforms.crop import RandomTranslate
from ffload.loaders.transforms.erase import Cutout
from ffload.loaders.transforms.flip import RandomHorizontalFlip
from ffload.loaders.transforms.normalize import NormalizeImage
from ffload.loaders.transforms.torch_ops import Convert, Squeeze, ToDevice, ToTensor, ToTorchImage

FIELD = RGBImageField()
VIEW = types.SimpleNamespace(fields={"image": FIELD, "mask": RGBImageField(), "label": IntField()})


@pytest.fixture(scope="module")
def batch():
    """(24, 32, 40, 3) uint8 crops of the astronaut photo."""
    img = data.astronaut()
    return np.stack([img[7 * k : 7 * k + 32, 11 * k : 11 * k + 40] for k in range(24)])


def context(n, epoch=0, seed=0):
    idx = np.arange(100, 100 + n, dtype=np.int64)
    return BatchContext(idx, sample_seeds(seed, epoch, idx), None, None, None, None, epoch)


def run(op, x, ctx, field="image"):
    """declare on x's spec, allocate from buffer_spec, call on a copy of x (ops work in place)."""
    spec = op.declare(Spec(x.shape[1:], x.dtype), VIEW.fields[field], VIEW)
    bspec = op.buffer_spec(spec, len(x) + 3)
    dst = None if bspec is None else np.empty(bspec.shape, bspec.dtype)
    out = op(x.copy(), dst, ctx)
    assert out.shape == (len(x),) + tuple(spec.shape) and out.dtype == spec.dtype
    return out


def draws(seed, salt, n, *bounds):
    """n draws from a sample's generator: uniforms (bound None) or randint(bound)."""
    state = np.uint64(seed_state(seed, salt))
    out = []
    for bound in bounds[:n]:
        value, state = uniform(state) if bound is None else randint(state, bound)
        state = np.uint64(state)
        out.append(value)
    return out


# ---------------------------------------------------------------- flip / translate / cutout


@pytest.mark.parametrize("dtype", [np.uint8, np.float16, np.float32])
def test_flip_matches_numpy_reference(batch, dtype):
    x = batch.astype(dtype)
    ctx = context(len(x))
    op = RandomHorizontalFlip(0.5)
    out = run(op, x, ctx)
    flips = [draws(s, op.salt, 1, None)[0] < 0.5 for s in ctx.seeds]
    assert 0 < sum(flips) < len(x)
    ref = np.stack([xi[:, ::-1] if f else xi for xi, f in zip(x, flips)])
    assert np.array_equal(out, ref)


def test_flip_probability_extremes(batch):
    assert np.array_equal(run(RandomHorizontalFlip(0.0), batch, context(24)), batch)
    assert np.array_equal(run(RandomHorizontalFlip(1.0), batch, context(24)), batch[:, :, ::-1])


@pytest.mark.parametrize("padding", [0, 3, 50])
def test_translate_matches_pad_and_crop_reference(batch, padding):
    ctx = context(len(batch))
    op = RandomTranslate(padding, fill=(9, 200, 31))
    out = run(op, batch, ctx)
    h, w = batch.shape[1:3]
    for xi, oi, s in zip(batch, out, ctx.seeds):
        y, x = draws(s, op.salt, 2, 2 * padding + 1, 2 * padding + 1)
        canvas = np.empty((h + 2 * padding, w + 2 * padding, 3), np.uint8)
        canvas[:] = (9, 200, 31)
        canvas[padding : padding + h, padding : padding + w] = xi
        assert np.array_equal(oi, canvas[y : y + h, x : x + w])


@pytest.mark.parametrize("size", [1, 8, 13])
def test_cutout_matches_numpy_reference(batch, size):
    ctx = context(len(batch))
    op = Cutout(size, fill=(1, 2, 3))
    out = run(op, batch, ctx)
    h, w = batch.shape[1:3]
    for xi, oi, s in zip(batch, out, ctx.seeds):
        y0, x0 = draws(s, op.salt, 2, max(h - size + 1, 1), max(w - size + 1, 1))
        ref = xi.copy()
        ref[y0 : y0 + size, x0 : x0 + size] = (1, 2, 3)  # FFCV's rule: always inside the image
        assert np.array_equal(oi, ref)
        assert np.all(oi == (1, 2, 3), axis=-1).sum() >= min(size, h) * min(size, w)


def test_random_ops_are_deterministic_and_epoch_dependent(batch):
    for make in (RandomHorizontalFlip, lambda: RandomTranslate(4), lambda: Cutout(6)):
        a = run(make(), batch, context(24, epoch=1))
        b = run(make(), batch, context(24, epoch=1))
        c = run(make(), batch, context(24, epoch=2))
        assert np.array_equal(a, b)
        assert not np.array_equal(a, c)


def test_fields_and_ops_draw_independently(batch):
    ctx = context(24)
    image = run(RandomHorizontalFlip(), batch, ctx, field="image")
    mask = run(RandomHorizontalFlip(), batch, ctx, field="mask")
    assert not np.array_equal(image, mask)
    flip, cut = RandomHorizontalFlip(), Cutout(4)
    run(flip, batch, ctx)
    run(cut, batch, ctx)
    assert flip.salt != cut.salt


def test_transform_argument_and_input_checks(batch):
    with pytest.raises(ValueError):
        RandomHorizontalFlip(1.5)
    with pytest.raises(ValueError):
        RandomTranslate(-1)
    with pytest.raises(ValueError):
        Cutout(0)
    with pytest.raises(ValueError, match="fill"):
        run(Cutout(4, fill=(0, 0, 300)), batch, context(24))
    with pytest.raises(ValueError, match="fill"):
        run(RandomTranslate(4, fill=(0, 0)), batch, context(24))
    torch_spec = Spec((32, 40, 3), torch.uint8, on_torch=True)
    with pytest.raises(TypeError, match="field 'image'"):  # Cutout has no torch path
        Cutout(4).declare(torch_spec, FIELD, VIEW)
    with pytest.raises(TypeError, match="field 'image'"):  # nor a flip of a (B, N) tensor
        RandomHorizontalFlip().declare(Spec((32,), torch.uint8, on_torch=True), FIELD, VIEW)


# ---------------------------------------------------------------- NormalizeImage


MEAN, STD = np.array([123.7, 116.3, 103.5]), np.array([58.4, 57.1, 57.4])


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
def test_normalize_numpy_stage_equals_reference(batch, dtype):
    out = run(NormalizeImage(MEAN, STD, dtype), batch, context(24))
    assert np.array_equal(out, ((batch - MEAN) / STD).astype(dtype))


@pytest.mark.parametrize("dtype, rows", [(np.float32, True), (np.float16, False), (np.float64, False)])
@pytest.mark.parametrize("pixels", [np.uint8, np.int8])
def test_normalize_8_bit_pixels_take_the_arithmetic_pass_only_where_it_is_exact(dtype, rows, pixels):
    """8-bit pixels to float32: ``x * (1 / std) - mean / std`` in float64 equals the table for
    these mean/std, so the vectorised pass runs; to float64 it would not (hundreds of the 768
    values differ in their last bit), so the table does; both give the reference exactly."""
    x = np.arange(-128, 128).astype(pixels).reshape(1, 4, 64, 1).repeat(3, axis=-1)
    mean, std = 255 * np.array([0.485, 0.456, 0.406]), 255 * np.array([0.229, 0.224, 0.225])
    op = NormalizeImage(mean, std, dtype)
    out = run(op, x, context(1))
    assert (op._rows is not None) == rows
    assert np.array_equal(out, ((x.astype(np.float64) - mean) / std).astype(dtype))


@pytest.mark.parametrize("dtype, atol", [(torch.float32, 1e-5), (torch.float16, 4e-3)])
@pytest.mark.parametrize("channels_last", [True, False])
def test_normalize_torch_stage_after_to_torch_image(batch, dtype, atol, channels_last):
    pipeline = [ToTensor(), ToTorchImage(channels_last=channels_last), NormalizeImage(MEAN, STD, dtype)]
    spec = Spec(batch.shape[1:], np.dtype(np.uint8))
    x = batch.copy()
    for op in pipeline:
        spec = op.declare(spec, FIELD, VIEW)
        x = op(x, None, context(24))
    assert spec == Spec((3, 32, 40), dtype, on_torch=True, device="cpu", channels_first=True)
    assert x.dtype == dtype and x.shape == (24, 3, 32, 40)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    assert x.is_contiguous(memory_format=fmt)
    ref = ((batch - MEAN) / STD).transpose(0, 3, 1, 2)
    assert np.allclose(x.float().numpy(), ref, rtol=0, atol=atol)


def test_normalize_torch_stage_nhwc(batch):
    op = NormalizeImage(MEAN, STD, np.float32)
    spec = op.declare(Spec((32, 40, 3), torch.uint8, on_torch=True), FIELD, VIEW)
    assert spec.shape == (32, 40, 3) and spec.dtype == torch.float32
    x = op(torch.from_numpy(batch.copy()), None, context(24))
    assert np.allclose(x.numpy(), (batch - MEAN) / STD, atol=1e-5)


def test_normalize_checks():
    with pytest.raises(ConfigurationError, match="std != 0"):
        NormalizeImage([1, 2, 3], [1, 0, 1])
    with pytest.raises(ValueError):
        NormalizeImage([1, 2], [1, 2, 3])
    with pytest.raises(ValueError):
        NormalizeImage(MEAN, STD, np.int32)
    with pytest.raises(TypeError, match="uint8, int8, uint16 or int16"):
        NormalizeImage(MEAN, STD).declare(Spec((8, 8, 3), np.dtype(np.float32)), FIELD, VIEW)
    with pytest.raises(TypeError, match="uint8, int8, uint16 or int16"):  # no 2**32-row table
        NormalizeImage(MEAN, STD).declare(Spec((8, 8, 3), np.dtype(np.uint32)), FIELD, VIEW)
    with pytest.raises(TypeError, match="3 channels"):
        NormalizeImage(MEAN, STD).declare(Spec((8, 8, 4), np.dtype(np.uint8)), FIELD, VIEW)
    with pytest.raises(TypeError, match="after ToTensor"):  # numpy has no bfloat16
        NormalizeImage(MEAN, STD, torch.bfloat16).declare(Spec((8, 8, 3), np.dtype(np.uint8)), FIELD, VIEW)
    spec = NormalizeImage(MEAN, STD, torch.bfloat16).declare(
        Spec((3, 8, 8), torch.uint8, on_torch=True, channels_first=True), FIELD, VIEW
    )
    assert spec.dtype == torch.bfloat16


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
@pytest.mark.parametrize("pixels", [np.uint16, np.int16, np.int8])
def test_normalize_16_bit_and_signed_numpy_stage_equals_reference(dtype, pixels):
    info = np.iinfo(pixels)
    rng = np.random.default_rng(5)
    x = rng.integers(info.min, info.max, (6, 9, 7, 2), dtype=pixels, endpoint=True)
    x[0, 0, 0] = info.max, info.min  # the table's both ends
    mean, std = [1000.0, -20.5], [350.0, 7.25]  # in the pixels' own units
    out = run(NormalizeImage(mean, std, dtype), x, context(6))
    ref = ((x.astype(np.float64) - mean) / std).astype(dtype)
    assert out.dtype == dtype and np.array_equal(out, ref, equal_nan=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_normalize_uint16_torch_stage(dtype):
    x = np.random.default_rng(6).integers(0, 65535, (4, 5, 6, 1), dtype=np.uint16, endpoint=True)
    x[0, 0, 0, 0] = 65535  # above float16's largest finite value: converted through float32
    op = NormalizeImage([30000.0], [20000.0], dtype)
    spec, x_t = Spec(x.shape[1:], np.dtype(np.uint16)), x.copy()
    for stage in (ToTensor(), ToTorchImage(), op):
        spec = stage.declare(spec, FIELD, VIEW)
        x_t = stage(x_t, None, context(4))
    assert spec.dtype == dtype and x_t.dtype == dtype and x_t.shape == (4, 1, 5, 6)
    ref = (x.astype(np.float64) - 30000.0) / 20000.0
    assert np.allclose(
        x_t.float().numpy().transpose(0, 2, 3, 1), ref, rtol=0, atol=2e-3 if dtype == torch.float16 else 1e-6
    )
    assert torch.isfinite(x_t).all()


# ---------------------------------------------------------------- torch stage


def test_to_tensor_shares_memory(batch):
    op = ToTensor()
    spec = op.declare(Spec(batch.shape[1:], np.dtype(np.uint8)), FIELD, VIEW)
    assert spec == Spec(batch.shape[1:], torch.uint8, on_torch=True, device="cpu")
    assert op.buffer_spec(spec, 8) is None
    x = batch.copy()
    t = op(x, None, context(24))
    x[0, 0, 0, 0] = 77
    assert t[0, 0, 0, 0] == 77 and t.data_ptr() == x.ctypes.data


def test_to_torch_image_layouts(batch):
    t = torch.from_numpy(batch.copy())
    spec_in = Spec((32, 40, 3), torch.uint8, on_torch=True)
    op = ToTorchImage(channels_last=True)
    assert op.declare(spec_in, FIELD, VIEW).shape == (3, 32, 40)
    out = op(t, None, context(24))
    assert out.shape == (24, 3, 32, 40) and out.data_ptr() == t.data_ptr()
    assert out.is_contiguous(memory_format=torch.channels_last)
    assert out.stride() == (32 * 40 * 3, 1, 40 * 3, 3)
    op = ToTorchImage(channels_last=False)
    op.declare(spec_in, FIELD, VIEW)
    out = op(t, None, context(24))
    assert out.is_contiguous() and out.stride() == (3 * 32 * 40, 32 * 40, 40, 1)
    assert torch.equal(out, t.permute(0, 3, 1, 2))


def test_to_torch_image_converts_int16_back_to_float16():
    half = torch.randn(2, 4, 4, 3).half()
    op = ToTorchImage(convert_back_int16=True)
    spec = op.declare(Spec((4, 4, 3), torch.int16, on_torch=True), FIELD, VIEW)
    assert spec.dtype == torch.float16
    assert torch.equal(op(half.view(torch.int16), None, context(2)), half.permute(0, 3, 1, 2))


def test_convert_numpy_and_torch(batch):
    out = run(Convert(np.float32), batch, context(24))
    assert out.dtype == np.float32 and np.array_equal(out, batch)
    op = Convert(torch.float64)
    spec = op.declare(Spec((32, 40, 3), torch.uint8, on_torch=True), FIELD, VIEW)
    assert spec.dtype == torch.float64 and spec.on_torch
    out = op(torch.from_numpy(batch), None, context(24))
    assert out.dtype == torch.float64
    np.testing.assert_array_equal(out.numpy(), batch.astype(np.float64))
    chw = torch.from_numpy(batch).permute(0, 3, 1, 2)  # channels-last memory: the layout is kept
    out = op(chw, None, context(24))
    assert out.stride() == chw.stride()
    np.testing.assert_array_equal(out.numpy(), batch.transpose(0, 3, 1, 2).astype(np.float64))


def test_to_device_cpu_keeps_layout(batch):
    op = ToDevice("cpu")
    spec = op.declare(Spec((3, 32, 40), torch.uint8, on_torch=True), FIELD, VIEW)
    assert spec.device == "cpu" and spec.on_torch
    x = torch.from_numpy(batch.copy()).permute(0, 3, 1, 2)
    out = op(x, None, context(24))
    assert torch.equal(out, x) and out.is_contiguous(memory_format=torch.channels_last)
    with pytest.raises(TypeError):
        op.declare(Spec((3, 32, 40), np.dtype(np.uint8)), FIELD, VIEW)


def test_squeeze_labels_numpy_and_torch():
    labels = np.arange(6, dtype=np.int64).reshape(6, 1)
    op = Squeeze()
    spec = op.declare(Spec((1,), np.dtype(np.int64)), VIEW.fields["label"], VIEW)
    assert spec.shape == ()
    assert op(labels, None, context(6)).shape == (6,)
    one = op(labels[:1], None, context(1))  # a batch of one keeps its batch dimension
    assert one.shape == (1,)
    op = Squeeze(2)
    spec = op.declare(Spec((3, 1), torch.int64, on_torch=True), VIEW.fields["label"], VIEW)
    assert spec.shape == (3,)
    assert op(torch.zeros(5, 3, 1), None, context(5)).shape == (5, 3)
    with pytest.raises(ValueError):
        Squeeze(0).declare(Spec((1,), np.dtype(np.int64)), VIEW.fields["label"], VIEW)
    with pytest.raises(ValueError):
        Squeeze(1).declare(Spec((3,), np.dtype(np.int64)), VIEW.fields["label"], VIEW)
