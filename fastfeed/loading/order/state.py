"""The loader's ``state_dict()`` layout (version 2), its checks, and reading version 1.

Version 2 (``{"fastfeed_loader": 2, ...}``)::

    epoch, batches          the epoch and the batches consumed at the current shape
    stages                  [[world_size, batch_size, mode, batches], ...]: every shape this
                            epoch ran at, the current one last (fastfeed.loading.order.elastic)
    rank, world_size, batch_size, drop_last, pad    the saving loader's shape (informative)
    dataset, num_samples, weights, epoch_samples, selection, seed, shuffle, shuffle_block
                            what the order depends on: must match (MUST_MATCH)

A state resumes at any world size, batch size, ``drop_last``/``pad`` and ``num_workers``
(elastic resume), a ``seq_len`` / ``batch_sampler`` loader's too (:class:`BatchStream`);
a state of other data or another order is refused with every field that differs.

Version 1 (no ``stages``) described one whole dataset at one shape. It is read as the
one-stage state it is where the planner's order equals the old one (no padding in the
epoch, or the epoch not begun or finished); otherwise (mid-epoch, with padding) the rest
of that epoch is planned the old way (:func:`fastfeed.loading.order.position.legacy_plan`),
which needs the saved shape, and states saved during that epoch stay version 1.

The layout is a :class:`fastfeed._state.StateLayout` (:data:`LAYOUT`): the version rules,
the integer checks, the reading and writing of ``stages`` and their messages are shared
with the samplers' state (:mod:`fastfeed.sampling.samplers`); what is the loader's own
(the fields that must match, the batches a stage had, the rank) is here.

Example:
    >>> check_version({"fastfeed_loader": 3})
    Traceback (most recent call last):
    ...
    fastfeed.errors.StateError: loader state version 3, this fastfeed reads 1 and 2: a newer fastfeed saved it; upgrade fastfeed to resume from it
"""

from __future__ import annotations

from typing import Any, Mapping, Protocol

from fastfeed._state import MAX_EPOCH, StateLayout
from fastfeed.errors import StateError
from fastfeed.loading.order.elastic import STAGES, ElasticState, Layout, Stage, segment_after

__all__ = ["LAYOUT", "MUST_MATCH", "MUST_MATCH_V1", "STATE_VERSION", "STREAM_KEYS", "BatchStream", "check_fields",
           "check_stages", "check_stream_keys", "check_stream_state", "check_version", "read_stages"]

#: Version of the ``state_dict()`` layout written.
STATE_VERSION = 2
#: State fields that must match exactly, in the order they are reported.
MUST_MATCH = ("dataset", "num_samples", "weights", "epoch_samples", "selection", "shuffle", "seed",
              "shuffle_block")
#: What a version-1 state had to match (its shape included).
MUST_MATCH_V1 = ("dataset", "num_samples", "world_size", "batch_size", "drop_last", "shuffle", "seed",
                 "shuffle_block")
#: State fields of the batch streams (:class:`BatchStream`): a state holding one fits only a
#: loader of that kind.
STREAM_KEYS = ("seq_len", "sampler")


def _v1_row(state: Mapping[str, Any]) -> tuple[Any, ...]:
    """The one stage a version-1 state describes (it had no ``pad``: a stage pads or drops)."""
    return (state["world_size"], state["batch_size"], "drop" if state["drop_last"] else "pad", state["batches"])


#: The loader's state layout (the module docstring).
LAYOUT = StateLayout(
    "loader state", version_key="fastfeed_loader", version=STATE_VERSION, reads=(1, 2),
    source="Loader.state_dict()", stages=STAGES, count_key="batches", v1_stage=_v1_row,
    ints=("epoch", "batches", "rank", "seed", "world_size", "batch_size", "num_samples", "shuffle_block"),
    most=(("epoch", MAX_EPOCH),), mismatch="saved {key}={saved}, now {now}")
_REFIT = ("Resume with the same datasets, weights, epoch_samples, subset/filter, shuffle, seed and shuffle_block "
          "(the sample order depends on them); world size, batch size and num_workers may change")


def check_version(state: Any) -> int:
    """The layout version of ``state`` (1 or 2).

    Raises:
        StateError: not a mapping, or another version.
    """
    return LAYOUT.version_of(state)


def check_fields(state: Mapping[str, Any], now: Mapping[str, Any], must_match: tuple[str, ...]) -> None:
    """Every field of ``now`` present, the integers integers, ``must_match`` equal.

    Raises:
        StateError: the message names every missing field, or every difference
            (``"saved dataset='ab12', now 'cd34'"``).
    """
    LAYOUT.check(state, now)
    LAYOUT.check_match(state, now, must_match, owner="loader", fix=_REFIT)
    if not state["rank"] < state["world_size"]:
        raise LAYOUT.error(f"rank={state['rank']} outside world_size={state['world_size']}")


