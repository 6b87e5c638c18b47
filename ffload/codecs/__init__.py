"""Image codecs shared by conversion, loading and benchmarks.

turbojpeg    the libjpeg-turbo bindings
jpeg         batched compiled JPEG decoding with crops and DCT scaling
restarts     restart-segment crops
resize       the compiled resize
jpeg_encode  JPEG encoding for conversion, through OpenCV (imports no numba)
"""

from __future__ import annotations
