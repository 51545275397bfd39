"""Versioned state: the shared helper (fastfeed._state), the pinned formats of the loader's and
the samplers' ``state_dict()``, and ONE harness every stateful class runs (torchdata.nodes
style: save mid-epoch, restore in a fresh object, compare the rest of the stream; then the
older version, a wrong version, a missing field, a wrong type), over many world shapes."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import pytest

import fastfeed
from fastfeed._state import StateLayout, Stages, differences, read_int
from fastfeed.errors import StateError
from fastfeed.loading.order.cursor import EpochCursor
from fastfeed.loading.order.elastic import ElasticState, Stage
from fastfeed.loading.order.rankplan import plan_spec
from fastfeed.loading.order.selection import Selection
from fastfeed.sampling.aspect import DistributedAspectRatioSampler
from fastfeed.sampling.samplers import DistributedLengthBucketSampler, DistributedTokenBudgetSampler

from _loader_data import write_dataset

# ---------------------------------------------------------------------- the helper
TOY = StateLayout("toy state", version_key="toy", version=2, source="Toy.state_dict()", required=("epoch",),
                  ints=("epoch", "step"), stages=Stages((("world_size", 1), ("mode", ("a", "b")), ("steps", 0))),
                  count_key="step", v1_stage=lambda s: (s["world_size"], "a", s["step"]))
GOOD = {"toy": 2, "epoch": 1, "step": 3, "stages": [[4, "a", 2], [2, "b", 3]]}


def test_a_layout_reads_its_versions_and_its_stages() -> None:
    assert TOY.check(GOOD) == 2
    assert TOY.read_stages(GOOD, 2) == ((4, "a", 2), (2, "b", 3))
    assert TOY.write_stages([(4, "a", 2)], (2, "b", 3)) == GOOD["stages"]
    v1 = {"toy": 1, "epoch": 1, "step": 3, "world_size": 2}
    assert TOY.check(v1) == 1  # no stages in version 1 ...
    assert TOY.read_stages(v1, 1) == ((2, "a", 3),)  # ... it is its one stage
    assert TOY.check({**GOOD, "step": np.int64(3)}) == 2  # numpy integers are integers


@pytest.mark.parametrize("state, match", [
    ([1], r"toy state: load_state_dict\(\) takes the dict from Toy.state_dict\(\), not a list"),
    ({"epoch": 1}, r"toy state lacks toy \(its version\); pass the dict from Toy.state_dict\(\)"),
    ({}, r"lacks epoch, toy \(its version\)"),  # every missing field at once
    ({**GOOD, "toy": 3}, r"version 3, this fastfeed reads 1 and 2: a newer fastfeed saved it; upgrade fastfeed"),
    ({**GOOD, "toy": 0}, r"version 0, this fastfeed reads 1 and 2; pass the dict from Toy.state_dict\(\)"),
    ({**GOOD, "toy": True}, r"version True"),
    ({**GOOD, "toy": "2"}, r"version '2'"),
    ({"toy": 2, "step": 0}, r"toy state lacks epoch, stages; pass"),
    ({**GOOD, "epoch": "1"}, r"epoch='1' is not an integer >= 0; .* turns integers into floats or strings"),
    ({**GOOD, "step": 3.0}, r"step=3.0 is not an integer >= 0"),
    ({**GOOD, "step": True}, r"step=True is not an integer >= 0"),
    ({**GOOD, "epoch": -1}, r"epoch=-1 is not an integer >= 0; pass .* \(its integers are never below 0; was it"),
])
def test_a_bad_state_says_what_where_and_the_fix(state: Any, match: str) -> None:
    with pytest.raises(StateError, match=match):
        TOY.check(state)


@pytest.mark.parametrize("stages, match", [
    ([], r"stages=\[\] is not a list of \[world_size, mode, steps\], one per shape the epoch ran at"),
    (5, r"stages=5 is not a list"),
    ([[2, "a"]], r"stage 0 is \[2, 'a'\], not \[world_size, mode, steps\]"),
    ([[2, "a", 3], [0, "a", 3]], r"stage 1 has world_size=0, not an integer >= 1"),
    ([["2", "a", 3]], r"stage 0 has world_size='2', not an integer >= 1; .* floats or strings"),
    ([[2, "c", 3]], r"stage 0 has mode='c', not one of 'a', 'b'"),
    ([[2, "a", -3]], r"stage 0 has steps=-3, not an integer >= 0"),
    ([[2, "a", 1]], r"toy state: step=3 but its last stage says 1; pass the dict from Toy.state_dict\(\)"),
])
def test_bad_stages_name_the_stage_and_the_column(stages: Any, match: str) -> None:
    state = {**GOOD, "stages": stages}
    with pytest.raises(StateError, match=match):
        TOY.read_stages(state, TOY.check(state))


def test_stage_capacity_and_the_fields_that_must_match() -> None:
    rows = TOY.read_stages(GOOD, 2)
    TOY.check_within(rows, lambda i: 3, epoch=1)
    with pytest.raises(StateError, match=r"toy state: stage 1 \(world_size=2, mode='b'\) consumed 3 steps of 2, "
                                         r"past the end of epoch 1 at that shape; pass the dict from Toy"):
        TOY.check_within(rows, lambda i: 2, epoch=1)
    assert differences({"w": (1, 2), "c": 5}, {"w": [1, 2], "c": {"x": 1}}, ["w", "c"]) == [("c.x", None, 1)]
    with pytest.raises(StateError, match=r"toy state does not fit this toy \(seed: saved 1, now 0; "
                                         r"config.b: saved 4, now 8\). Start afresh"):
        TOY.check_match({"seed": 1, "config": {"b": 4}}, {"seed": 0, "config": {"b": 8}}, ["seed", "config"],
                        owner="toy", fix="Start afresh")


def test_an_inconsistent_layout_is_refused_when_built() -> None:
    with pytest.raises(ValueError, match="version 3 must be one of reads"):
        StateLayout("x", version_key="x", version=3, source="X")
    with pytest.raises(ValueError, match="needs count_key, and v1_stage"):
        StateLayout("x", version_key="x", version=2, source="X", stages=TOY.stages, count_key="step")
    with pytest.raises(TypeError, match="without stages"):
        StateLayout("x", version_key="x", version=2, source="X").write_stages([], (1, 0))


def test_read_int_and_a_stage_row_round_trip() -> None:
    assert read_int({"n": np.int32(4)}, "n", what="x", fix="f") == 4
    assert type(read_int({"n": np.int32(4)}, "n", what="x", fix="f")) is int
    with pytest.raises(StateError, match="n=0 is not an integer >= 1"):
        read_int({"n": 0}, "n", what="x", fix="f", least=1)
    st = ElasticState(3, (Stage(8, 4, "pad", 2), Stage(2, 1, "exact", 0)))
    assert ElasticState.from_dict(json.loads(json.dumps(st.to_dict()))) == st


# ---------------------------------------------------------------------- the formats, pinned
# Built with the code before fastfeed._state existed; states saved then must load now, and the
# dicts written must stay these, key order included.
PINNED: dict[str, dict[str, Any]] = {
    'loader_fresh': {'fastfeed_loader': 2, 'epoch': 0, 'batches': 0, 'stages': [[3, 2, 'pad', 0]], 'rank': 1, 'world_size': 3, 'batch_size': 2, 'drop_last': False, 'pad': True, 'dataset': 'ab12', 'num_samples': 13, 'weights': None, 'epoch_samples': 13, 'selection': None, 'seed': 4, 'shuffle': True, 'shuffle_block': 8},  # noqa: E501
    'loader_mid': {'fastfeed_loader': 2, 'epoch': 0, 'batches': 1, 'stages': [[3, 2, 'pad', 1]], 'rank': 1, 'world_size': 3, 'batch_size': 2, 'drop_last': False, 'pad': True, 'dataset': 'ab12', 'num_samples': 13, 'weights': None, 'epoch_samples': 13, 'selection': None, 'seed': 4, 'shuffle': True, 'shuffle_block': 8},  # noqa: E501
    'loader_elastic': {'fastfeed_loader': 2, 'epoch': 0, 'batches': 2, 'stages': [[3, 2, 'pad', 1], [2, 1, 'drop', 2]], 'rank': 0, 'world_size': 2, 'batch_size': 1, 'drop_last': True, 'pad': False, 'dataset': 'ab12', 'num_samples': 13, 'weights': None, 'epoch_samples': 13, 'selection': None, 'seed': 4, 'shuffle': True, 'shuffle_block': 8},  # noqa: E501
    'loader_mixed': {'fastfeed_loader': 2, 'epoch': 2, 'batches': 1, 'stages': [[2, 2, 'drop', 1]], 'rank': 0, 'world_size': 2, 'batch_size': 2, 'drop_last': True, 'pad': True, 'dataset': ['aa', 'bb'], 'num_samples': 14, 'weights': [0.75, 0.25], 'epoch_samples': 12, 'selection': [None, '32574702e9da02dc'], 'seed': 9, 'shuffle': False, 'shuffle_block': 3},  # noqa: E501
    'loader_legacy': {'fastfeed_loader': 1, 'epoch': 0, 'batches': 1, 'seed': 4, 'world_size': 3, 'rank': 2, 'batch_size': 2, 'drop_last': False, 'shuffle': True, 'shuffle_block': 8, 'dataset': 'ab12', 'num_samples': 13},  # noqa: E501
    'loader_legacy_next': {'fastfeed_loader': 1, 'epoch': 0, 'batches': 2, 'seed': 4, 'world_size': 3, 'rank': 2, 'batch_size': 2, 'drop_last': False, 'shuffle': True, 'shuffle_block': 8, 'dataset': 'ab12', 'num_samples': 13},  # noqa: E501
    'loader_stream': {'seq_len': 8, 'tokens': 200, 'fastfeed_loader': 2, 'epoch': 0, 'batches': 2, 'stages': [[2, 2, 'pad', 2]], 'rank': 0, 'world_size': 2, 'batch_size': 2, 'drop_last': False, 'pad': True, 'dataset': 'ab12', 'num_samples': 13, 'weights': None, 'epoch_samples': 13, 'selection': None, 'seed': 4, 'shuffle': True, 'shuffle_block': 8},  # noqa: E501
    'bucket_fresh': {'sampler': 'DistributedLengthBucketSampler', 'version': 2, 'epoch': 0, 'step': 0, 'stages': [[2, 0]], 'seed': 7, 'num_replicas': 2, 'num_samples': 41, 'lengths_digest': '038ae781ebaf0960', 'config': {'batch_size': 3, 'shuffle': True, 'drop_last': False, 'jitter': 'auto', 'adaptive_jitter': True, 'cost': {'name': 'tokens', 'unit': 'tokens', 'const': 0.0, 'padded': 1.0, 'padded_sq': 0.0, 'tokens': 0.0, 'tokens_sq': 0.0}}},  # noqa: E501
    'bucket_mid': {'sampler': 'DistributedLengthBucketSampler', 'version': 2, 'epoch': 1, 'step': 2, 'stages': [[2, 2]], 'seed': 7, 'num_replicas': 2, 'num_samples': 41, 'lengths_digest': '038ae781ebaf0960', 'config': {'batch_size': 3, 'shuffle': True, 'drop_last': False, 'jitter': 'auto', 'adaptive_jitter': True, 'cost': {'name': 'tokens', 'unit': 'tokens', 'const': 0.0, 'padded': 1.0, 'padded_sq': 0.0, 'tokens': 0.0, 'tokens_sq': 0.0}}},  # noqa: E501
    'bucket_steps': {'sampler': 'DistributedLengthBucketSampler', 'version': 2, 'epoch': 1, 'step': 1, 'stages': [[2, 1]], 'seed': 7, 'num_replicas': 2, 'num_samples': 41, 'lengths_digest': '038ae781ebaf0960', 'config': {'batch_size': 3, 'shuffle': True, 'drop_last': False, 'jitter': 'auto', 'adaptive_jitter': True, 'cost': {'name': 'tokens', 'unit': 'tokens', 'const': 0.0, 'padded': 1.0, 'padded_sq': 0.0, 'tokens': 0.0, 'tokens_sq': 0.0}}},  # noqa: E501
    'budget_mid': {'sampler': 'DistributedTokenBudgetSampler', 'version': 2, 'epoch': 3, 'step': 1, 'stages': [[3, 1]], 'seed': 2, 'num_replicas': 3, 'num_samples': 41, 'lengths_digest': '038ae781ebaf0960', 'config': {'max_cost': 300.0, 'oversize': 'error', 'shuffle': False, 'drop_last': True, 'jitter': 0.05, 'adaptive_jitter': True, 'cost': {'name': 'tokens', 'unit': 'tokens', 'const': 0.0, 'padded': 1.0, 'padded_sq': 0.0, 'tokens': 0.0, 'tokens_sq': 0.0}}},  # noqa: E501
    'budget_elastic': {'sampler': 'DistributedTokenBudgetSampler', 'version': 2, 'epoch': 3, 'step': 1, 'stages': [[3, 1], [2, 1]], 'seed': 2, 'num_replicas': 2, 'num_samples': 41, 'lengths_digest': '038ae781ebaf0960', 'config': {'max_cost': 300.0, 'oversize': 'error', 'shuffle': False, 'drop_last': True, 'jitter': 0.05, 'adaptive_jitter': True, 'cost': {'name': 'tokens', 'unit': 'tokens', 'const': 0.0, 'padded': 1.0, 'padded_sq': 0.0, 'tokens': 0.0, 'tokens_sq': 0.0}}},  # noqa: E501
    'budget_attention': {'sampler': 'DistributedTokenBudgetSampler', 'version': 2, 'epoch': 0, 'step': 0, 'stages': [[2, 0]], 'seed': 2, 'num_replicas': 2, 'num_samples': 41, 'lengths_digest': '038ae781ebaf0960', 'config': {'max_cost': 300.0, 'oversize': 'error', 'shuffle': False, 'drop_last': True, 'jitter': 0.05, 'adaptive_jitter': True, 'cost': {'name': 'attention(d_model=1024)', 'unit': 'token-equivalents', 'const': 0.0, 'padded': 1.0, 'padded_sq': 0.00016276041666666666, 'tokens': 0.0, 'tokens_sq': 0.0}}},  # noqa: E501
}


class _FakeStream:
    """A seq_len-like BatchStream whose fields come first in the state (as TokenStream's do)."""

    def num_batches(self, epoch: int, prior: tuple[Stage, ...] = ()) -> int:
        return 7 - sum(s.batches for s in prior) // 2

    def state(self, epoch: int, batches: int, prior: tuple[Stage, ...] = ()) -> dict[str, Any]:
        return {"seq_len": 8, "tokens": 100 * batches + 10 * len(prior)}

    def check_state(self, state: Any) -> None:
        pass

    def check_stages(self, epoch: int, stages: tuple[Stage, ...]) -> None:
        pass


def _consume(c: EpochCursor, n: int) -> None:
    it = c.run(lambda p: iter(range(p.start, 10**6)))
    for _ in range(n):
        next(it)


_SPEC1 = dict(seed=4, shuffle_block=8)
_LENGTHS = np.random.default_rng(5).integers(5, 90, size=41)


def _cursor(rank: int, world: int, batch: int, **kw: Any) -> EpochCursor:
    return EpochCursor(plan_spec([[5, 5, 3]], **_SPEC1), fingerprints=["ab12"], batch_size=batch,
                       **{"drop_last": False, **kw}, rank=rank, world_size=world)


def _budget(world: int, rank: int, **kw: Any) -> DistributedTokenBudgetSampler:
    return DistributedTokenBudgetSampler(_LENGTHS, max_cost=300, num_replicas=world, rank=rank, seed=2, jitter=0.05,
                                         drop_last=True, shuffle=False, **kw)


def _today() -> dict[str, dict[str, Any]]:
    """The states the pinned dicts were built from, built again the same way."""
    out = {}
    c = _cursor(1, 3, 2)
    out["loader_fresh"] = c.state_dict()
    _consume(c, 1)
    out["loader_mid"] = c.state_dict()
    e = _cursor(0, 2, 1, drop_last=True, pad=False)
    e.load_state_dict(out["loader_mid"])
    _consume(e, 2)
    out["loader_elastic"] = e.state_dict()
    spec = plan_spec([[6, 4], Selection.from_kept([3, 3], np.array([0, 2, 3, 5]))], weights=[0.75, 0.25],
                     epoch_samples=12, seed=9, shuffle=False, shuffle_block=3)
    m = EpochCursor(spec, fingerprints=["aa", "bb"], batch_size=2, drop_last=True, rank=0, world_size=2)
    m.set_epoch(2)
    _consume(m, 1)
    out["loader_mixed"] = m.state_dict()
    legacy = _cursor(2, 3, 2)
    legacy.load_state_dict({"fastfeed_loader": 1, "epoch": 0, "batches": 1, "seed": 4, "world_size": 3, "rank": 0,
                            "batch_size": 2, "drop_last": False, "shuffle": True, "shuffle_block": 8,
                            "dataset": "ab12", "num_samples": 13})  # version 1, mid-epoch, with padding
    out["loader_legacy"] = legacy.state_dict()  # that epoch still saves version 1
    _consume(legacy, 1)
    out["loader_legacy_next"] = legacy.state_dict()
    s = EpochCursor(plan_spec([[5, 5, 3]], **_SPEC1), fingerprints=["ab12"], batch_size=2, drop_last=False,
                    rank=0, world_size=2, stream=_FakeStream())
    _consume(s, 2)
    out["loader_stream"] = s.state_dict()
    b = DistributedLengthBucketSampler(_LENGTHS, batch_size=3, num_replicas=2, rank=1, seed=7)
    out["bucket_fresh"] = b.state_dict()
    b.set_epoch(1)
    it = iter(b)
    next(it), next(it)
    out["bucket_mid"] = b.state_dict()
    out["bucket_steps"] = b.state_dict(steps=1)
    t = _budget(3, 0)
    t.set_epoch(3)
    next(iter(t))
    out["budget_mid"] = t.state_dict()
    u = _budget(2, 1)
    u.load_state_dict(out["budget_mid"])
    next(iter(u))
    out["budget_elastic"] = u.state_dict()
    out["budget_attention"] = _budget(2, 1, cost="attention").state_dict()
    return out


def test_the_written_formats_are_pinned() -> None:
    today = _today()
    assert today.keys() == PINNED.keys()
    for name, state in today.items():
        assert state == PINNED[name], name
        assert json.dumps(state) == json.dumps(PINNED[name]), name  # the key order too


@pytest.mark.parametrize("name, fresh", [
    ("loader_mid", lambda: _cursor(1, 3, 2)),
    ("loader_elastic", lambda: _cursor(0, 2, 1, drop_last=True, pad=False)),
    ("loader_legacy", lambda: _cursor(2, 3, 2)),
    ("loader_legacy_next", lambda: _cursor(2, 3, 2)),
    ("bucket_mid", lambda: DistributedLengthBucketSampler(_LENGTHS, batch_size=3, num_replicas=2, rank=1, seed=7)),
    ("budget_elastic", lambda: _budget(2, 1)),
])
def test_a_state_saved_before_loads_and_is_saved_again_unchanged(name: str, fresh: Callable[[], Any]) -> None:
    obj = fresh()
    obj.load_state_dict(json.loads(json.dumps(PINNED[name])))
    assert obj.state_dict() == PINNED[name]


# ---------------------------------------------------------------------- the harness
@dataclass(frozen=True)
class Shape:
    """A world shape: ranks, this rank, batch size (or max_cost / 100), remainder mode."""

    world: int
    rank: int
    batch: int
    mode: str  # "pad", "exact" or "drop"

    def __str__(self) -> str:
        return f"w{self.world}r{self.rank}b{self.batch}{self.mode}"


@dataclass(frozen=True)
class Stateful:
    """One stateful class under the harness.

    Attributes:
        name: for test ids.
        make: a fresh object at a shape (and the data root, for the file-backed loader).
        run: the items of one pass (after ``set_epoch``).
        version_key, count_key: the state's version field and position field.
        to_v1: the version-1 form of a state (None: that state has none).
        v1_exact: whether a version-1 state resumes the same items as the version-2 one
            (the loader plans a mid-epoch padded version-1 epoch the old way).
        shapes: the world shapes it runs at.
    """

    name: str
    make: Callable[[Shape, Path], Any]
    run: Callable[[Any], Iterator[Any]]
    version_key: str
    count_key: str
    to_v1: Callable[[dict[str, Any]], dict[str, Any] | None]
    v1_exact: Callable[[Shape, dict[str, Any]], bool]
    shapes: tuple[Shape, ...]


_SHARDS = [5, 0, 7, 6, 5]  # 23 samples
_V1_KEYS = ("epoch", "batches", "seed", "world_size", "rank", "batch_size", "drop_last", "shuffle", "shuffle_block",
            "dataset", "num_samples")


def _loader_v1(state: dict[str, Any]) -> dict[str, Any] | None:
    if state["stages"][-1][2] == "exact" or len(state["stages"]) > 1:
        return None  # version 1 had no pad=False, and one stage
    return {"fastfeed_loader": 1, **{k: state[k] for k in _V1_KEYS}}


def _loader_v1_exact(shape: Shape, state: dict[str, Any]) -> bool:
    n = -(-(-(-sum(_SHARDS) // shape.world)) // shape.batch)
    return shape.mode == "drop" or sum(_SHARDS) % shape.world == 0 or state["batches"] in (0, n)


def _make_cursor(shape: Shape, root: Path) -> EpochCursor:
    return EpochCursor(plan_spec([_SHARDS], seed=3, shuffle_block=4), fingerprints=["f00d"], batch_size=shape.batch,
                       drop_last=shape.mode == "drop", pad=shape.mode == "pad", rank=shape.rank,
                       world_size=shape.world)


def _run_cursor(c: EpochCursor) -> Iterator[Any]:
    def open_pass(p: Any) -> Iterator[Any]:
        plan = c.plan(p.epoch)
        for b in range(p.start, plan.num_batches):
            ids, src, valid = plan.batch(b)
            yield tuple(zip(src.tolist(), ids.tolist(), valid.tolist()))
    return c.run(open_pass)


def _make_loader(shape: Shape, root: Path) -> Any:
    return fastfeed.loader(root, batch_size=shape.batch, num_workers=0, decode=None, seed=5, rank=shape.rank,
                           world_size=shape.world, drop_last=shape.mode == "drop", pad=shape.mode == "pad")


def _sampler_v1(state: dict[str, Any]) -> dict[str, Any] | None:
    if len(state["stages"]) > 1:
        return None
    return {**{k: v for k, v in state.items() if k != "stages"}, "version": 1}


def _make_sampler(kind: str) -> Callable[[Shape, Path], Any]:
    lengths = np.random.default_rng(7).integers(5, 300, size=97)
    sizes = np.random.default_rng(8).integers(40, 400, size=(97, 2))

    def make(shape: Shape, root: Path) -> Any:
        common = dict(num_replicas=shape.world, rank=shape.rank, seed=3, jitter=0.03, drop_last=shape.mode == "drop")
        if kind == "aspect":
            common.pop("jitter")
            return DistributedAspectRatioSampler(sizes, resolution=128, batch_size=shape.batch, max_upscale=None,
                                                 **common)
        if kind == "bucket":
            return DistributedLengthBucketSampler(lengths, batch_size=shape.batch, **common)
        return DistributedTokenBudgetSampler(lengths, max_cost=300 * shape.batch, **common)
    return make


def _shapes(worlds: tuple[int, ...], batches: tuple[int, ...], modes: tuple[str, ...]) -> tuple[Shape, ...]:
    return tuple(Shape(w, r, b, m) for w in worlds for r in sorted({0, w - 1}) for b in batches for m in modes)


CASES = (
    Stateful("cursor", _make_cursor, _run_cursor, "fastfeed_loader", "batches", _loader_v1, _loader_v1_exact,
             _shapes((1, 2, 3, 5), (1, 3), ("pad", "exact", "drop"))),
    Stateful("loader", _make_loader, iter, "fastfeed_loader", "batches", _loader_v1, _loader_v1_exact,
             _shapes((1, 3), (2,), ("pad", "drop"))),
    Stateful("bucket", _make_sampler("bucket"), iter, "version", "step", _sampler_v1, lambda s, st: True,
             _shapes((1, 2, 3, 5), (2, 5), ("pad", "drop"))),
    Stateful("budget", _make_sampler("budget"), iter, "version", "step", _sampler_v1, lambda s, st: True,
             _shapes((1, 2, 4), (2,), ("pad", "drop"))),
    Stateful("aspect", _make_sampler("aspect"), iter, "version", "step", _sampler_v1, lambda s, st: True,
             _shapes((1, 2, 5), (3,), ("pad", "drop"))),
)
EPOCHS = 2
_PARAMS = [pytest.param(case, shape, id=f"{case.name}-{shape}") for case in CASES for shape in case.shapes]
_ONE_EACH = [pytest.param(case, case.shapes[-1], id=case.name) for case in CASES]


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("state") / "data"
    write_dataset(path, shard_counts=_SHARDS)
    return path


def _norm(item: Any) -> Any:
    """A loader batch as its keys; plan items and sampler batches as they are."""
    return tuple(item["__key__"]) if isinstance(item, dict) else item


def _stream(case: Stateful, obj: Any, first_epoch: int = 0) -> Iterator[tuple[int, Any]]:
    for epoch in range(first_epoch, EPOCHS):
        obj.set_epoch(epoch)
        for item in case.run(obj):
            yield epoch, _norm(item)


def _saved_at(case: Stateful, shape: Shape, root: Path, stop: int) -> tuple[list[tuple[int, Any]], dict[str, Any]]:
    """The first ``stop`` items of a run, and its state then (through JSON, as a checkpoint)."""
    obj = case.make(shape, root)
    head = []
    for got in _stream(case, obj):
        head.append(got)
        if len(head) == stop:
            break
    return head, json.loads(json.dumps(obj.state_dict()))


def _rest(case: Stateful, shape: Shape, root: Path, state: dict[str, Any]) -> list[tuple[int, Any]]:
    obj = case.make(shape, root)
    obj.load_state_dict(state)
    return list(_stream(case, obj, state["epoch"]))


@pytest.mark.parametrize("case, shape", _PARAMS)
def test_save_mid_epoch_restore_fresh_and_the_rest_of_the_stream_is_the_same(case: Stateful, shape: Shape,
                                                                             root: Path) -> None:
    ref = list(_stream(case, case.make(shape, root)))
    per_epoch = len(ref) // EPOCHS
    stops = sorted({1, per_epoch // 2, per_epoch, per_epoch + 1, len(ref) - 1} & set(range(1, len(ref))))
    for stop in stops:
        head, state = _saved_at(case, shape, root, stop)
        assert state[case.version_key] == 2
        assert head + _rest(case, shape, root, state) == ref, stop
        v1 = case.to_v1(state)
        if v1 is not None:  # the version-1 form of the same state: its one stage
            rest = _rest(case, shape, root, v1)
            assert len(rest) == len(ref) - stop
            if case.v1_exact(shape, state):
                assert head + rest == ref, stop


@pytest.mark.parametrize("case, shape", _PARAMS)
def test_a_state_resumes_at_another_world_size_with_one_more_stage(case: Stateful, shape: Shape, root: Path) -> None:
    ref = list(_stream(case, case.make(shape, root)))
    _, state = _saved_at(case, shape, root, max(1, len(ref) // EPOCHS // 2))
    other = Shape(shape.world % 3 + 1, 0, shape.batch, shape.mode)
    rests = []
    for rank in range(other.world):
        obj = case.make(Shape(other.world, rank, other.batch, other.mode), root)
        obj.load_state_dict(state)
        obj.set_epoch(state["epoch"])
        rests.append([_norm(x) for x in case.run(obj)])
        again = obj.state_dict()
        assert again["stages"][:-1] == state["stages"] and again["stages"][-1][-1] == len(rests[-1])
    assert len({len(r) for r in rests}) == 1  # every new rank runs the same steps


@pytest.mark.parametrize("case, shape", _ONE_EACH)
def test_a_bad_state_is_refused_and_leaves_the_object_as_it_was(case: Stateful, shape: Shape, root: Path) -> None:
    _, state = _saved_at(case, shape, root, 2)
    vk, ck, count, epoch = case.version_key, case.count_key, state[case.count_key], state["epoch"]
    bad = [
        ([state], "takes the dict from"),
        ({**state, vk: 3}, r"version 3, this fastfeed reads 1 and 2: a newer fastfeed saved it; upgrade"),
        ({**state, vk: "2"}, r"version '2', this fastfeed reads 1 and 2; pass the dict from"),
        ({k: v for k, v in state.items() if k != vk}, rf"lacks {vk}"),
        ({k: v for k, v in state.items() if k != ck}, rf"lacks {ck}; pass the dict from"),
        ({k: v for k, v in state.items() if k != "stages"}, r"lacks stages; pass the dict from"),
        ({**state, ck: str(count)}, rf"{ck}='{count}' is not an integer >= 0; .* floats or strings"),
        ({**state, ck: float(count)}, rf"{ck}={float(count)} is not an integer >= 0"),
        ({**state, "epoch": -1}, r"epoch=-1 is not an integer >= 0"),
        ({**state, ck: count + 1}, rf"{ck}={count + 1} but its last stage says {count}"),
        ({**state, "stages": []}, r"stages=\[\] is not a list of"),
        ({**state, "stages": [row[:-2] for row in state["stages"]]}, r"stage 0 is \["),
        ({**state, ck: 10**6, "stages": [[*state["stages"][0][:-1], 10**6]]},
         rf"stage 0 .* past the end of epoch {epoch}"),
        ({**state, "seed": state["seed"] + 1}, r"does not fit this .*seed.*now"),
    ]
    obj = case.make(shape, root)
    before = obj.state_dict()
    for s, match in bad:
        with pytest.raises(StateError, match=match):
            obj.load_state_dict(s)
        assert obj.state_dict() == before, match
