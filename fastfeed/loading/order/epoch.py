"""The epoch plan: which samples each rank reads, in which order, batch by batch.

Everything here is pure numpy and a function of ``(shard counts, seed, epoch,
world_size, rank, batch_size, drop_last, shuffle, shuffle_block)`` only, so the stream
of a rank never depends on ``num_workers``, and resuming is "skip the first k batches".

How an epoch is laid out:

1. **Global order.** With ``shuffle``, the shards are permuted (a new permutation every
   epoch) and the samples inside each shard are permuted too (each shard by its own
   generator, so a rank only computes the shards it reads); the shards are then
   concatenated, so the global order is shard-contiguous. Without ``shuffle`` it is the
   index order.
2. **Equal share per rank.** ``drop_last=False``: every rank gets
   ``ceil(N / world_size)`` samples; the ``world_size * ceil(N / world_size) - N``
   (at most ``world_size - 1``) missing slots repeat the first samples of this epoch's
   global order (cyclically when ``N < world_size``). ``drop_last=True``: every rank gets
   ``(N // world_size) // batch_size * batch_size`` samples, so only full batches
   exist; the tail of the global order (fewer than ``world_size * batch_size`` samples,
   different ones every epoch when shuffling) is not delivered this epoch.
3. **Locality.** Rank ``r`` takes the contiguous span ``r`` of the global order, so it
   reads about ``1 / world_size`` of the shards, a few at a time.
4. **Mixing.** With ``shuffle``, the rank's span is shuffled inside consecutive blocks of
   ``shuffle_block`` samples, so a batch mixes samples of several shards while reads stay
   within a window of a few shards.
5. **Batches.** The span is cut into batches of ``batch_size``; with ``drop_last=False``
   the last batch of every rank has the same, possibly smaller, size. Every rank has the
   same number of batches, always.
6. **Workers.** Batch ``b`` of a pass that starts at batch ``start`` is built by worker
   ``(b - start) % num_workers``; ``DataLoader(batch_size=None)`` hands batches back in
   that round-robin order, so the stream is the same for every ``num_workers``.

Example:
    >>> plan = plan_epoch([5, 3], seed=0, epoch=0, world_size=2, rank=1, batch_size=2,
    ...                   drop_last=False, shuffle=False)
    >>> plan.num_batches, plan.batch(0).tolist(), plan.batch(1).tolist()
    (2, [4, 5], [6, 7])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from fastfeed.errors import ConfigError

__all__ = [
    "DEFAULT_SHUFFLE_BLOCK",
    "EpochPlan",
    "epoch_order",
    "num_batches",
    "order_span",
    "plan_epoch",
    "samples_per_rank",
    "worker_batches",
]

#: Samples mixed together inside a rank's span (see step 4 of the module docstring).
from fastfeed.loading.order import DEFAULT_SHUFFLE_BLOCK  # noqa: E402  (defined without numpy)

# Distinct streams of randomness derived from one user seed.
_SHARD_STREAM = 0x5EED_0001
_BLOCK_STREAM = 0x5EED_0002
_SAMPLE_STREAM = 0x5EED_0003


@dataclass(frozen=True)
class EpochPlan:
    """The samples of one rank for one epoch, in delivery order.

    Attributes:
        samples: int64 global sample numbers, ``samples_per_rank`` of them.
        batch_size: samples per batch (the last batch may be smaller).
        num_batches: batches of this rank (the same on every rank).
    """

    samples: np.ndarray
    batch_size: int
    num_batches: int

    def batch(self, b: int) -> np.ndarray:
        """Global sample numbers of batch ``b`` (0-based)."""
        if not 0 <= b < self.num_batches:
            raise IndexError(f"batch {b} out of range for {self.num_batches} batches")
        return self.samples[b * self.batch_size : (b + 1) * self.batch_size]


def _check(num_samples: int, world_size: int, batch_size: int) -> None:
    if num_samples < 1:
        raise ConfigError("the dataset holds no samples; nothing to load")
    if world_size < 1:
        raise ConfigError(f"world_size={world_size} must be >= 1")
    if batch_size < 1:
        raise ConfigError(f"batch_size={batch_size} must be >= 1")


def samples_per_rank(num_samples: int, *, world_size: int, batch_size: int, drop_last: bool) -> int:
    """Samples every rank reads per epoch (the same on every rank).

    Example:
        >>> samples_per_rank(10, world_size=4, batch_size=2, drop_last=False)
        3
        >>> samples_per_rank(10, world_size=4, batch_size=2, drop_last=True)
        2
    """
    _check(num_samples, world_size, batch_size)
    if drop_last:
        return (num_samples // world_size) // batch_size * batch_size
    return -(-num_samples // world_size)


def num_batches(num_samples: int, *, world_size: int, batch_size: int, drop_last: bool) -> int:
    """Batches every rank yields per epoch (the same on every rank).

    Example:
        >>> num_batches(10, world_size=4, batch_size=2, drop_last=False)
        2
    """
    per_rank = samples_per_rank(
        num_samples, world_size=world_size, batch_size=batch_size, drop_last=drop_last
    )
    return -(-per_rank // batch_size)


def _shard_order(counts: np.ndarray, seed: int, epoch: int, shuffle: bool) -> np.ndarray:
    if not shuffle:
        return np.arange(len(counts))
    return np.random.default_rng([_SHARD_STREAM, seed, epoch]).permutation(len(counts))


def _in_shard(start: int, count: int, shard: int, seed: int, epoch: int, shuffle: bool) -> np.ndarray:
    if not shuffle:
        return np.arange(start, start + count, dtype=np.int64)
    return start + np.random.default_rng([_SAMPLE_STREAM, seed, epoch, shard]).permutation(count)


def order_span(counts: Sequence[int] | np.ndarray, *, seed: int, epoch: int, shuffle: bool,
               start: int, stop: int) -> np.ndarray:
    """Positions ``[start, stop)`` of the epoch's global order (cyclic past the end).

    Only the shards overlapping the span are shuffled, so a rank's share costs memory
    and time in proportion to the share, not to the dataset.

    Example:
        >>> order_span([2, 2], seed=0, epoch=0, shuffle=False, start=3, stop=6).tolist()
        [3, 0, 1]
    """
    counts = np.asarray(counts, dtype=np.int64)
    total = int(counts.sum())
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    order = _shard_order(counts, seed, epoch, shuffle)
    ends = np.cumsum(counts[order])  # end position of each shard in the global order
    parts: list[np.ndarray] = []
    pos = start
    while pos < stop:
        a = pos % total
        b = min(total, a + (stop - pos))
        k = int(np.searchsorted(ends, a, side="right"))
        while a < b:
            s = int(order[k])
            first = int(ends[k] - counts[s])
            block = _in_shard(int(starts[s]), int(counts[s]), s, seed, epoch, shuffle)
            take = block[a - first : min(b, int(ends[k])) - first]
            parts.append(take)
            a += len(take)
            pos += len(take)
            k += 1
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def epoch_order(shard_counts: Sequence[int] | np.ndarray, *, seed: int, epoch: int, shuffle: bool) -> np.ndarray:
    """The global, shard-contiguous order of all samples for one epoch (step 1).

    Example:
        >>> epoch_order([2, 2], seed=0, epoch=0, shuffle=False).tolist()
        [0, 1, 2, 3]
    """
    total = int(np.asarray(shard_counts, dtype=np.int64).sum())
    return order_span(shard_counts, seed=seed, epoch=epoch, shuffle=shuffle, start=0, stop=total)


def _block_shuffle(span: np.ndarray, block: int, rng: np.random.Generator) -> np.ndarray:
    for a in range(0, len(span), block):
        rng.shuffle(span[a : a + block])
    return span


def plan_epoch(
    shard_counts: Sequence[int] | np.ndarray,
    *,
    seed: int,
    epoch: int,
    world_size: int,
    rank: int,
    batch_size: int,
    drop_last: bool,
    shuffle: bool,
    shuffle_block: int = DEFAULT_SHUFFLE_BLOCK,
) -> EpochPlan:
    """The plan of rank ``rank`` for ``epoch`` (see the module docstring).

    Args:
        shard_counts: samples per shard, in index order.
        seed: the user's seed (>= 0).
        epoch: the epoch number (>= 0).
        world_size: number of ranks.
        rank: this rank, in ``[0, world_size)``.
        batch_size: samples per batch.
        drop_last: drop the remainder instead of repeating samples to fill it.
        shuffle: shuffle shards, samples in shards, and blocks of the rank's span.
        shuffle_block: samples mixed together in the rank's span (>= 1).

    Example:
        >>> p = plan_epoch([4, 4], seed=1, epoch=3, world_size=2, rank=0, batch_size=3,
        ...                drop_last=True, shuffle=True)
        >>> p.num_batches, len(p.samples)
        (1, 3)
    """
    counts = np.asarray(shard_counts, dtype=np.int64)
    total = int(counts.sum())
    if not 0 <= rank < world_size:
        raise ConfigError(f"rank={rank} must be in [0, {world_size}) for world_size={world_size}")
    if shuffle_block < 1:
        raise ConfigError(f"shuffle_block={shuffle_block} must be >= 1")
    per_rank = samples_per_rank(total, world_size=world_size, batch_size=batch_size, drop_last=drop_last)
    # positions past N wrap around: the padding repeats the first samples of the order
    span = order_span(counts, seed=seed, epoch=epoch, shuffle=shuffle,
                      start=rank * per_rank, stop=(rank + 1) * per_rank)
    if shuffle and shuffle_block > 1:
        rng = np.random.default_rng([_BLOCK_STREAM, seed, epoch, world_size, rank])
        span = _block_shuffle(span, shuffle_block, rng)
    return EpochPlan(samples=span, batch_size=batch_size, num_batches=-(-per_rank // batch_size))


def worker_batches(num_batches: int, *, start: int, num_workers: int, worker: int) -> range:
    """Batches built by ``worker`` in a pass that starts at batch ``start`` (step 6).

    ``num_workers=0`` means the main process builds every batch.

    Example:
        >>> list(worker_batches(7, start=2, num_workers=2, worker=1))
        [3, 5]
    """
    if num_workers <= 0:
        return range(start, num_batches)
    return range(start + worker, num_batches, num_workers)
