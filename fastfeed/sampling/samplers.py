"""Length-aware distributed batch samplers: equal steps, balanced work, little padding.

Both samplers yield, for their rank, one list of dataset indices per step: pass them to
a DataLoader as ``batch_sampler``. Every rank plans the same epoch from (lengths, seed,
epoch, world size) with pure numpy (:mod:`fastfeed.sampling.steps`) and takes its own batches.

- :class:`DistributedLengthBucketSampler`: ``batch_size`` samples per batch, each batch of
  similar lengths, all ranks of a step from the same length class.
- :class:`DistributedTokenBudgetSampler`: as many samples per batch as fit in ``max_cost``
  (padded tokens, attention cost, a fitted :class:`~fastfeed.sampling.costmodel.CostModel` in seconds,
  or any callable), balanced between the ranks of each step.

Guarantees: every rank yields the same number of steps for any N, world size and
``drop_last``; each sample is used exactly once per epoch up to the remainder policy
below; the plan depends only on (seed, epoch) and is re-drawn every epoch; long and
short steps are mixed over the epoch; ``state_dict`` resumes mid-epoch exactly.

Remainder policy (N samples, W ranks, B = batch_size):

- LengthBucket, ``drop_last=False``: every sample at least once; ``(-N) mod W`` samples,
  drawn at random each epoch, appear twice so each rank's batches have equal sizes; one
  step (at a random place in the length order) holds the smaller leftover batches.
- LengthBucket, ``drop_last=True``: every batch holds exactly B; ``N mod (W*B)`` samples,
  drawn at random each epoch, sit out the epoch (N < W*B gives zero steps).
- TokenBudget: batch sizes vary by design, so a short step is fine; only if the leftover
  step holds fewer than W samples, ``drop_last=False`` repeats ``W - n`` of them (at most
  W - 1) and ``drop_last=True`` leaves those ``n`` (at most W - 1) out. The leftover step
  sits at a random place in the length order, so no sample is repeated or left out
  systematically. Samples that alone exceed ``max_cost`` raise an error, or with
  ``oversize="skip"`` are left out every epoch, counted in ``num_skipped`` and logged.

Example:
    >>> from torch.utils.data import DataLoader
    >>> sampler = DistributedTokenBudgetSampler("/data/wiki-ff", max_cost=16384)  # doctest: +SKIP
    >>> loader = DataLoader(dataset, batch_sampler=sampler, num_workers=8)        # doctest: +SKIP
    >>> for epoch in range(10):                                                    # doctest: +SKIP
    ...     sampler.set_epoch(epoch)
    ...     for batch in loader: ...
"""

from __future__ import annotations

import hashlib
import inspect
import io
import logging
import math
import os
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence, Union

import numpy as np

from fastfeed._options import MAX_COUNT, as_bool, at_least, check_int, number
from fastfeed._state import MAX_EPOCH, StateLayout, Stages, check_epoch
from fastfeed._util import parse_duration
from fastfeed.dist import MAX_WORLD_SIZE, resolve_world
from fastfeed.errors import ConfigError
from fastfeed.packed.index import DatasetIndex, atomic_write_bytes
from fastfeed.sampling.costmodel import CostModel
from fastfeed.sampling.elastic import plan_after, restrict, stage_seed
from fastfeed.sampling.steps import (
    CostFn,
    Plan,
    co_batch_repeat_rate,
    plan_budget,
    plan_fixed,
)

__all__ = ["DistributedLengthBucketSampler", "DistributedTokenBudgetSampler", "resolve_lengths"]

log = logging.getLogger(__name__)

