"""GPU decoding: fastfeed ``decode="dali"`` against a hand-written DALI pipeline, the CPU path
and torchvision, on the same shards (issue: GPU decoding through NVIDIA DALI).

Data: ``shared/data/imagenet-sample`` (47 real photos, DALI's own decoder-CI images,
median ~1.1 MP) replicated to ~2,000 files, packed twice by ``fastfeed pack``: as
originals, and with ``--max-side 500`` (ImageNet-like sizes).

Per dataset, every loader does the same work: random-resized-crop decode -> 224x224 ->
random flip -> uint8 NCHW batches on the GPU (labels too):

- ``fastfeed dali``: ``fastfeed.loader(decode="dali")``;
- ``hand-written dali``: what a DALI user writes from DALI's docs on the same shards and
  index files (``fn.readers.webdataset`` with ``random_shuffle``, ``decoders.image_random_crop``
  mixed, ``resize``, ``crop_mirror_normalize``, ``DALIGenericIterator``);
- ``fastfeed cpu``: ``decode="cpu"`` with 16 worker processes (batch 64: 2,000 samples
  make too few batches of 256 to keep 16 workers busy), batches copied to the GPU;
- ``torchvision``: ``torchvision.io.decode_jpeg(list, device="cuda")`` on batches of
  encoded bytes held in memory (no reading cost at all, an upper bound for it), then
  ``RandomResizedCrop`` + flip per image on the GPU.

fastfeed and the hand-written pipeline always run at the same setting (DALI's
``num_threads``, ``hw_decoder_load``, ``prefetch_queue_depth``, and the batch size):

1. at DALI's defaults, measured A-B-B-A (drift favours neither);
2. a **paired search**: every candidate setting is measured for both, back to back (the
   order alternates): ``hw_decoder_load`` x ``num_threads`` at prefetch depth 3, then the
   other depths at the best of those, then the larger batch sizes at the best so far.
   The best setting is the one with the highest mean of the two rates, so the choice
   favours neither; it is stored as this dataset's tune result (what ``"auto"`` uses);
3. at that best setting, A-B-B-A again with full-length measurements;
4. at that setting again: fastfeed ``num_pipelines=1`` and ``2`` (the threads shared
   between the two), the hand-written pipeline, and two hand-written pipelines of half
   the threads read alternately, measured in rotation and then in the reverse order;
   each is given as a ratio against the best single hand-written pipeline (the faster
   of its two measurements at the best setting), and ``num_pipelines=2`` is stored with
   the tune result when it beats 1 by more than :data:`PIPES_MARGIN`;
5. on the resized shards (``--latency-on``), the time to the first batch for
   ``num_pipelines`` 1 and 2: cold (a fresh process), ``set_epoch`` / ``load_state_dict``
   on the same loader, a new loader resuming after ``close()``, an evaluation loader
   adopting a dropped one's pipelines (``benchmarks/dali_latency.py``; goal <= 1.0 s for
   the resume in a warm process).

The loaders and their measurement are :mod:`benchmarks.lib.dali`'s. Steady-state img/s come
from the one measuring core (:func:`fastfeed.timing.measure.measure`),
with every batch synchronised on the GPU, over epochs streamed back to back; each line
also gives the training thread's CPU time per image (what feeding and batch assembly
cost the thread that runs the training step).

Goals: fastfeed at the best setting >= 35,000 img/s on the resized shards with <= 16 CPU
cores, and >= 1.0x the hand-written pipeline at every setting (the A-B-B-A ratios at the
defaults and at the best setting; the search's single short pairs are listed too); the
first batch of a resumed loader in <= 1.0 s.

Run on the GPU machine (from the repo root; ``benchmarks/gpu_setup.sh`` installs DALI
from the wheel parts and finds the sample photos); about 6-7 minutes (each progress line
shows the seconds since the start; `--datasets resized` alone takes about 4)::

    source benchmarks/gpu_setup.sh && taskset -c 0-15 python3 benchmarks/dali_gpu.py

Without a GPU, check the logic end to end (DALI's CPU-only mode, tiny sizes)::

    .venv/bin/python benchmarks/dali_gpu.py --cpu-smoke

and measure what each batch costs the training thread, fastfeed against the hand-written
pipeline, with fastfeed's step broken down (CPU-only DALI, 24x24 images, batch 256)::

    .venv/bin/python benchmarks/dali_gpu.py --main-thread"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

if __name__ == "__main__":  # run as a script: the repo's root on the path, for benchmarks.lib
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.lib.dali import (  # noqa: E402
    CLOCK, DALI_DEFAULTS, MAIN_THREAD_US, SMOKE, Config, Setting, config_at, env_of, fastfeed_cpu, fastfeed_dali,
    handwritten_dali, handwritten_two, knobs_of, log, mean_rate, measure_one, prepare, result,
    setting_label, torchvision_gpu,
)
from benchmarks.lib.loaders import fastfeed_loader, option_value  # noqa: E402
from benchmarks.lib.measure import Measurement  # noqa: E402
from benchmarks.lib.report import Result  # noqa: E402
from benchmarks.lib.suite import Axis, Benchmark, Context  # noqa: E402

GOAL_RATE = 35_000
GOAL_RATIO = 1.0


def ab_pair(ds: Path, setting: Setting, cfg: Config, tag: str) -> tuple[Result, Result]:
    """fastfeed and the hand-written pipeline at one setting, measured A-B-B-A."""
    ff: list[Measurement] = []
    hw: list[Measurement] = []
    knobs, at = knobs_of(setting), config_at(cfg, setting)
    for first in (True, False):
        pair = [(ff, lambda: fastfeed_dali(ds, knobs, at)), (hw, lambda: handwritten_dali(ds, knobs, at))]
        for runs, make in (pair if first else pair[::-1]):
            runs.append(measure_one(make, at))
    return (result(f"fastfeed dali @{tag}", setting_label(setting), ff, knobs=setting),
            result(f"hand-written dali @{tag}", setting_label(setting), hw, knobs=setting))


#: fastfeed with num_pipelines=2 is stored as the tune result when it beats 1 by this much
PIPES_MARGIN = 0.03


def pipelines_compare(ds: Path, setting: Setting, cfg: Config) -> list[Result]:
    """fastfeed ``num_pipelines`` 1 and 2, the hand-written pipeline and two hand-written
    pipelines read alternately, at one setting (the threads shared between two pipelines),
    measured in rotation, then in the reverse order (drift favours none)."""
    knobs, at = knobs_of(setting), config_at(cfg, setting)
    makers = {
        "fastfeed dali num_pipelines=1": lambda: fastfeed_dali(ds, {**knobs, "num_pipelines": 1}, at),
        "fastfeed dali num_pipelines=2": lambda: fastfeed_dali(ds, {**knobs, "num_pipelines": 2}, at),
        "hand-written dali": lambda: handwritten_dali(ds, knobs, at),
        "hand-written dali x2 (half threads each)": lambda: handwritten_two(ds, knobs, at),
    }
    # two pipelines of the single best's threads each (benchmarks/dali_variants.py's two-pipes
    # variant ran 2 x 8): more threads in all, capped at the cores
    doubled = {**knobs, "num_threads": min(2 * int(knobs["num_threads"]), os.cpu_count() or 16)}
    if doubled["num_threads"] > knobs["num_threads"]:
        makers[f"fastfeed dali num_pipelines=2, num_threads={doubled['num_threads']}"] = (
            lambda: fastfeed_dali(ds, {**doubled, "num_pipelines": 2}, at))
        makers[f"hand-written dali x2, num_threads={doubled['num_threads']}"] = (
            lambda: handwritten_two(ds, doubled, at))
    runs: dict[str, list[Measurement]] = {k: [] for k in makers}
    for order in (list(makers), list(makers)[::-1]):
        for name in order:
            runs[name].append(measure_one(makers[name], at))
    threads = {name: doubled["num_threads"] if ", num_threads=" in name else knobs["num_threads"] for name in makers}
    return [result(f"{name} @best", setting_label(setting), runs[name], knobs={**setting, "num_threads": threads[name]})
            for name in makers]


def pipes_summary(pipes: list[Result], hw_best: Result) -> dict[str, Any]:
    """Ratios against the best single hand-written pipeline, and the knobs to store: two
    pipelines (sharing the threads, or with the threads doubled, whichever is faster) when
    they beat one by more than :data:`PIPES_MARGIN`, as ``fastfeed tune`` decides."""
    by = {r.name.removesuffix(" @best"): mean_rate(r) for r in pipes}
    single = max(by["hand-written dali"], mean_rate(hw_best))
    one = by["fastfeed dali num_pipelines=1"]
    twos = {name: rate for name, rate in by.items() if name.startswith("fastfeed dali num_pipelines=2")}
    best_two = max(twos, key=twos.__getitem__)
    wins = twos[best_two] > one * (1 + PIPES_MARGIN)
    threads = {r.name.removesuffix(" @best"): r.extra["knobs"]["num_threads"] for r in pipes}
    return {"best_single_handwritten": single,
            "ratios": {name: rate / max(single, 1e-9) for name, rate in by.items()},
            "two_vs_one": twos[best_two] / max(one, 1e-9), "best_two": best_two,
            "num_pipelines": 2 if wins else 1,
            "num_threads": threads[best_two] if wins and threads[best_two] != threads[
                "fastfeed dali num_pipelines=1"] else None}


@dataclass
class Trial:
    """One setting of the paired search: both pipelines, back to back."""

    setting: Setting
    ff: float
    hw: float
    ff_us: float
    hw_us: float

    @property
    def score(self) -> float:
        return (self.ff + self.hw) / 2

    def to_json(self) -> dict[str, Any]:
        return {"setting": self.setting, "fastfeed": self.ff, "handwritten": self.hw,
                "ratio": self.ff / max(self.hw, 1e-9), "fastfeed_main_us": self.ff_us,
                "handwritten_main_us": self.hw_us}


def paired_search(name: str, ds: Path, cfg: Config) -> list[Trial]:
    """Measure both pipelines at each candidate setting (see the module docstring)."""
    trials: list[Trial] = []

    def pair(setting: Setting) -> Trial:
        done = next((t for t in trials if t.setting == setting), None)
        if done is not None:
            return done
        knobs, at = knobs_of(setting), config_at(cfg, setting, cfg.trial_seconds)
        makers = [lambda: fastfeed_dali(ds, knobs, at), lambda: handwritten_dali(ds, knobs, at)]
        first_ff = len(trials) % 2 == 0  # alternate who goes first
        got = {}
        for which in ((0, 1) if first_ff else (1, 0)):
            m = measure_one(makers[which], at)
            got[which] = (m.samples_per_s, MAIN_THREAD_US.pop(id(m), float("nan")))
        t = Trial(setting, got[0][0], got[1][0], got[0][1], got[1][1])
        trials.append(t)
        log(f"  {name} search {setting_label(setting)}: fastfeed {t.ff:,.0f}, hand-written {t.hw:,.0f} img/s "
            f"({t.ff / max(t.hw, 1e-9):.3f}x)")
        return t

    loads, threads = cfg.grid(name)
    depth, batch = cfg.search_depths[0], cfg.search_batches[0]
    for load in loads:
        for n in threads:
            pair({"hw_decoder_load": load, "num_threads": n, "prefetch_queue_depth": depth, "batch_size": batch})
    best = max(trials, key=lambda t: t.score).setting
    for d in cfg.search_depths[1:]:
        pair({**best, "prefetch_queue_depth": d})
    best = max(trials, key=lambda t: t.score).setting
    for b in cfg.search_batches[1:]:
        pair({**best, "batch_size": b})
    return trials


def store_tune_result(ds: Path, setting: Setting, rate: float, cfg: Config, how: str) -> None:
    """Store ``setting`` as the dataset's tune result (what ``loader(decode="dali")``'s ``"auto"`` uses)
    and check that ``"auto"`` picks it up."""
    import datetime

    from fastfeed.dist import local_world_size
    from fastfeed.packed.index import DatasetIndex
    from fastfeed.knobs.record import TuneKey, TuneRecord, save_record

    index = DatasetIndex.load(ds)
    batch = setting["batch_size"]
    key = TuneKey.current(index.fingerprint, batch_size=batch, decode="dali", image_size=cfg.image_size,
                          local_world_size=local_world_size())
    knobs = knobs_of(setting)
    save_record(TuneRecord(key, 0, None, knobs, rate,
                           datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                           {"reason": how}), str(ds))
    auto = fastfeed_loader(ds, batch_size=batch, image_size=cfg.image_size, decode="dali", device_id=cfg.device_id)
    found = {k: option_value(auto.options, k) for k in knobs}
    if option_value(auto.options, "knobs_from") != "tuned" or found != knobs:
        log(f"WARNING: loader(decode='dali') 'auto' did not pick the stored setting up: {auto.options}")
    auto.close()


def tune_knobs(ds: Path, cfg: Config) -> tuple[dict[str, Any], str]:
    """``fastfeed tune --decode dali`` on ``ds`` (only with ``--fastfeed-tune SECONDS``):
    its choice joins the paired search as one more candidate."""
    import fastfeed

    extra = {} if cfg.gpu else {"device_id": None}
    res = fastfeed.tune(str(ds), batch_size=cfg.batch_size, decode="dali", image_size=cfg.image_size,
                        time_budget=cfg.tune_budget, loader_kwargs=extra)
    return dict(res.setting.knobs), f"fastfeed.tune: {res.reason}"


def feed_cost(ds: Path, cfg: Config, batches: int = 200) -> float:
    """Microseconds per sample that fastfeed's feeder (plan -> views of the mapped shards
    gathered into one DALI TensorList, meta rows) costs the training thread."""
    dl = fastfeed_loader(ds, batch_size=cfg.batch_size, image_size=cfg.image_size, decode="dali",
                         device_id=cfg.device_id, dali=DALI_DEFAULTS)
    feeder = dl._feeder  # called here without a pipeline
    feeder.restart(0, 0)
    feeder()
    feeder.pending.clear()
    n = 0
    t0 = time.thread_time()
    for _ in range(batches):
        n += len(feeder()[1])
        feeder.pending.clear()
    return (time.thread_time() - t0) / n * 1e6


def run_dataset(name: str, ds: Path, cfg: Config, skip: set[str],
                latency_on: frozenset[str] = frozenset({"resized"})) -> dict[str, Any]:
    results: list[Result] = []
    defaults: Setting = {**DALI_DEFAULTS, "batch_size": cfg.batch_size}
    if cfg.gpu:
        short = replace(cfg, seconds=1.0)  # warm CUDA, nvJPEG and the page cache first
        measure_one(lambda: fastfeed_dali(ds, DALI_DEFAULTS, short), short)
    ff_def, hw_def = ab_pair(ds, defaults, cfg, "defaults")
    results += [ff_def, hw_def]
    trials = paired_search(name, ds, cfg)
    tuned = ""
    if cfg.tune_budget > 0:
        knobs, why = tune_knobs(ds, cfg)
        log(f"{name}: fastfeed tune chose {knobs} ({why})")
        trials += paired_search_one(name, ds, cfg, {**knobs, "batch_size": cfg.batch_size}, trials)
        tuned = f"; fastfeed tune's choice {knobs} among them ({why})"
    how = f"paired search, {len(trials)} settings{tuned}"
    best = max(trials, key=lambda t: t.score)
    log(f"{name}: best setting {setting_label(best.setting)} ({how})")
    ff_best, hw_best = ab_pair(ds, best.setting, cfg, "best")
    results += [ff_best, hw_best]
    pipes: list[Result] = []
    summary: dict[str, Any] = {}
    stored = best.setting
    if "pipes" not in skip:
        pipes = pipelines_compare(ds, best.setting, cfg)
        summary = pipes_summary(pipes, hw_best)
        stored = {**best.setting, "num_pipelines": summary["num_pipelines"]}
        if summary["num_threads"]:
            stored["num_threads"] = summary["num_threads"]
        how += (f"; num_pipelines {summary['num_pipelines']} ({summary['two_vs_one']:.3f}x for the faster "
                f"two ({summary['best_two']}) over one)")
    store_tune_result(ds, stored, mean_rate(ff_best), cfg, how)
    latency: dict[str, Any] = {}
    if name in latency_on:
        from benchmarks.dali_latency import latency as first_batch_latency

        log(f"{name}: time to the first batch at {setting_label(best.setting)}")
        latency = first_batch_latency(ds, best.setting, image_size=cfg.image_size, device_id=cfg.device_id)
    for label, make, what in (
        ("fastfeed cpu", lambda: fastfeed_cpu(ds, cfg),
         f"decode='cpu', {cfg.cpu_workers} workers, batch {cfg.cpu_batch_size}"
         + (", copied to the GPU" if cfg.gpu else "")),
        ("torchvision decode_jpeg cuda", lambda: torchvision_gpu(ds, cfg),
         "bytes in memory, batched GPU decode + RandomResizedCrop/flip per image"),
    ):
        if label.split()[0] in skip or (label.startswith("torchvision") and not cfg.gpu):
            log(f"{label}: skipped")
            continue
        try:
            results.append(result(label, what, [measure_one(make, cfg)]))
        except Exception as e:  # noqa: BLE001 - a peer that cannot run is reported, the rest goes on
            log(f"{label}: failed: {type(e).__name__}: {e}")
    ratios = {
        "defaults": mean_rate(ff_def) / max(mean_rate(hw_def), 1e-9),
        "best": mean_rate(ff_best) / max(mean_rate(hw_best), 1e-9),
    }
    search_ratios = sorted(t.ff / max(t.hw, 1e-9) for t in trials)
    for r in results[4:]:
        ratios[f"best vs {r.name}"] = mean_rate(ff_best) / max(r.rate, 1e-9)
    return {"dataset": name, "path": str(ds), "best": stored, "how": how, "ratios": ratios,
            "pipes": pipes, "pipes_summary": summary, "latency": latency,
            "search": [t.to_json() for t in trials], "search_ratio_min": search_ratios[0],
            "search_ratio_median": search_ratios[len(search_ratios) // 2],
            "results": results, "best_rate": mean_rate(ff_best), "feed_us_per_sample": feed_cost(ds, cfg)}


def paired_search_one(name: str, ds: Path, cfg: Config, setting: Setting, trials: list[Trial]) -> list[Trial]:
    """One more candidate for the paired search (skipped when already measured)."""
    if any(t.setting == setting for t in trials):
        return []
    one = replace(cfg, search_loads=(setting["hw_decoder_load"],), search_threads=(setting["num_threads"],),
                  originals_loads=(setting["hw_decoder_load"],), originals_threads=(setting["num_threads"],),
                  search_depths=(setting["prefetch_queue_depth"],), search_batches=(setting["batch_size"],))
    return paired_search(name, ds, one)


def report(runs: list[dict[str, Any]], cfg: Config, env: dict[str, Any]) -> dict[str, Any]:
    """Print every dataset's figures against the goals; the JSON-ready dict of them."""
    print(f"\n== decode='dali' vs hand-written DALI / CPU / torchvision: {cfg.samples} samples, "
          f"batch {cfg.batch_size} unless the setting says, {cfg.image_size}x{cfg.image_size}, "
          f"{'GPU ' + str(env.get('gpu')) if cfg.gpu else 'CPU-only DALI (smoke)'}")
    out: dict[str, Any] = {"env": env, "config": {k: str(v) for k, v in vars(cfg).items()}, "datasets": []}
    for run in runs:
        print(f"\n-- {run['dataset']} ({run['path']})")
        for r in run["results"]:
            spread = ", ".join(f"{m.samples_per_s:,.0f}" for m in r.runs)
            cpu = [MAIN_THREAD_US.get(id(m)) for m in r.runs]
            us = sum(c for c in cpu if c is not None) / max(1, sum(c is not None for c in cpu))
            r.extra["main_thread_us_per_sample"] = us
            print(f"  {r.name:<34} {mean_rate(r):>10,.0f} img/s   [{spread}]  main thread {us:5.1f} us/img"
                  f"  {r.what}")
        print(f"  paired search ({run['how']}): fastfeed | hand-written img/s, ratio, main thread us/img")
        for t in run["search"]:
            print(f"    {setting_label(t['setting']):<78} {t['fastfeed']:>8,.0f} | {t['handwritten']:>8,.0f}  "
                  f"{t['ratio']:.3f}x  {t['fastfeed_main_us']:5.1f} | {t['handwritten_main_us']:5.1f}")
        ratios = run["ratios"]
        for key in ("defaults", "best"):
            ok = "met" if ratios[key] >= GOAL_RATIO else "MISSED"
            print(f"  fastfeed / hand-written @{key} (A-B-B-A): {ratios[key]:.3f}x [goal >= {GOAL_RATIO:g}: {ok}]")
        print(f"  fastfeed / hand-written over the search's single short pairs: min {run['search_ratio_min']:.3f}x, "
              f"median {run['search_ratio_median']:.3f}x")
        for key, v in ratios.items():
            if key.startswith("best vs"):
                print(f"  fastfeed (best setting) / {key[8:]}: {v:.1f}x")
        if run["dataset"] == "resized" and cfg.gpu:
            ok = "met" if run["best_rate"] >= GOAL_RATE else "MISSED"
            print(f"  fastfeed (best setting): {run['best_rate']:,.0f} img/s [goal >= {GOAL_RATE:,}: {ok}]")
        if run["pipes"]:
            _report_pipes(run["pipes"], run["pipes_summary"])
        if run["latency"]:
            from benchmarks.dali_latency import report as latency_report

            latency_report(run["latency"])
        us = run["feed_us_per_sample"]
        print(f"  fastfeed's feeder alone: {us:.2f} us/sample on the training thread "
              f"({us * run['best_rate'] / 1e6:.1%} of one core at the best rate)")
        print(f"  best setting: {setting_label(run['best'])}")
        out["datasets"].append({**{k: v for k, v in run.items() if k not in ("results", "pipes")},
                                "results": [r.to_json() for r in run["results"]],
                                "pipes": [r.to_json() for r in run["pipes"]]})
    print(f"wall time {CLOCK.elapsed():.0f} s")
    return out


