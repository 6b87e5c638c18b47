"""libjpeg-turbo's TurboJPEG 3 API, loaded with ctypes and callable from numba ``nopython`` code.

Which library, and why
----------------------
The compiled JPEG path needs the TurboJPEG **3** API: ``tj3SetCroppingRegion`` (decode only the
rows and iMCU columns of a crop box) and ``tj3SetScalingFactor`` (DCT-domain scaling by M/8).
Candidates checked on this project's machines (Debian 12, CPython 3.11, x86_64):

* the PyPI wheel ``turbojpeg==0.0.2`` (pinned in pyproject.toml): it bundles
  ``turbojpeg.libs/libturbojpeg-<hash>.so.0.3.0`` (libjpeg-turbo 3.0 pre-release "2.1.92",
  build 20230806, needing only libc) exporting ``tj3Init``, ``tj3DecompressHeader``,
  ``tj3SetScalingFactor``, ``tj3SetCroppingRegion``, ``tj3Decompress8``, ``tj3Get``,
  ``tj3GetErrorStr``, ``tj3GetErrorCode``, ``tj3Destroy``. A pip dependency, so every install
  has it; we use only its shared library, never its Python module. **First choice.**
* the system ``libturbojpeg.so.0`` (Debian 12's ``libturbojpeg0`` 2.1.5): only the TurboJPEG 2
  API (``tjInitDecompress``, ``tjDecompressHeader3``, ``tjDecompress2``), no cropping region.
  A system library is used only when it exports the tj3 API (libjpeg-turbo >= 3.0).
* ``simplejpeg`` links libjpeg-turbo statically and exports nothing; Pillow's ``libjpeg.so.62``
  has the libjpeg API, whose ``longjmp`` error handling must not cross numba frames.

When no TurboJPEG 3 library loads (e.g. a machine without the wheel and without a registry),
:func:`library` returns ``None`` and the decoders fall back to OpenCV (see
:mod:`ffload.codecs.jpeg`), with a warning.

Calling convention
------------------
The functions are ctypes function pointers with every pointer typed as ``c_size_t`` (numba passes
``arr.ctypes.data``, an integer). ``tj3SetScalingFactor`` takes ``tjscalingfactor {int num, int
denom}`` and ``tj3SetCroppingRegion`` takes ``tjregion {int x, y, w, h}`` **by value**; under the
x86-64 System V and AArch64 procedure-call standards such 8- and 16-byte integer structs travel in
one and two integer registers, packed little-endian, so they are declared here as one and two
``c_uint64`` (see :func:`pack2`). Other ABIs are refused (the fallback is used).

From numba
----------
Compiled code calls the library through :data:`NUMBA`: one ``@intrinsic`` per function
(:func:`ffload._jit.cextern.extern`) that calls the C symbol (``tj3Get`` ...) by name, the
library having been made visible to LLVM's symbol resolution
(``llvmlite.binding.load_library_permanently``) when it was loaded. The callers can so be cached
on disk (``cache=True``): a new process loads the cached code and LLVM binds the symbols to the
library it loaded. (Calling the ctypes function pointers from numba, as before, baked this
process's addresses into the code, so numba refused to cache it and every process recompiled the
image decoders: seconds before the first batch.)
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import importlib.util
import logging
import os
import platform
from dataclasses import dataclass

from llvmlite import binding as llvm_binding
from numba import njit

from ffload._jit.cextern import extern

log = logging.getLogger(__name__)

# turbojpeg.h (libjpeg-turbo 3.0)
TJINIT_DECOMPRESS = 1
TJPARAM_STOPONWARNING = 0
TJPARAM_SUBSAMP = 4
TJPARAM_JPEGWIDTH = 5
TJPARAM_JPEGHEIGHT = 6
TJPARAM_FASTDCT = 10
TJPF_RGB = 0
TJERR_WARNING = 0
TJERR_FATAL = 1
MCU_WIDTH = (8, 16, 16, 8, 8, 32, 8)
"""``tjMCUWidth`` indexed by ``TJSAMP_444, 422, 420, GRAY, 440, 411, 441`` (pixels)."""

_SUPPORTED_ABI = {"x86_64", "AMD64", "aarch64", "arm64"}
_S = ctypes.c_size_t
_I = ctypes.c_int
_U64 = ctypes.c_uint64
_SIGNATURES = {  # name: (restype, argtypes)
    "tj3Init": (_S, (_I,)),
    "tj3Destroy": (None, (_S,)),
    "tj3Set": (_I, (_S, _I, _I)),
    "tj3Get": (_I, (_S, _I)),
    "tj3DecompressHeader": (_I, (_S, _S, _S)),
    "tj3SetScalingFactor": (_I, (_S, _U64)),
    "tj3SetCroppingRegion": (_I, (_S, _U64, _U64)),
    "tj3Decompress8": (_I, (_S, _S, _S, _S, _I, _I)),
    "tj3GetErrorCode": (_I, (_S,)),
    "tj3GetErrorStr": (ctypes.c_char_p, (_S,)),
}


@dataclass(frozen=True)
class TurboJPEG:
    """A loaded TurboJPEG 3 library: ``path`` (the shared object) and its functions as typed
    ctypes function pointers (attributes named as in ``turbojpeg.h``)."""

    path: str
    funcs: dict

    def __getattr__(self, name):
        try:
            return self.funcs[name]
        except KeyError:
            raise AttributeError(name) from None

    def error(self, handle: int) -> str:
        """``tj3GetErrorStr(handle)``: the last error of ``handle`` (or of the library for 0)."""
        raw = self.funcs["tj3GetErrorStr"](handle)
        return raw.decode("utf-8", "replace") if raw else "unknown error"


def candidate_paths() -> list[str]:
    """Shared objects to try, in order: the ``turbojpeg`` wheel's bundled library (found from the
    package's location without importing it), then the system's ``libturbojpeg``."""
    paths = []
    spec = importlib.util.find_spec("turbojpeg")
    if spec is not None and spec.origin:
        site = os.path.dirname(spec.origin)
        paths += sorted(glob.glob(os.path.join(site, "turbojpeg.libs", "libturbojpeg*.so*")))
    system = ctypes.util.find_library("turbojpeg")
    if system:
        paths.append(system)
    return paths


def _open(path: str) -> TurboJPEG | None:
    try:
        lib = ctypes.CDLL(path)
    except OSError as e:
        log.debug("cannot load %s: %s", path, e)
        return None
    funcs = {}
    for name, (restype, argtypes) in _SIGNATURES.items():
        fn = getattr(lib, name, None)
        if fn is None:
            log.debug("%s lacks %s (TurboJPEG 3 API)", path, name)
            return None
        fn.restype, fn.argtypes = restype, list(argtypes)
        funcs[name] = fn
    return TurboJPEG(path, funcs)


def load(paths: list[str] | None = None) -> TurboJPEG | None:
    """Load the first library of ``paths`` (default :func:`candidate_paths`) that exports the
    TurboJPEG 3 API; ``None`` if none does or the CPU's calling convention is not one this module
    passes structs for."""
    if platform.machine() not in _SUPPORTED_ABI:
        return None
    for path in candidate_paths() if paths is None else paths:
        lib = _open(path)
        if lib is not None:
            return lib
    return None


_LIBRARY: list = []


def library() -> TurboJPEG | None:
    """The process's TurboJPEG 3 library (:func:`load`, once, its symbols made visible to the
    code numba compiles), or ``None``."""
    if not _LIBRARY:
        lib = load()
        if lib is not None:
            llvm_binding.load_library_permanently(lib.path)
        _LIBRARY.append(lib)
    return _LIBRARY[0]


NUMBA = {
    name: extern(name, ret, args)
    for name, (ret, args) in {
        "tj3Get": ("i", "pi"),
        "tj3DecompressHeader": ("i", "ppp"),
        "tj3SetScalingFactor": ("i", "pp"),
        "tj3SetCroppingRegion": ("i", "ppp"),
        "tj3Decompress8": ("i", "ppppii"),
        "tj3GetErrorCode": ("i", "p"),
    }.items()
}
"""The functions :mod:`ffload.codecs.jpeg` calls from compiled code, by ``turbojpeg.h`` name
(C types as in :data:`_SIGNATURES`). Call :func:`library` first: without the library the symbols
do not resolve."""


@njit(cache=True)
def pack2(lo, hi):
    """Two C ``int`` packed as one 8-byte struct passed by value (``lo`` first in memory)."""
    return (hi & 0xFFFFFFFF) << 32 | (lo & 0xFFFFFFFF)
