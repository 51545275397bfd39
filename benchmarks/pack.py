"""Goal: ``fastfeed pack`` at 2 workers is >= 2x as fast as the fastest peer.

One generated ImageFolder (``bench-data/synth-N``: ImageNet-like JPEGs, ~500x375, q90,
~100 KB, 100 classes; made once by :mod:`benchmarks.lib.data` and reused) is packed into
~256 MB tar shards, in one run, by

- ``fastfeed.pack`` with 1 and 2 worker processes (its defaults: shuffled order, sha256
  of every shard, DALI index files, resume records, the index);
- ``webdataset.ShardWriter``, the way its documentation writes shards: one process, a
  loop that reads each file and writes ``{"__key__", "jpg", "cls"}`` (same keys as
  fastfeed, same shuffled order, ``maxsize`` 256 MB);
- ``litdata.optimize`` with the same number of workers (2), when litdata imports: a
  function returning ``{"jpg": bytes, "cls": int}`` per file, ``chunk_bytes`` 256 MB.

Every run happens in a fresh Python process (so no run inherits another's threads or
state), and its time runs from the call to its return, after the tool's module is
imported (data written to the page cache; no tool syncs to disk, and the previous run's
output is deleted and synced away first). Besides wall time, each run reports its CPU time
(user + system, the process and its worker processes): on a shared machine wall time
measures the other tenants as much as the tool, CPU time much less. ``--out`` picks where
the shards go (default ``bench-data/pack-out``, on the same disk as the source).
The page cache is set the same way before every run: ``cold`` drops the source files
from it (``posix_fadvise(DONTNEED)``), ``warm`` reads them all first.

Run (dev machine; ~10 minutes the first time, most of it generating the images)::

    .venv-bench/bin/python benchmarks/pack.py            # with litdata (make bench-env)
    .venv/bin/python benchmarks/pack.py                  # without litdata
    .venv/bin/python benchmarks/pack.py --cache warm --repeat 3 --skip litdata

Prints files/s and MB/s per tool and cache state, fastfeed's ratios to each peer and to
the fastest peer, and one ``RESULT {json}`` line.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import statistics
import sys
from pathlib import Path
from typing import Any

if __name__ == "__main__":  # run as a script: the repo's root on the path, for benchmarks.lib
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.lib.data import BENCH_DATA, prepare_pack_run, synth_image_folder  # noqa: E402
from benchmarks.lib.measure import Stopwatch, rusage_cpu_seconds  # noqa: E402
from benchmarks.lib.peers import PACKERS, list_imagefolder  # noqa: E402
from benchmarks.lib.report import log  # noqa: E402
from benchmarks.lib.suite import REPEAT, Axis, Benchmark, Context, Point  # noqa: E402

GOAL = 2.0
SUBJECT = "fastfeed 2 workers"


def _busy(seconds: float) -> None:
    clock = Stopwatch.start()
    while clock.elapsed() < seconds:
        pass


def core_headroom(seconds: float = 3.0) -> float:
    """CPU time two busy processes get together, relative to one alone (2.0 on 2 free cores).

    On a shared machine this says how much a second worker can add at all.
    """
    got = []
    for n in (1, 2):
        c0 = rusage_cpu_seconds()
        procs = [mp.get_context("fork").Process(target=_busy, args=(seconds,)) for _ in range(n)]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
        got.append(rusage_cpu_seconds() - c0)
    return got[1] / got[0]


def options(ap: argparse.ArgumentParser) -> None:
    """The data, where the shards go, which tools."""
    ap.add_argument("--images", type=int, default=20_000, help="JPEGs to pack (default 20000)")
    ap.add_argument("--src", default=None, help="pack this ImageFolder instead of the generated one")
    ap.add_argument("--skip", default="", help="comma-separated tools to leave out (e.g. litdata)")
    ap.add_argument("--out", default=str(BENCH_DATA / "pack-out"),
                    help="where the shards go (deleted after each run)")
    ap.add_argument("--headroom-only", action="store_true",
                    help="only measure how much CPU a second process can get here, then stop")


def prepare(ctx: Context) -> dict[str, Path]:
    """How much CPU a second process gets here (into the environment), then the source folder."""
    ctx.env["core_headroom"] = core_headroom()
    log(f"two busy processes get {ctx.env['core_headroom']:.2f}x the CPU time of one (2.00 on 2 free cores), "
        f"load {os.getloadavg()[0]:.1f}")
    if ctx.args.headroom_only:
        return {}
    src = Path(ctx.args.src) if ctx.args.src else synth_image_folder(ctx.args.images)
    items = list_imagefolder(src)
    log(f"{len(items)} files, {sum(os.path.getsize(p) for p, _, _ in items) / 1e6:.0f} MB in {src}; "
        f"output to {ctx.args.out}")
    return {"src": src}


def skip(point: Point, ctx: Context) -> str | None:
    """Tools left out on the command line, or not installed here."""
    name = point["tool"]
    if ctx.args.headroom_only:
        return "--headroom-only: no packing"
    if any(s.strip() and s.strip() in name for s in ctx.args.skip.split(",")):
        return f"{name}: left out (--skip)"
    if name.startswith("litdata"):
        try:
            import litdata  # noqa: F401
        except ImportError:
            return ("litdata is not installed here (it needs torchvision, i.e. the 5.5 GB CUDA torch build): "
                    "run with .venv-bench/bin/python to include it")
    return None


def run_point(point: Point, ctx: Context) -> dict[str, float]:
    """One timed run of one tool, in this fresh process: from the call to its return, after the
    tool's module is imported; CPU is this process plus its worker processes, which every tool
    waits for before returning."""
    src, out = ctx.data["src"], Path(ctx.args.out)
    prepare_pack_run(src, out, point["cache"])
    fn, workers, module = PACKERS[point["tool"]]
    __import__(module)
    items = list_imagefolder(src)
    c0 = rusage_cpu_seconds()
    with Stopwatch() as took:
        n = fn(src, out, items, workers)
    return {"n": n, "seconds": took.wall, "cpu": rusage_cpu_seconds() - c0, "load": os.getloadavg()[0]}


def progress(point: Point, run: dict[str, float]) -> str:
    """The run's wall and CPU time."""
    return (f"{point['cache']:>4} {point['tool']}: {run['seconds']:.1f} s, {run['cpu']:.1f} CPU s, "
            f"load {run['load']:.1f}")


