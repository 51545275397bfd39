"""The last resize step of fastfeed's CPU image paths: ``fastfeed._resize`` against OpenCV.

Per crop, one core, CPU time (``time.process_time``): a RandomResizedCrop box (scale 0.08-1,
torchvision's rule) of each image resized bilinearly to 224 x 224 and mirrored, as
:func:`fastfeed.decode.resize.resize_into` does for a crop less than 2x the output:

- ``opencv``: ``cv2.resize(INTER_LINEAR)`` + ``cv2.flip`` (the path without the extension);
- ``fastfeed._resize``: the extension's one pass (``fastfeed/_resize.c``).

Two sources of pixels:

- ``page-cache``: the images of a ``fastfeed pack --store raw`` dataset, read straight from
  its memory-mapped shards in shuffled order (what a raw-pixel loader worker does: the
  pixels come from the page cache, not from the CPU cache);
- ``hot``: crops of one image that stays in the CPU cache (the JPEG path: the decoded crop
  was just written).

Prints microseconds per crop and the speed-up (opencv / fastfeed._resize), the median of
``--repeat`` interleaved passes.

Run::

    PYTHONPATH=. .venv/bin/python benchmarks/resize_kernel.py                 # 2,000 real photos, max side 500
    PYTHONPATH=. .venv/bin/python benchmarks/resize_kernel.py --images 500 --repeat 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path
from typing import Any, Callable

import numpy as np

if __name__ == "__main__":  # run as a script: the repo's root on the path, for benchmarks.lib
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.lib.data import pack_once, photo_folder  # noqa: E402
from benchmarks.lib.measure import Stopwatch  # noqa: E402
from benchmarks.lib.suite import REPEAT, Axis, Benchmark, Context, Point  # noqa: E402

OUT = 224


def _dataset(images: int, max_side: int, source: Path | None) -> Path:
    """The photos packed raw (``--store raw --max-side N``, 500 per shard)."""
    return pack_once(photo_folder(images, source), store="raw", max_side=max_side, samples_per_shard=500)


def _views(dataset: Path, seed: int) -> list[np.ndarray]:
    """Every image of the raw dataset as a (h, w, 3) view of its memory-mapped shard, shuffled."""
    from fastfeed.decode.raw import pixels
    from fastfeed.packed.index import DatasetIndex
    from fastfeed.packed.reader import DatasetReader

    os.environ["FASTFEED_RAW_READS"] = "map"  # views of the memory map (the loader's default on one machine)
    reader = DatasetReader(DatasetIndex.load(dataset))
    out = []
    for i in np.random.default_rng(seed).permutation(reader.index.num_samples):
        s = reader.read(int(i))
        out.append(np.asarray(pixels(s["rgb8"], s["__shape__"])))
    return out


def _boxes(views: list[np.ndarray], seed: int) -> list[tuple[int, int, int, int]]:
    from fastfeed.decode.geometry import NUM_UNIFORMS, random_resized_crop

    rng = np.random.default_rng(seed)
    boxes = []
    for v in views:
        top, left, h, w = random_resized_crop(v.shape[0], v.shape[1], rng.random(NUM_UNIFORMS))
        boxes.append((top, left, min(h, 2 * OUT - 1), min(w, 2 * OUT - 1)))  # < 2x: the bilinear step alone
    return boxes


def _time(fn: Callable[[np.ndarray], None], views: list[np.ndarray], boxes: list[tuple[int, int, int, int]]) -> float:
    """CPU microseconds per crop of one pass (one core: this process's CPU time)."""
    with Stopwatch() as took:
        for v, (y, x, h, w) in zip(views, boxes):
            fn(v[y:y + h, x:x + w])
    return took.cpu / len(views) * 1e6


def options(p: argparse.ArgumentParser) -> None:
    """The data."""
    p.add_argument("--images", type=int, default=2_000)
    p.add_argument("--max-side", type=int, default=500)
    p.add_argument("--source", type=Path, help="a folder of photos to replicate (default: shared/data/imagenet-sample; "
                   "on the GPU machine: .dali-bench/imagenet-sample)")


def prepare(ctx: Context) -> dict[str, Any]:
    """The crops of both sources, and the two kernels (each writing into one output buffer)."""
    import cv2

    try:
        from fastfeed import _resize
    except ImportError:
        raise SystemExit("[bench] fastfeed._resize is not built (`pip install -e .` with a C compiler builds it): "
                         "nothing to compare") from None
    cv2.setNumThreads(1)
    dst = np.empty((OUT, OUT, 3), np.uint8)

    def opencv(c: np.ndarray) -> None:
        cv2.resize(c, (OUT, OUT), dst=dst, interpolation=cv2.INTER_LINEAR)
        cv2.flip(dst, 1, dst=dst)

    def ext(c: np.ndarray) -> None:
        _resize.resize(c, dst, True)

    views = _views(_dataset(ctx.args.images, ctx.args.max_side, ctx.args.source), 0)
    boxes = _boxes(views, 1)
    hot_img = views[0]
    hot_boxes = [(0, 0, min(h, hot_img.shape[0]), min(w, hot_img.shape[1])) for _, _, h, w in boxes]
    return {"sources": {"page-cache": (views, boxes), "hot": ([hot_img] * len(views), hot_boxes)},
            "kernels": {"opencv": opencv, "fastfeed._resize": ext}, "simd": _resize.simd(),
            "cv2": cv2.__version__, "images": len(views)}


def run_point(point: Point, ctx: Context) -> float:
    """One pass of one kernel over one source's crops."""
    views, boxes = ctx.data["sources"][point["source"]]
    return _time(ctx.data["kernels"][point["kernel"]], views, boxes)


def report(rows: list[tuple[Point, float]], ctx: Context) -> dict[str, Any]:
    """Median microseconds per crop of the passes, and opencv / fastfeed._resize per source."""
    runs: dict[str, list[float]] = {}
    for pt, us in rows:
        runs.setdefault(f"{pt['source']} {pt['kernel']}", []).append(us)
    print(f"\n== resize_kernel: {ctx.data['images']} crops -> {OUT}x{OUT} + flip, one core, {ctx.data['simd']}, "
          f"OpenCV {ctx.data['cv2']}, {ctx.env['cpu']}")
    med = {k: statistics.median(v) for k, v in runs.items()}
    for k, v in med.items():
        print(f"  {k:28s} {v:7.1f} us per crop  (runs {', '.join(f'{x:.1f}' for x in runs[k])})")
    ratios = {src: med[f"{src} opencv"] / med[f"{src} fastfeed._resize"] for src in ctx.grid["source"]
              if f"{src} opencv" in med and f"{src} fastfeed._resize" in med}
    for src, r in ratios.items():
        print(f"  {src}: fastfeed._resize {r:.2f}x OpenCV")
    return {"us_per_crop": med, "runs": runs, "ratios": ratios, "env": ctx.env, "simd": ctx.data["simd"],
            "images": ctx.data["images"]}


BENCHMARK = Benchmark(
    name="resize_kernel", doc=__doc__, options=options, prepare=prepare, run_point=run_point, report=report,
    needs=("cv2",), repeat=3,
    grid=(REPEAT, Axis("source", ("page-cache", "hot"), help="where the pixels come from"),
          Axis("kernel", ("opencv", "fastfeed._resize"), help="the bilinear resize + flip")),
    quick={"images": 300, "repeat": 1},
)

if __name__ == "__main__":
    from benchmarks.run import main

    sys.exit(main([BENCHMARK.name, *sys.argv[1:]]))
