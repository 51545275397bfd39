"""A bounded on-disk shard cache shared by every process of one host.

Several DataLoader workers of several ranks ask for the same shard at once; the cache
makes sure it is fetched once and that a half-written file is never seen:

- each entry has a lock file (``.locks/<entry>.lock``, ``fcntl.flock``): the first
  process to miss takes it and fetches, the others wait on it and then find the entry.
  The wait is bounded: a waiter watches the holder's ``.part`` file, and when it has not
  grown for ``wait`` seconds (the holder is stopped, or stuck in a read that outlasts its
  own timeouts) the waiter logs who holds the lock and fetches the entry itself (the
  ``.part`` names differ and publishing is atomic, so two producers are only a wasted
  download);
- the fetch writes ``.tmp/<entry>.<host>.<pid>.<rand>.part``, the producer verifies it
  (size, sha256), and an atomic ``os.replace`` publishes it under its final name;
- a hit sets the entry's mtime to now, so mtime order is least-recently-used order;
- under one cache-wide lock (``.locks/_cache.lock``) eviction deletes the least recently
  used entries until entries plus in-flight ``.part`` files fit ``capacity`` bytes.
  ``.part`` files of processes that died on this host are removed on the way.

Deleting an entry another process has open is safe on POSIX (its descriptor stays
valid). A path returned by :meth:`ShardCache.get` should be opened right away: an
entry is only evicted once everything used less recently is gone, so this matters
only when ``capacity`` is smaller than the shards in use at once (a warning says so).

Example:
    >>> import tempfile
    >>> cache = ShardCache(tempfile.mkdtemp(), capacity="1MB")
    >>> path = cache.get("demo", lambda f: f.write(b"x" * 10), size=10)
    >>> open(path, "rb").read()
    b'xxxxxxxxxx'
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import secrets
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Callable, Iterator

from fastfeed._util import format_bytes, parse_size
from fastfeed.errors import ConfigError

__all__ = ["CacheStats", "ShardCache"]

log = logging.getLogger(__name__)

_LOCKS = ".locks"
_TMP = ".tmp"
_GLOBAL_LOCK = "_cache.lock"
_SAFE = re.compile(r"[^A-Za-z0-9._-]+")
_STALE_PART_S = 60.0
#: How long an eviction waits for the cache-wide lock (held only to list and delete) before it
#: goes on without it (a holder that was stopped must not stop every other process's misses).
_EVICT_WAIT_S = 60.0


@dataclass
class CacheStats:
    """What this process's cache object did (counters, not shared across processes)."""

    hits: int = 0
    misses: int = 0
    fetched_bytes: int = 0
    evicted: int = 0
    evicted_bytes: int = 0


@contextlib.contextmanager
def _flock(path: Path, *, wait: float | None = None, progress: Callable[[], int] | None = None) -> Iterator[bool]:
    """Hold an exclusive lock on ``path``; yields True, or False when ``wait`` ran out first.

    ``wait`` None: wait as long as it takes. Otherwise the lock is polled, and the wait ends
    (without the lock) once ``progress()`` (a number that grows while the holder works, e.g.
    the bytes it has written) has not changed for ``wait`` seconds.
    """
    try:
        import fcntl
    except ImportError:  # pragma: no cover - non-POSIX
        raise ConfigError("cache_dir needs POSIX file locks (fcntl); pass cache_dir=None") from None
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        if wait is None:
            fcntl.flock(fd, fcntl.LOCK_EX)
        elif not _poll_lock(fd, wait, progress):
            yield False
            return
        os.ftruncate(fd, 0)  # who holds it, for the message of a process that gives up waiting
        os.write(fd, f"{socket.gethostname()} pid {os.getpid()} since {time.strftime('%H:%M:%S')}\n".encode())
        yield True
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def _poll_lock(fd: int, wait: float, progress: Callable[[], int] | None) -> bool:
    """Take the lock on ``fd``, polling; False once ``progress()`` stood still for ``wait`` seconds."""
    import fcntl

    nap, seen, since = 0.01, None, time.monotonic()
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            now = progress() if progress is not None else 0
            if now != seen:
                seen, since = now, time.monotonic()
            elif time.monotonic() - since > wait:
                return False
            time.sleep(nap)
            nap = min(0.5, nap * 2)


