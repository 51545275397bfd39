"""Planning cost of mixed, filtered, elastic epoch plans (issue 18): one rank's plan, no data read.

Scenarios (shard counts are simulated: the planner reads only them and the metadata):

- ``10m``: 10,000,000 samples in 3 datasets (5M / 3M / 2M, 1,000 samples per shard),
  weights 0.5 / 0.3 / 0.2, a ``filter=`` on the first dataset's lengths (keeps about
  half: it is then cycled), W=64, batch 256. Goal: one rank's plan <= 1 s on a 2-core machine.
  Reported apart: the filter's evaluation (once per process, not per epoch).
- ``1b``: 1,000,000,000 samples in 100,000 shards mixed 0.8 / 0.2 with a second dataset
  of 50,000,000 in 5,000 shards, W=1024, batch 512. Goal: one rank's epoch plan <= 2 s
  and <= 1 GB. Nothing is O(N) per rank: the shard permutation is O(shards), a rank
  permutes only the ~120 shards it reads. Also timed: the elastic resume of that epoch
  at W=768 (a new rank computes the first-stage plans of the two or three old ranks
  whose rest it takes).

A filter at the 1B scale: its mask is O(N) bits (125 MB for 1e9) and ``kept`` is
O(kept) int64; store ``kept`` as a ``.npy`` sidecar and memory-map it
(``Selection(kept=np.load(path, mmap_mode="r"), ...)``): a rank then reads only the
pages of its shards, and the per-shard kept counts are O(shards).

Figures: median wall seconds of ``--repeat`` runs per step, and the peak of numpy
allocations during one more, traced run (tracemalloc), printed as a table and a
``RESULT {...}`` JSON line.

Usage:
    PYTHONPATH=. .venv/bin/python benchmarks/plan_scale.py [--scenario 10m|1b|all] [--repeat 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tracemalloc
from pathlib import Path
from typing import Any, Callable

import numpy as np

if __name__ == "__main__":  # run as a script: the repo's root on the path, for benchmarks.lib
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fastfeed.loading.order.rankplan import plan_rank, plan_spec  # noqa: E402
from fastfeed.loading.order.selection import select  # noqa: E402

from benchmarks.lib.measure import Stopwatch  # noqa: E402
from benchmarks.lib.suite import Axis, Benchmark, Context, Point  # noqa: E402


def _timed(fn: Callable[[], Any], repeat: int) -> tuple[float, float, Any]:
    """(median seconds of ``repeat`` untraced runs, peak MB of numpy allocations in one traced run, result)."""
    tracemalloc.start()
    fn()
    peak = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    times = []
    for _ in range(repeat):
        with Stopwatch() as took:
            out = fn()
        times.append(took.wall)
    return statistics.median(times), peak, out


def scenario_10m(repeat: int) -> list[dict[str, Any]]:
    sizes = (5_000_000, 3_000_000, 2_000_000)
    counts = [np.full(n // 1000, 1000, dtype=np.int64) for n in sizes]
    lengths = np.random.default_rng(0).integers(1, 2048, size=sizes[0])
    meta = {"index": np.arange(sizes[0], dtype=np.int64), "length": lengths}
    t_sel, m_sel, sel = _timed(lambda: select(counts[0], filter=lambda m: m["length"] < 1024, meta=meta), repeat)
    spec = plan_spec([sel, counts[1], counts[2]], weights=[0.5, 0.3, 0.2], seed=0)
    rows = [{"scenario": "10m", "step": "filter (once)", "s": t_sel, "peak_mb": m_sel, "kept": sel.size}]
    for rank in (0, 63):
        t, m, plan = _timed(lambda r=rank: plan_rank(spec, epoch=3, world_size=64, rank=r, batch_size=256), repeat)
        rows.append({"scenario": "10m", "step": f"rank {rank} plan", "s": t, "peak_mb": m,
                     "batches": plan.num_batches, "samples": int(plan.ids.shape[0])})
    return rows


def scenario_1b(repeat: int) -> list[dict[str, Any]]:
    big = np.full(100_000, 10_000, dtype=np.int64)
    small = np.full(5_000, 10_000, dtype=np.int64)
    t_spec, m_spec, spec = _timed(lambda: plan_spec([big, small], weights=[0.8, 0.2], seed=0), repeat)
    rows = [{"scenario": "1b", "step": "spec", "s": t_spec, "peak_mb": m_spec, "epoch_samples": spec.epoch_samples}]
    for rank in (0, 1023):
        t, m, plan = _timed(lambda r=rank: plan_rank(spec, epoch=5, world_size=1024, rank=r, batch_size=512),
                             repeat)
        rows.append({"scenario": "1b", "step": f"rank {rank} plan", "s": t, "peak_mb": m,
                     "batches": plan.num_batches, "samples": int(plan.ids.shape[0])})
    state = plan.state(plan.num_batches // 3)
    t, m, resumed = _timed(lambda: plan_rank(spec, epoch=5, world_size=768, rank=500, batch_size=512,
                                             resume=state), repeat)
    rows.append({"scenario": "1b", "step": "resume at W=768, rank 500", "s": t, "peak_mb": m,
                 "batches": resumed.num_batches, "samples": int(resumed.ids.shape[0])})
    return rows


SCENARIOS = {"10m": scenario_10m, "1b": scenario_1b}


def options(ap: argparse.ArgumentParser) -> None:
    """Runs per step."""
    ap.add_argument("--repeat", type=int, default=3, help="untraced runs per step (the median reported)")


def run_point(point: Point, ctx: Context) -> list[dict[str, Any]]:
    """Every step of one scenario."""
    return SCENARIOS[point["scenario"]](ctx.args.repeat)


def report(rows: list[tuple[Point, list[dict[str, Any]]]], ctx: Context) -> dict[str, Any]:
    """Median seconds and peak MB of every step."""
    steps = [r for _, scenario in rows for r in scenario]
    print(f"{'scenario':<9} {'step':<28} {'median s':>9} {'peak MB':>9}  extra")
    for r in steps:
        extra = {k: v for k, v in r.items() if k not in ("scenario", "step", "s", "peak_mb")}
        print(f"{r['scenario']:<9} {r['step']:<28} {r['s']:9.3f} {r['peak_mb']:9.1f}  {extra}")
    return {"benchmark": "plan_scale", "repeat": ctx.args.repeat, "rows": steps}


BENCHMARK = Benchmark(
    name="plan_scale", doc=__doc__, options=options, run_point=run_point, report=report,
    grid=(Axis("scenario", tuple(SCENARIOS), flag="--scenario", aliases={"all": tuple(SCENARIOS)},
               help="10m, 1b or all"),),
    quick={"scenario": ("10m",), "repeat": 1},
)

if __name__ == "__main__":
    from benchmarks.run import main

    sys.exit(main([BENCHMARK.name, *sys.argv[1:]]))
