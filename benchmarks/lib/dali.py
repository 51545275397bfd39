"""The DALI side of the benchmarks: the pipelines compared and how one of them is measured.

Shared by ``benchmarks/dali_gpu.py`` (the paired search, one or two pipelines),
``benchmarks/dali_variants.py`` (decoder options one at a time) and ``benchmarks/dali_latency.py``.
Every loader does the same work: random-resized-crop decode -> ``image_size`` squared -> random
flip -> uint8 NCHW batches on the GPU (labels too):

- :func:`fastfeed_dali`: ``fastfeed.loader(decode="dali")``;
- :func:`handwritten_dali`: what a DALI user writes from DALI's docs on the same shards and index
  files (``fn.readers.webdataset`` with ``random_shuffle``, ``decoders.image_random_crop`` mixed,
  ``resize``, ``crop_mirror_normalize``, ``DALIGenericIterator``); :func:`handwritten_two`: two of
  them of half the threads each, read alternately;
- :func:`fastfeed_cpu`: ``decode="cpu"`` with worker processes, batches copied to the GPU;
- :func:`torchvision_gpu`: ``torchvision.io.decode_jpeg(list, device="cuda")`` on batches of
  encoded bytes held in memory (no reading cost at all, an upper bound for it), then
  ``RandomResizedCrop`` + flip per image on the GPU.

Each maker returns ``(owner, forever)``: ``forever()`` yields batches over epochs streamed back
to back; ``owner`` is what to close. :func:`measure_one` measures one through
:func:`fastfeed.timing.measure.measure` with every batch synchronised on the GPU, and records the
training thread's CPU time per sample beside it.
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterator

from fastfeed.timing.measure import Measurement, measure

from benchmarks.lib.data import BENCH_DATA, REPO, SHARED_SAMPLE, replicated_sample
from benchmarks.lib.loaders import fastfeed_loader
from benchmarks.lib.measure import Stopwatch
from benchmarks.lib.report import Result
from benchmarks.lib.report import log as _log

__all__ = ["CLOCK", "DALI_DEFAULTS", "SMOKE", "Config", "Maker", "Setting", "alternate", "config_at", "env_of",
           "fastfeed_cpu", "fastfeed_dali", "handwritten_dali", "handwritten_two", "knobs_of", "log", "mean_rate",
           "measure_one", "prepare", "result", "setting_label", "sync", "torchvision_gpu"]

DALI_DEFAULTS = {"num_threads": 4, "hw_decoder_load": 0.65, "prefetch_queue_depth": 2}
"""DALI's own defaults (hw_decoder_load, prefetch_queue_depth) and the thread count of
DALI's ResNet-50 example: DALI's Pipeline has no default for num_threads."""
CLOCK = Stopwatch.start()  # seconds since the start, on every progress line

#: what a loader maker returns: (what to close, a callable yielding batches forever)
Maker = Callable[[], tuple[Any, Callable[[], Iterator[Any]]]]
#: A setting both pipelines run at: DALI's knobs plus "batch_size".
Setting = dict[str, Any]


def log(msg: str) -> None:
    """Progress line on stderr, with the seconds since the start."""
    _log(f"[{CLOCK.elapsed():4.0f} s] {msg}")


@dataclass(frozen=True)
class Config:
    """The sizes, times and search grid of the DALI benchmarks."""

    samples: int = 2_000
    batch_size: int = 256
    image_size: int = 224
    seconds: float = 3.5  # per A-B-B-A measurement
    trial_seconds: float = 1.5  # per measurement of the paired search
    search_loads: tuple[float, ...] = (1.0, 0.9, 0.75)
    search_threads: tuple[int, ...] = (4, 8, 12, 16)
    search_depths: tuple[int, ...] = (3, 2, 4)  # the first: while the others are searched
    search_batches: tuple[int, ...] = (256, 512)  # the first is batch_size
    originals_loads: tuple[float, ...] = (1.0, 0.75)  # a smaller grid on the originals
    originals_threads: tuple[int, ...] = (4, 12)
    tune_budget: float = 0.0  # > 0: also run `fastfeed tune --decode dali` for this long
    cpu_workers: int = 16
    cpu_batch_size: int = 64
    device_id: int | None = 0
    max_side: int = 500
    originals_max_side: int | None = None
    images: Path = SHARED_SAMPLE
    work: Path = BENCH_DATA / "dali"

    @property
    def gpu(self) -> bool:
        return self.device_id is not None

    def grid(self, dataset: str) -> tuple[tuple[float, ...], tuple[int, ...]]:
        """The (hw_decoder_load, num_threads) values searched on ``dataset``."""
        if dataset == "originals":
            return self.originals_loads, self.originals_threads
        return self.search_loads, self.search_threads

    def found_images(self) -> Config:
        """This config, with the sample photos where the GPU machine keeps them if not in ``shared/``."""
        if not self.images.is_dir() and (REPO / ".dali-bench" / "imagenet-sample").is_dir():
            return replace(self, images=REPO / ".dali-bench" / "imagenet-sample")
        return self


SMOKE = Config(samples=96, batch_size=16, image_size=64, seconds=1.5, trial_seconds=0.8,
               search_loads=(0.65,), search_threads=(1, 2), search_depths=(2, 3), search_batches=(16, 32),
               originals_loads=(0.65,), originals_threads=(1,), tune_budget=0.0, cpu_workers=2,
               cpu_batch_size=16, device_id=None, max_side=96, originals_max_side=192)


def knobs_of(setting: Setting) -> dict[str, Any]:
    """DALI's knobs of a setting (without its batch size)."""
    return {k: v for k, v in setting.items() if k != "batch_size"}


