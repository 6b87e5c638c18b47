"""The RGB image decoders (FFCV's ``{Simple,CenterCrop,RandomResizedCrop}RGBImageDecoder``, and a
whole-image resize): raw and JPEG samples alike, decoded (libjpeg-turbo), cropped and resized in
one GIL-free compiled call per batch (:func:`ffload.codecs.jpeg.decode_batch`), a following
RandomHorizontalFlip fused into the write.

The crop boxes are drawn in :mod:`ffload.loaders.decoders.crops` (RandomResizedCrop's box:
:func:`~ffload.loaders.decoders.crops.random_resized_crop_boxes`); the decoders here only pick
which kernel fills ``(B, 4)`` boxes. Semantics follow FFCV 1.0.2's ``ffcv/fields/rgb_image.py``
unless a docstring says otherwise.
"""

from __future__ import annotations

import numpy as np
import torch
from numba import njit

from ffload.codecs import jpeg
from ffload.codecs.resize import AUTO, TRIANGLE, TRIANGLE_SOURCE
from ffload.errors import ConfigurationError, FormatError, PipelineError
from ffload.formats.fields.image import RGBImageField, describe_size_mismatch, differing_sizes
from ffload.loaders.decoders.base import Decoder, flat_view, output_size_pair, region_array
from ffload.loaders.decoders.crops import center_crop_boxes, random_resized_crop_boxes
from ffload.loaders.pipeline.geometry import Geometry
from ffload.loaders.pipeline.operation import BatchContext, Spec
from ffload.loaders.rng import op_salt, seed_state, uniform


@njit(nogil=True, cache=True)
def flip_draws(seeds, salt, prob, out):
    """``out[b] = uniform(seed_state(seeds[b], salt)) < prob``: RandomHorizontalFlip's rule."""
    for b in range(seeds.shape[0]):
        u, _ = uniform(seed_state(seeds[b], salt))
        out[b] = u < prob


def device_spec(spec: Spec, device: torch.device) -> Spec:
    """The spec of a decoder's output made on ``device``: the same per-sample shape, a
    ``torch.uint8`` tensor there (as after ``ToTensor()`` and ``ToDevice(device)``)."""
    return Spec(spec.shape, torch.uint8, on_torch=True, device=str(device))


