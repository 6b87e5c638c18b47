"""A user's torchvision or Albumentations ``Compose``, compiled: :func:`from_torchvision` and
:func:`from_albumentations` turn the transform objects into ffload pipeline stages (decoder first)
that have the same semantics, and run what has no compiled counterpart as a Python stage.

How a torchvision stack maps (``docs/transforms-parity.md`` lists every difference, with the
parity measured):

* a leading ``RandomResizedCrop`` folds into :class:`RandomResizedCropRGBImageDecoder` with
  ``antialias=True``, a leading ``Resize`` (and a ``CenterCrop`` right after it) or ``CenterCrop``
  into :class:`ResizeCenterCropRGBImageDecoder` (the JPEG is decoded cropped and DCT-scaled where
  that stays within a grey level); anything else starts with :class:`SimpleRGBImageDecoder`;
* uint8 stages (flips, crops, warps, colour, blur, erasing) map one to one on the numpy ``(H, W, 3)``
  batch; ``ToTensor`` / ``ToDtype(scale=True)`` and ``Normalize`` are folded into one
  :class:`NormalizeImage` (``(x - 255 mean) / (255 std)`` in float64, rounded once to float32),
  emitted where the stack first needs float pixels (a ``RandomErasing`` after ``Normalize`` erases
  the float image with its ``value``) or at the end; ``output="tensor"`` adds ``ToTensor`` and
  ``ToTorchImage`` (a ``(B, C, H, W)`` tensor, float after a scaling, else uint8);
* anything else (``Lambda``, unknown classes, options the compiled ops lack, ``RandomApply`` with
  p < 1, ``RandomChoice``, ``RandomOrder``) runs as a :class:`PythonTransform` per run of
  consecutive such transforms, given a ``(C, H, W)`` tensor (a PIL image before a v1 ``ToTensor``);
  one ``UserWarning`` lists them with their measured cost, and those compiled with a resampling
  other than the user's (``RandomAffine``'s default nearest neighbour runs bilinear).

Randomness: every compiled op draws from ffload's per-sample seeds (``op.params(seeds)``), so a
batch does not depend on ``num_workers``; the Python stages seed torch's global generator per
sample (reproducible with one worker thread; with more, concurrent stages may interleave draws).
"""

from __future__ import annotations

import inspect
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from ffload.errors import ConfigurationError
from ffload.loaders.decoders.rgb import (
    RandomResizedCropRGBImageDecoder,
    ResizeCenterCropRGBImageDecoder,
    ResizeRGBImageDecoder,
    SimpleRGBImageDecoder,
)
from ffload.loaders.pipeline.operation import Operation
from ffload.loaders.transforms.color import ColorJitter, GaussianBlur, RandomGrayscale
from ffload.loaders.transforms.crop import RandomCrop
from ffload.loaders.transforms.erase import RandomErasing
from ffload.loaders.transforms.flip import RandomHorizontalFlip, RandomVerticalFlip
from ffload.loaders.transforms.normalize import NormalizeImage
from ffload.loaders.transforms.python import PythonTransform
from ffload.loaders.transforms.torch_ops import ToTensor, ToTorchImage
from ffload.loaders.transforms.warp import RandomAffine, RandomPerspective, RandomRotation

OUTPUTS = ("tensor", "numpy")
_PROBE = (224, 224)  # the image a Python stage's cost is measured on when the decoder's size is unknown