def setting_label(setting: Setting) -> str:
    """``k=v, ...`` of a setting, sorted."""
    return ", ".join(f"{k}={v}" for k, v in sorted(setting.items()))


def config_at(cfg: Config, setting: Setting, seconds: float | None = None) -> Config:
    """``cfg`` at a setting's batch size (and measurement time)."""
    return replace(cfg, batch_size=setting.get("batch_size", cfg.batch_size),
                   seconds=cfg.seconds if seconds is None else seconds)


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
            with Stopwatch() as took:
                fastfeed.pack(folder, dst, samples_per_shard=256, workers=os.cpu_count() or 1,
                              max_side=side, shuffle=True, seed=0)
            log(f"packed {folder.name} -> {dst.name} in {took.wall:.1f} s")
        out[name] = dst
    return out


# ---------------------------------------------------------------------- loaders
def sync(device_id: int | None) -> Callable[[Any], None]:
    """A ``consume`` that waits for the GPU's work on the current stream (nothing without a GPU)."""
    if device_id is None:
        return lambda batch: None
    import torch

    stream = torch.cuda.current_stream(device_id)
    return lambda batch: stream.synchronize()


def fastfeed_dali(ds: Path, knobs: dict[str, Any], cfg: Config) -> tuple[Any, Callable[[], Iterator[Any]]]:
    """``fastfeed.loader(decode="dali")`` at ``knobs`` (one pipeline unless they say), built and primed."""
    knobs = {"num_pipelines": 1, **knobs}  # explicit: a stored tune result must not decide it
    dl = fastfeed_loader(ds, batch_size=cfg.batch_size, image_size=cfg.image_size, decode="dali",
                         device_id=cfg.device_id, dali=knobs)
    # Build the pipeline here, as the hand-written one is built (pipe.build() and the
    # iterator's first prefetch) before it is measured: the ~1.7 s of building a GPU
    # pipeline then counts for neither (it did for fastfeed alone, which made its short
    # search trials meaningless).
    dl.set_epoch(0)
    first_pass = iter(dl)
    first = next(first_pass)

    def forever() -> Iterator[Any]:
        yield first
        yield from first_pass
        epoch = 1
        while True:
            dl.set_epoch(epoch)
            yield from dl
            epoch += 1

    return dl, forever


