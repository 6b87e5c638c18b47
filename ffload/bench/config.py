"""What one measurement is: :class:`BenchConfig`, the loader kinds and the pipelines they run."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields

from .peers.ceiling import DECODERS, default_decoder

KINDS = {
    "ffload": "ffload Loader",
    "ffload_torchvision": "ffload Loader, the stack compiled from its torchvision Compose (from_torchvision)",
    "ffcv": "ffcv Loader",
    "dataloader_arrays": "DataLoader, in-memory arrays",
    "dataloader_pil": "DataLoader + PIL, ImageFolder",
    "dataloader_albumentations": "DataLoader + OpenCV + Albumentations, ImageFolder",
    "decode_ceiling": "decode ceiling (num_workers threads decoding the same JPEG bytes, measured)",
}
"""Loader kinds and their display names (see :mod:`ffload.bench`)."""

PIPELINES = ("simple", "rrc", "center", "dl_simple", "dl_complex")
"""``simple``: images of one size as stored; ``rrc``: ``RandomResizedCrop(size)`` (scale
(0.08, 1), ratio (3/4, 4/3)); ``center``: ``CenterCrop(size, ratio=224/256)``. These add a
horizontal flip with probability 0.5. ``dl_simple`` / ``dl_complex``: the two augmentation
stacks of Deep Lake's loader benchmark (:data:`DEEPLAKE_STACKS`), output normalised float32."""

DEEPLAKE_PIPELINES = ("dl_simple", "dl_complex")
DEEPLAKE_STACKS = {
    "dl_simple": "resize of the centre square to size, RandomAffine(20), horizontal flip, Normalize",
    "dl_complex": "resize of the centre square to size, RandomAffine(20), horizontal and vertical flips, "
    "RandomPerspective(0.5, p=0.5), ColorJitter(0.2, 0.2, 0.2, 0.2), Normalize",
}
"""Deep Lake's "simple" and "complex" stacks, as every peer runs them: bilinear warps (ffload's
are bilinear; torchvision's RandomAffine defaults to nearest), ImageNet mean/std. Deep Lake
resizes the whole image to a square; here every peer takes the centre square first, so the
geometry is the same for all (the decoders crop, they do not stretch)."""

DEEPLAKE_PARAMS = {
    "degrees": 20.0,
    "distortion_scale": 0.5,
    "perspective_p": 0.5,
    "jitter": 0.2,
    "mean": (0.485, 0.456, 0.406),
    "std": (0.229, 0.224, 0.225),
}
"""The parameters of :data:`DEEPLAKE_STACKS` (mean/std in units of ``x / 255``)."""

CENTER_RATIO = 224 / 256
"""FFCV's ``CenterCropRGBImageDecoder`` ratio: the centre crop's side over the shorter side."""

DEFAULT_BATCH_SIZE = {"simple": 512, "rrc": 128, "center": 128, "dl_simple": 128, "dl_complex": 128}
"""``ffload bench``'s batch size per pipeline when none is given."""


