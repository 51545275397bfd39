"""Retrying remote calls: which errors are transient, and exponential backoff with jitter.

Connection resets, timeouts, throttling (``SlowDown``, HTTP 429) and server errors (5xx)
are retried; a missing object, denied access or missing credentials are not (the last
two become a :class:`~fastfeed.errors.RemoteError` that says what to check). After the
last attempt a ``RemoteError`` names the URL, the last error and the fix.

Example:
    >>> with_retries(lambda: "ok", "s3://bucket/key", "read", RetryPolicy(attempts=3))
    'ok'
"""

from __future__ import annotations

import errno
import logging
import random
import time
from dataclasses import dataclass
from typing import Callable, Mapping, TypeVar

from fastfeed.errors import ConfigError, FastfeedError, RemoteError

__all__ = ["RetryPolicy", "is_transient", "with_retries"]

log = logging.getLogger(__name__)
T = TypeVar("T")
_sleep = time.sleep  # the one place retries wait (tests replace it)

# Exception class names (anywhere in the MRO) of botocore / aiohttp / urllib3 /
# requests / fsspec errors that mean "the network or the server hiccupped; try again".
_TRANSIENT_NAMES = frozenset({
    "ChunkedEncodingError", "ClientConnectionError", "ClientOSError", "ClientPayloadError",
    "ConnectTimeoutError", "ConnectionClosedError", "EndpointConnectionError", "FSTimeoutError",
    "HTTPClientError", "IncompleteRead", "IncompleteReadError", "ProtocolError", "ProxyConnectionError",
    "ReadTimeoutError", "RemoteDisconnected", "ResponseStreamingError", "ServerDisconnectedError",
    "ServerTimeoutError",
})
_TRANSIENT_CODES = frozenset({
    "InternalError", "RequestTimeout", "RequestTimeoutException", "ServiceUnavailable", "SlowDown",
    "Throttling", "ThrottlingException", "TooManyRequestsException",
})
_TRANSIENT_ERRNOS = frozenset({
    errno.EIO, errno.EAGAIN, errno.ECONNRESET, errno.ECONNABORTED, errno.ETIMEDOUT, errno.EPIPE,
    errno.EBUSY, errno.EREMOTEIO, errno.ENETUNREACH, errno.EHOSTUNREACH,
})
_PERMANENT = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError, FileExistsError)


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently to retry a transient remote error.

    Attempt ``i`` (from 0) that fails waits ``min(max_delay, base_delay * 2**i)`` times a
    random factor in ``[0.5, 1]`` ("equal jitter": the wait still grows, and processes
    that failed together do not retry in lockstep).

    Example:
        >>> p = RetryPolicy(attempts=4, base_delay=1.0, max_delay=3.0)
        >>> [round(d, 1) for d in p.delays(random.Random(0))]
        [0.9, 1.8, 2.1]
    """

    attempts: int = 6
    base_delay: float = 0.25
    max_delay: float = 20.0

    def __post_init__(self) -> None:
        if self.attempts < 1 or self.base_delay < 0 or self.max_delay < 0:
            raise ConfigError(f"{self}: attempts must be >= 1 and delays >= 0")

    def delays(self, rng: random.Random | None = None) -> list[float]:
        """The waits between attempts (``attempts - 1`` of them)."""
        rng = rng or random.Random()
        return [
            min(self.max_delay, self.base_delay * 2.0**i) * rng.uniform(0.5, 1.0)
            for i in range(self.attempts - 1)
        ]


def is_transient(exc: BaseException) -> bool:
    """True when ``exc`` is worth retrying (network, timeout, throttling, server error).

    Example:
        >>> is_transient(ConnectionResetError()), is_transient(FileNotFoundError("x"))
        (True, False)
    """
    if isinstance(exc, (FastfeedError, *_PERMANENT)):
        return False
    if isinstance(exc, (TimeoutError, ConnectionError)):
        return True
    if _TRANSIENT_NAMES & {c.__name__ for c in type(exc).__mro__}:
        return True
    status = getattr(exc, "status", None)  # aiohttp.ClientResponseError
    if isinstance(status, int):
        return status >= 500 or status in (408, 429)
    response = getattr(exc, "response", None)  # botocore.exceptions.ClientError
    if isinstance(response, Mapping):
        code = response.get("Error", {}).get("Code", "")
        http = response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0
        return code in _TRANSIENT_CODES or int(http) >= 500 or int(http) == 429
    if isinstance(exc, OSError):  # s3fs maps unknown S3 errors to OSError(EIO)
        return exc.errno is None or exc.errno in _TRANSIENT_ERRNOS
    return False


def _permanent_error(exc: BaseException, url: str) -> FastfeedError | None:
    """A clear fastfeed error for a non-transient failure, or None to re-raise as is."""
    names = {c.__name__ for c in type(exc).__mro__}
    if "NoCredentialsError" in names or "PartialCredentialsError" in names:
        return RemoteError(
            f"{url}: no credentials found ({exc}); set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY "
            "or AWS_PROFILE, or pass the fsspec options {'key': ..., 'secret': ...} ({'anon': True} for public "
            "buckets): loader(..., storage=fastfeed.Storage(options=...)), pack(..., storage_options=...)"
        )
    if isinstance(exc, PermissionError):
        return RemoteError(
            f"{url}: access denied ({exc}); check the credentials and that they may read this "
            "bucket/prefix (storage_options or AWS_* environment variables)"
        )
    return None


def with_retries(fn: Callable[[], T], url: str, what: str, retry: RetryPolicy | None = None) -> T:
    """Call ``fn()``; retry transient failures with backoff; raise RemoteError at the end.

    Non-transient errors propagate at once (FileNotFoundError unchanged; missing
    credentials and access denied as RemoteError with the fix).

    Example:
        >>> with_retries(lambda: 42, "s3://b/k", "read")
        42
    """
    policy = retry or RetryPolicy()
    delays = policy.delays()
    for attempt in range(policy.attempts):
        try:
            return fn()
        except Exception as e:  # classified below: only transient errors are retried
            if not is_transient(e):
                translated = _permanent_error(e, url)
                if translated is None:
                    raise
                raise translated from e
            if attempt + 1 == policy.attempts:
                raise RemoteError(
                    f"{url}: {what} failed {policy.attempts} times, last with "
                    f"{type(e).__name__}: {e}; check that the endpoint is reachable "
                    "(the fsspec option {'client_kwargs': {'endpoint_url': ...}}: loader(..., storage=fastfeed.Storage("
                    "options=...)), pack(..., storage_options=...); or AWS_ENDPOINT_URL for s3://) and the network, or allow more attempts with "
                    "retry=RetryPolicy(attempts=..., max_delay=...)"
                ) from e
            log.info("%s: %s failed (%s: %s); retry %d/%d in %.2fs", url, what, type(e).__name__, e,
                     attempt + 1, policy.attempts - 1, delays[attempt])
            _sleep(delays[attempt])
    raise AssertionError("unreachable")  # pragma: no cover
