"""fsspec file systems whose every call is bounded: the clients' timeouts set, deadlines, bounded streams.

:func:`filesystem` gives the file system of a URL with the policy's ``timeout`` (60 s
without progress, by default; :mod:`fastfeed.storage.retry`) set as the connect and read
timeouts of its own client, s3fs/botocore (``config_kwargs``) and HTTP (aiohttp's
``sock_connect`` / ``sock_read``), and those clients' own retries off: botocore and s3fs
retry a read that timed out up to 125 times between them (5 x 5 x 5 nested attempts: hours
against a frozen store), so the only retries are fastfeed's (:func:`with_retries`),
counted and bounded. Options the caller set in those keys are kept. Other protocols keep
their clients' timeouts (pass them in the fsspec options) and get fastfeed's retries.

What a read timeout does not cover gets a deadline: :func:`call_within` (an upload whose
body the store stopped taking: aiohttp starts its read timeout only once the body is sent).
:func:`open_remote` streams an object by ranged requests, each bounded and retried, where
``fs.open()`` would hand its reads to the client's retries.

Example:
    >>> fs, path = filesystem("s3://bucket/train", {"anon": True, "timeout": 30})   # doctest: +SKIP
    >>> fs.retries, fs.config_kwargs["read_timeout"]                               # doctest: +SKIP
    (1, 30.0)
"""

from __future__ import annotations

import inspect
import io
from typing import Any, BinaryIO, Mapping

from fastfeed.errors import ConfigError, missing_dependency
from fastfeed.storage.retry import RetryPolicy, fsspec_options, policy_of, with_retries

__all__ = ["call_within", "filesystem", "open_remote"]


def filesystem(
    url: str, storage_options: Mapping[str, Any] | None = None, *, retry: RetryPolicy | None = None
) -> tuple[Any, str]:
    """Return (fsspec filesystem, path within it) for ``url``, its client's timeouts set.

    ``retry`` (default: the policy of ``storage_options``,
    :func:`~fastfeed.storage.retry.policy_of`) gives the timeout; see the module docstring
    for what is set where.

    Example:
        >>> fs, path = filesystem("s3://bucket/train", {"anon": True, "timeout": 30})   # doctest: +SKIP
    """
    try:
        import fsspec
    except ImportError:
        raise missing_dependency("fsspec", "s3", "Remote datasets") from None
    timeout = (retry or policy_of(storage_options)).timeout
    options = fsspec_options(storage_options)
    try:
        protocol = fsspec.core.split_protocol(url)[0]
        kind = _client_kind(fsspec.get_filesystem_class(protocol)) if protocol and "::" not in url else None
        if timeout is not None and kind is not None:
            options = _with_timeouts(kind, options, timeout)
        fs, path = fsspec.core.url_to_fs(url, **options)
    except ImportError as e:  # e.g. s3fs/gcsfs missing for the protocol
        raise missing_dependency(getattr(e, "name", None) or "s3fs", "s3", f"{url.split('://')[0]}:// URLs") from e
    except ValueError as e:
        raise ConfigError(f"{url}: not a URL fsspec understands ({e})") from None
    if timeout is not None and kind == "s3":
        fs.retries = 1  # s3fs's own retry loops (nested: 25 tries of each request); fastfeed retries
    return fs, path


def call_within(fs: Any, method: str, seconds: float | None, *args: Any, **kwargs: Any) -> Any:
    """``fs.method(*args, **kwargs)``, given up after ``seconds`` where the file system allows it.

    fsspec's asynchronous file systems (s3fs, HTTP, gcsfs, ...) run a call on their event
    loop and take a ``timeout=`` that cancels it; others are called as they are (their own
    timeouts apply). Raises :class:`TimeoutError` naming the deadline.

    Example:
        >>> fs, path = filesystem("s3://bucket/ff/shard-000000.tar")                  # doctest: +SKIP
        >>> call_within(fs, "put_file", 316.0, "/tmp/shard-000000.tar", path)          # doctest: +SKIP
    """
    fn = getattr(fs, method)
    if seconds is None or not inspect.iscoroutinefunction(getattr(fn, "__wrapped__", None)):
        return fn(*args, **kwargs)
    try:
        return fn(*args, timeout=seconds, **kwargs)
    except Exception as e:
        if type(e).__name__ != "FSTimeoutError":
            raise
        raise TimeoutError(f"{method} not done within {seconds:.0f} s (the store takes no more data?)") from e