class CompiledTransforms(list):
    """The stages :func:`from_torchvision` / :func:`from_albumentations` made, decoder first.

    A list of :class:`~ffload.loaders.pipeline.operation.Operation` to pass as a field's pipeline,
    with what the compilation left out.

    Attributes:
        decoder: the first stage.
        not_compiled: names of the transforms that run as Python stages.
        approximated: ``'Name: how'`` of the transforms compiled with other semantics.
    """

    def __init__(self, stages: Sequence[Operation], not_compiled: Sequence[str], approximated: Sequence[str]):
        super().__init__(stages)
        self.decoder = stages[0]
        self.not_compiled, self.approximated = list(not_compiled), list(approximated)

    @property
    def output_size(self) -> tuple[int, int] | None:
        """The decoder's ``(height, width)`` output, pixels (None where it depends on the images).

        Setting it between epochs is progressive resizing (FFCV's ImageNet recipe): the kernels take
        the size as an argument, so nothing is compiled again; a loader given these stages yields the
        new size from its next epoch on (``iter(loader)`` declares its pipelines again). Stages after the
        decoder take their sizes from it, except a ``RandomCrop``'s fixed window.

        Raises:
            ConfigurationError: a side below 1, or a decoder whose size is the stored images'.
        """
        return getattr(self.decoder, "output_size", None)

    @output_size.setter
    def output_size(self, value: int | tuple[int, int]) -> None:
        if not hasattr(type(self.decoder), "output_size"):
            raise ConfigurationError(f"{type(self.decoder).__name__} decodes the stored size; it has no output_size")
        self.decoder.output_size = value


class _Compiler:
    """The state of one compilation: the stages so far, the pending float conversion (an affine
    ``(x - mean) / std`` per channel, in uint8 units, not yet emitted), and the Python run."""

    def __init__(self, output: str, make_run: Callable[[list, bool], Callable]):
        if output not in OUTPUTS:
            raise ConfigurationError(f"output must be one of {OUTPUTS}, got {output!r}")
        self.output, self.make_run = output, make_run
        self.stages: list[Operation] = []
        self.pending: tuple[np.ndarray, np.ndarray] | None = None  # (mean, std) of the conversion to float
        self.floats = False  # the numpy stage already holds floats (NormalizeImage emitted)
        self.run: list[Any] = []  # consecutive transforms for one Python stage
        self.not_compiled: list[str] = []
        self.approximated: list[str] = []
        self.size: tuple[int, int] | None = None  # the image's (H, W) where known (cost probes)

    def add(self, op: Operation) -> None:
        self.flush()
        self.stages.append(op)

    def python(self, transform: Any) -> None:
        self.run.append(transform)
        self.not_compiled.append(type(transform).__name__)

    def emit_float(self) -> None:
        """Emit the pending conversion to float as a :class:`NormalizeImage` (the numpy stage)."""
        if self.pending is not None and not self.floats:
            self.add(NormalizeImage(*self.pending, dtype=np.float32))
            self.floats, self.pending = True, None

    def fill(self, value, channels: int = 3) -> tuple[float, ...]:
        """A torchvision fill (None, a number or a sequence, in the units of the current stage) as the
        ``(C,)`` values to paint on the numpy stage: uint8 units while the conversion is pending
        (emitting it first when the fill is not a whole uint8 value there)."""
        fill = np.zeros(channels) if value is None else np.broadcast_to(np.asarray(value, np.float64), (channels,))
        if self.pending is None or self.floats:
            return tuple(float(v) for v in fill)
        raw = fill * self.pending[1] + self.pending[0]
        if np.all(np.abs(raw - np.round(raw)) < 1e-6) and raw.min() >= 0 and raw.max() <= 255:
            return tuple(float(v) for v in np.round(raw))
        self.emit_float()
        return tuple(float(v) for v in fill)

    def flush(self) -> None:
        """Close the run of Python transforms as one :class:`PythonTransform`."""
        if not self.run:
            return
        run, self.run = self.run, []
        if self.pending is not None:  # the Python transforms see float tensors, as torchvision's would
            self.emit_float()
        fn = self.make_run(run, self.floats)
        self.stages.append(PythonTransform(fn, None, input_type="numpy"))
        probe = np.zeros((*(self.size or _PROBE), 3), np.float32 if self.floats else np.uint8)
        self.floats = fn(probe).dtype != np.uint8

    def finish(self) -> list[Operation]:
        self.flush()
        self.emit_float()
        if self.output == "tensor":
            self.stages += [ToTensor(), ToTorchImage()]
        return self.stages


