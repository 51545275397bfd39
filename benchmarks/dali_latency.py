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
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

GOAL_S = 1.0
#: the case the goal is about
WARM_CASE = "new loader + load_state_dict after close()"
COLD_CASE, COLD_IMPORT = "cold: first loader of a fresh process", "cold: importing DALI (before it)"


def _sync(device_id: int | None) -> Callable[[dict[str, Any]], None]:
    if device_id is None:
        return lambda batch: None
    import torch

    stream = torch.cuda.current_stream(device_id)
    return lambda batch: stream.synchronize()


def _timed(start: Callable[[], Any], sync: Callable[[dict[str, Any]], None]) -> tuple[float, Any]:
    """Seconds from ``start()`` (which returns an iterable loader) to its first batch."""
    t0 = time.perf_counter()
    dl = start()
    sync(next(iter(dl)))
    return time.perf_counter() - t0, dl


def in_process(ds: Path, knobs: dict[str, Any], *, batch_size: int, image_size: int,
               device_id: int | None) -> dict[str, Any]:
    """The warm cases (see the module docstring) for one setting, in this process."""
    import fastfeed

    args = dict(batch_size=batch_size, image_size=image_size, decode="dali", device_id=device_id, **knobs)
    sync = _sync(device_id)
    out: dict[str, Any] = {}
    out["first loader of this setting here"], dl = _timed(lambda: fastfeed.loader(str(ds), **args), sync)
    it = iter(dl)
    for _ in range(min(3, len(dl) - 1)):
        next(it)
    state = dl.state_dict()
    out["set_epoch (same loader)"], _ = _timed(lambda: (dl.set_epoch(dl.epoch + 1), dl)[1], sync)
    out["load_state_dict (same loader)"], _ = _timed(lambda: (dl.load_state_dict(state), dl)[1], sync)
    builds = {"same loader": dl._builds}
    dl.close()

    def resumed() -> Any:
        new = fastfeed.loader(str(ds), **args)
        new.load_state_dict(state)
        return new

    out[WARM_CASE], dl = _timed(resumed, sync)
    builds["resumed"] = dl._builds
    dl.close()
    out["eval loader, built"], ev = _timed(lambda: fastfeed.loader(str(ds), **args, augment=False), sync)
    del ev
    gc.collect()  # dropped unclosed: its pipelines are parked
    out["eval loader, adopted"], ev = _timed(lambda: fastfeed.loader(str(ds), **args, augment=False), sync)
    builds["eval adopted"], builds["eval adopted: adoptions"] = ev._builds, ev._adopted
    ev.close()
    out["builds"] = builds
    return out


def cold(ds: Path, knobs: dict[str, Any], *, batch_size: int, image_size: int, device_id: int | None,
         timeout: float = 180) -> dict[str, float]:
    """The cold case in a child process: {COLD_IMPORT: s, COLD_CASE: s} (empty on failure)."""
    cmd = [sys.executable, str(Path(__file__).resolve()), str(ds), "--child", "--knobs", json.dumps(knobs),
           "--batch-size", str(batch_size), "--image-size", str(image_size),
           "--device-id", "none" if device_id is None else str(device_id)]
    try:
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=os.environ.copy())
    except subprocess.TimeoutExpired:
        return {}
    lines = [ln for ln in run.stdout.splitlines() if ln.startswith("{")]
    if run.returncode != 0 or not lines:
        print(f"  cold child failed (rc {run.returncode}): {run.stderr[-800:]}", file=sys.stderr)
        return {}
    return json.loads(lines[-1])


def _child(ds: Path, knobs: dict[str, Any], batch_size: int, image_size: int, device_id: int | None) -> None:
    import torch

    if device_id is not None:  # as a training script has it by the time it makes its loader
        torch.zeros(1, device=f"cuda:{device_id}").sum().item()
    import fastfeed
    from fastfeed.loading.dali.backend import import_dali

    t0 = time.perf_counter()
    import_dali()
    t1 = time.perf_counter()
    args = dict(batch_size=batch_size, image_size=image_size, decode="dali", device_id=device_id, **knobs)
    took, dl = _timed(lambda: fastfeed.loader(str(ds), **args), _sync(device_id))
    print(json.dumps({COLD_IMPORT: t1 - t0, COLD_CASE: took}))
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dataset", type=Path)
    ap.add_argument("--knobs", default='{"num_threads": 8, "hw_decoder_load": 0.65, "prefetch_queue_depth": 2}')
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--device-id", default="0", help="a CUDA device, or 'none' (DALI on the CPU)")
    ap.add_argument("--num-pipelines", default="1,2")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    device = None if args.device_id == "none" else int(args.device_id)
    knobs = json.loads(args.knobs)
    if args.child:
        _child(args.dataset, knobs, args.batch_size, args.image_size, device)
        return 0
    lat = latency(args.dataset, {**knobs, "batch_size": args.batch_size}, image_size=args.image_size,
                  device_id=device, num_pipelines=tuple(int(n) for n in args.num_pipelines.split(",")))
    report(lat)
    print("RESULT " + json.dumps(lat, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
