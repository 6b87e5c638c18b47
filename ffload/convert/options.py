"""``ConvertOptions``: every option of a conversion in one frozen, validated dataclass, and
:func:`image_fields`, the fields it writes by default.

Both entry points build it: ``convert_dataset(src, dst, write_mode="jpg", ...)`` from its keyword
arguments, ``ffload convert`` from its command-line options. The conversion itself reads only
this object (:mod:`ffload.convert.conversion`, the engines), so an option has one name, one
default and one check.
"""

from __future__ import annotations

import dataclasses

from ffload.errors import ConfigurationError
from ffload.formats.fields.base import Field
from ffload.formats.fields.image import RGBImageField
from ffload.formats.fields.scalars import IntField
from ffload.formats.shards import parse_size
from ffload.limits import DEFAULT_MAX_PIXELS

ON_ERROR = ("fail", "skip")
ENGINES = ("local", "ray")
RESUME_OPTIONS = ("page_size", "on_error", "reencode", "strip_metadata", "verify", "max_pixels")
"""The options besides the fields that decide the bytes a ``.beton`` conversion writes: a
``resume`` must repeat them (:meth:`ConvertOptions.resume_arguments`, compared by
:meth:`ffload.convert.journal.ConversionJournal.load`)."""


def image_fields(
    write_mode: str = "raw",
    max_resolution: int | None = None,
    jpeg_quality: int = 90,
    smart_threshold: int | None = None,
    compress_probability: float = 0.5,
    jpeg_restart_interval: int | None = None,
) -> dict[str, Field]:
    """The fields of an image-classification dataset: ``image`` (RGBImageField) then ``label`` (IntField).

    The order is that of FFCV's examples.

    Args:
        write_mode: ``'raw'``, ``'jpg'``, ``'smart'`` or ``'proportion'`` (as :class:`ConvertOptions`).
        max_resolution: cap on the longer image side, pixels; None: none.
        jpeg_quality: quality of the JPEGs ffload encodes, 1..100.
        smart_threshold: ``'smart'``'s raw-size threshold, bytes.
        compress_probability: ``'proportion'``'s probability of JPEG, in [0, 1].
        jpeg_restart_interval: MCUs between restart markers; None: one per MCU from 128 px a side; 0: none.

    Raises:
        ConfigurationError: a bad argument, named (RGBImageField's checks).
    """
    return {
        "image": RGBImageField(
            write_mode, max_resolution, smart_threshold, jpeg_quality, compress_probability, jpeg_restart_interval
        ),
        "label": IntField(),
    }