class _TorchvisionRun:
    """A run of transforms not compiled, as one per-sample callable for :class:`PythonTransform`:
    numpy ``(H, W, C)`` in, as a ``(C, H, W)`` tensor (or a PIL image) through the transforms, numpy
    ``(H, W, C)`` out; the ``seed`` keyword seeds torch's global generator first."""

    def __init__(self, transforms: Sequence[Any], pil: bool):
        self.transforms, self.pil = list(transforms), pil

    def __call__(self, x: np.ndarray, seed: int = 0) -> np.ndarray:
        torch.manual_seed(seed)
        if self.pil:
            from PIL import Image

            y = Image.fromarray(np.ascontiguousarray(x))
        else:
            y = torch.from_numpy(np.ascontiguousarray(x)).permute(2, 0, 1)
        for t in self.transforms:
            y = t(y)
        if isinstance(y, torch.Tensor):
            return y.permute(1, 2, 0).contiguous().numpy()
        return np.asarray(y).reshape(np.asarray(y).shape[:2] + (-1,))


def _pair(size) -> tuple[int, int]:
    """torchvision's size argument (an int, or a sequence of 1 or 2) as ``(h, w)``."""
    if isinstance(size, (int, np.integer)):
        return int(size), int(size)
    size = [int(v) for v in size]
    return (size[0], size[0]) if len(size) == 1 else (size[0], size[1])


def _mode(transform) -> str:
    """The lower-case name of a transform's ``interpolation`` (``'bilinear'`` when it has none)."""
    mode = getattr(transform, "interpolation", None)
    return "bilinear" if mode is None else str(getattr(mode, "value", mode)).lower()


def _flatten(transforms) -> list[Any]:
    """The transforms of nested ``Compose`` objects (and ``RandomApply`` with p = 1), in order."""
    out = []
    for t in transforms:
        name = type(t).__name__
        if name == "Compose" or (name == "RandomApply" and float(t.p) >= 1.0):
            out += _flatten(t.transforms)
        else:
            out.append(t)
    return out


def _build(decoder_type: type, device, *args, **kwargs) -> Operation:
    """``decoder_type(*args, **kwargs)``, with ``device=device`` where a device is asked for.

    Raises:
        ConfigurationError: a device asked of a decoder whose constructor takes none.
    """
    if device is not None:
        if "device" not in inspect.signature(decoder_type.__init__).parameters:
            raise ConfigurationError(
                f"device={device!r}: {decoder_type.__name__} decodes on the CPU only (it takes no device)"
            )
        kwargs["device"] = device
    return decoder_type(*args, **kwargs)


def _decoder(transforms: list, compiler: _Compiler, device) -> Operation:
    """The decoder for the stack's leading transforms, consuming those it folds in."""
    first = transforms[0] if transforms else None
    name = type(first).__name__ if first is not None else ""
    decoder: Operation
    if name == "RandomResizedCrop":
        transforms.pop(0)
        size = _pair(first.size)
        decoder = _build(
            RandomResizedCropRGBImageDecoder, device, size, tuple(first.scale), tuple(first.ratio), antialias=True
        )
        if _mode(first) != "bilinear" or getattr(first, "antialias", True) is False:
            compiler.approximated.append(f"RandomResizedCrop: {_mode(first)} resampled as antialiased bilinear")
        compiler.size = size
    elif name == "Resize" or name == "CenterCrop":
        transforms.pop(0)
        resize, crop, max_size = None, None, None
        if name == "Resize":
            size = first.size
            resize = int(size[0]) if not isinstance(size, int) and len(size) == 1 else size
            resize = resize if isinstance(resize, int) else _pair(resize)
            max_size = getattr(first, "max_size", None)
            if _mode(first) != "bilinear" or getattr(first, "antialias", True) is False:
                compiler.approximated.append(f"Resize: {_mode(first)} resampled as antialiased bilinear")
            if transforms and type(transforms[0]).__name__ == "CenterCrop":
                crop = _pair(transforms.pop(0).size)
        else:
            crop = _pair(first.size)
        decoder = _build(ResizeCenterCropRGBImageDecoder, device, resize, crop, max_size)
        compiler.size = decoder.output_size
    else:
        decoder = _build(SimpleRGBImageDecoder, device)
    return decoder


