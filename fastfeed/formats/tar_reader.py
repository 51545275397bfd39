"""The loader's tar reader: one ``pread`` and a small header parser per sample.

:class:`~fastfeed.formats.tar.TarShardReader` parses a sample with :mod:`tarfile`,
which costs ~300 us per sample here: a third of the time budget of decoding a JPEG.
Reading a sample the index located needs much less: the span's bytes in one
``os.pread`` and, per member, its 512-byte header (name, size, type, checksum) plus
pax / GNU long-name records. That is what :func:`parse_sample` does (~15 us); anything
it does not recognise (sparse files, base-256 sizes it cannot trust, ...) falls back to
the tarfile-based reader, so both always agree.

Member names split into key and field by the one key rule
(:func:`fastfeed.formats.naming.split_key`), as the index scan of WebDataset tars does.

Example:
    >>> import tempfile, os
    >>> from fastfeed.formats.tar import TarShardWriter
    >>> p = os.path.join(tempfile.mkdtemp(), "s.tar")
    >>> w = TarShardWriter(p); off, size = w.add("a/k0", {"txt": b"hi", "cls": b"1"}); _ = w.close()
    >>> FastTarReader(p).read(off, size)
    {'__key__': 'a/k0', 'cls': b'1', 'txt': b'hi'}
"""

from __future__ import annotations

import io
import mmap
import os
import struct
import zlib
from typing import Any, BinaryIO, Callable, Iterator

import numpy as np

from fastfeed.errors import SampleError, ShardError
from fastfeed.formats.checksum import ShardSums
from fastfeed.formats.naming import RAW_FIELD, split_key
from fastfeed.formats.span import FileSpan, OpenFile, check_size
from fastfeed.formats.tar import TarShardReader

__all__ = ["FastTarReader", "first_member_name", "parse_sample"]

BLOCK = 512
_REGULAR = (ord("0"), 0, ord("7"))


class _Unusual(Exception):
    """A header this parser leaves to tarfile."""


def _octal(field: bytes) -> int:
    if field[:1] and field[0] & 0x80:
        raise _Unusual("base-256 number")
    text = field.split(b"\0", 1)[0].strip()
    return int(text, 8) if text else 0


def _pax(data: bytes) -> dict[str, str]:
    out: dict[str, str] = {}
    pos = 0
    while pos < len(data):
        sp = data.index(b" ", pos)
        length = int(data[pos:sp])
        record = data[sp + 1 : pos + length - 1]  # without the trailing newline
        k, _, v = record.partition(b"=")
        out[k.decode("utf-8", "surrogateescape")] = v.decode("utf-8", "surrogateescape")
        pos += length
    return out


def _byte_sum(buf: bytes, pos: int = 0) -> int:
    """The sum of the 512 bytes at ``pos``, exactly: Adler-32's first half is the byte sum
    modulo 65521, and a half block sums to at most 256 * 255 = 65280, so two calls over
    256 bytes each give it with no modulo (~0.4 us; ``sum()`` of the bytes takes ~1.9).

    Example:
        >>> _byte_sum(bytes(range(256)) * 2) == sum(bytes(range(256)) * 2)
        True
    """
    return (zlib.adler32(buf[pos:pos + 256], 0) & 0xFFFF) + (zlib.adler32(buf[pos + 256:pos + BLOCK], 0) & 0xFFFF)


def _checksum_ok(h: bytes) -> bool:
    stored = h[148:156].split(b"\0", 1)[0].strip()
    if not stored:
        return False
    want = int(stored, 8)
    unsigned = _byte_sum(h) - sum(h[148:156]) + 8 * 32
    if unsigned == want:
        return True
    # old tars summed signed chars: each byte above 127 counted 256 less (tarfile's signed_chksum)
    signed = unsigned - 256 * sum(1 for b in h if b > 127)
    return signed == want


