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
        self.train_batches: list[list[str]] = []

    def _loss(self, batch: dict, stage: str) -> torch.Tensor:
        self.seen[stage] += batch["__key__"]
        if stage == "train":
            self.train_batches.append(list(batch["__key__"]))
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


def mid_epoch_resume(root: str, tmp: Path, every: int, **trainer_kw: Any) -> dict[str, Any]:
    """fit 2 epochs with a checkpoint every ``every`` steps; fit again from the one at ``every``."""
    ckpt_dir = tmp / "ckpt"

    def saver() -> "L.Callback":
        return L.pytorch.callbacks.ModelCheckpoint(dirpath=ckpt_dir, every_n_train_steps=every, save_top_k=-1)

    first, second = Recorder(), Recorder()
    _trainer(str(tmp / "a"), max_epochs=2, callbacks=[saver()], **trainer_kw).fit(
        first, train_dataloaders=_loader(root))
    ckpt = next(ckpt_dir.glob(f"*step={every}.ckpt"))
    _trainer(str(tmp / "b"), max_epochs=2, callbacks=[saver()], **trainer_kw).fit(
        second, train_dataloaders=_loader(root), ckpt_path=str(ckpt))
    return {"first": first.train_batches, "second": second.train_batches}


@pytest.mark.filterwarnings("ignore:Checkpoint directory .* exists and is not empty")  # resuming into it
def test_mid_epoch_checkpoint_resumes_at_next_batch(tmp_path: Path) -> None:
    root = tmp_path / "data"
    write_dataset(root, shard_counts=(7, 7, 7, 4))  # 9 batches of 3 per epoch (the last of 1)
    res = mid_epoch_resume(str(root), tmp_path, every=12)  # epoch 1, after its 3rd batch
    assert len(res["first"]) == 18 and res["second"] == res["first"][12:]
    assert [len(b) for b in res["first"][:9]] == [3] * 8 + [1]


def run_ddp_rank(rank: int, world: int, root: str, out: str, port: int, tmp: str) -> None:
    become_rank(rank, world, port)
    res = run_all_stages(root, tmp, strategy="ddp", devices=world)
    res["resume"] = mid_epoch_resume(root, Path(tmp) / "resume", every=7, strategy="ddp", devices=world)
    Path(out).write_text(json.dumps(res))


@pytest.mark.dist
@pytest.mark.filterwarnings("ignore:Checkpoint directory .* exists and is not empty")
def test_fit_validate_test_predict_ddp_two_processes(tmp_path: Path) -> None:
    root = tmp_path / "data"
    write_dataset(root, shard_counts=(7, 7, 7, 4))
    port, world = free_port(), 2
    results = run_ranks(mp.get_context("fork"), run_ddp_rank,
                        lambda r, out: (r, world, str(root), out, port, str(tmp_path / "pl")), world, tmp_path)
    for r, res in enumerate(results):
        assert (res["rank"], res["world"]) == (r, world)
        _check(res, _expected(str(root), r, world))
        # 5 batches per rank and epoch; the checkpoint after step 7 (rank 0's loader state) resumes
        # both ranks at batch 3 of epoch 1
        assert len(res["resume"]["first"]) == 10 and res["resume"]["second"] == res["resume"]["first"][7:]
    assert {k for res in results for k in res["predict"]} == {f"s{i:05d}" for i in range(25)}
