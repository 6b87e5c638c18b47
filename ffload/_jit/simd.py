"""Vector code for compiled (numba) kernels, emitted as LLVM IR: square block transposes and the
RGB <-> RGBX byte shuffles (``shufflevector``), and the 16-bit weighted sums of the resize.

LLVM does not vectorise a transpose written as scalar loops: each element costs a load and a
store (the larger part of :mod:`.resize`'s time). These intrinsics load the ``n`` rows of an ``n x n`` block as ``n``-lane vectors, transpose them
with ``log2(n)`` levels of pairwise unpacks (the SSE2 ``punpckl*/punpckh*`` network: at level
``g`` = 1, 2, 4 ... lanes, rows ``i`` and ``i + g`` of each group of ``2g`` rows interleave in runs
of ``g`` lanes) and store the ``n`` results: a few instructions per block instead of two per element
(timings: ``docs/developer-notes.md``, ffload._jit.simd).

* :func:`transpose8_u16`: an 8 x 8 block of ``uint16`` (one 128-bit vector per row);
* :func:`transpose16_u8`: a 16 x 16 block of ``uint8``.

Nor does it vectorise the stride-3 byte loops that widen packed RGB pixels to one ``uint32``
each or narrow them back (it emits a scalar loop); one 16-byte shuffle (``pshufb``) does four pixels:

* :func:`rgb_to_rgbx4`: 16 bytes are read from ``src``, the first 12 (four RGB pixels) are
  written to ``dst`` as four little-endian ``uint32`` ``R | G << 8 | B << 16`` (16 bytes);
* :func:`rgbx_to_rgb4`: four such ``uint32`` (16 bytes) are read from ``src``, their low three
  bytes written to ``dst`` as 12 bytes of RGB, *followed by 4 zero bytes* (16 bytes written: a
  caller going left to right overwrites them with the next four pixels).

:func:`widen_rgb` and :func:`narrow_rgb` run them over a row of pixels inside bounds-checked
arrays (the rest per pixel).

Nor does it narrow a resize's multiply-adds to 16-bit lanes (it widens them to 32-bit
``pmulld``, two micro-ops for 8 lanes). The weighted sums of :mod:`.resize` are written as the
one 16-bit multiply x86 (``pmulhuw``) and ARM (``umull`` + narrowing shift) have, the high half
of an unsigned product, ``mulhi(x, w) = (x * w) >> 16``, with ``w`` a ``Q16`` weight:

Both take ``(base, offsets, weights, n, start, dst)``: ``n >= 1`` taps, each lane starting at
``start`` and summed in registers; tap ``k`` reads at ``base + offsets[k]`` (``offsets``: the
address of ``n`` ``int64`` byte offsets, ``weights``: of ``n`` ``uint16``) and adds
``mulhi(x, weights[k])``:

* :func:`weighted_sum_u8`: 32 lanes; tap ``k`` loads 32 bytes ``p`` and weighs ``x = p << 8``
  (8 fraction bits); the 32 ``uint16`` sums are stored at ``dst`` (64 bytes);
* :func:`weighted_sum_u16`: 16 lanes; tap ``k`` loads 16 ``uint16`` ``x`` (already with 8
  fraction bits); the sums are rounded half up to ``uint8``, ``(sum + 128) >> 8``, and stored at
  ``dst`` (16 bytes).

In both, every addition saturates at ``2**16 - 1`` (``llvm.uadd.sat``: ``paddusw`` / ``uqadd``),
the rounding's too: nothing wraps.

All take byte addresses (``uint64``; an array's ``ctypes.data`` plus an offset), the transposes
byte strides too, and return nothing. Nothing is checked: the caller guarantees that every byte
read or written lies inside its buffers (the ``n`` rows of ``n`` elements at ``src + r *
src_stride`` and ``dst + r * dst_stride``; the bytes each tap reads and ``dst``'s 16 or 64). Unaligned
addresses are fine (the loads and stores are ``align 1``).

numba's on-disk cache keys a function on its own source file: code cached with these intrinsics
inlined (``cache=True`` in :mod:`ffload.codecs.resize`, :mod:`ffload.loaders.transforms.color`,
:mod:`ffload.loaders.transforms.warp`) is not recompiled when only this file changes. A reinstall
touches every file; while editing, clear the ``__pycache__/*.nb[ic]`` files.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic


def unpack_network(n: int) -> list:
    """The levels of the transpose network for ``n`` (a power of two) rows of ``n`` lanes:
    per level ``(g, pairs)``, each pair ``(a, b, lo, hi)`` combining rows ``a`` and ``b`` into
    rows ``lo`` and ``hi`` with :func:`unpack_masks` ``(n, g)``."""
    levels = []
    g = 1
    while g < n:
        pairs = [
            (base + j, base + j + g, base + 2 * j, base + 2 * j + 1) for base in range(0, n, 2 * g) for j in range(g)
        ]
        levels.append((g, pairs))
        g *= 2
    return levels


def unpack_masks(n: int, g: int) -> tuple[list, list]:
    """``shufflevector`` masks over two ``n``-lane vectors ``a ++ b`` (lanes ``0..2n-1``): the
    low halves of ``a`` and ``b`` interleaved in runs of ``g`` lanes, and the high halves."""
    lo, hi = [], []
    for i in range(n // (2 * g)):
        for half, out in ((0, lo), (n // 2, hi)):
            start = half + i * g
            out += list(range(start, start + g)) + list(range(n + start, n + start + g))
    return lo, hi


def _transpose(bits: int, n: int):
    """An ``@intrinsic`` transposing an ``n x n`` block of ``bits``-bit elements."""
    vector = ir.VectorType(ir.IntType(bits), n)
    i64 = ir.IntType(64)
    levels = [
        (pairs, [ir.Constant(ir.VectorType(ir.IntType(32), n), m) for m in unpack_masks(n, g)])
        for g, pairs in unpack_network(n)
    ]

    def typer(typingctx, src, src_stride, dst, dst_stride):
        if not all(isinstance(t, types.Integer) for t in (src, src_stride, dst, dst_stride)):
            return None

        def codegen(context, builder, sig, args):
            s, ss, d, ds = (context.cast(builder, v, t, types.uint64) for v, t in zip(args, sig.args))
            byte = ir.IntType(8).as_pointer()

            def row(base, stride, r):
                at = builder.gep(builder.inttoptr(base, byte), [builder.mul(stride, ir.Constant(i64, r))])
                return builder.bitcast(at, vector.as_pointer())

            rows = [builder.load(row(s, ss, r), align=1) for r in range(n)]
            for pairs, (lo, hi) in levels:
                out = [None] * n
                for a, b, low, high in pairs:
                    out[low] = builder.shuffle_vector(rows[a], rows[b], lo)
                    out[high] = builder.shuffle_vector(rows[a], rows[b], hi)
                rows = out
            for r in range(n):
                builder.store(rows[r], row(d, ds, r), align=1)
            return context.get_dummy_value()

        return types.void(src, src_stride, dst, dst_stride), codegen

    typer.__name__ = f"transpose{n}_u{bits}"
    typer.__doc__ = f"Transpose an {n} x {n} block of uint{bits} (see the module docstring)."
    return intrinsic(typer)


transpose8_u16 = _transpose(16, 8)
transpose16_u8 = _transpose(8, 16)


def _shuffle16(name: str, mask: list):
    """An ``@intrinsic`` ``(src, dst)`` writing the 16 bytes ``shuffle(load16(src), zeros, mask)``
    at ``dst`` (lanes 16.. of ``mask`` select zero bytes)."""
    vector = ir.VectorType(ir.IntType(8), 16)
    lanes = ir.Constant(ir.VectorType(ir.IntType(32), 16), mask)
    zeros = ir.Constant(vector, None)

    def typer(typingctx, src, dst):
        if not all(isinstance(t, types.Integer) for t in (src, dst)):
            return None

        def codegen(context, builder, sig, args):
            s, d = (context.cast(builder, v, t, types.uint64) for v, t in zip(args, sig.args))
            pointer = vector.as_pointer()
            value = builder.load(builder.inttoptr(s, pointer), align=1)
            builder.store(builder.shuffle_vector(value, zeros, lanes), builder.inttoptr(d, pointer), align=1)
            return context.get_dummy_value()

        return types.void(src, dst), codegen

    typer.__name__ = name
    typer.__doc__ = f"Byte shuffle {name} (see the module docstring): lanes {mask}."
    return intrinsic(typer)


RGBX_MASK = [i for p in range(4) for i in (3 * p, 3 * p + 1, 3 * p + 2, 16)]
""":func:`rgb_to_rgbx4`'s lanes: four RGB pixels, each followed by a zero byte."""
RGB_MASK = [i for p in range(4) for i in (4 * p, 4 * p + 1, 4 * p + 2)] + [16] * 4
""":func:`rgbx_to_rgb4`'s lanes: the low three bytes of four ``uint32``, then four zero bytes."""
rgb_to_rgbx4 = _shuffle16("rgb_to_rgbx4", RGBX_MASK)
rgbx_to_rgb4 = _shuffle16("rgbx_to_rgb4", RGB_MASK)


