"""Small real-image datasets built offline, for demos, examples and tests.

* :func:`build_digits_folder` -- the 1797 handwritten digits of ``sklearn.datasets.load_digits()`` (UCI optical
  digits, 8x8, 16 gray levels) upscaled to ``size x size`` RGB PNGs in ``root/{train,test}/<digit>/``.
* :func:`build_photos_folder` -- an ImageNet-like ImageFolder: random crops/scales/flips (300-500 px, JPEG q90 with
  the ImageNet ``.JPEG`` extension, every fourth file PNG) of the photos bundled with scikit-image and
  scikit-learn, one class per photo.

scikit-learn / scikit-image are needed only when these functions run (``pip install scikit-learn scikit-image``).
Images are written with OpenCV; the output depends only on the arguments (``seed`` included).
"""

from __future__ import annotations

import importlib
import logging
import os

import cv2
import numpy as np

from ffload.errors import ConfigurationError

__all__ = ["digits_images", "build_digits_folder", "build_photos_folder", "PHOTO_CLASSES"]

logger = logging.getLogger(__name__)

PHOTO_CLASSES = (
    "astronaut",
    "camera",
    "chelsea",
    "china",
    "coffee",
    "flower",
    "hubble",
    "immunohistochemistry",
    "motorcycle",
    "retina",
    "rocket",
)
"""Class names of :func:`build_photos_folder`; ``camera`` is a grayscale photo (written as grayscale files)."""

_JPEG_QUALITY = 90


def _require(module: str, package: str):
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(f"building the demo data needs {package}: pip install {package}") from e


def _prepare_root(root: str | os.PathLike) -> str:
    root = os.fspath(root)
    if os.path.isdir(root) and os.listdir(root):
        raise FileExistsError(f"{root}: folder exists and is not empty; choose a new folder")
    os.makedirs(root, exist_ok=True)
    return root


def _write(path: str, image: np.ndarray, params=()) -> None:
    """Write an RGB ``(H, W, 3)`` or gray ``(H, W)`` uint8 image with OpenCV (which expects BGR)."""
    bgr = image[..., ::-1] if image.ndim == 3 else image
    if not cv2.imwrite(path, np.ascontiguousarray(bgr), list(params)):
        raise OSError(f"{path}: OpenCV could not write the image")


def digits_images(size: int = 32) -> tuple[np.ndarray, np.ndarray]:
    """The sklearn digits as RGB images.

    Each 8x8 digit (values 0-16, ink high) becomes ``round(v * 255 / 16)`` uint8, white ink on black as MNIST,
    resized to ``size x size`` with nearest-neighbour interpolation (blocky, so every written pixel is one of the
    original 64 values and the digits stay crisp), replicated to 3 channels.

    Args:
        size: output side in pixels (>= 8).
    Returns:
        ``(images (1797, size, size, 3) uint8 RGB, labels (1797,) int64)`` in ``load_digits()`` order.
    Raises:
        ImportError: scikit-learn missing. ConfigurationError: ``size < 8``.
    """
    if size < 8:
        raise ConfigurationError(f"size must be >= 8 pixels, got {size}")
    datasets = _require("sklearn.datasets", "scikit-learn")
    digits = datasets.load_digits()
    small = np.rint(digits.images * (255.0 / 16.0)).astype(np.uint8)
    big = np.stack([cv2.resize(d, (size, size), interpolation=cv2.INTER_NEAREST) for d in small])
    return np.repeat(big[..., None], 3, axis=3), digits.target.astype(np.int64)


def build_digits_folder(root: str | os.PathLike, size: int = 32, test_fraction: float = 0.2, seed: int = 0) -> dict:
    """Write the sklearn digits as ``root/train/<digit>/<index>.png`` and ``root/test/<digit>/<index>.png``.

    ``<index>`` is the 4-digit position in ``load_digits()``. The split is stratified: in each class,
    ``round(n_class * test_fraction)`` images, drawn with ``np.random.default_rng([seed, digit])``, go to test.

    Args:
        root: a new or empty folder.
        size: image side in pixels (see :func:`digits_images`).
        test_fraction: in ``[0, 1)``.
        seed: the split seed.
    Returns:
        ``{'root', 'size', 'num_train', 'num_test', 'train_per_class': {digit: n}, 'test_per_class': {...}}``
        (digits as ``str``).
    Raises:
        ImportError: scikit-learn missing. FileExistsError: ``root`` not empty. ConfigurationError: bad
        ``test_fraction``.
    """
    if not 0.0 <= test_fraction < 1.0:
        raise ConfigurationError(f"test_fraction must be in [0, 1), got {test_fraction}")
    images, labels = digits_images(size)
    root = _prepare_root(root)
    summary = {"root": root, "size": size, "train_per_class": {}, "test_per_class": {}}
    for digit in range(10):
        members = np.flatnonzero(labels == digit)
        n_test = int(round(len(members) * test_fraction))
        order = np.random.default_rng([seed, digit]).permutation(members)
        test_set = set(order[:n_test].tolist())
        for split in ("train", "test"):
            os.makedirs(os.path.join(root, split, str(digit)), exist_ok=True)
        for index in members:
            split = "test" if index in test_set else "train"
            _write(os.path.join(root, split, str(digit), f"{index:04d}.png"), images[index])
        summary["train_per_class"][str(digit)] = len(members) - n_test
        summary["test_per_class"][str(digit)] = n_test
    summary["num_train"] = sum(summary["train_per_class"].values())
    summary["num_test"] = sum(summary["test_per_class"].values())
    return summary


