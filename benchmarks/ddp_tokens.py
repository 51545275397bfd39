"""DDP benchmark (issues 4 and 10): real tokens/s and time waiting for the slowest rank.

A 12-layer, width-1024 transformer encoder (bf16 autocast) trains on random tokens whose
sequence lengths follow lognormal(5, 1) clamped to [16, 1024], over torchrun ranks.
Each configuration runs ``--steps`` measured steps after a warm-up, at the same average
real tokens per step:

  equal-work      control: every rank trains the *same* batch each step (rank 0's batch of
                  ff-tokens, so shapes still vary step to step): the wait it shows is the
                  floor of the measurement, not imbalance (expected ~0)
padded inputs ([n, longest] batches, torch SDPA attention, no key mask: a throughput
benchmark, masking does not change the padded FLOPs):
  ds-fixed        torch DistributedSampler + BatchSampler(B0), B0 = same mean tokens
  ff-bucket       DistributedLengthBucketSampler(batch_size=B0)
  ff-tokens       DistributedTokenBudgetSampler(cost="tokens")
  ff-attention    DistributedTokenBudgetSampler(cost="attention", d_model=width)
  ff-fitted       DistributedTokenBudgetSampler(cost=calibrate(step, features="padded"))
packed / varlen inputs (all sequences of a batch concatenated, attention per sequence
from cu_seqlens; ``--varlen-impl``: ``flash`` = torch.nn.attention.varlen.varlen_attn, the
flash-attention varlen kernel on [T, H, D] (torch >= 2.10, CUDA); ``nested`` = a jagged
nested tensor + SDPA given its min/max length so no layer syncs the host (more host work
per layer); ``auto`` = flash where it runs a forward + backward here, else nested, else one
SDPA per group of equal-length sequences; the choice is printed and in the JSON):
  ds-fixed-varlen, ff-varlen (cost="varlen"), ff-fitted-varlen (calibrated, "varlen")

Attention backend (``--sdpa``): torch >= 2.9 prefers cuDNN attention on H100/H200. cuDNN
builds an execution plan for every new (batch, length) shape, tens of ms of host time,
cached per shape: with length-aware batches nearly every step is a new shape, so every
step paid it, on whichever rank drew the new shape. The default ``flash`` turns cuDNN
attention off (torch's flash kernel, no per-shape setup); ``default`` keeps torch's choice.
At start-up the first-call vs cached time of both backends on fresh shapes is printed, and
the config ``ff-tokens@default`` (in the default list, ``--control-steps`` steps) runs
ff-tokens again with torch's own choice: the same batches, only the backend differs.

The step runs without host synchronisation (lengths go to the GPU through pinned memory,
non-blocking), so the CPU queues work ahead and the GPU timeline is the step. The gradient
all-reduce is done by hand after backward (DDP semantics without compute/communication
overlap) so the wait is measurable. Per step and rank, CUDA events (on CPU, the run's
:class:`benchmarks.lib.measure.Stopwatch`) mark: start, compute done (forward + backward), a
1-element all_reduce done (a barrier: it completes when the slowest rank arrives), gradient
all-reduce + optimizer done.

- wait share  = time blocked in that barrier / cycle time (start of a step to the start of
  the next, so host gaps count too): what the slowest rank costs this one.
- imbalance   = slowest rank's compute - this rank's compute, per step (all-gathered), over
  the same cycle time: the part of the wait the work itself explains. The two agree
  when the ranks start their steps together; the equal-work control shows both floors.
- model error (fitted configs) = |predicted step cost - measured (cycle - wait)| per step
  and rank: how well the calibrated model predicts training steps, not only its own shapes;
  planned wait = the wait the plan leaves if the model were exact (the sampler's share).

Batches of more than ``--max-micro-tokens`` padded tokens (the 1-GPU run of the scaling
study, at twice the per-rank batch) run as row chunks padded to the batch's longest, with
gradient accumulation: the same work, within memory.

Real tokens/s counts only non-padding tokens of all ranks over rank 0's wall time. The model and
its step are :mod:`benchmarks.lib.trainer`'s.

GPU (the lead runs it, as the ``tokens`` stage of benchmarks/gpu_runs.sh):
    NCCL_NVLS_ENABLE=0 torchrun --nproc-per-node 2 benchmarks/ddp_tokens.py --steps 150
CPU check (gloo, tiny model):
    .venv/bin/torchrun --nproc-per-node 2 benchmarks/ddp_tokens.py --device cpu --tiny
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import warnings
from pathlib import Path
from typing import Any, Callable

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink SHARP multicast off (see the device notes)

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

if __name__ == "__main__":  # run as a script: the repo's root on the path, for benchmarks.lib
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import fastfeed  # noqa: E402
from fastfeed.sampling.costmodel import CostModel  # noqa: E402

from benchmarks.lib.measure import Stopwatch  # noqa: E402
from benchmarks.lib.suite import Axis, Benchmark, Context  # noqa: E402
from benchmarks.lib.trainer import VARLEN, Trainer, probe_varlen, sdpa_backend_name, sdpa_setup_probe  # noqa: E402

CONTROL = ["equal-work"]
PADDED = ["ds-fixed", "ff-bucket", "ff-tokens", "ff-attention", "ff-fitted"]
VARLEN_CONFIGS = ["ds-fixed-varlen", "ff-varlen", "ff-fitted-varlen"]


# ----------------------------------------------------------------------------- samplers
def budget_for_tokens(make: Callable[[float], Any], target: float, lo: float, hi: float) -> Any:
    """Bisect max_cost so the plan's mean real tokens per batch is ``target`` (+-2%)."""
    for _ in range(40):
        mid = math.sqrt(lo * hi)
        s = make(mid)
        n, _, s1, _ = s.epoch_plan(0).features()
        tokens = float(s1.sum() / max(1, n.size))
        if abs(tokens / target - 1) < 0.02:
            return s
        lo, hi = (mid, hi) if tokens < target else (lo, mid)
    return s


