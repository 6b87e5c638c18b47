"""A real S3 server for tests: moto's server on 127.0.0.1, stoppable and restartable on its port.

:class:`S3TestServer` is ``moto.server.ThreadedMotoServer`` (the same WSGI application, werkzeug
server and request handler) with what failure tests need and ``ThreadedMotoServer`` lacks:

* :meth:`~S3TestServer.kill` stops the server like a crash: the listening socket is closed and
  every open connection is shut down (``ThreadedMotoServer.stop`` only stops accepting: werkzeug's
  HTTP/1.1 handler threads would go on serving keep-alive connections);
* :meth:`~S3TestServer.start` after :meth:`~S3TestServer.kill` listens on the same port again.
  moto keeps its state (buckets, objects, IAM users) in process-wide backends, not in the server
  object: a restarted server serves the same objects (checked by ``test_s3_server_restart``);
* :meth:`~S3TestServer.fail_next` makes the next N requests answer an S3 error (``503
  SlowDown`` by default) before reaching moto: throttling and 5xx, as S3 answers them;
* :meth:`~S3TestServer.require_auth` turns on moto's request authentication (signatures checked
  against IAM access keys; moto's ``/moto-api/reset-auth``), and :meth:`~S3TestServer.create_user`
  makes an IAM user with full access, whose keys then work while others are refused.

No request leaves the loopback address. Credentials for the test process come from the
environment (:meth:`~S3TestServer.environment`), as a user's would.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
import urllib.request

from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
from moto.server import ThreadedMotoServer
from werkzeug.serving import make_server

ACCESS_KEY, SECRET_KEY, REGION = "ffload-test-key", "ffload-test-secret", "us-east-1"


class _TrackingHandler(MotoRequestHandler):
    """moto's request handler, recording its connection so that a kill can cut it."""

    server_owner: S3TestServer

    def setup(self):
        super().setup()
        self.server_owner._connections.add(self.connection)

    def finish(self):
        try:
            super().finish()
        finally:
            self.server_owner._connections.discard(self.connection)


