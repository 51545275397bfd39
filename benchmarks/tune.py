"""Goal: `fastfeed tune` finds a near-best setting far faster than a grid, and beats PyTorch's default.

On one packed dataset of ImageNet-like JPEGs (generated, ~500x375, q90), with the same
pipeline for every setting (``fastfeed.loader``: decode -> RandomResizedCrop ->
flip -> uint8 batch), this script measures

1. ``fastfeed.tune`` (its own search, time budget and per-setting time, and its own
   confirmation of its top candidates, all counted in its measuring time);
2. the exhaustive grid: num_workers 0 .. ``--max-workers`` x ``--prefetch`` factors,
   each setting measured for the same per-setting time as tune uses, through the same
   measuring core (steady state only: start-up and the prefetch burst excluded, epochs
   as one stream with persistent workers; settings that never reached steady state are
   flagged and cannot be the grid's best);
3. a confirmation round: the tuned setting, the grid's two best and ``num_workers=0``
   (PyTorch's default) measured again with longer trials, interleaved, ``--confirm``
   rounds each. The grid's best in-grid figure is the maximum of many noisy
   measurements, so it is biased upwards; the goals compare the confirmation medians,
   with the better of the grid's two best as "grid best".

Goals: tuned >= 95% of the grid's best throughput; tune's measuring time <= 25% of the
grid's; tuned >= 2x ``num_workers=0``.

Every number comes from ``fastfeed.timing.measure.measure`` (the tune module's
``measure_loader``), the same core tune uses. Grid results are saved after every setting
in ``--state`` (JSON), so a run cut short (e.g. a 10-minute limit) continues where it
stopped when started again with the same arguments.

Run (dev machine, 2 cores)::

    .venv/bin/python benchmarks/tune.py

Run (16-core GPU machine, ``bash benchmarks/gpu_runs.sh tune``; CPU decode; needs only
what fastfeed's core imports: torch, numpy, Pillow; nothing to install there)::

    taskset -c 0-15 python3 benchmarks/tune.py --json $OUT/tune-h200.json

The defaults scale with the cores: ``1500 x cores`` images (24,000 on 16 cores: an
epoch of 375 batches, far longer than any prefetch queue), workers 0 .. 1.5 x cores,
prefetch 1, 2, 4, 8 (1 + 24 x 4 = 97 settings on 16 cores, ~4-5 minutes), 2 s per
setting, tune's budget 60 s (40% of it kept for its confirmation step). With all
eight prefetch factors (``--prefetch 1,2,3,4,5,6,7,8``) it does not fit a 10-minute
command: it stops at ``--deadline`` with "grid incomplete"; the same command with
``--resume`` continues it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
from pathlib import Path
from typing import Any

import numpy as np

if __name__ == "__main__":  # run as a script: the repo's root on the path, for benchmarks.lib
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fastfeed.host import cpu_count, host_info  # noqa: E402
from fastfeed.knobs.space import Setting  # noqa: E402
from fastfeed.packed.index import DatasetIndex  # noqa: E402
from fastfeed.tuning.api import measure_loader, tune  # noqa: E402

from benchmarks.lib.data import BENCH_DATA, synth_image_folder, warm  # noqa: E402
from benchmarks.lib.measure import Stopwatch  # noqa: E402
from benchmarks.lib.suite import Axis, Benchmark, Context  # noqa: E402


# ---------------------------------------------------------------------- data
def make_dataset(root: Path, images: int, size: tuple[int, int]) -> Path:
    """The generated JPEGs (``bench-data/synth-N``) packed with pack's defaults once; later runs reuse it."""
    packed = root / f"packed-{images}-{size[0]}x{size[1]}"
    if DatasetIndex.exists(packed):
        return packed
    from fastfeed.packing.api import pack

    with Stopwatch() as took:
        pack(str(synth_image_folder(images, size=size)), str(packed))
    print(f"dataset: {images} JPEGs {size[0]}x{size[1]} packed in {took.wall:.0f}s -> {packed}")
    return packed


