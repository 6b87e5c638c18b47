"""What is inside a dataset: fields, counts, sizes, class histogram, and a thumbnail grid."""

from __future__ import annotations

import contextlib

import cv2
import numpy as np

from ffload.errors import ConfigurationError, FormatError
from ffload.formats import DatasetView, image_sizes
from ffload.formats.dataset_origins import dataset_origins
from ffload.formats.fields.image import JPG, RGBImageField
from ffload.formats.fields.scalars import IntField
from ffload.formats.origins import Origins


def _stats(x: np.ndarray) -> dict:
    if x.size == 0:
        return {}
    return {"min": int(x.min()), "mean": round(float(x.mean()), 1), "max": int(x.max())}


def label_field(view: DatasetView) -> str | None:
    """The name of the label field: ``'label'`` if present, else the first IntField."""
    if isinstance(view.fields.get("label"), IntField):
        return "label"
    return next((n for n, f in view.fields.items() if isinstance(f, IntField)), None)


def summarize(view: DatasetView) -> dict:
    """A JSON-able description of ``view``: format, samples, bytes, per-field details (payload
    sizes in bytes, image sizes in pixels and write modes), for a sharded dataset its shards
    (``path``, ``samples``, ``bytes`` each), the label histogram, the dataset's ``info``
    (``class_names``: its ``"classes"``, names indexed by label, when stored), and where the samples
    came from (``origins``: the descriptor and the first :data:`FIRST_ORIGINS` samples' origins,
    :func:`sample_origins`; absent for a dataset without provenance)."""
    n = view.num_samples
    total = view.file_bytes()
    fields = []
    for name, f in view.fields.items():
        entry = {"name": name, "type": type(f).__name__, "arguments": f.arguments()}
        if name in view.sizes:
            entry["payload_bytes"] = _stats(view.sizes[name])
            entry["payload_bytes_total"] = int(view.sizes[name].sum())
        if isinstance(f, RGBImageField):
            col = view.metadata[name]
            sizes = image_sizes(col, distinct=False)
            entry["width"], entry["height"] = _stats(sizes[:, 1]), _stats(sizes[:, 0])
            entry["modes"] = {"jpg": int((col["mode"] == JPG).sum()), "raw": int((col["mode"] != JPG).sum())}
        fields.append(entry)
    out = {
        "path": view.path,
        "format": view.format,
        "samples": n,
        "bytes": total,
        "bytes_per_sample": round(total / n, 1) if n else 0,
        "page_size": view.page_size,
        "fields": fields,
    }
    if view.shards is not None:  # a sharded dataset (ffload.formats.shards): its manifest's entries
        layout = view.shards
        out["shards"] = [
            {"path": name, "samples": int(count), "bytes": int(size)}
            for name, count, size in zip(layout.names, layout.num_samples, layout.sizes)
        ]
    lab = label_field(view)
    if lab is not None and n:
        labels = view.metadata[lab]
        values, counts = np.unique(labels, return_counts=True)
        out["label_field"] = lab
        out["classes"] = int(values.size)
        out["histogram"] = {str(int(v)): int(c) for v, c in zip(values, counts)}
    if view.info:
        out["info"] = view.info
        if isinstance(view.info.get("classes"), list):
            out["class_names"] = [str(c) for c in view.info["classes"]]
    origins = dataset_origins(view)
    if origins is not None:
        out["origins"] = {
            "source": origins.descriptor,
            "first": sample_origins(view, range(min(FIRST_ORIGINS, n)), origins),
        }
    return out


FIRST_ORIGINS = 3
"""Samples whose origin :func:`summarize` lists."""


