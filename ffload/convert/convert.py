"""``convert_dataset``: an image source in, one complete ``.beton`` file or LMDB directory out."""
from __future__ import annotations

import errno
import os
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import numpy as np

from ..formats import dataset_writer, format_for_path
from ..formats.fields import Field, IntField, RGBImageField
from ..system import available_cpus, path_bytes
from .encode import encoded_chunks


class ConvertError(RuntimeError):
    """A conversion stopped: the message names the input (file or sample) and the cause."""


@dataclass
class ConvertReport:
    """What a conversion wrote.

    Attributes:
        dst: the output path; format: ``'beton'`` or ``'lmdb'``.
        samples: samples written; classes: number of classes (None if the source has no names).
        bytes: size of the output on disk (bytes); seconds: wall time of the conversion.
        skipped: ``(input, cause)`` for every input skipped under ``on_error='skip'``.
        label_counts: ``(C,) int64`` samples per label written (the class histogram).
        workers: worker processes used.
    """

    dst: str
    format: str
    samples: int
    classes: Optional[int]
    bytes: int
    seconds: float
    skipped: List[Tuple[str, str]] = field(default_factory=list)
    label_counts: Optional[np.ndarray] = None
    workers: int = 0

    @property
    def bytes_per_sample(self) -> float:
        return self.bytes / self.samples if self.samples else 0.0

    def as_dict(self) -> dict:
        """JSON-able summary."""
        return {"dst": self.dst, "format": self.format, "samples": self.samples,
                "classes": self.classes, "bytes": self.bytes,
                "bytes_per_sample": round(self.bytes_per_sample, 1), "seconds": round(self.seconds, 3),
                "images_per_second": round(self.samples / self.seconds, 1) if self.seconds else None,
                "workers": self.workers,
                "label_counts": None if self.label_counts is None else self.label_counts.tolist(),
                "skipped": [{"input": i, "cause": c} for i, c in self.skipped]}


def image_fields(write_mode: str = "raw", max_resolution: Optional[int] = None, jpeg_quality: int = 90,
                 smart_threshold: Optional[int] = None,
                 compress_probability: float = 0.5) -> Dict[str, Field]:
    """The fields of an image-classification dataset: ``image`` (RGBImageField) then ``label``
    (IntField), the order of FFCV's examples."""
    return {"image": RGBImageField(write_mode, max_resolution, smart_threshold, jpeg_quality,
                                   compress_probability),
            "label": IntField()}


def _disk_full(e: Exception) -> bool:
    """Whether ``e`` reports a full disk or quota: ``OSError`` ENOSPC/EDQUOT, or an ``lmdb.Error``
    carrying that message (py-lmdb reports system errors as text)."""
    if isinstance(e, OSError):
        return e.errno in (errno.ENOSPC, errno.EDQUOT)
    return type(e).__module__ == "lmdb" and (os.strerror(errno.ENOSPC) in str(e)
                                             or os.strerror(errno.EDQUOT) in str(e))


