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
``{"fastfeed_loader": 1, "epoch", "batches", "rank", ...}`` with what the order depends
on (:data:`MUST_MATCH`); :func:`check_state` names every difference when they do not
match. The saving rank does not matter: all ranks consume the same number of batches.

Example:
    >>> c = EpochCursor(fingerprint="ab12", shard_counts=[5, 5], batch_size=4, seed=0, shuffle=True,
    ...                 drop_last=False, shuffle_block=8192, rank=0, world_size=1)
    >>> list(c.run(lambda p: iter([f"e{p.epoch}b{b}" for b in range(p.start, 3)])))
    ['e0b0', 'e0b1', 'e0b2']
    >>> it = c.run(lambda p: iter([f"e{p.epoch}b{b}" for b in range(p.start, 3)]))
    >>> next(it), c.state_dict()["batches"]        # no set_epoch: the next epoch
    ('e1b0', 1)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Protocol, Sequence, TypeVar

import numpy as np

from fastfeed.errors import ConfigError, FastfeedError, StateError
from fastfeed.loading.options import LoaderOptions
from fastfeed.loading.plan import EpochPlan, num_batches, plan_epoch
from fastfeed.packed.index import DatasetIndex

__all__ = ["BatchStream", "EpochCursor", "MUST_MATCH", "Pass", "Resumable", "STATE_VERSION", "check_state"]

T = TypeVar("T")

#: Version of the ``state_dict()`` layout.
STATE_VERSION = 1
#: State fields that must match exactly, in the order they are reported.
MUST_MATCH = ("dataset", "num_samples", "world_size", "batch_size", "drop_last", "shuffle", "seed",
              "shuffle_block")
_INTS = ("epoch", "batches", "rank", "seed", "world_size", "batch_size", "num_samples", "shuffle_block")
_PLANS_KEPT = 3  # a DALI feed runs into the next epoch while this one ends
#: State fields of the batch streams (:class:`BatchStream`): a state holding one fits only a
#: loader of that kind.
STREAM_KEYS = ("seq_len", "sampler")


class BatchStream(Protocol):
    """A loader whose batches are not the sample plan's (``seq_len``, ``batch_sampler``):
    how many batches an epoch has, and what its state adds (see :mod:`fastfeed.loading.tokens`,
    :mod:`fastfeed.loading.sampled`). The cursor's epochs, passes and batch counts are unchanged."""

    def num_batches(self, epoch: int) -> int:
        """Batches of ``epoch`` on this rank (the same on every rank)."""

    def state(self, epoch: int, batches: int) -> dict[str, Any]:
        """The fields it adds to the state after ``batches`` batches of ``epoch``."""

    def check_state(self, state: Mapping[str, Any]) -> None:
        """Raise :class:`~fastfeed.errors.StateError` if ``state`` was saved by another stream."""


@dataclass(frozen=True)
class Pass:
    """One pass over the data: its epoch, first batch, and number (the newest delivers)."""

    epoch: int
    start: int
    number: int


