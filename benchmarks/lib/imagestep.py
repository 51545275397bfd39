"""An image-classification training step, and the two ways ``train_step`` times a run of it.

- :func:`trainer`: one SGD step of a torchvision ResNet (``channels_last``, bf16 autocast on the
  GPU) or of a small CNN (the CPU's) on a batch of uint8 NCHW images: to the device
  (``non_blocking``), normalised there, forward, backward, optimizer.
- :func:`batches`: (images, labels, first of an epoch) over epochs, back to back, from anything
  that starts an epoch's pass.
- :func:`plain_pass`: each step timed on the host: ``next()``, then the step and a
  synchronisation of the training stream (:func:`stream_sync`), so the wait for a batch is on
  that clock.
- :func:`monitored_pass`: the same loop under ``fastfeed.StepMonitor``, without per-step
  synchronisation: its shares, verdict and fix, and the pass's wall-clock rate.
- :func:`epoch_passes`: whole epochs timed as the plain pass, a row per epoch with the loader's
  setting (the autotune convergence run).

Example:
    >>> step = trainer("cnn", cuda=False, lr=0.01)                              # doctest: +SKIP
    >>> stream = batches(lambda: iter(dl), lambda b: (b["image"], b["label"]))  # doctest: +SKIP
    >>> plain_pass(stream, step, 20, stream_sync(False))["data_share"]          # doctest: +SKIP
    0.13
"""

from __future__ import annotations

import statistics
from typing import Any, Callable, Iterator

from benchmarks.lib.measure import Stopwatch

__all__ = ["Step", "batches", "epoch_passes", "model", "monitored_pass", "plain_pass", "stream_sync", "trainer"]

#: one training step on (images, labels)
Step = Callable[[Any, Any], None]


def model(name: str) -> Any:
    """``cnn`` (3 convolutions, 1000 outputs) or a torchvision model by name (``resnet50``), 1000 classes."""
    import torch

    if name == "cnn":
        return torch.nn.Sequential(
            torch.nn.Conv2d(3, 16, 3, stride=2, padding=1), torch.nn.ReLU(),
            torch.nn.Conv2d(16, 32, 3, stride=2, padding=1), torch.nn.ReLU(),
            torch.nn.Conv2d(32, 64, 3, stride=2, padding=1), torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(64, 1000))
    import torchvision

    return getattr(torchvision.models, name)(num_classes=1000)


