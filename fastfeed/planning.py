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

import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from fastfeed.costmodel import CostModel
from fastfeed.errors import ConfigError

__all__ = ["CostFn", "Plan", "adaptive_jitter", "by_value", "jittered_order", "plan_budget", "plan_fixed"]

log = logging.getLogger(__name__)

_SPLIT_EQUAL, _SPLIT_BALANCED, _SPLIT_SNAKE = 0, 1, 2


class CostFn:
    """A :class:`CostModel` or a ``callable(lengths) -> float``, behind one interface.

    A callable receives the lengths of one batch (int64 array, ascending) and must not
    decrease when a sample is added or lengthened. It is called per batch while planning:
    for speed on millions of samples, prefer a CostModel.
    """

    def __init__(self, cost: CostModel | Callable[[np.ndarray], float]) -> None:
        self.model = cost if isinstance(cost, CostModel) else None
        self.fn = None if self.model is not None else cost
        self._cap_cache: dict[tuple[int, float], int] = {}

    @property
    def additive(self) -> bool:
        """True when a snake split can beat contiguous splits (per-sample terms)."""
        return self.fn is not None or self.model.has_additive  # type: ignore[union-attr]

    def describe(self) -> Any:
        if self.model is not None:
            return self.model.describe()
        return {"callable": getattr(self.fn, "__qualname__", type(self.fn).__name__)}

    def per_sample(self, ls: np.ndarray) -> np.ndarray:
        """Estimated share of a batch's cost that one sample of each length brings."""
        if self.model is not None:
            return by_value(ls, self.model.per_sample_at)
        uniq, inv = np.unique(ls, return_inverse=True)
        vals = np.array([self._call(np.array([u])) for u in uniq], dtype=np.float64)
        return vals[inv]

    def capacity(self, maxlen: np.ndarray, budget: float) -> np.ndarray:
        """Most samples no longer than each ``maxlen`` one batch may hold (int64)."""
        if self.model is not None:
            return by_value(maxlen, lambda v: self.model.capacity(v, budget))  # type: ignore[union-attr]
        uniq, inv = np.unique(maxlen, return_inverse=True)
        return np.array([self._cap_one(int(u), budget) for u in uniq], dtype=np.int64)[inv]

    def _cap_one(self, L: int, budget: float) -> int:
        key = (L, budget)
        if key not in self._cap_cache:
            if self._call(np.full(1, L)) > budget:
                self._cap_cache[key] = 0
            else:
                lo, hi = 1, 2  # exponential then binary search on n (no batch needs more than 2**24)
                while hi <= 1 << 24 and self._call(np.full(hi, L)) <= budget:
                    lo, hi = hi, hi * 2
                while hi - lo > 1:
                    mid = (lo + hi) // 2
                    lo, hi = (mid, hi) if self._call(np.full(mid, L)) <= budget else (lo, mid)
                self._cap_cache[key] = lo
        return self._cap_cache[key]

    def _call(self, lengths: np.ndarray) -> float:
        v = float(self.fn(lengths))  # type: ignore[misc]
        if not np.isfinite(v) or v < 0:
            raise ConfigError(f"cost callable returned {v!r} for a batch of {len(lengths)}; it must be >= 0")
        return v

    def batch_costs(self, ls: np.ndarray, starts: np.ndarray, counts: np.ndarray,
                    features: Callable[[], tuple[np.ndarray, ...]]) -> np.ndarray:
        """Costs of contiguous batches ``ls[starts : starts + counts]``, shaped like ``starts``.

        A model uses ``features()`` (count, max, sum, sum of squares); a callable is
        called on each batch's lengths.
        """
        if self.model is not None:
            return self.model.cost_from_features(*features())
        out = [self._call(ls[a:a + c]) if c > 0 else 0.0 for a, c in zip(starts.ravel(), counts.ravel())]
        return np.array(out, dtype=np.float64).reshape(starts.shape)

    @property
    def needs_sq(self) -> bool:
        return self.model is not None and self.model.tokens_sq > 0


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
    """

    samples: np.ndarray
    lengths: np.ndarray
    starts: np.ndarray
    counts: np.ndarray
    order: np.ndarray
    num_repeats: int = 0
    num_dropped: int = 0
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
        return self.samples[_ranges(st, ct)], np.concatenate([[0], np.cumsum(ct)])

    def features(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Per batch (count, longest, sum of lengths, sum of squares), (S, W) each, in length order."""
        if self._features is None:
            self._features = _batch_features(self.lengths, self.starts, self.counts, need_sq=True)
        return self._features  # type: ignore[return-value]

    def costs(self, cost: "CostFn") -> np.ndarray:
        """(S, W) cost of every batch under ``cost``, in length order (not epoch order)."""
        return cost.batch_costs(self.lengths, self.starts, self.counts, self.features)


