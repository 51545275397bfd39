"""Samplers benchmark (issue 4): padding, rank balance, randomness and planning time.

For each length distribution and world size, one epoch is planned by:

- fastfeed DistributedLengthBucketSampler (fixed batch) and DistributedTokenBudgetSampler
  balancing on "tokens" (padded tokens), "attention" (+ n*max^2/6144) and "varlen";
- torch DistributedSampler + fixed batch (the real torch index arithmetic, see
  fastfeed.sampling.balance.distributed_sampler_batches, checked against torch in the tests);
- HF-style "megabatch" length grouping: a faithful re-implementation of
  transformers.trainer_pt_utils.get_length_grouped_indices (randperm, megabatches of
  50 x batch, each sorted longest first, longest batch first) with accelerate's
  round-robin batch sharding (batch k to rank k % W);
- fairseq-style sorted batch_by_size: a faithful re-implementation of
  fairseq.data.data_utils.batch_by_size with max_tokens (shuffle, stable sort by size,
  greedy fill while n x longest <= max_tokens, required_batch_size_multiple=1), batches
  shuffled per epoch and sharded batches[rank::W], short shards padded with empty
  (dummy) batches as fairseq's ShardedIterator does.

(Neither transformers nor fairseq is installed: re-implementations, labelled "re-impl".)

Figures: padding efficiency (real / padded tokens), straggler ratio under the tokens
and the attention cost, share of rank time waiting, co-batch repeat rate between
epochs 0 and 1 (per sample, and over pairs), Spearman rho of step index vs mean
length, and planning time (the fastfeed rows also give the jitter their ``jitter="auto"``
default chose for that corpus and world, and the seconds that choice took, measured apart
from the plan). Goals: padding >= 0.98, straggler <= 1.03 (both costs),
repeat <= 1%, |rho| <= 0.2.

Usage:
    .venv/bin/python benchmarks/samplers.py [--n 1000000] [--plan-n 10000000] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import sysconfig
import time
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np

from fastfeed.sampling.balance import co_batch_repeat_rate, distributed_sampler_batches, epoch_stats
from fastfeed.sampling.costmodel import CostModel
from fastfeed.sampling.steps import CostFn, Plan
from fastfeed.sampling.samplers import DistributedLengthBucketSampler, DistributedTokenBudgetSampler

BATCH = 16          # fixed batch size per rank
BUDGET = 16384      # padded tokens per batch (token budget)
JITTER: float | str = "auto"
COSTS = {"tokens": CostFn(CostModel.builtin("tokens")), "attention": CostFn(CostModel.builtin("attention"))}


# ----------------------------------------------------------------------------- distributions
def lognormal(n: int, seed: int = 0) -> np.ndarray:
    return np.clip(np.random.default_rng(seed).lognormal(5, 1, n), 16, 1024).astype(np.int64)


def bimodal(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    short = rng.normal(64, 16, n)
    long = rng.normal(900, 60, n)
    return np.clip(np.where(rng.random(n) < 0.5, short, long), 16, 1024).astype(np.int64)


def zipf_tail(n: int, seed: int = 0) -> np.ndarray:
    """Heavy tail with items close to the budget (a sample of 16384 fills a batch alone)."""
    rng = np.random.default_rng(seed)
    return np.clip(32 * rng.zipf(1.6, n), 16, BUDGET).astype(np.int64)


def _block_tokens(files: Iterable[Path]) -> np.ndarray:
    """Whitespace token counts of the blank-line separated blocks of ``files``; blocks of
    fewer than 8 tokens dropped, cut at 4096."""
    counts: list[int] = []
    for p in files:
        try:
            text = p.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        counts += [n for n in (len(b.split()) for b in text.split("\n\n")) if n >= 8]
    return np.clip(np.array(counts, dtype=np.int64), 8, 4096)


def stdlib_tokens() -> np.ndarray:
    """A real corpus offline: the blocks (:func:`_block_tokens`) of the Python standard
    library's .py files (~86k "documents" with a natural heavy tail)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    return _block_tokens(p for p in sorted(root.rglob("*.py")) if "site-packages" not in p.parts)


