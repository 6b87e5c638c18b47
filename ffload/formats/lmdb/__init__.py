"""ffload's LMDB schema, both directions. Readable with plain ``lmdb`` + ``numpy`` (no pickle).

Schema, version 2 (also in README.md, "LMDB schema"):

* An LMDB environment directory (``data.mdb``, ``lock.mdb``), one unnamed database.
* Key ``b"__ffload__"``: the metadata record, UTF-8 JSON::

      {"format": "ffload-lmdb", "version": 2, "num_samples": N,
       "fields": [{"name": "image", "type": "RGBImageField", "type_id": 2,
                   "arguments": {...}}, {"name": "label", "type": "IntField", ...}],
       "record_dtype": {"names": ["image", "label"],
                        "formats": [[["mode", "|u1"], ["width", "<u2"], ["height", "<u2"],
                                     ["data_ptr", "<u8"]], "<i8"],
                        "offsets": [0, 16], "itemsize": 24},
       "record_size": 24}

  ``record_dtype`` is numpy's dict form of the record dtype (a packed nested record is a list
  of ``[name, type]`` pairs, a scalar a numpy type string).

* Keys ``b"%010d" % i`` for samples ``i = 0..N-1`` (10 ASCII digits: fixed width, so LMDB's
  byte order is sample order). Each value is::

      record   record_size bytes: the sample's metadata record (numpy structured dtype
               ``record_dtype``, identical to the .beton metadata row), whose pointer sub-fields
               (``data_ptr``, ``ptr``, the NDArray offset) hold the payload's offset from the
               start of the value
      payloads the fields' payloads (same encodings as .beton) concatenated in field order; a
               payload's size is the distance to the next payload's offset (or to the value end)

* Key ``b"__ffload_records__"`` (new in version 2): the ``N`` records of the sample values,
  end to end (``N * record_size`` bytes, sample order), byte for byte the first
  ``record_size`` bytes of each value. Reading them from here costs one contiguous read at
  open; reading them from the values costs one random page per sample, which on a cold disk
  (a ``data.mdb`` larger than RAM) takes minutes. A version-1 database (no such key) is still
  read, through the values.
* Key ``b"__ffload_places__"`` (new in version 2): ``(N, 2) <u8``, per sample the offset of
  its value in ``data.mdb`` and the value's length in bytes, or offset ``2**64 - 1`` where not
  recorded (values shorter than one LMDB page, which LMDB may move inside the file as later
  writes copy leaf pages; a value of a page or more lives in overflow pages LMDB never moves).
  With it, opening reads no sample value: LMDB itself reads each value's first page when asked
  where the value is. The reader spot-checks a few recorded places against LMDB's answer and,
  when ``data.mdb`` was rewritten (``mdb_copy -c``), warns and asks LMDB for every value.

Reading a sample with nothing but lmdb and numpy (either version)::

    def to_dtype(t):
        if isinstance(t, str):
            return np.dtype(t)
        if isinstance(t, list):
            return np.dtype([(n, to_dtype(s)) for n, s in t])
        return np.dtype({**t, "formats": [to_dtype(f) for f in t["formats"]]})

    env = lmdb.open(path, readonly=True, lock=False)
    with env.begin() as txn:
        meta = json.loads(txn.get(b"__ffload__"))
        dt = to_dtype(meta["record_dtype"])
        value = txn.get(b"%010d" % 0)
        rec = np.frombuffer(value[:meta["record_size"]], dtype=dt)[0]
        jpeg_or_pixels = value[rec["image"]["data_ptr"]:]    # image is the only payload here

``map_size`` grows by itself while writing (doubling on ``MapFullError``).

Layout on disk: ``data.mdb`` is written as it is, with no preallocation (the file holds LMDB's
used pages, ``(last_pgno + 1) * psize`` bytes) and no sequential rewrite at the end. Each commit
writes its dirty pages in page order and appending puts the values at the end of the file, so
the file system lays the file out as contiguously as a ``cp`` copy, which a loader reads no
faster (measured: ``docs/developer-notes.md``, ``ffload.formats.lmdb``).

Reading zero-copy: the reader finds LMDB's own mapping of ``data.mdb`` in ``/proc/self/maps``
and subtracts its start from the address of a value (``buffers=True``): the result is the
value's offset inside ``data.mdb``. The writer records these offsets as it commits (the places
table), the reader takes them from there (version 1: one pass over every value at open), and
LMDB samples then go through the same memory-mapped gather as ``.beton``. Where no such
mapping is visible, values are copied into process memory instead.

Modules:

* ``layout``: the keys (:func:`~.layout.sample_key`, the table keys), format name, versions and
  the places table's ``UNPLACED`` mark, which both directions share.
* ``descriptors``: the fields' JSON descriptors (``"fields"``), also a sharded manifest's.
* ``mapping``: where a value lies in ``data.mdb`` (LMDB's mapping in ``/proc/self/maps``).
* ``writer``: :class:`~.writer.LMDBWriter`, the metadata record's ``record_dtype`` JSON.
* ``reader``: :func:`~.reader.open_lmdb` and its checks; ``read_origins_value``.
* ``env``: the process's shared read-only LMDB environments and a view's snapshot.
* ``pages``: :func:`~.pages.check_tree`, the B-tree walk that refuses a ``data.mdb`` that would
  make LMDB read outside the file.
"""

from __future__ import annotations
