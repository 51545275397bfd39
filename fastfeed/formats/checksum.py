"""The checksum of one sample's bytes: written by the shard writers, checked by the readers.

A sample's checksum covers exactly the bytes a reader reads for it: in a tar shard the span
``offsets.npy`` records (its members' headers, data and padding), in an LMDB shard the
record's value (the framed fields). ``pack`` records one per sample (``checksums.npy``) and
the loader checks it on every read, so a byte flipped on disk after packing, or an
``offsets.npy`` row that points at another sample, is an error and never a wrong sample.

A shard reader given a :class:`ShardSums` (the index's checksums of that shard's samples)
checks every sample it reads, whoever asks for it.

Two algorithms, both non-cryptographic (they catch damage, not tampering), named in
``index.json`` so a reader uses the one the writer used:

- ``xxh3_64`` (the :mod:`xxhash` package): ~3.6 us for a 110 KB JPEG on the 2-core
  development machine (30 GB/s), 0.3% of the CPU loader's ~1.1 ms per image;
- ``crc32`` (:func:`zlib.crc32`, the standard library): ~52 us for the same JPEG (2.1 GB/s),
  ~5% of the loader's CPU per image: the fallback when :mod:`xxhash` is not installed.

:func:`pack_algorithm` is what a writer in this process uses. Every value is stored as
uint64.

Example:
    >>> h = hasher("crc32"); h.update(b"ab"); h.update(b"c"); h.intdigest() == digest("crc32")(b"abc")
    True
    >>> digest("crc32")(b"abc")
    891568578
"""

from __future__ import annotations

import bisect
import zlib
from typing import TYPE_CHECKING, Any, Callable, Protocol

from fastfeed.errors import ConfigError, MissingDependencyError, SampleError

if TYPE_CHECKING:
    import numpy as np

__all__ = ["ALGORITHMS", "Hasher", "ShardSums", "digest", "hasher", "mismatch", "mismatch_reason", "pack_algorithm"]

#: The algorithms a reader knows, fastest first.
ALGORITHMS = ("xxh3_64", "crc32")

Buffer = Any  # bytes, bytearray, memoryview: anything with the buffer protocol


class Hasher(Protocol):
    """A running checksum over bytes given in pieces (``xxhash.xxh3_64``'s interface)."""

    def update(self, data: Buffer) -> None:
        """Add ``data``."""

    def intdigest(self) -> int:
        """The checksum of everything added so far."""


