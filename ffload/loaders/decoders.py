"""Decoders: the first operation of a field pipeline, reading samples from the dataset region.

Batch-level Python, sample-level compiled kernels: payload gathers (raw images, arrays, bytes)
run in one numba kernel per batch; JPEG decoding and resizing call OpenCV (libjpeg-turbo), which
releases the GIL, once per sample. Semantics follow FFCV 1.0.2's decoders
(``ffcv/fields/{rgb_image,basics,ndarray,bytes}.py``) unless a docstring says otherwise.
"""
from __future__ import annotations

from typing import Tuple, Union

import cv2
import numpy as np
from numba import njit

from ..formats.fields import (JPG, RAW, BytesField, FloatField, IntField, JSONField, NDArrayField,
                              RGBImageField)
from .crops import center_crop_boxes, jpeg_reductions, random_resized_crop_boxes
from .operation import BatchContext, Operation, Spec
from .rng import op_salt

# libjpeg's DCT-domain scaling: decode at 1/k of the size, straight to RGB.
_REDUCED_RGB = {k: (flag & ~cv2.IMREAD_COLOR_BGR) | cv2.IMREAD_COLOR_RGB
                for k, flag in ((2, cv2.IMREAD_REDUCED_COLOR_2), (4, cv2.IMREAD_REDUCED_COLOR_4),
                                (8, cv2.IMREAD_REDUCED_COLOR_8))}
_REDUCED_RGB[1] = cv2.IMREAD_COLOR_RGB


def field_name(field, view) -> str:
    """The name under which ``field`` (by identity) appears in ``view.fields``; ``'?'`` if absent."""
    return next((n for n, f in view.fields.items() if f is field), "?")


class Decoder(Operation):
    """Base of ffload's decoders: checks the field type at :meth:`declare` and remembers the
    field's name (for error messages)."""

    is_decoder = True

    def _check_field(self, field, view) -> str:
        """Return the field's name; raise TypeError if this decoder cannot decode it."""
        name = field_name(field, view)
        if not isinstance(field, self.field_types):
            accepted = " or ".join(t.__name__ for t in self.field_types)
            raise TypeError(f"{type(self).__name__} decodes {accepted} fields; field '{name}' is "
                            f"a {type(field).__name__}")
        self.field_name = name
        return name


def _region(ctx: BatchContext) -> np.ndarray:
    # a plain ndarray view (np.memmap slicing is slower and numba wants base arrays)
    return np.asarray(ctx.region)


def flat_view(array: np.ndarray) -> np.ndarray:
    """A 1-D view of a C-contiguous array, for kernels that write through it.

    Raises ValueError for other layouts (a reshaped copy would silently drop the writes)."""
    if not array.flags.c_contiguous:
        raise ValueError(f"expected a C-contiguous batch buffer, got strides {array.strides}")
    return array.reshape(-1)


