#!/usr/bin/env bash
# The README's main job on real data that ships offline: install, build an ImageFolder of real
# photos (scikit-image, scikit-learn) and one of real digits, convert to .beton and LMDB, inspect.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
OUT=${OUT:-demo}
python3 scripts/make_demo_data.py "$OUT"
ffload convert "$OUT/photos" "$OUT/photos.beton" --write-mode jpg --max-resolution 512 --overwrite
ffload convert "$OUT/photos" "$OUT/photos.lmdb" --write-mode jpg --max-resolution 512 --overwrite --quiet
ffload inspect "$OUT/photos.beton" --grid "$OUT/photos_grid.png"
ffload inspect "$OUT/photos.lmdb"
