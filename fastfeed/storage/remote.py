"""Object storage through fsspec: retries with backoff, whole-shard downloads, a local cache.

Any fsspec URL works (``s3://bucket/prefix``, ``gs://``, ``http(s)://``, ...). S3
endpoints and credentials come from the usual places (``AWS_ENDPOINT_URL``,
``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``, ``AWS_PROFILE``, ``~/.aws``), or from a
``storage_options`` dict passed through to fsspec, e.g.
``{"client_kwargs": {"endpoint_url": "http://minio:9000"}, "key": ..., "secret": ...}``.

How the loader reads a shard: :func:`open_shard` returns something a tar reader can
read samples from by (offset, size) without one request per sample:

- ``cache_dir`` given: the whole shard is downloaded once into a bounded local cache
  shared by all processes of the host (:class:`fastfeed.storage.cache.ShardCache`: lock file,
  ``.part`` file, verification, atomic rename, least-recently-used eviction) and its
  local path is returned. Ranks and workers that need the same shard wait for the one
  download; later epochs read local disk.
- no ``cache_dir``: the whole shard is downloaded into this process. Shards up to
  ``max_memory`` (default 512 MB) are held in memory (``io.BytesIO``); larger ones go
  to an unlinked temporary file (``TMPDIR``), which costs disk space and page cache but
  no process memory. The caller owns the returned file object and should close it when
  it moves on: memory is then about one shard per worker process (the loader keeps one
  open shard per worker), e.g. 8 workers x 256 MB shards = 2 GB.
- gzipped tars (``.tgz``, ``.tar.gz``) cannot be read by offset, so they are
  decompressed once, into the cache when there is one, else into memory/a temporary
  file as above; offsets then refer to the decompressed tar.
- a local plain path is returned as it is.

Downloads are parallel ranged reads (``fs.cat_ranges``, 8 MB parts, 4 at a time), each
retried on transient errors (connection resets, timeouts, throttling, HTTP 5xx) with
exponential backoff and jitter; after the last attempt a :class:`RemoteError` names the
URL and the fix. Missing objects are not retried (:class:`ShardError`).

Every call is bounded: the file systems come from :func:`fastfeed.storage.bounded.filesystem`
(the clients' connect and read timeouts set, their own retries off) and every request goes
through :func:`with_retries` (:mod:`fastfeed.storage.retry`: the timeout, the retries, the
RemoteError after the last).

Example:
    >>> src = open_shard("s3://bucket/train/shard-000000.tar", cache_dir="/local/cache",
    ...                  size=268435456, sha256="9f2c...")            # doctest: +SKIP
    >>> TarShardReader(src, name="s3://bucket/train/shard-000000.tar")  # doctest: +SKIP
"""

from __future__ import annotations

import errno
import functools
import hashlib
import io
import logging
import os
import tempfile
import zlib
from typing import Any, BinaryIO, Callable, Iterator, Mapping

from fastfeed._util import format_bytes, parse_size
from fastfeed.storage.cache import ShardCache, entry_name
from fastfeed.errors import RemoteError, ShardError
from fastfeed.storage.bounded import call_within, filesystem, open_remote
from fastfeed.storage.retry import RetryPolicy, is_transient, policy_of, with_retries

# filesystem, call_within and open_remote live in fastfeed.storage.bounded; importable from here too
__all__ = [
    "RetryPolicy",
    "call_within",
    "exists",
    "filesystem",
    "is_gzip_tar",
    "is_transient",
    "is_url",
    "open_remote",
    "open_shard",
    "policy_of",
    "read_bytes",
    "with_retries",
]

log = logging.getLogger(__name__)

PART_BYTES = 8 << 20
PARALLEL_PARTS = 4
_READ_BYTES = 8 << 20

# --------------------------------------------------------------------- basics
def is_url(path: str | os.PathLike[str]) -> bool:
    """True for a remote fsspec URL (``file://`` and plain paths are local).

    Example:
        >>> is_url("s3://b/k"), is_url("/data/x.tar"), is_url("file:///data/x.tar")
        (True, False, False)
    """
    s = str(path)
    return "://" in s and not s.startswith("file://")


def is_gzip_tar(path: str) -> bool:
    """True for gzipped tars (``.tgz``, ``.tar.gz``), which are read after decompression."""
    low = str(path).lower()
    return low.endswith(".tgz") or low.endswith(".tar.gz")


