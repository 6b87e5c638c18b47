"""Decoders: the first stage of a field's pipeline, from stored bytes to a batch (scalars, arrays, RGB images with their crops, image arrays, detection targets)."""
from __future__ import annotations
