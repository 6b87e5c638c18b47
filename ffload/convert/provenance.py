"""Where a conversion's samples come from: a source's origin strings and their descriptor.

Every sample a conversion writes carries one origin string into the dataset (the writers' origin
block, :mod:`ffload.formats.origins`), and ``info["origin"]`` says how to read them. A source
gives both through an ``origin(i) -> str`` method and an ``origin_info`` dict (the ImageFolder:
the path relative to its root; WebDataset: shard and ``__key__``; CIFAR: batch file and row;
Hugging Face: the row); any other source (:class:`~.sources.ArraySource`,
:class:`~.sources.IndexableSource`, a user's own) is described by its sample index.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from ffload.formats.origins import BLOCK_HEAD

__all__ = ["source_origins", "origin_room", "left_out_origin"]


def source_origins(source) -> tuple[dict, Callable[[int], str]]:
    """``(descriptor, origin_of)`` of ``source``: ``info["origin"]`` (a JSON object, see
    :mod:`ffload.formats.origins`) and the function giving sample ``i``'s origin string. Sources
    without ``origin``/``origin_info``: ``{"source": <type name>, "id": "index", "int": true}`` and
    ``str(i)``. A descriptor names no folder, path or URL of the source (nor its name): the same
    samples give the same dataset bytes wherever they are read from."""
    origin, info = getattr(source, "origin", None), getattr(source, "origin_info", None)
    if callable(origin) and isinstance(info, dict):
        return dict(info), origin
    return {"source": type(source).__name__, "id": "index", "int": True}, str


def origin_room(n: int, origin_of: Callable[[int], str]) -> int:
    """Bytes of the origin block of samples ``0..n-1`` (every input written): what a ``.beton``
    reserves up front, so that no skipped input can make it move its data. O(n) calls to
    ``origin_of``, no list kept."""
    total = sum(len(origin_of(i).encode("utf8", "surrogateescape")) for i in range(n))
    return BLOCK_HEAD + 8 * n + total if n else 0


def left_out_origin(source, path: str) -> str | None:
    """The origin of an entry a source left out while listing (``source.left_out``: a FIFO, an
    unreadable folder): ``path`` relative to the source's ``root``, ``/``-separated, when it lies
    under it; else None."""
    root = getattr(source, "root", None)
    if not isinstance(root, str) or "://" in root:
        return None
    rel = os.path.relpath(path, root)
    outside = rel.split(os.sep, 1)[0] == os.pardir  # the first part, not a prefix: "..foo" is a folder inside
    return None if outside else rel.replace(os.sep, "/")