def build_sampler(name: str, lengths: np.ndarray, args: argparse.Namespace, trainer: Trainer,
                  target: float, B0: int) -> tuple[Any, dict[str, Any], CostModel | None]:
    W, rank = dist.get_world_size(), dist.get_rank()
    common = dict(num_replicas=W, rank=rank, seed=0)
    info: dict[str, Any] = {}
    if name.startswith("ds-fixed"):
        from torch.utils.data import BatchSampler, DistributedSampler

        ds = DistributedSampler(range(len(lengths)), num_replicas=W, rank=rank, seed=0, drop_last=True)

        class Fixed:
            def __iter__(self):  # type: ignore[no-untyped-def]
                return iter(BatchSampler(ds, B0, drop_last=True))

            def set_epoch(self, e: int) -> None:
                ds.set_epoch(e)
        return Fixed(), {"batch_size": B0}, None
    if name == "ff-bucket":
        return fastfeed.DistributedLengthBucketSampler(lengths, batch_size=B0, **common), {"batch_size": B0}, None
    if name in ("ff-tokens", "equal-work"):
        if name == "equal-work":
            common["rank"] = 0  # every rank draws rank 0's batches: equal work, varying shapes
        s = budget_for_tokens(lambda c: fastfeed.DistributedTokenBudgetSampler(lengths, max_cost=c, **common),
                              target, args.budget / 4, args.budget * 4)
        return s, {"max_cost": s.max_cost}, None
    costs: dict[str, Any] = {"ff-attention": CostModel.attention(d_model=args.width),
                             "ff-varlen": CostModel.varlen(d_model=args.width)}
    if name in costs:
        cost = costs[name]
        longest = cost.predict([int(lengths.max())])
        s = budget_for_tokens(lambda c: fastfeed.DistributedTokenBudgetSampler(lengths, max_cost=c, cost=cost, **common),
                              target, max(longest, args.budget / 4), args.budget * 16)
        return s, {"max_cost": s.max_cost}, None
    varlen = name.endswith("varlen")
    with Stopwatch() as calibration, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = fastfeed.calibrate(lambda lens: trainer.step(lens, varlen, record=False), lengths,
                                   max_tokens=2 * args.budget, features="varlen" if varlen else "padded",
                                   num_shapes=args.shapes, repeats=args.repeats, time_budget=args.calib_budget,
                                   min_fraction=args.min_fraction, meta={"config": name})
    if rank == 0:
        for w in caught:
            print(f"  {name}: {w.category.__name__}: {w.message}", flush=True)
    info.update(calibration_s=calibration.wall, fit_median_ape=model.fit.median_ape,
                fit_worst_ape=model.fit.worst_ape, fit_loo_median_ape=model.fit.loo_median_ape,
                fit_r2=model.fit.r2, fit_outliers=len(model.fit.outliers),
                calib_shapes=model.meta.get("shapes"),
                calib_first_call_extra_ms=1000 * model.meta.get("first_call_extra_s", float("nan")),
                model=model.summary(), coefficients=model.describe())
    longest = model.predict([int(lengths.max())])
    s = budget_for_tokens(lambda c: fastfeed.DistributedTokenBudgetSampler(lengths, max_cost=c, cost=model, **common),
                          target, longest, longest * 1000)
    info["max_cost_s"] = s.max_cost
    planned = model.cost_from_features(*s.epoch_plan(0).features())  # (steps, ranks), predicted seconds
    info["planned_wait_share"] = float((planned.max(axis=1, keepdims=True) - planned).sum() / planned.max(axis=1).sum() / W)
    return s, info, model


