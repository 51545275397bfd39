"""Where the CPU of ``fastfeed.loader``'s processes goes: main process / workers, user / system, page faults.

One loader (batch ``--batch-size``, RandomResizedCrop 224 + flip, ``--workers`` workers, prefetch
``--prefetch``, shuffled, no ``pin_memory``) over one packed dataset (default: ``--images`` real
photos at ``--max-side`` 500 packed ``--store raw``, as ``loader_raw.py`` packs them), in a fresh
process per measurement: ``--warmup-epochs`` epochs untimed, then ``--epochs`` epochs whose CPU
seconds (user and system, of the main process and of its workers, from psutil) and the workers'
minor page faults (``/proc/PID/stat``) are counted per image. The wall-clock rate of the same
epochs comes from :mod:`fastfeed.timing` (steady windows, median); nothing else is sampled (no
memory snapshots: their ``smaps_rollup`` walks would land in the CPU figure, RESULTS.md session 8).

The grid's ``reads`` axis sets ``FASTFEED_RAW_READS`` for the process: ``map`` (views of the
shards' memory maps) and ``rows`` (the crop's rows read into a reused buffer), two rounds each,
interleaved: this is the measurement behind session 8's "what ``map`` costs in the loader"
(RESULTS.md; it was ``results/2026-12-02-h200-s8/adhoc/mp_split.py`` then).

Run (h200 host, 16 cores; the photos in ``.dali-bench/imagenet-sample``)::

    taskset -c 0-15 python3 benchmarks/loader_split.py --source .dali-bench/imagenet-sample --images 10000 \\
        --workers 16 --epochs 60
    .venv/bin/python benchmarks/loader_split.py --quick          # 2 cores: 1,000 photos, 2 workers
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any, Iterator

if __name__ == "__main__":  # run as a script: the repo's root on the path, for benchmarks.lib
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fastfeed.host import cpu_count  # noqa: E402

from benchmarks.lib.data import pack_once, photo_folder  # noqa: E402
from benchmarks.lib.loaders import fastfeed_loader  # noqa: E402
from benchmarks.lib.measure import measure  # noqa: E402
from benchmarks.lib.peers import samples_per_shard  # noqa: E402
from benchmarks.lib.suite import REPEAT, Axis, Benchmark, Context, Point  # noqa: E402


def options(p: argparse.ArgumentParser) -> None:
    """The dataset, the loader's shape, the epochs."""
    p.add_argument("--dataset", type=Path, help="a packed dataset (default: the photos packed as below)")
    p.add_argument("--images", type=int, default=2_000, help="copies of the photos (without --dataset)")
    p.add_argument("--source", type=Path, help="a folder of photos to replicate (default: shared/data/imagenet-sample)")
    p.add_argument("--store", choices=("raw", "jpeg"), default="raw", help="how the photos are packed")
    p.add_argument("--max-side", type=int, default=500, help="longer side of the stored images")
    p.add_argument("--workers", type=int, default=cpu_count(), help="loader worker processes")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--prefetch", type=int, default=2)
    p.add_argument("--warmup-epochs", type=int, default=2, help="untimed epochs first")
    p.add_argument("--epochs", type=int, default=20, help="epochs measured")


def prepare(ctx: Context) -> dict[str, Path]:
    """The dataset the loader reads."""
    args = ctx.args
    if args.dataset is not None:
        return {"dataset": args.dataset}
    folder = photo_folder(args.images, args.source)
    per_shard = samples_per_shard(args.images, args.workers)
    return {"dataset": pack_once(folder, store=args.store, max_side=args.max_side, samples_per_shard=per_shard)}


def _minflt(pid: int) -> int:
    """Minor page faults of a process so far (``/proc/PID/stat``, field 10)."""
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[7])


def _cpu(me: Any) -> tuple[float, float, float, float, int]:
    """(main user, main system, workers user, workers system, workers' minor faults) so far."""
    kids = me.children(recursive=True)
    m = me.cpu_times()
    kt = [k.cpu_times() for k in kids]
    return (m.user, m.system, sum(t.user for t in kt), sum(t.system for t in kt), sum(_minflt(k.pid) for k in kids))


