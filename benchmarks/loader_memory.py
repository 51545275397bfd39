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
import json
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import cpu_count, environment, log, pack_once, synth_image_folder, worker_memory  # noqa: E402
from _peers import BUILDERS, Setup, samples_per_shard  # noqa: E402

LOADERS = ("fastfeed", "imagefolder")
RSS_GOAL = 1.2
GROWTH_GOAL = 0.05


# ---------------------------------------------------------------------- child process
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


def child(name: str, data: dict[str, Path], setup: Setup, epochs: int) -> dict[str, Any]:
    """Run ``epochs`` epochs of one loader here; memory per worker and per epoch."""
    import torch  # noqa: F401 - a training script has both imported
    import torchvision  # noqa: F401

    builder, _ = BUILDERS[name]
    built = builder(data, setup)
    sampler = _Sampler()
    sampler.start()
    per_epoch, images = [], 0
    t0 = time.perf_counter()
    for _ in range(epochs):
        for batch in built.epoch():
            images += len(batch["__key__"]) if isinstance(batch, dict) else len(batch[0])
            del batch
        sampler.sample()
        per_epoch.append(_snapshot())  # persistent workers are alive between epochs
    elapsed = time.perf_counter() - t0
    sampler.stop()
    built.close()
    return {"name": name, "what": built.what, "epochs": epochs, "images": images,
            "seconds": elapsed, "per_epoch": per_epoch, "peak_per_worker": list(sampler.peak.values())}


# ---------------------------------------------------------------------- parent
def _run_child(name: str, data: dict[str, Path], args: argparse.Namespace, epochs: int) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", name, "--child-data", json.dumps({k: str(v) for k, v in data.items()}),
           "--workers", str(args.workers), "--batch-size", str(args.batch_size),
           "--prefetch", str(args.prefetch), "--epochs", str(epochs)]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"{name}: child failed ({out.returncode}):\n{out.stderr[-3000:]}")
    line = [ln for ln in out.stdout.splitlines() if ln.startswith("CHILD ")][-1]
    return json.loads(line[len("CHILD "):])


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


def _data(images: int, workers: int) -> dict[str, Path]:
    folder = synth_image_folder(images)
    return {"folder": folder, "fastfeed": pack_once(folder, samples_per_shard=samples_per_shard(images, workers))}


def parent(args: argparse.Namespace) -> dict[str, Any]:
    env = environment()
    report: dict[str, Any] = {"env": env, "workers": args.workers, "batch_size": args.batch_size,
                              "prefetch": args.prefetch, "per_worker": {}, "epochs": {}}
    big = _data(args.images, args.workers)
    print(f"\n== loader_memory: per worker, {args.workers} workers, batch {args.batch_size}, "
          f"1 epoch of {args.images} images (fresh process per loader)")
    print(f"{'loader':<14}{'RSS/worker':>14}{'PSS/worker':>14}{'USS/worker':>14}{'main RSS':>14}")
    for name in args.loaders:
        log(f"per-worker memory: {name}")
        res = _run_child(name, big, args, 1)
        pw = _per_worker(res)
        report["per_worker"][name] = {**pw, "main_rss": res["per_epoch"][-1]["main_rss"], "what": res["what"],
                                      "workers_seen": len(res["peak_per_worker"])}
        print(f"{name:<14}{_mib(pw['rss']):>14}{_mib(pw['pss']):>14}{_mib(pw['uss']):>14}"
              f"{_mib(res['per_epoch'][-1]['main_rss']):>14}")
    pw = report["per_worker"]
    if "fastfeed" in pw and "imagefolder" in pw:
        for k in ("rss", "pss", "uss"):
            ratio = pw["fastfeed"][k] / pw["imagefolder"][k]
            report.setdefault("ratios", {})[k] = ratio
            goal = f" [<= {RSS_GOAL:g}: {'met' if ratio <= RSS_GOAL else 'MISSED'}]" if k == "rss" else ""
            print(f"fastfeed / imagefolder {k.upper()} per worker: {ratio:.2f}x{goal}")

    small = _data(args.epoch_images, args.workers)
    print(f"\n== loader_memory: {args.epochs} epochs of {args.epoch_images} images, main + workers")
    print(f"{'loader':<14}{'RSS ep1':>12}{'RSS last':>12}{'growth':>9}{'PSS ep1':>12}{'PSS last':>12}{'growth':>9}")
    for name in args.epoch_loaders:
        log(f"memory over {args.epochs} epochs: {name}")
        res = _run_child(name, small, args, args.epochs)
        r0, r1, rg = _growth(res, "rss")
        p0, p1, pg = _growth(res, "pss")
        report["epochs"][name] = {"rss_first": r0, "rss_last": r1, "rss_growth": rg, "pss_first": p0,
                                  "pss_last": p1, "pss_growth": pg, "per_epoch": res["per_epoch"],
                                  "seconds": res["seconds"]}
        goal = f" [< {GROWTH_GOAL:.0%}: {'met' if rg < GROWTH_GOAL else 'MISSED'}]" if name == "fastfeed" else ""
        print(f"{name:<14}{_mib(r0):>12}{_mib(r1):>12}{rg:>9.1%}{_mib(p0):>12}{_mib(p1):>12}{pg:>9.1%}{goal}")
    print("RESULT " + json.dumps(report, sort_keys=True))
    return report


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--images", type=int, default=10_000, help="generated JPEGs for the per-worker run")
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--epoch-images", type=int, default=2_000, help="generated JPEGs for the epochs run")
    p.add_argument("--workers", type=int, default=cpu_count())
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--prefetch", type=int, default=2)
    p.add_argument("--loaders", default=",".join(LOADERS), help="per-worker run: fastfeed, imagefolder")
    p.add_argument("--epoch-loaders", default=",".join(LOADERS), help="epochs run: fastfeed, imagefolder")
    p.add_argument("--quick", action="store_true", help="2,000 images; 20 epochs of 500")
    p.add_argument("--json", type=Path, help="also write the report to this file")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--child-data", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.images, args.epoch_images = 2_000, 500
    args.loaders = [x for x in args.loaders.split(",") if x]
    args.epoch_loaders = [x for x in args.epoch_loaders.split(",") if x]
    return args


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if args.child:
        data = {k: Path(v) for k, v in json.loads(args.child_data).items()}
        setup = Setup(workers=args.workers, batch_size=args.batch_size, prefetch=args.prefetch)
        print("CHILD " + json.dumps(child(args.child, data, setup, args.epochs)))
        return 0
    report = parent(args)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return 0  # a missed goal is a finding in the report, not a failed run


if __name__ == "__main__":
    sys.exit(main())
