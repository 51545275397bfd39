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
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks._common import environment, log, pack_once, synth_image_folder  # noqa: E402
from fastfeed._util import parse_duration  # noqa: E402
from fastfeed.diagnosis.api import doctor  # noqa: E402
from fastfeed.tuning.api import measure_loader  # noqa: E402
from fastfeed.knobs.space import Setting  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--images", type=int, default=1000)
    ap.add_argument("--samples-per-shard", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--step-time", type=float, default=0.25, help="simulated training step, seconds per batch")
    ap.add_argument("--time-budget", default="30s")
    ap.add_argument("--repeat", type=int, default=3, help="doctor runs, each followed by a benchmark run")
    ap.add_argument("--json", default=None, help="write the results here too")
    args = ap.parse_args(argv)

    env = environment()
    src = synth_image_folder(args.images)
    packed = pack_once(src, samples_per_shard=args.samples_per_shard)
    budget = parse_duration(args.time_budget)
    doctors: list[float] = []
    bench: list[float] = []
    took: list[float] = []
    report = None
    for k in range(args.repeat):  # interleaved, so both see the same load on the machine
        log(f"doctor run {k + 1} on {packed} ({args.images} images)")
        t0 = time.perf_counter()
        r = doctor(packed, source=src, batch_size=args.batch_size, image_size=args.image_size,
                   step_time=args.step_time, time_budget=budget)
        took.append(time.perf_counter() - t0)
        report = report or r
        loader = r.stage("loader")
        doctors.append(loader.samples_per_s)
        s = r.settings
        setting = Setting(s["num_workers"], s["prefetch_factor"])
        # exactly what the doctor ran: the same function, setting and seconds
        m = measure_loader(packed, setting, batch_size=args.batch_size, image_size=args.image_size,
                           seconds=loader.figures["seconds"])
        bench.append(m.samples_per_s)
        log(f"doctor {loader.samples_per_s:,.0f}, benchmark {m.samples_per_s:,.0f} samples/s")
    print(report.text())
    ratio = statistics.median(doctors) / statistics.median(bench)
    slowest = max(took)
    print(f"\n== doctor vs benchmark, loader at {setting.label}, {args.repeat} interleaved runs each")
    print(f"doctor {', '.join(f'{x:,.0f}' for x in doctors)}; benchmark (measure_loader) "
          f"{', '.join(f'{x:,.0f}' for x in bench)} samples/s")
    print(f"median ratio {ratio:.2f} [0.85-1.15: {'met' if 0.85 <= ratio <= 1.15 else 'MISSED'}]")
    print(f"doctor wall time {', '.join(f'{t:.0f}' for t in took)} s for a {budget:.0f} s budget "
          f"[<= {1.5 * budget + 15:.0f} s: {'met' if slowest <= 1.5 * budget + 15 else 'MISSED'}]")
    out = {"env": env, "images": args.images, "batch_size": args.batch_size, "image_size": args.image_size,
           "doctor_loader": doctors, "benchmark_loader": bench, "ratio": ratio, "doctor_seconds": took,
           "budget_seconds": budget, "report": report.to_json()}
    print("RESULT " + json.dumps({k: v for k, v in out.items() if k != "report"}, sort_keys=True))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