def _parse(buf: bytes | memoryview, name: str, base: int) -> dict[str, Any]:
    mv = memoryview(buf)
    n = len(mv)
    pos = 0
    sample: dict[str, Any] = {}
    long_name: str | None = None
    pax: dict[str, str] = {}
    while pos + BLOCK <= n:
        h = bytes(mv[pos : pos + BLOCK])
        if h.count(0) == BLOCK:
            break
        if not _checksum_ok(h):
            raise SampleError(
                f"{name}: corrupt tar header at offset {base + pos} (bad checksum); the shard is "
                "damaged, restore it or re-run `fastfeed pack`",
                shard=name, key=sample.get("__key__", ""), offset=base + pos,
            )
        typ = h[156]
        size = int(pax["size"]) if "size" in pax else _octal(h[124:136])
        start, end = pos + BLOCK, pos + BLOCK + size
        if end > n:
            raise SampleError(
                f"{name}: member at offset {base + pos} runs past the sample's span ({size} bytes); "
                "the index does not match this shard, re-run `fastfeed pack`",
                shard=name, key=sample.get("__key__", ""), offset=base + pos,
            )
        if typ == ord("x"):
            pax = _pax(bytes(mv[start:end]))
        elif typ == ord("L"):
            long_name = bytes(mv[start:end]).split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
        elif typ in (ord("g"), ord("K")):
            pass  # global pax header, GNU long link name: nothing a sample needs
        elif typ in _REGULAR:
            member = pax.get("path") or long_name or _header_name(h)
            parts = split_key(member)
            if parts is not None:
                key, ext = parts
                if "__key__" not in sample:
                    sample["__key__"] = key
                elif sample["__key__"] != key:
                    raise SampleError(
                        f"{name}: bytes at offset {base} hold more than one sample ('{sample['__key__']}', "
                        f"'{key}'); the index does not match this shard, re-run `fastfeed pack`",
                        shard=name, key=key, offset=base,
                    )
                # raw pixels (pack --store raw) stay a view of what was read: no copy of ~0.5 MB
                sample[ext] = mv[start:end] if ext == RAW_FIELD else bytes(mv[start:end])
            pax, long_name = {}, None
        elif typ in (ord("S"), ord("M"), ord("V")):
            raise _Unusual(f"member type {chr(typ)}")
        else:
            pax, long_name = {}, None  # directories, links, devices: not sample data
        pos = start + -(-size // BLOCK) * BLOCK
    if "__key__" not in sample:
        raise SampleError(
            f"{name}: no sample member at offset {base}; the index does not match this shard, "
            "re-run `fastfeed pack`",
            shard=name, offset=base,
        )
    return sample


def _header_name(h: bytes) -> str:
    name = h[0:100].split(b"\0", 1)[0]
    if h[257:263] == b"ustar\x00":  # POSIX: a prefix field precedes the name
        prefix = h[345:500].split(b"\0", 1)[0]
        if prefix:
            name = prefix + b"/" + name
    return name.decode("utf-8", "surrogateescape")


# The fields of a ustar / v7 header the plain path reads, in one call: name, size, checksum,
# type flag, magic (mode, uid, gid, mtime, the link name and the version are skipped).
_HEADER = struct.Struct("100s24x12s12x8sc100x6s")
_PLAIN_TYPES = (b"0", b"\0", b"7")
_TERMINATORS = (0, 32)  # NUL or space after the octal digits


_ZERO_BLOCK = bytes(BLOCK)


def _address(view: memoryview) -> int:
    """The memory address of a (read-only) buffer's first byte."""
    return int(np.frombuffer(view, dtype=np.uint8).__array_interface__["data"][0]) if len(view) else 0


def _parse_plain(buf: bytes | memoryview) -> dict[str, Any] | None:
    """The plain case, fast: every member one ustar/v7 header of a regular file (no pax, no
    GNU long name), with a name, an octal size and checksum in the usual spelling, a right
    (unsigned) checksum, and one key; zero blocks may end the span. None for anything else,
    which :func:`_parse` then reads (and reports); whenever this gives a dict, it is the one
    :func:`_parse` gives (the tests compare both over varied tars).

    Per member: one ``struct`` unpack, two ``int``, the key rule and :func:`_byte_sum`.

    Raises:
        ValueError: a number that is not octal (the caller falls back to :func:`_parse`).
    """
    n = len(buf)
    pos = 0
    view = buf if type(buf) is memoryview else None  # a mapped shard: only raw pixels stay views
    fields: dict[str, Any] = {}
    key: str | None = None
    same: str | None = None  # key + ".", the start of the next members' names
    unpack = _HEADER.unpack_from
    while pos + BLOCK <= n:
        raw, size_f, chk, typ, magic = unpack(buf, pos)
        if not raw[0]:  # no name: the end-of-archive blocks, or something odd
            if buf[pos:pos + BLOCK] == _ZERO_BLOCK:
                break
            return None
        if (typ not in _PLAIN_TYPES or size_f[11] not in _TERMINATORS or chk[6] not in _TERMINATORS
                or chk[7] not in _TERMINATORS):
            return None
        size = int(size_f[:11], 8)
        start = pos + BLOCK
        end = start + size
        if end > n or _byte_sum(buf, pos) - sum(chk) + 8 * 32 != int(chk[:6], 8):
            return None  # past the span, or a bad checksum (or an old tar's signed sum): _parse tells
        member = raw.split(b"\0", 1)[0]
        if magic == b"ustar\0" and buf[pos + 345]:  # POSIX: a prefix field precedes the name
            member = bytes(buf[pos + 345:pos + 500]).split(b"\0", 1)[0] + b"/" + member
        text = member.decode("utf-8", "surrogateescape")
        if same is not None and text.startswith(same) and "/" not in text[len(same):]:
            field = text[len(same):].lower()  # what split_key gives (see below), without its regexes
        else:
            parts = split_key(text)
            if parts is None or (key is not None and parts[0] != key):
                return None
            key, field = parts
            # A later member named key + "." + rest, rest without "/", splits into (key, rest)
            # too: the key rule's regex can only split it at the same place as the first name
            # (every candidate cut lies inside the key, and whether it fits depends on the key
            # alone); a dunder key is left to split_key (a name like "__a__.b__" is metadata).
            same = None if key.startswith("__") else key + "."
        fields[field] = buf[start:end] if view is None or field == RAW_FIELD else bytes(view[start:end])
        pos = start + -(-size // BLOCK) * BLOCK
    if key is None:
        return None
    return {"__key__": key, **fields}


def parse_sample(buf: bytes | memoryview, name: str = "<tar>", offset: int = 0) -> dict[str, Any] | None:
    """Parse the members of one sample's span; None when tarfile should do it instead.

    Plain ustar members (what ``fastfeed pack`` writes) take a fast path
    (:func:`_parse_plain`) that gives the same dict; anything else the general one. From a
    ``memoryview`` (a memory-mapped shard) the raw-pixel field stays a view of it and the
    other fields are copied to ``bytes``, on both paths.

    Raises:
        SampleError: the span is damaged or holds other than exactly one sample.

    Example:
        >>> import io, tarfile
        >>> out = io.BytesIO()
        >>> with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tf:
        ...     for field, data in (("txt", b"hi"), ("cls", b"1")):
        ...         info = tarfile.TarInfo(f"k0.{field}"); info.size = len(data)
        ...         tf.addfile(info, io.BytesIO(data))
        >>> parse_sample(out.getvalue()[:2048])
        {'__key__': 'k0', 'txt': b'hi', 'cls': b'1'}
    """
    if type(buf) is bytes or type(buf) is memoryview:
        try:
            plain = _parse_plain(buf)
        except ValueError:
            plain = None
        if plain is not None:
            return plain
    try:
        return _parse(buf, name, offset)
    except (_Unusual, ValueError):
        return None


def first_member_name(read: Callable[[int, int], bytes], offset: int, where: str = "<tar>") -> str:
    """Path of the first regular member whose headers start at ``offset`` (pax and GNU
    long names honoured), reading only the header blocks through ``read(offset, size)``.

    For index files that do not carry member names (DALI's v1.1, written when a name holds
    whitespace), so the key still comes from the tar itself.

    Raises:
        SampleError: no regular member header at ``offset``.

    Example:
        >>> first_member_name(lambda o, n: shard[o : o + n], 0)         # doctest: +SKIP
        'train/IMG 0001.jpg'
    """
    pos, long_name, pax = offset, None, {}
    for _ in range(8):  # pax/longname headers, then the member's own
        h = bytes(read(pos, BLOCK))
        if len(h) < BLOCK or h.count(0) == BLOCK or not _checksum_ok(h):
            break
        typ = h[156]
        size = _octal(h[124:136])
        if typ in _REGULAR:
            return pax.get("path") or long_name or _header_name(h)
        padded = -(-size // BLOCK) * BLOCK
        if typ == ord("x"):
            pax = _pax(bytes(read(pos + BLOCK, size)))
        elif typ == ord("L"):
            long_name = bytes(read(pos + BLOCK, size)).split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
        pos += BLOCK + padded
    raise SampleError(f"{where}: no tar member header at offset {offset}; the index does not match "
                      "this shard, re-run `fastfeed pack`", shard=where, offset=offset)


def _key_in(buf: bytes | memoryview) -> str:
    """The key of the sample in a span, for messages (empty when the span is too damaged to say)."""
    try:
        sample = parse_sample(buf)
    except (SampleError, ValueError, IndexError, struct.error):
        return ""
    return str(sample["__key__"]) if sample else ""


class FastTarReader:
    """Read samples of a tar shard by (offset, size): a local path or a seekable file.

    Implements the shard reader protocol of :mod:`fastfeed.formats`. Reopens a path
    after a fork; a file object belongs to the process that opened it.

    With ``use_mmap`` (a local path; the loader asks for it on datasets of raw pixels,
    ``pack --store raw``), samples are read from a read-only memory map of the shard
    instead of with ``pread``: the raw pixel field (``rgb8``) is then a view of the page
    cache, so a random crop touches only its rows and nothing is copied or allocated per
    sample. Other fields are copied out as always. Before a read touches the map, the file's
    size is checked against the shard's (``size``, the index's; else the map's): a shard
    truncated under a running loader is a :class:`~fastfeed.errors.ShardError`, not a
    SIGBUS (one ``fstat`` a sample; a file truncated between that check and the decoder's
    reading of the pixels still faults: see ``docs/format.md``). Without the map, a read
    that comes back short is that ShardError when the file shrank, else a SampleError.

    With ``sums`` (the index's checksums of this shard, :class:`~fastfeed.formats.checksum.ShardSums`),
    :meth:`read` checks every sample's span against its checksum before parsing it.

    With ``raw_rows`` as well, only the members' headers are read through the map and the
    raw pixel field comes back as a :class:`~fastfeed.formats.span.FileSpan`: its place in
    the file, from which the decoder reads just the rows of its crop (``preadv`` into a
    buffer it reuses; see :mod:`fastfeed.formats.span` for when that beats the map).
    """

    def __init__(self, file: str | os.PathLike[str] | BinaryIO, *, name: str | None = None,
                 use_mmap: bool = False, raw_rows: bool = False, size: int | None = None,
                 sums: ShardSums | None = None) -> None:
        self._file = file
        self._size = size
        self.sums = sums
        self._path = str(file) if isinstance(file, (str, os.PathLike)) else None
        self.name = name or self._path or getattr(file, "path", None) or "<stream>"
        self._open: OpenFile | None = None
        self._slow: TarShardReader | None = None
        self._use_mmap = bool(use_mmap) and self._path is not None
        self._raw_rows = self._use_mmap and bool(raw_rows)
        self._map: mmap.mmap | None = None
        self._map_pid = -1
        self._map_base = 0  # the map's address: where a raw field's view starts in the file

    def _opened(self) -> OpenFile:
        f = self._open
        if f is None or f.pid != os.getpid():
            f = self._open = OpenFile.open(self._path)  # type: ignore[arg-type]
        return f

    def _open_fd(self) -> int:
        return self._opened().fd

    def _mapping(self) -> mmap.mmap | None:
        if self._map is None or self._map_pid != os.getpid():
            try:
                self._map = mmap.mmap(self._open_fd(), 0, access=mmap.ACCESS_READ)
            except (OSError, ValueError):  # empty, or a file system without mmap: pread instead
                self._use_mmap = self._raw_rows = False
                return None
            self._map_pid = os.getpid()
            self._map_base = _address(memoryview(self._map))
        return self._map

    def _read_span(self, offset: int, size: int) -> bytes | memoryview:
        if self._use_mmap:
            m = self._mapping()
            if m is not None:  # a page past the end of a file that shrank would be a SIGBUS: look first
                check_size(self._open_fd(), self._size if self._size is not None else len(m), self.name)
                return memoryview(m)[offset: offset + size]
        if self._path is None:
            f = self._file
            f.seek(offset)  # type: ignore[union-attr]
            return f.read(size)  # type: ignore[union-attr]
        return os.pread(self._open_fd(), size, offset)

    def will_need(self, offset: int, size: int) -> None:
        """Hint that ``size`` bytes at ``offset`` are read soon (a local file: the kernel
        starts reading them now, in the background, so that many reads are in flight when
        the page cache is cold). A no-op for streams; never raises."""
        if self._path is None or not hasattr(os, "posix_fadvise"):
            return
        try:
            os.posix_fadvise(self._open_fd(), offset, size, os.POSIX_FADV_WILLNEED)
        except (OSError, ShardError):  # only a hint: the read itself reports any problem
            pass

    def read(self, offset: int, size: int) -> dict[str, Any]:
        """The sample whose members start at ``offset`` and span ``size`` bytes.

        Raises:
            ShardError: the shard is shorter than the index says (truncated while being read).
            SampleError: the span is damaged, or its checksum is not the index's (with ``sums``).
        """
        buf = self._read_span(offset, size)
        if len(buf) != size:
            if self._path is not None and self._size is not None:
                check_size(self._open_fd(), self._size, self.name)
            raise SampleError(
                f"{self.name}: truncated at offset {offset} (wanted {size} bytes, got {len(buf)}); "
                "the shard is damaged, re-run `fastfeed pack` or restore it",
                shard=self.name, offset=offset,
            )
        if self.sums is not None:
            self.sums.check(buf, offset, self.name, lambda: _key_in(buf))
        sample = parse_sample(buf, self.name, offset)
        if sample is None:
            sample = TarShardReader(io.BytesIO(bytes(buf)), name=self.name).read(0, size)
        elif self._raw_rows and type(sample.get(RAW_FIELD)) is memoryview and len(sample[RAW_FIELD]):
            view = sample[RAW_FIELD]  # a view of the map, its pages not touched yet: hand over its place instead
            sample[RAW_FIELD] = FileSpan(self._opened(), _address(view) - self._map_base, len(view), name=self.name)
        return sample

    def __iter__(self) -> Iterator[dict[str, Any]]:
        if self._slow is None:
            self._slow = TarShardReader(self._file, name=self.name)  # type: ignore[arg-type]
        return iter(self._slow)

    def close(self) -> None:
        if self._map is not None and self._map_pid == os.getpid():
            try:
                self._map.close()
            except BufferError:  # samples still hold views of it: unmapped when the last one goes
                pass
        self._map = None
        self._open = None  # closed now, or when the last FileSpan of it goes
        if self._path is None and hasattr(self._file, "close"):
            self._file.close()  # type: ignore[union-attr]
        if self._slow is not None:
            self._slow.close()
            self._slow = None
