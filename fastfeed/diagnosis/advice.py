"""The step monitor's verdict and fix, from an :class:`~fastfeed.diagnosis.attribution.Attribution`.

The verdict follows the diagnosis path an expert takes, each with its own figure (the share
of step time it costs the job):

=======================  =================================================================
``input-bound``          the slowest rank of each step waited for data: :attr:`critical_data`
                         over :data:`LOSS`. The loader's own stage times name the stage
                         (storage, decode, workers, transfer; :mod:`fastfeed.loading.bottleneck`,
                         the doctor's classification); a bursty wait (median far below the
                         mean) is told from a steady one
``imbalanced``           ranks wait for the slowest (:data:`LOSS`), their compute differs
                         (max over mean over :data:`IMBALANCE`), and the slowest rank changes
``straggler``            the same, but one rank is the slowest most of the time
                         (:func:`~fastfeed.diagnosis.attribution.stable_share`)
``communication-bound``  collective time that compute does not hide, over :data:`LOSS`
``compute-bound``        none of the above
=======================  =================================================================

When several reach their threshold the largest loss wins. Scheduling signals come on top:
periodic long steps (checkpoints, evaluation), more worker processes than cores, low host
memory.

Example:
    >>> import numpy as np
    >>> from fastfeed.diagnosis.attribution import StepTimes, attribute
    >>> ones = np.ones((4, 20))
    >>> slow_data = StepTimes(data=0.3 * ones, work=0.1 * ones, blocked=0.01 * ones, other=0 * ones)
    >>> decide(attribute(slow_data), RunFacts(world_size=4, watched=True)).name
    'input-bound'
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from fastfeed._util import format_bytes
from fastfeed.diagnosis.attribution import Attribution
from fastfeed.diagnosis.vocabulary import pct, stage_label
from fastfeed.loading.bottleneck import LoadProfile, diagnose

__all__ = ["LOSS", "IMBALANCE", "LoaderFacts", "RunFacts", "Verdict", "decide"]

#: A cause that costs this share of step time (or more) is a verdict.
LOSS = 0.10
#: Ranks' compute counts as different when the slowest's is this much over the mean's.
IMBALANCE = 1.10
#: A bursty data wait: the median step waits less than this share of the mean wait.
BURSTY = 0.5
#: Host memory under this share available is pressure.
LOW_MEMORY = 0.10
#: Gradient bytes per step under which no bus bandwidth is reported (the time is latency).
MIN_BUS_BYTES = 1e6


@dataclass(frozen=True)
class LoaderFacts:
    """What one rank knows about its loader (a fastfeed loader reports its stage times).

    Attributes:
        kind: ``"fastfeed"``, ``"dataloader"`` (a torch DataLoader) or ``"iterable"``.
        num_workers, prefetch_factor: the loader's settings, when it has them.
        path: the dataset (a fastfeed loader's index root).
        read_s, decode_s, cpu_s, batches, step_s: the workers' seconds over the steps measured
            (:class:`~fastfeed.loading.stats.LoaderStats`), as :class:`LoadProfile` takes them.
    """

    kind: str = "iterable"
    num_workers: int | None = None
    prefetch_factor: int | None = None
    path: str | None = None
    read_s: float = 0.0
    decode_s: float = 0.0
    cpu_s: float = 0.0
    batches: int = 0
    step_s: float = 0.0

    def profile(self, wait_fraction: float) -> LoadProfile | None:
        """The loader's timings as the doctor classifies them (None: no stage times)."""
        if self.kind != "fastfeed" or self.num_workers is None:
            return None
        return LoadProfile(wait_fraction, self.step_s, self.read_s, self.decode_s, self.cpu_s, self.batches,
                           self.num_workers)

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "num_workers": self.num_workers, "prefetch_factor": self.prefetch_factor,
                "path": self.path, "read_s": self.read_s, "decode_s": self.decode_s, "cpu_s": self.cpu_s,
                "batches": self.batches, "step_s": self.step_s}


