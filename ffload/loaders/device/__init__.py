"""The RGB decoders' device path (experimental): ``device="cuda"`` on
:class:`~ffload.loaders.RandomResizedCropRGBImageDecoder`, :class:`~ffload.loaders.CenterCropRGBImageDecoder`,
:class:`~ffload.loaders.ResizeRGBImageDecoder` and :class:`~ffload.loaders.SimpleRGBImageDecoder`.

The worker threads draw crop boxes and flips exactly as on the CPU path (same kernels, same seeds);
:mod:`.stage` decodes the batch's JPEGs on the device in one call (:mod:`.codecs`: nvImageCodec,
torchvision's nvJPEG, or the host decoder), and :mod:`.resample` crops, resizes and flips the whole
batch in a few torch kernels; a share of each batch can be decoded by the CPU path at the same time
(the hybrid split). The torch code runs on CPU tensors as well, which is how the tests check it.
"""
