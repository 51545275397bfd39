"""Real gloo ranks for mixing, ``pad=False`` and elastic resume (W=3 -> W=2).

Every step all-reduces across ranks, so a rank with fewer steps (or one that crashes on
an empty last batch) would hang the job; :func:`run_ranks` fails the test instead.
"""

from __future__ import annotations

import json
import multiprocessing as mp
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
from _dist import run_ranks
from _loader_data import write_dataset

import fastfeed

pytestmark = [
    pytest.mark.dist,
    pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:This DataLoader will create"),
]


def _named(prefix: str):  # type: ignore[no-untyped-def]
    def fields(i: int, rng: np.random.Generator) -> dict[str, bytes]:
        return {"txt": f"{prefix}{i}".encode(), "cls": str(i % 5).encode()}
    return fields


def _steps(dl: Any, limit: int | None = None) -> list[list[Any]]:
    """(source, text, valid) of the samples of each step, with an all_reduce per step."""
    out = []
    for i, batch in enumerate(dl):
        dist.all_reduce(torch.ones(1))
        out.append([[s, t.decode(), v] for s, t, v in zip(batch["__source__"].tolist(), batch["txt"],
                                                           batch["valid"].tolist())])
        if limit is not None and i + 1 == limit:
            break
    return out


def _mix(roots: list[str]) -> list[fastfeed.Source]:
    """A and B, 2:1."""
    return [fastfeed.Source(roots[0], weight=2), fastfeed.Source(roots[1], weight=1)]


def run_rank(rank: int, world: int, roots: list[str], out: str, init: str, state: str | None) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world)
    try:
        dl = fastfeed.loader(_mix(roots), batch_size=3, pad=False, num_workers=1, decode=None, seed=5,
                             order=fastfeed.Order(epoch_samples=28))
        result: dict[str, Any] = {"len": len(dl)}
        if state is None:
            dl.set_epoch(0)
            result["epoch0"] = _steps(dl)
            dl.set_epoch(1)
            result["head"] = _steps(dl, limit=2)
            result["state"] = dl.state_dict()
        else:
            dl.load_state_dict(json.loads(state))
            result["rest"] = _steps(dl)
            result["epoch"] = dl.epoch
        Path(out).write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


def _job(tmp_path: Path, roots: list[str], world: int, state: str | None, name: str) -> list[dict]:
    work = tmp_path / name
    work.mkdir()
    ctx = mp.get_context("fork")
    init = work / "init"
    return run_ranks(ctx, run_rank, lambda r, out: (r, world, roots, out, str(init), state), world, work,
                     timeout=180)


def test_mixing_pad_false_and_an_elastic_resume_from_three_ranks_to_two(tmp_path: Path) -> None:
    write_dataset(tmp_path / "a", shard_counts=(9, 9, 4), fields=_named("a"))  # 22: 19 of them per epoch
    write_dataset(tmp_path / "b", shard_counts=(6,), fields=_named("b"))  # 6
    roots = [str(tmp_path / "a"), str(tmp_path / "b")]
    ref = fastfeed.loader(_mix(roots), batch_size=1000, decode=None, num_workers=0, seed=5,
                          order=fastfeed.Order(epoch_samples=28))
    epoch = {e: (ref.set_epoch(e), Counter((s, t.decode()) for b in ref
                                         for s, t in zip(b["__source__"].tolist(), b["txt"])))[1]
             for e in (0, 1)}
    assert sum(epoch[0].values()) == 28 and len({t for s, t in epoch[0] if s == 1}) == 6  # B cycled

    three = _job(tmp_path, roots, 3, None, "w3")
    assert len({r["len"] for r in three}) == 1 and len({len(r["epoch0"]) for r in three}) == 1
    got = Counter((s, t) for r in three for step in r["epoch0"] for s, t, v in step)
    assert got == epoch[0]  # pad=False: every sample of the epoch exactly once over the ranks
    assert all(v for r in three for step in r["epoch0"] for _, _, v in step)
    # 28 over 3 ranks: spans 9, 9, 10 -> 4 steps; the 9-sample ranks end on an empty batch (no hang)
    assert sorted(len(r["epoch0"][-1]) for r in three) == [0, 0, 1]

    state = three[0]["state"]
    assert state["stages"] == [[3, 3, "exact", 2]]
    two = _job(tmp_path, roots, 2, json.dumps(state), "w2")
    assert {r["epoch"] for r in two} == {1} and len({len(r["rest"]) for r in two}) == 1
    head = Counter((s, t) for r in three for step in r["head"] for s, t, _ in step)
    rest = Counter((s, t) for r in two for step in r["rest"] for s, t, v in step if v)
    assert head + rest == epoch[1]  # the union over the new ranks is exactly what was left, each once
