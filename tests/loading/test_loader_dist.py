"""Real multi-process runs: gloo ranks (rank/world from torch.distributed), real workers.

Every step all-reduces across ranks, so a rank with fewer batches would hang the job
(the bug this guards against); the parent fails the test after a timeout instead.
"""

from __future__ import annotations

import json
import multiprocessing as mp
from collections import Counter
from pathlib import Path

import pytest

from _dist import epoch_keys, run_ranks
import torch.distributed as dist

import fastfeed

from _loader_data import write_dataset

pytestmark = [
    pytest.mark.dist,
    # ranks fork from the test process, as DataLoader workers do (Python >= 3.12 warns when
    # the forking process runs threads, e.g. a session's moto server)
    pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning"),
]

EPOCHS = 2


def run_rank(rank: int, world: int, root: str, out: str, init: str, workers: int, drop_last: bool) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world)
    try:
        dl = fastfeed.loader(root, batch_size=3, num_workers=workers, drop_last=drop_last, seed=5,
                             decode=None)
        epochs = epoch_keys(dl, EPOCHS)
        result = {"rank": dl.rank, "world": dl.world_size, "len": len(dl), "epochs": epochs}
        Path(out).write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


def run_job(tmp_path: Path, root: Path, world: int, workers: int, drop_last: bool) -> list[dict]:
    # fork, as torchrun-started ranks are plain processes whose DataLoader workers fork too
    # (a spawned rank would make its workers spawn and re-import torch: slow, and unlike torchrun)
    ctx = mp.get_context("fork")
    init = tmp_path / "init"
    return run_ranks(ctx, run_rank, lambda r, out: (r, world, str(root), out, str(init), workers, drop_last),
                     world, tmp_path, timeout=180)


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
def test_three_ranks_two_workers_every_sample_once(tmp_path: Path) -> None:
    root = tmp_path / "data"
    write_dataset(root, fmt="tar", shard_counts=(9, 9, 9, 9, 5))  # 41 samples: not divisible by 3
    results = run_job(tmp_path, root, world=3, workers=2, drop_last=False)
    assert [r["rank"] for r in results] == [0, 1, 2] and {r["world"] for r in results} == {3}
    assert len({r["len"] for r in results}) == 1
    for e in range(EPOCHS):
        counts = Counter(k for r in results for k in r["epochs"][e])
        assert len(counts) == 41 and sum(counts.values()) == 42  # 41 + 1 repeated slot
        assert len({len(r["epochs"][e]) for r in results}) == 1
    assert results[0]["epochs"][0] != results[0]["epochs"][1]  # the epoch changes the order


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
def test_four_ranks_lmdb_drop_last(tmp_path: Path) -> None:
    root = tmp_path / "data"
    write_dataset(root, fmt="lmdb", shard_counts=(10, 10, 10, 8))  # 38 samples
    results = run_job(tmp_path, root, world=4, workers=1, drop_last=True)
    assert {r["len"] for r in results} == {3}  # 38 // 4 = 9 per rank -> 3 full batches of 3
    for e in range(EPOCHS):
        counts = Counter(k for r in results for k in r["epochs"][e])
        assert max(counts.values()) == 1 and len(counts) == 36
