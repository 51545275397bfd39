"""Elastic resume of the length samplers' plans (pure): consumed + rest == the whole epoch."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastfeed.errors import StateError
from fastfeed.sampling.costmodel import CostModel
from fastfeed.sampling.steps import CostFn, plan_budget, plan_fixed
from fastfeed.sampling.elastic import plan_after, rest_samples, restrict, stage_seed

COST = CostFn(CostModel.builtin("tokens"))


def _plan_at(lengths: np.ndarray, kind: str, drop_last: bool, seed: int = 0, epoch: int = 0):
    def plan_at(ids, world, stage):
        ls = lengths if ids is None else lengths[ids]
        common = {"world_size": world, "seed": stage_seed(seed, stage), "epoch": epoch, "shuffle": True,
                      "drop_last": drop_last, "jitter": 0.03, "cost": COST}
        if kind == "fixed":
            p = plan_fixed(ls, batch_size=3, **common)
        else:
            p = plan_budget(ls, max_cost=float(4 * lengths.max()), **common)
        return restrict(p, ids)
    return plan_at


def _consumed(plan, steps: int) -> Counter:
    out: Counter = Counter()
    for r in range(plan.world_size):
        flat, offsets = plan.rank_batches(r)
        out.update(flat[: offsets[steps]].tolist())
    return out


@settings(max_examples=50, deadline=None, database=None)
@given(n=st.integers(1, 120), kind=st.sampled_from(["fixed", "budget"]), drop_last=st.booleans(),
       worlds=st.lists(st.integers(1, 7), min_size=2, max_size=3), cuts=st.lists(st.floats(0, 1), min_size=3,
                                                                                 max_size=3))
def test_consumed_plus_rest_is_the_epoch(n, kind, drop_last, worlds, cuts) -> None:
    lengths = np.random.default_rng(n).integers(1, 50, size=n)
    plan_at = _plan_at(lengths, kind, drop_last)
    first = plan_at(None, worlds[0], 0)
    got, stages = Counter(), []
    plan = first
    for i, (w, cut) in enumerate(zip(worlds, cuts)):
        if i:
            plan = plan_after(plan_at, stages, world_size=w)
        assert plan.world_size == w
        steps = plan.num_steps if i == len(worlds) - 1 else int(cut * plan.num_steps)
        got += _consumed(plan, steps)
        stages.append((w, steps))
    whole = Counter(first.samples.tolist())
    if drop_last:
        assert not got - whole  # a later stage's own policy may drop up to W' - 1 (budget) or its tail
    else:
        assert not whole - got  # every sample of the epoch is delivered; repeats only from the policies
        extra = sum((got - whole).values())
        assert extra <= sum(w - 1 for w in worlds)


def test_rest_samples_and_errors() -> None:
    lengths = np.arange(1, 25)
    plan = _plan_at(lengths, "fixed", False)(None, 2, 0)
    assert sorted(rest_samples(plan, 0).tolist()) == sorted(plan.samples.tolist())
    assert rest_samples(plan, plan.num_steps).shape == (0,)
    with pytest.raises(StateError, match="steps=99"):
        rest_samples(plan, 99)
    end = plan_after(_plan_at(lengths, "fixed", False), [(2, plan.num_steps)], world_size=3)
    assert end.num_steps == 0 and end.world_size == 3
    with pytest.raises(StateError, match="no stage"):
        plan_after(_plan_at(lengths, "fixed", False), [], world_size=1)
