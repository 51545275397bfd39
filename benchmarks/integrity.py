"""Goal (issue 27, part 1): checking every sample against its checksum costs <= 3% of the CPU loader's CPU per image.

The loader checks each sample's bytes against the checksum ``fastfeed pack`` recorded
(``index.json``'s ``checksums``), on by default; ``storage=fastfeed.Storage(verify=False)``
turns it off. In one run, on the same shards, this measures

- ``verify-on`` / ``verify-off``: ``fastfeed.loader`` (``decode="cpu"``, RandomResizedCrop 224 +
  flip, uint8 batches) with the check on and off, the page cache warm, each measurement in a
  fresh process, interleaved and repeated ``--repeat`` times (the median is reported): CPU
  seconds per image of the loader's processes (:class:`benchmarks.lib.measure.CpuMeter`) and
  wall img/s. Their ratio is the cost, but on a shared 2-core machine two runs of the same
  loader differ by a few percent, as much as the goal allows;
- ``direct``: so the check's cost is also measured on its own, in this process: the
  checksum of every sample's span as the reader computes it (:class:`ShardSums.check
  <fastfeed.formats.checksum.ShardSums>`, lookup included), in microseconds per image, and
  as a share of ``verify-off``'s CPU per image; and the same for CRC32 (``zlib.crc32``, what
  a pack without the ``xxhash`` package records).

Data: ``tools.synth`` JPEGs (~500x375, q90, ~117 KB) packed by the default ``fastfeed pack``
(restart markers where ``fastfeed._jpegroi`` is built), made once under ``bench-data/``.

Run::

    .venv/bin/python benchmarks/run.py integrity                 # 3,000 images, 2 workers, 3 rounds
    .venv/bin/python benchmarks/run.py integrity --quick
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

if __name__ == "__main__":  # run as a script: the repo's root on the path, for benchmarks.lib
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fastfeed.host import cpu_count  # noqa: E402

from benchmarks.lib.data import pack_once, synth_image_folder, warm  # noqa: E402
from benchmarks.lib.loaders import epochs, loader_kwargs, shutdown  # noqa: E402
from benchmarks.lib.measure import Stopwatch, measure_source  # noqa: E402
from benchmarks.lib.peers import samples_per_shard  # noqa: E402
from benchmarks.lib.report import measured_line, print_report, results_of  # noqa: E402
from benchmarks.lib.suite import REPEAT, Axis, Benchmark, Context, Point  # noqa: E402

GOAL = 0.03  # the check's share of the loader's CPU per image, at most
PEERS = ("verify-on", "verify-off")


def options(p: argparse.ArgumentParser) -> None:
    """Images, workers, batch and time of every measurement."""
    p.add_argument("--images", type=int, default=3_000, help="generated JPEGs")
    p.add_argument("--workers", type=int, default=min(2, cpu_count()), help="worker processes")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--prefetch", type=int, default=2, help="prefetch_factor of the DataLoader")
    p.add_argument("--time", type=float, default=12.0, help="seconds of steady state per measurement")


def prepare(ctx: Context) -> dict[str, Path]:
    """The JPEGs, packed once with checksums (a pack made before them is refused, with the fix)."""
    args = ctx.args
    folder = synth_image_folder(args.images)
    ds = pack_once(folder, samples_per_shard=samples_per_shard(args.images, args.workers), jpeg_restarts=None)
    if "checksums" not in json.loads((ds / "index.json").read_text()):
        raise SystemExit(f"{ds}: packed before checksums existed (no \"checksums\" in its index.json): "
                         f"rm -r {ds} and run again")
    return {"folder": folder, "ds": ds}


def run_point(point: Point, ctx: Context) -> dict[str, Any]:
    """One measurement of the loader with the check on or off, in this (fresh) process."""
    import fastfeed

    args = ctx.args
    kw = loader_kwargs(batch_size=args.batch_size, image_size=224, workers=args.workers, prefetch=args.prefetch,
                       pin_memory=False)
    kw["storage"] = fastfeed.Storage(verify=point["peer"] == "verify-on")  # the option this benchmark is about
    dl = fastfeed.loader(str(ctx.data["ds"]), **kw)
    warm(ctx.data["ds"])
    load0 = os.getloadavg()[0]
    try:
        m, cpu = measure_source(epochs(dl), num_workers=args.workers, prefetch_factor=args.prefetch,
                                steady_time=args.time, max_time=3 * args.time + 60, sample_memory=False)
    finally:
        shutdown(dl)
    return {"measurement": m.to_json(with_times=True), "cpu_s_per_img": cpu,
            "what": f"fastfeed.loader, storage=fastfeed.Storage(verify={point['peer'] == 'verify-on'})",
            "check": {"loadavg_1m": [round(load0, 2), round(os.getloadavg()[0], 2)]}}


def direct_cost(ds: Path, rounds: int = 5) -> dict[str, float]:
    """Microseconds per image of the check alone (best of ``rounds`` passes over every sample):
    the recorded algorithm through the reader's lookup and compare, and CRC32 for comparison."""
    import zlib

    import numpy as np

    from fastfeed.formats.checksum import ShardSums
    from fastfeed.packed.index import DatasetIndex
    from fastfeed.packed.reader import SampleSums

    index = DatasetIndex.load(ds)
    sums = SampleSums(index)
    starts = index.shard_starts
    spans: list[tuple[ShardSums, list[tuple[int, bytes]]]] = []
    for s, info in enumerate(index.shards):  # the bytes read first: the check is timed, not the disk
        data = (ds / info.name).read_bytes()
        rows = np.asarray(index.offsets[int(starts[s]):int(starts[s + 1])]).tolist()
        spans.append((sums.shard(s), [(off, data[off:off + size]) for off, size in rows]))
    n = index.num_samples

    def best(check: Any) -> float:
        times = []
        for _ in range(rounds):
            with Stopwatch() as sw:
                for table, samples in spans:
                    for off, buf in samples:
                        check(table, off, buf)
            times.append(sw.cpu)
        return min(times) / n * 1e6

    recorded = best(lambda t, off, buf: t.check(buf, off, "", str))
    crc = best(lambda t, off, buf: zlib.crc32(buf))
    return {"algorithm": sums.algorithm, "us_per_img": recorded, "crc32_us_per_img": crc,
            "kb_per_img": sum(len(b) for _, s in spans for _, b in s) / n / 1e3}


