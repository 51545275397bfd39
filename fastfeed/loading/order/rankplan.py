"""The per-rank epoch plan over one or several (mixed, filtered) datasets.

Design: composes :mod:`~fastfeed.loading.order.selection` (which samples of each dataset),
:mod:`~fastfeed.loading.order.mixing` (which dataset fills each epoch position, and each
dataset's endless stream of shuffled passes) and :mod:`~fastfeed.loading.order.elastic`
(stages: how positions are dealt to ranks, and what is left after a stop) along the
steps of :mod:`fastfeed.loading.order.epoch`:

1. **Positions.** An epoch has ``E = epoch_samples`` real positions; position ``g`` is
   dataset ``source(g)``'s ``C_k(g)``-th sample of this epoch's share of its stream.
2. **Equal spans.** The first stage of the epoch gives rank ``r`` a contiguous span of
   positions (``"pad"``: ``ceil(E / W)`` each, the at most ``W - 1`` slots past ``E``
   repeat the samples of the first positions with ``valid=False``; ``"drop"``: full
   batches only; ``"exact"`` (``pad=False``): no repeat, spans differ by at most one,
   and a rank with fewer positions has a shorter last batch, *empty* when it holds
   ``(steps - 1) * batch_size`` positions: it is yielded anyway, so every rank runs the
   same number of steps and DDP collectives stay matched).
3. **Locality and shuffle.** Each dataset's part of the span is a contiguous piece of
   its stream (a few shards); with ``shuffle`` it is shuffled in blocks of
   ``shuffle_block`` by the rank's generator and dealt back into that dataset's slots,
   so a batch keeps its mixing proportions while mixing samples of several shards.
   Padding slots are not shuffled, so ``valid`` is exactly "position < E".
4. **Batches** of ``batch_size`` consecutive slots; every rank has the same number.
5. **Elastic resume.** A later stage (another world size, batch size or mode) deals the
   positions the earlier stages did not consume; the sample at a position is always
   the first stage's, so nothing is lost or repeated. The state is
   :class:`~fastfeed.loading.order.elastic.ElasticState`: a few integers per stage.

Cost per rank: O(its span) time and memory, plus O(shards) per dataset for the shard
permutation and O(passes) for a small dataset cycled many times in the span; a later
stage also computes the first-stage plans of the old ranks whose rest it takes.

With one dataset, no selection and no padding (``E`` divisible by ``W``, or
``drop_last``), the batches are exactly those of :func:`fastfeed.loading.order.epoch.plan_epoch`.
The plan never depends on ``num_workers``: workers take batches by
:func:`~fastfeed.loading.order.epoch.worker_batches`.

Example:
    >>> spec = plan_spec([[4, 4], [3]], weights=[2, 1], shuffle=False)
    >>> plan = plan_rank(spec, epoch=0, world_size=2, rank=0, batch_size=3)
    >>> plan.num_batches, spec.epoch_samples
    (2, 12)
    >>> b = plan.batch(0)
    >>> b.ids.tolist(), b.source.tolist(), b.valid.tolist()
    ([0, 0, 1], [0, 1, 0], [True, True, True])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, NamedTuple, Sequence

import numpy as np

from fastfeed.errors import ConfigError, StateError
from fastfeed.loading.order.elastic import ElasticState, Layout, Stage, mode_of, segment_after
from fastfeed.loading.order.mixing import (
    MixPattern,
    check_positions,
    dataset_seed,
    default_epoch_samples,
    mix_pattern,
    stream_ids,
)
from fastfeed.loading.order.epoch import _BLOCK_STREAM, DEFAULT_SHUFFLE_BLOCK, _block_shuffle
from fastfeed.loading.order.selection import Selection, select

__all__ = ["Batch", "PlanSpec", "RankPlan", "plan_rank", "plan_spec"]


class Batch(NamedTuple):
    """One batch: per sample its id inside its dataset, the dataset, and the padding flag."""

    ids: np.ndarray
    source: np.ndarray
    valid: np.ndarray


@dataclass(frozen=True)
class PlanSpec:
    """What the plans of every epoch depend on, validated once (see :func:`plan_spec`)."""

    sources: tuple[Selection, ...]
    pattern: MixPattern
    epoch_samples: int
    seed: int
    shuffle: bool
    shuffle_block: int

    @property
    def per_epoch(self) -> np.ndarray:
        """int64 (K,): samples of each dataset one epoch consumes (``C_k(E)``)."""
        return self.pattern.counts_before(np.array([self.epoch_samples], dtype=np.int64))[:, 0]


def plan_spec(
    datasets: Sequence[Selection | Sequence[int] | np.ndarray],
    *,
    weights: Sequence[float] | None = None,
    epoch_samples: int | None = None,
    seed: int = 0,
    shuffle: bool = True,
    shuffle_block: int = DEFAULT_SHUFFLE_BLOCK,
) -> PlanSpec:
    """Validate the epoch-independent inputs of the plans.

    Args:
        datasets: per dataset a :class:`~fastfeed.loading.order.selection.Selection` or its
            shard counts (every sample kept).
        weights: one per dataset (any positive total); None for a single dataset.
        epoch_samples: positions per epoch; default reads the largest-weight dataset once.
        seed: the user's seed (an integer >= 0).
        shuffle: shuffle every pass and every rank's blocks.
        shuffle_block: samples mixed together in a rank's span (>= 1).

    Example:
        >>> plan_spec([[700], [5, 5]], weights=[0.7, 0.3]).per_epoch.tolist()
        [700, 300]
    """
    if not datasets:
        raise ConfigError("no dataset to plan; pass at least one path")
    sels = tuple(d if isinstance(d, Selection) else select(d, name=f"dataset {i}") for i, d in enumerate(datasets))
    for s in sels:
        if s.size < 1:
            raise ConfigError(f"{s.name}: holds no samples; nothing to load")
    pattern = mix_pattern(weights, num_datasets=len(sels)) if weights is not None or len(sels) > 1 \
        else mix_pattern(None)
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ConfigError(f"seed={seed!r} must be an integer >= 0")
    if shuffle_block < 1:
        raise ConfigError(f"shuffle_block={shuffle_block} must be >= 1")
    e = default_epoch_samples(pattern, [s.size for s in sels]) if epoch_samples is None else epoch_samples
    return PlanSpec(sources=sels, pattern=pattern, epoch_samples=check_positions(e), seed=int(seed),
                    shuffle=bool(shuffle), shuffle_block=int(shuffle_block))


@dataclass(frozen=True)
class RankPlan:
    """One rank's batches of one epoch (or of the rest of it, after an elastic resume).

    Attributes:
        ids, source, valid: per slot of the rank's span, in delivery order.
        offsets: int64 (num_batches + 1,): batch ``b`` is slots ``offsets[b]:offsets[b + 1]``.
        start: the first batch to deliver (a same-shape resume skips the consumed ones).
        epoch: the epoch planned.
        prior: the stages of this epoch that ran before the current one.
        stage: the current shape (its ``batches`` is 0; see :meth:`state`).
    """

    ids: np.ndarray
    source: np.ndarray
    valid: np.ndarray
    offsets: np.ndarray
    start: int
    epoch: int
    prior: tuple[Stage, ...]
    stage: Stage

    @property
    def num_batches(self) -> int:
        """Batches of this rank at the current stage (equal on every rank), ``start`` included."""
        return int(self.offsets.shape[0] - 1)

    def batch(self, b: int) -> Batch:
        """Batch ``b`` (0-based, ``start <= b`` is what a resumed pass delivers).

        Example:
            >>> p = plan_rank(plan_spec([[5]], shuffle=False), epoch=0, world_size=2, rank=1, batch_size=2)
            >>> p.batch(1)
            Batch(ids=array([0]), source=array([0]), valid=array([False]))
        """
        if not 0 <= b < self.num_batches:
            raise IndexError(f"batch {b} out of range for {self.num_batches} batches")
        a, z = int(self.offsets[b]), int(self.offsets[b + 1])
        return Batch(self.ids[a:z], self.source[a:z], self.valid[a:z])

    def state(self, batches: int) -> ElasticState:
        """The state after ``batches`` batches of this stage (counting from 0, not ``start``)."""
        if not 0 <= batches <= self.num_batches:
            raise StateError(f"batches={batches} outside [0, {self.num_batches}] for this stage")
        s = self.stage
        return ElasticState(self.epoch, self.prior + (Stage(s.world_size, s.batch_size, s.mode, int(batches)),))


def plan_rank(
    spec: PlanSpec,
    *,
    epoch: int,
    world_size: int,
    rank: int,
    batch_size: int,
    drop_last: bool = False,
    pad: bool = True,
    resume: ElasticState | Mapping[str, Any] | None = None,
) -> RankPlan:
    """The plan of ``rank`` for ``epoch`` (module docstring), optionally resuming ``resume``.

    A ``resume`` of another epoch is ignored (the epoch starts afresh); of this epoch at
    the same shape it sets :attr:`RankPlan.start`; at another shape the plan covers the
    rest of the epoch (``start`` 0).

    Example:
        >>> spec = plan_spec([[10]], shuffle=False)
        >>> p = plan_rank(spec, epoch=0, world_size=4, rank=0, batch_size=2)
        >>> later = plan_rank(spec, epoch=0, world_size=2, rank=1, batch_size=2, resume=p.state(1))
        >>> later.num_batches, later.batch(0).ids.tolist(), later.batch(0).valid.tolist()
        (1, [8, 2], [True, False])
    """
    if not 0 <= rank < world_size:
        raise ConfigError(f"rank={rank} must be in [0, {world_size}) for world_size={world_size}")
    cur = Stage(int(world_size), int(batch_size), mode_of(drop_last=drop_last, pad=pad))
    prior, start = _stages_before(resume, epoch, cur)
    if not prior:
        layout = Layout(spec.epoch_samples, cur.world_size, cur.batch_size, cur.mode)
        ids, src, valid = _first_stage_rank(spec, epoch, layout, rank)
    else:
        seg = segment_after(spec.epoch_samples, prior)
        layout = Layout(seg.total, cur.world_size, cur.batch_size, cur.mode)
        ids, src, valid = _later_stage_rank(spec, epoch, prior, layout, rank)
    n = ids.shape[0]
    offsets = np.minimum(np.arange(layout.num_batches + 1, dtype=np.int64) * layout.batch_size, n)
    if start > layout.num_batches:
        raise StateError(f"resume state: batches={start} but this stage of epoch {epoch} has {layout.num_batches}")
    return RankPlan(ids=ids, source=src, valid=valid, offsets=offsets, start=start, epoch=int(epoch),
                    prior=prior, stage=cur)


def _stages_before(resume: ElasticState | Mapping[str, Any] | None, epoch: int,
                   cur: Stage) -> tuple[tuple[Stage, ...], int]:
    if resume is None:
        return (), 0
    st = resume if isinstance(resume, ElasticState) else ElasticState.from_dict(resume)
    if st.epoch != epoch:
        return (), 0
    if st.stages[-1].same_shape(cur):
        return st.stages[:-1], st.stages[-1].batches
    return st.stages, 0


def _block_rng(spec: PlanSpec, epoch: int, world_size: int, rank: int, k: int) -> np.random.Generator:
    key = [_BLOCK_STREAM, spec.seed, epoch, world_size, rank] + ([k] if k else [])
    return np.random.default_rng(key)


def _first_stage_rank(spec: PlanSpec, epoch: int, layout: Layout,
                      rank: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Slots of ``rank``'s span in the epoch's first stage: (ids, source, valid)."""
    starts, real_stops, stops = layout.spans()
    start, real_stop, stop = int(starts[rank]), int(real_stops[rank]), int(stops[rank])
    n_real = max(real_stop - start, 0)
    ids = np.empty(stop - start, dtype=np.int64)
    src = np.zeros(stop - start, dtype=np.int64)
    valid = np.zeros(stop - start, dtype=bool)
    valid[:n_real] = True
    per_epoch = spec.per_epoch
    if n_real:
        counts = spec.pattern.counts_before(np.arange(start, real_stop + 1, dtype=np.int64))
        if spec.pattern.num_datasets > 1:
            src[:n_real] = np.argmax(np.diff(counts, axis=1), axis=0)
        for k, sel in enumerate(spec.sources):
            lo, hi = int(counts[k, 0]), int(counts[k, -1])
            if hi == lo:
                continue
            base = epoch * int(per_epoch[k])
            part = stream_ids(sel, seed=dataset_seed(spec.seed, k), shuffle=spec.shuffle, start=base + lo,
                              stop=base + hi)
            if spec.shuffle and spec.shuffle_block > 1:
                part = _block_shuffle(part, spec.shuffle_block, _block_rng(spec, epoch, layout.world_size, rank, k))
            head = ids[:n_real]
            head[src[:n_real] == k] = part
    first_pad = max(start, real_stop)
    if stop > first_pad:  # padding: the samples of positions (g mod E), unshuffled
        g = np.arange(first_pad, stop, dtype=np.int64) % spec.epoch_samples
        before, after = spec.pattern.counts_before(g), spec.pattern.counts_before(g + 1)
        which = np.argmax(after - before, axis=0)
        tail_ids = ids[first_pad - start:]
        src[first_pad - start:] = which
        for k in np.unique(which).tolist():
            m = which == k
            idx = before[k, m] + epoch * int(per_epoch[k])
            lo = int(idx.min())
            got = stream_ids(spec.sources[k], seed=dataset_seed(spec.seed, k), shuffle=spec.shuffle, start=lo,
                             stop=int(idx.max()) + 1)
            tail_ids[m] = got[idx - lo]
    return ids, src, valid


def _later_stage_rank(spec: PlanSpec, epoch: int, prior: tuple[Stage, ...], layout: Layout,
                      rank: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Slots of ``rank`` in a stage after a resize: the first stage's samples at the rest's positions."""
    starts, real_stops, stops = layout.spans()
    start, real_stop, stop = int(starts[rank]), int(real_stops[rank]), int(stops[rank])
    v = np.arange(start, stop, dtype=np.int64)
    valid = v < real_stop
    if layout.total == 0 or v.shape[0] == 0:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty.copy(), np.zeros(0, dtype=bool)
    g = segment_after(spec.epoch_samples, prior).position(v % layout.total)
    first = prior[0]
    base = Layout(spec.epoch_samples, first.world_size, first.batch_size, first.mode)
    owner = base.rank_of(g)
    base_starts = base.spans()[0]
    ids = np.empty(v.shape[0], dtype=np.int64)
    src = np.empty(v.shape[0], dtype=np.int64)
    for r in np.unique(owner).tolist():
        m = owner == r
        b_ids, b_src, _ = _first_stage_rank(spec, epoch, base, r)
        local = g[m] - base_starts[r]
        ids[m], src[m] = b_ids[local], b_src[local]
    return ids, src, valid
