"""Mixing plans as pure functions: proportions, cycling, exactly once, equal steps, workers."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from loading.order._planning import all_ranks, delivered, epoch_multiset, shard_counts

from fastfeed.errors import ConfigError
from fastfeed.loading.order.mixing import (
    dataset_seed,
    default_epoch_samples,
    mix_pattern,
    stream_ids,
)
from fastfeed.loading.order.epoch import plan_epoch, worker_batches
from fastfeed.loading.order.rankplan import plan_rank, plan_spec

weights_st = st.lists(st.integers(0, 9), min_size=1, max_size=4).filter(lambda w: sum(w) > 0)


# ---------------------------------------------------------------- the position pattern
@settings(database=None)
@given(w=weights_st, g=st.integers(0, 10**9))
def test_counts_are_monotone_partitions_near_the_weights(w: list[int], g: int) -> None:
    pat = mix_pattern(w)
    c = pat.counts_before(np.array([g, g + 1], dtype=np.int64))
    assert c[:, 0].sum() == g and c[:, 1].sum() == g + 1
    step = c[:, 1] - c[:, 0]
    assert ((step == 0) | (step == 1)).all() and step.sum() == 1
    assert (np.abs(c[:, 0] - g * pat.probabilities) < 1.0 + 1e-9).all()


@settings(database=None)
@given(w=weights_st, start=st.integers(0, 10**6), b=st.integers(1, 300))
def test_every_window_holds_the_weights_up_to_rounding(w: list[int], start: int, b: int) -> None:
    pat = mix_pattern(w)
    got = np.bincount(pat.sources(start, start + b), minlength=len(w))
    want = b * pat.probabilities
    if len(w) <= 2:
        assert ((got == np.floor(want)) | (got == np.ceil(want))).all(), (got, want)
    assert (np.abs(got - want) < 2).all(), (got, want)
    assert (got[np.asarray(w) == 0] == 0).all()


def test_weights_are_normalised_exact_fractions() -> None:
    assert mix_pattern([0.7, 0.3]).probabilities.tolist() == pytest.approx([0.7, 0.3])
    assert mix_pattern([7, 3]).sources(0, 10).tolist() == mix_pattern([0.7, 0.3]).sources(0, 10).tolist()
    c = mix_pattern([0.7, 0.3]).counts_before(np.array([10**9]))
    assert c[:, 0].tolist() == [700_000_000, 300_000_000]


@pytest.mark.parametrize("weights, n, msg", [
    ([1.0], 2, "2 datasets"),
    ([1, 2, 3], 2, "3 entries"),
    ([0, 0], 2, "all zero"),
    ([1, -1], 2, ">= 0"),
    ([1, float("nan")], 2, ">= 0"),
    (None, 3, "one weight per dataset"),
])
def test_bad_weights_name_the_argument_and_the_fix(weights, n, msg) -> None:
    with pytest.raises(ConfigError, match="weights") as e:
        mix_pattern(weights, num_datasets=n)
    assert msg in str(e.value)


def test_default_epoch_reads_the_largest_weight_dataset_once() -> None:
    for w, sizes in [([0.7, 0.3], [700, 10]), ([1, 3], [50, 77]), ([2, 2, 1], [9, 13, 1]), ([1], [5])]:
        pat = mix_pattern(w)
        e = default_epoch_samples(pat, sizes)
        k = int(pat.chain[0])
        assert pat.counts_before(np.array([e]))[k, 0] == sizes[k]
        assert pat.counts_before(np.array([e - 1]))[k, 0] < sizes[k]


# ---------------------------------------------------------------- whole epochs
@settings(max_examples=60, deadline=None, database=None)
@given(sizes=st.lists(st.integers(1, 120), min_size=1, max_size=3), data=st.data(),
       world=st.integers(1, 9), batch=st.integers(1, 9), epoch=st.integers(0, 3),
       drop_last=st.booleans(), pad=st.booleans(), shuffle=st.booleans(), block=st.sampled_from([1, 4, 8192]))
def test_mixed_epoch_delivers_each_position_once_with_equal_steps(sizes, data, world, batch, epoch, drop_last, pad,
                                                                 shuffle, block) -> None:
    weights = data.draw(st.lists(st.integers(1, 5), min_size=len(sizes), max_size=len(sizes)))
    spec = plan_spec([shard_counts(n, i) for i, n in enumerate(sizes)], weights=weights, seed=3,
                     shuffle=shuffle, shuffle_block=block)
    plans = all_ranks(spec, epoch=epoch, world_size=world, batch_size=batch, drop_last=drop_last, pad=pad)
    assert len({p.num_batches for p in plans}) == 1
    got = delivered(plans)
    want = epoch_multiset(spec, epoch)
    if drop_last:
        assert not got - want
        assert sum(got.values()) == world * ((spec.epoch_samples // world) // batch * batch)
        assert all(len(p.batch(b).ids) == batch for p in plans for b in range(p.num_batches))
    else:
        assert got == want
    padding = sum(int((~p.valid).sum()) for p in plans)
    assert padding == (0 if drop_last or not pad else world * -(-spec.epoch_samples // world) - spec.epoch_samples)
    assert padding <= world - 1
    # the largest-weight dataset is read exactly once per epoch by default
    k = int(spec.pattern.chain[0])
    if not drop_last:
        assert sorted(i for (s, i) in got.elements() if s == k) == list(range(sizes[k]))


def test_a_small_dataset_is_cycled_in_complete_reshuffled_passes() -> None:
    spec = plan_spec([shard_counts(400), [10, 7]], weights=[0.6, 0.4], seed=1)
    small = int(spec.per_epoch[1])
    assert small == round(spec.epoch_samples * 0.4)
    seen: Counter = Counter()
    for epoch in range(3):
        got = delivered(all_ranks(spec, epoch=epoch, world_size=4, batch_size=8))
        assert got == epoch_multiset(spec, epoch)
        seen.update(i for (s, i) in got.elements() if s == 1)
    stream = stream_ids(spec.sources[1], seed=dataset_seed(1, 1), shuffle=True, start=0, stop=3 * small)
    passes = [stream[i:i + 17] for i in range(0, len(stream) - 16, 17)]
    assert len(passes) >= 10 and all(sorted(p.tolist()) == list(range(17)) for p in passes)
    assert len({tuple(p.tolist()) for p in passes}) == len(passes)  # reshuffled every pass
    assert max(seen.values()) - min(seen.values()) <= 1  # epochs carry on where the last pass stopped


def test_batches_carry_the_proportions_and_the_source() -> None:
    spec = plan_spec([shard_counts(3000), shard_counts(2000, 1)], weights=[0.75, 0.25], seed=2)
    for p in all_ranks(spec, epoch=1, world_size=3, batch_size=16):
        for b in range(p.num_batches - 1):
            _, src, valid = p.batch(b)
            assert np.bincount(src, minlength=2).tolist() == [12, 4]
            assert src.dtype == np.int64 and valid.all()


@pytest.mark.parametrize("world, batch, n, drop_last", [(4, 3, 64, False), (3, 5, 100, True), (1, 7, 33, False),
                                                        (8, 2, 1000, True)])
def test_one_dataset_without_padding_is_plan_epoch(world, batch, n, drop_last) -> None:
    counts = shard_counts(n, 5)
    spec = plan_spec([counts], seed=9, shuffle_block=16)
    for r in range(world):
        old = plan_epoch(counts, seed=9, epoch=2, world_size=world, rank=r, batch_size=batch,
                         drop_last=drop_last, shuffle=True, shuffle_block=16)
        new = plan_rank(spec, epoch=2, world_size=world, rank=r, batch_size=batch, drop_last=drop_last)
        assert new.num_batches == old.num_batches
        assert all(new.batch(b).ids.tolist() == old.batch(b).tolist() for b in range(old.num_batches))


def test_plans_are_deterministic_and_change_with_seed_and_epoch() -> None:
    spec = plan_spec([shard_counts(500), shard_counts(300, 1)], weights=[1, 1], seed=4)
    a = plan_rank(spec, epoch=0, world_size=2, rank=1, batch_size=10)
    b = plan_rank(spec, epoch=0, world_size=2, rank=1, batch_size=10)
    c = plan_rank(spec, epoch=1, world_size=2, rank=1, batch_size=10)
    d = plan_rank(plan_spec([shard_counts(500), shard_counts(300, 1)], weights=[1, 1], seed=5),
                  epoch=0, world_size=2, rank=1, batch_size=10)
    assert a.ids.tolist() == b.ids.tolist() and a.source.tolist() == b.source.tolist()
    assert a.ids.tolist() != c.ids.tolist() and a.ids.tolist() != d.ids.tolist()


@pytest.mark.parametrize("workers", [0, 1, 2, 3, 5])
@pytest.mark.parametrize("start", [0, 3])
def test_the_stream_does_not_depend_on_num_workers(workers: int, start: int) -> None:
    spec = plan_spec([shard_counts(700), shard_counts(90, 1)], weights=[3, 1], seed=0)
    plan = plan_rank(spec, epoch=0, world_size=2, rank=0, batch_size=7)
    queues = [list(worker_batches(plan.num_batches, start=start, num_workers=workers, worker=w))
              for w in range(max(workers, 1))]
    order = []  # DataLoader(batch_size=None) hands batches back round-robin over workers
    while any(queues):
        for q in queues:
            if q:
                order.append(q.pop(0))
    assert order == list(range(start, plan.num_batches))
    single = plan_rank(spec, epoch=0, world_size=2, rank=0, batch_size=7)  # no num_workers anywhere
    assert [plan.batch(b).ids.tolist() for b in order] == [single.batch(b).ids.tolist()
                                                           for b in range(start, single.num_batches)]


def test_epoch_samples_sets_the_epoch_length() -> None:
    spec = plan_spec([[50], [50]], weights=[1, 1], epoch_samples=30)
    assert spec.per_epoch.tolist() == [15, 15]
    with pytest.raises(ConfigError, match="epoch_samples"):
        plan_spec([[50]], epoch_samples=0)
