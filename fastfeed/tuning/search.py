"""The tuner's search: a pure function over ``measure_fn(setting) -> Measurement``.

The search never touches a loader; :func:`fastfeed.tuning.api.tune` gives it a function that
measures the real loader at a setting, and the tests give it fake throughput curves and
a fake clock.

Search space
    A :class:`~fastfeed.knobs.space.Setting` is ``num_workers``, ``prefetch_factor`` and
    the decode mode's own knobs; a :class:`~fastfeed.knobs.space.SearchSpace` says which
    values exist (see :mod:`fastfeed.knobs.space`).

Strategy (far fewer measurements than a grid)
    1. **climb workers** along a ladder (0, 1, 2, 3, 4, 6, 8, 12, 16, ...) at the default
       prefetch factor while throughput rises; stop after ``patience`` steps without a
       rise beyond the noise (see *tolerance*), when a target is met, or when memory
       runs out (measured, or predicted from the memory per worker seen so far);
    2. **refine** between the best rung and its neighbours (one bisection each way);
    3. **prefetch factor**: try larger (4, then 8 while it helps); try 1 only when memory
       binds; re-check the neighbouring worker counts if the factor changed. Without a
       target this runs from the refined setting and, when refine preferred a cheaper tie,
       from the fastest worker count too (deeper prefetch pays off at the plateau);
    4. **decode knobs**: one coordinate pass over each knob's values; a knob whose
       ``scales`` names thread knobs is tried at each new value as it is and then with
       those knobs scaled in proportion (two pipelines: the threads found shared between
       them, then twice those threads, capped at the largest candidate);
    5. **confirm**: the top 2-3 candidates are measured again, longer and interleaved,
       and the choice is made on those medians (:mod:`fastfeed.tuning.confirm`). Steps 1-4
       use the budget less a ``confirm_share`` kept for this step.

Steady state
    A trial whose measurement never reached steady state (``Measurement.steady`` False,
    see :mod:`fastfeed.timing.measure`) is shown with its reason and is chosen only when no
    steady trial exists.

Tolerance
    Two measurements differ only when the gap exceeds ``max(tolerance, noise / 2)``,
    where noise is the larger relative p10-p90 spread of their windows: on a busy machine
    the search asks for a bigger rise before it calls a rung better.

Choice (from the confirmation medians when step 5 ran; see :mod:`fastfeed.tuning.confirm`)
    With a target rate: the *cheapest* setting (fewest workers, then smallest prefetch,
    then earliest knob values) whose rate reaches ``target x (1 + headroom)``, leaving
    the other cores to the training process; if none does, the fastest. Without a
    target: the fastest, where settings within the noise of the fastest count as equal
    and the cheapest of those wins.

Example:
    >>> from fastfeed.timing.measure import Measurement
    >>> from fastfeed.knobs.space import Setting
    >>> def fake(s):  # throughput rises to 4 workers, then plateaus
    ...     r = 100.0 * min(s.num_workers + 1, 5)
    ...     return Measurement(r, r / 10, r, r, r, 50, 500, 1.0, 1.5, 0.1, 4, 0.2, 1, (), ())
    >>> out = search(fake, cores=16, time_budget=60)
    >>> out.best.setting.num_workers
    4
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from typing import Any, Callable

from fastfeed.errors import ConfigError
from fastfeed.timing.measure import Measurement
from fastfeed.tuning.confirm import Confirmed, choose, confirm, figure, top_candidates
from fastfeed.knobs.space import Knob, SearchSpace, Setting, worker_ladder

__all__ = ["SearchOutcome", "Trial", "search"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Trial:
    """One measured (or skipped) setting.

    Attributes:
        setting: what was measured.
        phase: which step of the search asked for it (``workers``, ``refine``, ...).
        measurement: the result, or None when skipped or failed.
        status: ``ok``, ``over memory``, ``skipped: ...`` or ``failed: ...``.
        seconds: wall time the measurement took.
    """

    setting: Setting
    phase: str
    measurement: Measurement | None
    status: str = "ok"
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == "ok" and self.measurement is not None

    @property
    def rate(self) -> float:
        return self.measurement.samples_per_s if self.measurement is not None else 0.0


@dataclass(frozen=True)
class SearchOutcome:
    """The trials in order, the chosen one and why.

    Attributes:
        trials: every trial, in the order run.
        best: the chosen trial (after step 5, its confirmation round nearest their median: :attr:`rate`
            is the setting's figure).
        reason: one sentence: why this setting.
        target_rate: the target the choice had to meet (samples/s), or None.
        target_met: whether it does (None without a target).
        out_of_time: True when the time budget ended the search early.
        confirmed: the candidates re-measured in step 5 (empty when it did not run).
    """

    trials: tuple[Trial, ...]
    best: Trial
    reason: str
    target_rate: float | None = None
    target_met: bool | None = None
    out_of_time: bool = False
    confirmed: tuple[Confirmed, ...] = ()

    @property
    def rate(self) -> float:
        """The chosen setting's figure, the one the choice was made on (:func:`~fastfeed.tuning.confirm.figure`):
        the median of its confirmation rounds when step 5 ran, else its search trial's rate."""
        return figure(self.best.setting, self.trials, self.confirmed)


# ---------------------------------------------------------------------- helpers
def _cost(t: Trial, space: SearchSpace, cores_per_rank: int) -> tuple[Any, ...]:
    """Cheaper first: fewer workers, smaller prefetch, earlier knob values."""
    s = t.setting
    knob_rank = []
    for knob in space.knobs:
        value = dict(s.knobs).get(knob.name, knob.default)
        vals = list(knob.candidates(cores_per_rank))
        knob_rank.append(vals.index(value) if value in vals else len(vals))
    return (s.num_workers, s.prefetch_factor or 0, *knob_rank)


def _tolerance(a: Measurement | None, b: Measurement | None, floor: float) -> float:
    noise = max((m.noise for m in (a, b) if m is not None), default=0.0)
    return min(0.25, max(floor, noise / 2))


class _OutOfTime(Exception):
    pass


class _Runner:
    """Runs and caches trials; enforces the time and memory budgets."""

    def __init__(self, measure_fn: Callable[[Setting], Measurement], *, time_budget: float,
                 memory_budget: int | None, clock: Callable[[], float],
                 on_trial: Callable[[Trial], None] | None) -> None:
        self.measure_fn = measure_fn
        self.memory_budget = memory_budget
        self.clock = clock
        self.deadline = clock() + time_budget
        self.on_trial = on_trial
        self.trials: list[Trial] = []
        self.done: dict[Setting, Trial] = {}

    def predicted_memory(self, s: Setting) -> int | None:
        """Main + per-worker memory of the largest measured worker count, scaled to ``s``.

        Only the worker count is extrapolated: a larger prefetch factor's extra batches
        are caught by measuring it ("over memory").
        """
        seen = [t for t in self.trials if t.measurement is not None
                and t.measurement.memory_bytes is not None and t.setting.num_workers > 0]
        if not seen or s.num_workers == 0:
            return None
        ref = max(seen, key=lambda t: t.setting.num_workers)
        m = ref.measurement
        if m is None or m.main_memory is None:  # pragma: no cover - filtered above
            return None
        per_worker = (m.workers_memory or 0) / ref.setting.num_workers
        return int(m.main_memory + per_worker * s.num_workers)

    def run(self, s: Setting, phase: str, *, again: bool = False,
            measure_fn: Callable[[Setting], Measurement] | None = None) -> Trial:
        """Measure ``s`` (or return its earlier trial unless ``again``)."""
        if s in self.done and not again:
            return self.done[s]
        if self.trials and self.clock() >= self.deadline and not again:
            raise _OutOfTime
        predicted = self.predicted_memory(s) if self.memory_budget else None
        if predicted is not None and self.memory_budget and predicted > self.memory_budget:
            t = Trial(s, phase, None, f"skipped: predicted memory {predicted / 2**20:.0f} MiB "
                      f"> budget {self.memory_budget / 2**20:.0f} MiB")
        else:
            start = self.clock()
            try:
                m = (measure_fn or self.measure_fn)(s)
                status = "ok"
                if (self.memory_budget and m.memory_bytes is not None
                        and m.memory_bytes > self.memory_budget):
                    status = "over memory"
            except (RuntimeError, OSError, MemoryError) as e:  # a worker killed, too many files
                log.warning("tune: %s failed: %s", s.label, e)
                m, status = None, f"failed: {type(e).__name__}: {e}"
            t = Trial(s, phase, m, status, self.clock() - start)
        self.trials.append(t)
        self.done.setdefault(s, t)
        if self.on_trial is not None:
            self.on_trial(t)
        return t


# ---------------------------------------------------------------------- the search
@dataclass
class _Ctx:
    run: _Runner
    space: SearchSpace
    cap: int
    goal: float | None
    tolerance: float
    patience: int
    cores_per_rank: int

    def better(self, a: Trial, b: Trial) -> bool:
        """``a`` is faster than ``b`` beyond the noise."""
        return a.ok and a.rate > b.rate * (1 + _tolerance(a.measurement, b.measurement, self.tolerance))

    def as_good(self, a: Trial, b: Trial) -> bool:
        """``a`` is not slower than ``b`` beyond the noise (so a cheaper ``a`` may replace it)."""
        tol = _tolerance(a.measurement, b.measurement, self.tolerance)
        return a.ok and a.rate * (1 + tol) >= b.rate

    def meets(self, t: Trial) -> bool:
        return self.goal is not None and t.ok and t.rate >= self.goal


def _climb(c: _Ctx) -> Trial | None:
    """Step 1: workers up the ladder at the default prefetch factor until a plateau."""
    ladder = list(c.space.workers) if c.space.workers is not None else worker_ladder(c.cap)
    ladder = [w for w in ladder if w <= c.cap] or [min(ladder)]
    knobs = tuple(sorted((k.name, k.default) for k in c.space.knobs))
    best: Trial | None = None
    misses = 0
    for w in ladder:
        t = c.run.run(Setting(w, c.space.default_prefetch, knobs), "workers")
        if not t.ok:
            break  # over memory, predicted over, or failed: more workers will not do better
        if best is None or c.better(t, best):
            best, misses = t, 0
        else:
            misses += 1
        if c.meets(t) or misses >= c.patience:
            break
    return best


def _measured_workers(c: _Ctx, like: Setting) -> list[Trial]:
    """Trials that differ from ``like`` only in num_workers, by workers."""
    return sorted((t for t in c.run.trials if t.setting.knobs == like.knobs and (
        t.setting.prefetch_factor == like.prefetch_factor or t.setting.num_workers == 0)),
        key=lambda t: t.setting.num_workers)


def _refine(c: _Ctx, best: Trial) -> Trial:
    """Step 2: bisect once between the best rung and each neighbour (to the cheapest rung that meets a target)."""
    if c.space.workers is not None:
        return best
    s = best.setting
    row = _measured_workers(c, s)
    lower = [t for t in row if t.setting.num_workers < s.num_workers]
    upper = [t for t in row if t.setting.num_workers > s.num_workers]
    pf = s.prefetch_factor or c.space.default_prefetch
    if c.meets(best):  # the cheapest rung that meets the target
        lo = lower[-1].setting.num_workers if lower else -1
        hi = s.num_workers
        while hi - lo > 1:
            t = c.run.run(replace(s, num_workers=(lo + hi) // 2, prefetch_factor=pf), "refine")
            if c.meets(t):
                best, hi = t, t.setting.num_workers
            else:
                lo = t.setting.num_workers
        return best
    if upper and upper[0].setting.num_workers - s.num_workers > 1:
        t = c.run.run(replace(s, num_workers=(s.num_workers + upper[0].setting.num_workers) // 2,
                              prefetch_factor=pf), "refine")
        if c.better(t, best):
            best = t
    if lower and s.num_workers - lower[-1].setting.num_workers > 1:
        t = c.run.run(replace(s, num_workers=(s.num_workers + lower[-1].setting.num_workers) // 2,
                              prefetch_factor=pf), "refine")
        if c.as_good(t, best) and t.setting.num_workers < best.setting.num_workers:
            best = t
    return best


def _prefetch_from_fastest(c: _Ctx, best: Trial) -> Trial:
    """Step 3 from ``best`` and, without a target, also from the fastest worker count measured.

    The refine step may hand over a cheaper setting that ties the fastest within the noise
    (e.g. 14 workers for 20). Prefetch depth pays off at the plateau, so trying it only at the
    cheaper count can miss the best combination: a grid on 16 cores found 20-21 workers x
    prefetch 4 best while the search, after preferring 14 workers, tried prefetch 4 only there.
    """
    out = _prefetch(c, best)
    if c.goal is not None:
        return out
    ok = [t for t in c.run.trials if t.ok and t.setting.knobs == best.setting.knobs
          and t.setting.num_workers > 0]
    if not ok:
        return out
    top = max(ok, key=lambda t: t.rate)
    if top.setting.num_workers == best.setting.num_workers:
        return out
    other = _prefetch(c, top)
    return other if c.better(other, out) else out


def _memory_bound(c: _Ctx, best: Trial) -> bool:
    budget = c.run.memory_budget
    if not budget:
        return False
    hit = any(t.status == "over memory" or t.status.startswith("skipped") for t in c.run.trials)
    used = best.measurement.memory_bytes if best.measurement is not None else None
    return hit or (used is not None and used > 0.8 * budget)


def _prefetch(c: _Ctx, best: Trial) -> Trial:
    """Step 3: larger prefetch while it helps; smaller when memory binds; re-check neighbours."""
    s = best.setting
    if s.num_workers == 0 or c.meets(best):
        return best
    pf = s.prefetch_factor or c.space.default_prefetch
    for p in (p for p in c.space.prefetch if p > pf):
        t = c.run.run(replace(s, prefetch_factor=p), "prefetch")
        if not c.better(t, best):
            break
        best = t
    if _memory_bound(c, best):
        for p in sorted((p for p in c.space.prefetch if p < pf), reverse=True):
            t = c.run.run(replace(s, prefetch_factor=p), "prefetch")
            if not c.as_good(t, best):
                break
            best = t
    if best.setting.prefetch_factor != pf and c.space.workers is None:
        ladder = worker_ladder(c.cap)
        w = best.setting.num_workers
        for nw in ([r for r in ladder if r > w][:1] + [r for r in ladder if 0 < r < w][-1:]):
            t = c.run.run(replace(best.setting, num_workers=nw), "prefetch")
            if (nw > w and c.better(t, best)) or (nw < w and c.as_good(t, best)):
                best = t
    return best


def _scaled(c: _Ctx, knob: Knob, base: Setting, value: Any) -> list[Setting]:
    """``base`` with ``knob`` at ``value`` and each knob it ``scales`` grown in proportion.

    A scaled knob goes to ``round(current * value / knob's current)``, capped at its largest
    candidate for these cores; settings where it would not change are left out.
    """
    knobs = dict(base.knobs)
    current = knobs.get(knob.name, knob.default)
    if not current or not isinstance(current, (int, float)) or not isinstance(value, (int, float)):
        return []
    by_name = {k.name: k for k in c.space.knobs}
    out = []
    for name in knob.scales:
        other = by_name.get(name)
        cands = () if other is None else other.candidates(c.cores_per_rank)
        if not cands:
            continue
        cur = knobs.get(name, other.default)
        n = min(max(cands), max(1, round(cur * value / current)))
        if n != cur:
            out.append(base.with_knob(knob.name, value).with_knob(name, n))
    return out


def _accept(c: _Ctx, t: Trial, best: Trial) -> Trial:
    """Step 4's rule: with a target met, any trial that meets it (cheaper values come first); else a faster one."""
    if c.meets(best):
        return t if c.meets(t) else best
    return t if c.better(t, best) else best


def _knobs(c: _Ctx, best: Trial) -> Trial:
    """Step 4: one coordinate pass over the decode mode's knobs.

    Each new value is measured as it is and then, for a knob with ``scales``, with each
    scaled knob grown in proportion (:func:`_scaled`); both go through the same rule, the
    plain (cheaper) setting first. When the plain one meets the target the scaled ones are
    not measured: they use more threads, so the choice would take the plain one anyway.
    """
    for knob in c.space.knobs:
        current = dict(best.setting.knobs).get(knob.name, knob.default)
        values = list(knob.candidates(c.cores_per_rank))
        if c.meets(best) and current in values:  # target met: only cheaper values may replace it
            values = values[: values.index(current)]
        for v in values:
            if v == current:
                continue
            base = best.setting
            plain = c.run.run(base.with_knob(knob.name, v), f"knob {knob.name}")
            best = _accept(c, plain, best)
            if c.meets(plain):
                continue
            for s in _scaled(c, knob, base, v):
                best = _accept(c, c.run.run(s, f"knob {knob.name}"), best)
    return best


def _choose(c: _Ctx, target_rate: float | None, headroom: float) -> tuple[Trial, str, bool | None]:
    ok = [t for t in c.run.trials if t.ok]
    ok = [t for t in ok if t.measurement is not None and t.measurement.steady] or ok
    cost = lambda t: _cost(t, c.space, c.cores_per_rank)  # noqa: E731
    top = max(ok, key=lambda t: t.rate)
    left = lambda t: max(0, c.cores_per_rank - c.space.cores_used(t.setting))  # noqa: E731
    if c.goal is not None and target_rate is not None:
        meeting = [t for t in ok if c.meets(t)]
        if meeting:
            best = min(meeting, key=cost)
            return best, (
                f"cheapest setting measured at >= {c.goal:,.0f} samples/s (target {target_rate:,.0f} "
                f"+ {headroom:.0%} headroom): {best.rate:,.0f} samples/s; leaves {left(best)} of "
                f"{c.cores_per_rank} cores per rank to the training process"), True
        return top, (
            f"target {target_rate:,.0f} samples/s not reached: the fastest setting gives "
            f"{top.rate:,.0f} samples/s, so input will bound training. Try a smaller image_size, "
            "decode='dali', fewer local ranks or a faster disk"), False
    ties = [t for t in ok if c.as_good(t, top)]
    best = min(ties, key=cost)
    if not (best.measurement is not None and best.measurement.steady):
        why = f"no setting reached steady state ({best.measurement.note if best.measurement else '?'}); "
        return best, why + f"fastest measured: {best.rate:,.0f} samples/s; measure longer", None
    if best is top:
        why = f"fastest measured: {top.rate:,.0f} samples/s"
    else:
        why = (f"within the measurement noise of the fastest ({top.setting.label}: {top.rate:,.0f} "
               f"samples/s) and cheaper: {best.rate:,.0f} samples/s")
    return best, f"{why}; leaves {left(best)} of {c.cores_per_rank} cores per rank to training", None


def _confirm(c: _Ctx, confirm_fn: Callable[[Setting], Measurement] | None, k: int, rounds: int,
             scale: float, deadline: float, target_rate: float | None, headroom: float
             ) -> tuple[Trial, str, bool | None, tuple[Confirmed, ...]] | None:
    """Step 5: re-measure the top candidates interleaved; None when it did not run."""
    cost = lambda t: _cost(t, c.space, c.cores_per_rank)  # noqa: E731
    searched = [t for t in c.run.trials if t.phase != "confirm"]
    prefer = _choose(c, target_rate, headroom)[0] if c.goal is None else None
    cands = top_candidates(searched, goal=c.goal, k=k, cost=cost, prefer=prefer)
    if len(cands) < 2:
        return None
    def again(s: Setting) -> Trial:
        return c.run.run(s, "confirm", again=True, measure_fn=confirm_fn)

    def expected(t: Trial) -> float:  # start-up does not grow with a longer trial
        startup = min(t.seconds, t.measurement.startup_s) if t.measurement is not None else 0.0
        return startup + scale * (t.seconds - startup)

    done = confirm(cands, again, rounds=rounds, deadline=deadline, clock=c.run.clock, expected_s=expected)
    done = [d for d in done if d.rates]
    if not done:
        return None
    by_setting = {t.setting: t for t in cands}
    pick = choose(done, goal=c.goal, tolerance=c.tolerance,
                  cost=lambda s: cost(by_setting[s]))
    best = pick.representative
    n = len(pick.rates)
    others = ", ".join(f"{d.setting.label} {d.rate:,.0f}" for d in done if d is not pick)
    left = max(0, c.cores_per_rank - c.space.cores_used(best.setting))
    head = (f"confirmed by {n} interleaved re-measurement{'s' if n > 1 else ''} of the top {len(done)}: "
            f"median {pick.rate:,.0f} samples/s (others: {others})")
    if c.goal is not None and target_rate is not None:
        met = pick.rate >= c.goal
        if met:
            return best, (f"cheapest setting at >= {c.goal:,.0f} samples/s (target {target_rate:,.0f} + "
                          f"{headroom:.0%} headroom), {head}; leaves {left} of {c.cores_per_rank} cores "
                          "per rank to the training process"), True, tuple(done)
        return best, (f"target {target_rate:,.0f} samples/s not reached: {head}, so input will bound "
                      "training. Try a smaller image_size, decode='dali', fewer local ranks or a faster disk"
                      ), False, tuple(done)
    top = max(done, key=lambda d: d.rate)
    if pick is not top:
        head += f"; within the noise of {top.setting.label} and cheaper"
    return best, f"{head}; leaves {left} of {c.cores_per_rank} cores per rank to training", None, tuple(done)


def search(
    measure_fn: Callable[[Setting], Measurement],
    *,
    cores: int,
    space: SearchSpace | None = None,
    local_world_size: int = 1,
    max_workers: int | None = None,
    target_rate: float | None = None,
    headroom: float = 0.1,
    memory_budget: int | None = None,
    time_budget: float = 60.0,
    tolerance: float = 0.03,
    patience: int = 2,
    confirm_top: int = 3,
    confirm_rounds: int = 2,
    confirm_fn: Callable[[Setting], Measurement] | None = None,
    confirm_scale: float = 1.0,
    confirm_share: float = 0.3,
    clock: Callable[[], float] = time.monotonic,
    on_trial: Callable[[Trial], None] | None = None,
) -> SearchOutcome:
    """Search the space with ``measure_fn`` (see the module docstring for the strategy).

    Args:
        measure_fn: measures a setting (raises RuntimeError/OSError/MemoryError when the
            setting fails: that trial is recorded as failed and the search goes on).
        cores: usable cores on the host.
        space: what may vary (``tune_space.space_for(decode)``; default workers/prefetch only).
        local_world_size: ranks sharing the host; each gets ``cores // local_world_size``.
        max_workers: cap on workers; default twice the cores per rank (I/O-bound loaders
            gain from a little oversubscription; the plateau stop ends the climb early).
        target_rate: samples/s the training step consumes, or None for the fastest.
        headroom: margin above ``target_rate`` a setting must reach.
        memory_budget: bytes of main + worker memory a setting may use, or None.
        time_budget: seconds of measuring; the search stops asking for new trials after it.
        tolerance: smallest relative gain that counts as faster (raised by the noise).
        patience: rungs without a gain before the climb stops.
        confirm_top: candidates to re-measure in step 5 (fewer than 2: no step 5).
        confirm_rounds: interleaved re-measurements of each candidate.
        confirm_fn: measures a candidate in step 5 (default ``measure_fn``; usually longer).
        confirm_scale: a ``confirm_fn`` trial's length over a ``measure_fn`` trial's (to
            plan whether a round fits the budget).
        confirm_share: share of ``time_budget`` kept for step 5.
        clock: monotonic seconds; injectable for tests.
        on_trial: called after every trial (progress output).

    Returns:
        A :class:`SearchOutcome`.

    Example:
        >>> out = search(measure_setting_somehow, cores=8, target_rate=2000)  # doctest: +SKIP
        >>> out.best.setting.loader_kwargs(), out.reason  # doctest: +SKIP
    """
    if cores < 1 or local_world_size < 1 or time_budget <= 0 or patience < 1:
        raise ConfigError(f"search: cores={cores}, local_world_size={local_world_size}, "
                          f"time_budget={time_budget}, patience={patience} must be positive")
    if max_workers is not None and max_workers < 0:
        raise ConfigError(f"max_workers={max_workers} must be >= 0")
    if target_rate is not None and target_rate <= 0:
        raise ConfigError(f"target_rate={target_rate} must be > 0 samples/s")
    if not 0 <= confirm_share < 1 or confirm_rounds < 0:
        raise ConfigError(f"confirm_share={confirm_share} must be in [0, 1) and confirm_rounds="
                          f"{confirm_rounds} >= 0")
    confirming = confirm_top >= 2 and confirm_rounds >= 1
    start = clock()
    space = space if space is not None else SearchSpace()
    cores_per_rank = max(1, cores // local_world_size)
    cap = 2 * cores_per_rank if max_workers is None else max_workers
    goal = target_rate * (1 + headroom) if target_rate is not None else None
    explore = time_budget * (1 - confirm_share) if confirming else time_budget
    runner = _Runner(measure_fn, time_budget=explore, memory_budget=memory_budget,
                     clock=clock, on_trial=on_trial)
    c = _Ctx(runner, space, cap, goal, tolerance, patience, cores_per_rank)
    out_of_time = False
    try:
        best = _climb(c)
        if best is not None:
            best = _refine(c, best)
            best = _prefetch_from_fastest(c, best)
            _knobs(c, best)
    except _OutOfTime:
        out_of_time = True
        log.info("tune: time budget of %.0f s used up after %d trials", time_budget, len(runner.trials))
    if not any(t.ok for t in runner.trials):
        first = runner.trials[0]
        memory = all("memory" in t.status for t in runner.trials)
        fix = ("lower the batch size or raise the memory budget" if memory else
               "every setting failed: fix that error (build the loader once by hand to see it whole), "
               "then tune again")
        raise ConfigError(f"tune: no setting could be measured (first: {first.setting.label}: {first.status}); {fix}")
    confirmed = None
    if confirming:
        confirmed = _confirm(c, confirm_fn, confirm_top, confirm_rounds, confirm_scale,
                             start + time_budget, target_rate, headroom)
    if confirmed is not None:
        chosen, reason, met, done = confirmed
        return SearchOutcome(tuple(runner.trials), chosen, reason, target_rate, met, out_of_time, done)
    chosen, reason, met = _choose(c, target_rate, headroom)
    return SearchOutcome(tuple(runner.trials), chosen, reason, target_rate, met, out_of_time)
