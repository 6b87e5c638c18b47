"""ffload: convert image datasets once into memory-mapped files (.beton / LMDB) and load them fast."""
from __future__ import annotations

from setuptools import find_packages, setup

setup(
    name="ffload",
    version="0.1.0",
    description="Memory-mapped datasets (FFCV .beton, LMDB) and JIT-compiled loading pipelines for PyTorch",
    long_description=open("README.md", encoding="utf-8").read() if __import__("os").path.exists("README.md") else "",
    long_description_content_type="text/markdown",
    packages=find_packages(include=["ffload", "ffload.*"]),
    python_requires=">=3.9",
    install_requires=[
        "numpy>=1.23",
        "numba>=0.57",
        "lmdb>=1.4",
        "opencv-python-headless>=4.8",
        # the decoder of record for source images (ffload/convert/images.py): Image.Exif, exif_transpose with XMP
        # and raw-profile orientation; tifffile reads 16-bit/float TIFF samples exactly (planar, tiled)
        "pillow>=11",
        "tifffile>=2023.1",
        # libjpeg-turbo 3 (TurboJPEG 3 API) as a shared library for the compiled JPEG path; only
        # its bundled libturbojpeg is used (see ffload/loaders/turbojpeg.py). Pinned: the module
        # is a 0.0.x binding whose wheel layout we rely on.
        "turbojpeg==0.0.2",
        "tqdm>=4.60",
        "click>=8.0",
        # torch is pinned by the install instructions (see README): on machines without a GPU
        # `pip install torch==2.13.0` must come first so that pip never resolves a CUDA build.
        "torch>=2.0",
        "matplotlib>=3.5",
    ],
    extras_require={
        "ffcv": ["ffcv==1.0.2"],
        "webdataset": ["braceexpand>=0.1.7"],
        "hf": ["datasets>=2.14"],
        "ray": ["ray>=2.9"],  # convert --engine ray (ffload.convert.ray_engine)
        "s3": ["fsspec>=2023.1", "s3fs>=2023.1"],  # s3:// datasets and conversions (ffload.storage)
        "http": ["fsspec>=2023.1", "aiohttp>=3.8"],  # http(s):// datasets (ffload.storage, fsspec's HTTPFileSystem)
        "gcs": ["fsspec>=2023.1", "gcsfs>=2023.1"],  # gs:// datasets and conversions (ffload.storage)
        "test": ["pytest>=7", "ruff>=0.6", "braceexpand>=0.1.7", "datasets>=2.14", "albumentations>=1.4", "scikit-learn>=1.2", "scikit-image>=0.20", "pillow>=9",
                 # object-storage tests: a real S3 server (moto, which brings boto3) on 127.0.0.1, and the s3
                 # extra. boto3 is not named here: unpinned beside s3fs, pip backtracked through every
                 # boto3 release newer than aiobotocore's botocore pin (minutes per install)
                 "moto[server]>=5.0", "fsspec>=2023.1", "s3fs>=2023.1",
                 # http(s):// tests: a real HTTP server in the test (tests/http_server.py), and the http extra
                 "aiohttp>=3.8",
                 # gs:// tests: a GCS emulator (a Python server) on 127.0.0.1, and the gcs extra
                 "gcsfs>=2023.1", "gcp-storage-emulator>=2022.6"],
    },
    entry_points={"console_scripts": ["ffload=ffload.cli:main"]},
)
