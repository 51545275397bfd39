"""GPU decoding: fastfeed ``decode="dali"`` against a hand-written DALI pipeline, the CPU path
and torchvision, on the same shards (issue: GPU decoding through NVIDIA DALI).

Data: ``shared/data/imagenet-sample`` (47 real photos, DALI's own decoder-CI images,
median ~1.1 MP) replicated to ~2,000 files, packed twice by ``fastfeed pack``: as
originals, and with ``--max-side 500`` (ImageNet-like sizes).

Per dataset, every loader does the same work: random-resized-crop decode -> 224x224 ->
random flip -> uint8 NCHW batches of 256 on the GPU (labels too):

- ``fastfeed dali``: ``fastfeed.loader(decode="dali")`` (here :func:`fastfeed.decode.dali.dali_loader`),
  at DALI's defaults and at the setting ``fastfeed tune --decode dali`` chose;
- ``hand-written dali``: what a DALI user writes from DALI's docs on the same shards and
  index files (``fn.readers.webdataset`` with ``random_shuffle``, ``decoders.image_random_crop``
  mixed, ``resize``, ``crop_mirror_normalize``, ``DALIGenericIterator``), at the same two
  settings. fastfeed and the hand-written pipeline are measured back to back, A-B-B-A,
  and averaged, so drift does not favour either;
- ``fastfeed cpu``: ``decode="cpu"`` with 16 worker processes (batch 64: 2,000 samples
  make too few batches of 256 to keep 16 workers busy), batches copied to the GPU;
- ``torchvision``: ``torchvision.io.decode_jpeg(list, device="cuda")`` on batches of
  encoded bytes held in memory (no reading cost at all, an upper bound for it), then
  ``RandomResizedCrop`` + flip per image on the GPU.

Steady-state img/s come from the one measuring core (:func:`fastfeed.measure.measure`),
with every batch synchronised on the GPU, over epochs streamed back to back.

Goals: fastfeed (tuned) >= 35,000 img/s on the resized shards with <= 16 CPU cores, and
>= 1.0x the hand-written pipeline at every setting.

Run on the GPU machine (from the repo root; ``benchmarks/gpu_setup.sh`` installs DALI
from the wheel parts and finds the sample photos)::

    source benchmarks/gpu_setup.sh && python3 benchmarks/dali_gpu.py

Without a GPU, check the logic end to end (DALI's CPU-only mode, tiny sizes)::

    .venv/bin/python benchmarks/dali_gpu.py --cpu-smoke
"""

from __future__ import annotations

import argparse
import gc
import inspect
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterator

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import REPO, SHARED_SAMPLE, Result, environment, log, replicated_sample  # noqa: E402
from fastfeed.measure import Measurement, measure  # noqa: E402

DALI_DEFAULTS = {"num_threads": 4, "hw_decoder_load": 0.65, "prefetch_queue_depth": 2}
"""DALI's own defaults (hw_decoder_load, prefetch_queue_depth) and the thread count of
DALI's ResNet-50 example: DALI's Pipeline has no default for num_threads."""
GOAL_RATE = 35_000
GOAL_RATIO = 1.0


@dataclass(frozen=True)
class Config:
    samples: int = 2_000
    batch_size: int = 256
    image_size: int = 224
    seconds: float = 5.0  # per measurement
    tune_budget: float = 60.0  # per dataset
    cpu_workers: int = 16
    cpu_batch_size: int = 64
    device_id: int | None = 0
    max_side: int = 500
    originals_max_side: int | None = None
    images: Path = SHARED_SAMPLE
    work: Path = REPO / "bench-data" / "dali"

    @property
    def gpu(self) -> bool:
        return self.device_id is not None


SMOKE = Config(samples=96, batch_size=16, image_size=64, seconds=1.5, tune_budget=8.0, cpu_workers=2,
               cpu_batch_size=16, device_id=None, max_side=96, originals_max_side=192)


# ---------------------------------------------------------------------- data
def prepare(cfg: Config) -> dict[str, Path]:
    """The replicated photos packed as originals and resized: {"originals": dir, "resized": dir}."""
    import fastfeed

    folder = replicated_sample(cfg.samples, src=cfg.images)
    out = {}
    for name, side in (("originals", cfg.originals_max_side), ("resized", cfg.max_side)):
        dst = cfg.work / f"{folder.name}-{name}-{side or 'full'}"
        if not (dst / "index.json").is_file():
            shutil.rmtree(dst, ignore_errors=True)
            t0 = time.perf_counter()
            fastfeed.pack(folder, dst, samples_per_shard=256, workers=os.cpu_count() or 1,
                          max_side=side, shuffle=True, seed=0)
            log(f"packed {folder.name} -> {dst.name} in {time.perf_counter() - t0:.1f} s")
        out[name] = dst
    return out


