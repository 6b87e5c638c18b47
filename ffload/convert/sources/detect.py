"""Which source reads a path: ordered detection over one table of source kinds.

:data:`SOURCE_KINDS` lists every kind in the order detection tries them (as WebDataset tries each
input kind in turn): the CIFAR python folders first, because they are recognised by their file
names, then WebDataset shards (``.tar``, ``.tar.gz``, ``.tgz`` files, a brace pattern or a folder
of them) and Hugging Face datasets (a ``save_to_disk`` folder or Parquet files), then the
ImageFolder, which accepts any folder and names what is wrong with it. A folder that holds both
shards and subfolders with images (an ImageFolder with a stray ``.tar.gz``, or shards beside
images) is ambiguous: auto-detection refuses it and names both, and ``--source`` decides. The same
table gives the ``kind`` argument of :func:`detect_source` and the choices of ``ffload convert
--source``, so a new kind is one row here.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from ffload.convert.images import DEFAULT_MAX_PIXELS, has_image_extension
from ffload.convert.sources.base import Source, SourceError
from ffload.convert.sources.cifar import TORCHVISION_FOLDERS, CIFARSource, cifar_variant
from ffload.convert.sources.hf import HFSource, looks_like_hf
from ffload.convert.sources.imagefolder import ImageFolderSource
from ffload.convert.sources.webdataset import SHARD_SUFFIXES, WebDatasetSource, looks_like_webdataset
from ffload.errors import ConfigurationError
from ffload.storage import is_remote

__all__ = ["SourceKind", "SOURCE_KINDS", "detect_kind", "detect_source"]


@dataclass(frozen=True)
class SourceKind:
    """One kind of dataset folder that :func:`detect_source` recognises.

    Attributes:
        name: the ``kind`` argument and ``--source`` value (``'cifar10'``, ...).
        described_as: how a message names a path of this kind ("this is <described_as>").
        expected: what a path of this kind is, for the message when ``--source`` names this kind
            and the path is not one ("asked for X, but ... is not <expected>").
        find: ``path -> folder``: the folder to open when ``path`` holds this kind (``path`` itself or
            a sub-folder, e.g. torchvision's ``cifar-10-batches-py``), else ``None``. Reads no data.
        open: ``(folder, split, label_kind, max_pixels) -> Source``; raises :class:`SourceError` naming the path.
    """

    name: str
    described_as: str
    expected: str
    find: Callable[[str], str | None]
    open: Callable[[str, str | None, str, int | None], Source]


def _cifar_finder(variant: str) -> Callable[[str], str | None]:
    """``find`` of a CIFAR kind: ``path`` itself, or torchvision's ``path/<archive folder>``."""

    def find(path: str) -> str | None:
        for folder in (path, os.path.join(path, TORCHVISION_FOLDERS[variant])):
            if cifar_variant(folder) == variant:
                return folder
        return None

    return find


def _open_cifar(folder: str, split: str | None, label_kind: str, max_pixels: int | None) -> CIFARSource:
    if split not in (None, "train", "test"):
        raise SourceError(f"{folder}: CIFAR split must be 'train' or 'test', got {split!r}", path=folder)
    return CIFARSource(folder, train=split != "test", label_kind=label_kind)


def _open_image_folder(folder: str, split: str | None, label_kind: str, max_pixels: int | None) -> ImageFolderSource:
    if split is not None:
        split_dir = os.path.join(folder, split)
        if not os.path.isdir(split_dir):
            raise SourceError(f"{split_dir}: no split folder {split!r} in {folder}", path=split_dir)
        folder = split_dir
    return ImageFolderSource(folder, max_pixels=max_pixels)


SOURCE_KINDS: dict[str, SourceKind] = {
    kind.name: kind
    for kind in (
        SourceKind(
            "cifar10",
            "a cifar10 folder",
            "a CIFAR-10 python folder (data_batch_1..5, test_batch, batches.meta)",
            _cifar_finder("cifar10"),
            _open_cifar,
        ),
        SourceKind(
            "cifar100",
            "a cifar100 folder",
            "a CIFAR-100 python folder (train, test, meta)",
            _cifar_finder("cifar100"),
            _open_cifar,
        ),
        SourceKind(
            "webdataset",
            "WebDataset shards",
            "WebDataset shards (a .tar, .tar.gz or .tgz file, a brace pattern or glob of them, or a folder "
            "holding them)",
            lambda path: path if looks_like_webdataset(path) else None,
            lambda path, split, label_kind, max_pixels: WebDatasetSource(path, max_pixels=max_pixels),
        ),
        SourceKind(
            "hf",
            "a Hugging Face dataset",
            "a Hugging Face dataset (a save_to_disk folder or Parquet files)",
            lambda path: path if looks_like_hf(path) else None,
            lambda path, split, label_kind, max_pixels: HFSource(path, split=split, max_pixels=max_pixels),
        ),
        SourceKind(
            "imagefolder",
            "an ImageFolder",
            "an ImageFolder (root/<class>/<image>)",
            lambda path: path,
            _open_image_folder,
        ),
    )
}
"""Every source kind, in detection order (the last one accepts any path)."""


def detect_kind(path: str | os.PathLike) -> tuple[SourceKind, str]:
    """The first kind of :data:`SOURCE_KINDS` whose ``find`` accepts ``path``, and the folder it found.

    Reads only file names. Every path gets a kind: ``'imagefolder'`` when nothing else matches
    (opening it then says what is missing), so nothing is raised here.

    Args:
        path: a source path (folder, file or shard pattern).
    """
    path = os.fspath(path)
    return next((kind, folder) for kind in SOURCE_KINDS.values() if (folder := kind.find(path)) is not None)


def detect_source(
    path: str | os.PathLike,
    kind: str | None = None,
    split: str | None = None,
    label_kind: str = "fine",
    max_pixels: int | None = DEFAULT_MAX_PIXELS,
    storage_options: dict | None = None,
) -> Source:
    """Open a dataset folder as the right source.

    Args:
        path: a CIFAR python folder (or torchvision's root holding one), WebDataset shards (a ``.tar``,
            a brace pattern ``'train-{000000..000146}.tar'`` or a folder of them), a Hugging Face
            ``save_to_disk`` folder or Parquet files, or an ImageFolder root.
        kind: ``None`` (auto: the first of :data:`SOURCE_KINDS` that :func:`detect_kind` finds), or one of
            its names: ``'cifar10'``, ``'cifar100'``, ``'webdataset'``, ``'hf'``, ``'imagefolder'``.
        split: CIFAR: ``'train'`` (default) or ``'test'``. Hugging Face DatasetDict: the split (default
            ``'train'``). ImageFolder: ``None`` reads ``path`` itself, any other value reads the subfolder
            ``path/<split>`` (``'train'``, ``'val'``, ...).
        label_kind: CIFAR-100 ``'fine'`` (default) or ``'coarse'``.
        max_pixels: sources that decode image files refuse images whose header declares more
            pixels (:func:`~ffload.convert.images.check_pixels`); ``None``: no limit.
        storage_options: for a URL (``s3://bucket/prefix``, an ImageFolder on object storage:
            :class:`~.remote.RemoteImageFolderSource`), the filesystem's options.
    Returns:
        the source of the kind found (:class:`~.imagefolder.ImageFolderSource`, :class:`~.cifar.CIFARSource`,
        :class:`~.webdataset.WebDatasetSource`, :class:`~.hf.HFSource`).
    Raises:
        SourceError: ``path`` missing, unknown ``kind``/``split``, a ``kind`` that does not match the
            folder, a folder that auto-detection finds to be both WebDataset shards and an ImageFolder
            (``kind`` decides), or any error of the chosen source.
    """
    path = os.fspath(path)
    if is_remote(path):
        return _open_remote(path, kind, split, max_pixels, storage_options)
    if not os.path.exists(path) and not looks_like_webdataset(path):  # a shard pattern names no one file
        raise SourceError(f"{path}: no such file or folder", path=path)
    if kind is None:
        chosen, folder = detect_kind(path)
        if chosen.name == "webdataset" and os.path.isdir(path):
            _refuse_ambiguous(path)
    elif kind not in SOURCE_KINDS:
        names = ", ".join(repr(name) for name in SOURCE_KINDS)
        raise SourceError(f"unknown dataset kind {kind!r}; expected one of {names} or None")
    else:
        chosen, folder = SOURCE_KINDS[kind], SOURCE_KINDS[kind].find(path)
        if folder is None:
            found = detect_kind(path)[0]  # the last kind accepts any path: it says nothing about this one
            what = f"{found.described_as}, not" if found.name != "imagefolder" else "not"
            raise SourceError(f"{path}: asked for {kind}, but this is {what} {chosen.expected}", path=path)
    return chosen.open(folder, split, label_kind, max_pixels)


def _refuse_ambiguous(folder: str) -> None:
    """Raise SourceError when ``folder``, which holds WebDataset shards, also has a subfolder holding an
    image file (at any depth; the walk stops at the first image): it may be an ImageFolder with a
    stray archive as well as shards, and detection does not guess."""
    with os.scandir(folder) as entries:
        entries = sorted(entries, key=lambda e: e.name)
    shards = [e.name for e in entries if e.name.endswith(SHARD_SUFFIXES) and e.is_file()]
    for sub in (e for e in entries if e.is_dir() and not e.name.startswith(".")):
        if any(has_image_extension(f) for _, _, files in os.walk(sub.path) for f in files):
            raise SourceError(
                f"{folder}: holds both WebDataset shards ({', '.join(shards[:3])}"
                f"{', ...' if len(shards) > 3 else ''}) and an ImageFolder ({sub.name}/ has images); "
                f"say which it is",
                path=folder,
                hint="--source webdataset or --source imagefolder (kind= in Python)",
            )


def _open_remote(
    url: str, kind: str | None, split: str | None, max_pixels: int | None, storage_options: dict | None
) -> Source:
    """An ImageFolder on object storage (the one kind read remotely); ConfigurationError for others."""
    from ffload.convert.sources.remote import RemoteImageFolderSource

    if kind not in (None, "imagefolder"):
        raise ConfigurationError(
            f"{url}: only ImageFolder sources (root/<class>/<image>) can be read from object storage, not {kind}",
            path=url,
            hint="download it, or use --source imagefolder",
        )
    if split is not None:
        url = f"{url.rstrip('/')}/{split}"
    return RemoteImageFolderSource(url, storage_options, max_pixels=max_pixels)
