"""What the 1.7 s of a first DALI ``Pipeline.build()`` in a process is spent on (issue 20, item 2).

``benchmarks/dali_phases.py`` showed that ``build()`` of any pipeline with the mixed image
decoder costs ~1.7 s whenever no other such pipeline is alive, and ~0.19 s beside one: what
DALI shares between live decoders is the set-up. This script builds the same one-decoder
pipeline in a fresh process per variant of the environment, to tell which part that is:

- ``default``: as installed;
- ``jpeg-extensions``: nvImageCodec told (``NVIMGCODEC_EXTENSIONS_PATH``) to load only its
  nvJPEG and libjpeg-turbo extensions (not JPEG 2000, TIFF, BMP, PNM, OpenCV);
- ``no-extensions``: an empty extensions folder (does the decoder still build?);
- ``eager-modules``: ``CUDA_MODULE_LOADING=EAGER`` (every CUDA kernel loaded at start-up);
- ``hw-off``: ``hw_decoder_load=0`` (no hardware decoder).

Each child initialises CUDA through torch first (as a training script does), imports DALI,
then times ``build()`` and the first run of a pipeline that decodes (mixed), crops and
resizes a batch of the sample photos; then a second pipeline built beside the first, and a
third after both are gone. Run on the GPU machine after ``source benchmarks/gpu_setup.sh``::

    python3 benchmarks/dali_build.py --images .dali-bench/imagenet-sample
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

if __name__ == "__main__":  # run as a script: the repo's root on the path, for benchmarks.lib
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.lib.measure import Stopwatch  # noqa: E402
from benchmarks.lib.suite import Axis, Benchmark, Context  # noqa: E402

VARIANTS = ("default", "jpeg-extensions", "no-extensions", "eager-modules", "hw-off")


def _child(images: Path | str, hw: float, threads: int, batch: int) -> None:
    """One variant's figures, in the fresh process :func:`run` starts: printed as ``CHILD {json}``."""
    import numpy as np
    import torch

    torch.zeros(1, device="cuda:0").sum().item()
    with Stopwatch() as took:
        from nvidia.dali import Pipeline, fn, types

    out: dict[str, Any] = {"import": took.wall}
    files = sorted(p for p in Path(images).rglob("*") if p.suffix.lower() in (".jpg", ".jpeg"))
    jpegs = [np.frombuffer(files[i % len(files)].read_bytes(), dtype=np.uint8) for i in range(batch)]

    def build() -> tuple[Any, float, float]:
        pipe = Pipeline(batch_size=batch, num_threads=threads, device_id=0, seed=1, prefetch_queue_depth=1)
        with pipe:
            enc = fn.external_source(name="enc", no_copy=True, dtype=types.UINT8)
            img = fn.decoders.image_random_crop(enc, device="mixed", output_type=types.RGB, hw_decoder_load=hw)
            pipe.set_outputs(fn.resize(img, resize_x=224, resize_y=224))
        with Stopwatch() as built:
            pipe.build()
        with Stopwatch() as ran:
            pipe.feed_input("enc", jpegs)
            pipe.run()[0].as_cpu()
        return pipe, built.wall, ran.wall

    first, out["build"], out["first run"] = build()
    second, out["build beside a live one"], _ = build()
    del first, second
    _, out["build after both dropped"], _ = build()
    print("CHILD " + json.dumps(out))


def options(ap: argparse.ArgumentParser) -> None:
    """The photos and the pipeline's setting."""
    ap.add_argument("--images", type=Path, required=True)
    ap.add_argument("--threads", type=int, default=12)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--hw", type=float, default=1.0)


def run(ctx: Context) -> dict[str, Any]:
    """Every variant of the grid in a fresh process; the table of their seconds."""
    args = ctx.args
    import nvidia.nvimgcodec as nvimgcodec

    ext_dir = Path(nvimgcodec.__file__).resolve().parent / "extensions"
    tmp = Path(tempfile.mkdtemp())
    (tmp / "jpeg").mkdir()
    (tmp / "none").mkdir()
    for so in ext_dir.iterdir():
        if so.name.startswith(("libnvjpeg_ext", "libjpeg_turbo_ext")):
            (tmp / "jpeg" / so.name).symlink_to(so)
    print(f"extensions in {ext_dir}: {sorted(p.name for p in ext_dir.iterdir())}")
    results: dict[str, Any] = {}
    for name in ctx.grid["variant"]:
        env, hw = dict(os.environ), args.hw
        if name == "jpeg-extensions":
            env["NVIMGCODEC_EXTENSIONS_PATH"] = str(tmp / "jpeg")
        elif name == "no-extensions":
            env["NVIMGCODEC_EXTENSIONS_PATH"] = str(tmp / "none")
        elif name == "eager-modules":
            env["CUDA_MODULE_LOADING"] = "EAGER"
        elif name == "hw-off":
            hw = 0.0
        # a bare interpreter: nothing but torch imported before DALI's import is timed
        code = (f"import json, sys; sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r}); "
                "from benchmarks.dali_build import _child; _child(*json.loads(sys.argv[1]))")
        cmd = [sys.executable, "-c", code, json.dumps([str(args.images), hw, args.threads, args.batch_size])]
        with Stopwatch() as took:
            got = subprocess.run(cmd, env=env, capture_output=True, text=True)
        lines = [ln for ln in got.stdout.splitlines() if ln.startswith("CHILD ")]
        if got.returncode or not lines:
            results[name] = {"error": got.stderr.strip().splitlines()[-3:]}
        else:
            results[name] = json.loads(lines[-1][6:])
            results[name]["process"] = took.wall
        print(name, json.dumps(results[name]))
    shutil.rmtree(tmp, ignore_errors=True)
    cols = ("import", "build", "first run", "build beside a live one", "build after both dropped", "process")
    print(f"{'variant':<18}" + "".join(f"{c:>26}" for c in cols))
    for name, r in results.items():
        print(f"{name:<18}" + ("".join(f"{r[c]:>26.3f}" for c in cols) if "error" not in r else f"  {r['error']}"))
    return results


BENCHMARK = Benchmark(
    name="dali_build", doc=__doc__, run=run, options=options, needs=("dali", "cuda"),
    grid=(Axis("variant", VARIANTS, flag="--variants", help="environments of the build"),),
)

if __name__ == "__main__":
    from benchmarks.run import main

    sys.exit(main([BENCHMARK.name, *sys.argv[1:]]))