def _report_pipes(pipes: list[Result], summary: dict[str, Any]) -> None:
    print(f"  one or two pipelines at the best setting (rotation, then reversed); vs the best single "
          f"hand-written pipeline ({summary['best_single_handwritten']:,.0f} img/s):")
    for r in pipes:
        name = r.name.removesuffix(" @best")
        spread = ", ".join(f"{m.samples_per_s:,.0f}" for m in r.runs)
        print(f"    {name:<42} {mean_rate(r):>10,.0f} img/s  {summary['ratios'][name]:.3f}x   [{spread}]")
    threads = f", num_threads={summary['num_threads']}" if summary.get("num_threads") else ""
    print(f"  fastfeed two pipelines / one: {summary['two_vs_one']:.3f}x ({summary['best_two']}); stored as the "
          f"tune result: num_pipelines={summary['num_pipelines']}{threads} (2 when it wins by > {PIPES_MARGIN:.0%})")


# ---------------------------------------------------------------------- the run
def options(ap: argparse.ArgumentParser) -> None:
    """The sizes, times and search values of the run (the defaults: :class:`Config`)."""
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny, DALI on the CPU: checks the logic here")
    ap.add_argument("--main-thread", action="store_true",
                    help="CPU-only DALI, tiny images: the training thread's CPU per batch, fastfeed vs "
                         "hand-written, and where fastfeed's goes")
    ap.add_argument("--images", type=Path, default=None,
                    help="the sample photos (default: shared/data/imagenet-sample, else .dali-bench/imagenet-sample)")
    ap.add_argument("--samples", type=int, default=None)
    ap.add_argument("--seconds", type=float, default=None, help="per A-B-B-A measurement")
    ap.add_argument("--trial-seconds", type=float, default=None, help="per measurement of the paired search")
    ap.add_argument("--loads", default=None, help="hw_decoder_load values searched, e.g. 1.0,0.9,0.75")
    ap.add_argument("--threads", default=None, help="num_threads values searched, e.g. 4,8,12,16")
    ap.add_argument("--depths", default=None, help="prefetch depths, the first one used while searching the rest")
    ap.add_argument("--batches", default=None, help="batch sizes, the first the default (e.g. 256,512)")
    ap.add_argument("--fastfeed-tune", type=float, default=None, metavar="SECONDS",
                    help="also run `fastfeed tune --decode dali` this long per dataset; its choice joins the search")
    ap.add_argument("--skip", default="",
                    help="comma list of parts to skip: fastfeed (cpu), torchvision, pipes (num_pipelines 1 vs 2)")
    ap.add_argument("--latency-on", default="resized",
                    help="datasets on which to time the first batch (benchmarks/dali_latency.py); '' for none")


