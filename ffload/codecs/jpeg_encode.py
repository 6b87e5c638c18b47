"""JPEG encoding for conversion: libjpeg(-turbo) through OpenCV (no numba; OpenCV imported on the first
encode), so that importing it stays light; the decoders live in :mod:`.jpeg` and :mod:`.turbojpeg`."""

from __future__ import annotations

import numpy as np

from ffload.errors import FieldError


def encode_jpeg(image: np.ndarray, quality: int, restart_interval: int = 0) -> np.ndarray:
    """JPEG-encode an ``(H, W, 3) uint8`` RGB image with libjpeg(-turbo) via OpenCV at ``quality``
    (1..100), 4:2:0, with a restart marker every ``restart_interval`` MCUs (0: none).

    Returns the file bytes as a 1-D uint8 array. Raises FieldError if OpenCV refuses.
    """
    import cv2

    ok, data = cv2.imencode(
        ".jpg",
        cv2.cvtColor(image, cv2.COLOR_RGB2BGR),
        [int(cv2.IMWRITE_JPEG_QUALITY), int(quality), int(cv2.IMWRITE_JPEG_RST_INTERVAL), int(restart_interval)],
    )
    if not ok:
        raise FieldError(f"JPEG encoding failed for a {image.shape} image")
    return data.reshape(-1)
