#!/usr/bin/env bash
# Install ffload and its test tools into the project's virtualenv `.venv/`, and ffcv 1.0.2 (the
# interop/benchmark peer) where the machine can build it.
#
# Works with any Python >= 3.9 on PATH, including a system Python that refuses `pip install`
# (PEP 668, "externally-managed-environment"): pip only ever runs inside a virtualenv, never with
# --break-system-packages. Inside an active virtualenv ($VIRTUAL_ENV) that one is used and `.venv`
# becomes a link to it, so `.venv/bin/python` names the environment in every case.
# torch is pinned first: an unpinned torch would pull gigabytes of CUDA packages on CPU machines.
#
# Environment: PYTHON (interpreter that makes the venv, default python3), FFLOAD_EXTRAS
# (comma-separated pip extras; default "test", plus "ffcv" when its build dependencies are present).
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
  command -v "$PY" >/dev/null || { echo "install: no $PY on PATH; install Python >= 3.9 first" >&2; exit 1; }
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

extras=${FFLOAD_EXTRAS:-}
if [ -z "$extras" ]; then
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
"$VPY" -m pip install -q "torch==2.13.0"
"$VPY" -m pip install -q -e ".[$extras]"
echo "install: ffload installed in $VENV (run 'source $VENV/bin/activate' to put 'ffload' on your PATH)"