@dataclass(frozen=True)
class RunFacts:
    """What the verdict needs besides the times.

    Attributes:
        world_size: the ranks.
        hosts: each rank's host name.
        watched: collectives were timed (``mon.watch(model)`` or ``mon.collective()``).
        loaders: each rank's :class:`LoaderFacts`.
        cores: usable cores of each rank's host; local_ranks: ranks on each rank's host.
        memory_available: the lowest share of host memory available that any rank saw.
        samples_per_step: samples per step and rank (None: not counted).
        collective_bytes: gradient bytes per step with collectives (0: not timed).
        slowest_by_window: the slowest rank of each window, in order.
    """

    world_size: int = 1
    hosts: tuple[str, ...] = ()
    watched: bool = False
    loaders: tuple[LoaderFacts, ...] = ()
    cores: tuple[int, ...] = ()
    local_ranks: tuple[int, ...] = ()
    memory_available: float | None = None
    samples_per_step: float | None = None
    collective_bytes: float = 0.0
    slowest_by_window: tuple[int, ...] = ()

    def host(self, rank: int) -> str:
        return self.hosts[rank] if rank < len(self.hosts) else "?"

    def loader(self, rank: int) -> LoaderFacts:
        return self.loaders[rank] if rank < len(self.loaders) else LoaderFacts()


@dataclass(frozen=True)
class Verdict:
    """The verdict, its figures and the fix.

    Attributes:
        name: one of :data:`~fastfeed.diagnosis.vocabulary.VERDICTS`.
        title: the verdict in one line, with its figure.
        why: the figures behind it.
        fix: the concrete action, with the figure that justifies it.
        stage: the limiting input stage (input-bound with a fastfeed loader), else None.
        headroom: how much faster the input could deliver (compute-bound, fastfeed loader), else None.
        bus_gb_s: achieved bus bandwidth of the gradient collectives (GB/s), when timed.
        signals: scheduling signals, each one line.
    """

    name: str
    title: str
    why: str
    fix: str
    stage: str | None = None
    headroom: float | None = None
    bus_gb_s: float | None = None
    signals: tuple[str, ...] = ()


def bus_bandwidth(a: Attribution, f: RunFacts) -> float | None:
    """GB/s of the gradient all-reduce as nccl-tests reports it: 2(n-1)/n x bytes / time.

    None below :data:`MIN_BUS_BYTES` per step, where latency, not bandwidth, sets the time.
    """
    if f.world_size < 2 or f.collective_bytes < MIN_BUS_BYTES or a.span_units == 0 or a.span_s <= 0:
        return None
    per_step = a.span_s / a.span_units
    return 2 * (f.world_size - 1) / f.world_size * f.collective_bytes / per_step / 1e9


def _ms(s: float) -> str:
    return f"{s * 1e3:,.1f} ms" if s < 10 else f"{s:,.1f} s"


def _rank(f: RunFacts, r: int) -> str:
    return f"rank {r} (host {f.host(r)})" if f.hosts else f"rank {r}"


def _tune(f: RunFacts, a: Attribution, rank: int, dali: bool = False) -> str:
    ld = f.loader(rank)
    path = ld.path or "DATASET"
    batch = f" --batch-size {f.samples_per_step:.0f}" if f.samples_per_step else ""
    step = a.step_s * (a.shares["compute"] + a.shares["collective"] + a.shares["other"])
    return f"`fastfeed tune {path}{batch}{' --decode dali' if dali else ''} --step-time {step:.3g}`"


