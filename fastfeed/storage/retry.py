"""Bounded remote calls: which errors are transient, how long a read may stall, backoff with jitter.

Every remote call fastfeed makes is bounded twice over: each connect and each read that
makes no progress for :attr:`RetryPolicy.timeout` seconds (60 by default) is given up
(:func:`fastfeed.storage.remote.filesystem` sets it in the file system's own client), and
transient failures (connection resets, timeouts, throttling ``SlowDown`` / HTTP 429, server
errors 5xx) are retried :attr:`~RetryPolicy.attempts` times with exponential backoff. So a
frozen store costs at most ``attempts * timeout`` plus the backoff (:meth:`RetryPolicy.bound`:
about 6.5 minutes with the defaults), then a :class:`~fastfeed.errors.RemoteError` names the
URL, what timed out, how long fastfeed waited and how to wait longer. A missing object,
denied access or missing credentials are not retried (the last two become a ``RemoteError``
that says what to check).

Where the policy comes from, first found first: the ``retry=`` argument of the storage
functions; the ``"timeout"`` / ``"retries"`` keys of ``storage_options`` (fastfeed reads
them and does not pass them to fsspec: ``loader(storage=fastfeed.Storage(timeout=,
retries=))`` puts them there, ``pack(..., storage_options={"timeout": 120})`` too); the
environment variables ``FASTFEED_STORAGE_TIMEOUT`` / ``FASTFEED_STORAGE_RETRIES``, read at
call time (for reads no option reaches, e.g. ``pack``'s object-store sources); the defaults.

Example:
    >>> with_retries(lambda: "ok", "s3://bucket/key", "read", RetryPolicy(attempts=3))
    'ok'
    >>> policy_of({"timeout": 5, "retries": 2, "anon": True})
    RetryPolicy(attempts=3, base_delay=1.0, max_delay=30.0, timeout=5.0)
    >>> round(RetryPolicy().bound() / 60, 1)        # minutes a frozen store costs at most
    6.5
"""

from __future__ import annotations

import errno
import logging
import os
import random
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, TypeVar

from fastfeed._util import parse_duration
from fastfeed.errors import ConfigError, FastfeedError, RemoteError

__all__ = ["OPTION_KEYS", "RETRIES_ENV", "RetryPolicy", "TIMEOUT_ENV", "check_retries", "check_timeout",
           "fsspec_options", "is_timeout", "is_transient", "policy_of", "with_policy", "with_retries"]

log = logging.getLogger(__name__)
T = TypeVar("T")
_sleep = time.sleep  # the one place retries wait (tests replace it)

#: The keys of ``storage_options`` that fastfeed reads itself (never passed to fsspec).
OPTION_KEYS = ("timeout", "retries")
#: Environment variables read at call time when no argument or option sets the timeout / retries.
TIMEOUT_ENV = "FASTFEED_STORAGE_TIMEOUT"
RETRIES_ENV = "FASTFEED_STORAGE_RETRIES"
DEFAULT_TIMEOUT = 60.0
DEFAULT_RETRIES = 5
#: An upload slower than this (bytes/s) counts as stalled: HTTP clients bound waiting for an answer,
#: not a body write the server stopped taking (aiohttp starts its read timeout once the body is
#: sent, and waits for a ``100 Continue`` without one), so uploads get a deadline by their size.
UPLOAD_FLOOR = 1_000_000

