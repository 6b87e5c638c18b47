"""Decoders: the first operation of a field pipeline, reading samples from the dataset region.

Batch-level Python, sample-level compiled kernels: payload gathers (raw images, arrays, bytes)
and the RGB image decoders (JPEG through libjpeg-turbo, crop, resize: :mod:`.jpeg`) run in one
GIL-free numba call per batch. Semantics follow FFCV 1.0.2's decoders
(``ffcv/fields/{rgb_image,basics,ndarray,bytes}.py``) unless a docstring says otherwise.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from ffload.codecs import jpeg
from ffload.errors import FieldError, FormatError
from ffload.formats.fields.bytes import BytesField, JSONField
from ffload.formats.fields.image import (
    IMAGE_HEADER,
    ImageArrayField,
    RGBImageField,
    describe_size_mismatch,
    differing_sizes,
)
from ffload.formats.fields.ndarray import NDArrayField, RaggedArrayField, cast_values
from ffload.formats.fields.scalars import FloatField, IntField
from ffload.loaders.decoders.crops import center_crop_boxes, random_resized_crop_boxes
from ffload.loaders.decoders.png import batch_payloads
from ffload.loaders.pipeline.geometry import Geometry
from ffload.loaders.pipeline.operation import BatchContext, Operation, Spec
from ffload.loaders.rng import op_salt, randint, seed_state, uniform


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


@njit(nogil=True, cache=True)
def _copy(src, src_start, dst, dst_start, n):
    """``dst[dst_start:dst_start + n] = src[src_start:src_start + n]`` on 1-D arrays; unsigned
    offsets let LLVM emit a vectorised copy (numba slices are ~10x slower here)."""
    s0 = np.uint64(src_start)
    d0 = np.uint64(dst_start)
    for k in range(np.uint64(n)):
        dst[d0 + k] = src[s0 + k]


@njit(nogil=True, cache=True)
def flip_draws(seeds, salt, prob, out):
    """``out[b] = uniform(seed_state(seeds[b], salt)) < prob``: RandomHorizontalFlip's rule."""
    for b in range(seeds.shape[0]):
        u, _ = uniform(seed_state(seeds[b], salt))
        out[b] = u < prob


class _RGBDecoder(Decoder):
    """Base of the RGB image decoders: every row of a batch through :func:`.jpeg.decode_batch`
    (one compiled call; raw and JPEG samples alike), errors raised naming the field and sample.
    A following :class:`~.transforms.RandomHorizontalFlip` is fused into the write
    (:meth:`fuse_flip`)."""

    field_types = (RGBImageField,)
    flip = None  # (flip_prob, salt) of a fused RandomHorizontalFlip
    publishes_geometry = True  # crop boxes and fused flips, for box/mask stages (.geometry)

    def __init__(self, fast_dct: bool = False):
        self.fast_dct = bool(fast_dct)

    def fuse_flip(self, flip_prob, salt):
        self.flip = (float(flip_prob), np.uint64(salt))
        return True

    def declare(self, spec, field, view):
        self._check_field(field, view)
        jpeg.warn_if_fallback()
        return self._declare(view)

    def _declare(self, view) -> Spec:
        """The output spec, from the field's metadata of the samples ``view.selected()``."""
        raise NotImplementedError

    def _boxes(self, ctx: BatchContext, heights, widths, out) -> None:
        """Fill ``out`` ``(B, 4) int64`` with the crop box of each row (stored-image pixels)."""
        raise NotImplementedError

    def __call__(self, src, dst, ctx):
        indices = ctx.indices
        batch = len(indices)
        out = dst[:batch]
        flat_view(out)  # the kernel writes through a flat view: check the layout
        column = ctx.metadata
        boxes = np.empty((batch, 4), dtype=np.int64)
        self._boxes(ctx, column["height"], column["width"], boxes)
        flips = np.zeros(batch, np.bool_)
        if self.flip is not None:
            flip_draws(ctx.seeds, self.flip[1], self.flip[0], flips)
        bad, code, detail = jpeg.decode_batch(indices, column, ctx.ptrs, ctx.sizes, _region(ctx), boxes,
                                              flips, out, self.fast_dct)
        if bad >= 0:
            s = int(indices[bad])
            where = f"field '{self.field_name}', sample {s}"
            if code == jpeg.BAD_SIZE:
                h, w = int(column["height"][s]), int(column["width"][s])
                cause = f"{where}: JPEG decodes to {detail}, metadata says {w}x{h}"
            elif code == jpeg.OUTSIDE:
                cause = f"{where}: {detail}"
            else:
                cause = f"{where}: corrupt JPEG ({int(ctx.sizes[s])} bytes): {detail}"
            raise FormatError(cause, field=self.field_name, sample=s)
        if self.publish is not None:
            sizes = np.stack([column["height"][indices], column["width"][indices]], axis=1)
            Geometry.publish(ctx, self.publish, boxes, sizes, out.shape[1:3], flips)
        return out


