"""The one measuring core: steady-state throughput of anything that yields batches.

``fastfeed tune``, ``fastfeed doctor`` and every script in ``benchmarks/`` measure through
:func:`measure`, so their numbers agree. A measurement has four phases:

1. **start-up**: ``iter(source)`` until the first batch arrives (``startup_s``): worker
   processes start, shards open, the first batch decodes. Reported, never timed.
2. **warm-up**: batches are consumed untimed until every worker has delivered one and
   the prefetch queue has drained to its steady level (and, in the first epoch,
   ``settle`` seconds have passed). Batches that piled up while a late worker started
   arrive in a burst; timing them overstates the rate. Where warm-up ends is found
   from the arrival times themselves (:mod:`fastfeed.timing.steady`: the MSER
   truncation rule, then a check that the rest is stationary); a caller may fix it to
   ``warmup_batches`` instead.
3. **steady state**: batches are timed until ``min_time`` seconds and ``min_batches``
   batches, at least ``min_rounds`` batches per worker, are steady, or ``max_time``
   (the cap on the whole measurement) runs out, or the source runs out.
4. **summary**: the steady batches are cut into contiguous windows (each at least one
   batch per worker, since batches arrive in bursts of ``num_workers``); the reported
   rate is the **median of the windows' rates**, robust to a stray slow batch (a page
   cache miss, another process on the core), and p10/p90 of the windows show the noise.

Epochs. When the source runs out and ``source`` is a callable (for example ``lambda:
iter(loader)``), a new epoch starts. With ``persistent=True`` (a loader whose workers
live across epochs, fastfeed's default) the epochs form one stream: warm-up happens
once and the gap at each epoch boundary is timed like any other, as training would
see it, so a dataset whose epoch is shorter than the warm-up (or than the prefetch
queue) is measured over many epochs instead of as a burst. Without it, every epoch
starts again (start-up, warm-up) and windows never span an epoch boundary.

A measurement that never reached steady state (the throughput was still changing when
``max_time`` ran out, or epochs without persistent workers were too short to warm up)
is returned with ``steady`` False and ``note`` saying why; callers refuse or flag it.

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
from fastfeed.timing.steady import SteadyStart, block_size, find_steady_start, first_candidate

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
        steady: False when steady state was not reached (see ``note``): the rate is
            then the best available (the batches after warm-up, or whole epochs).
        main_memory: peak PSS/RSS bytes of the measuring process, when sampled.
        workers_memory: peak summed PSS/RSS bytes of its children (workers), when sampled.
        note: why the measurement is not steady, or how epochs were handled ("" if plain).
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
    note: str = ""

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
class _Stream:
    """Arrivals of one uninterrupted stream: one epoch, or all epochs with persistent workers."""

    start: float
    settle: float
    times: list[float] = field(default_factory=list)  # arrival time of every batch
    sizes: list[int] = field(default_factory=list)
    verdict: SteadyStart | None = None
    checked: int = 0  # len(times) at the last verdict


#: The share of a measurement's time that memory snapshots may take (see :class:`_Peak`).
MEMORY_SHARE = 0.01


class _Peak:
    """Peak memory over snapshots, sampled at most every ``interval`` seconds, and less often
    when a snapshot is slow: at most :data:`MEMORY_SHARE` of the time goes to sampling.

    A snapshot reads each process's ``/proc/PID/smaps_rollup``, a walk over every page the
    process maps: ~10 ms for two workers that map 1 GB of raw-pixel shards on the 2-core VM,
    and the walks slow the workers they read (benchmarks/RESULTS.md, session 8).
    """

    def __init__(self, enabled: bool, interval: float) -> None:
        self.enabled, self.interval = enabled, interval
        self.main: int | None = None
        self.workers: int | None = None
        self._next = -math.inf

    def sample(self, now: float, force: bool = False) -> None:
        if not self.enabled or (now < self._next and not force):
            return
        t0 = time.perf_counter()
        snap: MemorySnapshot = process_memory()
        self._next = now + max(self.interval, (time.perf_counter() - t0) / MEMORY_SHARE)
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


@dataclass(frozen=True)
class _Rules:
    """How warm-up ends and when a measurement has enough (the arguments of :func:`measure`)."""

    num_workers: int
    warmup: int | None  # fixed warm-up batches, or None to detect steady state
    min_time: float
    need_batches: int  # steady batches at least: min_batches and min_rounds per worker
    deadline: float

    @property
    def every(self) -> int:
        """Batches between two checks: one block when detecting, every batch when fixed."""
        return block_size(self.num_workers) if self.warmup is None else 1

    def verdict(self, s: _Stream, *, fresh: bool = False) -> SteadyStart:
        """Where steady state starts in ``s`` (recomputed once a block has arrived since,
        or with ``fresh`` whenever a batch has)."""
        if s.verdict is not None and self.warmup is not None and s.verdict.index is not None:
            return s.verdict  # a fixed warm-up, once over, stays over
        new = len(s.times) - s.checked
        if s.verdict is not None and (new == 0 or (new < self.every and not fresh)):
            return s.verdict
        if self.warmup is None:
            v = find_steady_start(s.times, s.sizes, num_workers=self.num_workers, settle=s.settle)
        else:
            v = self._fixed(s)
        s.verdict, s.checked = v, len(s.times)
        return v

    def _fixed(self, s: _Stream) -> SteadyStart:
        k = first_candidate(s.times, skip=self.warmup or 1, settle=s.settle)
        if k is None:  # a very slow source gets half the time to warm up
            cap = s.start + (self.deadline - s.start) / 2
            k = next((i + 1 for i, t in enumerate(s.times[:-1]) if t >= cap), None)
        if k is None:
            return SteadyStart(None, False, reason="the source ended during warm-up")
        return SteadyStart(k, True)


def _steady_part(s: _Stream, v: SteadyStart) -> tuple[int, float]:
    """(batches, seconds) from the verdict's start to the last arrival."""
    if v.index is None or v.index >= len(s.times):
        return 0, 0.0
    return len(s.times) - v.index, s.times[-1] - s.times[v.index - 1]


