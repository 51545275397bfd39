"""Scaling study (issue 8): does step time stay flat as GPUs are added at a fixed global batch?

Run once per GPU count on one host, each rank a process:

    NCCL_NVLS_ENABLE=0 torchrun --nproc-per-node N benchmarks/scaling.py image \
        --data DATA --pipeline fastfeed-dali --global-batch 512 --json out_N.json
    NCCL_NVLS_ENABLE=0 torchrun --nproc-per-node N benchmarks/scaling.py tokens \
        --global-budget 32768 --json out_N.json
    python benchmarks/scaling.py summary out_*.json        # table + scaling efficiency
    python benchmarks/scaling.py summary scaltok_1.json ddp_tokens.json   # a ddp_tokens run is the N-GPU leg

Image workload: ResNet-50 (channels_last, bf16 autocast, SGD) reading

- ``fastfeed-dali``: ``fastfeed.loader(decode="dali")`` over fastfeed shards;
- ``fastfeed-cpu``: ``fastfeed.loader(decode="cpu")`` with worker processes;
- ``imagefolder``: torchvision ``ImageFolder`` + ``DistributedSampler`` + DataLoader (the baseline),
  RandomResizedCrop 224 + flip + PILToTensor, the same workers per rank.

Token workload: the transformer of ``benchmarks/ddp_tokens.py`` (fastfeed's samplers vs torch's
``DistributedSampler``) with the per-rank budget = global budget / N, so the global batch is fixed.

Per step and rank: data wait (``loader.stats`` for fastfeed, the same timer around ``next()``
for the baseline), compute (forward + backward, CUDA events), and the AllReduce split in two:
``straggler wait`` (a 1-element all_reduce: completes when the slowest rank arrives) and
``comm`` (the gradient all_reduce itself). Throughput counts the global batch over rank 0's wall
time. Scaling efficiency = throughput_N / (N x throughput_1), computed by ``summary``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any, Iterator

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast stays off (device notes)

import numpy as np  # noqa: E402

if __name__ == "__main__":  # run as a script: the repo's root on the path, for benchmarks.lib
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.lib.loaders import fastfeed_loader  # noqa: E402
from benchmarks.lib.measure import Stopwatch  # noqa: E402
from benchmarks.lib.suite import Benchmark, Context  # noqa: E402


def _dist_setup() -> tuple[Any, int, int, Any]:
    import torch
    import torch.distributed as dist

    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    local = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    return dist, dist.get_rank(), dist.get_world_size(), device


class _Timer:
    """CUDA events on a GPU, a :class:`Stopwatch` on CPU; ``between`` in seconds, synchronised."""

    def __init__(self, cuda: bool) -> None:
        import torch

        self.cuda = cuda
        self._torch = torch
        self._clock = Stopwatch.start()

    def mark(self) -> Any:
        if self.cuda:
            e = self._torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return self._clock.elapsed()

    def between(self, a: Any, b: Any) -> float:
        if self.cuda:
            b.synchronize()
            return a.elapsed_time(b) / 1000.0
        return b - a


def _baseline_loader(data: Path, per_rank: int, workers: int, rank: int, world: int) -> Any:
    import torch
    from torch.utils.data import DataLoader, DistributedSampler
    from torchvision import datasets, transforms

    tf = transforms.Compose([transforms.RandomResizedCrop(224), transforms.RandomHorizontalFlip(),
                             transforms.PILToTensor()])
    ds = datasets.ImageFolder(str(data), transform=tf)
    sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True, drop_last=True)
    dl = DataLoader(ds, batch_size=per_rank, sampler=sampler, num_workers=workers, drop_last=True,
                    pin_memory=torch.cuda.is_available(), persistent_workers=workers > 0,
                    prefetch_factor=4 if workers else None)
    dl.sampler_ = sampler
    return dl


def _batches(dl: Any, baseline: bool, epoch0: int = 0) -> Iterator[tuple[Any, Any, float]]:
    """Endless (images, labels, wait seconds) over epochs."""
    epoch = epoch0
    while True:
        if baseline:
            dl.sampler_.set_epoch(epoch)
        else:
            dl.set_epoch(epoch)
        it = iter(dl)
        while True:
            with Stopwatch() as waited:
                try:
                    b = next(it)
                except StopIteration:
                    b = None
            if b is None:
                break
            wait = waited.wall
            if baseline:
                yield b[0], b[1], wait
            else:
                yield b["image"], b["label"], wait
        epoch += 1


def run_image(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    import torch.nn.functional as F
    import torchvision

    dist, rank, world, device = _dist_setup()
    cuda = device.type == "cuda"
    per_rank = args.global_batch // world
    cores = len(os.sched_getaffinity(0))
    workers = args.workers if args.workers is not None else max(1, cores // world - 2)
    if args.pipeline == "imagefolder":
        dl = _baseline_loader(Path(args.data) / "folder", per_rank, workers, rank, world)
    else:
        kw: dict[str, Any] = dict(batch_size=per_rank, image_size=224, drop_last=True, seed=0,
                                  rank=rank, world_size=world)
        if args.pipeline == "fastfeed-dali":
            kw.update(decode="dali", device_id=device.index if cuda else None)
        else:
            kw.update(decode="cpu", workers=workers, prefetch=4)
        dl = fastfeed_loader(Path(args.data) / "shards", **kw)
    model = torchvision.models.resnet50(num_classes=1000).to(device).to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    params = [p for p in model.parameters() if p.requires_grad]
    mean = torch.tensor([0.485, 0.456, 0.406], device=device).view(1, 3, 1, 1) * 255
    std = torch.tensor([0.229, 0.224, 0.225], device=device).view(1, 3, 1, 1) * 255
    timer = _Timer(cuda)
    one = torch.zeros(1, device=device)
    rec: list[tuple[float, float, float, float]] = []
    stream = _batches(dl, args.pipeline == "imagefolder")
    clock = Stopwatch.start()
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            if cuda:
                torch.cuda.synchronize()
            dist.barrier()
            rec = []
            clock = Stopwatch.start()
        images, labels, wait = next(stream)
        images = images.to(device, non_blocking=True)
        labels = labels.to(device, non_blocking=True)
        x = images.float().sub_(mean).div_(std).contiguous(memory_format=torch.channels_last)
        t0 = timer.mark()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
            loss = F.cross_entropy(model(x), labels.long() % 1000)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        t1 = timer.mark()
        dist.all_reduce(one)  # completes when the slowest rank arrives
        t2 = timer.mark()
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        dist.all_reduce(flat)
        flat.div_(world)
        off = 0
        for p in params:
            n = p.numel()
            p.grad.copy_(flat[off:off + n].view_as(p.grad))
            off += n
        t3 = timer.mark()
        opt.step()
        rec.append((wait, timer.between(t0, t1), timer.between(t1, t2), timer.between(t2, t3)))
    if cuda:
        torch.cuda.synchronize()
    dist.barrier()
    wall = clock.elapsed()
    arr = np.array(rec)
    mine = {"rank": rank, "data_wait_s": float(arr[:, 0].sum()), "compute_s": float(arr[:, 1].sum()),
            "straggler_s": float(arr[:, 2].sum()), "comm_s": float(arr[:, 3].sum()), "wall_s": wall}
    everyone: list[Any] = [None] * world
    dist.all_gather_object(everyone, mine)
    out = {"workload": "image", "pipeline": args.pipeline, "world_size": world, "global_batch": args.global_batch,
           "workers_per_rank": workers if args.pipeline != "fastfeed-dali" else 0, "steps": args.steps,
           "images_per_s": args.global_batch * args.steps / wall, "step_ms": 1000 * wall / args.steps,
           "per_rank": everyone,
           "data_wait_share": float(np.mean([e["data_wait_s"] / e["wall_s"] for e in everyone])),
           "straggler_share": float(np.mean([e["straggler_s"] / e["wall_s"] for e in everyone])),
           "comm_share": float(np.mean([e["comm_s"] / e["wall_s"] for e in everyone])),
           "device": torch.cuda.get_device_name() if cuda else "cpu"}
    dist.destroy_process_group()
    return out


def run_tokens(args: argparse.Namespace) -> dict[str, Any]:
    """``benchmarks/ddp_tokens.py`` at this world size, the per-rank budget scaled to a fixed global one."""
    from benchmarks import ddp_tokens
    from benchmarks.run import run_benchmark

    world = int(os.environ.get("WORLD_SIZE", "1"))
    tmp = args.json + ".tokens.tmp" if args.json else f"/tmp/scaling_tokens_{world}.json"
    # the per-rank budget halves with every doubling of GPUs: the global batch stays fixed. At
    # 1 GPU the fixed-batch configs hold 2x the 2-GPU rows; ddp_tokens runs a batch over
    # --max-micro-tokens as gradient-accumulated chunks, so it fits where one pass would not.
    argv = ["--budget", str(args.global_budget // world), "--steps", str(args.steps), "--warmup",
            str(args.warmup), "--configs", args.configs, "--json", tmp, *args.extra]
    if args.tiny:
        argv += ["--device", "cpu", "--tiny"]
    run_benchmark(ddp_tokens.BENCHMARK, argv)
    if int(os.environ.get("RANK", "0")) != 0:
        return {}
    rows = json.loads(Path(tmp).read_text())["ddp_tokens"]["rows"]
    return {"workload": "tokens", "world_size": world, "global_budget": args.global_budget, "rows": rows}


def _token_run(run: dict[str, Any]) -> dict[str, Any] | None:
    """A ``scaling.py tokens`` result, or a ``ddp_tokens.py --json`` one read as the same."""
    if run.get("workload") == "tokens":
        return run
    d = run.get("ddp_tokens")
    if d is None:
        return None
    budget = int(d["args"]["budget"]) * int(d["world_size"])
    return {"workload": "tokens", "world_size": d["world_size"], "global_budget": budget, "rows": d["rows"]}


def summary(paths: list[str]) -> int:
    runs = [json.loads(Path(p).read_text()) for p in paths]
    img = [r for r in runs if r.get("workload") == "image"]
    tok = [t for t in map(_token_run, runs) if t is not None]
    if img:
        one = {r["pipeline"]: r["images_per_s"] for r in img if r["world_size"] == 1}
        print(f"{'pipeline':<15}{'GPUs':>5}{'img/s':>10}{'step ms':>9}{'data wait':>10}{'straggler':>10}"
              f"{'comm':>7}{'scaling eff':>12}")
        for r in sorted(img, key=lambda r: (r["pipeline"], r["world_size"])):
            base = one.get(r["pipeline"])
            eff = r["images_per_s"] / (r["world_size"] * base) if base else float("nan")
            print(f"{r['pipeline']:<15}{r['world_size']:>5}{r['images_per_s']:>10,.0f}{r['step_ms']:>9.1f}"
                  f"{r['data_wait_share']:>10.1%}{r['straggler_share']:>10.1%}{r['comm_share']:>7.1%}{eff:>12.2f}")
    if tok:
        budgets = {r["global_budget"] for r in tok}
        if len(budgets) > 1:
            print(f"warning: token runs at different global budgets {sorted(budgets)}: efficiencies are not comparable")
        one_t = {row["config"]: row["tokens_per_s"] for r in tok if r["world_size"] == 1 for row in r["rows"]}
        print(f"{'sampler':<18}{'GPUs':>5}{'steps':>6}{'tokens/s':>12}{'step ms':>9}{'wait':>7}{'comm ms':>8}"
              f"{'scaling eff':>12}")
        for r in sorted(tok, key=lambda r: r["world_size"]):
            for row in r["rows"]:
                base = one_t.get(row["config"])
                if base is None and r["world_size"] > 1:
                    continue  # configurations without a 1-GPU run have no efficiency to show
                eff = row["tokens_per_s"] / (r["world_size"] * base) if base else float("nan")
                print(f"{row['config']:<18}{r['world_size']:>5}{row.get('steps', 0):>6}{row['tokens_per_s']:>12,.0f}"
                      f"{row['step_ms']:>9.1f}{row['wait_share_mean']:>7.1%}{row.get('comm_ms', float('nan')):>8.1f}"
                      f"{eff:>12.2f}")
    return 0


def clocks(path: str) -> int:
    """Summarise ``nvidia-smi --query-gpu=timestamp,index,clocks.sm,temperature.gpu,power.draw,<reasons>
    --format=csv,noheader,nounits -lms N`` samples: per GPU, SM clock spread, temperature, power and
    the clock-event (throttle) reasons seen while the GPU was busy."""
    import csv

    per: dict[str, list[tuple[float, float, float, int]]] = {}
    with open(path, newline="") as f:
        for row in csv.reader(f):
            if len(row) < 6:
                continue
            try:
                sm, temp, power = float(row[2]), float(row[3]), float(row[4])
                reasons = int(row[5].strip(), 16)
            except ValueError:
                continue
            per.setdefault(row[1].strip(), []).append((sm, temp, power, reasons))
    for gpu, rows in sorted(per.items()):
        busy = [r for r in rows if r[2] > 150]  # watts: samples taken while training ran
        if not busy:
            print(f"gpu {gpu}: {len(rows)} samples, none busy")
            continue
        sm = np.array([r[0] for r in busy])
        seen: dict[int, int] = {}
        for r in busy:
            seen[r[3]] = seen.get(r[3], 0) + 1
        reasons = ", ".join(f"0x{k:x}: {v}" for k, v in sorted(seen.items()))
        print(f"gpu {gpu}: {len(busy)} busy samples, SM clock MHz min {sm.min():.0f} / median {np.median(sm):.0f} / "
              f"max {sm.max():.0f}, temp max {max(r[1] for r in busy):.0f} C, power median "
              f"{np.median([r[2] for r in busy]):.0f} W, event reasons {reasons}")
    return 0


def prepare(args: argparse.Namespace) -> int:
    """Build DATA/folder (ImageFolder of replicated photos) and DATA/shards (fastfeed pack)."""
    import shutil

    import fastfeed

    src, out = Path(args.source), Path(args.data)
    folder = out / "folder"
    files = sorted(p for p in src.rglob("*") if p.suffix.lower() in (".jpg", ".jpeg"))
    if not files:
        raise SystemExit(f"{src}: no JPEGs to replicate")
    for i in range(args.replicate):
        f = files[i % len(files)]
        dst = folder / f.parent.name / f"{f.stem}_{i:06d}{f.suffix.lower()}"
        dst.parent.mkdir(parents=True, exist_ok=True)
        if not dst.exists():
            shutil.copyfile(f, dst)
    fastfeed.pack(folder, out / "shards", samples_per_shard=args.samples_per_shard, workers=args.pack_workers,
                  max_side=args.max_side, overwrite=True)
    print(f"prepared {args.replicate} images in {folder} and shards in {out / 'shards'}")
    return 0


def options(ap: argparse.ArgumentParser) -> None:
    """The subcommands: prepare the data, run one leg (image, tokens), summarise, read GPU clocks."""
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("--source", required=True, help="folder of JPEGs in class folders")
    p.add_argument("--data", required=True)
    p.add_argument("--replicate", type=int, default=8192)
    p.add_argument("--samples-per-shard", type=int, default=512)
    p.add_argument("--pack-workers", type=int, default=8)
    p.add_argument("--max-side", type=int, default=500)
    i = sub.add_parser("image")
    i.add_argument("--data", required=True)
    i.add_argument("--pipeline", choices=["fastfeed-dali", "fastfeed-cpu", "imagefolder"], required=True)
    i.add_argument("--global-batch", type=int, default=512)
    i.add_argument("--workers", type=int, default=None, help="per rank (default: cores / ranks - 2)")
    i.add_argument("--steps", type=int, default=40)
    i.add_argument("--warmup", type=int, default=8)
    i.add_argument("--json", default=None)
    t = sub.add_parser("tokens")
    t.add_argument("--global-budget", type=int, default=32768)
    t.add_argument("--configs", default="ds-fixed,ff-tokens,ff-bucket")
    t.add_argument("--steps", type=int, default=60)
    t.add_argument("--warmup", type=int, default=8)
    t.add_argument("--tiny", action="store_true", help="CPU, tiny model: a quick check")
    t.add_argument("--json", default=None)
    t.add_argument("extra", nargs=argparse.REMAINDER, help="after --: more ddp_tokens.py options")
    s = sub.add_parser("summary", help="tables from scal_*.json, scaltok_*.json and ddp_tokens.json files")
    s.add_argument("paths", nargs="+")
    c = sub.add_parser("clocks", help="summarise an nvidia-smi CSV log (the tokens stage writes one)")
    c.add_argument("path")


def run(ctx: Context) -> dict[str, Any]:
    """One subcommand; a leg's figures on rank 0 (printed and written by the runner), else {}."""
    args = ctx.args
    if args.cmd == "summary":
        summary(args.paths)
        return {}
    if args.cmd == "clocks":
        clocks(args.path)
        return {}
    if args.cmd == "tokens":
        args.extra = [a for a in args.extra if a != "--"]
    if args.cmd == "prepare":
        prepare(args)
        return {}
    out = run_image(args) if args.cmd == "image" else run_tokens(args)
    return out if out and int(os.environ.get("RANK", "0")) == 0 else {}


BENCHMARK = Benchmark(
    name="scaling", doc=__doc__, options=options, run=run,
    launcher="torchrun --nproc-per-node N benchmarks/scaling.py image|tokens ...",
)

if __name__ == "__main__":
    from benchmarks.run import main

    sys.exit(main([BENCHMARK.name, *sys.argv[1:]]))
