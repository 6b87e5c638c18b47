"""ffload's LMDB schema, both directions: ``reader`` (the schema, open_lmdb, LMDBWriter) and ``pages``
(the structural check of ``data.mdb``)."""
from __future__ import annotations