def read_stages(state: Mapping[str, Any], version: int) -> tuple[Stage, ...]:
    """The stages of a checked state (a version-1 state's: its one stage), the last one's
    batches the state's ``batches``.

    Raises:
        StateError: a malformed stage, or a last stage that is not the state's position.

    Example:
        >>> read_stages({"fastfeed_loader": 1, "batches": 2, "world_size": 4, "batch_size": 8,
        ...              "drop_last": True}, 1)
        (Stage(world_size=4, batch_size=8, mode='drop', batches=2),)
    """
    return tuple(Stage(*row) for row in LAYOUT.read_stages(state, version))


def check_stages(state: Mapping[str, Any], epoch_samples: int) -> ElasticState:
    """The stages of a checked state (version 1 or 2), each within its epoch's batches.

    Raises:
        StateError: malformed stages, or a stage that consumed more batches than it had.

    Example:
        >>> check_stages({"fastfeed_loader": 2, "epoch": 0, "batches": 5, "stages": [[2, 1, "pad", 5]]}, 7)
        Traceback (most recent call last):
        ...
        fastfeed.errors.StateError: loader state: stage 0 (world_size=2, batch_size=1, mode='pad') consumed 5 batches of 4, past the end of epoch 0 at that shape; pass the dict from Loader.state_dict()
    """
    stages = read_stages(state, LAYOUT.version_of(state))

    def batches(i: int) -> int:
        s = stages[i]
        return Layout(segment_after(epoch_samples, stages[:i]).total, s.world_size, s.batch_size, s.mode).num_batches

    LAYOUT.check_within([s.row for s in stages], batches, epoch=state["epoch"])
    return ElasticState(state["epoch"], stages)


class BatchStream(Protocol):
    """A loader whose batches are not the sample plan's (``seq_len``, ``batch_sampler``):
    how many batches an epoch (or its rest after earlier stages) has, and what its state
    adds (see :mod:`fastfeed.loading.cpu.tokens`, :mod:`fastfeed.loading.cpu.sampled`). The
    cursor's epochs, passes, batch counts and stages are unchanged: a state saved at
    another world size or batch size continues the epoch, each stream re-planning its
    rest from the stages (a token offset; a sampler's rest of the epoch)."""

    def num_batches(self, epoch: int, prior: tuple[Stage, ...] = ()) -> int:
        """Batches of ``epoch`` on this rank (the same on every rank), after the stages ``prior``."""

    def state(self, epoch: int, batches: int, prior: tuple[Stage, ...] = ()) -> dict[str, Any]:
        """The fields it adds to the state after ``prior`` and ``batches`` batches of ``epoch``."""

    def check_state(self, state: Mapping[str, Any]) -> None:
        """Raise :class:`~fastfeed.errors.StateError` if ``state`` was saved by another stream."""

    def check_stages(self, epoch: int, stages: tuple[Stage, ...]) -> None:
        """Raise :class:`~fastfeed.errors.StateError` if a stage consumed more batches than it had."""


def check_stream_keys(state: Any, now: Mapping[str, Any]) -> None:
    """A state saved by a ``seq_len`` / ``batch_sampler`` loader fits only such a loader.

    Example:
        >>> check_stream_keys({"seq_len": 8}, {"epoch": 0})
        Traceback (most recent call last):
        ...
        fastfeed.errors.StateError: loader state saved by a loader with seq_len=8; resume it with the same seq_len= / batch_sampler=
    """
    if not isinstance(state, Mapping):
        return
    saved_by = [f"{k}={state[k]!r}" for k in STREAM_KEYS if k in state and k not in now]
    if saved_by:
        raise StateError(f"loader state saved by a loader with {', '.join(saved_by)}; resume it with the same "
                         "seq_len= / batch_sampler=")


def check_stream_state(state: Mapping[str, Any], now: Mapping[str, Any], stream: BatchStream,
                       shape: Stage) -> tuple[tuple[Stage, ...], int]:
    """Validate a state (version 1 or 2) for a ``seq_len`` / ``batch_sampler`` loader of ``shape``;
    return the stages of its epoch before this shape and the first batch at this shape.

    A version-2 state resumes at any shape (elastic resume: the stream re-plans the rest
    of the epoch after the saved stages); a version-1 state only at the shape it names.

    Raises:
        StateError: another stream or order, a version-1 state of another shape, or a
            stage with more batches than it had.
    """
    stream.check_state(state)  # its own differences first: they explain the others
    check_stream_keys(state, now)
    version = check_version(state)
    check_fields(state, now, MUST_MATCH if version == 2 else MUST_MATCH_V1)
    stages = read_stages(state, version)
    stream.check_stages(state["epoch"], stages)
    last = stages[-1]
    if last.same_shape(shape):
        return stages[:-1], last.batches
    return stages, 0
