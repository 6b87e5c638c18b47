"""JPEG decoders for the device stage: a batch of payloads in, the crop box of each sample out, as
``(h, w, 3) uint8`` RGB tensors on the stage's device.

Three backends, in the order :func:`select` prefers them on a CUDA device:

* ``"nvimgcodec"`` — NVIDIA nvImageCodec (``nvidia-nvimgcodec-cu13`` with its ``nvjpeg`` extra):
  one batched call that decodes only each sample's box (``Region``), on the GPU's hardware JPEG
  engines where the GPU has them (A100/H100 class) and nvJPEG on the CUDA cores otherwise;
* ``"torchvision"`` — ``torchvision.io.decode_jpeg(list, device=...)`` (nvJPEG, whole images; the
  box is a view);
* ``"host"`` — ffload's own libjpeg-turbo decode on the calling worker thread, then a copy to the
  device: the reference the tests compare with, and what runs on a CPU device.

Every backend decodes with the accurate IDCT, full size, no EXIF rotation (stored pixels are
already upright), RGB. A payload a backend cannot decode raises :class:`~ffload.errors.FormatError`
naming the sample.
"""

from __future__ import annotations

import importlib.util
import threading
from collections.abc import Sequence

import numpy as np
import torch

from ffload.codecs import jpeg
from ffload.errors import ConfigurationError, FormatError, UnavailableError

#: Backend names accepted by :func:`select` (``"auto"`` picks the first available).
BACKENDS = ("nvimgcodec", "torchvision", "host")


class JpegBackend:
    """Decode a batch of JPEG payloads to their crop boxes on ``device``.

    Args:
        device: the torch device the boxes end on.

    Attributes:
        name: the backend's name (one of :data:`BACKENDS`), reported by the loader's stats.
    """

    name = ""

    def __init__(self, device: torch.device):
        self.device = device

    def decode(self, payloads: Sequence[np.ndarray], boxes: np.ndarray, samples: np.ndarray) -> list[torch.Tensor]:
        """Decode ``payloads`` (``(n_k,) uint8`` each) and return each sample's box.

        Args:
            payloads: the JPEG files, one per sample, kept alive by the caller until the work
                queued on the current CUDA stream is done.
            boxes: ``(B, 4) int64`` ``(top, left, height, width)`` in pixels of the stored image.
            samples: ``(B,) int64`` sample ids, for error messages.

        Returns:
            ``B`` tensors ``(height, width, 3) uint8`` (views allowed) on :attr:`device`, ready in
            the order of the current CUDA stream.

        Raises:
            FormatError: a payload is not a JPEG the backend decodes, naming the sample.
        """
        raise NotImplementedError


class HostBackend(JpegBackend):
    """libjpeg-turbo on the calling thread (:func:`ffload.codecs.jpeg.decode_whole`), pixel-equal
    to the CPU decoders' full-size decode, then ``tensor.to(device)``."""

    name = "host"

    def decode(self, payloads, boxes, samples):
        result = []
        for data, (top, left, h, w), s in zip(payloads, boxes, samples):
            size, message = jpeg.header_size(data)
            if size is None:
                raise FormatError(f"sample {int(s)}: corrupt JPEG ({data.size} bytes): {message}", sample=int(s))
            image = np.empty((size[1], size[0], 3), np.uint8)
            message = jpeg.decode_whole(data, image)
            if message:
                raise FormatError(f"sample {int(s)}: corrupt JPEG ({data.size} bytes): {message}", sample=int(s))
            result.append(torch.from_numpy(image[top : top + h, left : left + w]).to(self.device))
        return result


class TorchvisionBackend(JpegBackend):
    """``torchvision.io.decode_jpeg(list, device=device, mode=RGB)``: nvJPEG on the CUDA cores,
    whole images in one call; each box is a view of its image."""

    name = "torchvision"

    def __init__(self, device: torch.device):
        super().__init__(device)
        from torchvision.io import ImageReadMode, decode_jpeg

        self._decode, self._mode = decode_jpeg, ImageReadMode.RGB
        self._lock = threading.Lock()  # one nvJPEG handle in torchvision, not documented as thread-safe

    def decode(self, payloads, boxes, samples):
        tensors = [torch.from_numpy(p) for p in payloads]
        try:
            with self._lock:
                images = self._decode(tensors, device=self.device, mode=self._mode)
        except RuntimeError:  # the batch call does not say which sample: decode them one by one
            for data, s in zip(tensors, samples):
                try:
                    self._decode(data, device=self.device, mode=self._mode)
                except RuntimeError as one:
                    raise FormatError(f"sample {int(s)}: nvJPEG cannot decode it: {one}", sample=int(s)) from one
            raise
        return [img.permute(1, 2, 0)[t : t + h, x : x + w] for img, (t, x, h, w) in zip(images, boxes)]


