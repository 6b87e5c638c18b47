"""Detection and segmentation targets that follow their image's geometry (crop, resize, flips,
translations, affine warps).

Four operations read what an image pipeline, or a box pipeline, publishes (see
:mod:`ffload.loaders.pipeline.geometry` for the mechanism and its checks), each one compiled kernel per
batch:

* :class:`TransformBoxes` (after :class:`~ffload.loaders.decoders.basics.RaggedArrayDecoder` on a ``(K, 4)``
  RaggedArrayField of ``(x0, y0, x1, y1)`` boxes in stored-image pixels): crop, scale, flip,
  shift, warp (corners, enclosing box), clip to the output, drop the boxes left too small
  (torchvision v2's ``SanitizeBoundingBoxes`` rule), compact the kept ones to the front.
* :class:`FollowBoxes` (a per-box ragged field: labels): keeps the rows of the kept boxes.
* :class:`BoxCountDecoder` (on a view of the boxes field): ``(B,) int64`` boxes kept per sample.
* :class:`MaskDecoder` (an ImageArrayField mask or label map, raw or PNG): nearest-neighbour
  resample of the same crop, flipped, shifted and warped like the image, values never interpolated.

Typical detection pipelines::

    Loader(path, batch_size=64, pipelines={
        "image": [RandomResizedCropRGBImageDecoder((512, 512)), RandomHorizontalFlip(), ToTensor()],
        "boxes": [RaggedArrayDecoder(max_length=100), TransformBoxes("image"), ToTensor()],
        "labels": [RaggedArrayDecoder(max_length=100, fill=-1), FollowBoxes("boxes", fill=-1), ToTensor()],
        "mask": [MaskDecoder("image"), ToTensor()],
        "num_boxes": [BoxCountDecoder("boxes"), ToTensor()],
    }, custom_field_mapper={"num_boxes": "boxes"})
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from ffload.errors import ConfigurationError, FieldError, FormatError, PipelineError
from ffload.formats.fields.image import IMAGE_HEADER, ImageArrayField
from ffload.formats.fields.ndarray import RaggedArrayField, cast_values
from ffload.loaders.decoders.base import Decoder, field_name, flat_view
from ffload.loaders.decoders.image_payloads import batch_payloads, image_header
from ffload.loaders.pipeline.geometry import COUNT, GEOMETRY, KeptBoxes
from ffload.loaders.pipeline.operation import Operation, Spec


def _require_link(op, name: str, source: str) -> None:
    """Raise unless the loader linked ``op`` to pipeline ``source`` (its ``link`` ran)."""
    if getattr(op, "_key", None) is None:
        raise ConfigurationError(
            f"{type(op).__name__} (field '{name}') reads pipeline {source!r}: build it inside a "
            f"Loader (or FieldPipeline with upstream=...), which links the two",
            field=name,
        )


@njit(nogil=True, cache=True)
def _clip(v, hi):
    return min(max(v, 0.0), hi)


@njit(nogil=True, cache=True)
def transform_boxes(boxes, counts, crops, out_h, out_w, hflip, vflip, forward, drop, min_size, fill, kept):
    """Map each sample's first ``counts[b]`` boxes through its image's geometry, in place.

    Per box ``(x0, y0, x1, y1)`` (stored-image pixels, pixel edges): ``x' = (x - left) * out_w /
    width``, ``y' = (y - top) * out_h / height`` with the crop ``(top, left, height, width)``,
    clipped to ``[0, out_w] x [0, out_h]``, then mirrored (``x' -> out_w - x'``, the corners
    swapped so that ``x0 <= x1``) where ``hflip``, likewise ``y`` where ``vflip``. Then through
    each later stage ``forward[b, s]`` (an affine map): its four corners mapped, the box that
    encloses them (Albumentations' ``rotate_method="largest_box"``, torchvision v2's affine on
    boxes), clipped again; a box left without area by a clip stays empty (its corner ``(x0, y0)``
    mapped, as a point). With ``drop``, a box whose final width or height is below ``min_size``
    (or not positive, or NaN) is removed and the later boxes move up; rows from the new count
    to ``K_max`` become ``fill``.

    Args:
        boxes: ``(B, K_max, 4)`` float32/float64, modified in place.
        counts: ``(B,) int64`` in: the rows holding boxes; out: the rows kept.
        crops: ``(B, 4) float64`` ``(top, left, height, width)``; out_h, out_w: output pixels.
        hflip, vflip: ``(B,) bool``. forward: ``(B, S, 3, 3) float64`` (:class:`.geometry.Geometry`).
        drop: bool; min_size: output pixels; fill: float.
        kept: ``(B, K_max) int64`` out: the stored row of each output row, -1 after the count.
    """
    for b in range(boxes.shape[0]):
        top, left, h, w = crops[b, 0], crops[b, 1], crops[b, 2], crops[b, 3]
        sx = out_w / w
        sy = out_h / h
        n = 0
        for k in range(counts[b]):
            x0 = _clip((boxes[b, k, 0] - left) * sx, out_w)
            y0 = _clip((boxes[b, k, 1] - top) * sy, out_h)
            x1 = _clip((boxes[b, k, 2] - left) * sx, out_w)
            y1 = _clip((boxes[b, k, 3] - top) * sy, out_h)
            if hflip[b]:
                x0, x1 = out_w - x1, out_w - x0
            if vflip[b]:
                y0, y1 = out_h - y1, out_h - y0
            for st in range(forward.shape[1]):
                m = forward[b, st]
                if not (x1 > x0 and y1 > y0):  # empty: a point
                    x1, y1 = x0, y0
                lo_x, lo_y, hi_x, hi_y = np.inf, np.inf, -np.inf, -np.inf
                for c in range(4):
                    px = x0 if c % 2 == 0 else x1
                    py = y0 if c < 2 else y1
                    qx = m[0, 0] * px + m[0, 1] * py + m[0, 2]
                    qy = m[1, 0] * px + m[1, 1] * py + m[1, 2]
                    lo_x, hi_x = min(lo_x, qx), max(hi_x, qx)
                    lo_y, hi_y = min(lo_y, qy), max(hi_y, qy)
                x0, y0, x1, y1 = _clip(lo_x, out_w), _clip(lo_y, out_h), _clip(hi_x, out_w), _clip(hi_y, out_h)
            if drop and not (x1 - x0 >= min_size and y1 - y0 >= min_size and x1 > x0 and y1 > y0):
                continue
            boxes[b, n, 0] = x0
            boxes[b, n, 1] = y0
            boxes[b, n, 2] = x1
            boxes[b, n, 3] = y1
            kept[b, n] = k
            n += 1
        for k in range(n, boxes.shape[1]):
            kept[b, k] = -1
            for c in range(4):
                boxes[b, k, c] = fill
        counts[b] = n


class TransformBoxes(Operation):
    """Apply an image pipeline's per-sample geometry to ``(K_max, 4)`` boxes, in place.

    Input: the padded batch of :class:`~ffload.loaders.decoders.basics.RaggedArrayDecoder` on a RaggedArrayField of
    ``inner_shape (4,)`` and a float dtype: per sample ``(K_max, 4)`` rows ``(x0, y0, x1, y1)``,
    pixels of the *stored* image the boxes belong to (torchvision's ``XYXY`` format, pixel
    edges: a box over columns 10..19 is ``x0 = 10, x1 = 20``). Output: the same array, boxes in
    pixels of the decoded image of field ``image`` (its crop or resize, then its
    RandomHorizontalFlip / RandomVerticalFlip, fused or not, RandomTranslate, RandomAffine and
    RandomRotation in pipeline order; a warp maps the four corners and keeps the enclosing
    box, Albumentations' ``rotate_method="largest_box"``), clipped to it after each stage (see
    :func:`transform_boxes`), kept boxes first in their stored order, then rows of ``fill``.

    Rule for boxes the crop cuts: with ``drop=True`` (default) a box whose final width or
    height is below ``min_size`` output pixels (default 1, torchvision v2's
    ``SanitizeBoundingBoxes``) is removed, so a box outside the image disappears; the count per
    sample is then :class:`BoxCountDecoder`'s, and :class:`FollowBoxes` drops the same rows of
    a per-box field (labels). With ``drop=False`` every box keeps its row (a box outside the
    image becomes a zero-area box on the border) and the count is the stored ``K``
    (:class:`~ffload.loaders.decoders.basics.RaggedLengthDecoder`'s, or :class:`BoxCountDecoder`'s: the same).
    Boxes beyond ``max_length`` of the decoder are ignored.

    Args:
        image: the name of the image pipeline (a field or a ``custom_field_mapper`` view) whose
            geometry the boxes follow; it must run before this pipeline.
        drop: remove the boxes the crop leaves too small (see above).
        min_size: smallest kept width and height, output pixels, >= 0.
        fill: the value of the rows after the kept boxes.

    Raises:
        ConfigurationError: bad arguments; (loader construction) the image pipeline is missing,
            runs later, or moves pixels in a way it does not record (:func:`.geometry.link`); (declare) not linked by a loader.
        PipelineError: (building the pipeline) the input is not a numpy ``(K, 4)`` float batch of a RaggedArrayField.
    """

    publishes_count = True

    def __init__(self, image: str, drop: bool = True, min_size: float = 1.0, fill: float = 0.0):
        if not isinstance(image, str):
            raise ConfigurationError(f"TransformBoxes: image must be the name of an image pipeline, got {image!r}")
        if not min_size >= 0:
            raise ConfigurationError(f"TransformBoxes: min_size must be >= 0 output pixels, got {min_size}")
        self.image, self.drop, self.min_size, self.fill = image, bool(drop), float(min_size), float(fill)
        self.requires = ((GEOMETRY, image),)

    def link(self, kind, producer):
        self._key = (kind, producer.name)

    def declare(self, spec, field, view):
        name = field_name(field, view)
        if (
            not isinstance(field, RaggedArrayField)
            or field.inner_shape != (4,)
            or spec is None
            or spec.on_torch
            or len(spec.shape) != 2
            or spec.shape[1] != 4
            or np.dtype(spec.dtype).kind != "f"
        ):
            raise PipelineError(
                f"TransformBoxes (field '{name}') needs the numpy (K, 4) float batch of "
                f"RaggedArrayDecoder on a RaggedArrayField(float, (4,)), got {spec} of "
                f"{type(field).__name__}"
            )
        self.row_bytes = np.uint64(field.row_bytes)
        _require_link(self, name, self.image)
        return spec

    def buffer_spec(self, spec_out, batch_size):
        return None

    def __call__(self, src, dst, ctx):
        geometry = ctx.shared[self._key]
        stored = np.minimum(ctx.sizes[ctx.indices] // self.row_bytes, src.shape[1]).astype(np.int64)
        counts = stored.copy()
        kept = np.empty(src.shape[:2], np.int64)
        out_h, out_w = geometry.out_size
        transform_boxes(
            src,
            counts,
            geometry.boxes,
            float(out_h),
            float(out_w),
            geometry.hflip,
            geometry.vflip,
            geometry.forward,
            self.drop,
            self.min_size,
            self.fill,
            kept,
        )
        if self.publish is not None:
            ctx.shared[self.publish] = KeptBoxes(counts, stored, kept)
        return src


class BoxCountDecoder(Decoder):
    """Decode the number of boxes :class:`TransformBoxes` kept per sample, ``() int64``.

    The boxes are those kept in pipeline ``boxes``; use it on a ``custom_field_mapper`` view of
    the boxes field, which runs after it.

    Args:
        boxes: the name of the pipeline holding the TransformBoxes.

    Raises:
        ConfigurationError: ``boxes`` not a name; (loader construction) that pipeline is missing,
            runs later, or has no TransformBoxes; (declare) not linked by a loader.
        PipelineError: (building the pipeline) the field is not a RaggedArrayField.
    """

    field_types = (RaggedArrayField,)

    def __init__(self, boxes: str):
        if not isinstance(boxes, str):
            raise ConfigurationError(f"BoxCountDecoder: boxes must be the name of a pipeline, got {boxes!r}")
        self.boxes = boxes
        self.requires = ((COUNT, boxes),)

    def link(self, kind, producer):
        self._key = (kind, producer.name)

    def declare(self, spec, field, view):
        _require_link(self, self._check_field(field, view), self.boxes)
        return Spec((), np.dtype(np.int64))

    def __call__(self, src, dst, ctx):
        out = dst[: len(ctx.indices)]
        out[:] = ctx.shared[self._key].counts
        return out


@njit(nogil=True, cache=True)
def keep_rows(flat, batch, k_max, row_bytes, lengths, stored, counts, kept, pad):
    """Compact each sample's rows as its boxes were, in place: output row ``k < counts[b]`` of
    sample b becomes its input row ``kept[b, k]`` (increasing, so forward copies are safe), the
    rows after hold ``pad`` (``(row_bytes,) uint8``).

    Args:
        flat: ``(B * k_max * row_bytes,) uint8`` the padded batch. lengths: ``(B,) int64`` this
            field's rows per sample; stored, counts, kept: :class:`.geometry.KeptBoxes`' arrays.

    Returns: -1, or the first sample whose row count is not its boxes' (``stored``)."""
    for b in range(batch):
        if lengths[b] != stored[b]:
            return b
        base = b * k_max * row_bytes
        for k in range(counts[b]):
            src = base + kept[b, k] * row_bytes
            dst = base + k * row_bytes
            if src != dst:
                for q in range(row_bytes):
                    flat[dst + q] = flat[src + q]
        for k in range(counts[b], k_max):
            dst = base + k * row_bytes
            for q in range(row_bytes):
                flat[dst + q] = pad[q]
    return -1


