#!/usr/bin/env bash
# The README's main job on real data that ships offline: install; build an ImageFolder of real
# photos (scikit-image, scikit-learn) and one of real digits; convert to .beton and LMDB; inspect
# and verify; load (with the loader benchmark); train the ResNet-9 recipe briefly on the digits.
# Everything runs from the project virtualenv that scripts/install.sh makes (.venv/).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
export PATH="$PWD/.venv/bin:$PATH"
OUT=${OUT:-demo}
rm -rf "$OUT/photos" "$OUT/digits"
python scripts/make_demo_data.py "$OUT"
ffload convert "$OUT/photos" "$OUT/photos.beton" --write-mode jpg --max-resolution 512 --overwrite
ffload convert "$OUT/photos" "$OUT/photos.lmdb" --write-mode jpg --max-resolution 512 --overwrite --quiet
ffload inspect "$OUT/photos.beton" --grid "$OUT/photos_grid.png"
ffload inspect "$OUT/photos.lmdb"
ffload verify "$OUT/photos.lmdb" --quiet
ffload bench "$OUT/photos.beton" --pipeline rrc --epochs 3
ffload bench "$OUT/photos.lmdb" --pipeline rrc --epochs 3
ffload recipe cifar10-resnet9 --data "$OUT/digits" --out "$OUT/run" --device cpu --width 0.25 --epochs 8 --batch-size 64
