"""A user's stack compiled (ffload.loaders.transforms.compose) and the decoders it folds into, without
torchvision (tests/test_torchvision_parity.py compares with torchvision itself): torchvision's
``Resize`` + ``CenterCrop`` decoder against Pillow's antialiased bilinear (torchvision's own filter),
its refusals, progressive resizing, ``from_albumentations`` against Albumentations on the same
pixels, and a ``PythonTransform`` that learns its output shape."""

from __future__ import annotations

import warnings

import albumentations as A
import numpy as np
import pytest
from albumentations.pytorch import ToTensorV2
from PIL import Image
from skimage import data
from test_decoders import decode, write

from ffload import Loader
from ffload.codecs import jpeg
from ffload.errors import ConfigurationError, PipelineError
from ffload.formats import RGBImageField
from ffload.loaders import RandomHorizontalFlip, RandomResizedCropRGBImageDecoder
from ffload.loaders.decoders.rgb import ResizeCenterCropRGBImageDecoder, SimpleRGBImageDecoder, resized_sizes
from ffload.loaders.transforms.compose import CompiledTransforms, from_albumentations
from ffload.loaders.transforms.normalize import NormalizeImage
from ffload.loaders.transforms.python import PythonTransform
from ffload.loaders.transforms.torch_ops import ToTensor
from tests.test_loader import next_order_ready


@pytest.fixture(scope="module")
def photos():
    return [data.astronaut(), data.chelsea(), data.coffee()]  # 512x512, 300x451, 400x600


@pytest.fixture(scope="module")
def raw(photos, tmp_path_factory):
    path = tmp_path_factory.mktemp("raw") / "p.beton"
    return write(path, {"image": RGBImageField(write_mode="raw")}, [(p,) for p in photos]), str(path)


def test_resized_sizes_are_torchvisions_rule():
    # int: the shorter side, the longer int(size * long / short); max_size caps the longer; a pair sets both
    h, w = resized_sizes(np.array([300, 512, 400]), np.array([451, 512, 300]), 256)
    assert h.tolist() == [256, 256, 341] and w.tolist() == [384, 256, 256]
    h, w = resized_sizes(np.array([300]), np.array([900]), 256, max_size=500)
    assert (h.tolist(), w.tolist()) == ([166], [500])
    h, w = resized_sizes(np.array([300]), np.array([451]), (10, 20))
    assert (h.tolist(), w.tolist()) == ([10], [20])


def test_resize_center_crop_is_pillows_bilinear_resize_then_crop(raw, photos):
    view, _ = raw
    out = decode(ResizeCenterCropRGBImageDecoder(160, 128), view, "image", [0, 1, 2])
    for b, photo in enumerate(photos):
        (nh,), (nw,) = resized_sizes([photo.shape[0]], [photo.shape[1]], 160)
        resized = np.asarray(Image.fromarray(photo).resize((int(nw), int(nh)), Image.BILINEAR))
        top, left = int(round((nh - 128) / 2.0)), int(round((nw - 128) / 2.0))
        ref = resized[top : top + 128, left : left + 128]
        diff = np.abs(out[b].astype(int) - ref)
        assert diff.mean() <= 0.5 and diff.max() <= 2, (b, diff.mean(), diff.max())


def test_resize_without_crop_needs_one_size_and_a_crop_no_larger_than_the_image(raw):
    view, _ = raw
    with pytest.raises(PipelineError, match=r"samples 0 and 1 different sizes \(256x256 and 384x256\)"):
        decode(ResizeCenterCropRGBImageDecoder(256), view, "image", [0])
    with pytest.raises(PipelineError, match="sample 0: resized to 64x64, smaller than the 70x70 crop"):
        decode(ResizeCenterCropRGBImageDecoder(64, 70), view, "image", [0])
    with pytest.raises(ConfigurationError, match="needs a size, a crop_size or both"):
        ResizeCenterCropRGBImageDecoder(None)


def test_output_size_changes_between_epochs_of_one_loader(raw):
    """FFCV's progressive resizing: set the decoder's output_size between epochs; the next epoch has
    the new size, with the crops and flips it would have had anyway (a loader built at that size
    gives the same batches), and nothing is compiled again."""
    _, path = raw

    def loader(decoder):
        ops = {"image": [decoder, RandomHorizontalFlip()]}
        return Loader(path, batch_size=3, pipelines=ops, num_workers=2, order="random", seed=4)

    decoder = RandomResizedCropRGBImageDecoder(32)
    with loader(decoder) as progressive:
        first = [b[0].copy() for b in progressive]
        compiled = len(jpeg.decode_rows.signatures)
        progressive._tuner.job_seconds_per_batch = 1.0  # as if the jobs at 32 px were measured
        decoder.output_size = 40
        it = iter(progressive)
        assert progressive._tuner.job_seconds_per_batch is None  # not what jobs at 40 px take
        second = [b[0].copy() for b in it]
        assert len(jpeg.decode_rows.signatures) == compiled
    assert {b.shape[1:] for b in first} == {(32, 32, 3)} and {b.shape[1:] for b in second} == {(40, 40, 3)}
    with loader(RandomResizedCropRGBImageDecoder(40)) as fixed:
        list(fixed)  # epoch 0
        reference = [b[0].copy() for b in fixed]
    for a, b in zip(second, reference):
        np.testing.assert_array_equal(a, b)