def local_path(path: str | os.PathLike[str]) -> str | None:
    """The local path of ``path`` (``file://`` stripped), or None for a remote URL."""
    s = str(path)
    if s.startswith("file://"):
        return s[len("file://"):]
    return None if is_url(s) else s


def read_bytes(
    url: str, *, storage_options: Mapping[str, Any] | None = None, retry: RetryPolicy | None = None
) -> bytes:
    """Read a whole (small) object, with retries. A missing object raises FileNotFoundError.

    Example:
        >>> read_bytes("s3://bucket/train/index.json")                 # doctest: +SKIP
    """
    policy = retry or policy_of(storage_options)
    fs, path = filesystem(url, storage_options, retry=policy)
    return with_retries(lambda: fs.cat_file(path), url, "read", policy)


def exists(
    url: str, *, storage_options: Mapping[str, Any] | None = None, retry: RetryPolicy | None = None
) -> bool:
    """True when the object exists (with retries)."""
    policy = retry or policy_of(storage_options)
    fs, path = filesystem(url, storage_options, retry=policy)
    return bool(with_retries(lambda: fs.exists(path), url, "exists", policy))


def object_size(
    url: str, *, storage_options: Mapping[str, Any] | None = None, retry: RetryPolicy | None = None
) -> int:
    """Size of an object in bytes (one HEAD/stat request, with retries); ShardError when missing."""
    policy = retry or policy_of(storage_options)
    fs, path = filesystem(url, storage_options, retry=policy)
    try:
        info = with_retries(lambda: fs.info(path), url, "stat", policy)
    except FileNotFoundError:
        raise _missing(url) from None
    size = info.get("size")
    if size is None:
        raise RemoteError(f"{url}: the server does not report the object's size; pass size= to open_shard")
    return int(size)


def _missing(url: str) -> ShardError:
    return ShardError(
        f"{url}: shard is missing; restore it or fix the path/URL (re-run `fastfeed pack` if the "
        "dataset was moved or re-packed)"
    )


# --------------------------------------------------------------------- download
class _NoRanges(Exception):
    """The server answered a ranged read with the whole object."""


class _ShortObject(Exception):
    """The object holds fewer bytes than expected (not transient: it was replaced or truncated)."""


def _remote_chunks(
    url: str, size: int, storage_options: Mapping[str, Any] | None, retry: RetryPolicy | None
) -> Iterator[bytes]:
    """The object's bytes in order: waves of parallel ranged reads, each wave retried."""
    retry = retry or policy_of(storage_options)
    fs, path = filesystem(url, storage_options, retry=retry)

    def whole() -> bytes:
        # a ranged read of the known size: s3fs would otherwise send a HEAD before the GET
        return fs.cat_file(path, start=0, end=size) if size > 0 else fs.cat_file(path)

    if size <= PART_BYTES:
        yield with_retries(whole, url, "download", retry)
        return
    pos = 0
    while pos < size:
        starts = list(range(pos, min(size, pos + PART_BYTES * PARALLEL_PARTS), PART_BYTES))
        ends = [min(s + PART_BYTES, size) for s in starts]

        def wave(starts: list[int] = starts, ends: list[int] = ends) -> list[bytes]:
            parts = fs.cat_ranges([path] * len(starts), starts, ends)
            for part, s, e in zip(parts, starts, ends):
                if isinstance(part, OSError) and part.errno == errno.EINVAL:  # S3 InvalidRange
                    raise _ShortObject(f"bytes {s}-{e} are past the end of the object") from part
                if isinstance(part, BaseException):
                    raise part
                if len(part) != e - s:
                    if len(part) == size:
                        raise _NoRanges()
                    raise _ShortObject(f"bytes {s}-{e} gave {len(part)} bytes: the object is shorter")
            return parts

        try:
            parts = with_retries(wave, url, f"download of bytes {starts[0]}-{ends[-1]}", retry)
        except _NoRanges:
            if pos:
                raise RemoteError(f"{url}: the server stopped honouring ranged reads mid-download") from None
            yield with_retries(whole, url, "download", retry)
            return
        yield from parts
        pos = ends[-1]


