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
(``_common.CpuMeter``; meaningful on a shared machine), and for the raw loaders the MB/s the
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
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    BENCH_DATA, SHARED_SAMPLE, Result, cpu_count, environment, files_under, log, measure_source,
    measurement_from_json, print_report, replicated_sample, synth_image_folder, warm,
)
from _peers import Built, Setup, _shutdown, ffcv_loader, samples_per_shard  # noqa: E402

GOALS_PER_CPU = {"ffcv-raw": 1.0, "fastfeed-jpeg": 3.0}
# fastfeed-raw reads raw pixels as the loader chooses (DatasetReader.raw_reads); -map / -rows force
# one way (FASTFEED_RAW_READS): the shard's memory map, or the crop's rows read into a reused buffer
RAW_READS = {"fastfeed-raw-map": "map", "fastfeed-raw-rows": "rows"}
DEFAULT_PEERS = ("fastfeed-raw", "fastfeed-jpeg", "ffcv-raw")
PEERS = (*DEFAULT_PEERS, *RAW_READS)
SUBJECT = "fastfeed-raw"


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--images", type=int, default=2_000, help="images (copies of the real photos)")
    p.add_argument("--source", type=Path, help="a folder of photos to replicate (default: shared/data/imagenet-sample; "
                   "on the GPU machine: .dali-bench/imagenet-sample)")
    p.add_argument("--max-side", type=int, default=500, help="longer side of the stored pixels (all loaders)")
    p.add_argument("--peers", default=",".join(DEFAULT_PEERS), help=f"subset of {','.join(PEERS)}")
    p.add_argument("--workers", type=int, default=min(2, cpu_count()), help="worker processes / FFCV threads")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--prefetch", type=int, default=2, help="prefetch_factor of fastfeed's DataLoader")
    p.add_argument("--time", type=float, default=8.0, help="seconds of steady state per measurement")
    p.add_argument("--repeat", type=int, default=1, help="interleaved repetitions (median reported)")
    p.add_argument("--json", type=Path, help="also write the report (a dict) to this file")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--child-data", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.peers = [x for x in args.peers.split(",") if x]
    unknown = set(args.peers) - set(PEERS)
    if unknown:
        p.error(f"unknown peers {sorted(unknown)}; choose from {', '.join(PEERS)}")
    return args


# ---------------------------------------------------------------------- data
def _folder(n: int, source: Path | None = None) -> Path:
    """``n`` copies of the real photos in ``source`` (default the shared sample), else synthetic JPEGs."""
    src = source or SHARED_SAMPLE
    return replicated_sample(n, src=src) if src.is_dir() else synth_image_folder(n)


def _pack(folder: Path, store: str, max_side: int, per_shard: int) -> Path:
    """``fastfeed pack --store STORE --max-side N`` of ``folder`` beside it; reused when complete."""
    import fastfeed

    dst = folder.with_name(f"{folder.name}.ff-{store}-{max_side}-{per_shard}")
    t0 = time.perf_counter()
    fastfeed.pack(folder, dst, store=store, max_side=max_side, samples_per_shard=per_shard,
                  workers=cpu_count(), seed=0)
    if time.perf_counter() - t0 > 1:
        log(f"packed {folder.name} -> {dst.name} ({store}) in {time.perf_counter() - t0:.0f} s")
    return dst


def _beton_raw(folder: Path, max_side: int) -> Path:
    """An FFCV ``.beton`` of raw pixels (``write_mode="raw"``, ``max_resolution``), written once."""
    from ffcv.fields import IntField, RGBImageField
    from ffcv.writer import DatasetWriter
    from torchvision import datasets

    dst = folder.with_name(f"{folder.name}.ffcv-raw-{max_side}.beton")
    stamp = dst.with_name(dst.name + ".json")
    recipe = {"src": str(folder), "write_mode": "raw", "max_resolution": max_side}
    if dst.exists() and stamp.exists() and json.loads(stamp.read_text()) == recipe:
        return dst
    tmp = dst.with_name(dst.name + ".tmp")
    t0 = time.perf_counter()
    writer = DatasetWriter(str(tmp), {"image": RGBImageField(write_mode="raw", max_resolution=max_side),
                                      "label": IntField()}, num_workers=cpu_count())
    writer.from_indexed_dataset(datasets.ImageFolder(str(folder)))
    os.replace(tmp, dst)
    stamp.write_text(json.dumps(recipe))
    log(f"wrote {dst.name} in {time.perf_counter() - t0:.0f} s")
    return dst


