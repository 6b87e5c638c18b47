"""ffload: convert image datasets once into memory-mapped files (.beton / LMDB) and load them fast."""
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
        "tqdm>=4.60",
        "click>=8.0",
        # torch is pinned by the install instructions (see README): on machines without a GPU
        # `pip install torch==2.13.0` must come first so that pip never resolves a CUDA build.
        "torch>=2.0",
        "matplotlib>=3.5",
    ],
    extras_require={
        "ffcv": ["ffcv==1.0.2"],
        "test": ["pytest>=7", "scikit-learn>=1.2", "scikit-image>=0.20", "pillow>=9"],
    },
    entry_points={"console_scripts": ["ffload=ffload.cli:main"]},
)
