"""Which DALI decoder options raise GPU decode throughput (issue 6's 35,000 img/s goal).

An exploration, not a goal script: the hand-written pipeline of ``benchmarks/dali_gpu.py``
(``fn.readers.webdataset`` -> ``decoders.image_random_crop`` mixed -> ``resize`` 224 ->
``crop_mirror_normalize`` uint8 NCHW + flip; :mod:`benchmarks.lib.dali`) on the resized shards,
at one base setting, with one change at a time:

- ``base``: the setting as given (default: the best setting of the last paired search);
- ``prealloc``: ``preallocate_width_hint`` / ``preallocate_height_hint`` at the shards'
  largest image (the hardware decoder's buffers allocated once, not grown per batch),
  plus ``device_memory_padding`` / ``host_memory_padding`` sized for a batch;
- ``no-antialias``: ``resize(antialias=False)`` (linear interpolation only: *changes the
  output* on downscaled crops; measured to know what the filter costs);
- ``batch-512`` / ``threads-8``: neighbours of the base setting;
- ``two-pipes``: two pipelines of half the threads each, read alternately (two decode
  streams in flight on one GPU);
- ``fastfeed``: ``fastfeed.loader(decode="dali")`` at the same setting (its default
  decoder options).

Each variant is measured ``--rounds`` times for ``--seconds`` of steady state each, in rotation
(drift favours none); batches synchronised on the GPU; img/s from :mod:`fastfeed.timing` (8
batches of warm-up, then the median of steady windows).

GPU (via benchmarks/gpu_runs.sh's setup):
    python3 benchmarks/dali_variants.py --rounds 2 --seconds 4
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Iterator

if __name__ == "__main__":  # run as a script: the repo's root on the path, for benchmarks.lib
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.lib.dali import Config, alternate, fastfeed_dali, handwritten_dali, prepare, sync  # noqa: E402
from benchmarks.lib.measure import measure  # noqa: E402
from benchmarks.lib.suite import REPEAT, Axis, Benchmark, Context, Point  # noqa: E402

VARIANTS = ("base", "prealloc", "no-antialias", "batch-512", "threads-8", "two-pipes", "fastfeed")
#: batches consumed before the steady part is timed (the pipelines are built and primed before that)
WARMUP_BATCHES = 8


def _largest_image(ds: Path) -> tuple[int, int]:
    """(width, height) hints: the largest width and height over a sample of the shards' images."""
    import io
    import tarfile

    from PIL import Image

    index = json.loads((ds / "index.json").read_text())
    wmax = hmax = 0
    for shard in index["shards"][:4]:
        with tarfile.open(ds / shard["name"]) as tf:
            for m in tf.getmembers():
                f = tf.extractfile(m) if m.name.endswith(".jpg") else None
                if f is not None:
                    w, h = Image.open(io.BytesIO(f.read())).size
                    wmax, hmax = max(wmax, w), max(hmax, h)
    return wmax, hmax


def handwritten(ds: Path, cfg: Config, *, batch_size: int, num_threads: int, hw_decoder_load: float,
                prefetch_queue_depth: int, **extra: Any) -> Callable[[], Iterator[Any]]:
    """The hand-written pipeline at this setting, yielding image batches."""
    knobs = {"num_threads": num_threads, "hw_decoder_load": hw_decoder_load,
             "prefetch_queue_depth": prefetch_queue_depth}
    _, forever = handwritten_dali(ds, knobs, replace(cfg, batch_size=batch_size), **extra)

    def images() -> Iterator[Any]:
        for batch in forever():
            yield batch["image"]
    return images


def _ff(ds: Path, cfg: Config, base: dict[str, Any]) -> Callable[[], Iterator[Any]]:
    knobs = {k: v for k, v in base.items() if k != "batch_size"}
    _, forever = fastfeed_dali(ds, knobs, replace(cfg, batch_size=base["batch_size"]))

    def images() -> Iterator[Any]:
        for batch in forever():
            yield batch["image"] if isinstance(batch, dict) else batch
    return images


def _base(args: argparse.Namespace) -> dict[str, Any]:
    return dict(batch_size=args.batch_size, num_threads=args.threads, hw_decoder_load=args.load,
                prefetch_queue_depth=args.depth)


