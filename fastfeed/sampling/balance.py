"""How balanced and how padded an epoch is: fastfeed's samplers next to DistributedSampler.

:func:`balance_report` plans one epoch with a fastfeed sampler and with torch's
``DistributedSampler`` + a fixed batch size (the same indices torch would produce), and
reports for each: steps per rank, padding efficiency (real tokens / padded tokens),
straggler ratio (mean over steps of slowest rank's cost / mean rank cost), the share of
rank time spent waiting for the slowest rank, and the epoch's cost (sum over steps of
the slowest rank's cost: predicted seconds with a fitted model).

Example:
    >>> import numpy as np
    >>> lengths = np.clip(np.random.default_rng(0).lognormal(5, 1, 20000), 16, 1024).astype(int)
    >>> r = balance_report(lengths, world_size=8, max_cost=16384)
    >>> r.rows[0].padding_efficiency > 0.95 > r.rows[1].padding_efficiency
    True
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Sequence

import numpy as np

from fastfeed._options import MAX_COUNT, as_bool, check_int
from fastfeed._state import check_epoch
from fastfeed.dist import MAX_WORLD_SIZE
from fastfeed.errors import ConfigError
from fastfeed.sampling.steps import CostFn, co_batch_repeat_rate
from fastfeed.sampling.samplers import (
    DistributedLengthBucketSampler,
    DistributedTokenBudgetSampler,
    resolve_lengths,
)

__all__ = ["BalanceReport", "BalanceStats", "balance_report", "co_batch_repeat_rate",
           "distributed_sampler_batches", "epoch_stats"]


@dataclass(frozen=True)
class BalanceStats:
    """Figures of one sampler over one epoch (costs in the report's unit).

    Attributes:
        name: which sampler.
        steps_per_rank: steps every rank runs (max over ranks if they differ).
        steps_equal: True when every rank runs the same number of steps.
        mean_batch_size: samples per batch.
        samples: samples drawn over all ranks (repeats included).
        padding_efficiency: real tokens / padded tokens (n * longest per batch).
        straggler_ratio: mean over steps of (slowest rank's cost / mean rank cost).
        worst_step_ratio: the largest such ratio of any step.
        wait_share: share of rank time spent waiting for the slowest rank of the step.
        epoch_cost: sum over steps of the slowest rank's cost.
        real_tokens_per_step: real tokens per step, all ranks together.
        tokens_per_cost: real tokens per unit of epoch cost (tokens/s with a fitted model).
    """

    name: str
    steps_per_rank: int
    steps_equal: bool
    mean_batch_size: float
    samples: int
    padding_efficiency: float
    straggler_ratio: float
    worst_step_ratio: float
    wait_share: float
    epoch_cost: float
    real_tokens_per_step: float
    tokens_per_cost: float


def epoch_stats(name: str, counts: np.ndarray, maxlen: np.ndarray, sum_l: np.ndarray,
                costs: np.ndarray, steps_per_rank: Sequence[int] | None = None) -> BalanceStats:
    """Figures from per-batch (S, W) arrays; batches a rank does not run have count 0."""
    counts = np.asarray(counts)
    has = counts > 0
    padded = float((counts * maxlen).sum())
    real = float(sum_l.sum())
    c = np.where(has, costs, 0.0)
    slow = c.max(axis=1) if c.size else np.zeros(0)
    mean = c.mean(axis=1) if c.size else np.zeros(0)
    ratio = np.divide(slow, mean, out=np.ones_like(slow), where=mean > 0)
    epoch = float(slow.sum())
    W = counts.shape[1] if counts.ndim == 2 else 1
    per_rank = list(steps_per_rank) if steps_per_rank is not None else [counts.shape[0]] * W
    return BalanceStats(
        name=name, steps_per_rank=int(max(per_rank) if per_rank else 0),
        steps_equal=len(set(per_rank)) <= 1,
        mean_batch_size=float(counts.sum() / max(1, has.sum())), samples=int(counts.sum()),
        padding_efficiency=real / padded if padded else 1.0,
        straggler_ratio=float(ratio.mean()) if ratio.size else 1.0,
        worst_step_ratio=float(ratio.max()) if ratio.size else 1.0,
        wait_share=float((slow[:, None] - c).sum() / (W * epoch)) if epoch else 0.0,
        epoch_cost=epoch, real_tokens_per_step=real / max(1, counts.shape[0]),
        tokens_per_cost=real / epoch if epoch else 0.0)


def distributed_sampler_batches(lengths: np.ndarray, *, world_size: int, batch_size: int, seed: int = 0,
                                epoch: int = 0, drop_last: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """torch ``DistributedSampler`` + ``DataLoader(batch_size)``: indices per (step, rank).

    Reproduces torch's index arithmetic (``randperm`` seeded with ``seed + epoch``,
    padding by repeating the first indices, ``indices[rank::world_size]``) without
    building Python lists, so it scales to millions. Returns ``(idx, valid)``:
    ``idx`` (S, W, batch_size) sample indices and ``valid`` marking real entries
    (the last batch may be short when ``drop_last=False``).
    """
    import torch

    N, W, B = lengths.shape[0], world_size, batch_size
    g = torch.Generator()
    g.manual_seed(seed + epoch)
    perm = torch.randperm(N, generator=g).numpy()
    if drop_last and N % W:
        per_rank = math.ceil((N - W) / W)
    else:
        per_rank = math.ceil(N / W)
    total = per_rank * W
    if total > N:
        perm = np.concatenate([perm, np.tile(perm, math.ceil((total - N) / N))[: total - N]])
    rank_idx = perm[:total].reshape(per_rank, W).T  # (W, per_rank): rank r takes perm[r::W]
    steps = per_rank // B if drop_last else math.ceil(per_rank / B)
    pad = steps * B - per_rank
    if pad > 0:
        rank_idx = np.concatenate([rank_idx, np.full((W, pad), -1)], axis=1)
    else:
        rank_idx = rank_idx[:, : steps * B]
    idx = rank_idx.reshape(W, steps, B).transpose(1, 0, 2)
    return idx, idx >= 0


def _fixed_batch_stats(name: str, lengths: np.ndarray, idx: np.ndarray, valid: np.ndarray,
                       cost: CostFn) -> BalanceStats:
    L = np.where(valid, lengths[np.maximum(idx, 0)], 0)
    counts = valid.sum(axis=2)
    maxlen = L.max(axis=2)
    lf = L.astype(np.float64)
    s1, s2 = lf.sum(axis=2), (lf * lf).sum(axis=2)
    if cost.model is not None:
        costs = cost.model.cost_from_features(counts, maxlen, s1, s2)
    else:
        costs = np.array([[cost._call(L[s, r][valid[s, r]]) if counts[s, r] else 0.0
                           for r in range(L.shape[1])] for s in range(L.shape[0])]).reshape(counts.shape)
    return epoch_stats(name, counts, maxlen, s1, costs)


@dataclass(frozen=True)
class BalanceReport:
    """fastfeed's sampler and the DistributedSampler baseline over one epoch."""

    num_samples: int
    world_size: int
    cost: str
    unit: str
    rows: tuple[BalanceStats, ...]
    settings: dict[str, Any]

    def speedup(self) -> float:
        """Baseline epoch cost / fastfeed epoch cost, per real token (predicted)."""
        ff, base = self.rows[0], self.rows[1]
        return ff.tokens_per_cost / base.tokens_per_cost if base.tokens_per_cost else float("nan")

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (what ``fastfeed balance --json`` prints)."""
        return {"num_samples": self.num_samples, "world_size": self.world_size, "cost": self.cost,
                "unit": self.unit, "settings": self.settings, "predicted_speedup": self.speedup(),
                "samplers": [asdict(r) for r in self.rows]}

    def text(self) -> str:
        """What ``fastfeed balance`` prints: :meth:`table`."""
        return self.table()

    def table(self) -> str:
        """One row per sampler (steps, batch, padding efficiency, straggler, waits, epoch cost), then the
        predicted speed-up."""
        head = (f"{self.num_samples:,} samples, world size {self.world_size}, cost {self.cost} [{self.unit}]")
        cols = ["steps/rank", "batch", "padding eff.", "straggler", "worst step", "wait share", "epoch cost"]
        width = max(len(r.name) for r in self.rows) + 2
        lines = [head, " " * width + "  ".join(f"{c:>12}" for c in cols)]
        for r in self.rows:
            vals = [f"{r.steps_per_rank:,}" + ("" if r.steps_equal else "!"), f"{r.mean_batch_size:.1f}",
                    f"{r.padding_efficiency:.3f}", f"{r.straggler_ratio:.3f}", f"{r.worst_step_ratio:.3f}",
                    f"{r.wait_share:.1%}", f"{r.epoch_cost:.4g}"]
            lines.append(f"{r.name:<{width}}" + "  ".join(f"{v:>12}" for v in vals))
        lines.append(f"predicted speed-up per real token: {self.speedup():.2f}x")
        return "\n".join(lines)


#: The most (rank, sample) slots one step of the DistributedSampler baseline may have (2**28).
MAX_BASELINE_SLOTS = 1 << 28


def _check_args(world_size: Any, batch_size: Any, seed: Any, epoch: Any, drop_last: Any,
                baseline: Any) -> tuple[int, int, int, bool, int | None]:
    """:func:`balance_report`'s own arguments, checked (the samplers check the rest)."""
    world = check_int("world_size", world_size, 1, most=MAX_WORLD_SIZE)
    seed = check_int("seed", seed, 0, most=(1 << 63) - 1)
    epoch = check_epoch(epoch, "balance_report(epoch=...)")
    if baseline is not None:
        baseline = check_int("baseline_batch_size", baseline, 1, most=MAX_COUNT)
    base = baseline if baseline is not None else batch_size
    if isinstance(base, int) and not isinstance(base, bool) and world * base > MAX_BASELINE_SLOTS:
        raise ConfigError(f"world_size={world} x batch {base}: the DistributedSampler baseline would lay out "
                          f"{world * base:,} slots a step (at most {MAX_BASELINE_SLOTS:,}); pass a smaller "
                          "baseline_batch_size (or batch_size)")
    return world, seed, epoch, as_bool(drop_last, "drop_last"), baseline


def balance_report(lengths: Any, *, world_size: int, batch_size: int | None = None,
                   max_cost: float | str | None = None, cost: Any = "tokens", seed: int = 0, epoch: int = 0,
                   drop_last: bool = False, jitter: float | str | None = None,
                   baseline_batch_size: int | None = None) -> BalanceReport:
    """Plan one epoch with a fastfeed sampler and with DistributedSampler; compare.

    Args:
        lengths: per-sample lengths (an array, a packed dataset path, ...).
        world_size: number of ranks.
        batch_size: use :class:`~fastfeed.sampling.samplers.DistributedLengthBucketSampler` with it, or
        max_cost: use :class:`~fastfeed.sampling.samplers.DistributedTokenBudgetSampler` with it.
        cost: ``"tokens"``, ``"attention"``, ``"varlen"``, a CostModel (or its JSON path)
            or a callable; with a fitted model, costs are predicted seconds.
        seed, epoch, drop_last, jitter: as for the samplers (``None``: their default, ``"auto"``).
        baseline_batch_size: DistributedSampler's batch size; default ``batch_size``, or
            for a budget the size giving the same mean real tokens per batch.

    Example:
        >>> r = balance_report([100, 900] * 500, world_size=4, batch_size=8)
        >>> print(r.table())  # doctest: +SKIP
    """
    if (batch_size is None) == (max_cost is None):
        raise ConfigError("give exactly one of batch_size (fixed batches) or max_cost (a cost budget)")
    world_size, seed, epoch, drop_last, baseline_batch_size = _check_args(
        world_size, batch_size, seed, epoch, drop_last, baseline_batch_size)
    lens = resolve_lengths(lengths)
    common = dict(num_replicas=world_size, rank=0, seed=seed, drop_last=drop_last, cost=cost,
                  jitter="auto" if jitter is None else jitter)
    if batch_size is not None:
        sampler: Any = DistributedLengthBucketSampler(lens, batch_size=batch_size, **common)
        name = f"fastfeed length buckets (batch {batch_size})"
    else:
        sampler = DistributedTokenBudgetSampler(lens, max_cost=max_cost, **common)
        name = f"fastfeed token budget ({sampler.max_cost:g})"
    plan = sampler.epoch_plan(epoch)
    n, mx, s1, _ = plan.features()
    ff = epoch_stats(name, n, mx, s1, plan.costs(sampler._cost_fn))
    if baseline_batch_size is None:
        baseline_batch_size = batch_size or max(1, round(float(s1.sum()) / max(1, int(n.size)) / float(lens.mean())))
    idx, valid = distributed_sampler_batches(lens, world_size=world_size, batch_size=baseline_batch_size,
                                             seed=seed, epoch=epoch, drop_last=drop_last)
    base = _fixed_batch_stats(f"DistributedSampler + batch {baseline_batch_size}", lens, idx, valid,
                              sampler._cost_fn)
    model = sampler._cost_fn.model
    return BalanceReport(
        num_samples=int(lens.shape[0]), world_size=world_size,
        cost=model.name if model is not None else "callable",
        unit=model.unit if model is not None else "cost", rows=(ff, base),
        settings={"batch_size": batch_size, "max_cost": getattr(sampler, "max_cost", None),
                  "baseline_batch_size": baseline_batch_size, "seed": seed, "epoch": epoch,
                  "drop_last": drop_last, "jitter": sampler.jitter,
                  "repeats": plan.num_repeats, "dropped": plan.num_dropped})