def _splat(builder, value, vector):
    """``value`` (an integer of ``vector``'s element type) in every lane of ``vector``."""
    lanes = ir.Constant(ir.VectorType(ir.IntType(32), vector.count), [0] * vector.count)
    one = builder.insert_element(ir.Constant(vector, None), value, ir.Constant(ir.IntType(32), 0))
    return builder.shuffle_vector(one, ir.Constant(vector, None), lanes)


def _vector_intrinsic(builder, name: str, vector, args: list):
    """Call the LLVM intrinsic ``llvm.<name>.v<lanes>i16`` on ``args`` (its result: ``vector``)."""
    full = f"llvm.{name}.v{vector.count}i16"
    module = builder.module
    fn = module.globals.get(full) or ir.Function(module, ir.FunctionType(vector, [a.type for a in args]), name=full)
    return builder.call(fn, args)


def _mulhi(builder, x, weight):
    """``(x * weight) >> 16`` per lane of the ``uint16`` vector ``x`` and the ``uint16`` scalar
    ``weight``: the high half of a 16-bit product (LLVM's unsigned fixed-point multiply with scale
    16, ``llvm.umul.fix``: one ``pmulhuw`` / ``umull`` + shift per vector)."""
    return _vector_intrinsic(
        builder, "umul.fix", x.type, [x, _splat(builder, weight, x.type), ir.Constant(ir.IntType(32), 16)]
    )


