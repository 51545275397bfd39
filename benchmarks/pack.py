"""Goal: ``fastfeed pack`` at 2 workers is >= 2x as fast as the fastest peer.

One generated ImageFolder (``bench-data/synth-N``: ImageNet-like JPEGs, ~500x375, q90,
~100 KB, 100 classes; made once by ``benchmarks/_common.py`` and reused) is packed into
~256 MB tar shards, in one run, by

- ``fastfeed.pack`` with 1 and 2 worker processes (its defaults: shuffled order, sha256
  of every shard, DALI index files, resume records, the index);
- ``webdataset.ShardWriter``, the way its documentation writes shards: one process, a
  loop that reads each file and writes ``{"__key__", "jpg", "cls"}`` (same keys as
  fastfeed, same shuffled order, ``maxsize`` 256 MB);
- ``litdata.optimize`` with the same number of workers (2), when litdata imports: a
  function returning ``{"jpg": bytes, "cls": int}`` per file, ``chunk_bytes`` 256 MB.

Every run happens in a fresh Python process (so no run inherits another's threads or
state), and its time runs from the call to its return, after the tool's module is
imported (data written to the page cache; no tool syncs to disk, and the previous run's
output is deleted and synced away first). Besides wall time, each run reports its CPU time
(user + system, the process and its worker processes): on a shared machine wall time
measures the other tenants as much as the tool, CPU time much less. ``--out`` picks where
the shards go (default ``bench-data/pack-out``, on the same disk as the source).
The page cache is set the same way before every run: ``cold`` drops the source files
from it (``posix_fadvise(DONTNEED)``), ``warm`` reads them all first.

Run (dev machine; ~10 minutes the first time, most of it generating the images)::

    .venv-bench/bin/python benchmarks/pack.py            # with litdata (make bench-env)
    .venv/bin/python benchmarks/pack.py                  # without litdata
    .venv/bin/python benchmarks/pack.py --cache warm --repeat 3 --skip litdata

Prints files/s and MB/s per tool and cache state, fastfeed's ratios to each peer and to
the fastest peer, and one ``RESULT {json}`` line.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    BENCH_DATA, environment, log, prepare_pack_run, synth_image_folder,
)

SHARD_BYTES = 256_000_000
GOAL = 2.0


def list_imagefolder(src: Path) -> list[tuple[str, int, str]]:
    """(path, class index, key) for every image, classes and files sorted, then shuffled."""
    classes = sorted(p.name for p in src.iterdir() if p.is_dir())
    items = []
    for c, name in enumerate(classes):
        for f in sorted((src / name).iterdir()):
            items.append((str(f), c, f"{name}/{f.stem}"))
    random.Random(0).shuffle(items)
    return items


def run_fastfeed(src: Path, out: Path, items: list, workers: int) -> int:
    import fastfeed

    idx = fastfeed.pack(src, out, workers=workers, shard_size=SHARD_BYTES)
    return idx.num_samples


def run_webdataset(src: Path, out: Path, items: list, workers: int) -> int:
    import webdataset as wds

    out.mkdir(parents=True)
    n = 0
    with wds.ShardWriter(str(out / "shard-%06d.tar"), maxsize=SHARD_BYTES, maxcount=10**9, verbose=0) as sink:
        for path, cls, key in items:
            with open(path, "rb") as f:
                sink.write({"__key__": key, "jpg": f.read(), "cls": cls})
            n += 1
    return n


def _litdata_item(item: tuple[str, int, str]) -> dict[str, Any]:
    path, cls, _ = item
    with open(path, "rb") as f:
        return {"jpg": f.read(), "cls": cls}


def run_litdata(src: Path, out: Path, items: list, workers: int) -> int:
    from litdata import optimize

    optimize(fn=_litdata_item, inputs=items, output_dir=str(out), chunk_bytes=SHARD_BYTES,
             num_workers=workers, verbose=False, mode="overwrite")
    return len(items)


TOOLS: dict[str, tuple[Callable[..., int], int, str]] = {
    "fastfeed 1 worker": (run_fastfeed, 1, "fastfeed"),
    "fastfeed 2 workers": (run_fastfeed, 2, "fastfeed"),
    "webdataset.ShardWriter": (run_webdataset, 1, "webdataset"),
    "litdata.optimize 2 workers": (run_litdata, 2, "litdata"),
}


def _cpu_seconds() -> float:
    """CPU (user + system) of this process and its waited-for children so far."""
    import resource

    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def run_one(name: str, src: Path, out: Path) -> dict[str, float]:
    """One timed run of one tool, meant for a fresh process (see :func:`_run_isolated`).

    The tool's module is imported first (not timed). CPU is this process plus its worker
    processes, which every tool waits for before returning: wall time on a shared machine
    measures the other tenants as much as the tool, CPU time much less.
    """
    fn, workers, module = TOOLS[name]
    __import__(module)
    items = list_imagefolder(src)
    c0, t0 = _cpu_seconds(), time.perf_counter()
    n = fn(src, out, items, workers)
    return {"n": n, "seconds": time.perf_counter() - t0, "cpu": _cpu_seconds() - c0}


def _run_isolated(name: str, src: Path, out: Path) -> dict[str, float]:
    """:func:`run_one` in a new interpreter, so no run inherits another's threads or state."""
    import json
    import subprocess

    code = (f"import sys, json; sys.path.insert(0, {str(Path(__file__).parent)!r}); import pack; "
            f"print('RUN ' + json.dumps(pack.run_one({name!r}, pack.Path({str(src)!r}), pack.Path({str(out)!r}))))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RUN ")), None)
    if proc.returncode != 0 or line is None:
        raise SystemExit(f"{name} failed:\n{proc.stderr[-3000:]}")
    return json.loads(line[4:])