def _prepare(args: argparse.Namespace, peers: list[str]) -> dict[str, Path]:
    folder = _folder(args.images, args.source)
    per_shard = samples_per_shard(args.images, args.workers)
    data: dict[str, Path] = {"folder": folder}
    if any(p.startswith("fastfeed-raw") for p in peers):
        data["raw"] = _pack(folder, "raw", args.max_side, per_shard)
    if "fastfeed-jpeg" in peers:
        data["jpeg"] = _pack(folder, "jpeg", args.max_side, per_shard)
    if "ffcv-raw" in peers:
        data["ffcv"] = _beton_raw(folder, args.max_side)
    return data


def _raw_mb_per_image(data: dict[str, Path]) -> float | None:
    """Mean MB of pixels per image of the raw pack (what storage delivers per image at the raw rate)."""
    if "raw" not in data:
        return None
    st = json.loads((data["raw"] / "index.json").read_text())["store"]
    return st["raw_bytes"] / max(1, st["raw_samples"]) / 1e6


# ---------------------------------------------------------------------- loaders
def _fastfeed(data: dict[str, Path], key: str, s: Setup) -> Built:
    import fastfeed

    dl = fastfeed.loader(str(data[key]), batch_size=s.batch_size, image_size=s.image_size, num_workers=s.workers,
                         prefetch_factor=s.prefetch if s.workers else None, seed=s.seed, pin_memory=False)
    epoch = [0]

    def one_epoch() -> Any:
        dl.set_epoch(epoch[0])
        epoch[0] += 1
        return iter(dl)

    what = ("fastfeed.loader over `fastfeed pack --store raw` tar shards (crop + resize from stored pixels)"
            if key == "raw" else "fastfeed.loader over default `fastfeed pack` tar shards (JPEG q90)")
    return Built(key, what, [data[key]], one_epoch, lambda: _shutdown(dl))


def _build(name: str, data: dict[str, Path], s: Setup) -> Built:
    if name.startswith("fastfeed-raw"):
        return _fastfeed(data, "raw", s)
    if name == "fastfeed-jpeg":
        return _fastfeed(data, "jpeg", s)
    built = ffcv_loader(data, s)
    built.what = built.what.replace("JPEG q90 re-encoded by FFCV", "RGBImageField(write_mode='raw', max_resolution)")
    return built


def _measure_one(name: str, data: dict[str, Path], s: Setup, steady: float) -> dict[str, Any]:
    built = _build(name, data, s)
    warm(*built.files)
    load0 = os.getloadavg()[0]
    try:
        # bounded: with epochs of a few batches (2,000 images) the rate never settles to
        # measure()'s tolerance, which then runs to its default limit (4 x steady + 180 s)
        # no memory samples: their smaps_rollup walks cost CPU in proportion to the mapped pages, which
        # would charge memory-mapped raw shards (16 workers x 5 GB) for the benchmark's own probing
        m, cpu = measure_source(built.epoch, num_workers=s.workers, prefetch_factor=s.prefetch, steady_time=steady,
                                max_time=3 * steady + 30, sample_memory=os.environ.get("LOADER_RAW_MEMORY") == "1")
    finally:
        built.close()
    return {"measurement": m.to_json(with_times=True), "cpu_s_per_img": cpu, "what": built.what,
            "check": {"loadavg_1m": [round(load0, 2), round(os.getloadavg()[0], 2)]}}