# ---------------------------------------------------------------------- loaders
def _sync(cfg: Config) -> Callable[[Any], None]:
    if not cfg.gpu:
        return lambda batch: None
    import torch

    stream = torch.cuda.current_stream(cfg.device_id)
    return lambda batch: stream.synchronize()


def fastfeed_dali(ds: Path, knobs: dict[str, Any], cfg: Config) -> tuple[Any, Callable[[], Iterator[Any]]]:
    from fastfeed.decode.dali import dali_loader

    dl = dali_loader(str(ds), batch_size=cfg.batch_size, image_size=cfg.image_size,
                     device_id=cfg.device_id, **knobs)

    def forever() -> Iterator[Any]:
        epoch = 0
        while True:
            dl.set_epoch(epoch)
            yield from dl
            epoch += 1

    return dl, forever


def handwritten_dali(ds: Path, knobs: dict[str, Any], cfg: Config) -> tuple[Any, Callable[[], Iterator[Any]]]:
    """A DALI pipeline as DALI's documentation writes it, on fastfeed's shards and index files."""
    from nvidia.dali import fn, pipeline_def, types
    from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

    index = json.loads((ds / "index.json").read_text())
    paths = [str(ds / s["name"]) for s in index["shards"]]
    index_paths = [str(ds / s["dali_index"]) for s in index["shards"]]
    decoder: dict[str, Any] = {"device": "mixed" if cfg.gpu else "cpu"}
    if cfg.gpu:
        decoder["hw_decoder_load"] = knobs["hw_decoder_load"]

    @pipeline_def(batch_size=cfg.batch_size, num_threads=knobs["num_threads"], device_id=cfg.device_id,
                  prefetch_queue_depth=knobs["prefetch_queue_depth"], seed=0)
    def pipeline() -> Any:
        jpegs, cls = fn.readers.webdataset(paths=paths, index_paths=index_paths, ext=["jpg", "cls"],
                                           random_shuffle=True, name="Reader")
        images = fn.decoders.image_random_crop(jpegs, output_type=types.RGB, **decoder)
        images = fn.resize(images, resize_x=cfg.image_size, resize_y=cfg.image_size)
        images = fn.crop_mirror_normalize(images, dtype=types.UINT8, output_layout="CHW",
                                          mirror=fn.random.coin_flip(probability=0.5))
        labels = fn.pad(cls, fill_value=0, shape=[8])  # the class id's ASCII digits, fixed length
        return images, (labels.gpu() if cfg.gpu else labels)

    pipe = pipeline()
    pipe.build()
    it = DALIGenericIterator([pipe], ["image", "label"], reader_name="Reader",
                             last_batch_policy=LastBatchPolicy.PARTIAL, auto_reset=True)

    def forever() -> Iterator[Any]:
        while True:
            for batch in it:
                yield batch[0]

    return it, forever


def fastfeed_cpu(ds: Path, cfg: Config) -> tuple[Any, Callable[[], Iterator[Any]]]:
    import fastfeed

    dl = fastfeed.loader(str(ds), batch_size=cfg.cpu_batch_size, image_size=cfg.image_size, decode="cpu",
                         num_workers=cfg.cpu_workers, prefetch_factor=2, pin_memory=cfg.gpu)

    def forever() -> Iterator[Any]:
        epoch = 0
        while True:
            dl.set_epoch(epoch)
            for batch in dl:
                if cfg.gpu:
                    batch["image"] = batch["image"].cuda(cfg.device_id, non_blocking=True)
                    batch["label"] = batch["label"].cuda(cfg.device_id, non_blocking=True)
                yield batch
            epoch += 1

    return dl, forever


