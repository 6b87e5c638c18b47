"""Export a dataset (``.beton`` or LMDB) to WebDataset tar shards, for users moving to streaming.

Each sample ``i`` becomes the members ``<key>.<ext>`` of one key, in sample order (WebDataset's
layout; see :mod:`ffload.convert.sources.webdataset`, which reads them back). The key keeps the
sample's provenance where the dataset records it (:mod:`ffload.formats.origins`,
:func:`~ffload.formats.origins.origin_key`): the source's WebDataset ``__key__``, an ImageFolder
file's path without its extension (``cat/img_0001``), or a row/index as 8 digits; a dataset without
provenance (ffcv's files, older ffload files) gets ``%08d`` of the sample number. Keys that would
repeat (``x.jpg`` and ``x.png`` in one folder, one key in two source shards) get ``-<sample
number>`` appended, so every key is unique; finding them costs 8 bytes per sample (a hash), not
a set of strings. A key never leads outside the shard's folder: its empty, ``.`` and ``..`` path
parts (and so a leading ``/``) are dropped, and a key left empty becomes ``%08d`` of the sample
number. Members are written in the POSIX.1-2001 (pax) tar format, which holds names of any length
(webdataset and ``tarfile`` read it).

* the first :class:`~ffload.formats.RGBImageField`: ``jpg`` — the stored JPEG bytes, not
  re-encoded — or ``png`` for a raw image (lossless, so pixels survive the round trip);
* an :class:`~ffload.formats.IntField` named ``label``: ``cls`` (ASCII integer);
* every other field ``name``: ``name.jpg``/``name.png`` (images), ``name.txt`` (int, float),
  ``name.json`` (JSON), ``name.bin`` (bytes), ``name.npy`` (NDArray, RaggedArray ``(K, ...)``,
  ImageArray ``(H, W, C)``: numpy's ``.npy`` format without pickle).

Shards follow ``pattern`` (a ``%``-format of the shard number, as WebDataset's ``ShardWriter``),
each closed at ``maxcount`` samples or ``maxsize`` bytes, whichever comes first. A shard is
written under a temporary name and renamed when complete; an error removes every shard of the
run, so the output appears only whole.
"""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
from collections.abc import Iterator

import cv2
import numpy as np

from ffload.convert.sources import SourceError
from ffload.errors import ConfigurationError
from ffload.formats import DatasetView
from ffload.formats.dataset_origins import dataset_origins
from ffload.formats.fields.bytes import BytesExtensionField, BytesField, JSONField
from ffload.formats.fields.image import JPG, RGBImageField
from ffload.formats.fields.ndarray import NDArrayField
from ffload.formats.fields.scalars import FloatField, IntField
from ffload.formats.origins import origin_key
from ffload.formats.shardio import check_mapping


def _members(view: DatasetView, i: int, region, image_name: str | None) -> Iterator[tuple[str, bytes]]:
    """``(extension, bytes)`` of every field of sample ``i``."""
    for name, field in view.fields.items():
        if isinstance(field, RGBImageField):
            meta = view.metadata[name][i]
            data = view.payload(name, i, region)
            if int(meta["mode"]) == JPG:
                ext, blob = "jpg", data.tobytes()
            else:
                rgb = np.asarray(data).reshape(int(meta["height"]), int(meta["width"]), 3)
                ok, png = cv2.imencode(".png", cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR))
                if not ok:
                    raise SourceError(f"{view.path}: sample {i}, field {name!r}: PNG encoding failed")
                ext, blob = "png", png.tobytes()
            yield (ext if name == image_name else f"{name}.{ext}"), blob
        elif isinstance(field, IntField) and name == "label":
            yield "cls", str(int(view.metadata[name][i])).encode()
        elif isinstance(field, (IntField, FloatField)):
            yield f"{name}.txt", repr(view.metadata[name][i].item()).encode()
        elif isinstance(field, JSONField):
            yield f"{name}.json", view.payload(name, i, region).tobytes().rstrip(b"\0")
        elif isinstance(field, BytesExtensionField):  # ragged arrays, N-channel images
            yield f"{name}.npy", _npy(field.to_array(view.payload(name, i, region)))
        elif isinstance(field, BytesField):
            yield f"{name}.bin", view.payload(name, i, region).tobytes()
        elif isinstance(field, NDArrayField):
            yield (
                f"{name}.npy",
                _npy(np.frombuffer(view.payload(name, i, region), dtype=field.dtype).reshape(field.shape)),
            )


ORIGIN_BATCH = 4096  # origins read per range read


