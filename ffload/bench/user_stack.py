"""``ffload bench DATASET --torchvision 'module:attribute'``: a user's torchvision stack, compiled by
:func:`ffload.transforms.from_torchvision` and run by the ffload ``Loader``, against the same stack
in ``DataLoader`` + PIL + torchvision over the same stored images, in one process, one after the other.

Both read the dataset's image field: the ``DataLoader`` side opens each stored JPEG with Pillow
(raw images become PIL images of their pixels) and applies the stack as a user's ``Dataset`` would;
both yield ``(B, C, H, W)`` tensors. Rates are images per second of the epochs after the first (the
first compiles and warms caches), median. The pixel difference is the mean absolute difference of
the first batch in grey levels (normalised outputs converted back with the stack's ``Normalize`` std);
random transforms draw from ffload's per-sample seeds on one side and torch's generator on the
other, so for a stack with random transforms it compares distributions, not samples (the report
says so; ``tests/test_torchvision_parity.py`` compares with the same draws).
"""

from __future__ import annotations

import importlib
import importlib.util
import io
import os
import statistics
import time
import warnings
from typing import Any

import numpy as np

from ffload.errors import ConfigurationError

_RANDOM_PREFIXES = ("Random", "ColorJitter", "GaussianBlur", "Lambda")  # transforms whose output varies per call


def load_stack(spec: str) -> Any:
    """The object ``spec`` names: ``'package.module:attribute'`` or ``'path/to/file.py:attribute'``
    (``attribute`` may be dotted).

    Raises:
        ConfigurationError: no ``:``, a module or file that does not import (its error quoted), or no
            such attribute.
    """
    where, sep, attribute = spec.rpartition(":")
    if not sep or not where or not attribute:
        raise ConfigurationError(f"--torchvision expects 'module:attribute' or 'file.py:attribute', got {spec!r}")
    try:
        if where.endswith(".py") or os.sep in where:
            loaded = importlib.util.spec_from_file_location("ffload_user_stack", where)
            if loaded is None or loaded.loader is None:
                raise ImportError(f"no Python file at {where}")
            module = importlib.util.module_from_spec(loaded)
            loaded.loader.exec_module(module)
        else:
            module = importlib.import_module(where)
    except Exception as e:  # a user's module: any error it raises while importing
        raise ConfigurationError(f"--torchvision {spec}: cannot import {where} ({type(e).__name__}: {e})") from e
    obj: Any = module
    for part in attribute.split("."):
        if not hasattr(obj, part):
            raise ConfigurationError(f"--torchvision {spec}: {where} has no attribute {attribute!r}")
        obj = getattr(obj, part)
    return obj


class StoredImages:
    """A map-style ``Dataset`` of a dataset's RGB images as PIL images through ``transform`` (the
    ``DataLoader`` + PIL + torchvision side). Opens the dataset in each worker process on first use.

    Args:
        path: the ``.beton`` / LMDB path. field: the image field's name. transform: applied to each PIL image.
        indices: the samples read.
    """

    def __init__(self, path: str, field: str, transform: Any, indices: np.ndarray):
        self.path, self.field, self.transform, self.indices = path, field, transform, indices
        self._view = None

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, k: int):
        from PIL import Image

        from ffload.formats import open_dataset
        from ffload.formats.fields.image import RAW

        if self._view is None:
            self._view = open_dataset(self.path)
        s = int(self.indices[k])
        payload = np.array(self._view.payload(self.field, s))
        meta = self._view.metadata[self.field][s]
        if int(meta["mode"]) == RAW:
            image = Image.fromarray(
                payload[: int(meta["height"]) * int(meta["width"]) * 3].reshape(
                    int(meta["height"]), int(meta["width"]), 3
                )
            )
        else:
            image = Image.open(io.BytesIO(payload.tobytes())).convert("RGB")
        return self.transform(image)


def _grey_levels(transforms, batch):
    """``(C, 1, 1)`` factors from the output's units to grey levels: 1 for integer outputs, ``255 * std``
    after the stack's last ``Normalize``, else 255 (a float image in [0, 1])."""
    import torch

    if not batch.is_floating_point():
        return torch.ones(batch.shape[1], 1, 1)
    std = next((t.std for t in reversed(list(transforms)) if type(t).__name__ == "Normalize"), [1.0] * batch.shape[1])
    return 255 * torch.as_tensor(std, dtype=torch.float32).reshape(-1, 1, 1)