def _stage(a: Attribution, f: RunFacts, rank: int) -> tuple[str | None, str]:
    """(stage kind or None, the stage in words with its figures) of ``rank``'s loader."""
    ld = f.loader(rank)
    p = ld.profile(max(a.share_of(rank, "data"), 0.05))
    if p is None or p.batches == 0:
        if ld.kind == "fastfeed":  # DALI: no worker timings
            return "input-bound", "the loader (GPU decode reports no stage times)"
        what = "a torch DataLoader" if ld.kind == "dataloader" else "an iterable"
        workers = f" with num_workers={ld.num_workers}" if ld.num_workers is not None else ""
        return None, f"{what}{workers} (no stage times: `fastfeed doctor` names the stage of a packed dataset)"
    kind = diagnose(p).kind
    if kind == "not-input-bound":
        kind = "transfer"  # the loop waits although the workers keep up
    who = "the training process" if p.num_workers == 0 else f"{p.num_workers} worker(s)"
    return kind, (f"{stage_label(kind, p.num_workers)}: {who} busy {p.busy:.0%} of the time, {p.read_share:.0%} "
                  f"of it reading, {1 - p.read_share:.0%} decoding")


def _input_fix(kind: str | None, a: Attribution, f: RunFacts, rank: int) -> str:
    ld = f.loader(rank)
    if kind is None:
        pack = (f"over many small files, pack them into shards (`fastfeed pack SRC DST`), load them with "
                f"fastfeed.loader(DST, ...) and let {_tune(f, a, rank).replace('DATASET', 'DST')} pick the workers; "
                "`fastfeed doctor DST` measures each stage on its own")
        if ld.kind == "iterable":
            return ("prepare batches during the step, in worker processes: a DataLoader with num_workers=N over "
                    "the data; " + pack)
        if ld.num_workers == 0:
            return "set num_workers (DataLoader(..., num_workers=4)) so loading overlaps the step; " + pack
        return pack
    if kind == "storage":
        return ("the workers wait on storage: pass cache_dir= to fastfeed.loader() for remote shards (a local cache "
                "per host), copy the shards to local NVMe, or re-pack with larger shards (`fastfeed pack ... "
                f"--shard-size 256MB`); `fastfeed doctor {ld.path or 'DATASET'}` measures the storage on its own")
    if kind == "decode":
        return (f"decode on the GPU: fastfeed.loader(..., decode='dali'); or store pixels, which crop without "
                f"decoding: `fastfeed pack SRC DST --store raw`; or more workers where cores are free: "
                f"{_tune(f, a, rank)}")
    if kind == "workers":
        if ld.num_workers == 0:
            return (f"set num_workers so loading overlaps the step: {_tune(f, a, rank)} measures the setting, which "
                    "loader(num_workers='auto') then uses")
        return f"raise num_workers: {_tune(f, a, rank)} measures the best setting (then num_workers='auto')"
    if kind == "input-bound":
        return f"tune the DALI pipeline (its threads and queue depth): {_tune(f, a, rank, dali=True)}"
    return ("batches are held up between the workers and the loop: raise prefetch_factor "
            "(workers=fastfeed.Workers(prefetch_factor=4)), leave a core to the training process, and keep the "
            "loop's per-batch work small")


def _input_bound(a: Attribution, f: RunFacts) -> Verdict:
    k = a.slowest_rank
    kind, stage = _stage(a, f, k)
    others = [a.share_of(r, "data") for r in range(a.ranks) if r != k]
    own, rest = a.share_of(k, "data"), (sum(others) / len(others) if others else 0.0)
    one_rank = a.ranks > 1 and a.stable and own > 2 * rest + LOSS / 2
    bursty = a.data_p50_s < BURSTY * a.data_mean_s
    pattern = (f"the wait comes in bursts (median {_ms(a.data_p50_s)}, mean {_ms(a.data_mean_s)} per step)" if bursty
               else f"the wait is steady (median {_ms(a.data_p50_s)}, mean {_ms(a.data_mean_s)} per step)")
    if one_rank:
        title = (f"input-bound on {_rank(f, k)}: its loader waits {pct(own)} of step time, the other ranks' "
                 f"{pct(rest)}; they wait for it {pct(a.shares['wait'])} of step time")
        fix = (f"{_rank(f, k)} reads the same data with the same code more slowly: look at that host (its storage "
               "or cache_dir, other jobs on its cores, its CPU clocks); then: " + _input_fix(kind, a, f, k))
    else:
        title = f"input-bound: the slowest rank of each step waited {pct(a.critical_data)} of step time for data"
        fix = _input_fix(kind, a, f, k)
    if bursty and kind not in ("workers",):
        fix = ("the loader keeps up on average but delivers in bursts: raise prefetch_factor "
               "(workers=fastfeed.Workers(prefetch_factor=4); a DataLoader's prefetch_factor=4); if that does not "
               "help: " + fix)
    why = f"limited by {stage}; {pattern}"
    return Verdict("input-bound", title, why, fix, stage=kind)


