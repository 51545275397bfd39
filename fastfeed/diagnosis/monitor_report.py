"""What :class:`fastfeed.StepMonitor` found: the verdict, the shares, the timeline; as text, JSON and HTML.

- :class:`WindowSummary`: one window of ``every`` steps over all ranks (what rank 0 logs, one
  line, and writes to the JSON-lines file);
- :class:`Timeline`: each rank's seconds per step in the five categories, binned over the run;
- :class:`MonitorReport`: the result of ``mon.report()``. :meth:`MonitorReport.html` is one
  self-contained page (inline SVG and CSS, nothing fetched): the verdict and its fix first,
  then where the step went on each rank, then the per-rank stacked timeline.

Example:
    >>> report = mon.report()                    # doctest: +SKIP
    >>> print(report.text())                     # doctest: +SKIP
    >>> report.verdict, report.shares["data"]    # doctest: +SKIP
    ('input-bound', 0.42)
    >>> report.html("monitor.html")              # doctest: +SKIP
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fastfeed.diagnosis.advice import LoaderFacts, RunFacts, decide
from fastfeed.diagnosis.attribution import StepTimes, attribute, split, stable_share
from fastfeed.diagnosis.monitor_page import bandwidth, page
from fastfeed.diagnosis.vocabulary import CATEGORIES, pct
from fastfeed.errors import ConfigError

__all__ = ["MonitorReport", "Timeline", "WindowSummary", "build_report", "samples_rate", "timeline"]

#: The wait for the slowest rank from which the text and the page point at it.
MARK_WAIT = 0.05

def shares_line(shares: dict[str, float]) -> str:
    """``data 4%, compute 71%, ...`` in :data:`CATEGORIES` order."""
    return ", ".join(f"{c} {pct(shares.get(c, 0.0))}" for c in CATEGORIES)


@dataclass(frozen=True)
class WindowSummary:
    """One window of steps over all ranks.

    Attributes:
        index: the window's number (0 first).
        first_step, steps: the run's index of its first step, and how many it holds.
        step_s: mean seconds per step (over ranks).
        samples_per_s: samples per second over all ranks (None: not counted).
        shares: each category's share of step time, over all ranks.
        per_rank: each rank's seconds in each category, in :data:`CATEGORIES` order.
        slowest_rank: the rank the others waited for most.
        same_slowest: whether it was the slowest of the previous window too (None: first window).
    """

    index: int
    first_step: int
    steps: int
    step_s: float
    samples_per_s: float | None
    shares: dict[str, float]
    per_rank: tuple[tuple[float, ...], ...]
    slowest_rank: int
    same_slowest: bool | None

    def line(self) -> str:
        """The log line of rank 0."""
        rate = f"{self.samples_per_s:,.0f} samples/s, " if self.samples_per_s else ""
        same = {None: "", True: " (the same as in the last window)", False: " (another than in the last window)"}
        ranks = len(self.per_rank)
        slowest = f"; slowest rank {self.slowest_rank}{same[self.same_slowest]}" if ranks > 1 else ""
        return (f"steps {self.first_step + 1}-{self.first_step + self.steps} on {ranks} rank(s): {rate}"
                f"{self.step_s * 1e3:,.1f} ms/step; {shares_line(self.shares)}{slowest}")

    def to_json(self) -> dict[str, Any]:
        return {"type": "window", "index": self.index, "first_step": self.first_step, "steps": self.steps,
                "step_s": self.step_s, "samples_per_s": self.samples_per_s, "shares": self.shares,
                "per_rank_seconds": [dict(zip(CATEGORIES, r)) for r in self.per_rank],
                "slowest_rank": self.slowest_rank,
                "same_slowest": self.same_slowest}


@dataclass(frozen=True)
class Timeline:
    """Each rank's mean seconds per step in each category, over bins of consecutive steps.

    Attributes:
        starts, ends: the run's first and last step of each bin.
        seconds: ranks x bins x categories (:data:`CATEGORIES` order), seconds per step.
    """

    starts: tuple[int, ...]
    ends: tuple[int, ...]
    seconds: tuple[tuple[tuple[float, ...], ...], ...]

    def to_json(self) -> dict[str, Any]:
        return {"starts": list(self.starts), "ends": list(self.ends), "categories": list(CATEGORIES),
                "seconds": [[list(b) for b in r] for r in self.seconds]}


@dataclass(frozen=True)
class MonitorReport:
    """The result of :meth:`fastfeed.StepMonitor.report`: where the steps went, the verdict and the fix.

    Attributes:
        verdict: ``"input-bound"``, ``"imbalanced"``, ``"straggler"``, ``"communication-bound"``
            or ``"compute-bound"``.
        title: the verdict in one line, with its figure.
        why: the figures behind it.
        fix: the concrete action and the figure that justifies it.
        shares: each category's share of step time (``data``, ``compute``, ``collective``,
            ``wait``, ``other``), over all ranks; they add up to 1.
        per_rank: the same for each rank.
        slowest_rank: the rank the others waited for most.
        slowest_host: the host of ``slowest_rank``.
        slowest_same: whether it was also the slowest of the window before the last (None:
            one window).
        stage: the limiting input stage (``storage``, ``decode``, ``workers``, ``transfer``,
            ``input-bound``: the doctor's names) when input-bound with a fastfeed loader.
        headroom: how much faster the input pipeline could deliver (compute-bound).
        bus_gb_s: achieved bus bandwidth of the gradient all-reduce, GB/s (timed collectives).
        signals: scheduling signals (periodic long steps, CPU oversubscription, memory pressure).
        notes: what limits these figures (collectives not timed, a rank that did not answer, ...).
        steps: steps attributed (the first one, start-up, is left out).
        world_size: the ranks.
        hosts: the host of each rank.
        step_s: mean seconds per step.
        samples_per_s: samples per second over all ranks (None: not counted).
        startup_s: the first step's wait for its batch.
        every: the monitor's steps per window.
        accumulation: the monitor's batches per optimizer step.
        watched: whether collectives were timed (``StepMonitor.watch``).
        windows: every window gathered, in order.
        timeline: the per-rank stacked timeline.
        figures: the attribution's figures (imbalance, gain, critical data share, ...).
        loaders: each rank's loader facts.
    """

    verdict: str
    title: str
    why: str
    fix: str
    shares: dict[str, float]
    per_rank: tuple[dict[str, float], ...]
    slowest_rank: int
    slowest_host: str
    slowest_same: bool | None
    stage: str | None
    headroom: float | None
    bus_gb_s: float | None
    signals: tuple[str, ...]
    notes: tuple[str, ...]
    steps: int
    world_size: int
    hosts: tuple[str, ...]
    step_s: float
    samples_per_s: float | None
    startup_s: float | None
    every: int
    accumulation: int
    watched: bool
    windows: tuple[WindowSummary, ...] = ()
    timeline: Timeline | None = field(default=None, repr=False)
    figures: dict[str, Any] = field(default_factory=dict, repr=False)
    loaders: tuple[dict[str, Any], ...] = field(default=(), repr=False)

    @property
    def slowest_matters(self) -> bool:
        """The other ranks wait for :attr:`slowest_rank` materially, and it is the same rank most of the time
        (then the text and the page point at it)."""
        return (self.world_size > 1 and self.shares.get("wait", 0.0) >= MARK_WAIT
                and self.figures.get("slowest_share", 0.0) >= stable_share(self.world_size))

    # ------------------------------------------------------------------ text
    def text(self) -> str:
        """The report for a terminal or a log."""
        hosts = len(set(self.hosts)) or 1
        rate = f", {self.samples_per_s:,.0f} samples/s" if self.samples_per_s else ""
        lines = [f"fastfeed step monitor: {self.world_size} rank(s) on {hosts} host(s), {self.steps:,} steps "
                 f"({len(self.windows)} window(s) of up to {self.every}), {self.step_s * 1e3:,.1f} ms/step{rate}",
                 f"verdict: {self.title}", f"  why: {self.why}", f"  fix: {self.fix}", ""]
        head = f"  {'rank':<6}{'host':<18}" + "".join(f"{c:>12}" for c in CATEGORIES)
        lines += [head, f"  {'all':<6}{'':<18}" + "".join(f"{pct(self.shares[c]):>12}" for c in CATEGORIES)]
        for r, sh in enumerate(self.per_rank):
            mark = " <- slowest" if r == self.slowest_rank and self.slowest_matters else ""
            host = self.hosts[r] if r < len(self.hosts) else ""
            lines.append(f"  {r:<6}{host[:17]:<18}" + "".join(f"{pct(sh[c]):>12}" for c in CATEGORIES) + mark)
        if self.world_size > 1:
            same = {None: "", True: ", the same in the last two windows",
                    False: ", not the same in the last two windows"}[self.slowest_same]
            lines.append(f"  slowest rank: {self.slowest_rank} (host {self.slowest_host}){same}")
        if self.bus_gb_s is not None:
            lines.append(f"  gradient all-reduce: {bandwidth(self.bus_gb_s)} bus bandwidth")
        lines += [f"signal: {s}" for s in self.signals]
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (the last line of the JSON-lines file, with ``"type": "report"``)."""
        return {"type": "report", "verdict": self.verdict, "title": self.title, "why": self.why, "fix": self.fix,
                "shares": self.shares, "per_rank": list(self.per_rank), "slowest_rank": self.slowest_rank,
                "slowest_host": self.slowest_host, "slowest_same": self.slowest_same, "stage": self.stage,
                "headroom": self.headroom, "bus_gb_s": self.bus_gb_s, "signals": list(self.signals),
                "notes": list(self.notes), "steps": self.steps, "world_size": self.world_size,
                "hosts": list(self.hosts), "step_s": self.step_s, "samples_per_s": self.samples_per_s,
                "startup_s": self.startup_s, "every": self.every, "accumulation": self.accumulation,
                "watched": self.watched, "windows": [w.to_json() for w in self.windows],
                "timeline": self.timeline.to_json() if self.timeline is not None else None,
                "figures": self.figures, "loaders": list(self.loaders)}

    # ------------------------------------------------------------------ HTML
    def html(self, path: str | os.PathLike[str] | None = None) -> str:
        """The self-contained page (see the module docstring); written to ``path`` when given."""
        text = page(self)
        if path is not None:
            Path(path).write_text(text, encoding="utf-8")
        return text



# ---------------------------------------------------------------------- from gathered windows to the report

#: At most this many bins in the report's timeline.
TIMELINE_BINS = 240

Window = tuple[int, list[dict[str, float]], np.ndarray]  # first step, the ranks' headers, ranks x steps x columns


def samples_rate(headers: list[dict[str, float]], seconds: np.ndarray) -> float | None:
    """Samples per second over all ranks: their samples over the mean rank's seconds (None: not counted)."""
    samples = sum(h["samples"] for h in headers if h["samples"] == h["samples"])
    wall = float(np.mean(seconds)) if len(seconds) else 0.0
    return samples / wall if samples and wall > 0 else None


def timeline(times: StepTimes, index: np.ndarray, bins: int = TIMELINE_BINS) -> Timeline:
    """Each rank's mean seconds per step in each category over at most ``bins`` runs of steps."""
    s = split(times)
    cats = np.stack([s.category(c) for c in CATEGORIES], axis=2)  # ranks x steps x categories
    edges = np.unique(np.linspace(0, times.steps, min(bins, times.steps) + 1).astype(int))
    sums = np.add.reduceat(cats, edges[:-1], axis=1)
    means = sums / np.diff(edges)[None, :, None]
    return Timeline(starts=tuple(int(index[a]) for a in edges[:-1]), ends=tuple(int(index[b - 1]) for b in edges[1:]),
                    seconds=tuple(tuple(tuple(float(x) for x in b) for b in r) for r in means))


def _loaders(facts: list[dict[str, Any]], headers: list[list[dict[str, float]]]) -> tuple[LoaderFacts, ...]:
    out = []
    for r, f in enumerate(facts):
        ld = f.get("loader") or {}
        total = {k: sum(h.get(k, 0.0) for h in headers[r] if h.get(k, 0.0) == h.get(k, 0.0))
                 for k in ("read_s", "decode_s", "cpu_s", "load_batches", "load_step_s")}
        out.append(LoaderFacts(kind=ld.get("kind", "iterable"), num_workers=ld.get("num_workers"),
                               prefetch_factor=ld.get("prefetch_factor"), path=ld.get("path"),
                               read_s=total["read_s"], decode_s=total["decode_s"], cpu_s=total["cpu_s"],
                               batches=int(total["load_batches"]), step_s=total["load_step_s"]))
    return tuple(out)


def build_report(windows: list[Window], facts: list[dict[str, Any]], *, summaries: tuple[WindowSummary, ...],
                 notes: tuple[str, ...], startup_s: float | None, every: int, accumulation: int,
                 history: int) -> MonitorReport:
    """The report of the gathered ``windows`` of the ranks whose static ``facts`` these are.

    Raises:
        ConfigError: no step is left once the first one (start-up) is left out.
    """
    ranks = len(facts)
    if not windows:
        raise ConfigError("StepMonitor.report(): no window was gathered; run some steps first")
    cube = np.concatenate([w[2] for w in windows], axis=1)
    index = np.concatenate([w[0] + np.arange(w[2].shape[1]) for w in windows])
    times = StepTimes.from_cube(cube, step_index=index, accumulation=accumulation)
    if times.steps == 0:
        raise ConfigError("StepMonitor.report(): only the first step (start-up, left out) was measured; run a few "
                          "more steps before asking for the report")
    kept = index[~np.isnan(cube).any(axis=(0, 2))]
    per_rank = [[w[1][r] for w in windows] for r in range(ranks)]
    flat = [h for hs in per_rank for h in hs]
    a = attribute(times)
    coll_steps = sum(h["coll_steps"] for h in flat if h["coll_steps"] == h["coll_steps"])
    memory = [h["memory_available"] for h in flat if h["memory_available"] == h["memory_available"]]
    counted = sum(h["samples"] for h in flat)
    run = RunFacts(
        world_size=ranks, hosts=tuple(str(f.get("host", "?")) for f in facts), watched=any(h["watched"] for h in flat),
        loaders=_loaders(facts, per_rank), cores=tuple(int(f.get("cores", 0)) for f in facts),
        local_ranks=tuple(int(f.get("local_ranks", 1)) for f in facts), memory_available=min(memory, default=None),
        samples_per_step=counted / ranks / max(1, sum(w[2].shape[1] for w in windows)) if counted else None,
        collective_bytes=sum(h["coll_bytes"] for h in flat) / coll_steps if coll_steps else 0.0,
        slowest_by_window=tuple(s.slowest_rank for s in summaries))
    v = decide(a, run)
    extra = list(notes)
    if ranks > 1 and not run.watched:
        extra.append("collectives were not timed, so compute includes the gradient all-reduce and the wait for the "
                     "slowest rank: model = mon.watch(ddp_model), or `with mon.collective():` around blocking ones")
    if accumulation > 1:
        extra.append(f"a step is one batch; the ranks synchronise once per {accumulation} steps (accumulation="
                     f"{accumulation}), so the wait for the slowest rank is counted per {accumulation} steps")
    if sum(w[2].shape[1] for w in windows) < sum(s.steps for s in summaries):
        extra.append(f"the verdict covers the last {times.steps:,} steps (history={history:,}); the windows cover all")
    if startup_s is not None:
        extra.append(f"the first step (start-up: {startup_s:.2f} s waiting for the first batch) is left out")
    k = a.slowest_rank
    return MonitorReport(
        verdict=v.name, title=v.title, why=v.why, fix=v.fix, shares=a.shares, per_rank=a.per_rank, slowest_rank=k,
        slowest_host=run.host(k), slowest_same=summaries[-1].same_slowest if len(summaries) > 1 else None,
        stage=v.stage, headroom=v.headroom, bus_gb_s=v.bus_gb_s, signals=v.signals, notes=tuple(extra),
        steps=times.steps, world_size=ranks, hosts=run.hosts, step_s=a.step_s,
        samples_per_s=samples_rate(flat, a.seconds.sum(axis=1)), startup_s=startup_s, every=every,
        accumulation=accumulation, watched=run.watched, windows=summaries, timeline=timeline(times, kept),
        figures=a.to_json(), loaders=tuple(ld.to_json() for ld in run.loaders))
