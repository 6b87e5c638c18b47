"""Datasets on object storage: URLs (``s3://bucket/key``, ``https://host/x.beton``, any fsspec protocol) -> fsspec.

One job: turn a URL into byte ranges and uploads, with one retry policy and clear errors.

* :func:`is_remote` -- whether a path is a URL of a remote filesystem (``s3://``, ``gs://``,
  ``http://``, ...) rather than a local path (``/x``, ``x.beton``, ``file:///x``).
* :func:`open_filesystem` -- ``(fsspec filesystem, path inside it)`` for a URL.
  ``storage_options`` are the filesystem's own arguments (for ``s3://``, those of
  ``s3fs.S3FileSystem``: ``key``, ``secret``, ``token``, ``endpoint_url``, ``client_kwargs``,
  ``anon``, ...). Without them, credentials and endpoint come from the standard places, as for
  the AWS command line: ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` / ``AWS_SESSION_TOKEN``,
  ``AWS_PROFILE``, ``~/.aws/credentials`` and ``~/.aws/config``, ``AWS_ENDPOINT_URL_S3`` /
  ``AWS_ENDPOINT_URL``, instance roles (botocore's credential chain). The command line takes
  them as ``--storage-options JSON``.
* :class:`RemoteObject` -- one object: its size (one HEAD), and :meth:`~RemoteObject.read`, one
  range GET per call, retried on transient errors, counted (:attr:`~RemoteObject.requests`).
  Over ``http://`` / ``https://`` (fsspec's ``HTTPFileSystem``, aiohttp) a read is one GET with
  ``Range: bytes=a-b`` that must be answered ``206 Partial Content`` with that range (RFC 9110
  section 14): a server that ignores the header (``200`` and the whole object) or declares
  ``Accept-Ranges: none`` is refused with a :class:`~ffload.errors.StorageError` saying so, and
  its body is never read. ``storage_options`` are then ``HTTPFileSystem``'s (``headers``,
  ``client_kwargs``, ...).
* ``gs://`` goes through the same code with ``gcsfs`` (``storage_options``: ``GCSFileSystem``'s:
  ``token``, ``project``, ``endpoint_url``; default credentials: ``GOOGLE_APPLICATION_CREDENTIALS``,
  gcloud's, the metadata server; ``STORAGE_EMULATOR_HOST`` for an emulator). gcsfs retries 5xx
  and connection errors itself (up to 6 tries, a class attribute that cannot be turned off per
  instance) beneath ffload's policy.
* :func:`upload_file` -- put a completed local file at a URL (s3fs uploads large files in
  parts, and S3 makes the object visible only when the upload completes).

Retries (:class:`RetryPolicy`): ffload's policy is the only one. For ``s3://`` the defaults turn
botocore's and s3fs's own retries off (``config_kwargs={'retries': {'total_max_attempts': 1}}``,
and the filesystem's ``retries`` attribute set to 1; ``storage_options`` may set them back), so that a request is attempted
``RetryPolicy.attempts`` times in all, sleeping ``min(max_delay, base_delay * 2**k)`` (half of it
fixed, half random: "equal jitter", as the AWS architecture blog recommends) after the k-th
failure. Transient: connection errors (refused, reset, closed mid-body, timeouts), HTTP 5xx,
throttling (HTTP 429/503, ``SlowDown``, ``Throttling``, ``RequestLimitExceeded``), and a body
shorter than the range asked for. Everything else is permanent and raised at once as
:class:`~ffload.errors.StorageError` naming the object and the cause: a missing object or bucket
(``NoSuchKey``, 404), access denied (``AccessDenied``, 401, 403), wrong credentials
(``InvalidAccessKeyId``, ``SignatureDoesNotMatch``, expired tokens); transient errors that outlast
the attempts also end as ``StorageError`` (``transient=True``).

Needs ``fsspec`` and the protocol's package: ``pip install 'ffload[s3]'`` (s3fs),
``'ffload[http]'`` (aiohttp), ``'ffload[gcs]'`` (gcsfs).
"""