def torchvision_gpu(ds: Path, cfg: Config) -> tuple[Any, Callable[[], Iterator[Any]]]:
    import torch
    import torchvision
    from torchvision.transforms import v2

    from fastfeed.formats.tar import TarShardReader
    from fastfeed.index import DatasetIndex

    index = DatasetIndex.load(ds)
    encoded = [torch.frombuffer(bytearray(s["jpg"]), dtype=torch.uint8)
               for i in range(len(index.shards)) for s in TarShardReader(index.shard_path(i))]
    crop = v2.Compose([v2.RandomResizedCrop(cfg.image_size, antialias=True), v2.RandomHorizontalFlip()])
    device = torch.device("cuda", cfg.device_id)

    def forever() -> Iterator[Any]:
        g = torch.Generator().manual_seed(0)
        while True:
            order = torch.randperm(len(encoded), generator=g).tolist()
            for a in range(0, len(order), cfg.batch_size):
                batch = [encoded[i] for i in order[a : a + cfg.batch_size]]
                images = torchvision.io.decode_jpeg(batch, device=device)
                yield torch.stack([crop(img) for img in images])

    return None, forever


# ---------------------------------------------------------------------- measuring
#: main-thread CPU microseconds per sample of each measurement, by id() of its Measurement
MAIN_THREAD_US: dict[int, float] = {}


def _measure(make: Callable[[], tuple[Any, Callable[[], Iterator[Any]]]], cfg: Config) -> Measurement:
    """One steady-state measurement; also records the training thread's CPU time per sample
    (what feeding and batch assembly cost the thread that runs the training step)."""
    owner, forever = make()
    samples = 0
    cpu0 = 0.0

    def counted() -> Iterator[Any]:  # thread CPU time after the first batch (start-up excluded)
        nonlocal samples, cpu0
        for k, batch in enumerate(forever()):
            if k == 0:
                cpu0 = time.thread_time()
            else:
                images = batch["image"] if isinstance(batch, dict) else batch
                samples += len(images)
            yield batch

    try:
        m = measure(counted, num_workers=0, min_batches=12, min_time=0.6 * cfg.seconds,
                    max_time=cfg.seconds, settle=0.5, consume=_sync(cfg))
        MAIN_THREAD_US[id(m)] = (time.thread_time() - cpu0) / max(1, samples) * 1e6
        return m
    finally:
        close = getattr(owner, "close", None)
        if callable(close):
            close()
        del owner
        gc.collect()


def _result(name: str, what: str, runs: list[Measurement], **extra: Any) -> Result:
    r = Result(name, what, "warm", runs)
    r.extra.update(extra)
    rate = r.rate
    log(f"{name}: {rate:,.0f} img/s ({what})")
    return r


def ab_pair(ds: Path, knobs: dict[str, Any], cfg: Config, label: str) -> tuple[Result, Result]:
    """fastfeed and the hand-written pipeline at one setting, measured A-B-B-A."""
    ff: list[Measurement] = []
    hw: list[Measurement] = []
    for first in (True, False):
        pair = [(ff, lambda: fastfeed_dali(ds, knobs, cfg)), (hw, lambda: handwritten_dali(ds, knobs, cfg))]
        for runs, make in (pair if first else pair[::-1]):
            runs.append(_measure(make, cfg))
    what = ", ".join(f"{k}={v}" for k, v in sorted(knobs.items()))
    return (_result(f"fastfeed dali @{label}", what, ff, knobs=knobs),
            _result(f"hand-written dali @{label}", what, hw, knobs=knobs))


def mean_rate(r: Result) -> float:
    return sum(m.samples_per_s for m in r.runs) / len(r.runs) if r.runs else 0.0


def tune_knobs(ds: Path, cfg: Config) -> tuple[dict[str, Any], str]:
    """``fastfeed tune --decode dali`` on ``ds``; returns the chosen knobs and how they were found.

    Runs :func:`fastfeed.tune` when ``fastfeed.loader()`` forwards the DALI knobs, else the
    same search (:func:`fastfeed.search.search` over ``TUNE_SPACE``, the same measuring
    core) on :func:`dali_loader` directly, and stores the result where ``"auto"`` finds it.
    """
    import fastfeed
    from fastfeed.loader import loader as ff_loader

    extra = {} if cfg.gpu else {"device_id": None}
    forwards = any(p.kind is p.VAR_KEYWORD for p in inspect.signature(ff_loader).parameters.values())
    if forwards:
        res = fastfeed.tune(str(ds), batch_size=cfg.batch_size, decode="dali", image_size=cfg.image_size,
                            time_budget=cfg.tune_budget, loader_kwargs=extra)
        return dict(res.setting.knobs), f"fastfeed.tune: {res.reason}"
    return _search_directly(ds, cfg)


