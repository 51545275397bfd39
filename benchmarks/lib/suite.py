"""A benchmark declared as data: its grid of settings and peers, one point's run, its report.

The shape is ffcv's benchmark suites': a parameter grid, warm-up, median. A benchmark file
defines ``BENCHMARK = Benchmark(...)``:

- ``grid``: the :class:`Axis` of its settings and peers, outermost first (``REPEAT`` marks
  where the interleaved rounds go); the runner walks their product, one point at a time;
- ``run_point(point, ctx)``: measures one point (a dict, one value per axis plus ``"round"``)
  and returns its row, or None when it failed (the benchmark has said why); with
  ``isolate=True`` every point runs in a fresh process of the same command
  (``benchmarks/run.py NAME ... --point JSON``), so that no loader inherits another's
  threads, buffers or imports into its forked workers;
- ``report(rows, ctx)``: prints the table and the ratios against the peer measured in the same
  run, and returns the figures as a JSON-ready dict (the runner prints it as one ``RESULT``
  line and writes it to ``--json``, by default ``bench-data/results/NAME.json``).

A benchmark whose steps depend on the figures of earlier ones (a search, a confirmation round,
one process per rank under torchrun) declares its settings the same way and gives ``run(ctx)``
instead of ``run_point``: the runner then calls it once.

Every axis can be narrowed from the command line, ``--grid peer=fastfeed,ffcv`` (or the
benchmark's own flag for it, ``--peers fastfeed,ffcv``); ``--quick`` applies the benchmark's
``quick`` settings (small and short: a check that it runs, not a figure to quote).

Example:
    >>> Axis("cache", ("warm", "cold")).pick("cold")
    ('cold',)
    >>> Axis("cache", ("warm", "cold")).pick("hot")
    Traceback (most recent call last):
    ...
    ValueError: --grid cache: unknown 'hot'; choose from warm, cold
"""

from __future__ import annotations

import argparse
import importlib.util
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

__all__ = ["REPEAT", "Axis", "Benchmark", "Context", "Point", "Row", "missing_need"]

#: the pseudo-axis of interleaved rounds (``--repeat N``) in a :attr:`Benchmark.grid`
REPEAT = "repeat"

Point = dict[str, Any]
Row = Any


@dataclass(frozen=True)
class Axis:
    """One dimension of a benchmark's grid.

    Attributes:
        name: what the values are (``peer``, ``cache``, ``dataset``); ``--grid NAME=...``.
        values: the default grid.
        choices: every value allowed (default: ``values``); a name outside them is an error.
        flag: the benchmark's own option for it, a comma list (``--peers``), kept so that the
            commands in benchmarks/RESULTS.md still run.
        parse: turns one text value into a value (default: the text).
        help: one line for ``--help``.
        alternate: walk the values backwards on odd rounds (drift favours none).
        aliases: names of value lists (``both`` for ``cold,warm``).
    """

    name: str
    values: tuple[Any, ...]
    choices: tuple[Any, ...] | None = None
    flag: str | None = None
    parse: Callable[[str], Any] = str
    help: str = ""
    alternate: bool = False
    aliases: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)

    def pick(self, text: str) -> tuple[Any, ...]:
        """The values of a comma list, checked against :attr:`choices`."""
        allowed = self.choices if self.choices is not None else self.values
        if text in allowed:  # one value with a comma in its name ("lognormal(5,1)[16,1024]")
            return (text,)
        picked = tuple(x for v in text.split(",") if v for x in self.aliases.get(v, (self.parse(v),)))
        unknown = [v for v in picked if v not in allowed]
        if unknown:
            raise ValueError(f"--grid {self.name}: unknown {', '.join(map(repr, unknown))}; "
                             f"choose from {', '.join(map(str, allowed))}")
        return picked


@dataclass
class Context:
    """What one run of a benchmark knows: its parsed options, grid, environment and data.

    Attributes:
        args: the parsed command line (the benchmark's options, ``quick``, ``repeat``).
        grid: the value list of every axis, as narrowed on the command line.
        env: :func:`benchmarks.lib.report.environment` at the start (empty in a point's process).
        data: what ``prepare`` returned (with ``isolate``: paths, handed to every point's process).
    """

    args: argparse.Namespace
    grid: dict[str, tuple[Any, ...]]
    env: dict[str, Any] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)

    def data_of(self, group: str) -> dict[str, Any]:
        """The entries ``GROUP:KEY`` of :attr:`data` as ``{KEY: value}`` (one dataset's files)."""
        return {k.split(":", 1)[1]: v for k, v in self.data.items() if k.startswith(f"{group}:")}


