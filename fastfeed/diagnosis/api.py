"""``fastfeed doctor``: where the input bottleneck is, with the figures and the fix.

"Why is my GPU idle?" has a handful of answers: storage too slow, decode too heavy, too
few workers, ranks waiting for each other, or no input problem at all. :func:`doctor`
measures each stage of the pipeline on its own, in bounded time, all through the one
measuring core :func:`fastfeed.timing.measure.measure` (so its figures agree with ``fastfeed
tune`` and ``benchmarks/``):

1. **storage**: sequential shard reads with the page cache dropped (remote shards: the
   loader's download path, and the latency of one request); with ``source=``, random
   reads of the raw files the dataset was packed from (what packing saves);
2. **decode + augmentation**: the loader's decoder over samples in memory, in one
   process (per core) and in one process per core (the host's ceiling);
3. **the loader** at its tuned (or given) setting (:func:`fastfeed.tuning.api.measure_loader`),
   with its workers' read and decode times from ``loader.stats``; with a demand, once
   more with the training step simulated (sleeping ``step_time`` per batch), giving the
   wait fraction training would see;
4. **GPU decode** through DALI, when DALI and a GPU are there (skipped with the reason);
5. for datasets with lengths (``pack --length``): padding efficiency and straggler ratio
   of fastfeed's length-bucketed sampler against ``DistributedSampler``.

Then it compares what the pipeline delivers with what training consumes (the demand:
``target_rate`` samples/s per rank, or ``batch_size / step_time``) and names the
limiting stage, the headroom and the fix (:mod:`fastfeed.diagnosis.verdict`). Shared
resources (storage, CPU cores) are divided among the ranks on the host
(``LOCAL_WORLD_SIZE``).

Modules: :mod:`fastfeed.diagnosis.probes` (storage, raw files, decode: measured apart from
fastfeed's loader), :mod:`fastfeed.diagnosis.stages` (the loader, the simulated step, DALI,
the samplers), :mod:`fastfeed.diagnosis.verdict` (findings), :mod:`fastfeed.diagnosis.report`
(text, JSON, HTML), and :mod:`fastfeed.loading.bottleneck` (the classification shared with the
periodic stats line).

Example:
    >>> report = fastfeed.doctor("/data/imagenet-ff", step_time=0.25, batch_size=256)  # doctest: +SKIP
    >>> print(report.text())                                                           # doctest: +SKIP
    >>> report.bottleneck                                                              # doctest: +SKIP
    'decode'
"""

from __future__ import annotations

import json as json_module
import logging
import os
import time
from typing import Any, Callable, Mapping

from fastfeed._options import check_int, fill_doc, mapping_or_none, path_or_none
from fastfeed._util import parse_duration
from fastfeed.decode.cpu import normalize_image_size
from fastfeed.formats.naming import holds_pixels
from fastfeed.diagnosis.probes import (
    image_stats,
    read_samples,
    source_probe,
    storage_probe,
)
from fastfeed.diagnosis.report import DoctorReport, Finding, Stage
from fastfeed.diagnosis.stages import (
    Budget,
    Run,
    balance_stage,
    dali_skip_reason,
    dali_stage,
    decode_stages,
    loader_stage,
    step_stage,
)
from fastfeed.diagnosis.verdict import Facts, conclude
from fastfeed.dist import MAX_WORLD_SIZE, local_world_size, resolve_world
from fastfeed.errors import ConfigError, FastfeedError
from fastfeed.host import cpu_count, memory_total
from fastfeed.loading.auto import resolve_auto
from fastfeed.loading.groups import Crop, Dali, Order, Storage, Tokens, Workers
from fastfeed.loading.options import LoaderOptions
from fastfeed.knobs.space import Setting
from fastfeed.packed.index import DatasetIndex
from fastfeed.packed.reader import check_shards, resolve_index
from fastfeed.storage.remote import is_url
from fastfeed.tuning.api import LOADER_OPTIONS, measured_options
from fastfeed.tuning.defaults import (
    DEFAULT_BATCH_SIZE,
    check_demand,
    resolve_defaults,
    small_dataset_note,
)

__all__ = ["DoctorReport", "Finding", "Stage", "doctor"]

log = logging.getLogger(__name__)


