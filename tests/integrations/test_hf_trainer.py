"""The HF ``Trainer`` trains from a fastfeed loader returned by ``get_train_dataloader``: a real
``Trainer.train()`` on CPU, a few steps, every batch in the loader's own order."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

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


class FastfeedTrainer(transformers.Trainer):
    """A Trainer whose training batches come from a fastfeed loader."""

    def __init__(self, *args: Any, train_loader: fastfeed.loading.api.Loader, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.train_loader = train_loader

    def get_train_dataloader(self) -> fastfeed.loading.api.Loader:
        return self.accelerator.prepare(self.train_loader)  # returns the loader itself


def test_trainer_train_reads_the_fastfeed_loader(tmp_path: Path) -> None:
    root = tmp_path / "data"
    write_dataset(root, shard_counts=(7, 7, 7, 4))  # 25 samples: 7 batches of 4 (last of 1)
    dl = fastfeed.loader(root, batch_size=BATCH, seed=1, decode=None, num_workers=1)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), num_train_epochs=2, use_cpu=True, report_to=[], save_strategy="no",
        logging_strategy="no", disable_tqdm=True, learning_rate=0.1,
    )
    model = TinyModel()
    trainer = FastfeedTrainer(model=model, args=args, train_loader=dl)
    out = trainer.train()
    assert out.global_step == 2 * len(dl) == 14
    twin = fastfeed.loader(root, batch_size=BATCH, seed=1, decode=None, num_workers=0)
    assert model.seen == keys_of(twin) + keys_of(twin)  # epoch 0 then epoch 1 (Trainer calls set_epoch)
    assert dl.stats.steps == 14 and dl.state_dict()["epoch"] == 1
