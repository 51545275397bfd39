"""Pure numpy planning of one epoch for the length-aware distributed samplers.

Everything here is a function of (lengths, world size, seed, epoch, options), computed
identically on every rank; no Python loop runs per sample. One epoch is planned as:

1. **Jittered length order.** Sort the samples by ``log(1 + length) + J(length) * u``
   with ``u ~ U[0, 1)`` re-drawn every epoch (a 16-bit key, so numpy's radix sort
   applies). Neighbours in this order have lengths within a factor ``exp(J)`` of each
   other, and which neighbours a sample gets changes every epoch. ``J`` is ``jitter``
   on average (token-weighted), spread by :func:`adaptive_jitter` toward lengths where
   randomness is scarce.
2. **Steps.** Cut that order into *steps* of consecutive samples, one batch per rank:
   ``world_size * batch_size`` samples (fixed batch), or, for a cost budget, as many as
   fit when every rank's batch holds ``ceil(n / world_size)`` samples padded to the
   step's longest (greedy, exact, jumping over runs of equal capacity).
3. **Batches.** Split each step into one batch per rank, choosing per step the split
   whose slowest rank is cheapest: equal counts, counts re-balanced by cost (budget
   sampler), or a snake deal (evens per-sample "varlen" costs). Steps are deliberately
   *not* re-sorted by true length: that would make batches tighter but nearly the same
   every epoch. ``jitter`` is the one trade-off: padding loss about ``jitter / 2``,
   co-batch repeats about ``batch size / samples within the jitter window``.
4. **Order.** Shuffle the order of the steps, so long and short steps mix over the epoch.

Remainders (the N that do not fill whole steps) follow the policy documented on the
samplers; the one small step lands at a random place in the length order each epoch,
so no sample is systematically dropped or repeated.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from fastfeed.errors import ConfigError
from fastfeed.sampling.splitting import (
    CostFn,
    batch_features,
    by_value,
    ranges,
    split_steps,
)

# CostFn and by_value live in fastfeed.sampling.splitting and are re-exported here for convenience
__all__ = ["CostFn", "Plan", "adaptive_jitter", "by_value", "co_batch_repeat_rate", "jittered_order", "plan_budget",
           "plan_fixed"]



@dataclass
class Plan:
    """One epoch for all ranks: ``num_steps`` steps of one batch per rank.

    Attributes:
        samples: flat sample indices; batch ``(s, r)`` of step ``s`` (in length order)
            for rank ``r`` is ``samples[starts[s, r] : starts[s, r] + counts[s, r]]``.
        lengths: the lengths of ``samples``, aligned with it.
        starts, counts: (S, W) int64.
        order: (S,) the epoch order: the t-th step run is step ``order[t]``.
        num_repeats: samples drawn twice this epoch (remainder policy).
        num_dropped: samples left out this epoch (remainder policy or skipped).
        valid: bool, aligned with ``samples``: False on a padding repeat (the aspect-ratio
            sampler flags its at most ``W - 1`` repeats); None: every sample is real.
    """

    samples: np.ndarray
    lengths: np.ndarray
    starts: np.ndarray
    counts: np.ndarray
    order: np.ndarray
    num_repeats: int = 0
    num_dropped: int = 0
    valid: np.ndarray | None = field(default=None, repr=False)
    _features: tuple[np.ndarray, ...] | None = field(default=None, repr=False)

    @property
    def num_steps(self) -> int:
        return int(self.order.shape[0])

    @property
    def world_size(self) -> int:
        return int(self.starts.shape[1])

    def rank_batches(self, rank: int) -> tuple[np.ndarray, np.ndarray]:
        """This rank's batches in epoch order: (flat indices, offsets of length S + 1)."""
        st = self.starts[self.order, rank]
        ct = self.counts[self.order, rank]
        return self.samples[ranges(st, ct)], np.concatenate([[0], np.cumsum(ct)])

    def rank_valid(self, rank: int) -> np.ndarray:
        """This rank's ``valid`` flags, aligned with :meth:`rank_batches`' flat indices."""
        st = self.starts[self.order, rank]
        ct = self.counts[self.order, rank]
        if self.valid is None:
            return np.ones(int(ct.sum()), dtype=bool)
        return self.valid[ranges(st, ct)]

    def features(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Per batch (count, longest, sum of lengths, sum of squares), (S, W) each, in length order."""
        if self._features is None:
            self._features = batch_features(self.lengths, self.starts, self.counts, need_sq=True)
        return self._features  # type: ignore[return-value]

    def costs(self, cost: "CostFn") -> np.ndarray:
        """(S, W) cost of every batch under ``cost``, in length order (not epoch order)."""
        return cost.batch_costs(self.lengths, self.starts, self.counts, self.features)


# ---------------------------------------------------------------------- step 1: order
_UNIT_BITS = 24  # log-lengths are handled as integers in [0, 2**24), keyed on the top 16 bits


def adaptive_jitter(ls: np.ndarray, jitter: float, batch_size_at: Callable[[np.ndarray], np.ndarray]) -> np.ndarray | None:
    """Per-length jitter (a table over ``0..max(ls)``) that spends a padding budget where
    randomness is scarce.

    A sample of length ``l`` shares its batch again next epoch with probability about
    ``b(l) / n(l)``: its batch size over the samples within its jitter window. Padding
    grows with the jitter, weighted by the tokens at that length. Minimising the mean
    repeat rate for the same token-weighted mean jitter gives
    ``J(l) ~ sqrt(b(l) / (n(l) * l))``: more jitter for rare lengths and for lengths whose
    batches are large (short sequences under a token budget), less where samples are
    plentiful. Normalised so the token-weighted mean is ``jitter``, clipped to
    ``[jitter / 4, 8 * jitter]``. None when lengths are too large for a table.
    """
    hi = int(ls.max())
    if hi >= 1 << 22 or jitter <= 0:
        return None
    counts = np.bincount(ls, minlength=hi + 1)
    cum = np.concatenate([[0], np.cumsum(counts)])
    v = np.arange(hi + 1, dtype=np.float64)
    lo_v = np.clip(np.floor(np.expm1(np.log1p(v) - jitter / 2)), 0, hi).astype(np.int64)
    hi_v = np.clip(np.ceil(np.expm1(np.log1p(v) + jitter / 2)), 0, hi).astype(np.int64)
    window = np.maximum(cum[hi_v + 1] - cum[lo_v], 1)
    present = np.flatnonzero(counts)
    b = np.ones(hi + 1)
    b[present] = np.maximum(np.asarray(batch_size_at(present), dtype=np.float64), 1.0)
    raw = np.sqrt(b / (window * np.maximum(v, 1.0)))
    tokens = counts * np.maximum(v, 1.0)
    for _ in range(2):  # normalise, clip, normalise again
        raw *= jitter / (float((tokens * raw).sum()) / float(tokens.sum()))
        raw = np.clip(raw, jitter / 4, 8 * jitter)
    return raw


def jittered_order(ls: np.ndarray, rng: np.random.Generator | None, jitter: float,
                   table: np.ndarray | None = None) -> np.ndarray:
    """Positions of ``ls`` sorted by ``log1p(l) + J(l) * u``, ``u ~ U[0, 1)``, on a 16-bit key.

    ``J(l)`` is ``table[l]`` (see :func:`adaptive_jitter`) or the constant ``jitter``.
    The noise is re-drawn every epoch, so a sample's neighbours are a fresh random
    draw among the samples within a factor ``exp(J)`` of its length. Integer
    arithmetic and numpy's radix sort keep this fast on 10M lengths. Without ``rng``
    (or with no jitter) the order is by length alone, ties by index.
    """
    n = ls.shape[0]
    lo, hi = int(ls.min()), int(ls.max())
    j = 0.0 if rng is None else (float(table.max()) if table is not None else jitter)
    if hi == lo and j <= 0:
        return np.arange(n, dtype=np.int64)
    xlo = np.log1p(lo)
    units = (2**_UNIT_BITS - 1) / (np.log1p(hi) - xlo + j)  # key units per log-length
    x = by_value(ls, lambda v: ((np.log1p(v) - xlo) * units).clip(0, None).astype(np.int32))
    if j > 0 and table is not None:
        scale = (table * units).astype(np.float32)
        x += (rng.random(n, dtype=np.float32) * scale[ls]).astype(np.int32)  # type: ignore[union-attr]
    elif j > 0:
        x += rng.integers(0, max(1, int(j * units)), n, dtype=np.int32)  # type: ignore[union-attr]
    x >>= _UNIT_BITS - 16
    return np.argsort(x.astype(np.uint16), kind="stable")


# ---------------------------------------------------------------------- step 2: steps
def _step_bounds_budget(cap: np.ndarray, cut: int) -> np.ndarray:
    """Boundaries of greedy steps over positions with per-end capacity ``cap``.

    ``cap[p]`` (non-increasing) is the most samples a step ending at ``p`` may hold.
    Steps are taken greedily from both ends toward ``cut`` and the middle is planned
    again, so the one step that may come out small sits at ``cut``.
    """
    n = cap.shape[0]
    run_starts = np.concatenate([[0], np.flatnonzero(np.diff(cap)) + 1])
    run_ends = np.concatenate([run_starts[1:], [n]])
    sm = np.arange(1, n + 1, dtype=np.int64) - cap  # a step [i, j) fits iff sm[j-1] <= i

    def forward(i: int, hi: int) -> list[np.ndarray]:
        out = []
        while i < hi:
            r = int(np.searchsorted(run_starts, i, side="right")) - 1
            kappa = int(cap[i])
            m = (min(int(run_ends[r]), hi) - i) // kappa
            if m > 0:
                out.append(np.arange(i + kappa, i + m * kappa + 1, kappa, dtype=np.int64))
                i += m * kappa
                continue
            j = min(int(np.searchsorted(sm, i, side="right")), hi)
            out.append(np.array([j], dtype=np.int64))
            i = j
        return out

    def backward(e: int, lo: int) -> tuple[list[np.ndarray], int]:
        out = []
        while e > lo:
            kappa = int(cap[e - 1])
            rs = int(run_starts[np.searchsorted(run_starts, e - 1, side="right") - 1])
            k = min((e - 1 - rs) // kappa + 1, (e - lo) // kappa)
            if k == 0:
                break
            out.append(np.arange(e - (k - 1) * kappa, e + 1, kappa, dtype=np.int64))
            e -= k * kappa
        return out, e

    fwd = np.concatenate([np.zeros(1, np.int64), *forward(0, cut)])
    a = int(fwd[-2]) if fwd.shape[0] >= 2 else 0
    bwd, e = backward(n, cut)
    mid = forward(a, e)
    parts = [fwd[: max(fwd.shape[0] - 1, 1)], *mid, *bwd[::-1]]
    return np.unique(np.concatenate(parts))


# ---------------------------------------------------------------------- public planners
def _rng(seed: int, epoch: int) -> np.random.Generator:
    return np.random.default_rng([int(seed) % 2**63, int(epoch) % 2**63, 0x5A3])


def _finish(ids: np.ndarray, ls: np.ndarray, bounds: np.ndarray, W: int, cost: CostFn,
            rng: np.random.Generator | None, *, balanced: bool, max_cost: float | None,
            repeats: int, dropped: int) -> Plan:
    ids, ls, starts, counts = split_steps(ids, ls, bounds, W, cost, balanced=balanced, max_cost=max_cost)
    S = bounds.shape[0] - 1
    order = rng.permutation(S) if rng is not None else np.arange(S)[::-1].copy()  # longest first
    return Plan(samples=ids, lengths=ls, starts=starts, counts=counts, order=order.astype(np.int64),
                num_repeats=repeats, num_dropped=dropped)


def _empty_plan(W: int, dropped: int) -> Plan:
    z = np.zeros((0, W), dtype=np.int64)
    return Plan(samples=np.zeros(0, np.int64), lengths=np.zeros(0, np.int64), starts=z, counts=z,
                order=np.zeros(0, np.int64), num_repeats=0, num_dropped=dropped)


def plan_fixed(lengths: np.ndarray, *, world_size: int, batch_size: int, seed: int, epoch: int,
               shuffle: bool, drop_last: bool, jitter: float, cost: CostFn, adaptive: bool = True) -> Plan:
    """Plan an epoch of fixed-size batches (see :class:`DistributedLengthBucketSampler`)."""
    W, B, N = world_size, batch_size, lengths.shape[0]
    rng = _rng(seed, epoch) if shuffle else None
    T = W * B
    ids: np.ndarray | None = None  # None: all samples, in index order
    repeats = dropped = 0
    if drop_last and N % T:
        dropped = N % T
        gone = rng.choice(N, dropped, replace=False) if rng is not None else np.arange(N - dropped, N)
        keep = np.ones(N, dtype=bool)
        keep[gone] = False
        ids = np.flatnonzero(keep)
    elif not drop_last and N % W:
        repeats = (-N) % W
        extra = rng.choice(N, repeats, replace=repeats > N) if rng is not None else np.arange(repeats) % N
        ids = np.concatenate([np.arange(N, dtype=np.int64), extra.astype(np.int64)])
    M = N if ids is None else ids.shape[0]
    if M == 0:
        return _empty_plan(W, dropped)
    table = adaptive_jitter(lengths, jitter, lambda v: np.full(v.shape, B)) if adaptive and rng is not None else None
    sigma = jittered_order(lengths if ids is None else lengths[ids], rng, jitter, table)
    ids = sigma if ids is None else ids[sigma]
    ls = lengths[ids]
    full, part = divmod(M, T)
    slot = int(rng.integers(0, full + 1)) if rng is not None else full
    bounds = np.arange(full + 1, dtype=np.int64) * T
    if part:
        bounds = np.concatenate([bounds[: slot + 1], bounds[slot:] + part])
    return _finish(ids, ls, bounds, W, cost, rng, balanced=False, max_cost=None,
                   repeats=repeats, dropped=dropped)


def plan_budget(lengths: np.ndarray, *, world_size: int, max_cost: float, seed: int, epoch: int,
                shuffle: bool, drop_last: bool, jitter: float, cost: CostFn,
                skip: np.ndarray | None = None, adaptive: bool = True) -> Plan:
    """Plan an epoch of cost-budgeted batches (see :class:`DistributedTokenBudgetSampler`).

    ``skip`` (bool, N) marks samples left out entirely (over-budget samples the user
    asked to skip); they are counted as dropped.
    """
    W, N = world_size, lengths.shape[0]
    rng = _rng(seed, epoch) if shuffle else None
    ids = None if skip is None or not skip.any() else np.flatnonzero(~skip).astype(np.int64)
    dropped = 0 if ids is None else N - ids.shape[0]
    if ids is not None and ids.shape[0] == 0:
        return _empty_plan(W, dropped)
    table = adaptive_jitter(lengths, jitter, lambda v: cost.capacity(v, max_cost)) \
        if adaptive and rng is not None else None
    sigma = jittered_order(lengths if ids is None else lengths[ids], rng, jitter, table)
    ids = sigma if ids is None else ids[sigma]
    ls = lengths[ids]
    # a step never holds more than every sample: clip before scaling by W, since zero-cost samples
    # (length 0 under "tokens") have an unbounded capacity (2**62) and W * 2**62 overflows int64
    cap = W * np.minimum(cost.capacity(np.maximum.accumulate(ls), max_cost), ls.shape[0])
    if cap.min() < 1:
        raise ConfigError("a sample is over max_cost (internal: over-budget samples must be filtered first)")
    cut = int(rng.integers(0, ids.shape[0] + 1)) if rng is not None else ids.shape[0]
    bounds = _step_bounds_budget(cap, cut)
    repeats = 0
    small = np.flatnonzero(np.diff(bounds) < W)
    if small.size:  # at most one step (the one at the cut) holds fewer than W samples
        s = int(small[0])
        a, b = int(bounds[s]), int(bounds[s + 1])
        if drop_last:
            dropped += b - a
            ids, ls = np.delete(ids, np.s_[a:b]), np.delete(ls, np.s_[a:b])
            bounds = np.concatenate([bounds[: s + 1], bounds[s + 2:] - (b - a)])
        else:
            repeats = W - (b - a)
            pick = rng.integers(a, b, repeats) if rng is not None else a + np.arange(repeats) % (b - a)
            ids, ls = np.insert(ids, b, ids[pick]), np.insert(ls, b, ls[pick])
            bounds = np.concatenate([bounds[: s + 1], bounds[s + 1:] + repeats])
    if bounds.shape[0] < 2:
        return _empty_plan(W, dropped)
    return _finish(ids, ls, bounds, W, cost, rng, balanced=True, max_cost=max_cost,
                   repeats=repeats, dropped=dropped)


# ---------------------------------------------------------------------- how plans differ
def _batch_of(plan: Plan, num_samples: int) -> np.ndarray:
    """Global batch number of every sample in ``plan`` (-1 when not drawn; last draw wins)."""
    bid = np.full(num_samples, -1, dtype=np.int64)
    order = np.argsort(plan.starts.ravel(), kind="stable")  # batches in layout order
    bid[plan.samples] = np.repeat(order, plan.counts.ravel()[order])
    return bid


def co_batch_repeat_rate(plan_a: Plan, plan_b: Plan, num_samples: int) -> tuple[float, float]:
    """How much batch composition repeats between two epochs' plans.

    Returns ``(per_sample, pairwise)``: the mean over samples of the share of its
    batch-mates in ``plan_a`` that are its batch-mates again in ``plan_b``; and the
    share of all pairs sharing a batch in ``plan_a`` that share one in ``plan_b``
    (dominated by the largest batches). Random batches give about batch size / N.

    Example:
        >>> from fastfeed.sampling.samplers import DistributedLengthBucketSampler
        >>> s = DistributedLengthBucketSampler(np.arange(1, 10001), batch_size=8, num_replicas=2, rank=0)
        >>> per_sample, pairs = co_batch_repeat_rate(s.epoch_plan(0), s.epoch_plan(1), 10000)
        >>> per_sample < 0.1
        True
    """
    a, b = _batch_of(plan_a, num_samples), _batch_of(plan_b, num_samples)
    ok = (a >= 0) & (b >= 0)
    a, b = a[ok], b[ok]
    size_a = np.bincount(a)[a]
    _, inv, both = np.unique(a * (int(b.max()) + 1) + b, return_inverse=True, return_counts=True)
    size_ab = both[inv]
    multi = size_a > 1
    per_sample = float(np.mean((size_ab[multi] - 1) / (size_a[multi] - 1))) if multi.any() else 0.0
    pairs_a = float(np.sum(size_a - 1))
    return per_sample, float(np.sum(size_ab - 1)) / pairs_a if pairs_a else 0.0
