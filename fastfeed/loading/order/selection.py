"""Which samples of one dataset an epoch plan may use: ``subset=`` and ``filter=``.

Design: a selection is evaluated once, at plan time, from metadata only (the index's
sidecar arrays; no shard is read), into a :class:`Selection`: the dataset's shard
counts, the sorted global ids of the kept samples (``None`` when every sample is kept)
and the number kept per shard. The planner treats the kept samples as a dataset of
their own whose shard ``s`` holds ``kept_counts[s]`` samples: the shard-contiguous
order of :func:`fastfeed.loading.order.epoch.order_span` is computed over those counts and
its "virtual" positions ``v`` are mapped back by ``kept[v]`` (kept ids are sorted and
shards are contiguous in index order, so the virtual ids of shard ``s`` are exactly its
kept samples, in order). A filtered dataset therefore has every guarantee of an
unfiltered one: every kept sample once per epoch, equal steps, exact resume, ``len``.
Keeping everything gives the same plan as no selection at all.

Cost: ``kept`` is O(kept samples) int64 (80 MB for 10M); a rank reads only the entries
of the shards it plans, so for very large indexes ``kept`` can be a memory-mapped
``.npy`` sidecar (``Selection.from_kept(counts, np.load(path, mmap_mode="r"))``) and the
filter's mask itself is O(N) bits; ``kept_counts`` is O(shards).

Example:
    >>> sel = select([3, 3], filter=lambda m: m["index"] % 2 == 0)
    >>> sel.size, sel.kept_counts.tolist(), sel.ids(np.arange(3)).tolist()
    (3, [2, 1], [0, 2, 4])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from fastfeed.errors import ConfigError

__all__ = ["FilterFn", "Selection", "index_metadata", "select"]

#: ``filter=fn``: ``fn(meta) -> bool mask`` over the dataset's samples.
FilterFn = Callable[[Mapping[str, np.ndarray]], Any]


@dataclass(frozen=True)
class Selection:
    """The samples of one dataset that the plan uses.

    Attributes:
        shard_counts: int64 (S,) samples per shard of the whole dataset.
        kept: sorted int64 global ids of the kept samples, or None for all of them.
        kept_counts: int64 (S,) kept samples per shard.
        name: how errors and reports name the dataset (its path, or ``"dataset 1"``).
    """

    shard_counts: np.ndarray
    kept: np.ndarray | None
    kept_counts: np.ndarray
    name: str = "dataset"

    @classmethod
    def from_kept(cls, shard_counts: Sequence[int] | np.ndarray, kept: np.ndarray, *,
                  name: str = "dataset") -> "Selection":
        """A selection of the sorted, unique global ids ``kept`` (an array or a memory map).

        Only ``O(shards log N)`` entries of ``kept`` are read here, so a memory-mapped
        sidecar of a huge filter costs no memory until a rank plans its shards.

        Example:
            >>> Selection.from_kept([2, 2], np.array([1, 2, 3])).kept_counts.tolist()
            [1, 2]
        """
        counts = np.asarray(shard_counts, dtype=np.int64)
        bounds = np.searchsorted(kept, np.concatenate([[0], np.cumsum(counts)]))
        return cls(shard_counts=counts, kept=kept, kept_counts=np.diff(bounds).astype(np.int64), name=name)

    @property
    def num_samples(self) -> int:
        """Samples of the whole dataset (kept or not)."""
        return int(self.shard_counts.sum())

    @property
    def size(self) -> int:
        """Kept samples: what one pass over this dataset delivers."""
        return int(self.kept_counts.sum())

    def ids(self, virtual: np.ndarray) -> np.ndarray:
        """Global sample ids of virtual positions (numbers among the kept samples)."""
        return virtual if self.kept is None else np.asarray(self.kept[virtual], dtype=np.int64)


def index_metadata(index: Any) -> dict[str, np.ndarray]:
    """The per-sample metadata a ``filter=`` function receives, from a dataset index.

    ``"index"`` (the global sample id) always; ``"label"`` and ``"length"`` when the
    index records them (``labels.npy``, ``lengths.npy``); ``"key"`` when the index
    carries sample keys (an attribute ``keys``; the index format 1 does not record them).

    Example:
        >>> from fastfeed.packed.index import DatasetIndex        # doctest: +SKIP
        >>> sorted(index_metadata(DatasetIndex.load("/data/x")))  # doctest: +SKIP
        ['index', 'label']
    """
    meta: dict[str, np.ndarray] = {"index": np.arange(int(index.num_samples), dtype=np.int64)}
    for key, attr in (("label", "labels"), ("length", "lengths"), ("key", "keys")):
        value = getattr(index, attr, None)
        if value is not None:
            meta[key] = np.asarray(value)
    return meta


def select(
    shard_counts: Sequence[int] | np.ndarray,
    *,
    subset: Any = None,
    filter: FilterFn | None = None,
    meta: Mapping[str, np.ndarray] | None = None,
    name: str = "dataset",
) -> Selection:
    """Evaluate ``subset`` and ``filter`` of one dataset into a :class:`Selection`.

    Args:
        shard_counts: samples per shard, in index order.
        subset: global sample ids to keep (any order, no repeats) or a bool mask of
            length N; None keeps all.
        filter: ``fn(meta) -> bool mask`` of length N, called once with ``meta``
            (default: just ``{"index": arange(N)}``); combined with ``subset`` by "and".
        meta: the per-sample metadata arrays (see :func:`index_metadata`).
        name: the dataset's name in error messages.

    Raises:
        ConfigError: a subset id out of range or repeated, a mask of the wrong length,
            a filter result of the wrong shape or dtype, or nothing left.

    Example:
        >>> select([4], subset=[3, 1]).kept.tolist()
        [1, 3]
    """
    counts = np.asarray(shard_counts, dtype=np.int64)
    n = int(counts.sum())
    keep: np.ndarray | None = None
    if subset is not None:
        keep = _subset_mask(subset, n, name)
    if filter is not None:
        mask = _filter_mask(filter, meta if meta is not None else {"index": np.arange(n, dtype=np.int64)}, n, name)
        keep = mask if keep is None else keep & mask
    if keep is None:
        return Selection(shard_counts=counts, kept=None, kept_counts=counts, name=name)
    kept = np.flatnonzero(keep).astype(np.int64)
    if kept.size == 0:
        both = subset is not None and filter is not None
        what = "subset and filter leave" if both else ("subset leaves" if filter is None else "filter leaves")
        raise ConfigError(f"{name}: {what} no sample of {n}; loosen {'them' if both else 'it'}, or leave this "
                          "dataset out")
    return Selection.from_kept(counts, kept, name=name)


def _subset_mask(subset: Any, n: int, name: str) -> np.ndarray:
    arr = np.asarray(subset)
    if arr.dtype == bool:
        if arr.shape != (n,):
            raise ConfigError(f"{name}: subset= is a bool mask of shape {arr.shape}, but the dataset has {n} "
                              f"samples; pass a mask of shape ({n},) or a list of sample ids")
        return arr
    if arr.size == 0:
        raise ConfigError(f"{name}: subset= is empty; pass the sample ids to keep, or subset=None for all")
    if arr.ndim != 1 or arr.dtype.kind not in "iu":
        raise ConfigError(f"{name}: subset= must be a 1-D list of integer sample ids or a bool mask, got "
                          f"shape {arr.shape} dtype {arr.dtype}")
    bad = (arr < 0) | (arr >= n)
    if bad.any():
        raise ConfigError(f"{name}: subset= holds sample id {int(arr[np.flatnonzero(bad)[0]])}, out of range for "
                          f"{n} samples (ids are 0..{n - 1}, no negative indexing); drop it from the subset")
    mask = np.zeros(n, dtype=bool)
    mask[arr] = True
    if int(mask.sum()) != arr.size:
        uniq, times = np.unique(arr, return_counts=True)
        raise ConfigError(f"{name}: subset= lists sample {int(uniq[np.argmax(times)])} more than once; every "
                          "sample is planned once per epoch, so pass unique ids (np.unique(subset))")
    return mask


def _filter_mask(fn: FilterFn, meta: Mapping[str, np.ndarray], n: int, name: str) -> np.ndarray:
    if not callable(fn):
        raise ConfigError(f"{name}: filter={fn!r} is not callable; pass fn(meta) -> bool mask")
    out = np.asarray(fn(meta))
    label = getattr(fn, "__qualname__", "the filter")
    if out.shape != (n,):
        raise ConfigError(f"{name}: filter {label} returned shape {out.shape}, expected ({n},): one bool per "
                          f"sample; write it vectorised over meta's arrays, e.g. meta['length'] < 512")
    if out.dtype != bool:
        raise ConfigError(f"{name}: filter {label} returned dtype {out.dtype}, expected bool; return a "
                          "comparison (meta['label'] == 3), or .astype(bool) it")
    return out
