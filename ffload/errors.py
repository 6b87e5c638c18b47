"""Every error ffload raises on purpose, under one root: :class:`FfloadError`.

Modelled on py-lmdb's ``lmdb.Error`` family: one root that carries structured context, one
subclass per cause (each with a one-line docstring), and an optional hint appended to the
message. A subclass also derives from ``ValueError``, ``TypeError`` or ``RuntimeError`` where the
error did before this module existed, so ``except ValueError`` (or ``TypeError``, ``RuntimeError``)
written against older ffload still works.

    FfloadError
    ├── ConfigurationError   (ValueError)   bad arguments: a constructor or option that cannot work
    │   ├── PipelineError    (TypeError)    a pipeline whose operations do not fit its field or each other
    │   └── UnavailableError (RuntimeError) an option that needs what this process lacks (CUDA, a library)
    ├── SourceError          (ValueError)   an input dataset that cannot be read as asked
    │   └── ImageDecodeError                one input image that cannot be decoded (corrupt)
    │       ├── ImageUnsupportedError       one valid image with a feature no decoder here reads
    │       └── ImageBombError              one whose header declares more pixels than allowed
    ├── FormatError          (ValueError)   a .beton / LMDB dataset that is not valid (DatasetError)
    ├── FieldError           (ValueError)   a value that its field cannot encode
    ├── ConvertError         (RuntimeError) a conversion that stopped
    │   └── DatasetBusyError                an output another process is writing
    ├── LoaderError          (RuntimeError) a batch that failed while loading
    ├── LoaderClosedError    (RuntimeError) a closed loader, or an epoch iterator it closed, was used
    ├── StorageError         (RuntimeError) a request to object storage (s3://) that failed
    └── RecipeError                         a training recipe's inputs, refused before training

The command line (:mod:`ffload.cli`) prints any ``FfloadError`` as one line,
``ffload: error: <message>``, and exits with status 1 (``--debug`` shows the traceback).
This module imports nothing from ffload, so every module may import it.
"""

from __future__ import annotations

__all__ = [
    "FfloadError",
    "ConfigurationError",
    "PipelineError",
    "UnavailableError",
    "SourceError",
    "ImageDecodeError",
    "ImageUnsupportedError",
    "ImageBombError",
    "FormatError",
    "DatasetError",
    "FieldError",
    "ConvertError",
    "DatasetBusyError",
    "LoaderError",
    "LoaderClosedError",
    "StorageError",
    "RecipeError",
]


class FfloadError(Exception):
    """Root of ffload's errors: ``str(e)`` names the file or sample and the cause.

    Args:
        message: the cause, starting with the path or sample it concerns.
        path: the file or folder concerned (``str``), or ``None``.
        field: the dataset field concerned, or ``None``.
        sample: the sample index concerned (``int``), or ``None``.
        hint: what the user can do about it; appended to the message in parentheses, as
            py-lmdb appends ``MDB_HINT``.

    Attributes ``message``, ``path``, ``field``, ``sample`` and ``hint`` hold the arguments as given.
    """

    def __init__(
        self,
        message: str,
        *,
        path: str | None = None,
        field: str | None = None,
        sample: int | None = None,
        hint: str | None = None,
    ):
        self.message, self.path, self.field, self.sample, self.hint = message, path, field, sample, hint
        super().__init__(f"{message} ({hint})" if hint else message)


class ConfigurationError(FfloadError, ValueError):
    """Bad arguments: a constructor, function or option given values that cannot work."""


class PipelineError(ConfigurationError, TypeError):
    """A pipeline whose operations do not fit its field or each other.

    A decoder for another field type, an operation given a stage, shape or dtype it does not take,
    an item that is not an operation, ``pipelines`` that is not a dict of lists. Raised while the
    ``Loader`` builds its pipelines (before any batch); the message names the field and the
    operation. A ``TypeError`` too, as these were before this class existed."""


class UnavailableError(ConfigurationError, RuntimeError):
    """An option that needs what this process lacks (CUDA, a ``torch.distributed`` group, a library).

    The message names the option and what it needs. A ``RuntimeError`` too, as these were before this class existed."""


class SourceError(FfloadError, ValueError):
    """An input dataset that cannot be read as asked: bad folder layout, corrupt archive, bad sample."""


class ImageDecodeError(SourceError):
    """One input image (file or array) that cannot be turned into ``(H, W, 3) uint8`` RGB."""


class ImageUnsupportedError(ImageDecodeError):
    """A valid input image with a feature (bit depth, compression, colour space, sample format) no decoder reads."""


class ImageBombError(ImageDecodeError):
    """An image whose header declares more pixels than the limit (a decompression bomb); refused before decoding."""


class FormatError(FfloadError, ValueError):
    """A ``.beton`` file or LMDB directory that is not a valid ffload/FFCV dataset (corrupt, truncated)."""


DatasetError = FormatError
"""The name :class:`FormatError` had before :mod:`ffload.errors` (``ffload.formats.DatasetError``)."""


class FieldError(FfloadError, ValueError):
    """A value that its field cannot encode (wrong type, shape, dtype or size)."""


class ConvertError(FfloadError, RuntimeError):
    """A conversion that stopped: a bad input under ``on_error='fail'``, a full disk, nothing to write."""


class DatasetBusyError(ConvertError):
    """An output dataset that another process is writing (it holds the advisory lock); names its pid."""


class LoaderError(FfloadError, RuntimeError):
    """A batch that failed in a loader worker; the epoch iterator that raised it is closed.

    Args:
        message: the cause, naming the sample and field when known.
        epoch, batch: where it happened (batch number within the epoch).
        field: the field whose pipeline failed, or ``None`` (e.g. reading the file failed).
        sample_index: the dataset index of the failing sample when it could be isolated, else
            ``None``; also available as ``sample``. The original exception is ``__cause__``.
    """

    def __init__(self, message: str, epoch: int, batch: int, field: str | None = None, sample_index: int | None = None):
        super().__init__(message, field=field, sample=sample_index)
        self.epoch, self.batch, self.sample_index = epoch, batch, sample_index
        self.args = (message, epoch, batch, field, sample_index)  # pickles with its context

    def __str__(self) -> str:
        return self.message


class LoaderClosedError(FfloadError, RuntimeError):
    """A closed ``Loader``, or an epoch iterator that its loader closed, was used.

    The loader closes an epoch iterator on a newer ``iter()``, ``load_state_dict`` or ``close``;
    the message says which and why."""


class StorageError(FfloadError, RuntimeError):
    """A request to remote object storage (``s3://bucket/key``, :mod:`ffload.storage`) that failed:
    the message names the object, the operation and the cause (no such object, access denied,
    credentials refused, or a transient error that outlasted the retries).

    Attributes:
        transient: True when the last error was a transient one (connection, 5xx, throttling)
            that outlasted the retries; False for a permanent one.
    """

    def __init__(self, message: str, *, path: str | None = None, transient: bool = False, hint: str | None = None):
        super().__init__(message, path=path, hint=hint)
        self.transient = transient


class RecipeError(FfloadError):
    """A training recipe's inputs (data folder, output folder, device, sizes), refused before training."""