def _local_chunks(path: str) -> Iterator[bytes]:
    with open(path, "rb") as f:
        while chunk := f.read(_READ_BYTES):
            yield chunk


class _Gunzip:
    """Write-through gzip decompressor with bounded memory, for ``.tgz`` shards.

    Handles several gzip members in a row and zero padding after a member (as gzip(1)).
    """

    def __init__(self, out: BinaryIO, url: str) -> None:
        self._out = out
        self._url = url
        self._d = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
        self._between = False  # a member ended: only zero padding or another member may follow

    def write(self, data: bytes) -> None:
        while True:
            if self._d.eof:
                data = self._d.unused_data + data
                self._d = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
                self._between = True
            if self._between:
                data = data.lstrip(b"\0")
            if not data:
                return
            self._between = False
            try:
                self._out.write(self._d.decompress(data, _READ_BYTES))
            except zlib.error as e:
                raise ShardError(f"{self._url}: not valid gzip data ({e}); restore the shard") from None
            data = self._d.unconsumed_tail

    def close(self) -> None:
        self._out.write(self._d.flush())
        if not (self._d.eof or self._between):
            raise ShardError(f"{self._url}: gzip stream is truncated; the shard is damaged, restore it")


def _fetch(
    out: BinaryIO,
    url: str,
    *,
    size: int | None,
    sha256: str | None,
    gunzip: bool,
    storage_options: Mapping[str, Any] | None,
    retry: RetryPolicy | None,
) -> None:
    """Copy the shard at ``url`` (decompressed when ``gunzip``) into ``out``, verified.

    A size or checksum mismatch is retried once (the object may have been replaced
    mid-read), then raises ShardError.
    """
    src = local_path(url)
    for attempt in range(2):
        out.seek(0)
        out.truncate()
        if src is not None:
            chunks = _local_chunks(src)
        else:
            want = size if size is not None else object_size(url, storage_options=storage_options, retry=retry)
            chunks = _remote_chunks(url, want, storage_options, retry)
        sink: Any = _Gunzip(out, url) if gunzip else out
        h = hashlib.sha256() if sha256 else None
        n = 0
        short = None
        try:
            for chunk in chunks:
                n += len(chunk)
                if h is not None:
                    h.update(chunk)
                sink.write(chunk)
        except FileNotFoundError:
            raise _missing(url) from None
        except _ShortObject as e:
            short = f"{e}, the index says {size} bytes"
        if short is not None:
            problem = short
        elif size is not None and n != size:
            problem = f"got {n} bytes, the index says {size}"
        elif h is not None and h.hexdigest() != sha256:
            problem = f"sha256 is {h.hexdigest()[:16]}..., the index says {str(sha256)[:16]}..."
        else:
            if gunzip:
                sink.close()
            return
        log.warning("%s: %s (attempt %d of 2)", url, problem, attempt + 1)
    raise ShardError(
        f"{url}: {problem}; the shard changed after the index was written (re-run `fastfeed pack`) "
        "or is damaged (restore it)"
    )


# --------------------------------------------------------------------- open_shard
class _ShardBytes(io.BytesIO):
    """An in-memory shard that remembers where it came from (for error messages)."""

    def __init__(self, data: bytes, path: str) -> None:
        super().__init__(data)  # shares ``data`` (no copy) until written to
        self.path = path


