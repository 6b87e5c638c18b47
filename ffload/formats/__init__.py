"""On-disk formats, both directions: FFCV's ``.beton`` v2, ffload's LMDB schema, and sharded
datasets (a directory of ``.beton`` shards and a JSON manifest, ``shards.py``).

``open_dataset(path)`` returns the :class:`DatasetView` the loader reads; ``dataset_writer`` and
``write_dataset`` create files atomically. See ``beton.py`` and ``lmdb/`` (its package docstring) for the layouts.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence

import numpy as np

from ffload.errors import ConfigurationError, FieldError
from ffload.formats.atomic import dataset_writer, format_for_path
from ffload.formats.beton import open_beton
from ffload.formats.fields.base import Field
from ffload.formats.fields.bytes import BytesField, JSONField
from ffload.formats.fields.image import ImageArrayField, RGBImageField, image_sizes
from ffload.formats.fields.ndarray import NDArrayField, RaggedArrayField
from ffload.formats.fields.scalars import FloatField, IntField
from ffload.formats.lmdb.reader import open_lmdb
from ffload.formats.shards import is_sharded, manifest_location, open_sharded
from ffload.formats.view import DatasetError, DatasetView
from ffload.limits import DEFAULT_MAX_PIXELS
from ffload.storage import is_remote

LMDB_MAGIC = b"\xde\xc0\xef\xbe"  # MDB_meta.mm_magic (0xBEEFC0DE) after the 16-byte page header

__all__ = [
    "open_dataset",
    "write_dataset",
    "dataset_writer",
    "format_for_path",
    "DatasetView",
    "DatasetError",
    "Field",
    "FieldError",
    "RGBImageField",
    "IntField",
    "FloatField",
    "BytesField",
    "NDArrayField",
    "JSONField",
    "RaggedArrayField",
    "ImageArrayField",
    "image_sizes",
]


def open_dataset(
    path: str, max_pixels: int | None = DEFAULT_MAX_PIXELS, storage_options: dict | None = None
) -> DatasetView:
    """Open a ``.beton`` file, an LMDB directory or a sharded dataset (format detected from the contents).

    The LMDB directory is an ffload one; the format comes from the contents, not the name.

    Args:
        path: the ``.beton`` file or LMDB directory, a sharded dataset's directory or its
            ``manifest.json`` (:mod:`.shards`: one view, global indices, the shards' payloads in
            one virtual region), or the URL of a ``.beton`` or of a sharded dataset (its prefix
            or ``.../manifest.json``) on object storage
            (``s3://bucket/key.beton``, :mod:`ffload.storage`): its header, field descriptors,
            metadata table and allocation table are read with a few range requests, and the
            view (the same fields, ptrs, sizes, page_size as for the local file) has
            ``remote`` set and no ``data_path`` (payloads are read through ``ffload.Loader``).
        storage_options: for a URL, the filesystem's options (credentials, ``endpoint_url``; see
            :func:`ffload.storage.open_filesystem`).
        max_pixels: refuse a dataset whose metadata declares an image (:class:`RGBImageField`)
            of more pixels, so that no decoder, ``verify`` or ``inspect --grid`` allocates for a
            hostile header (default :data:`~ffload.limits.DEFAULT_MAX_PIXELS`; ``None``: no limit).

    Raises:
        DatasetError: missing path, or not a dataset (with the cause: truncated, wrong version,
            LMDB without ffload's metadata record, offsets outside the file, an image above
            ``max_pixels`` naming its sample, ...).
        ConfigurationError: an LMDB URL (LMDB is read through a local memory map: not from
            object storage), or fsspec/s3fs missing for a URL.
        StorageError: a URL whose object is missing, denied, or unreachable (named).
    """
    path = os.fspath(path)
    if is_remote(path):
        view = _open_remote(path, storage_options)
    elif not os.path.exists(path):
        raise DatasetError(f"{path}: no such file or directory")
    elif is_sharded(path):
        view = open_sharded(path)
    elif (
        os.path.isdir(path)
        and not os.path.exists(os.path.join(path, "data.mdb"))
        and any(name.endswith(".beton") for name in os.listdir(path))
    ):
        raise DatasetError(
            f"{path}: holds .beton files but no manifest.json: not a (complete) sharded dataset; "
            "open one of its .beton files, or convert again",
            path=path,
        )
    elif os.path.isdir(path):
        view = open_lmdb(path)
    else:
        with open(path, "rb") as fp:
            head = fp.read(20)
        if head[16:20] == LMDB_MAGIC:
            raise DatasetError(f"{path}: looks like an LMDB data file; open its directory instead")
        view = open_beton(path)
    if max_pixels is not None:
        _check_image_pixels(view, max_pixels)
    return view


def _refuse_remote_lmdb(url: str) -> ConfigurationError:
    return ConfigurationError(
        f"{url}: LMDB datasets cannot be read from object storage: LMDB reads its data.mdb "
        "through a local memory map (mmap), which a remote object does not have",
        path=url,
        hint="convert it to .beton (ffload convert), or download the directory",
    )


def _open_remote(url: str, storage_options: dict | None) -> DatasetView:
    """The view of a remote ``.beton`` (see :func:`open_dataset`)."""
    from ffload.storage import RemoteObject

    if url.rstrip("/").endswith((".lmdb", "/data.mdb")):
        raise _refuse_remote_lmdb(url)
    if url.rstrip("/").endswith("/manifest.json") or url.endswith("/"):
        return open_sharded(url, storage_options)
    if not url.endswith(".beton"):  # a prefix holding a manifest, or an object
        from ffload.storage import remote_exists

        if remote_exists(manifest_location(url, True)[0], storage_options):
            return open_sharded(url, storage_options)
    remote = RemoteObject(url, storage_options)
    if remote.size >= 20 and remote.read(16, 20) == LMDB_MAGIC:
        raise _refuse_remote_lmdb(url)
    return open_beton(url, source=remote)


def _check_image_pixels(view: DatasetView, max_pixels: int) -> None:
    """DatasetError naming the first sample whose image metadata declares more than ``max_pixels``
    pixels (``height * width`` from :func:`image_sizes`; O(N), no payload read)."""
    for name, field in view.fields.items():
        if not isinstance(field, RGBImageField) or view.num_samples == 0:
            continue
        sizes = image_sizes(view.metadata[name], distinct=False)
        pixels = sizes[:, 0] * sizes[:, 1]
        worst = int(np.argmax(pixels > max_pixels))
        if pixels[worst] > max_pixels:
            height, width = (int(v) for v in sizes[worst])
            raise DatasetError(
                f"{view.path}: sample {worst}, field {name!r}: its metadata declares a "
                f"{width}x{height} image ({height * width:,} pixels), above the limit of "
                f"{max_pixels:,} pixels (corrupt or hostile; pass max_pixels= / "
                f"--max-pixels to allow it)",
                path=view.path,
                field=name,
                sample=worst,
            )


def write_dataset(
    dst: str,
    fields: dict[str, Field],
    samples: Iterable[Sequence],
    num_samples: int,
    overwrite: bool = False,
    page_size: int | None = None,
    info: dict | None = None,
    shard_size: int | str | None = None,
) -> str:
    """Encode ``samples`` in this process and write them to ``dst`` atomically.

    ``samples`` are tuples of values in field order; ``dst`` is ``.beton`` or ``.lmdb`` by suffix
    (with ``shard_size`` (bytes or ``"1GB"``) a directory of ``.beton`` shards and a manifest,
    :mod:`.shards`). For large image datasets use
    :func:`ffload.convert.convert_dataset`, which encodes in parallel. ``info`` is a dataset-level
    JSON object read back as ``open_dataset(dst).info`` (e.g. ``{"classes": names}``).

    Args:
        dst: the output path (``.beton``, ``.lmdb``, or a shard directory with ``shard_size``).
        fields: field name -> :class:`~ffload.formats.fields.Field`, in field order.
        samples: ``num_samples`` tuples of values, one per field in field order.
        num_samples: how many samples ``samples`` yields.
        overwrite: replace an existing ``dst`` (atomically, once the new one is complete).
        page_size: ``.beton`` page size in bytes (a power of two); None: the default (8 MiB).
        info: dataset-level JSON object; None: ``{}``.
        shard_size: bytes per shard, or a size string (``"1GB"``); None: one file.

    Returns:
        ``dst``.

    Raises:
        FieldError: a value does not fit its field (the message names the sample index).
        FileExistsError, ValueError: see :func:`dataset_writer`.
    """
    flist = list(fields.values())
    with dataset_writer(dst, fields, num_samples, overwrite, page_size, info=info, shard_size=shard_size) as writer:
        count = 0
        for i, sample in enumerate(samples):
            if len(sample) != len(flist):
                raise FieldError(f"sample {i}: {len(sample)} values for {len(flist)} fields")
            metas, payloads = [], []
            for f, value in zip(flist, sample):
                try:
                    m, p = f.encode(value, i)
                except FieldError as e:
                    raise FieldError(f"sample {i}: {e}") from e
                metas.append(m)
                payloads.append(p)
            writer.add(i, metas, payloads)
            count += 1
        if count != num_samples:
            raise ConfigurationError(f"num_samples={num_samples} but {count} samples were given")
    return dst
