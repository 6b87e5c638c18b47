#!/usr/bin/env bash
# Build .bench_gpu/ (git-ignored, ~35 MB): what scripts/bench_gpu.py needs on a GPU node that has no package
# index — the wheels ffload needs there beyond torch/torchvision/numba/numpy/OpenCV/Pillow (lmdb, turbojpeg,
# tifffile), nvImageCodec with nvJPEG, and py-spy (the GIL-sampled serial fraction of bench_scale.py), for the
# node's Python (PY, default 3.12), and six real photos (PNG) to synthesise ImageNet-sized JPEGs from. Run it
# here (where pip reaches an index), then carry .bench_gpu:
#
#   bash scripts/bench_gpu_assets.sh
#   python scripts/bench_gpu.py --out OUT --wheels .bench_gpu/wheels --photos .bench_gpu/photos
#   python scripts/bench_jpeg.py --photos .bench_gpu/photos --workers 1,4,8,16    # wheels on PYTHONPATH
# (py-spy's executable is the unpacked wheel's py_spy-*.data/scripts/py-spy: make it executable, put it on PATH)
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PY:-3.12}
python=${PYTHON:-.venv/bin/python}
mkdir -p .bench_gpu/wheels .bench_gpu/photos
"$python" -m pip download -q --no-deps --only-binary=:all: --python-version "$py" \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
  --platform manylinux1_x86_64 --platform manylinux_2_5_x86_64 \
  -d .bench_gpu/wheels lmdb "turbojpeg==0.0.2" tifffile nvidia-nvimgcodec-cu13 nvidia-nvjpeg py-spy
"$python" - <<'PY'
from PIL import Image
from skimage import data
from sklearn.datasets import load_sample_images

photos = dict(zip(("china", "flower"), load_sample_images().images))
photos.update(astronaut=data.astronaut(), chelsea=data.chelsea(), coffee=data.coffee(), rocket=data.rocket())
for name, image in photos.items():
    Image.fromarray(image).save(f".bench_gpu/photos/{name}.png")
PY
du -sh .bench_gpu
