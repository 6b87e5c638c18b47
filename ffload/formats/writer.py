"""The base of the container writers (``.beton``: :class:`~.beton.BetonWriter`, LMDB:
:class:`~.lmdb.writer.LMDBWriter`): what every container does alike when it is written.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np

from ffload.errors import ConfigurationError
from ffload.formats.fields.base import Field


def encode_info(info: dict) -> bytes:
    """``info`` as compact UTF-8 JSON (empty bytes for an empty dict).

    Raises:
        ConfigurationError: ``info`` is not a dict of JSON-able values (names the cause).
    """
    if not isinstance(info, dict):
        raise ConfigurationError(f"info must be a dict (a JSON object), got {type(info).__name__}")
    if not info:
        return b""
    try:
        return json.dumps(info, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf8")
    except (TypeError, ValueError) as e:
        raise ConfigurationError(f"info must hold JSON values only: {e}") from e


class DatasetWriter:
    """Streams samples ``0, 1, 2, ...``, in index order, into one container at ``path``.

    A template method (as fsspec's ``AbstractBufferedFile``): this base checks the order and
    the count, lays each sample's payloads out and sets their pointers, and runs the writer's
    end (commit or abort). A subclass sets :attr:`_handle` (the open file or environment: what
    :meth:`abort` closes) and implements only

    * :meth:`_write_sample` — store one sample: its records filled by :meth:`_lay_out`, its
      payload bytes where the container keeps them, its origin (:class:`~.origins.OriginLog`);
    * :meth:`_finalize` — write what follows the samples (tables, header, metadata record) and
      sync to disk; the base then closes :attr:`_handle`.

    Use as a context manager: on normal exit :meth:`close` commits, on an exception
    :meth:`abort` discards (as py-lmdb's ``Transaction``). The caller owns atomicity (write
    under a temporary name, rename after ``close``): see ``formats.atomic``.

    Args:
        path: the output to create (a file or a directory, per container).
        fields: name -> Field, in order.
        num_samples: at most this many samples will be added; fewer may be (skipped inputs):
            the container then records the number actually added.
        info: dataset-level information, a JSON object (``{"classes": [...]}``: class names
            indexed by label), stored once in the container and read back as
            :attr:`~.view.DatasetView.info`; ``None``: none.

    Attributes:
        count: samples added so far (the index the next :meth:`add` must carry).
    """

    _handle = None

    def __init__(self, path: str, fields: dict[str, Field], num_samples: int, info: dict | None = None):
        self.path = path
        self.fields = dict(fields)
        self._field_list = list(self.fields.values())
        self.num_samples = int(num_samples)
        self.count = 0
        self._info_json = encode_info({} if info is None else info)  # checks it first
        self.info = dict(info or {})

    def add(
        self, index: int, metas: Sequence, payloads: Sequence[np.ndarray | None], origin: str | None = None
    ) -> None:
        """Append sample ``index``: its metadata records (each field's ``metadata_type``, the
        pointers left 0) and payloads (1-D ``uint8`` arrays, ``None`` for fields without one),
        in field order, and where it came from (``origin``: a string read as ``info["origin"]``
        says, :mod:`.origins`; ``None``: unknown), stored in the container's origin block.

        Raises:
            ConfigurationError: ``index`` is not the next sample, or ``num_samples`` were added already.
        """
        if index != self.count or index >= self.num_samples:
            raise ConfigurationError(
                f"samples must be added in order, at most {self.num_samples}: expected {self.count}, got {index}"
            )
        self._write_sample(index, metas, payloads, origin)
        self.count += 1

    def _lay_out(
        self, records: Sequence[np.ndarray], metas: Sequence, payloads: Sequence, start: int, empty_gap: int = 0
    ) -> list[tuple[int, memoryview]]:
        """Fill one sample's metadata ``records`` (per field a writable view, 0-d or of one
        row) with ``metas``, placing the payloads end to end from offset ``start`` (bytes): each
        payload's offset goes into its record through :meth:`Field.set_pointer`. An empty
        payload is followed by ``empty_gap`` bytes the container fills (``.beton``: 1, so that it
        shares its offset with no other payload, as ffcv's reader needs).

        Returns ``(offset, bytes)`` per payload, in field order."""
        placed = []
        pos = start
        for f, record, meta, payload in zip(self._field_list, records, metas, payloads):
            record[...] = meta
            if not f.has_payload:
                continue
            f.set_pointer(record, pos)
            data = memoryview(np.ascontiguousarray(payload)).cast("B")
            placed.append((pos, data))
            pos += data.nbytes or empty_gap
        return placed

    def close(self) -> None:
        """Finish the container (it records the :attr:`count` samples added), sync it to disk
        and close it. If finishing fails, the writer is aborted and the error propagates."""
        try:
            self._finalize()
        except BaseException:
            self.abort()
            raise
        self._handle.close()

    def abort(self) -> None:
        """Close the output without finishing it (the caller deletes it); never raises."""
        try:
            self._handle.close()
        except Exception:  # the file or environment may already be unusable
            pass

    def __enter__(self) -> DatasetWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    def _write_sample(
        self, index: int, metas: Sequence, payloads: Sequence[np.ndarray | None], origin: str | None
    ) -> None:
        """Store sample ``index`` (checked to be the next one) and its origin; see the class docstring."""
        raise NotImplementedError

    def _finalize(self) -> None:
        """Write what follows the samples and sync to disk; see the class docstring."""
        raise NotImplementedError
