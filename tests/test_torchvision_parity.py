"""Pixel parity with torchvision itself: for every transform ``ffload.transforms.from_torchvision`` maps,
the parameters ffload draws (``op.params(seeds)``, the decoders' boxes, the flips' draws) applied with
torchvision's functional op to the same image, compared: exact for flips, crops, erasing and grayscale;
within one grey level on average for the resampling ops (``docs/transforms-parity.md`` holds the table).

torchvision imports only next to the torch build its wheel was linked against (the index's default, CUDA,
build): CI runs these in its env -i environment (``.ci/run``); elsewhere they skip, saying why."""

from __future__ import annotations

import io
import warnings

import numpy as np
import pytest
import torch
from PIL import Image
from skimage import data
from sklearn.datasets import load_sample_images
from test_decoders import decode, write
from test_transforms import context, run

from ffload.formats import RGBImageField
from ffload.loaders.decoders.crops import random_resized_crop_boxes
from ffload.loaders.decoders.rgb import RandomResizedCropRGBImageDecoder, ResizeCenterCropRGBImageDecoder
from ffload.loaders.rng import op_salt, randint, sample_seeds, seed_state, uniform, uniform_range
from ffload.loaders.transforms.color import ColorJitter, GaussianBlur, RandomGrayscale
from ffload.loaders.transforms.crop import RandomCrop
from ffload.loaders.transforms.erase import RandomErasing
from ffload.loaders.transforms.flip import RandomHorizontalFlip, RandomVerticalFlip
from ffload.loaders.transforms.normalize import NormalizeImage
from ffload.loaders.transforms.warp import RandomAffine, RandomPerspective, RandomRotation

try:
    from torchvision.transforms import v2
    from torchvision.transforms.v2 import functional as F
except Exception as e:  # ImportError, or torchvision's "operator torchvision::nms does not exist" (RuntimeError)
    pytest.skip(
        f"torchvision does not import here ({type(e).__name__}: {e}); its wheels need the torch build they were "
        "linked against: CI runs these tests in its env -i environment (.ci/run)",
        allow_module_level=True,
    )

pytestmark = pytest.mark.torchvision


def _tensor(image: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.array(image)).permute(2, 0, 1)  # a writable copy


def _hwc(tensor: torch.Tensor) -> np.ndarray:
    return tensor.permute(1, 2, 0).numpy()


def _draw(kernel, state, *args):
    """One draw of an ffload generator kernel: ``(value, next state as uint64)``."""
    value, state = kernel(np.uint64(state), *args)
    return value, np.uint64(state)


def _mean_diff(a, b) -> float:
    return float(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)).mean())


@pytest.fixture(scope="module")
def photos():
    """Five real photos of assorted sizes and aspect ratios (300..640 pixels a side)."""
    china, flower = load_sample_images().images
    return [data.astronaut(), data.chelsea(), data.coffee(), china, flower[:, :500]]


@pytest.fixture(scope="module")
def datasets(photos, tmp_path_factory):
    """The photos written raw and as JPEG (q90), with the pixels torchvision gets: the raw photo, or
    Pillow's decode of the stored JPEG (what a DataLoader + PIL reads)."""
    out = {}
    for mode in ("raw", "jpg"):
        path = tmp_path_factory.mktemp(mode) / "p.beton"
        view = write(path, {"image": RGBImageField(write_mode=mode)}, [(p,) for p in photos])
        if mode == "raw":
            decoded = photos
        else:
            decoded = [
                np.asarray(Image.open(io.BytesIO(np.array(view.payload("image", i)).tobytes())).convert("RGB"))
                for i in range(len(photos))
            ]
        out[mode] = (view, decoded, str(path))
    return out


@pytest.fixture(scope="module")
def tiles(photos):
    """(12, 64, 72, 3) uint8 tiles of the photos (a fixed-size batch for the numpy-stage ops)."""
    return np.stack([photos[k % 5][17 * k : 17 * k + 64, 23 * k : 23 * k + 72] for k in range(12)])