def _busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def core_headroom(seconds: float = 3.0) -> float:
    """CPU time two busy processes get together, relative to one alone (2.0 on 2 free cores).

    On a shared machine this says how much a second worker can add at all.
    """
    import multiprocessing as mp

    got = []
    for n in (1, 2):
        c0 = _cpu_seconds()
        procs = [mp.get_context("fork").Process(target=_busy, args=(seconds,)) for _ in range(n)]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
        got.append(_cpu_seconds() - c0)
    return got[1] / got[0]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=20_000, help="JPEGs to pack (default 20000)")
    ap.add_argument("--src", default=None, help="pack this ImageFolder instead of the generated one")
    ap.add_argument("--cache", choices=["cold", "warm", "both"], default="both")
    ap.add_argument("--repeat", type=int, default=1, help="runs per tool and cache state (median)")
    ap.add_argument("--skip", default="", help="comma-separated tools to leave out (e.g. litdata)")
    ap.add_argument("--out", default=str(BENCH_DATA / "pack-out"),
                    help="where the shards go (deleted after each run)")
    ap.add_argument("--headroom-only", action="store_true",
                    help="only measure how much CPU a second process can get here, then stop")
    args = ap.parse_args(argv)

    env = environment()
    env["core_headroom"] = core_headroom()
    log(f"two busy processes get {env['core_headroom']:.2f}x the CPU time of one (2.00 on 2 free cores), "
        f"load {os.getloadavg()[0]:.1f}")
    if args.headroom_only:
        return 0
    src = Path(args.src) if args.src else synth_image_folder(args.images)
    items = list_imagefolder(src)
    total = sum(os.path.getsize(p) for p, _, _ in items)
    log(f"{len(items)} files, {total / 1e6:.0f} MB in {src}")
    names = [n for n in TOOLS if n != "litdata.optimize 2 workers"]
    try:
        import litdata  # noqa: F401

        names.append("litdata.optimize 2 workers")
    except ImportError:
        log("litdata is not installed here (it needs torchvision, i.e. the 5.5 GB CUDA torch build): "
            "run with .venv-bench/bin/python to include it")
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    names = [n for n in names if not any(s in n for s in skip)]
    caches = ["cold", "warm"] if args.cache == "both" else [args.cache]
    out = Path(args.out)
    log(f"output to {out}")
    times: dict[tuple[str, str], list[float]] = {}
    cpus: dict[tuple[str, str], list[float]] = {}
    for cache in caches:
        for _ in range(args.repeat):
            for name in names:
                prepare_pack_run(src, out, cache)
                run = _run_isolated(name, src, out)
                dt, cpu, n = run["seconds"], run["cpu"], int(run["n"])
                if n != len(items):
                    raise SystemExit(f"{name} wrote {n} samples, expected {len(items)}")
                times.setdefault((name, cache), []).append(dt)
                cpus.setdefault((name, cache), []).append(cpu)
                log(f"{cache:>4} {name}: {dt:.1f} s, {len(items) / dt:,.0f} files/s, {total / dt / 1e6:,.0f} MB/s, "
                    f"{cpu:.1f} CPU s, load {os.getloadavg()[0]:.1f}")
    shutil.rmtree(out, ignore_errors=True)
    return _report(names, caches, times, cpus, len(items), total, env, out)