class SimpleRGBImageDecoder(_RGBDecoder):
    """Decode fixed-size RGB images as they are stored (FFCV's ``SimpleRGBImageDecoder``).

    Output per sample: ``(H, W, 3) uint8`` RGB, exactly the stored pixels (raw) or libjpeg-turbo's
    full-size decode (JPEG, also in mixed 'smart'/'proportion' datasets), one compiled call per
    batch (:mod:`.jpeg`).

    Args:
        fast_dct: decode JPEGs with libjpeg-turbo's fast integer IDCT (``TJPARAM_FASTDCT``,
            libjpeg's ``JDCT_IFAST``), as FFCV 1.0.2 does (``TJFLAG_FASTDCT``), instead of the
            accurate default (``JDCT_ISLOW``: OpenCV's, Pillow's and torchvision's, pixel-equal
            to ``cv2.imdecode``). Faster, and within about one grey level (mean absolute
            difference) of the accurate decode: ``scripts/bench_jpeg.py --fast-dct`` measures
            both. Applies to full-scale (8/8) decodes; the OpenCV fallback ignores it.

    Raises:
        TypeError (declare): the field is not an RGBImageField, or the images to be read
            (``view.selected()``: a Loader's ``indices``) differ in size, naming two of them (use
            :class:`CenterCropRGBImageDecoder` / :class:`RandomResizedCropRGBImageDecoder`).
        FormatError (call; a ValueError): a JPEG payload is corrupt (libjpeg-turbo's message) or
            its header declares a size other than its metadata (refused before decoding, so no
            buffer is sized from it); the message names the field and sample.
    """

    def _declare(self, view):
        name, column, selected = self.field_name, view.metadata[self.field_name], view.selected()
        if len(selected) == 0:
            raise ValueError(f"field '{name}': the dataset has no samples")
        pair = differing_sizes(column, selected)
        if pair is not None:
            raise TypeError(
                f"SimpleRGBImageDecoder needs images of one size, field '{name}' has several "
                f"({describe_size_mismatch(column, pair)}); use "
                "CenterCropRGBImageDecoder or RandomResizedCropRGBImageDecoder instead")
        first = int(selected[0])
        self.shape = (int(column["height"][first]), int(column["width"][first]), 3)
        return Spec(self.shape, np.dtype(np.uint8))

    def _boxes(self, ctx, heights, widths, out):
        out[:, :2] = 0
        out[:, 2] = self.shape[0]
        out[:, 3] = self.shape[1]


def _output_size(output_size) -> tuple[int, int]:
    if isinstance(output_size, (int, np.integer)):
        output_size = (output_size, output_size)
    h, w = (int(v) for v in output_size)
    if h < 1 or w < 1:
        raise ValueError(f"output_size must be positive, got {output_size}")
    return h, w


