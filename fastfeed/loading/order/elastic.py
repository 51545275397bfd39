"""Elastic resume: what an epoch has consumed at one world shape, and its rest at another.

Design. An epoch is a sequence of ``E`` real positions (:mod:`fastfeed.loading.order.mixing`);
which sample sits at position ``g`` is fixed by the shape the epoch *started* at (the
base stage: its world size picks each rank's span and block shuffle). A *stage* deals a
*segment* (a sorted set of positions, held as disjoint intervals) to ``world_size``
ranks by a :class:`Layout`: rank ``r`` takes a contiguous span of the segment's
positions in order and cuts it into batches of ``batch_size``:

- ``"pad"`` (``drop_last=False``): ``P = ceil(R / W)`` per rank; the ``W * P - R``
  (at most ``W - 1``) missing slots repeat the first positions, flagged not valid;
- ``"drop"`` (``drop_last=True``): ``P = (R // W) // B * B`` per rank, full batches only,
  the tail of the segment is not delivered this epoch;
- ``"exact"`` (``pad=False``): spans of ``floor`` or ``ceil(R / W)`` positions, no repeat;
  every rank has ``ceil(ceil(R / W) / B)`` batches, so a rank with fewer positions has a
  shorter last batch, which is *empty* when it has ``(steps - 1) * B`` positions (a rank
  yields it anyway, so every rank runs the same number of collective steps).

The first stage's segment is ``[0, E)``. A run that stops after ``c`` batches per rank
has consumed, on each rank, the first ``c * B`` positions of its span; the *rest* of a
stage is what is left of every rank's real span, again a set of at most ``W``
intervals, and it becomes the segment of the next stage, at any new shape. Position
identities never change, so the union over the new ranks of the rest is exactly what
the old run had not consumed, each once, plus the new stage's own end padding.

State. :class:`ElasticState` is ``epoch`` plus one :class:`Stage` (world size, batch
size, mode, batches consumed) per shape the epoch has run at: three integers and a word
per resize, nothing per sample (:data:`STAGES`, the rows of a state's ``stages``). A
resume at the same shape just updates the last stage's count; a new epoch starts from a
single stage.

Example:
    >>> lay = Layout(total=10, world_size=4, batch_size=2, mode="pad")
    >>> lay.per_rank, lay.num_batches, lay.rest(1).intervals()
    (3, 2, [(2, 3), (5, 6), (8, 9)])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from fastfeed._state import MAX_EPOCH, Stages, read_int
from fastfeed.errors import ConfigError, StateError

__all__ = ["MODES", "STAGES", "ElasticState", "Layout", "Segment", "Stage", "mode_of", "segment_after"]

#: Remainder policies of a stage (see the module docstring).
MODES = ("pad", "drop", "exact")
#: The rows of a state's ``stages``: ``[world_size, batch_size, mode, batches]`` (:attr:`Stage.row`).
STAGES = Stages((("world_size", 1), ("batch_size", 1), ("mode", MODES), ("batches", 0)))
_FIX = "pass the dict from state_dict()"


def mode_of(*, drop_last: bool, pad: bool) -> str:
    """The stage mode of the loader options ``drop_last`` and ``pad`` (``drop_last`` wins).

    Example:
        >>> mode_of(drop_last=False, pad=False), mode_of(drop_last=True, pad=False)
        ('exact', 'drop')
    """
    return "drop" if drop_last else ("pad" if pad else "exact")


@dataclass(frozen=True)
class Segment:
    """A sorted set of epoch positions as disjoint intervals ``[starts[i], starts[i] + lengths[i])``."""

    starts: np.ndarray
    lengths: np.ndarray

    @classmethod
    def whole(cls, total: int) -> "Segment":
        return cls(np.array([0], dtype=np.int64), np.array([int(total)], dtype=np.int64))

    @property
    def total(self) -> int:
        return int(self.lengths.sum())

    def intervals(self) -> list[tuple[int, int]]:
        """``[(start, stop), ...]`` (for reports and doctests)."""
        return [(int(a), int(a + n)) for a, n in zip(self.starts, self.lengths)]

    def position(self, v: np.ndarray) -> np.ndarray:
        """The epoch positions of the segment's ``v``-th elements (``0 <= v < total``).

        Example:
            >>> Segment(np.array([2, 8]), np.array([3, 2])).position(np.array([0, 3, 4])).tolist()
            [2, 8, 9]
        """
        offsets = np.cumsum(self.lengths) - self.lengths
        piece = np.searchsorted(offsets, v, side="right") - 1
        return self.starts[piece] + (v - offsets[piece])

    def pick(self, starts: np.ndarray, lengths: np.ndarray) -> "Segment":
        """The sub-segment of the elements ``[starts[i], starts[i] + lengths[i])`` (sorted, disjoint)."""
        offsets = np.cumsum(self.lengths) - self.lengths
        out_a: list[np.ndarray] = []
        out_n: list[np.ndarray] = []
        for a, n in zip(starts.tolist(), lengths.tolist()):
            if n <= 0:
                continue
            lo = int(np.searchsorted(offsets, a, side="right")) - 1
            hi = int(np.searchsorted(offsets, a + n, side="left"))
            off, st, ln = offsets[lo:hi], self.starts[lo:hi], self.lengths[lo:hi]
            cut_a = np.maximum(off, a)
            cut_b = np.minimum(off + ln, a + n)
            keep = cut_b > cut_a
            out_a.append((st + (cut_a - off))[keep])
            out_n.append((cut_b - cut_a)[keep])
        if not out_a:
            return Segment(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))
        return Segment(np.concatenate(out_a).astype(np.int64), np.concatenate(out_n).astype(np.int64))


@dataclass(frozen=True)
class Layout:
    """How one stage deals ``total`` segment elements to ranks (module docstring)."""

    total: int
    world_size: int
    batch_size: int
    mode: str

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ConfigError(f"mode={self.mode!r} must be one of {MODES}")
        for name in ("world_size", "batch_size"):
            if int(getattr(self, name)) < 1:
                raise ConfigError(f"{name}={getattr(self, name)} must be >= 1")

    @property
    def per_rank(self) -> int:
        """The most elements a rank's span holds (all ranks but ``"exact"`` hold this many)."""
        r, w, b = self.total, self.world_size, self.batch_size
        if self.mode == "drop":
            return (r // w) // b * b
        return -(-r // w)

    @property
    def num_batches(self) -> int:
        """Batches of every rank in this stage."""
        return -(-self.per_rank // self.batch_size)

    def spans(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per rank ``(start, real_stop, stop)``: the span is ``[start, stop)``, its elements at
        or past ``real_stop`` are padding (they repeat element ``i mod total``)."""
        w = np.arange(self.world_size + 1, dtype=np.int64)
        if self.mode == "exact":
            edges = w * self.total // self.world_size
            return edges[:-1], edges[1:], edges[1:]
        edges = w * self.per_rank
        return edges[:-1], np.minimum(edges[1:], self.total), edges[1:]

    def rank_of(self, v: np.ndarray) -> np.ndarray:
        """The rank whose real span holds element ``v``."""
        return np.searchsorted(self.spans()[1], v, side="right")

    def rest(self, batches: int) -> Segment:
        """The elements not consumed after ``batches`` batches per rank, in element coordinates."""
        start, real_stop, _ = self.spans()
        lo = np.minimum(start + int(batches) * self.batch_size, np.maximum(real_stop, start))
        n = np.maximum(real_stop - lo, 0)
        return Segment(lo[n > 0], n[n > 0])


@dataclass(frozen=True)
class Stage:
    """One shape an epoch ran at, and the batches per rank consumed at it."""

    world_size: int
    batch_size: int
    mode: str
    batches: int = 0

    def same_shape(self, other: "Stage") -> bool:
        return (self.world_size, self.batch_size, self.mode) == (other.world_size, other.batch_size, other.mode)

    @property
    def row(self) -> tuple[int, int, str, int]:
        """The stage as a row of a state's ``stages`` (:data:`STAGES`).

        Example:
            >>> Stage(8, 32, "pad", 5).row
            (8, 32, 'pad', 5)
        """
        return (self.world_size, self.batch_size, self.mode, self.batches)


def segment_after(epoch_samples: int, stages: tuple[Stage, ...]) -> Segment:
    """The positions of an epoch of ``epoch_samples`` that ``stages`` left unconsumed.

    Example:
        >>> segment_after(10, (Stage(4, 2, "pad", 1), Stage(2, 1, "pad", 1))).intervals()
        [(5, 6)]
    """
    seg = Segment.whole(epoch_samples)
    for st in stages:
        rest = Layout(seg.total, st.world_size, st.batch_size, st.mode).rest(st.batches)
        seg = seg.pick(rest.starts, rest.lengths)
    return seg


@dataclass(frozen=True)
class ElasticState:
    """Where an epoch stands: ``epoch`` and the stages it ran (module docstring)."""

    epoch: int
    stages: tuple[Stage, ...]

    def to_dict(self) -> dict[str, Any]:
        """Plain ints and strings, for a checkpoint.

        Example:
            >>> ElasticState(2, (Stage(8, 32, "pad", 5),)).to_dict()
            {'epoch': 2, 'stages': [[8, 32, 'pad', 5]]}
        """
        return {"epoch": self.epoch, "stages": STAGES.write(s.row for s in self.stages)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "ElasticState":
        """Inverse of :meth:`to_dict`.

        Raises:
            StateError: the mapping is not a state written by :meth:`to_dict`.
        """
        if not isinstance(d, Mapping) or "epoch" not in d or "stages" not in d:
            raise StateError(f"elastic state {d!r} is not a dict of epoch and stages; {_FIX}")
        epoch = read_int(d, "epoch", what="elastic state", fix=_FIX, most=MAX_EPOCH)
        return cls(epoch, tuple(Stage(*row) for row in STAGES.read(d["stages"], what="elastic state", fix=_FIX)))
