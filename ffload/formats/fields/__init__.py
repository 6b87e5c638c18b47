"""Field types: what a dataset column holds and how it is encoded (FFCV's fields and ffload's own), with their binary arguments and metadata layouts."""
from __future__ import annotations