# ---------------------------------------------------------------------- measuring
def _key(s: Setting) -> str:
    return f"{s.num_workers}:{s.prefetch_factor}"


def _progress(t: Any) -> None:
    m = t.measurement
    figure = f"{m.samples_per_s:,.0f} samples/s, start-up {m.startup_s:.1f}s" if m else t.status
    print(f"  tune {t.phase} {t.setting.label}: {figure} ({t.seconds:.1f}s)"
          f"{'' if m is None or m.steady else '  NOT STEADY: ' + m.note}", flush=True)


def run_grid(path: Path, settings: list[Setting], state: Path, *, per_trial: float, clock: Stopwatch,
             deadline: float, common: dict[str, Any]) -> tuple[dict[str, dict[str, Any]], bool]:
    """Measure every setting not yet in ``state`` (until ``clock`` passes ``deadline``); (results, complete)."""
    done: dict[str, dict[str, Any]] = json.loads(state.read_text()) if state.exists() else {}
    for i, s in enumerate(settings):
        if _key(s) in done:
            continue
        if clock.elapsed() > deadline:
            return done, False
        with Stopwatch() as took:
            m = measure_loader(path, s, seconds=per_trial, **common)
        done[_key(s)] = {"workers": s.num_workers, "prefetch": s.prefetch_factor or 0,
                         "rate": m.samples_per_s, "p10": m.p10_samples_per_s,
                         "p90": m.p90_samples_per_s, "steady": m.steady, "note": m.note,
                         "startup_s": m.startup_s, "warmup_batches": m.warmup_batches,
                         "steady_batches": m.batches, "seconds": took.wall}
        state.write_text(json.dumps(done, indent=1))
        flag = "" if m.steady else f"  NOT STEADY ({m.note})"
        print(f"  grid {i + 1}/{len(settings)} {s.label}: {m.samples_per_s:,.0f} samples/s "
              f"(p10..p90 {m.p10_samples_per_s:,.0f}..{m.p90_samples_per_s:,.0f}, start-up "
              f"{m.startup_s:.1f}s, {m.batches} steady batches, {took.wall:.1f}s){flag}", flush=True)
    return done, True


def grid_ranking(grid: dict[str, dict[str, Any]]) -> list[Setting]:
    """Grid settings by in-grid rate, steady ones first (an unsteady figure is not a result)."""
    rows = sorted(grid.values(), key=lambda r: (not r.get("steady", True), -r["rate"]))
    return [Setting(int(r["workers"]), int(r["prefetch"]) or None) for r in rows]


def confirm(path: Path, settings: dict[str, Setting], rounds: int, per_trial: float,
            common: dict[str, Any]) -> tuple[dict[str, float], dict[str, list[float]]]:
    """Interleaved re-measurement in rotating order; (median samples/s, all rates) per name."""
    rates: dict[str, list[float]] = {k: [] for k in settings}
    names = list(settings)
    for r in range(rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:
            m = measure_loader(path, settings[name], seconds=per_trial, **common)
            rates[name].append(m.samples_per_s)
            print(f"  confirm round {r + 1} {name} ({settings[name].label}): {m.samples_per_s:,.0f} "
                  f"samples/s{'' if m.steady else '  NOT STEADY: ' + m.note}", flush=True)
    return {k: float(np.median(v)) for k, v in rates.items()}, rates


# ---------------------------------------------------------------------- the run
def options(ap: argparse.ArgumentParser) -> None:
    """The data, the batch shape, the times; the grid's workers (its prefetch factors: the grid axis)."""
    ap.add_argument("--data", type=Path, default=BENCH_DATA / "tune")
    ap.add_argument("--images", type=int, default=None, help="JPEGs (default 1500 x cores, >= 3000)")
    ap.add_argument("--size", default="500x375", help="JPEG size WxH (varied +-25%%)")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--per-trial", type=float, default=2.0,
                    help="seconds per measured setting (60%% of it steady state, after start-up and warm-up)")
    ap.add_argument("--budget", default=None,
                    help="tune's time budget, its confirmation included (default: 30 x per-trial)")
    ap.add_argument("--max-workers", type=int, default=None,
                    help="grid and tune cap (default 1.5 x cores, at least 4)")
    ap.add_argument("--confirm", type=int, default=3, help="interleaved re-measurement rounds")
    ap.add_argument("--confirm-scale", type=float, default=1.5,
                    help="confirmation trials are this many times --per-trial")
    ap.add_argument("--deadline", type=float, default=1e9,
                    help="stop the grid after this many seconds (rerun to resume)")
    ap.add_argument("--state", type=Path, default=None, help="grid results file")
    ap.add_argument("--resume", action="store_true",
                    help="continue the grid saved in --state (default: measure it afresh)")