class _RGBDecoder(Decoder):
    """Base of the RGB image decoders: every row of a batch through :func:`ffload.codecs.jpeg.decode_batch`
    (one compiled call; raw and JPEG samples alike), errors raised naming the field and sample.
    A following :class:`~ffload.loaders.RandomHorizontalFlip` is fused into the write
    (:meth:`fuse_flip`)."""

    field_types = (RGBImageField,)
    flip = None  # (flip_prob, salt) of a fused RandomHorizontalFlip
    publishes_geometry = True  # crop boxes and fused flips, for box/mask stages (pipeline.geometry)
    mode = AUTO  # the resize mode (ffload.codecs.resize)

    def __init__(
        self,
        fast_dct: bool = False,
        *,
        device: str | None = None,
        device_share: float | str = 1.0,
        device_backend: str = "auto",
    ):
        self.fast_dct = bool(fast_dct)
        if device is not None:
            from ffload.loaders.device.stage import check_share

            check_share(device_share)
        self.device, self.device_share, self.device_backend = device, device_share, device_backend
        self.stage = None  # the DeviceImageStage when ``device`` is set, made at declare

    def fuse_flip(self, flip_prob, salt):
        self.flip = (float(flip_prob), np.uint64(salt))
        return True

    def declare(self, spec, field, view):
        self._check_field(field, view)
        jpeg.warn_if_fallback()
        out = self._declare(view)
        if self.device is None:
            return out
        from ffload.loaders.device.stage import DeviceImageStage

        self.stage = DeviceImageStage(self.device, self.device_backend, self.device_share, self.fast_dct)
        return device_spec(out, self.stage.device)

    def _declare(self, view) -> Spec:
        """The output spec, from the field's metadata of the samples ``view.selected()``."""
        raise NotImplementedError

    def _row_boxes(self, ctx: BatchContext, column) -> tuple[np.ndarray, np.ndarray | None]:
        """The batch's ``(boxes, windows)``: a new ``(B, 4) int64`` array filled by :meth:`_boxes`,
        and what it returns. Both are only read from here on."""
        boxes = np.empty((len(ctx.indices), 4), dtype=np.int64)
        return boxes, self._boxes(ctx, column["height"], column["width"], boxes)

    def _boxes(self, ctx: BatchContext, heights, widths, out) -> np.ndarray | None:
        """Fill ``out`` ``(B, 4) int64`` with the box of each row decoded (stored-image pixels); return
        ``(B, 4) float64`` the area of each row resampled to the output, inside its box
        (:func:`ffload.codecs.jpeg.decode_rows`), or None: the boxes themselves."""
        raise NotImplementedError

    def __call__(self, src, dst, ctx):
        indices = ctx.indices
        batch = len(indices)
        column = ctx.metadata
        boxes, windows = self._row_boxes(ctx, column)
        flips = np.zeros(batch, np.bool_)
        if self.flip is not None:
            flip_draws(ctx.seeds, self.flip[1], self.flip[0], flips)
        if self.stage is not None:
            out = self._on_device(ctx, column, boxes, flips)
        else:
            out = dst[:batch]
            self._on_host(ctx, column, boxes, windows, flips, out)
        if self.publish is not None:
            sizes = np.stack([column["height"][indices], column["width"][indices]], axis=1)
            published = boxes if windows is None else windows
            Geometry.publish(ctx, self.publish, published, sizes, tuple(out.shape[1:3]), flips)
        return out

    def _on_device(self, ctx, column, boxes, flips):
        try:
            return self.stage(
                ctx.indices, column, ctx.ptrs, ctx.sizes, region_array(ctx), boxes, flips, self._output_hw()
            )
        except FormatError as e:
            raise FormatError(f"field '{self.field_name}', {e}", field=self.field_name, sample=e.sample) from e

    def _output_hw(self) -> tuple[int, int]:
        """The output's ``(height, width)`` pixels."""
        raise NotImplementedError

    def _on_host(self, ctx, column, boxes, windows, flips, out) -> None:
        indices = ctx.indices
        flat_view(out)  # the kernel writes through a flat view: check the layout
        bad, code, detail = jpeg.decode_batch(
            indices,
            column,
            ctx.ptrs,
            ctx.sizes,
            region_array(ctx),
            boxes,
            flips,
            out,
            self.fast_dct,
            self.mode,
            windows,
        )
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


