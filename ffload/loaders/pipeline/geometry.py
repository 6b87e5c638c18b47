"""One image's per-sample geometry, shared with the box and mask pipelines of other fields.

Detection and segmentation need the image's crop, resize and flips applied to its boxes and
masks, sample by sample, with the same random draws. The loader runs every field's pipeline of
a batch one after the other on one worker thread, in the order of ``Loader.pipelines`` (the
dataset's fields, then the ``custom_field_mapper`` views), with one dict per batch,
:attr:`~.operation.BatchContext.shared`. A consumer operation names the pipeline it follows
(``TransformBoxes("image")``); when the loader builds the pipelines, :func:`link` finds that
pipeline among the ones already built and asks it to publish:

* ``("geometry", name)`` -> :class:`Geometry`: the image decoder (every RGB decoder, and the
  ``ImageArrayField`` decoders) stores its per-sample crop boxes, the stored image sizes and its
  output size; every later stage of the image pipeline either keeps the geometry
  (``keeps_geometry``: colour, normalisation, dtype and layout stages) or records what it does
  (:meth:`~.operation.Operation.record_geometry`: :class:`~ffload.transforms.RandomHorizontalFlip`,
  :class:`~ffload.transforms.RandomVerticalFlip`, fused or not, :class:`~ffload.transforms.RandomTranslate`,
  :class:`~ffload.transforms.RandomAffine` and :class:`~ffload.transforms.RandomRotation`). Any other stage
  (``RandomCrop``, ``RandomPerspective``, a ``PythonTransform``, a torch module) makes
  :func:`link` refuse, naming it.
* ``("count", name)`` -> :class:`KeptBoxes`: the boxes each sample kept after a
  :class:`~.targets.TransformBoxes` of pipeline ``name``, and which stored rows they were.

A pipeline that is not in the loader, or that runs after its consumer, is a
:class:`~ffload.errors.ConfigurationError` at loader construction, before any batch runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from ffload.errors import ConfigurationError
from ffload.loaders.pipeline.operation import Operation

GEOMETRY = "geometry"
COUNT = "count"


@dataclass
class Geometry:
    """The geometry an image pipeline applied to one batch, per sample.

    Attributes:
        boxes: ``(B, 4) float64`` crop boxes ``(top, left, height, width)`` in pixels of the
            stored image (torchvision's ``(i, j, h, w)``), which the decoder resized to ``out_size``.
        sizes: ``(B, 2) int64`` stored image ``(height, width)``, pixels.
        out_size: ``(out_h, out_w)``, pixels of the decoded image.
        hflip: ``(B,) bool`` the output was mirrored left-right (after the resize).
        vflip: ``(B,) bool`` the output was mirrored upside down (after the resize).
        forward: ``(B, S, 3, 3) float64``: the S stages that moved pixels after the flips above
            (translations, affine warps, flips after those), in pipeline order, as affine maps of
            output pixel-edge coordinates ``(x, y, 1)``: stage s moves the point ``p`` to
            ``forward[b, s] @ p``. ``S = 0`` when the pipeline has none.
        inverse: ``(B, S, 3, 3) float64``: the inverse of each ``forward`` (where stage s reads
            output point ``p``: the warps' own matrices).

    A stored pixel coordinate ``(x, y)`` (pixel edges: a pixel spans ``[x, x + 1)``) lands at
    ``x' = (x - left) * out_w / width``, ``y' = (y - top) * out_h / height``, then
    ``x' -> out_w - x'`` where ``hflip`` and ``y' -> out_h - y'`` where ``vflip``: the map the
    image resize follows (pixel centres at ``+ 0.5``, as OpenCV and torchvision place them);
    then through ``forward[b, 0], ..., forward[b, S - 1]``. Every stage keeps the size
    ``out_size``; what falls outside it at a stage is gone (the image there is fill).
    """

    boxes: np.ndarray
    sizes: np.ndarray
    out_size: tuple[int, int]
    hflip: np.ndarray
    vflip: np.ndarray
    forward: np.ndarray | None = None
    inverse: np.ndarray | None = None

    def __post_init__(self):
        if self.forward is None:
            self.forward = np.zeros((len(self.hflip), 0, 3, 3))
            self.inverse = np.zeros((len(self.hflip), 0, 3, 3))

    @classmethod
    def publish(cls, ctx, key, boxes, sizes, out_size, hflip=None) -> None:
        """Store the geometry of a decoded batch in ``ctx.shared[key]``.

        Args:
            boxes: ``(B, 4)`` integer or float crop boxes ``(top, left, height, width)``.
            sizes: ``(B, 2)`` stored image ``(height, width)`` of each row.
            out_size: ``(out_h, out_w)``; hflip: ``(B,) bool`` flips the decoder applied, or None.
        """
        batch = len(ctx.indices)
        flips = np.zeros(batch, np.bool_) if hflip is None else np.array(hflip, np.bool_)
        ctx.shared[key] = cls(
            np.array(boxes, np.float64),
            np.array(sizes, np.int64),
            (int(out_size[0]), int(out_size[1])),
            flips,
            np.zeros(batch, np.bool_),
        )

    def add_step(self, forward: np.ndarray, inverse: np.ndarray) -> None:
        """Append a stage that moved pixels: ``forward`` and ``inverse`` ``(B, 3, 3)`` affine maps
        of output pixel-edge coordinates (see the class)."""
        self.forward = np.concatenate([self.forward, np.asarray(forward, np.float64)[:, None]], axis=1)
        self.inverse = np.concatenate([self.inverse, np.asarray(inverse, np.float64)[:, None]], axis=1)

    def flip(self, axis: str, flips: np.ndarray) -> None:
        """Record a flip of the rows where ``flips`` (``(B,) bool``) about ``axis`` (``"hflip"``:
        left-right, ``"vflip"``: upside down): toggles the flags while no other stage has moved
        pixels (a flip commutes with the crop and resize), else appends it as a stage."""
        if self.forward.shape[1] == 0:
            flags = getattr(self, axis)
            np.logical_xor(flags, flips, out=flags)
            return
        k, size = (0, self.out_size[1]) if axis == "hflip" else (1, self.out_size[0])
        mats = np.tile(np.eye(3), (len(flips), 1, 1))
        mats[flips, k, k] = -1.0
        mats[flips, k, 2] = size
        self.add_step(mats, mats)  # a flip is its own inverse

    def rows(self, j: int) -> Geometry:
        """The geometry of row ``j`` alone (a batch of one)."""
        return Geometry(
            self.boxes[j : j + 1],
            self.sizes[j : j + 1],
            self.out_size,
            self.hflip[j : j + 1].copy(),
            self.vflip[j : j + 1].copy(),
            self.forward[j : j + 1].copy(),
            self.inverse[j : j + 1].copy(),
        )


@dataclass
class KeptBoxes:
    """What a :class:`~.targets.TransformBoxes` kept, per sample of one batch.

    Attributes:
        counts: ``(B,) int64`` boxes kept (the rows of the output holding boxes).
        stored: ``(B,) int64`` boxes it was given (the stored K, at most the decoder's ``K_max``).
        kept: ``(B, K_max) int64``: output row k of sample b holds stored row ``kept[b, k]`` for
            ``k < counts[b]``, -1 after.
    """

    counts: np.ndarray
    stored: np.ndarray
    kept: np.ndarray

    def rows(self, j: int) -> KeptBoxes:
        """Row ``j`` alone (a batch of one)."""
        return KeptBoxes(self.counts[j : j + 1], self.stored[j : j + 1], self.kept[j : j + 1])


def shared_rows(shared: Mapping, j: int) -> dict:
    """``shared`` restricted to batch row ``j`` (arrays sliced ``[j:j + 1]``, records by ``rows(j)``):
    the loader re-runs a failing field sample by sample with it."""
    return {k: v[j : j + 1] if isinstance(v, np.ndarray) else v.rows(j) for k, v in shared.items()}


def records(op) -> bool:
    """Whether ``op`` implements :meth:`~.operation.Operation.record_geometry`."""
    return type(op).record_geometry is not Operation.record_geometry


def link(consumer_name: str, op, built: Mapping, later: set[str]) -> None:
    """Connect ``op`` (of pipeline ``consumer_name``) to the pipelines it reads (``op.requires``:
    ``(kind, pipeline name)`` pairs) and make those publish.

    Args:
        built: the pipelines already built, by output name (they run before this one).
        later: the names of the pipelines that will run after this one.

    Raises:
        ConfigurationError: a named pipeline is absent or runs later, cannot publish that kind
            (its decoder is not an image decoder; no TransformBoxes), or moves pixels in a way
            it does not record.
    """
    for kind, source in op.requires:
        what = f"pipeline of field {consumer_name!r}: {type(op).__name__} follows field {source!r}"
        if source not in built:
            if source in later:
                raise ConfigurationError(
                    f"{what}, whose pipeline runs after it (pipelines run in the dataset's field order, then "
                    f"the custom_field_mapper views)",
                    field=consumer_name,
                    hint=f"decode {consumer_name!r} as a view of its field, e.g. custom_field_mapper="
                    f"{{'{consumer_name}_t': <field>}}, so that it runs after {source!r}",
                )
            raise ConfigurationError(
                f"{what}, which is not among the loader's pipelines ({', '.join(map(repr, built))}"
                f"{', ' if built and later else ''}{', '.join(map(repr, sorted(later)))})",
                field=consumer_name,
            )
        producer = built[source]
        if kind == GEOMETRY:
            _publish_geometry(producer, what)
        else:
            _publish_count(producer, what)
        op.link(kind, producer)


def _publish_geometry(producer, what: str) -> None:
    decoder = producer.ops[0]
    if not getattr(decoder, "publishes_geometry", False):
        raise ConfigurationError(
            f"{what}, whose decoder {type(decoder).__name__} is not an image decoder "
            f"(RGB decoders, ImageArrayDecoder and its crop decoders publish their geometry)",
            field=producer.name,
        )
    for i, stage in enumerate(producer.ops[1:], start=1):
        if not stage.keeps_geometry and not records(stage):
            raise ConfigurationError(
                f"{what}, but operation {i} of {producer.name!r} ({type(stage).__name__}) moves pixels in a way "
                f"boxes and masks cannot follow (supported: the decoder's crop and resize, RandomHorizontalFlip, "
                f"RandomVerticalFlip, RandomTranslate, RandomAffine, RandomRotation, and stages that move no pixel; "
                f"not RandomCrop, RandomPerspective, PythonTransform or torch modules)",
                field=producer.name,
            )
    key = (GEOMETRY, producer.name)
    for stage in producer.ops:
        stage.publish = key


def _publish_count(producer, what: str) -> None:
    stages = [s for s in producer.ops if getattr(s, "publishes_count", False)]
    if not stages:
        raise ConfigurationError(
            f"{what}, whose pipeline has no TransformBoxes (only it changes the counts)", field=producer.name
        )
    stages[-1].publish = (COUNT, producer.name)
