"""Splitting one step into one batch per rank (pure numpy, all steps at once).

Candidates per step: equal counts; counts re-balanced from the equal split's costs
(budget sampler); a snake deal (ranks 0..W-1, then W-1..0, ...) when the cost has
per-sample terms. The candidate whose slowest rank is cheapest wins, step by step.
Also the small array helpers the planner shares: :func:`by_value`, :func:`ranges`,
:func:`batch_features`, and :class:`CostFn`, the one interface over a
:class:`~fastfeed.sampling.costmodel.CostModel` or a cost callable.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from fastfeed.errors import ConfigError
from fastfeed.sampling.costmodel import CostModel

__all__ = ["CostFn", "batch_features", "by_value", "ranges", "split_steps"]


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


def ranges(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Concatenation of ``arange(s, s + c)`` for each pair, vectorised."""
    starts, counts = np.ravel(starts), np.ravel(counts)
    total = int(counts.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    ends = np.cumsum(counts)
    shift = np.repeat(starts - (ends - counts), counts)
    return np.arange(total, dtype=np.int64) + shift


def batch_features(ls: np.ndarray, starts: np.ndarray, counts: np.ndarray,
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


def split_steps(ids: np.ndarray, ls: np.ndarray, bounds: np.ndarray, W: int, cost: CostFn, *,
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
        costs.append(cost.batch_costs(arr, s, c, lambda: batch_features(arr, s, c, cost.needs_sq)))
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
