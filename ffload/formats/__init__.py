"""On-disk formats, both directions: FFCV's ``.beton`` v2 and ffload's LMDB schema.

``open_dataset(path)`` returns the :class:`DatasetView` the loader reads; ``dataset_writer`` and
``write_dataset`` create files atomically. See ``beton.py`` and ``lmdb_format.py`` for the layouts.
"""
from __future__ import annotations

import os
from typing import Dict, Iterable, Optional, Sequence

from .beton import open_beton
from .fields import (BytesField, Field, FieldError, FloatField, IntField, JSONField, NDArrayField,
                     RGBImageField)
from .lmdb_format import open_lmdb
from .view import DatasetError, DatasetView
from .writer import dataset_writer, format_for_path

LMDB_MAGIC = b"\xde\xc0\xef\xbe"  # MDB_meta.mm_magic (0xBEEFC0DE) after the 16-byte page header

__all__ = ["open_dataset", "write_dataset", "dataset_writer", "format_for_path", "DatasetView",
           "DatasetError", "Field", "FieldError", "RGBImageField", "IntField", "FloatField",
           "BytesField", "NDArrayField", "JSONField"]


def open_dataset(path: str) -> DatasetView:
    """Open a ``.beton`` file or an ffload LMDB directory for reading (format detected from the
    contents, not the name).

    Raises:
        DatasetError: missing path, or not a dataset (with the cause: truncated, wrong version,
            LMDB without ffload's metadata record, offsets outside the file, ...).
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        raise DatasetError(f"{path}: no such file or directory")
    if os.path.isdir(path):
        return open_lmdb(path)
    with open(path, "rb") as fp:
        head = fp.read(20)
    if head[16:20] == LMDB_MAGIC:
        raise DatasetError(f"{path}: looks like an LMDB data file; open its directory instead")
    return open_beton(path)


def write_dataset(dst: str, fields: Dict[str, Field], samples: Iterable[Sequence], num_samples: int,
                  overwrite: bool = False, page_size: Optional[int] = None) -> str:
    """Encode ``samples`` (tuples of values in field order) in this process and write ``dst``
    (``.beton`` or ``.lmdb`` by suffix) atomically. For large image datasets use
    :func:`ffload.convert.convert_dataset`, which encodes in parallel.

    Raises:
        FieldError: a value does not fit its field (the message names the sample index).
        FileExistsError, ValueError: see :func:`dataset_writer`.
    """
    flist = list(fields.values())
    with dataset_writer(dst, fields, num_samples, overwrite, page_size) as writer:
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
            raise ValueError(f"num_samples={num_samples} but {count} samples were given")
    return dst
