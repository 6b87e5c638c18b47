"""What every source is: the :class:`Source` protocol, and :func:`check_index` for its ``src[i]``.

A source is where ``convert`` reads ``(image, label)`` samples from. Sources are sent to worker
processes, so they keep only file lists and arrays (no open handles) and decode lazily in
``__getitem__``. Errors: :class:`~ffload.errors.SourceError` (re-exported here) for a dataset that
cannot be read as asked, :class:`~ffload.errors.ImageDecodeError` for one bad image.
"""

from __future__ import annotations

import operator
from typing import Protocol, runtime_checkable

import numpy as np

from ffload.errors import SourceError

__all__ = ["Source", "SourceError", "check_index"]


@runtime_checkable
class Source(Protocol):
    """What ``convert`` needs from a dataset.

    * ``len(src)`` -- number of samples ``N``.
    * ``src[i]`` -- ``(image (H, W, 3) uint8 RGB C-contiguous, label int)`` for ``0 <= i < N`` (negative indices
      as for sequences, IndexError outside); decoding happens here, lazily. Bad images raise
      :class:`~ffload.convert.images.ImageDecodeError` naming ``src.describe(i)``.
    * ``src.describe(i)`` -- the file path, or ``"sample i of <name>"``, for error messages.
    * ``src.classes`` -- class names indexed by label, or ``None`` when unknown.
    * ``src.labels`` -- ``(N,) int64``, cheap (no image decoded), for label histograms.
    * ``src.name`` -- a short name of the dataset.

    Sources must pickle cheaply: they are sent to worker processes.
    """

    name: str
    classes: list[str] | None

    @property
    def labels(self) -> np.ndarray: ...

    def __len__(self) -> int: ...

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]: ...

    def describe(self, i: int) -> str: ...


def check_index(i, n: int, name: str) -> int:
    """Validate a sample index like a Python sequence does.

    Args:
        i: an integer (Python or numpy); negative counts from the end.
        n: the number of samples.
        name: the dataset name for the error message.
    Returns:
        the index in ``[0, n)`` as ``int``.
    Raises:
        TypeError: ``i`` is not an integer. IndexError: ``i`` outside ``[-n, n)``.
    """
    k = operator.index(i)
    if k < 0:
        k += n
    if not 0 <= k < n:
        raise IndexError(f"sample index {i} out of range for {name} ({n} samples)")
    return k
