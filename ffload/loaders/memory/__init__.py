"""Memory managers: where a batch's bytes come from, and the epoch's schedule they evict by.

* ``base``: ``MemoryManager``, the ``typing.Protocol`` of the hooks the loader, its workers and the read-ahead call.
* ``os_cache``: ``OSCacheMemory`` (``os_cache=True``), the data file memory-mapped read-only.
* ``process_cache``: ``ProcessCacheMemory`` (``os_cache=False``), a bounded cache of 4-64 KiB blocks; ``cache_block``.
* ``pagepool``: ``PagePoolMemory``, a fixed pool of ``.beton`` page slots (QUASI_RANDOM, remote datasets).
* ``pagesource``: where the pool's pages come from: ``FilePages`` (``preadv``), ``RemotePages`` (range GETs).
* ``readahead``: ``ReadAhead`` (``madvise(WILLNEED)`` ahead of the batches), ``PagePoolReadAhead`` (pool prefetch).
* ``schedule``: ``EpochSchedule`` (each unit's next use in the epoch) and the page/block arithmetic of payloads.
* ``anonymous``: the ``mmap`` flags and populate advice of the caches' anonymous memory.
"""

from __future__ import annotations
