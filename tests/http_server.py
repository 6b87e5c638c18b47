"""A real HTTP server for tests: a folder served on 127.0.0.1 with byte ranges, stoppable and restartable.

:class:`HTTPTestServer` is a ``http.server.ThreadingHTTPServer`` (HTTP/1.1, keep-alive
connections, a thread per connection) serving the files under ``root`` (``GET`` and ``HEAD``),
with what the failure tests need:

* a single ``Range: bytes=a-b`` (or ``bytes=a-``) is answered ``206 Partial Content`` with its
  ``Content-Range``, an unsatisfiable one ``416`` (RFC 9110 section 14); ``HEAD`` and ``GET``
  say ``Accept-Ranges: bytes``;
* :attr:`~HTTPTestServer.ranges` = ``'ignore'`` answers every ``GET`` ``200`` with the whole file
  and no ``Accept-Ranges`` (what ``python -m http.server`` does), ``'none'`` also declares
  ``Accept-Ranges: none``;
* :meth:`~HTTPTestServer.fail_next` answers the next N requests with an HTTP error (``503`` by
  default), :meth:`~HTTPTestServer.drop_next` closes the connection of the next N requests without
  an answer (what a crashing proxy does), :meth:`~HTTPTestServer.stall_next` answers them late;
* :attr:`~HTTPTestServer.required_headers` (e.g. ``{'Authorization': 'Bearer x'}``): requests
  without them are answered ``401``;
* :meth:`~HTTPTestServer.kill` stops like a crash (listening socket closed, open connections cut)
  and :meth:`~HTTPTestServer.start` listens on the same port again;
* counters: :attr:`requests`, :attr:`gets`, :attr:`heads`, :attr:`in_flight` / :attr:`max_in_flight`.

No request leaves the loopback address. The same interface as ``s3_server.S3TestServer``
(``start``, ``kill``, ``stop``, ``fail_next``, ``reset_max``, the counters), so that tests run
against either.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

_RANGE = re.compile(r"bytes=(\d+)-(\d*)$")


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as real servers
    owner: HTTPTestServer

    def setup(self):
        super().setup()
        self.owner._connections.add(self.connection)

    def finish(self):
        try:
            super().finish()
        finally:
            self.owner._connections.discard(self.connection)

    def log_message(self, format, *args):  # quiet
        pass

    def do_HEAD(self):
        self._serve(body=False)

    def do_GET(self):
        self._serve(body=True)

    def _serve(self, body: bool) -> None:
        owner = self.owner
        action = owner._count(self.command)
        if action == "stall":  # no answer for a while, then the one asked for
            time.sleep(owner._stall_seconds)
            action = None
        if action == "drop":
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        if action is not None:
            self._answer(action, b"injected by the test server", "text/plain", body)
            return
        if any(self.headers.get(k) != v for k, v in owner.required_headers.items()):
            self._answer(401, b"unauthorized", "text/plain", body, {"WWW-Authenticate": "Bearer"})
            return
        with owner._lock:
            owner.in_flight += 1
            owner.max_in_flight = max(owner.max_in_flight, owner.in_flight)
        self._counted = True
        try:
            self._serve_file(body)
        finally:
            self._done()

    def _done(self) -> None:
        """Count this request as no longer in flight (once)."""
        if getattr(self, "_counted", False):
            self._counted = False
            with self.owner._lock:
                self.owner.in_flight -= 1

    def _send(self, data: bytes) -> None:
        """End the headers and write ``data``, counting the request done just before its last byte
        leaves: the client cannot have the whole response, and start another request, before
        then (counting after the write let a new request be counted while this handler's thread
        had not yet uncounted its own)."""
        if data:
            self.end_headers()
            self.wfile.write(data[:-1])
            self._done()
            self.wfile.write(data[-1:])
        else:
            self._done()
            self.end_headers()

    def _answer(self, status: int, data: bytes, kind: str, body: bool, headers: dict | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self._send(data if body else b"")

    def _serve_file(self, body: bool) -> None:
        owner = self.owner
        rel = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path).lstrip("/")
        path = os.path.realpath(os.path.join(owner.root, rel))
        if not path.startswith(owner.root + os.sep) or not os.path.isfile(path):
            self._answer(404, b"not found", "text/plain", body)
            return
        size = os.path.getsize(path)
        accept = {"bytes": "bytes", "none": "none"}.get(owner.ranges)
        headers = {"Accept-Ranges": accept} if accept else {}
        start, stop, status = 0, size, 200
        match = _RANGE.match(self.headers.get("Range", "").strip())
        if match and owner.ranges == "bytes" and self.command == "GET":
            start = int(match.group(1))
            stop = min(size, int(match.group(2)) + 1) if match.group(2) else size
            if start >= size or stop <= start:
                self._answer(416, b"", "text/plain", body, {"Content-Range": f"bytes */{size}"})
                return
            status = 206
            headers["Content-Range"] = f"bytes {start}-{stop - 1}/{size}"
        with open(path, "rb") as fp:
            fp.seek(start)
            data = fp.read(stop - start) if body else b""
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(stop - start))
        for k, v in headers.items():
            self.send_header(k, v)
        self._send(data)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):  # connections cut by kill() or drop_next(): expected
        pass


class HTTPTestServer:
    """The files under ``root`` over HTTP on ``127.0.0.1``; see the module docstring.

    Args:
        root: the folder served (``GET /a/b.beton`` is ``root/a/b.beton``).
        port: 0 picks a free port at the first start; later starts reuse it.

    Attributes:
        endpoint: ``'http://127.0.0.1:PORT'``. ranges: ``'bytes'`` (default), ``'ignore'``, ``'none'``.
        required_headers: headers a request must carry (else ``401``).
        requests, gets, heads: requests received (injected failures included).
        in_flight, max_in_flight: requests being served now, the most at once (:meth:`reset_max`).
    """

    def __init__(self, root: str, port: int = 0):
        self.root = os.path.realpath(root)
        self._port = port
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._connections: set = set()
        self._lock = threading.Lock()
        self._fail, self._fail_status, self._drop = 0, 503, 0
        self._stall, self._stall_seconds = 0, 0.0
        self.ranges = "bytes"
        self.required_headers: dict[str, str] = {}
        self.requests = self.gets = self.heads = 0
        self.in_flight = self.max_in_flight = 0

    def _count(self, method: str):
        """Count a request; what to do instead of serving it (``'drop'``, a status) or None."""
        with self._lock:
            self.requests += 1
            self.gets += method == "GET"
            self.heads += method == "HEAD"
            if self._drop > 0:
                self._drop -= 1
                return "drop"
            if self._stall > 0:
                self._stall -= 1
                return "stall"
            if self._fail > 0:
                self._fail -= 1
                return self._fail_status
        return None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._port}"

    def url(self, name: str) -> str:
        """The URL of the file ``root/name``."""
        return f"{self.endpoint}/{name}"

    def start(self) -> None:
        """Listen (again) on the port (a failure raises here) and serve from a daemon thread."""
        handler = type("Handler", (_Handler,), {"owner": self})
        deadline = time.monotonic() + 10
        while True:
            try:
                server = _Server(("127.0.0.1", self._port), handler)
                break
            except OSError:  # the port may take a moment to be free after a kill
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        self._server, self._port = server, server.server_address[1]
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True, name="http-test-server"
        )
        self._thread.start()

    def kill(self) -> None:
        """Stop like a crash: close the listening socket and cut every open connection."""
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        for conn in list(self._connections):
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join()

    def stop(self) -> None:
        """Same as :meth:`kill`."""
        if self._server is not None:
            self.kill()

    def fail_next(self, count: int, status: int = 503) -> None:
        """Answer the next ``count`` requests with HTTP ``status``."""
        with self._lock:
            self._fail, self._fail_status = count, status

    def drop_next(self, count: int) -> None:
        """Close the connection of the next ``count`` requests without answering."""
        with self._lock:
            self._drop = count

    def stall_next(self, count: int, seconds: float) -> None:
        """Wait ``seconds`` before answering each of the next ``count`` requests (a stalled server)."""
        with self._lock:
            self._stall, self._stall_seconds = count, float(seconds)

    def reset_max(self) -> None:
        """Start counting :attr:`max_in_flight` again."""
        with self._lock:
            self.max_in_flight = self.in_flight


@contextlib.contextmanager
def http_server(root: str):
    """A started :class:`HTTPTestServer` serving ``root``, stopped when the block ends."""
    server = HTTPTestServer(root)
    server.start()
    try:
        yield server
    finally:
        server.stop()
