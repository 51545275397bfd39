"""The tuner's last step: re-measure its best candidates, longer and interleaved, and pick by that.

The search ranks settings by one short measurement each. The top of such a ranking is
biased upwards (the maximum of many noisy figures is more often a lucky one than the
best setting), and settings measured minutes apart saw different background load.
So the top 2-3 candidates are measured again, ``rounds`` times each, in rotating order
(A B C, B C A, ...), with longer trials, and the choice is made on the medians:

- without a target: the fastest, where a candidate within the noise of the fastest
  (twice the standard error of the difference of the two medians, between
  ``tolerance`` and :data:`MAX_TIE`) counts as equal and the cheapest of those wins
  (fewer workers, then a smaller prefetch factor: less memory);
- with a target: the cheapest candidate whose median still meets it, else the fastest.

Everything here is pure logic over a ``measure_fn``; the tests use fake ones.

Example:
    >>> from fastfeed.timing.measure import Measurement
    >>> from fastfeed.tuning.search import Trial
    >>> from fastfeed.knobs.space import Setting
    >>> m = lambda r: Measurement(r, r / 8, r, r, r, 40, 320, 1.0, 2.0, 0.5, 8, 0.2, 1, (), ())
    >>> trials = [Trial(Setting(w, 2), "workers", m(100.0 * min(w, 4) + 1)) for w in (2, 4, 6)]
    >>> again = lambda s: Trial(s, "confirm", m(100.0 * min(s.num_workers, 4)))
    >>> done = confirm(top_candidates(trials, goal=None), again, rounds=2)
    >>> choose(done, goal=None).setting.num_workers  # 4 and 6 tie: the cheaper wins
    4
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from fastfeed.knobs.space import Setting

__all__ = ["MAX_TIE", "Confirmed", "choose", "confirm", "figure", "top_candidates"]

#: Largest relative gap that still counts as "within the noise" when choosing.
MAX_TIE = 0.04


@dataclass(frozen=True)
class Confirmed:
    """A candidate and its confirmation measurements.

    Attributes:
        setting: the candidate.
        searched: its rate in the search (samples/s), for the report.
        trials: the confirmation trials (``search.Trial``), in the order run.
    """

    setting: Setting
    searched: float
    trials: tuple[Any, ...]

    @property
    def rates(self) -> list[float]:
        return [t.rate for t in self.trials if t.ok]

    @property
    def rate(self) -> float:
        """Median of the confirmation rounds (0 when none succeeded)."""
        return float(np.median(self.rates)) if self.rates else 0.0

    @property
    def spread(self) -> float:
        """Relative spread of the rounds: (max - min) / median, 0 with one round."""
        r = self.rates
        return (max(r) - min(r)) / self.rate if len(r) > 1 and self.rate > 0 else 0.0

    @property
    def stderr(self) -> float:
        """Relative standard error of :attr:`rate`: the larger of the rounds' scatter and
        the windows' scatter within the rounds, over the square root of the rounds."""
        r = self.rates
        if not r or self.rate <= 0:
            return 0.0
        between = float(np.std(r, ddof=1)) / self.rate if len(r) > 1 else 0.0
        within = []
        for t in self.trials:
            w = t.measurement.window_rates if t.ok else ()
            if len(w) > 1 and t.rate > 0:
                within.append(float(np.std(w, ddof=1)) / t.rate / math.sqrt(len(w)))
        inside = math.sqrt(float(np.mean(np.square(within)))) if within else 0.0
        return max(between, inside) / math.sqrt(len(r))

    @property
    def representative(self) -> Any:
        """The round whose rate is nearest the median (the slower one on a tie)."""
        ok = [t for t in self.trials if t.ok]
        return min(ok, key=lambda t: (abs(t.rate - self.rate), t.rate))


def figure(setting: Setting, trials: Sequence[Any], confirmed: Sequence[Confirmed] = ()) -> float:
    """The one figure of ``setting`` that tune reports: headline, table, JSON, plot and store.

    The median of its confirmation rounds when it was re-measured (the figure the choice was
    made on), else the rate of its search trial (the search measures a setting once); 0.0
    when it was never measured.

    Example:
        >>> from fastfeed.timing.measure import Measurement
        >>> from fastfeed.tuning.search import Trial
        >>> m = lambda r: Measurement(r, r / 8, r, r, r, 40, 320, 1.0, 2.0, 0.5, 8, 0.2, 1, (), ())
        >>> s = Setting(4, 2)
        >>> trials = [Trial(s, "workers", m(1500.0)), Trial(s, "confirm", m(1000.0)), Trial(s, "confirm", m(1200.0))]
        >>> figure(s, trials), figure(s, trials, [Confirmed(s, 1500.0, tuple(trials[1:]))])
        (1500.0, 1100.0)
    """
    for c in confirmed:
        if c.setting == setting and c.rates:
            return c.rate
    return next((t.rate for t in trials if t.ok and t.setting == setting and t.phase != "confirm"), 0.0)