def _rate(batches, epochs: int) -> tuple[float, Any]:
    """Median images/s over epochs 1.. of ``batches()`` (an iterable of tensors per call), and epoch 0's first batch."""
    rates, first = [], None
    for epoch in range(epochs):
        start, count = time.perf_counter(), 0
        for batch in batches():
            if first is None:
                first = batch
            count += len(batch)
        if epoch:
            rates.append(count / (time.perf_counter() - start))
    return statistics.median(rates), first


def compare_user_stack(
    path: str, spec: str, batch_size: int, num_workers: int, epochs: int, limit: int | None, seed: int
) -> dict:
    """Run the stack ``spec`` names both ways over the dataset at ``path`` (module docstring).

    Returns:
        ``{"compiled_img_s", "torchvision_img_s", "ratio", "pixel_diff", "random", "not_compiled",
        "approximated", "stages", "shape"}``: rates in images/s, the first batches' mean absolute
        difference in grey levels, whether the stack has random transforms.

    Raises:
        ConfigurationError: a bad ``spec`` (:func:`load_stack`), torchvision that does not import
            (its error quoted), a dataset without an RGB image field, ``epochs`` below 2, or outputs
            of different shapes.
    """
    import torch

    from ffload import Loader
    from ffload.formats import RGBImageField, open_dataset
    from ffload.transforms import from_torchvision

    if epochs < 2:
        raise ConfigurationError("--torchvision needs at least 2 epochs (the first warms up)")
    try:
        import torchvision  # noqa: F401
    except Exception as e:  # ImportError, or the RuntimeError of a wheel built for another torch
        raise ConfigurationError(f"--torchvision: torchvision does not import here ({type(e).__name__}: {e})") from e
    stack = load_stack(spec)
    view = open_dataset(path)
    field = next((n for n, f in view.fields.items() if isinstance(f, RGBImageField)), None)
    if field is None:
        raise ConfigurationError(f"{path}: no RGBImageField to run the stack on")
    indices = np.arange(min(view.num_samples, limit or view.num_samples), dtype=np.int64)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        stages = from_torchvision(stack)
    pipelines = {name: (stages if name == field else None) for name in view.fields}
    with Loader(
        path, batch_size=batch_size, pipelines=pipelines, num_workers=num_workers, seed=seed, indices=indices
    ) as loader:
        compiled_rate, compiled_first = _rate(lambda: (b[0] for b in loader), epochs)
    data = torch.utils.data.DataLoader(
        StoredImages(path, field, stack, indices), batch_size=batch_size, num_workers=num_workers, shuffle=True
    )
    torch.manual_seed(seed)
    reference_rate, reference_first = _rate(lambda: iter(data), epochs)
    transforms = getattr(stack, "transforms", [stack])
    random = any(type(t).__name__.startswith(_RANDOM_PREFIXES) for t in transforms)
    grey = _grey_levels(transforms, reference_first)
    if random:  # other draws: the per-channel means of the first batches instead of the samples
        a, b = compiled_first.float() * grey, reference_first.float() * grey
        diff = (a.mean(dim=(0, 2, 3)) - b.mean(dim=(0, 2, 3))).abs().mean()
    else:  # the same samples both ways, in order
        n = min(batch_size, len(indices))
        with Loader(
            path, batch_size=n, pipelines=pipelines, num_workers=1, order="sequential", indices=indices[:n]
        ) as loader:
            a = next(iter(loader))[0].float()
        reference = StoredImages(path, field, stack, indices[:n])
        b = torch.stack([reference[k] for k in range(n)]).float()
        if a.shape != b.shape:
            raise ConfigurationError(f"compiled samples are {list(a.shape[1:])}, torchvision's {list(b.shape[1:])}")
        diff = ((a - b) * grey).abs().mean()
    return {
        "compiled_img_s": compiled_rate,
        "torchvision_img_s": reference_rate,
        "ratio": compiled_rate / reference_rate,
        "pixel_diff": float(diff),
        "random": random,
        "not_compiled": stages.not_compiled,
        "approximated": stages.approximated,
        "warnings": [str(w.message) for w in caught],
        "stages": [type(s).__name__ for s in stages],
        "shape": list(compiled_first.shape[1:]),
    }
