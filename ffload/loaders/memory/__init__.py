"""Memory managers: where a batch's bytes come from (the OS page cache with read-ahead, a bounded process cache, a page pool for remote datasets) and the epoch's schedule."""
from __future__ import annotations
