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
    .venv/bin/python benchmarks/samplers.py --grid world_size=8 --grid sampler=ff-bucket,ds-fixed
"""

from __future__ import annotations

import argparse
import functools
import math
import sys
import sysconfig
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np

if __name__ == "__main__":  # run as a script: the repo's root on the path, for benchmarks.lib
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fastfeed.sampling.balance import co_batch_repeat_rate, distributed_sampler_batches, epoch_stats  # noqa: E402
from fastfeed.sampling.costmodel import CostModel  # noqa: E402
from fastfeed.sampling.samplers import DistributedLengthBucketSampler, DistributedTokenBudgetSampler  # noqa: E402
from fastfeed.sampling.steps import CostFn, Plan  # noqa: E402

from benchmarks.lib.measure import Stopwatch  # noqa: E402
from benchmarks.lib.suite import Axis, Benchmark, Context, Point  # noqa: E402

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


def sampler_row(name: str, make: Callable[[int], Plan], lengths: np.ndarray) -> dict[str, Any]:
    """One sampler's figures on one corpus and world size (epochs 0 and 1 planned)."""
    if isinstance(make, _Planner):
        make(1)  # builds the sampler and resolves its jitter (timed apart: "jitter" columns)
    with Stopwatch() as took:
        p0 = make(0)
    plan_s = took.wall
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
        self.build: Callable[[], Any] = build
        self.sampler: Any = None
        self.info: dict[str, Any] = {}

    def __call__(self, e: int) -> Plan:
        if self.sampler is None:
            self.sampler = self.build()
            with Stopwatch() as took:
                jitter = self.sampler.jitter
            self.info = {"jitter": jitter, "jitter_s": took.wall}
        return self.sampler.epoch_plan(e)


def samplers_for(lengths: np.ndarray, W: int, tokens: int = BUDGET) -> dict[str, tuple[str, Callable[[int], Plan]]]:
    """Every sampler of :data:`SAMPLERS`: key -> (its name in the table, ``make(epoch) -> Plan``)."""
    ff_bucket = _Planner(lambda: DistributedLengthBucketSampler(lengths, batch_size=BATCH, num_replicas=W, rank=0,
                                                                jitter=JITTER))

    def ff_budget(cost: str) -> Callable[[int], Plan]:
        # the budget in the cost's unit: `tokens` padded tokens, or more if the longest sample needs it
        longest = float(CostModel.builtin(cost).predict([int(lengths.max())]))
        budget = max(float(tokens), longest)
        return _Planner(lambda: DistributedTokenBudgetSampler(lengths, max_cost=budget, cost=cost, num_replicas=W,
                                                              rank=0, jitter=JITTER))

    same_tokens = max(1, round(tokens * 0.97 / float(lengths.max())))  # fixed batch that never exceeds the budget
    return {
        "ff-bucket": (f"fastfeed bucket B={BATCH}", ff_bucket),
        "ff-tokens": (f"fastfeed budget tokens {tokens}", ff_budget("tokens")),
        "ff-attention": (f"fastfeed budget attention {tokens}", ff_budget("attention")),
        "ff-varlen": (f"fastfeed budget varlen {tokens}", ff_budget("varlen")),
        "ds-fixed": (f"DistributedSampler B={BATCH}", lambda e: distributed_sampler(lengths, W, BATCH, e)),
        "ds-fits": (f"DistributedSampler B={same_tokens} (fits {tokens})",
                    lambda e: distributed_sampler(lengths, W, same_tokens, e)),
        "hf-megabatch": (f"HF megabatch B={BATCH} (re-impl)", lambda e: hf_megabatch(lengths, W, BATCH, e)),
        "fairseq": (f"fairseq batch_by_size {tokens} (re-impl)",
                    lambda e: fairseq_batch_by_size(lengths, W, tokens, e)),
    }


def plan_time(n: int, W: int) -> dict[str, tuple[float, float]]:
    """(wall, CPU) seconds to plan one epoch of ``n`` lengths at world size ``W``, best of 3."""
    lengths = lognormal(n, seed=1)
    world = {"num_replicas": W, "rank": 0}
    out = {}
    for name, make in (("bucket", lambda: DistributedLengthBucketSampler(lengths, batch_size=BATCH, **world)),
                       ("budget tokens", lambda: DistributedTokenBudgetSampler(lengths, max_cost=BUDGET, **world)),
                       ("budget attention", lambda: DistributedTokenBudgetSampler(lengths, max_cost=BUDGET,
                                                                                  cost="attention", **world)),
                       ("budget varlen", lambda: DistributedTokenBudgetSampler(lengths, max_cost=BUDGET, cost="varlen",
                                                                               **world))):
        s = make()
        best = []
        for e in range(3):  # best of 3 epochs: the machine is shared
            s.set_epoch(e)
            s._cached = None
            with Stopwatch() as took:
                len(s)  # plans the epoch and extracts this rank's batches
            best.append((took.wall, took.cpu))
        out[name] = min(best)
    return out


