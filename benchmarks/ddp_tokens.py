"""DDP benchmark (issues 4 and 10): real tokens/s and time waiting for the slowest rank.

A 12-layer, width-1024 transformer encoder (bf16 autocast) trains on random tokens whose
sequence lengths follow lognormal(5, 1) clamped to [16, 1024], over torchrun ranks.
Each configuration runs ``--steps`` measured steps after a warm-up, at the same average
real tokens per step:

padded inputs ([n, longest] batches, torch SDPA attention, no key mask: a throughput
benchmark, masking does not change the padded FLOPs):
  ds-fixed        torch DistributedSampler + BatchSampler(B0), B0 = same mean tokens
  ff-bucket       DistributedLengthBucketSampler(batch_size=B0)
  ff-tokens       DistributedTokenBudgetSampler(cost="tokens")
  ff-attention    DistributedTokenBudgetSampler(cost="attention", d_model=width)
  ff-fitted       DistributedTokenBudgetSampler(cost=calibrate(step, features="padded"))
packed / varlen inputs (all sequences of a batch concatenated; attention per sequence
through a jagged nested tensor + SDPA, i.e. cu_seqlens without flash-attn; where this
torch/GPU cannot run that forward + backward, one SDPA per group of equal-length
sequences, said on stdout and in the JSON):
  ds-fixed-varlen, ff-varlen (cost="varlen"), ff-fitted-varlen (calibrated, "varlen")

The gradient all-reduce is done by hand after backward (DDP semantics without
compute/communication overlap) so the wait is measurable: per step and rank, CUDA
events (perf_counter on CPU) mark compute done, then a 1-element all_reduce (a
barrier) completes when the slowest rank arrives: that gap is the wait. Wait share =
sum of waits / sum of step times. Real tokens/s counts only non-padding tokens of all
ranks over rank 0's wall time.

GPU (the lead runs it):
    NCCL_NVLS_ENABLE=0 torchrun --nproc-per-node 2 benchmarks/ddp_tokens.py
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
import time
import warnings
from typing import Any, Callable

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink SHARP multicast off (see the device notes)

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import fastfeed  # noqa: E402
from fastfeed.costmodel import CostModel  # noqa: E402

#: varlen attention: jagged nested tensors, or (if this torch/GPU lacks them) per-length groups
VARLEN: dict[str, Any] = {"impl": "nested", "groups": None}

PADDED = ["ds-fixed", "ff-bucket", "ff-tokens", "ff-attention", "ff-fitted"]
VARLEN_CONFIGS = ["ds-fixed-varlen", "ff-varlen", "ff-fitted-varlen"]


# ----------------------------------------------------------------------------- model
class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def attend(self, h: torch.Tensor, offsets: torch.Tensor | None) -> torch.Tensor:
        H = self.heads
        if offsets is None:  # padded [n, L, 3d]
            n, L, _ = h.shape
            q, k, v = h.view(n, L, 3, H, -1).permute(2, 0, 3, 1, 4)
            return F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(n, L, -1)
        T = h.shape[0]
        parts = [p.contiguous() for p in h.view(T, 3, H, -1).unbind(1)]  # q, k, v: [T, H, D]
        if VARLEN["groups"] is None:  # packed [T, 3d] + cu_seqlens: jagged nested tensors
            q, k, v = (torch.nested.nested_tensor_from_jagged(p, offsets).transpose(1, 2) for p in parts)
            o = F.scaled_dot_product_attention(q, k, v).transpose(1, 2)
            return o.values().reshape(T, -1)
        out = torch.empty_like(parts[0])  # fallback: one SDPA per group of equal-length sequences
        for L, idx in VARLEN["groups"]:
            q, k, v = (p[idx].view(-1, L, H, p.shape[-1]).transpose(1, 2) for p in parts)
            out[idx] = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(-1, H, out.shape[-1])
        return out.reshape(T, -1)

    def forward(self, x: torch.Tensor, offsets: torch.Tensor | None) -> torch.Tensor:
        x = x + self.proj(self.attend(self.qkv(self.ln1(x)), offsets))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class Encoder(nn.Module):
    def __init__(self, vocab: int, d: int, layers: int, heads: int) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, tokens: torch.Tensor, offsets: torch.Tensor | None) -> torch.Tensor:
        x = self.emb(tokens)
        for b in self.blocks:
            x = b(x, offsets)
        return self.head(self.ln(x))


# ----------------------------------------------------------------------------- training step
class Trainer:
    def __init__(self, args: argparse.Namespace, device: torch.device) -> None:
        self.args, self.device = args, device
        torch.manual_seed(0)
        self.model = Encoder(args.vocab, args.width, args.layers, args.heads).to(device)
        for p in self.model.parameters():  # identical start on every rank
            dist.broadcast(p.data, 0)
        self.params = [p for p in self.model.parameters()]
        self.opt = torch.optim.AdamW(self.params, lr=1e-4)
        self.cuda = device.type == "cuda"
        self.records: list[tuple[Any, ...]] = []
        self.gen = torch.Generator(device=device)
        self.gen.manual_seed(1234 + dist.get_rank())

    def _now(self) -> Any:
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def step(self, lengths: np.ndarray, varlen: bool, record: bool = True) -> None:
        a, dev = self.args, self.device
        n, L = len(lengths), int(lengths.max())
        t0 = self._now()
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=self.cuda):
            if varlen:
                total = int(lengths.sum())
                tokens = torch.randint(0, a.vocab, (total,), device=dev, generator=self.gen)
                offsets = torch.from_numpy(np.concatenate([[0], np.cumsum(lengths)])).to(dev)
                VARLEN["groups"] = None if VARLEN["impl"] == "nested" else length_groups(lengths, dev)
                logits = self.model(tokens, offsets)
                loss = F.cross_entropy(logits.float(), tokens)
            else:
                tokens = torch.randint(0, a.vocab, (n, L), device=dev, generator=self.gen)
                keep = torch.arange(L, device=dev)[None, :] < torch.from_numpy(lengths).to(dev)[:, None]
                logits = self.model(tokens, None)
                loss = F.cross_entropy(logits.float().view(n * L, -1), tokens.masked_fill(~keep, -100).view(-1))
        loss.backward()
        t1 = self._now()
        dist.all_reduce(torch.ones(1, device=dev))  # returns when the slowest rank has arrived
        t2 = self._now()
        grads = [p.grad for p in self.params]
        flat = torch._utils._flatten_dense_tensors(grads)
        dist.all_reduce(flat)
        flat /= dist.get_world_size()
        for g, s in zip(grads, torch._utils._unflatten_dense_tensors(flat, grads)):
            g.copy_(s)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        t3 = self._now()
        if record:
            self.records.append((t0, t1, t2, t3, int(lengths.sum()), n * L))

    def summary(self) -> dict[str, float]:
        if self.cuda:
            torch.cuda.synchronize()
            ms = [(a.elapsed_time(b), b.elapsed_time(c), a.elapsed_time(d)) for a, b, c, d, *_ in self.records]
            comp, wait, step = (np.array(x) / 1000 for x in zip(*ms))
        else:
            comp, wait, step = (np.array(x) for x in zip(*[(b - a, c - b, d - a) for a, b, c, d, *_ in self.records]))
        real = sum(r[4] for r in self.records)
        padded = sum(r[5] for r in self.records)
        return {"wait_share": float(wait.sum() / step.sum()), "step_s": float(step.mean()),
                "compute_s": float(comp.mean()), "real_tokens": real, "padded_tokens": padded}


def length_groups(lengths: np.ndarray, dev: torch.device) -> list[tuple[int, torch.Tensor]]:
    """Token positions of the sequences of each distinct length, for the fallback."""
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    out = []
    for L in np.unique(lengths):
        s = starts[lengths == L]
        out.append((int(L), torch.from_numpy((s[:, None] + np.arange(L)).ravel()).to(dev)))
    return out


def probe_varlen(trainer: "Trainer") -> None:
    """Use nested tensors for varlen attention if a forward + backward works here."""
    try:
        trainer.step(np.array([5, 9, 3]), varlen=True, record=False)
    except (RuntimeError, NotImplementedError) as e:
        VARLEN["impl"] = "groups"
        if dist.get_rank() == 0:
            print(f"varlen attention: nested tensors unavailable ({str(e).splitlines()[0]}); "
                  "using one SDPA per group of equal-length sequences", flush=True)


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
                  target: float, B0: int) -> tuple[Any, dict[str, Any]]:
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
        return Fixed(), {"batch_size": B0}
    if name == "ff-bucket":
        return fastfeed.DistributedLengthBucketSampler(lengths, batch_size=B0, **common), {"batch_size": B0}
    if name == "ff-tokens":
        s = budget_for_tokens(lambda c: fastfeed.DistributedTokenBudgetSampler(lengths, max_cost=c, **common),
                              target, args.budget / 4, args.budget * 4)
        return s, {"max_cost": s.max_cost}
    costs: dict[str, Any] = {"ff-attention": CostModel.attention(d_model=args.width),
                             "ff-varlen": CostModel.varlen(d_model=args.width)}
    if name in costs:
        cost = costs[name]
        longest = cost.predict([int(lengths.max())])
        s = budget_for_tokens(lambda c: fastfeed.DistributedTokenBudgetSampler(lengths, max_cost=c, cost=cost, **common),
                              target, max(longest, args.budget / 4), args.budget * 16)
        return s, {"max_cost": s.max_cost}
    varlen = name.endswith("varlen")
    t0 = time.perf_counter()
    model = fastfeed.calibrate(lambda lens: trainer.step(lens, varlen, record=False), lengths,
                               max_tokens=2 * args.budget, features="varlen" if varlen else "padded",
                               num_shapes=args.shapes, repeats=args.repeats, time_budget=args.calib_budget,
                               meta={"config": name})
    info.update(calibration_s=time.perf_counter() - t0, fit_median_ape=model.fit.median_ape,
                fit_worst_ape=model.fit.worst_ape, fit_loo_median_ape=model.fit.loo_median_ape,
                model=model.summary())
    longest = model.predict([int(lengths.max())])
    s = budget_for_tokens(lambda c: fastfeed.DistributedTokenBudgetSampler(lengths, max_cost=c, cost=model, **common),
                          target, longest, longest * 1000)
    info["max_cost_s"] = s.max_cost
    return s, info


def run_config(name: str, lengths: np.ndarray, args: argparse.Namespace, trainer: Trainer,
               target: float, B0: int) -> dict[str, Any]:
    sampler, info = build_sampler(name, lengths, args, trainer, target, B0)
    varlen = name.endswith("varlen")
    trainer.records = []
    done, epoch = 0, 0
    wall = 0.0
    while done < args.warmup + args.steps:
        sampler.set_epoch(epoch)
        for batch in sampler:
            if done == args.warmup:
                if trainer.cuda:
                    torch.cuda.synchronize()
                dist.barrier()
                trainer.records = []
                start = time.perf_counter()
            trainer.step(lengths[np.asarray(batch)], varlen)
            done += 1
            if done == args.warmup + args.steps:
                break
        epoch += 1
    if trainer.cuda:
        torch.cuda.synchronize()
    dist.barrier()
    wall = time.perf_counter() - start
    mine = trainer.summary()
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    real = sum(m["real_tokens"] for m in everyone)
    padded = sum(m["padded_tokens"] for m in everyone)
    waits = [m["wait_share"] for m in everyone]
    return {"config": name, "tokens_per_s": real / wall, "step_ms": 1000 * wall / args.steps,
            "wait_share_mean": float(np.mean(waits)), "wait_share_max": float(np.max(waits)),
            "padding_efficiency": real / padded, "real_tokens_per_step": real / args.steps, **info}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--tiny", action="store_true", help="2 layers, width 64: a quick end-to-end check")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--budget", type=int, default=16384, help="padded tokens per batch of ff-tokens")
    ap.add_argument("--samples", type=int, default=200_000)
    ap.add_argument("--configs", default=",".join(PADDED + VARLEN_CONFIGS))
    ap.add_argument("--shapes", type=int, default=24, help="calibration shapes")
    ap.add_argument("--repeats", type=int, default=3, help="timings per calibration shape")
    ap.add_argument("--calib-budget", type=float, default=60.0, help="seconds per calibration")
    ap.add_argument("--json", default=None, help="also write the results here (rank 0)")
    args = ap.parse_args(argv)
    args.vocab, args.width, args.layers, args.heads = (1000, 64, 2, 4) if args.tiny else (32000, 1024, 12, 16)
    if args.tiny:
        args.samples, args.budget = min(args.samples, 20_000), min(args.budget, 2048)
    warnings.filterwarnings("ignore", message=".*nested tensors is in prototype.*")
    logging.getLogger("torch.nested").setLevel(logging.ERROR)  # per-step kernel-choice notes on CPU
    cuda = args.device == "cuda"
    dist.init_process_group("nccl" if cuda else "gloo")
    rank = dist.get_rank()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = True
    lengths = np.clip(np.random.default_rng(0).lognormal(5, 1, args.samples), 16, 1024).astype(np.int64)
    probe = fastfeed.DistributedTokenBudgetSampler(lengths, max_cost=args.budget, num_replicas=dist.get_world_size(), rank=0)
    n, _, s1, _ = probe.epoch_plan(0).features()
    target = float(s1.sum() / n.size)  # mean real tokens per batch of ff-tokens at --budget
    B0 = max(1, round(target / float(lengths.mean())))
    trainer = Trainer(args, device)
    if any(c.endswith("varlen") for c in args.configs.split(",")):
        probe_varlen(trainer)
    rows = []
    if rank == 0:
        print(f"world {dist.get_world_size()} x {args.device}, model {args.layers}x{args.width}, "
              f"{args.samples:,} lengths lognormal(5,1)[16,1024], ~{target:.0f} real tokens/batch (B0={B0})", flush=True)
        print(f"{'config':<18}{'tokens/s':>12}{'step ms':>9}{'wait mean':>10}{'wait max':>9}{'padding':>9}{'fit err':>9}", flush=True)
    for name in args.configs.split(","):
        r = run_config(name, lengths, args, trainer, target, B0)
        rows.append(r)
        if rank == 0:
            fit = f"{r['fit_median_ape']:.1%}" if "fit_median_ape" in r else "-"
            print(f"{name:<18}{r['tokens_per_s']:>12,.0f}{r['step_ms']:>9.1f}{r['wait_share_mean']:>10.1%}"
                  f"{r['wait_share_max']:>9.1%}{r['padding_efficiency']:>9.3f}{fit:>9}", flush=True)
    if rank == 0:
        base = {r["config"]: r["tokens_per_s"] for r in rows}
        for r in rows:
            ref = base.get("ds-fixed-varlen" if r["config"].endswith("varlen") else "ds-fixed")
            r["speedup_vs_ds_fixed"] = r["tokens_per_s"] / ref if ref else None
        out = {"ddp_tokens": {"device": torch.cuda.get_device_name() if cuda else "cpu",
                              "varlen_attention": VARLEN["impl"],
                              "world_size": dist.get_world_size(), "args": vars(args), "rows": rows}}
        print(json.dumps(out))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(out, f, indent=1)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
