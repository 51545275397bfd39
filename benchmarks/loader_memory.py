"""Goal: fastfeed's workers use no more memory than ImageFolder's, and none leaks over epochs.

Two measurements, each loader in a fresh Python process of its own (so one loader's
imports and caches do not inflate the other's forked workers); each process imports
torch and torchvision, as a training script would:

1. **per worker**: fastfeed (``fastfeed.loader`` over ``fastfeed pack`` tar shards)
   and torchvision ``ImageFolder`` + ``DataLoader`` (the ImageNet example's pipeline)
   on the same images, same workers, batch and prefetch, RandomResizedCrop 224 + flip,
   run for one epoch while the memory of every worker is sampled (psutil, every 0.2 s).
   Reported per worker: peak RSS (the goal's measure: fastfeed <= 1.2x ImageFolder), PSS
   (shared pages divided among their users) and USS (pages only that worker holds).
2. **over epochs**: each loader runs ``--epochs`` epochs (default 20) with persistent
   workers; after every epoch the RSS and PSS of the main process and its workers are
   recorded. Growth is from the end of epoch 1 (when buffers, caches and imports have
   settled) to the end of the last epoch. Goal: fastfeed grows by less than 5%.

Run (bench venv: ``make bench-env``)::

    .venv-bench/bin/python benchmarks/loader_memory.py            # 10,000 images; 20 epochs of 2,000
    .venv-bench/bin/python benchmarks/loader_memory.py --quick    # 2,000 images; 20 epochs of 500
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
from pathlib import Path
from typing import Any

if __name__ == "__main__":  # run as a script: the repo's root on the path, for benchmarks.lib
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fastfeed.host import cpu_count  # noqa: E402

from benchmarks.lib.data import pack_once, synth_image_folder  # noqa: E402
from benchmarks.lib.measure import Stopwatch, worker_memory  # noqa: E402
from benchmarks.lib.peers import BUILDERS, Setup, samples_per_shard  # noqa: E402
from benchmarks.lib.suite import Axis, Benchmark, Context, Point  # noqa: E402

LOADERS = ("fastfeed", "imagefolder")
PHASES = ("per-worker", "epochs")
RSS_GOAL = 1.2
GROWTH_GOAL = 0.05


# ---------------------------------------------------------------------- a point's process
class _Sampler(threading.Thread):
    """Samples the memory of this process's children every ``interval`` seconds."""

    def __init__(self, interval: float = 0.2) -> None:
        super().__init__(daemon=True)
        self.interval = interval
        self.peak: dict[int, dict[str, int]] = {}  # pid -> peak rss/pss/uss
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.wait(self.interval):
            self.sample()

    def sample(self) -> None:
        _, kids = worker_memory()
        for k in kids:
            p = self.peak.setdefault(k.pid, {"rss": 0, "pss": 0, "uss": 0})
            p["rss"] = max(p["rss"], k.rss)
            p["pss"] = max(p["pss"], k.pss or 0)
            p["uss"] = max(p["uss"], k.uss or 0)

    def stop(self) -> None:
        self._halt.set()
        self.join()


def _snapshot() -> dict[str, Any]:
    main, kids = worker_memory()
    return {"main_rss": main.rss, "main_pss": main.pss, "workers": len(kids),
            "workers_rss": sum(k.rss for k in kids), "workers_pss": sum(k.pss or 0 for k in kids),
            "per_worker_rss": [k.rss for k in kids]}


def run_point(point: Point, ctx: Context) -> dict[str, Any]:
    """Run one loader for its phase's epochs in this (fresh) process; memory per worker and per epoch."""
    import torch  # noqa: F401 - a training script has both imported
    import torchvision  # noqa: F401

    args, name = ctx.args, point["loader"]
    epochs = 1 if point["phase"] == "per-worker" else args.epochs
    builder, _ = BUILDERS[name]
    built = builder(ctx.data_of(point["phase"]), Setup(workers=args.workers, batch_size=args.batch_size,
                                                      prefetch=args.prefetch))
    sampler = _Sampler()
    sampler.start()
    per_epoch, images = [], 0
    with Stopwatch() as took:
        for _ in range(epochs):
            for batch in built.epoch():
                images += len(batch["__key__"]) if isinstance(batch, dict) else len(batch[0])
                del batch
            sampler.sample()
            per_epoch.append(_snapshot())  # persistent workers are alive between epochs
    sampler.stop()
    built.close()
    return {"name": name, "what": built.what, "epochs": epochs, "images": images,
            "seconds": took.wall, "per_epoch": per_epoch, "peak_per_worker": list(sampler.peak.values())}


# ---------------------------------------------------------------------- the run
def options(p: argparse.ArgumentParser) -> None:
    """Sizes, epochs, workers."""
    p.add_argument("--images", type=int, default=10_000, help="generated JPEGs for the per-worker run")
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--epoch-images", type=int, default=2_000, help="generated JPEGs for the epochs run")
    p.add_argument("--workers", type=int, default=cpu_count())
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--prefetch", type=int, default=2)
    p.add_argument("--loaders", default=",".join(LOADERS), help="per-worker run: fastfeed, imagefolder")
    p.add_argument("--epoch-loaders", default=",".join(LOADERS), help="epochs run: fastfeed, imagefolder")