def _range(value) -> tuple[float, float] | float:
    """A ColorJitter factor as torchvision stores it (None: off, or a ``(min, max)``) for ffload's ColorJitter."""
    return 0.0 if value is None else tuple(float(v) for v in value)


def _torchvision_stage(t, c: _Compiler) -> None:
    """Append the compiled stage of torchvision transform ``t`` to ``c``, or hand it to the Python run."""
    name = type(t).__name__
    bilinear = _mode(t) == "bilinear"
    if name in ("ToTensor", "ConvertImageDtype") or (name == "ToDtype" and getattr(t, "scale", False)):
        dtype = getattr(t, "dtype", torch.float32)
        dtype = dtype.get(torch.Tensor, dtype.get("others")) if isinstance(dtype, dict) else dtype
        if c.pending is None and not c.floats and dtype in (torch.float32, None):
            c.flush()
            c.pending = (np.zeros(3), np.full(3, 255.0))
            return
    elif name in ("PILToTensor", "ToImage", "ToPureTensor") and not c.floats:
        return  # the numpy stage is already the uint8 image (a Python run's result comes back as one)
    elif name == "Normalize" and not c.floats and not c.run and c.pending is not None:
        mean, std = np.asarray(t.mean, np.float64), np.asarray(t.std, np.float64)
        c.pending = (c.pending[0] + mean * c.pending[1], c.pending[1] * std)
        return
    elif name in ("RandomHorizontalFlip", "RandomVerticalFlip"):
        flip = RandomHorizontalFlip if name == "RandomHorizontalFlip" else RandomVerticalFlip
        return c.add(flip(float(t.p)))
    elif name == "RandomCrop" and getattr(t, "padding_mode", "constant") == "constant":
        padding = t.padding if t.padding is not None else 0
        pads = set(np.atleast_1d(np.asarray(padding, np.int64)).tolist())
        if len(pads) == 1:
            fill = c.fill(getattr(t, "fill", 0))
            size = _pair(t.size)
            c.add(RandomCrop(size, int(pads.pop()), bool(t.pad_if_needed), fill))
            c.size = size
            return
    elif name == "RandomErasing" and not isinstance(t.value, str):
        fill = c.fill(t.value)
        return c.add(RandomErasing(float(t.p), tuple(t.scale), tuple(t.ratio), fill))
    elif (
        name in ("RandomAffine", "RandomRotation", "RandomPerspective")
        and c.pending is None
        and not c.floats
        and getattr(t, "center", None) is None
        and not getattr(t, "expand", False)
    ):
        fill = getattr(t, "fill", 0)
        fill = fill.get(torch.Tensor, fill.get("others")) if isinstance(fill, dict) else fill
        fill = tuple(np.broadcast_to(np.asarray(0 if fill is None else fill, np.float64), (3,)).tolist())
        if not bilinear:
            c.approximated.append(f"{name}: {_mode(t)} resampled as bilinear")
        if name == "RandomPerspective":
            return c.add(RandomPerspective(float(t.distortion_scale), float(t.p), fill))
        if name == "RandomRotation":
            return c.add(RandomRotation(tuple(t.degrees), fill))
        shear = getattr(t, "shear", None)
        return c.add(
            RandomAffine(
                tuple(t.degrees),
                None if t.translate is None else tuple(t.translate),
                None if t.scale is None else tuple(t.scale),
                None if shear is None else tuple(shear),
                fill,
            )
        )
    elif c.pending is None and not c.floats:  # colour ops: torchvision's uint8 semantics
        if name == "ColorJitter":
            return c.add(ColorJitter(_range(t.brightness), _range(t.contrast), _range(t.saturation), _range(t.hue)))
        if name == "RandomGrayscale":
            return c.add(RandomGrayscale(float(t.p)))
        if name == "Grayscale" and int(t.num_output_channels) == 3:
            return c.add(RandomGrayscale(1.0))
        if name == "GaussianBlur" and len(set(_pair(t.kernel_size))) == 1:
            return c.add(GaussianBlur(_pair(t.kernel_size)[0], tuple(float(v) for v in t.sigma)))
    c.python(t)


