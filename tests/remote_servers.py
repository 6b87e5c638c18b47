"""The files of a local folder on a real server of either kind, for tests that run against both.

``serving('s3', folder)``: moto's S3 (:mod:`s3_server`) with this process's environment pointing at
it, every file of ``folder`` uploaded to ``s3://bkt/ds/<name>``; ``serving('http', folder)``: the
folder served by :mod:`http_server` at ``http://127.0.0.1:PORT/<name>``. Either yields a
:class:`Served`: ``url(name)``, ``kind``, and ``server`` (both kinds have ``start``, ``kill``,
``fail_next``, ``reset_max``, ``max_in_flight``, ``gets``, ``requests``). A kind whose packages are
missing is skipped.
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass

import pytest

KINDS = ("s3", "http")
BUCKET, PREFIX = "bkt", "s3://bkt/ds"


@dataclass
class Served:
    kind: str
    server: object
    folder: str

    def url(self, name: str) -> str:
        """The URL of ``folder/name`` on the server."""
        return f"{PREFIX}/{name}" if self.kind == "s3" else self.server.url(name)


@contextlib.contextmanager
def serving(kind: str, folder: str):
    """See the module docstring."""
    pytest.importorskip("fsspec")
    if kind == "s3":
        pytest.importorskip("s3fs")
        pytest.importorskip("moto.server")
        from s3_server import s3_environment

        from ffload.storage import upload_file

        logging.getLogger("werkzeug").setLevel(logging.WARNING)
        with s3_environment(BUCKET) as server:
            for name in sorted(os.listdir(folder)):
                if os.path.isfile(os.path.join(folder, name)):
                    upload_file(os.path.join(folder, name), f"{PREFIX}/{name}")
            yield Served(kind, server, folder)
    else:
        pytest.importorskip("aiohttp")
        from http_server import http_server

        with http_server(folder) as server:
            yield Served(kind, server, folder)
