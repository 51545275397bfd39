"""Goal: ``fastfeed pack --engine ray`` keeps >= 0.9x the local packer's throughput at equal cores.

The Ray column of ``benchmarks/pack.py``, in its own script because it needs a cluster: the
same generated ImageFolder (``bench-data/synth-N``: ImageNet-like JPEGs, ~500x375, q90,
~100 KB, 100 classes; made once by ``benchmarks/_common.py``, shared with ``pack.py``) is
packed, in one run, by

- ``fastfeed.pack(..., workers=C)``: the local engine, C processes on this machine;
- ``fastfeed.pack(..., engine="ray")`` on a real Ray cluster of this machine with the same
  total CPU count: ``--nodes`` ``ray start`` nodes of ``--cpus-per-node`` CPUs each (C =
  nodes x CPUs per node; default 2 x 1, the machine's 2 cores), started once for the run.
  Two Ray figures: "ray (connect)" is the command as a user runs it (connects, new worker
  processes, disconnects), "ray (warm driver)" packs from a driver that is already
  connected (workers started), which isolates the per-shard cost of distribution.

Both engines write the same bytes (checked on every run). Each Ray variant is compared
with local runs interleaved with its own (local, ray, local, ray, ... ``--repeat`` times
each), so that drift in the machine's load hits both alike; medians are reported. The page cache is warm (the
source files are read once first) unless ``--cache cold``. Shards are cut at
``--shard-size`` (256 MB, as ``pack.py``) and also at a smaller size that makes many shards
(``--small-shard-size``, 32 MB), which is where a per-shard overhead would show.

Ray's overhead per shard is (T_ray - T_local) x C / shards: the CPU-seconds each shard
costs more on Ray (scheduling, arguments, results, the driver loop).

Run (dev machine; ~5 minutes after the images exist)::

    .venv/bin/python benchmarks/pack_ray.py              # 20,000 JPEGs, 2 nodes x 1 CPU

Prints files/s and MB/s per engine and shard size, the ratios ray / local, the overhead
per shard, and one ``RESULT {json}`` line.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import BENCH_DATA, environment, evict, log, synth_image_folder, warm  # noqa: E402

GOAL = 0.9


def _digest(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.iterdir()):
        if p.is_file():
            h.update(p.name.encode())
            with open(p, "rb") as f:
                while chunk := f.read(1 << 22):
                    h.update(chunk)
    return h.hexdigest()


def _prepare(src: Path, out: Path, cache: str) -> None:
    shutil.rmtree(out, ignore_errors=True)
    os.sync()  # the previous run's dirty output must not be written back during this one
    (evict if cache == "cold" else warm)(src)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=20_000, help="JPEGs to pack (default 20000)")
    ap.add_argument("--nodes", type=int, default=2, help="Ray nodes on this machine (default 2)")
    ap.add_argument("--cpus-per-node", type=int, default=1, help="CPUs of each node (default 1)")
    ap.add_argument("--shard-size", default="256MB", help="shard size of the main comparison")
    ap.add_argument("--small-shard-size", default="32MB", help="a size giving many shards ('' to skip)")
    ap.add_argument("--repeat", type=int, default=3, help="runs per configuration (median)")
    ap.add_argument("--cache", choices=["warm", "cold"], default="warm")
    args = ap.parse_args(argv)

    import ray

    from fastfeed._ray_local import RAY_ENV, LocalRayCluster
    from fastfeed.pack import pack

    os.environ.update(RAY_ENV)
    logging.basicConfig(level=logging.WARNING)
    env = environment()
    cpus = args.nodes * args.cpus_per_node
    src = synth_image_folder(args.images)
    files = sorted(p for p in src.rglob("*.jpg"))
    total = sum(p.stat().st_size for p in files)
    log(f"{len(files)} files, {total / 1e6:.0f} MB in {src}; {args.nodes} Ray node(s) x "
        f"{args.cpus_per_node} CPU(s) vs the local packer with {cpus} workers")
    out = BENCH_DATA / "pack-ray-out"
    sizes = [s for s in (args.shard_size, args.small_shard_size) if s]

    t0 = time.perf_counter()
    cluster = LocalRayCluster(nodes=args.nodes, cpus_per_node=args.cpus_per_node).start()
    log(f"cluster started in {time.perf_counter() - t0:.0f} s at {cluster.address}")
    times: dict[tuple[str, str], list[float]] = {}
    shards: dict[str, int] = {}
    digests: dict[tuple[str, str], str] = {}
    try:
        def local(size: str) -> int:
            return len(pack(src, out, workers=cpus, shard_size=size).shards)

        def ray_connect(size: str) -> int:
            return len(pack(src, out, engine="ray", ray_address=cluster.address, shard_size=size).shards)

        def ray_warm(size: str) -> int:
            if not ray.is_initialized():
                ray.init(address=cluster.address, logging_level=logging.WARNING)
            return len(pack(src, out, engine="ray", shard_size=size).shards)

        # two phases, each interleaving the local packer with one Ray variant (a driver that
        # disconnects between runs starts new worker processes each time; a connected one
        # keeps them, after one untimed warm-up run)
        for variant, fn in (("ray (connect)", ray_connect), ("ray (warm driver)", ray_warm)):
            if variant == "ray (warm driver)":
                _prepare(src, out, args.cache)
                ray_warm(sizes[-1])
            for _ in range(args.repeat):
                for size in sizes:
                    for name, run in ((f"local|{variant}", local), (variant, fn)):
                        _prepare(src, out, args.cache)
                        t = time.perf_counter()
                        shards[size] = run(size)
                        dt = time.perf_counter() - t
                        digests.setdefault((name, size), _digest(out))
                        times.setdefault((name, size), []).append(dt)
                        log(f"{size:>6} {name:<30} {dt:6.1f} s  {len(files) / dt:7,.0f} files/s  "
                            f"{total / dt / 1e6:5,.0f} MB/s  ({shards[size]} shards)")
    finally:
        if ray.is_initialized():
            ray.shutdown()
        cluster.stop()
        shutil.rmtree(out, ignore_errors=True)
    for size in sizes:
        if len({d for (_, sz), d in digests.items() if sz == size}) != 1:
            raise SystemExit(f"shard size {size}: the engines wrote different bytes")
    return _report(times, shards, sizes, len(files), total, cpus, args, env)


def _report(times: dict, shards: dict, sizes: list[str], files: int, total: int, cpus: int,
            args: argparse.Namespace, env: dict[str, Any]) -> int:
    print(f"\n== fastfeed pack --engine ray vs local at {cpus} CPUs: {files} JPEGs, {total / 1e6:.0f} MB, "
          f"{args.nodes} node(s) x {args.cpus_per_node} CPU(s), {args.cache} page cache")
    print(f"{'shards':<16}{'engine':<20}{'files/s':>10}{'MB/s':>8}{'ray/local':>11}{'overhead/shard':>16}")
    ratios: dict[str, dict[str, float]] = {}
    overhead: dict[str, dict[str, float]] = {}
    met = True
    for size in sizes:
        for variant in ("ray (connect)", "ray (warm driver)"):
            t_local = statistics.median(times[(f"local|{variant}", size)])
            t = statistics.median(times[(variant, size)])
            r = t_local / t
            per = (t - t_local) * cpus / shards[size]
            ratios.setdefault(size, {})[variant] = r
            overhead.setdefault(size, {})[variant] = per
            print(f"{f'{shards[size]} x {size}':<16}{'local':<20}{files / t_local:>10,.0f}{total / t_local / 1e6:>8,.0f}")
            print(f"{'':<16}{variant:<20}{files / t:>10,.0f}{total / t / 1e6:>8,.0f}{r:>10.2f}x{per:>15.3f}s")
        r = ratios[size]["ray (connect)"]
        met = met and r >= GOAL
        print(f"  {size}: ray (connect) / local = {r:.2f}x [goal >= {GOAL:g}: {'met' if r >= GOAL else 'MISSED'}]; "
              f"warm driver {ratios[size]['ray (warm driver)']:.2f}x")
    env["loadavg_1m_end"] = os.getloadavg()[0]
    print("RESULT " + json.dumps({
        "title": "pack_ray", "files": files, "bytes": total, "env": env, "cpus": cpus,
        "nodes": args.nodes, "cache": args.cache, "shards": shards,
        "seconds": {f"{n}|{s}": v for (n, s), v in times.items()},
        "ratios": ratios, "overhead_cpu_s_per_shard": overhead, "goal": GOAL}, sort_keys=True))
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