# ---------------------------------------------------------------- decoders: resampling
@pytest.mark.parametrize("mode", ["raw", "jpg"])
@pytest.mark.parametrize("size", [(112, 96), (36, 40)])  # 36 x 40: most JPEG boxes >= 8x, decoded at half size
def test_random_resized_crop_decoder_is_torchvisions_resized_crop(datasets, mode, size):
    view, decoded, _ = datasets[mode]
    n = len(decoded)
    op = RandomResizedCropRGBImageDecoder(size, scale=(0.5, 1.0), antialias=True)
    out = decode(op, view, "image", range(n), seed=3)
    boxes = np.empty((n, 4), np.int64)
    column = view.metadata["image"]
    seeds = sample_seeds(3, 0, np.arange(n, dtype=np.int64))  # decode()'s
    random_resized_crop_boxes(
        np.arange(n, dtype=np.int64), column["height"], column["width"], seeds, op.salt, 0.5, 1.0, 3 / 4, 4 / 3, boxes
    )
    for b in range(n):
        ref = F.resized_crop(_tensor(decoded[b]), *boxes[b].tolist(), list(size), antialias=True)
        assert _mean_diff(out[b], _hwc(ref)) <= 1.0, (b, boxes[b])


@pytest.mark.parametrize("mode", ["raw", "jpg"])
@pytest.mark.parametrize(
    "size, crop, max_size",
    [(256, 224, None), ((100, 130), None, None), ((150, 200), (120, 180), None), (200, 150, 280), (None, 96, None)],
)
def test_resize_center_crop_decoder_is_torchvisions(datasets, mode, size, crop, max_size):
    view, decoded, _ = datasets[mode]
    keep = list(range(len(decoded)))
    out = decode(ResizeCenterCropRGBImageDecoder(size, crop, max_size), view, "image", keep)
    steps = ([] if size is None else [v2.Resize(size, max_size=max_size)]) + (
        [] if crop is None else [v2.CenterCrop(crop)]
    )
    for row, b in enumerate(keep):
        ref = _hwc(v2.Compose(steps)(_tensor(decoded[b])))
        assert out[row].shape == ref.shape
        if size is None and mode == "raw":
            np.testing.assert_array_equal(out[row], ref)  # a crop alone is a copy
        else:
            assert _mean_diff(out[row], ref) <= 1.0, b


# ---------------------------------------------------------------- exact ops
def test_flips_are_torchvisions_exactly(tiles):
    ctx = context(len(tiles))
    for op_type, flip in ((RandomHorizontalFlip, F.horizontal_flip), (RandomVerticalFlip, F.vertical_flip)):
        op = op_type(0.5)
        out = run(op, tiles, ctx)
        drawn = [uniform(np.uint64(seed_state(s, op.salt)))[0] < 0.5 for s in ctx.seeds]
        assert 0 < sum(drawn) < len(tiles)
        for b in range(len(tiles)):
            ref = _hwc(flip(_tensor(tiles[b]))) if drawn[b] else tiles[b]
            np.testing.assert_array_equal(out[b], ref)


def test_random_crop_with_padding_and_fill_is_torchvisions_exactly(tiles):
    ctx = context(len(tiles))
    op = RandomCrop((60, 70), padding=4, fill=(9, 80, 200))
    out = run(op, tiles, ctx)
    for b in range(len(tiles)):
        state = np.uint64(seed_state(ctx.seeds[b], op.salt))
        i, state = _draw(randint, state, 64 + 8 - 60 + 1)
        j, state = _draw(randint, state, 72 + 8 - 70 + 1)
        padded = F.pad(_tensor(tiles[b]), [4], fill=[9, 80, 200])
        np.testing.assert_array_equal(out[b], _hwc(F.crop(padded, int(i), int(j), 60, 70)))


def test_erasing_is_torchvisions_exactly(tiles):
    ctx = context(len(tiles))
    op = RandomErasing(p=0.9, fill=(3, 4, 5))
    out = run(op, tiles, ctx)
    boxes = op.params(ctx.seeds, 64, 72)
    assert (boxes[:, 2] > 0).sum() >= 2
    for b, (i, j, h, w) in enumerate(boxes.tolist()):
        ref = (
            F.erase(_tensor(tiles[b]), i, j, h, w, torch.tensor([3, 4, 5], dtype=torch.uint8)[:, None, None])
            if h
            else _tensor(tiles[b])
        )
        np.testing.assert_array_equal(out[b], _hwc(ref))


def test_grayscale_is_torchvisions_exactly(tiles):
    out = run(RandomGrayscale(1.0), tiles, context(len(tiles)))
    for b in range(len(tiles)):
        np.testing.assert_array_equal(out[b], _hwc(F.rgb_to_grayscale(_tensor(tiles[b]), num_output_channels=3)))


def test_to_tensor_normalize_is_torchvisions_within_float_rounding(tiles):
    mean, std = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
    out = run(NormalizeImage(255 * np.array(mean), 255 * np.array(std)), tiles, context(len(tiles)))
    for b in range(len(tiles)):
        ref = F.normalize(F.to_dtype(_tensor(tiles[b]), torch.float32, scale=True), mean, std)
        np.testing.assert_allclose(out[b], _hwc(ref), rtol=0, atol=2e-6)


