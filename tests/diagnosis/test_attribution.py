"""The step monitor's arithmetic and verdicts, over many synthetic runs, without processes.

:func:`lockstep` simulates what ranks that synchronise every step measure: each rank's busy time
(data + compute + other), the slowest rank's busy time ``B``, and every rank blocked in the
gradient all-reduce until ``B`` plus the transfer. Each planted cause must get its verdict and
no other, at every world size and seed; the invariants hold for arbitrary (random) times.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from fastfeed.diagnosis.advice import LOSS, LoaderFacts, RunFacts, bus_bandwidth, decide
from fastfeed.diagnosis.attribution import COLUMNS, StepTimes, attribute, split, stable_share
from fastfeed.diagnosis.exchange import HEADER, pack, unpack
from fastfeed.diagnosis.monitor_report import build_report, timeline
from fastfeed.diagnosis.vocabulary import CATEGORIES, VERDICTS
from fastfeed.errors import ConfigError


def lockstep(world: int, steps: int, *, compute: float | np.ndarray = 0.05, data: float | np.ndarray = 0.001,
             transfer: float = 0.002, other: float = 0.0003, noise: float = 0.01, seed: int = 0,
             watched: bool = True) -> StepTimes:
    """What ``world`` ranks measure over ``steps`` synchronised steps (arrays: ranks x steps, or scalars)."""
    rng = np.random.default_rng(seed)
    shape = (world, steps)
    c = np.broadcast_to(np.asarray(compute, dtype=float), shape) * rng.uniform(1 - noise, 1 + noise, shape)
    d = np.broadcast_to(np.asarray(data, dtype=float), shape) * rng.uniform(0.9, 1.1, shape)
    o = np.full(shape, other)
    busy = d + c + o
    blocked = busy.max(axis=0, keepdims=True) - busy + transfer * rng.uniform(0.9, 1.1, (1, steps))
    span = np.broadcast_to(blocked + c * 0.3, shape)
    if not watched:
        return StepTimes(data=d, work=c + blocked, blocked=0 * c, other=o)
    return StepTimes(data=d, work=c + blocked, blocked=blocked, other=o, span=span)


def facts(world: int, **kw: object) -> RunFacts:
    return RunFacts(world_size=world, hosts=tuple(f"node{r}" for r in range(world)), watched=True, **kw)


WORLDS = [2, 3, 4, 8]
SEEDS = [0, 1, 2]


# ---------------------------------------------------------------------- invariants
@pytest.mark.parametrize("world", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("steps", [1, 2, 7, 50])
@pytest.mark.parametrize("group", [1, 2, 3])
@pytest.mark.parametrize("seed", [0, 1])
def test_the_categories_add_up_to_each_ranks_step_time(world: int, steps: int, group: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    shape = (world, steps)
    work = rng.exponential(0.05, shape)
    t = StepTimes(data=rng.exponential(0.01, shape), work=work, blocked=work * rng.uniform(0, 1.2, shape),
                  other=rng.exponential(0.001, shape), span=rng.exponential(0.01, shape),
                  units=np.arange(steps) // group)
    s = split(t)
    parts = sum(s.category(c) for c in CATEGORIES)
    assert np.allclose(parts, t.data + t.work + t.other)
    assert all((s.category(c) >= -1e-12).all() for c in CATEGORIES)
    assert (s.wait <= t.blocked + 1e-12).all()
    a = attribute(t)
    assert abs(sum(a.shares.values()) - 1) < 1e-9 and all(abs(sum(r.values()) - 1) < 1e-9 for r in a.per_rank)
    assert a.units == -(-steps // group) and a.gain >= 1 - 1e-12 and a.imbalance >= 1 - 1e-12
    assert a.slowest_rank == int(np.argmax(a.excess_s)) and 0 <= a.critical_data <= 1
    assert decide(a, facts(world)).name in VERDICTS


def test_one_rank_never_waits_for_itself() -> None:
    t = lockstep(1, 30)
    a = attribute(t)
    assert a.shares["wait"] == 0 and a.gain == 1 and a.slowest_counts == (0,)


def test_the_documented_figures() -> None:
    ones = np.ones((2, 4))
    t = StepTimes(data=0.1 * ones, work=1.0 * ones, blocked=np.array([[0.05] * 4, [0.85] * 4]), other=0 * ones)
    a = attribute(t)
    assert a.per_rank[1]["wait"] == pytest.approx(0.8 / 1.1) and a.per_rank[1]["collective"] == pytest.approx(
        0.05 / 1.1)
    assert a.per_rank[0]["compute"] == pytest.approx(0.95 / 1.1) and a.imbalance == pytest.approx(0.95 / 0.55)
    assert a.gain == pytest.approx(1.1 / 0.7)  # the slowest's 1.05 s of busy time, the mean's 0.65


@pytest.mark.parametrize("bad", ["shape", "negative", "nan", "units"])
def test_bad_times_are_refused_with_what_is_wrong(bad: str) -> None:
    ok = np.ones((2, 3))
    kw = {"data": ok, "work": ok, "blocked": ok, "other": ok}
    if bad == "shape":
        kw["work"] = np.ones((2, 4))
    elif bad == "negative":
        kw["data"] = -ok
    elif bad == "nan":
        kw["other"] = ok * np.nan
    with pytest.raises(ConfigError, match="StepTimes"):
        StepTimes(**kw, units=np.array([2, 1, 0]) if bad == "units" else None)


def test_steps_unmeasured_on_any_rank_are_left_out() -> None:
    cube = np.ones((3, 6, len(COLUMNS)))
    cube[2, 1, :] = np.nan  # a rank with fewer steps: NaN padded
    cube[:, 0, :] = np.nan  # the start-up step
    t = StepTimes.from_cube(cube, first_step=40, accumulation=2)
    assert t.steps == 4 and t.units.tolist() == [21, 21, 22, 22]  # steps 42-45 of the run
    with pytest.raises(ConfigError, match="ranks x steps"):
        StepTimes.from_cube(np.ones((3, 6)))


# ---------------------------------------------------------------------- the planted causes
@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("seed", SEEDS)
def test_a_healthy_run_is_compute_bound(world: int, seed: int) -> None:
    v = decide(attribute(lockstep(world, 60, seed=seed)), facts(world))
    assert v.name == "compute-bound", v.title


@pytest.mark.parametrize("world", [1, *WORLDS])
@pytest.mark.parametrize("seed", SEEDS)
def test_a_slow_loader_on_every_rank_is_input_bound(world: int, seed: int) -> None:
    rng = np.random.default_rng(seed + 100)
    a = attribute(lockstep(world, 60, data=rng.uniform(0.04, 0.08, (world, 60)), seed=seed))
    v = decide(a, facts(world))
    assert v.name == "input-bound", v.title
    assert "input-bound:" in v.title and "on rank" not in v.title  # every rank, not one


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("seed", SEEDS)
def test_one_ranks_slow_loader_is_input_bound_on_that_rank(world: int, seed: int) -> None:
    slow = seed % world
    data = np.full((world, 60), 0.001)
    data[slow] = 0.06
    a = attribute(lockstep(world, 60, data=data, seed=seed))
    v = decide(a, facts(world))
    assert v.name == "input-bound" and a.slowest_rank == slow, v.title
    assert f"on rank {slow} (host node{slow})" in v.title and f"node{slow}" in v.fix


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("seed", SEEDS)
def test_varying_work_per_batch_is_imbalanced(world: int, seed: int) -> None:
    rng = np.random.default_rng(seed + 7)
    compute = 0.02 * rng.lognormal(0.0, 0.6, (world, 60))  # the cost of each rank's batch varies
    a = attribute(lockstep(world, 60, compute=compute, seed=seed))
    v = decide(a, facts(world))
    assert v.name == "imbalanced", v.title
    assert not a.stable and a.gain > 1.1 and f"~{a.gain:.2f}x" in v.fix and "DistributedTokenBudgetSampler" in v.fix


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("seed", SEEDS)
def test_one_rank_always_slower_is_a_straggler(world: int, seed: int) -> None:
    slow = (seed + 1) % world
    compute = np.full((world, 60), 0.04)
    compute[slow] = 0.06
    a = attribute(lockstep(world, 60, compute=compute, seed=seed))
    v = decide(a, facts(world, slowest_by_window=(slow,) * 3))
    assert v.name == "straggler" and a.slowest_rank == slow and a.stable, v.title
    assert f"rank {slow} (host node{slow})" in v.title and "3 of 3 windows" in v.title and "nvidia-smi" in v.fix


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("seed", SEEDS)
def test_collectives_that_compute_does_not_hide_are_communication_bound(world: int, seed: int) -> None:
    a = attribute(lockstep(world, 60, compute=0.005, transfer=0.05, seed=seed))
    v = decide(a, facts(world, collective_bytes=64e6))
    assert v.name == "communication-bound", v.title
    assert v.bus_gb_s is not None and "bus bandwidth" in v.why and "bucket_cap_mb" in v.fix


@pytest.mark.parametrize("world", WORLDS)
def test_without_timed_collectives_waiting_counts_as_compute(world: int) -> None:
    compute = np.full((world, 60), 0.04)
    compute[0] = 0.08  # a straggler the monitor cannot see without the collectives' times
    a = attribute(lockstep(world, 60, compute=compute, watched=False))
    assert a.shares["wait"] == 0 and a.shares["collective"] == 0
    assert decide(a, replace(facts(world), watched=False)).name == "compute-bound"


def test_when_several_causes_reach_their_threshold_the_largest_loss_wins() -> None:
    world = 4
    data = np.full((world, 60), 0.03)  # 30 ms of data wait on every rank ...
    compute = np.full((world, 60), 0.02)
    compute[1] = 0.03  # ... and a straggler costing less
    a = attribute(lockstep(world, 60, data=data, compute=compute))
    assert a.critical_data > a.shares["wait"] >= LOSS * 0.5
    assert decide(a, facts(world)).name == "input-bound"


# ---------------------------------------------------------------------- gradient accumulation
def test_with_accumulation_the_ranks_are_compared_per_optimizer_step() -> None:
    world, steps = 2, 40
    compute = np.zeros((world, steps))
    compute[0, 0::2] = compute[1, 1::2] = 0.05  # each rank slow on one of its two micro-steps
    t = lockstep(world, steps, compute=compute + 0.01)
    per_batch = attribute(t)  # as if they synchronised every batch: half the time waiting
    grouped = StepTimes(t.data, t.work, t.blocked, t.other, units=np.arange(steps) // 2)
    per_step = attribute(replace_blocked_per_unit(grouped))
    assert per_batch.shares["wait"] > 0.3 and decide(per_batch, facts(world)).name == "imbalanced"
    assert per_step.shares["wait"] < 0.05 and decide(per_step, facts(world)).name == "compute-bound"


def replace_blocked_per_unit(t: StepTimes) -> StepTimes:
    """What ranks measure when they synchronise once per unit: blocked only on its last step."""
    busy = t.data + (t.work - t.blocked) + t.other
    ends = np.r_[np.flatnonzero(np.diff(t.units)), t.steps - 1]
    starts = np.r_[0, ends[:-1] + 1]
    per_unit = np.add.reduceat(busy, starts, axis=1)
    blocked = np.zeros_like(busy)
    blocked[:, ends] = per_unit.max(axis=0, keepdims=True) - per_unit + 0.001
    work = busy - t.data - t.other + blocked
    return StepTimes(t.data, work, blocked, t.other, units=t.units)


# ---------------------------------------------------------------------- the fix names the stage
def _fastfeed(read: float, decode: float, workers: int = 4, batches: int = 50) -> LoaderFacts:
    return LoaderFacts(kind="fastfeed", num_workers=workers, prefetch_factor=2, path="/data/ff",
                       read_s=read, decode_s=decode, cpu_s=read + decode, batches=batches, step_s=5.0)


@pytest.mark.parametrize(("loader", "stage", "words"), [
    (_fastfeed(read=18.0, decode=1.0), "storage", "cache_dir="),
    (_fastfeed(read=1.0, decode=18.0), "decode", "decode='dali'"),
    (_fastfeed(read=0.5, decode=4.0, workers=0), "workers", "set num_workers"),
    (_fastfeed(read=0.5, decode=2.0), "transfer", "prefetch_factor"),
    (LoaderFacts(kind="fastfeed", path="/data/ff"), "input-bound", "--decode dali"),
    (LoaderFacts(kind="dataloader", num_workers=0), None, "num_workers"),
    (LoaderFacts(kind="iterable"), None, "fastfeed pack"),
])
def test_input_bound_names_the_loaders_stage_and_its_fix(loader: LoaderFacts, stage: str | None, words: str) -> None:
    a = attribute(lockstep(2, 60, data=0.06))
    v = decide(a, replace(facts(2), loaders=(loader, loader), samples_per_step=64))
    assert v.name == "input-bound" and v.stage == stage and words in v.fix, (v.stage, v.fix)
    if loader.path:
        assert "fastfeed tune /data/ff --batch-size 64" in v.fix or stage in ("storage", "transfer")


def test_a_bursty_data_wait_asks_for_a_deeper_prefetch() -> None:
    data = np.full((2, 60), 0.0005)
    data[:, ::6] = 0.3  # every 6th batch arrives late: the workers deliver in bursts
    v = decide(attribute(lockstep(2, 60, data=data)), facts(2))
    assert v.name == "input-bound" and "bursts" in v.why and "prefetch_factor" in v.fix


def test_compute_bound_says_the_inputs_headroom() -> None:
    a = attribute(lockstep(2, 60))
    v = decide(a, replace(facts(2), loaders=(_fastfeed(read=0.2, decode=1.0),) * 2))
    assert v.name == "compute-bound" and v.headroom == pytest.approx(1 / (1.2 / 20)) and "faster" in v.why


# ---------------------------------------------------------------------- signals, bandwidth, stability
def test_periodic_long_steps_are_a_signal() -> None:
    compute = np.full((2, 100), 0.05)
    compute[:, 9::10] = 0.5  # a checkpoint every 10 steps
    v = decide(attribute(lockstep(2, 100, compute=compute)), facts(2))
    assert any("every 10 steps" in s for s in v.signals), v.signals


def test_oversubscribed_cores_and_low_memory_are_signals() -> None:
    f = replace(facts(2), loaders=(_fastfeed(1, 1, workers=8),) * 2, cores=(16, 16), local_ranks=(4, 4),
                memory_available=0.04)
    sig = decide(attribute(lockstep(2, 30)), f).signals
    assert any("36 busy processes for 16 cores" in s for s in sig) and any("memory pressure" in s for s in sig)


def test_bus_bandwidth_is_nccl_tests_formula() -> None:
    a = attribute(lockstep(4, 10, compute=0.001, transfer=0.1))
    f = facts(4, collective_bytes=1e9)
    per_step = a.span_s / a.span_units
    assert bus_bandwidth(a, f) == pytest.approx(2 * 3 / 4 * 1e9 / per_step / 1e9)
    assert bus_bandwidth(a, facts(1, collective_bytes=1e9)) is None


@pytest.mark.parametrize(("world", "share"), [(2, 0.75), (3, 2 / 3), (4, 0.625), (8, 0.5625)])
def test_the_same_rank_means_halfway_between_chance_and_always(world: int, share: float) -> None:
    assert stable_share(world) == pytest.approx(share)


# ---------------------------------------------------------------------- the wire format and the report
def _windows(t: StepTimes, every: int) -> list:
    cube = np.stack([t.data, t.work, t.blocked, t.other, t.span], axis=2)
    out = []
    for first in range(0, t.steps, every):
        part = cube[:, first:first + every]
        vecs = np.stack([pack({"window": first // every, "first_step": first, "steps": part.shape[1],
                               "samples": 64 * part.shape[1], "coll_bytes": 4e6 * part.shape[1],
                               "coll_steps": part.shape[1], "watched": 1}, part[r], every)
                         for r in range(t.ranks)])
        headers, back = unpack(vecs, every)
        assert np.array_equal(back, part) and len(headers[0]) == len(HEADER)
        out.append((first, headers, back))
    return out


def test_a_report_from_gathered_windows_reads_in_text_json_and_html(tmp_path: object) -> None:
    compute = np.full((3, 95), 0.04)
    compute[2] = 0.07
    t = lockstep(3, 95, compute=compute)
    facts_ = [{"host": f"node{r}", "cores": 8, "local_ranks": 1, "loader": {"kind": "dataloader", "num_workers": 4}}
              for r in range(3)]
    r = build_report(_windows(t, 20), facts_, summaries=(), notes=("a note",), startup_s=0.5, every=20,
                     accumulation=1, history=1000)
    assert r.verdict == "straggler" and r.slowest_rank == 2 and r.slowest_host == "node2"
    assert r.steps == 95 and r.world_size == 3 and r.samples_per_s and r.bus_gb_s
    text = r.text()
    assert "verdict: straggler" in text and "<- slowest" in text and "note: a note" in text
    j = r.to_json()
    assert j["verdict"] == "straggler" and len(j["timeline"]["starts"]) == 95
    page = r.html(str(tmp_path) + "/r.html")
    assert "<svg" in page and "straggler" in page and "http" not in page.replace("http://www.w3.org/2000/svg", "")


def test_the_timeline_bins_long_runs() -> None:
    t = lockstep(2, 1000)
    tl = timeline(t, np.arange(1000), bins=100)
    assert len(tl.starts) == 100 and tl.starts[0] == 0 and tl.ends[-1] == 999
    assert np.allclose(np.sum(tl.seconds, axis=2).mean(), (t.data + t.work + t.other).mean())
