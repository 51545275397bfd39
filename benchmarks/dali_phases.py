"""Where the time to a ``decode="dali"`` loader's first batch goes (issue 20, item 3).

``benchmarks/dali_latency.py`` measures the time to the first batch per case; this script
splits the cold case into its phases, so a fix can be aimed at the part that costs:

1. importing DALI;
2. ``fastfeed.loader(...)`` returning (index, sample table, options: no pipeline yet);
3. the first ``next()``: pipeline definition + ``Pipeline.build()`` + the first iterations,
   with a profile of the call (the functions with the most cumulative time);
4. bare DALI pipelines fed the same JPEGs, built and run once each in this process, with
   one more part of fastfeed's graph at each row (decoder only, hardware decoder on, random
   crop + resize + normalise), at ``prefetch_queue_depth`` 1 and the loader's: what DALI
   itself costs before any fastfeed code runs; the last rows are built while a one-image
   pipeline of the same decoder is alive (what :func:`fastfeed.loading.dali.reuse.keep_warm`
   keeps), to show what DALI shares between live pipelines.

Run on the GPU machine after ``source benchmarks/gpu_setup.sh``::

    python3 benchmarks/dali_phases.py bench-data/dali/<dataset> --images .dali-bench/imagenet-sample
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import sys
from pathlib import Path
from typing import Any

import numpy as np

if __name__ == "__main__":  # run as a script: the repo's root on the path, for benchmarks.lib
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.lib.loaders import fastfeed_loader, fastfeed_options  # noqa: E402
from benchmarks.lib.measure import Stopwatch  # noqa: E402
from benchmarks.lib.suite import Benchmark, Context  # noqa: E402


def _jpegs(folder: Path, n: int) -> list[np.ndarray]:
    files = sorted(p for p in folder.rglob("*") if p.suffix.lower() in (".jpg", ".jpeg"))
    if not files:
        raise SystemExit(f"no JPEGs under {folder}")
    return [np.frombuffer(files[i % len(files)].read_bytes(), dtype=np.uint8) for i in range(n)]


def bare(d: Any, jpegs: list[np.ndarray], *, stage: str, batch: int, threads: int, depth: int,
         hw: float, size: int) -> dict[str, float]:
    """Build one bare pipeline up to ``stage`` and run it once: seconds per phase."""
    fn, types = d.fn, d.types
    clock = Stopwatch.start()
    t0 = clock.elapsed()
    pipe = d.Pipeline(batch_size=batch, num_threads=threads, device_id=0, seed=1, prefetch_queue_depth=depth)
    with pipe:
        enc = fn.external_source(name="enc", no_copy=True, dtype=types.UINT8)
        if stage == "decode":
            out = fn.decoders.image(enc, device="mixed", output_type=types.RGB, hw_decoder_load=hw)
        else:
            out = fn.decoders.image_random_crop(enc, device="mixed", output_type=types.RGB, hw_decoder_load=hw,
                                                random_area=[0.08, 1.0], random_aspect_ratio=[0.75, 4 / 3])
            out = fn.resize(out, resize_x=size, resize_y=size)
            out = fn.crop_mirror_normalize(out, dtype=types.UINT8, output_layout="CHW",
                                           mirror=fn.random.coin_flip(probability=0.5))
        pipe.set_outputs(out)
    t1 = clock.elapsed()
    pipe.build()
    t2 = clock.elapsed()
    for k in range(depth):
        pipe.feed_input("enc", jpegs[k * batch:(k + 1) * batch])
    outs = pipe.run()
    outs[0].as_cpu()  # the batch on the host: its GPU work is finished
    t3 = clock.elapsed()
    pipe.feed_input("enc", jpegs[:batch])
    pipe.run()[0].as_cpu()
    t4 = clock.elapsed()
    del pipe, outs
    return {"define": t1 - t0, "build": t2 - t1, "first run": t3 - t2, "next run": t4 - t3, "total": t3 - t0}


def options(ap: argparse.ArgumentParser) -> None:
    """The dataset, the photos of the bare pipelines, the setting."""
    ap.add_argument("dataset", type=Path, help="a fastfeed-packed image dataset")
    ap.add_argument("--images", type=Path, required=True, help="a folder of JPEGs for the bare pipelines")
    ap.add_argument("--knobs", default='{"num_threads": 8, "hw_decoder_load": 0.9, "prefetch_queue_depth": 3}')
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--image-size", type=int, default=224)


def run(ctx: Context) -> dict[str, Any]:
    """The phases of the first batch, then the bare pipelines (see the module docstring)."""
    args = ctx.args
    knobs = json.loads(args.knobs)
    import torch

    torch.zeros(1, device="cuda:0").sum().item()  # CUDA up, as in a training script
    from fastfeed.loading.dali.backend import import_dali

    out: dict[str, Any] = {"knobs": knobs}
    with Stopwatch() as took:
        d = import_dali()
    out["import DALI"] = took.wall
    with Stopwatch() as took:
        dl = fastfeed_loader(args.dataset, batch_size=args.batch_size, image_size=args.image_size,
                             decode="dali", device_id=0, dali={"num_pipelines": 1, **knobs})
    out["loader() returns"] = took.wall
    prof = cProfile.Profile()
    stream = torch.cuda.current_stream(0)
    with Stopwatch() as took:
        prof.enable()
        next(iter(dl))
        stream.synchronize()
        prof.disable()
    out["first next() (build + first batch)"] = took.wall
    dl.close()
    from fastfeed.loading.dali.graph import probe_pipeline
    from fastfeed.loading.dali.reuse import release_parked

    release_parked()  # the loader's warm pipeline (keep_warm) too: the bare rows build alone
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(28)
    print("\n".join(line for line in text.getvalue().splitlines() if line.strip())[:6000])
    jpegs = _jpegs(args.images, args.batch_size * max(3, knobs.get("prefetch_queue_depth", 2)))
    rows: dict[str, Any] = {}
    hw = float(knobs.get("hw_decoder_load", 0.9))
    threads = int(knobs.get("num_threads", 8))
    for stage, h, depth in (("decode", 0.0, 1), ("decode", hw, 1), ("full", hw, 1),
                            ("full", hw, int(knobs.get("prefetch_queue_depth", 2))), ("full", hw, 1)):
        name = f"{stage}, hw_decoder_load {h:g}, depth {depth}"
        rows[name if name not in rows else name + " (again)"] = bare(
            d, jpegs, stage=stage, batch=args.batch_size, threads=threads, depth=depth, hw=h, size=args.image_size)
    with Stopwatch() as took:
        keeper = probe_pipeline(d, fastfeed_options(batch_size=1, decode="dali", image_size=args.image_size,
                                                    device_id=0, dali={"hw_decoder_load": hw}))
    rows["one-image pipeline (the keeper) alone"] = {"define": 0.0, "build": took.wall, "first run": 0.0,
                                                     "next run": 0.0, "total": took.wall}
    for depth in (1, int(knobs.get("prefetch_queue_depth", 2))):
        rows[f"full, depth {depth}, beside the keeper"] = bare(
            d, jpegs, stage="full", batch=args.batch_size, threads=threads, depth=depth, hw=hw, size=args.image_size)
    del keeper
    out["bare pipelines"] = rows
    print(f"import DALI {out['import DALI']:.3f} s | loader() returns {out['loader() returns']:.3f} s | "
          f"first next() {out['first next() (build + first batch)']:.3f} s")
    print(f"{'bare pipeline (built in this process)':<44} define   build  1st run  next run  total")
    for name, r in rows.items():
        print(f"{name:<44} {r['define']:6.3f} {r['build']:7.3f} {r['first run']:8.3f} {r['next run']:9.3f} "
              f"{r['total']:6.3f}")
    return out


BENCHMARK = Benchmark(name="dali_phases", doc=__doc__, run=run, options=options, needs=("dali", "cuda"))

if __name__ == "__main__":
    from benchmarks.run import main

    sys.exit(main([BENCHMARK.name, *sys.argv[1:]]))
