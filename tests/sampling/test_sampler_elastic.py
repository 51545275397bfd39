"""Elastic resume of the length samplers through ``state_dict`` / ``load_state_dict``: a
state saved at ``num_replicas=W`` resumes at ``W'``; the rest of the epoch is exactly what
the old ranks had not run, every new rank has the same steps, later epochs are fresh."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import numpy as np
import pytest

from fastfeed.errors import StateError
from fastfeed.sampling.samplers import (
    DistributedLengthBucketSampler,
    DistributedTokenBudgetSampler,
)

LENGTHS = np.random.default_rng(7).integers(5, 300, size=173)


def make(kind: str, world: int, rank: int, **kw: Any) -> Any:
    if kind == "bucket":
        return DistributedLengthBucketSampler(LENGTHS, batch_size=4, num_replicas=world, rank=rank, seed=3,
                                              jitter=0.03, **kw)
    return DistributedTokenBudgetSampler(LENGTHS, max_cost=1200, num_replicas=world, rank=rank, seed=3,
                                         jitter=0.03, **kw)


def _epoch(kind: str, world: int, epoch: int, **kw: Any) -> list[list[list[int]]]:
    out = []
    for r in range(world):
        s = make(kind, world, r, **kw)
        s.set_epoch(epoch)
        out.append(list(s))
    return out


@pytest.mark.parametrize("kind", ["bucket", "budget"])
@pytest.mark.parametrize("old,new,cut", [(3, 2, 4), (2, 5, 7), (4, 1, 0), (1, 3, 30)])
def test_a_state_saved_at_one_world_size_resumes_at_another(kind: str, old: int, new: int, cut: int) -> None:
    before = _epoch(kind, old, 2)
    steps = min(cut, len(before[0]))
    consumed = Counter(i for rank in before for batch in rank[:steps] for i in batch)
    saver = make(kind, old, 0)
    saver.set_epoch(2)
    it = iter(saver)
    for _ in range(steps):
        next(it)
    state = json.loads(json.dumps(saver.state_dict()))
    assert state["stages"] == [[old, steps]] and state["version"] == 2
    after = []
    for r in range(new):
        s = make(kind, new, r)
        s.load_state_dict(state)
        assert s.epoch == 2
        after.append(list(s))
        assert s.state_dict()["stages"] == [[old, steps], [new, len(after[-1])]]
    assert len({len(a) for a in after}) == 1  # equal steps at the new size
    rest = Counter(i for rank in after for batch in rank for i in batch)
    planned = Counter(i for rank in before for batch in rank for i in batch)
    left = planned - consumed
    assert not left - rest  # everything unconsumed is delivered ...
    assert sum((rest - left).values()) <= new - 1  # ... plus at most the new policy's repeats
    later = make(kind, new, 0)
    later.load_state_dict(state)
    list(later)
    later.set_epoch(3)
    assert list(later) == _epoch(kind, new, 3)[0]  # then a fresh epoch at the new size


def test_a_version_1_state_is_its_one_stage() -> None:
    s = make("bucket", 2, 1)
    s.set_epoch(1)
    it = iter(s)
    for _ in range(3):
        next(it)
    v1 = {**s.state_dict(), "version": 1}
    del v1["stages"]
    t = make("bucket", 2, 1)
    t.load_state_dict(v1)
    assert list(t) == _epoch("bucket", 2, 1)[1][3:]
    u = make("bucket", 3, 0)
    u.load_state_dict(v1)
    assert len(list(u)) == len(u) > 0


def test_each_stage_is_checked_against_the_plan_at_its_own_world_size() -> None:
    """A chain of resizes (2 -> 1 -> 8): stage 1 ran at 1 rank, so its steps are counted
    against the rest planned at 1 rank, whatever world size loads the state."""
    rest_at_1 = make("bucket", 1, 0).epoch_plan(0, after=[(2, 3)], world_size=1).num_steps
    rest_at_8 = make("bucket", 8, 0).epoch_plan(0, after=[(2, 3)], world_size=8).num_steps
    assert rest_at_8 < rest_at_1
    chain = {**make("bucket", 1, 0).state_dict(), "step": rest_at_1, "stages": [[2, 3], [1, rest_at_1]]}
    for world in (1, 8, 3):
        s = make("bucket", world, 0)
        s.load_state_dict(chain)  # the whole rest ran at 1 rank: nothing is left
        assert list(s) == [] and s.state_dict()["stages"][:2] == [[2, 3], [1, rest_at_1]]
    bogus = {**chain, "stages": [[2, 3], [8, rest_at_1]]}  # 8 ranks never had that many steps
    for world in (1, 8, 3):
        with pytest.raises(StateError, match=rf"stage 1 \(num_replicas=8\) consumed {rest_at_1} steps of "
                                             rf"{rest_at_8}, past the end of epoch 0"):
            make("bucket", world, 0).load_state_dict(bogus)


def test_a_refused_state_leaves_the_sampler_as_it_was() -> None:
    s = make("budget", 3, 1)
    s.set_epoch(4)
    it = iter(s)
    next(it)
    before = s.state_dict()
    bad = {**before, "epoch": 2, "step": 10**6, "stages": [[3, 1], [2, 10**6]]}
    with pytest.raises(StateError, match="stage 1"):
        s.load_state_dict(bad)
    assert s.state_dict() == before
