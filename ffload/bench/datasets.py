"""Benchmark datasets built from real photos that ship offline (scikit-image / scikit-learn, via
:mod:`ffload.convert.demo_data`): an ImageNet-sized JPEG ImageFolder and CIFAR-sized raw crops; and
a ``.beton`` of random raw images (:func:`write_random_raw`) where only the loader's work matters.

ImageNet-sized: ``build_photos_folder`` gives ~400 px / ~34 KB images (smooth upscaled crops),
smaller than the ImageNet reference (~430 px, ~98 KB mean at q90), so each image is resized to a
longer side drawn from :data:`LONGER_SIDE` and given film grain (Gaussian, :data:`GRAIN_SIGMA`
per channel, from one fixed noise field), then saved as JPEG at :data:`JPEG_QUALITY`: ~430 px,
~98 KB mean.
"""

from __future__ import annotations

import math
import os
import shutil

import numpy as np

GRAIN_SIGMA, LONGER_SIDE, JPEG_QUALITY = 26.0, (360, 500), 90
"""Film grain (grey levels), longer side range (pixels) and JPEG quality of the photo set."""


def build_photo_jpegs(root: str, n_images: int, seed: int = 0) -> None:
    """An ImageNet-sized JPEG ImageFolder of about ``n_images`` photos in ``root`` (see the
    module docstring). Raises OSError when an image cannot be written."""
    import cv2

    from ffload.convert.demo_data import PHOTO_CLASSES, build_photos_folder

    demo = root + ".demo"
    shutil.rmtree(demo, ignore_errors=True)
    build_photos_folder(demo, n_per_class=math.ceil(n_images / len(PHOTO_CLASSES)), seed=seed)
    rng = np.random.default_rng(seed)
    grain = np.rint(rng.normal(0.0, GRAIN_SIGMA, (1024, 1024, 3))).astype(np.int16)
    for cls in sorted(os.listdir(demo)):
        os.makedirs(os.path.join(root, cls))
        for name in sorted(os.listdir(os.path.join(demo, cls))):
            bgr = cv2.imread(os.path.join(demo, cls, name), cv2.IMREAD_COLOR)
            h, w = bgr.shape[:2]
            scale = int(rng.integers(LONGER_SIDE[0], LONGER_SIDE[1] + 1)) / max(h, w)
            size = (max(1, round(w * scale)), max(1, round(h * scale)))
            bgr = cv2.resize(bgr, size, interpolation=cv2.INTER_CUBIC if scale > 1 else cv2.INTER_AREA)
            y, x = (int(rng.integers(0, 1024 - s + 1)) for s in bgr.shape[:2])
            noisy = np.clip(bgr + grain[y : y + bgr.shape[0], x : x + bgr.shape[1]], 0, 255).astype(np.uint8)
            out = os.path.join(root, cls, os.path.splitext(name)[0] + ".JPEG")
            if not cv2.imwrite(out, noisy, [cv2.IMWRITE_JPEG_QUALITY, JPEG_QUALITY]):
                raise OSError(f"{out}: OpenCV could not write the image")
    shutil.rmtree(demo)


def raw_crops(folder: str, n: int, side: int = 32, seed: int = 0):
    """``(n, side, side, 3) uint8`` random square crops (30-100 % of the shorter side, INTER_AREA)
    of up to 256 images of the ImageFolder, and their ``(n,) int64`` class labels."""
    from ffload.convert.sources import ImageFolderSource

    src = ImageFolderSource(folder)
    rng = np.random.default_rng(seed)
    picks = np.sort(rng.choice(len(src), size=min(256, len(src)), replace=False))
    photos = [src[int(i)] for i in picks]
    import cv2

    images = np.empty((n, side, side, 3), dtype=np.uint8)
    labels = np.empty(n, dtype=np.int64)
    for k in range(n):
        image, label = photos[k % len(photos)]
        h, w = image.shape[:2]
        c = int(min(h, w) * rng.uniform(0.3, 1.0))
        y, x = int(rng.integers(0, h - c + 1)), int(rng.integers(0, w - c + 1))
        images[k] = cv2.resize(image[y : y + c, x : x + c], (side, side), interpolation=cv2.INTER_AREA)
        labels[k] = label
    return images, labels


def write_random_raw(path: str, n: int, side: int = 32, seed: int = 0) -> None:
    """A ``.beton`` at ``path`` of ``n`` raw ``(side, side, 3) uint8`` images of uniform random
    pixels (``default_rng(seed)``), field ``image``, and labels ``i % 10``, field ``label``. The file
    appears only when complete (:func:`ffload.formats.write_dataset`). Raises OSError when it
    cannot be written."""
    from ffload.formats import IntField, RGBImageField, write_dataset

    images = np.random.default_rng(seed).integers(0, 256, (n, side, side, 3), dtype=np.uint8)
    fields = {"image": RGBImageField(write_mode="raw"), "label": IntField()}
    write_dataset(path, fields, ((images[i], i % 10) for i in range(n)), n)
