"""LMDB shards: one read-only LMDB environment (a single file) per shard.

Records are keyed by the sample's number inside the shard (``b"%010d"``) and hold the
sample encoded with :func:`encode_sample` (a small length-prefixed framing, never
pickle), including its ``__key__``.

py-lmdb refuses to open one environment twice in a process (its files are the key, so two
paths to one file count as one), and remembers the open ones across ``fork``. So every
reader in a process shares one read-only environment per shard file through
:func:`open_shared_env` (counted: the last reader to let go closes it), and a forked child
closes its copies of the parent's environments before it opens its own.

An LMDB environment is read through a memory map, and a page past the end of a file that is
shorter than its header says is a SIGBUS that kills the reading process. So before a file is
mapped, :func:`needed_size` reads its two meta pages and the file must hold every page they
count (a truncated shard is a :class:`~fastfeed.errors.ShardError` naming it); and
:class:`LmdbShardReader` checks the file's size (one ``fstat``) before every read, so a shard
truncated under a running loader is that error too. What remains: a file truncated in the
microseconds between that check and the read still faults (``docs/format.md``).

With ``checksum`` (:mod:`fastfeed.formats.checksum`), the writer records each record's
checksum (:attr:`LmdbShardWriter.checksums`); a reader given the index's checksums of the shard
(``sums``) checks every record it reads against them.

Example:
    >>> import tempfile, os
    >>> p = os.path.join(tempfile.mkdtemp(), "s.lmdb")
    >>> w = LmdbShardWriter(p); w.add("k0", {"txt": b"hi"})
    (0, 0)
    >>> _ = w.close()
    >>> LmdbShardReader(p).read(0, 0)
    {'__key__': 'k0', 'txt': b'hi'}
"""

from __future__ import annotations

import hashlib
import os
import struct
import threading
import weakref
from typing import Any, Callable, Iterator, Mapping

from fastfeed.errors import MissingDependencyError, SampleError, ShardError
from fastfeed.formats.checksum import ShardSums, digest
from fastfeed.formats.span import OpenFile, check_size

__all__ = ["LmdbShardReader", "LmdbShardWriter", "decode_sample", "encode_sample", "needed_size",
           "open_shared_env"]

MAGIC = b"FFS1"
_MAP_SIZE = 1 << 40
# LMDB's meta pages (pages 0 and 1; lmdb's mdb.c, MDB_meta after a 16-byte page header): magic
# and version at 16, the page size in the free DB's md_pad at 40, the last page number and the
# transaction id at 136 and 144; the meta of the higher transaction is the current one.
_LMDB_MAGIC = 0xBEEFC0DE
_META = struct.Struct("<II")
_PSIZE_AT, _LAST_AT = 40, 136
_PAGE = struct.Struct("<QQ")


def needed_size(path: str) -> int:
    """The bytes the LMDB file ``path`` must have: every page its current meta page counts.

    Reads the file's first two pages (nothing is mapped).

    Raises:
        ShardError: not an LMDB file, or shorter than its header says (truncated).

    Example:
        >>> import tempfile, os
        >>> p = os.path.join(tempfile.mkdtemp(), "s.lmdb")
        >>> w = LmdbShardWriter(p); _ = w.add("k0", {"txt": b"hi"}); _ = w.close()
        >>> needed_size(p) == os.path.getsize(p)
        True
    """
    try:
        with open(path, "rb") as fh:
            head = fh.read(1 << 16)
            size = os.fstat(fh.fileno()).st_size
    except FileNotFoundError:
        raise ShardError(f"{path}: shard is missing; restore it or re-run `fastfeed pack`") from None
    if len(head) < 64 or _META.unpack_from(head, 16) != (_LMDB_MAGIC, 1):
        raise ShardError(f"{path}: not an LMDB file (no LMDB meta page at its start, {size} bytes); the shard is "
                         "damaged or is not one: restore it or re-run `fastfeed pack`")
    psize = struct.unpack_from("<I", head, _PSIZE_AT)[0]
    if not 512 <= psize <= 1 << 16 or psize & (psize - 1):
        raise ShardError(f"{path}: its LMDB meta page gives a page size of {psize}; the shard is damaged, restore it "
                         "or re-run `fastfeed pack`")
    if size < 2 * psize:
        raise ShardError(f"{path}: {size} bytes, less than LMDB's two meta pages of {psize}: the shard is "
                         "truncated, restore it or re-run `fastfeed pack`")
    if len(head) < 2 * psize:
        with open(path, "rb") as fh:
            head = fh.read(2 * psize)
    metas = []
    for base in (0, psize):
        if _META.unpack_from(head, base + 16)[0] == _LMDB_MAGIC:
            last, txn = _PAGE.unpack_from(head, base + _LAST_AT)
            metas.append((txn, last))
    if not metas:
        raise ShardError(f"{path}: no valid LMDB meta page; the shard is damaged, restore it or re-run `fastfeed pack`")
    need = (max(metas)[1] + 1) * psize
    if size < need:
        raise ShardError(f"{path}: {size} bytes, but its LMDB header counts {need} ({need // psize} pages of {psize}): "
                         "the shard is truncated, restore it or re-run `fastfeed pack`")
    return need


