"""Where the step went: from each rank's measured times to shares, the slowest rank and the signals.

Pure numpy, no processes: :class:`fastfeed.StepMonitor` gathers the ranks' figures and calls
:func:`attribute`; :mod:`fastfeed.diagnosis.advice` turns the result into the verdict and
its fix. What a rank measures for each step, on its own clock (seconds):

==========  ==========================================================================
``data``    blocked in ``next()`` for the batch (and its host-to-device copy)
``work``    the step itself: from the batch in hand to the end of the step
``blocked`` the part of ``work`` spent blocked in collectives the monitor times (the
            gradient all-reduce of a watched DDP model, ``mon.collective()`` blocks)
``other``   between two steps: the monitor's bookkeeping, a framework's hooks
``span``    from the step's first collective launch to its last completion
==========  ==========================================================================

The ranks synchronise once per *unit*: a step, or with gradient accumulation the steps of
one optimizer step. Per unit, rank ``r`` was **busy** (not blocked) for ``b_r = data + work
- blocked + other``; every rank waits for the slowest, so with ``B = max_r b_r``:

- **wait** for the slowest rank: ``min(blocked_r, B - b_r)`` (derived from busy times, so
  no clock sync between hosts is needed);
- **collective**: ``blocked_r - wait_r``, the collective time compute did not hide;
- **compute**: ``work - blocked``; **data** and **other** as measured.

The five add up to each rank's step time. Without timed collectives (``blocked`` all 0)
wait and collective cannot be told from compute, and count as compute.

Example:
    >>> import numpy as np
    >>> ones = np.ones((2, 4))     # 2 ranks, 4 steps of 1.1 s; rank 1 is blocked 0.85 s of each
    >>> t = StepTimes(data=0.1 * ones, work=1.0 * ones, blocked=np.array([[0.05] * 4, [0.85] * 4]),
    ...               other=0 * ones)
    >>> a = attribute(t)
    >>> a.slowest_rank, {k: round(v, 2) for k, v in a.shares.items()}
    (0, {'data': 0.09, 'compute': 0.5, 'collective': 0.05, 'wait': 0.36, 'other': 0.0})
    >>> round(a.share_of(1, "wait"), 2), round(a.gain, 2)   # rank 1 waits for rank 0; balanced: 1.57x
    (0.73, 1.57)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fastfeed.diagnosis.vocabulary import CATEGORIES
from fastfeed.errors import ConfigError

__all__ = ["Attribution", "Split", "StepTimes", "attribute", "split", "stable_share"]

#: The measured columns of one step, in the order the monitor exchanges them.
COLUMNS = ("data", "work", "blocked", "other", "span")
#: A unit's slowest rank counts as "the slowest" when it was busy this much of the unit's time
#: longer than the median rank (below it, which rank is slowest is noise).
MATERIAL = 0.02
#: Long steps: this much over the median step (and 5 MADs), at least :data:`MIN_LONG` of them.
LONG_STEP = 0.5
MIN_LONG = 3


@dataclass(frozen=True)
class StepTimes:
    """What the ranks measured: one row per rank, one column per step (seconds).

    Attributes:
        data, work, blocked, other: see the module docstring; ``blocked`` is clipped to ``work``.
        span: first collective launch to last completion per step (None: not timed).
        units: the synchronisation unit of each step (non-decreasing; None: one per step).
    """

    data: np.ndarray
    work: np.ndarray
    blocked: np.ndarray
    other: np.ndarray
    span: np.ndarray | None = None
    units: np.ndarray | None = None

    def __post_init__(self) -> None:
        shape = np.shape(self.data)
        arrays = {"data": self.data, "work": self.work, "blocked": self.blocked, "other": self.other}
        if self.span is not None:
            arrays["span"] = self.span
        for name, arr in arrays.items():
            a = np.asarray(arr, dtype=np.float64)
            if a.ndim != 2 or a.shape != shape:
                raise ConfigError(f"StepTimes.{name}: shape {a.shape}, expected ranks x steps {shape}")
            if not np.all(np.isfinite(a)) or (a < 0).any():
                raise ConfigError(f"StepTimes.{name}: times must be finite and >= 0 (drop unmeasured steps)")
            object.__setattr__(self, name, a)
        object.__setattr__(self, "blocked", np.minimum(self.blocked, self.work))
        if self.units is not None:
            u = np.asarray(self.units, dtype=np.int64)
            if u.shape != (shape[1],) or (np.diff(u) < 0).any():
                raise ConfigError(f"StepTimes.units: {u.shape[0] if u.ndim else 0} non-decreasing ids expected, "
                                  f"one per step ({shape[1]})")
            object.__setattr__(self, "units", u)

    @property
    def ranks(self) -> int:
        return int(self.data.shape[0])

    @property
    def steps(self) -> int:
        return int(self.data.shape[1])

    @classmethod
    def from_cube(cls, cube: np.ndarray, *, first_step: int = 0, step_index: np.ndarray | None = None,
                  accumulation: int = 1) -> StepTimes:
        """From ranks x steps x :data:`COLUMNS`; steps with a NaN on any rank are left out.

        Each column's step of the run is ``step_index`` (or ``first_step``, ``first_step + 1``, ...);
        with ``accumulation=k`` the run's steps ``[0, k)``, ``[k, 2k)``, ... form one unit each.

        Example:
            >>> cube = np.ones((2, 5, len(COLUMNS))); cube[1, 0, 0] = np.nan
            >>> t = StepTimes.from_cube(cube, first_step=10, accumulation=2)
            >>> t.steps, t.units.tolist()
            (4, [5, 6, 6, 7])
        """
        cube = np.asarray(cube, dtype=np.float64)
        if cube.ndim != 3 or cube.shape[2] != len(COLUMNS):
            raise ConfigError(f"a cube of ranks x steps x {len(COLUMNS)} expected, got {cube.shape}")
        index = first_step + np.arange(cube.shape[1]) if step_index is None else np.asarray(step_index)
        if index.shape != (cube.shape[1],):
            raise ConfigError(f"step_index: {index.shape[0] if index.ndim else 0} entries for {cube.shape[1]} steps")
        keep = ~np.isnan(cube).any(axis=(0, 2))
        c = cube[:, keep, :]
        return cls(*(c[:, :, i] for i in range(len(COLUMNS))), units=index[keep] // max(1, accumulation))


@dataclass(frozen=True)
class Split:
    """Each rank's time per step in the five categories, and the units the ranks synchronised in.

    Attributes:
        data, compute, collective, wait, other: ranks x steps, seconds.
        busy: ranks x units: the time each rank was not blocked in a collective.
        total: ranks x units: each rank's step time (the five categories summed).
        starts: the first step (column) of each unit.
    """

    data: np.ndarray
    compute: np.ndarray
    collective: np.ndarray
    wait: np.ndarray
    other: np.ndarray
    busy: np.ndarray
    total: np.ndarray
    starts: np.ndarray

    def category(self, name: str) -> np.ndarray:
        """One of :data:`~fastfeed.diagnosis.vocabulary.CATEGORIES`, ranks x steps."""
        return getattr(self, name)


def _starts(t: StepTimes) -> np.ndarray:
    if t.units is None:
        return np.arange(t.steps)
    return np.flatnonzero(np.r_[True, np.diff(t.units) != 0]) if t.steps else np.zeros(0, np.int64)


def _per_unit(x: np.ndarray, starts: np.ndarray) -> np.ndarray:
    return np.add.reduceat(x, starts, axis=1) if x.shape[1] else x[:, :0]


def split(t: StepTimes) -> Split:
    """The categories of every rank and step (see the module docstring)."""
    starts = _starts(t)
    compute = t.work - t.blocked
    busy_steps = t.data + compute + t.other
    busy, blocked = _per_unit(busy_steps, starts), _per_unit(t.blocked, starts)
    wait_u = np.minimum(blocked, busy.max(axis=0, keepdims=True) - busy) if busy.size else busy
    # spread each unit's wait over its steps in proportion to their blocked time
    share = np.divide(wait_u, blocked, out=np.zeros_like(wait_u), where=blocked > 0)
    counts = np.diff(np.r_[starts, t.steps])
    wait = t.blocked * np.repeat(share, counts, axis=1)
    total = _per_unit(t.data + t.work + t.other, starts)
    return Split(t.data, compute, t.blocked - wait, wait, t.other, busy, total, starts)


def stable_share(world_size: int) -> float:
    """How often one rank must be the slowest to count as the same one: halfway from chance to always.

    Example:
        >>> stable_share(2), stable_share(4)
        (0.75, 0.625)
    """
    chance = 1.0 / max(1, world_size)
    return chance + 0.5 * (1.0 - chance)


@dataclass(frozen=True)
class Attribution:
    """Where the steps of some window (or the whole run) went, over all ranks.

    Attributes:
        ranks, steps, units: the shape measured.
        seconds: ranks x categories, seconds (columns in :data:`CATEGORIES` order).
        shares: each category's share of step time, averaged over the ranks.
        step_s: mean step time (over ranks and steps).
        critical_data: the share of step time the slowest rank of each unit spent waiting
            for data (what the data wait costs the whole job).
        imbalance: the slowest rank's compute per unit over the mean rank's (1.0: equal).
        gain: steps/s if every rank's busy time per unit were the mean (1.0: nothing to gain).
        slowest_rank: the rank whose busy time exceeded the mean the most, in sum.
        slowest_counts: per rank, the units in which it was materially the slowest.
        excess_s: per rank, busy seconds over the mean rank, summed over units.
        data_p50_s, data_mean_s: the slowest rank's data wait per unit (median, mean):
            a median far below the mean is a bursty (periodic) wait.
        long_steps: periodic long units, ``{"every", "count", "extra_s", "share"}``, or None.
        span_s, span_units: the slowest rank's collective span, summed over the units with
            collectives, and their count (for the bus bandwidth).
    """

    ranks: int
    steps: int
    units: int
    seconds: np.ndarray
    shares: dict[str, float]
    step_s: float
    critical_data: float
    imbalance: float
    gain: float
    slowest_rank: int
    slowest_counts: tuple[int, ...]
    excess_s: tuple[float, ...]
    data_p50_s: float
    data_mean_s: float
    long_steps: dict[str, float] | None = None
    span_s: float = 0.0
    span_units: int = 0
    per_rank: tuple[dict[str, float], ...] = field(default=(), repr=False)

    @property
    def slowest_share(self) -> float:
        """The share of material units in which :attr:`slowest_rank` was the slowest (0: none material)."""
        n = sum(self.slowest_counts)
        return self.slowest_counts[self.slowest_rank] / n if n else 0.0

    @property
    def stable(self) -> bool:
        """The same rank is the slowest most of the time (:func:`stable_share`)."""
        return sum(self.slowest_counts) > 0 and self.slowest_share >= stable_share(self.ranks)

    def share_of(self, rank: int, category: str) -> float:
        """One rank's share of its step time in ``category``."""
        return self.per_rank[rank][category]

    def to_json(self) -> dict[str, Any]:
        return {"ranks": self.ranks, "steps": self.steps, "units": self.units, "shares": self.shares,
                "per_rank": list(self.per_rank), "step_s": self.step_s, "critical_data": self.critical_data,
                "imbalance": self.imbalance, "gain": self.gain, "slowest_rank": self.slowest_rank,
                "slowest_share": self.slowest_share, "slowest_counts": list(self.slowest_counts),
                "excess_s": list(self.excess_s), "data_p50_s": self.data_p50_s,
                "data_mean_s": self.data_mean_s, "long_steps": self.long_steps}


