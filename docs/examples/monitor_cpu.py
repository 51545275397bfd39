"""Where did the step go? A small CNN trained on the CPU under fastfeed.StepMonitor, in one process or many.

    python docs/examples/monitor_cpu.py DATASET [--epochs 2] [--html monitor.html] [--jsonl monitor.jsonl]
    torchrun --standalone --nproc-per-node 2 docs/examples/monitor_cpu.py DATASET --html monitor.html   # gloo ranks

Rank 0 logs one line every ``--every`` steps and, at the end, the verdict and its fix; every rank
gets the same report. The model has one output per class of the dataset's index.
``tests/test_docs.py`` runs it on the demo data that ``docs/guides/monitor.md`` names
(``python -m tools.demo``).
"""

import argparse
import logging
import os
import time

import torch
import torch.distributed as dist

import fastfeed


def train(dataset: str, *, epochs: int = 2, every: int = 10, workers: int = 1, step_ms: float = 0.0,
          html: str | None = None, jsonl: str | None = None) -> fastfeed.MonitorReport:
    """Train; return the monitor's report. ``step_ms`` adds that much work to every step (a heavier model)."""
    if "WORLD_SIZE" in os.environ and not dist.is_initialized():   # under torchrun
        dist.init_process_group("gloo")
    classes = fastfeed.DatasetIndex.load(dataset).classes   # the labels' names, as packed
    if not classes:
        raise SystemExit(f"{dataset}: the index records no classes; this example trains a classifier "
                         "on labelled images (an ImageFolder, packed)")
    dl = fastfeed.loader(dataset, batch_size=8, image_size=32, num_workers=workers, seed=0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, stride=2), torch.nn.ReLU(),
                                torch.nn.Conv2d(16, 32, 3, stride=2), torch.nn.ReLU(),
                                torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                                torch.nn.Linear(32, len(classes)))   # one output per class
    if dist.is_initialized():
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    mon = fastfeed.StepMonitor(every=every, jsonl=jsonl)
    model = mon.watch(model)                         # times DDP's gradient all-reduce (nothing in one process)
    for epoch in range(epochs):
        dl.set_epoch(epoch)
        for batch in mon(dl):                        # data wait: the time blocked in next()
            loss = torch.nn.functional.cross_entropy(model(batch["image"].float() / 255), batch["label"])
            opt.zero_grad(); loss.backward(); opt.step()
            if step_ms:
                _busy(step_ms / 1e3)                 # a larger model's step, on the CPU
    report = mon.report()                            # on every rank: it gathers the last window
    if html and (not dist.is_initialized() or dist.get_rank() == 0):
        report.html(html)
    return report


def _busy(seconds: float) -> None:
    """Compute for ``seconds`` (the CPU stand-in for a larger model's step)."""
    end = time.perf_counter() + seconds
    x = torch.ones(64, 64)
    while time.perf_counter() < end:
        x = x @ x / 64


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dataset")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--every", type=int, default=10, help="steps per window (one log line, one all_gather)")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--step-ms", type=float, default=0.0, help="extra compute per step, milliseconds")
    ap.add_argument("--html", default=None, help="write the report's page here (rank 0)")
    ap.add_argument("--jsonl", default=None, help="one JSON line per window, for dashboards (rank 0)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")  # shows rank 0's line per window
    r = train(args.dataset, epochs=args.epochs, every=args.every, workers=args.workers, step_ms=args.step_ms,
              html=args.html, jsonl=args.jsonl)
    if not dist.is_initialized() or dist.get_rank() == 0:
        print(r.text())
    if dist.is_initialized():
        dist.destroy_process_group()
