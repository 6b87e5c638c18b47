"""Finding a dataset's origin block (:mod:`.origins`) in whichever container holds it: a ``.beton``
(where :func:`.beton.open_beton` saw its info block end), each shard of a sharded dataset (opened
when one of its strings is read), or an LMDB database's :data:`~.origins.ORIGINS_KEY` value."""

from __future__ import annotations

from ffload.formats.byteranges import LocalBytes, MemoryBytes
from ffload.formats.lmdb.reader import read_origins_value
from ffload.formats.origins import OriginBlock, Origins
from ffload.formats.view import DatasetView, dataset_error

__all__ = ["dataset_origins"]


def dataset_origins(view: DatasetView) -> Origins | None:
    """The :class:`Origins` of ``view`` (a ``.beton``, LMDB, or sharded dataset, local or remote),
    or None when it has none (no ``info["origin"]``, or no block: ffcv's files).

    A ``.beton``'s block is found where :func:`.beton.open_beton` saw the info block end
    (``view.origin_blocks``), with one read of its head; a sharded dataset's first shard's block
    likewise, the other shards' when one of their strings is read.

    Raises:
        DatasetError: a block that is corrupt, or whose count is not the dataset's (its shard's)
            sample count.
    """
    descriptor = view.info.get("origin")
    if not isinstance(descriptor, dict):
        return None
    if view.format == "lmdb":
        blocks = [_lmdb_block(view.path)]
    elif view.shards is not None:
        first = _beton_block(view, 0) if view.shards.paths else None
        if first is None:
            return None
        later = [lambda k=k: _shard_block(view, k) for k in range(1, len(view.shards.paths))]
        return Origins(descriptor, [first] + later, [int(c) for c in view.shards.num_samples])
    else:
        blocks = [_beton_block(view, 0)]
    if any(b is None for b in blocks):
        return None
    origins = Origins(descriptor, blocks)
    if len(origins) != view.num_samples:
        raise dataset_error(
            view.path, f"origin table holds {len(origins)} entries for {view.num_samples} samples (corrupt file)"
        )
    return origins


def _beton_block(view: DatasetView, k: int) -> OriginBlock | None:
    """The origin block of the ``.beton`` (``k`` 0) or of shard ``k`` of ``view``, read where the
    view's ``origin_blocks[k]`` says (its end checked against the first payload and the allocation
    table); None when the file has none."""
    place = view.origin_blocks[k] if view.origin_blocks else None
    if place is None:
        return None
    if view.shards is not None:
        path = view.shards.paths[k]
        source = LocalBytes(path) if view.remote is None else view.remote.remotes[k]
    else:
        path, source = view.path, LocalBytes(view.path) if view.remote is None else view.remote
    offset, limit = place
    return OriginBlock.find(path, source, offset, limit)


def _shard_block(view: DatasetView, k: int) -> OriginBlock:
    """Shard ``k``'s origin block; DatasetError naming the shard when it has none (its dataset's
    ``info`` describes origins, and the first shard has a block)."""
    block = _beton_block(view, k)
    if block is None:
        raise dataset_error(
            view.shards.paths[k],
            "shard has no origin block although the dataset's info describes origins (corrupt file)",
        )
    return block


def _lmdb_block(path: str) -> OriginBlock | None:
    """The origin block stored under :data:`~.origins.ORIGINS_KEY` in the LMDB database at ``path``."""
    raw = read_origins_value(path)
    return None if raw is None else OriginBlock.find(path, MemoryBytes(raw), 0, len(raw))
