"""Goal (issue 20): raw-pixel shards load >= 1.0x FFCV's raw mode and >= 3x fastfeed's own JPEG path per CPU-second.

In one run, on the same images (bounded to ``--max-side`` pixels, 500 by default: ImageNet's
size), the same pipeline (RandomResizedCrop 224 -> horizontal flip -> one uint8 batch) and the
same number of workers (FFCV: decode threads), this script measures

- ``fastfeed-raw``: ``fastfeed.loader`` over ``fastfeed pack --store raw --max-side N`` tar
  shards (pixels stored, crop + resize straight from them, no decode);
- ``fastfeed-jpeg``: the same loader over ``fastfeed pack --max-side N`` shards (JPEGs re-encoded
  at quality 90, with restart markers where ``fastfeed._jpegroi`` is built: the default pack);
- ``ffcv-raw``: ``ffcv.Loader`` over a ``.beton`` written with ``RGBImageField(write_mode="raw",
  max_resolution=N)``, ``RandomResizedCropRGBImageDecoder`` + ``RandomHorizontalFlip`` (skipped,
  with a line saying so, when ffcv is not installed: then only fastfeed's ratios are printed);

with the page cache warm (every file read first: the raw path is about CPU, and the figure
that tells whether storage keeps up is printed beside it), each measurement in a fresh process
(no loader inherits another's threads or imports), ``--repeat`` times interleaved (median).
Two figures per loader: wall-clock img/s and images per CPU-second of the loader's processes
(:class:`benchmarks.lib.measure.CpuMeter`; meaningful on a shared machine), and for the raw loaders the MB/s the
storage must deliver at the measured rate when the shards are not in the page cache.

The CPU figures leave out memory sampling (``LOADER_RAW_MEMORY=1`` puts it back): reading
``/proc/PID/smaps_rollup`` walks every mapped page, so it charged memory-mapped raw shards
for the benchmark's own probing (session 8, benchmarks/RESULTS.md).

Data: ``shared/data/imagenet-sample``'s 47 real photos replicated to ``--images`` files (made
once under ``bench-data/``), else (no shared data) ``tools.synth`` JPEGs.

Run (bench venv: ``make bench-env``; fastfeed's side needs no torchvision)::

    PYTHONPATH=. .venv-bench/bin/python benchmarks/loader_raw.py --images 2000 --workers 2
    PYTHONPATH=. .venv-bench/bin/python benchmarks/loader_raw.py --images 20000 --workers 16 --repeat 3  # GPU host
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Any

if __name__ == "__main__":  # run as a script: the repo's root on the path, for benchmarks.lib
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fastfeed.host import cpu_count  # noqa: E402

from benchmarks.lib.data import pack_once, photo_folder, tree_bytes, warm  # noqa: E402
from benchmarks.lib.measure import measure_source  # noqa: E402
from benchmarks.lib.peers import Built, Setup, fastfeed_built, ffcv_loader, samples_per_shard, write_beton  # noqa: E402
from benchmarks.lib.report import measured_line, print_report, results_of  # noqa: E402
from benchmarks.lib.suite import REPEAT, Axis, Benchmark, Context, Point  # noqa: E402

GOALS_PER_CPU = {"ffcv-raw": 1.0, "fastfeed-jpeg": 3.0}
# fastfeed-raw reads raw pixels as the loader chooses (DatasetReader.raw_reads); -map / -rows force
# one way (FASTFEED_RAW_READS): the shard's memory map, or the crop's rows read into a reused buffer
RAW_READS = {"fastfeed-raw-map": "map", "fastfeed-raw-rows": "rows"}
DEFAULT_PEERS = ("fastfeed-raw", "fastfeed-jpeg", "ffcv-raw")
PEERS = (*DEFAULT_PEERS, *RAW_READS)
SUBJECT = "fastfeed-raw"


def options(p: argparse.ArgumentParser) -> None:
    """Images, sizes, workers and time of every measurement."""
    p.add_argument("--images", type=int, default=2_000, help="images (copies of the real photos)")
    p.add_argument("--source", type=Path, help="a folder of photos to replicate (default: shared/data/imagenet-sample; "
                   "on the GPU machine: .dali-bench/imagenet-sample)")
    p.add_argument("--max-side", type=int, default=500, help="longer side of the stored pixels (all loaders)")
    p.add_argument("--workers", type=int, default=min(2, cpu_count()), help="worker processes / FFCV threads")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--prefetch", type=int, default=2, help="prefetch_factor of fastfeed's DataLoader")
    p.add_argument("--time", type=float, default=8.0, help="seconds of steady state per measurement")


def _ffcv_here() -> bool:
    return importlib.util.find_spec("ffcv") is not None and importlib.util.find_spec("torchvision") is not None


def prepare(ctx: Context) -> dict[str, Path]:
    """The photos bounded to ``--max-side``: packed raw, packed as JPEG, written raw for FFCV."""
    args, peers = ctx.args, ctx.grid["peer"]
    folder = photo_folder(args.images, args.source)
    per_shard = samples_per_shard(args.images, args.workers)
    data: dict[str, Path] = {"folder": folder}
    if any(p.startswith("fastfeed-raw") for p in peers):
        data["raw"] = pack_once(folder, store="raw", max_side=args.max_side, samples_per_shard=per_shard)
    if "fastfeed-jpeg" in peers:
        data["jpeg"] = pack_once(folder, store="jpeg", max_side=args.max_side, samples_per_shard=per_shard)
    if "ffcv-raw" in peers and _ffcv_here():
        data["ffcv"] = write_beton(folder, raw_max_side=args.max_side)
    return data


def skip(point: Point, ctx: Context) -> str | None:
    """FFCV where it is not installed."""
    if point["peer"] == "ffcv-raw" and not _ffcv_here():
        return ("ffcv-raw: skipped (ffcv or torchvision is not installed; `make bench-env` installs them): "
                "only fastfeed's own ratio is measured")
    return None


def _build(name: str, data: dict[str, Path], s: Setup) -> Built:
    if name.startswith("fastfeed-raw"):
        return fastfeed_built(data, s, "raw", shuffle=None)
    if name == "fastfeed-jpeg":
        return fastfeed_built(data, s, "jpeg", shuffle=None)
    return ffcv_loader(data, s)


def run_point(point: Point, ctx: Context) -> dict[str, Any]:
    """One measurement of one loader, page cache warm, in this (fresh) process."""
    args = ctx.args
    s = Setup(workers=args.workers, batch_size=args.batch_size, prefetch=args.prefetch)
    built = _build(point["peer"], ctx.data, s)
    warm(*built.files)
    load0 = os.getloadavg()[0]
    try:
        # bounded: with epochs of a few batches (2,000 images) the rate never settles to
        # measure()'s tolerance, which then runs to its default limit (4 x steady + 180 s)
        # no memory samples: their smaps_rollup walks cost CPU in proportion to the mapped pages, which
        # would charge memory-mapped raw shards (16 workers x 5 GB) for the benchmark's own probing
        m, cpu = measure_source(built.epoch, num_workers=s.workers, prefetch_factor=s.prefetch, steady_time=args.time,
                                max_time=3 * args.time + 30, sample_memory=os.environ.get("LOADER_RAW_MEMORY") == "1")
    finally:
        built.close()
    return {"measurement": m.to_json(with_times=True), "cpu_s_per_img": cpu, "what": built.what,
            "check": {"loadavg_1m": [round(load0, 2), round(os.getloadavg()[0], 2)]}}


def point_env(point: Point) -> dict[str, str]:
    """``FASTFEED_RAW_READS`` of the ``-map`` / ``-rows`` peers."""
    return {"FASTFEED_RAW_READS": RAW_READS[point["peer"]]} if point["peer"] in RAW_READS else {}


def _raw_mb_per_image(data: dict[str, Path]) -> float | None:
    """Mean MB of pixels per image of the raw pack (what storage delivers per image at the raw rate)."""
    if "raw" not in data:
        return None
    st = json.loads((data["raw"] / "index.json").read_text())["store"]
    return st["raw_bytes"] / max(1, st["raw_samples"]) / 1e6


def report(rows: list[tuple[Point, dict[str, Any]]], ctx: Context) -> dict[str, Any]:
    """The table and the ratios per CPU-second (the goals), and what storage must deliver."""
    args, data = ctx.args, ctx.data
    results = {r.name: r for r in results_of(rows, lambda pt: (pt["peer"], "warm"))}
    mb = _raw_mb_per_image(data)
    storage = {name: round(results[name].rate * mb, 1) for name in ("fastfeed-raw", *RAW_READS, "ffcv-raw")
               if name in results and mb is not None}
    sizes = {k: tree_bytes(v) for k, v in data.items()}
    title = (f"loader_raw: {data['folder'].name} at max side {args.max_side}, {args.workers} workers, batch "
             f"{args.batch_size}, RandomResizedCrop 224 + flip, uint8, page cache warm")
    # the goals are per CPU-second (print_report applies one goal table to both metrics: the per-CPU one counts)
    subject = next((n for n in (SUBJECT, *RAW_READS) if n in results), SUBJECT)
    out = print_report(title, list(results.values()), subject=subject, goals=GOALS_PER_CPU, env=ctx.env,
                       extra={"bytes": sizes, "raw_mb_per_image": mb, "storage_mb_per_s_at_rate": storage,
                              "workers": args.workers, "batch_size": args.batch_size, "steady_s": args.time,
                              "repeat": args.repeat, "max_side": args.max_side})
    for name, mbs in storage.items():
        print(f"  storage needed at {name}'s rate ({results[name].rate:,.0f} img/s x {mb:.3f} MB): {mbs:,.0f} MB/s "
              "when the shards are not in the page cache")
    print("  disk: " + ", ".join(f"{k} {v / 1e6:,.0f} MB" for k, v in sizes.items()))
    return out


BENCHMARK = Benchmark(
    name="loader_raw", doc=__doc__, options=options, prepare=prepare, skip=skip, run_point=run_point,
    point_env=point_env, progress=lambda pt, row: measured_line(row), report=report, isolate=True,
    grid=(REPEAT, Axis("peer", DEFAULT_PEERS, choices=PEERS, flag="--peers", help="the loaders compared")),
    quick={"images": 1_000, "time": 4.0},
)

if __name__ == "__main__":
    from benchmarks.run import main

    sys.exit(main([BENCHMARK.name, *sys.argv[1:]]))