class SimpleRGBImageDecoder(_RGBDecoder):
    """Decode fixed-size RGB images as they are stored (FFCV's ``SimpleRGBImageDecoder``).

    Output per sample: ``(H, W, 3) uint8`` RGB, exactly the stored pixels (raw) or libjpeg-turbo's
    full-size decode (JPEG, also in mixed 'smart'/'proportion' datasets), one compiled call per
    batch (:mod:`ffload.codecs.jpeg`).

    Args:
        fast_dct: decode JPEGs with libjpeg-turbo's fast integer IDCT (``TJPARAM_FASTDCT``,
            libjpeg's ``JDCT_IFAST``), as FFCV 1.0.2 does (``TJFLAG_FASTDCT``), instead of the
            accurate default (``JDCT_ISLOW``: OpenCV's, Pillow's and torchvision's, pixel-equal
            to ``cv2.imdecode``). Faster, and within about one grey level (mean absolute
            difference) of the accurate decode: ``scripts/bench_jpeg.py --fast-dct`` measures
            both. Applies to full-scale (8/8) decodes; the OpenCV fallback ignores it.
        device: decode on this torch device (``"cuda"``, ``"cuda:1"``; experimental, see the
            GPU guide): the output is then a ``(B, H, W, 3) uint8`` tensor there, with the same crop
            boxes and flips as the CPU path (:mod:`ffload.loaders.device`); ``None``: the CPU path.
        device_share: with ``device``, the share of each batch's rows decoded there, in ``[0, 1]``
            (the rest by the CPU path at the same time, on the worker thread), or ``"auto"``: both
            halves balanced from measured per-row times (:class:`~ffload.loaders.device.stage.ShareController`).
        device_backend: with ``device``, the JPEG decoder there: ``"auto"``, ``"nvimgcodec"``,
            ``"torchvision"`` or ``"host"`` (:func:`ffload.loaders.device.codecs.select`).

    Raises:
        PipelineError: (building the pipeline) the field is not an RGBImageField, or the images to be read
            (``view.selected()``: a Loader's ``indices``) differ in size, naming two of them (use
            :class:`CenterCropRGBImageDecoder` / :class:`RandomResizedCropRGBImageDecoder`).
        FormatError: (loading) a JPEG payload is corrupt (libjpeg-turbo's message) or
            its header declares a size other than its metadata (refused before decoding, so no
            buffer is sized from it); the message names the field and sample.
        ConfigurationError: ``device_share`` outside [0, 1] and not ``"auto"``; an unknown
            ``device_backend``.
        UnavailableError: (building the pipeline) the named ``device_backend`` cannot run here.
    """

    def _declare(self, view):
        name, column, selected = self.field_name, view.metadata[self.field_name], view.selected()
        if len(selected) == 0:
            raise FormatError(f"field '{name}': the dataset has no samples")
        pair = differing_sizes(column, selected)
        if pair is not None:
            raise PipelineError(
                f"SimpleRGBImageDecoder needs images of one size, field '{name}' has several "
                f"({describe_size_mismatch(column, pair)}); use "
                "CenterCropRGBImageDecoder or RandomResizedCropRGBImageDecoder instead"
            )
        first = int(selected[0])
        self.shape = (int(column["height"][first]), int(column["width"][first]), 3)
        self._whole = None
        return Spec(self.shape, np.dtype(np.uint8))

    _whole: tuple[np.ndarray, np.ndarray] | None = None

    def _row_boxes(self, ctx, column):
        """Every row's box is the whole image: the first ``B`` rows of one pair of arrays kept by
        the decoder (boxes ``int64``, windows ``float64``; made again, longer, for a longer batch),
        so that a job of many batches allocates and fills nothing under the GIL."""
        batch = len(ctx.indices)
        whole = self._whole
        if whole is None or len(whole[0]) < batch:
            boxes = np.zeros((batch, 4), dtype=np.int64)
            boxes[:, 2], boxes[:, 3] = self.shape[0], self.shape[1]
            whole = self._whole = (boxes, boxes.astype(np.float64))
        return whole[0][:batch], whole[1][:batch]

    def _output_hw(self):
        return self.shape[0], self.shape[1]


class _ResizedCropRGBImageDecoder(_RGBDecoder):
    """Shared body of the crop decoders: boxes from one kernel per batch, then decode (DCT-scaled
    and cropped by libjpeg-turbo for JPEGs), resize and write, one compiled call per batch.

    ``output_size`` may be set between epochs (progressive resizing, FFCV's ImageNet recipe): the
    compiled kernels take the size as an argument, so nothing is compiled again; a loader given
    the decoder yields the new size from its next epoch on (``iter(loader)`` declares its
    pipelines again when an output size changed).
    ``antialias`` resizes with torchvision's antialiased bilinear (:data:`ffload.codecs.resize.TRIANGLE`)
    instead of area / linear."""

    def __init__(
        self,
        output_size: int | tuple[int, int],
        fast_dct: bool = False,
        antialias: bool = False,
        *,
        device: str | None = None,
        device_share: float | str = 1.0,
        device_backend: str = "auto",
    ):
        if antialias and device is not None:
            raise ConfigurationError(
                "antialias=True has no device path yet (device= resizes by area / linear, as the CPU default)"
            )
        super().__init__(fast_dct, device=device, device_share=device_share, device_backend=device_backend)
        self.output_size = output_size
        self.mode = TRIANGLE if antialias else AUTO

    @property
    def output_size(self) -> tuple[int, int]:
        """``(height, width)`` of the output, pixels; set it with an int (square) or a pair
        (ConfigurationError for a side below 1)."""
        return self._output_size

    @output_size.setter
    def output_size(self, value: int | tuple[int, int]) -> None:
        self._output_size = output_size_pair(value)

    def _declare(self, view):
        return Spec(self.output_size + (3,), np.dtype(np.uint8))

    def _output_hw(self):
        return self.output_size