def _client_kind(cls: type) -> str | None:
    """``"s3"`` (s3fs), ``"http"`` (fsspec's HTTP) or None: the clients whose timeouts are set here."""
    for c in cls.__mro__:
        module = c.__module__ or ""
        if c.__name__ == "S3FileSystem" and module.split(".")[0] == "s3fs":
            return "s3"
        if c.__name__ == "HTTPFileSystem" and module.startswith("fsspec.implementations.http"):
            return "http"
    return None


def _with_timeouts(kind: str, options: dict[str, Any], timeout: float) -> dict[str, Any]:
    """``options`` with the connect / read timeouts of the client (and no retries of its own),
    where the caller did not set them."""
    out = dict(options)
    if kind == "s3":
        config = dict(out.get("config_kwargs") or {})
        config.setdefault("connect_timeout", timeout)
        config.setdefault("read_timeout", timeout)
        config.setdefault("retries", {"total_max_attempts": 1})
        out["config_kwargs"] = config
    elif kind == "http":
        import aiohttp

        client = dict(out.get("client_kwargs") or {})
        client.setdefault("timeout", aiohttp.ClientTimeout(total=None, sock_connect=timeout, sock_read=timeout))
        out["client_kwargs"] = client
    return out


class _RangeFile(io.RawIOBase):
    """A remote object read by ranged requests, each bounded and retried (see :func:`open_remote`)."""

    def __init__(self, url: str, size: int, storage_options: Mapping[str, Any] | None, retry: RetryPolicy,
                 block: int) -> None:
        super().__init__()
        self.url, self.size, self._retry, self._block = url, size, retry, block
        self._fs, self._path = filesystem(url, storage_options, retry=retry)
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self.size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buffer: Any) -> int:
        end = min(self.size, self._pos + len(buffer))
        if end <= self._pos:
            return 0
        start = self._pos
        data = with_retries(lambda: self._fs.cat_file(self._path, start=start, end=end), self.url,
                            f"read of bytes {start}-{end}", self._retry)
        n = len(data)
        buffer[:n] = data
        self._pos += n
        return n

    def readall(self) -> bytes:
        parts = []
        while chunk := self.read(self._block):  # RawIOBase's would ask for 8 KB at a time
            parts.append(chunk)
        return b"".join(parts)


def open_remote(
    url: str, *, size: int | None = None, storage_options: Mapping[str, Any] | None = None,
    retry: RetryPolicy | None = None, block: int = 8 << 20,
) -> BinaryIO:
    """A buffered, seekable file over a remote object whose every read is a bounded, retried request.

    ``fs.open()`` hands reads to the file system's own retries (which :func:`filesystem`
    turns off, so that fastfeed's are the only ones); this file reads ``block`` bytes at a
    time with ranged requests through :func:`with_retries`, so streaming a manifest or a
    tar from object storage is bounded and retried like every other read.

    Args:
        url: the object.
        size: its bytes when known (else one stat request).
        storage_options: fsspec options (with fastfeed's ``timeout`` / ``retries``).
        retry: the policy (default: that of ``storage_options``).
        block: bytes per request.

    Example:
        >>> with open_remote("s3://bucket/train.jsonl") as f:                  # doctest: +SKIP
        ...     first = f.readline()
    """
    policy = retry or policy_of(storage_options)
    if size is None:
        fs, path = filesystem(url, storage_options, retry=policy)
        size = int(with_retries(lambda: fs.info(path), url, "stat", policy)["size"])
    raw = _RangeFile(url, size, storage_options, policy, block)
    return io.BufferedReader(raw, buffer_size=block)  # type: ignore[return-value]
