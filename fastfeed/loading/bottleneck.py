"""What the loader's own timings say about the bottleneck.

One classification, used by the periodic stats line (``loader(..., log_every=N)``) and by
``fastfeed doctor``, from figures :class:`~fastfeed.loading.stats.LoaderStats` keeps anyway:

- the **wait fraction**: the share of step time the training loop spent inside ``next()``;
- per batch, the seconds its worker spent **reading** (shard I/O, remote downloads
  included) and **decoding** (decode, crop, augmentation, collation), and its CPU
  seconds, carried back with the batch (:data:`fastfeed.loading.cpu.dataset.TIMING_KEY`).

How a window of steps is classified:

==========================  ====================================================================
``not-input-bound``         the loop waited less than :data:`INPUT_BOUND` (5%) of step time:
                            the training step is the bottleneck
``workers``                 ``num_workers=0``: batches are read and decoded inside the training
                            process, one after the other with the step, so every step waits
``storage``                 the workers are busy (at least :data:`SATURATED`, 75%, of their wall
                            time on batches) and reading takes at least half of it
``decode``                  the workers are busy and decoding takes more than half of it
``transfer``                the loop waits while the workers are idle part of the time: batches
                            are held up between the workers and the loop (hand-off through
                            shared memory, ``pin_memory``, a training process short of CPU)
``input-bound``             the loop waits, and the loader reports no worker timings (DALI)
==========================  ====================================================================

Example:
    >>> p = LoadProfile(wait_fraction=0.3, step_s=10.0, read_s=1.0, decode_s=18.0, cpu_s=18.5,
    ...                 batches=100, num_workers=2)
    >>> d = diagnose(p)
    >>> d.kind, d.text
    ('decode', 'decode-bound (workers busy 95%, 95% of it decoding)')
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

__all__ = ["Diagnosis", "INPUT_BOUND", "LoadProfile", "SATURATED", "diagnose", "line_hook"]

#: Below this wait fraction the loop is not input-bound.
INPUT_BOUND = 0.05
#: Workers spending at least this share of their wall time on batches are saturated.
SATURATED = 0.75


@dataclass(frozen=True)
class LoadProfile:
    """Loader timings over some steps (a stats window, or the difference of two summaries).

    Attributes:
        wait_fraction: share of step time spent waiting for the next batch.
        step_s: the steps' wall time (wait plus the loop's own work).
        read_s: worker seconds spent reading the batches' samples.
        decode_s: worker seconds spent decoding and collating them.
        cpu_s: worker CPU seconds for them.
        batches: batches with timings (0: the loader reports none).
        num_workers: the loader's worker processes (0: the training process loads).
    """

    wait_fraction: float
    step_s: float
    read_s: float
    decode_s: float
    cpu_s: float
    batches: int
    num_workers: int

    @classmethod
    def from_window(cls, window: Mapping[str, Any], num_workers: int) -> "LoadProfile":
        """From :meth:`LoaderStats.window` (or a :meth:`LoaderStats.summary`)."""
        return cls(float(window.get("wait_fraction", 0.0)), float(window.get("step_s", 0.0)),
                   float(window.get("read_s", 0.0)), float(window.get("decode_s", 0.0)),
                   float(window.get("load_cpu_s", 0.0)), int(window.get("load_batches", 0)),
                   int(num_workers))

    @classmethod
    def between(cls, before: Mapping[str, Any], after: Mapping[str, Any], num_workers: int) -> "LoadProfile":
        """The steps between two :meth:`LoaderStats.summary` snapshots."""
        def d(key: str) -> float:
            return float(after.get(key, 0.0)) - float(before.get(key, 0.0))

        step = d("step_s")
        return cls(d("wait_s") / step if step > 0 else 0.0, step, d("read_s"), d("decode_s"),
                   d("load_cpu_s"), int(d("load_batches")), int(num_workers))

    @property
    def load_s(self) -> float:
        """Worker seconds spent on batches (read + decode)."""
        return self.read_s + self.decode_s

    @property
    def busy(self) -> float:
        """Share of the workers' wall time spent on batches (0 workers: of the step time)."""
        capacity = max(1, self.num_workers) * self.step_s
        return min(1.0, self.load_s / capacity) if capacity > 0 else 0.0

    @property
    def read_share(self) -> float:
        """Share of the batch time spent reading (the rest is decoding)."""
        return self.read_s / self.load_s if self.load_s > 0 else 0.0

    @property
    def cpu_share(self) -> float:
        """CPU seconds per wall second on batches (well below 1: waiting on I/O or for a core)."""
        return self.cpu_s / self.load_s if self.load_s > 0 else 0.0

    def to_json(self) -> dict[str, float | int]:
        return {"wait_fraction": self.wait_fraction, "step_s": self.step_s, "read_s": self.read_s,
                "decode_s": self.decode_s, "cpu_s": self.cpu_s, "batches": self.batches,
                "num_workers": self.num_workers, "busy": self.busy, "read_share": self.read_share,
                "cpu_share": self.cpu_share}


@dataclass(frozen=True)
class Diagnosis:
    """The class of a :class:`LoadProfile` (see the module docstring) and a short phrase."""

    kind: str
    text: str


def diagnose(p: LoadProfile) -> Diagnosis:
    """Classify loader timings (see the module docstring).

    Example:
        >>> diagnose(LoadProfile(0.01, 10.0, 1.0, 2.0, 3.0, 50, 4)).kind
        'not-input-bound'
    """
    if p.wait_fraction < INPUT_BOUND:
        return Diagnosis("not-input-bound", "not input-bound")
    if p.batches == 0:
        return Diagnosis("input-bound", "input-bound")
    if p.num_workers == 0:
        return Diagnosis("workers", f"loading in the training process (num_workers=0, "
                                    f"{p.read_share:.0%} of it reading): set num_workers")
    if p.busy < SATURATED:
        return Diagnosis("transfer", f"transfer-bound (workers busy only {p.busy:.0%})")
    if p.read_share >= 0.5:
        return Diagnosis("storage", f"storage-bound (workers busy {p.busy:.0%}, {p.read_share:.0%} of it reading)")
    return Diagnosis("decode", f"decode-bound (workers busy {p.busy:.0%}, {1 - p.read_share:.0%} of it decoding)")


def line_hook(num_workers: int) -> Callable[[dict[str, Any]], str]:
    """A :meth:`LoaderStats.add_line_hook` hook appending the diagnosis of each window.

    Example:
        >>> hook = line_hook(0)
        >>> hook({"wait_fraction": 0.4, "step_s": 1.0, "read_s": 0.1, "decode_s": 0.3, "load_batches": 5})
        'loading in the training process (num_workers=0, 25% of it reading): set num_workers'
    """
    def hook(window: dict[str, Any]) -> str:
        return diagnose(LoadProfile.from_window(window, num_workers)).text

    return hook