def _cost(s: Setting) -> tuple[int, int]:
    return (s.num_workers, s.prefetch_factor or 0)


def top_candidates(trials: Sequence[Any], *, goal: float | None, k: int = 3, margin: float = 0.15,
                   cost: Callable[[Any], Any] | None = None, prefer: Any = None) -> list[Any]:
    """The search trials worth confirming (at most ``k``, distinct settings).

    Without a goal: ``prefer`` (the search's own pick, e.g. the cheapest within the
    noise of the fastest) when given, then the fastest measured and the next ones
    within ``margin`` of the fastest (a clear winner is not re-measured against clear
    losers). With a goal: the
    cheapest trials that met it (a re-measure may show the cheapest falls short), or
    the fastest ones when none did. Steady measurements are preferred.

    Example:
        >>> top_candidates([], goal=None)
        []
    """
    ok = [t for t in trials if t.ok]
    steady = [t for t in ok if t.measurement.steady]
    pool = steady or ok
    seen: dict[Setting, Any] = {}
    for t in pool:  # one trial per setting: the first measurement (confirm rounds come later)
        seen.setdefault(t.setting, t)
    pool = list(seen.values())
    if not pool:
        return []
    key = cost or (lambda t: _cost(t.setting))
    if goal is not None:
        meeting = sorted((t for t in pool if t.rate >= goal), key=key)
        if meeting:
            return meeting[:k]
    fastest = sorted(pool, key=lambda t: -t.rate)
    top = fastest[0].rate
    out = [t for t in pool if prefer is not None and t.setting == prefer.setting]
    for t in fastest:
        if len(out) < k and t.rate >= top * (1 - margin) and t not in out:
            out.append(t)
    return out


def confirm(
    candidates: Sequence[Any],
    measure_fn: Callable[[Setting], Any],
    *,
    rounds: int = 2,
    deadline: float = math.inf,
    clock: Callable[[], float] = time.monotonic,
    expected_s: Callable[[Any], float] | None = None,
) -> list[Confirmed]:
    """Measure ``candidates`` ``rounds`` times each, interleaved (A B C, B C A, ...).

    ``measure_fn(setting)`` returns a finished ``search.Trial`` (the search's runner
    records it). A round starts only when ``expected_s`` (seconds per candidate, from
    its search trial; default: none expected) says it ends before ``deadline``; with no
    round done the list is empty.

    Example:
        >>> confirm([], lambda s: None)
        []
    """
    if len(candidates) < 1 or rounds < 1:
        return []
    runs: dict[Setting, list[Any]] = {t.setting: [] for t in candidates}
    est = expected_s or (lambda t: 0.0)
    for r in range(rounds):
        need = sum(est(t) for t in candidates)
        if clock() + need > deadline:
            break
        order = list(candidates[r % len(candidates):]) + list(candidates[: r % len(candidates)])
        for t in order:
            runs[t.setting].append(measure_fn(t.setting))
    done = [Confirmed(t.setting, t.rate, tuple(runs[t.setting])) for t in candidates]
    return [c for c in done if c.trials]


def choose(confirmed: Sequence[Confirmed], *, goal: float | None, tolerance: float = 0.02,
           cost: Callable[[Setting], Any] = _cost) -> Confirmed:
    """The candidate to use, from the confirmation medians (see the module docstring).

    Example:
        >>> choose([], goal=None)
        Traceback (most recent call last):
        ...
        ValueError: choose: no confirmed candidate
    """
    ok = [c for c in confirmed if c.rates]
    if not ok:
        raise ValueError("choose: no confirmed candidate")
    if goal is not None:
        meeting = [c for c in ok if c.rate >= goal]
        if meeting:
            return min(meeting, key=lambda c: cost(c.setting))
    top = max(ok, key=lambda c: c.rate)

    def tied(c: Confirmed) -> bool:
        tol = min(MAX_TIE, max(tolerance, 2 * math.hypot(c.stderr, top.stderr)))
        return c.rate * (1 + tol) >= top.rate

    return min((c for c in ok if tied(c)), key=lambda c: cost(c.setting))

