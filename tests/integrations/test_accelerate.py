"""HF Accelerate: ``accelerator.prepare`` leaves a fastfeed loader as it is, in every dispatch
mode, on real gloo ranks; ``save_state`` / ``load_state`` resume it at the next batch."""

from __future__ import annotations

import json
import multiprocessing as mp
from pathlib import Path

import pytest

from _dist import run_ranks
from _loader_data import keys_of, write_dataset
from _frameworks import become_rank, free_port

accelerate = pytest.importorskip("accelerate")

import fastfeed  # noqa: E402

# the dataloader settings users set on an Accelerator: the default and every dispatch mode
CONFIGS = {
    "default": {},
    "dispatch_false": {"dispatch_batches": False},
    "dispatch_true": {"dispatch_batches": True},
    "split_batches": {"split_batches": True},
    "uneven": {"even_batches": False},
}
BATCH, SEED, SAVED_AFTER = 3, 7, 2


def _loader(root: str, **kw: object) -> fastfeed.loading.api.Loader:
    return fastfeed.loader(root, batch_size=BATCH, seed=SEED, decode=None, num_workers=1, **kw)


def _step(accelerator, model, opt, batch: dict) -> list[str]:
    import torch

    x = batch["label"].float().unsqueeze(1).to(accelerator.device)
    accelerator.backward(model(x).pow(2).mean())
    opt.step()
    opt.zero_grad()
    torch.distributed.all_reduce(torch.ones(1))  # hangs if a rank ran out of batches
    return list(batch["__key__"])


def _train_epoch(accelerator, model, opt, dl) -> list[str]:
    return [k for batch in dl for k in _step(accelerator, model, opt, batch)]


def run_rank(rank: int, world: int, root: str, out: str, port: int, ckpt: str) -> None:
    become_rank(rank, world, port)
    import torch
    from accelerate import Accelerator
    from accelerate.utils import DataLoaderConfiguration

    result: dict = {"epochs": {}}
    for name, config in CONFIGS.items():
        accelerator = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(**config))
        model = torch.nn.Linear(1, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        dl = _loader(root)
        model, opt, prepared = accelerator.prepare(model, opt, dl)
        assert prepared is dl, name
        assert prepared.stats.steps == 0 and "batches" in prepared.state_dict()
        result["epochs"][name] = [_train_epoch(accelerator, model, opt, prepared) for _ in range(2)]
        result.setdefault("steps", {})[name] = prepared.stats.steps
    # save mid-epoch 1, then resume in a fresh Accelerator with a fresh loader
    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(1, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    model, opt, dl = accelerator.prepare(model, opt, _loader(root))
    accelerator.register_for_checkpointing(dl)
    _train_epoch(accelerator, model, opt, dl)
    dl.set_epoch(1)
    result["before_save"] = []
    for i, batch in enumerate(dl):
        result["before_save"] += _step(accelerator, model, opt, batch)
        if i + 1 == SAVED_AFTER:
            accelerator.save_state(ckpt)  # mid-epoch, after the step on this batch
            break
    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(1, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    model, opt, dl = accelerator.prepare(model, opt, _loader(root))
    accelerator.register_for_checkpointing(dl)
    accelerator.load_state(ckpt)
    result["resumed_state"] = dl.state_dict()
    dl.set_epoch(1)  # what a loop over range(start_epoch, epochs) does: keeps the resume point
    result["resumed"] = _train_epoch(accelerator, model, opt, dl)
    result["rank"], result["world"] = dl.rank, dl.world_size
    Path(out).write_text(json.dumps(result))
    accelerator.end_training()


@pytest.mark.dist
def test_prepare_leaves_loader_alone_and_resumes(tmp_path: Path) -> None:
    root = tmp_path / "data"
    write_dataset(root, shard_counts=(7, 7, 7, 4))  # 25 samples: uneven over 2 ranks
    ckpt, port, world = tmp_path / "ckpt", free_port(), 2
    results = run_ranks(mp.get_context("fork"), run_rank,
                        lambda r, out: (r, world, str(root), out, port, str(ckpt)), world, tmp_path, timeout=240)
    for r, res in enumerate(results):
        assert (res["rank"], res["world"]) == (r, world)
        alone = _loader(str(root), rank=r, world_size=world)  # what the rank sees unprepared
        want = [keys_of(alone) for _ in range(2)]
        assert want[0] != want[1]  # a new epoch is a new order
        for name in CONFIGS:
            assert res["epochs"][name] == want, name
            assert res["steps"][name] == 2 * len(alone), name
        assert res["before_save"] == want[1][: SAVED_AFTER * BATCH]
        assert res["resumed_state"]["epoch"] == 1 and res["resumed_state"]["batches"] == SAVED_AFTER
        assert res["resumed"] == want[1][SAVED_AFTER * BATCH:]
    # every sample of an epoch on some rank (fastfeed's own sharding, not Accelerate's)
    assert {k for res in results for k in res["epochs"]["default"][0]} == {f"s{i:05d}" for i in range(25)}
