"""How the benchmarks measure: throughput through :mod:`fastfeed.timing`, CPU, memory, one clock.

- **Throughput** of anything that yields batches goes through
  :func:`fastfeed.timing.measure.measure`, the core ``fastfeed tune`` and ``fastfeed doctor``
  use, so the numbers agree: start-up (workers starting, the first batch) is reported, never
  timed; warm-up runs until every worker has delivered and the prefetch queue has drained to its
  steady level; then steady batches are timed, cut into windows, and the median window rate is
  the figure. :func:`measure_source` adds the CPU seconds per sample of the loader's processes
  (:class:`CpuMeter`); a benchmark repeats it and reports the median of the repeats.
- **One-off durations** (how long ``pack`` took, the time to a first batch, one pass of a fixed
  amount of work) go through :class:`Stopwatch`, the one wall clock of ``benchmarks/`` outside
  :mod:`fastfeed.timing`: wall seconds and this process's CPU seconds of a block.
- **Memory**: :func:`worker_memory` (RSS, PSS, USS of a process and its workers).

Example:
    >>> with Stopwatch() as sw:
    ...     _ = sum(range(1000))
    >>> sw.wall >= 0 and sw.cpu >= 0
    True
"""

from __future__ import annotations

import resource
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Sequence

from fastfeed.timing.measure import Measurement, measure

__all__ = ["CpuMeter", "Measurement", "ProcMemory", "Stopwatch", "children_cpu_seconds", "measure",
           "measure_source", "measurement_from_json", "rusage_cpu_seconds", "tree_cpu_seconds", "worker_memory"]


# ---------------------------------------------------------------------- the clock of one-off durations
class Stopwatch:
    """Wall and CPU seconds of a block: ``with Stopwatch() as sw: ...``, then ``sw.wall``, ``sw.cpu``.

    ``sw.elapsed()`` reads the wall seconds so far (also inside the block, or for a stopwatch
    started with :meth:`start` and never stopped: a run's own clock). The CPU figure is this
    process's (``time.process_time``: all its threads, no child processes).
    """

    def __init__(self) -> None:
        self._t0 = self._c0 = 0.0
        self.wall = self.cpu = 0.0

    @classmethod
    def start(cls) -> Stopwatch:
        """A stopwatch running from now."""
        sw = cls()
        sw.__enter__()
        return sw

    def __enter__(self) -> Stopwatch:
        self._t0, self._c0 = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.wall = time.perf_counter() - self._t0
        self.cpu = time.process_time() - self._c0

    def elapsed(self) -> float:
        """Wall seconds since the start."""
        return time.perf_counter() - self._t0


def rusage_cpu_seconds() -> float:
    """User + system CPU of this process and of its children that have been waited for."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def children_cpu_seconds() -> float:
    """User + system CPU of this process's waited-for children (a subprocess that has ended)."""
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return kids.ru_utime + kids.ru_stime


# ---------------------------------------------------------------------- memory
@dataclass(frozen=True)
class ProcMemory:
    """Memory of one process, bytes (PSS/USS None where /proc does not tell)."""

    pid: int
    rss: int
    pss: int | None
    uss: int | None


def worker_memory(pid: int | None = None) -> tuple[ProcMemory, list[ProcMemory]]:
    """(main process, its child processes) memory via psutil: RSS, PSS and USS.

    RSS counts the pages a forked worker shares copy-on-write with its parent in full;
    PSS shares them out; USS is what the process alone holds.
    """
    import psutil

    def one(p: psutil.Process) -> ProcMemory | None:
        try:
            m = p.memory_full_info()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            return None
        return ProcMemory(p.pid, m.rss, getattr(m, "pss", None), getattr(m, "uss", None))

    proc = psutil.Process(pid)
    main = one(proc)
    if main is None:
        raise RuntimeError(f"process {proc.pid} vanished")
    kids = [m for m in (one(c) for c in proc.children(recursive=True)) if m is not None]
    return main, kids


# ---------------------------------------------------------------------- CPU of a loader
def tree_cpu_seconds(procs: Sequence[Any] | None = None) -> float:
    """User + system CPU seconds of processes (default: this one, its threads included,
    and its live children, found anew)."""
    import psutil

    if procs is None:
        me = psutil.Process()
        procs = [me, *me.children(recursive=True)]
    total = 0.0
    for proc in procs:
        try:
            total += sum(proc.cpu_times()[:2])
        except psutil.NoSuchProcess:
            pass
    return total


@dataclass
class _CpuEpoch:
    start: float  # CPU seconds of the tree when the epoch's iterator was made
    marks: list[tuple[float, int]] = field(default_factory=list)  # (CPU seconds, samples) per batch
    complete: bool = False  # ran to its end (else measure stopped it)