class CenterCropRGBImageDecoder(_ResizedCropRGBImageDecoder):
    """Centre crop then resize, for images of any size (FFCV's ``CenterCropRGBImageDecoder``).

    The crop is the centred square of side ``int(ratio * min(H, W))`` (FFCV's
    ``get_center_crop``), resized to ``output_size`` by :func:`ffload.codecs.resize.resize_rgb`
    (OpenCV's ``INTER_AREA`` when shrinking, ``INTER_LINEAR`` when enlarging). JPEGs are decoded
    by libjpeg-turbo, only the box's rows and iMCU columns, at half size when the box is at least
    4x the output (see :mod:`ffload.codecs.jpeg`); a half-size decode lands on average within
    about 2 grey levels (mean absolute difference) of a full decode + the same resize of the same
    box (measurements: ``docs/developer-notes.md``).

    Args:
        output_size: ``(height, width)`` or an int (square), pixels.
        ratio: crop side / shorter image side, in (0, 1]; 224/256 by default.
        fast_dct: libjpeg-turbo's fast IDCT, as in :class:`SimpleRGBImageDecoder`.
        antialias: resize with torchvision's antialiased bilinear (Pillow's ``BILINEAR``,
            :data:`ffload.codecs.resize.TRIANGLE`) instead of area / linear; JPEGs are then decoded
            at half size only from 8x the output.
        device, device_share, device_backend: decoding on a torch device, as in
            :class:`SimpleRGBImageDecoder`.

    Output per sample: ``(height, width, 3) uint8`` RGB.

    Raises:
        PipelineError: (building the pipeline) the field is not an RGBImageField.
        ConfigurationError: bad arguments.
        UnavailableError: (building the pipeline) the named ``device_backend`` cannot run here.
        FormatError: (loading) a corrupt JPEG (libjpeg-turbo's
            message), naming the field and sample.
    """

    def __init__(
        self,
        output_size: int | tuple[int, int],
        ratio: float = 224 / 256,
        fast_dct: bool = False,
        antialias: bool = False,
        *,
        device: str | None = None,
        device_share: float | str = 1.0,
        device_backend: str = "auto",
    ):
        super().__init__(
            output_size,
            fast_dct,
            antialias,
            device=device,
            device_share=device_share,
            device_backend=device_backend,
        )
        if not 0 < ratio <= 1:
            raise ConfigurationError(f"ratio must be in (0, 1], got {ratio}")
        self.ratio = float(ratio)

    def _boxes(self, ctx, heights, widths, out):
        center_crop_boxes(ctx.indices, heights, widths, self.ratio, out)


class RandomResizedCropRGBImageDecoder(_ResizedCropRGBImageDecoder):
    """Decode RGB images with a random crop then a resize (FFCV's ``RandomResizedCropRGBImageDecoder``).

    For images of any size; boxes follow torchvision's ``RandomResizedCrop.get_params`` rule
    and are drawn in :func:`ffload.loaders.decoders.crops.random_resized_crop_boxes`.

    The box of each sample derives from ``ctx.seeds`` and :attr:`salt`. Resizing and JPEG
    reduction as in :class:`CenterCropRGBImageDecoder`.

    Args:
        output_size: ``(height, width)`` or an int (square), pixels.
        scale: ``(min, max)`` area fraction of the crop, ``0 < min <= max``.
        ratio: ``(min, max)`` aspect ratio (width / height) of the crop, ``0 < min <= max``.
        fast_dct: libjpeg-turbo's fast IDCT, as in :class:`SimpleRGBImageDecoder`.
        antialias: torchvision's antialiased bilinear, as in :class:`CenterCropRGBImageDecoder`
            (``torchvision.transforms.v2.RandomResizedCrop``'s resize: crop, then resize the crop).
        device, device_share, device_backend: decoding on a torch device, as in
            :class:`SimpleRGBImageDecoder`.

    Attributes:
        salt: ``uint64`` mixed into every sample seed, set at declare from the class and field
            names (two fields draw independent boxes).

    Output per sample: ``(height, width, 3) uint8`` RGB.

    Raises:
        PipelineError: (building the pipeline) the field is not an RGBImageField.
        ConfigurationError: bad arguments.
        UnavailableError: (building the pipeline) the named ``device_backend`` cannot run here.
        FormatError: (loading) a corrupt JPEG (libjpeg-turbo's
            message), naming the field and sample.
    """

    def __init__(
        self,
        output_size: int | tuple[int, int],
        scale: tuple[float, float] = (0.08, 1.0),
        ratio: tuple[float, float] = (3 / 4, 4 / 3),
        fast_dct: bool = False,
        antialias: bool = False,
        *,
        device: str | None = None,
        device_share: float | str = 1.0,
        device_backend: str = "auto",
    ):
        super().__init__(
            output_size,
            fast_dct,
            antialias,
            device=device,
            device_share=device_share,
            device_backend=device_backend,
        )
        scale = tuple(float(v) for v in scale)
        ratio = tuple(float(v) for v in ratio)
        if len(scale) != 2 or not 0 < scale[0] <= scale[1]:
            raise ConfigurationError(f"scale must be (min, max) with 0 < min <= max, got {scale}")
        if len(ratio) != 2 or not 0 < ratio[0] <= ratio[1]:
            raise ConfigurationError(f"ratio must be (min, max) with 0 < min <= max, got {ratio}")
        self.scale, self.ratio = scale, ratio

    def declare(self, spec, field, view):
        out = super().declare(spec, field, view)
        self.salt = op_salt(type(self).__name__, self.field_name)
        return out

    def _boxes(self, ctx, heights, widths, out):
        random_resized_crop_boxes(
            ctx.indices,
            heights,
            widths,
            ctx.seeds,
            self.salt,
            self.scale[0],
            self.scale[1],
            self.ratio[0],
            self.ratio[1],
            out,
        )