def sample_keys(view: DatasetView) -> Iterator[str]:
    """The WebDataset key of every sample of ``view``, in order (see the module docstring); reads
    the origins twice (once to find the keys that repeat, by 64-bit hash), keeps no string list.

    Raises:
        DatasetError: (``ffload.errors.FormatError``) the dataset's origin block is corrupt or its
            count is not the sample count (:func:`~ffload.formats.origins.dataset_origins`), raised
            before the first key.
    """
    origins = dataset_origins(view)
    if origins is None:
        yield from (f"{i:08d}" for i in range(view.num_samples))
        return

    def keys() -> Iterator[str]:
        for start in range(0, len(origins), ORIGIN_BATCH):
            for i, origin in enumerate(origins.strings(start, min(len(origins), start + ORIGIN_BATCH)), start):
                yield _contained(origin_key(origins.descriptor, origin), i)

    def digest(key: str) -> int:
        return int.from_bytes(hashlib.blake2b(key.encode("utf8", "surrogateescape"), digest_size=8).digest(), "little")

    hashes = np.fromiter((digest(k) for k in keys()), dtype=np.uint64, count=len(origins))
    values, counts = np.unique(hashes, return_counts=True)
    repeated = set(values[counts > 1].tolist())
    for i, key in enumerate(keys()):
        yield f"{key}-{i:08d}" if repeated and digest(key) in repeated else key


def _contained(key: str, i: int) -> str:
    """``key`` without its empty, ``.`` and ``..`` ``/``-separated parts (a member name that stays
    inside the folder it is extracted to); ``%08d`` of ``i`` when nothing is left."""
    return "/".join(part for part in key.split("/") if part not in ("", ".", "..")) or f"{i:08d}"


def _npy(array: np.ndarray) -> bytes:
    """``array`` in numpy's ``.npy`` format (no pickle)."""
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return buf.getvalue()


def export_webdataset(
    view: DatasetView, pattern: str, maxcount: int = 100_000, maxsize: int = 3_000_000_000, progress: bool = False
) -> list[str]:
    """Write every sample of ``view`` to WebDataset shards named ``pattern % shard_number``.

    Args:
        view: an open dataset (:func:`ffload.formats.open_dataset`).
        pattern: e.g. ``'out/train-%06d.tar'``; its directory is created.
        maxcount: samples per shard at most (>= 1).
        maxsize: bytes of member data per shard at most (a sample larger than it gets a shard
            of its own).
        progress: a tqdm bar.

    Returns:
        The shard paths written, in order.

    Raises:
        ffload.errors.ConfigurationError: ``pattern`` without one ``%d``-style field, or non-positive limits.
        OSError: the output cannot be written (no shard of this run is left behind).
        FormatError: the dataset's data file shrank while it was read (named; likewise nothing left).
    """
    try:
        first = pattern % 0
    except TypeError:
        raise ConfigurationError(f"pattern {pattern!r} needs one %d-style field for the shard number") from None
    if first == pattern % 1 or maxcount < 1 or maxsize < 1:
        raise ConfigurationError(f"pattern {pattern!r} must vary with the shard number; limits must be >= 1")
    os.makedirs(os.path.dirname(os.path.abspath(first)), exist_ok=True)
    image_name = next((n for n, f in view.fields.items() if isinstance(f, RGBImageField)), None)
    region = view.open_region()
    written: list[str] = []
    tar, tmp, count, size = None, None, 0, 0
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=view.num_samples, unit="sample", desc=f"export {os.path.basename(view.path)}")

    def close():
        tar.close()
        check_mapping(region)  # the dataset shrank while it was read: no shard of zeros
        final = pattern % len(written)
        os.replace(tmp, final)
        written.append(final)

    try:
        for i, key in enumerate(sample_keys(view)):
            members = list(_members(view, i, region, image_name))
            sample_bytes = sum(len(b) for _, b in members)
            if tar is not None and (count >= maxcount or (count and size + sample_bytes > maxsize)):
                close()
                tar = None
            if tar is None:
                tmp = f"{pattern % len(written)}.tmp{os.getpid()}"
                tar = tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT)
                count = size = 0
            for ext, blob in members:
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size, info.mode, info.mtime = len(blob), 0o444, 0
                tar.addfile(info, io.BytesIO(blob))
            count += 1
            size += sample_bytes
            if bar is not None:
                bar.update(1)
        if tar is not None:
            close()
    except BaseException:
        if tar is not None:
            tar.close()
            os.unlink(tmp)
        for path in written:
            os.unlink(path)
        raise
    finally:
        if bar is not None:
            bar.close()
    return written