def trainer(name: str, *, cuda: bool, lr: float) -> Step:
    """One training step of model ``name`` on (uint8 NCHW images, labels), SGD with momentum."""
    import torch
    import torch.nn.functional as F

    device = torch.device("cuda" if cuda else "cpu")
    fmt = torch.channels_last if cuda else torch.contiguous_format
    net = model(name).to(device, memory_format=fmt)
    opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9, weight_decay=1e-4)
    mean = torch.tensor([0.485, 0.456, 0.406], device=device).view(1, 3, 1, 1) * 255
    std = torch.tensor([0.229, 0.224, 0.225], device=device).view(1, 3, 1, 1) * 255

    def step(images: Any, labels: Any) -> None:
        x = images.to(device, non_blocking=True).contiguous(memory_format=fmt)
        y = labels.to(device, non_blocking=True).long()
        x = x.float().sub_(mean).div_(std)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
            loss = F.cross_entropy(net(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def stream_sync(cuda: bool) -> Callable[[], None]:
    """Wait for the training stream's work (on the CPU: nothing to wait for).

    Not ``torch.cuda.synchronize()``: a device-wide sync also waits for the work of other
    streams, DALI's decoding of the batches ahead among them, which is no part of the step.
    """
    if not cuda:
        return _nothing
    import torch

    return torch.cuda.current_stream().synchronize


def _nothing() -> None:
    return None


def batches(epoch: Callable[[], Iterator[Any]],
            split: Callable[[Any], tuple[Any, Any]]) -> Iterator[tuple[Any, Any, bool]]:
    """(images, labels, first batch of an epoch) over epochs: ``epoch()`` starts each pass."""
    while True:
        first = True
        for batch in epoch():
            images, labels = split(batch)
            yield images, labels, first
            first = False


def plain_pass(stream: Iterator[Any], step: Step, steps: int, sync: Callable[[], None]) -> dict[str, Any]:
    """``steps`` steps, each timed on the host: ``next()``, then the step and ``sync()``.

    Returns img/s, the data-wait share, the epoch starts among the steps and the share without
    them, the median step and wait.
    """
    clock = Stopwatch.start()
    waits, totals, starts, samples = [], [], [], 0
    for _ in range(steps):
        t0 = clock.elapsed()
        images, labels, first = next(stream)
        t1 = clock.elapsed()
        step(images, labels)
        sync()
        t2 = clock.elapsed()
        waits.append(t1 - t0)
        totals.append(t2 - t0)
        starts.append(first)
        samples += len(labels)
    seconds = sum(totals)
    inside = [(w, t) for w, t, f in zip(waits, totals, starts) if not f]
    inner = sum(w for w, _ in inside) / sum(t for _, t in inside) if inside else None
    return {"steps": steps, "samples": samples, "seconds": seconds, "img_s": samples / seconds,
            "data_share": sum(waits) / seconds, "epoch_starts": sum(starts), "data_share_within_epochs": inner,
            "step_ms_median": 1e3 * statistics.median(totals), "wait_ms_median": 1e3 * statistics.median(waits)}


def monitored_pass(stream: Iterator[Any], step: Step, steps: int, loader: Any, every: int,
                   sync: Callable[[], None]) -> dict[str, Any]:
    """``steps + 1`` steps under ``fastfeed.StepMonitor(every=every)`` (its first is start-up, left out).

    ``loader`` is what the stream reads (the monitor takes its stage times and settings, as
    ``mon(dl)`` does). No synchronisation but one at each end: the img/s is the pass's wall clock.
    """
    import fastfeed

    mon = fastfeed.StepMonitor(every=every)
    mon.attach(loader)
    starts, samples = [], 0
    sync()
    with Stopwatch() as wall:
        for _ in range(steps + 1):
            mon.begin_wait()
            images, labels, first = next(stream)
            mon.begin_step(samples=len(labels))
            step(images, labels)
            starts.append(first)
            samples += len(labels)
        mon.end_pass()
        sync()
    r = mon.report()
    return {"steps": r.steps, "img_s": samples / wall.wall, "monitor_img_s": r.samples_per_s,
            "step_ms": 1e3 * r.step_s, "data_share": r.shares["data"], "shares": r.shares, "verdict": r.verdict,
            "title": r.title, "why": r.why, "fix": r.fix, "stage": r.stage, "notes": list(r.notes),
            "epoch_starts": sum(starts[1:])}


def epoch_passes(epoch: Callable[[], Iterator[Any]], split: Callable[[Any], tuple[Any, Any]], step: Step,
                 epochs: int, sync: Callable[[], None], setting: Callable[[], dict[str, Any]]) -> list[dict[str, Any]]:
    """``epochs`` whole epochs, each step timed as :func:`plain_pass` does; a row per epoch.

    ``setting()`` is read after each epoch's first batch (a worker count changed at the boundary
    applies from there) and after its last (a prefetch changed within it). Each row: img/s and the
    data-wait share over the epoch, the share without its first step (the queue the workers refill
    from ``iter()``), the first batch's wait, and the settings.
    """
    rows = []
    for e in range(epochs):
        clock = Stopwatch.start()
        waits, totals, samples, first = [], [], 0, None
        it = epoch()
        while True:
            t0 = clock.elapsed()
            batch = next(it, None)
            if batch is None:
                break
            t1 = clock.elapsed()
            images, labels = split(batch)
            if first is None:
                first = setting()
            step(images, labels)
            sync()
            t2 = clock.elapsed()
            waits.append(t1 - t0)
            totals.append(t2 - t0)
            samples += len(labels)
        seconds = sum(totals)
        inner = sum(waits[1:]) / sum(totals[1:]) if len(totals) > 1 else None
        rows.append({"epoch": e, "steps": len(totals), "img_s": samples / seconds if seconds else 0.0,
                     "data_share": sum(waits) / seconds if seconds else 0.0, "data_share_after_first": inner,
                     "first_wait_s": waits[0] if waits else 0.0, "at_start": first or setting(), "at_end": setting()})
    return rows