class ResizeRGBImageDecoder(_ResizedCropRGBImageDecoder):
    """Decode RGB images resized whole to ``output_size`` (torchvision's ``Resize((h, w))``).

    For images of any size. ``output_size`` is ``(height, width)``: both sides set, the aspect
    ratio is not kept; FFCV has no such decoder.

    Interpolation is :func:`ffload.codecs.resize.resize_rgb`'s, chosen per image as
    :class:`CenterCropRGBImageDecoder` does: OpenCV's ``INTER_AREA`` when neither side grows (an
    area average, which is what torchvision's bilinear ``antialias=True`` approximates when
    shrinking), ``INTER_LINEAR`` (bilinear, half-pixel centres) when a side grows; within one
    grey level of ``cv2.resize`` with that interpolation on raw images. JPEGs are decoded by
    libjpeg-turbo at half size when the box is at least 4x the output (:mod:`ffload.codecs.jpeg`),
    so they are close to, not equal to, a full decode + the same resize (on average within 2
    grey levels mean absolute difference, see :class:`CenterCropRGBImageDecoder`). Raw and JPEG
    samples alike, one compiled call per batch; a following
    :class:`~ffload.loaders.RandomHorizontalFlip` is fused.

    Args:
        output_size: ``(height, width)`` or an int (square), pixels.
        fast_dct: libjpeg-turbo's fast IDCT, as in :class:`SimpleRGBImageDecoder`.
        antialias: torchvision's antialiased bilinear, as in :class:`CenterCropRGBImageDecoder`
            (then ``torchvision.transforms.v2.Resize((height, width))``'s pixels, within a grey level).
        device, device_share, device_backend: decoding on a torch device, as in
            :class:`SimpleRGBImageDecoder`.

    Output per sample: ``(height, width, 3) uint8`` RGB.

    Raises:
        PipelineError: (building the pipeline) the field is not an RGBImageField.
        ConfigurationError: a non-positive size, or a bad ``device_share`` / ``device_backend``.
        UnavailableError: (building the pipeline) the named ``device_backend`` cannot run here.
        FormatError: (loading) a corrupt JPEG (libjpeg-turbo's
            message), naming the field and sample.
    """

    def _boxes(self, ctx, heights, widths, out):
        out[:, :2] = 0
        out[:, 2] = heights[ctx.indices]
        out[:, 3] = widths[ctx.indices]