class S3TestServer(ThreadedMotoServer):
    """moto's S3 server on ``127.0.0.1``; see the module docstring.

    Args:
        port: 0 picks a free port at the first start; later starts reuse it.

    Attributes:
        endpoint: ``'http://127.0.0.1:PORT'``. requests: requests received (all methods).
        gets: ``GET`` requests received. lists: bucket listings (``GET ?list-type=2``) received.
        in_flight: requests being served now; max_in_flight: the most at once (:meth:`reset_max`).
    """

    def __init__(self, port: int = 0):
        super().__init__(ip_address="127.0.0.1", port=port, verbose=False)
        self._connections: set = set()
        self._fail = 0
        self._fail_status, self._fail_code = 503, "SlowDown"
        self._lock = threading.Lock()
        self.requests = self.gets = self.lists = 0
        self.in_flight = self.max_in_flight = 0

    def _serve(self) -> None:
        self._server.serve_forever(poll_interval=0.05)

    def _wsgi(self, app):
        def serve(environ, start_response):
            if environ.get("PATH_INFO") == "/_ffload-counters":  # for benchmarks in another process
                body = json.dumps({"requests": self.requests, "gets": self.gets, "lists": self.lists}).encode()
                start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
                return [body]
            with self._lock:
                self.requests += 1
                self.gets += environ["REQUEST_METHOD"] == "GET"
                self.lists += environ["REQUEST_METHOD"] == "GET" and "list-type" in environ.get("QUERY_STRING", "")
                failing = self._fail > 0 and not environ.get("PATH_INFO", "").startswith("/moto-api")
                if failing:
                    self._fail -= 1
            if failing:
                body = (
                    f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>{self._fail_code}</Code>"
                    f"<Message>injected by the test server</Message></Error>"
                ).encode()
                if environ["REQUEST_METHOD"] == "HEAD":  # a HEAD answer has no body
                    body = b""
                start_response(
                    f"{self._fail_status} Injected",
                    [("Content-Type", "application/xml"), ("Content-Length", str(len(body)))],
                )
                return [body]
            with self._lock:
                self.in_flight += 1
                self.max_in_flight = max(self.max_in_flight, self.in_flight)
            try:
                return list(app(environ, start_response))  # the body, built while counted in flight
            finally:
                with self._lock:
                    self.in_flight -= 1

        return serve

    def reset_max(self) -> None:
        """Start counting :attr:`max_in_flight` again."""
        with self._lock:
            self.max_in_flight = self.in_flight

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._port}"

    def start(self) -> None:
        """Listen (again) on the port (binding here, so that a failure raises here) and serve from
        a daemon thread."""
        app = DomainDispatcherApplication(create_backend_app)
        handler = type("Handler", (_TrackingHandler,), {"server_owner": self})
        deadline = time.monotonic() + 10
        while True:
            try:
                self._server = make_server(self._ip_address, self._port, self._wsgi(app), True, request_handler=handler)
                break
            except OSError:  # the port may take a moment to be free after a kill
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        self._port = self._server.server_address[1]  # port 0: keep the one picked for restarts
        self._thread = threading.Thread(target=self._serve, daemon=True, name="s3-test-server")
        self._thread.start()
        self._server_ready_event.set()

    def kill(self) -> None:
        """Stop like a crash: close the listening socket and cut every open connection."""
        server = self._server
        self._server_ready_event.clear()
        if server is not None:
            server.shutdown()
            server.server_close()
        for conn in list(self._connections):
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._thread.join()
        self._server = None

    def stop(self) -> None:
        """Same as :meth:`kill` (no request is left half-served)."""
        if self._server is not None:
            self.kill()

    def fail_next(self, count: int, status: int = 503, code: str = "SlowDown") -> None:
        """Answer the next ``count`` requests with HTTP ``status`` and S3 error ``code``."""
        with self._lock:
            self._fail, self._fail_status, self._fail_code = count, status, code

    def _moto_api(self, path: str, data: bytes) -> dict:
        request = urllib.request.Request(
            self.endpoint + path, data=data, method="POST", headers={"Content-Type": "text/plain"}
        )
        with urllib.request.urlopen(request, timeout=10) as response:  # loopback only
            return json.loads(response.read() or b"{}")

    def require_auth(self, on: bool = True) -> None:
        """Check every request's signature against moto's IAM access keys (on), or accept any
        credentials (off, moto's default)."""
        self._moto_api("/moto-api/reset-auth", b"0" if on else b"inf")

    def create_user(self, name: str = "ffload-tester") -> dict[str, str]:
        """An IAM user allowed everything; returns ``{'key': ..., 'secret': ...}`` (call before
        :meth:`require_auth`)."""
        import boto3

        iam = boto3.client(
            "iam",
            endpoint_url=self.endpoint,
            region_name=REGION,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
        )
        iam.create_user(UserName=name)
        policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
        iam.put_user_policy(UserName=name, PolicyName="all", PolicyDocument=json.dumps(policy))
        key = iam.create_access_key(UserName=name)["AccessKey"]
        return {"key": key["AccessKeyId"], "secret": key["SecretAccessKey"]}

    def environment(self) -> dict[str, str]:
        """The environment variables a process needs to reach this server with the default
        credentials (``AWS_ENDPOINT_URL_S3`` and the keys), nothing else."""
        return {
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_DEFAULT_REGION": REGION,
            "AWS_ENDPOINT_URL_S3": self.endpoint,
            "AWS_ENDPOINT_URL": self.endpoint,
        }

    def storage_options(self) -> dict:
        """Explicit ``storage_options`` reaching this server (endpoint and default keys)."""
        return {
            "key": ACCESS_KEY,
            "secret": SECRET_KEY,
            "endpoint_url": self.endpoint,
            "client_kwargs": {"region_name": REGION},
        }

    def create_bucket(self, name: str) -> None:
        import boto3

        s3 = boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name=REGION,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
        )
        s3.create_bucket(Bucket=name)


@contextlib.contextmanager
def s3_environment(bucket: str = "bkt"):
    """A started :class:`S3TestServer` with ``bucket`` created and this process's environment
    pointing at it (:meth:`S3TestServer.environment`) until the block ends (a pytest fixture's
    body: ``with s3_environment() as server: yield server``)."""
    server = S3TestServer()
    server.start()
    saved = {k: os.environ.get(k) for k in server.environment()}
    os.environ.update(server.environment())
    try:
        server.create_bucket(bucket)
        yield server
    finally:
        server.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def counters(endpoint: str) -> dict[str, int]:
    """The request counters of a server at ``endpoint`` (``requests``, ``gets``, ``lists``)."""
    with urllib.request.urlopen(endpoint + "/_ffload-counters", timeout=10) as response:  # loopback only
        return json.loads(response.read())


if __name__ == "__main__":  # a server in a process of its own: prints its endpoint, serves until stdin closes
    import sys

    server = S3TestServer()
    server.start()
    print(server.endpoint, flush=True)
    sys.stdin.read()
    server.stop()
