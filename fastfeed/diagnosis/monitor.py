"""``fastfeed.StepMonitor``: where each training step goes, on every rank, while it trains.

A few lines in a plain loop (``torchrun`` or one process)::

    mon = fastfeed.StepMonitor(every=50)        # rank and world size from torch.distributed
    model = mon.watch(ddp_model)                 # times the gradient collectives (a DDP comm hook)
    for batch in mon(dl):                        # any iterable; a fastfeed loader adds its stage times
        loss = model(batch["x"]).mean(); loss.backward(); opt.step(); opt.zero_grad()
    print(mon.report().text())                   # on every rank: the report is collective

What a step is: one batch drawn from ``mon(dl)``, from the moment the loop asks for it to the
moment it asks for the next. Each rank splits its steps into data wait, compute, collective,
wait for the slowest rank, and other (:mod:`fastfeed.diagnosis.attribution`); every ``every``
steps the ranks exchange one small vector (:mod:`fastfeed.diagnosis.exchange`: one
asynchronous all_gather over a gloo group of the monitor's own) and rank 0 logs one line on
the ``fastfeed.monitor`` logger. With gradient accumulation (``accumulation=k``) a step is
still one batch; the ranks synchronise once per ``k`` steps, so the wait for the slowest
rank is computed per ``k`` steps.

What it costs: a few clock reads per step (CUDA events on the GPU, read a few steps later:
no per-step synchronisation), one all_gather of ``~5 x every`` floats every ``every`` steps,
started without waiting for it. Time outside the loop (evaluation between epochs) is no step.

Edge cases, each said in the report's notes rather than hanging: ``torch.distributed`` not
initialised (each process reports alone); a rank whose peers run no monitor (its exchange
gives up after ``timeout``); ranks that run different numbers of steps; the last, partial
window (the report gathers it); a loader without ``len`` (never needed).

Example:
    >>> mon = StepMonitor(every=4)
    >>> for batch in mon(range(10)):
    ...     pass
    >>> r = mon.report()
    >>> r.steps, r.world_size, sorted(r.shares) == sorted(["data", "compute", "collective", "wait", "other"])
    (9, 1, True)
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
from collections import deque
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import numpy as np

from fastfeed._options import path_or_none
from fastfeed.diagnosis.attribution import COLUMNS, StepTimes, attribute
from fastfeed.diagnosis.clocks import CudaClock, HostClock, StepRecord, make_clock
from fastfeed.diagnosis.exchange import Exchange, LocalExchange, pack, unpack
from fastfeed.diagnosis.feed import LoaderProbe, memory_available, to_device
from fastfeed.diagnosis.monitor_report import MonitorReport, WindowSummary, build_report, samples_rate
from fastfeed.errors import ConfigError
from fastfeed.host import cpu_count
from fastfeed.timing.measure import count_samples

__all__ = ["StepMonitor"]

log = logging.getLogger("fastfeed.monitor")
#: The longest ``timeout`` (seconds): a week. The exchange's process group takes it as a
#: ``datetime.timedelta``, which has its own limit far beyond any wait worth waiting.
MAX_TIMEOUT = 7 * 24 * 3600

def _int(name: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(f"StepMonitor({name}={value!r}): must be an integer >= {low}")
    return value


class StepMonitor:
    """Per-rank step attribution during training: the shares, the verdict and the fix.

    Args:
        every: steps per window: the ranks exchange their figures and rank 0 logs one line
            every ``every`` steps (a multiple of ``accumulation``).
        accumulation: batches per optimizer step with gradient accumulation: the ranks
            synchronise once per ``accumulation`` steps.
        timeout: seconds any wait for the other ranks may take: joining the exchange (once, when
            the first window is posted), each window's gather (a rank held up by a checkpoint
            save waits that long), the report; past it the monitor reports what it gathered, or
            this rank alone, and says why.
        jsonl: a JSON-lines file rank 0 writes for dashboards: a header, one line per window,
            the report (the file is started anew by each run).
        clock: ``"auto"`` (CUDA events when this process uses CUDA), ``"host"`` or ``"cuda"``.
        history: the most recent steps the report's verdict covers (every window is kept).

    Example:
        >>> mon = StepMonitor(every=50)                                  # doctest: +SKIP
        >>> model = mon.watch(torch.nn.parallel.DistributedDataParallel(net))   # doctest: +SKIP
        >>> for batch in mon(fastfeed.loader("/data/ff", batch_size=256)):     # doctest: +SKIP
        ...     train_step(model, batch)
        >>> print(mon.report().text())                                   # doctest: +SKIP
    """

    def __init__(self, every: int = 50, *, accumulation: int = 1, timeout: float = 300.0,
                 jsonl: str | os.PathLike[str] | None = None, clock: str = "auto", history: int = 100_000) -> None:
        self.every = _int("every", every, 1)
        self.accumulation = _int("accumulation", accumulation, 1)
        if self.every % self.accumulation:
            up = -(-self.every // self.accumulation) * self.accumulation
            raise ConfigError(f"StepMonitor(every={every}, accumulation={accumulation}): a window must hold whole "
                              f"optimizer steps; use every={up}")
        # compared before float(): an int too large for a float (10**400) is refused, not an OverflowError
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= MAX_TIMEOUT:
            raise ConfigError(f"StepMonitor(timeout={timeout!r}): must be a number of seconds > 0 and at most "
                              f"{MAX_TIMEOUT} (a week)")
        if clock not in ("auto", "host", "cuda"):
            raise ConfigError(f"StepMonitor(clock={clock!r}): use 'auto', 'host' or 'cuda'")
        self.timeout = float(timeout)
        self.jsonl = Path(jsonl) if path_or_none(jsonl, "StepMonitor.jsonl") is not None else None
        self.history = _int("history", history, self.every)
        self._clock_kind = clock
        self._clock: HostClock | CudaClock | None = None
        self._exchange: Exchange | LocalExchange | None = None
        self._probe: LoaderProbe | None = None
        self.watched = False
        self.rank, self.world_size = 0, 1
        self.steps = 0  # steps ended so far
        self._state = "idle"  # idle | waiting | step | between
        self._wait: Any = None
        self._prev_end: Any = None
        self._current: StepRecord | None = None
        self._async: list[tuple[Any, Any, int]] = []  # DDP buckets of the open step (appended by gloo/NCCL threads)
        self._sync: list[tuple[Any, Any, int]] = []
        self._open: list[StepRecord] = []
        self._window_first = 0
        self._windows_posted = 0
        self._closing: deque[tuple[int, int, list[StepRecord], dict[str, float]]] = deque()
        self._gathered: deque[tuple[int, list[dict[str, float]], np.ndarray]] = deque()
        self._unsummarized: list[tuple[int, tuple[int, list[dict[str, float]], np.ndarray]]] = []
        self._own: deque[tuple[int, dict[str, float], np.ndarray]] = deque()  # this rank's windows (the fallback)
        self._own_steps = 0
        self._kept_steps = 0
        self._summaries: list[WindowSummary] = []
        self._notes: list[str] = []
        self._startup_s: float | None = None
        self._started = False

    # ------------------------------------------------------------------ what it watches
    def watch(self, model: Any, *, hook: Callable[..., Any] | None = None, state: Any = None) -> Any:
        """Time ``model``'s gradient collectives; returns the model.

        A :class:`torch.nn.parallel.DistributedDataParallel` model gets a comm hook that runs
        ``hook`` (default: DDP's all-reduce, ``allreduce_hook``) and stamps each bucket's launch and
        completion. Any other model is returned as it is: in one process it has no collectives;
        in a distributed run (FSDP, a hand-written all-reduce) the log says that its collectives
        are not timed (time them with :meth:`collective`).
        """
        from torch.nn.parallel import DistributedDataParallel

        if not isinstance(model, DistributedDataParallel):
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
                log.warning("StepMonitor.watch(%s): only DistributedDataParallel models are timed; the collectives "
                            "of this one count as compute (wrap blocking collectives in `with mon.collective():`)",
                            type(model).__name__)
            return model
        if hook is None:
            from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook as hook
        try:
            model.register_comm_hook(state, self._timed(hook))
        except RuntimeError as e:
            raise ConfigError(f"StepMonitor.watch(): {e}: the model has a comm hook already; call mon.watch(model, "
                              "hook=your_hook, state=your_state) instead of registering it yourself") from None
        self.watched = True
        return model

    def _timed(self, inner: Callable[..., Any]) -> Callable[..., Any]:
        def hook(state: Any, bucket: Any) -> Any:
            clock = self._ensure_clock()
            buf = bucket.buffer()
            launched, nbytes = clock.stamp(), buf.numel() * buf.element_size()
            fut = inner(state, bucket)

            def done(f: Any) -> Any:
                self._async.append((launched, clock.stamp(), nbytes))
                return f.value()

            return fut.then(done)

        import torch
        import torch.distributed as dist

        # DDP checks the hook's annotations against the classes themselves (not their names)
        hook.__annotations__ = {"state": Any, "bucket": dist.GradBucket, "return": torch.futures.Future[torch.Tensor]}
        return hook

    @contextlib.contextmanager
    def collective(self, nbytes: int = 0) -> Iterator[None]:
        """Time a blocking collective of the step: ``with mon.collective(t.numel() * 4): dist.all_reduce(t)``."""
        clock = self._ensure_clock()
        start = clock.stamp()
        try:
            yield
        finally:
            self._sync.append((start, clock.stamp(), int(nbytes)))
            self.watched = True

    def attach(self, loader: Any) -> None:
        """Read the stage times and settings of ``loader`` (``mon(dl)`` does it; callbacks call it)."""
        if self._probe is None or self._probe.loader is not loader:  # the same loader: keep counting (epochs)
            self._probe = LoaderProbe(loader)

    # ------------------------------------------------------------------ the steps
    def __call__(self, iterable: Iterable[Any], *, device: Any = None) -> Iterator[Any]:
        """Yield the batches of ``iterable``, timing each step; with ``device``, move them there (non-blocking)."""
        self.attach(iterable)
        return self._iterate(iterable, device)

    def _iterate(self, iterable: Iterable[Any], device: Any) -> Iterator[Any]:
        try:
            self.begin_wait()
            it = iter(iterable)  # starting workers counts as the first batch's wait
            while True:
                try:
                    batch = next(it)
                except StopIteration:
                    return
                if device is not None:
                    batch = to_device(batch, device)
                self.begin_step(batch)
                yield batch
                self.begin_wait()
        finally:
            self.end_pass()

    def _ensure_clock(self) -> HostClock | CudaClock:
        if self._clock is None:
            self._clock = make_clock(self._clock_kind)
        return self._clock

    def begin_wait(self) -> None:
        """The loop asks for its next batch now (ends a step still open)."""
        if self._state == "step":
            self.end_step()
        self._wait = self._ensure_clock().stamp()
        self._state = "waiting"

    def begin_step(self, batch: Any = None, *, data_s: float | None = None, samples: int | None = None) -> None:
        """The batch is in hand: the data wait ends, the step begins.

        Args:
            batch: the step's batch (its samples are counted), or None.
            data_s: the data wait as the loader measured it, when the monitor did not see the wait
                (a callback between two steps of a framework); a fastfeed loader's stats give it by
                themselves.
            samples: the step's samples, when ``batch`` is not given.
        """
        if self._state == "step":
            self.end_step()
        if not self._started:
            self._start()
        clock = self._ensure_clock()
        if data_s is None and self._state == "between" and self._probe is not None:
            data_s = self._probe.wait_since()
        elif self._probe is not None and self._probe.stats is not None:
            self._probe.wait_since()  # keep its baseline current
        if samples is None:
            try:
                samples = count_samples(batch) if batch is not None else 0
            except (ConfigError, TypeError):
                samples = 0
        rec = StepRecord(self._wait if self._state == "waiting" else None, self._prev_end, data_s, samples)
        self._async.clear()
        rec.begin = clock.stamp()
        self._current, self._state = rec, "step"

    def end_step(self) -> None:
        """The step's work is done (its collectives included)."""
        if self._state != "step" or self._current is None:
            return
        rec, clock = self._current, self._ensure_clock()
        rec.end = clock.stamp()
        rec.async_coll, self._async = self._async, []
        rec.sync_coll, self._sync = self._sync, []
        self._open.append(rec)
        self.steps += 1
        self._prev_end, self._current, self._state = rec.end, None, "between"
        if len(self._open) >= self.every:
            self._close()
        self._advance()

    def end_pass(self) -> None:
        """The loop left its loader (end of an epoch, evaluation): the time until the next batch is no step."""
        if self._state == "step":
            self.end_step()
        self._state, self._wait, self._prev_end = "idle", None, None

    # ------------------------------------------------------------------ windows
    def _start(self) -> None:
        """At the first step: rank and world size."""
        import torch.distributed as dist

        self._started = True
        if dist.is_available() and dist.is_initialized():
            self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        env = os.environ.get("WORLD_SIZE", "1")
        if self.world_size == 1 and env.isdigit() and int(env) > 1:
            self._notes.append(f"torch.distributed is not initialised (WORLD_SIZE={env} is set): each process "
                               "reports on its own steps; call torch.distributed.init_process_group() before the "
                               "first step to see all ranks")

    def _open_exchange(self) -> Exchange | LocalExchange:
        """When the first window is posted (the ranks step together by then): every rank joins the exchange."""
        facts = {"host": socket.gethostname(), "pid": os.getpid(), "cores": cpu_count(),
                 "local_ranks": _local_ranks(), "loader": (self._probe or LoaderProbe(None)).facts()}
        if self.world_size > 1:
            self._exchange = Exchange.open(self.rank, self.world_size, self.timeout, facts)
            if self._exchange.failed:
                self._notes.append(self._exchange.failed)
                self.world_size = 1
        else:
            self._exchange = LocalExchange(facts)
        if self.rank == 0 and self.jsonl is not None:
            self._write({"type": "header", "world_size": self.world_size, "every": self.every,
                         "accumulation": self.accumulation, "ranks": self._exchange.facts}, mode="w")
        return self._exchange

    def _close(self) -> None:
        """End the open window at this step: snapshot the loader now, read the stamps ``lag`` steps later."""
        if not self._open:
            return
        header = {"coll_steps": 0.0, "memory_available": memory_available(), "watched": float(self.watched),
                  **(self._probe.delta() if self._probe is not None else {})}
        self._closing.append((self._windows_posted, self._window_first, self._open, header))
        self._windows_posted += 1
        self._window_first += len(self._open)
        self._open = []

    def _advance(self, flush: bool = False) -> None:
        """Post the windows whose stamps can be read; pick up the gathered ones."""
        clock = self._ensure_clock()
        if flush and self._closing:
            clock.flush()
        while self._closing and (flush or self.steps >= self._closing[0][1] + len(self._closing[0][2]) + clock.lag):
            index, first, records, header = self._closing.popleft()
            clock.settle(records[-1].end)  # lag steps old: done; and the collectives' completions with it
            for done in (d for r in records for _, d, _ in r.async_coll):
                clock.settle(done)
            self._post(index, first, records, header)
        if self._exchange is not None:
            for index, matrix in self._exchange.poll():
                self._gathered_window(index, matrix)

    def _post(self, index: int, first: int, records: list[StepRecord], header: dict[str, float]) -> None:
        clock = self._ensure_clock()
        steps = np.array([r.resolve(clock) for r in records], dtype=np.float64).reshape(-1, len(COLUMNS))
        header.update(window=index, first_step=first, steps=len(records), samples=sum(r.samples for r in records),
                      coll_bytes=sum(r.coll_bytes for r in records),
                      coll_steps=sum(1 for r in records if r.async_coll or r.sync_coll))
        if first == 0:  # the run's first step: start-up (workers, first batch, warm-up), left out
            self._startup_s = header["startup_s"] = float(steps[0, 0])
            steps[0, :] = np.nan
        self._own.append((first, dict(header), steps))
        self._own_steps += len(steps)
        while len(self._own) > 1 and self._own_steps - len(self._own[0][2]) >= self.history:
            self._own_steps -= len(self._own.popleft()[2])
        exchange = self._exchange or self._open_exchange()
        exchange.post(index, pack(header, steps, self.every))

    def _gathered_window(self, index: int, matrix: np.ndarray) -> None:
        headers, cube = unpack(matrix, self.every)
        counts = {int(h["steps"]) for h in headers}
        if len(counts) > 1 or {int(h["window"]) for h in headers} != {index}:
            ran = ", ".join(f"rank {r}: {int(h['steps'])}" for r, h in enumerate(headers))
            self._note(f"window {index}: the ranks ran different numbers of steps ({ran}); steps missing on a "
                       "rank are left out")
        window = (int(headers[0]["first_step"]), headers, cube)
        self._gathered.append(window)
        self._unsummarized.append((index, window))
        self._kept_steps += cube.shape[1]
        if self.rank == 0:  # rank 0 logs each window as it comes; the others summarise at the report
            self._summarize()
        while len(self._gathered) > 1 and self._kept_steps - self._gathered[0][2].shape[1] >= self.history:
            self._summarize()
            self._kept_steps -= self._gathered.popleft()[2].shape[1]

    def _summarize(self) -> None:
        """The :class:`WindowSummary` of every gathered window not summarised yet (rank 0: logged)."""
        for index, (first, headers, cube) in self._unsummarized:
            times = StepTimes.from_cube(cube, first_step=first, accumulation=self.accumulation)
            if times.steps == 0:
                continue
            a = attribute(times, detail=False)
            previous = self._summaries[-1].slowest_rank if self._summaries else None
            summary = WindowSummary(
                index=index, first_step=first, steps=cube.shape[1], step_s=a.step_s,
                samples_per_s=samples_rate(headers, a.seconds.sum(axis=1)), shares=a.shares,
                per_rank=tuple(tuple(float(x) for x in row) for row in a.seconds), slowest_rank=a.slowest_rank,
                same_slowest=None if previous is None else previous == a.slowest_rank)
            self._summaries.append(summary)
            if self.rank == 0:
                log.info("fastfeed monitor: %s", summary.line())
                self._write(summary.to_json())
        self._unsummarized.clear()

    def _note(self, text: str) -> None:
        if text not in self._notes:
            self._notes.append(text)
            log.warning("StepMonitor: %s", text)

    def _write(self, obj: dict[str, Any], mode: str = "a") -> None:
        if self.jsonl is None:
            return
        try:
            self.jsonl.parent.mkdir(parents=True, exist_ok=True)
            with open(self.jsonl, mode, encoding="utf-8") as f:
                f.write(json.dumps(obj, default=float) + "\n")
        except OSError as e:
            self._note(f"{self.jsonl}: cannot write the JSON-lines file ({e}); the monitor goes on without it")
            self.jsonl = None

    # ------------------------------------------------------------------ the report
    def report(self) -> MonitorReport:
        """Gather the last (partial) window and attribute the run; call it on every rank.

        Raises:
            ConfigError: no step was measured yet (the first step, start-up, is left out).
        """
        if self._state == "step":
            self.end_step()
        if self.steps == 0:
            raise ConfigError("StepMonitor.report(): no step was measured: iterate `for batch in mon(loader)` (or "
                              "call begin_step()/end_step()) first")
        self._close()
        self._advance(flush=True)
        if self._exchange is not None:
            for index, matrix in self._exchange.drain():
                self._gathered_window(index, matrix)
            if self._exchange.failed:
                self._note(self._exchange.failed)
        self._summarize()
        report = self._build()
        if self.rank == 0:
            self._write(report.to_json())
        return report

    def _build(self) -> MonitorReport:
        windows = list(self._gathered)
        facts = self._exchange.facts if self._exchange is not None else [{}]
        if not windows or windows[0][2].shape[0] != len(facts):  # nothing gathered from the peers: this rank
            windows = [(first, [h], steps[None]) for first, h, steps in self._own]
            facts = facts[self.rank:self.rank + 1] if len(facts) > self.rank else facts[:1]
        return build_report(windows, facts, summaries=tuple(self._summaries), notes=tuple(self._notes),
                            startup_s=self._startup_s, every=self.every, accumulation=self.accumulation,
                            history=self.history)


def _local_ranks() -> int:
    from fastfeed.dist import local_world_size

    return local_world_size()
