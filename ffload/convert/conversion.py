"""The core every conversion engine shares: one :class:`Conversion` from a source to a local
destination (source resolution, the atomic output and its lock, the ``.beton`` journal and
``resume``, ``on_error``, progress, disk-full errors, the :class:`ConvertReport`).

An engine is a function ``engine(conversion, writer)`` that gets the samples encoded and into
``writer`` in source order, through :meth:`Conversion.take` (errors and outcomes) and
:meth:`Conversion.write_chunks` or :meth:`Conversion.adopt_labels`: local processes
(:func:`ffload.convert.convert.write_local`), Ray tasks returning chunks
(:func:`ffload.convert.ray_engine.write_ray_chunks`) or Ray tasks writing shards
(:func:`ffload.convert.ray_shards.write_ray_shards`).
"""

from __future__ import annotations

import copy
import errno
import os
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from ffload.convert.encode import SampleEncoder
from ffload.convert.options import ConvertOptions
from ffload.convert.provenance import left_out_origin, origin_room, source_origins
from ffload.errors import ConfigurationError, ConvertError
from ffload.formats import dataset_writer, format_for_path
from ffload.formats.shards import check_shard_size_arguments
from ffload.system import available_cpus, path_bytes


@dataclass
class ConvertReport:
    """What a conversion wrote.

    Attributes:
        dst: the output path; format: ``'beton'``, ``'lmdb'`` or ``'shards'`` (a sharded directory).
        samples: samples written; classes: number of classes (None if the source has no names).
        bytes: size of the output on disk (bytes); seconds: wall time of the conversion.
        skipped: ``(input, cause)`` for every input skipped under ``on_error='skip'``.
        skipped_origins: the origin of each of them, in the same order (an ImageFolder's path
            relative to its root, a WebDataset ``shard:key``, ...: :mod:`.provenance`), or None.
        label_counts: ``(C,) int64`` samples per label written (the class histogram).
        workers: worker processes used.
        passed_through: images stored as their source JPEG's bytes (no decode, no encode).
        reencoded: images decoded and re-encoded to JPEG, counted per reason (a key of
            :data:`ffload.convert.passthrough.REASONS`); images stored raw count in neither.
        resumed_from: source samples an interrupted run had converted already (``resume``); the
            counts above include them, ``seconds`` does not.
    """

    dst: str
    format: str
    samples: int
    classes: int | None
    bytes: int
    seconds: float
    skipped: list[tuple[str, str]] = field(default_factory=list)
    label_counts: np.ndarray | None = None
    workers: int = 0
    passed_through: int = 0
    reencoded: dict[str, int] = field(default_factory=dict)
    resumed_from: int = 0
    skipped_origins: list[str | None] = field(default_factory=list)

    @property
    def bytes_per_sample(self) -> float:
        return self.bytes / self.samples if self.samples else 0.0

    def as_dict(self) -> dict:
        """JSON-able summary."""
        return {
            "dst": self.dst,
            "format": self.format,
            "samples": self.samples,
            "classes": self.classes,
            "bytes": self.bytes,
            "bytes_per_sample": round(self.bytes_per_sample, 1),
            "seconds": round(self.seconds, 3),
            "images_per_second": round(self.samples / self.seconds, 1) if self.seconds else None,
            "workers": self.workers,
            "passed_through": self.passed_through,
            "reencoded": sum(self.reencoded.values()),
            "reencode_reasons": dict(self.reencoded),
            "resumed_from": self.resumed_from,
            "label_counts": None if self.label_counts is None else self.label_counts.tolist(),
            "skipped": [
                {"input": i, "cause": c, "origin": o}
                for (i, c), o in zip(self.skipped, self.skipped_origins + [None] * len(self.skipped))
            ],
        }


def _disk_full(e: Exception) -> bool:
    """Whether ``e`` reports a full disk or quota, by class and errno: ``OSError`` ENOSPC/EDQUOT,
    ``lmdb.DiskError`` (py-lmdb's class for ENOSPC), or an ``lmdb.Error`` whose ``code`` is EDQUOT."""
    import lmdb

    full = (errno.ENOSPC, errno.EDQUOT)
    if isinstance(e, OSError):
        return e.errno in full
    return isinstance(e, lmdb.DiskError) or (isinstance(e, lmdb.Error) and getattr(e, "code", None) in full)


def resolve_source(source, options: ConvertOptions):
    """The Source to convert: a path or URL detected (``detect_source`` with ``source_kind``,
    ``storage_options`` and ``max_pixels``), a Source as given, or a copy holding
    ``options.max_pixels`` when its own limit differs (one limit for the whole conversion).
    Raises SourceError / ConfigurationError as ``detect_source`` does."""
    from ffload.convert.sources import detect_source

    if isinstance(source, (str, os.PathLike)):
        return detect_source(
            os.fspath(source),
            kind=options.source_kind,
            storage_options=options.storage_options,
            max_pixels=options.max_pixels,
        )
    if getattr(source, "max_pixels", options.max_pixels) != options.max_pixels:
        source = copy.copy(source)
        source.max_pixels = options.max_pixels
    return source


