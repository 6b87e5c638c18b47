"""The compiled resize (ffload.loaders.resize) against cv2.resize of the same crop, cut out."""
from __future__ import annotations

import cv2
import numpy as np
import pytest
from skimage import data

from ffload.loaders.resize import AREA, LINEAR, interpolation, resize_rgb


@pytest.mark.parametrize("box,out,mode", [
    ((50, 60, 107, 123), (224, 224), LINEAR),  # enlarged: border taps would fall outside the box
    ((0, 0, 150, 90), (224, 200), LINEAR),  # at the image's top-left corner
    ((40, 30, 201, 260), (224, 224), LINEAR),  # one side grows, the other shrinks
    ((17, 33, 300, 380), (224, 224), AREA),
    ((80, 70, 300, 380), (160, 128), AREA),  # at the image's bottom-right corner
])
def test_a_window_resizes_as_cv2_resizes_the_cut_out_crop(box, out, mode):
    img = np.ascontiguousarray(data.astronaut()[:380, :450])
    top, left, h, w = box
    oh, ow = out
    assert interpolation(h, w, oh, ow) == mode
    ref = cv2.resize(np.ascontiguousarray(img[top:top + h, left:left + w]), (ow, oh),
                     interpolation=cv2.INTER_AREA if mode == AREA else cv2.INTER_LINEAR)
    dst = np.zeros(oh * ow * 3, np.uint8)
    resize_rgb(img.reshape(-1), 0, img.shape[1] * 3, img.shape[0], img.shape[1], float(top), float(left),
               float(h), float(w), mode, dst, 0, oh, ow, False, np.empty(2 * oh * img.shape[1] * 3, np.uint16))
    diff = np.abs(dst.reshape(oh, ow, 3).astype(int) - ref)
    assert diff.max() <= 1, diff.max()  # fixed-point rounding: one level at most