# Exception class names (anywhere in the MRO) of botocore / aiohttp / urllib3 /
# requests / fsspec errors that mean "the network or the server hiccupped; try again".
_TRANSIENT_NAMES = frozenset({
    "ChunkedEncodingError", "ClientConnectionError", "ClientOSError", "ClientPayloadError",
    "ConnectTimeoutError", "ConnectionClosedError", "EndpointConnectionError", "FSTimeoutError",
    "HTTPClientError", "IncompleteRead", "IncompleteReadError", "ProtocolError", "ProxyConnectionError",
    "ReadTimeoutError", "RemoteDisconnected", "ResponseStreamingError", "ServerDisconnectedError",
    "ServerTimeoutError",
})
# ... of those, the ones that mean "nothing came for too long" (the rest: the connection broke).
_TIMEOUT_NAMES = frozenset({"ConnectTimeoutError", "FSTimeoutError", "ReadTimeoutError", "ServerTimeoutError",
                            "ConnectTimeout", "ReadTimeout", "TimeoutError"})
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
    """How long a remote call may stall, and how often and how patiently it is retried.

    Attempt ``i`` (from 0) that fails waits ``min(max_delay, base_delay * 2**i)`` times a
    random factor in ``[0.5, 1]`` ("equal jitter": the wait still grows, and processes
    that failed together do not retry in lockstep).

    Attributes:
        attempts: tries of one call in all (``retries + 1``).
        base_delay: seconds before the first retry (doubling after each).
        max_delay: the longest wait between two tries.
        timeout: seconds a connect or a read may make no progress before the attempt is
            given up (set in the file system's client: s3fs/botocore, HTTP); None leaves the
            file system's own settings.

    Example:
        >>> p = RetryPolicy(attempts=4, base_delay=1.0, max_delay=3.0)
        >>> [round(d, 1) for d in p.delays(random.Random(0))]
        [0.9, 1.8, 2.1]
    """

    attempts: int = DEFAULT_RETRIES + 1
    base_delay: float = 1.0
    max_delay: float = 30.0
    timeout: float | None = DEFAULT_TIMEOUT

    def __post_init__(self) -> None:
        if isinstance(self.attempts, bool) or not isinstance(self.attempts, int) or self.attempts < 1 \
                or self.base_delay < 0 or self.max_delay < 0:
            raise ConfigError(f"{self}: attempts must be an integer >= 1 and delays >= 0")
        if self.timeout is not None:
            object.__setattr__(self, "timeout", check_timeout(self.timeout, "RetryPolicy.timeout"))

    @property
    def retries(self) -> int:
        """Tries after the first."""
        return self.attempts - 1

    def delays(self, rng: random.Random | None = None) -> list[float]:
        """The waits between attempts (``attempts - 1`` of them)."""
        rng = rng or random.Random()
        return [
            min(self.max_delay, self.base_delay * 2.0**i) * rng.uniform(0.5, 1.0)
            for i in range(self.attempts - 1)
        ]

    def upload_deadline(self, nbytes: int) -> float | None:
        """Seconds one upload attempt of ``nbytes`` may take: ``timeout`` plus the bytes at
        :data:`UPLOAD_FLOOR` (1 MB/s); None without a timeout.

        Example:
            >>> RetryPolicy(timeout=60).upload_deadline(256_000_000)
            316.0
        """
        return None if self.timeout is None else self.timeout + nbytes / UPLOAD_FLOOR

    def bound(self) -> float:
        """The longest one call can take against a store that stopped answering: every
        attempt waits ``timeout``, and the backoff at its longest (None: unbounded here)."""
        if self.timeout is None:
            return float("inf")
        waits = sum(min(self.max_delay, self.base_delay * 2.0**i) for i in range(self.attempts - 1))
        return self.attempts * self.timeout + waits


def check_timeout(value: Any, name: str) -> float:
    """A timeout in seconds (a number or ``"90s"``, ``"2m"``), > 0.

    Example:
        >>> check_timeout("2m", "timeout")
        120.0
    """
    seconds = parse_duration(value, name) if isinstance(value, (int, float, str)) and not isinstance(value, bool) \
        else -1.0
    if not seconds > 0:
        raise ConfigError(f"{name}={value!r} must be a number of seconds > 0 (or a duration like '90s', '2m')")
    return seconds


