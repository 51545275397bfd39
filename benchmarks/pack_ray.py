"""Goal: ``fastfeed pack --engine ray`` keeps >= 0.9x the local packer's throughput at equal cores.

The Ray column of ``benchmarks/pack.py``, in its own script because it needs a cluster: the
same generated ImageFolder (``bench-data/synth-N``: ImageNet-like JPEGs, ~500x375, q90,
~100 KB, 100 classes; made once by :mod:`benchmarks.lib.data`, shared with ``pack.py``) is
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

Two measures, because other processes may share the machine's cores:

- wall time: files/s and MB/s, and ray / local (the goal);
- CPU time: the CPU-seconds each run used in this process tree (this driver, the local
  packer's processes, and for Ray every process of the cluster: GCS, raylets, agents,
  workers), sampled from ``/proc`` (:class:`CpuMeter`). Packing from a warm page cache is
  CPU-bound, so local CPU-s / ray CPU-s is the throughput ratio at equal cores that load
  from other processes cannot blur, and (ray CPU-s - local CPU-s) / shards is Ray's
  overhead per shard.

Run (dev machine; ~5 minutes after the images exist)::

    .venv/bin/python benchmarks/pack_ray.py              # 20,000 JPEGs, 2 nodes x 1 CPU

Prints files/s and MB/s per engine and shard size, the ratios ray / local, the overhead
per shard, and one ``RESULT {json}`` line.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import shutil
import statistics
import sys
from pathlib import Path
from typing import Any

if __name__ == "__main__":  # run as a script: the repo's root on the path, for benchmarks.lib
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.lib.data import BENCH_DATA, prepare_pack_run, synth_image_folder  # noqa: E402
from benchmarks.lib.measure import Stopwatch  # noqa: E402
from benchmarks.lib.report import log  # noqa: E402
from benchmarks.lib.suite import REPEAT, Axis, Benchmark, Context  # noqa: E402

GOAL = 0.9
VARIANTS = ("ray (connect)", "ray (warm driver)")


def _digest(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.iterdir()):
        if p.is_file():
            h.update(p.name.encode())
            with open(p, "rb") as f:
                while chunk := f.read(1 << 22):
                    h.update(chunk)
    return h.hexdigest()


class TreeCpuMeter:
    """CPU-s used by this process tree during a run, sampled from ``/proc`` every 100 ms.

    Each process is keyed by (pid, start time) and its own utime + stime is remembered at
    its last sighting, so processes that exit during the run still count (parents'
    cutime would not do: a Ray raylet ignores SIGCHLD, so its dead workers' time is
    accounted nowhere). A process living under 100 ms may be missed. Only new pids and the
    tree's own pids are read each time (a few ms), and the sampling thread's own CPU is
    subtracted. Subtrees rooted at ``exclude`` are left out.
    """

    def __init__(self, exclude: set[int]) -> None:
        import threading

        self.exclude = exclude
        self.tick = os.sysconf("SC_CLK_TCK")
        self.member: dict[int, tuple[str, bool]] = {}  # pid -> (start time, in the tree)
        self.seen: dict[tuple[int, str], float] = {}
        self.stop = threading.Event()
        self.tid = 0
        self.start = self._sample()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    @staticmethod
    def _stat(pid: int) -> list[str] | None:
        try:
            text = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return None
        return text[text.rindex(")") + 2:].split()

    def _sample(self) -> dict[tuple[int, str], float]:
        pids = sorted(int(n) for n in os.listdir("/proc") if n.isdigit())
        fresh: dict[int, list[str]] = {}
        for pid in pids:
            if pid not in self.member and (f := self._stat(pid)) is not None:
                fresh[pid] = f
        me = os.getpid()
        changed = True
        while changed:  # a new child may be listed before its new parent
            changed = False
            for pid, f in list(fresh.items()):
                parent = self.member.get(int(f[1]))
                if pid == me or (parent is not None and parent[1]):
                    self.member[pid] = (f[19], pid not in self.exclude)
                elif parent is None and int(f[1]) in fresh:
                    continue
                else:
                    self.member[pid] = (f[19], False)
                del fresh[pid]
                changed = True
        now: dict[tuple[int, str], float] = {}
        for pid in pids:
            start, inside = self.member.get(pid, ("", False))
            if not inside or (f := self._stat(pid)) is None:
                continue
            if f[19] != start:  # the pid was reused by another process
                del self.member[pid]
                continue
            now[(pid, start)] = (int(f[11]) + int(f[12])) / self.tick  # own utime + stime
        self.seen.update(now)
        return now

    def _run(self) -> None:
        import threading

        self.tid = threading.get_native_id()
        while not self.stop.wait(0.1):
            self._sample()

    def _own(self) -> float:
        f = self._stat_task()
        return 0.0 if f is None else (int(f[11]) + int(f[12])) / self.tick

    def _stat_task(self) -> list[str] | None:
        try:
            text = Path(f"/proc/self/task/{self.tid}/stat").read_text()
        except OSError:
            return None
        return text[text.rindex(")") + 2:].split()

    def done(self) -> float:
        """Stop sampling; CPU-s used since the meter was created."""
        self.stop.set()
        self.thread.join()
        sampler = self._own()
        self._sample()
        return sum(v - self.start.get(k, 0.0) for k, v in self.seen.items()) - sampler


def options(ap: argparse.ArgumentParser) -> None:
    """The data, the cluster's shape, the shard sizes, the page cache."""
    ap.add_argument("--images", type=int, default=20_000, help="JPEGs to pack (default 20000)")
    ap.add_argument("--nodes", type=int, default=2, help="Ray nodes on this machine (default 2)")
    ap.add_argument("--cpus-per-node", type=int, default=1, help="CPUs of each node (default 1)")
    ap.add_argument("--shard-size", default="256MB", help="shard size of the main comparison")
    ap.add_argument("--small-shard-size", default="32MB", help="a size giving many shards ('' to skip)")
    ap.add_argument("--cache", choices=["warm", "cold"], default="warm")


