"""The loader's own tuning while it runs: from the data wait it sees to its next setting.

With ``num_workers="auto"`` (and ``Workers(autotune=True)``, the default) the CPU loader
keeps tuning itself as training runs, the way tf.data's ``AUTOTUNE`` does: every few steps
it measures how much of the step time the loop spent waiting for data, and when that share
is above :data:`GOAL` it changes its setting. The decision is this module's one pure
function, :func:`decide`: from the windows measured at the current setting (and the
workers' busy share, from the seconds they report per batch) to the next setting:

- **prefetch now**: waiting at all, the prefetch factor doubles (up to
  :attr:`Limits.max_prefetch` and the memory the batches in flight may take): a deeper
  queue absorbs slow batches and a step's variance, and it applies to the running workers;
- **workers at the next epoch**: when the workers are busy (at least :data:`BUSY` of the
  time: they cannot deliver faster) or the prefetch factor is at its limit, the worker count
  that would deliver the loop's rate without waiting, ``n x busy x (1 + margin) / (1 -
  wait)`` (and at least one more), up to :attr:`Limits.max_workers` (what the host has left
  after the training process: :func:`fastfeed.host.worker_cores`); persistent workers are
  rebuilt at the epoch boundary, never mid-epoch.

It never lowers a setting (a setting that stops waiting stays), never goes below one worker
(decoding on the training thread) and never past its limits; at them it says so once. The
order of batches, resume and exactly-once do not depend on it: they are a function of the
plan (:mod:`fastfeed.loading.order`), which no worker count changes. The wiring (windows
from ``loader.stats``, the live prefetch, the rebuild, the log lines) is in
:mod:`fastfeed.loading.cpu.loader`.

Example:
    >>> w = [Window(steps=16, wait_s=0.8, step_s=2.0, work_s=3.9)]      # 40% waiting, 2 workers busy 97%
    >>> d = decide(w, Setting(2, 2), Limits(max_workers=14))
    >>> d.prefetch_factor, d.num_workers, d.changed
    (4, 4, True)
    >>> decide([Window(16, 0.01, 2.0, 3.0)], Setting(4, 4), Limits(max_workers=14)).changed   # 0.5% waiting
    False
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

__all__ = ["BUSY", "GOAL", "MIN_STEPS", "Decision", "Limits", "Setting", "Window", "decide", "window_steps"]

#: The share of step time waiting for data the tuner aims below.
GOAL = 0.02
#: Workers busy at least this share of the time cannot deliver faster: more of them are needed.
BUSY = 0.85
#: Fewest steps of measurement before a decision.
MIN_STEPS = 8


@dataclass(frozen=True)
class Setting:
    """What the tuner turns.

    Attributes:
        num_workers: DataLoader worker processes (at least 1).
        prefetch_factor: batches in flight per worker.
    """

    num_workers: int
    prefetch_factor: int


@dataclass(frozen=True)
class Window:
    """What the loop saw over consecutive steps at one setting.

    Attributes:
        steps: steps measured.
        wait_s: seconds the loop waited in ``next()`` over them.
        step_s: seconds of those steps, waits included.
        work_s: the workers' seconds reading and decoding those batches (None: unknown).
    """

    steps: int
    wait_s: float
    step_s: float
    work_s: float | None = None

    @property
    def wait_share(self) -> float:
        return self.wait_s / self.step_s if self.step_s > 0 else 0.0


@dataclass(frozen=True)
class Limits:
    """How far the tuner may go.

    Attributes:
        max_workers: the most workers (the cores the host has left for them).
        max_prefetch: the deepest prefetch factor.
        goal: the data-wait share it aims below.
        margin: extra worker capacity asked for, over what the measured rate needs.
        batch_bytes: bytes of one batch (None: unknown, no memory bound).
        max_in_flight_bytes: bytes the batches in flight may take (workers x prefetch x batch).
    """

    max_workers: int
    max_prefetch: int = 8
    goal: float = GOAL
    margin: float = 0.15
    batch_bytes: int | None = None
    max_in_flight_bytes: int | None = None

    def fits(self, s: Setting) -> bool:
        """The batches in flight of ``s`` fit the memory bound."""
        if not self.batch_bytes or not self.max_in_flight_bytes:
            return True
        return s.num_workers * s.prefetch_factor * self.batch_bytes <= self.max_in_flight_bytes


@dataclass(frozen=True)
class Decision:
    """The next setting and the figure that caused it.

    Attributes:
        prefetch_factor: the prefetch factor to use now.
        num_workers: the workers to use from the next epoch.
        reason: what was measured and what changes ("" when nothing does).
        at_limit: waiting, but nothing may change any more (the reason says which limit).
    """

    prefetch_factor: int
    num_workers: int
    reason: str = ""
    at_limit: bool = False

    @property
    def changed(self) -> bool:
        return bool(self.reason) and not self.at_limit


def window_steps(num_workers: int) -> int:
    """Steps per measurement window: two rounds of the workers, at least :data:`MIN_STEPS`.

    Example:
        >>> window_steps(2), window_steps(12)
        (8, 24)
    """
    return max(MIN_STEPS, 2 * num_workers)


def _pooled(windows: Sequence[Window]) -> Window:
    steps = sum(w.steps for w in windows)
    works = [w.work_s for w in windows]
    work = None if any(x is None for x in works) else sum(x for x in works if x is not None)
    return Window(steps, sum(w.wait_s for w in windows), sum(w.step_s for w in windows), work)


def decide(windows: Sequence[Window], current: Setting, limits: Limits) -> Decision:
    """The setting after ``windows`` (measured at ``current``; see the module docstring).

    Args:
        windows: the windows measured since the setting last changed, oldest first.
        current: the setting they were measured at.
        limits: how far the tuner may go.

    Returns:
        A :class:`Decision`: unchanged below the goal or with fewer than :data:`MIN_STEPS`
        steps; else a deeper prefetch now and, when the workers are the bottleneck, more of
        them from the next epoch; ``at_limit`` when nothing may change.

    Example:
        >>> decide([], Setting(4, 2), Limits(max_workers=8)).changed
        False
    """
    n, pf = current.num_workers, current.prefetch_factor
    w = _pooled(windows)
    if w.steps < MIN_STEPS or w.step_s <= 0 or n < 1:
        return Decision(pf, n)
    wait = min(w.wait_share, 0.99)
    if wait <= limits.goal:
        return Decision(pf, n)
    busy = None if w.work_s is None else min(1.0, w.work_s / (n * w.step_s))
    new_pf = max(pf, min(limits.max_prefetch, 2 * pf))  # a tuned factor past the deepest stays
    while new_pf > pf and not limits.fits(Setting(n, new_pf)):
        new_pf -= 1
    saturated = busy is None or busy >= BUSY
    new_n = n
    if saturated or new_pf == pf:
        need = math.ceil(n * (1.0 if busy is None else busy) * (1 + limits.margin) / (1 - wait))
        new_n = max(n, min(limits.max_workers, max(n + 1, need)))
        while new_n > n and not limits.fits(Setting(new_n, new_pf)):
            new_n -= 1
    seen = (f"data wait {wait:.1%} of step time over {w.steps} steps (goal {limits.goal:.0%})"
            + ("" if busy is None else f", workers busy {busy:.0%}"))
    if new_pf == pf and new_n == n:
        why = []
        if n >= limits.max_workers:
            why.append(f"num_workers={n} is what the host has left for workers")
        if pf >= limits.max_prefetch:
            why.append(f"prefetch_factor={pf} is the deepest")
        if n < limits.max_workers or pf < limits.max_prefetch:
            why.append("the batches in flight would pass the memory bound")
        return Decision(pf, n, f"{seen}; at its limits ({'; '.join(why)})", at_limit=True)
    changes = []
    if new_pf != pf:
        changes.append(f"prefetch_factor {pf} -> {new_pf} now")
    if new_n != n:
        changes.append(f"num_workers {n} -> {new_n} from the next epoch")
    return Decision(new_pf, new_n, f"{seen}: {', '.join(changes)}")
