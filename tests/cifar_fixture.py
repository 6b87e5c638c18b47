"""Write folders in the exact layout and pickle structure of the official CIFAR "python version" archives.

The official files were written by Python 2 ``cPickle`` with protocol 2: dict keys and strings are Python 2
``str`` (opcodes ``SHORT_BINSTRING``/``BINSTRING``, read back as ``bytes`` with ``encoding='bytes'`` or as ``str``
with ``encoding='latin1'``), labels are lists of ints, and ``data`` is a numpy array pickled through the globals
``numpy.core.multiarray._reconstruct``, ``numpy.ndarray`` and ``numpy.dtype``. Python 3's pickler cannot produce
that (its protocol 2 writes ``bytes`` through ``_codecs.encode`` and numpy 2 names ``numpy._core``), so the opcodes
are emitted here directly. Used by the tests and by ``scripts/make_cifar_like.py``.
"""

from __future__ import annotations

import os
import struct

import numpy as np

CIFAR10_LABEL_NAMES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
"""The official CIFAR-10 class names, in label order."""

_README = b'<meta HTTP-EQUIV="REFRESH" content="0; URL=http://www.cs.toronto.edu/~kriz/cifar.html">\n'


class _Global:
    """A ``GLOBAL`` opcode: ``c<module>\\n<name>\\n``."""

    def __init__(self, module: str, name: str):
        self.module, self.name = module, name


class _Reduce:
    """``callable``, ``args``, ``REDUCE``, then ``state`` and ``BUILD`` (what ``__reduce__`` triples become)."""

    def __init__(self, callable_: _Global, args: tuple, state: tuple):
        self.callable, self.args, self.state = callable_, args, state


def _uint8_array(array: np.ndarray) -> _Reduce:
    """A C-contiguous uint8 array as numpy 1.x under Python 2 reduces it: ``numpy.core.multiarray._reconstruct(
    numpy.ndarray, (0,), 'b')`` then ``__setstate__((1, shape, dtype('u1'), False, raw bytes))``."""
    if array.dtype != np.uint8:
        raise TypeError(f"the CIFAR files hold uint8 arrays only, got {array.dtype}")
    dtype = _Reduce(_Global("numpy", "dtype"), ("u1", 0, 1), (3, "|", None, None, None, -1, -1, 0))
    state = (1, tuple(int(s) for s in array.shape), dtype, False, np.ascontiguousarray(array).tobytes())
    return _Reduce(_Global("numpy.core.multiarray", "_reconstruct"), (_Global("numpy", "ndarray"), (0,), "b"), state)


def _emit(out: bytearray, obj) -> None:
    """Append the protocol-2 opcodes of ``obj`` as Python 2 cPickle writes them (without memo entries)."""
    if obj is None:
        out += b"N"
    elif isinstance(obj, bool):
        out += b"\x88" if obj else b"\x89"
    elif isinstance(obj, int):
        if 0 <= obj < 256:
            out += b"K" + bytes([obj])
        elif 0 <= obj < 65536:
            out += b"M" + struct.pack("<H", obj)
        else:
            out += b"J" + struct.pack("<i", obj)
    elif isinstance(obj, (bytes, str)):  # a Python 2 str
        data = obj.encode("latin-1") if isinstance(obj, str) else obj
        out += (b"U" + bytes([len(data)]) if len(data) < 256 else b"T" + struct.pack("<i", len(data))) + data
    elif isinstance(obj, tuple):
        if len(obj) > 3:
            out += b"("
        for item in obj:
            _emit(out, item)
        out += (b")", b"\x85", b"\x86", b"\x87")[len(obj)] if len(obj) <= 3 else b"t"
    elif isinstance(obj, list):
        out += b"]"
        for start in range(0, len(obj), 1000):  # cPickle appends in batches of 1000
            out += b"("
            for item in obj[start : start + 1000]:
                _emit(out, item)
            out += b"e"
    elif isinstance(obj, dict):
        out += b"}("
        for key, value in obj.items():
            _emit(out, key)
            _emit(out, value)
        out += b"u"
    elif isinstance(obj, np.ndarray):
        _emit(out, _uint8_array(obj))
    elif isinstance(obj, _Global):
        out += f"c{obj.module}\n{obj.name}\n".encode()
    elif isinstance(obj, _Reduce):
        _emit(out, obj.callable)
        _emit(out, obj.args)
        out += b"R"
        _emit(out, obj.state)
        out += b"b"
    else:
        raise TypeError(f"cannot emit {type(obj).__name__}")


def py2_pickle(obj) -> bytes:
    """``obj`` (dicts, lists, tuples, ints, bytes/str, None, bools, uint8 arrays) pickled as Python 2 cPickle
    protocol 2 would, strings as Python 2 ``str``."""
    out = bytearray(b"\x80\x02")
    _emit(out, obj)
    out += b"."
    return bytes(out)


