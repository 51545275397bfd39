"""Goal: aspect-ratio buckets through fastfeed beat a hand-written per-rank bucket loader, with pixel steps balanced.

Two parts, in one run, on the real photos of ``shared/data/imagenet-sample`` (47 photos,
479-1280 px wide, replicated to ``--images`` files; on the GPU machine ``.dali-bench``'s copy):

1. **Throughput** (img/s, and images per CPU-second of the loader's processes), each
   measurement in a fresh process, interleaved ``--repeat`` times (median), through
   :func:`fastfeed.timing.measure.measure` (start-up and the prefetch burst excluded):

   - ``fastfeed``: ``DistributedAspectRatioSampler(ds, resolution=R, batch_size=B)`` and
     ``fastfeed.loader(ds, batch_sampler=sampler, augment=False)`` over the default pack
     (``--decode cpu``, or ``--decode dali`` on the GPU machine): each image resized to cover
     its bucket and center-cropped to it, one uint8 tensor per batch;
   - ``handwritten``: what trainers write (diffusers' examples, kohya, SimpleTuner): every
     file's size read with PIL at start, a ``DistributedSampler``-style shard, each rank
     bucketing its own shard (nearest aspect ratio in log space, the same buckets), batches of
     ``B`` in an order of its own, over a ``torch`` ``DataLoader`` whose dataset opens each
     file with PIL, resizes it to cover its bucket (bilinear) and center-crops; the default
     collate stacks the batch. Always CPU.

   Both with ``--workers`` worker processes (default: every core), batch ``B`` (default 8),
   rank 0 of a world of 1 (one machine's throughput).
2. **Pixel straggler ratio** at W=8 and W=64 (no decode; a second): per step, the rank with the
   most pixels over the ranks' mean, mean/p95/max over the steps every rank runs
   (:func:`fastfeed.sampling.aspect_report.aspect_balance_report`, the figures of ``fastfeed
   balance --resolution``), for fastfeed's sampler and naive per-rank bucketing, on the sizes of
   the packed photos and on them repeated to ``--plan-images`` (default 100,000).

Goals: fastfeed >= 1.0x the hand-written loader in img/s; pixel straggler ratio (mean over
steps) <= 1.05 at W=8 and W=64.

Run (bench venv: ``make bench-env``)::

    .venv-bench/bin/python benchmarks/aspect.py --resolution 512            # the 2-core machine
    .venv-bench/bin/python benchmarks/aspect.py --quick
    .venv-bench/bin/python benchmarks/aspect.py --plan-only                 # part 2 only

On the 16-core GPU machine, after the DALI wheel parts (``benchmarks/gpu_setup.sh`` says how; the
last call carries ``.devwhl/p06``, ``.whl`` and ``.dali-bench``; benchmarks/RESULTS.md has the whole
command, with the two C extensions built)::

    source benchmarks/gpu_setup.sh && export FASTFEED_BENCH_DATA=/tmp/bench-data
    python3 benchmarks/run.py aspect --images 4000 --repeat 2 --time 10                 # CPU, 16 workers
    python3 benchmarks/run.py aspect --images 4000 --repeat 2 --time 10 --decode dali   # DALI on the GPU
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path
from typing import Any, Iterator

if __name__ == "__main__":  # run as a script: the repo's root on the path, for benchmarks.lib
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from fastfeed.host import cpu_count  # noqa: E402

from benchmarks.lib.data import SHARED_SAMPLE, pack_once, replicated_sample, sample_photos, warm  # noqa: E402
from benchmarks.lib.measure import measure_source  # noqa: E402
from benchmarks.lib.report import measured_line, print_report, results_of  # noqa: E402
from benchmarks.lib.suite import REPEAT, Axis, Benchmark, Context, Point, missing_need  # noqa: E402

GOALS = {"handwritten": 1.0}
PEERS = ("fastfeed", "handwritten")
STRAGGLER_GOAL = 1.05
WORLDS = (8, 64)


def options(p: argparse.ArgumentParser) -> None:
    """Sizes, workers, decode and time of every measurement."""
    p.add_argument("--images", type=int, default=2_000, help="copies of the 47 real photos")
    p.add_argument("--resolution", type=int, default=1024,
                   help="buckets of about R x R pixels (1024; 512 for a 2-core machine)")
    p.add_argument("--batch-size", type=int, default=8, help="images per batch (both loaders)")
    p.add_argument("--workers", type=int, default=cpu_count(), help="worker processes of both loaders")
    p.add_argument("--prefetch", type=int, default=2, help="prefetch_factor of both DataLoaders")
    p.add_argument("--decode", choices=("cpu", "dali"), default="cpu",
                   help="fastfeed's decode (dali: the GPU machine); the hand-written loader is always PIL on CPU")
    p.add_argument("--time", type=float, default=15.0, help="seconds of steady state per measurement")
    p.add_argument("--plan-images", type=int, default=100_000,
                   help="the photos' sizes repeated to this many for the straggler figures")
    p.add_argument("--plan-only", action="store_true", help="only the straggler figures (no decode)")


def prepare(ctx: Context) -> dict[str, Any]:
    """The photos (a folder of copies) and their default fastfeed pack (sizes in its index)."""
    args = ctx.args
    src = SHARED_SAMPLE if SHARED_SAMPLE.is_dir() else sample_photos()
    folder = replicated_sample(args.images, src=src)
    per_shard = max(64, math.ceil(args.images / max(1, 2 * args.workers)))
    return {"photos:folder": str(folder), "photos:fastfeed": str(pack_once(folder, samples_per_shard=per_shard,
                                                                         jpeg_restarts=None))}


def skip(point: Point, ctx: Context) -> str | None:
    """No throughput with ``--plan-only``; DALI only where it is installed."""
    if ctx.args.plan_only:
        return "throughput: not measured (--plan-only)"
    if point["peer"] == "fastfeed" and ctx.args.decode == "dali":
        return missing_need("dali")
    return None


# ---------------------------------------------------------------------- the hand-written loader
class PerRankBucketSampler:
    """The per-rank bucket sampler trainers write: this rank's ``DistributedSampler`` shard, bucketed on its own.

    Yields lists of indices, each one bucket's; each bucket's last batch is smaller. The ranks
    do not agree on their numbers of batches (which is why DDP hangs at the end of the epoch).
    """

    def __init__(self, bucket_of: np.ndarray, batch_size: int, *, rank: int = 0, world_size: int = 1,
                 seed: int = 0) -> None:
        self.bucket_of, self.batch_size = bucket_of, batch_size
        self.rank, self.world_size, self.seed, self.epoch = rank, world_size, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _batches(self) -> list[list[int]]:
        rng = np.random.default_rng(self.seed + self.epoch)
        n = self.bucket_of.shape[0]
        perm = rng.permutation(n)
        perm = np.concatenate([perm, perm[: (-n) % self.world_size]])[self.rank::self.world_size]
        batches: list[list[int]] = []
        for k in np.unique(self.bucket_of[perm]):
            mine = perm[self.bucket_of[perm] == k]
            batches += [mine[i:i + self.batch_size].tolist() for i in range(0, mine.shape[0], self.batch_size)]
        order = np.random.default_rng([self.seed + self.epoch, self.rank]).permutation(len(batches))
        return [batches[i] for i in order]

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self._batches())

    def __len__(self) -> int:
        return len(self._batches())


class CoverCropFolder:
    """A map-style dataset: file ``i`` opened with PIL, resized to cover its bucket, center-cropped (CHW uint8)."""

    def __init__(self, files: list[str], shapes: np.ndarray, bucket_of: np.ndarray) -> None:
        self.files, self.shapes, self.bucket_of = files, shapes, bucket_of

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> Any:
        import torch
        from PIL import Image

        H, W = (int(v) for v in self.shapes[self.bucket_of[i]])
        with Image.open(self.files[i]) as im:
            im = im.convert("RGB")
        s = max(H / im.height, W / im.width)
        w, h = max(W, round(im.width * s)), max(H, round(im.height * s))
        im = im.resize((w, h), Image.BILINEAR)
        top, left = (h - H) // 2, (w - W) // 2
        im = im.crop((left, top, left + W, top + H))
        return torch.from_numpy(np.asarray(im)).permute(2, 0, 1)


def _photo_files(folder: str) -> list[str]:
    return sorted(str(p) for p in Path(folder).rglob("*") if p.suffix.lower() in (".jpg", ".jpeg", ".png"))


def handwritten_loader(folder: str, args: argparse.Namespace) -> Any:
    """The hand-written loader over ``folder`` (sizes read with PIL at start, as trainers do)."""
    from PIL import Image
    from torch.utils.data import DataLoader

    from fastfeed.sampling.buckets import assign, make_buckets

    files = _photo_files(folder)
    sizes = []
    for f in files:
        with Image.open(f) as im:
            sizes.append((im.height, im.width))
    b = make_buckets(args.resolution)
    bucket_of = assign(np.asarray(sizes, dtype=np.int64), b)
    ds = CoverCropFolder(files, np.stack([b.heights, b.widths], axis=1), bucket_of)
    sampler = PerRankBucketSampler(bucket_of, args.batch_size)
    dl = DataLoader(ds, batch_sampler=sampler, num_workers=args.workers, persistent_workers=args.workers > 0,
                    prefetch_factor=args.prefetch if args.workers else None)
    return dl, sampler


def fastfeed_loader(ds: str, args: argparse.Namespace) -> Any:
    """fastfeed's sampler and loader; center crops (``augment=False``), as the hand-written one."""
    import fastfeed
    from fastfeed.sampling.aspect import DistributedAspectRatioSampler

    sampler = DistributedAspectRatioSampler(ds, resolution=args.resolution, batch_size=args.batch_size,
                                            max_upscale=None, num_replicas=1, rank=0, seed=0)
    kw: dict[str, Any] = {"decode": args.decode, "augment": False}
    if args.decode == "cpu":
        kw.update(num_workers=args.workers, prefetch_factor=args.prefetch)
    else:  # DALI's own threads, no DataLoader workers
        import torch

        from fastfeed.loading.dali.backend import DEFAULTS, default_num_threads

        # the defaults spelled out: with "auto" knobs, loader(decode="dali") with an aspect sampler looks
        # the tune record up with image_size (0, 0) and fails (2026-12-03); explicit knobs skip the lookup
        knobs = {**DEFAULTS, "num_threads": default_num_threads()}
        # without CUDA (a check of the code path): DALI on the CPU
        kw["dali"] = fastfeed.Dali(**knobs, **({} if torch.cuda.is_available() else {"device_id": None}))
    return fastfeed.loader(ds, batch_sampler=sampler, **kw), sampler


