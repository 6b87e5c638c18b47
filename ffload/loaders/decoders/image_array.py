"""Decoders of ImageArrayFields (any channel count, uint8 / uint16 / float32, raw or PNG): the
stored image as is, or a fixed-size window of it (centred or random; no resize), one compiled
gather per batch over the raw layout of :mod:`ffload.loaders.decoders.image_payloads`.

The window's position is drawn in :func:`ffload.loaders.decoders.crops.crop_window`.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ffload.errors import FieldError, FormatError, PipelineError
from ffload.formats.fields.image import IMAGE_HEADER, ImageArrayField
from ffload.loaders.decoders.base import Decoder, copy_bytes, flat_view, output_size_pair
from ffload.loaders.decoders.crops import crop_window
from ffload.loaders.decoders.image_payloads import batch_payloads, image_header
from ffload.loaders.pipeline.geometry import Geometry
from ffload.loaders.pipeline.operation import Spec
from ffload.loaders.rng import op_salt


@njit(nogil=True, cache=True)
def _gather_images(indices, ptrs, sizes, region, dst, height, width, nbytes, header_bytes):
    """Copy each sample's pixels (after its ``(height <u4, width <u4)`` header) into its row of
    ``dst`` (flat ``(B * nbytes,) uint8``). Returns -1, or the row whose payload is not a
    ``height x width`` image of ``nbytes`` pixel bytes or lies outside ``region``."""
    for b in range(indices.shape[0]):
        s = indices[b]
        p = np.int64(ptrs[s])
        if p < 0 or np.int64(sizes[s]) != nbytes + header_bytes or p + nbytes + header_bytes > region.shape[0]:
            return b
        h, w = image_header(region, p)
        if h != height or w != width:
            return b
        copy_bytes(region, p + header_bytes, dst, b * nbytes, nbytes)
    return -1


class ImageArrayDecoder(Decoder):
    """Decode an ImageArrayField of one image size to ``(H, W, C)`` per sample, pixels as stored.

    Per sample the field's dtype
    (uint8, uint16 or float32), exactly the stored pixels and channel count (grayscale stays one
    channel), one compiled gather per batch. The counterpart of :class:`SimpleRGBImageDecoder`
    for any channel count and depth. PNG-compressed fields are decoded first (OpenCV, in the
    worker thread: :func:`~ffload.loaders.decoders.image_payloads.batch_payloads`), then gathered alike; their size is the first
    sample's to be read (``view.selected()``: sample 0, or a Loader's first index), and a sample
    of another size is an error when its batch is decoded.

    Raises:
        PipelineError: (building the pipeline) the field is not an ImageArrayField, or the raw payloads to be read
            differ in size (images of several sizes).
        FormatError: (declare) no samples, or that first sample's header disagrees with its size (or its
            PNG is corrupt); (call) a sample whose image is not the dataset's size, or a corrupt
            PNG, naming the field and sample.
    """

    field_types = (ImageArrayField,)
    publishes_geometry = True  # the whole image, for box/mask stages (pipeline.geometry)

    def declare(self, spec, field, view):
        name = self._check_field(field, view)
        selected, sizes = view.selected(), view.sizes[name]
        if len(selected) == 0:
            raise FormatError(f"field '{name}': the dataset has no samples")
        first = int(selected[0])
        other = np.flatnonzero(sizes[selected] != sizes[first]) if field.compression == "raw" else np.zeros(0)
        if other.size:
            s = int(selected[other[0]])
            raise PipelineError(
                f"ImageArrayDecoder needs images of one size; field '{name}': sample {s} "
                f"is {int(sizes[s])} bytes, sample {first} {int(sizes[first])}; use "
                "CenterCropImageArrayDecoder or RandomCropImageArrayDecoder"
            )
        try:
            self.shape = field.to_array(view.payload(name, first)).shape
        except FieldError as e:
            raise FormatError(f"field '{name}', sample {first}: {e}") from e
        self.nbytes = self.shape[0] * self.shape[1] * field.pixel_bytes
        self.field = field
        return Spec(self.shape, field.dtype)

    def __call__(self, src, dst, ctx):
        out = dst[: len(ctx.indices)]
        height, width, _ = self.shape
        indices, ptrs, sizes, region = batch_payloads(self.field, ctx, self.field_name)
        bad = _gather_images(
            indices,
            ptrs,
            sizes,
            region,
            flat_view(out).view(np.uint8),
            height,
            width,
            self.nbytes,
            IMAGE_HEADER.itemsize,
        )
        if bad >= 0:
            s = int(ctx.indices[bad])
            raise FormatError(
                f"field '{self.field_name}', sample {s}: not a {width}x{height} image of "
                f"{self.nbytes} pixel bytes (corrupt header or payload outside the data region)"
            )
        if self.publish is not None:
            whole = np.tile(np.array([0, 0, height, width], np.int64), (len(out), 1))
            Geometry.publish(ctx, self.publish, whole, whole[:, 2:], (height, width))
        return out


@njit(nogil=True, cache=True)
def _crop_images(
    indices, ptrs, sizes, region, dst, out_h, out_w, pixel_bytes, header_bytes, seeds, salt, random, boxes, image_sizes
):
    """Cut an ``out_h x out_w`` window of each sample's image into its row of ``dst`` (flat
    ``(B * out_h * out_w * pixel_bytes,) uint8``), placed by
    :func:`~ffload.loaders.decoders.crops.crop_window` (centred, or with ``random`` drawn from
    ``seed_state(seeds[b], salt)``). Writes each row's window ``(y0, x0, out_h, out_w)``
    into ``boxes`` and its image ``(h, w)`` into ``image_sizes`` (``(B, 4)`` / ``(B, 2) int64``).
    Returns ``(-1, 0, 0)``, or ``(row, h, w)`` of the first sample whose payload is not its
    header's image (h = -1), or is smaller than the window."""
    row = out_w * pixel_bytes
    for b in range(indices.shape[0]):
        s = indices[b]
        p = np.int64(ptrs[s])
        n = np.int64(sizes[s])
        if p < 0 or n < header_bytes or p + n > region.shape[0]:
            return b, np.int64(-1), np.int64(0)
        h, w = image_header(region, p)
        if n != header_bytes + h * w * pixel_bytes:
            return b, np.int64(-1), np.int64(0)
        if h < out_h or w < out_w:
            return b, h, w
        y0, x0 = crop_window(h, w, out_h, out_w, seeds[b], salt, random)
        boxes[b, 0] = y0
        boxes[b, 1] = x0
        boxes[b, 2] = out_h
        boxes[b, 3] = out_w
        image_sizes[b, 0] = h
        image_sizes[b, 1] = w
        for r in range(out_h):
            copy_bytes(region, p + header_bytes + ((y0 + r) * w + x0) * pixel_bytes, dst, (b * out_h + r) * row, row)
    return -1, np.int64(0), np.int64(0)


