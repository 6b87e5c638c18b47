#!/usr/bin/env bash
# Install ffload from a clean clone of this checkout's HEAD with each given Python, the way a new
# user does it (`env -i`: no PIP_* variables, a minimal PATH), and run the smoke tests
# (`pytest -m smoke`) with that environment's interpreter. One line per Python at the end.
#
#   bash scripts/smoke_python.sh ~/.pyenv/versions/3.10.13/bin/python ~/.pyenv/versions/3.13.0/bin/python
#
# Each run leaves its log in $OUT (default runs/smoke_python/<version>.log). The pip cache is
# shared with the user's; each environment is removed afterwards (a CUDA build of torch is several GB).
set -uo pipefail
cd "$(dirname "$0")/.."
[ $# -gt 0 ] || { echo "usage: $0 PYTHON [PYTHON ...]" >&2; exit 2; }
OUT=${OUT:-runs/smoke_python}
mkdir -p "$OUT"
status=0
summary=()
for python in "$@"; do
  version=$("$python" -c 'import platform; print(platform.python_version())') || { summary+=("$python: not runnable"); status=1; continue; }
  work=$(mktemp -d)
  git clone -q . "$work/ffload"
  log="$OUT/$version.log"
  start=$SECONDS
  env -i PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" HOME="$HOME" LANG=C.UTF-8 \
      PYTHON="$python" FFLOAD_EXTRAS=test bash -c 'cd "$1" && bash scripts/install.sh && .venv/bin/python -m pytest -q -m smoke -p no:cacheprovider' _ "$work/ffload" >"$log" 2>&1
  rc=$?
  result=$(grep -E '^[0-9]+ (passed|failed)|(passed|failed|error)' "$log" | tail -n 1)
  summary+=("Python $version: exit $rc in $((SECONDS - start)) s; ${result:-no pytest summary} ($log)")
  [ $rc -eq 0 ] || status=1
  rm -rf "$work"
done
printf '%s\n' "${summary[@]}"
exit $status