def run(ctx: Context) -> dict[str, Any]:
    """A local Ray cluster up; each variant of the grid interleaved with the local packer; the ratios."""
    args, env = ctx.args, ctx.env
    import ray

    from tools.ray_local import RAY_ENV, LocalRayCluster
    from fastfeed.packing.api import pack

    os.environ.update(RAY_ENV)
    logging.basicConfig(level=logging.WARNING)
    cpus = args.nodes * args.cpus_per_node
    src = synth_image_folder(args.images)
    files = sorted(p for p in src.rglob("*.jpg"))
    total = sum(p.stat().st_size for p in files)
    log(f"{len(files)} files, {total / 1e6:.0f} MB in {src}; {args.nodes} Ray node(s) x "
        f"{args.cpus_per_node} CPU(s) vs the local packer with {cpus} workers")
    out = BENCH_DATA / "pack-ray-out"
    sizes = [s for s in (args.shard_size, args.small_shard_size) if s]

    # Ray's memory monitor kills tasks when the *machine* is short of memory, which on a shared
    # machine may be other people's processes: off for this measurement (the kernel's stays)
    with Stopwatch() as took:
        cluster = LocalRayCluster(nodes=args.nodes, cpus_per_node=args.cpus_per_node,
                                  env={"RAY_memory_monitor_refresh_ms": "0"}).start()
    cluster_roots = {node.proc.pid for node in cluster.nodes}
    log(f"cluster started in {took.wall:.0f} s at {cluster.address}")
    times: dict[tuple[str, str], list[float]] = {}
    cpu: dict[tuple[str, str], list[float]] = {}
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
        for variant, fn in ((v, {"ray (connect)": ray_connect, "ray (warm driver)": ray_warm}[v])
                            for v in ctx.grid["variant"]):
            if variant == "ray (warm driver)":
                prepare_pack_run(src, out, args.cache)
                ray_warm(sizes[-1])
            for _ in range(args.repeat):
                for size in sizes:
                    for name, pack_with in ((f"local|{variant}", local), (variant, fn)):
                        prepare_pack_run(src, out, args.cache)
                        meter = TreeCpuMeter(cluster_roots if name.startswith("local") else set())
                        with Stopwatch() as took:
                            shards[size] = pack_with(size)
                        dt = took.wall
                        cpu.setdefault((name, size), []).append(meter.done())
                        digests.setdefault((name, size), _digest(out))
                        times.setdefault((name, size), []).append(dt)
                        log(f"{size:>6} {name:<30} {dt:6.1f} s  {len(files) / dt:7,.0f} files/s  "
                            f"{total / dt / 1e6:5,.0f} MB/s  {cpu[(name, size)][-1]:6.1f} CPU-s  "
                            f"({shards[size]} shards)")
    finally:
        if ray.is_initialized():
            ray.shutdown()
        cluster.stop()
        shutil.rmtree(out, ignore_errors=True)
    for size in sizes:
        if len({d for (_, sz), d in digests.items() if sz == size}) != 1:
            raise SystemExit(f"shard size {size}: the engines wrote different bytes")
    return _report(times, cpu, shards, sizes, len(files), total, cpus, args, env, tuple(ctx.grid["variant"]))