def report(rows: list[tuple[Point, dict[str, float]]], ctx: Context) -> dict[str, Any]:
    """files/s, MB/s and CPU per file per tool and cache state; fastfeed against the fastest peer."""
    if not rows:
        return {}
    src, out = ctx.data["src"], Path(ctx.args.out)
    shutil.rmtree(out, ignore_errors=True)
    items = list_imagefolder(src)
    files, total = len(items), sum(os.path.getsize(p) for p, _, _ in items)
    times: dict[tuple[str, str], list[float]] = {}
    cpus: dict[tuple[str, str], list[float]] = {}
    for pt, run in rows:
        if int(run["n"]) != files:
            raise SystemExit(f"{pt['tool']} wrote {int(run['n'])} samples, expected {files}")
        times.setdefault((pt["tool"], pt["cache"]), []).append(run["seconds"])
        cpus.setdefault((pt["tool"], pt["cache"]), []).append(run["cpu"])
    names = list(dict.fromkeys(pt["tool"] for pt, _ in rows))
    caches = list(dict.fromkeys(pt["cache"] for pt, _ in rows))
    print(f"\n== fastfeed pack vs peers: {files} JPEGs, {total / 1e6:.0f} MB, 256 MB tar shards, output in {out}")
    print(f"{'tool':<28}" + "".join(f"{c + ' files/s':>16}{c + ' MB/s':>12}{c + ' CPU ms/file':>18}"
                                     for c in caches))
    rates: dict[str, dict[str, float]] = {}
    cpu_ms: dict[str, dict[str, float]] = {}
    for name in names:
        cells = ""
        for c in caches:
            dt = statistics.median(times[(name, c)])
            rates.setdefault(c, {})[name] = files / dt
            cpu_ms.setdefault(c, {})[name] = statistics.median(cpus[(name, c)]) / files * 1e3
            cells += f"{files / dt:>16,.0f}{total / dt / 1e6:>12,.0f}{cpu_ms[c][name]:>18.3f}"
        print(f"{name:<28}{cells}")
    ratios: dict[str, dict[str, float]] = {}
    met = True
    for c in caches:
        me = rates[c].get(SUBJECT)
        peers = {n: r for n, r in rates[c].items() if not n.startswith("fastfeed")}
        if not peers or not me:
            continue
        ratios[c] = {n: me / r for n, r in peers.items()}
        best = max(peers, key=peers.__getitem__)
        ratio = me / peers[best]
        met = met and ratio >= GOAL
        one = rates[c].get("fastfeed 1 worker", float("nan")) / peers[best]
        print(f"  {c}: {SUBJECT} / fastest peer ({best}) = {ratio:.2f}x "
              f"[goal >= {GOAL:g}: {'met' if ratio >= GOAL else 'MISSED'}]; 1 worker: {one:.2f}x; "
              + "; ".join(f"vs {n} {v:.2f}x" for n, v in ratios[c].items()))
        eff = cpu_ms[c][best] / cpu_ms[c][SUBJECT]
        print(f"  {c}: CPU per file, {best} / {SUBJECT} = {eff:.2f}x (fastfeed uses {1 / eff:.0%} "
              "of the peer's CPU time per file)")
    env = {**ctx.env, "loadavg_1m_end": os.getloadavg()[0]}
    return {"title": "pack", "files": files, "bytes": total, "env": env, "out": str(out),
            "seconds": {f"{n}|{c}": v for (n, c), v in times.items()},
            "cpu_s": {f"{n}|{c}": v for (n, c), v in cpus.items()}, "cpu_ms_per_file": cpu_ms,
            "files_per_s": rates, "ratios": ratios, "goal": GOAL, "exit_code": 0 if met else 1}


BENCHMARK = Benchmark(
    name="pack", doc=__doc__, options=options, prepare=prepare, skip=skip, run_point=run_point,
    progress=progress, report=report, isolate=True,
    grid=(Axis("cache", ("cold", "warm"), flag="--cache", aliases={"both": ("cold", "warm")},
               help="the source's page cache: cold, warm or both"),
          REPEAT,
          Axis("tool", tuple(PACKERS), help="the packers compared")),
    quick={"images": 2_000},
)

if __name__ == "__main__":
    from benchmarks.run import main

    sys.exit(main([BENCHMARK.name, *sys.argv[1:]]))
