"""What pack's default restart markers cost: shard bytes and pack time, with and without.

``fastfeed pack`` stores JPEGs losslessly re-coded with a restart marker after every MCU
when ``fastfeed._jpegroi`` is built (the default since issue 17; ``--no-jpeg-restarts``
keeps the source bytes). The pixels are the same; this script measures the rest of
the trade on the benchmark data (generated ImageNet-like JPEGs and the real photos of
``shared/data/imagenet-sample`` replicated, as ``loader_cpu.py`` makes them):

- shard bytes of each pack (the JPEGs' bytes dominate);
- pack wall time and CPU seconds (the pack runs in a fresh process, one writer, so its
  CPU time is the cost of packing, whatever else shares the machine);
- how many JPEGs came out re-coded (the others, CMYK or unreadable, are stored as they
  were) and, on a sample of them, that the decoded pixels are the source's.

Run (bench venv: ``make bench-env``)::

    .venv-bench/bin/python benchmarks/pack_restarts.py                 # 2,000 synth + 1,000 real
    .venv-bench/bin/python benchmarks/pack_restarts.py --images 10000 --real-images 3000
"""

from __future__ import annotations

import argparse
import io
import shutil
import statistics
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

if __name__ == "__main__":  # run as a script: the repo's root on the path, for benchmarks.lib
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.lib.data import BENCH_DATA, replicated_sample, synth_image_folder, tree_bytes  # noqa: E402
from benchmarks.lib.measure import Stopwatch, children_cpu_seconds  # noqa: E402
from benchmarks.lib.report import log  # noqa: E402
from benchmarks.lib.suite import REPEAT, Axis, Benchmark, Context, Point  # noqa: E402

_PACK = ("import sys, fastfeed; fastfeed.pack(sys.argv[1], sys.argv[2], samples_per_shard=500, workers=1, "
         "overwrite=True, jpeg_restarts={restarts})")


def _pack(src: Path, dst: Path, restarts: bool) -> dict[str, float]:
    """Pack in a fresh process; its wall time and CPU seconds (user + system)."""
    shutil.rmtree(dst, ignore_errors=True)
    before = children_cpu_seconds()
    with Stopwatch() as took:
        subprocess.run([sys.executable, "-c", _PACK.format(restarts=restarts), str(src), str(dst)], check=True,
                       cwd=Path(__file__).resolve().parent.parent)
    return {"wall_s": took.wall, "cpu_s": children_cpu_seconds() - before}


def _jpegs(dst: Path) -> list[bytes]:
    out = []
    for shard in sorted(dst.glob("*.tar")):
        with tarfile.open(shard) as tf:
            for m in tf:
                if m.isfile() and m.name.lower().endswith((".jpg", ".jpeg")):
                    f = tf.extractfile(m)
                    if f is not None:
                        out.append(f.read())
    return out


def _same_pixels(plain: list[bytes], rst: list[bytes], n: int) -> int:
    """How many of the first ``n`` pairs decode to the same pixels (Pillow); shards keep one order."""
    import numpy as np
    from PIL import Image

    same = 0
    for a, b in list(zip(plain, rst))[:n]:
        same += bool(np.array_equal(np.asarray(Image.open(io.BytesIO(a))), np.asarray(Image.open(io.BytesIO(b)))))
    return same


def options(p: argparse.ArgumentParser) -> None:
    """The sizes of the two datasets."""
    p.add_argument("--images", type=int, default=2_000, help="generated JPEGs")
    p.add_argument("--real-images", type=int, default=1_000, help="copies of the 47 real photos")


def prepare(ctx: Context) -> dict[str, Path]:
    """The two image folders."""
    out: dict[str, Path] = {}
    if "synth" in ctx.grid["dataset"]:
        out["synth"] = synth_image_folder(ctx.args.images)
    if "real" in ctx.grid["dataset"]:
        out["real"] = replicated_sample(ctx.args.real_images)
    return out


def _dst(src: Path, restarts: bool) -> Path:
    return BENCH_DATA / f"{src.name}.pack-restarts-{int(restarts)}"


def run_point(point: Point, ctx: Context) -> dict[str, Any]:
    """One pack (one writer, a fresh process) of one dataset, with or without restart markers."""
    src = ctx.data[point["dataset"]]
    dst = _dst(src, point["restarts"])
    return {**_pack(src, dst, point["restarts"]), "bytes": tree_bytes(dst), "dst": str(dst)}


def report(rows: list[tuple[Point, dict[str, Any]]], ctx: Context) -> dict[str, Any]:
    """Per dataset: shard bytes and pack time (medians) with and without, how many JPEGs were
    re-coded, and on a sample that the decoded pixels are the source's."""
    reports = []
    for kind in ctx.grid["dataset"]:
        src = ctx.data[kind]
        out: dict[str, Any] = {"dataset": kind, "folder": src.name}
        for restarts in (False, True):
            runs = [r for pt, r in rows if pt["dataset"] == kind and pt["restarts"] == restarts]
            if not runs:
                break
            out["restarts" if restarts else "plain"] = {
                "bytes": runs[-1]["bytes"], "wall_s": statistics.median_high(r["wall_s"] for r in runs),
                "cpu_s": statistics.median_high(r["cpu_s"] for r in runs), "dst": runs[-1]["dst"]}
        else:
            reports.append(_compare(kind, src, out))
    return {"datasets": reports}


def _compare(kind: str, src: Path, out: dict[str, Any]) -> dict[str, Any]:
    plain, rst = _jpegs(Path(out["plain"]["dst"])), _jpegs(Path(out["restarts"]["dst"]))
    out["jpegs"] = len(plain)
    out["recoded"] = sum(a != b for a, b in zip(plain, rst))
    out["pixel_checked"] = min(200, len(plain))
    out["pixel_same"] = _same_pixels(plain, rst, out["pixel_checked"])
    src_bytes = tree_bytes(src)
    p, r = out["plain"], out["restarts"]
    log(f"{kind}: {len(plain)} JPEGs, source {src_bytes / 1e6:.1f} MB; shards plain {p['bytes'] / 1e6:.1f} MB, "
        f"with restarts {r['bytes'] / 1e6:.1f} MB ({r['bytes'] / p['bytes'] - 1:+.1%}); pack (1 writer) plain "
        f"{p['wall_s']:.1f} s wall / {p['cpu_s']:.1f} CPU-s, with restarts {r['wall_s']:.1f} s / {r['cpu_s']:.1f} "
        f"CPU-s (+{(r['cpu_s'] - p['cpu_s']) / len(plain) * 1e3:.2f} ms CPU per JPEG); re-coded {out['recoded']}, "
        f"same pixels {out['pixel_same']}/{out['pixel_checked']}")
    return out


BENCHMARK = Benchmark(
    name="pack_restarts", doc=__doc__, options=options, prepare=prepare, run_point=run_point, report=report,
    grid=(Axis("dataset", ("synth", "real"), help="generated JPEGs, replicated real photos"),
          Axis("restarts", (False, True), parse=lambda v: v.lower() in ("1", "true", "yes"),
               help="shards with restart markers or without"),
          REPEAT),
    quick={"images": 500, "real_images": 300},
)

if __name__ == "__main__":
    from benchmarks.run import main

    sys.exit(main([BENCHMARK.name, *sys.argv[1:]]))