def _search_directly(ds: Path, cfg: Config) -> tuple[dict[str, Any], str]:
    import datetime

    from fastfeed.decode.dali import TUNE_SPACE
    from fastfeed.dist import local_world_size
    from fastfeed.host import cpu_count
    from fastfeed.index import DatasetIndex
    from fastfeed.search import search
    from fastfeed.tune_store import TuneKey, TuneRecord, save_record

    trial = replace(cfg, seconds=max(1.0, min(cfg.seconds, cfg.tune_budget / 12)))

    def measure_fn(setting: Any) -> Measurement:
        return _measure(lambda: fastfeed_dali(ds, dict(setting.knobs), trial), trial)

    out = search(measure_fn, cores=cpu_count(), space=TUNE_SPACE, local_world_size=local_world_size(),
                 time_budget=cfg.tune_budget,
                 on_trial=lambda t: log(f"  tune {t.setting.label}: {t.rate:,.0f} img/s {t.status}"))
    index = DatasetIndex.load(ds)
    key = TuneKey.current(index.fingerprint, batch_size=cfg.batch_size, decode="dali",
                          image_size=cfg.image_size, local_world_size=local_world_size())
    knobs = dict(out.best.setting.knobs)
    save_record(TuneRecord(key, 0, None, knobs, out.best.rate,
                           datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                           {"reason": out.reason, "trials": len(out.trials)}), str(ds))
    return knobs, f"fastfeed.search over TUNE_SPACE ({len(out.trials)} trials): {out.reason}"


def feed_cost(ds: Path, cfg: Config, batches: int = 200) -> float:
    """Microseconds per sample that fastfeed's feeding (plan -> views of the mapped shards,
    labels, meta) costs the training process's thread; DALI's own per-sample work excluded."""
    from fastfeed.decode.dali import dali_loader

    dl = dali_loader(str(ds), batch_size=cfg.batch_size, image_size=cfg.image_size,
                     device_id=cfg.device_id, **DALI_DEFAULTS)
    feeder = dl._feeder  # the external_source callback, called here without a pipeline
    feeder.restart(0, 0)
    feeder()
    feeder.pending.clear()
    n = 0
    t0 = time.perf_counter()
    for _ in range(batches):
        n += len(feeder()[0])
        feeder.pending.clear()
    return (time.perf_counter() - t0) / n * 1e6


def run_dataset(name: str, ds: Path, cfg: Config, skip: set[str]) -> dict[str, Any]:
    from fastfeed.decode.dali import dali_loader

    results: list[Result] = []
    defaults = dict(DALI_DEFAULTS)
    if cfg.gpu:
        short = replace(cfg, seconds=1.0)  # warm CUDA, nvJPEG and the page cache first
        _measure(lambda: fastfeed_dali(ds, defaults, short), short)
    ff_def, hw_def = ab_pair(ds, defaults, cfg, "defaults")
    results += [ff_def, hw_def]
    knobs, how = tune_knobs(ds, cfg)
    log(f"{name}: tuned {knobs} ({how})")
    auto = dali_loader(str(ds), batch_size=cfg.batch_size, image_size=cfg.image_size, device_id=cfg.device_id)
    found = {k: getattr(auto.options, k) for k in knobs}
    if auto.options.knobs_from != "tuned" or found != knobs:
        log(f"WARNING: dali_loader('auto') did not pick the tune result up: {auto.options}")
    auto.close()
    ff_best, hw_best = ab_pair(ds, knobs, cfg, "tuned")
    results += [ff_best, hw_best]
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
            results.append(_result(label, what, [_measure(make, cfg)]))
        except Exception as e:  # noqa: BLE001 - a peer that cannot run is reported, the rest goes on
            log(f"{label}: failed: {type(e).__name__}: {e}")
    ratios = {
        "defaults": mean_rate(ff_def) / max(mean_rate(hw_def), 1e-9),
        "tuned": mean_rate(ff_best) / max(mean_rate(hw_best), 1e-9),
    }
    for r in results[4:]:
        ratios[f"tuned vs {r.name}"] = mean_rate(ff_best) / max(r.rate, 1e-9)
    return {"dataset": name, "path": str(ds), "tuned": knobs, "how": how, "ratios": ratios,
            "results": results, "best_rate": mean_rate(ff_best), "feed_us_per_sample": feed_cost(ds, cfg)}


