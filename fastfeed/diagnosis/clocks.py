"""The step monitor's clocks and the record of one step, read when its window closes.

A step is stamped four times on the clock of the place the work runs: when the loop asks
for a batch (``wait``), when the batch is in hand (``begin``), when the step is done (``end``)
and, for the gap before the next step, the previous step's ``end``. Collectives add a stamp
at launch and at completion.

- :class:`HostClock`: ``time.perf_counter()``. On the CPU (and for a GPU step that
  synchronises anyway) the host's time is the step's time.
- :class:`CudaClock`: CUDA events recorded on the current stream, never waited for per step:
  a window is read :attr:`CudaClock.lag` steps after its last step, when its events have long
  completed (one ``synchronize`` on an event that is done costs nothing). On the GPU stream
  the gap between one step's end and the next step's start is the time the GPU had nothing
  to do: the data wait as the GPU sees it (a host that waits for data while the GPU still
  works through queued steps costs nothing, and counts nothing).

Example:
    >>> clock = HostClock()
    >>> rec = StepRecord(wait=clock.stamp(), prev_end=None)
    >>> rec.begin = clock.stamp(); rec.end = clock.stamp()
    >>> data, work, blocked, other, span = rec.resolve(clock)
    >>> data >= 0 and work >= 0 and blocked == other == span == 0.0
    True
"""

from __future__ import annotations

import time
from typing import Any

__all__ = ["CudaClock", "HostClock", "StepRecord", "make_clock"]


class HostClock:
    """Host wall time (``time.perf_counter``); windows are read as soon as they end."""

    name = "host"
    lag = 0

    def stamp(self) -> float:
        return time.perf_counter()

    @staticmethod
    def seconds(a: Any, b: Any) -> float:
        return float(b - a)

    def settle(self, stamp: Any) -> None:
        """Nothing to wait for: host stamps are read at once."""

    def flush(self) -> None:
        """Nothing to wait for."""


class CudaClock:
    """CUDA events on the current stream, read :attr:`lag` steps later (no per-step synchronisation)."""

    name = "cuda"
    lag = 2

    def __init__(self) -> None:
        import torch

        self._event = torch.cuda.Event
        self._sync = torch.cuda.synchronize

    def stamp(self) -> Any:
        ev = self._event(enable_timing=True)
        ev.record()
        return ev

    @staticmethod
    def seconds(a: Any, b: Any) -> float:
        return float(a.elapsed_time(b)) / 1e3

    def settle(self, stamp: Any) -> None:
        """Wait for ``stamp`` (lag steps old: done long ago) so that its window can be read."""
        stamp.synchronize()

    def flush(self) -> None:
        """Wait for every recorded event (the report)."""
        self._sync()


def make_clock(kind: str) -> HostClock | CudaClock:
    """``"host"``, ``"cuda"``, or ``"auto"``: CUDA events when CUDA is in use in this process."""
    if kind == "auto":
        import torch

        kind = "cuda" if torch.cuda.is_available() and torch.cuda.is_initialized() else "host"
    return CudaClock() if kind == "cuda" else HostClock()


class StepRecord:
    """The stamps of one step, turned into seconds by :meth:`resolve` when its window closes.

    Attributes:
        wait: the loop asked for the batch (None: the wait was not seen, e.g. in a callback).
        prev_end: the previous step's end, when this step followed it directly (else None).
        begin, end: the batch in hand; the step done.
        data_s: the data wait as the loader measured it (a fastfeed loader's stats), or None.
        async_coll: (launch, done, bytes) of collectives running beside compute (DDP buckets).
        sync_coll: (start, end, bytes) of collectives the step blocked in (``mon.collective()``).
        samples: samples in the batch.
    """

    __slots__ = ("wait", "prev_end", "begin", "end", "data_s", "async_coll", "sync_coll", "samples")

    def __init__(self, wait: Any, prev_end: Any, data_s: float | None = None, samples: int = 0) -> None:
        self.wait, self.prev_end, self.data_s, self.samples = wait, prev_end, data_s, samples
        self.begin: Any = None
        self.end: Any = None
        self.async_coll: list[tuple[Any, Any, int]] = []
        self.sync_coll: list[tuple[Any, Any, int]] = []

    @property
    def coll_bytes(self) -> int:
        return sum(n for *_, n in self.async_coll) + sum(n for *_, n in self.sync_coll)

    def resolve(self, clock: HostClock | CudaClock) -> tuple[float, float, float, float, float]:
        """(data, work, blocked, other, span) in seconds (see :mod:`fastfeed.diagnosis.attribution`)."""
        sec = clock.seconds
        if self.wait is not None:
            data = max(0.0, sec(self.wait, self.begin))
            other = max(0.0, sec(self.prev_end, self.wait)) if self.prev_end is not None else 0.0
        elif self.prev_end is not None:  # between two steps, nothing told the wait from the rest
            gap = max(0.0, sec(self.prev_end, self.begin))
            data = gap if self.data_s is None else min(self.data_s, gap)
            other = gap - data
        else:
            data, other = max(0.0, self.data_s or 0.0), 0.0
        work = max(0.0, sec(self.begin, self.end))
        blocked = span = 0.0
        if self.async_coll:  # blocked: from the last bucket's launch (compute done) to the last completion
            launches = [sec(self.begin, a) for a, _, _ in self.async_coll]
            dones = [sec(self.begin, b) for _, b, _ in self.async_coll]
            blocked = max(0.0, max(dones) - max(launches))
            span = max(0.0, max(dones) - min(launches))
        for a, b, _ in self.sync_coll:
            d = max(0.0, sec(a, b))
            blocked += d
            span += d
        return data, work, min(blocked, work), other, span