class _Crc32:
    """:func:`zlib.crc32` as a :class:`Hasher`."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0

    def update(self, data: Buffer) -> None:
        self.value = zlib.crc32(data, self.value)

    def intdigest(self) -> int:
        return self.value


def _xxhash() -> Any | None:
    try:
        import xxhash
    except ImportError:
        return None
    return xxhash


def pack_algorithm() -> str:
    """The algorithm a shard writer uses here: ``xxh3_64`` when :mod:`xxhash` imports, else ``crc32``.

    Example:
        >>> pack_algorithm() in ALGORITHMS
        True
    """
    return "xxh3_64" if _xxhash() is not None else "crc32"


def _module_for(name: str) -> Any:
    if name not in ALGORITHMS:
        raise ConfigError(f"unknown checksum algorithm {name!r} (this fastfeed knows {', '.join(ALGORITHMS)}); "
                          "install the fastfeed version that wrote the dataset, or re-pack it")
    if name == "crc32":
        return None
    xx = _xxhash()
    if xx is None:
        raise MissingDependencyError(
            "this dataset's samples carry xxh3_64 checksums, which need the 'xxhash' module: pip install xxhash "
            "(or turn the check off: fastfeed.loader(..., storage=fastfeed.Storage(verify=False)))")
    return xx


def digest(name: str) -> Callable[[Buffer], int]:
    """The one-shot checksum function of algorithm ``name`` (bytes -> int).

    Raises:
        ConfigError: an unknown algorithm.
        MissingDependencyError: ``xxh3_64`` without the :mod:`xxhash` module.
    """
    xx = _module_for(name)
    return zlib.crc32 if xx is None else xx.xxh3_64_intdigest


def hasher(name: str) -> Hasher:
    """A new running checksum of algorithm ``name`` (for bytes written in pieces).

    Raises:
        ConfigError: an unknown algorithm.
        MissingDependencyError: ``xxh3_64`` without the :mod:`xxhash` module.
    """
    xx = _module_for(name)
    return _Crc32() if xx is None else xx.xxh3_64()


def mismatch(shard: str, unit: str, offset: int, key: str, algorithm: str, got: int, want: int) -> SampleError:
    """The error of a sample whose bytes do not have the checksum the index recorded.

    Example:
        >>> print(mismatch("s.tar", "offset", 1024, "k1", "crc32", 1, 2))  # doctest: +NORMALIZE_WHITESPACE
        s.tar: sample 'k1' at offset 1024: its bytes' crc32 checksum is 0000000000000001, the index recorded
        0000000000000002; the shard was damaged after packing (or offsets.npy points at other bytes): restore
        the shard or re-run `fastfeed pack`
    """
    what = f"sample '{key}'" if key else "a sample"
    return SampleError(f"{shard}: {what} at {unit} {offset}: {mismatch_reason(algorithm, got, want)}",
                       shard=shard, key=key, offset=offset)


def mismatch_reason(algorithm: str, got: int, want: int) -> str:
    """What :func:`mismatch` says after naming the sample: both checksums, the likely cause, the fix."""
    return (f"its bytes' {algorithm} checksum is {got:016x}, the index recorded {want:016x}; the shard was damaged "
            "after packing (or offsets.npy points at other bytes): restore the shard or re-run `fastfeed pack`")


class ShardSums:
    """The checksums of one shard's samples, found by where a sample is: what its reader checks.

    Args:
        algorithm: the algorithm that made them.
        sums: per sample of the shard, in file order, its checksum (uint64).
        offsets: per sample, the byte offset of its span (tar; sorted, as ``offsets.npy`` is);
            None for LMDB, whose readers ask by record number.
        skip: per sample, True where it is not checked (raw pixels read a crop's rows at a
            time: see ``docs/format.md``); None: every sample is.

    Example:
        >>> import numpy as np
        >>> sums = ShardSums("crc32", np.array([digest("crc32")(b"abc"), 7], np.uint64), np.array([0, 512]))
        >>> sums.expected(0) == digest("crc32")(b"abc"), sums.expected(512), sums.expected(100)
        (True, 7, None)
        >>> sums.check(b"abc", 0, "s.tar", lambda: "k0")
        >>> sums.check(b"abd", 0, "s.tar", lambda: "k0")
        Traceback (most recent call last):
        ...
        fastfeed.errors.SampleError: s.tar: sample 'k0' at offset 0: its bytes' crc32 checksum is 00000000ab40d461, the index recorded 00000000352441c2; the shard was damaged after packing (or offsets.npy points at other bytes): restore the shard or re-run `fastfeed pack`
    """

    __slots__ = ("algorithm", "digest", "_sums", "_offsets", "_skip", "_keep")

    def __init__(self, algorithm: str, sums: np.ndarray, offsets: np.ndarray | None = None,
                 skip: np.ndarray | None = None) -> None:
        import numpy as np  # here: `fastfeed --help` imports the formats, and must not wait for numpy

        self.algorithm = algorithm
        self.digest = digest(algorithm)
        # memoryviews of contiguous arrays: bisect and indexing on them cost ~1.6 us a sample
        # (numpy's scalar searchsorted ~3 us), with the values kept as compact as numpy's
        self._keep = (np.ascontiguousarray(sums, dtype=np.uint64),
                      None if offsets is None else np.ascontiguousarray(offsets, dtype=np.int64),
                      None if skip is None else np.ascontiguousarray(skip, dtype=bool))
        self._sums = memoryview(self._keep[0])
        self._offsets = None if self._keep[1] is None else memoryview(self._keep[1])
        self._skip = None if self._keep[2] is None else self._keep[2].tolist()

    def expected(self, offset: int) -> int | None:
        """The checksum of the sample at ``offset`` (tar) or record ``offset`` (LMDB); None when
        no sample of the index starts there, or it is one not checked."""
        if self._offsets is None:
            j = offset
        else:
            j = bisect.bisect_left(self._offsets, offset)
            if j >= len(self._offsets) or self._offsets[j] != offset:
                return None
        if not 0 <= j < len(self._sums) or (self._skip is not None and self._skip[j]):
            return None
        return int(self._sums[j])

    def check(self, data: Buffer, offset: int, shard: str, key_of: Callable[[], str]) -> None:
        """Check the bytes of the sample at ``offset`` (``key_of()`` names it, asked only on a mismatch).

        Raises:
            SampleError: the bytes' checksum is not the recorded one (:func:`mismatch`).
        """
        want = self.expected(offset)
        if want is None:
            return
        got = self.digest(data)
        if got != want:
            unit = "offset" if self._offsets is not None else "record"
            raise mismatch(shard, unit, offset, key_of(), self.algorithm, got, want)