def _enough(streams: list[_Stream], rules: _Rules) -> bool:
    n, secs = 0, 0.0
    for s in streams:
        v = rules.verdict(s)
        if v.steady:
            b, t = _steady_part(s, v)
            n, secs = n + b, secs + t
    return n >= rules.need_batches and secs >= rules.min_time


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
    min_rounds: int = 4,
    max_time: float = 30.0,
    windows: int = 7,
    persistent: bool = False,
    consume: Callable[[Any], None] | None = None,
    sample_memory: bool = False,
    memory_interval: float = 0.5,
    clock: Callable[[], float] = time.perf_counter,
) -> Measurement:
    """Measure the steady-state throughput of ``source`` (see the module docstring).

    Args:
        source: an iterable of batches, or a callable returning one (then epochs restart
            when it runs out).
        samples_of: counts the samples of a batch (default :func:`count_samples`).
        num_workers: the loader's worker processes (sets warm-up, blocks and window size).
        prefetch_factor: the loader's batches in flight per worker (only reported: the
            queue's drain is detected from the arrivals).
        warmup_batches: fix the warm-up to this many batches instead of detecting it.
        settle: minimum seconds of warm-up after the first batch (first stream only).
        min_batches: steady batches to time at least (unless ``max_time`` runs out).
        min_time: steady seconds to time at least (unless ``max_time`` runs out).
        min_rounds: steady batches per worker to time at least (unless ``max_time`` runs out).
        max_time: cap on the whole measurement, start-up and warm-up included.
        windows: how many windows to cut the steady batches into (fewer when short).
        persistent: epochs of a callable source continue one stream (workers that live
            across epochs): one warm-up, epoch boundaries timed.
        consume: called with every batch inside the timed loop (e.g. a copy to the GPU).
        sample_memory: record peak memory of this process and its worker children.
        memory_interval: seconds between memory samples.
        clock: monotonic seconds; injectable for tests.

    Returns:
        A :class:`Measurement`.

    Example:
        >>> m = measure(lambda: iter([[1, 2]] * 100), warmup_batches=1, min_batches=10, min_time=0, settle=0)
        >>> m.batches, m.samples, m.warmup_batches
        (10, 20, 1)
    """
    if min_batches < 1 or max_time <= 0 or windows < 1 or num_workers < 0 or min_rounds < 0:
        raise ConfigError(
            f"measure: min_batches={min_batches}, max_time={max_time}, windows={windows}, "
            f"num_workers={num_workers}, min_rounds={min_rounds} must be >= 1, > 0, >= 1, >= 0, >= 0"
        )
    if warmup_batches is not None and warmup_batches < 0:
        raise ConfigError(f"measure: warmup_batches={warmup_batches} must be >= 0")
    restartable = callable(source) and not hasattr(source, "__iter__")
    peak = _Peak(sample_memory, memory_interval)
    t0 = clock()
    rules = _Rules(num_workers, warmup_batches, min_time,
                   max(min_batches, min_rounds * num_workers), t0 + max_time)
    streams: list[_Stream] = []
    epochs = 0
    while True:
        if not streams or not persistent:
            streams.append(_Stream(clock(), settle if not streams else 0.0))
        before = len(streams[-1].times)
        it = _open(source)
        epochs += 1
        try:
            done = _run_epoch(it, streams, rules, samples_of, consume, peak, clock)
        finally:
            _close(it)
        empty = len(streams[-1].times) == before
        if done or not restartable or empty or clock() >= rules.deadline:
            break  # enough, a plain iterable ended, an epoch was empty, or time is up
    return _summarise(streams, rules, t0, clock(), windows, epochs, persistent, peak)