@dataclass(frozen=True)
class Benchmark:
    """One benchmark: its grid and peers as data, and the functions that measure and report.

    Attributes:
        name: the file's name (``loader_cpu``): ``benchmarks/run.py NAME``.
        doc: the file's docstring (the first paragraph is the goal, the rest the ``--help`` epilog).
        grid: the axes, outermost first, with :data:`REPEAT` where the rounds go.
        options: adds the benchmark's own options (sizes, times) to the parser.
        quick: option values (by ``dest``) and axis value lists (by axis name) of ``--quick``; an
            option given on the command line keeps its value.
        prepare: builds or finds the data, once per run.
        run_point: measures one point; returns its row (None: failed).
        skip: why a point is not measured (None: measure it); said once per reason.
        report: prints the figures of the rows and returns them as a JSON-ready dict.
        report_by: report once per value of this axis (the outermost), as soon as it is done.
        progress: one line on a point's row, logged as soon as it is measured.
        run: a benchmark of dependent steps: the whole run (instead of ``run_point``).
        isolate: every point in a fresh process.
        point_env: environment variables of a point's process (with ``isolate``).
        needs: what must be here to run at all: ``"cuda"``, ``"dali"`` or module names;
            without them the runner says so and skips the benchmark (exit 0).
        launcher: how it is started (``torchrun ...``) when the runner cannot start it: ``make bench``
            says so instead of running it.
        repeat: the rounds of :data:`REPEAT` when ``--repeat`` is not given.
        repeat_flags: the options that set the rounds (a benchmark's own older name too).
    """

    name: str
    doc: str
    grid: tuple[Axis | str, ...] = ()
    options: Callable[[argparse.ArgumentParser], None] | None = None
    quick: Mapping[str, Any] = field(default_factory=dict)
    prepare: Callable[[Context], dict[str, Any]] | None = None
    run_point: Callable[[Point, Context], Row] | None = None
    skip: Callable[[Point, Context], str | None] | None = None
    report: Callable[[list[tuple[Point, Row]], Context], dict[str, Any]] | None = None
    report_by: str | None = None
    progress: Callable[[Point, Row], str] | None = None
    run: Callable[[Context], dict[str, Any]] | None = None
    isolate: bool = False
    point_env: Callable[[Point], Mapping[str, str]] | None = None
    needs: tuple[str, ...] = ()
    launcher: str | None = None
    repeat: int = 1
    repeat_flags: tuple[str, ...] = ("--repeat",)

    def __post_init__(self) -> None:
        if (self.run is None) == (self.run_point is None):
            raise TypeError(f"benchmark {self.name}: give exactly one of run_point= and run=")
        if self.run_point is not None and self.report is None:
            raise TypeError(f"benchmark {self.name}: run_point= needs report=")
        names = [a.name for a in self.axes]
        if self.report_by is not None and (not names or names[0] != self.report_by):
            raise TypeError(f"benchmark {self.name}: report_by={self.report_by!r} must be the outermost axis")

    @property
    def axes(self) -> list[Axis]:
        """The grid's axes, without the rounds."""
        return [a for a in self.grid if isinstance(a, Axis)]

    @property
    def summary(self) -> str:
        """The first paragraph of the docstring, in one line."""
        return " ".join(self.doc.strip().split("\n\n")[0].split())

    def points(self, grid: Mapping[str, Sequence[Any]], repeat: int) -> list[Point]:
        """Every point of the grid, in run order (rounds where :data:`REPEAT` stands)."""
        out: list[Point] = [{}]
        for item in self.grid:
            if not isinstance(item, Axis):  # REPEAT
                out = [{**p, "round": r} for p in out for r in range(repeat)]
                continue
            new = []
            for p in out:
                values = list(grid[item.name])
                if item.alternate and p.get("round", 0) % 2:
                    values.reverse()
                new += [{**p, item.name: v} for v in values]
            out = new
        if REPEAT not in self.grid:
            out = [{**p, "round": 0} for p in out]
        return out


def missing_need(need: str) -> str | None:
    """Why ``need`` is not met here (None when it is)."""
    if need == "cuda":
        try:
            import torch
        except ImportError:
            return "torch is not installed"
        return None if torch.cuda.is_available() else "no CUDA GPU here"
    if need == "dali":
        from fastfeed.loading.dali.backend import dali_available

        return None if dali_available() else ("NVIDIA DALI is not installed (pip install 'fastfeed[dali]'; on the "
                                                 "GPU machine: source benchmarks/gpu_setup.sh)")
    if importlib.util.find_spec(need) is None:
        return f"{need} is not installed (`make bench-env` installs the benchmarks' peers)"
    return None

