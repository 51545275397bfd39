"""The epoch plan as a pure function: exactly once, equal steps, determinism, workers, locality."""

from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import pytest

from fastfeed.errors import ConfigError
from fastfeed.loading.order.epoch import (
    epoch_order,
    num_batches,
    order_span,
    plan_epoch,
    samples_per_rank,
    worker_batches,
)

WORLDS = [1, 2, 3, 4, 7, 8, 16, 31, 64]
SIZES = [1, 5, 63, 64, 65, 1000]
BATCHES = [1, 3, 32]


def shard_counts(n: int, seed: int = 0) -> np.ndarray:
    """Uneven shard sizes (some empty) summing to n."""
    rng = np.random.default_rng([n, seed])
    cuts = np.sort(rng.integers(0, n + 1, size=max(1, n // 40)))
    return np.diff(np.concatenate([[0], cuts, [n]]))


def all_ranks(counts: np.ndarray, world: int, batch: int, drop_last: bool, epoch: int = 0,
              shuffle: bool = True, seed: int = 0, block: int = 16) -> list:
    return [plan_epoch(counts, seed=seed, epoch=epoch, world_size=world, rank=r, batch_size=batch,
                       drop_last=drop_last, shuffle=shuffle, shuffle_block=block) for r in range(world)]


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("world", WORLDS)
def test_exactly_once_and_equal_steps(world: int, n: int, batch: int, drop_last: bool) -> None:
    counts = shard_counts(n)
    plans = all_ranks(counts, world, batch, drop_last)
    # equal steps, and equal batch sizes step by step, on every rank
    steps = {p.num_batches for p in plans}
    assert len(steps) == 1
    nb = steps.pop()
    assert nb == num_batches(n, world_size=world, batch_size=batch, drop_last=drop_last)
    for b in range(nb):
        assert len({len(p.batch(b)) for p in plans}) == 1
    delivered = Counter(int(i) for p in plans for i in p.samples)
    total = sum(delivered.values())
    assert all(0 <= i < n for i in delivered)
    if drop_last:
        # only full batches; each sample at most once; fewer than world*batch dropped
        assert all(len(p.batch(b)) == batch for p in plans for b in range(nb))
        assert max(delivered.values(), default=1) == 1
        assert 0 <= n - total < world * batch
    else:
        # every sample at least once; at most world_size - 1 repeated slots
        assert set(delivered) == set(range(n))
        assert total == world * -(-n // world)
        assert total - n <= world - 1
        assert nb == -(-(-(-n // world)) // batch)


@pytest.mark.parametrize("world,n", [(4, 1000), (8, 63), (64, 5)])
def test_deterministic_and_epoch_dependent(world: int, n: int) -> None:
    counts = shard_counts(n)
    a = all_ranks(counts, world, 3, False, epoch=2, seed=7)
    b = all_ranks(counts, world, 3, False, epoch=2, seed=7)
    assert all(np.array_equal(x.samples, y.samples) for x, y in zip(a, b))
    if n >= 60:
        c = all_ranks(counts, world, 3, False, epoch=3, seed=7)
        d = all_ranks(counts, world, 3, False, epoch=2, seed=8)
        flat = lambda ps: np.concatenate([p.samples for p in ps])  # noqa: E731
        assert not np.array_equal(flat(a), flat(c))  # the epoch changes the order
        assert not np.array_equal(flat(a), flat(d))  # so does the seed


def test_shard_order_and_in_shard_order_change_every_epoch() -> None:
    counts = np.full(20, 50)
    firsts, inner = [], []
    for epoch in range(4):
        order = epoch_order(counts, seed=0, epoch=epoch, shuffle=True)
        shards = order // 50
        # shard-contiguous: each shard's samples are adjacent
        runs = [k for k, _ in itertools.groupby(shards.tolist())]
        assert sorted(runs) == list(range(20))
        firsts.append(tuple(runs))
        inner.append(tuple(order[shards == 0].tolist()))
    assert len(set(firsts)) == 4 and len(set(inner)) == 4


@pytest.mark.parametrize("shuffle", [True, False])
def test_a_span_is_a_slice_of_the_cyclic_order(shuffle: bool) -> None:
    counts = shard_counts(1000, seed=3)
    full = epoch_order(counts, seed=1, epoch=2, shuffle=shuffle)
    assert sorted(full.tolist()) == list(range(1000))
    for a, b in [(0, 1000), (10, 300), (990, 1010), (0, 2500), (5, 5)]:
        span = order_span(counts, seed=1, epoch=2, shuffle=shuffle, start=a, stop=b)
        assert span.tolist() == [int(full[i % 1000]) for i in range(a, b)]


def test_no_shuffle_is_index_order() -> None:
    counts = [3, 4, 5]
    plans = all_ranks(np.array(counts), 2, 2, False, shuffle=False)
    assert np.concatenate([p.samples for p in plans]).tolist() == list(range(12))
    # padding repeats the first samples of the epoch order
    plans = all_ranks(np.array([3, 2]), 3, 1, False, shuffle=False)
    assert np.concatenate([p.samples for p in plans]).tolist() == [0, 1, 2, 3, 4, 0]


def round_robin(per_worker: list[list[int]]) -> list[int]:
    """What DataLoader(batch_size=None) does with iterable workers: cycle, skip the exhausted."""
    its = [iter(x) for x in per_worker]
    alive = [True] * len(its)
    out: list[int] = []
    while any(alive):
        for w, it in enumerate(its):
            if not alive[w]:
                continue
            nxt = next(it, None)
            if nxt is None:
                alive[w] = False
            else:
                out.append(nxt)
    return out


@pytest.mark.parametrize("workers", range(0, 9))
@pytest.mark.parametrize("nb,start", [(0, 0), (1, 0), (7, 0), (7, 3), (100, 0), (100, 99), (5, 5)])
def test_worker_split_reassembles_in_order(workers: int, nb: int, start: int) -> None:
    if workers == 0:
        assert list(worker_batches(nb, start=start, num_workers=0, worker=0)) == list(range(start, nb))
        return
    parts = [list(worker_batches(nb, start=start, num_workers=workers, worker=w)) for w in range(workers)]
    assert round_robin(parts) == list(range(start, nb))
    # every worker gets a share within one batch of the others
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize("world", [1, 4, 16])
def test_locality_each_rank_reads_few_shards(world: int) -> None:
    counts = np.full(64, 100)  # 6400 samples in 64 shards
    starts = np.concatenate([[0], np.cumsum(counts)])
    for epoch in range(2):
        for p in all_ranks(counts, world, 32, False, epoch=epoch, block=256):
            shards = np.searchsorted(starts, p.samples, side="right") - 1
            assert len(set(shards.tolist())) <= 64 // world + 1
            # a block of 256 samples touches at most 4 shards: reads stay within a window
            for a in range(0, len(shards), 256):
                assert len(set(shards[a:a + 256].tolist())) <= 4


def test_fewer_samples_than_ranks() -> None:
    plans = all_ranks(np.array([2, 1]), 8, 4, False)
    assert all(p.num_batches == 1 and len(p.samples) == 1 for p in plans)
    assert Counter(int(p.samples[0]) for p in plans).keys() == {0, 1, 2}
    assert samples_per_rank(3, world_size=8, batch_size=4, drop_last=True) == 0


def test_bad_arguments() -> None:
    with pytest.raises(ConfigError, match="no samples"):
        plan_epoch([0], seed=0, epoch=0, world_size=1, rank=0, batch_size=1, drop_last=False, shuffle=True)
    with pytest.raises(ConfigError, match="rank=4"):
        plan_epoch([5], seed=0, epoch=0, world_size=4, rank=4, batch_size=1, drop_last=False, shuffle=True)
    with pytest.raises(ConfigError, match="batch_size"):
        num_batches(5, world_size=1, batch_size=0, drop_last=False)