def _add_sat(builder, a, b):
    """``min(a + b, 2**16 - 1)`` per lane of two ``uint16`` vectors (``llvm.uadd.sat``)."""
    return _vector_intrinsic(builder, "uadd.sat", a.type, [a, b])


def _weighted_sum(name: str, lanes: int, widen: bool):
    """The ``@intrinsic`` ``name(base, offsets, weights, n, start, dst)``: ``n >= 1`` taps of ``lanes``
    lanes summed in registers, one loop iteration per tap. ``widen``: each tap loads ``lanes`` bytes and
    shifts them to 8 fraction bits, and the ``uint16`` sums are stored as they are (:func:`weighted_sum_u8`);
    else each tap loads ``lanes`` ``uint16`` and the sums are rounded to bytes (:func:`weighted_sum_u16`)."""
    i8, i16, i64 = ir.IntType(8), ir.IntType(16), ir.IntType(64)
    v16 = ir.VectorType(i16, lanes)
    source = ir.VectorType(i8 if widen else i16, lanes)

    def typer(typingctx, base, offsets, weights, n, start, dst):
        if not all(isinstance(t, types.Integer) for t in (base, offsets, weights, n, start, dst)):
            return None

        def codegen(context, builder, sig, args):
            b, o, w, count, first, d = (context.cast(builder, v, t, types.uint64) for v, t in zip(args, sig.args))
            first = _splat(builder, builder.trunc(first, i16), v16)
            entry = builder.block
            loop = builder.function.append_basic_block("taps")
            done = builder.function.append_basic_block("taps.done")
            builder.branch(loop)
            builder.position_at_end(loop)
            k = builder.phi(i64)
            acc = builder.phi(v16)
            k.add_incoming(ir.Constant(i64, 0), entry)
            acc.add_incoming(first, entry)
            offset = builder.load(builder.gep(builder.inttoptr(o, i64.as_pointer()), [k]), align=1)
            weight = builder.load(builder.gep(builder.inttoptr(w, i16.as_pointer()), [k]), align=1)
            x = builder.load(builder.inttoptr(builder.add(b, offset), source.as_pointer()), align=1)
            if widen:
                x = builder.shl(builder.zext(x, v16), ir.Constant(v16, [8] * lanes))
            total = _add_sat(builder, acc, _mulhi(builder, x, weight))
            following = builder.add(k, ir.Constant(i64, 1))
            k.add_incoming(following, loop)
            acc.add_incoming(total, loop)
            builder.cbranch(builder.icmp_unsigned("<", following, count), loop, done)
            builder.position_at_end(done)
            if not widen:
                rounded = _add_sat(builder, total, ir.Constant(v16, [128] * lanes))
                total = builder.trunc(builder.lshr(rounded, ir.Constant(v16, [8] * lanes)), ir.VectorType(i8, lanes))
            builder.store(total, builder.inttoptr(d, total.type.as_pointer()), align=1)
            return context.get_dummy_value()

        return types.void(base, offsets, weights, n, start, dst), codegen

    typer.__name__ = name
    typer.__doc__ = f"{lanes} lanes of weighted taps summed in registers (see the module docstring)."
    return intrinsic(typer)