def _images(batch: Any) -> int:
    return int(batch["image"].shape[0]) if isinstance(batch, dict) else int(batch.shape[0])


def run_point(point: Point, ctx: Context) -> dict[str, Any]:
    """One measurement of one loader, built fresh in this process."""
    args, data = ctx.args, ctx.data_of("photos")
    if point["peer"] == "fastfeed":
        dl, sampler = fastfeed_loader(data["fastfeed"], args)
        what = (f"DistributedAspectRatioSampler + fastfeed.loader(batch_sampler=, decode={args.decode!r}, "
                "augment=False)")
        files = [Path(data["fastfeed"])]
    else:
        dl, sampler = handwritten_loader(data["folder"], args)
        what = "per-rank bucket sampler + DataLoader over PIL open / resize to cover / center crop"
        files = [Path(data["folder"])]
    warm(*files)
    epoch = 0

    def one_epoch() -> Any:
        nonlocal epoch
        (dl if hasattr(dl, "set_epoch") else sampler).set_epoch(epoch)
        epoch += 1
        return iter(dl)

    load0 = os.getloadavg()[0]
    try:
        dali = point["peer"] == "fastfeed" and args.decode == "dali"
        m, cpu = measure_source(one_epoch, num_workers=0 if dali else args.workers,
                                prefetch_factor=None if dali else args.prefetch, steady_time=args.time,
                                samples_of=_images)
    finally:
        from benchmarks.lib.loaders import shutdown

        if point["peer"] == "handwritten":
            shutdown(dl)
    return {"measurement": m.to_json(with_times=True), "cpu_s_per_img": cpu, "what": what,
            "check": {"loadavg_1m": [round(load0, 2), round(os.getloadavg()[0], 2)], "batches_per_epoch": len(sampler)}}


