"""C functions called from numba ``nopython`` code by symbol name, so the callers can be cached.

:func:`extern` makes a numba ``@intrinsic`` that declares the C symbol in the LLVM module and calls
it. The machine code refers to the symbol by name, not to an address of this process, so numba
caches it on disk (``cache=True``) and a new process binds the name again when it loads the code.
Calling a ctypes function pointer from numba instead bakes the address into the code, and numba
refuses to cache that. The symbol must be visible to LLVM's symbol resolution before the first call
compiles or loads: a shared library through :func:`llvmlite.binding.load_library_permanently`
(``turbojpeg.library``), a function of the running process through :func:`process_symbol`.
numba's on-disk cache is keyed on the calling module's source, not on this one: after changing
the code :func:`extern` generates, delete the ``__pycache__/*.nbi``/``*.nbc`` files of its users.
"""

from __future__ import annotations

import ctypes

from llvmlite import binding as llvm_binding
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

_LLVM = {"i": ir.IntType(32), "p": ir.IntType(64)}  # C int; size_t, pointer or 8-byte struct
_NUMBA = {"i": types.int32, "p": types.uint64}


def extern(symbol: str, ret: str, args: str):
    """A numba ``@intrinsic`` calling the C function ``symbol``: ``ret`` and each character of
    ``args`` is ``'i'`` (a C ``int``) or ``'p'`` (64 bits: ``size_t``, a pointer, an 8-byte struct
    passed by value). It takes integers, converts each to its C type and returns an ``int64``;
    nopython code only. Arities 1 to 6."""

    def build(argtys):
        if len(argtys) != len(args) or not all(isinstance(t, types.Integer) for t in argtys):
            return None

        def codegen(context, builder, sig, values):
            fn = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(_LLVM[ret], [_LLVM[a] for a in args]), symbol
            )
            result = builder.call(
                fn, [context.cast(builder, v, t, _NUMBA[a]) for v, t, a in zip(values, sig.args, args)]
            )
            return context.cast(builder, result, _NUMBA[ret], types.int64)

        return types.int64(*argtys), codegen

    # one fixed arity each: numba's lowering does not fold *args of an intrinsic
    by_arity = {
        1: lambda typingctx, a: build((a,)),
        2: lambda typingctx, a, b: build((a, b)),
        3: lambda typingctx, a, b, c: build((a, b, c)),
        4: lambda typingctx, a, b, c, d: build((a, b, c, d)),
        5: lambda typingctx, a, b, c, d, e: build((a, b, c, d, e)),
        6: lambda typingctx, a, b, c, d, e, f: build((a, b, c, d, e, f)),
    }
    return intrinsic(by_arity[len(args)])


def process_symbol(symbol: str) -> bool:
    """Make the running process's C function ``symbol`` (the C library's ``madvise`` ...) visible
    to LLVM under its name; call before compiled code using it is compiled or loaded. Returns
    whether the symbol exists (``False`` where the process has no such function or, as on
    Windows, no global symbol table to look in)."""
    if llvm_binding.address_of_symbol(symbol) is None:
        try:
            function = getattr(ctypes.CDLL(None), symbol)
        except (AttributeError, OSError, TypeError):
            return False
        llvm_binding.add_symbol(symbol, ctypes.cast(function, ctypes.c_void_p).value)
    return True