def _lmdb() -> Any:
    """The ``lmdb`` module: a core dependency, imported when an LMDB shard is first used."""
    try:
        import lmdb
    except ImportError:
        raise MissingDependencyError(
            "LMDB shards need the 'lmdb' module, a dependency of fastfeed that is missing from "
            "this environment: pip install lmdb (or reinstall fastfeed)"
        ) from None
    return lmdb


class _SharedEnvs:
    """The read-only environments open in one process: file identity -> [environment, users]."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.lock = threading.Lock()
        self.envs: dict[tuple[int, int], list[Any]] = {}


_shared = _SharedEnvs()


def _shared_here() -> _SharedEnvs:
    """This process's table; in a forked child, a new one after closing the parent's copies.

    py-lmdb keeps the parent's environments in its "already open" set across fork, so the
    child must close its copies before opening the same files. Shards are opened with
    ``lock=False`` (no lock file, no reader table): closing the child's copy only unmaps
    the child's memory and closes the child's descriptors; the parent's stay as they are.
    The parent's lock is not taken: another parent thread may have held it at the fork.
    """
    global _shared
    table = _shared
    if table.pid != os.getpid():
        for env, _ in table.envs.values():
            try:
                env.close()
            except Exception:  # noqa: BLE001 - the child's copy; nothing of it is needed any more
                pass
        table = _shared = _SharedEnvs()
    return table


def open_shared_env(path: str) -> tuple[Any, Callable[[], None]]:
    """The process's read-only environment of the LMDB file ``path``, and its release.

    Readers of one file in one process (two loaders, a train and an eval loader,
    ``open_dataset``) share one environment; it closes when the last of them calls its
    release (each release counts once, however often it is called, and in no other process).

    Raises:
        ShardError: the file is missing, is not an LMDB shard, or is shorter than its header
            says (:func:`needed_size`).

    Example:
        >>> import tempfile, os
        >>> p = os.path.join(tempfile.mkdtemp(), "s.lmdb")
        >>> w = LmdbShardWriter(p); _ = w.add("k0", {"txt": b"hi"}); _ = w.close()
        >>> (a, release_a), (b, release_b) = open_shared_env(p), open_shared_env(p)
        >>> a is b
        True
        >>> release_a(); release_b()
    """
    lmdb = _lmdb()
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise ShardError(f"{path}: shard is missing; restore it or re-run `fastfeed pack`") from None
    if not os.path.isfile(path):
        raise ShardError(f"{path}: not a file; an LMDB shard is one file, re-run `fastfeed pack`")
    key = (st.st_dev, st.st_ino)  # what py-lmdb refuses to open twice: the file, not the path
    table = _shared_here()
    with table.lock:
        entry = table.envs.get(key)
        if entry is None:
            needed_size(path)  # a truncated file: this error, not a SIGBUS when a page past its end is read
            try:
                env = lmdb.open(path, subdir=False, readonly=True, lock=False, readahead=False,
                                max_readers=2048)
            except lmdb.Error as e:
                raise ShardError(f"{path}: cannot open LMDB shard ({e}); re-run `fastfeed pack`") from None
            entry = table.envs[key] = [env, 0]
        entry[1] += 1
        env = entry[0]
    done = False

    def release() -> None:
        nonlocal done
        if done or table.pid != os.getpid():
            return  # released already, or a forked child's copy (closed by _shared_here)
        done = True
        with table.lock:
            entry = table.envs.get(key)
            if entry is None or entry[0] is not env:
                return
            entry[1] -= 1
            if entry[1] == 0:
                del table.envs[key]
                env.close()

    return env, release


def record_key(i: int) -> bytes:
    return b"%010d" % i


def encode_sample(key: str, fields: Mapping[str, bytes]) -> bytes:
    """Frame a sample: magic, field count, then (name, bytes) pairs in sorted order."""
    items = [("__key__", key.encode("utf-8"))] + [(k, bytes(fields[k])) for k in sorted(fields)]
    parts = [MAGIC, struct.pack("<I", len(items))]
    for name, data in items:
        n = name.encode("utf-8")
        parts += [struct.pack("<HQ", len(n), len(data)), n, data]
    return b"".join(parts)


def decode_sample(buf: bytes | memoryview, where: str = "") -> dict:
    """Inverse of :func:`encode_sample`; raises SampleError on damaged records."""
    mv = memoryview(buf)
    if bytes(mv[:4]) != MAGIC:
        raise SampleError(f"{where}: not a fastfeed LMDB record (bad magic)", shard=where)
    try:
        (count,) = struct.unpack_from("<I", mv, 4)
        pos = 8
        out: dict = {}
        for _ in range(count):
            nlen, dlen = struct.unpack_from("<HQ", mv, pos)
            pos += 10
            name = bytes(mv[pos : pos + nlen]).decode("utf-8")
            pos += nlen
            if pos + dlen > len(mv):
                raise struct.error("field runs past the record")
            out[name] = bytes(mv[pos : pos + dlen])
            pos += dlen
    except (struct.error, UnicodeDecodeError) as e:
        raise SampleError(f"{where}: damaged LMDB record ({e})", shard=where) from None
    out["__key__"] = out["__key__"].decode("utf-8")
    return out


class LmdbShardWriter:
    """Write one LMDB shard; samples are numbered in the order they are added.

    With ``checksum`` (an algorithm of :mod:`fastfeed.formats.checksum`), :attr:`checksums`
    holds, per sample added, the checksum of its record (the bytes its reader reads).
    """

    def __init__(self, path: str | os.PathLike[str], *, checksum: str | None = None) -> None:
        lmdb = _lmdb()
        self.path = str(path)
        self._digest = digest(checksum) if checksum is not None else None
        #: per sample added, the checksum of its record (with ``checksum``; else empty)
        self.checksums: list[int] = []
        if os.path.exists(self.path):
            os.remove(self.path)
        self._env = lmdb.open(
            self.path, subdir=False, map_size=_MAP_SIZE, lock=False, sync=False,
            metasync=False, readahead=False, meminit=True, max_dbs=0,
        )
        self._txn = self._env.begin(write=True)
        self._n = 0

    def add(self, key: str, fields: Mapping[str, bytes]) -> tuple[int, int]:
        """Append a sample; return (record number, 0)."""
        record = encode_sample(key, fields)
        if self._digest is not None:
            self.checksums.append(self._digest(record))
        self._txn.put(record_key(self._n), record, append=True)
        self._n += 1
        return self._n - 1, 0

    def close(self) -> tuple[int, str]:
        """Commit, sync, and return (file size, sha256)."""
        self._txn.commit()
        self._env.sync(True)
        self._env.close()
        h = hashlib.sha256()
        with open(self.path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        return os.path.getsize(self.path), h.hexdigest()


class LmdbShardReader:
    """Read samples of an LMDB shard; shares the process's environment of the file
    (:func:`open_shared_env`) and opens its own after a fork.

    Every read first checks that the file still has the size its header gave when it was
    opened (one ``fstat``): a shard truncated while it is read is a ShardError, not a SIGBUS.
    With ``sums`` (:class:`~fastfeed.formats.checksum.ShardSums`), every record read is checked
    against its checksum.
    """

    def __init__(self, path: str | os.PathLike[str], *, name: str | None = None,
                 sums: ShardSums | None = None) -> None:
        self.path = str(path)
        self.name = name or self.path
        self.sums = sums
        self._env: Any = None
        self._pid = -1
        self._release: Any = None
        self._file: OpenFile | None = None
        self._need = 0

    def _open(self) -> Any:
        if self._env is None or self._pid != os.getpid():
            self._env, release = open_shared_env(self.path)
            self._pid = os.getpid()
            # a reader dropped without close() lets go of the environment too
            self._release = weakref.finalize(self, release)
            self._release.atexit = False
            self._file = OpenFile.open(self.path)
            self._need = needed_size(self.path)
        check_size(self._file.fd, self._need, self.name)  # type: ignore[union-attr]
        return self._env

    def read(self, offset: int, size: int = 0) -> dict:
        """Return record number ``offset`` (``size`` is unused for LMDB).

        Raises:
            ShardError: the file shrank since it was opened.
            SampleError: the record is missing, damaged, or its checksum is not the index's (``sums``).
        """
        env = self._open()
        with env.begin(buffers=True) as txn:
            buf = txn.get(record_key(offset))
            if buf is None:
                raise SampleError(
                    f"{self.name}: record {offset} is missing; the index does not match this "
                    "shard, re-run `fastfeed pack`",
                    shard=self.name, offset=offset,
                )
            if self.sums is not None:
                self.sums.check(buf, offset, self.name, lambda: _key_of(buf))
            return decode_sample(buf, f"{self.name}[{offset}]")

    def records(self) -> Iterator[tuple[int, memoryview]]:
        """Every record's number and bytes (valid until the next one), in order; the file's size
        is checked before each."""
        env = self._open()
        with env.begin(buffers=True) as txn:
            for k, v in txn.cursor():
                self._open()
                yield int(bytes(k)), v

    def __len__(self) -> int:
        return int(self._open().stat()["entries"])

    def __iter__(self) -> Iterator[dict]:
        for n, v in self.records():
            yield decode_sample(v, f"{self.name}[{n:010d}]")

    def close(self) -> None:
        """Let go of the shared environment (closed when no other reader of this process uses it)."""
        if self._release is not None:
            self._release()  # once only; does nothing in a forked child
        self._env = self._release = self._file = None


def _key_of(buf: bytes | memoryview) -> str:
    """The key of a record, for messages (empty when the record is too damaged to say)."""
    try:
        return str(decode_sample(buf)["__key__"])
    except (SampleError, KeyError, AttributeError, UnicodeDecodeError):
        return ""
