"""The one runner of ``benchmarks/``: any benchmark, or all of them (what ``make bench`` calls).

One benchmark: ``benchmarks/run.py NAME [--grid AXIS=V1,V2 ...] [--repeat N] [--quick] [--json
PATH] [its options]`` (``python benchmarks/NAME.py ...`` is the same). It walks the benchmark's
grid (:mod:`benchmarks.lib.suite`), prints its table and the ratios against the peer measured
in the same run, writes the figures to ``--json`` (default ``bench-data/results/NAME.json``) and
prints them as one ``RESULT {json}`` line (``RESULT-FILE PATH`` when that line would be long).
``NAME --help`` lists its grid and options.

All of them: ``benchmarks/run.py [--quick] [--only A,B] [--skip C]`` starts each benchmark with
the same Python (the bench venv under ``make bench``), one after the other, streams its output,
keeps it in ``bench-data/logs/NAME.log`` and the ``RESULT`` lines in
``bench-data/logs/results.jsonl``, and ends with a summary. A benchmark that needs a GPU or a
package that is not installed says so and is skipped, and so does one started by ``torchrun``.

Run::

    make bench                                   # everything, full size
    make bench BENCH_ARGS="--quick"              # small and short
    make bench BENCH_ARGS="--only loader_cpu,loader_memory"
    .venv-bench/bin/python benchmarks/run.py loader_cpu --quick --grid peer=fastfeed,ffcv --grid cache=warm
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Sequence

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))

from benchmarks.lib.data import BENCH_DATA  # noqa: E402
from benchmarks.lib.measure import Stopwatch  # noqa: E402
from benchmarks.lib.report import environment, log, write_json  # noqa: E402
from benchmarks.lib.suite import REPEAT, Benchmark, Context, Point, missing_need  # noqa: E402

#: the longest RESULT line printed; a longer result is only written to its file (RESULT-FILE PATH)
RESULT_LINE = 4000
# run first (cheap, or producing data the others reuse); the rest follow alphabetically
ORDER = ("pack", "loader_cpu", "loader_memory", "loader_s3", "decode_per_core", "tune")


def names() -> list[str]:
    """Every benchmark of ``benchmarks/``, in run order."""
    found = sorted(p.stem for p in HERE.glob("*.py") if not p.stem.startswith("_") and p.stem != "run")
    return [n for n in ORDER if n in found] + [n for n in found if n not in ORDER]


def load(name: str) -> Benchmark:
    """The :class:`Benchmark` declared by ``benchmarks/NAME.py``."""
    module = importlib.import_module(f"benchmarks.{name}")
    bench = getattr(module, "BENCHMARK", None)
    if not isinstance(bench, Benchmark):
        raise SystemExit(f"benchmarks/{name}.py declares no BENCHMARK = Benchmark(...)")
    return bench


# ---------------------------------------------------------------------- one benchmark
def _parser(bench: Benchmark) -> argparse.ArgumentParser:
    head, _, rest = bench.doc.strip().partition("\n\n")
    grid = "\n".join(f"  {a.name}: {','.join(map(str, a.values))}"
                     + (f" (of {','.join(map(str, a.choices))})" if a.choices else "")
                     + (f"; {a.flag}" if a.flag else "") + (f"; {a.help}" if a.help else "") for a in bench.axes)
    p = argparse.ArgumentParser(prog=f"benchmarks/run.py {bench.name}", description=" ".join(head.split()),
                                epilog=(f"grid (--grid AXIS=V1,V2):\n{grid}\n\n" if grid else "") + rest,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    if bench.options is not None:
        bench.options(p)
    for axis in bench.axes:
        if axis.flag:
            p.add_argument(axis.flag, dest=f"grid_{axis.name}", default=None, metavar="A,B",
                           help=f"{axis.help or axis.name} (the grid's {axis.name} axis; default "
                                f"{','.join(map(str, axis.values))})")
    if bench.axes:
        p.add_argument("--grid", action="append", default=[], metavar="AXIS=V1,V2",
                       help="narrow one axis of the grid (repeatable)")
    if REPEAT in bench.grid:
        p.add_argument(*bench.repeat_flags, dest="repeat", type=int, default=bench.repeat,
                       help=f"interleaved rounds, the median reported (default {bench.repeat})")
    p.add_argument("--quick", action="store_true", help="small and short: a check that it runs, not a figure to quote")
    p.add_argument("--json", type=Path, default=None, help=f"write the figures here (default {BENCH_DATA}/results/"
                                                          f"{bench.name}.json)")
    p.add_argument("--point", default=None, help=argparse.SUPPRESS)
    return p


def _grid(bench: Benchmark, args: argparse.Namespace, p: argparse.ArgumentParser) -> dict[str, tuple[Any, ...]]:
    grid = {a.name: tuple(a.values) for a in bench.axes}
    if args.quick:
        grid.update({k: tuple(v) for k, v in bench.quick.items() if k in grid})
    given = {a.name: getattr(args, f"grid_{a.name}", None) for a in bench.axes}
    for item in getattr(args, "grid", []):
        name, eq, values = item.partition("=")
        if not eq or name not in grid:
            p.error(f"--grid {item!r}: want AXIS=V1,V2 with AXIS one of {', '.join(grid)}")
        given[name] = values
    for axis in bench.axes:
        if given[axis.name] is not None:
            try:
                grid[axis.name] = axis.pick(given[axis.name])
            except ValueError as e:
                p.error(str(e))
    return grid


def _isolated(bench: Benchmark, argv: Sequence[str], point: Point, ctx: Context) -> Any:
    """One point in a fresh process of the same command; its row (None when it failed)."""
    cmd = [sys.executable, str(HERE / "run.py"), bench.name, *argv,
           "--point", json.dumps({"point": point, "data": {k: str(v) for k, v in ctx.data.items()}})]
    env = {**os.environ, **(bench.point_env(point) if bench.point_env else {})}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("CHILD ")]
    if out.returncode != 0 or not lines:
        log(f"{bench.name} {_label(point)}: FAILED (exit {out.returncode}):\n{out.stderr[-2000:]}")
        return None
    return json.loads(lines[-1][len("CHILD "):])


def _label(point: Point) -> str:
    return " ".join(f"{k}={v}" for k, v in point.items())


def _walk(bench: Benchmark, argv: Sequence[str], ctx: Context) -> list[dict[str, Any]]:
    """Every point of the grid; a report per ``report_by`` group (or one in all)."""
    run_point, report = bench.run_point, bench.report
    if run_point is None or report is None:  # Benchmark.__post_init__ refuses it; for the type checker
        raise TypeError(f"benchmark {bench.name} has no run_point/report")
    points = bench.points(ctx.grid, getattr(ctx.args, "repeat", 1))
    groups: dict[Any, list[Point]] = {}
    for pt in points:
        groups.setdefault(pt[bench.report_by] if bench.report_by else None, []).append(pt)
    reports, said = [], set()
    for group in groups.values():
        rows = []
        for pt in group:
            why = bench.skip(pt, ctx) if bench.skip else None
            if why:
                if why not in said:
                    log(f"{bench.name}: {why}")
                    said.add(why)
                continue
            log(f"{bench.name} {_label(pt)}")
            row = _isolated(bench, argv, pt, ctx) if bench.isolate else run_point(pt, ctx)
            if row is not None:
                rows.append((pt, row))
                if bench.progress is not None:
                    log(f"  {bench.progress(pt, row)}")
        reports.append(report(rows, ctx))
    return reports


def run_benchmark(bench: Benchmark, argv: Sequence[str]) -> int:
    """Run ``bench`` with the command line ``argv`` (its options, without its name)."""
    if bench.launcher and "LOCAL_RANK" not in os.environ and set(argv) <= {"--quick"}:  # from run_all
        print(f"SKIPPED {bench.name}: not run here; {bench.launcher} (see its header)")
        return 0
    if not {"-h", "--help"} & set(argv):  # --help works everywhere
        for need in bench.needs:
            why = missing_need(need)
            if why:
                print(f"SKIPPED {bench.name}: {why}")
                return 0
    p = _parser(bench)
    args = p.parse_args(list(argv))
    if args.quick:  # the benchmark's small settings, where the command line left the default
        for dest, value in bench.quick.items():
            if dest not in {a.name for a in bench.axes} and getattr(args, dest, None) == p.get_default(dest):
                setattr(args, dest, value)
    ctx = Context(args=args, grid=_grid(bench, args, p))
    if args.point is not None:  # one point, in the process the parent started for it
        got = json.loads(args.point)
        ctx.data = {k: Path(v) for k, v in got["data"].items()}
        if bench.run_point is None:
            p.error("--point: this benchmark has no points")
        print("CHILD " + json.dumps(bench.run_point(got["point"], ctx), default=str))
        return 0
    ctx.env = environment()
    log(f"{bench.name}: {ctx.env['cores']} cores, load {ctx.env['loadavg_1m']:.1f}; data in {BENCH_DATA}")
    if bench.prepare is not None:
        ctx.data = bench.prepare(ctx)
    if bench.run is not None:
        reports = [bench.run(ctx)]
    else:
        reports = _walk(bench, argv, ctx)
    rc = max([int(r.pop("exit_code", 0)) for r in reports if r] or [0])
    reports = [r for r in reports if r]  # a rank other than 0, a command that only prints
    if not reports:
        return rc
    path = Path(args.json) if args.json else BENCH_DATA / "results" / f"{bench.name}.json"
    write_json(path, reports[0] if len(reports) == 1 else reports)
    lines = [json.dumps(r, sort_keys=True, default=str) for r in reports]
    if max(map(len, lines)) > RESULT_LINE:  # it would push the table out of a log's tail (a GPU run's answer)
        print(f"RESULT-FILE {path}", flush=True)
    for line in lines if max(map(len, lines)) <= RESULT_LINE else ():
        print(f"RESULT {line}", flush=True)
    return rc


# ---------------------------------------------------------------------- all of them
def run_all(argv: Sequence[str]) -> int:
    """Every benchmark in a subprocess, one after the other (``make bench``)."""
    p = argparse.ArgumentParser(prog="benchmarks/run.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="pass --quick to every benchmark")
    p.add_argument("--only", default="", help="comma list of benchmark names (default: all)")
    p.add_argument("--skip", default="", help="comma list of benchmark names to leave out")
    args = p.parse_args(list(argv))
    todo = names()
    if args.only:
        wanted = [n for n in args.only.split(",") if n]
        unknown = sorted(set(wanted) - set(todo))
        if unknown:
            p.error(f"no such benchmark {unknown}; have {', '.join(todo)}")
        todo = [n for n in todo if n in wanted]
    todo = [n for n in todo if n not in set(args.skip.split(","))]
    logs = BENCH_DATA / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    summary = []
    for name in todo:
        cmd = [sys.executable, "-u", str(HERE / "run.py"), name] + (["--quick"] if args.quick else [])
        print(f"\n######## {name}: {' '.join(cmd[2:])}", flush=True)
        with Stopwatch() as took, open(logs / f"{name}.log", "w", encoding="utf-8") as out, \
                open(logs / "results.jsonl", "a", encoding="utf-8") as results:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for line in proc.stdout or ():
                sys.stdout.write(line)
                out.write(line)
                if line.startswith(("RESULT ", "RESULT-FILE ")):
                    stamp = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
                    kind, _, rest = line.partition(" ")
                    got = json.loads(rest) if kind == "RESULT" else json.loads(Path(rest.strip()).read_text())
                    results.write(json.dumps({"benchmark": name, "at": stamp, "result": got}) + "\n")
            rc = proc.wait()
        summary.append((name, rc, took.wall))
    print("\n######## summary")
    for name, rc, took in summary:
        print(f"{name:<16} {'ok' if rc == 0 else f'exit {rc}':<8} {took:7.0f} s   log: {logs / (name + '.log')}")
    return 0 if all(rc == 0 for _, rc, _ in summary) else 1


def main(argv: Sequence[str] | None = None) -> int:
    """``run.py NAME ...`` runs one benchmark; ``run.py [--quick] [--only ...]`` runs them all."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and not argv[0].startswith("-"):
        if argv[0] not in names():
            raise SystemExit(f"benchmarks/run.py: no benchmark {argv[0]!r}; have {', '.join(names())}")
        return run_benchmark(load(argv[0]), argv[1:])
    return run_all(argv)


if __name__ == "__main__":
    sys.exit(main())
