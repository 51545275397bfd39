"""Helpers for the pure planning tests: every rank's plan of an epoch, as plain lists."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

from fastfeed.loading.order.mixing import dataset_seed, stream_ids
from fastfeed.loading.order.rankplan import PlanSpec, RankPlan, plan_rank


def all_ranks(spec: PlanSpec, *, epoch: int, world_size: int, batch_size: int, drop_last: bool = False,
              pad: bool = True, resume: Any = None) -> list[RankPlan]:
    """The plan of every rank of one world."""
    return [plan_rank(spec, epoch=epoch, world_size=world_size, rank=r, batch_size=batch_size,
                      drop_last=drop_last, pad=pad, resume=resume) for r in range(world_size)]


def delivered(plans: list[RankPlan], *, first: int | None = None, stop: int | None = None,
              valid_only: bool = True) -> Counter:
    """Multiset of (dataset, id) the ranks deliver in batches [first, stop) (default [start, end))."""
    out: Counter = Counter()
    for p in plans:
        lo = p.start if first is None else first
        hi = p.num_batches if stop is None else stop
        for b in range(lo, hi):
            ids, src, valid = p.batch(b)
            keep = valid if valid_only else np.ones_like(valid)
            out.update(zip(src[keep].tolist(), ids[keep].tolist()))
    return out


def epoch_multiset(spec: PlanSpec, epoch: int) -> Counter:
    """What one epoch must deliver: each dataset's stream positions [e*T_k, (e+1)*T_k), once each."""
    out: Counter = Counter()
    for k, (sel, t) in enumerate(zip(spec.sources, spec.per_epoch.tolist())):
        got = stream_ids(sel, seed=dataset_seed(spec.seed, k), shuffle=spec.shuffle, start=epoch * t,
                         stop=(epoch + 1) * t)
        out.update((k, i) for i in got.tolist())
    return out


def shard_counts(n: int, seed: int = 0) -> list[int]:
    """Uneven shard sizes (some empty) summing to n."""
    rng = np.random.default_rng([n, seed])
    cuts = np.sort(rng.integers(0, n + 1, size=max(1, n // 25)))
    return np.diff(np.concatenate([[0], cuts, [n]])).tolist()
