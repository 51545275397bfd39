"""The one measuring core: steady-state throughput of anything that yields batches.

``fastfeed tune``, ``fastfeed doctor`` and every script in ``benchmarks/`` measure through
:func:`measure`, so their numbers agree. A measurement has four phases:

1. **start-up**: ``iter(source)`` until the first batch arrives (``startup_s``): worker
   processes start, shards open, the first batch decodes. Reported, never mixed into
   the rate.
2. **warm-up**: batches are consumed and discarded until the prefetch queue has been
   filled and drained once (``num_workers x prefetch_factor`` batches, the requests a
   DataLoader sends at start) *and*, in the first epoch, ``settle`` seconds have passed
   since the first batch. The first batches arrive in a burst that was produced while
   the consumer was not yet asking; timing them would overstate the rate.
3. **steady state**: every batch's arrival is timed until ``min_time`` and
   ``min_batches`` are reached, and at least ``min_rounds`` batches per worker (workers
   finish batches in bursts; fewer rounds measure the burst, not the rate), or
   ``max_time`` (the cap on the whole measurement) runs out, or the source runs out.
4. **summary**: the steady batches are cut into contiguous windows (each at least one
   batch per worker, since batches arrive in bursts of ``num_workers``); the reported
   rate is the **median of the windows' rates**, robust to a stray slow batch (a page
   cache miss, another process on the core), and p10/p90 of the windows show the noise.

When the source runs out and ``source`` is a callable (for example ``lambda:
iter(loader)``), a new epoch starts and goes through start-up and warm-up again
(shortened to half an epoch when epochs are shorter than twice the warm-up); windows
never span an epoch boundary. When no steady batch could be timed at all
(every epoch shorter than the warm-up), the rate falls back to whole-epoch timing and
``steady`` is False.

The clock is injectable, so the logic is tested with a fake clock.

Example:
    >>> import time
    >>> def batches():
    ...     for _ in range(200):
    ...         time.sleep(0.001)
    ...         yield list(range(32))
    >>> m = measure(batches, min_batches=50, min_time=0.05, settle=0.0)
    >>> m.batches >= 50 and 0 < m.samples_per_s < 32_000
    True
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterable, Iterator

import numpy as np

from fastfeed.errors import ConfigError
from fastfeed.host import MemorySnapshot, process_memory

__all__ = ["Measurement", "count_samples", "measure"]

log = logging.getLogger(__name__)

Source = Iterable[Any] | Callable[[], Iterable[Any]]


def count_samples(batch: Any) -> int:
    """Number of samples in a batch, the way fastfeed and PyTorch batch them.

    A dict counts its ``"__key__"`` list, else its first sized value; a tensor or array
    counts its first dimension; a tuple/list of tensors (``(images, labels)``) counts
    its first element; any other sequence counts its length.

    Example:
        >>> count_samples({"__key__": ["a", "b"], "image": None}), count_samples([0, 1, 2])
        (2, 3)
    """
    if isinstance(batch, dict):
        if "__key__" in batch:
            return len(batch["__key__"])
        for value in batch.values():
            if hasattr(value, "shape") or isinstance(value, (list, tuple)):
                return count_samples(value)
        raise ConfigError("cannot count the samples of a batch dict without sized values; pass samples_of=")
    shape = getattr(batch, "shape", None)
    if shape is not None and len(shape) > 0:
        return int(shape[0])
    if isinstance(batch, (list, tuple)):
        if batch and (hasattr(batch[0], "shape") or isinstance(batch[0], (list, tuple))):
            return count_samples(batch[0])
        return len(batch)
    raise ConfigError(f"cannot count the samples of a {type(batch).__name__} batch; pass samples_of=")


@dataclass(frozen=True)
class Measurement:
    """What :func:`measure` found. Rates are steady-state unless ``steady`` is False.

    Attributes:
        samples_per_s: median over windows of samples/s.
        batches_per_s: median over windows of batches/s.
        p10_samples_per_s: 10th percentile of the windows' rates (the slow end).
        p90_samples_per_s: 90th percentile of the windows' rates.
        mean_samples_per_s: all steady samples over all steady time.
        batches: steady batches timed.
        samples: steady samples timed.
        elapsed: steady seconds timed.
        total_s: wall time of the whole measurement, start-up and warm-up included.
        startup_s: seconds from ``iter()`` to the first batch (first epoch).
        warmup_batches: batches discarded by warm-up (all epochs).
        warmup_s: seconds spent in warm-up (all epochs).
        epochs: iterations of the source that were started.
        batch_times: seconds between consecutive steady batches.
        window_rates: samples/s of each window.
        steady: False when no steady batch could be timed (rate from whole epochs).
        main_memory: peak PSS/RSS bytes of the measuring process, when sampled.
        workers_memory: peak summed PSS/RSS bytes of its children (workers), when sampled.
    """

    samples_per_s: float
    batches_per_s: float
    p10_samples_per_s: float
    p90_samples_per_s: float
    mean_samples_per_s: float
    batches: int
    samples: int
    elapsed: float
    total_s: float
    startup_s: float
    warmup_batches: int
    warmup_s: float
    epochs: int
    batch_times: tuple[float, ...] = field(repr=False)
    window_rates: tuple[float, ...] = field(repr=False)
    steady: bool = True
    main_memory: int | None = None
    workers_memory: int | None = None

    @property
    def noise(self) -> float:
        """Relative spread of the windows: (p90 - p10) / median, 0 when unknown."""
        if self.samples_per_s <= 0:
            return 0.0
        return (self.p90_samples_per_s - self.p10_samples_per_s) / self.samples_per_s

    @property
    def median_batch_s(self) -> float:
        """Median seconds between steady batches (NaN when none)."""
        return float(np.median(self.batch_times)) if self.batch_times else math.nan

    def batch_time_percentile(self, q: float) -> float:
        """The ``q``-th percentile (0..100) of the steady batch times (NaN when none)."""
        return float(np.percentile(self.batch_times, q)) if self.batch_times else math.nan

    @property
    def memory_bytes(self) -> int | None:
        """Peak main + workers memory, when sampled."""
        if self.main_memory is None:
            return None
        return self.main_memory + (self.workers_memory or 0)

    def to_json(self, *, with_times: bool = False) -> dict[str, Any]:
        """A JSON-ready dict (per-batch times only when ``with_times``)."""
        d = asdict(self)
        d["batch_times"] = list(self.batch_times) if with_times else None
        d["window_rates"] = list(self.window_rates)
        d["noise"] = self.noise
        return d


# ---------------------------------------------------------------------- the run
@dataclass
class _Epoch:
    """Timings of one iteration of the source."""

    start: float
    first: float | None = None
    warm_end: float | None = None
    warm_batches: int = 0
    times: list[float] = field(default_factory=list)  # arrival time of each steady batch
    sizes: list[int] = field(default_factory=list)
    all_batches: int = 0
    all_samples: int = 0
    last: float | None = None


class _Peak:
    """Peak memory over snapshots, sampled at most every ``interval`` seconds."""

    def __init__(self, enabled: bool, interval: float) -> None:
        self.enabled, self.interval = enabled, interval
        self.main: int | None = None
        self.workers: int | None = None
        self._next = -math.inf

    def sample(self, now: float, force: bool = False) -> None:
        if not self.enabled or (now < self._next and not force):
            return
        self._next = now + self.interval
        snap: MemorySnapshot = process_memory()
        if snap.main_bytes is not None:
            self.main = max(self.main or 0, snap.main_bytes)
            self.workers = max(self.workers or 0, snap.workers_bytes or 0)


def _open(source: Source) -> Iterator[Any]:
    it = source() if callable(source) and not hasattr(source, "__iter__") else source
    return iter(it)


def _close(it: Iterator[Any]) -> None:
    """Stop a generator now. A DataLoader iterator is left alone: without persistent
    workers it shuts them down when dropped; with them, the loader reuses them."""
    stop = getattr(it, "close", None)
    if callable(stop):
        stop()


def measure(
    source: Source,
    *,
    samples_of: Callable[[Any], int] = count_samples,
    num_workers: int = 0,
    prefetch_factor: int | None = None,
    warmup_batches: int | None = None,
    settle: float = 0.25,
    min_batches: int = 20,
    min_time: float = 1.0,
    min_rounds: int = 2,
    max_time: float = 30.0,
    windows: int = 7,
    consume: Callable[[Any], None] | None = None,
    sample_memory: bool = False,
    memory_interval: float = 0.5,
    clock: Callable[[], float] = time.perf_counter,
) -> Measurement:
    """Measure the steady-state throughput of ``source`` (see the module docstring).

    Args:
        source: an iterable of batches, or a callable returning one (then epochs restart
            when it runs out, each with its own start-up and warm-up).
        samples_of: counts the samples of a batch (default :func:`count_samples`).
        num_workers: the loader's worker processes (sets warm-up and window size).
        prefetch_factor: the loader's batches in flight per worker (default 2 with workers).
        warmup_batches: batches to discard; default ``num_workers x prefetch_factor`` (at least 1).
        settle: minimum seconds of warm-up after the first batch (first epoch only).
        min_batches: steady batches to time at least (unless ``max_time`` runs out).
        min_time: steady seconds to time at least (unless ``max_time`` runs out).
        min_rounds: steady batches per worker to time at least (unless ``max_time`` runs out).
        max_time: cap on the whole measurement, start-up and warm-up included.
        windows: how many windows to cut the steady batches into (fewer when short).
        consume: called with every batch inside the timed loop (e.g. a copy to the GPU).
        sample_memory: record peak memory of this process and its worker children.
        memory_interval: seconds between memory samples.
        clock: monotonic seconds; injectable for tests.

    Returns:
        A :class:`Measurement`.

    Example:
        >>> m = measure(lambda: iter([[1, 2]] * 100), min_batches=10, min_time=0, settle=0)
        >>> m.batches, m.samples, m.warmup_batches
        (10, 20, 1)
    """
    if min_batches < 1 or max_time <= 0 or windows < 1 or num_workers < 0:
        raise ConfigError(
            f"measure: min_batches={min_batches}, max_time={max_time}, windows={windows}, "
            f"num_workers={num_workers} must be >= 1, > 0, >= 1, >= 0"
        )
    pf = prefetch_factor if prefetch_factor is not None else (2 if num_workers else 0)
    warm_n = warmup_batches if warmup_batches is not None else max(1, num_workers * pf)
    restartable = callable(source) and not hasattr(source, "__iter__")
    peak = _Peak(sample_memory, memory_interval)
    epochs: list[_Epoch] = []
    t0 = clock()
    deadline = t0 + max_time
    done = False
    while not done:
        ep = _Epoch(start=clock())
        epochs.append(ep)
        it = _open(source)
        try:
            # an epoch too short for the warm-up keeps half of itself for timing
            prev = epochs[-2].all_batches if len(epochs) > 1 else None
            warm = warm_n if prev is None or prev >= 2 * warm_n else max(1, prev // 2)
            done = _run_epoch(it, ep, samples_of, consume, warm, settle,
                              max(min_batches, min_rounds * num_workers), min_time, deadline,
                              epochs, peak, clock)
        finally:
            _close(it)
        if not done and (not restartable or ep.all_batches == 0 or clock() >= deadline):
            break  # a plain iterable ended, an epoch was empty, or time is up
    return _summarise(epochs, t0, clock(), windows, max(1, num_workers), peak)


def _run_epoch(
    it: Iterator[Any], ep: _Epoch, samples_of: Callable[[Any], int],
    consume: Callable[[Any], None] | None, warm_n: int, settle: float, min_batches: int,
    min_time: float, deadline: float, epochs: list[_Epoch], peak: _Peak,
    clock: Callable[[], float],
) -> bool:
    """Consume one epoch; True once the whole measurement has enough (or time is up)."""
    warm_cap = ep.start + (deadline - ep.start) / 2
    for batch in it:
        if consume is not None:
            consume(batch)
        now = clock()
        n = samples_of(batch)
        ep.all_batches += 1
        ep.all_samples += n
        ep.last = now
        if ep.first is None:
            ep.first = now
        if ep.warm_end is None:
            ep.warm_batches += 1
            settled = now - ep.first >= settle or len(epochs) > 1  # later epochs: refill only
            warmed = ep.warm_batches >= warm_n and settled
            if warmed or now >= warm_cap:  # a very slow source gets half the time to warm up
                ep.warm_end = now
                peak.sample(now, force=True)  # the prefetch queue is as full as it gets
        else:
            ep.times.append(now)
            ep.sizes.append(n)
            peak.sample(now)
            steady_n = sum(len(e.times) for e in epochs)
            steady_t = sum(e.times[-1] - e.warm_end for e in epochs if e.times and e.warm_end)
            if steady_n >= min_batches and steady_t >= min_time:
                return True
        if now >= deadline:
            return True
    return False


def _windows(ep: _Epoch, size: int) -> list[tuple[int, int, float]]:
    """(samples, batches, seconds) of contiguous windows of ``size`` steady batches.

    The first window starts at the end of warm-up; a tail shorter than ``size`` joins
    the window before it.
    """
    if ep.warm_end is None or not ep.times:
        return []
    bounds = list(range(0, len(ep.times), size))
    if len(bounds) > 1 and len(ep.times) - bounds[-1] < size:
        bounds.pop()
    out = []
    for k, lo in enumerate(bounds):
        hi = bounds[k + 1] if k + 1 < len(bounds) else len(ep.times)
        begin = ep.warm_end if lo == 0 else ep.times[lo - 1]
        out.append((sum(ep.sizes[lo:hi]), hi - lo, ep.times[hi - 1] - begin))
    return out


def _summarise(
    epochs: list[_Epoch], t0: float, t1: float, windows: int, burst: int, peak: _Peak
) -> Measurement:
    steady_n = sum(len(e.times) for e in epochs)
    size = max(burst, math.ceil(steady_n / windows)) if steady_n else 1
    wins = [w for e in epochs for w in _windows(e, size) if w[2] > 0]
    times: list[float] = []
    for e in epochs:
        if e.warm_end is not None and e.times:
            times += [float(t) for t in np.diff([e.warm_end, *e.times])]
    samples = sum(sum(e.sizes) for e in epochs)
    elapsed = float(sum(times))
    if not wins:  # every epoch ended inside warm-up: time whole epochs, start-up included
        wins = [(e.all_samples, e.all_batches, e.last - e.start) for e in epochs
                if e.last is not None and e.last > e.start]
        if not wins:
            log.warning("measure: the source yielded no batch; throughput is 0")
    rates = [s / t for s, _, t in wins]
    batch_rates = [b / t for _, b, t in wins]
    med = float(np.median(rates)) if rates else 0.0
    first = epochs[0].first
    return Measurement(
        samples_per_s=med,
        batches_per_s=float(np.median(batch_rates)) if batch_rates else 0.0,
        p10_samples_per_s=float(np.percentile(rates, 10)) if rates else 0.0,
        p90_samples_per_s=float(np.percentile(rates, 90)) if rates else 0.0,
        mean_samples_per_s=samples / elapsed if elapsed > 0 else med,
        batches=steady_n,
        samples=samples,
        elapsed=elapsed,
        total_s=t1 - t0,
        startup_s=(first - epochs[0].start) if first is not None else t1 - t0,
        warmup_batches=sum(e.warm_batches for e in epochs),
        warmup_s=sum((e.warm_end or e.last or e.start) - e.start for e in epochs),
        epochs=len(epochs),
        batch_times=tuple(times),
        window_rates=tuple(float(r) for r in rates),
        steady=steady_n > 0,
        main_memory=peak.main,
        workers_memory=peak.workers,
    )
