"""Write the vendored intersphinx inventories (python.inv, numpy.inv, torch.inv) that docs/conf.py reads.

The real ``objects.inv`` files are served by the projects' documentation sites, which neither CI nor our machines
can reach, and no package on the registry ships them. So these inventories are written here, with sphobjinv
(``pip install sphobjinv``), and list exactly the external names ffload's docstrings and pages refer to, each
with the address the project's own inventory gives it. A reference to a name missing here fails the nitpicky
docs build: add the name below and run ``python docs/_intersphinx/make_inventories.py``.
"""

from __future__ import annotations

import builtins
from pathlib import Path

import sphobjinv as soi

HERE = Path(__file__).resolve().parent

PY_TYPES = ["bool", "bytearray", "bytes", "dict", "float", "frozenset", "int", "list", "memoryview", "object"]
PY_TYPES += ["range", "set", "slice", "str", "tuple", "type"]
PY_EXCEPTIONS = sorted(n for n, v in vars(builtins).items() if isinstance(v, type) and issubclass(v, BaseException))
PY_MODULES = ["json", "faulthandler", "mmap", "os", "pickle", "signal", "tarfile", "threading", "zlib", "logging"]
PY_OBJECTS = [  # (name, role, page)
    ("None", "data", "library/constants.html"),
    ("os.PathLike", "class", "library/os.html"),
    ("enum.Enum", "class", "library/enum.html"),
    ("enum.IntEnum", "class", "library/enum.html"),
    ("pathlib.Path", "class", "library/pathlib.html"),
    ("collections.abc.Callable", "class", "library/collections.abc.html"),
    ("collections.abc.Iterable", "class", "library/collections.abc.html"),
    ("collections.abc.Iterator", "class", "library/collections.abc.html"),
    ("collections.abc.Mapping", "class", "library/collections.abc.html"),
    ("collections.abc.Sequence", "class", "library/collections.abc.html"),
    ("typing.Any", "data", "library/typing.html"),
    ("typing.Literal", "data", "library/typing.html"),
    ("typing.Protocol", "class", "library/typing.html"),
    ("logging.Logger", "class", "library/logging.html"),
    ("threading.Thread", "class", "library/threading.html"),
    ("concurrent.futures.ThreadPoolExecutor", "class", "library/concurrent.futures.html"),
]
PY_OBJECTS += [(n, "class", "library/functions.html") for n in PY_TYPES]
PY_OBJECTS += [(n, "exception", "library/exceptions.html") for n in PY_EXCEPTIONS]
PY_OBJECTS += [(m, "module", f"library/{m}.html") for m in PY_MODULES]

NUMPY_OBJECTS = [
    ("numpy.ndarray", "class", "reference/generated/numpy.ndarray.html"),
    ("numpy.dtype", "class", "reference/generated/numpy.dtype.html"),
    ("numpy.memmap", "class", "reference/generated/numpy.memmap.html"),
    ("numpy.void", "class", "reference/arrays.scalars.html"),
    ("numpy.uint8", "class", "reference/arrays.scalars.html"),
    ("numpy.uint16", "class", "reference/arrays.scalars.html"),
    ("numpy.uint64", "class", "reference/arrays.scalars.html"),
    ("numpy.int64", "class", "reference/arrays.scalars.html"),
    ("numpy.float32", "class", "reference/arrays.scalars.html"),
    ("numpy.typing.DTypeLike", "data", "reference/typing.html"),
    ("numpy.typing.ArrayLike", "data", "reference/typing.html"),
    ("numpy.typing.NDArray", "data", "reference/typing.html"),
]
# type aliases appear in signatures as classes (autodoc's py:class role): listed under both roles
NUMPY_OBJECTS += [(name, "class", page) for name, role, page in NUMPY_OBJECTS if role == "data"]

TORCH_OBJECTS = [
    ("torch.Tensor", "class", "tensors.html"),
    ("torch.dtype", "class", "tensor_attributes.html"),
    ("torch.device", "class", "tensor_attributes.html"),
    ("torch.Generator", "class", "generated/torch.Generator.html"),
    ("torch.utils.data.DataLoader", "class", "data.html"),
    ("torch.utils.data.Dataset", "class", "data.html"),
    ("torch.utils.data.distributed.DistributedSampler", "class", "data.html"),
    ("torch.nn.Module", "class", "generated/torch.nn.Module.html"),
]


def write(path: Path, project: str, version: str, objects: list[tuple[str, str, str]]) -> None:
    """One zlib-compressed Sphinx inventory (version 2) at ``path``, an anchor per name (``page#name``;
    ``page#module-name`` for a module, as Sphinx writes them)."""
    inv = soi.Inventory()
    inv.project, inv.version = project, version
    for name, role, page in objects:
        anchor = f"module-{name}" if role == "module" else name
        inv.objects.append(
            soi.DataObjStr(name=name, domain="py", role=role, priority="1", uri=f"{page}#{anchor}", dispname="-")
        )
    soi.writebytes(path, soi.compress(inv.data_file(contract=True)))


INVENTORIES = {  # file stem -> (project, version, objects)
    "python": ("Python", "3", PY_OBJECTS),
    "numpy": ("NumPy", "2", NUMPY_OBJECTS),
    "torch": ("PyTorch", "2", TORCH_OBJECTS),
}

if __name__ == "__main__":
    for stem, (project, version, objects) in INVENTORIES.items():
        write(HERE / f"{stem}.inv", project, version, objects)