def open_journal(dst: str, fields: dict, source, arguments: dict, options: ConvertOptions):
    """``(ConversionJournal, the interrupted run's journal or None)`` for a ``.beton`` conversion;
    without ``options.resume`` (or with nothing to resume) an earlier run's files are removed.
    Raises ConfigurationError as :meth:`ConversionJournal.load` does, leaving the files in place."""
    from ffload.convert.journal import ConversionJournal, source_fingerprint

    journal = ConversionJournal(
        dst, fields, len(source), arguments, source_fingerprint(source), options.checkpoint_seconds
    )
    try:
        state = journal.load() if options.resume else None
    except BaseException:
        journal.release()
        raise
    if state is None:
        journal.start()
    return journal, state


class Conversion:
    """One conversion of ``source`` into the local path ``dst``, from its checks to its report
    (the module docstring); :meth:`run` runs it with an engine.

    Args:
        source: a path, URL or Source (:func:`resolve_source`).
        dst: a ``.beton`` file, ``.lmdb`` directory, or with ``options.shard_size`` a directory of shards.
        options: the conversion's options.

    Attributes (for the engines):
        source, dst, format (``'beton'``, ``'lmdb'``, ``'shards'``), options, fields (name -> Field),
        encoder (the :class:`~.encode.SampleEncoder`), workers (local processes), label_pos (the
        label field's position, or None), start (the first source index to encode: > 0 when
        resumed), written (samples written so far), bar (the tqdm bar, or None).

    Raises (before anything is written):
        FileExistsError: ``dst`` exists without ``options.overwrite``.
        ConfigurationError: ``shard_size`` with an ``.lmdb``/``.beton`` name or ``resume``;
            ``resume`` to LMDB, or refused by the journal (:meth:`ConversionJournal.load`).
        ConvertError: an empty source, or an unreadable entry under ``on_error='fail'``.
        SourceError: the source cannot be read.
    """

    def __init__(self, source, dst: str, options: ConvertOptions):
        if options.shard_size is not None:
            check_shard_size_arguments(dst, options.shard_size, options.resume)
            self.format = "shards"
        else:
            self.format = format_for_path(dst)
        if os.path.lexists(dst) and not options.overwrite:
            raise FileExistsError(f"{dst} already exists (use --overwrite / overwrite=True to replace it)")
        self.dst, self.options = dst, options
        self.source = source = resolve_source(source, options)
        self.fields = options.dataset_fields()
        self.num_samples = n = len(source)
        if n == 0:
            raise ConvertError(f"{getattr(source, 'name', source)}: the source has no samples")
        self.workers = available_cpus() if options.num_workers is None else max(0, int(options.num_workers))
        self.label_pos = list(self.fields).index("label") if "label" in self.fields else None
        self.labels = np.zeros(n, dtype=np.int64)
        # entries the source left out while listing (ImageFolderSource: unreadable folders, FIFOs, loops)
        unreadable = getattr(source, "unreadable", [])
        if unreadable and options.on_error == "fail":
            raise ConvertError(
                f"{unreadable[0][0]}: {unreadable[0][1]} ({len(unreadable)} unreadable entries; "
                f"--on-error skip lists them and goes on)",
                path=unreadable[0][0],
            )
        self.classes = getattr(source, "classes", None)
        descriptor, self.origin_of = source_origins(source)
        self.info = {"classes": [str(c) for c in self.classes]} if self.classes else {}  # read back as view.info
        self.info["origin"] = descriptor  # how to read the origin strings (ffload.formats.origins)
        self.encoder = SampleEncoder(
            source,
            list(self.fields.values()),
            passthrough=not options.reencode,
            strip_metadata=options.strip_metadata,
            verify=options.verify,
            max_pixels=options.max_pixels,
        )
        self.journal = state = None
        if self.format == "beton":
            self.journal, state = open_journal(
                dst, self.fields, source, options.resume_arguments(self.fields, self.info), options
            )
        elif options.resume:  # (sharded outputs refused it above, saying why)
            raise ConfigurationError(f"{dst}: resume=True / --resume works for .beton outputs only")
        self.state = state
        self.start, self.written = (state["next_index"], state["count"]) if state else (0, 0)
        # (input, cause, origin) per skipped input
        self.skipped: list[tuple] = (
            [(tuple(s) + (None,))[:3] for s in state["skipped"]]
            if state
            else [(path, cause, left_out_origin(source, path)) for path, cause in getattr(source, "left_out", [])]
        )
        self.outcomes: Counter = Counter(state["outcomes"] if state else {})
        self.bar = None

    def take(self, errors: list, outcomes: Counter) -> None:
        """The bookkeeping of one chunk or task: ``errors`` (``(index, input, cause)``) raise the
        first as ConvertError under ``on_error='fail'``, else join the skipped; ``outcomes`` counted."""
        if errors:
            if self.options.on_error == "fail":
                _, name, cause = errors[0]
                raise ConvertError(f"{name}: {cause}")
            self.skipped.extend((name, cause, self.origin_of(i)) for i, name, cause in errors)
        self.outcomes.update(outcomes)

    def write_chunks(self, writer, chunks: Iterator) -> None:
        """Write the ``(EncodedChunk, slab or None)`` of ``chunks`` (in source order) through
        ``writer``, with a journal checkpoint and a progress update after each; ``chunks`` is
        closed at the end (its workers stopped), also on an error."""
        flist = list(self.fields.values())
        try:
            for chunk, slab in chunks:
                self.take(chunk.errors, chunk.outcomes)
                for index, metas, payloads in chunk.samples(flist, slab):
                    writer.add(self.written, metas, payloads, self.origin_of(index))
                    if self.label_pos is not None:
                        self.labels[self.written] = int(metas[self.label_pos])
                    self.written += 1
                if self.journal is not None:
                    self.journal.commit(writer, chunk.stop, self.skipped, self.outcomes)
                if self.bar is not None:
                    self.bar.update(chunk.stop - chunk.start)
        finally:
            chunks.close()

    def adopt_labels(self, labels: np.ndarray, samples: int) -> None:
        """Count ``samples`` written elsewhere (a Ray task's shards), with their ``(k,) int64`` labels."""
        self.labels[self.written : self.written + len(labels)] = labels
        self.written += samples

    def run(self, engine: Callable[[Conversion, object], None]) -> ConvertReport:
        """Open the output (atomic: it appears only when complete; resumed from the journal's
        checkpoint), let ``engine(self, writer)`` write the samples, and report.

        Raises:
            ConvertError: a bad input under ``on_error='fail'``, every input failed, or a full
                disk (the partial output removed); what ``engine`` raises.
        """
        options, journal, t0 = self.options, self.journal, time.perf_counter()
        if options.progress:
            from tqdm import tqdm

            self.bar = tqdm(
                total=self.num_samples,
                initial=self.start,
                unit="img",
                desc=f"convert -> {os.path.basename(self.dst)}",
                smoothing=0.1,
            )
        try:
            opener = journal and journal.writer(
                options.page_size, self.state, self.info, origin_room(self.num_samples, self.origin_of)
            )
            with dataset_writer(
                self.dst,
                self.fields,
                self.num_samples,
                overwrite=options.overwrite,
                page_size=options.page_size,
                tmp=journal and journal.partial,
                info=self.info,
                shard_size=options.shard_size,
                open_writer=opener,
            ) as writer:
                if journal is not None:
                    if self.label_pos is not None:
                        self.labels[: self.written] = writer.metadata[f"f{self.label_pos}"][: self.written]
                    journal.commit(writer, self.start, self.skipped, self.outcomes, force=True)
                engine(self, writer)
                if self.written == 0:
                    raise ConvertError(
                        f"{getattr(self.source, 'name', 'source')}: every input failed; first: "
                        f"{self.skipped[0][0]}: {self.skipped[0][1]}"
                    )
        except Exception as e:  # OSError from our writes, lmdb.Error from LMDB's
            if _disk_full(e):
                raise ConvertError(
                    f"{self.dst}: no space left on the device while writing; nothing was "
                    f"written (the partial output was removed)",
                    path=self.dst,
                ) from e
            raise
        finally:
            if journal is not None:
                journal.discard()  # done, or failed: the output is atomic (a killed run leaves its journal)
            if self.bar is not None:
                self.bar.close()
        return self.report(time.perf_counter() - t0)

    def report(self, seconds: float) -> ConvertReport:
        """The :class:`ConvertReport` of the samples written, after ``seconds`` of conversion."""
        written, classes, outcomes = self.written, self.classes, Counter(self.outcomes)
        counts = None
        if self.label_pos is not None and written and self.labels[:written].min() >= 0:
            counts = np.bincount(self.labels[:written], minlength=len(classes) if classes else 0)
        return ConvertReport(
            dst=self.dst,
            format=self.format,
            samples=written,
            classes=len(classes) if classes else None,
            bytes=path_bytes(self.dst),
            seconds=seconds,
            skipped=[(name, cause) for name, cause, _ in self.skipped],
            skipped_origins=[origin for _, _, origin in self.skipped],
            label_counts=counts,
            workers=self.workers,
            passed_through=outcomes.pop("passed_through", 0),
            reencoded=dict(sorted(outcomes.items())),
            resumed_from=self.start,
        )