@dataclass(frozen=True)
class BenchConfig:
    """One measurement: a loader kind on a dataset with a pipeline.

    Args:
        kind: a key of :data:`KINDS`.
        path: the dataset (``.beton`` file or ``.lmdb`` directory); for ``dataloader_pil`` the
            ImageFolder root.
        pipeline: one of :data:`PIPELINES` (``decode_ceiling`` decodes whole images whatever
            the pipeline).
        batch_size: samples per batch (>= 1).
        num_workers: loader threads / DataLoader processes (>= 1); for ``decode_ceiling`` the
            number of threads decoding at once.
        epochs: epochs (>= 1); for ``decode_ceiling`` passes over the payloads (in each mode).
        size: output side of the crop pipelines, pixels.
        image_field, label_field: field names (``label_field`` may be ``None``).
        disabled_fields: other fields of the dataset, disabled in the ffload/ffcv pipelines.
        seed: the loaders' seed.
        limit: visit only the first ``limit`` samples (``indices``), or all when ``None``.
        name: the row label (default: ``kind``); rows with equal names and worker counts are
            aggregated over rounds.
        decoder: ``decode_ceiling``'s JPEG decoder, a key of
            :data:`ffload.bench.peers.ceiling.DECODERS` (default: the fastest available,
            :func:`~ffload.bench.peers.ceiling.default_decoder`).
        fast_dct: ffload's RGB decoders use libjpeg-turbo's fast IDCT (their ``fast_dct``
            argument; ffcv 1.0.2 always does). ``ffload`` kind only.

    Raises:
        ffload.errors.ConfigurationError: an unknown kind, pipeline or decoder, a non-positive count.
    """

    kind: str
    path: str
    pipeline: str
    batch_size: int
    num_workers: int
    epochs: int
    size: int = 224
    image_field: str = "image"
    label_field: str | None = "label"
    disabled_fields: tuple[str, ...] = ()
    seed: int = 0
    limit: int | None = None
    name: str = ""
    decoder: str = field(default_factory=default_decoder)
    fast_dct: bool = False

    def __post_init__(self):
        problem = self._problem()
        if problem is not None:
            from ffload.errors import ConfigurationError  # here only: the bench worker runs without ffload

            raise ConfigurationError(problem)
        object.__setattr__(self, "disabled_fields", tuple(self.disabled_fields))
        if not self.name:
            object.__setattr__(self, "name", self.kind)

    def _problem(self) -> str | None:
        # The first bad value, named with the cause, or None.
        if self.kind not in KINDS:
            return f"unknown loader kind {self.kind!r}; expected one of {', '.join(KINDS)}"
        if self.pipeline not in PIPELINES:
            return f"unknown pipeline {self.pipeline!r}; expected one of {', '.join(PIPELINES)}"
        if self.decoder not in DECODERS:
            return f"unknown decoder {self.decoder!r}; expected one of {', '.join(DECODERS)}"
        for key in ("batch_size", "num_workers", "epochs", "size"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                return f"{key} must be an integer >= 1, got {value!r}"
        if self.limit is not None and (not isinstance(self.limit, int) or self.limit < 1):
            return f"limit must be None or an integer >= 1, got {self.limit!r}"
        if self.kind == "dataloader_arrays" and self.pipeline != "simple":
            return "dataloader_arrays holds images of one size: it runs the 'simple' pipeline only"
        if self.kind == "dataloader_albumentations" and self.pipeline not in DEEPLAKE_PIPELINES:
            return f"dataloader_albumentations runs the augmentation stacks only ({DEEPLAKE_PIPELINES})"
        if self.kind == "ffload_torchvision" and self.pipeline not in DEEPLAKE_PIPELINES:
            return f"ffload_torchvision compiles the augmentation stacks only ({DEEPLAKE_PIPELINES})"
        if self.fast_dct and self.kind != "ffload":
            return f"fast_dct is an option of ffload's decoders, not of {self.kind}"
        if self.kind in ("ffcv", "dataloader_arrays") and self.pipeline in DEEPLAKE_PIPELINES:
            return f"{self.kind} has no {self.pipeline} augmentation stack"
        return None

    def num_samples(self, available: int) -> int:
        """How many of ``available`` samples the measurement visits (``limit`` applied)."""
        return available if self.limit is None else min(available, self.limit)

    def to_dict(self) -> dict:
        """A JSON-serialisable dict (the inverse of :meth:`from_dict`)."""
        d = asdict(self)
        d["disabled_fields"] = list(self.disabled_fields)
        return d

    @classmethod
    def from_dict(cls, d: Mapping) -> BenchConfig:
        """Build from :meth:`to_dict`'s output. Raises ConfigurationError on unknown keys."""
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            from ffload.errors import ConfigurationError  # here only: the bench worker runs without ffload

            raise ConfigurationError(f"unknown BenchConfig keys: {', '.join(sorted(unknown))}")
        return cls(**dict(d))