def report(runs: list[dict[str, Any]], cfg: Config, env: dict[str, Any], json_path: Path | None) -> dict[str, Any]:
    print(f"\n== decode='dali' vs hand-written DALI / CPU / torchvision: {cfg.samples} samples, "
          f"batch {cfg.batch_size}, {cfg.image_size}x{cfg.image_size}, "
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
        ratios = run["ratios"]
        for key in ("defaults", "tuned"):
            ok = "met" if ratios[key] >= GOAL_RATIO else "MISSED"
            print(f"  fastfeed / hand-written @{key}: {ratios[key]:.3f}x [goal >= {GOAL_RATIO:g}: {ok}]")
        for key, v in ratios.items():
            if key.startswith("tuned vs"):
                print(f"  fastfeed (tuned) / {key[9:]}: {v:.1f}x")
        if run["dataset"] == "resized" and cfg.gpu:
            ok = "met" if run["best_rate"] >= GOAL_RATE else "MISSED"
            print(f"  fastfeed (tuned): {run['best_rate']:,.0f} img/s [goal >= {GOAL_RATE:,}: {ok}]")
        us = run["feed_us_per_sample"]
        print(f"  fastfeed's feeding: {us:.2f} us/sample on the training thread "
              f"({us * run['best_rate'] / 1e6:.1%} of one core at the tuned rate)")
        print(f"  tuned: {run['tuned']} ({run['how']})")
        out["datasets"].append({**{k: v for k, v in run.items() if k != "results"},
                                "results": [r.to_json() for r in run["results"]]})
    text = json.dumps(out, sort_keys=True, default=str)
    if json_path is not None:  # the long line would push the table out of a short log tail
        json_path.write_text(text + "\n")
        print(f"RESULT written to {json_path}")
    else:
        print("RESULT " + text)
    return out


def _env(cfg: Config) -> dict[str, Any]:
    env = environment()
    try:
        import nvidia.dali

        env["dali"] = nvidia.dali.__version__
    except ImportError:
        env["dali"] = None
    if cfg.gpu:
        import torch

        env["gpu"] = torch.cuda.get_device_name(cfg.device_id)
    return env


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny, DALI on the CPU: checks the logic here")
    ap.add_argument("--images", type=Path, default=None,
                    help="the sample photos (default: shared/data/imagenet-sample, else .dali-bench/imagenet-sample)")
    ap.add_argument("--samples", type=int, default=None)
    ap.add_argument("--seconds", type=float, default=None, help="per measurement")
    ap.add_argument("--tune-budget", type=float, default=None, help="seconds of tuning per dataset")
    ap.add_argument("--datasets", default="resized,originals", help="which packed copies to run")
    ap.add_argument("--skip", default="", help="comma list of peers to skip: fastfeed (cpu), torchvision")
    ap.add_argument("--json", type=Path, default=None, help="also write the RESULT dict here")
    args = ap.parse_args(argv)
    cfg = SMOKE if args.cpu_smoke else Config()
    if args.images is not None:
        cfg = replace(cfg, images=args.images)
    elif not cfg.images.is_dir() and (REPO / ".dali-bench" / "imagenet-sample").is_dir():
        cfg = replace(cfg, images=REPO / ".dali-bench" / "imagenet-sample")
    if args.samples:
        cfg = replace(cfg, samples=args.samples)
    if args.seconds:
        cfg = replace(cfg, seconds=args.seconds)
    if args.tune_budget:
        cfg = replace(cfg, tune_budget=args.tune_budget)
    from fastfeed.decode.dali import dali_available

    if not dali_available():
        print("SKIPPED dali_gpu: NVIDIA DALI is not installed (pip install 'fastfeed[dali]'; on the "
              "GPU machine: source benchmarks/gpu_setup.sh)")
        return 0
    if cfg.gpu:
        import torch

        if not torch.cuda.is_available():
            print("SKIPPED dali_gpu: no CUDA GPU here; `--cpu-smoke` checks the logic without one")
            return 0
    os.environ.setdefault("FASTFEED_TUNE_DIR", str(cfg.work / "tune"))
    env = _env(cfg)
    data = prepare(cfg)
    runs = []
    for name in [n for n in args.datasets.split(",") if n]:
        runs.append(run_dataset(name, data[name], cfg, set(filter(None, args.skip.split(",")))))
    report(runs, cfg, env, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