def report(rows: list[tuple[Point, dict[str, Any]]], ctx: Context) -> dict[str, Any]:
    """The table, the CPU ratio on/off, and the check's direct cost as a share of the loader's CPU."""
    args = ctx.args
    results = {r.name: r for r in results_of(rows, lambda pt: (pt["peer"], "warm"))}
    direct = direct_cost(ctx.data["ds"])
    title = (f"integrity: {ctx.data['ds'].name}, {args.workers} workers, batch {args.batch_size}, RandomResizedCrop "
             f"224 + flip, uint8, page cache warm")
    out = print_report(title, list(results.values()), subject="verify-on", goals={}, env=ctx.env,
                       extra={"direct": direct, "workers": args.workers, "batch_size": args.batch_size,
                              "steady_s": args.time, "repeat": args.repeat, "goal_share": GOAL})
    on, off = results.get("verify-on"), results.get("verify-off")
    cpu_on = on.per_cpu_second if on else None
    cpu_off = off.per_cpu_second if off else None
    if cpu_on and cpu_off:
        ratio = cpu_off / cpu_on  # CPU per image, on / off
        out["cpu_ratio_on_off"] = ratio
        print(f"  CPU per image, verify on / off: {ratio:.3f} ({(ratio - 1) * 100:+.1f}%; median of "
              f"{args.repeat} round(s); two runs of one loader here differ by a few percent)")
    print(f"  the check alone ({direct['algorithm']}, lookup and compare included): {direct['us_per_img']:.1f} us "
          f"per image of {direct['kb_per_img']:.0f} KB; CRC32 of the same bytes {direct['crc32_us_per_img']:.1f} us")
    if cpu_off:
        share = direct["us_per_img"] / 1e6 * cpu_off
        crc_share = direct["crc32_us_per_img"] / 1e6 * cpu_off
        out["direct_share"], out["crc32_share"] = share, crc_share
        verdict = "met" if share <= GOAL else "missed"
        print(f"  share of the loader's {1e3 / cpu_off:.2f} ms CPU per image: {share * 100:.2f}% "
              f"(goal <= {GOAL * 100:.0f}%: {verdict}); with CRC32 {crc_share * 100:.2f}%")
    return out


BENCHMARK = Benchmark(
    name="integrity", doc=__doc__, options=options, prepare=prepare, run_point=run_point,
    progress=lambda pt, row: measured_line(row), report=report, isolate=True, repeat=3,
    grid=(REPEAT, Axis("peer", PEERS, flag="--peers", help="the check on, off or both", alternate=True)),
    quick={"images": 1_000, "time": 4.0},
)

if __name__ == "__main__":
    from benchmarks.run import main

    sys.exit(main([BENCHMARK.name, *sys.argv[1:]]))
