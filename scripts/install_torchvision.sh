#!/usr/bin/env bash
# Install into the project virtualenv (.venv/) the torchvision that matches its torch build, and check that
# it imports: torchvision's wheels are linked against one torch build (PyPI's against the CUDA build, which
# runs without a GPU; PyTorch's CPU index's against the CPU build), and next to another `import torchvision`
# fails ("operator torchvision::nms does not exist"). Used by .ci/run for the torchvision parity tests
# (pytest -m torchvision); they skip, saying why, where torchvision does not import.
set -euo pipefail
cd "$(dirname "$0")/.."
VPY=.venv/bin/python
index=$("$VPY" -c "import torch; print('' if torch.version.cuda else 'https://download.pytorch.org/whl/cpu')")
torch_version=$("$VPY" -c "import torch; print(torch.__version__.split('+')[0])")
# no upgrade of torch: pip picks the torchvision release built for this torch
"$VPY" -m pip install -q ${index:+--index-url "$index"} torchvision "torch==$torch_version"
"$VPY" -c "import torchvision, torch; print('install: torchvision', torchvision.__version__, 'beside torch', torch.__version__)"