def _report(times: dict, cpu: dict, shards: dict, sizes: list[str], files: int, total: int, cpus: int,
            args: argparse.Namespace, env: dict[str, Any], variants: tuple[str, ...] = VARIANTS) -> dict[str, Any]:
    """The table, ray / local in wall and CPU time, Ray's CPU per shard; the JSON-ready figures."""
    print(f"\n== fastfeed pack --engine ray vs local at {cpus} CPUs: {files} JPEGs, {total / 1e6:.0f} MB, "
          f"{args.nodes} node(s) x {args.cpus_per_node} CPU(s), {args.cache} page cache, median of {args.repeat}")
    print(f"{'shards':<14}{'engine':<19}{'files/s':>9}{'MB/s':>6}{'wall ray/local':>16}"
          f"{'CPU-s':>8}{'CPU local/ray':>15}{'CPU-s/shard extra':>19}")
    ratios: dict[str, dict[str, dict[str, float]]] = {}
    met = True
    for size in sizes:
        for variant in variants:
            lt = statistics.median(times[(f"local|{variant}", size)])
            lc = statistics.median(cpu[(f"local|{variant}", size)])
            rt = statistics.median(times[(variant, size)])
            rc = statistics.median(cpu[(variant, size)])
            r = ratios.setdefault(size, {}).setdefault(variant, {})
            r.update(wall=lt / rt, cpu=lc / rc, overhead_cpu_s_per_shard=(rc - lc) / shards[size])
            print(f"{f'{shards[size]} x {size}':<14}{'local':<19}{files / lt:>9,.0f}{total / lt / 1e6:>6,.0f}"
                  f"{'':>16}{lc:>8.1f}")
            print(f"{'':<14}{variant:<19}{files / rt:>9,.0f}{total / rt / 1e6:>6,.0f}{r['wall']:>15.2f}x"
                  f"{rc:>8.1f}{r['cpu']:>14.2f}x{r['overhead_cpu_s_per_shard']:>18.3f}s")
        c = ratios[size].get("ray (connect)")
        if c is not None:
            met = met and c["wall"] >= GOAL
            print(f"  {size}: ray (connect) / local = {c['wall']:.2f}x wall, {c['cpu']:.2f}x CPU "
                  f"[goal >= {GOAL:g}: {'met' if c['wall'] >= GOAL else 'MISSED'}]")
    env["loadavg_1m_end"] = os.getloadavg()[0]
    return {"title": "pack_ray", "files": files, "bytes": total, "env": env, "cpus": cpus,
            "nodes": args.nodes, "cache": args.cache, "shards": shards,
            "seconds": {f"{n}|{s}": v for (n, s), v in times.items()},
            "cpu_seconds": {f"{n}|{s}": v for (n, s), v in cpu.items()},
            "ratios": ratios, "goal": GOAL, "exit_code": 0 if met else 1}


BENCHMARK = Benchmark(
    name="pack_ray", doc=__doc__, options=options, run=run, needs=("ray",), repeat=3,
    grid=(Axis("variant", VARIANTS, help="how the Ray driver runs (each interleaved with the local packer)"),
          REPEAT),
    quick={"images": 2_000, "repeat": 1, "small_shard_size": ""},
)

if __name__ == "__main__":
    from benchmarks.run import main

    sys.exit(main([BENCHMARK.name, *sys.argv[1:]]))
