"""Which DALI decoder options raise GPU decode throughput (issue 6's 35,000 img/s goal).

An exploration, not a goal script: the hand-written pipeline of ``benchmarks/dali_gpu.py``
(``fn.readers.webdataset`` -> ``decoders.image_random_crop`` mixed -> ``resize`` 224 ->
``crop_mirror_normalize`` uint8 NCHW + flip) on the resized shards, at one base setting,
with one change at a time:

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

Each variant is measured ``--rounds`` times for ``--seconds`` each, in rotation (drift
favours none); batches synchronised on the GPU; img/s over the steady part.

GPU (via benchmarks/gpu_runs.sh's setup):
    python3 benchmarks/dali_variants.py --rounds 2 --seconds 4
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Iterator

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.dali_gpu import Config, fastfeed_dali, handwritten_dali, prepare  # noqa: E402


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
                if m.name.endswith(".jpg"):
                    f = tf.extractfile(m)
                    assert f is not None
                    w, h = Image.open(io.BytesIO(f.read())).size
                    wmax, hmax = max(wmax, w), max(hmax, h)
    return wmax, hmax


def handwritten(ds: Path, cfg: Config, *, batch_size: int, num_threads: int, hw_decoder_load: float,
                prefetch_queue_depth: int, **extra: Any) -> Callable[[], Iterator[Any]]:
    """dali_gpu.py's hand-written pipeline at this setting, yielding image batches."""
    knobs = {"num_threads": num_threads, "hw_decoder_load": hw_decoder_load,
             "prefetch_queue_depth": prefetch_queue_depth}
    _, forever = handwritten_dali(ds, knobs, replace(cfg, batch_size=batch_size), **extra)

    def images() -> Iterator[Any]:
        for batch in forever():
            yield batch["image"]
    return images


def alternate(*streams: Callable[[], Iterator[Any]]) -> Callable[[], Iterator[Any]]:
    def forever() -> Iterator[Any]:
        its = [s() for s in streams]
        while True:
            for it in its:
                yield next(it)
    return forever


def rate(make: Callable[[], Callable[[], Iterator[Any]]], seconds: float) -> float:
    """img/s over ``seconds`` after 8 warm-up batches, every batch synchronised."""
    import torch

    forever = make()
    it = forever()
    for _ in range(8):
        next(it)
    torch.cuda.synchronize()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        images = next(it)
        torch.cuda.current_stream().synchronize()
        n += len(images)
    out = n / (time.perf_counter() - t0)
    del it, forever
    import gc

    gc.collect()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--load", type=float, default=1.0)
    ap.add_argument("--depth", type=int, default=3)
    ap.add_argument("--only", default="", help="comma list of variants")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    cfg = Config()
    if not cfg.images.is_dir():
        cfg = Config(images=Path(__file__).resolve().parent.parent / ".dali-bench" / "imagenet-sample")
    ds = prepare(cfg)["resized"]
    w, h = _largest_image(ds)
    base = dict(batch_size=args.batch_size, num_threads=args.threads, hw_decoder_load=args.load,
                prefetch_queue_depth=args.depth)
    half = dict(base, num_threads=max(1, args.threads // 2))
    prealloc = {"preallocate_width_hint": w, "preallocate_height_hint": h,
                "device_memory_padding": 4 * w * h * 3 * args.batch_size // 4,
                "host_memory_padding": w * h * 3 * 16}
    variants: dict[str, Callable[[], Callable[[], Iterator[Any]]]] = {
        "base": lambda: handwritten(ds, cfg, **base),
        "prealloc": lambda: handwritten(ds, cfg, **base, decoder_extra=prealloc),
        "no-antialias": lambda: handwritten(ds, cfg, **base, resize_extra={"antialias": False}),
        "batch-512": lambda: handwritten(ds, cfg, **dict(base, batch_size=512)),
        "threads-8": lambda: handwritten(ds, cfg, **dict(base, num_threads=8)),
        "two-pipes": lambda: alternate(handwritten(ds, cfg, **half, seed=1, shard=(0, 2)),
                                       handwritten(ds, cfg, **half, seed=2, shard=(1, 2))),
        "fastfeed": lambda: _ff(ds, cfg, base),
    }
    only = [v for v in args.only.split(",") if v] or list(variants)
    rates: dict[str, list[float]] = {v: [] for v in only}
    print(f"resized shards {ds.name}: largest image {w}x{h}; base {base}", flush=True)
    for r in range(args.rounds):
        order = only if r % 2 == 0 else only[::-1]
        for v in order:
            x = rate(variants[v], args.seconds)
            rates[v].append(x)
            print(f"  round {r + 1} {v:<14} {x:>9,.0f} img/s", flush=True)
    b = statistics.median(rates["base"]) if "base" in rates else None
    print(f"\n{'variant':<14}{'img/s (median)':>16}{'vs base':>9}  rounds")
    for v in only:
        m = statistics.median(rates[v])
        print(f"{v:<14}{m:>16,.0f}{(m / b if b else float('nan')):>9.3f}  " + ", ".join(f"{x:,.0f}" for x in rates[v]))
    if args.json:
        args.json.write_text(json.dumps({"base": base, "largest": [w, h], "rates": rates}, indent=1))
    return 0


def _ff(ds: Path, cfg: Config, base: dict[str, Any]) -> Callable[[], Iterator[Any]]:
    knobs = {k: v for k, v in base.items() if k != "batch_size"}
    _, forever = fastfeed_dali(ds, knobs, replace(cfg, batch_size=base["batch_size"]))

    def images() -> Iterator[Any]:
        for batch in forever():
            yield batch["image"] if isinstance(batch, dict) else batch
    return images


if __name__ == "__main__":
    sys.exit(main())
