"""Square block transposes for compiled (numba) code, emitted as LLVM vector shuffles.

LLVM does not vectorise a transpose written as scalar loops: each element costs a load and a
store (about 0.45 ns per element on a Zen 3 core, the larger part of :mod:`.resize`'s time).
These intrinsics load the ``n`` rows of an ``n x n`` block as ``n``-lane vectors, transpose them
with ``log2(n)`` levels of pairwise unpacks (the SSE2 ``punpckl*/punpckh*`` network: at level
``g`` = 1, 2, 4 ... lanes, rows ``i`` and ``i + g`` of each group of ``2g`` rows interleave in runs
of ``g`` lanes) and store the ``n`` results: about 0.05 ns per element.

* :func:`transpose8_u16`: an 8 x 8 block of ``uint16`` (one 128-bit vector per row);
* :func:`transpose16_u8`: a 16 x 16 block of ``uint8``.

Both take byte addresses and byte strides (``uint64``; an array's ``ctypes.data`` plus an
offset) and return nothing. Nothing is checked: the caller guarantees that the ``n`` rows of
``n`` elements at ``src + r * src_stride`` and ``dst + r * dst_stride`` lie inside its buffers.
Unaligned addresses are fine (the loads and stores are ``align 1``).

numba's on-disk cache keys a function on its own source file: code cached with these intrinsics
inlined (``cache=True`` in :mod:`.resize`) is not recompiled when only this file changes. A
reinstall touches every file; while editing, clear the ``__pycache__/*.nb[ic]`` files.
"""
from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.extending import intrinsic


def unpack_network(n: int) -> list:
    """The levels of the transpose network for ``n`` (a power of two) rows of ``n`` lanes:
    per level ``(g, pairs)``, each pair ``(a, b, lo, hi)`` combining rows ``a`` and ``b`` into
    rows ``lo`` and ``hi`` with :func:`unpack_masks` ``(n, g)``."""
    levels = []
    g = 1
    while g < n:
        pairs = [(base + j, base + j + g, base + 2 * j, base + 2 * j + 1)
                 for base in range(0, n, 2 * g) for j in range(g)]
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
    levels = [(pairs, [ir.Constant(ir.VectorType(ir.IntType(32), n), m) for m in unpack_masks(n, g)])
              for g, pairs in unpack_network(n)]

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