class _ResizedCropRGBImageDecoder(_RGBDecoder):
    """Shared body of the crop decoders: boxes from one kernel per batch, then decode (DCT-scaled
    and cropped by libjpeg-turbo for JPEGs), resize and write, one compiled call per batch."""

    def __init__(self, output_size: int | tuple[int, int], fast_dct: bool = False):
        super().__init__(fast_dct)
        self.output_size = _output_size(output_size)

    def _declare(self, view):
        return Spec(self.output_size + (3,), np.dtype(np.uint8))


class CenterCropRGBImageDecoder(_ResizedCropRGBImageDecoder):
    """Centre crop then resize, for images of any size (FFCV's ``CenterCropRGBImageDecoder``).

    The crop is the centred square of side ``int(ratio * min(H, W))`` (FFCV's
    ``get_center_crop``), resized to ``output_size`` by :func:`ffload.codecs.resize.resize_rgb`
    (OpenCV's ``INTER_AREA`` when shrinking, ``INTER_LINEAR`` when enlarging). JPEGs are decoded
    by libjpeg-turbo, only the box's rows and iMCU columns, at half size when the box is at least
    4x the output (see :mod:`ffload.codecs.jpeg`); a half-size decode lands on average within
    2 grey levels (mean absolute difference) of a full decode + the same resize of the same box:
    1.7 on the benchmarks' grainy photos at 4x, up to ~3 for single images.

    Args:
        output_size: ``(height, width)`` or an int (square), pixels.
        ratio: crop side / shorter image side, in (0, 1]; 224/256 by default.
        fast_dct: libjpeg-turbo's fast IDCT, as in :class:`SimpleRGBImageDecoder`.

    Output per sample: ``(height, width, 3) uint8`` RGB.

    Raises:
        TypeError (declare): the field is not an RGBImageField.
        ValueError: bad arguments; (call, FormatError) a corrupt JPEG (libjpeg-turbo's message), naming the
            field and sample.
    """

    def __init__(self, output_size: int | tuple[int, int], ratio: float = 224 / 256,
                 fast_dct: bool = False):
        super().__init__(output_size, fast_dct)
        if not 0 < ratio <= 1:
            raise ValueError(f"ratio must be in (0, 1], got {ratio}")
        self.ratio = float(ratio)

    def _boxes(self, ctx, heights, widths, out):
        center_crop_boxes(ctx.indices, heights, widths, self.ratio, out)


class RandomResizedCropRGBImageDecoder(_ResizedCropRGBImageDecoder):
    """Random crop then resize, for images of any size (FFCV's
    ``RandomResizedCropRGBImageDecoder``, boxes drawn with torchvision's
    ``RandomResizedCrop.get_params`` rule, see :func:`ffload.loaders.decoders.crops.random_resized_crop_boxes`).

    The box of each sample derives from ``ctx.seeds`` and :attr:`salt`. Resizing and JPEG
    reduction as in :class:`CenterCropRGBImageDecoder`.

    Args:
        output_size: ``(height, width)`` or an int (square), pixels.
        scale: ``(min, max)`` area fraction of the crop, ``0 < min <= max``.
        ratio: ``(min, max)`` aspect ratio (width / height) of the crop, ``0 < min <= max``.
        fast_dct: libjpeg-turbo's fast IDCT, as in :class:`SimpleRGBImageDecoder`.

    Attributes:
        salt: ``uint64`` mixed into every sample seed, set at declare from the class and field
            names (two fields draw independent boxes).

    Output per sample: ``(height, width, 3) uint8`` RGB.

    Raises:
        TypeError (declare): the field is not an RGBImageField.
        ValueError: bad arguments; (call, FormatError) a corrupt JPEG (libjpeg-turbo's message), naming the
            field and sample.
    """

    def __init__(self, output_size: int | tuple[int, int], scale: tuple[float, float] = (0.08, 1.0),
                 ratio: tuple[float, float] = (3 / 4, 4 / 3), fast_dct: bool = False):
        super().__init__(output_size, fast_dct)
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


