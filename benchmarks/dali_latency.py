"""Time to the first batch of ``fastfeed.loader(decode="dali")`` (issue 20, item 3).

Each case is timed from the call that starts it (``fastfeed.loader(...)``,
``set_epoch``, ``load_state_dict``) to the first batch, synchronised on the GPU:

- ``cold``: the first loader of a fresh process, CUDA already initialised (a training
  script's model is on the GPU by then); DALI's import is timed apart. Run in a child
  process, once per ``num_pipelines``;
- ``set_epoch`` / ``load_state_dict`` on the same loader: the pipelines are kept, nothing
  is built (the batches in flight are run out and dropped);
- ``new loader + load_state_dict after close()``: a resume in the same process, a build
  on a warm host;
- ``eval loader, built`` / ``eval loader, adopted``: ``augment=False`` loaders, the second
  created after the first was dropped without ``close()`` (it adopts its pipelines,
  :mod:`fastfeed.loading.dali.reuse`).

Goal: <= 1.0 s for a second loader / resume on a warm host. ``benchmarks/dali_gpu.py``
runs this on the resized shards; alone (after ``source benchmarks/gpu_setup.sh``)::

    python3 benchmarks/dali_latency.py bench-data/dali/<dataset> --num-pipelines 1,2
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

if __name__ == "__main__":  # run as a script: the repo's root on the path, for benchmarks.lib
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.lib.dali import sync  # noqa: E402
from benchmarks.lib.loaders import fastfeed_loader  # noqa: E402
from benchmarks.lib.measure import Stopwatch  # noqa: E402
from benchmarks.lib.suite import Axis, Benchmark, Context  # noqa: E402

GOAL_S = 1.0
#: the case the goal is about
WARM_CASE = "new loader + load_state_dict after close()"
COLD_CASE, COLD_IMPORT = "cold: first loader of a fresh process", "cold: importing DALI (before it)"


def _timed(start: Callable[[], Any], done: Callable[[Any], None]) -> tuple[float, Any]:
    """Seconds from ``start()`` (which returns an iterable loader) to its first batch (``done`` with it)."""
    with Stopwatch() as took:
        dl = start()
        done(next(iter(dl)))
    return took.wall, dl


def in_process(ds: Path, knobs: dict[str, Any], *, batch_size: int, image_size: int,
               device_id: int | None) -> dict[str, Any]:
    """The warm cases (see the module docstring) for one setting, in this process."""
    args = dict(batch_size=batch_size, image_size=image_size, decode="dali", device_id=device_id, dali=knobs)
    done = sync(device_id)
    out: dict[str, Any] = {}
    out["first loader of this setting here"], dl = _timed(lambda: fastfeed_loader(ds, **args), done)
    it = iter(dl)
    for _ in range(min(3, len(dl) - 1)):
        next(it)
    state = dl.state_dict()
    out["set_epoch (same loader)"], _ = _timed(lambda: (dl.set_epoch(dl.epoch + 1), dl)[1], done)
    out["load_state_dict (same loader)"], _ = _timed(lambda: (dl.load_state_dict(state), dl)[1], done)
    builds = {"same loader": dl._builds}
    dl.close()

    def resumed() -> Any:
        new = fastfeed_loader(ds, **args)
        new.load_state_dict(state)
        return new

    out[WARM_CASE], dl = _timed(resumed, done)
    builds["resumed"] = dl._builds
    dl.close()
    out["eval loader, built"], ev = _timed(lambda: fastfeed_loader(ds, **args, augment=False), done)
    del ev
    gc.collect()  # dropped unclosed: its pipelines are parked
    out["eval loader, adopted"], ev = _timed(lambda: fastfeed_loader(ds, **args, augment=False), done)
    builds["eval adopted"], builds["eval adopted: adoptions"] = ev._builds, ev._adopted
    ev.close()
    out["builds"] = builds
    return out


def cold(ds: Path, knobs: dict[str, Any], *, batch_size: int, image_size: int, device_id: int | None,
         timeout: float = 180) -> dict[str, float]:
    """The cold case in a child process: {COLD_IMPORT: s, COLD_CASE: s} (empty on failure)."""
    # a bare interpreter that imports this module and calls _child: nothing else is imported before
    # the cold case (not the runner's checks, which import DALI, nor its environment record)
    code = (f"import json, sys; sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r}); "
            "from benchmarks.dali_latency import _child; _child(*json.loads(sys.argv[1]))")
    cmd = [sys.executable, "-c", code, json.dumps([str(ds), knobs, batch_size, image_size, device_id])]
    try:
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=os.environ.copy())
    except subprocess.TimeoutExpired:
        return {}
    lines = [ln for ln in run.stdout.splitlines() if ln.startswith("{")]
    if run.returncode != 0 or not lines:
        print(f"  cold child failed (rc {run.returncode}): {run.stderr[-800:]}", file=sys.stderr)
        return {}
    return json.loads(lines[-1])


def _child(ds: Path | str, knobs: dict[str, Any], batch_size: int, image_size: int, device_id: int | None) -> None:
    """The cold case, in the fresh process :func:`cold` starts: prints its two figures as JSON."""
    import torch

    if device_id is not None:  # as a training script has it by the time it makes its loader
        torch.zeros(1, device=f"cuda:{device_id}").sum().item()
    from fastfeed.loading.dali.backend import import_dali

    with Stopwatch() as imported:
        import_dali()
    args = dict(batch_size=batch_size, image_size=image_size, decode="dali", device_id=device_id, dali=knobs)
    took, dl = _timed(lambda: fastfeed_loader(ds, **args), sync(device_id))
    print(json.dumps({COLD_IMPORT: imported.wall, COLD_CASE: took}))
    dl.close()


def latency(ds: Path, setting: dict[str, Any], *, image_size: int, device_id: int | None,
            num_pipelines: tuple[int, ...] = (1, 2)) -> dict[str, Any]:
    """Every case for each ``num_pipelines`` at ``setting`` (DALI knobs and ``batch_size``)."""
    from fastfeed.loading.dali.backend import import_dali

    import_dali()  # timed apart, in the cold case
    knobs = {k: v for k, v in setting.items() if k not in ("batch_size", "num_pipelines")}
    batch = setting["batch_size"]
    out: dict[str, Any] = {"setting": {k: v for k, v in setting.items() if k != "num_pipelines"}, "goal_s": GOAL_S}
    for n in num_pipelines:
        k = {**knobs, "num_pipelines": n}
        out[str(n)] = {**cold(ds, k, batch_size=batch, image_size=image_size, device_id=device_id),
                       **in_process(ds, k, batch_size=batch, image_size=image_size, device_id=device_id)}
    return out


def report(lat: dict[str, Any]) -> None:
    """Print :func:`latency`'s result as a table (seconds), with the goal."""
    ns = [k for k in lat if k.isdigit()]
    print(f"  time to the first batch (s) at {lat['setting']}, num_pipelines {' | '.join(ns)}:")
    cases = [c for c in lat[ns[0]] if c != "builds"]
    for c in cases:
        cells = " | ".join(f"{lat[n].get(c, float('nan')):6.3f}" for n in ns)
        print(f"    {c:<46} {cells}")
    for n in ns:
        warm = lat[n].get(WARM_CASE, float("nan"))
        ok = "met" if warm <= lat["goal_s"] else "MISSED"
        print(f"    num_pipelines={n}: {WARM_CASE} {warm:.3f} s [goal <= {lat['goal_s']:g} s: {ok}]; "
              f"builds {lat[n].get('builds')}")


def options(ap: argparse.ArgumentParser) -> None:
    """The dataset, the setting and the device."""
    ap.add_argument("dataset", type=Path)
    ap.add_argument("--knobs", default='{"num_threads": 8, "hw_decoder_load": 0.65, "prefetch_queue_depth": 2}')
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--device-id", default="0", help="a CUDA device, or 'none' (DALI on the CPU)")


def run(ctx: Context) -> dict[str, Any]:
    """Every case at every ``num_pipelines`` of the grid."""
    args = ctx.args
    device = None if args.device_id == "none" else int(args.device_id)
    knobs = json.loads(args.knobs)
    lat = latency(args.dataset, {**knobs, "batch_size": args.batch_size}, image_size=args.image_size,
                  device_id=device, num_pipelines=tuple(ctx.grid["num_pipelines"]))
    report(lat)
    return lat


BENCHMARK = Benchmark(
    name="dali_latency", doc=__doc__, run=run, options=options, needs=("dali",),
    grid=(Axis("num_pipelines", (1, 2), flag="--num-pipelines", parse=int, help="pipelines behind the loader"),),
)

if __name__ == "__main__":
    from benchmarks.run import main

    sys.exit(main([BENCHMARK.name, *sys.argv[1:]]))