def _check(batch_size: int, target_rate: float | None, step_time: float | None, time_budget: str | float,
           decode: str | None, world_size: int | None, source: Any) -> tuple[float | None, float, int]:
    """Validate the arguments; returns (demand in samples/s or None, budget seconds, world size)."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ConfigError(f"batch_size={batch_size!r} must be an integer >= 1")
    target_rate, step_time = check_demand(target_rate, step_time)
    demand = target_rate if step_time is None else batch_size / step_time
    budget = parse_duration(time_budget, "time_budget")
    if budget <= 0:
        raise ConfigError(f"time_budget={time_budget!r} must be positive")
    if decode not in ("cpu", "dali", None):
        raise ConfigError(f"decode={decode!r}; use 'cpu', 'dali' or None")
    world = check_int("world_size", world_size, 1, most=MAX_WORLD_SIZE) if world_size is not None else \
        resolve_world()[1]
    if path_or_none(source, "source") is not None and (is_url(str(source)) or not os.path.isdir(source)):
        raise ConfigError(f"--source {source}: not a local folder; give the folder the dataset was packed from")
    return demand, budget, world


def _storage_options(storage: Any, loader_kwargs: Mapping[str, Any] | None) -> Any:
    """The fsspec options to read the index with, before the options are validated."""
    if isinstance(storage, Storage):
        return storage.options
    if isinstance(storage, Mapping):
        return storage.get("options")
    return (loader_kwargs or {}).get("storage_options")


def _load_index(path: str, cache_dir: Any, storage_options: Any) -> DatasetIndex:
    try:
        index = resolve_index(path, cache_dir=cache_dir, storage_options=storage_options)
    except FastfeedError as e:
        if not is_url(path) and os.path.isdir(path) and not os.path.exists(os.path.join(path, "index.json")):
            raise ConfigError(
                f"{path}: not a packed dataset ({e}). Pack it first, `fastfeed pack {path} PACKED`, then run "
                f"`fastfeed doctor PACKED --source {path}` to see what packing saves"
            ) from None
        raise
    check_shards(index)
    return index


def _disk_free(index: DatasetIndex) -> int | None:
    """Free bytes on the file system of a local dataset (where a raw-pixel copy would likely go); None if remote."""
    import shutil

    if not index.root or is_url(index.root):
        return None
    try:
        return int(shutil.disk_usage(index.root).free)
    except OSError:
        return None


def _has_images(index: DatasetIndex) -> bool:
    return any(holds_pixels(f) for f in index.fields)


# ---------------------------------------------------------------------- doctor()
def doctor(
    path: str | os.PathLike[str],
    *,
    source: str | os.PathLike[str] | None = None,
    target_rate: float | None = None,
    step_time: float | None = None,
    world_size: int | None = None,
    batch_size: int | None = None,
    image_size: int | tuple[int, int] | str | None = "auto",
    decode: str | None = "cpu",
    num_workers: int | str = "auto",
    augment: bool | None = None,
    transform: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    seq_len: int | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    crop: Crop | Mapping[str, Any] | None = None,
    workers: Workers | Mapping[str, Any] | None = None,
    dali: Dali | Mapping[str, Any] | None = None,
    storage: Storage | Mapping[str, Any] | None = None,
    tokens: Tokens | Mapping[str, Any] | None = None,
    order: Order | Mapping[str, Any] | None = None,
    time_budget: str | float = "60s",
    seed: int = 0,
    json: str | os.PathLike[str] | None = None,
    report: str | os.PathLike[str] | None = None,
    on_stage: Callable[[Stage], None] | None = None,
    prefetch_factor: int | str | None = None,
    storage_options: Mapping[str, Any] | None = None,
    loader_kwargs: Mapping[str, Any] | None = None,
) -> DoctorReport:
    """Measure every stage of the input pipeline and say which one limits training.

    Args:
        path: a packed dataset (folder or URL), or WebDataset tars.
        source: the raw folder the dataset was packed from (measures small-file reads).
        target_rate: samples/s one rank's training step consumes.
        step_time: seconds per training step instead (demand = ``batch_size / step_time``).
        world_size: ranks, for the sampler balance (default: torch.distributed /
            ``WORLD_SIZE``, else 1).
        batch_size: the per-rank batch size training uses (default
            :data:`~fastfeed.tuning.defaults.DEFAULT_BATCH_SIZE`, the same as ``tune``'s).
        image_size: the output size training uses; ``"auto"``: 224 when the dataset has
            images (and is decoded), else None, as ``tune``.
        decode: ``"cpu"``, ``"dali"`` or None (raw bytes), as given to ``loader()``.
        dali: with ``decode="dali"``, training's DALI options; with ``decode="cpu"``, those of
            the DALI stage measured beside it (``Dali(device_id=None)`` measures DALI on the CPU).
        num_workers: the loader's workers (with ``workers=Workers(prefetch_factor=)``, its
            setting); ``"auto"`` is what ``loader()`` would use (a ``fastfeed tune`` result,
            else its heuristic).
        {loader options}
        time_budget: total measuring time, e.g. ``"60s"``.
        seed: shuffle and crop seed.
        json: also write the report as JSON to this file.
        report: also write a self-contained HTML report to this file.
        on_stage: called with every stage as it is measured (progress).
        prefetch_factor: the former spelling of ``workers=Workers(prefetch_factor=)`` (a
            ``FutureWarning``).
        storage_options: the former spelling of ``storage=Storage(options=)`` (a
            ``FutureWarning``).
        loader_kwargs: the former spelling of the loader options above, as one dict (a
            ``FutureWarning``).

    Returns:
        A :class:`DoctorReport`; ``report.bottleneck`` names the main finding.

    Example:
        >>> r = doctor("/data/imagenet-ff", batch_size=256, image_size=224, step_time=0.3)  # doctest: +SKIP
        >>> r.bottleneck, r.headroom                                                        # doctest: +SKIP
        ('decode', 0.74)
    """
    start = time.monotonic()
    load_average = os.getloadavg()[0] if hasattr(os, "getloadavg") else None  # before we add our own
    given_batch, batch_size = batch_size, DEFAULT_BATCH_SIZE if batch_size is None else batch_size
    loader_kwargs = mapping_or_none(loader_kwargs, "loader_kwargs")
    demand, budget, world = _check(batch_size, target_rate, step_time, time_budget, decode, world_size, source)
    path_s = str(path)
    former = {k: v for k, v in (("prefetch_factor", prefetch_factor), ("storage_options", storage_options))
              if v is not None}
    if former:
        loader_kwargs = {**former, **dict(loader_kwargs or {})}
    index = _load_index(path_s, cache_dir, _storage_options(storage, loader_kwargs))

    has_images = _has_images(index)
    chosen = resolve_defaults(has_images=has_images, batch_size=given_batch, image_size=image_size, decode=decode)
    if chosen.assumed:
        log.info("doctor: %s", chosen.line())
    size = normalize_image_size(chosen.image_size)
    cores, ranks = cpu_count(), local_world_size()
    cores_per_rank = max(1, cores // ranks)
    options = measured_options(batch_size=batch_size, decode=decode, image_size=size, seed=seed,
                               loader_kwargs=loader_kwargs, caller="doctor", augment=augment, transform=transform,
                               seq_len=seq_len, cache_dir=cache_dir, crop=crop, workers=workers,
                               dali=dali if decode == "dali" else None, storage=storage, tokens=tokens, order=order,
                               rank=0, world_size=1)
    storage_options = options.storage.options
    num, pf, workers_from = resolve_auto(index, batch_size=batch_size, decode=decode, image_size=size,
                                         num_workers=num_workers, prefetch_factor=options.workers.prefetch_factor)
    setting = Setting(num, pf)
    dali_skip = dali_skip_reason(index, decode, has_images)
    plan = ["storage", "loader"] + (["source"] if source is not None else [])
    plan += ["decode_core", "decode_all"] if decode == "cpu" else []
    plan += ["loader_step"] if demand else []
    plan += ["dali"] if dali_skip is None else []
    stages: dict[str, Stage] = {}

    def emit(stage: Stage) -> None:
        stages[stage.key] = stage
        log.info("doctor: %s: %s", stage.name, stage.skipped or stage.detail)
        if on_stage is not None:
            on_stage(stage)

    run = Run(path_s, setting, options, Budget(budget, plan), emit, dali=dali)
    profile, images, balance = _measure(
        run, index, source=source, demand=demand, step=step_time if step_time is not None else
        batch_size / demand if demand else None, workers_from=workers_from, dali_skip=dali_skip, world=world,
        cores_per_rank=cores_per_rank, ranks=ranks, has_images=has_images, storage_options=storage_options)
    facts = Facts(path=path_s, batch_size=batch_size, image_size=size, decode=decode, num_workers=num,
                  prefetch_factor=pf, workers_from=workers_from, cores_per_rank=cores_per_rank, local_ranks=ranks,
                  remote=is_url(index.shard_path(0)) if index.shards else False,
                  cache_dir=None if cache_dir is None else str(cache_dir),
                  fits_in_memory=sum(s.bytes for s in index.shards) <= memory_total() / 2, demand=demand,
                  step_time=step_time, stages=stages, profile=profile, images=images, balance=balance,
                  dali_skipped=dali_skip, load_average=load_average,
                  small_dataset=small_dataset_note(index.num_samples, batch_size, world),
                  num_samples=index.num_samples, stored_raw=index.store is not None,
                  disk_free=_disk_free(index))
    findings, limiting, deliverable, input_bound, headroom = conclude(facts)
    result = _report(facts, index, findings, limiting, deliverable, input_bound, headroom, world, setting,
                     time.monotonic() - start, target_rate, step_time)
    if json is not None:
        with open(json, "w", encoding="utf-8") as f:
            json_module.dump(result.to_json(), f, indent=1)
    if report is not None:
        result.write_html(report)
    return result


def _measure(run: Run, index: DatasetIndex, *, source: Any, demand: float | None, step: float | None,
             workers_from: str, dali_skip: str | None, world: int, cores_per_rank: int, ranks: int,
             has_images: bool, storage_options: Any) -> tuple[Any, Any, Any]:
    """Run every stage in turn; returns (the loader's profile, image sizes, the balance report)."""
    samples, ids = read_samples(index, cache_dir=run.options.cache_dir, storage_options=storage_options)
    images = image_stats(samples, run.options.crop.image_field) if has_images else None
    if run.decode == "cpu":
        decode_stages(run, index, samples, ids, cores_per_rank, ranks)
    else:
        why = "decode=None: raw bytes" if run.decode is None else "decode='dali': measured by the loader stage"
        run.emit(Stage("decode_core", "decode + augment (1 core)", None, "", {}, skipped=why))
    del samples
    m, profile = loader_stage(run, workers_from=workers_from)
    if demand and step:
        step_stage(run, demand=demand, rate=m.samples_per_s, step=step)
    dali_stage(run, dali_skip)
    # the cold-cache probes last: dropping the shards from the page cache earlier would make the
    # loader's figure colder than the page cache the training finds
    run.emit(storage_probe(index, seconds=run.budget["storage"], local_ranks=ranks,
                           storage_options=storage_options))
    if source is not None:
        run.emit(source_probe(source, seconds=run.budget["source"], num_samples=index.num_samples,
                              local_ranks=ranks, seed=run.seed))
    return profile, images, balance_stage(run, index, world)


def _report(f: Facts, index: DatasetIndex, findings: tuple[Finding, ...], limiting: str, deliverable: float,
            input_bound: bool | None, headroom: float | None, world: int, setting: Any, elapsed: float,
            target_rate: float | None, step_time: float | None) -> DoctorReport:
    demand_from = (f"batch {f.batch_size} every {step_time:g} s" if step_time is not None
                   else "the target rate" if target_rate is not None else "")
    dataset = {"num_samples": index.num_samples, "num_shards": len(index.shards), "format": index.format,
               "bytes": sum(s.bytes for s in index.shards), "fields": list(index.fields), "remote": f.remote,
               "lengths": index.lengths is not None, "fits_in_memory": f.fits_in_memory}
    host = {"cores": cpu_count(), "local_ranks": f.local_ranks, "cores_per_rank": f.cores_per_rank,
            "memory_gib": memory_total() / 2**30, "world_size": world, "load_average": f.load_average}
    settings = {"batch_size": f.batch_size, "image_size": list(f.image_size) if f.image_size else None,
                "decode": f.decode, "setting": setting.label, "num_workers": f.num_workers,
                "prefetch_factor": f.prefetch_factor, "workers_from": f.workers_from, "cache_dir": f.cache_dir}
    order = ["storage", "source", "decode_core", "decode_all", "dali", "loader", "loader_step", "balance"]
    stages = tuple(f.stages[k] for k in order if k in f.stages)
    return DoctorReport(f.path, dataset, host, settings, f.demand, demand_from, deliverable, limiting,
                        input_bound, headroom, findings, stages, elapsed)


fill_doc(doctor, LoaderOptions, names=[n for n in LOADER_OPTIONS if n != "dali"], marker="{loader options}")
