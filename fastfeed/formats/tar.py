"""Tar shards in the WebDataset convention, with NVIDIA DALI index files.

A sample is a run of adjacent members ``<key>.<ext>``, named by the one key rule
:func:`fastfeed.formats.naming.split_key` (``a/b/0001.seg.png`` -> key ``a/b/0001``, field
``seg.png``). Members are plain POSIX (ustar, pax when a name needs it) with fixed
mtime/uid/gid/mode and no user names, so the same input gives byte-identical shards.

Next to each shard the writer can produce DALI's webdataset index (format v1.2: per
sample, ``ext data_offset size member_path`` for each member) so that
``fn.readers.webdataset`` opens it without scanning.

Example:
    >>> import tempfile, os
    >>> d = tempfile.mkdtemp()
    >>> w = TarShardWriter(os.path.join(d, "s.tar"))
    >>> w.add("cat/0001", {"jpg": b"xx", "cls": b"3"})
    (0, 2048)
    >>> size, sha = w.close()
    >>> TarShardReader(os.path.join(d, "s.tar")).read(0, 2048)["cls"]
    b'3'
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import tarfile
from typing import BinaryIO, Iterator, Mapping

from fastfeed.errors import SampleError, ShardError
from fastfeed.formats.checksum import hasher
from fastfeed.formats.naming import split_key

__all__ = ["TarShardReader", "TarShardWriter", "dali_index_text"]

BLOCK = 512
RECORD = BLOCK * 20
_ZEROS = bytes(BLOCK)
_SPACE = re.compile(r"\s")


def _tarfile_header(name: str, size: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.size = size
    info.mtime = 0
    info.mode = 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.type = tarfile.REGTYPE
    return info.tobuf(format=tarfile.PAX_FORMAT, encoding="utf-8", errors="strict")


# The fast path below fills name and size into a header that tarfile itself produced,
# so both paths give the same bytes (tests compare them); tarfile handles the rest
# (names over 100 bytes or non-ASCII get a pax header, huge sizes a pax size record).
_TEMPLATE = _tarfile_header("a", 0)
_TEMPLATE_SUM = sum(_TEMPLATE) - sum(_TEMPLATE[148:156]) - ord("a") - sum(_TEMPLATE[124:136])
_SPACES_SUM = 8 * ord(" ")
_MAX_FAST_SIZE = 8**11 - 1


def _header(name: str, size: int) -> bytes:
    """Deterministic POSIX tar header(s) for a regular member ``name`` of ``size`` bytes."""
    raw = name.encode("utf-8", "surrogateescape")
    if len(raw) > 100 or not name.isascii() or size > _MAX_FAST_SIZE:
        return _tarfile_header(name, size)
    size_field = b"%011o\0" % size
    chk = _TEMPLATE_SUM + _SPACES_SUM + sum(raw) + sum(size_field)
    return b"".join((
        raw, bytes(100 - len(raw)), _TEMPLATE[100:124], size_field, _TEMPLATE[136:148],
        b"%06o\0 " % chk, _TEMPLATE[156:],
    ))


class TarShardWriter:
    """Write one tar shard (optionally with its DALI index) sample by sample.

    Fields of a sample are written in sorted order. ``close()`` pads the archive to a
    whole tar record and returns (size, sha256). With ``checksum`` (an algorithm of
    :mod:`fastfeed.formats.checksum`), :attr:`checksums` holds, per sample added, the
    checksum of its span (headers, data and padding: the bytes its reader reads).
    """

    def __init__(self, path: str | os.PathLike[str], *, fileobj: BinaryIO | None = None,
                 checksum: str | None = None) -> None:
        self.path = str(path)
        self.checksum = checksum
        #: per sample added, the checksum of its span (with ``checksum``; else empty)
        self.checksums: list[int] = []
        self._f: BinaryIO = fileobj if fileobj is not None else open(path, "wb", buffering=1 << 20)
        self._own = fileobj is None
        self._sha = hashlib.sha256()
        self._pos = 0
        self._dali: list[list[tuple[str, int, int, str]]] = []  # per sample (ext, data offset, size, name)
        self._names_have_spaces = False

    def _write(self, data: bytes) -> None:
        self._f.write(data)
        self._sha.update(data)
        self._pos += len(data)

    def add(self, key: str, fields: Mapping[str, bytes]) -> tuple[int, int]:
        """Append a sample; return (offset of its first header, byte span)."""
        start = pos = self._pos
        write, update = self._f.write, self._sha.update
        span = hasher(self.checksum) if self.checksum is not None else None
        members = []
        for ext in sorted(fields):
            data = fields[ext]
            size = len(data)
            name = f"{key}.{ext}"
            header = _header(name, size)
            pad = _ZEROS[:-size % BLOCK] if size % BLOCK else b""
            write(header)
            update(header)
            write(data)
            update(data)
            if pad:
                write(pad)
                update(pad)
            if span is not None:
                span.update(header)
                span.update(data)
                if pad:
                    span.update(pad)
            pos += len(header)
            members.append((ext, pos, size, name))
            pos += size + len(pad)
        self._pos = pos
        if span is not None:
            self.checksums.append(span.intdigest())
        if not self._names_have_spaces and (_SPACE.search(key) or any(_SPACE.search(f) for f in fields)):
            self._names_have_spaces = True
        self._dali.append(members)
        return start, pos - start

    def dali_index(self) -> str:
        """DALI webdataset index text for the samples written so far.

        Format v1.2 (per member ``ext data_offset size path``). DALI reads each line with
        whitespace-separated ``>>`` extraction, so a member path containing whitespace
        would shift the fields: such shards get format v1.1 (``ext data_offset size``),
        which DALI reads the same way minus the source-info path.
        """
        if self._names_have_spaces:
            lines = [" ".join(f"{e} {o} {n}" for e, o, n, _ in m) for m in self._dali]
            return f"v1.1 {len(lines)}\n" + "".join(line + "\n" for line in lines)
        return dali_index_text([" ".join(f"{e} {o} {n} {name}" for e, o, n, name in m) for m in self._dali])

    def close(self) -> tuple[int, str]:
        """Write the end-of-archive blocks and padding; return (size, sha256)."""
        end = self._pos + 2 * BLOCK
        self._write(b"\0" * (2 * BLOCK + (-end % RECORD)))
        self._f.flush()
        if self._own:
            os.fsync(self._f.fileno())
            self._f.close()
        return self._pos, self._sha.hexdigest()


def dali_index_text(entries: list[str]) -> str:
    """Render DALI's webdataset index (v1.2) from per-sample member triples."""
    return f"v1.2 {len(entries)}\n" + "".join(e + "\n" for e in entries)