def prepare(ctx: Context) -> dict[str, Any]:
    """The packed dataset, in the page cache; the run's clock (``--deadline`` counts from here)."""
    clock = Stopwatch.start()
    args = ctx.args
    w, h = (int(x) for x in args.size.lower().split("x"))
    args.data.mkdir(parents=True, exist_ok=True)
    images = args.images if args.images is not None else max(3000, 1500 * cpu_count())
    path = make_dataset(args.data, images, (w, h))
    warm(path)
    return {"path": path, "images": images, "clock": clock}


def run(ctx: Context) -> dict[str, Any]:
    """tune, the exhaustive grid, the confirmation round, the goals."""
    args = ctx.args
    cores = cpu_count()
    path, images, clock = ctx.data["path"], ctx.data["images"], ctx.data["clock"]
    cap = args.max_workers if args.max_workers is not None else max(4, 3 * cores // 2)
    prefetch = list(ctx.grid["prefetch"])
    common: dict[str, Any] = {"batch_size": args.batch_size, "image_size": args.image_size, "decode": "cpu"}
    host = host_info()
    print(f"host: {cores} cores, {host.memory_gib} GiB, {host.cpu_model}; load average "
          f"{os.getloadavg()[0]:.1f}; batch {args.batch_size}, image_size {args.image_size}, "
          f"{images} images, {args.per_trial}s per setting, workers 0..{cap}, prefetch {','.join(map(str, prefetch))}")

    # 1. tune (not stored: the benchmark must not change what loader(num_workers="auto") does)
    budget = args.budget or 30 * args.per_trial
    tuned = tune(path, batch_size=args.batch_size, image_size=args.image_size, time_budget=budget,
                 max_workers=cap, trial_time=args.per_trial, store=False, on_trial=_progress)
    print(tuned.table())
    print(tuned.summary())

    # 2. the grid
    settings = [Setting(0, None)] + [Setting(w, p) for w in range(1, cap + 1) for p in prefetch]
    state = args.state or args.data / f"grid-{cores}c-b{args.batch_size}-s{args.image_size}-{args.per_trial}s.json"
    if not args.resume:
        state.unlink(missing_ok=True)
    grid, complete = run_grid(path, settings, state, per_trial=args.per_trial,
                              clock=clock, deadline=args.deadline, common=common)
    if not complete:
        print(f"grid incomplete ({len(grid)}/{len(settings)} settings, saved in {state}); "
              "run the same command again with --resume to continue")
        return {"grid_incomplete": {"settings": len(grid), "of": len(settings), "state": str(state)}, "exit_code": 3}
    ranking = grid_ranking(grid)
    grid_best, grid_2nd = ranking[0], ranking[1] if len(ranking) > 1 else ranking[0]
    g = grid[_key(grid_best)]
    grid_s = sum(r["seconds"] for r in grid.values())
    tune_s = tuned.measuring_s
    unsteady = [k for k, r in grid.items() if not r.get("steady", True)]

    # 3. confirmation: tuned vs the grid's two best vs PyTorch's default, interleaved
    conf, conf_rates = confirm(path, {"tuned": tuned.setting, "grid best": grid_best, "grid 2nd": grid_2nd,
                                      "num_workers=0": Setting(0)},
                               args.confirm, args.confirm_scale * args.per_trial, common)
    best_name = max(("grid best", "grid 2nd"), key=lambda k: conf[k])
    grid_conf = conf[best_name]
    figures = {
        "date": datetime.date.today().isoformat(),
        "host": host.to_json(),
        "python": platform.python_version(),
        "args": {k: str(v) for k, v in vars(args).items() if k != "point"},
        "images": images,
        "max_workers": cap,
        "tuned": tuned.setting.loader_kwargs(),
        "tuned_trials": len(tuned.trials),
        "tuned_reason": tuned.reason,
        "tune_confirmed": [{**c.setting.loader_kwargs(), "median": c.rate, "rates": c.rates}
                           for c in tuned.confirmed],
        "grid_best": grid_best.loader_kwargs(),
        "grid_2nd": grid_2nd.loader_kwargs(),
        "grid_best_confirmed": (grid_best if best_name == "grid best" else grid_2nd).loader_kwargs(),
        "grid_settings": len(grid),
        "grid_unsteady": unsteady,
        "grid_best_rate_in_grid": g["rate"],
        "tuned_rate_in_grid": grid.get(_key(tuned.setting), {}).get("rate"),
        "confirm": conf,
        "confirm_rates": conf_rates,
        "tuned_vs_grid_best": conf["tuned"] / grid_conf,
        "tune_time_vs_grid_time": tune_s / grid_s,
        "tuned_vs_workers0": conf["tuned"] / conf["num_workers=0"],
        "tune_measuring_s": tune_s,
        "load_average_end": os.getloadavg()[0],
        "grid_measuring_s": grid_s,
        "grid": grid,
        "tune_trials": tuned.to_json()["trials"],
        "total_s": clock.elapsed(),
    }
    goals = [
        ("tuned >= 95% of the grid's best", figures["tuned_vs_grid_best"] >= 0.95,
         f"{figures['tuned_vs_grid_best']:.3f}"),
        ("tune time <= 25% of the grid's", figures["tune_time_vs_grid_time"] <= 0.25,
         f"{figures['tune_time_vs_grid_time']:.3f} ({tune_s:.0f}s vs {grid_s:.0f}s)"),
        ("tuned >= 2x num_workers=0", figures["tuned_vs_workers0"] >= 2.0,
         f"{figures['tuned_vs_workers0']:.2f}x"),
    ]
    print()
    print(f"grid: {len(grid)} settings ({len(unsteady)} never steady), best {grid_best.label} at "
          f"{g['rate']:,.0f} samples/s (in grid), 2nd {grid_2nd.label}")
    print(f"tune: {len(tuned.trials)} settings, chose {tuned.setting.label}")
    print("confirmation medians (samples/s): " + ", ".join(f"{k} {v:,.0f}" for k, v in conf.items()))
    for name, ok, value in goals:
        print(f"  {'PASS' if ok else 'FAIL'}  {name}: {value}")
    if tuned.setting == Setting(0):
        print("  note: tune chose num_workers=0 (workers did not help on this machine now); the "
              "third ratio compares a setting with itself and shows the run-to-run noise")
    figures["goals"] = {name: ok for name, ok, _ in goals}
    print(f"total {clock.elapsed():.0f}s; load average now {os.getloadavg()[0]:.1f}")
    figures["exit_code"] = 0 if all(ok for _, ok, _ in goals) else 1
    return figures


BENCHMARK = Benchmark(
    name="tune", doc=__doc__, options=options, prepare=prepare, run=run,
    grid=(Axis("prefetch", (1, 2, 4, 8), choices=tuple(range(1, 65)), flag="--prefetch", parse=int,
               help="grid prefetch factors (the workers: 0 .. --max-workers)"),),
    quick={"per_trial": 1.0, "max_workers": 3, "prefetch": (1, 2), "confirm": 2},
)

if __name__ == "__main__":
    from benchmarks.run import main

    sys.exit(main([BENCHMARK.name, *sys.argv[1:]]))