def prepare(ctx: Context) -> dict[str, Path]:
    """Generated JPEGs and their pack, for each phase."""
    args, data = ctx.args, {}
    for phase, n in (("per-worker", args.images), ("epochs", args.epoch_images)):
        if phase in ctx.grid["phase"]:
            folder = synth_image_folder(n)
            data[f"{phase}:folder"] = folder
            data[f"{phase}:fastfeed"] = pack_once(folder, samples_per_shard=samples_per_shard(n, args.workers))
    return data


def skip(point: Point, ctx: Context) -> str | None:
    """Each phase runs its loaders: ``--loaders`` (per worker), ``--epoch-loaders`` (epochs)."""
    flag = "--loaders" if point["phase"] == "per-worker" else "--epoch-loaders"
    chosen = ctx.args.loaders if point["phase"] == "per-worker" else ctx.args.epoch_loaders
    if point["loader"] not in chosen.split(","):
        return f"{point['phase']} {point['loader']}: not in {flag}"
    return None


def _mib(n: float) -> str:
    return f"{n / 2**20:,.0f} MiB"


def _per_worker(res: dict[str, Any]) -> dict[str, float]:
    peaks = res["peak_per_worker"]
    return {k: statistics.mean(p[k] for p in peaks) for k in ("rss", "pss", "uss")} if peaks else {}


def _growth(res: dict[str, Any], key: str) -> tuple[float, float, float]:
    """(value after epoch 1, after the last epoch, relative growth) of main + workers ``key``."""
    series = [e[f"main_{key}"] + e[f"workers_{key}"] for e in res["per_epoch"]]
    first, last = series[0], series[-1]
    return first, last, (last - first) / first


def report(rows: list[tuple[Point, dict[str, Any]]], ctx: Context) -> dict[str, Any]:
    """Memory per worker against ImageFolder's, and growth over the epochs."""
    args = ctx.args
    out: dict[str, Any] = {"env": ctx.env, "workers": args.workers, "batch_size": args.batch_size,
                           "prefetch": args.prefetch, "per_worker": {}, "epochs": {}}
    per_worker = [(pt, res) for pt, res in rows if pt["phase"] == "per-worker"]
    if per_worker:
        print(f"\n== loader_memory: per worker, {args.workers} workers, batch {args.batch_size}, "
              f"1 epoch of {args.images} images (fresh process per loader)")
        print(f"{'loader':<14}{'RSS/worker':>14}{'PSS/worker':>14}{'USS/worker':>14}{'main RSS':>14}")
    for pt, res in per_worker:
        pw = _per_worker(res)
        main_rss = res["per_epoch"][-1]["main_rss"]
        out["per_worker"][pt["loader"]] = {**pw, "main_rss": main_rss, "what": res["what"],
                                           "workers_seen": len(res["peak_per_worker"])}
        print(f"{pt['loader']:<14}{_mib(pw['rss']):>14}{_mib(pw['pss']):>14}{_mib(pw['uss']):>14}{_mib(main_rss):>14}")
    pw = out["per_worker"]
    if "fastfeed" in pw and "imagefolder" in pw:
        for k in ("rss", "pss", "uss"):
            ratio = pw["fastfeed"][k] / pw["imagefolder"][k]
            out.setdefault("ratios", {})[k] = ratio
            goal = f" [<= {RSS_GOAL:g}: {'met' if ratio <= RSS_GOAL else 'MISSED'}]" if k == "rss" else ""
            print(f"fastfeed / imagefolder {k.upper()} per worker: {ratio:.2f}x{goal}")
    over = [(pt, res) for pt, res in rows if pt["phase"] == "epochs"]
    if over:
        print(f"\n== loader_memory: {args.epochs} epochs of {args.epoch_images} images, main + workers")
        print(f"{'loader':<14}{'RSS ep1':>12}{'RSS last':>12}{'growth':>9}{'PSS ep1':>12}{'PSS last':>12}{'growth':>9}")
    for pt, res in over:
        name = pt["loader"]
        r0, r1, rg = _growth(res, "rss")
        p0, p1, pg = _growth(res, "pss")
        out["epochs"][name] = {"rss_first": r0, "rss_last": r1, "rss_growth": rg, "pss_first": p0,
                               "pss_last": p1, "pss_growth": pg, "per_epoch": res["per_epoch"],
                               "seconds": res["seconds"]}
        goal = f" [< {GROWTH_GOAL:.0%}: {'met' if rg < GROWTH_GOAL else 'MISSED'}]" if name == "fastfeed" else ""
        print(f"{name:<14}{_mib(r0):>12}{_mib(r1):>12}{rg:>9.1%}{_mib(p0):>12}{_mib(p1):>12}{pg:>9.1%}{goal}")
    return out  # a missed goal is a finding in the report, not a failed run


BENCHMARK = Benchmark(
    name="loader_memory", doc=__doc__, options=options, prepare=prepare, skip=skip, run_point=run_point,
    report=report, isolate=True, needs=("torchvision", "psutil"),
    grid=(Axis("phase", PHASES, help="per-worker (one epoch) and epochs (growth)"),
          Axis("loader", LOADERS, help="the loaders (of each phase: --loaders, --epoch-loaders)")),
    quick={"images": 2_000, "epoch_images": 500},
)

if __name__ == "__main__":
    from benchmarks.run import main

    sys.exit(main([BENCHMARK.name, *sys.argv[1:]]))