def variant(name: str, ds: Path, cfg: Config, base: dict[str, Any],
            largest: tuple[int, int]) -> Callable[[], Iterator[Any]]:
    """The image batches of one variant (its pipelines built now)."""
    w, h = largest
    half = dict(base, num_threads=max(1, base["num_threads"] // 2))
    prealloc = {"preallocate_width_hint": w, "preallocate_height_hint": h,
                "device_memory_padding": 4 * w * h * 3 * base["batch_size"] // 4,
                "host_memory_padding": w * h * 3 * 16}
    if name == "prealloc":
        return handwritten(ds, cfg, **base, decoder_extra=prealloc)
    if name == "no-antialias":
        return handwritten(ds, cfg, **base, resize_extra={"antialias": False})
    if name == "batch-512":
        return handwritten(ds, cfg, **dict(base, batch_size=512))
    if name == "threads-8":
        return handwritten(ds, cfg, **dict(base, num_threads=8))
    if name == "two-pipes":
        return alternate(handwritten(ds, cfg, **half, seed=1, shard=(0, 2)),
                         handwritten(ds, cfg, **half, seed=2, shard=(1, 2)))
    if name == "fastfeed":
        return _ff(ds, cfg, base)
    return handwritten(ds, cfg, **base)


def options(ap: argparse.ArgumentParser) -> None:
    """The base setting and the time per measurement."""
    ap.add_argument("--seconds", type=float, default=4.0, help="steady seconds per measurement")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--load", type=float, default=1.0)
    ap.add_argument("--depth", type=int, default=3)


def prepare_data(ctx: Context) -> dict[str, Any]:
    """The resized shards of ``benchmarks/dali_gpu.py`` and their largest image."""
    ds = prepare(Config().found_images())["resized"]
    largest = _largest_image(ds)
    print(f"resized shards {ds.name}: largest image {largest[0]}x{largest[1]}; base {_base(ctx.args)}", flush=True)
    return {"ds": ds, "largest": largest}


def run_point(point: Point, ctx: Context) -> float:
    """img/s of one variant: :func:`fastfeed.timing.measure.measure`, every batch synchronised."""
    import gc

    seconds = ctx.args.seconds
    forever = variant(point["variant"], ctx.data["ds"], Config().found_images(), _base(ctx.args), ctx.data["largest"])
    m = measure(forever, warmup_batches=WARMUP_BATCHES, settle=0.0, min_batches=12, min_time=seconds,
                max_time=2 * seconds + 30, consume=sync(0))
    del forever
    gc.collect()
    print(f"  round {point['round'] + 1} {point['variant']:<14} {m.samples_per_s:>9,.0f} img/s", flush=True)
    return m.samples_per_s


def report(rows: list[tuple[Point, float]], ctx: Context) -> dict[str, Any]:
    """Median img/s per variant, and each against ``base``."""
    rates: dict[str, list[float]] = {}
    for pt, rate in rows:
        rates.setdefault(pt["variant"], []).append(rate)
    b = statistics.median(rates["base"]) if "base" in rates else None
    print(f"\n{'variant':<14}{'img/s (median)':>16}{'vs base':>9}  rounds")
    for v, xs in rates.items():
        m = statistics.median(xs)
        print(f"{v:<14}{m:>16,.0f}{(m / b if b else float('nan')):>9.3f}  " + ", ".join(f"{x:,.0f}" for x in xs))
    return {"base": _base(ctx.args), "largest": list(ctx.data["largest"]), "rates": rates}


BENCHMARK = Benchmark(
    name="dali_variants", doc=__doc__, needs=("dali", "cuda"), options=options, prepare=prepare_data,
    grid=(REPEAT, Axis("variant", VARIANTS, flag="--only", help="the variants", alternate=True)),
    repeat=2, repeat_flags=("--rounds", "--repeat"), run_point=run_point, report=report,
    quick={"seconds": 1.0, "repeat": 1},
)

if __name__ == "__main__":
    from benchmarks.run import main

    sys.exit(main([BENCHMARK.name, *sys.argv[1:]]))
