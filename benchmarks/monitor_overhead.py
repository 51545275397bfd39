"""Goal: fastfeed.StepMonitor costs at most 1% of a realistic training step (issue 28, item 4).

One model, one training step per batch, two ways, interleaved round by round (the order alternates,
so drift favours neither):

- ``off``: ``for batch in batches: step(batch)``;
- ``on``: ``mon = fastfeed.StepMonitor(every=--every)``, ``model = mon.watch(model)``,
  ``for batch in mon(batches): step(batch)``.

Each pass times ``--steps`` steps after ``--warmup`` untimed ones (``lib.measure.Stopwatch``; on
the GPU one synchronisation at the end of the pass, none per step, so the monitor's CUDA events
are read as they are in training). The figure is the median over rounds of ``on / off - 1``,
paired by round; beside it, the monitor's own time per step from its report (its ``other``
share: the bookkeeping between steps, window closes included) and from a loop that does nothing
but step the monitor.

Models: ``--model cnn`` (a small CNN, 3 convolutions on 3x64x64, batch 32, one intra-op thread:
the CPU default, ~23 ms a step on the 2-core machine) or ``resnet50``
(torchvision's ResNet-50, 224x224, batch 128, channels_last, bf16 autocast: the GPU default).
Batches come from memory (already on the device) unless ``--data PATH`` names a packed dataset
(or ``--data synth``: ``--images`` generated ImageNet-like JPEGs, packed once), read by
``fastfeed.loader`` (``--workers``, ``--decode``): then the monitor's verdict is the figure to
read (CPU decode with too few workers: input-bound; ``--decode dali``: compute-bound). Under
``torchrun`` each rank trains a DDP replica (NCCL on GPUs, gloo on the CPU) and the monitor's one
all_gather per window is in the figure too. ``--profile`` runs ``torch.profiler`` over the
last round's monitored pass, leaves that round out of the overhead (the profiler costs time of its
own) and cross-checks the monitor's data-wait share against the profiler's time in the
DataLoader's ``__next__`` for the same steps (a fastfeed CPU loader is a DataLoader; a DALI
loader is not, so there only the GPU's busy share is printed, beside the monitor's).

Run (dev machine, 2 cores)::

    .venv/bin/python benchmarks/run.py monitor_overhead --repeat 7

Run (GPU machine, one H200)::

    python3 benchmarks/run.py monitor_overhead --model resnet50 --device cuda --repeat 5 \\
        --json $OUT/monitor_overhead.json
    python3 benchmarks/run.py monitor_overhead --model resnet50 --device cuda --data synth --workers 2 \\
        --repeat 3 --profile --json $OUT/monitor_cpu2.json      # CPU decode, too few workers: input-bound
    python3 benchmarks/run.py monitor_overhead --model resnet50 --device cuda --data synth --decode dali \\
        --repeat 3 --profile --json $OUT/monitor_dali.json      # GPU decode: compute-bound
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

if __name__ == "__main__":  # run as a script: the repo's root on the path, for benchmarks.lib
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.lib.data import pack_once, synth_image_folder  # noqa: E402
from benchmarks.lib.loaders import fastfeed_loader  # noqa: E402
from benchmarks.lib.measure import Stopwatch  # noqa: E402
from benchmarks.lib.report import log  # noqa: E402
from benchmarks.lib.suite import REPEAT, Axis, Benchmark, Context, Point  # noqa: E402

#: the issue's goal: the monitor's cost as a share of the step
GOAL = 0.01


def options(ap: argparse.ArgumentParser) -> None:
    """The model, the device, the steps, the monitor's window."""
    ap.add_argument("--model", choices=("cnn", "resnet50"), default=None, help="default: resnet50 on CUDA, else cnn")
    ap.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    ap.add_argument("--batch-size", type=int, default=None, help="default: 128 (resnet50), 32 (cnn)")
    ap.add_argument("--steps", type=int, default=200, help="timed steps per pass")
    ap.add_argument("--warmup", type=int, default=10, help="untimed steps before each pass")
    ap.add_argument("--every", type=int, default=50, help="the monitor's window (steps per all_gather)")
    ap.add_argument("--clock", choices=("auto", "host", "cuda"), default="auto", help="the monitor's clock")
    ap.add_argument("--data", default=None, help="a packed dataset to read batches from, or 'synth' (generated "
                    "ImageNet-like JPEGs, --images of them, packed once under bench-data/); default: memory")
    ap.add_argument("--images", type=int, default=10_000, help="images of --data synth")
    ap.add_argument("--workers", type=int, default=4, help="loader workers with --data")
    ap.add_argument("--decode", default="cpu", help="loader decode with --data (cpu, dali)")
    ap.add_argument("--profile", action="store_true", help="torch.profiler over the last monitored pass (a cross-check of the shares)")


