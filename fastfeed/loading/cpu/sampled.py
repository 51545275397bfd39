"""``loader(batch_sampler=...)``: the balanced length-aware samplers decide every batch.

``fastfeed.loader(DST, batch_sampler=DistributedTokenBudgetSampler(DST, max_cost=16384))``
(or a :class:`~fastfeed.sampling.samplers.DistributedLengthBucketSampler`) runs
:class:`SamplerBatches`: the same workers, decoding, stats, buffer reuse and padding as
any ``loader()``, but batch ``b`` of an epoch is the sampler's step ``b`` for this rank
(``sampler.epoch_plan(epoch).rank_batches(rank)``), a pure function of the sampler's
lengths, seed and epoch. So every rank has the same number of steps (the sampler's
guarantee), the stream does not depend on ``num_workers``, and ``dl.state_dict()``
resumes mid-epoch: the loader drives the sampler's plan by epoch itself (calling the
sampler's own ``set_epoch`` or iterating it is not needed), and its state names the
sampler, its lengths and settings (:class:`SamplerStream`), so a state fits only a loader
with the same sampler. Elastic resume: a state saved at ``num_replicas=W`` loads into a
loader whose sampler (same lengths and settings) has ``num_replicas=W'``; the rest of the
epoch is the sampler's own re-plan of the steps the old ranks had not run
(:mod:`fastfeed.sampling.elastic`: every unconsumed sample as often as the old plan held it,
equal steps on the new ranks), and later epochs are a fresh plan at ``W'``.

Example:
    >>> s = DistributedTokenBudgetSampler("/data/wiki-ff", max_cost=16384)   # doctest: +SKIP
    >>> dl = fastfeed.loader("/data/wiki-ff", batch_sampler=s)               # doctest: +SKIP
    >>> b = next(iter(dl)); b["input_ids"].shape                              # doctest: +SKIP
    torch.Size([37, 440])
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Mapping

import numpy as np

from fastfeed.errors import ConfigError, StateError
from fastfeed.loading.cpu.dataset import ShardBatches
from fastfeed.loading.order.elastic import Stage
from fastfeed.loading.order.rankplan import Batch

__all__ = ["SamplerBatches", "SamplerPlan", "SamplerStream", "check_sampler_fits", "sampler_plan", "sampler_stages"]

_PLANS_KEPT = 3


class SamplerPlan:
    """One epoch of a sampler for one rank, with the interface of a
    :class:`~fastfeed.loading.order.rankplan.RankPlan` (``num_batches``, ``batch(b)``)."""

    def __init__(self, flat: np.ndarray, offsets: np.ndarray, valid: np.ndarray | None = None) -> None:
        self.flat, self.offsets = np.asarray(flat, dtype=np.int64), np.asarray(offsets, dtype=np.int64)
        self.valid = np.ones(self.flat.size, dtype=bool) if valid is None else np.asarray(valid, dtype=bool)
        self.num_batches = int(self.offsets.size - 1)

    def batch(self, b: int) -> Batch:
        """The samples of step ``b`` (one dataset; ``valid`` False on the sampler's padding repeats)."""
        if not 0 <= b < self.num_batches:
            raise IndexError(f"batch {b} out of range for {self.num_batches} batches")
        at = slice(self.offsets[b], self.offsets[b + 1])
        ids = self.flat[at]
        return Batch(ids, np.zeros(ids.size, dtype=np.int64), self.valid[at])


def sampler_stages(stages: tuple[Stage, ...]) -> list[tuple[int, int]]:
    """The sampler's ``(num_replicas, steps)`` stages of the loader's stages."""
    return [(s.world_size, s.batches) for s in stages]


def sampler_plan(sampler: Any, epoch: int, prior: tuple[Stage, ...] = ()) -> SamplerPlan:
    """``sampler``'s batches of ``epoch`` for its rank, or of the rest of the epoch after the
    loader's stages ``prior`` (elastic resume; the sampler's own state is left alone)."""
    plan = sampler.epoch_plan(epoch, after=sampler_stages(prior))
    flat, offsets = plan.rank_batches(sampler.rank)
    return SamplerPlan(flat, offsets, plan.rank_valid(sampler.rank))


def check_sampler_fits(sampler: Any, num_samples: int, where: str) -> None:
    """The sampler's lengths cover exactly the dataset's samples.

    Raises:
        ConfigError: they do not (the message says how to build the sampler).
    """
    n = int(sampler.lengths.shape[0])
    if n != num_samples:
        raise ConfigError(f"{where}: the batch_sampler holds {n} lengths but the dataset has {num_samples} "
                          f"samples; build it from the same dataset ({type(sampler).__name__}({where!r}, ...))")


class SamplerStream:
    """The cursor's view of a ``batch_sampler`` loader (a :class:`~fastfeed.loading.order.cursor.BatchStream`):
    the sampler's steps per epoch (or of its rest after stages at other world sizes), and
    its identity in the state."""

    def __init__(self, sampler: Any) -> None:
        self.sampler = sampler
        s = sampler.state_dict()
        ident = {k: s[k] for k in ("sampler", "num_samples", "lengths_digest", "config")}
        digest = hashlib.blake2b(json.dumps(ident, sort_keys=True, default=str).encode(), digest_size=6).hexdigest()
        self.ident = f"{s['sampler']}:{digest}"
        self._counts: dict[tuple[int, tuple[Stage, ...]], int] = {}

    def num_batches(self, epoch: int, prior: tuple[Stage, ...] = ()) -> int:
        key = (epoch, prior)
        if key not in self._counts:
            if len(self._counts) >= _PLANS_KEPT:
                self._counts.pop(next(iter(self._counts)))
            self._counts[key] = sampler_plan(self.sampler, epoch, prior).num_batches
        return self._counts[key]

    def plan(self, epoch: int, prior: tuple[Stage, ...] = ()) -> SamplerPlan:
        """This rank's steps of ``epoch`` (of its rest after ``prior``): what ``decode="dali"`` feeds."""
        return sampler_plan(self.sampler, epoch, prior)

    def state(self, epoch: int, batches: int, prior: tuple[Stage, ...] = ()) -> dict[str, Any]:
        return {"sampler": self.ident}

    def check_state(self, state: Mapping[str, Any]) -> None:
        if state.get("sampler") != self.ident:
            raise StateError(f"loader state saved with batch_sampler {state.get('sampler')!r}, now {self.ident!r}; "
                             "resume with the same sampler (class, lengths, max_cost/batch_size, jitter, cost)")

    def check_stages(self, epoch: int, stages: tuple[Stage, ...]) -> None:
        for i, st in enumerate(stages):
            after = sampler_stages(stages[:i])
            n = self.sampler.epoch_plan(epoch, after=after, world_size=st.world_size).num_steps
            if st.batches > n:
                raise StateError(f"loader state: stage {i} ({st.world_size} ranks) consumed {st.batches} steps of "
                                 f"the sampler's {n}; pass the dict from Loader.state_dict()")


class SamplerBatches(ShardBatches):
    """:class:`~fastfeed.loading.cpu.dataset.ShardBatches` (over one source) whose plan is the
    sampler's (see the module docstring)."""

    def __init__(self, *args: Any, sampler: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sampler = sampler
        self.stream = SamplerStream(sampler)
        self._plans: dict[tuple[int, tuple[Stage, ...]], SamplerPlan] = {}

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_plans"] = {}  # workers compute their own
        return state

    def __len__(self) -> int:
        return self.stream.num_batches(0)

    def plan(self, epoch: int, prior: tuple[Stage, ...] = (),  # type: ignore[override]
             legacy: bool = False) -> SamplerPlan:
        """This rank's steps of ``epoch``, or of its rest after the stages ``prior`` (the last few kept)."""
        key = (epoch, prior)
        if key not in self._plans:
            if len(self._plans) >= _PLANS_KEPT:
                self._plans.pop(next(iter(self._plans)))
            self._plans[key] = sampler_plan(self.sampler, epoch, prior)
        return self._plans[key]