def run_point(point: Point, ctx: Context) -> dict[str, Any]:
    """Warm-up epochs, then the measured ones: CPU per image, split; the steady wall-clock rate."""
    import psutil

    args = ctx.args
    dl = fastfeed_loader(ctx.data["dataset"], batch_size=args.batch_size, image_size=224, workers=args.workers,
                         prefetch=args.prefetch, shuffle=True, seed=0, pin_memory=False)
    me = psutil.Process()
    for e in range(args.warmup_epochs):
        dl.set_epoch(e)
        for _ in dl:
            pass
    counted = {"images": 0}

    def measured() -> Iterator[Any]:
        for e in range(args.warmup_epochs, args.warmup_epochs + args.epochs):
            dl.set_epoch(e)
            for b in dl:
                counted["images"] += len(b["__key__"])
                yield b

    c0 = _cpu(me)
    # every measured epoch, one stream (the workers persist): min_time is never reached, so measure()
    # runs the stream to its end and reports its steady windows
    m = measure(measured(), num_workers=args.workers, prefetch_factor=args.prefetch, min_time=float("inf"),
                max_time=float("inf"))
    c1 = _cpu(me)
    n = counted["images"]
    mu, ms, wu, ws = [(a - b) / n * 1e6 for a, b in zip(c1[:4], c0[:4])]
    return {"reads": point["reads"], "images": n, "img_per_s": m.samples_per_s, "steady": m.steady,
            "main_us": mu + ms, "main_user_us": mu, "main_sys_us": ms, "workers_us": wu + ws,
            "workers_user_us": wu, "workers_sys_us": ws, "img_per_cpu_s": 1e6 / (mu + ms + wu + ws),
            "faults_per_img": (c1[4] - c0[4]) / n}


def point_env(point: Point) -> dict[str, str]:
    """How the process reads raw pixels."""
    return {"FASTFEED_RAW_READS": point["reads"]}


def progress(point: Point, r: dict[str, Any]) -> str:
    """The figures of one measurement."""
    return (f"{r['reads']}: {r['img_per_s']:,.0f} img/s; us CPU per image: main {r['main_us']:.1f} (sys "
            f"{r['main_sys_us']:.1f}), workers {r['workers_us']:.1f} (sys {r['workers_sys_us']:.1f}) -> "
            f"{r['img_per_cpu_s']:,.0f} img/CPU-s; workers' minor faults per image {r['faults_per_img']:.1f}")


def report(rows: list[tuple[Point, dict[str, Any]]], ctx: Context) -> dict[str, Any]:
    """Every round, then the medians per way of reading and their ratio per CPU-second."""
    args = ctx.args
    print(f"\n== loader_split: {ctx.data['dataset'].name}, {args.workers} workers, batch {args.batch_size}, "
          f"{args.epochs} epochs after {args.warmup_epochs}")
    print(f"{'reads':<6}{'img/s':>10}{'main us/img (sys)':>19}{'workers us/img (sys)':>22}{'img/CPU-s':>11}"
          f"{'faults/img':>11}")
    for _, r in rows:
        print(f"{r['reads']:<6}{r['img_per_s']:>10,.0f}{r['main_us']:>12.1f} ({r['main_sys_us']:4.1f})"
              f"{r['workers_us']:>15.1f} ({r['workers_sys_us']:4.1f}){r['img_per_cpu_s']:>11,.0f}"
              f"{r['faults_per_img']:>11.2f}")
    med = {reads: statistics.median(r["img_per_cpu_s"] for _, r in rows if r["reads"] == reads)
           for reads in dict.fromkeys(r["reads"] for _, r in rows)}
    if "map" in med and "rows" in med:
        print(f"map / rows per CPU-second: {med['map'] / med['rows']:.2f}x")
    return {"title": "loader_split", "env": ctx.env, "dataset": str(ctx.data["dataset"]), "workers": args.workers,
            "epochs": args.epochs, "rounds": [r for _, r in rows], "img_per_cpu_s": med}


BENCHMARK = Benchmark(
    name="loader_split", doc=__doc__, options=options, prepare=prepare, run_point=run_point, point_env=point_env,
    progress=progress, report=report, isolate=True, needs=("psutil",), repeat=2,
    grid=(REPEAT, Axis("reads", ("map", "rows"), help="FASTFEED_RAW_READS of the loader's process")),
    quick={"images": 1_000, "epochs": 10, "warmup_epochs": 1, "repeat": 1},
)

if __name__ == "__main__":
    from benchmarks.run import main

    sys.exit(main([BENCHMARK.name, *sys.argv[1:]]))
