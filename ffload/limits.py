"""Limits on what a hostile input may make ffload allocate; one definition shared by conversion and loading."""

from __future__ import annotations

__all__ = ["DEFAULT_MAX_PIXELS"]

DEFAULT_MAX_PIXELS = 2 * (1024 * 1024 * 1024 // 4 // 3)
"""Pixels (178,956,970) above which an image is refused, at conversion from its file header and at open from a
dataset's metadata: twice Pillow's ``Image.MAX_IMAGE_PIXELS``, where Pillow raises ``DecompressionBombError``.
Above half of it (Pillow's limit, ~89.5 Mpx) conversion logs a warning, as Pillow's ``DecompressionBombWarning``."""
