"""What decoders say: Python warnings (Pillow's) and what libtiff writes to the process's standard error are
captured during a decode (one ``warnings.showwarning`` hook for all threads; file descriptor 2 redirected under a
lock), and a decoder's refusal is worded as unsupported (a feature the header shows) or corrupt, with the
decoder's words. The policy is stated in :mod:`ffload.convert.images`."""

from __future__ import annotations

import contextlib
import os
import struct
import sys
import tempfile
import threading
import warnings

from ffload.convert.images._headers import TIFF_COMPRESSIONS, TIFF_PHOTOMETRICS, first_value, jpeg_frame, tiff_tags
from ffload.errors import ImageDecodeError, ImageUnsupportedError

_STDERR_REDIRECT = threading.Lock()
"""Held while file descriptor 2 points at a capture file: two threads that each saved and restored it could leave
the process's stderr pointing at a closed file."""


_DECODING = threading.local()
"""``said``: the list a decode in this thread collects warnings in; absent outside a decode."""


_shown_elsewhere = warnings.showwarning
"""The ``warnings.showwarning`` that :func:`_capture_warning` replaced: it shows other threads' warnings."""


def _capture_warning(message, category, filename, lineno, file=None, line=None):
    """``warnings.showwarning`` while ffload is imported: a warning raised in a thread that is decoding goes to
    that decode's messages; any other goes on to the function this one replaced."""
    said = getattr(_DECODING, "said", None)
    if said is None:
        return _shown_elsewhere(message, category, filename, lineno, file, line)
    said.append(f"{category.__name__}: {message}")


def _hook_warnings() -> None:
    """Put :func:`_capture_warning` in place where something (``warnings.catch_warnings``,
    ``logging.captureWarnings``) replaced it; idempotent, so threads racing here all leave it in place."""
    global _shown_elsewhere
    current = warnings.showwarning
    if current is not _capture_warning:
        _shown_elsewhere = current
        warnings.showwarning = _capture_warning


@contextlib.contextmanager
def decoder_messages(stderr: bool):
    """Capture what decoders say during the block: Python warnings (Pillow's) raised in this thread and, with
    ``stderr``, what C libraries write to file descriptor 2 (one thread at a time: the descriptor is the
    process's). Yields a list, filled with the messages when the block ends."""
    said: list[str] = []
    _hook_warnings()
    _DECODING.said = caught = []
    with contextlib.ExitStack() as stack:
        stack.callback(delattr, _DECODING, "said")
        sink = None
        if stderr:
            stack.enter_context(_STDERR_REDIRECT)
            sink = stack.enter_context(tempfile.TemporaryFile())
        if sink is not None:
            sys.stderr.flush()
            saved = os.dup(2)
            os.dup2(sink.fileno(), 2)
        try:
            yield said
        finally:
            if sink is not None:
                os.dup2(saved, 2)
                os.close(saved)
                sink.seek(0)
                said.extend(
                    line.strip() for line in sink.read().decode("utf-8", "replace").splitlines() if line.strip()
                )
            said.extend(caught)


_TIFF_COMMON_COMPRESSIONS = (1, 2, 3, 4, 5, 7, 8, 32773, 32946)


def refusal(data: bytes, fmt: str, name: str, error: Exception, said: str) -> ImageDecodeError:
    """The error for a file the decoder refused: unsupported when its header shows a feature from
    :func:`_unsupported_feature`, else corrupt; the decoder's words (and messages) in both."""
    words = str(error).strip() or type(error).__name__
    if said:
        words = f"{words}; {said}"
    feature = _unsupported_feature(data, fmt)
    if feature is not None:
        return ImageUnsupportedError(f"{name}: unsupported: {feature} (the decoder says: {words})")
    return ImageDecodeError(f"{name}: corrupt or truncated {fmt} file (the decoder says: {words})")


def _unsupported_feature(data: bytes, fmt: str) -> str | None:
    """A feature of a file's header that explains why a decoder refused it (an uncommon compression, bit depth,
    colour space or coding), or None (the file is then taken as corrupt)."""
    try:
        if fmt == "JPEG":
            frame = jpeg_frame(data)
            if frame is None:
                return None
            marker, precision, _, _, components, _ = frame
            if precision != 8:
                return f"{precision}-bit JPEG"
            if marker in (0xC3, 0xC7, 0xCB, 0xCF):
                return "lossless JPEG"
            if marker in (0xC5, 0xC6, 0xCD, 0xCE):
                return "hierarchical JPEG"
            if marker >= 0xC9:
                return "arithmetic-coded JPEG"
            return f"JPEG with {components} components" if components not in (0, 1, 3, 4) else None
        if fmt == "TIFF":
            return _tiff_feature(tiff_tags(data))
        if fmt == "BMP" and int.from_bytes(data[14:18], "little") >= 40:
            bits, compression = struct.unpack("<HI", data[28:34])
            if compression in (4, 5):
                return f"BMP holding a {'JPEG' if compression == 4 else 'PNG'} image (compression {compression})"
            if compression not in (0, 1, 2, 3, 6):
                return f"BMP compression {compression}"
            return f"{bits}-bit BMP" if bits not in (1, 2, 4, 8, 16, 24, 32) else None
    except (struct.error, IndexError):
        return None
    return None


def _tiff_feature(tags: dict[int, tuple[int, ...]]) -> str | None:
    """The uncommon feature of a TIFF's first IFD (compression, JPEG depth, colour space, bit depth), or None."""
    compression, bits = first_value(tags, 259, 1), first_value(tags, 258, 1)
    photometric = first_value(tags, 262, -1)
    if compression not in _TIFF_COMMON_COMPRESSIONS:
        return f"TIFF compression {TIFF_COMPRESSIONS.get(compression, compression)} ({compression})"
    if compression == 7 and bits != 8:
        return f"{bits}-bit JPEG-compressed TIFF"
    if photometric not in (0, 1, 2, 3, 5, 6, 8):
        return f"TIFF colour space {TIFF_PHOTOMETRICS.get(photometric, photometric)}"
    if bits == 64 and first_value(tags, 339, 1) != 3:
        return "64-bit integer TIFF samples"
    return f"{bits}-bit TIFF samples" if bits not in (1, 2, 4, 8, 16, 32, 64) else None