class _Parts:
    """A write-only sink that keeps the pieces, joined once at the end (one copy at most)."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def seek(self, pos: int) -> None:
        pass

    def truncate(self) -> None:
        self.parts.clear()

    def write(self, data: bytes) -> None:
        self.parts.append(data)

    def getvalue(self) -> bytes:
        return self.parts[0] if len(self.parts) == 1 else b"".join(self.parts)


@functools.lru_cache(maxsize=8)
def _cache(cache_dir: str, capacity: int) -> ShardCache:
    return ShardCache(cache_dir, capacity)


def shard_cache(cache_dir: str | os.PathLike[str], cache_size: str | int = "50GB") -> ShardCache:
    """The (per-process, reused) :class:`ShardCache` object for ``cache_dir``."""
    return _cache(str(cache_dir), parse_size(cache_size, "cache_size"))


def open_shard(
    url: str,
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    cache_size: str | int = "50GB",
    storage_options: Mapping[str, Any] | None = None,
    size: int | None = None,
    sha256: str | None = None,
    retry: RetryPolicy | None = None,
    max_memory: str | int = "512MB",
) -> str | BinaryIO:
    """Make the shard at ``url`` readable by (offset, size): a local path or a file object.

    Args:
        url: a local path, ``file://`` URL or any fsspec URL; ``.tgz``/``.tar.gz`` are
            decompressed (offsets refer to the decompressed tar).
        cache_dir: local folder for a cache shared by the processes of this host;
            None to download into this process instead (see the module docstring).
        cache_size: bound of the cache (``"50GB"``); hold at least two shards per
            process of the host.
        storage_options: passed to fsspec (endpoint, credentials, ...).
        size: the shard's expected bytes (the index's ``ShardInfo.bytes``); verified,
            and part of the cache entry's identity. Looked up (one request) when None.
        sha256: the expected hex digest; verified on download when given (not on cache
            hits) and part of the cache entry's identity.
        retry: timeout and retries of every request (default: the ``"timeout"`` / ``"retries"``
            of ``storage_options``, else the environment's or the defaults: :func:`policy_of`).
        max_memory: without a cache, shards up to this size are held in memory, larger
            ones in an unlinked temporary file.

    Returns:
        A local path (``str``), or a seekable binary file object the caller must close.

    Raises:
        ShardError: the shard is missing, truncated or does not match size/sha256.
        RemoteError: storage failed after retries, or credentials/access are wrong.

    Example:
        >>> open_shard("/data/ff/shard-000000.tar")                      # doctest: +SKIP
        '/data/ff/shard-000000.tar'
        >>> f = open_shard("s3://bucket/ff/shard-000000.tar")            # doctest: +SKIP
        >>> f.seek(1024); header = f.read(512)                           # doctest: +SKIP
    """
    url = str(url)
    gz = is_gzip_tar(url)
    src = local_path(url)
    if src is not None:
        if not os.path.isfile(src):
            raise _missing(url)
        if not gz:
            return src
    retry = retry or policy_of(storage_options)
    fetch = functools.partial(
        _fetch, url=url, size=size, sha256=sha256, gunzip=gz, storage_options=storage_options, retry=retry
    )
    if cache_dir is not None:
        return _open_cached(url, src, gz, fetch, shard_cache(cache_dir, cache_size), size, sha256, retry)
    return _open_in_process(url, src, gz, fetch, size, parse_size(max_memory, "max_memory"),
                            storage_options, retry)


def _open_cached(
    url: str, src: str | None, gz: bool, fetch: Callable[..., None], cache: ShardCache,
    size: int | None, sha256: str | None, retry: RetryPolicy,
) -> str:
    if src is not None:  # a local .tgz: its identity is its path, size and mtime
        st = os.stat(src)
        identity = f"{os.path.abspath(src)}|{st.st_size}|{st.st_mtime_ns}"
    else:
        identity = f"{url}|{size if size is not None else ''}|{sha256 or ''}"
    base = url.rstrip("/").rsplit("/", 1)[-1]
    if gz:
        base = base[: -len(".tgz")] + ".tar" if base.lower().endswith(".tgz") else base[: -len(".gz")]
    # another process's download of the entry that stops making progress is waited for as long as
    # one request may stall here, then this process fetches too (cache.get)
    return cache.get(entry_name(identity, base), fetch, size=None if gz else size, wait=retry.bound())


def _open_in_process(
    url: str, src: str | None, gz: bool, fetch: Callable[..., None], size: int | None,
    max_memory: int, storage_options: Mapping[str, Any] | None, retry: RetryPolicy | None,
) -> BinaryIO:
    if gz:
        out: Any = tempfile.SpooledTemporaryFile(max_size=max_memory)
    else:
        known = size if size is not None else object_size(url, storage_options=storage_options, retry=retry)
        fetch = functools.partial(fetch, size=known)
        if known <= max_memory:
            parts = _Parts()
            fetch(parts)
            return _ShardBytes(parts.getvalue(), url)
        log.debug("%s: %s > max_memory, downloading to a temporary file", url, format_bytes(known))
        out = tempfile.TemporaryFile()
    try:
        fetch(out)
        out.seek(0)
    except BaseException:
        out.close()
        raise
    out.path = url  # for error messages of the tar reader
    return out
