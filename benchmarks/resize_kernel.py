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
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import SHARED_SAMPLE, environment, log, replicated_sample, synth_image_folder  # noqa: E402

OUT = 224


def _dataset(images: int, max_side: int, source: Path | None) -> Path:
    import fastfeed

    src = source or SHARED_SAMPLE
    folder = replicated_sample(images, src=src) if src.is_dir() else synth_image_folder(images)
    dst = folder.with_name(f"{folder.name}.ff-raw-{max_side}-resize")
    fastfeed.pack(folder, dst, store="raw", max_side=max_side, samples_per_shard=500, seed=0)
    return dst


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
    t = time.process_time()
    for v, (y, x, h, w) in zip(views, boxes):
        fn(v[y:y + h, x:x + w])
    return (time.process_time() - t) / len(views) * 1e6


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--images", type=int, default=2_000)
    p.add_argument("--max-side", type=int, default=500)
    p.add_argument("--source", type=Path, help="a folder of photos to replicate (default: shared/data/imagenet-sample; "
                   "on the GPU machine: .dali-bench/imagenet-sample)")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)

    import cv2

    try:
        from fastfeed import _resize
    except ImportError:
        log("fastfeed._resize is not built (`pip install -e .` with a C compiler builds it): nothing to compare")
        return 1
    cv2.setNumThreads(1)
    dst = np.empty((OUT, OUT, 3), np.uint8)

    def opencv(c: np.ndarray) -> None:
        cv2.resize(c, (OUT, OUT), dst=dst, interpolation=cv2.INTER_LINEAR)
        cv2.flip(dst, 1, dst=dst)

    def ext(c: np.ndarray) -> None:
        _resize.resize(c, dst, True)

    views = _views(_dataset(args.images, args.max_side, args.source), 0)
    boxes = _boxes(views, 1)
    hot_img = views[0]
    hot = [hot_img] * len(views)
    hot_boxes = [(0, 0, min(h, hot_img.shape[0]), min(w, hot_img.shape[1])) for _, _, h, w in boxes]
    runs: dict[str, list[float]] = {}
    for _ in range(args.repeat):
        for src, vs, bs in (("page-cache", views, boxes), ("hot", hot, hot_boxes)):
            for name, fn in (("opencv", opencv), ("fastfeed._resize", ext)):
                runs.setdefault(f"{src} {name}", []).append(_time(fn, vs, bs))
    env = environment()
    print(f"\n== resize_kernel: {len(views)} crops -> {OUT}x{OUT} + flip, one core, {_resize.simd()}, "
          f"OpenCV {cv2.__version__}, {env['cpu']}")
    med = {k: statistics.median(v) for k, v in runs.items()}
    for k, v in med.items():
        print(f"  {k:28s} {v:7.1f} us per crop  (runs {', '.join(f'{x:.1f}' for x in runs[k])})")
    ratios = {src: med[f"{src} opencv"] / med[f"{src} fastfeed._resize"] for src in ("page-cache", "hot")}
    for src, r in ratios.items():
        print(f"  {src}: fastfeed._resize {r:.2f}x OpenCV")
    if args.json:
        args.json.write_text(json.dumps({"us_per_crop": med, "runs": runs, "ratios": ratios, "env": env,
                                         "simd": _resize.simd(), "images": len(views)}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
