"""Build the offline demo datasets under OUT: OUT/digits (sklearn digits as 32x32 RGB PNGs, train/test ImageFolders)
and OUT/photos (an ImageNet-like ImageFolder of crops of the photos bundled with scikit-image/scikit-learn).

    python scripts/make_demo_data.py demo/
    ffload convert demo/digits/train digits-train.beton
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from ffload.convert.demo_data import build_digits_folder, build_photos_folder


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", help="output folder (OUT/digits and OUT/photos must not exist or be empty)")
    parser.add_argument("--digits-size", type=int, default=32, help="digit image side in pixels (default 32)")
    parser.add_argument("--test-fraction", type=float, default=0.2, help="digits test split (default 0.2)")
    parser.add_argument("--photos-per-class", type=int, default=20, help="photos per class (default 20)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        digits = build_digits_folder(
            os.path.join(args.out, "digits"), size=args.digits_size, test_fraction=args.test_fraction, seed=args.seed
        )
        photos = build_photos_folder(
            os.path.join(args.out, "photos"), n_per_class=args.photos_per_class, seed=args.seed
        )
    except (ImportError, FileExistsError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(json.dumps({"digits": digits, "photos": photos}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
