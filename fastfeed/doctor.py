"""``fastfeed doctor``: where the input bottleneck is, with the figures and the fix.

"Why is my GPU idle?" has a handful of answers: storage too slow, decode too heavy, too
few workers, ranks waiting for each other, or no input problem at all. :func:`doctor`
measures each stage of the pipeline on its own, in bounded time, all through the one
measuring core :func:`fastfeed.measure.measure` (so its figures agree with ``fastfeed
tune`` and ``benchmarks/``):

1. **storage**: sequential shard reads with the page cache dropped (remote shards: the
   loader's download path, and the latency of one request); with ``source=``, random
   reads of the raw files the dataset was packed from (what packing saves);
2. **decode + augmentation**: the loader's decoder over samples in memory, in one
   process (per core) and in one process per core (the host's ceiling);
3. **the loader** at its tuned (or given) setting (:func:`fastfeed.tune.measure_loader`),
   with its workers' read and decode times from ``loader.stats``; with a demand, once
   more with the training step simulated (sleeping ``step_time`` per batch), giving the
   wait fraction training would see;
4. **GPU decode** through DALI, when DALI and a GPU are there (skipped with the reason);
5. for datasets with lengths (``pack --length``): padding efficiency and straggler ratio
   of fastfeed's length-bucketed sampler against ``DistributedSampler``.

Then it compares what the pipeline delivers with what training consumes (the demand:
``target_rate`` samples/s per rank, or ``batch_size / step_time``) and names the
limiting stage, the headroom and the fix (:mod:`fastfeed.doctor_verdict`). Shared
resources (storage, CPU cores) are divided among the ranks on the host
(``LOCAL_WORLD_SIZE``).

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

from fastfeed._util import parse_duration
from fastfeed.bottleneck import LoadProfile
from fastfeed.dist import local_world_size, resolve_world
from fastfeed.doctor_probes import decode_probe, image_stats, read_samples, source_probe, storage_probe
from fastfeed.doctor_report import DoctorReport, Finding, Stage
from fastfeed.doctor_verdict import Facts, conclude
from fastfeed.errors import ConfigError, FastfeedError
from fastfeed.host import cpu_count, memory_total
from fastfeed.index import DatasetIndex
from fastfeed.remote import is_url

__all__ = ["DoctorReport", "Finding", "Stage", "doctor"]

log = logging.getLogger(__name__)

#: Shares of the time budget per stage (normalised over the stages that run).
WEIGHTS = {"storage": 1.0, "source": 1.0, "decode_core": 1.0, "decode_all": 1.0, "loader": 2.5,
           "loader_step": 1.5, "dali": 1.5}
#: Samples per batch in the decode probes (the per-sample cost barely depends on it).
PROBE_BATCH = 8
_DECODER_ARGS = {"augment": "augment", "decode_backend": "backend", "image_field": "image_field",
                 "transform": "transform", "crop_scale": "scale", "crop_ratio": "ratio", "flip": "flip",
                 "crop_fraction": "crop_fraction"}


def _check(batch_size: int, target_rate: float | None, step_time: float | None) -> float | None:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ConfigError(f"batch_size={batch_size!r} must be an integer >= 1")
    if target_rate is not None and step_time is not None:
        raise ConfigError("give target_rate (samples/s per rank) or step_time (seconds per batch), not both")
    if step_time is not None:
        if not step_time > 0:
            raise ConfigError(f"step_time={step_time} must be > 0 seconds")
        return batch_size / step_time
    if target_rate is not None and not target_rate > 0:
        raise ConfigError(f"target_rate={target_rate} must be > 0 samples/s")
    return target_rate


def _load_index(path: str, cache_dir: Any, storage_options: Any) -> DatasetIndex:
    from fastfeed.source import check_shards, resolve_index

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


class _Budget:
    """Seconds per stage: the budget split by :data:`WEIGHTS` over the stages that run."""

    def __init__(self, total: float, stages: list[str]) -> None:
        unit = total / sum(WEIGHTS[s] for s in stages)
        self.seconds = {s: max(0.5, WEIGHTS[s] * unit) for s in stages}

    def __getitem__(self, stage: str) -> float:
        return self.seconds[stage]


def _has_images(index: DatasetIndex) -> bool:
    from fastfeed.decode.fields import is_image

    return any(is_image(f) for f in index.fields)


def _decoder(decode: str | None, image_size: tuple[int, int] | None, seed: int,
             loader_kwargs: Mapping[str, Any]) -> Any:
    from fastfeed.decode.cpu import CpuDecoder

    args = {_DECODER_ARGS[k]: v for k, v in loader_kwargs.items() if k in _DECODER_ARGS}
    return CpuDecoder(image_size=image_size, seed=seed, **args)


# ---------------------------------------------------------------------- the loader stages
def _loader_run(path: str, setting: Any, *, batch_size: int, decode: str | None, image_size: Any,
                seconds: float, loader_kwargs: Mapping[str, Any], step_time: float | None
                ) -> tuple[Any, LoadProfile]:
    """Measure the loader (through tune's measure_loader); its profile after warm-up from stats."""
    from fastfeed.tune import measure_loader

    held: dict[str, Any] = {}
    seen = [0]
    warm = max(1, setting.num_workers * (setting.prefetch_factor or 0)) + 1

    def on_loader(dl: Any) -> None:
        held["dl"] = dl

    def consume(batch: Any) -> None:
        seen[0] += 1
        if seen[0] == warm:  # the prefetch queue has been drained once: steady from here
            held["before"] = held["dl"].stats.summary()
        if step_time:
            time.sleep(step_time)

    m = measure_loader(path, setting, batch_size=batch_size, decode=decode, image_size=image_size,
                       seconds=seconds, min_batches=4 if step_time else 8, loader_kwargs=loader_kwargs,
                       consume=consume, on_loader=on_loader)
    after = held["dl"].stats.summary()
    profile = LoadProfile.between(held.get("before", {}), after, setting.num_workers)
    if profile.batches < 2:  # too slow for steady batches after warm-up: take every timed batch
        profile = LoadProfile.between({}, after, setting.num_workers)
    return m, profile


def _loader_detail(m: Any, p: LoadProfile, setting: Any) -> str:
    parts = [f"p10-p90 {m.p10_samples_per_s:,.0f}-{m.p90_samples_per_s:,.0f}",
             f"start-up {m.startup_s:.1f} s"]
    if p.batches:
        who = "main process" if setting.num_workers == 0 else "workers"
        parts.insert(0, f"{who} busy {p.busy:.0%} ({p.read_share:.0%} reading, {1 - p.read_share:.0%} "
                        f"decoding, {p.cpu_share:.0%} CPU)")
    return ", ".join(parts)


def _dali_skip_reason(index: DatasetIndex, decode: str | None, has_images: bool) -> str | None:
    if decode == "dali":
        return "the loader stage already runs decode='dali'"
    if not has_images:
        return "no images"
    if index.format != "tar":
        return f"{index.format} shards (DALI reads tar shards)"
    if not all(s.dali_index for s in index.shards):
        return "the shards have no DALI index files (re-pack with `fastfeed pack`)"
    import torch

    if not torch.cuda.is_available():
        return "no CUDA GPU on this machine"
    from fastfeed.decode.dali import DALI_INSTALL, dali_available

    if not dali_available():
        return f"DALI is not installed ({DALI_INSTALL})"
    return None


# ---------------------------------------------------------------------- doctor()
def doctor(
    path: str | os.PathLike[str],
    *,
    source: str | os.PathLike[str] | None = None,
    target_rate: float | None = None,
    step_time: float | None = None,
    world_size: int | None = None,
    batch_size: int = 256,
    image_size: int | tuple[int, int] | str | None = "auto",
    decode: str | None = "cpu",
    num_workers: int | str = "auto",
    prefetch_factor: int | str | None = "auto",
    time_budget: str | float = "60s",
    cache_dir: str | os.PathLike[str] | None = None,
    storage_options: Mapping[str, Any] | None = None,
    loader_kwargs: Mapping[str, Any] | None = None,
    seed: int = 0,
    json: str | os.PathLike[str] | None = None,
    report: str | os.PathLike[str] | None = None,
    on_stage: Callable[[Stage], None] | None = None,
) -> DoctorReport:
    """Measure every stage of the input pipeline and say which one limits training.

    Args:
        path: a packed dataset (folder or URL), or WebDataset tars.
        source: the raw folder the dataset was packed from (measures small-file reads).
        target_rate: samples/s one rank's training step consumes.
        step_time: seconds per training step instead (demand = ``batch_size / step_time``).
        world_size: ranks, for the sampler balance (default: torch.distributed /
            ``WORLD_SIZE``, else 1).
        batch_size: the per-rank batch size training uses.
        image_size: the output size training uses; ``"auto"``: 224 when the dataset has
            images, else None.
        decode: ``"cpu"``, ``"dali"`` or None (raw bytes), as given to ``loader()``.
        num_workers, prefetch_factor: the loader setting; ``"auto"`` is what ``loader()``
            would use (a ``fastfeed tune`` result, else its heuristic).
        time_budget: total measuring time, e.g. ``"60s"``.
        cache_dir, storage_options: as for ``loader()`` (remote data).
        loader_kwargs: further ``loader()`` arguments training uses (``transform``,
            ``augment``, ``decode_backend``, ...); the decode probes use them too.
        seed: shuffle and crop seed.
        json: also write the report as JSON to this file.
        report: also write a self-contained HTML report to this file.
        on_stage: called with every stage as it is measured (progress).

    Returns:
        A :class:`DoctorReport`; ``report.bottleneck`` names the main finding.

    Example:
        >>> r = doctor("/data/imagenet-ff", batch_size=256, image_size=224, step_time=0.3)  # doctest: +SKIP
        >>> r.bottleneck, r.headroom                                                        # doctest: +SKIP
        ('decode', 0.74)
    """
    start = time.monotonic()
    demand = _check(batch_size, target_rate, step_time)
    budget = parse_duration(time_budget, "time_budget")
    if budget <= 0:
        raise ConfigError(f"time_budget={time_budget!r} must be positive")
    if decode not in ("cpu", "dali", None):
        raise ConfigError(f"decode={decode!r}; use 'cpu', 'dali' or None")
    world = world_size if world_size is not None else resolve_world()[1]
    if world < 1:
        raise ConfigError(f"world_size={world} must be >= 1")
    if source is not None and (is_url(str(source)) or not os.path.isdir(source)):
        raise ConfigError(f"--source {source}: not a local folder; give the folder the dataset was packed from")
    path_s = str(path)
    kwargs = dict(loader_kwargs or {})
    kwargs.update(cache_dir=cache_dir, storage_options=storage_options, rank=0, world_size=1)
    index = _load_index(path_s, cache_dir, storage_options)
    from fastfeed.decode.cpu import normalize_image_size
    from fastfeed.tune import resolve_auto
    from fastfeed.tune_space import Setting

    has_images = _has_images(index)
    size = normalize_image_size((224 if has_images else None) if image_size == "auto" else image_size)
    cores, ranks = cpu_count(), local_world_size()
    cores_per_rank = max(1, cores // ranks)
    workers, pf, workers_from = resolve_auto(index, batch_size=batch_size, decode=decode, image_size=size,
                                             num_workers=num_workers, prefetch_factor=prefetch_factor)
    setting = Setting(workers, pf)
    dali_skip = _dali_skip_reason(index, decode, has_images)
    plan = ["storage", "loader"] + (["source"] if source is not None else [])
    plan += ["decode_core", "decode_all"] if decode == "cpu" else []
    plan += ["loader_step"] if demand else []
    plan += ["dali"] if dali_skip is None else []
    secs = _Budget(budget, plan)
    stages: dict[str, Stage] = {}

    def done(stage: Stage) -> None:
        stages[stage.key] = stage
        log.info("doctor: %s: %s", stage.name, stage.skipped or stage.detail)
        if on_stage is not None:
            on_stage(stage)

    done(storage_probe(index, seconds=secs["storage"], local_ranks=ranks, storage_options=storage_options))
    if source is not None:
        done(source_probe(source, seconds=secs["source"], num_samples=index.num_samples, local_ranks=ranks,
                          seed=seed))
    samples, ids = read_samples(index, cache_dir=cache_dir, storage_options=storage_options)
    images = image_stats(samples, kwargs.get("image_field")) if has_images else None
    if decode == "cpu":
        _decode_stages(done, index, samples, ids, size, seed, kwargs, cores_per_rank, ranks, batch_size, secs)
    else:
        why = "decode=None: raw bytes" if decode is None else "decode='dali': measured by the loader stage"
        done(Stage("decode_core", "decode + augment (1 core)", None, "", {}, skipped=why))
    m, profile = _loader_run(path_s, setting, batch_size=batch_size, decode=decode, image_size=size,
                             seconds=secs["loader"] / 1.5, loader_kwargs=kwargs, step_time=None)
    done(Stage("loader", f"loader ({setting.label})", m.samples_per_s, _loader_detail(m, profile, setting),
               {"setting": setting.loader_kwargs(), "workers_from": workers_from, "profile": profile.to_json(),
                "measurement": m.to_json()}, measurement=m))
    if demand:
        step = step_time if step_time is not None else batch_size / demand
        ms, ps = _loader_run(path_s, setting, batch_size=batch_size, decode=decode, image_size=size,
                             seconds=secs["loader_step"] / 1.5, loader_kwargs=kwargs, step_time=step)
        done(Stage("loader_step", f"loader + {step:.3g} s step", ms.samples_per_s,
                   f"waited {ps.wait_fraction:.0%} of step time (loader.stats, training step simulated by "
                   f"sleeping)", {"wait_fraction": ps.wait_fraction, "step_time": step,
                                  "profile": ps.to_json(), "measurement": ms.to_json()}, measurement=ms))
    _dali_stage(done, path_s, dali_skip, batch_size, size, secs, kwargs)
    balance = _balance_stage(done, index, world, batch_size, seed)
    facts = Facts(path=path_s, batch_size=batch_size, image_size=size, decode=decode, num_workers=workers,
                  prefetch_factor=pf, workers_from=workers_from, cores_per_rank=cores_per_rank, local_ranks=ranks,
                  remote=is_url(index.shard_path(0)) if index.shards else False,
                  cache_dir=None if cache_dir is None else str(cache_dir),
                  fits_in_memory=sum(s.bytes for s in index.shards) <= memory_total() / 2, demand=demand,
                  step_time=step_time, stages=stages, profile=profile, images=images, balance=balance,
                  dali_skipped=dali_skip)
    findings, limiting, deliverable, input_bound, headroom = conclude(facts)
    result = _report(facts, index, findings, limiting, deliverable, input_bound, headroom, world, setting,
                     time.monotonic() - start, target_rate, step_time)
    if json is not None:
        with open(json, "w", encoding="utf-8") as f:
            json_module.dump(result.to_json(), f, indent=1)
    if report is not None:
        result.write_html(report)
    return result


def _decode_stages(done: Callable[[Stage], None], index: DatasetIndex, samples: list[dict[str, Any]],
                   ids: Any, size: Any, seed: int, kwargs: Mapping[str, Any], cores: int, ranks: int,
                   batch_size: int, secs: _Budget) -> None:
    decoder = _decoder("cpu", size, seed, kwargs)
    labels = index.labels[ids] if index.labels is not None and len(ids) else None
    batch = min(batch_size, PROBE_BATCH)
    one = decode_probe(decoder, samples, labels, processes=1, batch=batch, seconds=secs["decode_core"])
    done(Stage("decode_core", "decode + augment (1 core)", one.samples_per_s,
               f"{one.samples_per_s:,.0f} samples/s in one process, from memory, {len(samples)} samples "
               f"cycled", {"measurement": one.to_json()}, measurement=one))
    if cores * ranks < 2:
        done(Stage("decode_all", "decode + augment (all cores)", one.samples_per_s,
                   "1 core: the same as above", {"processes": 1}, measurement=one))
        return
    procs = cores * ranks
    m = decode_probe(decoder, samples, labels, processes=procs, batch=batch, seconds=secs["decode_all"])
    detail = f"{procs} processes, {m.samples_per_s / max(1e-9, one.samples_per_s):.1f}x one core"
    if ranks > 1:
        detail += f", shared by {ranks} ranks"
    done(Stage("decode_all", f"decode + augment ({procs} cores)", m.samples_per_s / ranks, detail,
               {"processes": procs, "measurement": m.to_json()}, measurement=m))


def _dali_stage(done: Callable[[Stage], None], path: str, skip: str | None, batch_size: int, size: Any,
                secs: _Budget | Any, kwargs: Mapping[str, Any]) -> None:
    if skip is not None:
        done(Stage("dali", "GPU decode (DALI)", None, "", {}, skipped=skip))
        return
    from fastfeed.tune import measure_loader
    from fastfeed.tune_space import Setting

    dali_kwargs = {k: v for k, v in kwargs.items() if k not in ("transform", "decode_backend")}
    try:
        m = measure_loader(path, Setting(0, None), batch_size=batch_size, decode="dali", image_size=size,
                           seconds=secs["dali"] / 1.5, loader_kwargs=dali_kwargs)
    except FastfeedError as e:
        done(Stage("dali", "GPU decode (DALI)", None, "", {}, skipped=str(e)))
        return
    done(Stage("dali", "GPU decode (DALI)", m.samples_per_s, f"loader(decode='dali'), start-up {m.startup_s:.1f} s",
               {"measurement": m.to_json()}, measurement=m))


def _balance_stage(done: Callable[[Stage], None], index: DatasetIndex, world: int, batch_size: int,
                   seed: int) -> Any:
    lengths = index.lengths
    if lengths is None:
        done(Stage("balance", "length balance", None, "", {}, skipped="no lengths in the index "
                                                                       "(`fastfeed pack --length FIELD`)"))
        return None
    from fastfeed.balance import balance_report

    r = balance_report(lengths, world_size=world, batch_size=batch_size, seed=seed)
    ff, base = r.rows[0], r.rows[1]
    detail = (f"world size {world}: padding efficiency {base.padding_efficiency:.2f} -> {ff.padding_efficiency:.2f}, "
              f"straggler ratio {base.straggler_ratio:.2f} -> {ff.straggler_ratio:.2f} "
              f"(DistributedSampler -> length buckets)")
    done(Stage("balance", "length balance", None, detail, r.to_json()))
    return r


def _report(f: Facts, index: DatasetIndex, findings: tuple[Finding, ...], limiting: str, deliverable: float,
            input_bound: bool | None, headroom: float | None, world: int, setting: Any, elapsed: float,
            target_rate: float | None, step_time: float | None) -> DoctorReport:
    demand_from = (f"batch {f.batch_size} every {step_time:g} s" if step_time is not None
                   else "the target rate" if target_rate is not None else "")
    dataset = {"num_samples": index.num_samples, "num_shards": len(index.shards), "format": index.format,
               "bytes": sum(s.bytes for s in index.shards), "fields": list(index.fields), "remote": f.remote,
               "lengths": index.lengths is not None, "fits_in_memory": f.fits_in_memory}
    host = {"cores": cpu_count(), "local_ranks": f.local_ranks, "cores_per_rank": f.cores_per_rank,
            "memory_gib": memory_total() / 2**30, "world_size": world}
    settings = {"batch_size": f.batch_size, "image_size": list(f.image_size) if f.image_size else None,
                "decode": f.decode, "setting": setting.label, "num_workers": f.num_workers,
                "prefetch_factor": f.prefetch_factor, "workers_from": f.workers_from, "cache_dir": f.cache_dir}
    order = ["storage", "source", "decode_core", "decode_all", "dali", "loader", "loader_step", "balance"]
    stages = tuple(f.stages[k] for k in order if k in f.stages)
    return DoctorReport(f.path, dataset, host, settings, f.demand, demand_from, deliverable, limiting,
                        input_bound, headroom, findings, stages, elapsed)
