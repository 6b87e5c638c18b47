"""Image codecs shared by conversion, loading and benchmarks: the libjpeg-turbo bindings (:mod:`.turbojpeg`), batched compiled JPEG decoding with crops and DCT scaling (:mod:`.jpeg`), restart-segment crops (:mod:`.restarts`) and the compiled resize (:mod:`.resize`)."""
from __future__ import annotations
