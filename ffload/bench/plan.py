"""Planning one ``ffload bench`` invocation: what the dataset holds (:func:`describe_dataset`),
which pipeline fits it (:func:`choose_pipeline`) and which measurements to run
(:func:`plan_configs`)."""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence

from ffload.errors import ConfigurationError

from .config import PIPELINES, BenchConfig


def describe_dataset(path: str) -> dict:
    """What ``ffload bench`` needs to know about a dataset.

    Returns ``{'format', 'num_samples', 'image_field', 'label_field' (or None),
    'disabled_fields', 'one_size' (bool), 'size' ((H, W) when one_size), 'jpeg_samples'}``:
    the first RGBImageField is the image, the first IntField the label; other fields are
    disabled.

    Raises:
        ffload.formats.DatasetError: ``path`` is not a dataset.
        ConfigurationError (a ValueError): the dataset has no RGBImageField, or no samples.
    """
    import numpy as np

    from ffload.formats import open_dataset
    from ffload.formats.fields.image import JPG, RGBImageField, image_sizes
    from ffload.formats.fields.scalars import IntField

    view = open_dataset(path)
    images = [n for n, f in view.fields.items() if isinstance(f, RGBImageField)]
    if not images:
        raise ConfigurationError(
            f"{path}: no RGBImageField (fields: {', '.join(view.fields) or 'none'}); the loader benchmark needs images"
        )
    if view.num_samples == 0:
        raise ConfigurationError(f"{path}: the dataset has no samples")
    image = images[0]
    labels = [n for n, f in view.fields.items() if isinstance(f, IntField)]
    label = labels[0] if labels else None
    meta = view.metadata[image]
    sizes = image_sizes(meta)
    one_size = len(sizes) == 1
    return {
        "format": view.format,
        "num_samples": view.num_samples,
        "image_field": image,
        "label_field": label,
        "disabled_fields": [n for n in view.fields if n not in (image, label)],
        "one_size": one_size,
        "size": (int(sizes[0][0]), int(sizes[0][1])) if one_size else None,
        "jpeg_samples": int(np.count_nonzero(meta["mode"] == JPG)),
    }


def choose_pipeline(info: dict, requested: str = "auto") -> str:
    """``'simple'`` for images of one size, ``'rrc'`` otherwise, unless ``requested`` names one
    of :data:`PIPELINES`. Raises ValueError for ``'simple'`` on images of several sizes."""
    if requested == "auto":
        return "simple" if info["one_size"] else "rrc"
    if requested not in PIPELINES:
        raise ConfigurationError(f"unknown pipeline {requested!r}; expected auto or one of {', '.join(PIPELINES)}")
    if requested == "simple" and not info["one_size"]:
        raise ConfigurationError(
            "the images have several sizes: the 'simple' pipeline needs one size; use --pipeline rrc or center"
        )
    return requested


def ffcv_available() -> bool:
    """Whether ``ffcv`` is importable (checked without importing it)."""
    return importlib.util.find_spec("ffcv") is not None


def plan_configs(
    path: str,
    info: dict,
    pipeline: str,
    batch_size: int,
    workers: Sequence[int],
    epochs: int,
    size: int = 224,
    compare: bool = False,
    source_folder: str | None = None,
    seed: int = 0,
    limit: int | None = None,
) -> tuple[list[BenchConfig], list[str]]:
    """The measurements of one ``ffload bench`` invocation, in interleaving order.

    ffload always; with ``compare``: ffcv (a ``.beton`` and ffcv installed), the in-memory
    ``DataLoader`` (``simple`` pipeline), ``DataLoader`` + PIL (``source_folder`` given) and the
    decode ceiling (JPEG samples present), for each worker count. Returns
    ``(configs, notes)``, the notes saying which comparisons were skipped and why."""
    notes = []
    kinds = ["ffload"]
    if compare:
        if info["format"] != "beton":
            notes.append("ffcv: skipped, ffcv reads .beton files only")
        elif not ffcv_available():
            notes.append("ffcv: skipped, not installed (pip install 'ffload[ffcv]')")
        else:
            kinds.append("ffcv")
        if pipeline == "simple":
            kinds.append("dataloader_arrays")
        if source_folder:
            kinds.append("dataloader_pil")
        else:
            notes.append(
                "dataloader_pil: skipped, pass --source-folder (the ImageFolder the dataset was converted from)"
            )
        if info["jpeg_samples"]:
            kinds.append("decode_ceiling")
    common = dict(
        pipeline=pipeline,
        batch_size=batch_size,
        epochs=epochs,
        size=size,
        image_field=info["image_field"],
        label_field=info["label_field"],
        disabled_fields=tuple(info["disabled_fields"]),
        seed=seed,
        limit=limit,
    )
    configs = []
    for w in workers:
        for kind in kinds:
            configs.append(
                BenchConfig(
                    kind=kind, path=source_folder if kind == "dataloader_pil" else path, num_workers=w, **common
                )
            )
    return configs, notes