def _barrier(trainer: Trainer) -> None:
    if trainer.cuda:
        dist.barrier(device_ids=[trainer.device.index])
    else:
        dist.barrier()


def _memory_counters() -> dict[str, float]:
    st = torch.cuda.memory_stats()
    return {"alloc_retries": st.get("num_alloc_retries", 0), "device_allocs": st.get("num_device_alloc", 0)}


def run_config(name: str, lengths: np.ndarray, args: argparse.Namespace, trainer: Trainer,
               target: float, B0: int) -> dict[str, Any]:
    """Train one configuration; ``NAME@default`` runs NAME with torch's default SDPA backend choice."""
    base, _, variant = name.partition("@")
    if variant not in ("", "default"):
        raise SystemExit(f"config {name!r}: the only variant is @default (torch's own SDPA backend choice)")
    cudnn_was = torch.backends.cuda.cudnn_sdp_enabled()
    if variant:
        torch.backends.cuda.enable_cudnn_sdp(True)
    try:
        row = _run_config(base, lengths, args, trainer, target, B0, short=bool(variant) or base in CONTROL)
    finally:
        torch.backends.cuda.enable_cudnn_sdp(cudnn_was)
    row["config"] = name
    return row


def _run_config(name: str, lengths: np.ndarray, args: argparse.Namespace, trainer: Trainer,
                target: float, B0: int, short: bool) -> dict[str, Any]:
    sampler, info, model = build_sampler(name, lengths, args, trainer, target, B0)
    info["sdpa_padded_backend"] = sdpa_backend_name(args, trainer.device)
    varlen = name.endswith("varlen")
    steps = min(args.steps, args.control_steps) if short else args.steps
    trainer.records = []
    done, epoch = 0, 0
    clock = Stopwatch.start()
    mem0: dict[str, float] = {}
    while done < args.warmup + steps:
        sampler.set_epoch(epoch)
        for batch in sampler:
            if done == args.warmup:
                if trainer.cuda:
                    torch.cuda.synchronize()
                    torch.cuda.reset_peak_memory_stats()
                    mem0 = _memory_counters()
                _barrier(trainer)
                trainer.records = []
                clock = Stopwatch.start()
            trainer.step(lengths[np.asarray(batch)], varlen)
            done += 1
            if done == args.warmup + steps:
                break
        epoch += 1
    if trainer.cuda:
        torch.cuda.synchronize()
    _barrier(trainer)
    wall = clock.elapsed()
    mine = trainer.timings()
    if trainer.cuda:
        mem1 = _memory_counters()
        mine.update({k: mem1[k] - mem0.get(k, 0) for k in mem1}, peak_gib=torch.cuda.max_memory_allocated() / 2**30)
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    return summarise(name, everyone, wall, steps, model, info)


def summarise(name: str, everyone: list[dict[str, Any]], wall: float, steps: int,
              model: CostModel | None, info: dict[str, Any]) -> dict[str, Any]:
    """One row: throughput, wait and imbalance shares per rank, step split, model error."""
    get = {k: np.array([e[k] for e in everyone], dtype=np.float64)
           for k in ("compute", "wait", "comm", "cycle", "n", "max", "sum", "sumsq")}  # (W, steps) each
    cycle = get["cycle"].sum(axis=1)
    wait = get["wait"].sum(axis=1) / cycle
    imbalance = (get["compute"].max(axis=0) - get["compute"]).sum(axis=1) / cycle
    real = float(get["sum"].sum())
    padded = float((get["n"] * get["max"]).sum())
    row: dict[str, Any] = {
        "config": name, "tokens_per_s": real / wall, "step_ms": 1000 * wall / steps, "steps": steps,
        "wait_share_mean": float(wait.mean()), "wait_share_max": float(wait.max()),
        "wait_share_per_rank": wait.tolist(),
        "imbalance_share_mean": float(imbalance.mean()), "imbalance_share_max": float(imbalance.max()),
        "compute_ms": 1000 * float(get["compute"].mean()), "comm_ms": 1000 * float(get["comm"].mean()),
        "cycle_ms": 1000 * float(get["cycle"].mean()),
        "host_queue_ms_per_rank": [1000 * float(np.mean(e["host"])) for e in everyone],
        "padding_efficiency": real / padded, "real_tokens_per_step": real / steps, **info}
    if "peak_gib" in everyone[0]:
        row.update(peak_gib=max(e["peak_gib"] for e in everyone),
                   alloc_retries=int(sum(e["alloc_retries"] for e in everyone)),
                   device_allocs=int(sum(e["device_allocs"] for e in everyone)))
    if model is not None:
        pred = model.cost_from_features(get["n"], get["max"], get["sum"], get["sumsq"])
        work = get["cycle"] - get["wait"]
        ape = np.abs(pred - work) / work
        row.update(train_model_median_ape=float(np.median(ape)), train_model_p90_ape=float(np.quantile(ape, 0.9)),
                   train_model_bias=float(np.median(pred / work) - 1))
    return row