# ---------------------------------------------------------------- colour and blur
def test_color_jitter_is_torchvisions_with_ffloads_factors(tiles):
    ctx = context(len(tiles))
    op = ColorJitter(0.4, 0.4, 0.4, 0.1)
    out = run(op, tiles, ctx)
    params = op.params(ctx.seeds)
    adjust = [F.adjust_brightness, F.adjust_contrast, F.adjust_saturation, F.adjust_hue]
    diffs = []
    for b in range(len(tiles)):
        x = _tensor(tiles[b])
        for k in params[b, :4].astype(int):
            x = adjust[k](x, float(params[b, 4 + k]))
        diffs.append(_mean_diff(out[b], _hwc(x)))
    assert max(diffs) <= 1.0, diffs


def test_gaussian_blur_is_torchvisions_with_ffloads_sigma(tiles):
    ctx = context(len(tiles))
    op = GaussianBlur(5, (0.1, 2.0))
    out = run(op, tiles, ctx)
    for b, sigma in enumerate(op.params(ctx.seeds).tolist()):
        ref = F.gaussian_blur(_tensor(tiles[b]), [5, 5], [sigma, sigma])
        assert _mean_diff(out[b], _hwc(ref)) <= 1.0, sigma


# ---------------------------------------------------------------- warps
def _affine_draws(seed, salt, ranges, translate, height, width):
    """RandomAffine's draw order (ffload.loaders.transforms.warp._affine_params) as torchvision's arguments."""
    state = np.uint64(seed_state(seed, salt))
    _, state = _draw(uniform, state)
    angle, state = _draw(uniform_range, state, ranges[0, 0], ranges[0, 1])
    dx, state = _draw(uniform_range, state, -translate[0] * width, translate[0] * width)
    dy, state = _draw(uniform_range, state, -translate[1] * height, translate[1] * height)
    scale, state = _draw(uniform_range, state, ranges[1, 0], ranges[1, 1])
    shx, state = _draw(uniform_range, state, ranges[2, 0], ranges[2, 1])
    shy, state = _draw(uniform_range, state, ranges[3, 0], ranges[3, 1])
    return angle, [int(np.round(dx)), int(np.round(dy))], scale, [shx, shy]


@pytest.mark.parametrize(
    "op",
    [
        RandomAffine(20, translate=(0.1, 0.2), scale=(0.8, 1.2), shear=(-5, 5, -3, 3), fill=(10, 20, 30)),
        RandomRotation(30),
    ],
    ids=["affine", "rotation"],
)
def test_affine_warps_are_torchvisions_bilinear(tiles, op):
    ctx = context(len(tiles))
    out = run(op, tiles, ctx)
    for b in range(len(tiles)):
        angle, shift, scale, shear = _affine_draws(ctx.seeds[b], op.salt, op.ranges, op.translate, 64, 72)
        ref = F.affine(_tensor(tiles[b]), angle, shift, scale, shear, v2.InterpolationMode.BILINEAR, list(op.fill))
        assert _mean_diff(out[b], _hwc(ref)) <= 1.0, b


def test_perspective_is_torchvisions_bilinear(tiles):
    ctx = context(len(tiles))
    op = RandomPerspective(0.5, p=1.0, fill=(7, 7, 7))
    out = run(op, tiles, ctx)
    ends = op.corners(ctx.seeds, 64, 72)
    start = [[0, 0], [71, 0], [71, 63], [0, 63]]
    for b in range(len(tiles)):
        ref = F.perspective(
            _tensor(tiles[b]), start, ends[b].astype(int).tolist(), v2.InterpolationMode.BILINEAR, [7, 7, 7]
        )
        assert _mean_diff(out[b], _hwc(ref)) <= 1.0, b