def _check_images(images, labels, what: str) -> tuple[np.ndarray, list[int]]:
    images = np.asarray(images)
    if images.dtype != np.uint8 or images.ndim != 4 or images.shape[1:] != (32, 32, 3):
        raise ValueError(f"{what} images must be (N, 32, 32, 3) uint8, got {images.dtype} {images.shape}")
    labels = [int(v) for v in np.asarray(labels).reshape(-1)]
    if len(labels) != len(images):
        raise ValueError(f"{what}: {len(images)} images but {len(labels)} labels")
    return images, labels


def _rows(images: np.ndarray) -> np.ndarray:
    """``(N, 32, 32, 3)`` HWC RGB -> ``(N, 3072)``: the 1024 red, then green, then blue values of each image."""
    return np.ascontiguousarray(images.transpose(0, 3, 1, 2).reshape(len(images), 3072))


def _filenames(labels, names, start: int) -> list[bytes]:
    return [f"{names[label]}_s_{start + i:06d}.png".encode() for i, label in enumerate(labels)]


def _dump(path: str, obj) -> None:
    with open(path, "wb") as f:
        f.write(py2_pickle(obj))


def write_cifar10_folder(
    root, train_images, train_labels, test_images, test_labels, label_names=CIFAR10_LABEL_NAMES
) -> str:
    """Write ``root/{data_batch_1..5, test_batch, batches.meta, readme.html}`` like ``cifar-10-batches-py``.

    Args:
        root: the folder to write (created).
        train_images, test_images: ``(N, 32, 32, 3) uint8`` RGB; the train images are split in file order into
            5 batches with ``np.array_split`` (10000 each for the real 50000).
        train_labels, test_labels: ``(N,)`` ints.
        label_names: class names, in label order.
    Returns:
        ``root`` as ``str``.
    """
    train_images, train_labels = _check_images(train_images, train_labels, "train")
    test_images, test_labels = _check_images(test_images, test_labels, "test")
    root = os.fspath(root)
    os.makedirs(root, exist_ok=True)
    bounds = np.cumsum([0] + [len(p) for p in np.array_split(np.arange(len(train_images)), 5)])
    for b in range(5):
        lo, hi = int(bounds[b]), int(bounds[b + 1])
        _dump(
            os.path.join(root, f"data_batch_{b + 1}"),
            {
                b"batch_label": f"training batch {b + 1} of 5".encode(),
                b"labels": train_labels[lo:hi],
                b"data": _rows(train_images[lo:hi]),
                b"filenames": _filenames(train_labels[lo:hi], label_names, lo),
            },
        )
    _dump(
        os.path.join(root, "test_batch"),
        {
            b"batch_label": b"testing batch 1 of 1",
            b"labels": test_labels,
            b"data": _rows(test_images),
            b"filenames": _filenames(test_labels, label_names, 0),
        },
    )
    _dump(
        os.path.join(root, "batches.meta"),
        {
            b"num_cases_per_batch": int(bounds[1] - bounds[0]),
            b"label_names": [n.encode() for n in label_names],
            b"num_vis": 3072,
        },
    )
    with open(os.path.join(root, "readme.html"), "wb") as f:
        f.write(_README)
    return root


def write_cifar100_folder(
    root,
    train_images,
    train_fine,
    train_coarse,
    test_images,
    test_fine,
    test_coarse,
    fine_names=None,
    coarse_names=None,
) -> str:
    """Write ``root/{train, test, meta}`` like ``cifar-100-python``.

    Args:
        root: the folder to write (created).
        train_images, test_images: ``(N, 32, 32, 3) uint8`` RGB.
        train_fine, train_coarse, test_fine, test_coarse: ``(N,)`` ints.
        fine_names, coarse_names: class names; default ``fine_00..fine_99`` and ``coarse_00..coarse_19`` (the
            official counts).
    Returns:
        ``root`` as ``str``.
    """
    fine_names = fine_names or [f"fine_{i:02d}" for i in range(100)]
    coarse_names = coarse_names or [f"coarse_{i:02d}" for i in range(20)]
    root = os.fspath(root)
    os.makedirs(root, exist_ok=True)
    for split, images, fine, coarse in (
        ("train", train_images, train_fine, train_coarse),
        ("test", test_images, test_fine, test_coarse),
    ):
        images, fine = _check_images(images, fine, split)
        _, coarse = _check_images(images, coarse, split)
        _dump(
            os.path.join(root, split),
            {
                b"filenames": _filenames(fine, fine_names, 0),
                b"batch_label": f"{'training' if split == 'train' else 'testing'} batch 1 of 1".encode(),
                b"fine_labels": fine,
                b"coarse_labels": coarse,
                b"data": _rows(images),
            },
        )
    _dump(
        os.path.join(root, "meta"),
        {
            b"fine_label_names": [n.encode() for n in fine_names],
            b"coarse_label_names": [n.encode() for n in coarse_names],
        },
    )
    return root
