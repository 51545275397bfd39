"""``fastfeed shapes DST``: record the image sizes of a dataset packed before pack recorded them.

``pack`` writes ``sizes.npy`` (every sample's displayed image (height, width), EXIF orientation
applied, read from the image's header: :mod:`fastfeed.decode.imagesize`) and the index's
``sizes`` entry. A dataset packed by an older fastfeed has neither; :func:`add_shapes` reads
every sample's image header from the shards (no image is decoded, nothing else changes) and
writes the same two: ``sizes.npy`` first, then ``index.json`` atomically, with the new
sidecar's sha256 in its ``checksums`` entry. The shards, their sha256 and the index's
fingerprint stay as they were, so ``fastfeed tune``'s records still apply. Every sample is
read through the loader's own reader, so a sample whose bytes fail their checksum is an
error naming its shard and key, as in the loader.

Images stored as pixels (``pack --store raw``) take their shape from ``shapes.npy``. A local
dataset only: the command writes into DST (for an object-store dataset, run it on a copy and
upload ``sizes.npy`` and ``index.json``).

Example:
    >>> result = add_shapes("/data/photos-ff")                     # doctest: +SKIP
    >>> print(result.text())                                       # doctest: +SKIP
    /data/photos-ff: image sizes of 1000 samples recorded in sizes.npy (0 without a readable image)
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
from dataclasses import asdict, dataclass
from typing import Any, Callable

import numpy as np

from fastfeed.decode.imagesize import sample_size
from fastfeed.errors import ConfigError
from fastfeed.packed.index import DatasetIndex
from fastfeed.packed.reader import DatasetReader
from fastfeed.packing.dest import hold_destination, on_full_disk
from fastfeed.storage.remote import is_url

__all__ = ["ShapesResult", "add_shapes"]

log = logging.getLogger("fastfeed.pack")


@dataclass(frozen=True)
class ShapesResult:
    """What :func:`add_shapes` did.

    Attributes:
        path: the dataset.
        num_samples: samples in the dataset.
        unknown: samples without an image or a readable header (``(0, 0)`` in ``sizes.npy``).
        written: False when the index already recorded sizes and ``overwrite`` was not given.
    """

    path: str
    num_samples: int
    unknown: int
    written: bool

    def text(self) -> str:
        """What ``fastfeed shapes`` prints.

        Example:
            >>> print(ShapesResult("ff", 10, 1, True).text())
            ff: image sizes of 10 samples recorded in sizes.npy (1 without a readable image); `fastfeed info ff` shows their aspect ratios
        """
        if not self.written:
            return (f"{self.path}: the index already records image sizes ({self.num_samples} samples, "
                    f"{self.unknown} without a readable image); pass --overwrite to read them again")
        return (f"{self.path}: image sizes of {self.num_samples} samples recorded in sizes.npy ({self.unknown} "
                f"without a readable image); `fastfeed info {self.path}` shows their aspect ratios")

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict of the attributes (``fastfeed shapes --json``)."""
        return asdict(self)


def _shard_sizes(job: tuple[str, int]) -> tuple[int, np.ndarray]:
    """The sizes of shard ``s``'s samples (run in a worker process, or in this one)."""
    root, s = job
    index = _index(root)
    reader = DatasetReader(index, max_open=1)
    a, b = (int(v) for v in index.shard_starts[s:s + 2])
    out = np.zeros((b - a, 2), dtype=np.int32)
    offsets = np.asarray(index.offsets[a:b])
    for j in range(b - a):
        sample = reader.read_at(s, int(offsets[j, 0]), int(offsets[j, 1]), a + j)
        out[j] = sample_size(sample)
    reader.reader(s).close()
    return s, out


_INDEXES: dict[str, DatasetIndex] = {}


def _index(root: str) -> DatasetIndex:
    """The index of ``root``, loaded once per process."""
    if root not in _INDEXES:
        _INDEXES[root] = DatasetIndex.load(root)
    return _INDEXES[root]


def add_shapes(dst: str | os.PathLike[str], *, overwrite: bool = False, workers: int = 1,
               progress: Callable[[int, int], None] | None = None) -> ShapesResult:
    """Read every sample's image header and record the sizes in ``sizes.npy`` and the index.

    Args:
        dst: a local packed dataset folder.
        overwrite: read them again when the index already records sizes.
        workers: processes reading shards (1: this process).
        progress: called with ``(shards done, shards)``.

    Returns:
        A :class:`ShapesResult` (``text()`` is what ``fastfeed shapes`` prints).

    Raises:
        ConfigError: DST is a URL, or not a packed dataset.
        SampleError: a sample whose bytes fail their checksum (shard and key named).

    Example:
        >>> add_shapes("/data/photos-ff").unknown                      # doctest: +SKIP
        0
    """
    root = os.fspath(dst)
    if is_url(root):
        raise ConfigError(f"{root}: fastfeed shapes writes sizes.npy into the dataset's folder; run it on a local "
                          "copy and upload its sizes.npy and index.json")
    if not DatasetIndex.exists(root):
        raise ConfigError(f"{root}: no index.json; `fastfeed shapes` adds image sizes to a packed dataset "
                          "(`fastfeed pack SRC DST` records them itself)")
    _INDEXES.pop(root, None)
    index = _index(root)
    if index.sizes is not None and not overwrite:
        return ShapesResult(root, index.num_samples, int(index.sizes.get("unknown", 0)), written=False)
    sizes = np.zeros((index.num_samples, 2), dtype=np.int32)
    starts = index.shard_starts
    jobs = [(root, s) for s in range(len(index.shards))]
    done = 0
    pool = concurrent.futures.ProcessPoolExecutor(workers) if workers > 1 and len(jobs) > 1 else None
    try:
        results = pool.map(_shard_sizes, jobs) if pool is not None else map(_shard_sizes, jobs)
        for s, rows in results:
            sizes[starts[s]:starts[s + 1]] = rows
            done += 1
            if progress is not None:
                progress(done, len(jobs))
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
    updated = index.with_sizes(sizes)
    # one writer at a time in DST (a pack's lock), and a full disk said as pack says it
    with hold_destination(root, command=f"fastfeed shapes {root}"), \
            on_full_disk(root, needed=lambda: sizes.nbytes, what="sizes.npy", resumes=False):
        updated.save(root)
    unknown = int(updated.sizes["unknown"]) if updated.sizes is not None else 0
    log.info("%s: image sizes of %d samples written to sizes.npy (%d unknown)", root, index.num_samples, unknown)
    return ShapesResult(root, index.num_samples, unknown, written=True)