class _CropImageArrayDecoder(Decoder):
    """Shared body of the ImageArrayField crop decoders (:attr:`random` picks the offsets)."""

    field_types = (ImageArrayField,)
    random = False
    publishes_geometry = True  # the windows, for box/mask stages (pipeline.geometry)

    def __init__(self, output_size: int | tuple[int, int]):
        self.output_size = output_size_pair(output_size)

    def declare(self, spec, field, view):
        self._check_field(field, view)
        self.pixel_bytes = field.pixel_bytes
        self.field = field
        self.salt = op_salt(type(self).__name__, self.field_name)
        return Spec(self.output_size + (field.channels,), field.dtype)

    def __call__(self, src, dst, ctx):
        out = dst[: len(ctx.indices)]
        out_h, out_w = self.output_size
        boxes = np.empty((len(out), 4), np.int64)
        image_sizes = np.empty((len(out), 2), np.int64)
        indices, ptrs, sizes, region = batch_payloads(self.field, ctx, self.field_name)
        bad, h, w = _crop_images(
            indices,
            ptrs,
            sizes,
            region,
            flat_view(out).view(np.uint8),
            out_h,
            out_w,
            self.pixel_bytes,
            IMAGE_HEADER.itemsize,
            ctx.seeds,
            np.uint64(self.salt),
            self.random,
            boxes,
            image_sizes,
        )
        if bad >= 0:
            where = f"field '{self.field_name}', sample {int(ctx.indices[bad])}"
            if h < 0:
                raise FormatError(f"{where}: header and payload size disagree (corrupt image)")
            raise ValueError(f"{where}: the {w}x{h} image is smaller than the {out_w}x{out_h} crop")
        if self.publish is not None:
            Geometry.publish(ctx, self.publish, boxes, image_sizes, self.output_size)
        return out


class CenterCropImageArrayDecoder(_CropImageArrayDecoder):
    """Decode the centred ``output_size`` window of each ImageArrayField image (no resize).

    For images of any sizes at least that large (torchvision's ``CenterCrop`` offsets; no resize, no padding):
    per sample ``(height, width, C)`` of the stored dtype and channel count.

    Args:
        output_size: ``(height, width)`` or an int (square), pixels.

    Raises:
        PipelineError: (building the pipeline) the field is not an ImageArrayField.
        ConfigurationError: a non-positive size.
        ValueError: (loading) an image smaller than the
            window (torchvision would pad it).
        FormatError: (loading) a corrupt header. Both
            name the field and sample.
    """


class RandomCropImageArrayDecoder(_CropImageArrayDecoder):
    """Decode an ``output_size`` window at a random position of each ImageArrayField image.

    For images of any sizes at least that large (torchvision's ``RandomCrop`` without padding; the
    offsets derive from ``ctx.seeds`` and :attr:`salt`, so they do not depend on ``num_workers``):
    per sample ``(height, width, C)`` of the stored dtype and channel count.

    Args:
        output_size: ``(height, width)`` or an int (square), pixels.

    Raises:
        PipelineError: (building the pipeline) the field is not an ImageArrayField.
        ConfigurationError: a non-positive size.
        ValueError: (loading) an image smaller than the
            window.
        FormatError: (loading) a corrupt header. Both name the field and sample.
    """

    random = True