# ---------------------------------------------------------------------- the straggler figures
def straggler_figures(ds: str, args: argparse.Namespace) -> dict[str, Any]:
    """Part 2: fastfeed's sampler and naive per-rank bucketing at W=8 and W=64, on the pack's sizes and on
    them repeated to ``--plan-images``; prints the table."""
    import fastfeed
    from fastfeed.sampling.aspect_report import aspect_balance_report

    sizes = np.asarray(fastfeed.DatasetIndex.load(ds).image_sizes, dtype=np.int64)
    sets = {f"{sizes.shape[0]:,} photos": sizes}
    if args.plan_images > sizes.shape[0]:
        sets[f"{args.plan_images:,} (sizes repeated)"] = np.resize(sizes, (args.plan_images, 2))
    print(f"\n== aspect: pixel straggler ratio per step (the rank with the most pixels / the mean), resolution "
          f"{args.resolution}, batch {args.batch_size}; goal: fastfeed mean <= {STRAGGLER_GOAL}")
    print(f"{'images':<26}{'W':>4}  {'plan':<34}{'steps/rank':>12}{'mean':>8}{'p95':>8}{'max':>8}{'wait':>8}")
    out: list[dict[str, Any]] = []
    for label, s in sets.items():
        for W in WORLDS:
            r = aspect_balance_report(s, resolution=args.resolution, world_size=W, batch_size=args.batch_size,
                                      max_upscale=None)
            for row in r.rows:
                lo, hi = row.steps_per_rank
                print(f"{label:<26}{W:>4}  {row.name:<34}{(f'{lo}' if lo == hi else f'{lo}-{hi}!'):>12}"
                      f"{row.straggler_mean:>8.3f}{row.straggler_p95:>8.3f}{row.straggler_max:>8.3f}"
                      f"{row.wait_share:>8.1%}")
            ff = r.rows[0]
            out.append({"images": int(s.shape[0]), "world_size": W, "crop_pixels": r.crop.pixels,
                        "fastfeed": {"steps_per_rank": list(ff.steps_per_rank), "mean": ff.straggler_mean,
                                     "p95": ff.straggler_p95, "max": ff.straggler_max, "wait_share": ff.wait_share},
                        "naive": {"steps_per_rank": list(r.rows[1].steps_per_rank), "mean": r.rows[1].straggler_mean,
                                  "p95": r.rows[1].straggler_p95, "max": r.rows[1].straggler_max,
                                  "wait_share": r.rows[1].wait_share},
                        "goal_met": ff.straggler_mean <= STRAGGLER_GOAL})
    met = all(o["goal_met"] for o in out)
    print(f"straggler goal (fastfeed mean <= {STRAGGLER_GOAL} at W={', '.join(map(str, WORLDS))}): "
          f"{'met' if met else 'MISSED'}; '!': ranks run different numbers of steps")
    return {"straggler": out, "straggler_goal_met": met}


