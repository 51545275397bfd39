"""Lightning: ``fit``, ``validate``, ``test`` and ``predict`` with fastfeed loaders, in one process
and with ``strategy="ddp"`` on 2 real gloo CPU processes; a mid-epoch checkpoint resumes at the
next batch."""

from __future__ import annotations

import json
import multiprocessing as mp
from pathlib import Path
from typing import Any

import pytest

from _dist import run_ranks
from _frameworks import become_rank, free_port
from _loader_data import keys_of, write_dataset

L = pytest.importorskip("lightning")

import torch  # noqa: E402

import fastfeed  # noqa: E402

pytestmark = [
    # Lightning's own notices about any IterableDataset with __len__, a val loop over few batches,
    # and a deprecation inside lightning's _pytree under this torch
    pytest.mark.filterwarnings("ignore:Your `IterableDataset` has `__len__` defined"),
    pytest.mark.filterwarnings("ignore:.*does not have many workers"),
    pytest.mark.filterwarnings("ignore:The number of training batches"),
    pytest.mark.filterwarnings("ignore:You defined a `validation_step` but have no `val_dataloader`"),
    pytest.mark.filterwarnings("ignore:.*isinstance.treespec, LeafSpec.*:DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:.*isinstance.treespec, LeafSpec.*:FutureWarning"),
]
BATCH, SEED = 3, 3


def _loader(root: str, *, shuffle: bool = True, **kw: Any) -> fastfeed.loading.api.Loader:
    return fastfeed.loader(root, batch_size=BATCH, seed=SEED, shuffle=shuffle, decode=None, num_workers=1, **kw)


class Recorder(L.LightningModule):
    """Records the keys of every batch each loop sees."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(1, 1)
        self.seen: dict[str, list[str]] = {"train": [], "val": [], "test": []}

    def _loss(self, batch: dict, stage: str) -> torch.Tensor:
        self.seen[stage] += batch["__key__"]
        return self.lin(batch["label"].float().unsqueeze(1)).pow(2).mean()

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        return self._loss(batch, "train")

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        self._loss(batch, "val")

    def test_step(self, batch: dict, batch_idx: int) -> None:
        self._loss(batch, "test")

    def predict_step(self, batch: dict, batch_idx: int) -> list[str]:
        return list(batch["__key__"])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def _trainer(tmp: str, **kw: Any) -> "L.Trainer":
    kw.setdefault("accelerator", "cpu")
    kw.setdefault("devices", 1)
    return L.Trainer(default_root_dir=tmp, logger=False, enable_progress_bar=False, enable_model_summary=False,
                     num_sanity_val_steps=0, **kw)


def run_all_stages(root: str, tmp: str, **trainer_kw: Any) -> dict[str, Any]:
    """fit (2 epochs, with validation), validate, test, predict; the keys each saw."""
    model = Recorder()
    train, val = _loader(root), _loader(root, shuffle=False)
    trainer = _trainer(tmp, max_epochs=2, enable_checkpointing=False, **trainer_kw)
    trainer.fit(model, train_dataloaders=train, val_dataloaders=val)
    fit = dict(model.seen)
    model.seen = {"train": [], "val": [], "test": []}
    trainer.validate(model, dataloaders=val, verbose=False)
    trainer.test(model, dataloaders=_loader(root, shuffle=False), verbose=False)
    predicted = trainer.predict(model, dataloaders=_loader(root, shuffle=False))
    return {"fit": fit, "validate": model.seen["val"], "test": model.seen["test"],
            "predict": [k for batch in predicted for k in batch], "train_steps": train.stats.steps,
            "rank": train.rank, "world": train.world_size}


def _expected(root: str, rank: int = 0, world: int = 1) -> dict[str, list]:
    train = _loader(root, rank=rank, world_size=world)
    ordered = keys_of(_loader(root, shuffle=False, rank=rank, world_size=world))
    return {"train": keys_of(train) + keys_of(train), "eval": ordered, "steps": 2 * len(train)}


def _check(res: dict, want: dict) -> None:
    assert res["fit"]["train"] == want["train"]
    assert res["fit"]["val"] == want["eval"] * 2  # one validation pass per epoch
    assert res["validate"] == res["test"] == res["predict"] == want["eval"]
    assert res["train_steps"] == want["steps"]  # stats of the loader passed to fit


def test_fit_validate_test_predict_one_process(tmp_path: Path) -> None:
    root = tmp_path / "data"
    write_dataset(root, shard_counts=(7, 7, 7, 4))
    res = run_all_stages(str(root), str(tmp_path / "pl"))
    _check(res, _expected(str(root)))
    assert sorted(res["predict"]) == [f"s{i:05d}" for i in range(25)]


@pytest.mark.filterwarnings("ignore:Checkpoint directory .* exists and is not empty")  # resuming into it
def test_mid_epoch_checkpoint_resumes_at_next_batch(tmp_path: Path) -> None:
    root = tmp_path / "data"
    write_dataset(root, shard_counts=(7, 7, 7, 4))  # 9 batches of 3 per epoch
    ckpt_dir = tmp_path / "ckpt"
    every = 12  # the checkpoint lands in epoch 1, after its 3rd batch
    first = Recorder()
    def saver(path: Path) -> "L.Callback":
        return L.pytorch.callbacks.ModelCheckpoint(dirpath=path, every_n_train_steps=every, save_top_k=-1)

    _trainer(str(tmp_path / "a"), max_epochs=2, callbacks=[saver(ckpt_dir)]).fit(
        first, train_dataloaders=_loader(str(root)))
    ckpt = next(ckpt_dir.glob(f"*step={every}.ckpt"))
    second = Recorder()
    _trainer(str(tmp_path / "b"), max_epochs=2, callbacks=[saver(ckpt_dir)]).fit(
        second, train_dataloaders=_loader(str(root)), ckpt_path=str(ckpt))
    assert len(first.seen["train"]) == 2 * 25  # two epochs of 9 batches: 8 of 3 samples, 1 of 1
    done = 25 + (every - 9) * BATCH  # epoch 0, then 3 batches of epoch 1
    assert second.seen["train"] == first.seen["train"][done:]


def run_ddp_rank(rank: int, world: int, root: str, out: str, port: int, tmp: str) -> None:
    become_rank(rank, world, port)
    res = run_all_stages(root, tmp, strategy="ddp", devices=world)
    Path(out).write_text(json.dumps(res))


@pytest.mark.dist
def test_fit_validate_test_predict_ddp_two_processes(tmp_path: Path) -> None:
    root = tmp_path / "data"
    write_dataset(root, shard_counts=(7, 7, 7, 4))
    port, world = free_port(), 2
    results = run_ranks(mp.get_context("fork"), run_ddp_rank,
                        lambda r, out: (r, world, str(root), out, port, str(tmp_path / "pl")), world, tmp_path)
    for r, res in enumerate(results):
        assert (res["rank"], res["world"]) == (r, world)
        _check(res, _expected(str(root), r, world))
    assert {k for res in results for k in res["predict"]} == {f"s{i:05d}" for i in range(25)}