def sample_origins(view: DatasetView, indices, origins: Origins | None | bool = True) -> list[dict]:
    """``[{"index": i, "origin": {...} or None, "label": int}, ...]`` for each sample ``i`` of
    ``indices``: where it came from (:meth:`ffload.formats.origins.Origins.describe`: ``path``
    relative to the source root, WebDataset ``shard`` and ``key``, ``file`` and ``row``, ``row``,
    ``index``; None without provenance) and its label (when the dataset has a label field).
    ``origins``: the view's :func:`~ffload.formats.dataset_origins.dataset_origins` when the caller
    has it already (None: it has none), ``True``: found here.

    Raises:
        ConfigurationError: an index outside ``[0, N)`` (named).
        DatasetError: a corrupt origin block.
    """
    origins = dataset_origins(view) if origins is True else origins
    lab = label_field(view)
    out = []
    for i in indices:
        i = int(i)
        if not 0 <= i < view.num_samples:
            raise ConfigurationError(f"{view.path}: no sample {i} (the dataset has {view.num_samples})", path=view.path)
        entry = {"index": i, "origin": None if origins is None else origins.describe(i)}
        if lab is not None:
            entry["label"] = int(view.metadata[lab][i])
        out.append(entry)
    return out


def save_grid(view: DatasetView, out_png: str, count: int = 36, seed: int = 0, thumb: int = 96) -> int:
    """Write a PNG grid of ``count`` evenly spaced samples' images with their labels, decoded
    by the Loader's default pipeline (:class:`ffload.loaders.samples.SampleDecoder`) and shrunk to at
    most ``thumb`` pixels a side (INTER_AREA). A remote ``.beton``'s samples are read through
    the Loader's page pool (:class:`ffload.loaders.pagedsamples.PagedSamples`: the pages they are in).

    Returns the number of images drawn.

    Raises:
        ConfigurationError: there is no image field.
        FormatError: an image does not decode (a corrupt JPEG, one whose header disagrees with
            its metadata); the message names ``view.path``, the field and the sample.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ffload.loaders.samples import SampleDecoder  # imports the loaders (torch): only for a grid

    img_field = next((n for n, f in view.fields.items() if isinstance(f, RGBImageField)), None)
    if img_field is None:
        raise ConfigurationError(f"{view.path}: no RGBImageField to draw", path=view.path)
    lab = label_field(view)
    count = min(count, view.num_samples)
    idx = np.linspace(0, view.num_samples - 1, count).astype(int) if count else []
    cols = int(np.ceil(np.sqrt(count))) or 1
    rows = int(np.ceil(count / cols)) or 1
    fig, axes = plt.subplots(rows, cols, figsize=(cols * 1.4, rows * 1.55), squeeze=False)
    for ax in axes.ravel():
        ax.axis("off")
    with contextlib.ExitStack() as stack:
        if view.remote is None:
            one = SampleDecoder(view, img_field)

            def decode(k: int) -> np.ndarray:
                return one(int(idx[k]))
        else:  # a remote .beton: each sample's pages through the Loader's page pool
            from ffload.loaders.pagedsamples import PagedSamples

            paged = stack.enter_context(PagedSamples(view, [np.array([i], np.int64) for i in idx]))
            one = SampleDecoder(paged.view, img_field, paged.region)

            def decode(k: int) -> np.ndarray:
                with paged.holding(k):
                    return one(int(idx[k]))

        images = []
        for k in range(len(idx)):
            try:
                images.append(decode(k))
            except ValueError as e:  # the decoders' FormatError, which names the field and sample
                raise FormatError(f"{view.path}: {e}", path=view.path, field=img_field, sample=int(idx[k])) from e
    for ax, i, img in zip(axes.ravel(), idx, images):
        scale = thumb / max(img.shape[:2])
        if scale < 1:
            img = cv2.resize(
                img,
                (max(1, int(img.shape[1] * scale)), max(1, int(img.shape[0] * scale))),
                interpolation=cv2.INTER_AREA,
            )
        ax.imshow(img, interpolation="nearest")
        title = f"#{i}" + (f"  label {int(view.metadata[lab][i])}" if lab else "")
        ax.set_title(title, fontsize=7)
    fig.tight_layout()
    fig.savefig(out_png, dpi=100)
    plt.close(fig)
    return len(idx)
