"""The epoch cursor: which epoch the next pass runs, from which batch, and the resume state.

Every loader drives one :class:`EpochCursor` the same way, whatever decodes its batches
(:class:`fastfeed.loading.api.Loader` for ``decode="cpu"`` / None,
:class:`fastfeed.loading.dali.pipeline.DaliLoader` for ``decode="dali"``): ``iter()``
returns :meth:`EpochCursor.run`, which begins the pass (:meth:`EpochCursor.begin_pass`)
and counts the batches it hands out, and :class:`Resumable` gives the loader its ``len``,
``epoch``, ``set_epoch``, ``state_dict`` and ``load_state_dict``. So the rules below hold
for both backends, and a state saved by one resumes in the other.

**Passes and epochs.**

- ``set_epoch(e)`` makes the next pass run epoch ``e`` from its first batch (or from a
  loaded resume point of epoch ``e``).
- Without it, every new pass runs the next epoch: the first pass runs epoch 0, and a
  pass after any other pass runs the epoch after it, **whether the previous pass
  finished or was abandoned** (a ``break`` out of the loop, a dropped iterator). A new
  pass always brings a new order, as a new pass over a shuffling DataLoader does (its
  sampler draws a new permutation at every ``iter()``), and forgetting ``set_epoch``
  never repeats an order. To replay an epoch, call ``set_epoch`` with it.

  Why not restart an abandoned epoch: ``while True: for b in dl: ...; break`` expects
  new data on the next pass, as with any DataLoader; and Lightning's
  ``limit_train_batches=N`` stops iterating after N batches and starts each epoch with a
  new ``iter()``, calling ``set_epoch`` only on ``dataloader.sampler`` and
  ``dataloader.batch_sampler.sampler`` (``_set_sampler_epoch``), so a loader reached by
  no ``set_epoch`` would train on the same N batches every epoch.
- ``load_state_dict(state)``: the next pass continues the saved epoch after its last
  consumed batch, in the same order, with any ``num_workers`` and either backend. A
  state saved after the epoch's last batch makes the next pass the next epoch (or, after
  ``set_epoch`` with the saved epoch, an empty pass). ``set_epoch`` with another epoch
  drops the resume point. A state records batches consumed, never whether the pass was
  abandoned, so a run resumed from a state saved at a ``break`` continues that epoch;
  call ``set_epoch(next)`` to start the next one instead (Lightning restarts this way).
- One pass at a time: a pass begins at the first ``next()`` of an iterator (one that is
  never advanced is no pass: Lightning calls ``iter()`` once on a loader that is not a
  DataLoader, to check that it is iterable), and only the newest pass delivers batches
  (an older iterator raises instead of taking the new pass's batches).

**State.** ``state_dict()`` is a few ints and strings, the same for every backend:
``{"fastfeed_loader": 2, "epoch", "batches", "stages", "rank", ...}`` with what the order
depends on (:data:`~fastfeed.loading.order.state.MUST_MATCH`; the layout and the reading of
version-1 states are :mod:`fastfeed.loading.order.state`); :func:`check_state` names every
difference when they do not match. The saving rank does not matter: all ranks consume
the same number of batches.

**Elastic resume.** A state saved at another world size, batch size or
``drop_last``/``pad`` continues the same epoch: the new ranks deal exactly the samples
the old run had not consumed, each once (plus at most ``world_size - 1`` padding
repeats, ``valid=False``), and later epochs are a fresh run's at the new shape. The
plan of every pass comes from :func:`fastfeed.loading.order.position.rank_plan` (the
planner, :mod:`fastfeed.loading.order.rankplan`), for both backends and their workers.

Example:
    >>> from fastfeed.loading.order.rankplan import plan_spec
    >>> c = EpochCursor(plan_spec([[5, 5]]), fingerprints=["ab12"], batch_size=4, drop_last=False,
    ...                 rank=0, world_size=1)
    >>> list(c.run(lambda p: iter([f"e{p.epoch}b{b}" for b in range(p.start, 3)])))
    ['e0b0', 'e0b1', 'e0b2']
    >>> it = c.run(lambda p: iter([f"e{p.epoch}b{b}" for b in range(p.start, 3)]))
    >>> next(it), c.state_dict()["batches"]        # no set_epoch: the next epoch
    ('e1b0', 1)
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Sequence, TypeVar

from fastfeed._state import MAX_EPOCH, check_epoch
from fastfeed.errors import ConfigError, FastfeedError, StateError
from fastfeed.loading.order.elastic import ElasticState, Layout, Stage, mode_of
from fastfeed.loading.order.rankplan import PlanSpec, RankPlan
from fastfeed.loading.order.position import MAX_STAGES, Position, rank_plan
from fastfeed.loading.order.state import (
    LAYOUT,
    MUST_MATCH,
    STATE_VERSION,
    STREAM_KEYS,
    BatchStream,
    check_fields,
    check_stages,
    check_stream_keys,
    check_stream_state,
    check_version,
)
from fastfeed.packed.index import DatasetIndex

# BatchStream and STREAM_KEYS live in fastfeed.loading.order.state; importable from here too
__all__ = ["BatchStream", "EpochCursor", "MUST_MATCH", "Pass", "Resumable", "STATE_VERSION", "STREAM_KEYS",
           "check_state"]

T = TypeVar("T")

_PLANS_KEPT = 3  # a DALI feed runs into the next epoch while this one ends
_V1_MATCH = ("dataset", "num_samples", "shuffle", "seed", "shuffle_block")


@dataclass(frozen=True)
class Pass:
    """One pass over the data: its epoch, first batch, number (the newest delivers), and
    the earlier stages of its epoch (elastic resume) or the legacy flag (version-1 state)."""

    epoch: int
    start: int
    number: int
    prior: tuple[Stage, ...] = ()
    legacy: bool = False

    @property
    def position(self) -> Position:
        """What the workers need to plan this pass."""
        return Position(self.epoch, self.start, self.prior, self.legacy)


def _selection_digest(spec: PlanSpec) -> list[str | None] | None:
    if all(s.kept is None for s in spec.sources):
        return None
    return [None if s.kept is None else hashlib.sha256(memoryview(s.kept).cast("B")).hexdigest()[:16]
            for s in spec.sources]


class EpochCursor:
    """The epoch/resume state machine of one loader on one rank (see the module docstring).

    Args:
        spec: the validated datasets, weights, selections and order
            (:func:`fastfeed.loading.order.rankplan.plan_spec`).
        fingerprints: each dataset's fingerprint (``DatasetIndex.fingerprint``).
        batch_size, drop_last, pad, rank, world_size: this loader's shape.
        stream: the batches of a ``seq_len`` / ``batch_sampler`` loader, which are not the
            sample plan's (:class:`~fastfeed.loading.order.state.BatchStream`): it gives the batches
            per epoch (of its rest after an elastic resume) and adds its fields to the state.
    """

    def __init__(self, spec: PlanSpec, *, fingerprints: Sequence[str], batch_size: int, drop_last: bool,
                 rank: int, world_size: int, pad: bool = True, stream: BatchStream | None = None) -> None:
        self._args: dict[str, Any] = {"fingerprints": list(fingerprints), "batch_size": batch_size,
                                      "drop_last": drop_last, "rank": rank, "world_size": world_size,
                                      "pad": pad, "stream": stream}
        self.spec = spec
        self.rank = int(rank)
        self.shape = Stage(int(world_size), int(batch_size), mode_of(drop_last=drop_last, pad=pad))
        self._stream = stream
        self._fresh_batches = Layout(spec.epoch_samples, self.shape.world_size, self.shape.batch_size,
                                     self.shape.mode).num_batches
        single = len(spec.sources) == 1
        self._ident: dict[str, Any] = {
            "dataset": fingerprints[0] if single else list(fingerprints),
            "num_samples": int(sum(s.size for s in spec.sources)),
            "weights": None if single else [float(p) for p in spec.pattern.probabilities],
            "epoch_samples": spec.epoch_samples,
            "selection": _selection_digest(spec),
            "seed": spec.seed, "shuffle": spec.shuffle, "shuffle_block": spec.shuffle_block,
        }
        self._shape_fields = {"world_size": self.shape.world_size, "batch_size": self.shape.batch_size,
                              "drop_last": bool(drop_last), "pad": bool(pad)}
        self._plans: dict[tuple[int, tuple[Stage, ...], bool], RankPlan] = {}
        self._epoch = 0
        self._consumed = 0  # batches of self._epoch handed out at this shape (incl. a resumed prefix)
        self._resume: int | None = None  # first batch of the next pass, from load_state_dict
        self._prior: tuple[Stage, ...] = ()  # stages of self._epoch at other shapes (elastic resume)
        self._legacy = False  # self._epoch resumes a version-1 state the old way
        self._epoch_set = False
        self._passes = 0

    def fresh(self) -> "EpochCursor":
        """A new cursor built like this one, at epoch 0 with no resume point (a re-created loader's).

        Example:
            >>> from fastfeed.loading.order.rankplan import plan_spec
            >>> c = EpochCursor(plan_spec([[5]]), fingerprints=["ab12"], batch_size=2, drop_last=False,
            ...                 rank=0, world_size=1)
            >>> c.set_epoch(3); (c.epoch, c.fresh().epoch, c.fresh().num_batches)
            (3, 0, 3)
        """
        return EpochCursor(self.spec, **self._args)

    # ------------------------------------------------------------------ epochs and passes
    @property
    def num_batches(self) -> int:
        """Batches of a fresh epoch on this rank (``len(loader)``; a stream's: of the current epoch)."""
        return self._fresh_batches if self._stream is None else self._stream.num_batches(self._epoch)

    def epoch_batches(self, epoch: int) -> int:
        """Batches of ``epoch`` on this rank (after an elastic resume: of its rest)."""
        if self._stream is None:
            return self.plan(epoch).num_batches
        return self._stream.num_batches(epoch, self._prior if epoch == self._epoch else ())

    @property
    def epoch(self) -> int:
        """The epoch of the current (or next) pass."""
        return self._epoch

    @property
    def consumed(self) -> int:
        """Batches of :attr:`epoch` handed out at this shape, a resumed prefix included."""
        return self._consumed

    def set_epoch(self, epoch: int) -> None:
        """Run ``epoch`` on the next pass: from its start, or from a loaded resume point of it."""
        epoch = check_epoch(epoch, "set_epoch")
        if self._resume is None or epoch != self._epoch:
            self._resume = None
            self._consumed = 0
            self._prior, self._legacy = (), False
        self._epoch, self._epoch_set = epoch, True

    def begin_pass(self) -> Pass:
        """Start a pass (``iter(loader)``): its epoch and first batch, by the rules above."""
        start = 0
        if self._resume is not None:
            start, self._resume = self._resume, None
            if not self._epoch_set and start >= self.epoch_batches(self._epoch):
                self._next_epoch()  # the saved epoch was complete
                start = 0
        elif not self._epoch_set and self._passes > 0:
            self._next_epoch()  # a new pass is a new epoch, finished or abandoned
        self._passes += 1
        self._epoch_set, self._consumed = False, start
        return Pass(self._epoch, start, self._passes, self._prior, self._legacy)

    def _next_epoch(self) -> None:
        if self._epoch >= MAX_EPOCH:
            raise ConfigError(f"epoch {self._epoch} is the last a loader runs (2**62); a new pass would run the "
                              "one after it: call set_epoch() with the epoch to run")
        self._epoch += 1
        self._prior, self._legacy = (), False

    def run(self, open_pass: Callable[[Pass], Iterator[T]]) -> Iterator[T]:
        """One pass, begun at the first ``next()``: :meth:`begin_pass`, then the batches of
        ``open_pass(pass)``, counted; raises once a newer pass began.

        The pass begins lazily, so an iterator that is never advanced is no pass
        (Lightning calls ``iter()`` once on a loader that is not a DataLoader, to check it).
        """
        p = self.begin_pass()
        batches = open_pass(p)
        while True:
            if p.number != self._passes:
                raise FastfeedError(
                    "this loader was iterated again: only its newest iterator delivers batches (each "
                    "iter() starts a new pass, the next epoch unless set_epoch() says otherwise)")
            try:
                batch = next(batches)
            except StopIteration:
                return
            self._consumed += 1
            yield batch

    def plan(self, epoch: int) -> RankPlan:
        """This rank's plan of ``epoch`` (the rest of it after an elastic resume; the last few kept).

        Raises:
            ConfigError: a ``seq_len`` / ``batch_sampler`` loader, whose batches are its stream's.
        """
        if self._stream is not None:
            raise ConfigError("a seq_len= / batch_sampler= loader's batches are not a sample plan; "
                              "ask its dataset (TokenBatches.plan / SamplerBatches.plan)")
        pos = Position(epoch, 0, self._prior, self._legacy) if epoch == self._epoch else Position(epoch, 0)
        key = (epoch, pos.prior, pos.legacy)
        plan = self._plans.get(key)
        if plan is None:
            plan = rank_plan(self.spec, self.shape, self.rank, pos)
            if len(self._plans) >= _PLANS_KEPT:
                self._plans.pop(next(iter(self._plans)))
            self._plans[key] = plan
        return plan

    # ------------------------------------------------------------------ resume
    def state_dict(self) -> dict[str, Any]:
        """Where the loader is: the epoch, batches consumed, the stages, what the order depends on."""
        return self._v1_state() if self._legacy else self._v2_state()

    def _v2_state(self) -> dict[str, Any]:
        extra = {} if self._stream is None else self._stream.state(self._epoch, self._consumed, self._prior)
        return {
            **extra,
            "fastfeed_loader": STATE_VERSION,
            "epoch": self._epoch,
            "batches": self._consumed,
            "stages": LAYOUT.write_stages([p.row for p in self._prior], (*self.shape.row[:3], self._consumed)),
            "rank": self.rank,
            **self._shape_fields,
            **self._ident,
        }

    def _v1_state(self) -> dict[str, Any]:
        i, f = self._ident, self._shape_fields
        extra = {} if self._stream is None else self._stream.state(self._epoch, self._consumed)
        return {**extra, "fastfeed_loader": 1, "epoch": self._epoch, "batches": self._consumed, "seed": i["seed"],
                "world_size": f["world_size"], "rank": self.rank, "batch_size": f["batch_size"],
                "drop_last": f["drop_last"], "shuffle": i["shuffle"], "shuffle_block": i["shuffle_block"],
                "dataset": i["dataset"], "num_samples": i["num_samples"]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state`` on the next pass (checked by :func:`check_state`), at this
        loader's shape, whatever the saved one (elastic resume)."""
        if self._stream is not None:
            (prior, resume), legacy = self._read_stream_state(state), False
        else:
            prior, resume, legacy = self._read_state(state)
        if len(prior) >= MAX_STAGES:
            raise StateError(f"loader state: the epoch already ran at {len(prior)} shapes; at most "
                             f"{MAX_STAGES} are kept; resume at one of its shapes or from the next epoch")
        self._epoch, self._consumed, self._resume = state["epoch"], resume, resume
        self._prior, self._legacy, self._epoch_set = prior, legacy, False
        self._plans.clear()

    def _read_stream_state(self, state: Mapping[str, Any]) -> tuple[tuple[Stage, ...], int]:
        """(earlier stages, first batch at this shape) of a saved ``seq_len`` / ``batch_sampler`` state."""
        stream = self._stream
        if stream is None:
            raise StateError("a sample loader reads its state with _read_state")
        now = self._v2_state() if check_version(state) == 2 else self._v1_state()
        return check_stream_state(state, now, stream, self.shape)

    def _read_state(self, state: Mapping[str, Any]) -> tuple[tuple[Stage, ...], int, bool]:
        """(earlier stages, first batch at this shape, legacy) of a saved state."""
        check_stream_keys(state, self._v2_state())
        if check_version(state) == 2:
            stages = check_state(state, self._v2_state(), self.spec.epoch_samples).stages
        else:
            if self._ident["weights"] is not None or self._ident["selection"] is not None:
                raise StateError("a version-1 loader state describes one whole dataset, and this loader mixes "
                                 "datasets or has a subset/filter; resume with the loader it was saved by")
            check_fields(state, self._v1_state(), _V1_MATCH)
            stages = check_stages(state, self.spec.epoch_samples).stages
            if self._v1_needs_legacy(stages[0]):
                return (), stages[0].batches, True
        last = stages[-1]
        if last.same_shape(self.shape):
            return stages[:-1], last.batches, False
        return stages, 0, False

    def _v1_needs_legacy(self, stage: Stage) -> bool:
        """A version-1 state mid-epoch where the old plan padded: only the old plan resumes it exactly."""
        n = self.spec.epoch_samples
        lay = Layout(n, stage.world_size, stage.batch_size, stage.mode)
        exact = stage.mode == "drop" or n % stage.world_size == 0 or stage.batches in (0, lay.num_batches)
        if exact:
            return False
        if not stage.same_shape(self.shape):
            raise StateError(
                f"a version-1 loader state saved mid-epoch (world_size={stage.world_size}, batch_size="
                f"{stage.batch_size}, drop_last=False) resumes only at that shape, now world_size="
                f"{self.shape.world_size}, batch_size={self.shape.batch_size}, mode {self.shape.mode!r}; "
                "resume there, or from the start of the next epoch (set_epoch)")
        return True


def check_state(state: Any, now: Mapping[str, Any], epoch_samples: int) -> ElasticState:
    """Validate a saved version-2 loader state against the loader's own (``now``); return
    its epoch and stages.

    Raises:
        StateError: the state is malformed, or the order it was saved with differs (the
            message names every difference: "saved seed=1, now 0").

    Example:
        >>> check_state({"fastfeed_loader": 2, "epoch": 1}, {"epoch": 0, "batches": 0}, 10)
        Traceback (most recent call last):
        ...
        fastfeed.errors.StateError: loader state lacks batches, stages; pass the dict from Loader.state_dict()
    """
    check_fields(state, now, MUST_MATCH)
    return check_stages(state, epoch_samples)


class Resumable:
    """``len``, ``epoch``, ``set_epoch``, ``state_dict`` and ``load_state_dict`` of a loader
    that drives an :class:`EpochCursor` at ``self._cursor`` (every fastfeed loader)."""

    _cursor: EpochCursor

    def __len__(self) -> int:
        """Batches per epoch on this rank (the same on every rank); a pass that resumes an
        epoch saved at another shape delivers only that epoch's rest."""
        return self._cursor.num_batches

    @property
    def epoch(self) -> int:
        """The epoch of the current (or next) pass."""
        return self._cursor.epoch

    def set_epoch(self, epoch: int) -> None:
        """Run ``epoch`` on the next pass: from its start, or from a loaded resume point.

        Without ``set_epoch`` every new pass runs the next epoch, whether the previous
        pass finished or was abandoned (see :mod:`fastfeed.loading.order.cursor`). After
        :meth:`load_state_dict`, ``set_epoch`` with the saved epoch keeps the resume point
        (a state saved after the last batch of an epoch then gives an empty pass).

        Example:
            >>> for epoch in range(start_epoch, 90):          # doctest: +SKIP
            ...     dl.set_epoch(epoch)
            ...     for batch in dl: ...
        """
        self._cursor.set_epoch(epoch)

    def state_dict(self) -> dict[str, Any]:
        """Where this loader is: the epoch, batches consumed, and what the order depends on.

        The same layout for every ``decode``: a state saved with one resumes in the other.

        Example:
            >>> dl.state_dict()                                    # doctest: +SKIP
            {'fastfeed_loader': 2, 'epoch': 3, 'batches': 1200, 'stages': [[8, 256, 'pad', 1200]], ...}
        """
        return self._cursor.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state`` (from :meth:`state_dict`) on the next pass.

        Every field is checked; anything the order depends on must match, and the error
        says what differs (``"saved seed=1, now 0"``). The saving rank does not
        matter: all ranks consume the same number of batches. A state saved at another
        world size or batch size continues the same epoch (elastic resume: the rest of
        the epoch is dealt to the new ranks, each unconsumed sample once).

        Raises:
            StateError: the state is malformed or was saved by a loader with another order.

        Example:
            >>> dl.load_state_dict(torch.load("ckpt.pt")["loader"])   # doctest: +SKIP
        """
        self._cursor.load_state_dict(state)
