"""The keys of an ffload LMDB database and the constants its reader and writer share (the schema:
:mod:`ffload.formats.lmdb`): the sample keys, the table keys, the format's name and versions, and
the places table's mark for a value whose place is not recorded."""

from __future__ import annotations

import numpy as np

from ffload.formats.origins import ORIGINS_KEY

__all__ = [
    "META_KEY",
    "RECORDS_KEY",
    "PLACES_KEY",
    "TABLE_KEYS",
    "UNPLACED",
    "FORMAT_NAME",
    "VERSION",
    "READABLE_VERSIONS",
    "KEY_FORMAT",
    "sample_key",
]

META_KEY = b"__ffload__"
RECORDS_KEY = b"__ffload_records__"
PLACES_KEY = b"__ffload_places__"
UNPLACED = np.uint64(2**64 - 1)
"""The offset in the places table of a value whose place in ``data.mdb`` is not recorded."""
TABLE_KEYS = (META_KEY, ORIGINS_KEY, RECORDS_KEY, PLACES_KEY)
"""The keys that are not samples': they sort after the sample keys and are written last."""
FORMAT_NAME = "ffload-lmdb"
VERSION = 2
READABLE_VERSIONS = (1, 2)
KEY_FORMAT = b"%010d"


def sample_key(index: int) -> bytes:
    """The LMDB key of sample ``index``: 10 ASCII digits."""
    return KEY_FORMAT % index
