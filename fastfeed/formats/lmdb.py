"""LMDB shards: one read-only LMDB environment (a single file) per shard.

Records are keyed by the sample's number inside the shard (``b"%010d"``) and hold the
sample encoded with :func:`encode_sample` (a small length-prefixed framing, never
pickle), including its ``__key__``.

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
from typing import Any, Iterator, Mapping

from fastfeed.errors import MissingDependencyError, SampleError, ShardError

__all__ = ["LmdbShardReader", "LmdbShardWriter", "decode_sample", "encode_sample"]

MAGIC = b"FFS1"
_MAP_SIZE = 1 << 40


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
    """Write one LMDB shard; samples are numbered in the order they are added."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        lmdb = _lmdb()
        self.path = str(path)
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
        self._txn.put(record_key(self._n), encode_sample(key, fields), append=True)
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
    """Read samples of an LMDB shard; reopens itself after a fork."""

    def __init__(self, path: str | os.PathLike[str], *, name: str | None = None) -> None:
        self.path = str(path)
        self.name = name or self.path
        self._env: Any = None
        self._pid = -1

    def _open(self) -> Any:
        if self._env is None or self._pid != os.getpid():
            lmdb = _lmdb()
            if not os.path.isfile(self.path):
                raise ShardError(f"{self.path}: shard is missing; restore it or re-run `fastfeed pack`")
            try:
                self._env = lmdb.open(
                    self.path, subdir=False, readonly=True, lock=False, readahead=False,
                    max_readers=2048,
                )
            except lmdb.Error as e:
                raise ShardError(f"{self.path}: cannot open LMDB shard ({e}); re-run `fastfeed pack`") from None
            self._pid = os.getpid()
        return self._env

    def read(self, offset: int, size: int = 0) -> dict:
        """Return record number ``offset`` (``size`` is unused for LMDB)."""
        env = self._open()
        with env.begin(buffers=True) as txn:
            buf = txn.get(record_key(offset))
            if buf is None:
                raise SampleError(
                    f"{self.name}: record {offset} is missing; the index does not match this "
                    "shard, re-run `fastfeed pack`",
                    shard=self.name, offset=offset,
                )
            return decode_sample(buf, f"{self.name}[{offset}]")

    def __len__(self) -> int:
        return int(self._open().stat()["entries"])

    def __iter__(self) -> Iterator[dict]:
        env = self._open()
        with env.begin(buffers=True) as txn:
            for k, v in txn.cursor():
                yield decode_sample(v, f"{self.name}[{bytes(k).decode()}]")

    def close(self) -> None:
        if self._env is not None and self._pid == os.getpid():
            self._env.close()
        self._env = None
