"""Transforms: compiled per-sample augmentations seeded per (epoch, sample), the torch conversions, and user Python callables."""
from __future__ import annotations
