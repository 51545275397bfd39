"""Bytes of a local shard that are located but not read yet: raw pixels read a row range at a time.

A sample of ``pack --store raw`` holds ~0.5 MB of pixels, of which a random crop needs a
band of rows. Read through a memory map, every page the crop touches for the first time in
a process is a page fault; a worker meets each sample for the first time again and again
when the dataset is larger than the page cache, or while each of many workers has seen only
its share of it (on a gVisor host a fault costs several microseconds, and the crop of one
sample tens of them). :class:`FileSpan` is the other way: the reader hands the decoder the
span's place in the file, and the decoder reads only the crop's rows, with one ``preadv``
into a buffer it reuses (:meth:`FileSpan.readinto`), so nothing is mapped, faulted or
allocated per sample.

:class:`OpenFile` owns a file descriptor and closes it when the last holder drops it, so
a span stays readable after its reader closed (a batch can touch more shards than a
process keeps open).

Example:
    >>> import os, tempfile
    >>> p = os.path.join(tempfile.mkdtemp(), "f.bin")
    >>> with open(p, "wb") as f:
    ...     _ = f.write(bytes(range(16)))
    >>> span = FileSpan(OpenFile.open(p), 4, 8, name=p)
    >>> len(span), span.tobytes()
    (8, b'\\x04\\x05\\x06\\x07\\x08\\t\\n\\x0b')
    >>> buf = bytearray(3)
    >>> span.readinto(memoryview(buf), 2)
    >>> bytes(buf)
    b'\\x06\\x07\\x08'
"""

from __future__ import annotations

import os

from fastfeed.errors import SampleError, ShardError

__all__ = ["FileSpan", "OpenFile", "check_size"]


def check_size(fd: int, need: int, name: str) -> None:
    """Raise :class:`~fastfeed.errors.ShardError` when the open file ``fd`` is now shorter than ``need`` bytes.

    What a memory-mapped read calls before it touches the map: a page past the end of a file
    that shrank is a SIGBUS that kills the process (in a DataLoader worker, torch then blames
    shared memory), a short file is this error naming it. One ``fstat`` (~1-3 us).

    Example:
        >>> import os, tempfile
        >>> p = os.path.join(tempfile.mkdtemp(), "s.bin")
        >>> with open(p, "wb") as f:
        ...     _ = f.write(b"x" * 10)
        >>> fd = os.open(p, os.O_RDONLY)
        >>> check_size(fd, 10, p)
        >>> check_size(fd, 20, "s.bin")
        Traceback (most recent call last):
        ...
        fastfeed.errors.ShardError: s.bin: the shard is 10 bytes now, 20 when it was checked: it was truncated or rewritten while being read; restore it (or re-run `fastfeed pack`) and start again
        >>> os.close(fd)
    """
    size = os.fstat(fd).st_size
    if size < need:
        raise ShardError(f"{name}: the shard is {size} bytes now, {need} when it was checked: it was truncated or "
                         "rewritten while being read; restore it (or re-run `fastfeed pack`) and start again")


class OpenFile:
    """A read-only file descriptor, closed when the last reference goes (in the process that opened it)."""

    __slots__ = ("fd", "pid", "__weakref__")

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.pid = os.getpid()

    @classmethod
    def open(cls, path: str) -> OpenFile:
        """Open ``path`` for reading.

        Raises:
            ShardError: the file is missing.
        """
        try:
            return cls(os.open(path, os.O_RDONLY))
        except FileNotFoundError:
            raise ShardError(f"{path}: shard is missing; restore it or re-run `fastfeed pack`") from None

    def __del__(self, _getpid=os.getpid, _close=os.close) -> None:  # bound now: at exit ``os`` may be gone
        if self.pid == _getpid():  # a forked child leaves its parent's descriptor alone
            try:
                _close(self.fd)
            except OSError:
                pass


class FileSpan:
    """``size`` bytes at ``offset`` of an open file, read when asked (``len()`` is free).

    Args:
        file: the open shard (kept open while the span lives).
        offset: where the bytes start in the file.
        size: how many.
        name: the shard's name, for errors.
    """

    __slots__ = ("file", "offset", "size", "name")

    def __init__(self, file: OpenFile, offset: int, size: int, *, name: str = "<file>") -> None:
        self.file, self.offset, self.size, self.name = file, int(offset), int(size), name

    def __len__(self) -> int:
        return self.size

    def __repr__(self) -> str:
        return f"FileSpan({self.name!r}, offset={self.offset}, size={self.size})"

    def readinto(self, buf: memoryview, start: int = 0) -> None:
        """Fill ``buf`` with the span's bytes from ``start`` on (one ``preadv``, no allocation).

        Raises:
            SampleError: the file ends early (it was truncated after the index was checked; the
                reader that made the span checked the shard's size when it read the sample).
        """
        want = len(buf)
        if start < 0 or start + want > self.size:
            raise ValueError(f"bytes {start}..{start + want} are outside the span of {self.size}")
        at = self.offset + start
        got = _preadv(self.file.fd, [buf], at)
        if got != want:
            raise SampleError(f"{self.name}: truncated at offset {at} (wanted {want} bytes, got {got}); the "
                              "shard is damaged, re-run `fastfeed pack` or restore it", shard=self.name, offset=at)

    def tobytes(self) -> bytes:
        """All of the span's bytes."""
        out = bytearray(self.size)
        self.readinto(memoryview(out))
        return bytes(out)


def _pread_into(fd: int, bufs: list[memoryview], at: int) -> int:  # pragma: no cover - platforms without preadv
    data = os.pread(fd, len(bufs[0]), at)
    bufs[0][: len(data)] = data
    return len(data)


_preadv = getattr(os, "preadv", _pread_into)
