"""The random transforms on a torch batch (ffload.loaders.transforms.batch_torch, after ToTensor or a
device decoder) against the compiled numpy path on the same photos and seeds: the same ``params``, and
the same pixels (bit for bit on CPU tensors: the torch code evaluates the kernels' float32 / float64
expressions in the same order), NHWC and NCHW, alone and through a real Loader where ToTensor sits
before or after the augmentations. The ``gpu`` tests run the same comparisons on a CUDA device and
skip without one."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from skimage import data
from sklearn.datasets import load_sample_images
from test_transforms import FIELD, VIEW

import ffload
from ffload.errors import PipelineError
from ffload.formats import RGBImageField, write_dataset
from ffload.loaders import (
    NormalizeImage,
    RandomResizedCropRGBImageDecoder,
    SimpleRGBImageDecoder,
    ToDevice,
    ToTensor,
    ToTorchImage,
)
from ffload.loaders.pipeline.operation import BatchContext, Spec
from ffload.loaders.rng import sample_seeds
from ffload.loaders.transforms.color import ColorJitter, GaussianBlur, RandomGrayscale
from ffload.loaders.transforms.erase import Cutout, RandomErasing
from ffload.loaders.transforms.flip import RandomHorizontalFlip, RandomVerticalFlip
from ffload.loaders.transforms.warp import RandomAffine, RandomPerspective, RandomRotation

H, W = 48, 55  # W not a multiple of 4: the CPU RGB kernels' per-pixel tails run too

CUDA = torch.cuda.is_available()
gpu = pytest.mark.gpu


@pytest.fixture(scope="module")
def photos():
    """(18, H, W, 3) uint8 crops of real photos: astronaut, coffee, chelsea (skimage), china and
    flower (sklearn)."""
    sources = [data.astronaut(), data.coffee(), data.chelsea(), *load_sample_images().images]
    return np.stack([sources[k % 5][11 * k : 11 * k + H, 17 * k : 17 * k + W] for k in range(18)])


def context(n, seed=3, epoch=1):
    idx = np.arange(40, 40 + n, dtype=np.int64)
    return BatchContext(idx, sample_seeds(seed, epoch, idx), None, None, None, None, epoch)


OPS = {
    "hflip": lambda: RandomHorizontalFlip(0.5),
    "vflip": lambda: RandomVerticalFlip(0.5),
    "erasing": lambda: RandomErasing(0.7, fill=(9, 200, 31)),
    "grayscale": lambda: RandomGrayscale(0.5),
    "jitter": lambda: ColorJitter(0.4, 0.4, 0.4, 0.1),
    "jitter_contrast_hue": lambda: ColorJitter(contrast=(0.2, 1.8), hue=0.5),
    "affine": lambda: RandomAffine(30, translate=(0.1, 0.2), scale=(0.8, 1.2), shear=10, fill=(10, 20, 30)),
    "rotation": lambda: RandomRotation(45),
    "perspective": lambda: RandomPerspective(0.5, 0.8, fill=(255, 0, 128)),
}


def numpy_path(make, x, ctx):
    """(op declared on numpy, its output on a copy of x)."""
    op = make()
    spec = op.declare(Spec(x.shape[1:], x.dtype), FIELD, VIEW)
    bspec = op.buffer_spec(spec, len(x))
    dst = None if bspec is None else np.empty(bspec.shape, bspec.dtype)
    return op, np.array(op(x.copy(), dst, ctx))


def torch_path(make, x, ctx, device="cpu", channels_first=False):
    """(op declared on a torch spec, its NHWC output as numpy) for x uploaded to ``device``."""
    op = make()
    t = torch.from_numpy(x.copy()).to(device)
    shape = x.shape[1:]
    if channels_first:
        t, shape = t.permute(0, 3, 1, 2), (shape[2], shape[0], shape[1])
    spec = Spec(shape, torch.uint8, on_torch=True, device=str(t.device), channels_first=channels_first)
    assert op.declare(spec, FIELD, VIEW) == spec and op.buffer_spec(spec, len(x)) is None
    out = op(t, None, ctx)
    assert out.shape == t.shape and out.dtype == t.dtype and out.device == t.device
    return op, (out.permute(0, 2, 3, 1) if channels_first else out).cpu().numpy()


@pytest.mark.parametrize("name", list(OPS))
def test_torch_path_gives_the_numpy_pixels(photos, name):
    ctx = context(len(photos))
    op_np, ref = numpy_path(OPS[name], photos, ctx)
    op_t, out = torch_path(OPS[name], photos, ctx)
    assert op_np.salt == op_t.salt
    changed = [not np.array_equal(a, b) for a, b in zip(ref, photos)]
    assert 0 < sum(changed)  # the op did something
    if name not in ("jitter", "jitter_contrast_hue", "affine", "rotation"):
        assert sum(changed) < len(photos)  # and left some samples alone
    np.testing.assert_array_equal(out, ref)


@pytest.mark.parametrize("name", ["hflip", "erasing", "jitter", "affine"])
def test_nchw_input_gives_the_nhwc_pixels(photos, name):
    ctx = context(len(photos))
    _, ref = torch_path(OPS[name], photos, ctx)
    _, out = torch_path(OPS[name], photos, ctx, channels_first=True)
    np.testing.assert_array_equal(out, ref)


def test_params_are_the_kernels_draws(photos):
    """The flips' and grayscale's ``params`` are the samples their compiled kernels change."""
    ctx = context(len(photos))
    for make, change in [
        (OPS["hflip"], lambda x: x[:, ::-1]),
        (OPS["vflip"], lambda x: x[::-1]),
        (OPS["grayscale"], None),
    ]:
        op, ref = numpy_path(make, photos, ctx)
        drawn = op.params(ctx.seeds)
        assert drawn.dtype == np.bool_ and 0 < drawn.sum() < len(photos)
        for b in range(len(photos)):
            if change is None:
                assert np.all(ref[b] == ref[b][..., :1]) == bool(drawn[b])
            else:
                np.testing.assert_array_equal(ref[b], change(photos[b]) if drawn[b] else photos[b])


def test_float_batch_is_flipped_and_erased_with_a_float_fill(photos):
    ctx = context(len(photos))
    x = photos.astype(np.float32) / 7
    ref = numpy_path(OPS["erasing"], numpy_path(OPS["hflip"], x, ctx)[1], ctx)[1]
    spec = Spec(x.shape[1:], torch.float32, on_torch=True)
    out = torch.from_numpy(x.copy())
    for make in (OPS["hflip"], OPS["erasing"]):
        op = make()
        op.declare(spec, FIELD, VIEW)
        out = op(out, None, ctx)
    np.testing.assert_array_equal(out.numpy(), ref)


def test_torch_input_refused_where_there_is_no_torch_path():
    spec = Spec((H, W, 3), torch.uint8, on_torch=True)
    for op in (Cutout(4), GaussianBlur(3)):
        with pytest.raises(PipelineError, match="before ToTensor"):
            op.declare(spec, FIELD, VIEW)
    for op in (ColorJitter(0.2), RandomAffine(10)):
        with pytest.raises(PipelineError, match="uint8"):
            op.declare(Spec((H, W, 3), torch.float32, on_torch=True), FIELD, VIEW)
    with pytest.raises(ffload.errors.ConfigurationError, match="not representable"):
        RandomErasing(fill=(300, 0, 0)).declare(spec, FIELD, VIEW)


def test_normalize_torch_stage_matches_the_numpy_stage(photos):
    mean, std = 255 * np.array([0.485, 0.456, 0.406]), 255 * np.array([0.229, 0.224, 0.225])
    ref = numpy_path(lambda: NormalizeImage(mean, std), photos, context(len(photos)))[1]
    for channels_first in (False, True):
        op = NormalizeImage(mean, std)
        t = torch.from_numpy(photos)
        shape = (3, H, W) if channels_first else (H, W, 3)
        t = t.permute(0, 3, 1, 2) if channels_first else t
        op.declare(Spec(shape, torch.uint8, on_torch=True, channels_first=channels_first), FIELD, VIEW)
        out = op(t, None, None)
        out = (out.permute(0, 2, 3, 1) if channels_first else out).numpy()
        np.testing.assert_allclose(out, ref, rtol=0, atol=2e-6 * np.abs(ref).max())


# ---------------------------------------------------------------- through a Loader
@pytest.fixture(scope="module")
def dataset(tmp_path_factory, photos):
    path = tmp_path_factory.mktemp("torch_aug") / "d.beton"
    rows = [(np.ascontiguousarray(np.roll(photos[k % len(photos)], 5 * k, axis=1)),) for k in range(24)]
    write_dataset(str(path), {"image": RGBImageField("jpg", jpeg_quality=90)}, rows, len(rows))
    return str(path)


def augmentations():
    return [
        RandomHorizontalFlip(),
        RandomErasing(0.5, fill=(0, 128, 255)),
        ColorJitter(0.3, 0.3, 0.3, 0.05),
        RandomGrayscale(0.3),
        RandomAffine(15, translate=(0.1, 0.1), scale=(0.9, 1.1)),
        RandomVerticalFlip(),
    ]


def batches(path, pipeline):
    with ffload.Loader(
        path, batch_size=10, num_workers=2, order="random", seed=11, pipelines={"image": pipeline}
    ) as ld:
        return [b[0].cpu().numpy() for b in ld]


@pytest.mark.parametrize("decoder", [lambda: RandomResizedCropRGBImageDecoder(40), SimpleRGBImageDecoder])
def test_loader_batches_equal_whether_augmented_before_or_after_to_tensor(dataset, decoder):
    """[decoder, augmentations, ToTensor] (the flip fused into the decoder) and [decoder, ToTensor,
    augmentations] (torch, not fused) give the same batches."""
    before = batches(dataset, [decoder(), *augmentations(), ToTensor()])
    after = batches(dataset, [decoder(), ToTensor(), *augmentations()])
    nchw = batches(dataset, [decoder(), ToTensor(), ToTorchImage(), *augmentations()])
    assert len(before) == len(after) == 3
    for a, b, c in zip(before, after, nchw):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a, c.transpose(0, 2, 3, 1))


def test_boxes_and_masks_follow_the_torch_path_geometry(tmp_path):
    """Flips and warps on the torch stage record the same geometry as on the numpy stage: the
    boxes and masks that follow the image are the same, and so are the images."""
    from test_box_warps import FIELDS, rectangles
    from test_box_warps import H as BH
    from test_box_warps import W as BW

    from ffload.loaders import MaskDecoder, RaggedArrayDecoder, ResizeRGBImageDecoder, TransformBoxes

    n = 16
    path = write_dataset(str(tmp_path / "g.beton"), FIELDS, rectangles(n, seed=4, margin=18), n)

    def load(image):
        pipelines = {
            "image": image,
            "boxes": [RaggedArrayDecoder(), TransformBoxes("image", drop=False)],
            "labels": None,
            "mask": [MaskDecoder("image")],
            "index": None,
        }
        with ffload.Loader(path, batch_size=n, num_workers=1, order="sequential", seed=2, pipelines=pipelines) as ld:
            ((image, boxes, mask),) = list(ld)
        return (image.numpy() if isinstance(image, torch.Tensor) else image), boxes, mask

    def augmentations():
        return [RandomHorizontalFlip(), RandomAffine(20, translate=(0.1, 0.1)), RandomVerticalFlip()]

    a = load([ResizeRGBImageDecoder((BH, BW)), *augmentations(), ToTensor()])
    b = load([ResizeRGBImageDecoder((BH, BW)), ToTensor(), *augmentations()])
    plain = load([ResizeRGBImageDecoder((BH, BW))])
    assert not np.array_equal(a[0], plain[0]) and not np.array_equal(a[1], plain[1])
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)


# ---------------------------------------------------------------- CUDA
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA device")


@gpu
@needs_cuda
@pytest.mark.parametrize("name", list(OPS))
def test_cuda_path_matches_the_numpy_pixels(photos, name):
    """Exact for flips, erasing and grayscale; at most 1 grey level off for the float kernels
    (and on fewer than 1% of the values), where the device rounds a division differently."""
    ctx = context(len(photos))
    _, ref = numpy_path(OPS[name], photos, ctx)
    _, out = torch_path(OPS[name], photos, ctx, device="cuda")
    diff = np.abs(out.astype(int) - ref)
    if name in ("hflip", "vflip", "erasing", "grayscale"):
        assert diff.max() == 0
    assert diff.max() <= 1 and (diff > 0).mean() < 0.01


@gpu
@needs_cuda
def test_cuda_loader_batches_equal_the_cpu_batches(dataset):
    mean, std = 255 * np.array([0.485, 0.456, 0.406]), 255 * np.array([0.229, 0.224, 0.225])
    norm = (NormalizeImage(mean, std, np.float32),)
    cpu = batches(dataset, [RandomResizedCropRGBImageDecoder(40), *augmentations(), ToTensor(), *norm])
    dev = batches(
        dataset,
        [RandomResizedCropRGBImageDecoder(40), ToTensor(), ToDevice("cuda:0"), *augmentations(), *norm],
    )
    for a, b in zip(cpu, dev):
        assert np.abs(a - b).max() <= 2 / (255 * 0.224)  # one grey level, plus float rounding
