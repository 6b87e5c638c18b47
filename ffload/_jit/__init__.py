"""numba/LLVM glue (private): C functions called by name from compiled code (:mod:`.cextern`) and the SIMD intrinsics the kernels use (:mod:`.simd`)."""

from __future__ import annotations
