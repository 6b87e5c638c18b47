"""ImageArrayField payloads in the raw layout the kernels read: the header and the PNG staging.

A raw ``ImageArrayField`` payload is a ``(height <u4, width <u4)`` header (``IMAGE_HEADER``) then
the pixels, row-major; kernels read the header with :func:`image_header`. An
``ImageArrayField(compression="png")`` stores each sample as a PNG file instead; the decoders of
ImageArrayFields (:mod:`ffload.loaders.decoders.image_array`, and
:class:`~ffload.loaders.decoders.targets.MaskDecoder`) read raw payloads through
``(indices, ptrs, sizes, region)``, and :func:`batch_payloads` hands them the same four for either
compression: the batch's own for raw fields, and for PNG fields a staging buffer holding each
sample decoded (OpenCV's ``cv2.imdecode``, ``IMREAD_UNCHANGED``; it releases the GIL, so the
loader's worker threads decode in parallel) in the raw layout. Every later step (crop, nearest
resample, flips) is then the raw path itself.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ffload.errors import FieldError, FormatError
from ffload.formats.fields.image import IMAGE_HEADER, ImageArrayField
from ffload.loaders.decoders.base import region_array
from ffload.loaders.pipeline.operation import BatchContext


@njit(nogil=True, cache=True)
def image_header(region, p):
    """The ``(height, width)`` (``int64`` each) of the raw ImageArrayField header at
    ``region[p:p + 8]`` (``<u4`` each; compiled, call it from kernels)."""
    h = np.int64(0)
    w = np.int64(0)
    for k in range(4):
        h |= np.int64(region[p + k]) << (8 * k)
        w |= np.int64(region[p + 4 + k]) << (8 * k)
    return h, w


def batch_payloads(field: ImageArrayField, ctx: BatchContext, name: str):
    """The batch's payloads in the raw ImageArrayField layout, for the decoders' kernels.

    Args:
        field: the ImageArrayField decoded. ctx: the batch. name: the field's name (errors).

    Returns:
        ``(indices, ptrs, sizes, region)``: ``ctx``'s own for a raw field; for a PNG field
        ``indices = arange(B)`` into ``ptrs``/``sizes`` ``(B,) uint64`` of a new ``uint8``
        ``region`` holding row b's header and pixels (so a kernel's failing row b is still
        sample ``ctx.indices[b]``).

    Raises:
        FormatError: a PNG that is corrupt, of another depth or channel count than the field's,
            or whose payload lies outside the data region, naming the field and sample (the
            loader turns it into a :class:`~ffload.errors.LoaderError` with that sample).
    """
    region = region_array(ctx)
    if field.compression == "raw":
        return ctx.indices, ctx.ptrs, ctx.sizes, region
    images = []
    for s in ctx.indices:
        p, n = int(ctx.ptrs[s]), int(ctx.sizes[s])
        if p < 0 or p + n > region.shape[0]:
            raise FormatError(f"field '{name}', sample {int(s)}: payload lies outside the data region")
        try:
            images.append(field.decode_png(region[p : p + n]))
        except FieldError as e:
            raise FormatError(f"field '{name}', sample {int(s)}: {e}") from e
    sizes = np.array([IMAGE_HEADER.itemsize + im.nbytes for im in images], np.uint64)
    ptrs = np.zeros(len(images), np.uint64)
    np.cumsum(sizes[:-1], out=ptrs[1:])
    staged = np.empty(int(sizes.sum()), np.uint8)
    for im, p in zip(images, ptrs.tolist()):
        staged[p : p + IMAGE_HEADER.itemsize] = np.array([im.shape[:2]], IMAGE_HEADER).view(np.uint8)
        staged[p + IMAGE_HEADER.itemsize : p + IMAGE_HEADER.itemsize + im.nbytes] = im.reshape(-1).view(np.uint8)
    return np.arange(len(images), dtype=np.int64), ptrs, sizes, staged
