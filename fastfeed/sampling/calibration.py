"""Calibrate a cost model: time your own training step on varied batch shapes, then fit.

:func:`calibrate` builds a short, deliberately varied set of batches from the real
length distribution (short and long, small and large, uniform and mixed lengths, so
that every feature of :class:`~fastfeed.sampling.costmodel.CostModel` can be told apart), runs
``step`` on each a few times with the GPU synchronised around every measurement, and
fits the model with :func:`~fastfeed.sampling.costmodel.fit_cost_model` on the median of the warm
timings of each shape.

How it times: the shapes are run in rounds (every shape once per round), so a slow
drift of the device (clocks, temperature, other work) spreads over all shapes instead
of biasing some. The first round is *cold*: it is only compared with the later, warm
ones. A step whose first run on a new shape is much slower than its repeats has a
per-shape setup cost (for example torch's cuDNN attention backend, which builds an
execution plan for every new shape, or ``torch.compile`` recompiling): a length-aware
sampler makes nearly every batch a new shape, so training pays that cost on most steps
and no model of the lengths can balance it. :class:`ShapeSetupWarning` says so, with
the figure, and the model keeps it in ``meta["first_call_extra_s"]``.

In a distributed job call it on every rank: all ranks run the same shapes in the same
order (so collective calls inside ``step`` line up), start every timed step together
(a tiny all-reduce after the synchronisation, so one rank's late start does not count
as another's step time), stop together, and fit one model on the slowest rank's times,
so every rank plans with identical costs.

Example:
    >>> def step(lengths):                       # build a batch of these lengths, train one step
    ...     x = torch.randint(0, 32000, (len(lengths), max(lengths)), device="cuda")
    ...     loss = model(x).float().mean(); loss.backward(); opt.step(); opt.zero_grad()
    >>> cm = fastfeed.calibrate(step, "/data/wiki-ff", max_tokens=16384)   # doctest: +SKIP
    >>> print(cm.summary()); cm.save("step_cost.json")                       # doctest: +SKIP
    >>> sampler = fastfeed.DistributedTokenBudgetSampler("/data/wiki-ff", max_cost=0.12, cost=cm)  # doctest: +SKIP
"""

from __future__ import annotations

import datetime as _dt
import logging
import sys
import time
import warnings
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from fastfeed.errors import ConfigError
from fastfeed.sampling.costmodel import CostModel, fit_cost_model
from fastfeed.sampling.samplers import resolve_lengths

__all__ = ["ShapeSetupWarning", "calibrate", "design_shapes"]

log = logging.getLogger(__name__)


class ShapeSetupWarning(UserWarning):
    """The timed step costs much more on the first run of each new batch shape than on repeats."""