def _warn(c: _Compiler, source: str) -> None:
    """The one warning of a compilation: what runs in Python, with its cost measured on a random image of
    the decoder's size (224 x 224 where unknown), and what was compiled with other resampling."""
    parts = []
    if c.not_compiled:
        image = np.random.default_rng(0).integers(0, 256, (*(c.size or _PROBE), 3), dtype=np.uint8)
        costs = [f"{_best_ms(stage.fn, image):.2f} ms" for stage in c.stages if isinstance(stage, PythonTransform)]
        parts.append(
            f"not compiled, run per sample in Python holding the GIL: {', '.join(c.not_compiled)} "
            f"(measured {' + '.join(costs)} per {'x'.join(map(str, image.shape[:2]))} sample)"
        )
    if c.approximated:
        parts.append("compiled with other resampling: " + "; ".join(c.approximated))
    if parts:
        warnings.warn(f"{source}: " + "; ".join(parts), UserWarning, stacklevel=3)


def _best_ms(fn: Callable, image: np.ndarray) -> float:
    """Milliseconds of ``fn(image)``, best of three."""
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        fn(image)
        best = min(best, time.perf_counter() - start)
    return best * 1e3


def from_torchvision(compose: Any, *, output: str = "tensor", device: Any = None) -> CompiledTransforms:
    """Compile a torchvision (``transforms`` or ``transforms.v2``) stack into ffload stages.

    The image field's pipeline, decoder first, with torchvision's semantics: the module docstring
    gives the mapping, ``docs/transforms-parity.md`` every difference and the parity measured
    (exact for flips, crops, erasing and grayscale; within a grey level on average for the
    resampling ops). Random parameters come from ffload's per-sample seeds, not torch's generator:
    same distributions, other draws.

    Args:
        compose: a ``Compose`` (nested ones and ``RandomApply(p=1)`` are flattened), a list of
            transforms, or one transform.
        output: ``'tensor'``: a ``(B, C, H, W)`` torch tensor per batch (float32 after ``ToTensor`` /
            ``ToDtype(scale=True)`` / ``Normalize``, else uint8); ``'numpy'``: the ``(B, H, W, C)`` numpy
            batch of the same values.
        device: passed to the decoder where it takes a ``device`` (device decoders), else an error.

    Returns:
        :class:`CompiledTransforms` (a list of stages; ``.output_size`` for progressive resizing).

    Raises:
        ConfigurationError: an unknown ``output``, a ``device`` the decoder does not take, or a
            transform argument ffload's op refuses. Warns (``UserWarning``, once): the transforms
            that run in Python with their measured cost, and those compiled with other resampling.
    """
    transforms = _flatten(getattr(compose, "transforms", compose if isinstance(compose, (list, tuple)) else [compose]))
    v1 = any(type(t).__name__ == "ToTensor" and ".v2" not in type(t).__module__ for t in transforms)
    c = _Compiler(output, lambda run, floats: _TorchvisionRun(run, pil=v1 and not floats))
    decoder = _decoder(transforms, c, device)
    c.stages.append(decoder)
    for t in transforms:
        _torchvision_stage(t, c)
    stages = c.finish()
    _warn(c, "ffload.transforms.from_torchvision")
    return CompiledTransforms(stages, c.not_compiled, c.approximated)


class _AlbumentationsRun:
    """A run of Albumentations transforms as one per-sample callable: numpy ``(H, W, C)`` in and out,
    each transform seeded from the ``seed`` keyword (``set_random_seed``)."""

    def __init__(self, transforms: Sequence[Any]):
        self.transforms = list(transforms)

    def __call__(self, x: np.ndarray, seed: int = 0) -> np.ndarray:
        for i, t in enumerate(self.transforms):
            if hasattr(t, "set_random_seed"):
                t.set_random_seed((seed + i) % 2**32)
            x = t(image=x)["image"]
        x = x.numpy() if isinstance(x, torch.Tensor) else np.asarray(x)
        return x if x.ndim == 3 else x[..., None]


