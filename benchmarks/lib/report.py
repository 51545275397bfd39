"""What the benchmarks print: results, ratios against the peer measured in the same run, JSON.

Every loader benchmark reports two metrics per loader: wall-clock samples/s (what the goals are
about) and samples per CPU-second of the loader's processes (steady when other jobs share the
cores). :func:`print_report` prints them as a table with one column pair per page-cache state,
then the ratios of the subject (fastfeed's row) against every peer, each against its goal.
The runner (``benchmarks/run.py``) prints the returned dict as one ``RESULT {json}`` line and
writes it to a file.

Example:
    >>> print(ratio_line({"fastfeed": 300.0, "imagefolder": 100.0}, "fastfeed", {"imagefolder": 3.0}))
    imagefolder 3.00x [>= 3: met]
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

if TYPE_CHECKING:
    from fastfeed.timing.measure import Measurement

__all__ = ["Result", "environment", "fmt_rate", "log", "measured_line", "pct", "print_report", "ratio_line", "results_of",
           "write_json"]

#: the modules whose versions :func:`environment` records (absent ones as None)
VERSIONS = ("torch", "torchvision", "numpy", "PIL", "webdataset", "ffcv", "simplejpeg", "cv2")


def log(msg: str) -> None:
    """A progress line on stderr (the report goes to stdout)."""
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def environment() -> dict[str, Any]:
    """Date, machine and software versions, for RESULTS.md and the JSON of a run."""
    from fastfeed.host import host_info

    info = host_info()
    env: dict[str, Any] = {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "cores": info.cores, "memory_gib": info.memory_gib, "cpu": info.cpu_model,
        "python": platform.python_version(), "loadavg_1m": os.getloadavg()[0],
        "note": os.environ.get("BENCH_NOTE", ""),
    }
    for mod in VERSIONS:
        try:
            env[mod] = __import__(mod).__version__
        except Exception:  # noqa: BLE001 - a peer that does not import (for any reason) is reported as absent
            env[mod] = None
    return env


def write_json(path: Path, obj: Any) -> None:
    """``obj`` as indented JSON in ``path`` (its folder made)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=1, default=str) + "\n")


def fmt_rate(x: float) -> str:
    """Rates as people read them: 1,234 or 12.3."""
    return f"{x:,.0f}" if x >= 100 else f"{x:.1f}"


# ---------------------------------------------------------------------- ratios
def pct(x: float | None) -> str:
    """A share as a percentage with one decimal, "-" for None."""
    return "-" if x is None else f"{x:.1%}"


def ratio_line(values: Mapping[str, float], subject: str, goals: Mapping[str, float] | None = None) -> str:
    """``peer ratio [goal]`` for every peer of ``subject`` in ``values`` (subject / peer)."""
    mine = values.get(subject)
    parts = []
    for name, theirs in values.items():
        if name == subject or not mine or not theirs:
            continue
        ratio = mine / theirs
        goal = (goals or {}).get(name)
        mark = "" if goal is None else f" [>= {goal:g}: {'met' if ratio >= goal else 'MISSED'}]"
        parts.append(f"{name} {ratio:.2f}x{mark}")
    return "; ".join(parts)


# ---------------------------------------------------------------------- loader results
@dataclass
class Result:
    """One measured configuration of a loader benchmark (possibly repeated)."""

    name: str
    what: str
    cache: str
    runs: list[Measurement] = field(default_factory=list)
    cpu_per_image: list[float | None] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        """Median over repeats of the steady-state samples/s (wall clock)."""
        return statistics.median(m.samples_per_s for m in self.runs) if self.runs else 0.0

    @property
    def per_cpu_second(self) -> float | None:
        """Median over repeats of samples per CPU-second of the loader's processes."""
        vals = [1 / c for c in self.cpu_per_image if c]
        return statistics.median(vals) if vals else None

    def to_json(self) -> dict[str, Any]:
        """The figures, each run's too, as a JSON-ready dict."""
        return {
            "name": self.name, "what": self.what, "cache": self.cache, "img_per_s": self.rate,
            "img_per_cpu_s": self.per_cpu_second,
            "runs": [{"img_per_s": m.samples_per_s, "p10": m.p10_samples_per_s,
                      "p90": m.p90_samples_per_s, "batches": m.batches, "startup_s": m.startup_s,
                      "total_s": m.total_s, "epochs": m.epochs, "steady": m.steady,
                      "cpu_s_per_img": c}
                     for m, c in zip(self.runs, self.cpu_per_image)],
            **self.extra,
        }