class CpuMeter:
    """CPU seconds the loader's process tree spends per sample in steady state.

    On a machine whose cores are shared with other jobs, wall-clock rates move with their
    load; the CPU time a loader needs per image barely does. :meth:`wrap` wraps each
    epoch's iterator and reads the CPU time of this process (its threads included: FFCV
    decodes in threads) and of its child processes (DataLoader workers) at every batch.

    - Epochs after the first that ran to their end give exact figures: with persistent
      workers no work crosses an epoch boundary, so the CPU from the epoch's start to its
      last batch is the work of its images (the first epoch also holds worker start-up
      and JIT compiles, so it is left out).
    - Otherwise (a measurement shorter than an epoch), the CPU between the arrival of
      batch ``depth`` and the last batch, over the images in between: the prefetch queue
      is full at both ends, so it is the work of that many batches. ``depth`` is the
      batches in flight (workers x prefetch); in an epoch that ran to its end the last
      ``depth`` batches are left out too (the queue drains).
    """

    def __init__(self, depth: int, samples_of: Callable[[Any], int] | None = None) -> None:
        self.depth = max(1, depth)
        self.samples_of = samples_of  # None: fastfeed.timing.measure.count_samples
        self.epochs: list[_CpuEpoch] = []

    def wrap(self, it: Iterable[Any]) -> Iterator[Any]:
        """Iterate ``it`` (one epoch), recording CPU time per batch."""
        import psutil

        from fastfeed.timing.measure import count_samples

        count = self.samples_of or count_samples
        ep = _CpuEpoch(start=tree_cpu_seconds())
        self.epochs.append(ep)
        procs: list[Any] | None = None
        source = iter(it)
        try:
            for batch in source:
                if procs is None:  # the workers are up once the first batch is here
                    me = psutil.Process()
                    procs = [me, *me.children(recursive=True)]
                ep.marks.append((tree_cpu_seconds(procs), count(batch)))
                yield batch
            ep.complete = True
        finally:
            if not ep.complete:  # stopped early: close it as measure would (DataLoader iterators have no close)
                stop = getattr(source, "close", None)
                if callable(stop):
                    stop()

    def cpu_per_image(self) -> float | None:
        """Steady CPU seconds per sample (per what ``samples_of`` counts), or None when no stretch was steady."""
        whole = [e for e in self.epochs[1:] if e.complete and e.marks]
        if whole:
            return sum(e.marks[-1][0] - e.start for e in whole) / sum(n for e in whole for _, n in e.marks)
        cpu, images = 0.0, 0
        for e in self.epochs:
            first = self.depth
            last = len(e.marks) - 1 - (self.depth if e.complete else 0)
            if last - first >= 2:
                cpu += e.marks[last][0] - e.marks[first][0]
                images += sum(n for _, n in e.marks[first + 1:last + 1])
        return cpu / images if images else None


def measure_source(
    make_iter: Callable[[], Iterable[Any]], *, num_workers: int, prefetch_factor: int | None,
    steady_time: float, min_batches: int = 12, max_time: float | None = None,
    samples_of: Callable[[Any], int] | None = None, consume: Callable[[Any], None] | None = None,
    sample_memory: bool = True,
) -> tuple[Measurement, float | None]:
    """Steady-state throughput of a loader through :func:`fastfeed.timing.measure.measure`.

    ``make_iter`` starts one epoch (``lambda: iter(loader)``); epochs restart when one is
    shorter than the measurement. ``steady_time`` is the steady-state time to measure at
    least; start-up (worker start, JIT compiles) and warm-up come on top, up to
    ``max_time`` in all (default ``4 x steady_time + 180`` s). ``samples_of`` counts what a
    batch holds (default: its samples; the text benchmarks count tokens), ``consume`` sees
    every batch. ``sample_memory=False`` leaves out the memory samples: each reads every
    process's ``/proc/PID/smaps_rollup``, whose kernel walk grows with the pages a process has
    mapped and lands in the CPU figure (benchmarks/RESULTS.md, session 8).

    Returns:
        The measurement and the steady CPU seconds per sample (:class:`CpuMeter`).
    """
    pf = prefetch_factor if prefetch_factor is not None else (2 if num_workers else 0)
    meter = CpuMeter(max(1, num_workers * pf), samples_of)  # batches in flight
    extra: dict[str, Any] = {"consume": consume}
    if samples_of is not None:
        extra["samples_of"] = samples_of
    m = measure(lambda: meter.wrap(make_iter()), num_workers=num_workers, **extra,
                prefetch_factor=prefetch_factor, min_batches=min_batches, min_time=steady_time,
                max_time=max_time if max_time is not None else 4 * steady_time + 180,
                sample_memory=sample_memory)
    return m, meter.cpu_per_image()


def measurement_from_json(d: dict[str, Any]) -> Measurement:
    """A :class:`Measurement` back from ``to_json(with_times=True)`` (e.g. from a child process)."""
    fields = {k: v for k, v in d.items() if k in Measurement.__dataclass_fields__}
    fields["batch_times"] = tuple(fields.get("batch_times") or ())
    fields["window_rates"] = tuple(fields.get("window_rates") or ())
    return Measurement(**fields)