class EpochCursor:
    """The epoch/resume state machine of one loader on one rank (see the module docstring).

    Args:
        fingerprint: the dataset's fingerprint (``DatasetIndex.fingerprint``).
        shard_counts: samples per shard, in index order.
        batch_size, seed, shuffle, drop_last, shuffle_block, rank, world_size: the order
            (see :func:`fastfeed.loading.plan.plan_epoch`).
    """

    def __init__(self, *, fingerprint: str, shard_counts: Sequence[int] | np.ndarray, batch_size: int,
                 seed: int, shuffle: bool, drop_last: bool, shuffle_block: int, rank: int,
                 world_size: int, stream: BatchStream | None = None) -> None:
        self._counts = np.asarray(shard_counts, dtype=np.int64)
        num_samples = int(self._counts.sum())
        self._stream = stream
        self._num_batches = num_batches(num_samples, world_size=world_size, batch_size=batch_size,
                                        drop_last=drop_last)
        self._order: dict[str, Any] = {
            "seed": seed, "world_size": world_size, "rank": rank, "batch_size": batch_size,
            "drop_last": drop_last, "shuffle": shuffle, "shuffle_block": shuffle_block,
            "dataset": fingerprint, "num_samples": num_samples,
        }
        self._plans: dict[int, EpochPlan] = {}
        self._epoch = 0
        self._consumed = 0  # batches of self._epoch handed out (incl. a resumed prefix)
        self._resume: int | None = None  # first batch of the next pass, from load_state_dict
        self._epoch_set = False
        self._passes = 0

    @classmethod
    def for_options(cls, index: DatasetIndex, options: LoaderOptions) -> "EpochCursor":
        """The cursor of a loader over ``index`` with ``options``.

        Example:
            >>> cursor = EpochCursor.for_options(index, options)     # doctest: +SKIP
        """
        o = options
        return cls(fingerprint=index.fingerprint, shard_counts=index.shard_counts, batch_size=o.batch_size,
                   seed=o.seed, shuffle=o.shuffle, drop_last=o.drop_last, shuffle_block=o.shuffle_block,
                   rank=o.rank, world_size=o.world_size)

    # ------------------------------------------------------------------ epochs and passes
    @property
    def num_batches(self) -> int:
        """Batches of the current (or next) epoch on this rank."""
        return self._num_batches if self._stream is None else self._stream.num_batches(self._epoch)

    @property
    def epoch(self) -> int:
        """The epoch of the current (or next) pass."""
        return self._epoch

    @property
    def consumed(self) -> int:
        """Batches of :attr:`epoch` handed out, a resumed prefix included."""
        return self._consumed

    def set_epoch(self, epoch: int) -> None:
        """Run ``epoch`` on the next pass: from its start, or from a loaded resume point of it."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ConfigError(f"set_epoch({epoch!r}): the epoch is an integer >= 0")
        if self._resume is None or epoch != self._epoch:
            self._resume = None
            self._consumed = 0
        self._epoch, self._epoch_set = epoch, True

    def begin_pass(self) -> Pass:
        """Start a pass (``iter(loader)``): its epoch and first batch, by the rules above."""
        start = 0
        if self._resume is not None:
            start, self._resume = self._resume, None
            if not self._epoch_set and start >= self.num_batches:
                self._epoch, start = self._epoch + 1, 0  # the saved epoch was complete
        elif not self._epoch_set and self._passes > 0:
            self._epoch += 1  # a new pass is a new epoch, finished or abandoned
        self._passes += 1
        self._epoch_set, self._consumed = False, start
        return Pass(self._epoch, start, self._passes)

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

    def plan(self, epoch: int) -> EpochPlan:
        """This rank's plan of ``epoch`` (the last few are kept)."""
        plan = self._plans.get(epoch)
        if plan is None:
            o = self._order
            plan = plan_epoch(self._counts, seed=o["seed"], epoch=epoch, world_size=o["world_size"],
                              rank=o["rank"], batch_size=o["batch_size"], drop_last=o["drop_last"],
                              shuffle=o["shuffle"], shuffle_block=o["shuffle_block"])
            if len(self._plans) >= _PLANS_KEPT:
                self._plans.pop(min(self._plans))
            self._plans[epoch] = plan
        return plan

    # ------------------------------------------------------------------ resume
    def state_dict(self) -> dict[str, Any]:
        """Where the loader is: the epoch, batches consumed, and what the order depends on."""
        o = self._order
        extra = {} if self._stream is None else self._stream.state(self._epoch, self._consumed)
        return {
            **extra,
            "fastfeed_loader": STATE_VERSION,
            "epoch": self._epoch,
            "batches": self._consumed,
            "seed": o["seed"],
            "world_size": o["world_size"],
            "rank": o["rank"],
            "batch_size": o["batch_size"],
            "drop_last": o["drop_last"],
            "shuffle": o["shuffle"],
            "shuffle_block": o["shuffle_block"],
            "dataset": o["dataset"],
            "num_samples": o["num_samples"],
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state`` on the next pass (checked by :func:`check_state`)."""
        if self._stream is not None and isinstance(state, Mapping):
            self._stream.check_state(state)  # its own differences first: they explain the others
        check_state(state, self.state_dict(), self._num_batches if self._stream is None else None)
        if self._stream is not None:
            check_state(state, self.state_dict(), self._stream.num_batches(state["epoch"]))
        self._epoch, self._consumed, self._resume = state["epoch"], state["batches"], state["batches"]
        self._epoch_set = False


def check_state(state: Any, now: Mapping[str, Any], epoch_batches: int | None) -> None:
    """Validate a saved loader state against the loader's own (``now``); ``epoch_batches``
    (None: not checked) bounds its batches.

    Raises:
        StateError: the state is malformed, or the order it was saved with differs (the
            message names every difference: "saved with world_size=8, now 4").

    Example:
        >>> check_state({"epoch": 1}, {"epoch": 0, "batches": 0}, 10)
        Traceback (most recent call last):
        ...
        fastfeed.errors.StateError: loader state lacks batches; pass the dict from Loader.state_dict()
    """
    if not isinstance(state, Mapping):
        raise StateError(f"load_state_dict() takes the dict from state_dict(), not {type(state).__name__}")
    missing = sorted(set(now) - set(state))
    if missing:
        raise StateError(f"loader state lacks {', '.join(missing)}; pass the dict from Loader.state_dict()")
    saved_by = [f"{k}={state[k]!r}" for k in STREAM_KEYS if k in state and k not in now]
    if saved_by:
        raise StateError(f"loader state saved by a loader with {', '.join(saved_by)}; resume it with the same "
                         "seq_len= / batch_sampler=")
    if state["fastfeed_loader"] != STATE_VERSION:
        raise StateError(f"loader state version {state['fastfeed_loader']!r}, this fastfeed reads {STATE_VERSION}")
    for name in _INTS:
        v = state[name]
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise StateError(f"loader state: {name}={v!r} is not an integer >= 0")
    diffs = [f"{k}={state[k]!r}, now {now[k]!r}" for k in MUST_MATCH if state[k] != now[k]]
    if diffs:
        raise StateError(
            "loader state does not fit this loader: saved with " + "; ".join(diffs)
            + ". Resume with the same dataset, world size, batch size, drop_last, shuffle, seed "
            "and shuffle_block (the sample order depends on them)"
        )
    if not state["rank"] < state["world_size"]:
        raise StateError(f"loader state: rank={state['rank']} outside world_size={state['world_size']}")
    if epoch_batches is not None and state["batches"] > epoch_batches:
        raise StateError(
            f"loader state: batches={state['batches']} but an epoch of this loader has only {epoch_batches}"
        )


class Resumable:
    """``len``, ``epoch``, ``set_epoch``, ``state_dict`` and ``load_state_dict`` of a loader
    that drives an :class:`EpochCursor` at ``self._cursor`` (every fastfeed loader)."""

    _cursor: EpochCursor

    def __len__(self) -> int:
        """Batches per epoch on this rank (the same on every rank)."""
        return self._cursor.num_batches

    @property
    def epoch(self) -> int:
        """The epoch of the current (or next) pass."""
        return self._cursor.epoch

    def set_epoch(self, epoch: int) -> None:
        """Run ``epoch`` on the next pass: from its start, or from a loaded resume point.

        Without ``set_epoch`` every new pass runs the next epoch, whether the previous
        pass finished or was abandoned (see :mod:`fastfeed.loading.cursor`). After
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
            {'fastfeed_loader': 1, 'epoch': 3, 'batches': 1200, 'seed': 0, 'world_size': 8, ...}
        """
        return self._cursor.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state`` (from :meth:`state_dict`) on the next pass.

        Every field is checked; anything the order depends on must match, and the error
        says what differs (``"saved with world_size=8, now 4"``). The saving rank does
        not matter: all ranks consume the same number of batches.

        Raises:
            StateError: the state is malformed or was saved by a loader with another order.

        Example:
            >>> dl.load_state_dict(torch.load("ckpt.pt")["loader"])   # doctest: +SKIP
        """
        self._cursor.load_state_dict(state)