def _ranges(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Concatenation of ``arange(s, s + c)`` for each pair, vectorised."""
    starts, counts = np.ravel(starts), np.ravel(counts)
    total = int(counts.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    ends = np.cumsum(counts)
    shift = np.repeat(starts - (ends - counts), counts)
    return np.arange(total, dtype=np.int64) + shift


def _batch_features(ls: np.ndarray, starts: np.ndarray, counts: np.ndarray,
                    need_sq: bool) -> tuple[np.ndarray, ...]:
    """(count, max, sum, sum of squares) of batches that tile ``ls`` in ``starts`` order.

    Batches must be contiguous and together cover ``ls``; empty batches give garbage
    (their steps are marked invalid by the caller).
    """
    shape = starts.shape
    idx = np.minimum(starts.ravel(), max(ls.shape[0] - 1, 0))
    if ls.shape[0] == 0:
        z = np.zeros(shape)
        return counts, z.astype(np.int64), z, z
    mx = np.maximum.reduceat(ls, idx).reshape(shape)
    s1 = np.add.reduceat(ls, idx).astype(np.float64).reshape(shape)
    if need_sq:
        s2 = np.add.reduceat(by_value(ls, lambda v: v.astype(np.float64) ** 2), idx).reshape(shape)
    else:
        s2 = np.zeros(shape)
    return counts, mx, s1, s2


# ---------------------------------------------------------------------- step 1: order
_UNIT_BITS = 24  # log-lengths are handled as integers in [0, 2**24), keyed on the top 16 bits


def by_value(values: np.ndarray, fn: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """``fn(values)`` for a vectorised ``fn``, evaluated once per distinct value.

    Integer lengths repeat a lot: a lookup table over ``0..max`` (or the distinct
    values when the range is huge) is several times faster than arithmetic on 10M values.
    """
    if values.shape[0] == 0:
        return fn(values)
    hi = int(values.max())
    if hi < 1 << 22:
        return np.asarray(fn(np.arange(hi + 1, dtype=np.int64)))[values]
    uniq, inv = np.unique(values, return_inverse=True)
    return np.asarray(fn(uniq))[inv]


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


# ---------------------------------------------------------------------- step 3: batches
def _equal_counts(nz: np.ndarray, W: int) -> np.ndarray:
    """(S, W) counts of an equal split (sizes differ by at most one, larger last)."""
    k = np.arange(W + 1, dtype=np.int64)[None, :]
    return np.diff((k * nz[:, None]) // W, axis=1)


def _starts(st: np.ndarray, counts: np.ndarray) -> np.ndarray:
    return st[:, None] + np.cumsum(counts, axis=1) - counts


def _balanced_counts(nz: np.ndarray, eq_counts: np.ndarray, eq_costs: np.ndarray, const: float) -> np.ndarray:
    """(S, W) counts of contiguous parts sized inversely to their per-sample cost.

    Starts from the equal split: part ``k`` costs ``c_k`` for ``n_k`` samples, so a
    sample there costs about ``a_k = (c_k - const) / n_k``; giving part ``k`` a share
    of samples proportional to ``1 / a_k`` evens the parts' costs (shorter parts take
    more samples). Rounded by largest remainder; parts may come out empty (invalid).
    """
    per = np.maximum(eq_costs - const, 1e-300) / np.maximum(eq_counts, 1)
    share = (1.0 / per) / np.sum(1.0 / per, axis=1, keepdims=True)
    want = share * nz[:, None]
    counts = np.floor(want).astype(np.int64)
    short = nz - counts.sum(axis=1)
    rank = np.argsort(np.argsort(counts - want, axis=1, kind="stable"), axis=1, kind="stable")
    return counts + (rank < short[:, None])


def _snake_counts(nz: np.ndarray, W: int) -> np.ndarray:
    """(S, W) counts of a snake deal (ranks 0..W-1, then W-1..0, ...) of every step."""
    F, rem = np.divmod(nz, W)
    k = np.arange(W)[None, :]
    extra = np.where((F % 2 == 0)[:, None], k < rem[:, None], k >= W - rem[:, None])
    return F[:, None] + extra


def _snake_perm(z: int, W: int) -> np.ndarray:
    """Local permutation of a step of ``z`` samples: dealt snake-wise, then rank after rank."""
    rnd, off = np.divmod(np.arange(z, dtype=np.int64), W)
    rank = np.where(rnd % 2 == 0, off, W - 1 - off)
    return np.lexsort((rnd, rank))


def _apply_snake(arr: np.ndarray, st: np.ndarray, nz: np.ndarray, W: int, rows: np.ndarray) -> np.ndarray:
    """A copy of ``arr`` with the given steps laid out snake-dealt, rank after rank."""
    out = arr.copy()
    zs = nz[rows]
    for z in np.unique(zs):
        r = rows[zs == z]
        perm = _snake_perm(int(z), W)
        starts = st[r]
        # runs of back-to-back steps of this size are one reshape each, no index matrix
        breaks = np.flatnonzero(np.diff(starts) != z) + 1
        for run in np.split(starts, breaks):
            first, k = int(run[0]), run.shape[0]
            if k >= 4 and z % W == 0:  # whole rounds: reverse odd rounds, then rounds x ranks -> ranks x rounds
                block = arr[first:first + k * z].reshape(k, z // W, W).copy()
                block[:, 1::2, :] = block[:, 1::2, ::-1]
                out[first:first + k * z] = block.transpose(0, 2, 1).ravel()
            elif k >= 4:
                out[first:first + k * z] = np.take(arr[first:first + k * z].reshape(k, z), perm, axis=1).ravel()
            else:
                base = run[:, None]
                out[base + np.arange(z)] = arr[base + perm]
    return out


def _choose(costs: Sequence[np.ndarray], valid: Sequence[np.ndarray], max_cost: float | None) -> np.ndarray:
    """Per step, which split has the lowest slowest-rank cost (ties: lower total, then first)."""
    best = np.zeros(costs[0].shape[0], dtype=np.int64)
    best_max, best_sum = costs[0].max(axis=1), costs[0].sum(axis=1)
    for i in range(1, len(costs)):
        ok = valid[i].copy()
        if max_cost is not None:
            ok &= np.all(costs[i] <= max_cost * (1 + 1e-9), axis=1)
        mx, sm = costs[i].max(axis=1), costs[i].sum(axis=1)
        tol = 1e-9 * np.maximum(best_max, 1e-300)
        better = ok & ((mx < best_max - tol) | ((np.abs(mx - best_max) <= tol) & (sm < best_sum - tol)))
        best = np.where(better, i, best)
        best_max = np.where(better, mx, best_max)
        best_sum = np.where(better, sm, best_sum)
    return best


def _split_steps(ids: np.ndarray, ls: np.ndarray, bounds: np.ndarray, W: int, cost: CostFn, *,
                 balanced: bool, max_cost: float | None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Split every step into W batches; returns (ids, lengths, starts, counts).

    Candidates: equal counts; a snake deal when the cost has per-sample terms; and
    (budget sampler) counts re-balanced from the equal split's costs. Per step, the
    candidate whose slowest rank is cheapest wins.
    """
    st = bounds[:-1].astype(np.int64)
    nz = np.diff(bounds).astype(np.int64)
    equal = _equal_counts(nz, W)
    if W == 1 or not (balanced or cost.additive):
        return ids, ls, _starts(st, equal), equal
    every = np.arange(st.shape[0])
    counts: list[np.ndarray] = []
    snake: list[bool] = []
    costs: list[np.ndarray] = []
    valid: list[np.ndarray] = []

    laid: dict[str, np.ndarray] = {}

    def candidate(c: np.ndarray, is_snake: bool) -> None:
        arr = ls
        if is_snake:
            arr = laid["ls"] = _apply_snake(ls, st, nz, W, every)
        s = _starts(st, c)
        costs.append(cost.batch_costs(arr, s, c, lambda: _batch_features(arr, s, c, cost.needs_sq)))
        valid.append(np.all(c > 0, axis=1))
        counts.append(c)
        snake.append(is_snake)

    candidate(equal, False)
    if cost.additive:
        candidate(_snake_counts(nz, W), True)
    if balanced:
        const = cost.model.const if cost.model is not None else 0.0
        candidate(_balanced_counts(nz, equal, costs[0], const), False)
    pick = _choose(costs, valid, max_cost)
    final = np.take_along_axis(np.stack(counts), pick[None, :, None], axis=0)[0]
    for i in np.flatnonzero(snake):
        rows = np.flatnonzero(pick == i)
        if rows.size == st.shape[0]:
            ids, ls = _apply_snake(ids, st, nz, W, every), laid["ls"]
        elif rows.size:  # lay out every step, keep the snake layout where it was picked
            mask = np.repeat(pick == i, nz)
            ids = np.where(mask, _apply_snake(ids, st, nz, W, every), ids)
            ls = np.where(mask, laid["ls"], ls)
    return ids, ls, _starts(st, final), final


# ---------------------------------------------------------------------- public planners
def _rng(seed: int, epoch: int) -> np.random.Generator:
    return np.random.default_rng([int(seed) % 2**63, int(epoch) % 2**63, 0x5A3])


def _finish(ids: np.ndarray, ls: np.ndarray, bounds: np.ndarray, W: int, cost: CostFn,
            rng: np.random.Generator | None, *, balanced: bool, max_cost: float | None,
            repeats: int, dropped: int) -> Plan:
    ids, ls, starts, counts = _split_steps(ids, ls, bounds, W, cost, balanced=balanced, max_cost=max_cost)
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
    cap = W * cost.capacity(np.maximum.accumulate(ls), max_cost)
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
