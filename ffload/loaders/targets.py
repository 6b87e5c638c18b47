"""Detection and segmentation targets that follow their image's geometry (crop, resize, flips).

Three operations read the per-sample :class:`~.geometry.Geometry` an image pipeline publishes
(see :mod:`ffload.loaders.geometry` for the mechanism and its checks), each one compiled kernel
per batch:

* :class:`TransformBoxes` (after :class:`~.decoders.RaggedArrayDecoder` on a ``(K, 4)``
  RaggedArrayField of ``(x0, y0, x1, y1)`` boxes in stored-image pixels): crop, scale, flip,
  clip to the output, drop the boxes left too small (torchvision v2's ``SanitizeBoundingBoxes``
  rule), compact the kept ones to the front.
* :class:`BoxCountDecoder` (on a view of the boxes field): ``(B,) int64`` boxes kept per sample.
* :class:`MaskDecoder` (an ImageArrayField mask or label map): nearest-neighbour resample of the
  same crop, flipped like the image, values never interpolated.

Typical detection pipelines::

    Loader(path, batch_size=64, pipelines={
        "image": [RandomResizedCropRGBImageDecoder((512, 512)), RandomHorizontalFlip(), ToTensor()],
        "boxes": [RaggedArrayDecoder(max_length=100), TransformBoxes("image"), ToTensor()],
        "mask": [MaskDecoder("image"), ToTensor()],
        "num_boxes": [BoxCountDecoder("boxes"), ToTensor()],
    }, custom_field_mapper={"num_boxes": "boxes"})
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

from ..errors import ConfigurationError
from ..formats.fields import IMAGE_HEADER, ImageArrayField, RaggedArrayField
from .decoders import Decoder, _header, _region, field_name, flat_view
from .geometry import COUNT, GEOMETRY
from .operation import Operation, Spec


def _require_link(op, name: str, source: str) -> None:
    """Raise unless the loader linked ``op`` to pipeline ``source`` (its ``link`` ran)."""
    if getattr(op, "_key", None) is None:
        raise ConfigurationError(f"{type(op).__name__} (field '{name}') reads pipeline {source!r}: build it inside a "
                                 f"Loader (or FieldPipeline with upstream=...), which links the two", field=name)


@njit(nogil=True, cache=True)
def transform_boxes(boxes, counts, crops, out_h, out_w, hflip, vflip, drop, min_size, fill):
    """Map each sample's first ``counts[b]`` boxes through its image's geometry, in place.

    Per box ``(x0, y0, x1, y1)`` (stored-image pixels, pixel edges): ``x' = (x - left) * out_w /
    width``, ``y' = (y - top) * out_h / height`` with the crop ``(top, left, height, width)``,
    clipped to ``[0, out_w] x [0, out_h]``, then mirrored (``x' -> out_w - x'``, the corners
    swapped so that ``x0 <= x1``) where ``hflip``, likewise ``y`` where ``vflip``. With ``drop``,
    a box whose clipped width or height is below ``min_size`` (or not positive, or NaN) is
    removed and the later boxes move up; rows from the new count to ``K_max`` become ``fill``.

    Args:
        boxes: ``(B, K_max, 4)`` float32/float64, modified in place.
        counts: ``(B,) int64`` in: the rows holding boxes; out: the rows kept.
        crops: ``(B, 4) float64`` ``(top, left, height, width)``; out_h, out_w: output pixels.
        hflip, vflip: ``(B,) bool``. drop: bool; min_size: output pixels; fill: float.
    """
    for b in range(boxes.shape[0]):
        top, left, h, w = crops[b, 0], crops[b, 1], crops[b, 2], crops[b, 3]
        sx = out_w / w
        sy = out_h / h
        kept = 0
        for k in range(counts[b]):
            x0 = min(max((boxes[b, k, 0] - left) * sx, 0.0), out_w)
            y0 = min(max((boxes[b, k, 1] - top) * sy, 0.0), out_h)
            x1 = min(max((boxes[b, k, 2] - left) * sx, 0.0), out_w)
            y1 = min(max((boxes[b, k, 3] - top) * sy, 0.0), out_h)
            if hflip[b]:
                x0, x1 = out_w - x1, out_w - x0
            if vflip[b]:
                y0, y1 = out_h - y1, out_h - y0
            if drop and not (x1 - x0 >= min_size and y1 - y0 >= min_size and x1 > x0 and y1 > y0):
                continue
            boxes[b, kept, 0] = x0
            boxes[b, kept, 1] = y0
            boxes[b, kept, 2] = x1
            boxes[b, kept, 3] = y1
            kept += 1
        for k in range(kept, boxes.shape[1]):
            for c in range(4):
                boxes[b, k, c] = fill
        counts[b] = kept


class TransformBoxes(Operation):
    """Apply an image pipeline's per-sample geometry to ``(K_max, 4)`` boxes, in place.

    Input: the padded batch of :class:`~.decoders.RaggedArrayDecoder` on a RaggedArrayField of
    ``inner_shape (4,)`` and a float dtype: per sample ``(K_max, 4)`` rows ``(x0, y0, x1, y1)``,
    pixels of the *stored* image the boxes belong to (torchvision's ``XYXY`` format, pixel
    edges: a box over columns 10..19 is ``x0 = 10, x1 = 20``). Output: the same array, boxes in
    pixels of the decoded image of field ``image`` (its crop or resize, then its
    RandomHorizontalFlip / RandomVerticalFlip, fused or not), clipped to it (see
    :func:`transform_boxes`), kept boxes first in their stored order, then rows of ``fill``.

    Rule for boxes the crop cuts: with ``drop=True`` (default) a box whose clipped width or
    height is below ``min_size`` output pixels (default 1, torchvision v2's
    ``SanitizeBoundingBoxes``) is removed, so a box outside the crop disappears; the count per
    sample is then :class:`BoxCountDecoder`'s. With ``drop=False`` every box keeps its row (a box
    outside the crop becomes a zero-area box on the border) and the count is the stored ``K``
    (:class:`~.decoders.RaggedLengthDecoder`'s, or :class:`BoxCountDecoder`'s: the same).
    Boxes beyond ``max_length`` of the decoder are ignored. Labels stored per box in another
    ragged field stay in stored order: use ``drop=False`` to keep them aligned.

    Args:
        image: the name of the image pipeline (a field or a ``custom_field_mapper`` view) whose
            geometry the boxes follow; it must run before this pipeline.
        drop: remove the boxes the crop leaves too small (see above).
        min_size: smallest kept width and height, output pixels, >= 0.
        fill: the value of the rows after the kept boxes.

    Raises:
        ConfigurationError: bad arguments; (loader construction) the image pipeline is missing,
            runs later, or moves pixels in a way it does not record (:func:`.geometry.link`); (declare) not linked by a loader.
        TypeError (declare): the input is not a numpy ``(K, 4)`` float batch of a RaggedArrayField.
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
        if not isinstance(field, RaggedArrayField) or field.inner_shape != (4,) or spec is None or spec.on_torch \
                or len(spec.shape) != 2 or spec.shape[1] != 4 or np.dtype(spec.dtype).kind != "f":
            raise TypeError(f"TransformBoxes (field '{name}') needs the numpy (K, 4) float batch of "
                            f"RaggedArrayDecoder on a RaggedArrayField(float, (4,)), got {spec} of "
                            f"{type(field).__name__}")
        self.row_bytes = np.uint64(field.row_bytes)
        _require_link(self, name, self.image)
        return spec

    def buffer_spec(self, spec_out, batch_size):
        return None

    def __call__(self, src, dst, ctx):
        geometry = ctx.shared[self._key]
        counts = np.minimum(ctx.sizes[ctx.indices] // self.row_bytes, src.shape[1]).astype(np.int64)
        out_h, out_w = geometry.out_size
        transform_boxes(src, counts, geometry.boxes, float(out_h), float(out_w), geometry.hflip, geometry.vflip,
                        self.drop, self.min_size, self.fill)
        if self.publish is not None:
            ctx.shared[self.publish] = counts
        return src


class BoxCountDecoder(Decoder):
    """Per sample ``() int64``: the boxes :class:`TransformBoxes` kept in pipeline ``boxes`` (use
    it on a ``custom_field_mapper`` view of the boxes field, which runs after it).

    Args:
        boxes: the name of the pipeline holding the TransformBoxes.

    Raises:
        ConfigurationError: ``boxes`` not a name; (loader construction) that pipeline is missing,
            runs later, or has no TransformBoxes; (declare) not linked by a loader.
        TypeError (declare): the field is not a RaggedArrayField.
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
        out = dst[:len(ctx.indices)]
        out[:] = ctx.shared[self._key]
        return out


@njit(nogil=True, cache=True)
def sample_masks(indices, ptrs, sizes, region, dst, out_h, out_w, pixel_bytes, header_bytes, crops, image_sizes,
                 hflip, vflip):
    """Nearest-neighbour resample of each sample's mask over its image's crop into ``dst`` (flat
    ``(B * out_h * out_w * pixel_bytes,) uint8``), mirrored as the image.

    The crop ``(top, left, height, width)`` (image pixels) is scaled to the mask's own size
    (``mask_h / image_h``, ``mask_w / image_w``: a mask stored at another resolution follows
    proportionally); output pixel ``(y, x)`` takes the mask pixel under its centre,
    ``floor(top + (y + 0.5) * height / out_h)`` (OpenCV's ``INTER_NEAREST_EXACT``, torch's
    ``nearest-exact``), clamped to the mask. Returns -1, or the row whose payload is not its
    header's image or lies outside ``region``."""
    row = out_w * pixel_bytes
    cols = np.empty(out_w, np.int64)
    for b in range(indices.shape[0]):
        s = indices[b]
        p = np.int64(ptrs[s])
        n = np.int64(sizes[s])
        if p < 0 or n < header_bytes or p + n > region.shape[0]:
            return b
        h, w = _header(region, p)
        if n != header_bytes + h * w * pixel_bytes or h == 0 or w == 0:
            return b
        fy = h / image_sizes[b, 0]
        fx = w / image_sizes[b, 1]
        top, left = crops[b, 0] * fy, crops[b, 1] * fx
        step_y, step_x = crops[b, 2] * fy / out_h, crops[b, 3] * fx / out_w
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
    """Decode an ImageArrayField mask or label map with the geometry of the image pipeline
    ``image``: per sample ``(out_h, out_w, C)`` of the stored dtype (uint8, uint16, float32; ``C``
    as stored), ``(out_h, out_w)`` the image's decoded size; the same crop, resize and flips as
    the image, by nearest neighbour (:func:`sample_masks`), so label values are never mixed.

    The mask may be stored at the image's size (the usual case: exact pixel correspondence) or at
    another one (the crop is scaled proportionally). One compiled call per batch.

    Args:
        image: the name of the image pipeline (a field or a ``custom_field_mapper`` view) it
            follows; it must run before this pipeline.

    Raises:
        ConfigurationError: ``image`` not a name; (loader construction) the image pipeline is
            missing, runs later, or moves pixels in a way it does not record; (declare) not linked by a loader.
        TypeError (declare): the field is not an ImageArrayField.
        ValueError (call): a corrupt mask payload, naming the field and sample.
    """

    field_types = (ImageArrayField,)

    def __init__(self, image: str):
        if not isinstance(image, str):
            raise ConfigurationError(f"MaskDecoder: image must be the name of an image pipeline, got {image!r}")
        self.image = image
        self.requires = ((GEOMETRY, image),)

    def link(self, kind, producer):
        self._key = (kind, producer.name)
        self.output_size = tuple(int(v) for v in producer.specs[0].shape[:2])

    def declare(self, spec, field, view):
        _require_link(self, self._check_field(field, view), self.image)
        self.pixel_bytes = field.pixel_bytes
        return Spec(self.output_size + (field.channels,), field.dtype)

    def __call__(self, src, dst, ctx):
        geometry = ctx.shared[self._key]
        out = dst[:len(ctx.indices)]
        out_h, out_w = self.output_size
        bad = sample_masks(ctx.indices, ctx.ptrs, ctx.sizes, _region(ctx), flat_view(out).view(np.uint8),
                           out_h, out_w, self.pixel_bytes, IMAGE_HEADER.itemsize, geometry.boxes, geometry.sizes,
                           geometry.hflip, geometry.vflip)
        if bad >= 0:
            raise ValueError(f"field '{self.field_name}', sample {int(ctx.indices[bad])}: the mask's header and payload "
                             "size disagree, or the payload lies outside the data region (corrupt image)")
        return out
