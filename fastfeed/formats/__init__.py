"""Shard formats behind one writer and one reader protocol.

``FORMATS[name]`` gives ``(writer_class, reader_class, suffix)``. A writer appends whole
samples (a key and a mapping of field name -> bytes) and reports where each landed; a
reader returns a sample from its location in the shard, or iterates the shard in order.

Example:
    >>> from fastfeed.formats import FORMATS
    >>> sorted(FORMATS)
    ['lmdb', 'tar']
"""

from __future__ import annotations

from typing import Iterator, Mapping, Protocol

from fastfeed.formats.lmdb import LmdbShardReader, LmdbShardWriter
from fastfeed.formats.naming import split_key
from fastfeed.formats.tar import TarShardReader, TarShardWriter

__all__ = [
    "FORMATS",
    "LmdbShardReader",
    "LmdbShardWriter",
    "Sample",
    "ShardReader",
    "ShardWriter",
    "TarShardReader",
    "TarShardWriter",
    "split_key",
]

#: One sample: ``{"__key__": str, "<ext>": bytes, ...}``.
Sample = dict


class ShardWriter(Protocol):
    """Appends samples to one shard file; ``close()`` returns (bytes, sha256)."""

    def add(self, key: str, fields: Mapping[str, bytes]) -> tuple[int, int]:
        """Append one sample; return its (offset, size) for the index."""

    def close(self) -> tuple[int, str]:
        """Finish the shard; return (file size, sha256 hex)."""


class ShardReader(Protocol):
    """Reads samples of one shard."""

    def read(self, offset: int, size: int) -> Sample:
        """Return the sample stored at (offset, size) as the index records it."""

    def __iter__(self) -> Iterator[Sample]:
        """Iterate the shard's samples in file order."""

    def close(self) -> None:
        """Release the file."""


FORMATS: dict[str, tuple[type, type, str]] = {
    "tar": (TarShardWriter, TarShardReader, ".tar"),
    "lmdb": (LmdbShardWriter, LmdbShardReader, ".lmdb"),
}