def resized_sizes(heights, widths, size, max_size=None) -> tuple[np.ndarray, np.ndarray]:
    """torchvision's ``Resize(size, max_size)`` output sizes (``_compute_resized_output_size``) of
    images ``heights x widths`` (``(N,)`` integer arrays, pixels): ``size`` an int sets the shorter
    side, the longer becomes ``int(size * long / short)`` (then both scaled down so that the longer
    is at most ``max_size``); a ``(h, w)`` pair sets both. Returns ``(new_heights, new_widths)``
    ``int64``."""
    heights, widths = np.asarray(heights, np.int64), np.asarray(widths, np.int64)
    if not isinstance(size, (int, np.integer)):
        return np.full(heights.shape, size[0], np.int64), np.full(heights.shape, size[1], np.int64)
    short, long = np.minimum(heights, widths), np.maximum(heights, widths)
    new_short = np.full(short.shape, int(size), np.int64)
    new_long = np.floor(int(size) * long / short).astype(np.int64)
    if max_size is not None:
        over = new_long > max_size
        new_short = np.where(over, np.floor(max_size * new_short / np.maximum(new_long, 1)).astype(np.int64), new_short)
        new_long = np.where(over, max_size, new_long)
    portrait = widths <= heights
    return np.where(portrait, new_long, new_short), np.where(portrait, new_short, new_long)