def _run_epoch(it: Iterator[Any], streams: list[_Stream], rules: _Rules,
               samples_of: Callable[[Any], int], consume: Callable[[Any], None] | None,
               peak: _Peak, clock: Callable[[], float]) -> bool:
    """Consume one epoch into the last stream; True once the measurement has enough (or time is up)."""
    s = streams[-1]
    for batch in it:
        if consume is not None:
            consume(batch)
        now = clock()
        s.times.append(now)
        s.sizes.append(samples_of(batch))
        peak.sample(now, force=len(s.times) == 1)
        if now >= rules.deadline:
            return True
        if len(s.times) - s.checked >= rules.every and _enough(streams, rules):
            return True
    return False


def _windows(s: _Stream, lo: int, size: int) -> list[tuple[int, int, float]]:
    """(samples, batches, seconds) of contiguous windows of ``size`` batches from index ``lo``.

    Each window is timed from the arrival before its first batch; a tail shorter than
    ``size`` joins the window before it.
    """
    n = len(s.times)
    if lo < 1 or lo >= n:
        return []
    bounds = list(range(lo, n, size))
    if len(bounds) > 1 and n - bounds[-1] < size:
        bounds.pop()
    out = []
    for k, a in enumerate(bounds):
        b = bounds[k + 1] if k + 1 < len(bounds) else n
        out.append((sum(s.sizes[a:b]), b - a, s.times[b - 1] - s.times[a - 1]))
    return out


#: Fewest rounds of the workers a steady measurement must contain, whatever was asked.
MIN_STEADY_ROUNDS = 2


def _pick(streams: list[_Stream], rules: _Rules) -> tuple[list[tuple[_Stream, int]], bool, str]:
    """The (stream, first steady index) pairs to time, whether they are steady, and a note."""
    verdicts = [(s, rules.verdict(s, fresh=True)) for s in streams]
    steady = [(s, v.index) for s, v in verdicts if v.steady and v.index is not None]
    if steady:
        n = sum(len(s.times) - i for s, i in steady)
        need = max(1, rules.num_workers * MIN_STEADY_ROUNDS)
        if n >= need:
            return steady, True, ""
        return steady, False, f"only {n} steady batches ({need} needed); measure longer"
    reasons = [v.reason for _, v in verdicts if v.reason]
    guess = [(s, v.index) for s, v in verdicts if v.index is not None and v.index < len(s.times)]
    return guess, False, (reasons[-1] if reasons else "no steady batch")


def _summarise(streams: list[_Stream], rules: _Rules, t0: float, t1: float, windows: int,
               epochs: int, persistent: bool, peak: _Peak) -> Measurement:
    parts, steady, note = _pick(streams, rules)
    burst = max(1, rules.num_workers)
    steady_n = sum(len(s.times) - i for s, i in parts)
    size = burst * max(1, math.ceil(steady_n / windows / burst)) if steady_n else 1  # whole rounds
    wins = [w for s, i in parts for w in _windows(s, i, size) if w[2] > 0]
    times: list[float] = []
    for s, i in parts:
        times += [float(t) for t in np.diff(s.times[i - 1:])]
    samples = sum(sum(s.sizes[i:]) for s, i in parts)
    elapsed = float(sum(times))
    if not wins:  # nothing after warm-up: time whole streams, start-up included
        steady_n, samples, elapsed, times = 0, 0, 0.0, []
        wins = [(sum(s.sizes), len(s.times), s.times[-1] - s.start) for s in streams
                if s.times and s.times[-1] > s.start]
        if not wins:
            log.warning("measure: the source yielded no batch; throughput is 0")
        note = note or "no batch after warm-up: rate of whole epochs, start-up included"
    if persistent and epochs > 1 and steady:
        note = f"{epochs} epochs measured as one stream (persistent workers)"
    rates = [s / t for s, _, t in wins]
    batch_rates = [b / t for _, b, t in wins]
    med = float(np.median(rates)) if rates else 0.0
    first = streams[0].times[0] if streams and streams[0].times else None
    start_idx = {id(s): i for s, i in parts}
    warm_b = sum(start_idx.get(id(s), len(s.times)) for s in streams)
    warm_s = sum(s.times[start_idx.get(id(s), len(s.times)) - 1] - s.start for s in streams if s.times)
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
        startup_s=(first - streams[0].start) if first is not None else t1 - t0,
        warmup_batches=warm_b,
        warmup_s=warm_s,
        epochs=epochs,
        batch_times=tuple(times),
        window_rates=tuple(float(r) for r in rates),
        steady=steady and steady_n > 0,
        main_memory=peak.main,
        workers_memory=peak.workers,
        note=note,
    )