def from_albumentations(compose: Any, *, output: str = "tensor") -> CompiledTransforms:
    """Compile an Albumentations ``Compose`` into ffload stages, decoder first.

    Mapped where the semantics agree (``docs/transforms-parity.md``): a leading
    ``RandomResizedCrop`` (its ``size``, ``scale``, ``ratio``; ffload's antialiased resize where
    Albumentations uses ``cv2.INTER_LINEAR``, the documented difference), ``CenterCrop`` (its
    ``(H - h) // 2`` offsets),
    ``HorizontalFlip``, ``VerticalFlip``, ``RandomCrop`` (no padding), ``Normalize`` (``mean``,
    ``std``, ``max_pixel_value``) and ``ToTensorV2`` (layout only, no scaling). A leading ``Resize``
    folds into :class:`ResizeRGBImageDecoder` (area when shrinking, linear when enlarging; Albumentations
    resizes with ``INTER_LINEAR`` both ways). The rest runs as one :class:`PythonTransform` per run,
    called as Albumentations is (``t(image=x)["image"]`` on the numpy ``(H, W, C)`` image).

    Args:
        compose: an ``albumentations.Compose``, a list of transforms, or one transform.
        output: as :func:`from_torchvision`.

    Returns:
        :class:`CompiledTransforms`.

    Raises:
        ConfigurationError: an unknown ``output``, or an argument ffload's op refuses. Warns
            (``UserWarning``, once) as :func:`from_torchvision`.
    """
    transforms = list(getattr(compose, "transforms", compose if isinstance(compose, (list, tuple)) else [compose]))
    c = _Compiler(output, lambda run, floats: _AlbumentationsRun(run))
    name = type(transforms[0]).__name__ if transforms else ""
    if name == "RandomResizedCrop":
        t = transforms.pop(0)
        size = _pair(getattr(t, "size", None) or (t.height, t.width))
        c.stages.append(RandomResizedCropRGBImageDecoder(size, tuple(t.scale), tuple(t.ratio), antialias=True))
        c.approximated.append("RandomResizedCrop: cv2.INTER_LINEAR resampled as antialiased bilinear")
        c.size = size
    elif name == "Resize":
        t = transforms.pop(0)
        c.stages.append(ResizeRGBImageDecoder((int(t.height), int(t.width))))
        c.approximated.append("Resize: cv2.INTER_LINEAR resampled as area (shrinking) / linear")
        c.size = (int(t.height), int(t.width))
    elif name == "CenterCrop":
        t = transforms.pop(0)
        c.stages.append(ResizeCenterCropRGBImageDecoder(None, (int(t.height), int(t.width)), floor_offsets=True))
        c.size = (int(t.height), int(t.width))
    else:
        c.stages.append(SimpleRGBImageDecoder())
    for t in transforms:
        kind = type(t).__name__
        p = float(getattr(t, "p", 1.0))
        if kind in ("HorizontalFlip", "VerticalFlip"):
            c.add((RandomHorizontalFlip if kind == "HorizontalFlip" else RandomVerticalFlip)(p))
        elif kind == "RandomCrop" and p >= 1.0 and not getattr(t, "pad_if_needed", False):
            c.size = (int(t.height), int(t.width))
            c.add(RandomCrop(c.size))
        elif kind == "Normalize" and p >= 1.0 and t.max_pixel_value and (c.flush() or not c.floats):
            mean = np.asarray(t.mean, np.float64) * float(t.max_pixel_value)
            std = np.asarray(t.std, np.float64) * float(t.max_pixel_value)
            c.pending = (mean, std)
            c.emit_float()
        elif kind == "ToTensorV2" and not c.run:
            continue  # finish() converts to a (C, H, W) tensor
        else:
            c.python(t)
    stages = c.finish()
    _warn(c, "ffload.transforms.from_albumentations")
    return CompiledTransforms(stages, c.not_compiled, c.approximated)
