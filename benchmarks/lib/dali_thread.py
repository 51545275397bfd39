"""What each batch of ``decode="dali"`` costs the training thread, and where fastfeed's goes.

``benchmarks/dali_gpu.py --main-thread``: CPU-only DALI, 2,048 generated 24x24 JPEGs (so small
that DALI's decoding hardly costs anything and the per-batch Python stands out), batches of 256:
the training thread's CPU time per batch (``time.thread_time``), fastfeed against the
hand-written pipeline (alternating, three times each), then one more fastfeed run with the
pieces of its step timed (each wrapped in a timer: :func:`instrumented`).
"""

from __future__ import annotations

import functools
import gc
import shutil
import statistics
import time
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Iterator

from benchmarks.lib.dali import Config, Maker, fastfeed_dali, handwritten_dali

__all__ = ["main_thread", "tiny_dataset"]


def tiny_dataset(cfg: Config, samples: int = 2048) -> Path:
    """2,048 generated 24x24 JPEGs in 10 classes, packed 256 per shard: images so small
    that DALI's decoding hardly costs anything and the per-batch Python stands out."""
    import numpy as np

    import fastfeed
    from tools.synth import make_jpeg

    dst = cfg.work / f"tiny-{samples}"
    if not (dst / "index.json").is_file():
        src = cfg.work / f"tiny-{samples}-src"
        shutil.rmtree(src, ignore_errors=True)
        rng = np.random.default_rng(0)
        for i in range(samples):
            (src / f"c{i % 10}").mkdir(parents=True, exist_ok=True)
            (src / f"c{i % 10}" / f"img{i:05d}.jpg").write_bytes(make_jpeg(rng, (24, 24), texture=3.0))
        shutil.rmtree(dst, ignore_errors=True)
        fastfeed.pack(src, dst, samples_per_shard=256, shuffle=True, seed=0)
    return dst


#: The pieces of fastfeed's step timed by :func:`main_thread` (nested ones indented).
_PIECES = ("share_outputs", "_next_iteration", "  release_outputs", "  schedule_run", "  _feed_one",
           "    feeder()", "      feeder._views", "      feeder.pack", "    feed_input", "_to_batch",
           "  _tensor", "  _field_values", "  keys()", "stats.record")


def _timed(acc: dict[str, float], name: str, f: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(f)  # DALI inspects the signature of what it calls
    def timed(*a: Any, **k: Any) -> Any:
        t = time.thread_time()
        try:
            return f(*a, **k)
        finally:
            acc[name] += time.thread_time() - t
    return timed


@contextmanager
def instrumented(dl: Any, acc: dict[str, float]) -> Iterator[None]:
    """Time the pieces of ``dl``'s step into ``acc`` (the pipeline's methods once it exists)."""
    feeder, table = dl._feeder, dl._table
    for name, obj, attr in (("_next_iteration", dl, "_next_iteration"), ("  _feed_one", dl, "_feed_one"),
                            ("_to_batch", dl, "_to_batch"), ("  _tensor", dl, "_tensor"),
                            ("  _field_values", dl, "_field_values"), ("stats.record", dl.stats, "record"),
                            ("      feeder._views", feeder, "_views"), ("      feeder.pack", feeder, "pack")):
        if hasattr(obj, attr):  # (an older loader lacks some)
            setattr(obj, attr, _timed(acc, name, getattr(obj, attr)))
    saved = [(type(feeder), "__call__", "    feeder()"), (type(table), "keys", "  keys()")]
    originals = [getattr(cls, attr) for cls, attr, _ in saved]
    for cls, attr, name in saved:
        setattr(cls, attr, _timed(acc, name, getattr(cls, attr)))
    build = dl._feed_from

    def feed_from(epoch: int, step: int) -> None:
        build(epoch, step)
        pipe = dl._pipe
        if not getattr(pipe, "_ff_timed", False):
            pipe._ff_timed = True
            for name, attr in (("share_outputs", "share_outputs"), ("  release_outputs", "release_outputs"),
                               ("  schedule_run", "schedule_run"), ("    feed_input", "feed_input")):
                setattr(pipe, attr, _timed(acc, name, getattr(pipe, attr)))

    dl._feed_from = feed_from
    try:
        yield
    finally:
        for (cls, attr, _), f in zip(saved, originals):
            setattr(cls, attr, f)


def _thread_ms_per_batch(make: Maker, batches: int) -> float:
    owner, forever = make()
    try:
        it = forever()
        for _ in range(5):  # built, prefetched, steady
            next(it)
        t0 = time.thread_time()
        for _ in range(batches):
            next(it)
        return (time.thread_time() - t0) / batches * 1e3
    finally:
        getattr(owner, "close", lambda: None)()
        del owner
        gc.collect()


def main_thread(cfg: Config, batches: int = 150, repeats: int = 3) -> dict[str, Any]:
    """The training thread's CPU time per batch of 256 tiny images, CPU-only DALI:
    fastfeed vs the hand-written pipeline (alternating, ``repeats`` each), then where
    fastfeed's goes (one more run with its step's pieces timed)."""
    ds = tiny_dataset(cfg)
    small = replace(cfg, batch_size=256, image_size=16, device_id=None)
    knobs = {"num_threads": 1, "hw_decoder_load": 0.65, "prefetch_queue_depth": 2}
    makers = {"fastfeed": lambda: fastfeed_dali(ds, knobs, small),
              "hand-written": lambda: handwritten_dali(ds, knobs, small)}
    per: dict[str, list[float]] = {k: [] for k in makers}
    for r in range(repeats):
        for name in (list(makers) if r % 2 == 0 else list(makers)[::-1]):
            per[name].append(_thread_ms_per_batch(makers[name], batches))
    acc: dict[str, float] = defaultdict(float)
    dl, forever = fastfeed_dali(ds, knobs, small)
    with instrumented(dl, acc):
        it = forever()
        for _ in range(5):
            next(it)
        acc.clear()
        t0 = time.thread_time()
        for _ in range(batches):
            next(it)
        total = (time.thread_time() - t0) / batches * 1e3
    dl.close()
    print(f"\n== training thread CPU per batch of 256 ({ds.name}: 24x24 JPEGs, 16x16 out, CPU-only DALI "
          f"{knobs}; {batches} batches x {repeats}, median [all])")
    out: dict[str, Any] = {"dataset": str(ds), "batches": batches}
    for name, ms in per.items():
        med = statistics.median(ms)
        out[name] = {"ms_per_batch": ms, "median_us_per_img": med / 256 * 1e3}
        print(f"  {name:<13} {med:6.3f} ms/batch  {med / 256 * 1e3:5.2f} us/img  "
              f"[{', '.join(f'{m:.3f}' for m in ms)}]")
    print(f"  fastfeed's pieces (instrumented run: {total:.3f} ms/batch; nested pieces are indented):")
    for name in _PIECES:
        ms = acc.get(name, 0.0) / batches * 1e3
        print(f"    {name:<22} {ms:6.3f} ms/batch  {ms / 256 * 1e3:5.2f} us/img")
    out["pieces_ms_per_batch"] = {k.strip(): v / batches * 1e3 for k, v in acc.items()}
    return out