def convert_dataset(source, dst: str, write_mode: str = "raw", max_resolution: Optional[int] = None,
                    jpeg_quality: int = 90, smart_threshold: Optional[int] = None,
                    compress_probability: float = 0.5, num_workers: Optional[int] = None,
                    on_error: str = "fail", overwrite: bool = False, progress: bool = True,
                    page_size: Optional[int] = None, chunk_size: Optional[int] = None,
                    fields: Optional[Dict[str, Field]] = None, source_kind: Optional[str] = None) -> ConvertReport:
    """Convert an image source into ``dst`` (``.beton`` file or ``.lmdb`` directory, by suffix).

    Args:
        source: a path (ImageFolder root or CIFAR archive folder, see ``detect_source``) or a
            Source (``ImageFolderSource``, ``CIFARSource``, ``ArraySource``, ``IndexableSource``).
        dst: output path; it appears only when complete (temporary name, fsync, rename).
        write_mode, max_resolution, jpeg_quality, smart_threshold, compress_probability: the
            ``RGBImageField`` arguments (FFCV's meaning).
        num_workers: encoding processes (None: all cores; 0: in this process).
        on_error: ``'fail'`` stops at the first bad input naming it; ``'skip'`` leaves it out and
            lists it in ``ConvertReport.skipped``.
        overwrite: replace an existing ``dst`` (only once the new one is complete).
        progress: show a tqdm bar (images/s) on stderr.
        page_size: ``.beton`` page size in bytes (power of two >= 2 MiB; grows for large samples).
        chunk_size: samples per worker task (default: sized so that a task carries ~16 MiB).
        fields: override the fields (default: :func:`image_fields` from the arguments above).
        source_kind: force the source detection (``'imagefolder'``, ``'cifar10'``, ``'cifar100'``).

    Returns:
        ConvertReport.

    Raises:
        ConvertError: a bad input under ``on_error='fail'`` (names the file and cause), a full
            disk, or nothing left to write.
        FileExistsError: ``dst`` exists and ``overwrite`` is False.
        SourceError / ValueError: the source or the arguments are invalid (before any writing).
    """
    from .sources import detect_source

    if on_error not in ("fail", "skip"):
        raise ValueError(f"on_error must be 'fail' or 'skip', got {on_error!r}")
    fmt = format_for_path(dst)
    if os.path.lexists(dst) and not overwrite:
        raise FileExistsError(f"{dst} already exists (use --overwrite / overwrite=True to replace it)")
    if isinstance(source, (str, os.PathLike)):
        source = detect_source(os.fspath(source), kind=source_kind)
    if fields is None:
        fields = image_fields(write_mode, max_resolution, jpeg_quality, smart_threshold, compress_probability)
    n = len(source)
    if n == 0:
        raise ConvertError(f"{getattr(source, 'name', source)}: the source has no samples")
    workers = available_cpus() if num_workers is None else max(0, int(num_workers))
    flist = list(fields.values())
    label_pos = list(fields).index("label") if "label" in fields else None
    labels = np.zeros(n, dtype=np.int64)
    skipped: List[Tuple[str, str]] = []
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=n, unit="img", desc=f"convert -> {os.path.basename(dst)}", smoothing=0.1)
    t0 = time.perf_counter()
    written = 0
    try:
        with dataset_writer(dst, fields, n, overwrite=overwrite, page_size=page_size) as writer:
            chunks = encoded_chunks(source, fields, workers, chunk_size)
            try:
                for chunk, slab in chunks:
                    if chunk.errors:
                        if on_error == "fail":
                            _, name, cause = chunk.errors[0]
                            raise ConvertError(f"{name}: {cause}")
                        skipped.extend((name, cause) for _, name, cause in chunk.errors)
                    for _, metas, payloads in chunk.samples(flist, slab):
                        writer.add(written, metas, payloads)
                        if label_pos is not None:
                            labels[written] = int(metas[label_pos])
                        written += 1
                    if bar is not None:
                        bar.update(chunk.stop - chunk.start)
            finally:
                chunks.close()
            if written == 0:
                raise ConvertError(f"{getattr(source, 'name', 'source')}: every input failed; first: "
                                   f"{skipped[0][0]}: {skipped[0][1]}")
    except Exception as e:  # OSError from our writes, lmdb.Error from LMDB's
        if _disk_full(e):
            raise ConvertError(f"{dst}: no space left on the device while writing; nothing was "
                               f"written (the partial output was removed)") from e
        raise
    finally:
        if bar is not None:
            bar.close()
    seconds = time.perf_counter() - t0
    classes = getattr(source, "classes", None)
    counts = None
    if label_pos is not None and written and labels[:written].min() >= 0:
        counts = np.bincount(labels[:written], minlength=len(classes) if classes else 0)
    return ConvertReport(dst=dst, format=fmt, samples=written, classes=len(classes) if classes else None,
                         bytes=path_bytes(dst), seconds=seconds, skipped=skipped, label_counts=counts,
                         workers=workers)
