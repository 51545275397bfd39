"""Reading samples by global number: the index, its shards, and lazily opened readers.

:func:`resolve_index` finds the index of a packed dataset, or builds one in memory for
WebDataset tars; :func:`check_shards` fails fast on missing or truncated local shards;
:class:`DatasetReader`, the loader's reader, opens shards lazily in the process that reads
them (reopened after a fork, a bounded number kept open): tar samples by ``(offset, size)`` from
``index.offsets`` with :class:`~fastfeed.formats.tar_reader.FastTarReader`, LMDB samples
by record number, URLs through :func:`fastfeed.storage.remote.open_shard` (``cache_dir`` for a
shared local cache). A shard whose size or record count does not match the index is an
error when it is opened. A sample holding raw pixels (field ``rgb8``, ``pack --store raw``)
gets its ``(height, width)`` from ``shapes.npy`` as its ``"__shape__"`` entry, when it is
read by its global number.

Integrity (on by default, ``verify=``): every shard reader gets the index's checksums of its
samples (:func:`sample_sums`), so each sample read is checked against the checksum ``pack``
recorded (:class:`~fastfeed.formats.checksum.ShardSums`: a mismatch is a
:class:`~fastfeed.errors.SampleError` naming shard, key and both values); an index written
before checksums loads unchecked, and the process says so once, in one log line. Shard readers
also know each shard's size, so a shard truncated while it is read is a
:class:`~fastfeed.errors.ShardError` naming it (never a SIGBUS from a memory map).

Example:
    >>> reader = DatasetReader(resolve_index("/data/imagenet-ff"))  # doctest: +SKIP
    >>> reader.read(0)["__key__"]                                    # doctest: +SKIP
    'n01440764/n01440764_10026'
"""

from __future__ import annotations

import logging
import os
from collections import OrderedDict
from typing import Any, Mapping, Sequence

import numpy as np

from fastfeed.errors import (
    ConfigError,
    FastfeedError,
    IndexMismatchError,
    SampleError,
    ShardError,
)
from fastfeed.formats.checksum import ShardSums, digest
from fastfeed.formats.lmdb import LmdbShardReader
from fastfeed.formats.naming import RAW_FIELD
from fastfeed.formats.tar_reader import FastTarReader
from fastfeed.packed.foreign import open_index
from fastfeed.packed.index import DatasetIndex
from fastfeed.packed.layout import INDEX_NAME
from fastfeed.storage.remote import is_gzip_tar, is_url, local_path, open_shard

__all__ = ["DatasetReader", "SampleSums", "check_shards", "resolve_index", "sample_error", "sample_sums"]

log = logging.getLogger(__name__)

_MAX_OPEN_FILES = 64
RAW_READS = ("map", "rows")  # how raw pixels are read: DatasetReader.raw_reads


