"""The pipelines every loader runs: the FFCV-style operation lists (ffload's and ffcv's
classes of the same names) and the crop boxes of the PIL baseline."""

from __future__ import annotations

import math
import random
from collections.abc import Mapping

from .config import CENTER_RATIO, DEEPLAKE_PARAMS, DEEPLAKE_PIPELINES, BenchConfig


def build_pipelines(cfg: BenchConfig, ops: Mapping) -> dict:
    """The benchmark's pipelines built from ``ops``, a mapping of FFCV's operation names to
    classes (ffload's or ffcv's): ``[decoder, RandomHorizontalFlip(), ToTensor(),
    ToTorchImage()]`` for the image (:func:`deeplake_ops` for the augmentation stacks),
    ``[IntDecoder(), ToTensor()]`` for the label, ``None`` (disabled) for the other fields. The decoder is ``SimpleRGBImageDecoder()``,
    ``RandomResizedCropRGBImageDecoder((size, size))`` or ``CenterCropRGBImageDecoder((size,
    size), ratio=CENTER_RATIO)`` for the ``simple`` / ``rrc`` / ``center`` pipeline (with
    ``fast_dct=True`` when ``cfg.fast_dct``)."""
    size = (cfg.size, cfg.size)
    if cfg.pipeline in DEEPLAKE_PIPELINES:
        image = deeplake_ops(cfg, ops)
    else:
        image = [_decoder(cfg, ops, size), ops["RandomHorizontalFlip"](), ops["ToTensor"](), ops["ToTorchImage"]()]
    pipes = {cfg.image_field: image}
    if cfg.label_field:
        pipes[cfg.label_field] = [ops["IntDecoder"](), ops["ToTensor"]()]
    pipes.update({name: None for name in cfg.disabled_fields})
    return pipes


def _decoder(cfg: BenchConfig, ops: Mapping, size: tuple[int, int]):
    extra = {"fast_dct": True} if cfg.fast_dct else {}  # ffload's option (BenchConfig checks)
    return {
        "simple": lambda: ops["SimpleRGBImageDecoder"](**extra),
        "rrc": lambda: ops["RandomResizedCropRGBImageDecoder"](size, **extra),
        "center": lambda: ops["CenterCropRGBImageDecoder"](size, ratio=CENTER_RATIO, **extra),
    }[cfg.pipeline]()


def deeplake_ops(cfg: BenchConfig, ops: Mapping) -> list:
    """ffload's operations for a Deep Lake stack (:data:`~.config.DEEPLAKE_STACKS`): the centre
    square decoded at ``size``, the augmentations, ``NormalizeImage`` to float32 on the numpy
    stage, then ``ToTensor``, ``ToTorchImage``."""
    import numpy as np

    p = DEEPLAKE_PARAMS
    stack = [
        ops["CenterCropRGBImageDecoder"]((cfg.size, cfg.size), ratio=1.0),
        ops["RandomAffine"](p["degrees"]),
        ops["RandomHorizontalFlip"](),
    ]
    if cfg.pipeline == "dl_complex":
        j = p["jitter"]
        stack += [
            ops["RandomVerticalFlip"](),
            ops["RandomPerspective"](p["distortion_scale"], p=p["perspective_p"]),
            ops["ColorJitter"](j, j, j, j),
        ]
    mean, std = 255 * np.array(p["mean"]), 255 * np.array(p["std"])
    return stack + [ops["NormalizeImage"](mean, std, np.float32), ops["ToTensor"](), ops["ToTorchImage"]()]


def deeplake_compose(cfg: BenchConfig):
    """A Deep Lake stack (:data:`~.config.DEEPLAKE_STACKS`) as the torchvision ``v2.Compose`` a user
    would write (``Resize`` + ``CenterCrop`` for the centre square at ``size``, bilinear warps,
    ``ToImage`` + ``ToDtype(scale=True)`` + ``Normalize``): what ``ffload_torchvision`` compiles
    with :func:`ffload.transforms.from_torchvision`. Needs torchvision."""
    import torch
    from torchvision.transforms import InterpolationMode, v2

    p, bilinear = DEEPLAKE_PARAMS, InterpolationMode.BILINEAR
    stack = [
        v2.Resize(cfg.size),
        v2.CenterCrop(cfg.size),
        v2.RandomAffine(p["degrees"], interpolation=bilinear),
        v2.RandomHorizontalFlip(),
    ]
    if cfg.pipeline == "dl_complex":
        j = p["jitter"]
        stack += [
            v2.RandomVerticalFlip(),
            v2.RandomPerspective(p["distortion_scale"], p=p["perspective_p"], interpolation=bilinear),
            v2.ColorJitter(j, j, j, j),
        ]
    stack += [v2.ToImage(), v2.ToDtype(torch.float32, scale=True), v2.Normalize(p["mean"], p["std"])]
    return v2.Compose(stack)


def rrc_box(
    width: int, height: int, rng: random.Random, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)
) -> tuple[int, int, int, int]:
    """A ``RandomResizedCrop`` box ``(left, top, right, bottom)`` in pixels, drawn with
    torchvision's ``RandomResizedCrop.get_params`` rule (10 tries of area fraction in ``scale``
    and log-uniform aspect ratio in ``ratio``, then the centred crop clamped to ``ratio``)."""
    area = width * height
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    for _ in range(10):
        target = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(log_lo, log_hi))
        w = int(round(math.sqrt(target * aspect)))
        h = int(round(math.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            top = rng.randint(0, height - h)
            left = rng.randint(0, width - w)
            return left, top, left + w, top + h
    in_ratio = width / height
    if in_ratio < ratio[0]:
        w, h = width, int(round(width / ratio[0]))
    elif in_ratio > ratio[1]:
        w, h = int(round(height * ratio[1])), height
    else:
        w, h = width, height
    top, left = (height - h) // 2, (width - w) // 2
    return left, top, left + w, top + h


def center_box(width: int, height: int, ratio: float = CENTER_RATIO) -> tuple[int, int, int, int]:
    """FFCV's centre-crop box ``(left, top, right, bottom)``: the centred square of side
    ``int(ratio * min(width, height))`` (``ffcv.fields.rgb_image.get_center_crop``)."""
    c = int(ratio * min(width, height))
    top, left = (height - c) // 2, (width - c) // 2
    return left, top, left + c, top + c
