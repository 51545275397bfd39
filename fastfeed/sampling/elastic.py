"""Elastic resume for the length samplers: the rest of an epoch, re-planned at a new world size.

The rule (shared with the loader's :mod:`fastfeed.loading.order.elastic`): the order of an
epoch is fixed by the shape it started at; a stop after ``t`` steps has consumed the
steps ``order[:t]`` of every rank; the *rest* is the multiset of samples in the steps
``order[t:]`` of all ranks (a sample the remainder policy drew twice stays twice), and a
resume at another world size plans an epoch over exactly those samples, with the
sampler's own planner and remainder policy at the new size (so each rank again gets
equal steps and the at most ``W' - 1`` repeats or drops of the policy). A chain of
resizes repeats the step. Later epochs are a fresh plan at the new size.

State: ``epoch`` plus ``(world_size, steps)`` per stage, nothing per sample; every rank
recomputes the stages' plans from (lengths, seed, epoch), as it does for one stage.
The re-plan of stage ``i`` draws its randomness from ``seed`` mixed with ``i``
(:func:`stage_seed`), so it differs from the first stage's.

Example:
    >>> from fastfeed.sampling.steps import CostFn, plan_fixed
    >>> from fastfeed.sampling.costmodel import CostModel
    >>> lengths = np.arange(1, 41)
    >>> def plan_at(ids, world, stage):
    ...     ls = lengths if ids is None else lengths[ids]
    ...     p = plan_fixed(ls, world_size=world, batch_size=2, seed=stage_seed(0, stage), epoch=0,
    ...                    shuffle=True, drop_last=False, jitter=0.03, cost=CostFn(CostModel.builtin("tokens")))
    ...     return restrict(p, ids)
    >>> first = plan_at(None, 4, 0)
    >>> rest = plan_after(plan_at, [(4, 2)], world_size=3)
    >>> rest.world_size, sorted(rest.samples.tolist()) == sorted(rest_samples(first, 2).tolist())
    (3, True)
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable, Sequence

import numpy as np

from fastfeed.errors import StateError
from fastfeed.sampling.steps import Plan
from fastfeed.sampling.splitting import ranges

__all__ = ["PlanAt", "plan_after", "rest_samples", "restrict", "stage_seed"]

#: ``plan_at(ids, world_size, stage) -> Plan`` over the samples ``ids`` (None: all), with global indices.
PlanAt = Callable[[np.ndarray | None, int, int], Plan]
_RESIZE_STREAM = 0x5EED_0020


def stage_seed(seed: int, stage: int) -> int:
    """The planner seed of stage ``stage`` of an epoch: ``seed`` itself for the first."""
    if stage == 0:
        return int(seed)
    return int(np.random.SeedSequence([_RESIZE_STREAM, int(seed), int(stage)]).generate_state(1, np.uint64)[0] >> 1)


def rest_samples(plan: Plan, steps: int) -> np.ndarray:
    """Samples of the steps not yet run after ``steps`` steps (all ranks, with multiplicity; a
    padding repeat the plan flags in ``valid`` is not a sample and is left out)."""
    if not 0 <= steps <= plan.num_steps:
        raise StateError(f"steps={steps} outside [0, {plan.num_steps}] for this epoch's plan")
    todo = plan.order[steps:]
    at = ranges(plan.starts[todo].ravel(), plan.counts[todo].ravel())
    return plan.samples[at] if plan.valid is None else plan.samples[at[plan.valid[at]]]


def restrict(plan: Plan, ids: np.ndarray | None) -> Plan:
    """A plan made over ``lengths[ids]`` with its local indices mapped back to ``ids``."""
    return plan if ids is None else replace(plan, samples=np.asarray(ids)[plan.samples])


def plan_after(plan_at: PlanAt, stages: Sequence[tuple[int, int]], *, world_size: int) -> Plan:
    """The plan of the rest of an epoch at ``world_size`` after ``stages`` ((world, steps) each).

    Raises:
        StateError: no stage, or a stage's steps past the end of its plan.

    The plan of stage ``i + 1`` is made at the world size of ``stages[i + 1]`` (the last
    at ``world_size``), so a stage's plan always has its stage's world size.
    """
    if not stages:
        raise StateError("elastic sampler state has no stage; pass the state from state_dict()")
    plan = plan_at(None, int(stages[0][0]), 0)
    for i, (_, steps) in enumerate(stages):
        nxt = int(stages[i + 1][0]) if i + 1 < len(stages) else int(world_size)
        rest = rest_samples(plan, int(steps))
        plan = plan_at(rest, nxt, i + 1) if rest.shape[0] else _empty_plan(nxt)
    return plan


def _empty_plan(world_size: int) -> Plan:
    """The plan of a rest with no sample (a state saved after the last step): no step."""
    none = np.zeros(0, dtype=np.int64)
    grid = np.zeros((0, world_size), dtype=np.int64)
    return Plan(samples=none, lengths=none.copy(), starts=grid, counts=grid.copy(), order=none.copy())
