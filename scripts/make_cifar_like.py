"""Write a folder in the official CIFAR-10 (or CIFAR-100) python layout from real images: the sklearn digits,
upscaled to 32x32 RGB. A fixture generator for trying `ffload convert` / the CIFAR recipe without the real archive.

    python scripts/make_cifar_like.py /tmp/cifar-10-batches-py
    python scripts/make_cifar_like.py --variant cifar100 /tmp/cifar-100-python

CIFAR-100 gets fine label = digit and coarse label = digit parity (even/odd).
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "tests"))
from cifar_fixture import write_cifar10_folder, write_cifar100_folder  # noqa: E402

from ffload.convert.demo_data import digits_images  # noqa: E402

DIGIT_NAMES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", help="folder to write (must not exist or be empty)")
    parser.add_argument("--variant", choices=("cifar10", "cifar100"), default="cifar10")
    parser.add_argument("--test-fraction", type=float, default=0.2, help="share of the 1797 digits in the test split")
    parser.add_argument("--seed", type=int, default=0, help="seed of the train/test shuffle")
    args = parser.parse_args(argv)
    if os.path.isdir(args.out) and os.listdir(args.out):
        print(f"error: {args.out} exists and is not empty", file=sys.stderr)
        return 1
    images, labels = digits_images(32)
    order = np.random.default_rng(args.seed).permutation(len(labels))
    n_test = int(round(len(labels) * args.test_fraction))
    test, train = order[:n_test], order[n_test:]
    if args.variant == "cifar10":
        write_cifar10_folder(
            args.out, images[train], labels[train], images[test], labels[test], label_names=DIGIT_NAMES
        )
    else:
        write_cifar100_folder(
            args.out,
            images[train],
            labels[train],
            labels[train] % 2,
            images[test],
            labels[test],
            labels[test] % 2,
            fine_names=DIGIT_NAMES,
            coarse_names=["even", "odd"],
        )
    print(f"wrote {args.variant} layout to {args.out}: {len(train)} train, {len(test)} test images")
    return 0


if __name__ == "__main__":
    sys.exit(main())
