"""Run real rank processes (gloo) for the multi-rank tests and collect what each wrote."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable


def run_ranks(ctx: Any, target: Callable[..., None], args_of: Callable[[int, str], tuple], world: int,
              tmp_path: Path, timeout: float = 240) -> list[dict]:
    """Start ``world`` processes ``target(*args_of(rank, out_path))``; each writes JSON to its
    ``out_path``. Fails the test if a rank hangs (the symptom of unequal step counts) or exits
    non-zero; returns the ranks' JSON in rank order."""
    outs = [tmp_path / f"rank{r}.json" for r in range(world)]
    procs = [ctx.Process(target=target, args=args_of(r, str(outs[r]))) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=timeout)
    hung = [r for r, p in enumerate(procs) if p.is_alive()]
    for p in procs:
        if p.is_alive():
            p.kill()
    assert not hung, f"ranks {hung} hung (unequal step counts?)"
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
    return [json.loads(o.read_text()) for o in outs]


def epoch_keys(dl: Any, epochs: int) -> list[list[str]]:
    """Inside a rank: the keys ``dl`` yields in each epoch, with an all_reduce per batch, which
    hangs (and fails :func:`run_ranks`) if another rank runs out of batches first."""
    import torch
    import torch.distributed as dist

    out = []
    for epoch in range(epochs):
        dl.set_epoch(epoch)
        keys: list[str] = []
        for batch in dl:
            dist.all_reduce(torch.ones(1))
            keys += batch["__key__"]
        out.append(keys)
    return out
