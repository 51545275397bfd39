"""What ``fastfeed tune`` reports: :class:`TuneResult`, its table, JSON and plot.

Example:
    >>> r = fastfeed.tune("/data/ff", batch_size=256)   # doctest: +SKIP
    >>> print(r.table()); print(r.summary())            # doctest: +SKIP
    >>> plot_result(r, "tune.png")                      # doctest: +SKIP
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastfeed._util import format_bytes
from fastfeed.errors import ConfigError, missing_dependency
from fastfeed.loading.options import as_keywords
from fastfeed.timing.measure import Measurement
from fastfeed.tuning.confirm import figure
from fastfeed.tuning.search import Trial
from fastfeed.knobs.space import Setting
from fastfeed.knobs.record import TuneKey

__all__ = ["TuneResult", "figure_of", "plot_result", "require_plot"]


@dataclass(frozen=True)
class TuneResult:
    """What :func:`tune` measured and chose.

    Attributes:
        path: the dataset.
        key: what the result is valid for (and stored under).
        setting: the chosen setting (:meth:`loader_kwargs` gives it as ``loader()`` keywords).
        measurement: the chosen setting's measurement (when it was re-measured, the round nearest
            the median: its memory and steadiness); its figure is :attr:`samples_per_s`.
        trials: every trial in the order run.
        reason: one sentence: why this setting.
        target_rate: the per-rank target (samples/s), or None for the fastest.
        target_met: whether the chosen setting meets the target (None without one).
        cores: usable cores on the host; ``cores_per_rank`` after ``LOCAL_WORLD_SIZE``.
        memory_budget: bytes a setting could use (main + workers).
        time_budget: seconds of measuring allowed; ``elapsed``: seconds the run took.
        out_of_time: the time budget ended the search before it finished.
        stored_at: the file the result was written to, or None.
        confirmed: the candidates re-measured at the end (``tune_confirm.Confirmed``).
        notes: warnings for the user (a batch larger than the dataset, a better stored
            result kept).
    """

    path: str
    key: TuneKey
    setting: Setting
    measurement: Measurement
    trials: tuple[Trial, ...]
    reason: str
    target_rate: float | None
    target_met: bool | None
    cores: int
    cores_per_rank: int
    memory_budget: int | None
    time_budget: float
    elapsed: float
    out_of_time: bool
    stored_at: str | None = None
    confirmed: tuple[Any, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def num_workers(self) -> int:
        return self.setting.num_workers

    @property
    def prefetch_factor(self) -> int | None:
        return self.setting.prefetch_factor

    @property
    def samples_per_s(self) -> float:
        """The chosen setting's figure, the one the choice was made on: the median of its
        confirmation rounds when it was re-measured, else its search trial's rate (what the
        summary, the table's ``*``, the JSON, the plot and the stored record all quote)."""
        return self.rate_of(self.setting)

    def rate_of(self, setting: Setting) -> float:
        """The one figure of a measured setting (:func:`~fastfeed.tuning.confirm.figure`)."""
        return figure(setting, self.trials, self.confirmed)

    @property
    def chosen_runs(self) -> tuple[Trial, ...]:
        """The trials behind :attr:`samples_per_s`: the chosen setting's confirmation rounds, or its one
        search trial (the rows the table marks ``*``)."""
        for c in self.confirmed:
            if c.setting == self.setting and c.rates:
                return tuple(t for t in c.trials if t.ok)
        return tuple(t for t in self.trials if t.measurement is not None and t.measurement is self.measurement)

    @property
    def measuring_s(self) -> float:
        """Seconds spent measuring (the sum over trials)."""
        return sum(t.seconds for t in self.trials)

    @property
    def baseline(self) -> Trial | None:
        """The ``num_workers=0`` trial (PyTorch's default), when it was measured."""
        return next((t for t in self.trials if t.ok and t.setting.num_workers == 0), None)

    def table(self) -> str:
        """The trials as a text table, the runs behind the chosen figure marked with ``*``."""
        rows = [("", "phase", "workers", "prefetch", "knobs", "samples/s", "p10..p90", "memory", "time", "status")]
        chosen = self.chosen_runs
        for t in self.trials:
            m = t.measurement
            rows.append((
                "*" if any(t is c for c in chosen) else "",
                t.phase,
                str(t.setting.num_workers),
                "-" if t.setting.prefetch_factor is None else str(t.setting.prefetch_factor),
                " ".join(f"{k}={v}" for k, v in t.setting.knobs) or "-",
                f"{m.samples_per_s:,.0f}" if m else "-",
                f"{m.p10_samples_per_s:,.0f}..{m.p90_samples_per_s:,.0f}" if m else "-",
                format_bytes(m.memory_bytes) if m and m.memory_bytes is not None else "-",
                f"{t.seconds:.1f}s",
                t.status if m is None or m.steady else f"{t.status}, NOT STEADY: {m.note}",
            ))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        right = {2, 3, 5, 6, 7, 8}
        return "\n".join(
            "  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()
            for r in rows)

    def summary(self) -> str:
        """A few lines: the choice, why, against num_workers=0, where it was stored."""
        s = self.setting
        runs = len(self.chosen_runs)
        how = f": the median of the {runs} re-measurements marked *" if runs > 1 and self.confirmed else ""
        lines = [f"chosen: num_workers={s.num_workers} prefetch_factor={s.prefetch_factor}"
                 + "".join(f" {k}={v}" for k, v in s.knobs)
                 + f"  ({self.samples_per_s:,.0f} samples/s{how})", f"why: {self.reason}"]
        for c in self.confirmed:
            rates = ", ".join(f"{r:,.0f}" for r in c.rates)
            lines.append(f"  confirm {c.setting.label}: median {c.rate:,.0f} samples/s ({rates}; "
                         f"search saw {c.searched:,.0f})")
        base = self.baseline
        base_rate = self.rate_of(base.setting) if base is not None else 0.0
        if base_rate > 0 and s.num_workers:
            lines.append(f"vs num_workers=0 (PyTorch's default): {self.samples_per_s / base_rate:.1f}x "
                         f"({base_rate:,.0f} samples/s)")
        lines.append(f"measured {len(self.trials)} settings in {self.measuring_s:.0f}s "
                     f"({self.cores} cores, {self.cores_per_rank} per rank, LOCAL_WORLD_SIZE="
                     f"{self.key.local_world_size})" + (" - time budget ran out" if self.out_of_time else ""))
        if self.stored_at:
            lines.append(f"stored in {self.stored_at}; loader(num_workers='auto') will use it")
        lines += [f"warning: {n}" for n in self.notes]
        return "\n".join(lines)

    def loader_kwargs(self) -> dict[str, Any]:
        """The chosen setting as ``fastfeed.loader()`` keywords (``num_workers``, and the
        ``Workers`` / ``Dali`` groups of the rest), for a loader built by hand.

        Example:
            >>> dl = fastfeed.loader(path, batch_size=256, **result.loader_kwargs())   # doctest: +SKIP
        """
        return as_keywords(self.setting.loader_kwargs())

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (what ``fastfeed tune --json`` prints)."""
        return {
            "path": self.path,
            "key": self.key.to_json(),
            "chosen": {**self.setting.loader_kwargs(), "samples_per_s": self.samples_per_s,
                       "runs": len(self.chosen_runs), "steady": self.measurement.steady},
            "reason": self.reason,
            "target_rate": self.target_rate,
            "target_met": self.target_met,
            "cores": self.cores,
            "cores_per_rank": self.cores_per_rank,
            "memory_budget": self.memory_budget,
            "time_budget": self.time_budget,
            "elapsed": self.elapsed,
            "measuring_s": self.measuring_s,
            "out_of_time": self.out_of_time,
            "stored_at": self.stored_at,
            "notes": list(self.notes),
            "trials": [_trial_json(t, chosen=any(t is c for c in self.chosen_runs)) for t in self.trials],
            "confirmed": [{**c.setting.loader_kwargs(), "median": c.rate, "rates": c.rates,
                           "searched": c.searched} for c in self.confirmed],
        }


def _trial_json(t: Trial, *, chosen: bool) -> dict[str, Any]:
    return {"phase": t.phase, **t.setting.loader_kwargs(), "status": t.status, "seconds": t.seconds,
            "chosen": chosen, "measurement": t.measurement.to_json() if t.measurement is not None else None}


def require_plot(png: str | os.PathLike[str]) -> None:
    """Fail now, before measuring, when ``png`` cannot be drawn: no matplotlib, or no such folder."""
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        raise missing_dependency("matplotlib", "plot", "tune --plot")
    folder = Path(png).resolve().parent
    if not folder.is_dir():
        raise ConfigError(f"--plot {png}: the folder {folder} does not exist; create it or choose another path")


def plot_result(result: TuneResult, png: str | os.PathLike[str]) -> Path:
    """Draw throughput against workers, one line per prefetch factor, to ``png``.

    Each setting is drawn at its one figure (:meth:`TuneResult.rate_of`: the median of its
    re-measurements when it was confirmed, ringed, else its search trial), so the chosen
    setting's star lies on its own line, at the figure the summary quotes. Uses matplotlib's
    object API (no pyplot, no global backend change).
    """
    out = Path(png)
    figure_of(result).savefig(out)
    return out


def figure_of(result: TuneResult) -> Any:
    """The matplotlib ``Figure`` :func:`plot_result` saves (its lines labelled: one per prefetch
    factor, ``re-measured: ...``, ``chosen: ...``, ``target``)."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.ticker import MaxNLocator
    except ImportError:
        raise missing_dependency("matplotlib", "plot", "tune --plot") from None
    fig = Figure(figsize=(7, 4.5), dpi=120)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    chosen = result.setting
    color = "k"
    for label, ts in _series(result):
        xs = [t.setting.num_workers for t in ts]
        (line,) = ax.plot(xs, [result.rate_of(t.setting) for t in ts], marker="o", label=label)
        if any(t.setting == chosen for t in ts) and color == "k":
            color = line.get_color()
    confirmed = [c for c in result.confirmed if c.rates]
    if confirmed:
        runs = sorted({len(c.rates) for c in confirmed})
        ax.plot([c.setting.num_workers for c in confirmed], [c.rate for c in confirmed], marker="o",
                markersize=13, markerfacecolor="none", markeredgecolor="0.35", linestyle="none",
                label=f"re-measured: median of {'/'.join(map(str, runs))} runs")
    ax.plot([chosen.num_workers], [result.samples_per_s], marker="*", markersize=18, color=color,
            markeredgecolor="k", linestyle="none", zorder=5,
            label=f"chosen: {chosen.label} ({result.samples_per_s:,.0f}/s)")
    if result.target_rate:
        ax.axhline(result.target_rate, color="gray", linestyle="--", label="target")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("num_workers")
    ax.set_ylabel("samples/s")
    ax.set_title(f"fastfeed tune: batch {result.key.batch_size}, decode={result.key.decode}, "
                 f"{result.cores} cores")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return fig


def _series(result: TuneResult) -> list[tuple[str, list[Trial]]]:
    """The plot's lines: (label, search trials by workers) per prefetch factor and knobs; ``num_workers=0``
    (no prefetch factor) starts every line without knobs, or is a line of its own when nothing else ran."""
    lines: dict[tuple[Any, ...], list[Trial]] = {}
    for t in result.trials:
        if t.ok and t.phase != "confirm":
            lines.setdefault((t.setting.prefetch_factor, t.setting.knobs), []).append(t)
    zero = [t for (pf, _), ts in lines.items() if pf is None for t in ts]
    out = []
    for (pf, knobs), ts in sorted(lines.items(), key=lambda kv: (kv[0][0] or 0, str(kv[0][1]))):
        if pf is None:
            continue
        ts = sorted(zero + ts if not knobs else ts, key=lambda t: t.setting.num_workers)
        out.append((f"prefetch_factor={pf}" + "".join(f" {k}={v}" for k, v in knobs), ts))
    if zero and not out:
        out.append(("num_workers=0", zero[:1]))
    return out
