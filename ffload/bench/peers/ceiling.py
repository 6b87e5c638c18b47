"""The JPEG decode ceiling, measured: full-size decoding of a dataset's own JPEG payloads,
held in memory, by one thread and by ``num_threads`` threads at once in the same process.

No loader that decodes those JPEGs at full size can beat the multi-thread rate on the same
machine at the same moment, so loaders are compared with that measured figure (the one-thread
rate is reported beside it: on a shared or throttled machine the threads get fewer cores than
asked for). The decoder is a parameter (:data:`DECODERS`); by default the fastest available
(:func:`default_decoder`): TurboJPEG into a reused buffer, else OpenCV.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..measurement import EpochRecord, epoch_record, median_after_warmup

Decoder = Callable[[object], object]
"""``decode(payload (n,) uint8 JPEG bytes) -> (H, W, 3) uint8 RGB array, or None when the
bytes do not decode`` (``cv2.imdecode``'s contract). It must be thread-safe and should release
the GIL."""


def opencv_decoder() -> Decoder:
    """OpenCV's ``cv2.imdecode(payload, IMREAD_COLOR_RGB)`` (its bundled libjpeg-turbo, through the
    libjpeg API; releases the GIL). A new output array per image."""
    import cv2

    flag = cv2.IMREAD_COLOR_RGB
    return lambda payload: cv2.imdecode(payload, flag)


def turbojpeg_decoder() -> Decoder:
    """libjpeg-turbo's TurboJPEG 3 API, the library ffload's loaders call
    (:mod:`ffload.codecs.turbojpeg`): ``tj3DecompressHeader`` then ``tj3Decompress8`` to RGB at
    full size, default settings (accurate integer IDCT, fancy upsampling), one handle and one
    reused output buffer per thread (ctypes releases the GIL). It returns a view of that buffer,
    valid until the thread's next call; warnings count as failures, as in the loaders. At least
    as fast as :func:`opencv_decoder` on the same bytes (no libjpeg row loop, no new array per
    image); ``scripts/bench_jpeg.py`` measures both in one run.

    Raises:
        ffload.errors.UnavailableError: no TurboJPEG 3 library (:func:`available_decoders` then leaves it
            out).
    """
    import threading

    import numpy as np

    from ffload.codecs import jpeg
    from ffload.errors import UnavailableError

    if jpeg.backend() != "turbojpeg":
        raise UnavailableError("decoder 'turbojpeg' needs the TurboJPEG 3 library (pip install turbojpeg==0.0.2)")
    local = threading.local()

    def decode(payload):
        data = np.ascontiguousarray(payload, dtype=np.uint8)
        size, _ = jpeg.header_size(data)
        if size is None or size[::-1] != jpeg.frame_size(data, 0, data.size) or min(size) <= 0:
            return None  # refused, or no frame header of this size (tables only: the handle's last size)
        width, height = size
        out = getattr(local, "out", None)
        if out is None or out.size < height * width * 3:
            out = local.out = np.empty(height * width * 3, np.uint8)
        image = out[: height * width * 3].reshape(height, width, 3)
        return None if jpeg.decode_whole(data, image) else image

    return decode


DECODERS: dict[str, Callable[[], Decoder]] = {"opencv": opencv_decoder, "turbojpeg": turbojpeg_decoder}
"""Decoder factories by name (:attr:`BenchConfig.decoder`)."""


def available_decoders() -> list[str]:
    """The names of :data:`DECODERS` usable here, fastest first (``turbojpeg`` needs the
    TurboJPEG 3 library)."""
    from ffload.codecs import turbojpeg as tj

    return (["turbojpeg"] if tj.library() is not None else []) + ["opencv"]


def default_decoder() -> str:
    """The decoder the ceiling uses unless told: the fastest available (the issue's definition:
    a full-size decode of the same bytes with the fastest decoder available)."""
    return available_decoders()[0]


@dataclass
class DecodeCeiling:
    """What :func:`measure_decode_ceiling` measured.

    Attributes:
        num_threads: threads of the concurrent passes.
        single_thread: one :class:`EpochRecord` per one-thread pass over every payload.
        threads: one per pass of ``num_threads`` threads decoding interleaved shares.
        single_thread_img_s, threads_img_s: images/s, medians of passes 1.. (pass 0 alone when
            there is one).
    """

    num_threads: int
    single_thread: list[EpochRecord]
    threads: list[EpochRecord]
    single_thread_img_s: float
    threads_img_s: float


def measure_decode_ceiling(
    payloads: Sequence, num_threads: int, passes: int, decode: Decoder, names: Sequence[str] | None = None
) -> DecodeCeiling:
    """Decode every payload ``passes`` times in this thread, then ``passes`` times with
    ``num_threads`` threads (thread ``t`` decodes ``payloads[t::num_threads]``), timing each pass.

    Args:
        payloads: JPEG byte arrays (``(n,) uint8``).
        num_threads, passes: >= 1.
        decode: a :data:`Decoder`.
        names: one label per payload for error messages (default ``'payload <i>'``).

    Raises:
        ffload.errors.ConfigurationError: ``payloads`` is empty or a count is < 1.
        ffload.errors.FormatError: ``decode`` returns ``None`` (names the payload).
    """
    from ffload.errors import ConfigurationError, FormatError  # here only: the bench worker runs without ffload

    if not payloads:
        raise ConfigurationError("payloads is empty: no payload to decode")
    if num_threads < 1 or passes < 1:
        raise ConfigurationError(f"num_threads and passes must be >= 1, got {num_threads} and {passes}")
    names = list(names) if names is not None else [f"payload {i}" for i in range(len(payloads))]

    def decode_share(start: int) -> None:
        for i in range(start, len(payloads), num_threads):
            if decode(payloads[i]) is None:
                raise FormatError(f"{names[i]}: the JPEG payload does not decode")

    single = []
    for p in range(passes):
        t0 = time.perf_counter()
        for i, payload in enumerate(payloads):
            if decode(payload) is None:
                raise FormatError(f"{names[i]}: the JPEG payload does not decode")
        single.append(epoch_record(p, time.perf_counter() - t0, len(payloads)))
    threads = []
    with concurrent.futures.ThreadPoolExecutor(num_threads) as pool:
        for p in range(passes):
            t0 = time.perf_counter()
            list(pool.map(decode_share, range(num_threads)))
            threads.append(epoch_record(p, time.perf_counter() - t0, len(payloads)))
    return DecodeCeiling(num_threads, single, threads, median_after_warmup(single), median_after_warmup(threads))


def load_jpeg_payloads(path: str, image_field: str, num_samples: int | None = None) -> tuple[list[int], list]:
    """The JPEG payloads of ``image_field`` among the first ``num_samples`` samples (all when
    ``None``) of the dataset at ``path``, copied into memory.

    Returns ``(sample indices, payloads ((n,) uint8 arrays))``.

    Raises:
        ffload.formats.DatasetError: ``path`` is not a dataset.
        ffload.errors.ConfigurationError: the field holds no JPEG sample.
    """
    import numpy as np

    from ffload.errors import ConfigurationError
    from ffload.formats import open_dataset
    from ffload.formats.fields.image import JPG

    view = open_dataset(path)
    region = view.open_region()
    n = view.num_samples if num_samples is None else min(num_samples, view.num_samples)
    indices = np.flatnonzero(view.metadata[image_field]["mode"][:n] == JPG).tolist()
    if not indices:
        raise ConfigurationError(
            f"{path}: field {image_field!r} has no JPEG samples; the decode ceiling applies to JPEG datasets",
            path=path,
            field=image_field,
        )
    payloads = [np.array(view.payload(image_field, i, region)) for i in indices]
    del region
    return indices, payloads