def config(args: argparse.Namespace) -> Config:
    """The :class:`Config` of the command line."""
    cfg = SMOKE if args.cpu_smoke or args.main_thread else Config()
    cfg = replace(cfg, images=args.images) if args.images is not None else cfg.found_images()
    floats = lambda text: tuple(float(v) for v in text.split(","))  # noqa: E731
    ints = lambda text: tuple(int(v) for v in text.split(","))  # noqa: E731
    for value, change in ((args.samples, {"samples": args.samples}), (args.seconds, {"seconds": args.seconds}),
                          (args.trial_seconds, {"trial_seconds": args.trial_seconds}),
                          (args.fastfeed_tune, {"tune_budget": args.fastfeed_tune})):
        if value:
            cfg = replace(cfg, **change)
    if args.loads:
        cfg = replace(cfg, search_loads=floats(args.loads))
    if args.threads:
        cfg = replace(cfg, search_threads=ints(args.threads))
    if args.depths:
        cfg = replace(cfg, search_depths=ints(args.depths))
    if args.batches:
        cfg = replace(cfg, search_batches=ints(args.batches), batch_size=ints(args.batches)[0])
    return cfg


def run(ctx: Context) -> dict[str, Any]:
    """Every dataset of the grid (or the training-thread figures with ``--main-thread``)."""
    args = ctx.args
    cfg = config(args)
    if cfg.gpu:
        import torch

        if not torch.cuda.is_available():
            print("SKIPPED dali_gpu: no CUDA GPU here; `--cpu-smoke` checks the logic without one")
            return {}
    os.environ.setdefault("FASTFEED_TUNE_DIR", str(cfg.work / "tune"))
    if args.main_thread:
        from benchmarks.lib.dali_thread import main_thread

        return main_thread(cfg)
    env = env_of(cfg, ctx.env)
    data = prepare(cfg)
    skip = set(filter(None, args.skip.split(",")))
    latency_on = frozenset(filter(None, args.latency_on.split(",")))
    runs = [run_dataset(name, data[name], cfg, skip, latency_on) for name in ctx.grid["dataset"]]
    return report(runs, cfg, env)


BENCHMARK = Benchmark(
    name="dali_gpu", doc=__doc__, run=run, options=options, needs=("dali",),
    grid=(Axis("dataset", ("resized", "originals"), flag="--datasets", help="which packed copies to run"),),
    quick={"cpu_smoke": True},
)

if __name__ == "__main__":
    from benchmarks.run import main

    sys.exit(main([BENCHMARK.name, *sys.argv[1:]]))