def handwritten_dali(ds: Path, knobs: dict[str, Any], cfg: Config, *, decoder_extra: dict[str, Any] | None = None,
                     resize_extra: dict[str, Any] | None = None, seed: int = 0,
                     shard: tuple[int, int] = (0, 1)) -> tuple[Any, Callable[[], Iterator[Any]]]:
    """A DALI pipeline as DALI's documentation writes it, on fastfeed's shards and index files.

    The keyword arguments are for ``benchmarks/dali_variants.py``: extra decoder / resize
    options, the pipeline's seed, and (shard_id, num_shards) of the reader.
    """
    from nvidia.dali import fn, pipeline_def, types
    from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

    index = json.loads((ds / "index.json").read_text())
    paths = [str(ds / s["name"]) for s in index["shards"]]
    index_paths = [str(ds / s["dali_index"]) for s in index["shards"]]
    decoder: dict[str, Any] = {"device": "mixed" if cfg.gpu else "cpu", **(decoder_extra or {})}
    if cfg.gpu:
        decoder["hw_decoder_load"] = knobs["hw_decoder_load"]

    @pipeline_def(batch_size=cfg.batch_size, num_threads=knobs["num_threads"], device_id=cfg.device_id,
                  prefetch_queue_depth=knobs["prefetch_queue_depth"], seed=seed)
    def pipeline() -> Any:
        jpegs, cls = fn.readers.webdataset(paths=paths, index_paths=index_paths, ext=["jpg", "cls"],
                                           random_shuffle=True, shard_id=shard[0], num_shards=shard[1],
                                           name="Reader")
        images = fn.decoders.image_random_crop(jpegs, output_type=types.RGB, **decoder)
        images = fn.resize(images, resize_x=cfg.image_size, resize_y=cfg.image_size, **(resize_extra or {}))
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


def alternate(*streams: Callable[[], Iterator[Any]]) -> Callable[[], Iterator[Any]]:
    """One batch of each stream in turn, forever."""
    def forever() -> Iterator[Any]:
        its = [s() for s in streams]
        while True:
            for it in its:
                yield next(it)
    return forever


def handwritten_two(ds: Path, knobs: dict[str, Any], cfg: Config) -> tuple[Any, Callable[[], Iterator[Any]]]:
    """Two hand-written pipelines of half the threads each, on half the shards each, read
    alternately (``benchmarks/dali_variants.py``'s ``two-pipes``)."""
    half = {**knobs, "num_threads": max(1, knobs["num_threads"] // 2)}
    a = handwritten_dali(ds, half, cfg, seed=1, shard=(0, 2))
    b = handwritten_dali(ds, half, cfg, seed=2, shard=(1, 2))
    return (a[0], b[0]), alternate(a[1], b[1])


def fastfeed_cpu(ds: Path, cfg: Config) -> tuple[Any, Callable[[], Iterator[Any]]]:
    """``fastfeed.loader(decode="cpu")`` with ``cfg.cpu_workers`` workers, batches copied to the GPU."""
    dl = fastfeed_loader(ds, batch_size=cfg.cpu_batch_size, image_size=cfg.image_size, decode="cpu",
                         workers=cfg.cpu_workers, prefetch=2, pin_memory=cfg.gpu)

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
    """torchvision's batched GPU JPEG decode over the shards' bytes held in memory."""
    import torch
    import torchvision
    from torchvision.transforms import v2

    from fastfeed.formats.tar import TarShardReader
    from fastfeed.packed.index import DatasetIndex

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


def measure_one(make: Maker, cfg: Config) -> Measurement:
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
                    max_time=cfg.seconds, settle=0.5, consume=sync(cfg.device_id))
        MAIN_THREAD_US[id(m)] = (time.thread_time() - cpu0) / max(1, samples) * 1e6
        return m
    finally:
        stop = getattr(owner, "close", None)
        if callable(stop):
            stop()
        del owner
        gc.collect()


def result(name: str, what: str, runs: list[Measurement], **extra: Any) -> Result:
    """The measurements of one loader as a :class:`~benchmarks.lib.report.Result`."""
    r = Result(name, what, "warm", runs)
    r.extra.update(extra)
    r.extra["measurements"] = [{"img_per_s": m.samples_per_s, "p10": m.p10_samples_per_s, "p90": m.p90_samples_per_s,
                                "batches": m.batches, "startup_s": m.startup_s, "total_s": m.total_s,
                                "main_thread_us_per_img": MAIN_THREAD_US.get(id(m))} for m in runs]
    log(f"{name}: {r.rate:,.0f} img/s ({what})")
    return r


def mean_rate(r: Result) -> float:
    """The mean img/s of a result's measurements."""
    return sum(m.samples_per_s for m in r.runs) / len(r.runs) if r.runs else 0.0


def env_of(cfg: Config, env: dict[str, Any]) -> dict[str, Any]:
    """``env`` with DALI's version and the GPU's name."""
    try:
        import nvidia.dali

        env["dali"] = nvidia.dali.__version__
    except ImportError:
        env["dali"] = None
    if cfg.gpu:
        import torch

        env["gpu"] = torch.cuda.get_device_name(cfg.device_id)
    return env