class FollowBoxes(Operation):
    """Drop the rows of a per-box field that :class:`TransformBoxes` dropped, to stay aligned with the boxes.

    The :class:`TransformBoxes` is that of pipeline ``boxes``; the per-box field is labels or any
    ``(K, ...)`` ragged field stored row by row with the boxes (class ids, ``iscrowd``, areas,
    keypoints). The counterpart of
    Albumentations' ``BboxParams(label_fields=[...])`` and torchvision v2's
    ``SanitizeBoundingBoxes(labels_getter=...)``.

    Input: the padded batch of :class:`~ffload.loaders.decoders.basics.RaggedArrayDecoder` on a RaggedArrayField (any
    dtype and inner shape), per sample ``(K_max, *inner_shape)`` with the same ``K_max`` as the
    boxes' decoder (give both the same ``max_length``). Output: the same array, in place: the rows
    of the kept boxes first, in stored order (row k pairs with output box k), then rows of
    ``fill``; :class:`BoxCountDecoder` gives the count. With ``TransformBoxes(drop=False)`` nothing
    moves (every row is kept).

    Args:
        boxes: the name of the pipeline holding the TransformBoxes; it must run before this one
            (decode the labels as a ``custom_field_mapper`` view when their field comes first).
        fill: the value of the rows after the kept ones, cast to the field's dtype.

    Raises:
        ConfigurationError: ``boxes`` not a name; (loader construction) that pipeline is missing,
            runs later, or has no TransformBoxes; (declare) not linked by a loader, or a ``K_max``
            other than the boxes'.
        PipelineError: (building the pipeline) the input is not the numpy batch of a RaggedArrayField.
        FormatError: (loading) a sample whose row count is not its boxes' count, naming the field and sample.
    """

    def __init__(self, boxes: str, fill: float = 0):
        if not isinstance(boxes, str):
            raise ConfigurationError(f"FollowBoxes: boxes must be the name of a pipeline, got {boxes!r}")
        self.boxes, self.fill = boxes, fill
        self.requires = ((COUNT, boxes),)

    def link(self, kind, producer):
        self._key = (kind, producer.name)
        stage = max(i for i, op in enumerate(producer.ops) if getattr(op, "publishes_count", False))  # the publisher
        self.box_rows = int(producer.specs[stage].shape[0])

    def declare(self, spec, field, view):
        name = field_name(field, view)
        if (
            not isinstance(field, RaggedArrayField)
            or spec is None
            or spec.on_torch
            or tuple(spec.shape[1:]) != field.inner_shape
        ):
            raise PipelineError(
                f"FollowBoxes (field '{name}') needs the numpy batch of RaggedArrayDecoder on a "
                f"RaggedArrayField, got {spec} of {type(field).__name__}"
            )
        _require_link(self, name, self.boxes)
        if spec.shape[0] != self.box_rows:
            raise ConfigurationError(
                f"FollowBoxes (field '{name}'): {spec.shape[0]} rows per sample, but the boxes "
                f"of pipeline {self.boxes!r} have {self.box_rows}",
                field=name,
                hint="give both RaggedArrayDecoders the same max_length",
            )
        fill = cast_values(np.array(self.fill), field.dtype, f"FollowBoxes fill {self.fill!r}")
        self.pad = np.full(field.inner_shape, fill, field.dtype).reshape(-1).view(np.uint8)
        self.row_bytes = field.row_bytes
        self.field_name = name
        return spec

    def buffer_spec(self, spec, batch_size):
        return None

    def __call__(self, src, dst, ctx):
        record = ctx.shared[self._key]
        k_max = src.shape[1]
        lengths = np.minimum(ctx.sizes[ctx.indices] // np.uint64(self.row_bytes), k_max).astype(np.int64)
        bad = keep_rows(
            flat_view(src).view(np.uint8),
            len(src),
            k_max,
            self.row_bytes,
            lengths,
            record.stored,
            record.counts,
            record.kept,
            self.pad,
        )
        if bad >= 0:
            raise FormatError(
                f"field '{self.field_name}', sample {int(ctx.indices[bad])}: {int(lengths[bad])} rows, "
                f"but its boxes (pipeline {self.boxes!r}) have {int(record.stored[bad])}: the rows "
                f"cannot be paired"
            )
        return src


@njit(nogil=True, cache=True)
def _unwarp(inverse, b, px, py, out_w, out_h):
    """The point ``(px, py)`` of the final output taken back through sample b's stages
    (``inverse[b, S - 1]`` first); ``(nan, nan)`` when a stage read it from outside its image."""
    for st in range(inverse.shape[1] - 1, -1, -1):
        m = inverse[b, st]
        px, py = m[0, 0] * px + m[0, 1] * py + m[0, 2], m[1, 0] * px + m[1, 1] * py + m[1, 2]
        if not (0.0 <= px < out_w and 0.0 <= py < out_h):
            return np.nan, np.nan
    return px, py


@njit(nogil=True, cache=True)
def sample_masks(
    indices,
    ptrs,
    sizes,
    region,
    dst,
    out_h,
    out_w,
    pixel_bytes,
    header_bytes,
    crops,
    image_sizes,
    hflip,
    vflip,
    inverse,
    fill,
):
    """Nearest-neighbour resample of each sample's mask over its image's crop into ``dst`` (flat
    ``(B * out_h * out_w * pixel_bytes,) uint8``), mirrored, shifted and warped as the image.

    The crop ``(top, left, height, width)`` (image pixels) is scaled to the mask's own size
    (``mask_h / image_h``, ``mask_w / image_w``: a mask stored at another resolution follows
    proportionally); output pixel ``(y, x)`` takes the mask pixel under its centre,
    ``floor(top + (y + 0.5) * height / out_h)`` (OpenCV's ``INTER_NEAREST_EXACT``, torch's
    ``nearest-exact``), clamped to the mask. With later stages (``inverse``, ``(B, S, 3, 3)``,
    :class:`.geometry.Geometry`), the centre ``(x + 0.5, y + 0.5)`` is first taken back through
    them (the point each warp or shift read, Albumentations' ``mask_interpolation=INTER_NEAREST``);
    a centre that a stage read from outside its image gets ``fill`` (``(pixel_bytes,) uint8``,
    the image's fill there). Returns -1, or the row whose payload is not its header's image or
    lies outside ``region``."""
    row = out_w * pixel_bytes
    cols = np.empty(out_w, np.int64)
    for b in range(indices.shape[0]):
        s = indices[b]
        p = np.int64(ptrs[s])
        n = np.int64(sizes[s])
        if p < 0 or n < header_bytes or p + n > region.shape[0]:
            return b
        h, w = image_header(region, p)
        if n != header_bytes + h * w * pixel_bytes or h == 0 or w == 0:
            return b
        fy = h / image_sizes[b, 0]
        fx = w / image_sizes[b, 1]
        top, left = crops[b, 0] * fy, crops[b, 1] * fx
        step_y, step_x = crops[b, 2] * fy / out_h, crops[b, 3] * fx / out_w
        if inverse.shape[1] > 0:  # per pixel: the stages after the flips
            d = b * out_h * row
            for y in range(out_h):
                for x in range(out_w):
                    px, py = _unwarp(inverse, b, x + 0.5, y + 0.5, out_w, out_h)
                    if px != px:
                        for k in range(pixel_bytes):
                            dst[d + k] = fill[k]
                    else:
                        px = out_w - px if hflip[b] else px
                        py = out_h - py if vflip[b] else py
                        r = min(max(np.int64(math.floor(top + py * step_y)), 0), h - 1)
                        c = min(max(np.int64(math.floor(left + px * step_x)), 0), w - 1)
                        q = p + header_bytes + (r * w + c) * pixel_bytes
                        for k in range(pixel_bytes):
                            dst[d + k] = region[q + k]
                    d += pixel_bytes
            continue
        for x in range(out_w):
            c = min(max(np.int64(math.floor(left + (x + 0.5) * step_x)), 0), w - 1)
            cols[out_w - 1 - x if hflip[b] else x] = c
        for y in range(out_h):
            r = min(max(np.int64(math.floor(top + (y + 0.5) * step_y)), 0), h - 1)
            oy = out_h - 1 - y if vflip[b] else y
            src = p + header_bytes + r * w * pixel_bytes
            d = (b * out_h + oy) * row
            for x in range(out_w):
                q = src + cols[x] * pixel_bytes
                for k in range(pixel_bytes):
                    dst[d + k] = region[q + k]
                d += pixel_bytes
    return -1


class MaskDecoder(Decoder):
    """Decode an ImageArrayField mask or label map with the geometry of an image pipeline.

    The image pipeline is ``image``. Per sample ``(out_h, out_w, C)`` of the stored dtype (uint8, uint16, float32; ``C``
    as stored), ``(out_h, out_w)`` the image's decoded size; the same crop, resize and flips as
    the image, by nearest neighbour (:func:`sample_masks`), so label values are never mixed.

    The mask may be stored at the image's size (the usual case: exact pixel correspondence) or at
    another one (the crop is scaled proportionally), raw or PNG-compressed (decoded first, then
    the same path: :func:`~ffload.loaders.decoders.image_payloads.batch_payloads`). A ``RandomTranslate`` or ``RandomAffine`` /
    ``RandomRotation`` of the image moves the mask the same way (nearest neighbour at the point
    the image's warp reads; ``fill`` where the image gets its fill). One compiled call per batch.

    Args:
        image: the name of the image pipeline (a field or a ``custom_field_mapper`` view) it
            follows; it must run before this pipeline.
        fill: the mask value where a translation or warp of the image leaves no pixel (0, or an
            ignore index such as 255), one value for every channel (Albumentations' ``fill_mask``).

    Raises:
        ConfigurationError: ``image`` not a name, a ``fill`` the mask dtype cannot hold; (loader
            construction) the image pipeline is missing, runs later, or moves pixels in a way it
            does not record; (declare) not linked by a loader.
        PipelineError: (building the pipeline) the field is not an ImageArrayField.
        FormatError: (loading) a corrupt mask payload (raw or PNG), naming the field and sample.
    """

    field_types = (ImageArrayField,)

    def __init__(self, image: str, fill: float = 0):
        if not isinstance(image, str):
            raise ConfigurationError(f"MaskDecoder: image must be the name of an image pipeline, got {image!r}")
        self.image, self.fill = image, fill
        self.requires = ((GEOMETRY, image),)

    def link(self, kind, producer):
        self._key = (kind, producer.name)
        self.output_size = tuple(int(v) for v in producer.specs[0].shape[:2])

    def declare(self, spec, field, view):
        name = self._check_field(field, view)
        _require_link(self, name, self.image)
        self.pixel_bytes = field.pixel_bytes
        self.field = field
        try:
            fill = cast_values(np.array(self.fill), field.dtype, f"MaskDecoder fill {self.fill!r}")
        except FieldError as e:
            raise ConfigurationError(f"MaskDecoder (field '{name}'): {e}", field=name) from e
        self.fill_bytes = np.full(field.channels, fill, field.dtype).view(np.uint8)
        return Spec(self.output_size + (field.channels,), field.dtype)

    def __call__(self, src, dst, ctx):
        geometry = ctx.shared[self._key]
        out = dst[: len(ctx.indices)]
        out_h, out_w = self.output_size
        indices, ptrs, sizes, region = batch_payloads(self.field, ctx, self.field_name)
        bad = sample_masks(
            indices,
            ptrs,
            sizes,
            region,
            flat_view(out).view(np.uint8),
            out_h,
            out_w,
            self.pixel_bytes,
            IMAGE_HEADER.itemsize,
            geometry.boxes,
            geometry.sizes,
            geometry.hflip,
            geometry.vflip,
            geometry.inverse,
            self.fill_bytes,
        )
        if bad >= 0:
            raise FormatError(
                f"field '{self.field_name}', sample {int(ctx.indices[bad])}: the mask's header and "
                "payload size disagree, or the payload lies outside the data region (corrupt image)"
            )
        return out
