"""Write the golden .beton fixtures in tests/fixtures/ with ffcv 1.0.2's own DatasetWriter.

    python scripts/make_ffcv_fixtures.py [--out tests/fixtures]

Each fixture is gzipped (ffcv pads pages to >= 2 MiB with zeros) next to an .npz of the exact
values that went in, so that tests check our reader against ffcv's writer without ffcv installed.
Images are real: scikit-learn's digits (upscaled) and crops of scikit-image's photos.
"""

from __future__ import annotations

import argparse
import gzip
import os
import shutil
import tempfile

import numpy as np


def source_samples():
    """12 real images of varying size with labels, floats, arrays, bytes and JSON values."""
    import cv2
    from skimage import data
    from sklearn.datasets import load_digits

    digits = load_digits()
    images, labels = [], []
    for i in range(8):
        d = (digits.images[i] * (255 / 16)).astype(np.uint8)
        d = cv2.resize(d, (16 + 2 * i, 16 + i), interpolation=cv2.INTER_NEAREST)
        images.append(np.repeat(d[:, :, None], 3, axis=2))
        labels.append(int(digits.target[i]))
    for k, photo in enumerate([data.astronaut(), data.chelsea(), data.coffee(), data.rocket()]):
        y, x = 20 * k, 30 * k
        images.append(np.ascontiguousarray(photo[y : y + 48 + 8 * k, x : x + 64 - 4 * k, :3]))
        labels.append(10 + k)
    n = len(images)
    floats = np.linspace(-1.5, 2.5, n)
    arrays = np.arange(n * 6, dtype=np.float32).reshape(n, 2, 3) / 7
    blobs = [bytes(range(i, 3 * i + 1)) for i in range(n)]
    docs = [{"index": i, "name": f"sample-{i}", "tags": list(range(i % 3))} for i in range(n)]
    return images, labels, floats, arrays, blobs, docs


class _Samples:
    def __init__(self, rows):
        self.rows = rows

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return self.rows[i]


def write_fixtures(out: str) -> None:
    from ffcv.fields import BytesField, FloatField, IntField, JSONField, NDArrayField, RGBImageField
    from ffcv.writer import DatasetWriter

    images, labels, floats, arrays, blobs, docs = source_samples()
    os.makedirs(out, exist_ok=True)
    tmp = tempfile.mkdtemp()
    try:
        raw_rows = [
            (images[i], labels[i], floats[i], arrays[i], np.frombuffer(blobs[i], np.uint8), docs[i])
            for i in range(len(images))
        ]
        jobs = {
            "ffcv_all_fields_raw.beton": (
                {
                    "image": RGBImageField(write_mode="raw"),
                    "label": IntField(),
                    "value": FloatField(),
                    "array": NDArrayField(np.dtype("float32"), (2, 3)),
                    "blob": BytesField(),
                    "doc": JSONField(),
                },
                raw_rows,
            ),
            "ffcv_images_jpg.beton": (
                {"image": RGBImageField(write_mode="jpg", jpeg_quality=90), "label": IntField()},
                [(images[i], labels[i]) for i in range(len(images))],
            ),
        }
        for name, (fields, rows) in jobs.items():
            path = os.path.join(tmp, name)
            DatasetWriter(path, fields, num_workers=1).from_indexed_dataset(_Samples(rows))
            with open(path, "rb") as src, gzip.open(os.path.join(out, name + ".gz"), "wb", 9) as dst:
                shutil.copyfileobj(src, dst)
    finally:
        shutil.rmtree(tmp)
    shapes = np.array([im.shape for im in images], dtype=np.int64)
    np.savez_compressed(
        os.path.join(out, "ffcv_fixtures_expected.npz"),
        pixels=np.concatenate([im.reshape(-1) for im in images]),
        shapes=shapes,
        labels=np.array(labels, dtype=np.int64),
        floats=floats,
        arrays=arrays,
        blob_lengths=np.array([len(b) for b in blobs]),
        blobs=np.frombuffer(b"".join(blobs), np.uint8),
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures"))
    write_fixtures(parser.parse_args().out)
