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
import json
import resource
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import BENCH_DATA, files_under, log, replicated_sample, synth_image_folder  # noqa: E402

_PACK = ("import sys, fastfeed; fastfeed.pack(sys.argv[1], sys.argv[2], samples_per_shard=500, workers=1, "
         "overwrite=True, jpeg_restarts={restarts})")


def _pack(src: Path, dst: Path, restarts: bool) -> dict[str, float]:
    """Pack in a fresh process; its wall time and CPU seconds (user + system)."""
    shutil.rmtree(dst, ignore_errors=True)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", _PACK.format(restarts=restarts), str(src), str(dst)], check=True,
                   cwd=Path(__file__).resolve().parent.parent)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": wall, "cpu_s": cpu}


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


def measure(kind: str, src: Path, repeat: int) -> dict[str, Any]:
    out: dict[str, Any] = {"dataset": kind, "folder": src.name}
    for restarts in (False, True):
        dst = BENCH_DATA / f"{src.name}.pack-restarts-{int(restarts)}"
        runs = [_pack(src, dst, restarts) for _ in range(repeat)]
        size = sum(p.stat().st_size for p in files_under(dst))
        out["restarts" if restarts else "plain"] = {
            "bytes": size, "wall_s": sorted(r["wall_s"] for r in runs)[len(runs) // 2],
            "cpu_s": sorted(r["cpu_s"] for r in runs)[len(runs) // 2], "dst": str(dst)}
    plain, rst = _jpegs(Path(out["plain"]["dst"])), _jpegs(Path(out["restarts"]["dst"]))
    out["jpegs"] = len(plain)
    out["recoded"] = sum(a != b for a, b in zip(plain, rst))
    out["pixel_checked"] = min(200, len(plain))
    out["pixel_same"] = _same_pixels(plain, rst, out["pixel_checked"])
    src_bytes = sum(p.stat().st_size for p in files_under(src))
    p, r = out["plain"], out["restarts"]
    log(f"{kind}: {len(plain)} JPEGs, source {src_bytes / 1e6:.1f} MB; shards plain {p['bytes'] / 1e6:.1f} MB, "
        f"with restarts {r['bytes'] / 1e6:.1f} MB ({r['bytes'] / p['bytes'] - 1:+.1%}); pack (1 writer) plain "
        f"{p['wall_s']:.1f} s wall / {p['cpu_s']:.1f} CPU-s, with restarts {r['wall_s']:.1f} s / {r['cpu_s']:.1f} "
        f"CPU-s (+{(r['cpu_s'] - p['cpu_s']) / len(plain) * 1e3:.2f} ms CPU per JPEG); re-coded {out['recoded']}, "
        f"same pixels {out['pixel_same']}/{out['pixel_checked']}")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--images", type=int, default=2_000, help="generated JPEGs")
    p.add_argument("--real-images", type=int, default=1_000, help="copies of the 47 real photos")
    p.add_argument("--repeat", type=int, default=1, help="packs of each kind (median reported)")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    reports = [measure("synth", synth_image_folder(args.images), args.repeat),
               measure("real", replicated_sample(args.real_images), args.repeat)]
    print("RESULT " + json.dumps(reports))
    if args.json:
        args.json.write_text(json.dumps(reports, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
