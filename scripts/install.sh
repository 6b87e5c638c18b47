#!/usr/bin/env bash
# Install ffload with its test tools, and ffcv 1.0.2 (the interop/benchmark peer) where possible.
# torch is pinned first: an unpinned torch would pull gigabytes of CUDA packages on CPU machines.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  # ffcv builds against these (pkg-config finds opencv4 and libturbojpeg); the opencv-python
  # wheel ffcv pulls in (beside our headless one) needs libGL and glib at import time
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq pkg-config libopencv-dev libturbojpeg0-dev libgl1 libglib2.0-0 >/dev/null
fi
$PY -m pip install -q "torch==2.13.0"
if pkg-config --exists opencv4 libturbojpeg 2>/dev/null; then
  $PY -m pip install -q -e ".[test,ffcv]"
else
  echo "note: pkg-config/libopencv-dev/libturbojpeg0-dev missing: installing without ffcv (its tests will be skipped)" >&2
  $PY -m pip install -q -e ".[test]"
fi