def report(rows: list[tuple[Point, dict[str, Any]]], ctx: Context) -> dict[str, Any]:
    """The throughput table and ratios, then the straggler figures."""
    args, data = ctx.args, ctx.data_of("photos")
    extra = straggler_figures(data["fastfeed"], args)
    extra.update({"resolution": args.resolution, "batch_size": args.batch_size, "workers": args.workers,
                  "decode": args.decode, "images": args.images, "steady_s": args.time, "repeat": args.repeat})
    if not rows:
        return extra
    title = (f"aspect: {args.images:,} real photos, buckets at {args.resolution}, batch {args.batch_size}, "
             f"{args.workers} workers, fastfeed decode={args.decode}")
    return print_report(title, results_of(rows, lambda pt: (pt["peer"], "warm")), subject="fastfeed", goals=GOALS,
                        env=ctx.env, extra=extra)


BENCHMARK = Benchmark(
    name="aspect", doc=__doc__, options=options, prepare=prepare, skip=skip, run_point=run_point,
    progress=lambda pt, row: measured_line(row), report=report, isolate=True, needs=("torch", "PIL"),
    grid=(REPEAT, Axis("peer", PEERS, flag="--peers", help="the loaders compared", alternate=True)),
    quick={"images": 400, "time": 5.0, "plan_images": 20_000, "resolution": 512},
)

if __name__ == "__main__":
    from benchmarks.run import main

    sys.exit(main([BENCHMARK.name, *sys.argv[1:]]))