def check_retries(value: Any, name: str) -> int:
    """A number of retries (an integer >= 0)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{name}={value!r} must be an integer >= 0 (tries after the first)")
    return value


def policy_of(storage_options: Mapping[str, Any] | None = None) -> RetryPolicy:
    """The policy that ``storage_options`` (its ``"timeout"`` / ``"retries"`` keys) asks for;
    the environment's (``FASTFEED_STORAGE_TIMEOUT`` / ``FASTFEED_STORAGE_RETRIES``) or the
    defaults for what they do not set.

    Example:
        >>> policy_of({"timeout": "2m"}).timeout, policy_of(None).attempts
        (120.0, 6)
    """
    opts = storage_options or {}
    timeout = opts.get("timeout")
    if timeout is None:
        env = os.environ.get(TIMEOUT_ENV, "").strip()
        timeout = check_timeout(env, TIMEOUT_ENV) if env else DEFAULT_TIMEOUT
    retries = opts.get("retries")
    if retries is None:
        env = os.environ.get(RETRIES_ENV, "").strip()
        retries = check_retries(int(env) if env.isdigit() else env, RETRIES_ENV) if env else DEFAULT_RETRIES
    return RetryPolicy(attempts=check_retries(retries, "retries") + 1,
                       timeout=check_timeout(timeout, "timeout"))


def with_policy(storage_options: Mapping[str, Any] | None, *, timeout: Any = None,
                retries: int | None = None) -> dict[str, Any] | None:
    """``storage_options`` that carry ``timeout`` / ``retries`` (None: left as they are) to every read.

    Example:
        >>> with_policy({"anon": True}, timeout=30)
        {'anon': True, 'timeout': 30.0}
        >>> with_policy(None) is None
        True
    """
    out = dict(storage_options or {})
    if timeout is not None:
        out["timeout"] = check_timeout(timeout, "timeout")
    if retries is not None:
        out["retries"] = check_retries(retries, "retries")
    return out if (out or storage_options is not None) else None


def fsspec_options(storage_options: Mapping[str, Any] | None) -> dict[str, Any]:
    """``storage_options`` without the keys fastfeed reads itself (:data:`OPTION_KEYS`).

    Example:
        >>> fsspec_options({"anon": True, "timeout": 5})
        {'anon': True}
    """
    return {k: v for k, v in (storage_options or {}).items() if k not in OPTION_KEYS}


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


def is_timeout(exc: BaseException) -> str | None:
    """``"connect"`` or ``"read"`` when ``exc`` says nothing came for too long, else None.

    Example:
        >>> is_timeout(TimeoutError()), is_timeout(ConnectionResetError())
        ('read', None)
    """
    names = {c.__name__ for c in type(exc).__mro__}
    if not (names & _TIMEOUT_NAMES or isinstance(exc, TimeoutError)
            or (isinstance(exc, OSError) and exc.errno == errno.ETIMEDOUT)):
        return None
    return "connect" if any("Connect" in n for n in names) else "read"


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


def _gave_up(url: str, what: str, policy: RetryPolicy, exc: BaseException, elapsed: float) -> RemoteError:
    """The RemoteError after the last attempt: what failed, how long it took, the fix."""
    last = f"{type(exc).__name__}: {exc}"
    tries = "once" if policy.attempts == 1 else f"{policy.attempts} times"
    kind = is_timeout(exc)
    if kind is not None and policy.timeout is not None:
        doing = "no connection" if kind == "connect" else "no answer"
        longer, more = f"{2 * policy.timeout:g}", policy.retries + 2
        return RemoteError(
            f"{url}: {what} timed out {tries}, {elapsed:.1f} s in all ({doing} for {policy.timeout:g} s gives an "
            f"attempt up; last {last}); the store stopped answering or is too slow. "
            f"If it is only slow, wait longer: loader(..., storage=fastfeed.Storage(timeout={longer}, "
            f"retries={more})), pack(..., storage_options={{'timeout': {longer}, 'retries': {more}}}) or "
            f"{TIMEOUT_ENV}={longer} {RETRIES_ENV}={more}; else check that the endpoint answers (the fsspec "
            "option {'client_kwargs': {'endpoint_url': ...}}, AWS_ENDPOINT_URL for s3://) and the network"
        )
    return RemoteError(
        f"{url}: {what} failed {tries} in {elapsed:.1f} s, last with {last}; check that the endpoint is "
        "reachable (the fsspec option {'client_kwargs': {'endpoint_url': ...}}: loader(..., "
        "storage=fastfeed.Storage(options=...)), pack(..., storage_options=...); or AWS_ENDPOINT_URL for "
        "s3://) and the network, or allow more attempts: loader(..., storage=fastfeed.Storage(retries=...)), "
        "pack(..., storage_options={'retries': ...}), or retry=RetryPolicy(attempts=..., max_delay=...)"
    )


def with_retries(fn: Callable[[], T], url: str, what: str, retry: RetryPolicy | None = None) -> T:
    """Call ``fn()``; retry transient failures with backoff; raise RemoteError at the end.

    Non-transient errors propagate at once (FileNotFoundError unchanged; missing
    credentials and access denied as RemoteError with the fix). ``retry`` None: the
    environment's policy or the defaults (:func:`policy_of`).

    Example:
        >>> with_retries(lambda: 42, "s3://b/k", "read")
        42
    """
    policy = retry or policy_of(None)
    delays = policy.delays()
    start = time.monotonic()
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
                raise _gave_up(url, what, policy, e, time.monotonic() - start) from e
            # a stall is rare and worth a line in a job's log; a reset or a throttled request is not
            level = logging.WARNING if is_timeout(e) else logging.INFO
            log.log(level, "%s: %s failed (%s: %s); retry %d/%d in %.2fs", url, what, type(e).__name__, e,
                    attempt + 1, policy.attempts - 1, delays[attempt])
            _sleep(delays[attempt])
    raise AssertionError("unreachable")  # pragma: no cover