def _pct(v: Any) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.1%}"


def options(ap: argparse.ArgumentParser) -> None:
    """The model, the steps, the attention backends, the calibration (the configurations: the grid)."""
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--tiny", action="store_true", help="2 layers, width 64: a quick end-to-end check")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--control-steps", type=int, default=60,
                    help="measured steps of the equal-work control and of @default runs")
    ap.add_argument("--budget", type=int, default=16384, help="padded tokens per batch of ff-tokens")
    ap.add_argument("--samples", type=int, default=200_000)
    ap.add_argument("--setup-probe", action="store_true",
                    help="time SDPA's first vs cached call on new shapes per backend (padded layout)")
    ap.add_argument("--sdpa", default="flash", choices=["flash", "default"],
                    help="flash: cuDNN attention off (no per-shape plan builds); default: torch's choice")
    ap.add_argument("--varlen-impl", default="auto", choices=["auto", "flash", "nested"],
                    help="varlen attention: flash = varlen_attn (CUDA), nested = jagged nested tensors + SDPA")
    ap.add_argument("--max-micro-tokens", type=int, default=98304,
                    help="larger batches run as gradient-accumulated row chunks (memory)")
    ap.add_argument("--shapes", type=int, default=32, help="calibration shapes")
    ap.add_argument("--repeats", type=int, default=4, help="timings per calibration shape (the first is cold)")
    ap.add_argument("--min-fraction", type=float, default=0.25,
                    help="smallest calibration batch, as a share of its largest (2 x --budget)")
    ap.add_argument("--calib-budget", type=float, default=30.0, help="seconds per calibration")