from __future__ import annotations

import os
import random
import threading
import time
from dataclasses import dataclass
from typing import Any

from ffload.errors import ConfigurationError, StorageError

__all__ = [
    "is_remote",
    "open_filesystem",
    "RetryPolicy",
    "RemoteObject",
    "upload_file",
    "remote_exists",
    "classify_error",
    "storage_call",
    "install_hint",
    "default_cache_dir",
]

_LOCAL_PROTOCOLS = {"file", "local"}

_THROTTLING_CODES = {
    "SlowDown",
    "Throttling",
    "ThrottlingException",
    "RequestLimitExceeded",
    "TooManyRequests",
    "TooManyRequestsException",
    "ProvisionedThroughputExceededException",
    "RequestThrottled",
    "RequestThrottledException",
    "ServiceUnavailable",
    "InternalError",
    "RequestTimeout",
    "RequestTimeoutException",
    "503",
    "500",
}
_CREDENTIAL_CODES = {
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "ExpiredToken",
    "InvalidToken",
    "TokenRefreshRequired",
    "AuthFailure",
    "UnrecognizedClientException",
    "InvalidClientTokenId",
    "ExpiredTokenException",
}
_NOT_FOUND_CODES = {"NoSuchKey", "NoSuchBucket", "404", "NotFound"}
_DENIED_CODES = {"AccessDenied", "403", "401", "Forbidden", "Unauthorized", "AllAccessDisabled"}
_HTTP_PROTOCOLS = {"http", "https"}
_EXTRAS = {"s3": "s3", "s3a": "s3", "http": "http", "https": "http", "gs": "gcs", "gcs": "gcs"}


def install_hint(url: str) -> str:
    """The ``pip install`` command of the extra that serves ``url``'s protocol
    (``"pip install 'ffload[s3]'"`` for ``s3://``, ``[http]`` for ``http(s)://``, ``[gcs]`` for
    ``gs://``; ``[s3]`` for others, whose package fsspec names in its own error)."""
    return f"pip install 'ffload[{_EXTRAS.get(url.split('://', 1)[0].lower(), 's3')}]'"


def is_remote(path) -> bool:
    """Whether ``path`` is a URL of a remote filesystem (``'s3://bucket/key'``, ``'gs://...'``,
    ``'https://...'``, ``'memory://...'``): anything with a ``PROTOCOL://`` prefix other than
    ``file://``/``local://``. Local paths (``str`` or ``os.PathLike``) give False. Never raises;
    needs no fsspec."""
    if not isinstance(path, (str, os.PathLike)):
        return False
    text = os.fspath(path)
    if not isinstance(text, str) or "://" not in text:
        return False
    protocol = text.split("://", 1)[0].split("::")[-1].lower()
    return bool(protocol) and protocol.replace("+", "").replace("-", "").isalnum() and protocol not in _LOCAL_PROTOCOLS


def default_cache_dir() -> str:
    """ffload's local cache folder for remote data (a remote dataset's page cache file, a
    conversion to a URL staged for ``--resume``): ``$FFLOAD_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/ffload``, else ``~/.cache/ffload`` (not created here)."""
    if os.environ.get("FFLOAD_CACHE_DIR"):
        return os.environ["FFLOAD_CACHE_DIR"]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "ffload")


def _import_fsspec(url: str):
    try:
        import fsspec
    except ImportError:
        raise ConfigurationError(
            f"{url}: reading or writing object storage URLs needs fsspec", path=url, hint=install_hint(url)
        ) from None
    return fsspec