def _memory_bytes() -> int:
    """This machine's physical memory (0 where the OS does not say)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):  # pragma: no cover - platforms without sysconf
        return 0


def resolve_index(
    path_or_url: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    cache_size: str | int = "50GB",
    storage_options: Mapping[str, Any] | None = None,
    on_error: str = "raise",
) -> DatasetIndex:
    """The index of a packed dataset, or an in-memory one for WebDataset tars without index.

    Accepts a dataset folder/URL with ``index.json``, or tars as
    :func:`fastfeed.packed.foreign.open_index` does (folder, shard, list, brace pattern, glob).

    Example:
        >>> resolve_index("/data/imagenet-ff").num_samples       # doctest: +SKIP
        1281167
    """
    if isinstance(path_or_url, DatasetIndex):
        return path_or_url
    if path_or_url is None or isinstance(path_or_url, (bool, int, float, complex, Mapping)) or (
            isinstance(path_or_url, (str, bytes)) and not path_or_url) or type(path_or_url).__module__ == "numpy":
        raise ConfigError(f"{path_or_url!r}: give the folder or URL of a packed dataset (or a list of shards), "
                          "e.g. 'train-ff'")
    return open_index(path_or_url, storage_options=storage_options, cache_dir=cache_dir,
                      cache_size=cache_size, on_error=on_error)


def check_shards(index: DatasetIndex) -> None:
    """Fail fast on local shards that are missing or whose size differs from the index.

    Remote shards are checked when they are opened (size, and sha256 when the index has
    it). Costs one ``stat`` per shard.
    """
    for s, info in enumerate(index.shards):
        path = local_path(index.shard_path(s))
        if path is None:
            continue
        try:
            size = os.stat(path).st_size
        except FileNotFoundError:
            raise ShardError(
                f"{path}: shard is missing (listed in {os.path.join(index.root, INDEX_NAME)}); "
                "restore it or re-run `fastfeed pack`"
            ) from None
        if size != info.bytes:
            raise IndexMismatchError(
                f"{path}: {size} bytes but the index says {info.bytes}; the shard was truncated "
                "or replaced after packing. Restore it, or re-run `fastfeed pack`"
            )


#: Dataset roots this process has said "no checksums" of (once each).
_UNCHECKED: set[str] = set()


class SampleSums:
    """What the read path checks a dataset's samples against: the index's per-sample checksums.

    Raw-pixel samples (``pack --store raw|mixed:P``) are left out: a crop reads only its rows of
    them, and checking all ~0.5 MB would cost more than the crop (``docs/format.md``).

    Args:
        index: a dataset index with checksums (``index.checksums``).
    """

    def __init__(self, index: DatasetIndex) -> None:
        entry = index.checksums or {}
        self.algorithm = str(entry.get("algorithm"))
        self.digest = digest(self.algorithm)
        self.sums = index.sample_checksums
        shapes = index.shapes
        self.raw = None if shapes is None else np.asarray(shapes[:, 0]) > 0
        self.index = index

    def expected(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The checksums of samples ``ids`` (uint64), and which of them are checked (bool: not raw pixels)."""
        ids = np.asarray(ids, dtype=np.int64)
        checked = np.ones(len(ids), dtype=bool) if self.raw is None else ~self.raw[ids]
        return np.asarray(self.sums[ids], dtype=np.uint64), checked

    def shard(self, s: int) -> ShardSums:
        """The checksums of shard ``s``'s samples, as its reader looks them up."""
        starts = self.index.shard_starts
        a, b = int(starts[s]), int(starts[s + 1])
        offsets = None if self.index.format == "lmdb" else self.index.offsets[a:b, 0]
        return ShardSums(self.algorithm, self.sums[a:b], offsets, None if self.raw is None else self.raw[a:b])


def sample_sums(index: DatasetIndex, verify: bool = True) -> SampleSums | None:
    """The checksums the read path checks ``index``'s samples against; None when ``verify`` is off,
    or for an index without them (written before checksums: said once per dataset and process, in
    one log line; WebDataset tars without a fastfeed index have none to say).

    Example:
        >>> sample_sums(DatasetIndex.load("/data/imagenet-ff")).algorithm   # doctest: +SKIP
        'xxh3_64'
    """
    if not verify:
        return None
    if index.checksums is None:
        root = index.root or "<dataset>"
        if not index.options.get("scanned") and root not in _UNCHECKED:
            _UNCHECKED.add(root)
            log.warning("%s: no checksums: re-pack to verify on read (the index predates them; samples are "
                        "read unchecked)", root)
        return None
    return SampleSums(index)