def python_tokens() -> np.ndarray:
    """A larger real corpus offline: the blocks of every .py file of this Python's standard
    library and installed packages (site-packages: torch, numpy, ...; ~1M blocks in the dev
    venv). Which packages are installed changes its size, so its figures are quoted with
    the sample count."""
    paths = sysconfig.get_paths()
    roots = sorted({Path(paths[k]) for k in ("stdlib", "purelib", "platlib")})
    return _block_tokens(sorted({p for root in roots for p in root.rglob("*.py")}))


# ----------------------------------------------------------------------------- baselines
def plan_from_batches(lengths: np.ndarray, batches: list[np.ndarray], W: int) -> Plan:
    """Global batches (in run order, batch k -> rank k % W, missing ones empty) as a Plan."""
    S = math.ceil(len(batches) / W)
    counts = np.zeros((S, W), dtype=np.int64)
    for k, b in enumerate(batches):
        counts[k // W, k % W] = len(b)
    samples = np.concatenate(batches) if batches else np.zeros(0, np.int64)
    starts = (np.cumsum(counts.ravel()) - counts.ravel()).reshape(S, W)
    return Plan(samples=samples, lengths=lengths[samples], starts=starts, counts=counts, order=np.arange(S))


def distributed_sampler(lengths: np.ndarray, W: int, B: int, epoch: int) -> Plan:
    idx, valid = distributed_sampler_batches(lengths, world_size=W, batch_size=B, seed=0, epoch=epoch)
    counts = valid.sum(axis=2)
    samples = idx[valid]
    starts = (np.cumsum(counts.ravel()) - counts.ravel()).reshape(counts.shape)
    return Plan(samples=samples, lengths=lengths[samples], starts=starts, counts=counts,
                order=np.arange(counts.shape[0]))


def hf_megabatch(lengths: np.ndarray, W: int, B: int, epoch: int) -> Plan:
    import torch

    n = lengths.shape[0]
    mult = max(1, min(n // (B * 4), 50))
    g = torch.Generator()
    g.manual_seed(epoch)
    perm = torch.randperm(n, generator=g).numpy()
    mega = mult * B
    mid = np.arange(n) // mega
    order = np.lexsort((-lengths[perm], mid))  # each megabatch sorted longest first (stable)
    idx = perm[order]
    maxima = np.maximum.reduceat(lengths[idx], np.arange(0, n, mega))
    top = int(np.argmax(maxima)) * mega  # swap the longest sample to the very front
    idx[0], idx[top] = idx[top], idx[0]
    batches = [idx[i:i + B] for i in range(0, n, B)]
    while len(batches) % W:  # accelerate even_batches: loop back to the start
        batches.append(batches[len(batches) % W])
    return plan_from_batches(lengths, batches, W)


def fairseq_batch_by_size(lengths: np.ndarray, W: int, max_tokens: int, epoch: int) -> Plan:
    rng = np.random.RandomState(0)
    indices = rng.permutation(lengths.shape[0])
    indices = indices[np.argsort(lengths[indices], kind="mergesort")]
    batches, cur, cur_max = [], [], 0
    for i, L in zip(indices.tolist(), lengths[indices].tolist()):  # the Cython loop, in Python
        new_max = max(cur_max, L)
        if cur and new_max * (len(cur) + 1) > max_tokens:
            batches.append(np.array(cur))
            cur, new_max = [], L
        cur.append(i)
        cur_max = new_max
    if cur:
        batches.append(np.array(cur))
    order = np.random.RandomState(epoch).permutation(len(batches))  # shuffled per epoch
    return plan_from_batches(lengths, [batches[k] for k in order], W)


# ----------------------------------------------------------------------------- measuring
def spearman_step_vs_length(plan: Plan) -> float:
    n, _, s1, _ = plan.features()
    mean = (s1.sum(axis=1) / np.maximum(n.sum(axis=1), 1))[plan.order]
    if mean.shape[0] < 3:
        return float("nan")
    _, inv, counts = np.unique(mean, return_inverse=True, return_counts=True)
    r2 = (np.cumsum(counts) - (counts - 1) / 2.0)[inv]  # average ranks: many steps tie (same lengths)
    if np.all(r2 == r2[0]):
        return 0.0
    return float(np.corrcoef(np.arange(mean.shape[0]), r2)[0, 1])


def measure(name: str, make: Callable[[int], Plan], lengths: np.ndarray) -> dict[str, Any]:
    if isinstance(make, _Planner):
        make(1)  # builds the sampler and resolves its jitter (timed apart: "jitter" columns)
    t0 = time.perf_counter()
    p0 = make(0)
    plan_s = time.perf_counter() - t0
    p1 = make(1)
    n, mx, s1, _ = p0.features()
    row: dict[str, Any] = {"sampler": name, "plan_s": plan_s}
    for cname, cfn in COSTS.items():
        st = epoch_stats(name, n, mx, s1, p0.costs(cfn))
        row[f"straggler_{cname}"] = st.straggler_ratio
        row[f"wait_{cname}"] = st.wait_share
        row[f"epoch_cost_{cname}"] = st.epoch_cost
    row.update(steps=st.steps_per_rank, batch=st.mean_batch_size, padding=st.padding_efficiency,
               tokens_per_step=st.real_tokens_per_step)
    row["repeat_sample"], row["repeat_pairs"] = co_batch_repeat_rate(p0, p1, lengths.shape[0])
    row["rho"] = spearman_step_vs_length(p0)
    row.update(getattr(make, "info", {}))
    return row


class _Planner:
    """``make(epoch) -> Plan`` over one fastfeed sampler, built on first use; the jitter it
    resolves (``jitter="auto"`` measures plans) is timed apart from the epoch's plan."""

    def __init__(self, build: Callable[[], Any]) -> None:
        self.build, self.sampler, self.info = build, None, {}

    def __call__(self, e: int) -> Plan:
        if self.sampler is None:
            self.sampler = self.build()
            t0 = time.perf_counter()
            jitter = self.sampler.jitter
            self.info = {"jitter": jitter, "jitter_s": time.perf_counter() - t0}
        return self.sampler.epoch_plan(e)


def samplers_for(lengths: np.ndarray, W: int, tokens: int = BUDGET) -> list[tuple[str, Callable[[int], Plan]]]:
    ff_bucket = _Planner(lambda: DistributedLengthBucketSampler(lengths, batch_size=BATCH, num_replicas=W, rank=0,
                                                                jitter=JITTER))

    def ff_budget(cost: str) -> Callable[[int], Plan]:
        # the budget in the cost's unit: `tokens` padded tokens, or more if the longest sample needs it
        longest = float(CostModel.builtin(cost).predict([int(lengths.max())]))
        budget = max(float(tokens), longest)
        return _Planner(lambda: DistributedTokenBudgetSampler(lengths, max_cost=budget, cost=cost, num_replicas=W,
                                                              rank=0, jitter=JITTER))

    same_tokens = max(1, round(tokens * 0.97 / float(lengths.max())))  # fixed batch that never exceeds the budget
    return [
        (f"fastfeed bucket B={BATCH}", ff_bucket),
        (f"fastfeed budget tokens {tokens}", ff_budget("tokens")),
        (f"fastfeed budget attention {tokens}", ff_budget("attention")),
        (f"fastfeed budget varlen {tokens}", ff_budget("varlen")),
        (f"DistributedSampler B={BATCH}", lambda e: distributed_sampler(lengths, W, BATCH, e)),
        (f"DistributedSampler B={same_tokens} (fits {tokens})", lambda e: distributed_sampler(lengths, W, same_tokens, e)),
        (f"HF megabatch B={BATCH} (re-impl)", lambda e: hf_megabatch(lengths, W, BATCH, e)),
        (f"fairseq batch_by_size {tokens} (re-impl)", lambda e: fairseq_batch_by_size(lengths, W, tokens, e)),
    ]


def plan_time(n: int, W: int) -> dict[str, float]:
    lengths = lognormal(n, seed=1)
    out = {}
    for name, make in (("bucket", lambda: DistributedLengthBucketSampler(lengths, batch_size=BATCH, num_replicas=W, rank=0)),
                       ("budget tokens", lambda: DistributedTokenBudgetSampler(lengths, max_cost=BUDGET, num_replicas=W, rank=0)),
                       ("budget attention", lambda: DistributedTokenBudgetSampler(lengths, max_cost=BUDGET, cost="attention", num_replicas=W, rank=0)),
                       ("budget varlen", lambda: DistributedTokenBudgetSampler(lengths, max_cost=BUDGET, cost="varlen", num_replicas=W, rank=0))):
        s = make()
        best = []
        for e in range(3):  # best of 3 epochs: the machine is shared
            s.set_epoch(e)
            s._cached = None
            t0, c0 = time.perf_counter(), time.process_time()
            len(s)  # plans the epoch and extracts this rank's batches
            best.append((time.perf_counter() - t0, time.process_time() - c0))
        out[name] = min(best)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1_000_000, help="samples per synthetic distribution")
    ap.add_argument("--plan-n", type=int, default=10_000_000, help="samples for the planning-time figure")
    ap.add_argument("--world-sizes", default="8,64")
    ap.add_argument("--only", default=None, help="comma list of distributions")
    ap.add_argument("--json", default=None, help="write all rows here")
    ap.add_argument("--jitter", type=lambda v: v if v == "auto" else float(v), default="auto",
                    help="fastfeed samplers' jitter: 'auto' (their default: measured per corpus) or a number")
    ap.add_argument("--baselines", action=argparse.BooleanOptionalAction, default=True)
    args = ap.parse_args(argv)
    global JITTER
    JITTER = args.jitter
    # the stdlib corpus is small (~86k blocks, mean ~30 tokens): a 2048-token budget keeps
    # enough steps per epoch at 64 ranks for the figures to mean something
    dists = {"lognormal(5,1)[16,1024]": lambda: lognormal(args.n), "python-stdlib tokens": stdlib_tokens,
             "bimodal 64/900": lambda: bimodal(args.n), f"zipf tail to {BUDGET}": lambda: zipf_tail(args.n),
             "python-all tokens": python_tokens}
    budgets = {"python-stdlib tokens": 2048, "python-all tokens": 2048}
    if args.only:
        dists = {k: v for k, v in dists.items() if any(o in k for o in args.only.split(","))}
    rows = []
    for dname, gen in dists.items():
        lengths = gen()
        for W in [int(w) for w in args.world_sizes.split(",")]:
            print(f"\n== {dname}: N={lengths.shape[0]:,}, mean length {lengths.mean():.0f}, world size {W}", flush=True)
            print(f"{'sampler':<44}{'steps':>7}{'batch':>7}{'padding':>9}{'strag tok':>10}{'strag att':>10}"
                  f"{'wait tok':>9}{'repeat':>8}{'rep pairs':>10}{'rho':>7}{'plan s':>8}{'jitter':>8}{'auto s':>8}")
            for name, make in samplers_for(lengths, W, budgets.get(dname, BUDGET)):
                if not args.baselines and not name.startswith("fastfeed"):
                    continue
                r = measure(name, make, lengths)
                r.update(distribution=dname, world_size=W, n=int(lengths.shape[0]))
                rows.append(r)
                print(f"{name:<44}{r['steps']:>7}{r['batch']:>7.1f}{r['padding']:>9.3f}{r['straggler_tokens']:>10.3f}"
                      f"{r['straggler_attention']:>10.3f}{r['wait_tokens']:>9.1%}{r['repeat_sample']:>8.2%}"
                      f"{r['repeat_pairs']:>10.2%}{r['rho']:>7.2f}{r['plan_s']:>8.2f}"
                      + (f"{r['jitter']:>8.2f}{r['jitter_s']:>8.2f}" if "jitter" in r else ""), flush=True)
    times = {}
    if args.plan_n:
        for W in [int(w) for w in args.world_sizes.split(",")]:
            times[W] = plan_time(args.plan_n, W)
            print(f"\nplan time, {args.plan_n:,} lengths, world size {W} (best of 3, wall / cpu s): " +
                  ", ".join(f"{k} {w:.2f}/{c:.2f}" for k, (w, c) in times[W].items()), flush=True)
    result = {"rows": rows, "plan_time": {str(k): v for k, v in times.items()}, "n": args.n, "plan_n": args.plan_n}
    print(json.dumps({"samplers_benchmark": {"plan_time": result["plan_time"]}}))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
