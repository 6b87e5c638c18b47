"""Dataset sources: where ``convert`` reads ``(image, label)`` samples from.

A source follows the :class:`~.base.Source` protocol (``len``, ``src[i] -> (image (H, W, 3) uint8 RGB,
label int)``, ``describe``, ``classes``, ``labels``, ``name``). One module per kind:

* :mod:`.base` -- the protocol, :func:`check_index`, :class:`~ffload.errors.SourceError`;
* :mod:`.imagefolder` -- :class:`ImageFolderSource`, ``root/<class>/**/<image>`` as torchvision's
  ``ImageFolder`` (``.classes``, ``.samples``);
* :mod:`.cifar` -- :class:`CIFARSource`, the official CIFAR-10/100 python archives, read without trusting pickle;
* :mod:`.arrays` -- :class:`ArraySource` (in-memory arrays), :class:`IndexableSource` (any
  ``dataset[i] -> (image, label)``);
* :mod:`.webdataset` -- :class:`WebDatasetSource`, WebDataset tar shards (brace patterns, cls/json labels);
* :mod:`.hf` -- :class:`HFSource`, Hugging Face ``datasets`` (objects, ``save_to_disk`` folders, Parquet);
* :mod:`.detect` -- :func:`detect_source`: a path to the right source, in the order of one table,
  :data:`SOURCE_KINDS` (also the CLI's ``--source`` choices).

Every image goes through :mod:`ffload.convert.images`, so ``src[i][0]`` is always ``(H, W, 3) uint8`` RGB.
"""

from __future__ import annotations

from ffload.convert.sources.arrays import ArraySource, IndexableSource
from ffload.convert.sources.base import Source, SourceError, check_index
from ffload.convert.sources.cifar import (
    CIFARSource,
    cifar_variant,
    find_cifar_folder,
    is_cifar_folder,
    missing_cifar_files,
    read_cifar_pickle,
)
from ffload.convert.sources.detect import SOURCE_KINDS, SourceKind, detect_kind, detect_source
from ffload.convert.sources.hf import HFSource
from ffload.convert.sources.imagefolder import ImageFolderSource
from ffload.convert.sources.webdataset import WebDatasetSource

__all__ = [
    "Source",
    "SourceError",
    "check_index",
    "ImageFolderSource",
    "CIFARSource",
    "ArraySource",
    "IndexableSource",
    "WebDatasetSource",
    "HFSource",
    "SourceKind",
    "SOURCE_KINDS",
    "detect_kind",
    "detect_source",
    "is_cifar_folder",
    "find_cifar_folder",
    "cifar_variant",
    "missing_cifar_files",
    "read_cifar_pickle",
]