def design_shapes(lengths: np.ndarray, *, max_tokens: int, num_shapes: int = 32,
                  seed: int = 0, min_fraction: float = 1 / 32) -> list[np.ndarray]:
    """Varied batches (arrays of positions into ``lengths``) for calibration.

    Longest lengths on a geometric grid over the real distribution's 5%..100%
    quantiles; per length, batches of about ``min_fraction``, its square root (1/32,
    ~1/6 by default) and all of ``max_tokens`` padded tokens; each both *uniform*
    (lengths close to the longest) and *mixed* (lengths drawn from the distribution
    below the longest). Never more than ``max_tokens`` padded tokens per batch.

    Raise ``min_fraction`` (e.g. 1/4) when small steps are bound by the CPU launching
    kernels rather than by the GPU: their time stops following the lengths, and a
    linear fit across that knee is off for the large batches that training uses.

    Example:
        >>> shapes = design_shapes(np.arange(16, 1025), max_tokens=8192, num_shapes=12)
        >>> len(shapes), all(len(s) * np.arange(16, 1025)[s].max() <= 8192 for s in shapes)
        (12, True)
    """
    if not 0 < min_fraction <= 1:
        raise ConfigError(f"min_fraction={min_fraction!r} must be in (0, 1]: the smallest batch, as a share of max_tokens")
    rng = np.random.default_rng(seed)
    order = np.argsort(lengths, kind="stable")
    sorted_l = lengths[order]
    lo = max(1.0, float(np.quantile(sorted_l, 0.05)))
    hi = float(sorted_l[-1])
    if hi > max_tokens:
        hi = float(sorted_l[np.searchsorted(sorted_l, max_tokens, side="right") - 1])
    levels = np.unique(np.round(np.geomspace(lo, max(hi, lo), 6)))
    shapes: list[np.ndarray] = []
    for L in levels:
        top = np.searchsorted(sorted_l, L, side="right")  # samples no longer than L
        if top == 0:
            continue
        Lr = float(sorted_l[top - 1])
        for frac in sorted({min_fraction, min_fraction ** 0.5, 1.0}):
            n = int(max(1, min(max_tokens // max(Lr, 1), round(frac * max_tokens / max(Lr, 1)))))
            near = np.searchsorted(sorted_l, Lr * 0.97, side="left")
            uniform = order[rng.integers(near, top, n)]
            shapes.append(uniform)
            if n > 1:
                mixed = np.concatenate([[order[top - 1]], order[rng.integers(0, top, n - 1)]])
                shapes.append(mixed)
    if not shapes:
        raise ConfigError("no calibration shapes fit: max_tokens is smaller than the shortest sample")
    if len(shapes) > num_shapes:  # keep the extremes, sample the rest
        keep = [int(np.argmax([len(s) * lengths[s].max() for s in shapes])), 0]
        rest = [i for i in range(len(shapes)) if i not in keep]
        keep += list(rng.choice(rest, num_shapes - len(keep), replace=False))
        shapes = [shapes[i] for i in sorted(set(keep))]
    return [shapes[i] for i in rng.permutation(len(shapes))]


def _cuda_sync() -> Callable[[], None] | None:
    torch = sys.modules.get("torch")  # if the step never imported torch, nothing runs on a GPU
    if torch is None:
        return None
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.cuda.synchronize
    return None


def _dist() -> Any:
    dist = sys.modules.get("torch.distributed")  # a process group implies it is imported
    return dist if dist is not None and dist.is_available() and dist.is_initialized() else None


def _collective_device(dist: Any) -> Any:
    import torch

    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _allreduce_max(values: Sequence[float]) -> np.ndarray:
    """Element-wise max over ranks (identity without a process group)."""
    dist = _dist()
    if dist is None:
        return np.asarray(values, dtype=np.float64)
    import torch

    t = torch.tensor(list(values), dtype=torch.float64, device=_collective_device(dist))
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.cpu().numpy()


def _aligner() -> Callable[[], None] | None:
    """A tiny all-reduce that returns once every rank has reached it (None without a process group)."""
    dist = _dist()
    if dist is None:
        return None
    import torch

    device = _collective_device(dist)
    token = torch.zeros(1, device=device)

    def align() -> None:
        dist.all_reduce(token)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    return align


def calibrate(
    step: Callable[[Any], Any],
    lengths: Any,
    *,
    max_tokens: int,
    features: str | Sequence[str] = "all",
    num_shapes: int = 32,
    repeats: int = 4,
    warmup: int = 3,
    time_budget: float = 60.0,
    call_with: str = "lengths",
    sync: str | Callable[[], None] | None = "auto",
    seed: int = 0,
    warn_above: float = 0.05,
    min_fraction: float = 1 / 32,
    setup_warn_above: float = 0.25,
    meta: Mapping[str, Any] | None = None,
) -> CostModel:
    """Time ``step`` on varied batches and fit a :class:`CostModel` in seconds.

    Args:
        step: runs one full training step (forward, backward, optimizer) on a batch.
            It gets the batch's lengths (int64 array) or, with ``call_with="indices"``,
            the dataset indices of real samples of those lengths.
        lengths: the dataset's lengths (anything :func:`fastfeed.sampling.samplers.resolve_lengths`
            takes); the shapes follow their distribution.
        max_tokens: the largest batch to try, in padded tokens (``n * longest``): keep it
            within your GPU memory, e.g. the budget you plan to train with.
        features: what to fit (``"all"``, ``"padded"``, ``"varlen"`` or names).
        num_shapes: how many different batches to time (a few dozen is plenty).
        repeats: timings per shape, in rounds over all shapes. The first (cold) round
            only measures per-shape setup cost; the fit uses the median of the others
            (of the cold one when ``repeats=1``).
        warmup: untimed runs of the largest shape first (allocator, autotuning, compile).
        time_budget: seconds after which no new shape is started (at least
            ``len(features) + 2`` shapes are always timed); the cold round gets
            ``time_budget / repeats`` of it, as each later round costs about the same.
        call_with: ``"lengths"`` or ``"indices"``.
        sync: ``"auto"`` synchronises CUDA when it is in use; a callable; or None.
        seed: picks the shapes (the same on every rank).
        warn_above: median error above which a :class:`~fastfeed.sampling.costmodel.PoorFitWarning` is raised.
        min_fraction: the smallest batches, as a share of ``max_tokens`` (see :func:`design_shapes`).
        setup_warn_above: median extra time of a shape's first run over its warm runs, as a
            share of the warm time, above which a :class:`ShapeSetupWarning` is raised.
        meta: extra provenance saved with the model.

    Returns:
        The fitted model; ``model.fit`` holds its quality (median and worst error),
        ``model.meta["first_call_extra_s"]`` the median per-shape setup cost.
    """
    if call_with not in ("lengths", "indices"):
        raise ConfigError(f"call_with={call_with!r} must be 'lengths' or 'indices'")
    if not isinstance(max_tokens, (int, np.integer)) or max_tokens < 1:
        raise ConfigError(f"max_tokens={max_tokens!r} must be a positive integer (padded tokens)")
    lens = resolve_lengths(lengths)
    shapes = design_shapes(lens, max_tokens=int(max_tokens), num_shapes=num_shapes, seed=seed,
                           min_fraction=min_fraction)
    do_sync = _cuda_sync() if sync == "auto" else sync
    if do_sync is not None and not callable(do_sync):
        raise ConfigError(f"sync={sync!r} must be 'auto', a callable or None")
    align = _aligner()
    min_shapes = 7 if features == "all" else 5
    rounds = max(1, int(repeats))

    def run(idx: np.ndarray) -> float:
        arg = idx if call_with == "indices" else lens[idx]
        if do_sync:
            do_sync()
        if align:
            align()
        t0 = time.perf_counter()
        step(arg)
        if do_sync:
            do_sync()
        return time.perf_counter() - t0

    largest = max(shapes, key=lambda s: len(s) * int(lens[s].max()))
    for _ in range(max(0, warmup)):
        run(largest)
    start = time.perf_counter()
    cold: list[float] = []
    for i, idx in enumerate(shapes):  # round 0 (cold) decides how many shapes fit the budget
        cold.append(run(idx))
        over = time.perf_counter() - start > time_budget / rounds and i + 1 >= min_shapes
        if _allreduce_max([float(over)])[0] > 0 and i + 1 < len(shapes):
            log.warning("calibration stopped after %d of %d shapes (time_budget=%gs)", i + 1, len(shapes), time_budget)
            break
    shapes = shapes[: len(cold)]
    warm = [[run(idx) for idx in shapes] for _ in range(rounds - 1)]  # rounds 1.. over every shape
    kept = np.median(np.array(warm), axis=0) if warm else np.array(cold)
    times = _allreduce_max([*kept, *cold])
    kept, cold_all = times[: len(shapes)], times[len(shapes):]
    records = [(lens[idx], float(t)) for idx, t in zip(shapes, kept)]
    info: dict[str, Any] = {
        "calibrated": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "shapes": len(records), "repeats": rounds, "max_tokens": int(max_tokens), "min_fraction": min_fraction,
        "seconds": round(time.perf_counter() - start, 3), **_device_info(), **dict(meta or {})}
    if warm:
        extra = cold_all - kept
        info["first_call_extra_s"] = float(np.median(extra))
        info["first_call_extra_share"] = float(np.median(extra / kept))
        if info["first_call_extra_share"] > setup_warn_above:
            warnings.warn(ShapeSetupWarning(
                f"the first run of each new batch shape took a median {info['first_call_extra_s'] * 1e3:.1f} ms "
                f"({info['first_call_extra_share']:.0%}) longer than its repeats: the step has a per-shape setup "
                "cost. A length-aware sampler makes nearly every batch a new shape, so training pays it on most "
                "steps, and no cost model of the lengths can balance it. Common causes: torch's cuDNN attention "
                "backend builds a plan per shape (torch.backends.cuda.enable_cudnn_sdp(False) picks flash "
                "attention); torch.compile recompiles (compile with dynamic=True); "
                "torch.backends.cudnn.benchmark=True autotunes every shape"
            ), stacklevel=2)
    return fit_cost_model(records, features=features, warn_above=warn_above, name="calibrated", meta=info)


def _device_info() -> dict[str, Any]:
    torch = sys.modules.get("torch")
    if torch is None:
        return {"device": "cpu"}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    return {"device": "cpu", "torch": torch.__version__}