def _run_child(name: str, data: dict[str, Path], args: argparse.Namespace) -> dict[str, Any] | None:
    cmd = [sys.executable, __file__, "--child", name, "--child-data", json.dumps({k: str(v) for k, v in data.items()}),
           "--workers", str(args.workers), "--batch-size", str(args.batch_size), "--prefetch", str(args.prefetch),
           "--time", str(args.time)]
    env = dict(os.environ)
    if name in RAW_READS:
        env["FASTFEED_RAW_READS"] = RAW_READS[name]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("CHILD ")]
    if out.returncode != 0 or not lines:
        log(f"{name}: FAILED (exit {out.returncode}):\n{out.stderr[-2000:]}")
        return None
    return json.loads(lines[-1][len("CHILD "):])


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    setup = Setup(workers=args.workers, batch_size=args.batch_size, prefetch=args.prefetch)
    if args.child:
        data = {k: Path(v) for k, v in json.loads(args.child_data).items()}
        print("CHILD " + json.dumps(_measure_one(args.child, data, setup, args.time)))
        return 0
    peers = list(args.peers)
    if "ffcv-raw" in peers and (importlib.util.find_spec("ffcv") is None or importlib.util.find_spec("torchvision")
                                is None):
        log("ffcv-raw: skipped (ffcv or torchvision is not installed; `make bench-env` installs them): "
            "only fastfeed's own ratio is measured")
        peers.remove("ffcv-raw")
    env = environment()
    env["note"] = os.environ.get("BENCH_NOTE", "")
    log(f"{env['cores']} cores, load {env['loadavg_1m']:.1f}; peers {', '.join(peers)}; data in {BENCH_DATA}")
    data = _prepare(args, peers)
    mb = _raw_mb_per_image(data)
    results: dict[str, Result] = {}
    for rep in range(args.repeat):
        for name in peers:
            log(f"{name} (run {rep + 1}/{args.repeat})")
            got = _run_child(name, data, args)
            if got is None:
                continue
            m = measurement_from_json(got["measurement"])
            r = results.setdefault(name, Result(name, got["what"], "warm"))
            r.runs.append(m)
            r.cpu_per_image.append(got["cpu_s_per_img"])
            r.extra.setdefault("checks", []).append(got["check"])
            log(f"  {m.samples_per_s:,.0f} img/s, "
                f"{1 / got['cpu_s_per_img']:,.0f} img/cpu-s" if got["cpu_s_per_img"] else "  no CPU figure")
    storage = {}
    for name in ("fastfeed-raw", *RAW_READS, "ffcv-raw"):
        if name in results and mb is not None:
            storage[name] = round(results[name].rate * mb, 1)
    sizes = {k: sum(p.stat().st_size for p in files_under(v)) for k, v in data.items()}
    title = (f"loader_raw: {data['folder'].name} at max side {args.max_side}, {args.workers} workers, batch "
             f"{args.batch_size}, RandomResizedCrop 224 + flip, uint8, page cache warm")
    # the goals are per CPU-second (print_report applies one goal table to both metrics: the per-CPU one counts)
    subject = next((n for n in (SUBJECT, *RAW_READS) if n in results), SUBJECT)
    report = print_report(title, list(results.values()), subject=subject, goals=GOALS_PER_CPU, env=env,
                          extra={"bytes": sizes, "raw_mb_per_image": mb, "storage_mb_per_s_at_rate": storage,
                                 "workers": args.workers, "batch_size": args.batch_size, "steady_s": args.time,
                                 "repeat": args.repeat, "max_side": args.max_side})
    for name, mbs in storage.items():
        print(f"  storage needed at {name}'s rate ({results[name].rate:,.0f} img/s x {mb:.3f} MB): {mbs:,.0f} MB/s "
              "when the shards are not in the page cache")
    print("  disk: " + ", ".join(f"{k} {v / 1e6:,.0f} MB" for k, v in sizes.items()))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
