"""Elastic resume and exact-once evaluation as pure functions, over many world shapes."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from loading.order._planning import all_ranks, delivered, epoch_multiset, shard_counts

from fastfeed.errors import StateError
from fastfeed.loading.order.elastic import ElasticState, Layout, Stage, segment_after
from fastfeed.loading.order.rankplan import plan_rank, plan_spec

shape_st = st.tuples(st.integers(1, 9), st.integers(1, 7), st.sampled_from(["pad", "exact", "drop"]))


def _opts(mode: str) -> dict:
    return {"drop_last": mode == "drop", "pad": mode == "pad"}


def _spec(sizes: list[int], weights: list[int] | None, shuffle: bool = True):
    return plan_spec([shard_counts(n, i) for i, n in enumerate(sizes)], weights=weights, seed=11,
                     shuffle=shuffle, shuffle_block=4)


@settings(max_examples=80, deadline=None, database=None)
@given(sizes=st.lists(st.integers(1, 150), min_size=1, max_size=2), w2=st.integers(1, 4),
       shapes=st.lists(shape_st, min_size=2, max_size=4), cuts=st.lists(st.floats(0, 1), min_size=4, max_size=4),
       epoch=st.integers(0, 2), shuffle=st.booleans())
def test_consumed_plus_rest_is_the_whole_epoch_over_chains_of_resizes(sizes, w2, shapes, cuts, epoch,
                                                                      shuffle) -> None:
    spec = _spec(sizes, [3, w2][:len(sizes)] if len(sizes) > 1 else None, shuffle)
    base_mode = shapes[0][2]
    whole = delivered(all_ranks(spec, epoch=epoch, world_size=shapes[0][0], batch_size=shapes[0][1],
                                **_opts(base_mode)))
    if base_mode != "drop":
        assert whole == epoch_multiset(spec, epoch)
    got: Counter = Counter()
    state = None
    for i, ((world, batch, mode), cut) in enumerate(zip(shapes, cuts)):
        plans = all_ranks(spec, epoch=epoch, world_size=world, batch_size=batch, resume=state, **_opts(mode))
        steps = {p.num_batches for p in plans}
        assert len(steps) == 1
        last = i == len(shapes) - 1
        stop = plans[0].num_batches if last else plans[0].start + int(cut * (plans[0].num_batches - plans[0].start))
        got += delivered(plans, stop=stop)
        pads = sum(int((~p.valid).sum()) for p in plans)
        assert pads <= (world - 1 if mode == "pad" else 0)
        if mode == "drop":
            assert all(len(p.batch(b).ids) == batch for p in plans for b in range(p.num_batches))
        state = plans[0].state(stop).to_dict()
        assert all(p.state(stop).to_dict() == state for p in plans)  # rank 0's state fits every rank
    if any(m == "drop" for (_, _, m) in shapes):
        assert not got - whole  # a drop_last stage leaves its own tail out, never repeats
    else:
        assert got == whole


@pytest.mark.parametrize("world, batch, mode", [(4, 3, "pad"), (3, 2, "exact"), (5, 4, "drop")])
def test_same_shape_resume_continues_the_stream_exactly(world, batch, mode) -> None:
    spec = _spec([200, 60], [2, 1])
    for r in range(world):
        whole = plan_rank(spec, epoch=1, world_size=world, rank=r, batch_size=batch, **_opts(mode))
        for cut in (0, 1, whole.num_batches // 2, whole.num_batches):
            again = plan_rank(spec, epoch=1, world_size=world, rank=r, batch_size=batch, resume=whole.state(cut),
                              **_opts(mode))
            assert again.start == cut and again.num_batches == whole.num_batches
            for b in range(cut, whole.num_batches):
                assert again.batch(b).ids.tolist() == whole.batch(b).ids.tolist()


def test_after_a_resize_later_epochs_are_a_fresh_run_at_the_new_shape() -> None:
    spec = _spec([300], None)
    old = plan_rank(spec, epoch=0, world_size=8, rank=0, batch_size=4)
    state = old.state(3).to_dict()
    resumed = plan_rank(spec, epoch=0, world_size=2, rank=1, batch_size=6, resume=state)
    assert resumed.num_batches < plan_rank(spec, epoch=0, world_size=2, rank=1, batch_size=6).num_batches
    nxt = plan_rank(spec, epoch=1, world_size=2, rank=1, batch_size=6, resume=state)
    fresh = plan_rank(spec, epoch=1, world_size=2, rank=1, batch_size=6)
    assert nxt.ids.tolist() == fresh.ids.tolist() and nxt.start == 0


def test_a_state_saved_at_the_end_of_an_epoch_resumes_to_nothing() -> None:
    spec = _spec([50], None)
    p = plan_rank(spec, epoch=0, world_size=3, rank=0, batch_size=4)
    for shape in ((3, 4), (2, 5)):
        q = plan_rank(spec, epoch=0, world_size=shape[0], rank=0, batch_size=shape[1], resume=p.state(p.num_batches))
        assert q.num_batches - q.start == 0


def test_the_state_is_a_few_integers_per_stage() -> None:
    spec = _spec([1000], None)
    p = plan_rank(spec, epoch=2, world_size=16, rank=3, batch_size=8)
    q = plan_rank(spec, epoch=2, world_size=4, rank=0, batch_size=8, resume=p.state(2))
    d = q.state(1).to_dict()
    assert d == {"epoch": 2, "stages": [[16, 8, "pad", 2], [4, 8, "pad", 1]]}
    assert ElasticState.from_dict(d) == q.state(1)
    assert segment_after(spec.epoch_samples, q.state(1).stages).total == 1000 - 16 * 16 - 4 * 8


@pytest.mark.parametrize("bad", [{}, {"epoch": 0, "stages": []}, {"epoch": -1, "stages": [[1, 1, "pad", 0]]},
                                 {"epoch": 0, "stages": [[1, 1, "sideways", 0]]}, {"epoch": 0, "stages": [[1]]}])
def test_malformed_states_raise_state_error(bad) -> None:
    with pytest.raises(StateError, match="elastic state"):
        plan_rank(_spec([10], None), epoch=0, world_size=1, rank=0, batch_size=1, resume=bad)


@pytest.mark.parametrize("bad, match", [
    ({"epoch": 0, "stages": [[1, 1, "pad", 0], [2, 0, "pad", 0]]}, r"stage 1 has batch_size=0, not an integer >= 1"),
    ({"epoch": 0, "stages": [[1, 1, "pad"]]}, r"stage 0 is \[1, 1, 'pad'\], not \[world_size, batch_size, mode, "),
    ({"epoch": 0, "stages": [["1", 1, "pad", 0]]}, r"world_size='1', not an integer >= 1; .* floats or strings"),
    ({"epoch": "0", "stages": [[1, 1, "pad", 0]]}, r"elastic state: epoch='0' is not an integer >= 0"),
])
def test_a_malformed_stage_is_named_with_its_column(bad, match) -> None:
    with pytest.raises(StateError, match=match):
        ElasticState.from_dict(bad)


def test_resume_past_the_end_raises_state_error() -> None:
    with pytest.raises(StateError, match="batches=99"):
        plan_rank(_spec([10], None), epoch=0, world_size=1, rank=0, batch_size=1,
                  resume={"epoch": 0, "stages": [[1, 1, "pad", 99]]})


# ---------------------------------------------------------------- exact-once evaluation
@settings(max_examples=80, deadline=None, database=None)
@given(n=st.integers(1, 200), world=st.integers(1, 12), batch=st.integers(1, 9), mix=st.booleans())
def test_pad_false_delivers_every_sample_once_with_equal_steps(n, world, batch, mix) -> None:
    spec = _spec([n, 7], [1, 1]) if mix else _spec([n], None)
    plans = all_ranks(spec, epoch=0, world_size=world, batch_size=batch, pad=False)
    assert len({p.num_batches for p in plans}) == 1
    assert all(p.valid.all() for p in plans)
    assert delivered(plans, valid_only=False) == epoch_multiset(spec, 0)
    sizes = [len(p.ids) for p in plans]
    assert max(sizes) - min(sizes) <= 1
    per_rank = -(-spec.epoch_samples // world)
    assert plans[0].num_batches == -(-per_rank // batch)


def test_pad_false_gives_a_short_rank_an_empty_last_step() -> None:
    plans = all_ranks(_spec([9], None), epoch=0, world_size=4, batch_size=2, pad=False)
    assert [[len(p.batch(b).ids) for b in range(p.num_batches)] for p in plans] == [[2, 0], [2, 0], [2, 0], [2, 1]]
    assert plans[0].batch(1).valid.dtype == bool and plans[0].batch(1).source.shape == (0,)


def test_padding_is_flagged_and_at_most_world_size_minus_one() -> None:
    for n, world in [(10, 4), (3, 8), (64, 64), (65, 64)]:
        plans = all_ranks(_spec([n], None), epoch=0, world_size=world, batch_size=3)
        invalid = [(p.source[~p.valid].tolist(), p.ids[~p.valid].tolist()) for p in plans]
        assert sum(len(i) for _, i in invalid) == world * -(-n // world) - n
        assert Counter(i for p in plans for i in p.ids[p.valid].tolist()) == Counter(range(n))


def test_layout_spans() -> None:
    assert [a.tolist() for a in Layout(10, 4, 2, "pad").spans()] == [[0, 3, 6, 9], [3, 6, 9, 10], [3, 6, 9, 12]]
    assert [a.tolist() for a in Layout(10, 4, 2, "exact").spans()] == [[0, 2, 5, 7], [2, 5, 7, 10], [2, 5, 7, 10]]
    assert Layout(10, 4, 2, "drop").per_rank == 2 and Layout(7, 4, 2, "drop").num_batches == 0
    assert Stage(2, 3, "pad", 5).same_shape(Stage(2, 3, "pad", 0))
    assert np.array_equal(Layout(0, 3, 2, "pad").spans()[0], [0, 0, 0])


@pytest.mark.parametrize("n, before, after", [
    (10, (64, 2, "pad"), (3, 4, "pad")),
    (1000, (16, 8, "pad"), (64, 3, "exact")),
    (5, (7, 1, "exact"), (2, 2, "pad")),
    (3000, (64, 4, "pad"), (48, 5, "pad")),
])
def test_large_and_tiny_worlds_resize_exactly(n, before, after) -> None:
    spec = _spec([n, 40], [3, 1])
    first = all_ranks(spec, epoch=1, world_size=before[0], batch_size=before[1], **_opts(before[2]))
    cut = first[0].num_batches // 2
    rest = all_ranks(spec, epoch=1, world_size=after[0], batch_size=after[1], resume=first[0].state(cut),
                     **_opts(after[2]))
    assert len({p.num_batches for p in rest}) == 1
    assert delivered(first, stop=cut) + delivered(rest) == epoch_multiset(spec, 1)
    assert sum(int((~p.valid).sum()) for p in rest) <= (after[0] - 1 if after[2] == "pad" else 0)