# ---------------------------------------------------------------- from_torchvision end to end
def test_compiled_stack_matches_torchvision_end_to_end(datasets):
    """Deep Lake's complex stack shape (crop, flip, affine, perspective, jitter, tensor, normalize) compiled
    and run by a Loader, against torchvision's functional ops with the same draws (salts as the pipeline
    sets them: per operation position)."""
    from ffload import Loader
    from ffload.transforms import from_torchvision

    view, decoded, path = datasets["raw"]
    stack = v2.Compose(
        [
            v2.RandomResizedCrop(96),
            v2.RandomHorizontalFlip(),
            v2.RandomVerticalFlip(0.3),
            v2.ColorJitter(0.3, 0.3, 0.3, 0.05),
            v2.ToImage(),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize([0.5, 0.4, 0.3], [0.2, 0.25, 0.3]),
        ]
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # everything here compiles
        stages = from_torchvision(stack)
    n = len(decoded)
    with Loader(path, batch_size=n, pipelines={"image": stages}, seed=5, num_workers=1, order="sequential") as loader:
        got = next(iter(loader))[0].numpy()
    seeds = sample_seeds(5, 0, np.arange(n, dtype=np.int64))
    field = "image"
    salts = [op_salt(int(op_salt(type(s).__name__, field)), i) for i, s in enumerate(stages)]
    column = view.metadata["image"]
    boxes = np.empty((n, 4), np.int64)
    random_resized_crop_boxes(
        np.arange(n, dtype=np.int64), column["height"], column["width"], seeds, salts[0], 0.08, 1.0, 3 / 4, 4 / 3, boxes
    )
    jitter = stages[3]
    jitter.salt = salts[3]
    params = jitter.params(seeds)
    adjust = [F.adjust_brightness, F.adjust_contrast, F.adjust_saturation, F.adjust_hue]
    for b in range(n):
        x = F.resized_crop(_tensor(decoded[b]), *boxes[b].tolist(), [96, 96], antialias=True)
        if uniform(np.uint64(seed_state(seeds[b], salts[1])))[0] < 0.5:
            x = F.horizontal_flip(x)
        if uniform(np.uint64(seed_state(seeds[b], salts[2])))[0] < 0.3:
            x = F.vertical_flip(x)
        for k in params[b, :4].astype(int):
            x = adjust[k](x, float(params[b, 4 + k]))
        x = F.normalize(F.to_dtype(x, torch.float32, scale=True), [0.5, 0.4, 0.3], [0.2, 0.25, 0.3])
        grey = 255 * np.array([0.2, 0.25, 0.3])[:, None, None]  # normalised units -> grey levels
        assert _mean_diff(got[b] * grey, x.numpy() * grey) <= 1.0, b


def test_from_torchvision_maps_folds_and_warns_once():
    from ffload.errors import ConfigurationError
    from ffload.transforms import from_torchvision

    stack = v2.Compose(
        [
            v2.Resize(256),
            v2.CenterCrop(224),
            v2.RandomAffine(10),  # nearest by default: compiled bilinear, said in the warning
            v2.Lambda(lambda x: x),
            v2.RandomPosterize(4),
            v2.ToImage(),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize([0.5] * 3, [0.25] * 3),
            v2.RandomErasing(value=0),
        ]
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        stages = from_torchvision(stack)
    assert len(caught) == 1
    message = str(caught[0].message)
    assert "not compiled, run per sample in Python holding the GIL: Lambda, RandomPosterize (measured " in message
    assert "per 224x224 sample" in message and "RandomAffine: nearest resampled as bilinear" in message
    assert [type(s).__name__ for s in stages] == [
        "ResizeCenterCropRGBImageDecoder",
        "RandomAffine",
        "PythonTransform",
        "NormalizeImage",  # (x - 127.5) / 63.75, emitted before the erasing: value 0 is not a whole uint8 value
        "RandomErasing",
        "ToTensor",
        "ToTorchImage",
    ]
    assert stages.not_compiled == ["Lambda", "RandomPosterize"] and stages.output_size == (224, 224)
    assert stages[3].mean.tolist() == [127.5] * 3 and stages[3].std.tolist() == [63.75] * 3
    numpy_out = from_torchvision(v2.Compose([v2.RandomCrop(32, padding=2), v2.ToImage()]), output="numpy")
    assert [type(s).__name__ for s in numpy_out] == ["SimpleRGBImageDecoder", "RandomCrop"]
    with pytest.raises(ConfigurationError, match="takes no device"):
        from_torchvision(stack, device="cuda")


def test_bench_torchvision_prints_both_rates_and_the_pixel_difference(datasets, tmp_path):
    from click.testing import CliRunner

    from ffload.cli import main

    stack_file = tmp_path / "stacks.py"
    stack_file.write_text(
        "from torchvision.transforms import v2\n"
        "import torch\n"
        "stack = v2.Compose([v2.Resize(100), v2.CenterCrop(80), v2.ToImage(), v2.ToDtype(torch.float32, scale=True)])\n"
    )
    _, _, path = datasets["jpg"]
    args = ["bench", path, "--torchvision", f"{stack_file}:stack", "--epochs", "2", "--num-workers", "1"]
    result = CliRunner().invoke(main, [*args, "--batch-size", "5", "--json"])
    assert result.exit_code == 0, result.output
    import json

    report = json.loads(result.output)
    assert report["compiled_img_s"] > 0 and report["torchvision_img_s"] > 0 and not report["random"]
    assert report["shape"] == [3, 80, 80] and report["pixel_diff"] <= 1.0
    result = CliRunner().invoke(main, [*args, "--batch-size", "5"])
    assert "DataLoader + PIL + torchvision:" in result.output and "pixel difference" in result.output


def test_deeplake_complex_stack_matches_torchvision_end_to_end(datasets):
    """Deep Lake's complex stack (resize, affine, both flips, perspective, jitter, normalize) as a torchvision
    Compose, compiled and run by a Loader on the JPEGs, against torchvision's functional ops with the same
    draws on Pillow's decode of the same bytes."""
    from ffload import Loader
    from ffload.transforms import from_torchvision

    view, decoded, path = datasets["jpg"]
    bilinear = v2.InterpolationMode.BILINEAR
    mean, std = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
    stack = v2.Compose(
        [
            v2.Resize(128),
            v2.CenterCrop(112),
            v2.RandomAffine(20, interpolation=bilinear),
            v2.RandomHorizontalFlip(),
            v2.RandomVerticalFlip(),
            v2.RandomPerspective(0.5, p=0.5),
            v2.ColorJitter(0.2, 0.2, 0.2, 0.2),
            v2.ToImage(),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize(mean, std),
        ]
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        stages = from_torchvision(stack)
    n = len(decoded)
    with Loader(path, batch_size=n, pipelines={"image": stages}, seed=2, num_workers=1, order="sequential") as loader:
        got = next(iter(loader))[0].numpy()
    seeds = sample_seeds(2, 0, np.arange(n, dtype=np.int64))
    salts = [op_salt(int(op_salt(type(s).__name__, "image")), i) for i, s in enumerate(stages)]
    affine, perspective, jitter = stages[1], stages[4], stages[5]
    perspective.salt, jitter.salt = salts[4], salts[5]
    ends, factors = perspective.corners(seeds, 112, 112), jitter.params(seeds)
    adjust = [F.adjust_brightness, F.adjust_contrast, F.adjust_saturation, F.adjust_hue]
    grey = 255 * np.array(std)[:, None, None]
    diffs = []
    for b in range(n):
        x = v2.Compose([v2.Resize(128), v2.CenterCrop(112)])(_tensor(decoded[b]))
        angle, shift, scale, shear = _affine_draws(seeds[b], salts[1], affine.ranges, affine.translate, 112, 112)
        x = F.affine(x, angle, shift, scale, shear, bilinear, [0, 0, 0])
        for salt, flip in ((salts[2], F.horizontal_flip), (salts[3], F.vertical_flip)):
            if uniform(np.uint64(seed_state(seeds[b], salt)))[0] < 0.5:
                x = flip(x)
        start = [[0, 0], [111, 0], [111, 111], [0, 111]]
        if ends[b].astype(int).tolist() != start:
            x = F.perspective(x, start, ends[b].astype(int).tolist(), bilinear, [0, 0, 0])
        for k in factors[b, :4].astype(int):
            x = adjust[k](x, float(factors[b, 4 + k]))
        x = F.normalize(F.to_dtype(x, torch.float32, scale=True), mean, std)
        diffs.append(_mean_diff(got[b] * grey, x.numpy() * grey))
    assert max(diffs) <= 1.0, diffs


@pytest.mark.parametrize("pipeline", ["dl_simple", "dl_complex"])
def test_deeplake_stacks_as_torchvision_compose_compile_entirely(pipeline):
    """What bench_augment's ffload_torchvision row runs: the stack as a user writes it, every
    transform compiled (nothing left to Python), the resize and crop folded into the decoder."""
    from ffload.bench.config import BenchConfig
    from ffload.bench.pipelines import deeplake_compose
    from ffload.transforms import from_torchvision

    cfg = BenchConfig(
        kind="ffload_torchvision", path="x", pipeline=pipeline, batch_size=4, num_workers=1, epochs=1, size=96
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a stage left to Python or approximated would warn
        stages = from_torchvision(deeplake_compose(cfg))
    assert isinstance(stages.decoder, ResizeCenterCropRGBImageDecoder)
    assert not stages.not_compiled and stages.output_size == (96, 96)