def _ranks_wait(a: Attribution, f: RunFacts) -> Verdict:
    k = a.slowest_rank
    wait = a.shares["wait"]
    if a.stable:
        same = sum(1 for r in f.slowest_by_window if r == k)
        windows = (f", and in {same} of {len(f.slowest_by_window)} windows" if len(f.slowest_by_window) > 1 else "")
        title = (f"straggler: {_rank(f, k)} is the slowest in {a.slowest_share:.0%} of steps{windows}; the other "
                 f"ranks wait {pct(wait)} of step time for it")
        why = (f"the slowest rank's compute is {a.imbalance:.2f}x the mean rank's per step, and it is the same rank: "
               "with the same code and batch shapes, its host or GPU is slower")
        fix = (f"look at {_rank(f, k)}: GPU clocks, temperature and throttle reasons (`nvidia-smi -q -d "
               "CLOCK,TEMPERATURE,PERFORMANCE`), other processes on its GPU or cores, its CPU frequency; drain or "
               f"replace the node if it stays slow (without the wait: ~{a.gain:.2f}x steps/s)")
        return Verdict("straggler", title, why, fix)
    title = (f"imbalanced: ranks wait {pct(wait)} of step time for the slowest, and the slowest rank changes "
             f"(the most frequent, rank {k}, in {pct(a.slowest_share)} of steps)")
    why = (f"the slowest rank's compute is {a.imbalance:.2f}x the mean rank's per step: the work per batch varies "
           "(sequence lengths, image shapes), so every step waits for whichever rank drew the costliest batch")
    fix = ("balance the cost per step: batch_sampler=fastfeed.DistributedTokenBudgetSampler(lengths, max_cost=..., "
           "cost=fastfeed.calibrate(step, lengths, max_tokens=...)) (a cost model fitted on your step; "
           "fastfeed.fit_cost_model fits one from measured (lengths, seconds)); predicted gain from the steps seen: "
           f"~{a.gain:.2f}x steps/s if every rank's work per step were the mean")
    return Verdict("imbalanced", title, why, fix)


def _communication(a: Attribution, f: RunFacts) -> Verdict:
    bw = bus_bandwidth(a, f)
    title = (f"communication-bound: gradient collectives that compute does not hide take "
             f"{pct(a.shares['collective'])} of step time")
    why = f"{format_bytes(f.collective_bytes)} of gradients per step over {f.world_size} ranks"
    if bw is not None:
        why += (f"; achieved bus bandwidth {bw:,.3g} GB/s (2(n-1)/n x bytes / time, as nccl-tests computes it): "
                "compare it with the link's and with nccl-tests' all_reduce_perf on these hosts")
    fix = ("overlap and batch the collectives: larger buckets (DDP(model, bucket_cap_mb=100)); gradient "
           "accumulation (model.no_sync() for k-1 of k batches) to all-reduce once per k batches; check the "
           "transport with NCCL_DEBUG=INFO (NET/Socket where InfiniBand or NVLink was expected)")
    if f.collective_bytes < MIN_BUS_BYTES:  # latency or a host short of CPU for the communication threads
        why += "; at this size the time is latency, or a host too busy to run the communication threads"
        fix = ("fewer collectives: gradient accumulation (model.no_sync() for k-1 of k batches) all-reduces once "
               "per k batches; leave cores to the communication threads (fewer loader workers per rank); check "
               "the backend and transport (NCCL on GPUs; NCCL_DEBUG=INFO)")
    return Verdict("communication-bound", title, why, fix, bus_gb_s=bw)