def run(ctx: Context) -> dict[str, Any]:
    """Every configuration of the grid on this rank; rank 0's table and figures (other ranks: {})."""
    args = ctx.args
    args.vocab, args.width, args.layers, args.heads = (1000, 64, 2, 4) if args.tiny else (32000, 1024, 12, 16)
    if args.tiny:
        args.samples, args.budget = min(args.samples, 20_000), min(args.budget, 2048)
    warnings.filterwarnings("ignore", message=".*nested tensors is in prototype.*")
    logging.getLogger("torch.nested").setLevel(logging.ERROR)  # per-step kernel-choice notes on CPU
    cuda = args.device == "cuda"
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, W = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    env: dict[str, Any] = {"torch": torch.__version__}
    if cuda:
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = True
        env.update(cuda=torch.version.cuda, cudnn=torch.backends.cudnn.version())
        if args.setup_probe:  # opt-in: the packed (nested) layout under cuDNN crashed torch 2.11 on H200
            env.update(sdpa_setup_probe=sdpa_setup_probe(args, device))
        if args.sdpa == "flash":
            torch.backends.cuda.enable_cudnn_sdp(False)
    env.update(sdpa=args.sdpa, sdpa_padded_backend=sdpa_backend_name(args, device))
    lengths = np.clip(np.random.default_rng(0).lognormal(5, 1, args.samples), 16, 1024).astype(np.int64)
    probe = fastfeed.DistributedTokenBudgetSampler(lengths, max_cost=args.budget, num_replicas=W, rank=0)
    n, _, s1, _ = probe.epoch_plan(0).features()
    target = float(s1.sum() / n.size)  # mean real tokens per batch of ff-tokens at --budget
    B0 = max(1, round(target / float(lengths.mean())))
    trainer = Trainer(args, device)
    configs = list(ctx.grid["config"])
    if any(c.partition("@")[0].endswith("varlen") for c in configs):
        probe_varlen(trainer, args.varlen_impl)
    rows = []
    if rank == 0:
        print(f"world {W} x {args.device}, model {args.layers}x{args.width}, "
              f"{args.samples:,} lengths lognormal(5,1)[16,1024], ~{target:.0f} real tokens/batch (B0={B0}), "
              f"{args.steps} steps", flush=True)
        print("env " + json.dumps({k: v for k, v in env.items() if k != "sdpa_setup_probe"}), flush=True)
        if "sdpa_setup_probe" in env:
            print("SDPA fwd+bwd on new shapes, first call / cached (ms): " + ", ".join(
                f"{k} {v['first_ms']:.1f} / {v['cached_ms']:.1f}" if "first_ms" in v else f"{k} n/a ({v['error']})"
                for k, v in env["sdpa_setup_probe"].items()), flush=True)
        print(f"{'config':<18}{'tokens/s':>11}{'step ms':>9}{'wait mean':>10}{'wait max':>9}{'imbal.':>8}"
              f"{'comp ms':>9}{'comm ms':>9}{'padding':>8}{'fit err':>8}{'train err':>10}", flush=True)
    for name in configs:
        r = run_config(name, lengths, args, trainer, target, B0)
        rows.append(r)
        if rank == 0:
            print(f"{name:<18}{r['tokens_per_s']:>11,.0f}{r['step_ms']:>9.1f}{r['wait_share_mean']:>10.1%}"
                  f"{r['wait_share_max']:>9.1%}{r['imbalance_share_mean']:>8.1%}{r['compute_ms']:>9.1f}"
                  f"{r['comm_ms']:>9.1f}{r['padding_efficiency']:>8.3f}{_pct(r.get('fit_median_ape')):>8}"
                  f"{_pct(r.get('train_model_median_ape')):>10}", flush=True)
    if rank == 0:
        base = {r["config"]: r["tokens_per_s"] for r in rows}
        print("per config: wait share per rank | CPU time to queue forward+backward per rank | peak GiB | allocator retries | padded SDPA backend | speed-up"
              " | calibration", flush=True)
        for r in rows:
            ref = base.get("ds-fixed-varlen" if r["config"].partition("@")[0].endswith("varlen") else "ds-fixed")
            r["speedup_vs_ds_fixed"] = r["tokens_per_s"] / ref if ref else None
            extra = ""
            if "model" in r:
                extra = (f" | {r['model'].splitlines()[0]}; first call of a shape {r['calib_first_call_extra_ms']:+.1f} ms;"
                         f" planned wait {_pct(r['planned_wait_share'])};"
                         f" model vs training steps: median {_pct(r['train_model_median_ape'])},"
                         f" p90 {_pct(r['train_model_p90_ape'])}, bias {r['train_model_bias']:+.1%}")
            speed = f" | {r['speedup_vs_ds_fixed']:.2f}x ds-fixed" if r["speedup_vs_ds_fixed"] else ""
            host = "/".join(f"{h:.0f}" for h in r["host_queue_ms_per_rank"])
            print(f"  {r['config']:<18}{' '.join(_pct(w) for w in r['wait_share_per_rank'])} | host queue ms {host} | "
                  f"{r.get('peak_gib', float('nan')):.1f} | {r.get('alloc_retries', '-')} | "
                  f"{r['sdpa_padded_backend']}{speed}{extra}", flush=True)
    out: dict[str, Any] = {}
    if rank == 0:
        out = {"ddp_tokens": {"device": torch.cuda.get_device_name() if cuda else "cpu",
                              "varlen_attention": VARLEN["impl"], "env": env, "world_size": W,
                              "args": {k: v for k, v in vars(args).items() if k != "point"}, "rows": rows}}
    dist.destroy_process_group()
    return out


#: every configuration (and NAME@default: NAME with torch's default SDPA backend, an A/B of --sdpa)
CONFIGS = (*CONTROL, *PADDED, *VARLEN_CONFIGS)
BENCHMARK = Benchmark(
    name="ddp_tokens", doc=__doc__, options=options, run=run,
    launcher="torchrun --nproc-per-node N benchmarks/ddp_tokens.py",
    grid=(Axis("config", (*CONFIGS, "ff-tokens@default"), choices=(*CONFIGS, *(f"{c}@default" for c in CONFIGS)),
               flag="--configs", help="the configurations (see the table above)"),),
    quick={"tiny": True, "device": "cpu", "steps": 20, "warmup": 3, "control_steps": 10, "calib_budget": 5.0},
)

if __name__ == "__main__":
    from benchmarks.run import main

    sys.exit(main([BENCHMARK.name, *sys.argv[1:]]))
