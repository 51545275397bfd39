"""The step monitor on real gloo ranks (3 processes on the CPU), each with a planted cause.

Every scenario trains a DDP model (watched by the monitor) for a few windows with one cause
planted, and each must get its verdict and no other:

==================  ===========================================================  ====================
scenario            what is planted                                              verdict
==================  ===========================================================  ====================
healthy             equal compute on every rank, batches in memory               compute-bound
slow-loader         a fastfeed loader whose transform is slow, on every rank     input-bound (decode)
one-slow-loader     rank 1's DataLoader sleeps per sample                        input-bound, rank 1
variable-length     compute proportional to each batch's longest sequence        imbalanced
                    (DistributedSampler over lognormal lengths)
straggler           rank 2's compute always 2x the others'                       straggler, rank 2
big-model           4M parameters, almost no compute: the all-reduce dominates   communication-bound
==================  ===========================================================  ====================

The planted compute and loader costs are sleeps: they take the same time whatever else the
shared 2-core machine runs, which a CPU-bound stand-in would not. The edge cases run here
too: a rank whose peers run no monitor, ranks with different numbers of steps, gradient
accumulation with ``no_sync``.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch._dynamo  # noqa: F401 - DDP imports it on first use: here, once, not in every forked rank (~10 s)
import torch.distributed as dist

import fastfeed
from _dist import run_ranks
from _loader_data import write_dataset

pytestmark = [
    pytest.mark.dist,
    pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning"),
]

WORLD, EVERY, STEPS = 3, 10, 30  # 3 windows; the first step (start-up) is left out


def _init(rank: int, init: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=WORLD)


def slow_transform(sample: dict[str, Any]) -> dict[str, Any]:
    time.sleep(0.012)  # 4 samples a batch: ~50 ms of "decode" per batch in the worker
    return sample


class Sleepy(torch.utils.data.Dataset):
    """``n`` small samples; each takes ``delay`` seconds to load."""

    def __init__(self, n: int, delay: float) -> None:
        self.n, self.delay = n, delay

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        if self.delay:
            time.sleep(self.delay)
        return torch.full((8,), float(i))


def _batches(scenario: str, rank: int, root: str) -> tuple[Any, Any]:
    """(the loader, the per-step compute in seconds as a function of the batch)."""
    if scenario == "slow-loader":
        dl = fastfeed.loader(root, batch_size=4, decode=None, num_workers=1, transform=slow_transform, seed=1)
        return dl, lambda b: 0.01
    if scenario == "variable-length":
        lengths = np.random.default_rng(0).lognormal(4.0, 0.9, 4000).astype(int) + 8
        sampler = torch.utils.data.DistributedSampler(range(len(lengths)), shuffle=True, seed=0)
        dl = torch.utils.data.DataLoader(list(range(len(lengths))), batch_size=4, sampler=sampler)
        # padded batches: the step costs batch x longest (0.03 ms a token), so it varies with the draw
        return dl, lambda b: 3e-5 * len(b) * float(lengths[b.numpy()].max())
    delay = 0.015 if scenario == "one-slow-loader" and rank == 1 else 0.0
    dl = torch.utils.data.DataLoader(Sleepy(4 * STEPS, delay), batch_size=4)
    if scenario == "straggler":
        return dl, lambda b: 0.06 if rank == 2 else 0.03
    if scenario == "big-model":
        return dl, lambda b: 0.0
    if scenario == "healthy":  # long enough that gloo's small all-reduce on busy cores stays a few percent
        return dl, lambda b: 0.06
    return dl, lambda b: 0.04  # one-slow-loader


def run_scenario(rank: int, scenario: str, root: str, init: str, out: str) -> None:
    _init(rank, init)
    try:
        torch.manual_seed(0)
        width = 1024 if scenario == "big-model" else 8
        net = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(4 if width > 8 else 1)])
        model = torch.nn.parallel.DistributedDataParallel(net)
        opt = torch.optim.SGD(model.parameters(), lr=1e-4)
        mon = fastfeed.StepMonitor(every=EVERY, timeout=60)
        model = mon.watch(model)
        dl, cost = _batches(scenario, rank, root)
        steps = 0
        for batch in mon(dl):
            x = batch["label"] if isinstance(batch, dict) else batch
            time.sleep(cost(x))
            loss = model(torch.ones(1, width)).sum()
            loss.backward()
            opt.step()
            opt.zero_grad()
            steps += 1
            if steps == STEPS:
                break
        report = mon.report()
        Path(out).write_text(json.dumps({**report.to_json(), "text": report.text()}))
    finally:
        dist.destroy_process_group()


EXPECTED = {"healthy": "compute-bound", "slow-loader": "input-bound", "one-slow-loader": "input-bound",
            "variable-length": "imbalanced", "straggler": "straggler", "big-model": "communication-bound"}


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("mon") / "data"
    write_dataset(root, shard_counts=(100, 100, 100, 100))
    return root


def _run(tmp_path: Path, target: Any, args: tuple, timeout: float = 120) -> list[dict]:
    init = tmp_path / "init"
    return run_ranks(mp.get_context("fork"), target, lambda r, out: (r, *args, str(init), out), WORLD, tmp_path,
                     timeout=timeout)


@pytest.mark.parametrize("scenario", list(EXPECTED))
def test_each_planted_cause_gets_its_verdict(scenario: str, data: Path, tmp_path: Path) -> None:
    results = _run(tmp_path, run_scenario, (scenario, str(data)))
    r = results[0]
    assert r["verdict"] == EXPECTED[scenario], r["text"]
    assert all(x["verdict"] == r["verdict"] and x["shares"] == r["shares"] for x in results)  # one report, all ranks
    assert r["world_size"] == WORLD and r["steps"] == STEPS - 1 and r["watched"]
    assert len(r["windows"]) == 3 and abs(sum(r["shares"].values()) - 1) < 1e-9
    if scenario == "slow-loader":
        assert r["stage"] == "decode", r["text"]  # the loader's own stage times name it
    if scenario == "one-slow-loader":
        assert r["slowest_rank"] == 1 and "rank 1" in r["title"], r["text"]
    if scenario == "straggler":
        assert r["slowest_rank"] == 2 and r["slowest_same"] is True, r["text"]
    if scenario == "big-model":
        assert r["bus_gb_s"] and r["bus_gb_s"] > 0 and "bus bandwidth" in r["why"], r["text"]
    if scenario == "healthy":
        assert r["shares"]["compute"] > 0.7, r["text"]


# ---------------------------------------------------------------------- edge cases on real ranks
def run_alone(rank: int, init: str, out: str) -> None:
    """Only rank 0 runs a monitor; the others train without one."""
    _init(rank, init)
    try:
        t0 = time.perf_counter()
        if rank == 0:
            mon = fastfeed.StepMonitor(every=5, timeout=2)
            for _ in mon(range(12)):
                dist.all_reduce(torch.ones(1))
            report = mon.report()
            res = {"verdict": report.verdict, "world": report.world_size, "notes": list(report.notes),
                   "steps": report.steps}
        else:
            for _ in range(12):
                dist.all_reduce(torch.ones(1))
            res = {}
        Path(out).write_text(json.dumps({**res, "took": time.perf_counter() - t0}))
    finally:
        dist.destroy_process_group()


def test_a_rank_whose_peers_run_no_monitor_reports_alone_and_says_why(tmp_path: Path) -> None:
    results = _run(tmp_path, run_alone, (), timeout=60)
    r = results[0]
    assert r["world"] == 1 and r["steps"] == 11
    assert any("did not join the monitor's exchange within 2 s" in n for n in r["notes"]), r["notes"]
    assert r["took"] < 20  # bounded: the 2 s timeout, not a hang


def run_unequal(rank: int, init: str, out: str) -> None:
    """Rank 2 stops 7 steps early and never calls report(): the others time out and say so."""
    _init(rank, init)
    try:
        mon = fastfeed.StepMonitor(every=5, timeout=2)
        for i, _ in enumerate(mon(range(17 if rank == 2 else 24))):
            time.sleep(0.005)
        res: dict[str, Any] = {}
        if rank != 2:
            report = mon.report()
            res = {"world": report.world_size, "windows": len(report.windows), "notes": list(report.notes),
                   "steps": report.steps}
        else:
            time.sleep(4)  # stay alive past the others' timeout, without answering
        Path(out).write_text(json.dumps(res))
    finally:
        dist.destroy_process_group()


def test_ranks_with_different_step_counts_end_within_the_timeout(tmp_path: Path) -> None:
    results = _run(tmp_path, run_unequal, (), timeout=90)
    for r in results[:2]:
        assert r["world"] == WORLD and r["windows"] == 3, r  # steps 1-15 of every rank: 3 full windows
        assert any("gather of window" in n and "failed" in n for n in r["notes"]), r["notes"]
        assert r["steps"] == 14


def run_accumulation(rank: int, init: str, out: str) -> None:
    """Gradient accumulation over 2 batches with no_sync: rank ``r`` is slow on micro-step ``r % 2``."""
    _init(rank, init)
    try:
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
        mon = fastfeed.StepMonitor(every=8, accumulation=2, timeout=60)
        model = mon.watch(model)
        for i, _ in enumerate(mon(range(25))):
            time.sleep(0.04 if i % 2 == rank % 2 else 0.0)  # each rank's two micro-steps sum to the same work
            sync = i % 2 == 1
            ctx = model.no_sync() if not sync else torch.enable_grad()
            with ctx:
                model(torch.ones(1, 4)).sum().backward()
        report = mon.report()
        Path(out).write_text(json.dumps({**report.to_json(), "text": report.text()}))
    finally:
        dist.destroy_process_group()


def test_gradient_accumulation_counts_the_wait_per_optimizer_step(tmp_path: Path) -> None:
    r = _run(tmp_path, run_accumulation, ())[0]
    # per batch the ranks take turns being slow, but they synchronise once per 2 batches, where
    # their work is equal: no wait for a slowest rank, and no imbalance verdict
    assert r["verdict"] == "compute-bound", r["text"]
    assert r["shares"]["wait"] < 0.1 and r["accumulation"] == 2, r["text"]
    assert any("once per 2 steps" in n for n in r["notes"])
