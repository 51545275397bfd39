"""Always-on loader statistics: how long the training loop waited for data.

A step is one batch handed to the training loop. For each step the loader records the
time spent inside ``next()`` (the *wait*: the loop had nothing to do) and the time since
the previous batch was handed out (the *step time*: wait plus the loop's own work).
From these come the wait fraction (wait / step time; near 0 means data is not the
bottleneck), samples/s, and the number of samples skipped with ``on_error="skip"``
(counted in the workers and sent back with each batch). Where the loader reports it
(:meth:`LoaderStats.record_work`), the time the workers spent reading and decoding each
batch is summed too, which tells storage-bound from decode-bound
(:mod:`fastfeed.loading.bottleneck`).

The cost is two ``time.perf_counter()`` calls and a few additions per batch. The first
batch of every pass is timed apart (``first_batch_s``: worker start-up and prefetch)
and left out of the steady-state figures.

Periodic logging is off by default; ``log_every=N`` logs one line every N steps on the
``fastfeed.loader`` logger (INFO). Other modules can append text to that line with
:meth:`LoaderStats.add_line_hook` (for example a diagnosis of the bottleneck).

Example:
    >>> stats = LoaderStats()
    >>> for batch_size in stats.track(iter([4, 4, 4]), lambda b: b):
    ...     pass
    >>> s = stats.summary()
    >>> s["steps"], s["samples"], s["skipped"]
    (3, 12, 0)
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Any, Callable, Iterator, TypeVar

import numpy as np

from fastfeed.errors import ConfigError

__all__ = ["LoaderStats"]

log = logging.getLogger("fastfeed.loader")

T = TypeVar("T")

#: A line hook gets a window summary (see :meth:`LoaderStats.window`) and returns text
#: to append to the periodic log line, or None.
LineHook = Callable[[dict[str, Any]], "str | None"]


class LoaderStats:
    """Per-step wait times, throughput and skipped samples of a loader.

    Args:
        log_every: log one line every this many steps (None or 0: never).
        recent: how many recent step waits to keep for percentiles.
        clock: the time source (seconds).

    Attributes:
        steps: batches handed to the training loop since the last :meth:`reset`.
        samples: samples in those batches.
        skipped: samples skipped because of ``on_error="skip"``.
        skip_messages: the first few skip reasons (shard, key, offset, error).
    """

    def __init__(self, *, log_every: int | None = None, recent: int = 1024,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        if log_every is not None and (isinstance(log_every, bool) or not isinstance(log_every, int) or log_every < 0):
            raise ConfigError(f"log_every={log_every!r} must be None or an integer >= 0")
        self.log_every = int(log_every or 0)
        self.clock = clock
        self._hooks: list[LineHook] = []
        self._recent_len = recent
        self.reset()

    def reset(self) -> None:
        """Forget everything recorded so far."""
        self.steps = 0
        self.samples = 0
        self.skipped = 0
        self.skip_messages: list[str] = []
        self.first_batch_s = 0.0
        self.passes = 0
        self._wait = 0.0
        self._busy = 0.0  # steady-state step time (first batch of each pass excluded)
        self._steady_samples = 0
        self._recent: deque[float] = deque(maxlen=self._recent_len)
        self._last_out: float | None = None
        self._pass_start = self.clock()
        self._load = (0.0, 0.0, 0.0, 0)  # steady read s, decode s, CPU s, batches (record_work)
        self._pending: tuple[float, float, float] | None = None
        self._mark = (0, 0.0, 0.0, 0, 0, self._load)  # steps, wait, busy, samples, skipped, load at last log

    # ------------------------------------------------------------------ recording
    def begin_pass(self) -> None:
        """Call when a new pass over the data starts (``iter(loader)``)."""
        self.passes += 1
        self._last_out = None
        self._pass_start = self.clock()

    def record(self, wait_s: float, now: float, samples: int, skipped: int = 0,
               messages: list[str] | None = None) -> None:
        """Record one step: ``wait_s`` in ``next()``, the batch handed out at ``now``."""
        work, self._pending = self._pending, None
        self.steps += 1
        self.samples += samples
        if skipped:
            self._record_skips(skipped, messages or [])
        if self._last_out is None:
            self.first_batch_s = now - self._pass_start
        else:
            self._wait += wait_s
            self._busy += now - self._last_out
            self._steady_samples += samples
            self._recent.append(wait_s)
            if work is not None:
                r, d, c, n = self._load
                self._load = (r + work[0], d + work[1], c + work[2], n + 1)
        self._last_out = now
        if self.log_every and self.steps % self.log_every == 0:
            self._log_line()

    def record_work(self, read_s: float, decode_s: float, cpu_s: float) -> None:
        """The cost of the batch the next :meth:`record` counts: its worker's read, decode, CPU seconds."""
        self._pending = (float(read_s), float(decode_s), float(cpu_s))

    def _record_skips(self, skipped: int, messages: list[str]) -> None:
        if self.skipped == 0 and messages:
            log.warning(
                "skipped a sample: %s (on_error='skip'; further skips are only counted in "
                "loader.stats)", messages[0],
            )
        self.skipped += skipped
        room = 20 - len(self.skip_messages)
        if room > 0:
            self.skip_messages.extend(messages[:room])

    def track(self, it: Iterator[T], size_of: Callable[[T], int],
              skipped_of: Callable[[T], tuple[int, list[str]]] | None = None) -> Iterator[T]:
        """Wrap a batch iterator, timing each ``next()``; yields the same batches."""
        self.begin_pass()
        clock = self.clock
        while True:
            t0 = clock()
            try:
                batch = next(it)
            except StopIteration:
                return
            t1 = clock()
            skipped, messages = skipped_of(batch) if skipped_of is not None else (0, None)
            self.record(t1 - t0, t1, size_of(batch), skipped, messages)
            yield batch

    # ------------------------------------------------------------------ reporting
    @property
    def wait_fraction(self) -> float:
        """Share of steady-state step time spent waiting for data (0..1)."""
        return self._wait / self._busy if self._busy > 0 else 0.0

    @property
    def samples_per_s(self) -> float:
        """Steady-state samples per second seen by the training loop."""
        return self._steady_samples / self._busy if self._busy > 0 else 0.0

    def summary(self) -> dict[str, Any]:
        """All figures since the last :meth:`reset`, as a plain dict.

        Keys: ``steps``, ``samples``, ``skipped``, ``passes``, ``first_batch_s``,
        ``wait_s``, ``step_s`` (steady-state totals), ``wait_fraction``,
        ``samples_per_s``, ``mean_wait_ms``, ``p50_wait_ms``, ``p95_wait_ms`` (over the
        last ``recent`` steps), and where the loader reports them (:meth:`record_work`)
        ``read_s``, ``decode_s``, ``load_cpu_s``: steady-state seconds the workers spent
        reading and decoding, and their CPU seconds, over ``load_batches`` batches.
        """
        steady = max(1, len(self._recent))
        recent = np.fromiter(self._recent, dtype=np.float64) if self._recent else np.zeros(1)
        return {
            "steps": self.steps,
            "samples": self.samples,
            "skipped": self.skipped,
            "passes": self.passes,
            "first_batch_s": round(self.first_batch_s, 6),
            "wait_s": round(self._wait, 6),
            "step_s": round(self._busy, 6),
            "wait_fraction": round(self.wait_fraction, 4),
            "samples_per_s": round(self.samples_per_s, 2),
            "mean_wait_ms": round(float(recent.sum()) / steady * 1e3, 3),
            "p50_wait_ms": round(float(np.percentile(recent, 50)) * 1e3, 3),
            "p95_wait_ms": round(float(np.percentile(recent, 95)) * 1e3, 3),
            "read_s": round(self._load[0], 6),
            "decode_s": round(self._load[1], 6),
            "load_cpu_s": round(self._load[2], 6),
            "load_batches": self._load[3],
        }

    def window(self) -> dict[str, Any]:
        """Figures since the previous periodic log line (or since the start)."""
        steps0, wait0, busy0, samples0, skipped0, load0 = self._mark
        busy = self._busy - busy0
        wait = self._wait - wait0
        load = [a - b for a, b in zip(self._load, load0)]
        return {
            "steps": self.steps - steps0,
            "last_step": self.steps,
            "wait_s": wait,
            "step_s": busy,
            "wait_fraction": wait / busy if busy > 0 else 0.0,
            "samples_per_s": (self._steady_samples - samples0) / busy if busy > 0 else 0.0,
            "skipped": self.skipped - skipped0,
            "read_s": load[0],
            "decode_s": load[1],
            "load_cpu_s": load[2],
            "load_batches": int(load[3]),
        }

    def add_line_hook(self, hook: LineHook) -> None:
        """Append ``hook(window)``'s text to every periodic log line."""
        self._hooks.append(hook)

    def line(self, window: dict[str, Any]) -> str:
        """The periodic one-line report for a window (see :meth:`window`)."""
        text = (
            f"step {window['last_step']}: {window['samples_per_s']:.0f} samples/s, "
            f"waited {window['wait_fraction']:.0%} of step time, "
            f"{window['skipped']} skipped"
        )
        extra = [t for t in (h(window) for h in self._hooks) if t]
        return "; ".join([text, *extra])

    def _log_line(self) -> None:
        log.info("%s", self.line(self.window()))
        self._mark = (self.steps, self._wait, self._busy, self._steady_samples, self.skipped, self._load)

    def __repr__(self) -> str:
        s = self.summary()
        return (
            f"LoaderStats(steps={s['steps']}, samples={s['samples']}, skipped={s['skipped']}, "
            f"samples_per_s={s['samples_per_s']}, wait_fraction={s['wait_fraction']})"
        )
