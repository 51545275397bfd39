"""Train a small CNN on a packed dataset on the CPU, with exact resume from a checkpoint.

    python docs/examples/train_cpu.py DATASET [--epochs 2] [--ckpt ckpt.pt]

Kill it at any step and run the same command again: it continues at the next batch, in the
same order. The model has one output per class of the dataset's index (the folders of an
ImageFolder). ``tests/test_docs.py`` runs it on the demo data that ``docs/examples/train_cpu.md``
names (``python -m tools.demo``).
"""

import argparse
import os

import torch

import fastfeed


def train(dataset: str, ckpt: str, epochs: int = 2, stop_after: int | None = None) -> list[str]:
    """Train; save ``ckpt`` after every step; return the keys seen. ``stop_after`` simulates a crash."""
    classes = fastfeed.DatasetIndex.load(dataset).classes   # the labels' names, as packed
    if not classes:
        raise SystemExit(f"{dataset}: the index records no classes; this example trains a classifier "
                         "on labelled images (an ImageFolder, packed)")
    dl = fastfeed.loader(dataset, batch_size=8, image_size=32, num_workers=0, seed=0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, stride=2), torch.nn.ReLU(),
                                torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                                torch.nn.Linear(8, len(classes)))   # one output per class
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    start, seen = 0, []
    if os.path.exists(ckpt):
        state = torch.load(ckpt)
        model.load_state_dict(state["model"]); opt.load_state_dict(state["opt"])
        dl.load_state_dict(state["data"]); start = state["data"]["epoch"]
    for epoch in range(start, epochs):
        dl.set_epoch(epoch)                          # the saved epoch resumes mid-way, later ones start fresh
        for batch in dl:
            loss = torch.nn.functional.cross_entropy(model(batch["image"].float() / 255), batch["label"])
            opt.zero_grad(); loss.backward(); opt.step()
            seen += batch["__key__"]
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "data": dl.state_dict()}, ckpt)
            if stop_after is not None and len(seen) >= stop_after:
                return seen
    return seen


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dataset")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--ckpt", default="ckpt.pt")
    args = ap.parse_args()
    print(f"trained on {len(train(args.dataset, args.ckpt, args.epochs))} samples")