def test_output_size_changes_between_loaders_without_compiling(raw, photos):
    """Progressive resizing: a new output size decodes without a new compiled specialisation."""
    _, path = raw
    stages = CompiledTransforms([ResizeCenterCropRGBImageDecoder(72, 64), ToTensor()], [], [])
    with Loader(path, batch_size=3, pipelines={"image": stages}, num_workers=1, order="sequential") as loader:
        assert next(iter(loader))[0].shape == (3, 64, 64, 3)
    compiled = len(jpeg.decode_rows.signatures)
    stages.output_size = 48
    assert stages.output_size == (48, 48) and stages.decoder.size == 54  # the crop keeps its share
    with Loader(path, batch_size=3, pipelines={"image": stages}, num_workers=1, order="sequential") as loader:
        small = next(iter(loader))[0].numpy()
    assert small.shape == (3, 48, 48, 3)
    assert len(jpeg.decode_rows.signatures) == compiled
    np.testing.assert_array_equal(small, decode(ResizeCenterCropRGBImageDecoder(54, 48), raw[0], "image", [0, 1, 2]))
    with pytest.raises(ConfigurationError, match="has no output_size"):
        CompiledTransforms([SimpleRGBImageDecoder()], [], []).output_size = 32


def test_compiled_transforms_output_size_changes_between_epochs_of_one_loader(raw):
    """Progressive resizing through a :class:`CompiledTransforms`' ``output_size`` (which sets its
    decoder's): the next epoch's jobs computed before the change are dropped, the epoch has the new size."""
    _, path = raw
    stages = CompiledTransforms([ResizeCenterCropRGBImageDecoder(72, 64), ToTensor()], [], [])
    # 9 one-sample batches (the 3 photos thrice) on 4 slots: the next epoch's jobs start during this one
    indices = np.tile(np.arange(3), 3)
    with Loader(
        path, batch_size=1, pipelines={"image": stages}, num_workers=2, batches_ahead=1, indices=indices
    ) as loader:
        for _ in loader:
            next_order_ready(loader)
        loader._runner.wait_idle()  # they ran at 64x64
        assert loader._next_jobs is not None and loader._next_jobs.futures, "no job of the next epoch ran early"
        stages.output_size = 48
        assert {tuple(b[0].shape[1:3]) for b in loader} == {(48, 48)}


def test_from_albumentations_normalize_and_flip_are_albumentations_pixels(raw, photos):
    _, path = raw
    stack = A.Compose([A.CenterCrop(200, 240), A.HorizontalFlip(p=1.0), A.Normalize(), ToTensorV2()])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # all of it compiles
        stages = from_albumentations(stack)
    assert [type(s).__name__ for s in stages] == [
        "ResizeCenterCropRGBImageDecoder",
        "RandomHorizontalFlip",
        "NormalizeImage",
        "ToTensor",
        "ToTorchImage",
    ]
    with Loader(path, batch_size=3, pipelines={"image": stages}, num_workers=1, order="sequential") as loader:
        got = next(iter(loader))[0].numpy()
    for b, photo in enumerate(photos):
        # chelsea's 451 - 240 = 211 columns to spare: Albumentations' floor (105), not torchvision's 106
        np.testing.assert_allclose(got[b], stack(image=photo)["image"].numpy(), rtol=0, atol=1e-5)


def test_from_albumentations_runs_the_rest_in_python_with_one_warning(raw):
    _, path = raw
    stack = A.Compose([A.RandomResizedCrop((64, 64)), A.VerticalFlip(), A.ToGray(p=1.0), A.Normalize()])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        stages = from_albumentations(stack, output="numpy")
    assert len(caught) == 1
    message = str(caught[0].message)
    assert "not compiled, run per sample in Python" in message and "ToGray" in message and "ms" in message
    assert "RandomResizedCrop: cv2.INTER_LINEAR resampled as antialiased bilinear" in message
    assert [type(s).__name__ for s in stages] == [
        "RandomResizedCropRGBImageDecoder",
        "RandomVerticalFlip",
        "PythonTransform",
        "NormalizeImage",
    ]
    with Loader(path, batch_size=3, pipelines={"image": stages}, num_workers=1) as loader:
        batch = next(iter(loader))[0]
    assert batch.shape == (3, 64, 64, 3) and batch.dtype == np.float32
    pixels = batch * (255 * np.array([0.229, 0.224, 0.225])) + 255 * np.array([0.485, 0.456, 0.406])
    np.testing.assert_allclose(pixels[..., 0], pixels[..., 1], atol=1e-3)  # grey: three equal channels
    with pytest.raises(ConfigurationError, match="output must be one of"):
        from_albumentations(stack, output="pil")


def test_python_transform_learns_its_output_shape_at_declare(raw):
    _, path = raw
    op = PythonTransform(lambda x: x[::2, ::4, :1], None)
    stages = [ResizeCenterCropRGBImageDecoder(None, (40, 40)), op, NormalizeImage([0.0], [1.0])]
    with Loader(path, batch_size=3, pipelines={"image": stages}, num_workers=1, order="sequential") as loader:
        batch = next(iter(loader))[0]
    assert batch.shape == (3, 20, 10, 1)
    assert op.output_shape is None  # the loader's copy learned it; the object passed is unchanged


def test_bench_stack_spec_errors_name_the_cause(tmp_path):
    from ffload.bench.user_stack import load_stack

    with pytest.raises(ConfigurationError, match="expects 'module:attribute'"):
        load_stack("stacks")
    (tmp_path / "stacks.py").write_text("stack = [1]\n")
    assert load_stack(f"{tmp_path / 'stacks.py'}:stack") == [1]
    with pytest.raises(ConfigurationError, match="has no attribute 'other'"):
        load_stack(f"{tmp_path / 'stacks.py'}:other")
    with pytest.raises(ConfigurationError, match="cannot import no_such_module_here"):
        load_stack("no_such_module_here:x")