@dataclasses.dataclass(frozen=True)
class ConvertOptions:
    """The options of :func:`~ffload.convert.convert_dataset` and of ``ffload convert``, checked when built.

    They are :func:`ffload.convert.convert_dataset`'s keyword arguments (same names and
    defaults). A bad value raises ConfigurationError naming the option.

    Attributes:
        write_mode: ``str``, default ``'raw'``: how images are stored (FFCV's ``RGBImageField``):
            ``'raw'``, ``'jpg'``, ``'smart'`` (JPEG above ``smart_threshold`` bytes) or
            ``'proportion'`` (JPEG with probability ``compress_probability``).
        max_resolution: ``int`` pixels or None (default): cap the longer image side (INTER_AREA).
        jpeg_quality: ``int`` in 1..100, default 90: the quality of the JPEGs ffload encodes.
        smart_threshold: ``int`` bytes or None (default): ``'smart'``'s raw-size threshold.
        compress_probability: ``float`` in [0, 1], default 0.5: ``'proportion'``'s probability.
        jpeg_restart_interval: ``int`` MCUs in 0..65535 or None (default: one restart marker per
            MCU for images of at least 128 px a side; 0: none) in the JPEGs ffload encodes, so
            crop decoders entropy-decode only the crop's MCUs.
        num_workers: ``int`` >= 0 or None (default: all cores): local encoding processes (0: in
            this process).
        on_error: ``str``, default ``'fail'``: ``'fail'`` stops at the first bad input naming it;
            ``'skip'`` leaves it out and lists it in ``ConvertReport.skipped``.
        overwrite: ``bool``, default False: replace an existing destination (only once the new
            one is complete).
        progress: ``bool``, default True: a tqdm bar (images/s) on stderr.
        page_size: ``int`` bytes or None (default: 8 MiB): ``.beton`` page size, a power of two
            >= 2 MiB (grows for large samples).
        chunk_size: ``int`` >= 1 samples or None (default: sized so that a task carries ~16 MiB):
            samples per worker (or Ray) task.
        fields: ``dict[str, Field]`` or None (default: :func:`image_fields` of the options above):
            the dataset's fields, in order.
        source_kind: ``str`` or None (default: detected): force the detection of a path source
            (``'imagefolder'``, ``'cifar10'``, ``'cifar100'``, ...; ``detect_source``'s ``kind``).
        reencode: ``bool``, default False: decode and re-encode every JPEG (FFCV's behaviour)
            instead of storing a source JPEG's own bytes where it already is what the write mode
            asks for (pass-through, :mod:`ffload.convert.passthrough`; file-backed sources with
            the default fields).
        strip_metadata: ``bool``, default False: drop the APPn/COM segments of passed-through JPEGs.
        verify: ``bool``, default False: decode each passed-through JPEG once as the loader
            would; one that fails is re-encoded from OpenCV's decode instead.
        resume: ``bool``, default False: ``.beton`` only: continue the interrupted conversion to
            the destination from its last checkpoint (byte-identical to an uninterrupted run;
            from scratch when there is none); the fields and :data:`RESUME_OPTIONS` must repeat.
        checkpoint_seconds: ``float`` seconds >= 0, default 1.0: at most one checkpoint (fsync +
            journal, :mod:`ffload.convert.journal`) per this many seconds (0: after every chunk).
        engine: ``str``, default ``'local'``: ``'local'`` (``num_workers`` forked processes) or
            ``'ray'`` (Ray tasks across a cluster: :mod:`ffload.convert.ray_engine`, or with
            ``shard_size`` :mod:`ffload.convert.ray_shards`; needs ``ffload[ray]``).
        ray_address: ``str`` or None (default: this process's Ray instance, ``RAY_ADDRESS`` or a
            new local one): the cluster of ``engine='ray'`` (``'auto'``, ``'ray://host:port'``).
        storage_options: ``dict`` or None (default: from the environment): for a URL source or
            destination, the filesystem's options (credentials, ``endpoint_url``;
            :func:`ffload.storage.open_filesystem`).
        shard_size: ``int`` bytes or None (default: one file): write a directory of standalone
            ``.beton`` shards of at most this many bytes each and a ``manifest.json``
            (:mod:`ffload.formats.shards`). Given as an int or a size string (``"1GB"``,
            ``"512MiB"``), kept as the int. Not with ``resume``, nor an ``.lmdb`` or ``.beton``
            destination (refused with the destination: :func:`ffload.formats.shards.check_shard_size_arguments`).
        max_pixels: ``int`` pixels >= 1 or None (no limit), default
            :data:`ffload.limits.DEFAULT_MAX_PIXELS`: refuse an input image whose header declares
            more pixels (a decompression bomb), wherever the conversion reads one (encoders,
            pass-through, the source: a Source whose own limit differs is converted through a
            copy holding this one).

    Raises:
        ConfigurationError: an option out of its range or choices, or not a size (named in the message).
    """

    write_mode: str = "raw"
    max_resolution: int | None = None
    jpeg_quality: int = 90
    smart_threshold: int | None = None
    compress_probability: float = 0.5
    jpeg_restart_interval: int | None = None
    num_workers: int | None = None
    on_error: str = "fail"
    overwrite: bool = False
    progress: bool = True
    page_size: int | None = None
    chunk_size: int | None = None
    fields: dict[str, Field] | None = None
    source_kind: str | None = None
    reencode: bool = False
    strip_metadata: bool = False
    verify: bool = False
    resume: bool = False
    checkpoint_seconds: float = 1.0
    engine: str = "local"
    ray_address: str | None = None
    storage_options: dict | None = None
    shard_size: int | str | None = None
    max_pixels: int | None = DEFAULT_MAX_PIXELS

    def __post_init__(self):
        for name, choices in (("on_error", ON_ERROR), ("engine", ENGINES)):
            if getattr(self, name) not in choices:
                raise ConfigurationError(
                    f"{name} must be {' or '.join(map(repr, choices))}, got {getattr(self, name)!r}"
                )
        for name, least in (("num_workers", 0), ("chunk_size", 1), ("max_pixels", 1), ("checkpoint_seconds", 0)):
            value = getattr(self, name)
            if value is not None and not value >= least:
                raise ConfigurationError(
                    f"{name} must be >= {least}{'' if name == 'checkpoint_seconds' else ' or None'}, got {value!r}"
                )
        if self.fields is not None and not (
            isinstance(self.fields, dict) and all(isinstance(f, Field) for f in self.fields.values())
        ):
            raise ConfigurationError(f"fields must be a dict of name -> Field, got {self.fields!r}")
        self.dataset_fields()  # the image options, checked by RGBImageField
        if self.shard_size is not None:
            object.__setattr__(self, "shard_size", parse_size(self.shard_size))  # frozen: the one normalisation

    def dataset_fields(self) -> dict[str, Field]:
        """The fields to write: ``fields``, or new :func:`image_fields` of the image options."""
        if self.fields is not None:
            return self.fields
        return image_fields(
            self.write_mode,
            self.max_resolution,
            self.jpeg_quality,
            self.smart_threshold,
            self.compress_probability,
            self.jpeg_restart_interval,
        )

    def as_keywords(self) -> dict:
        """The options as :func:`~ffload.convert.convert_dataset`'s keyword arguments, by field
        name (a shallow copy): ``convert_dataset(src, dst, **options.as_keywords())``."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def resume_arguments(self, fields: dict[str, Field], info: dict) -> dict:
        """The JSON object a ``.beton`` conversion's journal records and a ``resume`` compares:
        each field's type and arguments, ``info`` (the dataset-level JSON: class names, origin
        descriptor) and the :data:`RESUME_OPTIONS`."""
        return {
            "fields": {k: [type(f).__name__, f.arguments()] for k, f in fields.items()},
            "info": info,
            **{name: getattr(self, name) for name in RESUME_OPTIONS},
        }
