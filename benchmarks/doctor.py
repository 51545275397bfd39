"""Goal: `fastfeed doctor`'s figures agree with the benchmarks', and it keeps to its time budget.

On one packed dataset of ImageNet-like JPEGs (generated, ~500x375 +-25%, q90, tar shards;
the raw folder is passed as ``--source``), this script

1. runs ``fastfeed.doctor`` (CPU decode -> RandomResizedCrop ``--image-size`` -> flip, the
   loader at its tuned or heuristic setting, ``--step-time`` as the training step) and
   prints its report;
2. after each doctor run, measures the same loader setting the way ``benchmarks/tune.py``
   and ``fastfeed tune`` do (``fastfeed.tuning.api.measure_loader``, as long as the doctor
   measured it); ``--repeat`` rounds, interleaved, so both see the same load;
3. prints the ratio of the medians, doctor / benchmark, for the loader (goal: within
   0.85-1.15, the measurement noise) and the doctor's wall time against its budget
   (goal: <= 1.5x the budget plus 15 s of start-up: worker launches, imports, the decode pool).

Every figure comes from ``fastfeed.timing.measure.measure``. On a machine with a GPU and NVIDIA
DALI the doctor also measures ``decode="dali"``.

Run (dev machine, 2 cores)::

    .venv/bin/python benchmarks/doctor.py --images 1000 --batch-size 64 --time-budget 30s

Run (GPU machine, 16 cores; after ``source benchmarks/gpu_setup.sh`` so DALI imports)::

    source benchmarks/gpu_setup.sh && python3 benchmarks/doctor.py --images 10000 --batch-size 256 \\
        --step-time 0.1 --time-budget 60s --json $OUT/doctor-h200.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

if __name__ == "__main__":  # run as a script: the repo's root on the path, for benchmarks.lib
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fastfeed._util import parse_duration  # noqa: E402
from fastfeed.diagnosis.api import doctor  # noqa: E402
from fastfeed.knobs.space import Setting  # noqa: E402
from fastfeed.tuning.api import measure_loader  # noqa: E402

from benchmarks.lib.data import pack_once, synth_image_folder  # noqa: E402
from benchmarks.lib.measure import Stopwatch  # noqa: E402
from benchmarks.lib.report import log  # noqa: E402
from benchmarks.lib.suite import REPEAT, Benchmark, Context, Point  # noqa: E402


def options(ap: argparse.ArgumentParser) -> None:
    """The data, the batch shape, the simulated step, the doctor's budget."""
    ap.add_argument("--images", type=int, default=1000)
    ap.add_argument("--samples-per-shard", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--step-time", type=float, default=0.25, help="simulated training step, seconds per batch")
    ap.add_argument("--time-budget", default="30s")


def prepare(ctx: Context) -> dict[str, Any]:
    """The generated JPEGs and their pack."""
    src = synth_image_folder(ctx.args.images)
    return {"src": src, "packed": pack_once(src, samples_per_shard=ctx.args.samples_per_shard), "report": None}


def run_point(point: Point, ctx: Context) -> dict[str, Any]:
    """One doctor run, then the same loader setting measured as tune measures it, as long."""
    args, packed = ctx.args, ctx.data["packed"]
    log(f"doctor run {point['round'] + 1} on {packed} ({args.images} images)")
    with Stopwatch() as took:
        r = doctor(packed, source=ctx.data["src"], batch_size=args.batch_size, image_size=args.image_size,
                   step_time=args.step_time, time_budget=parse_duration(args.time_budget))
    ctx.data["report"] = ctx.data["report"] or r
    loader = r.stage("loader")
    s = r.settings
    setting = Setting(s["num_workers"], s["prefetch_factor"])
    # exactly what the doctor ran: the same function, setting and seconds
    m = measure_loader(packed, setting, batch_size=args.batch_size, image_size=args.image_size,
                       seconds=loader.figures["seconds"])
    log(f"doctor {loader.samples_per_s:,.0f}, benchmark {m.samples_per_s:,.0f} samples/s")
    return {"doctor": loader.samples_per_s, "bench": m.samples_per_s, "took": took.wall, "setting": setting.label}


def report(rows: list[tuple[Point, dict[str, Any]]], ctx: Context) -> dict[str, Any]:
    """The doctor's report, the ratio of the medians, its wall time against its budget."""
    args, rep = ctx.args, ctx.data["report"]
    doctors, bench, took = ([r[k] for _, r in rows] for k in ("doctor", "bench", "took"))
    budget = parse_duration(args.time_budget)
    print(rep.text())
    ratio = statistics.median(doctors) / statistics.median(bench)
    slowest = max(took)
    print(f"\n== doctor vs benchmark, loader at {rows[-1][1]['setting']}, {len(rows)} interleaved runs each")
    print(f"doctor {', '.join(f'{x:,.0f}' for x in doctors)}; benchmark (measure_loader) "
          f"{', '.join(f'{x:,.0f}' for x in bench)} samples/s")
    print(f"median ratio {ratio:.2f} [0.85-1.15: {'met' if 0.85 <= ratio <= 1.15 else 'MISSED'}]")
    print(f"doctor wall time {', '.join(f'{t:.0f}' for t in took)} s for a {budget:.0f} s budget "
          f"[<= {1.5 * budget + 15:.0f} s: {'met' if slowest <= 1.5 * budget + 15 else 'MISSED'}]")
    return {"env": ctx.env, "images": args.images, "batch_size": args.batch_size, "image_size": args.image_size,
            "doctor_loader": doctors, "benchmark_loader": bench, "ratio": ratio, "doctor_seconds": took,
            "budget_seconds": budget, "report": rep.to_json()}


BENCHMARK = Benchmark(
    name="doctor", doc=__doc__, options=options, prepare=prepare, run_point=run_point, report=report,
    grid=(REPEAT,), repeat=3,
    quick={"time_budget": "10s", "repeat": 1},
)

if __name__ == "__main__":
    from benchmarks.run import main

    sys.exit(main([BENCHMARK.name, *sys.argv[1:]]))