def results_of(rows: Sequence[tuple[Mapping[str, Any], Mapping[str, Any]]],
               key: Callable[[Mapping[str, Any]], tuple[str, str]]) -> list[Result]:
    """The rows of a loader benchmark (``measurement``, ``cpu_s_per_img``, ``what``, ``check`` each),
    gathered into one :class:`Result` per ``key(point)`` = (name, cache), in the order first seen."""
    from benchmarks.lib.measure import measurement_from_json

    results: dict[tuple[str, str], Result] = {}
    for pt, got in rows:
        name, cache = key(pt)
        r = results.setdefault((name, cache), Result(name, got["what"], cache))
        r.runs.append(measurement_from_json(got["measurement"]))
        r.cpu_per_image.append(got["cpu_s_per_img"])
        r.extra.setdefault("checks", []).append(got["check"])
    return list(results.values())


def measured_line(row: Mapping[str, Any]) -> str:
    """One line of a loader benchmark's row: the rates, the noise, the batches, the checks."""
    from benchmarks.lib.measure import measurement_from_json

    m, cpu = measurement_from_json(row["measurement"]), row["cpu_s_per_img"]
    eff = f"{1 / cpu:,.0f} img/cpu-s" if cpu else "no steady CPU figure"
    return (f"{m.samples_per_s:,.0f} img/s (p10 {m.p10_samples_per_s:,.0f}, p90 {m.p90_samples_per_s:,.0f}, "
            f"{m.batches} batches, start-up {m.startup_s:.1f} s), {eff}, checks {row['check']}")


def _ratios(results: Sequence[Result], subject: str, metric: Callable[[Result], float | None],
            goals: Mapping[str, float], label: str) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    print(f"ratios, {label} (fastfeed / peer; goal in brackets):")
    for cache in dict.fromkeys(r.cache for r in results):
        values = {r.name: v for r in results if r.cache == cache and (v := metric(r))}
        if not values.get(subject):
            continue
        out[cache] = {n: values[subject] / v for n, v in values.items() if n != subject}
        print(f"  {cache:>5}: " + ratio_line(values, subject, goals))
    return out


def print_report(
    title: str, results: Sequence[Result], *, subject: str, goals: Mapping[str, float],
    env: Mapping[str, Any], extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Print the table and the ratios of ``subject`` against each peer, in both metrics.

    Args:
        title: what was measured (one line).
        results: every configuration; columns are their ``cache`` values.
        subject: the name of fastfeed's row.
        goals: peer name -> minimum ratio (subject / peer); other peers have none.
        env: :func:`environment` at the start of the run.
        extra: more fields for the JSON.

    Returns:
        The report as a JSON-ready dict.
    """
    print(f"\n== {title}")
    caches = list(dict.fromkeys(r.cache for r in results))
    names = list(dict.fromkeys(r.name for r in results))
    table = {(r.name, r.cache): r for r in results}
    width = max(len(n) for n in names) + 2 if names else 8
    print(f"{'loader':<{width}}" + "".join(f"{c + ' img/s':>13}{c + ' img/cpu-s':>17}" for c in caches))
    for name in names:
        cells = ""
        for c in caches:
            r = table.get((name, c))
            rate = fmt_rate(r.rate) if r and r.runs else "-"
            eff = fmt_rate(r.per_cpu_second) if r and r.per_cpu_second else "-"
            cells += f"{rate:>13}{eff:>17}"
        print(f"{name:<{width}}{cells}")
    for name in names:
        print(f"  {name}: {next(r.what for r in results if r.name == name)}")
    ratios = _ratios(results, subject, lambda r: r.rate if r.runs else None, goals, "wall-clock img/s")
    eff = _ratios(results, subject, lambda r: r.per_cpu_second, goals, "img per CPU-second")
    return {"title": title, "env": dict(env), "results": [r.to_json() for r in results],
            "ratios": ratios, "ratios_per_cpu_s": eff, "goals": dict(goals), **(extra or {})}
