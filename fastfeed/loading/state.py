"""The loader's ``state_dict()`` layout (version 2), its checks, and reading version 1.

Version 2 (``{"fastfeed_loader": 2, ...}``)::

    epoch, batches          the epoch and the batches consumed at the current shape
    stages                  [[world_size, batch_size, mode, batches], ...]: every shape this
                            epoch ran at, the current one last (fastfeed.loading.elastic)
    rank, world_size, batch_size, drop_last, pad    the saving loader's shape (informative)
    dataset, num_samples, weights, epoch_samples, selection, seed, shuffle, shuffle_block
                            what the order depends on: must match (MUST_MATCH)

A state resumes at any world size, batch size, ``drop_last``/``pad`` and ``num_workers``
(elastic resume); a state of other data or another order is refused with every field
that differs. Version 1 (no ``stages``) described one whole dataset at one shape. It is
read as the one-stage state it is where the planner's order equals the old one (no
padding in the epoch, or the epoch not begun or finished); otherwise (mid-epoch, with
padding) the rest of that epoch is planned the old way
(:func:`fastfeed.loading.position.legacy_plan`), which needs the saved shape, and states
saved during that epoch stay version 1.

Example:
    >>> check_version({"fastfeed_loader": 3})
    Traceback (most recent call last):
    ...
    fastfeed.errors.StateError: loader state version 3, this fastfeed reads 1 and 2
"""

from __future__ import annotations

from typing import Any, Mapping

from fastfeed.errors import StateError
from fastfeed.loading.elastic import ElasticState, Layout, Stage, segment_after

__all__ = ["MUST_MATCH", "MUST_MATCH_V1", "STATE_VERSION", "check_fields", "check_stages", "check_version",
           "v1_stage"]

#: Version of the ``state_dict()`` layout written.
STATE_VERSION = 2
#: State fields that must match exactly, in the order they are reported.
MUST_MATCH = ("dataset", "num_samples", "weights", "epoch_samples", "selection", "shuffle", "seed",
              "shuffle_block")
#: What a version-1 state had to match (its shape included).
MUST_MATCH_V1 = ("dataset", "num_samples", "world_size", "batch_size", "drop_last", "shuffle", "seed",
                 "shuffle_block")
_INTS = ("epoch", "batches", "rank", "seed", "world_size", "batch_size", "num_samples", "shuffle_block")


def check_version(state: Any) -> int:
    """The layout version of ``state`` (1 or 2).

    Raises:
        StateError: not a mapping, or another version.
    """
    if not isinstance(state, Mapping):
        raise StateError(f"load_state_dict() takes the dict from state_dict(), not {type(state).__name__}")
    if "fastfeed_loader" not in state:
        raise StateError("loader state lacks fastfeed_loader (its version); pass the dict from Loader.state_dict()")
    version = state["fastfeed_loader"]
    if version not in (1, 2) or isinstance(version, bool):
        raise StateError(f"loader state version {version!r}, this fastfeed reads 1 and 2")
    return int(version)


def check_fields(state: Mapping[str, Any], now: Mapping[str, Any], must_match: tuple[str, ...]) -> None:
    """Every field of ``now`` present, the integers integers, ``must_match`` equal.

    Raises:
        StateError: the message names every missing field, or every difference
            (``"saved with dataset='ab12', now 'cd34'"``).
    """
    missing = sorted(set(now) - set(state))
    if missing:
        raise StateError(f"loader state lacks {', '.join(missing)}; pass the dict from Loader.state_dict()")
    for name in _INTS:
        v = state[name]
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise StateError(f"loader state: {name}={v!r} is not an integer >= 0")
    diffs = [f"{k}={_show(state[k])}, now {_show(now[k])}" for k in must_match if _norm(state[k]) != _norm(now[k])]
    if diffs:
        raise StateError(
            "loader state does not fit this loader: saved with " + "; ".join(diffs)
            + ". Resume with the same datasets, weights, epoch_samples, subset/filter, shuffle, seed and "
            "shuffle_block (the sample order depends on them); world size, batch size and num_workers may change")
    if not state["rank"] < state["world_size"]:
        raise StateError(f"loader state: rank={state['rank']} outside world_size={state['world_size']}")


def check_stages(state: Mapping[str, Any], epoch_samples: int) -> ElasticState:
    """The stages of a version-2 state, each within its epoch's batches.

    Raises:
        StateError: malformed stages, or a stage that consumed more batches than it had.
    """
    st = ElasticState.from_dict({"epoch": state["epoch"], "stages": state["stages"]})
    if st.stages[-1].batches != state["batches"]:
        raise StateError(f"loader state: batches={state['batches']} but its last stage says "
                         f"{st.stages[-1].batches}; pass the dict from Loader.state_dict()")
    for i, s in enumerate(st.stages):
        total = segment_after(epoch_samples, st.stages[:i]).total
        n = Layout(total, s.world_size, s.batch_size, s.mode).num_batches
        if s.batches > n:
            raise StateError(f"loader state: stage {i} ({s.world_size} ranks, batch {s.batch_size}, {s.mode}) "
                             f"consumed {s.batches} batches of {n}; pass the dict from Loader.state_dict()")
    return st


def v1_stage(state: Mapping[str, Any]) -> Stage:
    """The one stage a version-1 state describes."""
    return Stage(state["world_size"], state["batch_size"], "drop" if state["drop_last"] else "pad",
                 state["batches"])


def _norm(v: Any) -> Any:
    return [_norm(x) for x in v] if isinstance(v, (list, tuple)) else v


def _show(v: Any) -> str:
    return repr(_norm(v))