def default_storage_options(protocol: str) -> dict[str, Any]:
    """The options ffload passes for ``protocol`` unless ``storage_options`` overrides them: for
    ``s3``, botocore's and s3fs's own retries off (ffload's :class:`RetryPolicy` retries), and a
    new filesystem instance per call (the environment is read each time); for ``http(s)``,
    aiohttp timeouts per connection (30 s) and per read (60 s without a byte) instead of its
    5 minutes per request."""
    if protocol in ("s3", "s3a"):
        # skip_instance_cache: fsspec would otherwise hand back an instance made with the
        # environment (endpoint, credentials) of an earlier call
        return {"config_kwargs": {"retries": {"total_max_attempts": 1}}, "skip_instance_cache": True}
    if protocol in _HTTP_PROTOCOLS:
        try:
            import aiohttp
        except ImportError:  # open_filesystem names the extra
            return {}
        # aiohttp's default is 5 minutes for the whole request: a stalled server would hold a
        # page that long before each retry. A new connection gets 30 s, and a request 60 s
        # without a byte; a slow but moving body of any size is never cut.
        return {"client_kwargs": {"timeout": aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=60)}}
    return {}


def open_filesystem(url: str, storage_options: dict[str, Any] | None = None):
    """The fsspec filesystem serving ``url`` and the object's path inside it.

    Args:
        url: ``PROTOCOL://...`` (``s3://bucket/key``).
        storage_options: the filesystem's arguments (see the module docstring), merged over
            :func:`default_storage_options` (``config_kwargs`` and ``client_kwargs`` dicts are
            merged key by key).

    Returns:
        ``(fs, path)``: an ``fsspec.AbstractFileSystem`` and ``str`` (``bucket/key`` for S3).

    Raises:
        ConfigurationError: fsspec or the protocol's package (s3fs, aiohttp, gcsfs) is missing (the message
            gives the install command), or ``storage_options`` are not a dict or not arguments of
            that filesystem (named).
    """
    fsspec = _import_fsspec(url)
    if storage_options is not None and not isinstance(storage_options, dict):
        raise ConfigurationError(f"storage_options must be a dict (JSON object), got {type(storage_options).__name__}")
    protocol = url.split("://", 1)[0].lower()
    options = default_storage_options(protocol)
    for key, value in (storage_options or {}).items():
        if key in ("config_kwargs", "client_kwargs") and isinstance(value, dict):
            options[key] = {**options.get(key, {}), **value}
        else:
            options[key] = value
    try:
        fs, path = fsspec.core.url_to_fs(url, **options)
    except ImportError as e:
        raise ConfigurationError(
            f"{url}: the {protocol}:// protocol needs a package that is not installed ({e})",
            path=url,
            hint=install_hint(url),
        ) from e
    except (TypeError, ValueError) as e:
        raise ConfigurationError(f"{url}: bad storage_options for {protocol}:// ({e})", path=url) from e
    if protocol in ("s3", "s3a") and hasattr(fs, "retries"):
        fs.retries = 1  # s3fs's own retry loop (a class attribute, not an argument): ours retries
    return fs, path


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently a request is retried on a transient error.

    Attributes:
        attempts: tries in all (>= 1).
        base_delay: seconds slept after the first failure; doubled after each further one.
        max_delay: the longest sleep (seconds).
        timeout: give up once this many seconds passed since the first try (``None``: only
            ``attempts`` counts).
    With the defaults (10 attempts, 0.1 s doubling, 4 s at most) a request rides through about
    18 s of outage.
    """

    attempts: int = 10
    base_delay: float = 0.1
    max_delay: float = 4.0
    timeout: float | None = None

    def delay(self, failures: int) -> float:
        """Seconds to sleep after ``failures`` (>= 1) failed tries: equal jitter around
        ``min(max_delay, base_delay * 2 ** (failures - 1))``."""
        cap = min(self.max_delay, self.base_delay * 2 ** (failures - 1))
        return cap / 2 + random.uniform(0, cap / 2)


def _error_code(error: BaseException) -> tuple[str | None, int | None]:
    """``(service error code, HTTP status)`` of a botocore ``ClientError`` (or an aiohttp
    response error, a gcsfs ``HttpError``) anywhere in ``error``'s cause/context chain, else
    ``(None, None)``."""
    seen = set()
    e: BaseException | None = error
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        response = getattr(e, "response", None)
        if isinstance(response, dict) and "Error" in response:
            code = response["Error"].get("Code")
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            return (str(code) if code is not None else None), (int(status) if status else None)
        for name in ("status", "code"):  # aiohttp's response errors; gcsfs's HttpError, urllib's HTTPError
            status = getattr(e, name, None)
            if isinstance(status, int) and not isinstance(status, bool) and 100 <= status < 600:
                return None, status
        e = e.__cause__ or e.__context__
    return None, None


def _connection_error_types() -> tuple[type, ...]:
    types: list[type] = [ConnectionError, TimeoutError]
    try:
        import botocore.exceptions as be

        types += [
            be.ConnectionError,
            be.HTTPClientError,
            be.ReadTimeoutError,
            be.ConnectTimeoutError,
            be.ResponseStreamingError,
            be.IncompleteReadError,
        ]
    except ImportError:
        pass
    try:
        import aiohttp

        types += [aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, aiohttp.ServerTimeoutError]
    except ImportError:
        pass
    try:
        from fsspec.exceptions import FSTimeoutError

        types.append(FSTimeoutError)
    except ImportError:
        pass
    return tuple(types)


def classify_error(error: BaseException) -> tuple[bool, str]:
    """Whether ``error`` (raised by fsspec/s3fs/botocore/aiohttp for one request) is worth
    retrying, and the cause in words.

    Returns:
        ``(transient, cause)``; ``transient`` for connection errors (refused, reset, server
        disconnected: botocore's, aiohttp's ``ClientConnectionError`` family, ``OSError``
        ``ConnectionError``), timeouts, HTTP 5xx and 429, and throttling codes; False for a
        missing object (404), denied access (401, 403), wrong credentials, a server without
        range requests and anything unknown (matched by class, HTTP status and service error
        code, never by message text).
    """
    code, status = _error_code(error)
    if code is None and status is None:  # fsspec's HTTP info() turns any failure into FileNotFoundError
        for e in _chain(error):
            if isinstance(e, _connection_error_types()):
                return True, f"connection failed ({type(e).__name__}: {e})"
    if code in _CREDENTIAL_CODES:
        return (
            False,
            f"the credentials were refused ({code}): check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, "
            f"AWS_PROFILE, ~/.aws/credentials or storage_options",
        )
    if (
        code in _NOT_FOUND_CODES
        or status == 404
        or (code is None and status is None and isinstance(error, FileNotFoundError))
    ):
        return False, f"no such object or bucket ({code or status or 'not found'})"
    if code in _DENIED_CODES or status in (401, 403) or (code is None and isinstance(error, PermissionError)):
        return False, f"access denied ({code or status or 'permission denied'})"
    if code in _THROTTLING_CODES or (status is not None and (status >= 500 or status == 429)):
        return True, f"the service is busy or failing ({code or ''} HTTP {status})".replace("( ", "(")
    for e in _chain(error):
        if isinstance(e, _connection_error_types()):
            return True, f"connection failed ({type(e).__name__}: {e})"
    if code is not None or status is not None:
        return False, f"{code or ''} HTTP {status}: {error}".strip()
    return False, f"{type(error).__name__}: {error}"


def _chain(error: BaseException):
    seen = set()
    e: BaseException | None = error
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        e = e.__cause__ or e.__context__


class _ShortRead(ConnectionError):
    """A range GET whose body is shorter than the range (a connection cut mid-body): transient."""


def storage_call(url: str, what: str, call, retry: RetryPolicy | None = None, on_attempt=None, on_retry=None):
    """Run ``call()`` (one request to the object ``url``) under ``retry``.

    Args:
        url: the object, for the message (``s3://bucket/key``).
        what: the operation in words (``'read bytes 0..24'``, ``'upload'``).
        call: a function of no arguments doing one request.
        retry: the :class:`RetryPolicy` (default one when ``None``).
        on_attempt: called (no arguments) before each try (request counters).
        on_retry: called with the error before sleeping for a retry (error counters).

    Returns:
        what ``call`` returns.

    Raises:
        StorageError: a permanent error (at once) or a transient one after the last attempt;
            names ``url``, the operation and the cause; the last error is ``__cause__``.
    """
    retry = retry or RetryPolicy()
    start, failures = time.monotonic(), 0
    while True:
        if on_attempt is not None:
            on_attempt()
        try:
            return call()
        except (KeyboardInterrupt, SystemExit, StorageError, ConfigurationError):
            raise
        except Exception as e:
            transient, cause = classify_error(e)
            failures += 1
            late = retry.timeout is not None and time.monotonic() - start >= retry.timeout
            if not transient or failures >= retry.attempts or late:
                tries = f" after {failures} attempts" if transient else ""
                raise StorageError(f"{url}: cannot {what}{tries}: {cause}", path=url, transient=transient) from e
            if on_retry is not None:
                on_retry(e)
            time.sleep(retry.delay(failures))


class RemoteObject:
    """One object on remote storage, read by byte ranges.

    Args:
        url: ``PROTOCOL://...`` of the object.
        storage_options: see :func:`open_filesystem`.
        retry: the :class:`RetryPolicy` of every request.

    Attributes:
        url: as given. size: bytes of the object (one HEAD at construction).
        requests: range GETs issued so far, retries included (thread-safe counter).
        retried: range GETs that failed with a transient error and were tried again.
        bytes_read: bytes received by range GETs so far.

    Raises:
        StorageError: the object is missing, unreadable or the credentials are refused (named).
        ConfigurationError: see :func:`open_filesystem`.
    """

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None, retry: RetryPolicy | None = None):
        self.url, self.retry = url, retry or RetryPolicy()
        self.storage_options = storage_options
        self.fs, self.fs_path = open_filesystem(url, storage_options)
        self._lock = threading.Lock()
        self.requests = self.bytes_read = self.retried = 0
        try:
            info = storage_call(url, "read its size", lambda: self.fs.info(self.fs_path), self.retry)
        except StorageError as e:
            # a HEAD answer has no body, so a 403 does not say why: one GET of a byte does
            if e.transient or _error_code(e.__cause__) not in ((None, 403), ("403", 403)):
                raise
            storage_call(url, "read its size", lambda: self.fs.cat_file(self.fs_path, start=0, end=1), self.retry)
            raise
        if info.get("type") == "directory":
            raise StorageError(f"{url}: is a folder (prefix), not an object", path=url)
        self._http = url.split("://", 1)[0].lower() in _HTTP_PROTOCOLS
        if info.get("size") is None:
            raise StorageError(
                f"{url}: the server does not say the object's size (no Content-Length in its "
                "answer to HEAD): ffload reads objects by byte ranges and needs it",
                path=url,
            )
        if self._http and info.get("partial") is False:
            raise StorageError(
                f"{url}: the server declares 'Accept-Ranges: none': ffload reads datasets by HTTP "
                "range requests (Range: bytes=a-b answered 206); serve the file from a server that "
                "supports them, or download it",
                path=url,
            )
        self.size = int(info["size"])

    def _count(self) -> None:
        with self._lock:
            self.requests += 1

    def _count_retry(self, error: BaseException) -> None:
        with self._lock:
            self.retried += 1

    def read(self, start: int, stop: int) -> bytes:
        """Bytes ``[start, stop)`` of the object (one range GET, retried; ``0 <= start <= stop <=
        size``). Raises StorageError naming the object and the range; ConfigurationError (naming them)
        for a range outside the object."""
        if not 0 <= start <= stop <= self.size:
            raise ConfigurationError(
                f"{self.url}: range {start}..{stop} outside the object's {self.size} bytes", path=self.url
            )
        if stop == start:
            return b""

        def get() -> bytes:
            if self._http:
                data = _http_range(self.fs, self.fs_path, start, stop, self.size)
            else:
                data = self.fs.cat_file(self.fs_path, start=start, end=stop)
            if len(data) != stop - start:
                raise _ShortRead(f"got {len(data)} of {stop - start} bytes")
            return data

        data = storage_call(self.url, f"read bytes {start}..{stop}", get, self.retry, self._count, self._count_retry)
        with self._lock:
            self.bytes_read += len(data)
        return data

    def __repr__(self) -> str:
        return f"RemoteObject({self.url!r}, {self.size} bytes)"


def _http_range(fs, url: str, start: int, stop: int, size: int) -> bytes:
    """Bytes ``[start, stop)`` of the object ``url`` of fsspec's ``HTTPFileSystem`` ``fs``: one
    GET with ``Range: bytes=start-(stop-1)`` (and the filesystem's own request options), on
    fsspec's event loop and aiohttp session.

    fsspec's ``cat_file`` would accept any ``200`` and read its whole body: a server that ignores
    ``Range`` would hand back the object's first bytes as those of the range. Here the answer
    must be ``206`` with the ``Content-Range`` asked for (a ``200`` only when the range is the
    whole object); otherwise the body is left unread and the read fails.

    Raises:
        StorageError: a server that does not serve ranges (permanent; names ``url``).
        aiohttp.ClientResponseError (an HTTP error status), aiohttp's connection errors and
            timeouts: classified by :func:`classify_error` (404 missing, 401/403 denied, 5xx
            and 429 transient).
    """
    from fsspec.asyn import sync

    async def get() -> bytes:
        session = await fs.set_session()
        kwargs = dict(fs.kwargs)
        headers = dict(kwargs.pop("headers", None) or {})
        headers["Range"] = f"bytes={start}-{stop - 1}"
        headers["Accept-Encoding"] = "identity"  # the stored bytes, never a compressed encoding of them
        encode = getattr(fs, "encode_url", lambda u: u)
        async with session.get(encode(url), headers=headers, **kwargs) as r:
            r.raise_for_status()
            content_range = r.headers.get("Content-Range", "")
            if r.status == 206 and content_range.startswith(f"bytes {start}-{stop - 1}/"):
                return await r.read()
            if r.status == 200 and start == 0 and stop == size:
                return await r.read()
            if r.status == 206:
                what = f"answered bytes {start}..{stop} with 'Content-Range: {content_range}'"
            else:
                what = (
                    f"answered a request for bytes {start}..{stop} (Range: bytes={start}-{stop - 1}) "
                    f"with HTTP {r.status} and the whole object"
                )
            raise StorageError(
                f"{url}: the server {what}: it does not support HTTP range requests, which "
                "ffload reads datasets by (206 Partial Content); serve the file from a server "
                "that supports them (any object store, nginx, Apache, ...), or download it",
                path=url,
            )

    return sync(fs.loop, get)


def remote_exists(url: str, storage_options: dict[str, Any] | None = None, retry: RetryPolicy | None = None) -> bool:
    """Whether an object (or prefix) exists at ``url``; StorageError on denied access or refused
    credentials."""
    fs, path = open_filesystem(url, storage_options)
    return bool(storage_call(url, "check whether it exists", lambda: fs.exists(path), retry))


def upload_file(
    local_path: str, url: str, storage_options: dict[str, Any] | None = None, retry: RetryPolicy | None = None
) -> None:
    """Upload the complete local file ``local_path`` to ``url`` (fsspec ``put_file``; s3fs uses a
    multipart upload above its block size, and the object appears only when it completes).

    Raises:
        StorageError: the upload failed (permanent error, or transient ones past the retries),
            naming ``url`` and the cause.
    """
    fs, path = open_filesystem(url, storage_options)
    storage_call(url, f"upload {local_path}", lambda: fs.put_file(local_path, path), retry)
