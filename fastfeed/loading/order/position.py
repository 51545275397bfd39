"""Where a pass starts, and the one function that turns it into a rank's plan.

A :class:`Position` is what a pass needs to know beyond the loader's fixed options: the
epoch, the first batch, the stages of that epoch that ran at other shapes before this
one (an elastic resume, :mod:`fastfeed.loading.order.elastic`), and whether the epoch resumes
a state written by the version-1 loader (``legacy``, see :func:`legacy_plan`).
:func:`rank_plan` is the only place that plans for a loader: the cursor (``len`` of the
pass, the DALI feeder) and the DataLoader workers call it with the same arguments, so
they agree batch for batch. Workers receive positions through a small shared-memory
tensor (:class:`SharedPosition`), so persistent workers follow ``set_epoch`` and
``load_state_dict`` without a restart.

Example:
    >>> from fastfeed.loading.order.rankplan import plan_spec
    >>> spec = plan_spec([[10]], shuffle=False)
    >>> shape = Stage(2, 2, "pad")
    >>> rank_plan(spec, shape, 1, Position(0, 0)).batch(0).ids.tolist()
    [5, 6]
    >>> rank_plan(spec, shape, 1, Position(0, 0, prior=(Stage(4, 2, "pad", 1),))).num_batches
    1
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from fastfeed.errors import ConfigError
from fastfeed.loading.order.elastic import MODES, ElasticState, Layout, Stage
from fastfeed.loading.order.epoch import _BLOCK_STREAM, _block_shuffle, plan_epoch
from fastfeed.loading.order.rankplan import PlanSpec, RankPlan, plan_rank

__all__ = ["MAX_STAGES", "Position", "SharedPosition", "legacy_plan", "rank_plan"]

#: Shapes one epoch may run at (resizes + 1) before it ends; a state with more is refused.
MAX_STAGES = 16


@dataclass(frozen=True)
class Position:
    """The start of a pass: epoch, first batch, earlier stages of the epoch, legacy flag."""

    epoch: int
    start: int
    prior: tuple[Stage, ...] = ()
    legacy: bool = False


def rank_plan(spec: PlanSpec, shape: Stage, rank: int, pos: Position) -> RankPlan:
    """``rank``'s plan of ``pos.epoch`` at ``shape`` after the stages ``pos.prior``.

    ``start`` of the plan is always 0: the pass starts at ``pos.start`` itself.
    """
    if pos.legacy:
        return legacy_plan(spec, shape, rank, pos.epoch)
    resume = ElasticState(pos.epoch, pos.prior + (Stage(shape.world_size, shape.batch_size, shape.mode, 0),)) \
        if pos.prior else None
    return plan_rank(spec, epoch=pos.epoch, world_size=shape.world_size, rank=rank, batch_size=shape.batch_size,
                     drop_last=shape.mode == "drop", pad=shape.mode != "exact", resume=resume)


def legacy_plan(spec: PlanSpec, shape: Stage, rank: int, epoch: int) -> RankPlan:
    """The version-1 loader's plan of one dataset (:func:`fastfeed.loading.order.epoch.plan_epoch`).

    Used only for the rest of an epoch resumed from a version-1 state whose order the
    planner does not reproduce (padding on some rank): the old code block-shuffled its
    padding with the real samples. ``valid`` is exact: the same block shuffle is applied
    to the span's positions, and a position past the epoch's end is padding.

    Example:
        >>> from fastfeed.loading.order.rankplan import plan_spec
        >>> p = legacy_plan(plan_spec([[5]], shuffle=False), Stage(2, 2, "pad"), 1, 0)
        >>> p.ids.tolist(), p.valid.tolist()
        ([3, 4, 0], [True, True, False])
    """
    if len(spec.sources) != 1 or spec.sources[0].kept is not None or shape.mode != "pad":
        raise ConfigError("a version-1 loader state describes one whole dataset with drop_last=False")
    n, w, b = spec.epoch_samples, shape.world_size, shape.batch_size
    old = plan_epoch(spec.sources[0].shard_counts, seed=spec.seed, epoch=epoch, world_size=w, rank=rank,
                     batch_size=b, drop_last=False, shuffle=spec.shuffle, shuffle_block=spec.shuffle_block)
    per_rank = old.samples.shape[0]
    positions = np.arange(rank * per_rank, (rank + 1) * per_rank, dtype=np.int64)
    if spec.shuffle and spec.shuffle_block > 1:  # the same draws permute the positions as the samples
        rng = np.random.default_rng([_BLOCK_STREAM, spec.seed, epoch, w, rank])
        positions = _block_shuffle(positions, spec.shuffle_block, rng)
    lay = Layout(n, w, b, "pad")
    offsets = np.minimum(np.arange(lay.num_batches + 1, dtype=np.int64) * b, per_rank)
    return RankPlan(ids=old.samples, source=np.zeros(per_rank, dtype=np.int64), valid=positions < n,
                    offsets=offsets, start=0, epoch=int(epoch), prior=(), stage=shape)


class SharedPosition:
    """A :class:`Position` in shared memory, so DataLoader workers see updates.

    Layout (int64): ``epoch, start, legacy, len(prior)``, then ``(world, batch, mode, batches)``
    per prior stage (at most :data:`MAX_STAGES` - 1 of them).

    Example:
        >>> sp = SharedPosition()
        >>> sp.set(Position(3, 2, prior=(Stage(4, 8, "exact", 5),)))
        >>> sp.get()
        Position(epoch=3, start=2, prior=(Stage(world_size=4, batch_size=8, mode='exact', batches=5),), legacy=False)
    """

    def __init__(self) -> None:
        self.t = torch.zeros(4 + 4 * MAX_STAGES, dtype=torch.int64).share_memory_()

    def set(self, pos: Position) -> None:
        if len(pos.prior) >= MAX_STAGES:
            raise ConfigError(f"an epoch ran at {len(pos.prior) + 1} shapes; at most {MAX_STAGES} are kept")
        row = [pos.epoch, pos.start, int(pos.legacy), len(pos.prior)]
        for s in pos.prior:
            row += [s.world_size, s.batch_size, MODES.index(s.mode), s.batches]
        self.t[: len(row)] = torch.tensor(row, dtype=torch.int64)

    def get(self) -> Position:
        v = self.t.tolist()
        prior = tuple(Stage(int(v[4 + 4 * i]), int(v[5 + 4 * i]), MODES[int(v[6 + 4 * i])], int(v[7 + 4 * i]))
                      for i in range(int(v[3])))
        return Position(int(v[0]), int(v[1]), prior, bool(v[2]))