def _compute(a: Attribution, f: RunFacts) -> Verdict:
    title = f"compute-bound: {pct(a.shares['compute'])} of step time is compute"
    k = a.slowest_rank
    p = f.loader(k).profile(a.share_of(k, "data"))
    headroom = None
    why = f"data wait {a.shares['data']:.1%}, wait for the slowest rank {a.shares['wait']:.1%}, collectives " \
          f"{a.shares['collective']:.1%} of step time"
    if p is not None and p.batches and p.busy > 0:
        headroom = 1.0 / p.busy
        why += (f"; the input pipeline's {max(1, p.num_workers)} worker(s) are busy {p.busy:.0%} of the time: the "
                f"data could come ~{headroom:.1f}x faster")
    fix = "nothing to fix in the input pipeline or between ranks: speed up the step itself (mixed precision, " \
          "torch.compile, fused optimizers, larger batches)"
    if headroom is not None and headroom > 2 and (p.num_workers or 0) > 1:
        fix += f"; {_tune(f, a, k)} finds the fewest workers that keep up, leaving cores to training"
    return Verdict("compute-bound", title, why, fix, headroom=headroom)


def signals(a: Attribution, f: RunFacts) -> tuple[str, ...]:
    """Scheduling signals: periodic long steps, more processes than cores, low host memory."""
    out = []
    if a.long_steps is not None and a.long_steps["share"] >= 0.02:
        ls = a.long_steps
        out.append(f"periodic long steps: every {ls['every']:.0f} steps one takes {_ms(ls['extra_s'])} longer "
                   f"({ls['count']:.0f} times, {ls['share']:.0%} of the time): checkpointing or evaluation on a "
                   "schedule? Make it asynchronous or less frequent")
    for r in range(min(len(f.cores), len(f.local_ranks))):
        workers = f.loader(r).num_workers or 0
        procs = (workers + 1) * f.local_ranks[r]
        if procs > f.cores[r]:
            out.append(f"CPU oversubscription on host {f.host(r)}: {f.local_ranks[r]} rank(s) x ({workers} workers "
                       f"+ 1) = {procs} busy processes for {f.cores[r]} cores: fewer workers per rank "
                       "(`fastfeed tune` measures) or more cores")
            break
    if f.memory_available is not None and f.memory_available < LOW_MEMORY:
        out.append(f"host memory pressure: {f.memory_available:.0%} of memory available at the lowest: fewer workers "
                   "or a smaller prefetch_factor, or the page cache cannot hold the shards")
    return tuple(out)


def decide(a: Attribution, f: RunFacts) -> Verdict:
    """The verdict of ``a`` (see the module docstring), with its signals."""
    candidates: list[tuple[float, int, Any]] = []
    if a.critical_data >= LOSS:
        candidates.append((a.critical_data, 0, _input_bound))
    if a.ranks > 1 and a.shares["wait"] >= LOSS and a.imbalance >= IMBALANCE:
        candidates.append((a.shares["wait"], 1, _ranks_wait))
    if a.shares["collective"] >= LOSS:
        candidates.append((a.shares["collective"], 2, _communication))
    pick = min(candidates, key=lambda c: (-c[0], c[1]))[2] if candidates else _compute
    v = pick(a, f)
    bw = v.bus_gb_s if v.bus_gb_s is not None else bus_bandwidth(a, f)
    return replace(v, bus_gb_s=None if bw is None or math.isnan(bw) else bw, signals=signals(a, f))