def _load_photos() -> dict:
    """``{class name: (H, W, 3) or (H, W) uint8}`` for :data:`PHOTO_CLASSES` (bundled files, no download)."""
    skdata = _require("skimage.data", "scikit-image")
    datasets = _require("sklearn.datasets", "scikit-learn")
    sample = datasets.load_sample_images()
    by_file = {os.path.splitext(os.path.basename(f))[0]: img for f, img in zip(sample.filenames, sample.images)}
    return {
        "astronaut": skdata.astronaut(),
        "camera": skdata.camera(),
        "chelsea": skdata.chelsea(),
        "china": by_file["china"],
        "coffee": skdata.coffee(),
        "flower": by_file["flower"],
        "hubble": skdata.hubble_deep_field(),
        "immunohistochemistry": skdata.immunohistochemistry(),
        "motorcycle": skdata.stereo_motorcycle()[0],
        "retina": skdata.retina(),
        "rocket": skdata.rocket(),
    }


def _random_view(photo: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A random crop (8-100 % of the area, aspect 3/4-4/3, as torchvision's RandomResizedCrop draws them), resized
    so the longer side is 300-500 px, flipped horizontally half of the time."""
    h, w = photo.shape[:2]
    for _ in range(10):
        area = h * w * rng.uniform(0.08, 1.0)
        aspect = np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3)))
        cw, ch = int(round(np.sqrt(area * aspect))), int(round(np.sqrt(area / aspect)))
        if 0 < cw <= w and 0 < ch <= h:
            break
    else:
        cw, ch = w, h
    y, x = int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1))
    crop = photo[y : y + ch, x : x + cw]
    longer = int(rng.integers(300, 501))
    scale = longer / max(ch, cw)
    size = (max(1, int(round(cw * scale))), max(1, int(round(ch * scale))))
    out = cv2.resize(crop, size, interpolation=cv2.INTER_AREA if scale < 1 else cv2.INTER_CUBIC)
    return out[:, ::-1] if rng.random() < 0.5 else out


def build_photos_folder(root: str | os.PathLike, n_per_class: int = 20, seed: int = 0) -> dict:
    """Write an ImageNet-like ImageFolder ``root/<class>/<class>_<k>.JPEG|.png`` from bundled photos.

    Class ``c`` (index in :data:`PHOTO_CLASSES`) gets ``n_per_class`` random views of its photo drawn with
    ``np.random.default_rng([seed, c])`` (see ``_random_view``): files ``k % 4 == 3`` are PNG, the others JPEG
    quality 90 with the ImageNet-style upper-case ``.JPEG`` extension. ``camera`` is grayscale, so its files are
    single-channel, like the grayscale JPEGs found in ImageNet.

    Args:
        root: a new or empty folder.
        n_per_class: images per class (>= 1).
        seed: the sampling seed.
    Returns:
        ``{'root', 'classes': [...], 'per_class': {class: n}, 'num_images', 'num_jpeg', 'num_png'}``.
    Raises:
        ImportError: scikit-image or scikit-learn missing. FileExistsError: ``root`` not empty.
        ConfigurationError: ``n_per_class < 1``.
    """
    if n_per_class < 1:
        raise ConfigurationError(f"n_per_class must be >= 1, got {n_per_class}")
    photos = _load_photos()
    root = _prepare_root(root)
    summary = {"root": root, "classes": list(PHOTO_CLASSES), "per_class": {}, "num_jpeg": 0, "num_png": 0}
    for c, name in enumerate(PHOTO_CLASSES):
        rng = np.random.default_rng([seed, c])
        class_dir = os.path.join(root, name)
        os.makedirs(class_dir)
        for k in range(n_per_class):
            view = _random_view(photos[name], rng)
            if k % 4 == 3:
                _write(os.path.join(class_dir, f"{name}_{k:04d}.png"), view)
                summary["num_png"] += 1
            else:
                _write(os.path.join(class_dir, f"{name}_{k:04d}.JPEG"), view, (cv2.IMWRITE_JPEG_QUALITY, _JPEG_QUALITY))
                summary["num_jpeg"] += 1
        summary["per_class"][name] = n_per_class
    summary["num_images"] = summary["num_jpeg"] + summary["num_png"]
    logger.info("wrote %d photos in %d classes under %s", summary["num_images"], len(PHOTO_CLASSES), root)
    return summary