def _decode_jpeg(data: np.ndarray, k: int, height: int, width: int, sample: int, name: str) -> np.ndarray:
    """Decode one JPEG payload to RGB at 1/k scale (k in 1, 2, 4, 8) with OpenCV; the result
    must be ``ceil(height / k) x ceil(width / k)`` (the metadata's size, scaled as libjpeg does).

    Raises ValueError naming the field and sample: corrupt data, or a size other than the metadata's."""
    img = cv2.imdecode(data, _REDUCED_RGB[k])
    if img is None:
        raise ValueError(f"field '{name}', sample {sample}: corrupt JPEG ({data.size} bytes) "
                         "could not be decoded")
    if img.shape[:2] != (-(-height // k), -(-width // k)):
        size = f"{img.shape[1]}x{img.shape[0]}" + (f" at 1/{k} scale" if k > 1 else "")
        raise ValueError(f"field '{name}', sample {sample}: JPEG decodes to {size}, metadata says "
                         f"{width}x{height}")
    return img


@njit(nogil=True, cache=True)
def _copy(src, src_start, dst, dst_start, n):
    """``dst[dst_start:dst_start + n] = src[src_start:src_start + n]`` on 1-D arrays; unsigned
    offsets let LLVM emit a vectorised copy (numba slices are ~10x slower here)."""
    s0 = np.uint64(src_start)
    d0 = np.uint64(dst_start)
    for k in range(np.uint64(n)):
        dst[d0 + k] = src[s0 + k]


@njit(nogil=True, cache=True)
def _gather_raw_images(indices, modes, ptrs, region, dst, nbytes, jpg_rows):
    """Copy raw-mode images into the rows of ``dst`` (flat ``(B * nbytes,) uint8``); list the
    JPEG rows in ``jpg_rows``. Returns the number of JPEG rows, or ``-1 - b`` if row b's payload
    is outside ``region``."""
    n_jpg = 0
    for b in range(indices.shape[0]):
        s = indices[b]
        if modes[s] == RAW:
            p = np.int64(ptrs[s])
            if p < 0 or p + nbytes > region.shape[0]:
                return -1 - b
            _copy(region, p, dst, b * nbytes, nbytes)
        else:
            jpg_rows[n_jpg] = b
            n_jpg += 1
    return n_jpg


class SimpleRGBImageDecoder(Decoder):
    """Decode fixed-size RGB images as they are stored (FFCV's ``SimpleRGBImageDecoder``).

    Output per sample: ``(H, W, 3) uint8`` RGB. Raw samples are gathered by one compiled kernel
    per batch; JPEG samples (``mode`` 0, also in mixed 'smart'/'proportion' datasets) are decoded
    with ``cv2.imdecode(..., IMREAD_COLOR_RGB)``.

    Raises:
        TypeError (declare): the field is not an RGBImageField, or images differ in size (use
            :class:`CenterCropRGBImageDecoder` / :class:`RandomResizedCropRGBImageDecoder`).
        ValueError (call): a JPEG payload is corrupt or decodes to a size other than its
            metadata; the message names the sample.
    """

    field_types = (RGBImageField,)

    def declare(self, spec, field, view):
        name = self._check_field(field, view)
        column = view.metadata[name]
        if len(column) == 0:
            raise ValueError(f"field '{name}': the dataset has no samples")
        heights, widths = column["height"], column["width"]
        if heights.min() != heights.max() or widths.min() != widths.max():
            raise TypeError(
                f"SimpleRGBImageDecoder needs images of one size, field '{name}' has heights "
                f"{heights.min()}..{heights.max()} and widths {widths.min()}..{widths.max()}; use "
                "CenterCropRGBImageDecoder or RandomResizedCropRGBImageDecoder instead")
        self.shape = (int(heights[0]), int(widths[0]), 3)
        return Spec(self.shape, np.dtype(np.uint8))

    def __call__(self, src, dst, ctx):
        indices = ctx.indices
        batch = len(indices)
        out = dst[:batch]
        region = _region(ctx)
        jpg_rows = np.empty(batch, dtype=np.int64)
        n_jpg = _gather_raw_images(indices, ctx.metadata["mode"], ctx.ptrs, region, flat_view(out),
                                   int(np.prod(self.shape)), jpg_rows)
        if n_jpg < 0:
            raise ValueError(f"field '{self.field_name}', sample {int(indices[-1 - n_jpg])}: payload "
                             "lies outside the data region")
        for b in jpg_rows[:n_jpg].tolist():
            s = int(indices[b])
            p, n = int(ctx.ptrs[s]), int(ctx.sizes[s])
            out[b] = _decode_jpeg(region[p:p + n], 1, self.shape[0], self.shape[1], s, self.field_name)
        return out


def _output_size(output_size) -> Tuple[int, int]:
    if isinstance(output_size, (int, np.integer)):
        output_size = (output_size, output_size)
    h, w = (int(v) for v in output_size)
    if h < 1 or w < 1:
        raise ValueError(f"output_size must be positive, got {output_size}")
    return h, w


def resize_interpolation(crop_h: int, crop_w: int, out_h: int, out_w: int) -> int:
    """OpenCV interpolation for resizing a ``crop_h x crop_w`` crop to ``out_h x out_w`` (pixels):
    ``INTER_AREA`` when either side shrinks by 2x or more (it averages: no aliasing), else
    ``INTER_LINEAR``. Measured on photos against an antialiased Lanczos resize: below 2x,
    INTER_LINEAR is 3-5x cheaper than INTER_AREA (whose non-integer path is slow) for about
    1.5 dB less PSNR when shrinking, and better when enlarging. FFCV uses INTER_AREA always."""
    if crop_h >= 2 * out_h or crop_w >= 2 * out_w:
        return cv2.INTER_AREA
    return cv2.INTER_LINEAR


class _ResizedCropRGBImageDecoder(Decoder):
    """Shared body of the crop decoders: boxes from one kernel per batch, then per sample decode
    (DCT-reduced when the box allows), crop (a view) and ``cv2.resize`` into the output row."""

    field_types = (RGBImageField,)

    def __init__(self, output_size: Union[int, Tuple[int, int]]):
        self.output_size = _output_size(output_size)

    def declare(self, spec, field, view):
        self._check_field(field, view)
        return Spec(self.output_size + (3,), np.dtype(np.uint8))

    def _boxes(self, ctx: BatchContext, heights, widths, out) -> None:
        raise NotImplementedError

    def __call__(self, src, dst, ctx):
        indices = ctx.indices
        batch = len(indices)
        out = dst[:batch]
        out_h, out_w = self.output_size
        column = ctx.metadata
        modes, heights, widths = column["mode"], column["height"], column["width"]
        boxes = np.empty((batch, 4), dtype=np.int64)
        self._boxes(ctx, heights, widths, boxes)
        factors = np.empty(batch, dtype=np.int64)
        dec_boxes = np.empty((batch, 4), dtype=np.int64)
        jpeg_reductions(indices, modes, heights, widths, boxes, out_h, out_w, JPG, factors, dec_boxes)
        region = _region(ctx)
        ptrs, sizes = ctx.ptrs, ctx.sizes
        rows = zip(indices.tolist(), modes[indices].tolist(), heights[indices].tolist(),
                   widths[indices].tolist(), factors.tolist(), dec_boxes.tolist())
        for b, (s, mode, h, w, k, (top, left, ch, cw)) in enumerate(rows):
            p = int(ptrs[s])
            if mode == RAW:
                if p + h * w * 3 > region.shape[0]:
                    raise ValueError(f"field '{self.field_name}', sample {s}: payload lies outside the "
                                     "data region")
                image = region[p:p + h * w * 3].reshape(h, w, 3)
            else:
                image = _decode_jpeg(region[p:p + int(sizes[s])], k, h, w, s, self.field_name)
            crop = image[top:top + ch, left:left + cw]
            cv2.resize(crop, (out_w, out_h), dst=out[b],
                       interpolation=resize_interpolation(ch, cw, out_h, out_w))
        return out


class CenterCropRGBImageDecoder(_ResizedCropRGBImageDecoder):
    """Centre crop then resize, for images of any size (FFCV's ``CenterCropRGBImageDecoder``).

    The crop is the centred square of side ``int(ratio * min(H, W))`` (FFCV's
    ``get_center_crop``), resized to ``output_size`` with :func:`resize_interpolation`. JPEGs are
    decoded at 1/k scale (libjpeg DCT scaling, k in 8, 4, 2) when the box at that scale still
    covers the output size; the box then snaps to the k-pixel grid (see
    :func:`ffload.loaders.crops.jpeg_reductions`). Measured on 512-640 px q90 photos, decoding at
    1/2, 1/4, 1/8 costs 20, 30, 40 % less than a full decode; the output is then a few grey
    levels (30-37 dB PSNR) from a full decode + INTER_AREA resize of the same box.

    Args:
        output_size: ``(height, width)`` or an int (square), pixels.
        ratio: crop side / shorter image side, in (0, 1]; 224/256 by default.

    Output per sample: ``(height, width, 3) uint8`` RGB.

    Raises:
        TypeError (declare): the field is not an RGBImageField.
        ValueError: bad arguments; (call) a corrupt JPEG, naming the sample.
    """

    def __init__(self, output_size: Union[int, Tuple[int, int]], ratio: float = 224 / 256):
        super().__init__(output_size)
        if not 0 < ratio <= 1:
            raise ValueError(f"ratio must be in (0, 1], got {ratio}")
        self.ratio = float(ratio)

    def _boxes(self, ctx, heights, widths, out):
        center_crop_boxes(ctx.indices, heights, widths, self.ratio, out)


class RandomResizedCropRGBImageDecoder(_ResizedCropRGBImageDecoder):
    """Random crop then resize, for images of any size (FFCV's
    ``RandomResizedCropRGBImageDecoder``, boxes drawn with torchvision's
    ``RandomResizedCrop.get_params`` rule, see :func:`ffload.loaders.crops.random_resized_crop_boxes`).

    The box of each sample derives from ``ctx.seeds`` and :attr:`salt`. Resizing and JPEG
    reduction as in :class:`CenterCropRGBImageDecoder`.

    Args:
        output_size: ``(height, width)`` or an int (square), pixels.
        scale: ``(min, max)`` area fraction of the crop, ``0 < min <= max``.
        ratio: ``(min, max)`` aspect ratio (width / height) of the crop, ``0 < min <= max``.

    Attributes:
        salt: ``uint64`` mixed into every sample seed, set at declare from the class and field
            names (two fields draw independent boxes).

    Output per sample: ``(height, width, 3) uint8`` RGB.

    Raises:
        TypeError (declare): the field is not an RGBImageField.
        ValueError: bad arguments; (call) a corrupt JPEG, naming the sample.
    """

    def __init__(self, output_size: Union[int, Tuple[int, int]], scale: Tuple[float, float] = (0.08, 1.0),
                 ratio: Tuple[float, float] = (3 / 4, 4 / 3)):
        super().__init__(output_size)
        scale = tuple(float(v) for v in scale)
        ratio = tuple(float(v) for v in ratio)
        if len(scale) != 2 or not 0 < scale[0] <= scale[1]:
            raise ValueError(f"scale must be (min, max) with 0 < min <= max, got {scale}")
        if len(ratio) != 2 or not 0 < ratio[0] <= ratio[1]:
            raise ValueError(f"ratio must be (min, max) with 0 < min <= max, got {ratio}")
        self.scale, self.ratio = scale, ratio

    def declare(self, spec, field, view):
        out = super().declare(spec, field, view)
        self.salt = op_salt(type(self).__name__, self.field_name)
        return out

    def _boxes(self, ctx, heights, widths, out):
        random_resized_crop_boxes(ctx.indices, heights, widths, ctx.seeds, self.salt,
                                  self.scale[0], self.scale[1], self.ratio[0], self.ratio[1], out)


class _MetadataDecoder(Decoder):
    """Scalars stored as the metadata itself: ``dst[:B] = metadata[indices]``."""

    dtype: np.dtype

    def declare(self, spec, field, view):
        self._check_field(field, view)
        return Spec((), self.dtype)

    def __call__(self, src, dst, ctx):
        out = dst[:len(ctx.indices)]
        np.take(ctx.metadata, ctx.indices, out=out)
        return out


class IntDecoder(_MetadataDecoder):
    """Decode an IntField: per sample ``() int64`` (FFCV's ``IntDecoder``).

    Raises TypeError at declare for another field type."""

    field_types = (IntField,)
    dtype = np.dtype(np.int64)


class FloatDecoder(_MetadataDecoder):
    """Decode a FloatField: per sample ``() float64`` (FFCV's ``FloatDecoder``).

    Raises TypeError at declare for another field type."""

    field_types = (FloatField,)
    dtype = np.dtype(np.float64)


@njit(nogil=True, cache=True)
def _gather_payloads(indices, ptrs, sizes, region, dst, width):
    """Copy each sample's payload into its row of ``dst`` (flat ``(B * width,) uint8``),
    zero-padding the rest. Returns -1, or the row whose payload is longer than ``width`` or
    outside ``region``."""
    for b in range(indices.shape[0]):
        s = indices[b]
        p = np.int64(ptrs[s])
        n = np.int64(sizes[s])
        if p < 0 or n > width or p + n > region.shape[0]:
            return b
        _copy(region, p, dst, b * width, n)
        start = np.uint64(b * width)
        for k in range(np.uint64(n), np.uint64(width)):
            dst[start + k] = 0
    return -1


class NDArrayDecoder(Decoder):
    """Decode an NDArrayField: per sample the field's ``shape`` and ``dtype`` (little-endian),
    gathered by one kernel per batch (FFCV's ``NDArrayDecoder``).

    Raises:
        TypeError (declare): the field is not an NDArrayField.
        ValueError (declare): a payload's size differs from ``prod(shape) * itemsize``.
    """

    field_types = (NDArrayField,)

    def declare(self, spec, field, view):
        name = self._check_field(field, view)
        self.dtype = np.dtype(field.dtype).newbyteorder("<")
        self.nbytes = int(np.prod(field.shape)) * self.dtype.itemsize
        bad = np.flatnonzero(view.sizes[name] != self.nbytes)
        if bad.size:
            s = int(bad[0])
            raise ValueError(f"field '{name}', sample {s}: payload is {int(view.sizes[name][s])} "
                             f"bytes, expected {self.nbytes}")
        return Spec(tuple(field.shape), self.dtype)

    def __call__(self, src, dst, ctx):
        batch = len(ctx.indices)
        out = dst[:batch]
        flat = flat_view(out).view(np.uint8)
        bad = _gather_payloads(ctx.indices, ctx.ptrs, ctx.sizes, _region(ctx), flat, self.nbytes)
        if bad >= 0:
            raise ValueError(f"field '{self.field_name}', sample {int(ctx.indices[bad])}: payload "
                             "lies outside the data region")
        return out


class BytesDecoder(Decoder):
    """Decode a BytesField or JSONField: per sample ``(max_size,) uint8``, the payload followed
    by zeros; ``max_size`` is the largest payload of the dataset (FFCV's ``BytesDecoder``, which
    leaves the padding unspecified). Use ``JSONField.unpack`` to parse JSON rows.

    Raises:
        TypeError (declare): the field is neither a BytesField nor a JSONField.
    """

    field_types = (BytesField, JSONField)

    def declare(self, spec, field, view):
        name = self._check_field(field, view)
        sizes = view.sizes[name]
        self.max_size = int(sizes.max()) if len(sizes) else 0
        return Spec((self.max_size,), np.dtype(np.uint8))

    def __call__(self, src, dst, ctx):
        out = dst[:len(ctx.indices)]
        bad = _gather_payloads(ctx.indices, ctx.ptrs, ctx.sizes, _region(ctx), flat_view(out),
                               self.max_size)
        if bad >= 0:
            raise ValueError(f"field '{self.field_name}', sample {int(ctx.indices[bad])}: payload is "
                             f"longer than {self.max_size} bytes or outside the data region")
        return out
