"""An ImageFolder on object storage: ``s3://bucket/root/<class>/**/<image>``, through fsspec.

The same layout, classes and sample order as :class:`~.imagefolder.ImageFolderSource` (torchvision's
``ImageFolder``): classes are the sorted first path components under the root (hidden ones, starting
with ``.``, skipped at every level), labels ``0..C-1``; inside a class, objects are ordered by their
"folder" (the key up to the last ``/``) then their name; an object is an image when its name ends with
one of :data:`~ffload.convert.images.IMAGE_EXTENSIONS` in any case; images directly under the root are
ignored (with a warning). Object stores have no folders, symbolic links or FIFOs, so nothing else is left
out.

The root is listed **once** (one recursive listing: ``fs.find``; S3 pages through ``ListObjectsV2``),
which also gives every object's size and ETag (the resume fingerprint, :func:`file_entries`). Image
bytes are read by whole-object GETs, retried on transient errors (:mod:`ffload.storage`):
``convert``'s encoder asks for a chunk's objects at once (:meth:`RemoteImageFolderSource.prefetch`),
and each process fetches them with at most ``max_requests`` GETs in flight (so at most
``num_workers * max_requests`` in all).
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import posixpath

import numpy as np

from ffload.convert.images import DEFAULT_MAX_PIXELS, IMAGE_EXTENSIONS, decode_image_bytes, has_image_extension
from ffload.convert.sources.base import SourceError, check_index
from ffload.storage import RetryPolicy, open_filesystem, storage_call

__all__ = ["RemoteImageFolderSource"]

logger = logging.getLogger(__name__)


class RemoteImageFolderSource:
    """Images in ``PROTOCOL://root/<class>/**/<image>`` (see the module docstring).

    Args:
        url: the root (``s3://bucket/prefix``).
        storage_options: the filesystem's options (:func:`ffload.storage.open_filesystem`).
        max_pixels: images whose header declares more pixels are refused; ``None``: no limit.
        max_requests: GETs in flight at most per process (>= 1).
        retry: the :class:`~ffload.storage.RetryPolicy` of every request.

    Attributes:
        root: the URL (no trailing ``/``); name: its last component; classes: ``list[str]``;
        labels: ``(N,) int64``; left_out, unreadable: ``[]`` (nothing is left out of a listing).

    Raises:
        SourceError: nothing under ``url``, no class "folders", or a class without images (named).
        StorageError: the listing failed (named: no such bucket, access denied, credentials).

    ``src[i]`` -> ``(image (H, W, 3) uint8 RGB, label int)``; ``src.encoded(i)`` -> the object's bytes;
    ``src.describe(i)`` -> its URL.
    """

    def __init__(
        self,
        url: str,
        storage_options: dict | None = None,
        max_pixels: int | None = DEFAULT_MAX_PIXELS,
        max_requests: int = 8,
        retry: RetryPolicy | None = None,
    ):
        self.root = url.rstrip("/")
        self.storage_options, self.max_pixels = storage_options, max_pixels
        self.max_requests, self.retry = max(1, int(max_requests)), retry
        fs, base = open_filesystem(self.root, storage_options)
        base = base.rstrip("/")
        self._protocol = self.root.split("://", 1)[0]
        listing = storage_call(self.root, "list it", lambda: fs.find(base, detail=True), retry)
        per_class: dict[str, list[tuple[str, str, str, int, str]]] = {}
        stray = others = 0
        for key, info in listing.items():
            if info.get("type", "file") != "file" or not key.startswith(base + "/"):
                continue
            rel = key[len(base) + 1 :]
            parts = rel.split("/")
            if any(p.startswith(".") or not p for p in parts):
                continue
            if len(parts) == 1:
                stray += has_image_extension(rel)
                continue
            if not has_image_extension(parts[-1]):
                others += 1
                per_class.setdefault(parts[0], [])
                continue
            per_class.setdefault(parts[0], []).append(
                (
                    posixpath.dirname(rel),
                    parts[-1],
                    rel,
                    int(info.get("size", 0)),
                    str(info.get("ETag", info.get("etag", ""))),
                )
            )
        if not listing:
            raise SourceError(
                f"{self.root}: no objects under this prefix; expected root/<class>/<image>", path=self.root
            )
        if not per_class:
            raise SourceError(
                f"{self.root}: no class folders (found {len(listing)} objects); expected root/<class>/<image>",
                path=self.root,
            )
        if stray:
            logger.warning(
                "%s: %d images directly under the root are ignored (images must be in class folders)", self.root, stray
            )
        self.classes = sorted(per_class)
        self._keys: list[str] = []
        self._entries: list[tuple[int, str]] = []
        labels = []
        for label, cls in enumerate(self.classes):
            files = sorted(per_class[cls])
            if not files:
                raise SourceError(
                    f"{self.root}/{cls}: class folder {cls!r} holds no images ({others} objects with "
                    f"other extensions under the root); image extensions are "
                    f"{', '.join(IMAGE_EXTENSIONS)} (any case)",
                    path=f"{self.root}/{cls}",
                )
            for _, _, rel, size, etag in files:
                self._keys.append(rel)
                self._entries.append((size, etag))
            labels.extend([label] * len(files))
        self.labels = np.asarray(labels, dtype=np.int64)
        self.name = posixpath.basename(self.root.split("://", 1)[1]) or self.root
        self.left_out: list[tuple[str, str]] = []
        self.unreadable: list[tuple[str, str]] = []
        self._base = base
        self._process: tuple | None = None  # (pid, fs, executor), opened lazily in each process
        self._fetched: dict[int, concurrent.futures.Future] = {}

    def __len__(self) -> int:
        return len(self.labels)

    def url(self, i: int) -> str:
        """The URL of sample ``i``'s object; IndexError outside ``[-N, N)``."""
        return f"{self.root}/{self._keys[check_index(i, len(self), self.name)]}"

    describe = url

    def origin(self, i: int) -> str:
        """Sample ``i``'s provenance: its key relative to :attr:`root` (``str``)."""
        return self._keys[check_index(i, len(self), self.name)]

    @property
    def origin_info(self) -> dict:
        """How :meth:`origin` reads (:mod:`ffload.formats.origins`): a path relative to the root, as
        for a local ImageFolder (the URL is not stored, as a local root's path is not: the same tree
        gives the same dataset bytes wherever it is read from)."""
        return {"source": "imagefolder", "id": "path"}

    def file_entries(self):
        """``(url, size, etag)`` of every sample's object, in order, from the listing (what a
        resumed conversion compares: :func:`ffload.convert.journal.source_fingerprint`)."""
        for key, (size, etag) in zip(self._keys, self._entries):
            yield f"{self.root}/{key}", size, etag

    def _handles(self):
        """``(fs, executor)`` of this process (workers are forked: nothing is shared across)."""
        if self._process is None or self._process[0] != os.getpid():
            fs, _ = open_filesystem(self.root, self.storage_options)
            pool = concurrent.futures.ThreadPoolExecutor(self.max_requests, "ffload-source-get")
            self._process = (os.getpid(), fs, pool)
            self._fetched = {}
        return self._process[1], self._process[2]

    def _get(self, i: int) -> bytes:
        fs, _ = self._handles()
        key = f"{self._base}/{self._keys[i]}"
        return storage_call(self.url(i), "read it", lambda: fs.cat_file(key), self.retry)

    def prefetch(self, indices) -> None:
        """Start fetching the objects of samples ``indices`` (at most ``max_requests`` at once);
        :meth:`encoded` then takes each from there (once)."""
        _, pool = self._handles()
        for i in indices:
            i = check_index(i, len(self), self.name)
            if i not in self._fetched:
                self._fetched[i] = pool.submit(self._get, i)

    def encoded(self, i) -> bytes:
        """The bytes of sample ``i``'s object (prefetched or fetched now).

        Raises:
            StorageError: the object cannot be read (named, with the cause).
        """
        i = check_index(i, len(self), self.name)
        self._handles()
        future = self._fetched.pop(i, None)
        return future.result() if future is not None else self._get(i)

    def __getitem__(self, i) -> tuple[np.ndarray, int]:
        """``(image (H, W, 3) uint8 RGB, label int)``; ImageDecodeError naming the URL for a bad image."""
        i = check_index(i, len(self), self.name)
        return decode_image_bytes(self.encoded(i), self.url(i), self.max_pixels), int(self.labels[i])

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_process"], state["_fetched"] = None, {}
        return state

    def __repr__(self) -> str:
        return f"RemoteImageFolderSource({self.root!r}: {len(self)} images, {len(self.classes)} classes)"
