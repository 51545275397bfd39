"""Per-core speed of fastfeed's CPU decode path, against FFCV's per-image operations.

One process, one core, no worker processes: how many images per second of CPU time
does each pipeline turn into a uint8 batch of ``--batch`` 224x224 RandomResizedCrops
with random horizontal flips?

- ``fastfeed-turbo``: ``fastfeed.loader(num_workers=0, decode_backend="turbo")`` over
  ``fastfeed pack --no-jpeg-restarts`` tar shards (plain JPEGs; everything: shard reads,
  tar parsing, crop choice, DCT-scaled decode, of only the crop's region when the
  extension ``fastfeed._jpegroi`` is built (:mod:`fastfeed.decode.roi`), OpenCV resize
  into the batch buffer, labels, stats).
- ``fastfeed-turbo-rst``: the same over default ``fastfeed pack`` shards (restart
  markers: the same pixels, losslessly re-coded with a restart marker per 16x16 block,
  so a crop is cut out of the compressed data and only its blocks are decoded; packing
  needs the extension). This is the default install's path.
- ``fastfeed-turbo-rst-pycut``: the same shards with the extension switched off: the
  crop's segments are cut in Python and decoded by simplejpeg (an install without a C
  compiler).
- ``fastfeed-turbo-full``: plain shards with region decoding switched off (whole-image
  simplejpeg decode, as without the extension): the region decoding's share.
- ``fastfeed-pillow``: the default shards with ``decode_backend="pillow"`` (an install
  without simplejpeg or OpenCV).
- ``ffcv-ops``: the operations FFCV's ``RandomResizedCropRGBImageDecoder`` +
  ``RandomHorizontalFlip`` run per image (libjpeg-turbo full decode with fast DCT,
  torchvision's crop rule, ``cv2.resize`` with ``INTER_AREA``, flip), written here in a
  few lines over the same JPEG bytes *already in memory* (no file reads, no tar
  parsing: in its favour). This is not FFCV itself (``benchmarks/loader_cpu.py`` runs
  the real FFCV loader); it shows where per-core time goes.
- ``ffcv-ops-linear``: the same with bilinear resizing (what fastfeed uses when the crop
  is less than twice the output), to separate the resize's share from the rest.

CPU time (``time.process_time``) is reported besides wall time, because the machine
may be shared; passes of the pipelines interleave and the median of ``--repeat`` is printed.

Run::

    .venv/bin/python benchmarks/decode_per_core.py                 # 512 images, 500x375 q90
    .venv/bin/python benchmarks/decode_per_core.py --source real   # the 47 real photos, replicated
    .venv/bin/python benchmarks/decode_per_core.py --images 2048 --repeat 5
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any, Callable

import numpy as np

if __name__ == "__main__":  # run as a script: the repo's root on the path, for benchmarks.lib
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fastfeed.decode.geometry import FLIP, NUM_UNIFORMS, random_resized_crop, uniforms  # noqa: E402

from benchmarks.lib.data import BENCH_DATA, replicated_sample, synth_image_folder  # noqa: E402
from benchmarks.lib.loaders import fastfeed_loader  # noqa: E402
from benchmarks.lib.measure import Stopwatch  # noqa: E402
from benchmarks.lib.suite import REPEAT, Axis, Benchmark, Context, Point  # noqa: E402

PIPELINES = ("fastfeed-turbo", "fastfeed-turbo-rst", "fastfeed-turbo-rst-pycut", "fastfeed-turbo-full",
             "fastfeed-pillow", "ffcv-ops", "ffcv-ops-linear")
#: the pipelines that need fastfeed._jpegroi (restart-marker shards are packed with it)
NEEDS_ROI = ("fastfeed-turbo-rst", "fastfeed-turbo-rst-pycut")


def ffcv_ops(datas: list[bytes], batch: int, size: int, interp: str) -> Callable[[], int]:
    import cv2
    import simplejpeg

    cv2.setNumThreads(1)
    flag = cv2.INTER_AREA if interp == "area" else cv2.INTER_LINEAR
    u = uniforms(seed=0, epoch=0, ids=np.arange(len(datas)), n=NUM_UNIFORMS)

    def run() -> int:
        for a in range(0, len(datas), batch):
            out = np.empty((min(batch, len(datas) - a), size, size, 3), np.uint8)
            for j in range(out.shape[0]):
                img = simplejpeg.decode_jpeg(datas[a + j], "RGB", fastdct=True)
                top, left, h, w = random_resized_crop(img.shape[0], img.shape[1], u[a + j])
                cv2.resize(img[top:top + h, left:left + w], (size, size), dst=out[j], interpolation=flag)
                if u[a + j, FLIP] < 0.5:
                    cv2.flip(out[j], 1, dst=out[j])
        return len(datas)

    return run


def fastfeed_pass(root: Path, batch: int, size: int, backend: str, ext: bool = True,
                  cut: bool = True) -> Callable[[], int]:
    dl = fastfeed_loader(root, batch_size=batch, image_size=size, workers=0, decode_backend=backend,
                         pin_memory=False)
    if not ext:  # num_workers=0: this process's decoder; as without _jpegroi (cut: Python restart cut)
        images = dl.dataset.decoder.images
        images._load()
        images._roi, images._cut = False, cut

    def run() -> int:
        return sum(len(b["__key__"]) for b in dl)

    return run


def options(ap: argparse.ArgumentParser) -> None:
    """The images, the batch shape, where the packs go."""
    ap.add_argument("--images", type=int, default=512)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--source", choices=("synth", "real"), default="synth",
                    help="synth: generated 500x375 q90 JPEGs; real: shared/data/imagenet-sample replicated")
    ap.add_argument("--data", type=Path, default=BENCH_DATA / "decode_per_core", help="where the packs go")


def prepare(ctx: Context) -> dict[str, Any]:
    """The JPEGs, their plain and restart-marker packs, every pipeline built and run once (warm:
    page cache, imports, lazy loads)."""
    import fastfeed
    from fastfeed.decode import roi

    args = ctx.args
    if args.source == "synth":
        src = synth_image_folder(args.images, num_classes=10, vary_size=False)
    else:
        src = replicated_sample(args.images)
    packed = args.data / f"packed-{src.name}"
    rst = packed.with_name(packed.name + "-rst")
    if not (packed / "index.json").exists():
        fastfeed.pack(src, packed, samples_per_shard=256, overwrite=True, jpeg_restarts=False)
    if roi.built() and not (rst / "index.json").exists():
        fastfeed.pack(src, rst, samples_per_shard=256, overwrite=True)  # the default: restart markers
    datas = [p.read_bytes() for p in sorted(src.rglob("*.jpg"))]
    what = "500x375 q90" if args.source == "synth" else "real photos (imagenet-sample)"
    print(f"{len(datas)} JPEGs ({what}), mean {np.mean([len(d) for d in datas]) / 1e3:.0f} KB -> "
          f"RandomResizedCrop {args.size} + flip, batch {args.batch}, 1 process")
    makers: dict[str, Callable[[], Callable[[], int]]] = {
        "fastfeed-turbo": lambda: fastfeed_pass(packed, args.batch, args.size, "turbo"),
        "fastfeed-turbo-rst": lambda: fastfeed_pass(rst, args.batch, args.size, "turbo"),
        "fastfeed-turbo-rst-pycut": lambda: fastfeed_pass(rst, args.batch, args.size, "turbo", ext=False),
        "fastfeed-turbo-full": lambda: fastfeed_pass(packed, args.batch, args.size, "turbo", ext=False, cut=False),
        "fastfeed-pillow": lambda: fastfeed_pass(rst if roi.built() else packed, args.batch, args.size, "pillow"),
        "ffcv-ops": lambda: ffcv_ops(datas, args.batch, args.size, "area"),
        "ffcv-ops-linear": lambda: ffcv_ops(datas, args.batch, args.size, "linear"),
    }
    runs = {k: makers[k]() for k in ctx.grid["pipeline"] if k not in NEEDS_ROI or roi.built()}
    for run in runs.values():
        run()  # warm: page cache, imports, lazy loads
    return {"runs": runs, "images": len(datas)}


def skip(point: Point, ctx: Context) -> str | None:
    """The restart-marker pipelines without ``fastfeed._jpegroi``."""
    if point["pipeline"] not in ctx.data["runs"]:
        return f"{point['pipeline']}: fastfeed._jpegroi is not built (restart-marker shards need it)"
    return None


def run_point(point: Point, ctx: Context) -> dict[str, float]:
    """One pass of one pipeline: images per CPU-second and per second."""
    with Stopwatch() as took:
        n = ctx.data["runs"][point["pipeline"]]()
    return {"cpu": n / took.cpu, "wall": n / took.wall}


def report(rows: list[tuple[Point, dict[str, float]]], ctx: Context) -> dict[str, Any]:
    """Median images per CPU-second of the passes; each against FFCV's operations; the fallbacks."""
    from fastfeed.decode import roi

    passes: dict[str, list[dict[str, float]]] = {}
    for pt, r in rows:
        passes.setdefault(pt["pipeline"], []).append(r)
    rates = {k: (statistics.median(x["cpu"] for x in v), statistics.median(x["wall"] for x in v))
             for k, v in passes.items()}
    ref = rates["ffcv-ops"][0] if "ffcv-ops" in rates else float("nan")
    print(f"{'pipeline':<20}{'img/s per CPU-s':>16}{'ms CPU/img':>11}{'img/s wall':>12}{'vs ffcv-ops':>13}")
    for name, (cpu, wall) in rates.items():
        print(f"{name:<20}{cpu:>16.0f}{1e3 / cpu:>11.2f}{wall:>12.0f}{cpu / ref:>12.2f}x")
    turbo = rates.get("fastfeed-turbo", (float("nan"),))[0]
    if "fastfeed-turbo-full" in rates:
        print(f"region decoding (fastfeed._jpegroi): {'built' if roi.available() else 'NOT built'}; "
              f"fastfeed-turbo / fastfeed-turbo-full: {turbo / rates['fastfeed-turbo-full'][0]:.2f}x")
    if "fastfeed-turbo-rst" in rates:
        default = rates["fastfeed-turbo-rst"][0]
        print(f"restart markers (pack's default): fastfeed-turbo-rst / fastfeed-turbo: {default / turbo:.2f}x")
        print("CPU per image of each fallback vs the default path (fastfeed-turbo-rst): " + ", ".join(
            f"{k} {default / rates[k][0]:.2f}x" for k in
            ("fastfeed-turbo-rst-pycut", "fastfeed-turbo", "fastfeed-turbo-full", "fastfeed-pillow") if k in rates))
    ratio = turbo / ref
    print(f"goal: fastfeed-turbo >= 1.0x ffcv-ops per core: {ratio:.2f}x -> {'pass' if ratio >= 1.0 else 'FAIL'}")
    return {"source": ctx.args.source, "images": ctx.data["images"],
            "img_per_cpu_s": {k: round(v[0], 1) for k, v in rates.items()},
            "ratio_vs_ffcv_ops": round(ratio, 3), "goal": 1.0, "pass": bool(ratio >= 1.0)}


BENCHMARK = Benchmark(
    name="decode_per_core", doc=__doc__, options=options, prepare=prepare, skip=skip, run_point=run_point,
    report=report, needs=("cv2", "simplejpeg"), repeat=3,
    grid=(REPEAT, Axis("pipeline", PIPELINES, help="the pipelines compared (see the table above)")),
    quick={"images": 128, "repeat": 2},
)

if __name__ == "__main__":
    from benchmarks.run import main

    sys.exit(main([BENCHMARK.name, *sys.argv[1:]]))
