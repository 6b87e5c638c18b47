"""Decode stored samples through the Loader's own code path, outside a Loader.

``ffload verify``, ``ffload inspect --grid`` and the tests decode samples here, and they run
exactly what training runs: the field's default pipeline
(:func:`ffload.loaders.pipeline.build.default_pipeline`, e.g. ``SimpleRGBImageDecoder`` + ``ToTensor``)
on batches of the dataset, and, when a batch fails, on one-sample batches to name each bad
sample (as the Loader does before it raises ``LoaderError``). Whatever decoder the Loader uses
by default, these use too.

The default image pipeline needs images of one size: samples are grouped by size, and each
size gets its pipeline, declared on the dataset with one of those samples selected
(:attr:`~ffload.formats.DatasetView.selection`), so that errors name the real sample index.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ffload.formats import RGBImageField, image_sizes
from ffload.formats.shardio import check_mapping
from ffload.formats.view import DatasetView

MAX_PIPELINES = 8  # pipelines (with their buffers) a SampleDecoder keeps, one per image size


class SampleDecoder:
    """Decodes samples of field ``name`` of ``view`` with the Loader's default pipeline for
    that field.

    Not thread-safe (it reuses its batch buffers): use one per thread.

    Args:
        view: the opened dataset.
        name: the field to decode.
        region: the data region (``view.open_region()``, opened here when None).
        batch_size: at most this many samples per pipeline run in :meth:`failures`.

    Raises:
        KeyError: no field ``name``; TypeError: no default pipeline for the field's type.
    """

    def __init__(self, view: DatasetView, name: str, region: np.ndarray | None = None, batch_size: int = 64):
        self.view, self.name, self.field = view, name, view.fields[name]
        self.region = view.open_region() if region is None else region
        self.batch_size = int(batch_size)
        self._column = view.metadata[name]
        self._ptrs, self._sizes = view.ptrs.get(name), view.sizes.get(name)
        self._pipelines: dict[tuple | None, tuple] = {}  # image size (or None) -> pipeline, buffers, batch

    def _size_groups(self, indices: np.ndarray) -> list[np.ndarray]:
        """``indices`` split into groups of one image size (one group for other fields)."""
        if not isinstance(self.field, RGBImageField) or indices.size < 2:
            return [indices]
        _, group = np.unique(image_sizes(self._column[indices], distinct=False), axis=0, return_inverse=True)
        order = np.argsort(group.reshape(-1), kind="stable")
        return np.split(indices[order], np.flatnonzero(np.diff(group.reshape(-1)[order])) + 1)

    def _pipeline(self, index: int, batch: int) -> tuple:
        """The pipeline (and buffers for ``batch`` samples) that decodes sample ``index``."""
        from ffload.loaders.pipeline.build import FieldPipeline, default_pipeline

        declared_on, key = self.view, None
        if isinstance(self.field, RGBImageField):  # the default decoder needs images of one size
            declared_on = dataclasses.replace(self.view, selection=np.array([index], dtype=np.int64))
            key = tuple(image_sizes(self._column[index : index + 1])[0])
        cached = self._pipelines.pop(key, None)
        if cached is None or cached[2] < batch:
            if len(self._pipelines) >= MAX_PIPELINES:  # drop the least recently used
                del self._pipelines[next(iter(self._pipelines))]
            ops = default_pipeline(self.name, self.field, declared_on)
            pipeline = FieldPipeline(self.name, self.field, ops, declared_on, batch_size=batch)
            cached = (pipeline, pipeline.allocate(pin_memory=False), batch)
        self._pipelines[key] = cached
        return cached

    def _run(self, indices: np.ndarray):
        """One pipeline run over ``indices`` (``(B,) int64``, one image size): the batch."""
        from ffload.loaders.pipeline.operation import BatchContext

        pipeline, buffers, _ = self._pipeline(int(indices[0]), len(indices))
        ctx = BatchContext(
            indices, np.zeros(len(indices), dtype=np.uint64), self.region, self._column, self._ptrs, self._sizes, 0
        )
        out = pipeline.run(buffers, ctx)
        check_mapping(self.region)  # a file that shrank while it was read: its lost bytes read as zeros
        return out

    def __call__(self, index: int) -> np.ndarray:
        """Decode sample ``index``: the pipeline's output for it (its own copy), e.g.
        ``(H, W, 3) uint8`` RGB for an image, a 0-d ``int64`` array for an IntField.

        Raises:
            ValueError (or what the decoder raises): the sample does not decode; the message
            names the field and the sample.
            FormatError: the data file shrank while it was read (named; see
                :func:`ffload.formats.shardio.check_mapping`).
        """
        return self._run(np.array([index], dtype=np.int64))[0].numpy().copy()  # default pipelines end in ToTensor

    def failures(self, indices) -> list[tuple[int, Exception]]:
        """Decode ``indices`` (any order) in batches of one image size, and each sample of a
        failing batch alone. Returns ``(sample index, exception)`` for every sample that does
        not decode, in the order decoded. Raises FormatError when the data file shrank while it
        was read (its lost bytes would make every later sample look bad)."""
        failed = []
        for group in self._size_groups(np.asarray(indices, dtype=np.int64)):
            for start in range(0, len(group), self.batch_size):
                batch = group[start : start + self.batch_size]
                try:
                    self._run(batch)
                except Exception:  # find the bad samples as the Loader does: one at a time
                    check_mapping(self.region)  # unless the file shrank under us: that is not theirs
                    for j in range(len(batch)):
                        try:
                            self._run(batch[j : j + 1])
                        except Exception as e:
                            failed.append((int(batch[j]), e))
        return failed


def decode_image(view: DatasetView, name: str, index: int, region: np.ndarray | None = None) -> np.ndarray:
    """Decode image ``index`` of the RGBImageField ``name`` to ``(H, W, 3) uint8`` RGB, as the
    Loader's default pipeline does. For many samples, keep one :class:`SampleDecoder`.

    Raises:
        ValueError: the payload does not decode (corrupt JPEG, size other than its metadata);
            the message names the field and the sample.
    """
    return SampleDecoder(view, name, region)(index)