class ResizeCenterCropRGBImageDecoder(_RGBDecoder):
    """Decode RGB images as torchvision's ``Resize(size, max_size)`` then ``CenterCrop(crop_size)``.

    The two leading transforms of torchvision's evaluation stacks, for images of any size: the
    resize of :func:`resized_sizes` (an int ``size`` sets the *shorter* side and keeps the aspect
    ratio), antialiased bilinear (:data:`ffload.codecs.resize.TRIANGLE_SOURCE`: Pillow's
    ``BILINEAR``, torchvision's default), then the centred ``crop_size`` window at torchvision's
    offsets (``round((new - crop) / 2)``, halves to even). Only the window is resampled: its
    output pixels have the centres and filter taps they have in the whole resized image (the taps
    reach past the window into the image), so within a grey level of torchvision's pixels (Pillow
    rounds to 8 bits between its passes). JPEGs are decoded by libjpeg-turbo, the window's rows and
    iMCU columns, at half size from 8x the output. ``crop_size=None``: no crop (the resized images
    must then share one size, as a batch needs); ``size=None``: no resize (the crop is copied).

    Args:
        size: an int (shorter side), a ``(height, width)`` pair, or None; pixels.
        crop_size: an int (square), a ``(height, width)`` pair, or None; pixels.
        max_size: the longest side after an int ``size`` resize, or None.
        fast_dct: libjpeg-turbo's fast IDCT, as in :class:`SimpleRGBImageDecoder`.
        floor_offsets: place the crop at ``(new - crop) // 2`` (Albumentations' ``CenterCrop``)
            instead of torchvision's rounding.

    ``output_size`` (the crop's, else the resize's) may be set between epochs (progressive
    resizing, as :class:`CenterCropRGBImageDecoder`): the crop takes the new size and ``size``
    scales with it (``round(size * new / old)``), so the crop keeps its share of the image.

    Output per sample: ``(height, width, 3) uint8`` RGB.

    Raises:
        ConfigurationError: sizes below 1, neither ``size`` nor ``crop_size``, ``max_size`` with a pair
            or not above ``size``. PipelineError (declare): the field is not an RGBImageField; without
            ``crop_size``, images whose resized sizes differ (naming two); a resized image smaller
            than the crop (torchvision pads it with zeros; naming the sample). FormatError (call): a
            corrupt JPEG, naming the field and sample.
    """

    mode = TRIANGLE_SOURCE

    def __init__(
        self,
        size: int | tuple[int, int] | None,
        crop_size: int | tuple[int, int] | None = None,
        max_size: int | None = None,
        fast_dct: bool = False,
        floor_offsets: bool = False,
    ):
        super().__init__(fast_dct)
        self.floor_offsets = bool(floor_offsets)
        if size is None and crop_size is None:
            raise ConfigurationError("ResizeCenterCropRGBImageDecoder needs a size, a crop_size or both")
        if isinstance(size, (int, np.integer)):
            size = int(size)
            if size < 1:
                raise ConfigurationError(f"size must be positive, got {size}")
        elif size is not None:
            size = output_size_pair(tuple(size))
        if max_size is not None and (not isinstance(size, int) or max_size <= size):
            raise ConfigurationError(f"max_size needs an int size below it, got size {size}, max_size {max_size}")
        self.size, self.max_size = size, max_size
        self.crop_size = None if crop_size is None else output_size_pair(crop_size)

    @property
    def output_size(self) -> tuple[int, int] | None:
        """The crop's ``(height, width)``, or the resize's pair; None for an int resize without a crop
        (the size is then known at declare). Setting it (progressive resizing) scales ``size`` likewise."""
        if self.crop_size is not None:
            return self.crop_size
        return None if isinstance(self.size, int) or self.size is None else self.size

    @output_size.setter
    def output_size(self, value: int | tuple[int, int]) -> None:
        new = output_size_pair(value)
        old = self.output_size
        if old is None:
            raise ConfigurationError("output_size: an int resize without a crop has no fixed size to change")
        if isinstance(self.size, int):
            self.size = max(1, round(self.size * new[0] / old[0]))
        elif self.size is not None and self.crop_size is not None:
            self.size = (max(1, round(self.size[0] * new[0] / old[0])), max(1, round(self.size[1] * new[1] / old[1])))
        elif self.size is not None:
            self.size = new
        if self.crop_size is not None:
            self.crop_size = new

    def _resized(self, heights, widths):
        if self.size is None:
            return np.asarray(heights, np.int64), np.asarray(widths, np.int64)
        return resized_sizes(heights, widths, self.size, self.max_size)

    def _declare(self, view):
        name, column, selected = self.field_name, view.metadata[self.field_name], view.selected()
        if len(selected) == 0:
            raise FormatError(f"field '{name}': the dataset has no samples")
        new_h, new_w = self._resized(column["height"][selected], column["width"][selected])
        if self.crop_size is None:
            other = np.flatnonzero((new_h != new_h[0]) | (new_w != new_w[0]))
            if other.size:
                a, b = int(selected[0]), int(selected[other[0]])
                raise PipelineError(
                    f"field '{name}': Resize({self.size}) gives samples {a} and {b} different sizes "
                    f"({new_w[0]}x{new_h[0]} and {new_w[other[0]]}x{new_h[other[0]]}); a batch needs one: add a crop_size"
                )
            return Spec((int(new_h[0]), int(new_w[0]), 3), np.dtype(np.uint8))
        small = np.flatnonzero((new_h < self.crop_size[0]) | (new_w < self.crop_size[1]))
        if small.size:
            s = int(selected[small[0]])
            raise PipelineError(
                f"field '{name}', sample {s}: resized to {new_w[small[0]]}x{new_h[small[0]]}, smaller than the "
                f"{self.crop_size[1]}x{self.crop_size[0]} crop (torchvision would pad it with zeros)"
            )
        return Spec(self.crop_size + (3,), np.dtype(np.uint8))

    def _boxes(self, ctx, heights, widths, out):
        """Each row's crop in stored-image pixels (returned), and in ``out`` the box decoded: the window
        widened by the filter's support (``max(scale, 1)`` pixels) each side, rounded outwards and
        clipped to the image; the window itself where nothing is resized."""
        h = np.asarray(heights[ctx.indices], np.int64)
        w = np.asarray(widths[ctx.indices], np.int64)
        new_h, new_w = self._resized(h, w)
        crop_h, crop_w = (new_h, new_w) if self.crop_size is None else self.crop_size
        place = np.floor if self.floor_offsets else np.round
        top = place((new_h - crop_h) / 2.0)
        left = place((new_w - crop_w) / 2.0)
        sy, sx = h / new_h, w / new_w
        windows = np.stack([top * sy, left * sx, crop_h * sy, crop_w * sx], axis=1)
        for axis, (scale, n) in enumerate(((sy, h), (sx, w))):
            start, length = windows[:, axis], windows[:, axis + 2]
            pad = np.where(scale == 1.0, 0.0, np.maximum(scale, 1.0))
            lo = np.maximum(np.floor(start - pad), 0).astype(np.int64)
            hi = np.minimum(np.ceil(start + length + pad), n).astype(np.int64)
            out[:, axis], out[:, axis + 2] = lo, hi - lo
        return windows