# ----------------------------------------------------------------------------- the grid
#: the corpora: name -> (lengths of ``n`` samples, or of the real corpus; the token budget in their unit)
#: (the stdlib corpus is small, ~86k blocks of mean ~30 tokens: a 2048-token budget keeps enough steps
#: per epoch at 64 ranks for the figures to mean something)
DISTRIBUTIONS: dict[str, tuple[Callable[[int], np.ndarray], int]] = {
    "lognormal(5,1)[16,1024]": (lognormal, BUDGET),
    "python-stdlib tokens": (lambda n: stdlib_tokens(), 2048),
    "bimodal 64/900": (bimodal, BUDGET),
    f"zipf tail to {BUDGET}": (zipf_tail, BUDGET),
    "python-all tokens": (lambda n: python_tokens(), 2048),
}
SAMPLERS = ("ff-bucket", "ff-tokens", "ff-attention", "ff-varlen", "ds-fixed", "ds-fits", "hf-megabatch", "fairseq")


@functools.lru_cache(maxsize=1)
def _lengths(dist: str, n: int) -> np.ndarray:
    return DISTRIBUTIONS[dist][0](n)


def options(ap: argparse.ArgumentParser) -> None:
    """Corpus sizes, the jitter, which distributions and samplers."""
    ap.add_argument("--n", type=int, default=1_000_000, help="samples per synthetic distribution")
    ap.add_argument("--plan-n", type=int, default=10_000_000, help="samples for the planning-time figure")
    ap.add_argument("--only", default=None, help="comma list of distributions (a part of their names)")
    ap.add_argument("--jitter", type=lambda v: v if v == "auto" else float(v), default="auto",
                    help="fastfeed samplers' jitter: 'auto' (their default: measured per corpus) or a number")
    ap.add_argument("--baselines", action=argparse.BooleanOptionalAction, default=True)


def skip(point: Point, ctx: Context) -> str | None:
    """Distributions not named by ``--only``; the baselines with ``--no-baselines``."""
    only = ctx.args.only
    if only and not any(o in point["distribution"] for o in only.split(",")):
        return f"{point['distribution']}: not in --only"
    if not ctx.args.baselines and not point["sampler"].startswith("ff-"):
        return "--no-baselines: fastfeed's samplers only"
    return None


def run_point(point: Point, ctx: Context) -> dict[str, Any]:
    """One sampler's epoch plans on one corpus at one world size."""
    global JITTER
    JITTER = ctx.args.jitter
    dist, W = point["distribution"], point["world_size"]
    lengths = _lengths(dist, ctx.args.n)
    first = [s for s in ctx.grid["sampler"] if skip({**point, "sampler": s}, ctx) is None][:1]
    if [point["sampler"]] == first:
        print(f"\n== {dist}: N={lengths.shape[0]:,}, mean length {lengths.mean():.0f}, world size {W}", flush=True)
        print(f"{'sampler':<44}{'steps':>7}{'batch':>7}{'padding':>9}{'strag tok':>10}{'strag att':>10}"
              f"{'wait tok':>9}{'repeat':>8}{'rep pairs':>10}{'rho':>7}{'plan s':>8}{'jitter':>8}{'auto s':>8}")
    name, make = samplers_for(lengths, W, DISTRIBUTIONS[dist][1])[point["sampler"]]
    r = sampler_row(name, make, lengths)
    r.update(distribution=dist, world_size=W, n=int(lengths.shape[0]))
    print(f"{name:<44}{r['steps']:>7}{r['batch']:>7.1f}{r['padding']:>9.3f}{r['straggler_tokens']:>10.3f}"
          f"{r['straggler_attention']:>10.3f}{r['wait_tokens']:>9.1%}{r['repeat_sample']:>8.2%}"
          f"{r['repeat_pairs']:>10.2%}{r['rho']:>7.2f}{r['plan_s']:>8.2f}"
          + (f"{r['jitter']:>8.2f}{r['jitter_s']:>8.2f}" if "jitter" in r else ""), flush=True)
    return r


def report(rows: list[tuple[Point, dict[str, Any]]], ctx: Context) -> dict[str, Any]:
    """The rows (printed as they were measured), then the planning time at ``--plan-n`` lengths:
    a measurement of its own, per world size of the grid, after the grid's points."""
    args = ctx.args
    times = {}
    if args.plan_n:
        for W in ctx.grid["world_size"]:
            times[W] = plan_time(args.plan_n, W)
            print(f"\nplan time, {args.plan_n:,} lengths, world size {W} (best of 3, wall / cpu s): " +
                  ", ".join(f"{k} {w:.2f}/{c:.2f}" for k, (w, c) in times[W].items()), flush=True)
    return {"rows": [r for _, r in rows], "plan_time": {str(k): v for k, v in times.items()}, "n": args.n,
            "plan_n": args.plan_n}


BENCHMARK = Benchmark(
    name="samplers", doc=__doc__, options=options, skip=skip, run_point=run_point, report=report,
    grid=(Axis("distribution", tuple(DISTRIBUTIONS), help="the length distributions"),
          Axis("world_size", (8, 64), flag="--world-sizes", parse=int, help="ranks"),
          Axis("sampler", SAMPLERS, help="fastfeed's samplers (ff-) and the baselines")),
    quick={"n": 100_000, "plan_n": 1_000_000, "distribution": ("lognormal(5,1)[16,1024]", "python-stdlib tokens")},
)

if __name__ == "__main__":
    from benchmarks.run import main

    sys.exit(main([BENCHMARK.name, *sys.argv[1:]]))