LengthsLike = Union[np.ndarray, Sequence[int], str, "os.PathLike[str]", Any, Callable[..., Any]]
CostSpec = Union[str, CostModel, Callable[[np.ndarray], float]]
DEFAULT_JITTER = 0.03
#: The samplers' ``state_dict()`` layout (version 2; version 1 had no ``stages``): the
#: version rules, integer checks, ``stages`` and messages are shared with the loader's
#: (:class:`fastfeed._state.StateLayout`); ``source`` names the sampler class when read.
STATE_LAYOUT = StateLayout(
    "sampler state", version_key="version", version=2, reads=(1, 2), source="the sampler's state_dict()",
    required=("sampler", "epoch", "step", "seed", "num_replicas", "num_samples", "lengths_digest", "config"),
    ints=("epoch", "step", "num_replicas", "num_samples"), most=(("epoch", MAX_EPOCH),),
    stages=Stages((("num_replicas", 1), ("steps", 0))), count_key="step",
    v1_stage=lambda state: (state["num_replicas"], state["step"]))
#: What a state must match: the sampler, its lengths and options (world size may change).
_MUST_MATCH = ("sampler", "seed", "num_samples", "lengths_digest", "config")

#: ``jitter="auto"``: the jitters tried, smallest first (the first is :data:`DEFAULT_JITTER`).
AUTO_JITTERS = (0.03, 0.04, 0.05, 0.06, 0.08, 0.10, 0.12)
#: ``jitter="auto"`` stops at the first jitter whose per-sample co-batch repeat between two
#: epochs is at most this ...
AUTO_REPEAT_TARGET = 0.01
#: ... and never widens the jitter to where padding efficiency falls below this.
AUTO_PADDING_FLOOR = 0.98
#: ``jitter="auto"`` measures plans of up to this many samples; larger corpora (whose
#: length pools are larger, so repeats rarer) use :data:`DEFAULT_JITTER`.
AUTO_MAX_SAMPLES = 4_000_000


# ---------------------------------------------------------------------- lengths
def resolve_lengths(lengths: LengthsLike, *, num_samples: int | None = None,
                    cache: str | os.PathLike[str] | None = None) -> np.ndarray:
    """Per-sample lengths as a validated int64 array.

    Args:
        lengths: a numpy array or sequence of lengths; a packed dataset (path or URL of a
            folder with ``index.json``, or a :class:`~fastfeed.packed.index.DatasetIndex`) whose
            lengths ``fastfeed pack --length`` recorded; a ``.npy`` file; a callable
            ``f() -> lengths``; or a callable ``f(i) -> length`` with ``num_samples``.
        num_samples: how many samples a per-index callable covers.
        cache: a ``.npy`` file to keep a callable's result in (read when it exists and
            matches ``num_samples``, else written), so it is evaluated once.

    Example:
        >>> resolve_lengths([3, 1, 2]).tolist()
        [3, 1, 2]
        >>> resolve_lengths(lambda i: 10 * i, num_samples=3).tolist()
        [0, 10, 20]
    """
    where = "lengths"
    if isinstance(lengths, DatasetIndex):
        arr, where = _index_lengths(lengths, lengths.root or "the index")
    elif isinstance(lengths, (str, os.PathLike)):
        where = str(lengths)
        if where.endswith(".npy"):
            try:
                arr = np.load(where, allow_pickle=False)
            except FileNotFoundError:
                raise ConfigError(f"{where}: no such lengths file") from None
        else:
            arr, where = _index_lengths(DatasetIndex.load(lengths), where)
    elif callable(lengths) and not isinstance(lengths, np.ndarray):
        arr = _cached_call(lengths, num_samples, cache)
        where = f"lengths from {getattr(lengths, '__qualname__', 'a callable')}"
    else:
        arr = np.asarray(lengths)
    return _validate_lengths(arr, where)


def _index_lengths(idx: Any, where: str) -> tuple[np.ndarray, str]:
    lengths = idx.lengths
    if lengths is None:
        raise ConfigError(
            f"{where}: the dataset has no recorded lengths; re-pack it with "
            "`fastfeed pack --length FIELD ...`, or pass the lengths (an array or a callable)"
        )
    return np.asarray(lengths), f"{where} (lengths.npy)"


