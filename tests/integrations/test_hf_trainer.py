"""The HF ``Trainer`` trains from a fastfeed loader returned by ``get_train_dataloader``: a real
``Trainer.train()`` on CPU, a few steps, every batch in the loader's own order."""

from __future__ import annotations

import json
import multiprocessing as mp
from pathlib import Path
from typing import Any

import pytest

from _dist import run_ranks
from _frameworks import become_rank, free_port
from _loader_data import keys_of, write_dataset

transformers = pytest.importorskip("transformers")

import torch  # noqa: E402

import fastfeed  # noqa: E402

BATCH = 4


class TinyModel(torch.nn.Module):
    """Takes a fastfeed batch as keyword arguments; returns the loss as the Trainer expects."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(1, 5)
        self.seen: list[str] = []

    def forward(self, label: torch.Tensor, __key__: list[str], **fields: Any) -> dict[str, torch.Tensor]:
        self.seen += __key__
        logits = self.lin(label.float().unsqueeze(1))
        return {"loss": torch.nn.functional.cross_entropy(logits, label), "logits": logits}


LOADER_STATE = "fastfeed_loader.json"


class SaveLoaderState(transformers.TrainerCallback):
    """Writes the loader's position into every checkpoint the Trainer saves."""

    def __init__(self, loader: fastfeed.loading.api.Loader) -> None:
        self.loader = loader

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.is_world_process_zero:  # every rank's position is the same
            folder = Path(args.output_dir) / f"{transformers.trainer_utils.PREFIX_CHECKPOINT_DIR}-{state.global_step}"
            (folder / LOADER_STATE).write_text(json.dumps(self.loader.state_dict()))


class FastfeedTrainer(transformers.Trainer):
    """A Trainer whose training batches come from a fastfeed loader, resumable at the next batch.

    Pass ``ignore_data_skip=True``: the loader continues where the checkpoint left it, instead
    of the Trainer reading and dropping the batches already trained on.
    """

    def __init__(self, *args: Any, train_loader: fastfeed.loading.api.Loader, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.train_loader = train_loader
        self.add_callback(SaveLoaderState(train_loader))

    def get_train_dataloader(self) -> fastfeed.loading.api.Loader:
        return self.accelerator.prepare(self.train_loader)  # returns the loader itself

    def train(self, resume_from_checkpoint: str | bool | None = None, **kwargs: Any) -> Any:
        if resume_from_checkpoint is True:
            resume_from_checkpoint = transformers.trainer_utils.get_last_checkpoint(self.args.output_dir)
        if resume_from_checkpoint:
            state = json.loads((Path(resume_from_checkpoint) / LOADER_STATE).read_text())
            self.train_loader.load_state_dict(state)
        return super().train(resume_from_checkpoint=resume_from_checkpoint, **kwargs)


def _args(out: Path, **kw: Any) -> Any:
    return transformers.TrainingArguments(
        output_dir=str(out), num_train_epochs=2, use_cpu=True, report_to=[], logging_strategy="no",
        disable_tqdm=True, learning_rate=0.1, ignore_data_skip=True, ddp_find_unused_parameters=False, **kw,
    )


def _loader(root: Path, workers: int = 1) -> fastfeed.loading.api.Loader:
    return fastfeed.loader(root, batch_size=BATCH, seed=1, decode=None, num_workers=workers)


def test_trainer_train_reads_the_fastfeed_loader(tmp_path: Path) -> None:
    root = tmp_path / "data"
    write_dataset(root, shard_counts=(7, 7, 7, 4))  # 25 samples: 7 batches of 4 (last of 1)
    dl, model = _loader(root), TinyModel()
    out = FastfeedTrainer(model=model, args=_args(tmp_path / "out", save_strategy="no"), train_loader=dl).train()
    assert out.global_step == 2 * len(dl) == 14
    twin = _loader(root, workers=0)
    assert model.seen == keys_of(twin) + keys_of(twin)  # epoch 0 then epoch 1 (Trainer calls set_epoch)
    assert dl.stats.steps == 14 and dl.state_dict()["epoch"] == 1


def test_trainer_resumes_mid_epoch_at_next_batch(tmp_path: Path) -> None:
    root = tmp_path / "data"
    write_dataset(root, shard_counts=(7, 7, 7, 4))
    first = TinyModel()
    args = _args(tmp_path / "out", save_strategy="steps", save_steps=10)  # step 10: batch 3 of epoch 1
    FastfeedTrainer(model=first, args=args, train_loader=_loader(root)).train()
    ckpt = tmp_path / "out" / "checkpoint-10"
    assert json.loads((ckpt / LOADER_STATE).read_text())["batches"] == 3
    second, dl = TinyModel(), _loader(root)
    out = FastfeedTrainer(model=second, args=args, train_loader=dl).train(resume_from_checkpoint=str(ckpt))
    assert out.global_step == 14
    done = 25 + 3 * BATCH  # epoch 0 and 3 batches of epoch 1
    assert second.seen == first.seen[done:]
    assert torch.equal(first.lin.weight, second.lin.weight)  # the same steps on the same batches


def run_trainer_rank(rank: int, world: int, root: str, out: str, port: int, tmp: str) -> None:
    become_rank(rank, world, port)
    model, dl = TinyModel(), _loader(Path(root))
    result = FastfeedTrainer(model=model, args=_args(Path(tmp), save_strategy="no"), train_loader=dl).train()
    Path(out).write_text(json.dumps({"seen": model.seen, "steps": result.global_step, "rank": dl.rank,
                                     "world": dl.world_size, "weight": model.lin.weight.flatten().tolist()}))


@pytest.mark.dist
def test_trainer_two_ranks_each_reads_its_share(tmp_path: Path) -> None:
    root = tmp_path / "data"
    write_dataset(root, shard_counts=(7, 7, 7, 4))
    port, world = free_port(), 2
    results = run_ranks(mp.get_context("fork"), run_trainer_rank,
                        lambda r, out: (r, world, str(root), out, port, str(tmp_path / "out")), world, tmp_path)
    for r, res in enumerate(results):
        alone = fastfeed.loader(root, batch_size=BATCH, seed=1, decode=None, num_workers=0, rank=r, world_size=world)
        assert (res["rank"], res["world"]) == (r, world)
        assert res["seen"] == keys_of(alone) + keys_of(alone) and res["steps"] == 2 * len(alone)
    assert results[0]["weight"] == results[1]["weight"]  # DDP kept the replicas in step
    assert {k for res in results for k in res["seen"]} == {f"s{i:05d}" for i in range(25)}
