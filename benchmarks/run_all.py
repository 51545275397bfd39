"""Run every benchmark script in ``benchmarks/`` (what ``make bench`` calls).

Each ``benchmarks/<name>.py`` that does not start with ``_`` is one goal; this runner
starts them one after the other with the same Python (the bench venv under ``make
bench``), streams their output, keeps each one's full output in
``bench-data/logs/<name>.log`` and the ``RESULT`` JSON lines in
``bench-data/logs/results.jsonl``, and ends with a summary. ``--quick`` is passed to
the scripts that accept it. A script that needs a GPU or a package that is not
installed says so and exits; the runner carries on.

Run::

    make bench                                   # everything, full size
    make bench BENCH_ARGS="--quick"              # small and short
    make bench BENCH_ARGS="--only loader_cpu,loader_memory"
"""

from __future__ import annotations

import argparse
import datetime
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _common import BENCH_DATA  # noqa: E402

# run first (cheap, or producing data the others reuse); the rest follow alphabetically
ORDER = ("pack", "loader_cpu", "loader_memory", "loader_s3", "decode_per_core", "tune")
# need one process per rank under torchrun (and a GPU for their figures): see their headers
TORCHRUN = {"ddp_tokens": "torchrun --nproc-per-node N benchmarks/ddp_tokens.py",
            "scaling": "torchrun --nproc-per-node N benchmarks/scaling.py image|tokens ..."}


def scripts() -> list[str]:
    """Benchmark names in run order (torchrun-only scripts left out)."""
    found = sorted(p.stem for p in HERE.glob("*.py")
                   if not p.stem.startswith("_") and p.stem != "run_all" and p.stem not in TORCHRUN)
    return [n for n in ORDER if n in found] + [n for n in found if n not in ORDER]


def _accepts_quick(path: Path) -> bool:
    return "--quick" in path.read_text(encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="pass --quick to the scripts that take it")
    p.add_argument("--only", default="", help="comma list of benchmark names (default: all)")
    p.add_argument("--skip", default="", help="comma list of benchmark names to leave out")
    args = p.parse_args(argv)
    names = scripts()
    if args.only:
        wanted = [n for n in args.only.split(",") if n]
        unknown = sorted(set(wanted) - set(names))
        if unknown:
            p.error(f"no such benchmark {unknown}; have {', '.join(names)}")
        names = [n for n in names if n in wanted]
    names = [n for n in names if n not in set(args.skip.split(","))]
    logs = BENCH_DATA / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    summary = []
    for name in names:
        path = HERE / f"{name}.py"
        cmd = [sys.executable, "-u", str(path)] + (["--quick"] if args.quick and _accepts_quick(path) else [])
        print(f"\n######## {name}: {' '.join(cmd[1:])}", flush=True)
        t0 = time.perf_counter()
        with open(logs / f"{name}.log", "w", encoding="utf-8") as log, \
                open(logs / "results.jsonl", "a", encoding="utf-8") as results:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for line in proc.stdout or ():
                sys.stdout.write(line)
                log.write(line)
                if line.startswith("RESULT "):
                    stamp = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
                    results.write(f'{{"benchmark": "{name}", "at": "{stamp}", "result": {line[7:].strip()}}}\n')
            rc = proc.wait()
        summary.append((name, rc, time.perf_counter() - t0))
    print("\n######## summary")
    for name, how in sorted(TORCHRUN.items()):
        if (HERE / f"{name}.py").exists():
            print(f"{name:<16} not run here: {how} (see its header)")
    for name, rc, took in summary:
        print(f"{name:<16} {'ok' if rc == 0 else f'exit {rc}':<8} {took:7.0f} s   log: {logs / (name + '.log')}")
    return 0 if all(rc == 0 for _, rc, _ in summary) else 1


if __name__ == "__main__":
    sys.exit(main())