# ---------------------------------------------------------------------- the model and its step
def _setup(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    if "WORLD_SIZE" in os.environ and not dist.is_initialized():  # torchrun
        dist.init_process_group("nccl" if cuda else "gloo")
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device(f"cuda:{local}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    name = args.model or ("resnet50" if cuda else "cnn")
    size, batch = (224, args.batch_size or 128) if name == "resnet50" else (64, args.batch_size or 32)
    if name == "resnet50":
        import torchvision

        net = torchvision.models.resnet50(num_classes=1000)
    else:
        if not cuda:  # one intra-op thread: two threads on a shared 2-core machine make the step 3x slower and noisy
            torch.set_num_threads(1)
        net = torch.nn.Sequential(
            torch.nn.Conv2d(3, 16, 3, stride=2, padding=1), torch.nn.ReLU(),
            torch.nn.Conv2d(16, 32, 3, stride=2, padding=1), torch.nn.ReLU(),
            torch.nn.Conv2d(32, 64, 3, stride=2, padding=1), torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(64, 1000))
    net = net.to(device, memory_format=torch.channels_last if cuda else torch.contiguous_format)
    gen = torch.Generator().manual_seed(0)
    memory = [(torch.randn(batch, 3, size, size, generator=gen).to(device),
               torch.randint(0, 1000, (batch,), generator=gen).to(device)) for _ in range(8)]
    return {"net": net, "device": device, "cuda": cuda, "model_name": name, "batch": batch, "size": size,
            "memory": memory, "rank": dist.get_rank() if dist.is_initialized() else 0,
            "world": dist.get_world_size() if dist.is_initialized() else 1}


def _step(model: Any, opt: Any, s: dict[str, Any]) -> Callable[[Any], None]:
    import torch

    amp = s["cuda"]

    def step(batch: Any) -> None:
        if isinstance(batch, dict):  # from a fastfeed loader: NCHW images, uint8 unless Dali(output=...) says so
            x = batch["image"].to(s["device"], non_blocking=True)
            if x.shape[1] != 3 and x.shape[-1] == 3:
                x = x.permute(0, 3, 1, 2)
            x = x.float().div_(255) if x.dtype == torch.uint8 else x.float()
            y = batch["label"].to(s["device"], non_blocking=True).long()
        else:
            x, y = batch
        with torch.autocast(s["device"].type, dtype=torch.bfloat16, enabled=amp):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def _batches(ctx: Context, n: int) -> Iterable[Any]:
    dl = ctx.data.get("loader")
    if dl is None:
        return itertools.islice(itertools.cycle(ctx.data["memory"]), n)
    return itertools.islice(_forever(dl), n)


def _forever(dl: Any) -> Iterator[Any]:
    epoch = 0
    while True:
        dl.set_epoch(epoch)
        yield from dl
        epoch += 1


def prepare(ctx: Context) -> dict[str, Any]:
    """The model and its batches, once; the cost of stepping the monitor alone."""
    import fastfeed

    s = _setup(ctx.args)
    if ctx.args.data:
        path = ctx.args.data
        if path == "synth":
            path = pack_once(synth_image_folder(ctx.args.images), samples_per_shard=256, jpeg_restarts=None)
        cpu = ctx.args.decode == "cpu"  # DALI starts no workers; pinned memory: the loader's default with CUDA
        s["loader"] = fastfeed_loader(path, batch_size=s["batch"], image_size=s["size"], decode=ctx.args.decode,
                                      workers=ctx.args.workers if cpu else None)
        s["data"] = str(path)
    for _ in fastfeed.StepMonitor(every=ctx.args.every, clock="host")(range(1000)):  # first calls, imports
        pass
    mon = fastfeed.StepMonitor(every=ctx.args.every, clock="host")
    n = 20_000
    with Stopwatch() as sw:
        for _ in mon(range(n)):
            pass
    s["empty_step_us"] = sw.wall / n * 1e6  # the monitor's whole cost per step, windows included, one process
    log(f"{s['model_name']} batch {s['batch']} on {s['device']} x {s['world']} rank(s); stepping the monitor "
        f"alone: {s['empty_step_us']:.1f} us per step")
    return s


def run_point(point: Point, ctx: Context) -> dict[str, Any]:
    """One pass of ``--steps`` steps, with or without the monitor."""
    import torch
    import torch.distributed as dist

    import fastfeed

    args, s = ctx.args, ctx.data
    model = s["net"]
    if dist.is_initialized():  # a fresh wrapper per pass: a comm hook can be registered once per DDP model
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[s["device"]] if s["cuda"] else None)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    step = _step(model, opt, s)
    sync = torch.cuda.synchronize if s["cuda"] else (lambda: None)
    for batch in _batches(ctx, args.warmup):
        step(batch)
    sync()
    on = point["monitor"] == "on"
    mon = fastfeed.StepMonitor(every=args.every, clock=args.clock) if on else None
    if mon is not None:
        model = mon.watch(model)
    profile = on and args.profile and point["round"] == args.repeat - 1
    prof = _profiler(s["cuda"]) if profile else None
    batches = _batches(ctx, args.steps)
    with Stopwatch() as sw:
        if prof is not None:
            prof.__enter__()
        for batch in (mon(batches) if mon is not None else batches):
            step(batch)
        sync()
        if prof is not None:
            prof.__exit__(None, None, None)
    row: dict[str, Any] = {"step_s": sw.wall / args.steps}
    if mon is not None:
        r = mon.report()
        row.update(verdict=r.verdict, shares=r.shares, own_us=r.shares["other"] * r.step_s * 1e6)
        if prof is not None:
            row["profiler_gpu_busy"] = _gpu_busy(prof, sw.wall)
            row["profiler_next_share"] = _next_share(prof, sw.wall)
    return row


def _profiler(cuda: bool) -> Any:
    import torch

    acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    return torch.profiler.profile(activities=acts)


def _next_share(prof: Any, wall_s: float) -> float | None:
    """The share of the pass the loop spent in the DataLoader's ``__next__``, as torch.profiler records it
    (its ``enumerate(DataLoader)#...__next__`` ranges): the profiler's own figure for the monitor's data wait
    (None: no such range, e.g. a DALI loader, which is no DataLoader)."""
    spans = [e.time_range.elapsed_us() for e in prof.events()
             if "DataLoader" in e.name and e.name.endswith("__next__")]
    return sum(spans) / 1e6 / wall_s if spans else None


def _gpu_busy(prof: Any, wall_s: float) -> float | None:
    """The union of the CUDA kernels' intervals over the pass's wall time (None: none recorded)."""
    from torch.autograd import DeviceType

    spans = sorted((e.time_range.start, e.time_range.end) for e in prof.events()
                   if getattr(e, "device_type", None) == DeviceType.CUDA)
    if not spans:
        return None
    busy, (lo, hi) = 0.0, spans[0]
    for a, b in spans[1:]:
        if a > hi:
            busy, lo, hi = busy + hi - lo, a, b
        else:
            hi = max(hi, b)
    busy += hi - lo
    return busy / 1e6 / wall_s


# ---------------------------------------------------------------------- the report
def report(rows: list[tuple[Point, dict[str, Any]]], ctx: Context) -> dict[str, Any]:
    """Paired rounds, the median overhead against the goal, the monitor's own time per step."""
    s = ctx.data
    if s["rank"] != 0:
        return {}
    by_round: dict[int, dict[str, dict[str, Any]]] = {}
    for pt, row in rows:
        by_round.setdefault(pt["round"], {})[pt["monitor"]] = row
    # a profiled pass pays for the profiler: it cross-checks the shares, it is not an overhead round
    pairs = [(r["off"]["step_s"], r["on"]["step_s"], r["on"]) for r in by_round.values()
             if {"off", "on"} <= set(r) and "profiler_gpu_busy" not in r["on"]]
    table = [{"round": i, "off_ms": off * 1e3, "on_ms": on * 1e3, "ratio": on / off, "own_us": mon["own_us"],
              "verdict": mon["verdict"]} for i, (off, on, mon) in enumerate(pairs)]
    print(f"\n== fastfeed.StepMonitor overhead: {s['model_name']}, batch {s['batch']}, {s['device']}, "
          f"{s['world']} rank(s), every={ctx.args.every}, {ctx.args.steps} steps per pass")
    print(f"{'round':<6}{'off ms/step':>12}{'on ms/step':>12}{'on/off':>9}{'monitor us/step':>17}  verdict")
    for t in table:
        print(f"{t['round']:<6}{t['off_ms']:>12.2f}{t['on_ms']:>12.2f}{t['ratio']:>9.4f}{t['own_us']:>17.1f}  "
              f"{t['verdict']}")
    ratios = [t["ratio"] for t in table]
    overhead = statistics.median(ratios) - 1 if ratios else float("nan")
    step_ms = statistics.median(t["off_ms"] for t in table) if table else float("nan")
    own = statistics.median(t["own_us"] for t in table) if table else float("nan")
    spread = f"{min(ratios) - 1:+.2%} .. {max(ratios) - 1:+.2%}" if ratios else "-"
    met = "met" if overhead <= GOAL else "MISSED"
    print(f"overhead {overhead:+.2%} of a {step_ms:.1f} ms step (median of {len(ratios)} paired rounds; "
          f"rounds {spread}) [<= {GOAL:.0%}: {met}]")
    print(f"the monitor's own time: {own:.0f} us per step in training ({own / 1e3 / step_ms:.2%} of the step), "
          f"{s['empty_step_us']:.1f} us per step stepping it alone")
    profiled = [row for _, row in rows if "profiler_gpu_busy" in row]
    busy = [row["profiler_gpu_busy"] for row in profiled]
    if profiled:
        last = profiled[-1]
        nxt = last.get("profiler_next_share")
        said = (f"time in DataLoader.__next__ {nxt:.1%} of the pass" if nxt is not None
                else "no DataLoader.__next__ range (not a DataLoader)")
        print(f"cross-check, the profiled pass (left out of the overhead rounds): torch.profiler: {said}; "
              f"the monitor: data wait {last['shares']['data']:.1%}"
              + (f" (difference {last['shares']['data'] - nxt:+.1%})" if nxt is not None else ""))
        gb = last["profiler_gpu_busy"]
        print(f"  (GPU kernels busy {gb:.1%} of the pass; the monitor's compute + collective "
              f"{last['shares']['compute'] + last['shares']['collective']:.1%} counts a step's host time too, so these "
              "differ where the step is launch-bound)" if gb is not None else "  (no CUDA kernel recorded)")
    verdicts = sorted({t["verdict"] for t in table})
    print(f"the monitor's verdict{'s' if len(verdicts) > 1 else ''}: {', '.join(verdicts)}"
          + (f" (batches from {s['data']}, decode={ctx.args.decode})" if s.get("data") else " (batches from memory)"))
    return {"env": ctx.env, "model": s["model_name"], "batch": s["batch"], "device": str(s["device"]),
            "data": s.get("data"), "decode": ctx.args.decode if s.get("data") else None, "verdicts": verdicts,
            "world": s["world"], "every": ctx.args.every, "steps": ctx.args.steps, "rounds": table,
            "overhead": overhead, "step_ms": step_ms, "own_us_per_step": own, "empty_step_us": s["empty_step_us"],
            "goal": GOAL, "met": overhead <= GOAL, "profiler_gpu_busy": busy[-1] if busy else None,
            "profiler_next_share": profiled[-1].get("profiler_next_share") if profiled else None}


BENCHMARK = Benchmark(
    name="monitor_overhead", doc=__doc__, options=options, prepare=prepare, run_point=run_point, report=report,
    grid=(REPEAT, Axis("monitor", ("off", "on"), alternate=True, help="without / with fastfeed.StepMonitor")),
    repeat=5, quick={"steps": 30, "warmup": 3, "repeat": 1, "every": 10},
)

if __name__ == "__main__":
    from benchmarks.run import main

    sys.exit(main([BENCHMARK.name, *sys.argv[1:]]))
