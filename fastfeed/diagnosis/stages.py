"""The stages of ``fastfeed doctor`` that run fastfeed's own parts: decoder, loader, DALI, samplers.

Each function measures one stage and hands a :class:`~fastfeed.diagnosis.report.Stage` to
``run.emit``. The loader is measured by :func:`fastfeed.tuning.api.measure_loader`, the exact
function ``fastfeed tune`` and ``benchmarks/`` use; its workers' read and decode times
come from the loader's own ``stats`` (after warm-up), so the doctor and the periodic stats
line classify the same figures the same way (:mod:`fastfeed.loading.bottleneck`).

Example:
    >>> run = Run(path, Setting(4, 2), options=measured_options(batch_size=256, decode="cpu", image_size=224),
    ...           budget=Budget(60, ["loader"]), emit=print)                           # doctest: +SKIP
    >>> measurement, profile = loader_stage(run, workers_from="tuned")                     # doctest: +SKIP
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from fastfeed.diagnosis.probes import decode_probe
from fastfeed.diagnosis.report import Stage
from fastfeed.errors import FastfeedError
from fastfeed.loading.bottleneck import LoadProfile
from fastfeed.loading.cpu.loader import decoder_for
from fastfeed.loading.dali.backend import DALI_INSTALL, dali_available
from fastfeed.loading.options import LoaderOptions
from fastfeed.knobs.space import Setting
from fastfeed.packed.index import DatasetIndex
from fastfeed.sampling.balance import balance_report
from fastfeed.timing.measure import Measurement
from fastfeed.tuning.api import measure_loader, measured_options

__all__ = ["Budget", "Run", "balance_stage", "dali_skip_reason", "dali_stage", "decode_stages", "loader_stage",
           "step_stage"]

#: Shares of the time budget per stage (normalised over the stages that run).
WEIGHTS = {"storage": 1.0, "source": 1.0, "decode_core": 1.0, "decode_all": 1.0, "loader": 2.5,
           "loader_step": 1.5, "dali": 1.5}
#: Samples per batch in the decode probes: the per-sample cost barely depends on it, and
#: small batches give many timed batches even for large images.
PROBE_BATCH = 4
class Budget:
    """Seconds per stage: ``total`` split by :data:`WEIGHTS` over the stages that run (>= 0.5 s each)."""

    def __init__(self, total: float, stages: list[str]) -> None:
        unit = total / sum(WEIGHTS[s] for s in stages)
        self.total = total
        self.seconds = {s: max(0.5, WEIGHTS[s] * unit) for s in stages}

    def __getitem__(self, stage: str) -> float:
        return self.seconds[stage]


@dataclass(frozen=True)
class Run:
    """What every stage needs: the dataset, the loader setting and shape, the budget, the sink."""

    path: str
    setting: Any  # fastfeed.knobs.space.Setting
    options: LoaderOptions  # training's loader options (tuning.api.measured_options)
    budget: Budget
    emit: Callable[[Stage], None]
    dali: Any = None  # the DALI stage's options (a fastfeed.Dali or a dict of them); None: training's

    @property
    def batch_size(self) -> int:
        return self.options.batch_size

    @property
    def decode(self) -> str | None:
        return self.options.decode

    @property
    def image_size(self) -> tuple[int, int] | None:
        return self.options.image_size

    @property
    def seed(self) -> int:
        return self.options.seed


# ---------------------------------------------------------------------- decode
def decode_stages(run: Run, index: DatasetIndex, samples: list[dict[str, Any]], ids: np.ndarray,
                  cores_per_rank: int, local_ranks: int) -> None:
    """Decode + augmentation ceilings: one process, then one process per core of the host."""

    decoder = decoder_for(run.options)
    labels = index.labels[ids] if index.labels is not None and len(ids) else None
    batch = min(run.batch_size, PROBE_BATCH)
    one, per_cpu = decode_probe(decoder, samples, labels, processes=1, batch=batch,
                                seconds=run.budget["decode_core"])
    run.emit(Stage("decode_core", "decode + augment (1 core)", one.samples_per_s,
                   f"one process, from memory ({len(samples)} samples cycled); {per_cpu:,.0f} per CPU-second",
                   {"per_cpu_second": per_cpu, "measurement": one.to_json()}, measurement=one))
    procs = cores_per_rank * local_ranks
    if procs < 2:
        run.emit(Stage("decode_all", "decode + augment (all cores)", one.samples_per_s,
                       "1 core: the same as above", {"processes": 1, "per_cpu_second": per_cpu}, measurement=one))
        return
    m, per_cpu_all = decode_probe(decoder, samples, labels, processes=procs, batch=batch,
                                  seconds=run.budget["decode_all"])
    detail = (f"{procs} processes, {m.samples_per_s / max(1e-9, one.samples_per_s):.1f}x one core; "
              f"{per_cpu_all:,.0f} per CPU-second")
    if local_ranks > 1:
        detail += f"; shared by {local_ranks} ranks"
    run.emit(Stage("decode_all", f"decode + augment ({procs} cores)", m.samples_per_s / local_ranks, detail,
                   {"processes": procs, "per_cpu_second": per_cpu_all, "measurement": m.to_json()},
                   measurement=m))


# ---------------------------------------------------------------------- the loader
def loader_run(run: Run, *, seconds: float, step_time: float | None = None
               ) -> tuple[Measurement, LoadProfile, float | None]:
    """Measure the loader through tune's ``measure_loader``; its workers' profile after warm-up.

    With ``step_time`` every batch is followed by that much sleep: the training step,
    simulated, so ``loader.stats`` shows the wait fraction training would see.

    Returns:
        The measurement, the workers' profile, and the CPU share of the training process
        itself while batches arrived (receiving them: unpickling, the pin-memory thread).
    """

    held: dict[str, Any] = {}
    seen = [0]
    warm = max(1, run.setting.num_workers * (run.setting.prefetch_factor or 0)) + 1

    def on_loader(dl: Any) -> None:
        held["dl"] = dl

    def consume(batch: Any) -> None:
        seen[0] += 1
        held["end"] = (time.perf_counter(), time.process_time())
        if seen[0] == warm:  # the prefetch queue has been drained once: steady from here
            held["before"] = held["dl"].stats.summary()
            held["start"] = held["end"]
        if step_time:
            time.sleep(step_time)

    m = measure_loader(run.path, run.setting, options=run.options, seconds=seconds, min_batches=4 if step_time else 8,
                       consume=consume, on_loader=on_loader)
    after = held["dl"].stats.summary()
    profile = LoadProfile.between(held.get("before", {}), after, run.setting.num_workers)
    if profile.batches < 2:  # too slow for steady batches after warm-up: take every timed batch
        profile = LoadProfile.between({}, after, run.setting.num_workers)
    main_cpu = None
    if "start" in held and held["end"][0] > held["start"][0]:
        main_cpu = (held["end"][1] - held["start"][1]) / (held["end"][0] - held["start"][0])
    return m, profile, main_cpu


def loader_stage(run: Run, *, workers_from: str) -> tuple[Measurement, LoadProfile]:
    """The loader at its setting, as fast as it goes (the loop does nothing but wait)."""
    seconds = run.budget["loader"] / 1.5
    m, p, main_cpu = loader_run(run, seconds=seconds)
    parts = [f"p10-p90 {m.p10_samples_per_s:,.0f}-{m.p90_samples_per_s:,.0f}", f"start-up {m.startup_s:.1f} s"]
    if p.batches:
        who = "main process" if run.setting.num_workers == 0 else "workers"
        parts.insert(0, f"{who} busy {p.busy:.0%} ({p.read_share:.0%} reading, {1 - p.read_share:.0%} "
                        f"decoding, {p.cpu_share:.0%} CPU)")
    run.emit(Stage("loader", f"loader ({run.setting.label})", m.samples_per_s, ", ".join(parts),
                   {"setting": run.setting.loader_kwargs(), "workers_from": workers_from, "seconds": seconds,
                    "main_cpu_share": main_cpu, "profile": p.to_json(), "measurement": m.to_json()},
                   measurement=m))
    return m, p


def step_stage(run: Run, *, demand: float, rate: float, step: float) -> None:
    """The loader again with the training step simulated by sleeping: the wait fraction from stats."""
    name = f"loader + {step:.3g} s step"
    if rate < 0.25 * demand:
        run.emit(Stage("loader_step", name, None, "", {"step_time": step}, skipped=(
            f"the loader delivers {rate / demand:.2f}x the demand: training would wait ~{1 - rate / demand:.0%} "
            "of each step")))
        return
    load = run.batch_size / rate if rate > 0 else step
    per_step = step + load if run.setting.num_workers == 0 else max(step, load)
    seconds = max(run.budget["loader_step"] / 1.5, 6 * per_step / 0.6)  # at least ~6 steady steps
    if seconds > run.budget.total:
        run.emit(Stage("loader_step", name, None, "", {"step_time": step}, skipped=(
            f"~{seconds * 1.5:.0f} s needed to time a few {per_step:.2g} s steps; raise --time-budget")))
        return
    m, p, _ = loader_run(run, seconds=seconds, step_time=step)
    if p.batches < 3:
        run.emit(Stage("loader_step", name, None, "", {"step_time": step},
                       skipped="too few batches within the time budget to time the wait; raise --time-budget"))
        return
    # no rate in the table: the loop's pace is set by the simulated step, not by the input
    run.emit(Stage("loader_step", name, None,
                   f"waited {p.wait_fraction:.0%} of step time (loader.stats), the loop ran at "
                   f"{m.samples_per_s:,.0f} samples/s; the step simulated by sleeping",
                   {"wait_fraction": p.wait_fraction, "step_time": step, "samples_per_s": m.samples_per_s,
                    "profile": p.to_json(), "measurement": m.to_json()}, measurement=m))


# ---------------------------------------------------------------------- DALI
def dali_skip_reason(index: DatasetIndex, decode: str | None, has_images: bool) -> str | None:
    """Why GPU decode cannot be measured here, or None when it can."""
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

    if not dali_available():
        return f"DALI is not installed ({DALI_INSTALL})"
    return None


def dali_stage(run: Run, skip: str | None) -> None:
    """``loader(decode="dali")`` at its tuned (or default) knobs, or the reason it was skipped."""
    if skip is not None:
        run.emit(Stage("dali", "GPU decode (DALI)", None, "", {}, skipped=skip))
        return

    o = run.options
    try:  # training's crops, storage and order; what only worker processes do (transform, workers) has no DALI twin
        dali = measured_options(batch_size=o.batch_size, decode="dali", image_size=o.image_size, seed=o.seed,
                                augment=o.augment, cache_dir=o.cache_dir, crop=o.crop,
                                dali=o.dali if run.dali is None else run.dali,
                                storage=o.storage, order=o.order, rank=o.rank, world_size=o.world_size)
        m = measure_loader(run.path, Setting(0, None), options=dali, seconds=run.budget["dali"] / 1.5)
    except FastfeedError as e:
        run.emit(Stage("dali", "GPU decode (DALI)", None, "", {}, skipped=str(e)))
        return
    run.emit(Stage("dali", "GPU decode (DALI)", m.samples_per_s,
                   f"loader(decode='dali'), p10-p90 {m.p10_samples_per_s:,.0f}-{m.p90_samples_per_s:,.0f}, "
                   f"start-up {m.startup_s:.1f} s", {"measurement": m.to_json()}, measurement=m))


# ---------------------------------------------------------------------- samplers
def balance_stage(run: Run, index: DatasetIndex, world_size: int) -> Any:
    """Padding and rank balance of one epoch: length buckets vs DistributedSampler (None without lengths)."""
    lengths = index.lengths
    if lengths is None:
        run.emit(Stage("balance", "length balance", None, "", {},
                       skipped="no lengths in the index (`fastfeed pack --length FIELD`)"))
        return None

    r = balance_report(lengths, world_size=world_size, batch_size=run.batch_size, seed=run.seed)
    ff, base = r.rows[0], r.rows[1]
    detail = (f"world size {world_size}: padding efficiency {base.padding_efficiency:.2f} -> "
              f"{ff.padding_efficiency:.2f}, straggler ratio {base.straggler_ratio:.2f} -> "
              f"{ff.straggler_ratio:.2f} (DistributedSampler -> length buckets)")
    run.emit(Stage("balance", "length balance", None, detail, r.to_json()))
    return r