def _shares(seconds: np.ndarray) -> dict[str, float]:
    total = float(seconds.sum())
    return {c: (float(seconds[..., i].sum()) / total if total > 0 else 0.0) for i, c in enumerate(CATEGORIES)}


def _long_steps(unit_time: np.ndarray) -> dict[str, float] | None:
    """Units much longer than the median, at a regular interval (checkpoints, evaluation), or None."""
    if unit_time.size < 4 * MIN_LONG:
        return None
    med = float(np.median(unit_time))
    mad = float(np.median(np.abs(unit_time - med)))
    long = np.flatnonzero(unit_time > med + max(LONG_STEP * med, 5 * mad))
    if long.size < MIN_LONG:
        return None
    gaps = np.diff(long)
    values, counts = np.unique(gaps, return_counts=True)
    every = int(values[np.argmax(counts)])
    if every < 2 or counts.max() < (2 / 3) * gaps.size:
        return None
    extra = float((unit_time[long] - med).sum())
    return {"every": every, "count": int(long.size), "extra_s": extra / long.size,
            "share": extra / float(unit_time.sum())}


def attribute(t: StepTimes, *, detail: bool = True) -> Attribution:
    """Shares, the slowest rank, imbalance and the signals of ``t`` (see :class:`Attribution`).

    ``detail=False`` computes the seconds, shares, step time and slowest rank only (a window's
    log line), leaving the other figures at their neutral values.
    """
    s = split(t)
    seconds = np.stack([s.category(c).sum(axis=1) for c in CATEGORIES], axis=1) if t.steps else \
        np.zeros((t.ranks, len(CATEGORIES)))
    per_rank = tuple(_shares(seconds[r]) for r in range(t.ranks))
    units = s.busy.shape[1]
    if units == 0 or not detail:
        excess = (s.busy - s.busy.mean(axis=0, keepdims=True)).sum(axis=1) if units else np.zeros(t.ranks)
        step_s = float(s.total.sum()) / (t.ranks * t.steps) if t.steps else 0.0
        shares = _shares(seconds) if units else {c: 0.0 for c in CATEGORIES}
        return Attribution(t.ranks, t.steps, units, seconds, shares, step_s, 0.0, 1.0, 1.0, int(np.argmax(excess)),
                           (0,) * t.ranks, tuple(float(e) for e in excess), 0.0, 0.0, per_rank=per_rank)
    unit_time = s.total.max(axis=0)  # in lockstep every rank's; else the step lasted the longest rank's
    total = float(unit_time.sum())
    slow = np.argmax(s.busy, axis=0)
    cols = np.arange(units)
    data_u = _per_unit(t.data, s.starts)[slow, cols]
    local = _per_unit(t.work - t.blocked + t.other, s.starts)  # compute and other: the rank's own work
    mean_local = float(local.mean(axis=0).sum())
    lag = s.busy.max(axis=0) - np.median(s.busy, axis=0)
    material = lag > MATERIAL * unit_time
    counts = np.bincount(slow[material], minlength=t.ranks)
    excess = (s.busy - s.busy.mean(axis=0, keepdims=True)).sum(axis=1)
    lost = float((s.busy.max(axis=0) - s.busy.mean(axis=0)).sum())
    span_s, span_units = 0.0, 0
    if t.span is not None:
        span = _per_unit(t.span, s.starts)[slow, cols]
        span_s, span_units = float(span.sum()), int((span > 0).sum())
    return Attribution(
        ranks=t.ranks, steps=t.steps, units=units, seconds=seconds, shares=_shares(seconds),
        step_s=float(s.total.sum()) / (t.ranks * t.steps), critical_data=float(data_u.sum()) / total if total else 0.0,
        imbalance=float(local.max(axis=0).sum()) / mean_local if mean_local > 0 else 1.0,
        gain=total / (total - lost) if total > lost else 1.0, slowest_rank=int(np.argmax(excess)),
        slowest_counts=tuple(int(c) for c in counts), excess_s=tuple(float(e) for e in excess),
        data_p50_s=float(np.median(data_u)), data_mean_s=float(data_u.mean()), long_steps=_long_steps(unit_time),
        span_s=span_s, span_units=span_units, per_rank=per_rank)
