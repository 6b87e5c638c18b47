"""What every decoder shares: the :class:`Decoder` base (field-type check, field name for errors)
and the helpers its kernels use to read the dataset region and write the batch buffer.

A decoder is the first operation of a field pipeline: it reads the batch's samples from the
dataset region (``ctx.region``, addressed by ``ctx.ptrs`` / ``ctx.sizes``) into the batch buffer,
one GIL-free compiled call per batch.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ffload.errors import ConfigurationError, PipelineError
from ffload.loaders.pipeline.operation import BatchContext, Operation


def field_name(field, view) -> str:
    """The name under which ``field`` (by identity) appears in ``view.fields``; ``'?'`` if absent."""
    return next((n for n, f in view.fields.items() if f is field), "?")


class Decoder(Operation):
    """Base of ffload's decoders: the field type checked at ``declare``, the field's name kept.

    The check runs at :meth:`declare`; the name serves error messages.

    Subclasses set ``field_types`` (a tuple of field classes) and call :meth:`_check_field`
    from ``declare``.
    """

    is_decoder = True
    rowwise = True  # a sample's row comes from its own payload and seed (Operation)

    def _check_field(self, field, view) -> str:
        """Return the field's name; raise PipelineError if this decoder cannot decode it."""
        name = field_name(field, view)
        if not isinstance(field, self.field_types):
            accepted = " or ".join(t.__name__ for t in self.field_types)
            raise PipelineError(
                f"{type(self).__name__} decodes {accepted} fields; field '{name}' is a {type(field).__name__}"
            )
        self.field_name = name
        return name


def region_array(ctx: BatchContext) -> np.ndarray:
    """The batch's dataset region as a plain 1-D ``uint8`` ndarray view (not an ``np.memmap``):
    numba wants base arrays, and slicing a memmap is slower."""
    return np.asarray(ctx.region)


def flat_view(array: np.ndarray) -> np.ndarray:
    """A 1-D view of a C-contiguous array, for kernels that write through it.

    Raises ConfigurationError for other layouts (a reshaped copy would silently drop the writes)."""
    if not array.flags.c_contiguous:
        raise ConfigurationError(f"expected a C-contiguous batch buffer, got strides {array.strides}")
    return array.reshape(-1)


@njit(nogil=True, cache=True)
def copy_bytes(src, src_start, dst, dst_start, n):
    """``dst[dst_start:dst_start + n] = src[src_start:src_start + n]`` on 1-D arrays (compiled;
    call it from kernels). Unsigned offsets let LLVM emit a vectorised copy, which numba's slice
    assignment does not."""
    s0 = np.uint64(src_start)
    d0 = np.uint64(dst_start)
    for k in range(np.uint64(n)):
        dst[d0 + k] = src[s0 + k]


def output_size_pair(output_size) -> tuple[int, int]:
    """A crop decoder's ``output_size`` argument as ``(height, width)`` pixels (an int is a square).

    Raises ConfigurationError: a side below 1."""
    if isinstance(output_size, (int, np.integer)):
        output_size = (output_size, output_size)
    h, w = (int(v) for v in output_size)
    if h < 1 or w < 1:
        raise ConfigurationError(f"output_size must be positive, got {output_size}")
    return h, w