class TarShardReader:
    """Read samples of a tar shard by (offset, size), or sequentially.

    ``file`` is a local path or an open binary file object supporting seek/read
    (for example an fsspec file).
    """

    def __init__(self, file: str | os.PathLike[str] | BinaryIO, *, name: str | None = None) -> None:
        if isinstance(file, (str, os.PathLike)):
            self.name = name or str(file)
            self._path: str | None = str(file)
            self._f: BinaryIO | None = None
        else:
            self.name = name or getattr(file, "path", None) or getattr(file, "name", "<stream>")
            self._path = None
            self._f = file
        self._pid = os.getpid()

    def _file(self) -> BinaryIO:
        if self._f is None or self._pid != os.getpid():
            if self._path is None:
                raise ShardError(f"{self.name}: stream cannot be reopened in a new process")
            try:
                self._f = open(self._path, "rb")
            except FileNotFoundError:
                raise ShardError(
                    f"{self._path}: shard is missing; restore it or re-run `fastfeed pack`"
                ) from None
            self._pid = os.getpid()
        return self._f

    def read(self, offset: int, size: int) -> dict:
        """Return the sample whose members start at ``offset`` and span ``size`` bytes."""
        f = self._file()
        f.seek(offset)
        buf = f.read(size)
        if len(buf) != size:
            raise SampleError(
                f"{self.name}: truncated at offset {offset} (wanted {size} bytes, got "
                f"{len(buf)}); the shard is damaged, re-run `fastfeed pack` or restore it",
                shard=self.name,
                offset=offset,
            )
        samples = list(_parse_members(io.BytesIO(buf), self.name, offset))
        if len(samples) != 1:
            raise SampleError(
                f"{self.name}: bytes at offset {offset} hold {len(samples)} samples, expected 1; "
                "the index does not match this shard, re-run `fastfeed pack`",
                shard=self.name,
                offset=offset,
            )
        return samples[0]

    def __iter__(self) -> Iterator[dict]:
        f = self._file()
        f.seek(0)
        yield from _parse_members(f, self.name, 0)

    def close(self) -> None:
        if self._f is not None and self._path is not None:
            self._f.close()
            self._f = None


def _parse_members(f: BinaryIO, name: str, base: int) -> Iterator[dict]:
    """Group the regular members of a tar stream into samples by key."""
    try:
        tf = tarfile.open(fileobj=f, mode="r|")
    except tarfile.TarError as e:
        raise SampleError(f"{name}: not a tar archive at offset {base} ({e})", shard=name, offset=base) from None
    current: dict | None = None
    try:
        for member in tf:
            if not member.isreg():
                continue
            parts = split_key(member.name)
            if parts is None:
                continue
            key, ext = parts
            ef = tf.extractfile(member)
            data = ef.read() if ef is not None else b""
            if len(data) != member.size:
                raise SampleError(
                    f"{name}: member {member.name} truncated at offset {base + member.offset}",
                    shard=name, key=key, offset=base + member.offset,
                )
            if current is None or current["__key__"] != key:
                if current is not None:
                    yield current
                current = {"__key__": key}
            current[ext] = data
    except tarfile.TarError as e:
        raise SampleError(
            f"{name}: corrupt tar data after offset {base} ({e}); the shard is damaged, re-run "
            "`fastfeed pack` or restore it",
            shard=name, offset=base,
        ) from None
    if current is not None:
        yield current