weighted_sum_u8 = _weighted_sum("weighted_sum_u8", 32, widen=True)
weighted_sum_u16 = _weighted_sum("weighted_sum_u16", 16, widen=False)


@njit(nogil=True, cache=True)
def widen_rgb(src, start, n, dst, dst_start):
    """``dst[dst_start + i] = R | G << 8 | B << 16`` of the ``i``-th of the ``n`` RGB pixels at
    ``src[start:]`` (1-D C-contiguous ``uint8`` and ``uint32`` arrays; the caller keeps both
    ranges inside them): four pixels per :func:`rgb_to_rgbx4` while its 16-byte read stays inside
    ``src``, the rest one by one."""
    u1, u2, u3, u4, u12, u16 = (np.uint64(1), np.uint64(2), np.uint64(3), np.uint64(4), np.uint64(12), np.uint64(16))
    s, d, end = np.uint64(start), np.uint64(dst_start), np.uint64(src.shape[0])
    src_at, dst_at = np.uint64(src.ctypes.data), np.uint64(dst.ctypes.data)
    done, count = np.uint64(0), np.uint64(n)
    while done + u4 <= count and s + u16 <= end:
        rgb_to_rgbx4(src_at + s, dst_at + u4 * d)
        s += u12
        d += u4
        done += u4
    for _ in range(done, count):
        dst[d] = np.uint32(src[s]) | (np.uint32(src[s + u1]) << 8) | (np.uint32(src[s + u2]) << 16)
        s += u3
        d += u1


@njit(nogil=True, cache=True)
def narrow_rgb(src, src_start, n, dst, start):
    """The inverse of :func:`widen_rgb`: the low three bytes of ``src[src_start:src_start + n]``
    (``uint32``) as ``3 n`` bytes of RGB at ``dst[start:]`` (``uint8``), four pixels per
    :func:`rgbx_to_rgb4` while its 16-byte write stays inside those ``3 n`` bytes (nothing after
    them is touched), the rest one by one."""
    u1, u2, u3, u4, u12, u16 = (np.uint64(1), np.uint64(2), np.uint64(3), np.uint64(4), np.uint64(12), np.uint64(16))
    s, d, count = np.uint64(src_start), np.uint64(start), np.uint64(n)
    src_at, dst_at = np.uint64(src.ctypes.data), np.uint64(dst.ctypes.data)
    done = np.uint64(0)
    while u3 * done + u16 <= u3 * count:
        rgbx_to_rgb4(src_at + u4 * s, dst_at + d)
        s += u4
        d += u12
        done += u4
    for _ in range(done, count):
        v = src[s]
        dst[d], dst[d + u1], dst[d + u2] = np.uint8(v & 255), np.uint8((v >> 8) & 255), np.uint8((v >> 16) & 255)
        s += u1
        d += u3