def _report(names: list[str], caches: list[str], times: dict, cpus: dict, files: int, total: int, env: dict,
            out: Path) -> int:
    import json
    import statistics

    print(f"\n== fastfeed pack vs peers: {files} JPEGs, {total / 1e6:.0f} MB, 256 MB tar shards, output in {out}")
    print(f"{'tool':<28}" + "".join(f"{c + ' files/s':>16}{c + ' MB/s':>12}{c + ' CPU ms/file':>18}"
                                     for c in caches))
    rates: dict[str, dict[str, float]] = {}
    cpu_ms: dict[str, dict[str, float]] = {}
    for name in names:
        cells = ""
        for c in caches:
            dt = statistics.median(times[(name, c)])
            rates.setdefault(c, {})[name] = files / dt
            cpu_ms.setdefault(c, {})[name] = statistics.median(cpus[(name, c)]) / files * 1e3
            cells += f"{files / dt:>16,.0f}{total / dt / 1e6:>12,.0f}{cpu_ms[c][name]:>18.3f}"
        print(f"{name:<28}{cells}")
    ratios: dict[str, dict[str, float]] = {}
    met = True
    for c in caches:
        me = rates[c]["fastfeed 2 workers"]
        peers = {n: r for n, r in rates[c].items() if not n.startswith("fastfeed")}
        if not peers:
            continue
        ratios[c] = {n: me / r for n, r in peers.items()}
        best = max(peers, key=peers.get)
        ratio = me / peers[best]
        met = met and ratio >= GOAL
        one = rates[c]["fastfeed 1 worker"] / peers[best]
        print(f"  {c}: fastfeed 2 workers / fastest peer ({best}) = {ratio:.2f}x "
              f"[goal >= {GOAL:g}: {'met' if ratio >= GOAL else 'MISSED'}]; 1 worker: {one:.2f}x; "
              + "; ".join(f"vs {n} {v:.2f}x" for n, v in ratios[c].items()))
        eff = cpu_ms[c][best] / cpu_ms[c]["fastfeed 2 workers"]
        print(f"  {c}: CPU per file, {best} / fastfeed 2 workers = {eff:.2f}x (fastfeed uses {1 / eff:.0%} "
              "of the peer's CPU time per file)")
    env["loadavg_1m_end"] = os.getloadavg()[0]
    print("RESULT " + json.dumps({"title": "pack", "files": files, "bytes": total, "env": env, "out": str(out),
                                  "seconds": {f"{n}|{c}": v for (n, c), v in times.items()},
                                  "cpu_s": {f"{n}|{c}": v for (n, c), v in cpus.items()},
                                  "cpu_ms_per_file": cpu_ms,
                                  "files_per_s": rates, "ratios": ratios, "goal": GOAL}, sort_keys=True))
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
