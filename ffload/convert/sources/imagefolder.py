"""The ImageFolder source: ``root/<class>/**/<image>``, classes and sample order as torchvision's
``datasets.ImageFolder``; the one definition of "an ImageFolder" in ffload."""

from __future__ import annotations

import logging
import os
import stat

import numpy as np

from ffload.convert.images import DEFAULT_MAX_PIXELS, IMAGE_EXTENSIONS, has_image_extension, load_image, read_image_file
from ffload.convert.sources.base import SourceError, check_index

__all__ = ["ImageFolderSource"]

logger = logging.getLogger(__name__)

_SPLIT_NAMES = {"train", "test", "val", "valid", "validation"}


class ImageFolderSource:
    """Images in ``root/<class>/**/<image>``, as torchvision's ``datasets.ImageFolder``.

    Classes are ``sorted(entry.name for entry in os.scandir(root) if entry.is_dir())`` with labels ``0..C-1``;
    inside a class, files are taken in torchvision's order (directories of ``os.walk(followlinks=True)`` sorted by
    path, file names sorted within a directory), nested subfolders included; a file is an image when its name ends
    with one of :data:`~ffload.convert.images.IMAGE_EXTENSIONS` in any case. Unlike torchvision, hidden entries
    (names starting with ``.``: ``.ipynb_checkpoints``, macOS ``._x.jpg``) are skipped at every level, class
    folders included. Images lying directly in ``root`` are ignored (with a warning).

    Walking is hostile-input safe (unlike ``os.walk(followlinks=True)``):

    * a directory is entered at most once, identified by ``(st_dev, st_ino)``: a symbolic link to a folder
      already walked (a loop to a parent, two folders linking to each other, a second link to one folder) is
      not followed again and is listed in :attr:`left_out` ("symlink loop or duplicate");
    * only regular files are images: a FIFO, socket or device named ``x.jpg`` is never opened (it could block
      forever) and is listed in :attr:`left_out`;
    * a folder that cannot be listed (permission denied, I/O error) and a dangling symbolic link are listed in
      :attr:`unreadable` (and :attr:`left_out`): ``convert_dataset`` fails on them under ``on_error='fail'`` and
      lists them as skipped under ``'skip'``, so nothing is ever dropped without a line in the report.

    Args:
        root: the dataset folder.
        max_pixels: images whose header declares more pixels are refused (see
            :func:`~ffload.convert.images.check_pixels`); ``None``: no limit. Also a settable attribute.

    Attributes:
        root: absolute path.
        classes: ``list[str]``, class names indexed by label.
        labels: ``(N,) int64``.
        name: ``basename(root)``.
        samples: ``[(path, label), ...]`` in sample order (torchvision's ``ImageFolder.samples``), for code
            that reads the files itself (the DataLoader baselines).
        left_out: ``[(path, cause), ...]``: every entry with an image extension, or folder, that is not a
            sample (see above).
        unreadable: the part of ``left_out`` that is an error (cannot be read).

    Raises:
        SourceError: ``root`` missing, a file, empty or without class folders, or a class folder without images
            (named in the message) unless it could not be read (then it is in :attr:`unreadable`).

    ``src[i]`` -> ``(load_image(path) (H, W, 3) uint8 RGB, label int)``; ``src.describe(i)`` -> the path. Paths
    are stored as one bytes buffer plus ``(N + 1,) int64`` offsets, so a million-image source pickles in one copy.
    """

    def __init__(self, root: str | os.PathLike, max_pixels: int | None = DEFAULT_MAX_PIXELS):
        root = os.path.abspath(os.fspath(root))
        if not os.path.exists(root):
            raise SourceError(f"{root}: no such folder", path=root)
        if not os.path.isdir(root):
            raise SourceError(
                f"{root}: is a file; expected a folder with one subfolder per class (root/<class>/<image>)", path=root
            )
        entries = list(os.scandir(root))
        if not entries:
            raise SourceError(
                f"{root}: empty folder; expected one subfolder per class (root/<class>/<image>)", path=root
            )
        classes = sorted(e.name for e in entries if e.is_dir() and not e.name.startswith("."))
        if not classes:
            raise SourceError(
                f"{root}: no class subfolders (found {len(entries)} files); expected root/<class>/<image>", path=root
            )
        stray = sum(1 for e in entries if not e.is_dir() and has_image_extension(e.name))
        if stray:
            logger.warning(
                "%s: %d image files directly in the root are ignored (images must be in class subfolders)", root, stray
            )
        if set(classes) <= _SPLIT_NAMES:
            logger.warning(
                "%s: the class folders %s look like dataset splits; pass split=... (or point at one "
                "split) to read one split",
                root,
                classes,
            )
        encoded, labels = [], []
        self.left_out: list[tuple[str, str]] = []
        self.unreadable: list[tuple[str, str]] = []
        seen: dict[tuple[int, int], str] = {}  # (st_dev, st_ino) -> the path it was walked as
        for folder in [root] + [os.path.join(root, cls) for cls in classes]:  # class folders win over links
            st = os.stat(folder)
            seen.setdefault((st.st_dev, st.st_ino), folder)
        for label, cls in enumerate(classes):
            files = self._class_files(root, cls, seen)
            encoded.extend(os.fsencode(f) for f in files)
            labels.extend([label] * len(files))
        self.max_pixels = max_pixels
        self.root = root
        self.name = os.path.basename(root)
        self.classes = classes
        self.labels = np.asarray(labels, dtype=np.int64)
        self._offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
        np.cumsum([len(e) for e in encoded], out=self._offsets[1:])
        self._paths = b"".join(encoded)

    def _class_files(self, root: str, cls: str, seen: dict[tuple[int, int], str]) -> list[str]:
        """Image paths of one class, relative to ``root``, in torchvision's order; records what is left out;
        SourceError if the class has no images and nothing in it was unreadable."""
        class_dir = os.path.join(root, cls)
        unreadable = len(self.unreadable)
        walked, others = [], 0
        stack = [class_dir]
        while stack:
            dirpath = stack.pop()
            try:
                st = os.stat(dirpath)
                key = (st.st_dev, st.st_ino)
                if seen.setdefault(key, dirpath) != dirpath:
                    self._leave_out(
                        dirpath,
                        f"symlink loop or duplicate: the folder was already walked as {seen[key]}; not followed again",
                    )
                    continue
                with os.scandir(dirpath) as it:
                    entries = sorted((e for e in it if not e.name.startswith(".")), key=lambda e: e.name)
            except OSError as e:
                self._leave_out(dirpath, f"cannot list the folder ({e.strerror or e})", error=True)
                continue
            filenames, subdirs = [], []
            for entry in entries:
                try:
                    mode = entry.stat().st_mode  # follows symbolic links
                except OSError as e:
                    dangling = isinstance(e, FileNotFoundError) and entry.is_symlink()
                    self._leave_out(
                        entry.path,
                        "dangling symbolic link" if dangling else f"cannot stat ({e.strerror or e})",
                        error=True,
                    )
                    continue
                if stat.S_ISDIR(mode):
                    subdirs.append(entry.path)
                elif not has_image_extension(entry.name):
                    others += 1
                elif stat.S_ISREG(mode):
                    filenames.append(entry.name)
                else:
                    self._leave_out(entry.path, f"not a regular file ({_file_kind(mode)}); not opened")
            walked.append((dirpath, filenames))
            stack.extend(reversed(subdirs))  # depth first, in name order: deterministic loop reports
        walked.sort(key=lambda entry: entry[0])
        files = [
            os.path.relpath(os.path.join(dirpath, fname), root) for dirpath, filenames in walked for fname in filenames
        ]
        if not files and len(self.unreadable) == unreadable:
            detail = f" ({others} files with other extensions)" if others else ""
            raise SourceError(
                f"{class_dir}: class folder {cls!r} holds no images{detail}; image extensions are "
                f"{', '.join(IMAGE_EXTENSIONS)} (any case)",
                path=class_dir,
            )
        return files

    def _leave_out(self, path: str, cause: str, error: bool = False) -> None:
        self.left_out.append((path, cause))
        if error:
            self.unreadable.append((path, cause))
        logger.warning("%s: %s", path, cause)

    def __len__(self) -> int:
        return len(self.labels)

    def path(self, i: int) -> str:
        """Absolute path of sample ``i`` (``str``); IndexError outside ``[-N, N)``."""
        i = check_index(i, len(self), self.name)
        return os.path.join(self.root, os.fsdecode(self._paths[self._offsets[i] : self._offsets[i + 1]]))

    def __getitem__(self, i) -> tuple[np.ndarray, int]:
        """``(image (H, W, 3) uint8 RGB, label int)``; ImageDecodeError naming the file for a bad image."""
        i = check_index(i, len(self), self.name)
        return load_image(self.path(i), self.max_pixels), int(self.labels[i])

    def encoded(self, i) -> bytes:
        """The image file's bytes of sample ``i``, as stored; ImageDecodeError naming the file if unreadable."""
        return read_image_file(self.path(i))

    def describe(self, i: int) -> str:
        """The image path of sample ``i``."""
        return self.path(i)

    def origin(self, i: int) -> str:
        """Sample ``i``'s provenance: its path relative to :attr:`root`, ``/``-separated (``str``)."""
        i = check_index(i, len(self), self.name)
        return os.fsdecode(self._paths[self._offsets[i] : self._offsets[i + 1]]).replace(os.sep, "/")

    @property
    def origin_info(self) -> dict:
        """How :meth:`origin` reads (:mod:`ffload.formats.origins`): a path relative to the root."""
        return {"source": "imagefolder", "id": "path"}

    @property
    def samples(self) -> list[tuple[str, int]]:
        """``[(absolute path str, label int), ...]`` for every sample in order, as torchvision's
        ``ImageFolder.samples``; built on each access (O(N)), so keep the list you get."""
        return [
            (os.path.join(self.root, os.fsdecode(self._paths[a:b])), int(label))
            for a, b, label in zip(self._offsets[:-1].tolist(), self._offsets[1:].tolist(), self.labels)
        ]

    def __repr__(self) -> str:
        return f"ImageFolderSource({self.root!r}: {len(self)} images, {len(self.classes)} classes)"


def _file_kind(mode: int) -> str:
    """'FIFO', 'socket', 'character device', 'block device' or 'special file' for a ``st_mode``."""
    kinds = (
        (stat.S_ISFIFO, "FIFO"),
        (stat.S_ISSOCK, "socket"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
    )
    return next((name for test, name in kinds if test(mode)), "special file")