class NvImageCodecBackend(JpegBackend):
    """nvImageCodec: every sample's box decoded in one batched call (``CodeStream`` sub-streams
    with a ``Region``), on the current CUDA stream; on a CPU device its CPU (libjpeg-turbo)
    backend, which the tests use."""

    name = "nvimgcodec"

    def __init__(self, device: torch.device):
        super().__init__(device)
        from nvidia import nvimgcodec

        self._nv = nvimgcodec
        self._local = threading.local()  # a decoder is not thread-safe: one per worker thread
        self._decoder()  # fails here, not on a worker, when nvImageCodec cannot start
        self._params = nvimgcodec.DecodeParams(
            apply_exif_orientation=False, color_spec=nvimgcodec.ColorSpec.SRGB, allow_any_depth=False
        )

    def _decoder(self):
        decoder = getattr(self._local, "decoder", None)
        if decoder is None:
            nv = self._nv
            if self.device.type == "cuda":
                decoder = nv.Decoder(device_id=self.device.index if self.device.index is not None else 0)
            else:
                decoder = nv.Decoder(device_id=nv.NVIMGCODEC_DEVICE_CPU_ONLY, backends=[nv.Backend(nv.CPU_ONLY)])
            self._local.decoder = decoder
        return decoder

    def decode(self, payloads, boxes, samples):
        nv = self._nv
        streams = [
            nv.CodeStream(p).get_sub_code_stream(region=nv.Region(start=(int(t), int(x)), end=(int(t + h), int(x + w))))
            for p, (t, x, h, w) in zip(payloads, boxes)
        ]
        stream = torch.cuda.current_stream(self.device).cuda_stream if self.device.type == "cuda" else 0
        images = self._decoder().decode(streams, params=self._params, cuda_stream=stream)
        result = []
        for image, data, s in zip(images, payloads, samples):
            if image is None:
                raise FormatError(f"sample {int(s)}: nvImageCodec cannot decode it ({data.size} bytes)", sample=int(s))
            if self.device.type == "cuda":
                result.append(torch.from_dlpack(image))  # ordered on the current stream, no copy
            else:
                result.append(torch.from_numpy(np.asarray(image)))
        return result


_CLASSES = {"nvimgcodec": NvImageCodecBackend, "torchvision": TorchvisionBackend, "host": HostBackend}


def available(name: str) -> bool:
    """Whether backend ``name``'s package can be imported here (without importing it)."""
    if name == "nvimgcodec":
        return (
            importlib.util.find_spec("nvidia") is not None and importlib.util.find_spec("nvidia.nvimgcodec") is not None
        )
    if name == "torchvision":
        return importlib.util.find_spec("torchvision") is not None
    return name == "host"


def select(device: torch.device, name: str = "auto") -> JpegBackend:
    """The JPEG backend for ``device``.

    ``"auto"``: on CUDA, nvImageCodec if it imports and initialises, else torchvision if it
    imports, else the host decoder (which then does all the decoding on the worker threads); on
    a CPU device, the host decoder.

    Raises:
        ConfigurationError: an unknown name.
        UnavailableError: a named backend that cannot run here (the message says why).
    """
    if name not in BACKENDS and name != "auto":
        raise ConfigurationError(f"unknown device JPEG backend {name!r}; choose from {', '.join(BACKENDS)} or 'auto'")
    if name != "auto":
        if not available(name):
            raise UnavailableError(f"the {name} JPEG backend is not installed here")
        try:
            return _CLASSES[name](device)
        except (ImportError, RuntimeError, OSError) as e:
            raise UnavailableError(f"the {name} JPEG backend cannot run here: {e}") from e
    if device.type != "cuda":
        return HostBackend(device)
    for candidate in ("nvimgcodec", "torchvision"):
        if available(candidate):
            try:
                return _CLASSES[candidate](device)
            except (ImportError, RuntimeError, OSError):
                continue
    return HostBackend(device)
