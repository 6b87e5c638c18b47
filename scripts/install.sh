#!/usr/bin/env bash
# Install ffload and its test tools into the project's virtualenv `.venv/`, and ffcv 1.0.2 (the
# interop/benchmark peer) where the machine can build it.
#
# Works with any Python >= 3.10 on PATH, including a system Python that refuses `pip install`
# (PEP 668, "externally-managed-environment"): pip only ever runs inside a virtualenv, never with
# --break-system-packages. Inside an active virtualenv ($VIRTUAL_ENV) that one is used and `.venv`
# becomes a link to it, so `.venv/bin/python` names the environment in every case.
#
# torch: a torch the environment can already import is kept, whatever its version or build (CPU,
# CUDA, ROCm), as long as it is one pyproject.toml admits. Only where none imports is one installed:
# on a machine without an NVIDIA GPU PyTorch's CPU-only wheel index is tried first (a short
# timeout, no retries, that index alone), then the default index, which serves CUDA builds (they
# run on a CPU, but weigh several GB). One line says which build was installed and why.
#
# Environment: PYTHON (interpreter that makes the venv, default python3), FFLOAD_EXTRAS
# (comma-separated pip extras; unset: "test", plus "ffcv" when its build dependencies are present; empty: none),
# FFLOAD_TORCH_INDEX (a pip index URL to install torch from, instead of the choice above; e.g.
# https://download.pytorch.org/whl/cu126 for a given CUDA).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=.venv

is_root() { [ "$(id -u)" = 0 ]; }

if [ -n "${VIRTUAL_ENV:-}" ] && [ -x "$VIRTUAL_ENV/bin/python" ]; then
  if [ "$(cd "$VIRTUAL_ENV" && pwd -P)" != "$(cd "$VENV" 2>/dev/null && pwd -P || true)" ]; then
    rm -rf "$VENV"
    ln -s "$VIRTUAL_ENV" "$VENV"
  fi
elif [ ! -x "$VENV/bin/python" ]; then
  command -v "$PY" >/dev/null || { echo "install: no $PY on PATH; install Python >= 3.10 first" >&2; exit 1; }
  if ! "$PY" -c "import ensurepip, venv" 2>/dev/null; then
    pkg="python$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')-venv"
    if is_root && command -v apt-get >/dev/null; then
      echo "install: $PY has no venv module; installing $pkg with apt-get" >&2
      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$pkg" >/dev/null
    else
      echo "install: $PY cannot create a virtualenv: install the '$pkg' package (sudo apt-get install $pkg), then rerun" >&2
      exit 1
    fi
  fi
  rm -rf "$VENV"
  "$PY" -m venv "$VENV"
fi
VPY="$VENV/bin/python"

extras=${FFLOAD_EXTRAS-}
if [ -z "${FFLOAD_EXTRAS+set}" ]; then
  extras=test
  if is_root && command -v apt-get >/dev/null && ! pkg-config --exists opencv4 libturbojpeg 2>/dev/null; then
    # ffcv builds against these (pkg-config finds opencv4 and libturbojpeg); the opencv-python
    # wheel ffcv pulls in (beside our headless one) needs libGL and glib at import time
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq pkg-config libopencv-dev libturbojpeg0-dev libgl1 libglib2.0-0 >/dev/null
  fi
  if pkg-config --exists opencv4 libturbojpeg 2>/dev/null; then
    extras=test,ffcv
  else
    echo "install: pkg-config/libopencv-dev/libturbojpeg0-dev missing: installing without ffcv (its tests will be skipped)" >&2
  fi
fi

"$VPY" -m pip install -q --upgrade pip

# The torch requirement is pyproject.toml's, so that this script and pip agree on what is supported.
torch_req=$(sed -n 's/^ *"\(torch[<>=!~][^"]*\)",.*/\1/p' pyproject.toml | head -n 1)
torch_req=${torch_req:-torch}
torch_build() {  # e.g. "torch 2.13.0+cpu (CPU-only build)"
  "$VPY" -c 'import torch; v = torch.version
print(f"torch {torch.__version__} (" + (f"CUDA {v.cuda}" if v.cuda else f"ROCm {v.hip}" if getattr(v, "hip", None) else "CPU-only") + " build)")' 2>/dev/null  # (torch warns when numpy is not installed yet)
}
has_nvidia_gpu() { [ -e /proc/driver/nvidia/version ] || { command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; }; }
cpu_index=https://download.pytorch.org/whl/cpu

if "$VPY" - "$torch_req" 2>/dev/null <<'EOF'; then
import sys
from importlib.metadata import version
try:
    from packaging.requirements import Requirement
except ImportError:  # a new venv has only pip's copy
    from pip._vendor.packaging.requirements import Requirement
import torch  # noqa: F401  (importable, not just installed)
sys.exit(0 if Requirement(sys.argv[1]).specifier.contains(version("torch"), prereleases=True) else 1)
EOF
  echo "install: keeping the $(torch_build) this environment has"
elif [ -n "${FFLOAD_TORCH_INDEX:-}" ]; then
  "$VPY" -m pip install -q --index-url "$FFLOAD_TORCH_INDEX" "$torch_req"
  echo "install: installed $(torch_build) from FFLOAD_TORCH_INDEX ($FFLOAD_TORCH_INDEX)"
elif has_nvidia_gpu; then
  "$VPY" -m pip install -q "$torch_req"
  echo "install: installed $(torch_build) from the default index (an NVIDIA GPU is present)"
elif env -u PIP_INDEX_URL -u PIP_EXTRA_INDEX_URL -u PIP_FIND_LINKS PIP_CONFIG_FILE=/dev/null \
       "$VPY" -m pip install -q --index-url "$cpu_index" --timeout 5 --retries 0 \
       "$torch_req" >/dev/null 2>&1; then
  # that index alone: pip.conf's or the environment's other indexes could offer a CUDA build
  echo "install: installed $(torch_build) from PyTorch's CPU-only index (no NVIDIA GPU here)"
else
  "$VPY" -m pip install -q "$torch_req"
  echo "install: installed $(torch_build) from the default index: no NVIDIA GPU here, but PyTorch's" \
       "CPU-only index ($cpu_index) could not be reached; set FFLOAD_TORCH_INDEX to choose an index"
fi
"$VPY" -m pip install -q -e ".${extras:+[$extras]}"
echo "install: ffload installed in $VENV (run 'source $VENV/bin/activate' to put 'ffload' on your PATH)"