def _holder(lock: Path) -> str:
    """Who holds ``lock``, as its holder wrote it (``host pid N since HH:MM:SS``)."""
    try:
        text = lock.read_text(errors="replace").strip()
    except OSError:
        text = ""
    return f"held by {text}" if text else "holder unknown"


def entry_name(identity: str, basename: str) -> str:
    """File name of a cache entry: a digest of its identity plus a readable tail.

    Example:
        >>> entry_name("s3://b/shard-000001.tar|1024|", "shard-000001.tar")[16:]
        '-shard-000001.tar'
    """
    import hashlib

    digest = hashlib.sha256(identity.encode("utf-8")).hexdigest()[:16]
    tail = _SAFE.sub("_", basename)[-80:] or "entry"
    return f"{digest}-{tail}"


class ShardCache:
    """A folder of at most ``capacity`` bytes of whole files, LRU-evicted, multi-process safe.

    Args:
        root: the cache folder (created when missing). Put it on local disk; several
            processes of one host may share it.
        capacity: bound on the bytes of entries plus downloads in progress
            (``"50GB"``, ``"200GiB"`` or an int).
    """

    def __init__(self, root: str | os.PathLike[str], capacity: str | int = "50GB") -> None:
        self.root = Path(root).expanduser()
        self.capacity = parse_size(capacity, "cache_size")
        self.stats = CacheStats()
        try:
            (self.root / _LOCKS).mkdir(parents=True, exist_ok=True)
            (self.root / _TMP).mkdir(exist_ok=True)
        except OSError as e:
            raise ConfigError(f"cache_dir={str(root)!r} cannot be created ({e}); pass a writable folder") from None
        self._host = re.sub(r"[^A-Za-z0-9_-]+", "_", socket.gethostname())[:40] or "host"
        self._warned_small = False

    def __repr__(self) -> str:
        return f"ShardCache({str(self.root)!r}, capacity={format_bytes(self.capacity)!r})"

    # ------------------------------------------------------------------ public
    def get(
        self,
        name: str,
        produce: Callable[[BinaryIO], object],
        *,
        size: int | None = None,
        wait: float | None = None,
    ) -> str:
        """Return the local path of entry ``name``, producing it on a miss.

        Args:
            name: the entry's file name (see :func:`entry_name`); it must change when
                the content would (fold the source's size/sha256 into it).
            produce: writes the entry's bytes to the given file and raises if they are
                wrong (it runs at most once per miss, in one process at a time, unless a
                wait runs out).
            size: expected bytes of the entry when known, reserved before producing.
            wait: seconds to wait for another process's download of the entry that makes
                no progress, before producing it here too (None: as long as it takes).

        Returns:
            The path of the published entry.
        """
        final = self.root / name
        if self._touch(final):
            self.stats.hits += 1
            return str(final)
        lock = self.root / _LOCKS / f"{name}.lock"
        with _flock(lock, wait=wait, progress=lambda: self._part_bytes(name)) as locked:
            if not locked:
                log.warning(
                    "%s: waited %g s for another process's download of %s that made no progress (%s); "
                    "downloading it here too", self.root, wait, name, _holder(lock))
            if self._touch(final):  # another process fetched it while we waited
                self.stats.hits += 1
                return str(final)
            self.stats.misses += 1
            if size is not None:
                if size > self.capacity:
                    raise ConfigError(
                        f"{name}: {format_bytes(size)} does not fit cache_size={format_bytes(self.capacity)}; "
                        "raise it (at least two shards per process on this host: loader(..., "
                        "storage=fastfeed.Storage(cache_size=...))) or pass cache_dir=None"
                    )
                self.evict(reserve=size)
            part = self.root / _TMP / f"{name}.{self._host}.{os.getpid()}.{secrets.token_hex(4)}.part"
            try:
                with open(part, "wb") as f:
                    produce(f)
                    f.flush()
                os.replace(part, final)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    part.unlink()
            self.stats.fetched_bytes += final.stat().st_size
        self.evict(keep=name)
        return str(final)

    def entries(self) -> list[tuple[str, int, int]]:
        """(name, bytes, mtime_ns) of every published entry, least recently used first."""
        out = []
        for e in os.scandir(self.root):
            if e.name.startswith(".") or not e.is_file(follow_symlinks=False):
                continue
            with contextlib.suppress(FileNotFoundError):
                st = e.stat(follow_symlinks=False)
                out.append((e.name, st.st_size, st.st_mtime_ns))
        out.sort(key=lambda t: (t[2], t[0]))
        return out

    def total_bytes(self) -> int:
        """Bytes held by entries plus in-flight downloads."""
        return sum(b for _, b, _ in self.entries()) + sum(b for _, b in self._parts())

    def evict(self, *, reserve: int = 0, keep: str | None = None) -> int:
        """Delete least-recently-used entries until ``reserve`` more bytes fit; return bytes freed."""
        freed = 0
        with _flock(self.root / _LOCKS / _GLOBAL_LOCK, wait=_EVICT_WAIT_S):
            entries = self.entries()
            total = sum(b for _, b, _ in entries) + sum(b for _, b in self._parts())
            for name, nbytes, _ in entries:
                if total + reserve <= self.capacity:
                    break
                if name == keep:
                    continue
                with contextlib.suppress(FileNotFoundError):
                    (self.root / name).unlink()
                    total -= nbytes
                    freed += nbytes
                    self.stats.evicted += 1
                    self.stats.evicted_bytes += nbytes
                    log.debug("%s: evicted %s (%s)", self.root, name, format_bytes(nbytes))
            if total + reserve > self.capacity and not self._warned_small:
                self._warned_small = True
                log.warning(
                    "%s: cache_size=%s is smaller than the shards in use at once (%s); "
                    "raise it to at least two shards per process on this host (storage=fastfeed.Storage(cache_size=...))",
                    self.root, format_bytes(self.capacity), format_bytes(total + reserve),
                )
        return freed

    # ------------------------------------------------------------------ internals
    def _touch(self, path: Path) -> bool:
        try:
            os.utime(path, ns=(time.time_ns(), time.time_ns()))
        except FileNotFoundError:
            return False
        return True

    def _part_bytes(self, name: str) -> int:
        """Bytes written so far by the downloads of entry ``name`` in progress (any process)."""
        total = 0
        with contextlib.suppress(FileNotFoundError):
            for e in os.scandir(self.root / _TMP):
                if e.name.startswith(name + "."):
                    with contextlib.suppress(FileNotFoundError):
                        total += e.stat(follow_symlinks=False).st_size
        return total

    def _parts(self) -> list[tuple[str, int]]:
        """In-flight downloads; removes those of dead processes of this host."""
        out = []
        now = time.time()
        for e in os.scandir(self.root / _TMP):
            try:
                st = e.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            if self._is_stale(e.name, now - st.st_mtime):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(e.path)
                    log.info("%s: removed %s left by a process that died", self.root, e.name)
                continue
            out.append((e.name, st.st_size))
        return out

    def _is_stale(self, part_name: str, age_s: float) -> bool:
        bits = part_name.rsplit(".", 4)  # <entry>.<host>.<pid>.<rand>.part
        if len(bits) != 5 or bits[1] != self._host or age_s < _STALE_PART_S:
            return False
        try:
            os.kill(int(bits[2]), 0)
        except ProcessLookupError:
            return True
        except (PermissionError, ValueError):
            return False
        return False