def _cached_call(fn: Callable[..., Any], num_samples: int | None,
                 cache: str | os.PathLike[str] | None) -> np.ndarray:
    if cache is not None and Path(cache).is_file():
        arr = np.load(cache, allow_pickle=False)
        if num_samples is None or arr.shape[0] == num_samples:
            log.info("lengths read from cache %s", cache)
            return arr
        log.warning("%s holds %d lengths, expected %d: recomputing", cache, arr.shape[0], num_samples)
    required = [p for p in inspect.signature(fn).parameters.values()
                if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if not required:
        arr = np.asarray(fn())
    elif num_samples is None:
        raise ConfigError("a per-sample lengths callable f(i) needs num_samples=N (e.g. len(dataset))")
    else:
        arr = np.fromiter((fn(i) for i in range(num_samples)), dtype=np.int64, count=num_samples)
    if cache is not None:
        buf = io.BytesIO()
        np.save(buf, np.asarray(arr, dtype=np.int64), allow_pickle=False)
        atomic_write_bytes(cache, buf.getvalue())
    return arr


def _validate_lengths(arr: np.ndarray, where: str) -> np.ndarray:
    if arr.ndim != 1:
        raise ConfigError(f"{where}: lengths must be one-dimensional, got shape {arr.shape}")
    if arr.shape[0] == 0:
        raise ConfigError(f"{where}: no samples (empty lengths)")
    if arr.dtype.kind not in "iuf" and arr.dtype != bool:
        raise ConfigError(f"{where}: lengths must be numbers, got dtype {arr.dtype}")
    if arr.dtype.kind == "f":
        bad = ~np.isfinite(arr) | (arr != np.round(arr))
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ConfigError(
                f"{where}: sample {i} has length {arr[i]!r}; lengths must be whole numbers "
                "(tokens, frames; write durations in milliseconds)"
            )
    if arr.min() < 0:
        i = int(np.argmin(arr))
        raise ConfigError(f"{where}: sample {i} has a negative length {arr[i]}")
    return np.ascontiguousarray(arr, dtype=np.int64)


def _digest(lengths: np.ndarray) -> str:
    return hashlib.blake2b(np.ascontiguousarray(lengths).view(np.uint8), digest_size=8).hexdigest()


def resolve_cost(cost: CostSpec) -> CostModel | Callable[[np.ndarray], float]:
    """``"tokens"``/``"attention"``/``"varlen"``, a CostModel, a JSON path or a callable."""
    if isinstance(cost, CostModel):
        return cost
    if isinstance(cost, (str, os.PathLike)):
        text = str(cost)
        if text.endswith(".json"):
            return CostModel.load(text)
        return CostModel.builtin(text)
    if callable(cost):
        return cost
    raise ConfigError(f"cost={cost!r}: use 'tokens', 'attention', 'varlen', a CostModel or a callable")


# ---------------------------------------------------------------------- base
class _LengthSampler:
    """Shared machinery: world, epochs, plan cache, iteration, state."""

    def __init__(self, lengths: LengthsLike, *, num_replicas: int | None, rank: int | None,
                 seed: int, shuffle: bool, drop_last: bool, jitter: float | str, cost: CostSpec,
                 num_samples: int | None, adaptive_jitter: bool = True) -> None:
        self.rank, self.num_replicas = resolve_world(rank, num_replicas)
        self.lengths = resolve_lengths(lengths, num_samples=num_samples)
        seed = check_int("seed", seed, 0, most=(1 << 64) - 1)
        if not (isinstance(jitter, str) and jitter == "auto"):
            jitter = _jitter(jitter)
        self.seed, self.shuffle, self.drop_last = seed, as_bool(shuffle, "shuffle"), as_bool(drop_last, "drop_last")
        self.jitter_spec: float | str = jitter if jitter == "auto" else float(jitter)
        self._jitter: float | None = None if jitter == "auto" else float(jitter)
        self.jitter_report: dict[str, Any] | None = None
        self.adaptive_jitter = as_bool(adaptive_jitter, "adaptive_jitter")
        self.cost = resolve_cost(cost)
        self._cost_fn = CostFn(self.cost)
        self.epoch = 0
        self._position = 0               # steps of the current epoch yielded so far
        self._resume: int | None = None  # where the next iteration starts (load_state_dict)
        self._stages: tuple[tuple[int, int], ...] = ()  # (world, steps) of this epoch at other sizes
        self._cached: tuple[Any, np.ndarray, np.ndarray, int, int] | None = None
        self._digest: str | None = None

    # -- planning
    def _plan(self, epoch: int, jitter: float | None = None) -> Plan:
        return self._plan_over(None, epoch=epoch, world_size=self.num_replicas, seed=self.seed, jitter=jitter)

    def _plan_over(self, ids: np.ndarray | None, *, epoch: int, world_size: int, seed: int,
                   jitter: float | None = None) -> Plan:  # pragma: no cover - abstract
        """The plan over the samples ``ids`` (None: all), in global indices."""
        raise NotImplementedError

    def _resized_plan(self) -> Plan:
        """The rest of the current epoch after the stages it ran at other world sizes
        (:func:`fastfeed.sampling.elastic.plan_after`)."""
        return self._plan_after(self.epoch, self._stages, self.num_replicas)

    def _plan_after(self, epoch: int, stages: Sequence[tuple[int, int]], world_size: int) -> Plan:
        def plan_at(ids: np.ndarray | None, world: int, stage: int) -> Plan:
            return self._plan_over(ids, epoch=epoch, world_size=world, seed=stage_seed(self.seed, stage))
        return plan_after(plan_at, stages, world_size=world_size)

    @property
    def jitter(self) -> float:
        """The jitter the plans use; with ``jitter="auto"`` chosen on first use (:meth:`_auto_jitter`)."""
        if self._jitter is None:
            self._jitter = self._auto_jitter()
        return self._jitter

    def _auto_jitter(self) -> float:
        """The smallest of :data:`AUTO_JITTERS` whose plans repeat co-batches little enough.

        For each jitter, smallest first, plan epochs 0 and 1 and measure the per-sample
        co-batch repeat (:func:`fastfeed.sampling.steps.co_batch_repeat_rate`) and epoch 0's
        padding efficiency. Stop at the first with repeat <= :data:`AUTO_REPEAT_TARGET`.
        Do not go on past a jitter whose padding falls under :data:`AUTO_PADDING_FLOOR`:
        then the largest jitter that kept the floor is used and the trade-off is logged
        (a small corpus with large batches of short samples cannot have both). Measured,
        not predicted: the same numpy planning the epochs use, identical on every rank.
        Without shuffling, or beyond :data:`AUTO_MAX_SAMPLES`, :data:`DEFAULT_JITTER`.
        """
        n = int(self.lengths.shape[0])
        if not self.shuffle or n < 2 or n > AUTO_MAX_SAMPLES:
            self.jitter_report = {"jitter": DEFAULT_JITTER, "why": "default (no shuffle, or too many samples "
                                  "to measure)" if n >= 2 else "default"}
            return DEFAULT_JITTER
        tried: list[tuple[float, float, float]] = []
        for j in AUTO_JITTERS:
            first = self._plan(0, j)
            if first.num_steps == 0:
                tried.append((j, 0.0, 1.0))
                break
            repeat, _ = co_batch_repeat_rate(first, self._plan(1, j), n)
            count, longest, total, _ = first.features()
            padded = float((count * longest).sum())
            padding = float(total.sum()) / padded if padded else 1.0
            tried.append((j, repeat, padding))
            if repeat <= AUTO_REPEAT_TARGET or padding < AUTO_PADDING_FLOOR:
                break
        good = [t for t in tried if t[1] <= AUTO_REPEAT_TARGET and t[2] >= AUTO_PADDING_FLOOR]
        if good:
            pick, why = good[0], "first to meet the repeat target"
        else:
            kept = [t for t in tried if t[2] >= AUTO_PADDING_FLOOR]
            pick = kept[-1] if kept else tried[0]
            if tried[-1][2] < AUTO_PADDING_FLOOR:
                why = f"co-batch repeat <= {AUTO_REPEAT_TARGET:.0%} needs padding below {AUTO_PADDING_FLOOR} here"
            else:
                why = f"co-batch repeat still over {AUTO_REPEAT_TARGET:.0%} at the widest jitter tried"
            log.info("jitter='auto': %s; using jitter %.2f (repeat %.2f%%, padding %.3f); pass jitter= to "
                     "choose another trade-off", why, pick[0], 100 * pick[1], pick[2])
        self.jitter_report = {"jitter": pick[0], "repeat": pick[1], "padding": pick[2], "why": why,
                              "tried": [{"jitter": j, "repeat": r, "padding": p} for j, r, p in tried]}
        return pick[0]

    def epoch_plan(self, epoch: int | None = None, *, after: Sequence[tuple[int, int]] = (),
                   world_size: int | None = None) -> Plan:
        """The global plan (all ranks) of ``epoch`` (default: the current one), for reports
        and for loaders that drive the sampler (``loader(batch_sampler=)``).

        Args:
            epoch: the epoch (default: the current one).
            after: ``(num_replicas, steps)`` of the stages this epoch already ran: the plan is
                then the rest of the epoch (elastic resume, :mod:`fastfeed.sampling.elastic`).
            world_size: plan for this many ranks (default: ``num_replicas``).

        Example:
            >>> s = DistributedLengthBucketSampler(list(range(1, 41)), batch_size=2, num_replicas=4, rank=0)
            >>> rest = s.epoch_plan(0, after=[(4, 2)], world_size=2)
            >>> s.epoch_plan(0).num_steps, rest.num_steps, rest.world_size
            (5, 6, 2)
        """
        e = self.epoch if epoch is None else check_epoch(epoch, "epoch_plan")
        world = self.num_replicas if world_size is None else check_int("world_size", world_size, 1,
                                                                           most=MAX_WORLD_SIZE)
        if after:
            stages = tuple((check_int("after: num_replicas", w, 1, most=MAX_WORLD_SIZE),
                            check_int("after: steps", t, 0)) for w, t in after)
            return self._plan_after(e, stages, world)
        if world == self.num_replicas:
            return self._plan(e)
        return self._plan_over(None, epoch=e, world_size=world, seed=self.seed)

    def _rank_plan(self) -> tuple[np.ndarray, np.ndarray]:
        key = (self.epoch, self._stages)
        if self._cached is None or self._cached[0] != key:
            plan = self._resized_plan() if self._stages else self._plan(self.epoch)
            flat, offsets = plan.rank_batches(self.rank)
            self._cached = (key, flat, offsets, plan.num_repeats, plan.num_dropped)
        return self._cached[1], self._cached[2]

    @property
    def num_repeats(self) -> int:
        """Samples drawn twice in the current epoch (remainder policy)."""
        self._rank_plan()
        return self._cached[3]  # type: ignore[index]

    @property
    def num_dropped(self) -> int:
        """Samples left out of the current epoch (remainder policy and skipped samples)."""
        self._rank_plan()
        return self._cached[4]  # type: ignore[index]

    # -- the Sampler protocol
    def set_epoch(self, epoch: int) -> None:
        """Select the epoch to plan (call before each epoch, like DistributedSampler).

        A position restored by :meth:`load_state_dict` for this same epoch is kept.
        """
        epoch = check_epoch(epoch, "set_epoch")
        if epoch != self.epoch:
            self._position, self._resume, self._stages = 0, None, ()
        self.epoch = epoch

    def __len__(self) -> int:
        """Steps (batches for this rank) in the current epoch; equal on every rank."""
        return int(self._rank_plan()[1].shape[0] - 1)

    def __iter__(self) -> Iterator[list[int]]:
        flat, offsets = self._rank_plan()
        start = 0 if self._resume is None else self._resume
        self._resume, self._position = None, start
        for t in range(start, len(offsets) - 1):
            self._position = t + 1
            yield flat[offsets[t]:offsets[t + 1]].tolist()

    # -- state
    def _config(self) -> dict[str, Any]:
        return {"shuffle": self.shuffle, "drop_last": self.drop_last, "jitter": self.jitter_spec,
                "adaptive_jitter": self.adaptive_jitter, "cost": self._cost_fn.describe()}

    def state_dict(self, steps: int | None = None) -> dict[str, Any]:
        """The position in the epoch, enough to resume exactly, at any world size.

        ``stages`` lists ``[num_replicas, steps]`` for every world size this epoch ran
        at, the current last (:mod:`fastfeed.sampling.elastic`): a few integers.

        Args:
            steps: steps of this epoch your loop has finished. By default, the steps this
                sampler has yielded; a DataLoader with workers fetches ahead, so pass the
                count of steps you trained when resuming matters.

        Example:
            >>> s = DistributedLengthBucketSampler([5, 9, 3, 7], batch_size=2, num_replicas=2, rank=0, jitter=0)
            >>> {k: v for k, v in s.state_dict().items() if k in ("version", "epoch", "step", "stages")}
            {'version': 2, 'epoch': 0, 'step': 0, 'stages': [[2, 0]]}
        """
        if self._digest is None:
            self._digest = _digest(self.lengths)
        if steps is not None:
            pos = check_int("steps", steps, 0)
        else:
            pos = self._position if self._resume is None else self._resume
        return {"sampler": type(self).__name__, "version": STATE_LAYOUT.version, "epoch": self.epoch,
                "step": pos, "stages": STATE_LAYOUT.write_stages(self._stages, (self.num_replicas, pos)),
                "seed": self.seed, "num_replicas": self.num_replicas,
                "num_samples": int(self.lengths.shape[0]), "lengths_digest": self._digest,
                "config": self._config()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume at the saved position: the next iteration continues the saved epoch.

        A state saved at another world size (``num_replicas``) continues the same epoch
        (elastic resume): the steps not yet run at the old size are re-planned over the
        new ranks with this sampler's planner and remainder policy, so every rank again
        gets equal steps and the unconsumed samples are delivered, each as often as the
        old plan held them (plus the policy's at most ``num_replicas - 1`` repeats or
        drops). Later epochs are a fresh plan at the new size. A version-1 state (no
        ``stages``) is its one stage. A state that is refused leaves the sampler as it was.

        Raises:
            StateError: the state is malformed, or was saved by a sampler with another
                configuration or lengths (the message lists each difference).
        """
        layout = replace(STATE_LAYOUT, source=f"{type(self).__name__}.state_dict()")
        version = layout.check(state)
        layout.check_match(state, self.state_dict(), _MUST_MATCH, owner="sampler",
                           fix="Resume with the same lengths, seed and options, or start the epoch afresh")
        epoch, stages = int(state["epoch"]), layout.read_stages(state, version)

        def steps(i: int) -> int:  # of stage i's plan, after the stages before it
            world = stages[i][0]
            if i == 0:
                return self._plan_over(None, epoch=epoch, world_size=world, seed=self.seed).num_steps
            return self._plan_after(epoch, stages[:i], world).num_steps

        layout.check_within(stages, steps, epoch=epoch)
        last = stages[-1]
        self.epoch, self._cached = epoch, None
        self._stages, start = (stages[:-1], last[1]) if last[0] == self.num_replicas else (stages, 0)
        self._position = self._resume = start


# ---------------------------------------------------------------------- the samplers
class DistributedLengthBucketSampler(_LengthSampler):
    """Fixed-size batches of similar lengths; every rank of a step gets one length class.

    Args:
        lengths: per-sample lengths (see :func:`resolve_lengths`: an array, a packed
            dataset path or :class:`~fastfeed.packed.index.DatasetIndex`, or a callable).
        batch_size: samples per batch (per rank).
        num_replicas, rank: the world; default from torch.distributed, then the
            ``WORLD_SIZE``/``RANK`` environment, then 1 process (:func:`fastfeed.resolve_world`).
        seed: the plan is a function of (seed, epoch); use the same seed on every rank.
        shuffle: False gives one fixed plan, steps longest first (for evaluation).
        drop_last: the remainder policy (module docstring).
        jitter: log-length noise re-drawn each epoch (token-weighted mean): batch-mates
            are within a factor ``exp(jitter)`` in length. Larger mixes batches more
            across epochs, at more padding (about ``jitter / 2``). ``"auto"`` (default)
            measures: the smallest of 0.03, 0.04, ... 0.12 whose two first epochs share
            at most 1% of each sample's batch-mates, without padding efficiency falling
            under 0.98 (see ``jitter_report`` after the first plan).
        adaptive_jitter: spread that noise toward lengths where randomness is scarce
            (rare lengths, large batches of short samples), keeping the padding cost;
            False uses ``jitter`` everywhere.
        cost: used to balance each step's batches between ranks and in reports;
            ``"tokens"`` (padded), ``"attention"``, ``"varlen"``, a CostModel or a callable.
        num_samples: for a per-index lengths callable.

    Example:
        >>> s = DistributedLengthBucketSampler([5, 9, 3, 7, 1, 8, 2, 6], batch_size=2, num_replicas=2, rank=0)
        >>> len(s), sorted(len(b) for b in s)
        (2, [2, 2])
    """

    def __init__(self, lengths: LengthsLike, *, batch_size: int, num_replicas: int | None = None,
                 rank: int | None = None, seed: int = 0, shuffle: bool = True, drop_last: bool = False,
                 jitter: float | str = "auto", adaptive_jitter: bool = True, cost: CostSpec = "tokens",
                 num_samples: int | None = None) -> None:
        self.batch_size = check_int("batch_size", batch_size, 1, most=MAX_COUNT)
        super().__init__(lengths, num_replicas=num_replicas, rank=rank, seed=seed, shuffle=shuffle,
                         drop_last=drop_last, jitter=jitter, cost=cost, num_samples=num_samples,
                         adaptive_jitter=adaptive_jitter)
        if drop_last and self.lengths.shape[0] < self.num_replicas * self.batch_size:
            log.warning("drop_last=True with %d samples < world size %d x batch size %d: epochs have no steps",
                        self.lengths.shape[0], self.num_replicas, self.batch_size)

    def _plan_over(self, ids: np.ndarray | None, *, epoch: int, world_size: int, seed: int,
                   jitter: float | None = None) -> Plan:
        lengths = self.lengths if ids is None else self.lengths[ids]
        return restrict(plan_fixed(lengths, world_size=world_size, batch_size=self.batch_size,
                                   seed=seed, epoch=epoch, shuffle=self.shuffle, drop_last=self.drop_last,
                                   jitter=self.jitter if jitter is None else jitter, cost=self._cost_fn,
                                   adaptive=self.adaptive_jitter), ids)

    def _config(self) -> dict[str, Any]:
        return {"batch_size": self.batch_size, **super()._config()}


class DistributedTokenBudgetSampler(_LengthSampler):
    """Batches of varying size whose cost stays within ``max_cost``, balanced per step.

    Args:
        lengths: per-sample lengths (see :func:`resolve_lengths`).
        max_cost: the budget of one batch, in the cost's unit: padded tokens for
            ``"tokens"``, token equivalents for ``"attention"``/``"varlen"``, seconds for a
            fitted CostModel (``"120ms"`` works too).
        cost: ``"tokens"`` (batch size x longest), ``"attention"`` (adds n x longest^2 /
            6144), ``"varlen"`` (sum l + sum l^2 / 6144), a :class:`CostModel`, the path of
            a saved one, or a callable ``f(lengths_of_one_batch) -> cost`` that never
            decreases when a sample is added or lengthened (slower: called per batch).
        oversize: ``"error"`` (default) when one sample alone exceeds ``max_cost``, or
            ``"skip"`` to leave such samples out (counted in ``num_skipped``, logged).
        num_replicas, rank, seed, shuffle, drop_last, jitter, adaptive_jitter, num_samples:
            as for :class:`DistributedLengthBucketSampler`.

    Example:
        >>> s = DistributedTokenBudgetSampler([100] * 8 + [400] * 2, max_cost=400, num_replicas=2, rank=0)
        >>> [sum(100 if i < 8 else 400 for i in b) for b in sorted(s)]
        [400, 400]
    """

    def __init__(self, lengths: LengthsLike, *, max_cost: float | str, cost: CostSpec = "tokens",
                 num_replicas: int | None = None, rank: int | None = None, seed: int = 0,
                 shuffle: bool = True, drop_last: bool = False, jitter: float | str = "auto",
                 adaptive_jitter: bool = True, oversize: str = "error", num_samples: int | None = None) -> None:
        super().__init__(lengths, num_replicas=num_replicas, rank=rank, seed=seed, shuffle=shuffle,
                         drop_last=drop_last, jitter=jitter, cost=cost, num_samples=num_samples,
                         adaptive_jitter=adaptive_jitter)
        self.max_cost = _parse_budget(max_cost, self.cost)
        if not isinstance(oversize, str) or oversize not in ("error", "skip"):
            raise ConfigError(f"oversize={oversize!r} must be 'error' or 'skip'")
        self.oversize = oversize
        self._skip = self._find_oversize()

    def _find_oversize(self) -> np.ndarray | None:
        single = self._cost_fn.per_sample(self.lengths)  # a callable's per_sample is f([l])
        if self._cost_fn.model is not None:
            single = single + self._cost_fn.model.const
        over = single > self.max_cost * (1 + 1e-12)
        if not over.any():
            return None
        n, worst = int(over.sum()), int(np.argmax(np.where(over, self.lengths, -1)))
        msg = (f"{n} sample(s) cost more than max_cost={self.max_cost:g} on their own (longest: sample "
               f"{worst}, length {self.lengths[worst]}, cost {single[worst]:.4g})")
        if self.oversize == "error":
            raise ConfigError(msg + "; raise max_cost, truncate them, or pass oversize='skip'")
        log.warning("%s: skipping them every epoch (oversize='skip')", msg)
        return over

    @property
    def num_skipped(self) -> int:
        """Samples left out of every epoch because they alone exceed ``max_cost``."""
        return 0 if self._skip is None else int(self._skip.sum())

    def _plan_over(self, ids: np.ndarray | None, *, epoch: int, world_size: int, seed: int,
                   jitter: float | None = None) -> Plan:
        lengths = self.lengths if ids is None else self.lengths[ids]
        skip = self._skip if ids is None or self._skip is None else self._skip[ids]
        return restrict(plan_budget(lengths, world_size=world_size, max_cost=self.max_cost,
                                    seed=seed, epoch=epoch, shuffle=self.shuffle, drop_last=self.drop_last,
                                    jitter=self.jitter if jitter is None else jitter, cost=self._cost_fn,
                                    skip=skip, adaptive=self.adaptive_jitter), ids)

    def _config(self) -> dict[str, Any]:
        return {"max_cost": self.max_cost, "oversize": self.oversize, **super()._config()}


def _jitter(value: Any) -> float:
    """``jitter``: a number in [0, 5] (log-length units)."""
    try:
        return number(0, 5)(value, "jitter")  # type: ignore[return-value]
    except ConfigError:
        raise ConfigError(f"jitter={value!r} must be 'auto' or a number in [0, 5] (log-length units)") from None


def _parse_budget(max_cost: float | str, cost: Any) -> float:
    if isinstance(max_cost, str):
        if not (isinstance(cost, CostModel) and cost.unit == "seconds"):
            raise ConfigError(f"max_cost={max_cost!r} is a duration, but the cost is not a fitted model in seconds")
        value = parse_duration(max_cost, "max_cost")
    elif isinstance(max_cost, bool) or not isinstance(max_cost, (int, float, np.integer, np.floating)):
        raise ConfigError(f"max_cost={max_cost!r} must be a positive number (the budget of one batch, in the "
                          "cost's unit)")
    else:
        try:
            value = float(max_cost)
        except OverflowError:  # an int too large for a float (10**400)
            value = math.inf
    if not (math.isfinite(value) and value > 0):
        raise ConfigError(f"max_cost={max_cost!r} must be a positive number")
    return value