class ResizeRGBImageDecoder(_ResizedCropRGBImageDecoder):
    """Resize the whole image to ``output_size``, for images of any size (torchvision's
    ``Resize((h, w))`` with a ``(height, width)`` size: both sides set, the aspect ratio is not
    kept; FFCV has no such decoder).

    Interpolation is :func:`ffload.codecs.resize.resize_rgb`'s, chosen per image as
    :class:`CenterCropRGBImageDecoder` does: OpenCV's ``INTER_AREA`` when neither side grows (an
    area average, which is what torchvision's bilinear ``antialias=True`` approximates when
    shrinking), ``INTER_LINEAR`` (bilinear, half-pixel centres) when a side grows; within one
    grey level of ``cv2.resize`` with that interpolation on raw images. JPEGs are decoded by
    libjpeg-turbo at half size when the box is at least 4x the output (:mod:`ffload.codecs.jpeg`),
    so they are close to, not equal to, a full decode + the same resize (on average within 2
    grey levels mean absolute difference, see :class:`CenterCropRGBImageDecoder`). Raw and JPEG
    samples alike, one compiled call per batch; a following
    :class:`~.transforms.RandomHorizontalFlip` is fused.

    Args:
        output_size: ``(height, width)`` or an int (square), pixels.
        fast_dct: libjpeg-turbo's fast IDCT, as in :class:`SimpleRGBImageDecoder`.

    Output per sample: ``(height, width, 3) uint8`` RGB.

    Raises:
        TypeError (declare): the field is not an RGBImageField.
        ValueError: a non-positive size; (call, FormatError) a corrupt JPEG (libjpeg-turbo's message), naming
            the field and sample.
    """

    def _boxes(self, ctx, heights, widths, out):
        out[:, :2] = 0
        out[:, 2] = heights[ctx.indices]
        out[:, 3] = widths[ctx.indices]


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
    by zeros; ``max_size`` is the largest payload of the samples to be read (``view.selected()``:
    the dataset, or a Loader's ``indices``; FFCV's ``BytesDecoder``, which
    leaves the padding unspecified). Use ``JSONField.unpack`` to parse JSON rows.

    Raises:
        TypeError (declare): the field is neither a BytesField nor a JSONField.
    """

    field_types = (BytesField, JSONField)

    def declare(self, spec, field, view):
        name = self._check_field(field, view)
        sizes = view.sizes[name][view.selected()]
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


@njit(nogil=True, cache=True)
def _gather_clipped(indices, ptrs, sizes, region, dst, width, pad):
    """Copy the first ``min(size, width)`` bytes of each sample's payload into its row of ``dst``
    (flat ``(B * width,) uint8``) and fill the rest of the row from ``pad`` (``(width,) uint8``).
    Returns -1, or the row whose payload lies outside ``region``."""
    for b in range(indices.shape[0]):
        s = indices[b]
        p = np.int64(ptrs[s])
        n = np.int64(sizes[s])
        if p < 0 or p + n > region.shape[0]:
            return b
        n = min(n, width)
        _copy(region, p, dst, b * width, n)
        start = np.uint64(b * width)
        for k in range(np.uint64(n), np.uint64(width)):
            dst[start + k] = pad[k]
    return -1


def _max_length(max_length) -> int | None:
    if max_length is not None and int(max_length) < 0:
        raise ValueError(f"max_length must be >= 0 or None, got {max_length}")
    return None if max_length is None else int(max_length)


class RaggedArrayDecoder(Decoder):
    """Decode a RaggedArrayField into a padded batch: per sample ``(K_max, *inner_shape)`` of the
    field's dtype, the sample's ``K`` rows first, then rows of ``fill``. Pair it with
    :class:`RaggedLengthDecoder` on a second view of the field for the ``(B,)`` lengths::

        Loader(path, ..., pipelines={"boxes": [RaggedArrayDecoder(), ToTensor()],
                                     "num_boxes": [RaggedLengthDecoder(), ToTensor()]},
               custom_field_mapper={"num_boxes": "boxes"})

    (torch's ``pad_sequence`` layout, batch first; FFCV has no such decoder.)

    Args:
        max_length: ``K_max`` in rows. ``None``: the largest ``K`` of the samples to be read
            (``view.selected()``: the dataset, or a Loader's ``indices``), from the sizes at declare (one batch shape for every epoch). An int: samples with more rows
            keep their first ``max_length`` rows (the rest are dropped; the lengths decoder then
            reports ``min(K, max_length)``), and ``K_max = max_length`` even if no sample is that long.
        fill: the padding value, cast to the field's dtype (e.g. ``-1`` for label lists).

    Memory: each batch buffer is ``batch_size * K_max * row_bytes`` bytes, so one very long
    sample sets the size of every batch: pass ``max_length`` to bound it.

    Raises:
        TypeError (declare): the field is not a RaggedArrayField.
        ValueError: a negative ``max_length``, a ``fill`` the dtype cannot hold; (call) a payload
            outside the data region, naming the field and sample.
    """

    field_types = (RaggedArrayField,)

    def __init__(self, max_length: int | None = None, fill=0):
        self.max_length = _max_length(max_length)
        self.fill = fill

    def declare(self, spec, field, view):
        name = self._check_field(field, view)
        lengths = field.lengths(view.sizes[name][view.selected()])
        rows = self.max_length if self.max_length is not None else int(lengths.max()) if lengths.size else 0
        fill = cast_values(np.array(self.fill), field.dtype, f"fill {self.fill!r}")
        row = np.full(field.inner_shape, fill, dtype=field.dtype)
        self.pad = np.tile(row.reshape(-1).view(np.uint8), rows)
        self.width = rows * field.row_bytes
        return Spec((rows,) + field.inner_shape, field.dtype)

    def __call__(self, src, dst, ctx):
        out = dst[:len(ctx.indices)]
        bad = _gather_clipped(ctx.indices, ctx.ptrs, ctx.sizes, _region(ctx), flat_view(out).view(np.uint8),
                              self.width, self.pad)
        if bad >= 0:
            raise ValueError(f"field '{self.field_name}', sample {int(ctx.indices[bad])}: payload lies "
                             "outside the data region")
        return out


class RaggedLengthDecoder(Decoder):
    """Decode the row counts of a RaggedArrayField: per sample ``() int64``, ``K`` (or
    ``min(K, max_length)``, matching :class:`RaggedArrayDecoder` with the same ``max_length``).
    Reads only the metadata (``K = size // row_bytes``), never the payload.

    Raises:
        TypeError (declare): the field is not a RaggedArrayField.
        ValueError: a negative ``max_length``.
    """

    field_types = (RaggedArrayField,)

    def __init__(self, max_length: int | None = None):
        self.max_length = _max_length(max_length)

    def declare(self, spec, field, view):
        self._check_field(field, view)
        self.row_bytes = np.uint64(field.row_bytes)
        return Spec((), np.dtype(np.int64))

    def __call__(self, src, dst, ctx):
        out = dst[:len(ctx.indices)]
        out[:] = ctx.sizes[ctx.indices] // self.row_bytes
        if self.max_length is not None:
            np.minimum(out, self.max_length, out=out)
        return out


@njit(nogil=True, cache=True)
def _header(region, p):
    """The ``(height, width)`` of the ImageArrayField header at ``region[p:p + 8]`` (``<u4`` each)."""
    h = np.int64(0)
    w = np.int64(0)
    for k in range(4):
        h |= np.int64(region[p + k]) << (8 * k)
        w |= np.int64(region[p + 4 + k]) << (8 * k)
    return h, w


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
        h, w = _header(region, p)
        if h != height or w != width:
            return b
        _copy(region, p + header_bytes, dst, b * nbytes, nbytes)
    return -1


class ImageArrayDecoder(Decoder):
    """Decode an ImageArrayField of one image size: per sample ``(H, W, C)`` of the field's dtype
    (uint8, uint16 or float32), exactly the stored pixels and channel count (grayscale stays one
    channel), one compiled gather per batch. The counterpart of :class:`SimpleRGBImageDecoder`
    for any channel count and depth. PNG-compressed fields are decoded first (OpenCV, in the
    worker thread: :func:`.png.batch_payloads`), then gathered alike; their size is the first
    sample's to be read (``view.selected()``: sample 0, or a Loader's first index), and a sample
    of another size is an error when its batch is decoded.

    Raises:
        TypeError (declare): the field is not an ImageArrayField, or the raw payloads to be read
            differ in size (images of several sizes).
        ValueError: (declare) no samples, or that first sample's header disagrees with its size (or its
            PNG is corrupt); (call) a sample whose image is not the dataset's size, or a corrupt
            PNG, naming the field and sample.
    """

    field_types = (ImageArrayField,)
    publishes_geometry = True  # the whole image, for box/mask stages (.geometry)

    def declare(self, spec, field, view):
        name = self._check_field(field, view)
        selected, sizes = view.selected(), view.sizes[name]
        if len(selected) == 0:
            raise ValueError(f"field '{name}': the dataset has no samples")
        first = int(selected[0])
        other = np.flatnonzero(sizes[selected] != sizes[first]) if field.compression == "raw" else np.zeros(0)
        if other.size:
            s = int(selected[other[0]])
            raise TypeError(f"ImageArrayDecoder needs images of one size; field '{name}': sample {s} "
                            f"is {int(sizes[s])} bytes, sample {first} {int(sizes[first])}; use "
                            "CenterCropImageArrayDecoder or RandomCropImageArrayDecoder")
        try:
            self.shape = field.to_array(view.payload(name, first)).shape
        except FieldError as e:
            raise ValueError(f"field '{name}', sample {first}: {e}") from e
        self.nbytes = self.shape[0] * self.shape[1] * field.pixel_bytes
        self.field = field
        return Spec(self.shape, field.dtype)

    def __call__(self, src, dst, ctx):
        out = dst[:len(ctx.indices)]
        height, width, _ = self.shape
        indices, ptrs, sizes, region = batch_payloads(self.field, ctx, self.field_name)
        bad = _gather_images(indices, ptrs, sizes, region, flat_view(out).view(np.uint8),
                             height, width, self.nbytes, IMAGE_HEADER.itemsize)
        if bad >= 0:
            s = int(ctx.indices[bad])
            raise ValueError(f"field '{self.field_name}', sample {s}: not a {width}x{height} image of "
                             f"{self.nbytes} pixel bytes (corrupt header or payload outside the data region)")
        if self.publish is not None:
            whole = np.tile(np.array([0, 0, height, width], np.int64), (len(out), 1))
            Geometry.publish(ctx, self.publish, whole, whole[:, 2:], (height, width))
        return out


@njit(nogil=True, cache=True)
def _crop_images(indices, ptrs, sizes, region, dst, out_h, out_w, pixel_bytes, header_bytes, seeds, salt, random,
                 boxes, image_sizes):
    """Cut an ``out_h x out_w`` window of each sample's image into its row of ``dst`` (flat
    ``(B * out_h * out_w * pixel_bytes,) uint8``): centred (torchvision's ``CenterCrop`` offsets,
    ``round((h - out_h) / 2)`` half to even) or, with ``random``, at ``(y, x)`` uniform in
    ``{0..h - out_h} x {0..w - out_w}`` drawn in that order from ``seed_state(seeds[b], salt)``
    (torchvision's ``RandomCrop.get_params``). Writes each row's window ``(y0, x0, out_h, out_w)``
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
        h, w = _header(region, p)
        if n != header_bytes + h * w * pixel_bytes:
            return b, np.int64(-1), np.int64(0)
        if h < out_h or w < out_w:
            return b, h, w
        if random:
            state = seed_state(seeds[b], salt)
            y0, state = randint(state, h - out_h + 1)
            x0, state = randint(state, w - out_w + 1)
        else:
            y0 = (h - out_h) // 2 + ((h - out_h) % 2) * (((h - out_h) // 2) % 2)
            x0 = (w - out_w) // 2 + ((w - out_w) % 2) * (((w - out_w) // 2) % 2)
        boxes[b, 0] = y0
        boxes[b, 1] = x0
        boxes[b, 2] = out_h
        boxes[b, 3] = out_w
        image_sizes[b, 0] = h
        image_sizes[b, 1] = w
        for r in range(out_h):
            _copy(region, p + header_bytes + ((y0 + r) * w + x0) * pixel_bytes, dst, (b * out_h + r) * row, row)
    return -1, np.int64(0), np.int64(0)


class _CropImageArrayDecoder(Decoder):
    """Shared body of the ImageArrayField crop decoders (:attr:`random` picks the offsets)."""

    field_types = (ImageArrayField,)
    random = False
    publishes_geometry = True  # the windows, for box/mask stages (.geometry)

    def __init__(self, output_size: int | tuple[int, int]):
        self.output_size = _output_size(output_size)

    def declare(self, spec, field, view):
        self._check_field(field, view)
        self.pixel_bytes = field.pixel_bytes
        self.field = field
        self.salt = op_salt(type(self).__name__, self.field_name)
        return Spec(self.output_size + (field.channels,), field.dtype)

    def __call__(self, src, dst, ctx):
        out = dst[:len(ctx.indices)]
        out_h, out_w = self.output_size
        boxes = np.empty((len(out), 4), np.int64)
        image_sizes = np.empty((len(out), 2), np.int64)
        indices, ptrs, sizes, region = batch_payloads(self.field, ctx, self.field_name)
        bad, h, w = _crop_images(indices, ptrs, sizes, region, flat_view(out).view(np.uint8),
                                 out_h, out_w, self.pixel_bytes, IMAGE_HEADER.itemsize, ctx.seeds,
                                 np.uint64(self.salt), self.random, boxes, image_sizes)
        if bad >= 0:
            where = f"field '{self.field_name}', sample {int(ctx.indices[bad])}"
            if h < 0:
                raise ValueError(f"{where}: header and payload size disagree (corrupt image)")
            raise ValueError(f"{where}: the {w}x{h} image is smaller than the {out_w}x{out_h} crop")
        if self.publish is not None:
            Geometry.publish(ctx, self.publish, boxes, image_sizes, self.output_size)
        return out


class CenterCropImageArrayDecoder(_CropImageArrayDecoder):
    """Cut the centred ``output_size`` window of each ImageArrayField image, for images of any
    sizes at least that large (torchvision's ``CenterCrop`` offsets; no resize, no padding):
    per sample ``(height, width, C)`` of the stored dtype and channel count.

    Args:
        output_size: ``(height, width)`` or an int (square), pixels.

    Raises:
        TypeError (declare): the field is not an ImageArrayField.
        ValueError: a non-positive size; (call) an image smaller than the window (torchvision
            would pad it) or a corrupt header, naming the field and sample.
    """


class RandomCropImageArrayDecoder(_CropImageArrayDecoder):
    """Cut an ``output_size`` window at a random position of each ImageArrayField image, for
    images of any sizes at least that large (torchvision's ``RandomCrop`` without padding; the
    offsets derive from ``ctx.seeds`` and :attr:`salt`, so they do not depend on ``num_workers``):
    per sample ``(height, width, C)`` of the stored dtype and channel count.

    Args:
        output_size: ``(height, width)`` or an int (square), pixels.

    Raises:
        TypeError (declare): the field is not an ImageArrayField.
        ValueError: a non-positive size; (call) an image smaller than the window or a corrupt
            header, naming the field and sample.
    """

    random = True