class DatasetReader:
    """Reads samples of an index by global number; opens shards lazily, per process.

    Args:
        index: the dataset index.
        cache_dir: local cache for remote/gzipped shards (see :mod:`fastfeed.storage.remote`).
        cache_size: bound of that cache.
        storage_options: fsspec options for remote shards.
        max_open: shards kept open per process (least recently used are closed).
        verify: check every sample read against the checksum ``pack`` recorded (see the module doc).
    """

    def __init__(self, index: DatasetIndex, *, cache_dir: str | os.PathLike[str] | None = None,
                 cache_size: str | int = "50GB", storage_options: Mapping[str, Any] | None = None,
                 max_open: int = _MAX_OPEN_FILES, verify: bool = True) -> None:
        self.index = index
        self.verify = bool(verify)
        self._sums = sample_sums(index, self.verify)
        self.cache_dir = None if cache_dir is None else str(cache_dir)
        self.cache_size = cache_size
        self.storage_options = storage_options
        self.max_open = max(1, int(max_open))
        self._starts = index.shard_starts
        self._readers: OrderedDict[int, Any] = OrderedDict()
        self._pid = os.getpid()
        self._raw_reads: str | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_readers"] = OrderedDict()
        return state

    # ------------------------------------------------------------------ shards
    def shard_name(self, s: int) -> str:
        return self.index.shard_path(s)

    def locate(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(shard numbers, (offset, size) rows) of global samples ``ids``."""
        shards = np.searchsorted(self._starts, ids, side="right") - 1
        return shards, np.asarray(self.index.offsets[ids])

    def reader(self, s: int) -> Any:
        """The open reader of shard ``s`` (opened, and size-checked, on first use)."""
        if self._pid != os.getpid():  # forked: the parent's handles are not ours
            self._readers = OrderedDict()
            self._pid = os.getpid()
        r = self._readers.get(s)
        if r is not None:
            self._readers.move_to_end(s)
            return r
        r = self._open(s)
        self._readers[s] = r
        while len(self._readers) > self.max_open:
            _, old = self._readers.popitem(last=False)
            old.close()
        return r

    def _open(self, s: int) -> Any:
        info = self.index.shards[s]
        url = self.shard_name(s)
        sums = self._sums.shard(s) if self._sums is not None else None
        if self.index.format == "lmdb":
            path = self._local_copy(url, info.bytes, info.sha256)
            r = LmdbShardReader(path, name=url, sums=sums)
            entries = len(r)
            if entries != info.samples:
                r.close()
                raise IndexMismatchError(
                    f"{url}: holds {entries} records but the index says {info.samples}; the index "
                    "does not match this shard, re-run `fastfeed pack`"
                )
            return r
        src = open_shard(url, cache_dir=self.cache_dir, cache_size=self.cache_size,
                         storage_options=self.storage_options, size=info.bytes,
                         sha256=info.sha256 or None)
        if isinstance(src, str) and not is_gzip_tar(url):
            size = os.path.getsize(src)
            if size != info.bytes:
                raise IndexMismatchError(
                    f"{url}: {size} bytes but the index says {info.bytes}; the shard was truncated "
                    "or replaced after packing. Restore it, or re-run `fastfeed pack`"
                )
        # raw pixels: the crop's rows only, through a memory map or read into a reused buffer
        raw = self.index.store is not None
        return FastTarReader(src, name=url, use_mmap=raw, raw_rows=raw and self.raw_reads() == "rows",
                             size=None if is_gzip_tar(url) else info.bytes, sums=sums)

    def raw_reads(self) -> str:
        """How this process reads raw pixels (``pack --store raw``): ``"map"`` or ``"rows"``.

        ``"map"``: a crop is a view of the shard's memory map, the cheapest once its pages are
        mapped in this process. ``"rows"``: the crop's rows are read with ``preadv`` into a
        buffer the decoder reuses (:mod:`fastfeed.formats.span`), which costs a copy of the
        crop's full-width rows but never a page fault. ``FASTFEED_RAW_READS=map|rows``
        chooses; otherwise "rows" when the dataset's shards are larger than a quarter of this
        machine's memory (samples keep coming back unmapped, evicted from the page cache, and
        one ``preadv`` reads them from disk in one request), and "map" otherwise, however many
        processes share an epoch: with 16 workers on 16 cores the map still took 1.46x fewer
        CPU-seconds per image than rows, with ~0.7 page faults an image (benchmarks/RESULTS.md,
        raw-pixel shards, session 8).
        """
        if self._raw_reads is None:
            want = os.environ.get("FASTFEED_RAW_READS", "").strip().lower()
            if want and want not in RAW_READS:
                log.warning("FASTFEED_RAW_READS=%r is not one of %s: the loader chooses (see "
                            "DatasetReader.raw_reads)", want, "|".join(RAW_READS))
            if want not in RAW_READS:
                total = sum(int(sh.bytes) for sh in self.index.shards)
                want = "rows" if total > _memory_bytes() // 4 else "map"
            self._raw_reads = want
        return self._raw_reads

    def _local_copy(self, url: str, size: int, sha256: str) -> str:
        if not is_url(url):
            path = local_path(url) or url
            if not os.path.isfile(path):
                raise ShardError(f"{path}: shard is missing; restore it or re-run `fastfeed pack`")
            return path
        src = open_shard(url, cache_dir=self.cache_dir, cache_size=self.cache_size,
                         storage_options=self.storage_options, size=size, sha256=sha256 or None)
        if not isinstance(src, str):
            src.close()
            raise ConfigError(f"{url}: LMDB shards on object storage need cache_dir= (LMDB reads local files)")
        return src

    def close(self) -> None:
        """Close the shards this process opened."""
        if self._pid == os.getpid():
            for r in self._readers.values():
                r.close()
        self._readers = OrderedDict()

    # ------------------------------------------------------------------ samples
    def read(self, i: int) -> dict[str, Any]:
        """Global sample ``i`` as ``{"__key__": ..., field: bytes}``."""
        shards, locs = self.locate(np.array([i]))
        return self.read_at(int(shards[0]), int(locs[0, 0]), int(locs[0, 1]), i)

    def read_at(self, s: int, offset: int, size: int, i: int | None = None) -> dict[str, Any]:
        """The sample at ``offset`` (tar) or record ``offset`` (LMDB) of shard ``s``; with its global
        number ``i``, a raw-pixel sample also gets its ``"__shape__"`` (height, width)."""
        sample = self.reader(s).read(offset, size)
        return sample if i is None else self.attach_shape(sample, i)

    def attach_shape(self, sample: dict[str, Any], i: int) -> dict[str, Any]:
        """``sample`` (global number ``i``) with its ``"__shape__"`` (height, width) when it
        holds raw pixels (the shape is in the index, not in the sample)."""
        if RAW_FIELD in sample:
            shapes = self.index.shapes
            if shapes is not None:
                sample["__shape__"] = (int(shapes[i, 0]), int(shapes[i, 1]))
        return sample

    def will_need(self, ids: np.ndarray) -> None:
        """Hint that samples ``ids`` are read soon: local tar shards start reading them in
        the background (``posix_fadvise(WILLNEED)``). Shards not open yet, LMDB and remote
        streams are left alone; never raises (the reads report any problem)."""
        if self.index.format == "lmdb" or len(ids) == 0:
            return
        shards, locs = self.locate(np.asarray(ids))
        for s, off, size in zip(shards.tolist(), locs[:, 0].tolist(), locs[:, 1].tolist()):
            r = self._readers.get(s)
            if r is None:
                url = self.shard_name(s)
                if is_url(url) or is_gzip_tar(url):
                    continue
                try:
                    r = self.reader(s)
                except (FastfeedError, OSError):  # the read itself reports it, with its context
                    continue
            hint = getattr(r, "will_need", None)
            if hint is not None:
                hint(off, size)


#: The old name of :class:`DatasetReader`, still imported by ``fastfeed.loading`` and ``fastfeed.diagnosis``.
ShardSource = DatasetReader


def sample_error(reader: DatasetReader, s: int, offset: int, key: str, exc: BaseException) -> SampleError:
    """``exc`` as a SampleError that names shard, key and offset (kept if it already does)."""
    if isinstance(exc, SampleError) and exc.shard:
        if key and not exc.key:
            exc.key = key
        return exc
    name = reader.shard_name(s)
    what = f"sample '{key}'" if key else "a sample"
    unit = "record" if reader.index.format == "lmdb" else "offset"
    return SampleError(f"{name}: {what} at {unit} {offset}: {exc}", shard=name, key=key, offset=offset)
