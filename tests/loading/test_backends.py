"""ONE behavioural harness for every loader backend: ``decode="cpu"`` and ``decode="dali"``
(DALI in its CPU-only mode, ``device_id=None``; skipped without DALI).

Every test runs both backends through the same assertions, against the rank plan
(:func:`fastfeed.loading.order.rankplan.plan_rank`, a pure function) rather than against each
other: epochs with and without ``set_epoch``, abandoned passes, the newest iterator,
mid-epoch resume in a fresh loader, resume across backends, equal steps on every rank
(ranks simulated with ``rank=``/``world_size=``; the real gloo tests are in
test_loader_dist.py and test_dali.py), ``len()``, and ``on_error="skip"`` counting.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
import numpy as np
from loading.dali._dali_data import DALI_CPU, corrupt_samples, require_dali, tar_dataset

import fastfeed
from fastfeed.errors import ConfigError, FastfeedError, SampleError
from fastfeed.loading.order.rankplan import plan_rank, plan_spec
from fastfeed.packed.index import DatasetIndex
from tools.synth import make_jpeg

pytestmark = pytest.mark.usefixtures("isolated_store")  # see tests/conftest.py

BACKENDS = ["cpu", "dali"]
BATCH, SEED = 7, 13


@pytest.fixture(scope="module")
def packed(small_image_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The 60 photo-like JPEGs of conftest's image folder, packed into 4 tar shards."""
    out = tmp_path_factory.mktemp("backends") / "ff"
    fastfeed.pack(small_image_folder, out, samples_per_shard=16)
    return out


@pytest.fixture(scope="module")
def corrupt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tar_dataset(tmp_path_factory.mktemp("backends_bad") / "ff", corrupt_samples(), 6)


@pytest.fixture(scope="module")
def other(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A second image dataset to mix with ``packed``: 21 JPEGs keyed m000..m020, labels 5..7."""
    rng = np.random.default_rng(11)
    samples = [(f"m{i:03d}", {"jpg": make_jpeg(rng, (40, 30)), "cls": b"%d" % (5 + i % 3)}) for i in range(21)]
    return tar_dataset(tmp_path_factory.mktemp("backends_other") / "ff", samples, 8,
                       labels=[5 + i % 3 for i in range(21)])


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    if request.param == "dali":
        require_dali()
    return str(request.param)


def make(root: Path | list[Path], backend: str, *, weights: list[float] | None = None, subset: Any = None,
         filter: Any = None, **kw: Any) -> Any:
    """A loader of ``backend`` over ``root`` (a list: mixed with ``weights``, as fastfeed.Source objects;
    ``subset`` / ``filter``: the selection of the one dataset); the same arguments otherwise."""
    args: dict[str, Any] = dict(batch_size=BATCH, image_size=16, seed=SEED)
    args.update(dict(DALI_CPU) if backend == "dali" else dict(decode="cpu", num_workers=0))
    args.update(kw)
    if isinstance(root, list):
        sources = [fastfeed.Source(str(r), weight=w) for r, w in zip(root, weights or (), strict=True)]
        return fastfeed.loader(sources, **args)
    if subset is None and filter is None:
        return fastfeed.loader(str(root), **args)
    return fastfeed.loader(fastfeed.Source(str(root), subset=subset, filter=filter), **args)


def keys(batches: Any) -> list[list[str]]:
    return [list(b["__key__"]) for b in batches]


_INDEX_KEYS: dict[Path, list[str]] = {}


def expected(root: Path, epoch: int, *, rank: int = 0, world_size: int = 1, drop_last: bool = False,
             batch_size: int = BATCH, seed: int = SEED) -> list[list[str]]:
    """The keys of each batch of ``epoch`` on ``rank``, from the plan and the index order."""
    if root not in _INDEX_KEYS:
        raw = fastfeed.loader(str(root), batch_size=1000, shuffle=False, decode=None, num_workers=0)
        _INDEX_KEYS[root] = [k for b in raw for k in b["__key__"]]
    names = _INDEX_KEYS[root]
    spec = plan_spec([DatasetIndex.load(root).shard_counts], seed=seed, shuffle=True)
    plan = plan_rank(spec, epoch=epoch, world_size=world_size, rank=rank, batch_size=batch_size,
                     drop_last=drop_last)
    return [[names[i] for i in plan.batch(b).ids.tolist()] for b in range(plan.num_batches)]


# ---------------------------------------------------------------------- epochs
def test_passes_without_set_epoch_run_epoch_after_epoch(packed: Path, backend: str) -> None:
    dl = make(packed, backend)
    assert dl.epoch == 0
    for epoch in range(3):
        assert keys(dl) == expected(packed, epoch) and dl.epoch == epoch


def test_set_epoch_picks_the_next_pass(packed: Path, backend: str) -> None:
    dl = make(packed, backend)
    dl.set_epoch(5)
    assert keys(dl) == expected(packed, 5)
    assert keys(dl) == expected(packed, 6)  # no set_epoch: the next epoch
    dl.set_epoch(5)
    assert keys(dl) == expected(packed, 5) and dl.epoch == 5  # replayed
    for bad in (-1, True, "1", 1.0):
        with pytest.raises(ConfigError, match="set_epoch"):
            dl.set_epoch(bad)


def test_a_new_pass_after_an_abandoned_one_is_the_next_epoch(packed: Path, backend: str) -> None:
    """``while True: for b in dl: ...; break`` sees a new epoch every time, as with a
    shuffling DataLoader; ``set_epoch`` replays an abandoned epoch."""
    dl = make(packed, backend)
    firsts = []
    for _ in range(3):
        for batch in dl:
            firsts.append(list(batch["__key__"]))
            break
    assert firsts == [expected(packed, e)[0] for e in range(3)] and dl.epoch == 2
    assert keys(dl) == expected(packed, 3)
    it = iter(dl)
    head = [list(next(it)["__key__"]) for _ in range(2)]
    it.close()
    assert head == expected(packed, 4)[:2] and dl.state_dict()["batches"] == 2
    dl.set_epoch(4)
    assert keys(dl) == expected(packed, 4)


def test_limited_batches_per_epoch_as_lightning_runs_them(packed: Path, backend: str) -> None:
    """Lightning's ``limit_train_batches=N``: N batches, then a new ``iter()`` next epoch,
    with or without a ``set_epoch`` call reaching the loader: the same batches. An
    iterator that is never advanced (Lightning's iterability check) is no pass."""
    n = 2
    for call_set_epoch in (False, True):
        dl = make(packed, backend)
        iter(dl)  # Lightning's check that a loader (not a DataLoader) is iterable: no pass
        for epoch in range(3):
            if call_set_epoch:
                dl.set_epoch(epoch)
            it = iter(dl)
            assert [list(next(it)["__key__"]) for _ in range(n)] == expected(packed, epoch)[:n]


def test_only_the_newest_pass_delivers(packed: Path, backend: str) -> None:
    dl = make(packed, backend)
    first = iter(dl)
    next(first)
    second, third = iter(dl), iter(dl)  # passes begin at their first next()
    got = [list(next(second)["__key__"])]
    with pytest.raises(FastfeedError, match="iterated again"):
        next(first)
    got += keys(second)
    assert got == expected(packed, 1) and dl.state_dict()["batches"] == len(dl)
    assert keys(third) == expected(packed, 2) and dl.epoch == 2


# ---------------------------------------------------------------------- resume
@pytest.mark.parametrize("stop", [0, 3, "end"])
def test_resume_mid_epoch_in_a_fresh_loader(packed: Path, backend: str, stop: int | str) -> None:
    dl = make(packed, backend, rank=1, world_size=2)
    want = expected(packed, 1, rank=1, world_size=2)
    k = len(want) if stop == "end" else int(stop)
    dl.set_epoch(1)
    it = iter(dl)
    head = [list(next(it)["__key__"]) for _ in range(k)]
    state = json.loads(json.dumps(dl.state_dict()))  # plain ints and strings
    assert (state["epoch"], state["batches"], state["fastfeed_loader"]) == (1, k, 2)
    fresh = make(packed, backend, rank=0, world_size=2)  # another rank's state fits
    fresh.load_state_dict(state)
    fresh_other_rank = make(packed, backend, rank=1, world_size=2)
    fresh_other_rank.load_state_dict(state)
    rest = keys(fresh_other_rank)
    if k < len(want):
        assert head + rest == want and fresh_other_rank.epoch == 1
        assert keys(fresh_other_rank) == expected(packed, 2, rank=1, world_size=2)  # then the next epoch
    else:  # saved after the epoch's last batch: the next pass is the next epoch
        assert head == want and rest == expected(packed, 2, rank=1, world_size=2)
    assert keys(fresh) == (expected(packed, 1, rank=0, world_size=2)[k:] if k < len(want)
                           else expected(packed, 2, rank=0, world_size=2))


@pytest.mark.parametrize("first,second", [("cpu", "dali"), ("dali", "cpu")])
def test_resume_across_backends(packed: Path, first: str, second: str) -> None:
    require_dali()
    a = make(packed, first)
    a.set_epoch(2)
    it = iter(a)
    head = [next(it) for _ in range(3)]
    state = a.state_dict()
    b = make(packed, second)
    assert set(b.state_dict()) == set(state)
    assert {k: v for k, v in b.state_dict().items() if k not in ("epoch", "batches", "stages")} == \
        {k: v for k, v in state.items() if k not in ("epoch", "batches", "stages")}
    b.load_state_dict(state)
    rest = list(b)
    assert keys(head) + keys(rest) == expected(packed, 2) and b.epoch == 2
    labels = [int(x) for batch in head + rest for x in batch["label"].tolist()]
    ref = make(packed, "cpu")
    ref.set_epoch(2)
    assert labels == [int(x) for batch in ref for x in batch["label"].tolist()]


# ---------------------------------------------------------------------- ranks and len
@pytest.mark.parametrize("world_size,drop_last", [(2, False), (3, True), (7, False)])
def test_equal_steps_on_every_rank(packed: Path, backend: str, world_size: int, drop_last: bool) -> None:
    loaders = [make(packed, backend, rank=r, world_size=world_size, drop_last=drop_last)
               for r in range(world_size)]
    streams = [keys(dl) for dl in loaders]
    assert {len(dl) for dl in loaders} == {len(s) for s in streams} and len({len(s) for s in streams}) == 1
    for r, s in enumerate(streams):
        assert s == expected(packed, 0, rank=r, world_size=world_size, drop_last=drop_last)
    counts = Counter(k for s in streams for b in s for k in b)
    if drop_last:
        assert max(counts.values()) == 1 and 60 - len(counts) < world_size * BATCH
    else:
        assert len(counts) == 60 and sum(counts.values()) - 60 <= world_size - 1


@pytest.mark.parametrize("batch_size,world_size,drop_last", [(7, 1, False), (7, 1, True), (4, 3, False),
                                                             (5, 4, True), (60, 1, False)])
def test_len_is_the_batches_of_an_epoch(packed: Path, backend: str, batch_size: int, world_size: int,
                                        drop_last: bool) -> None:
    dl = make(packed, backend, batch_size=batch_size, rank=world_size - 1, world_size=world_size,
              drop_last=drop_last)
    per_rank = 60 // world_size if drop_last else math.ceil(60 / world_size)
    n = per_rank // batch_size if drop_last else math.ceil(per_rank / batch_size)
    assert len(dl) == n == len(list(dl))
    saved = dl.state_dict()
    state = {**saved, "epoch": 0, "batches": n - 1, "stages": [saved["stages"][-1][:3] + [n - 1]]}
    dl.load_state_dict(state)
    assert len(dl) == n and len(list(dl)) == 1  # len is the epoch's, a resumed pass yields the rest


# ---------------------------------------------------------------------- bad samples
def test_skip_counts_bad_samples_and_keeps_steps_equal(corrupt: Path, backend: str) -> None:
    ranks = [make(corrupt, backend, batch_size=4, world_size=2, rank=r, on_error="skip") for r in range(2)]
    for epoch in range(2):
        streams = []
        for dl in ranks:
            dl.set_epoch(epoch)
            streams.append(keys(dl))
        assert [len(s) for s in streams] == [len(dl) for dl in ranks] == [2, 2]
        for r, s in enumerate(streams):
            want = expected(corrupt, epoch, rank=r, world_size=2, batch_size=4)
            assert s == [[k for k in b if k not in ("k005", "k009")] for b in want]
    assert sum(dl.stats.skipped for dl in ranks) == 4  # two bad samples, two epochs
    messages = [m for dl in ranks for m in dl.stats.skip_messages]
    assert any("k005" in m for m in messages) and any("k009" in m for m in messages)
    with pytest.raises(SampleError, match="k00[59]"):
        list(make(corrupt, backend, batch_size=4, on_error="raise"))


# ---------------------------------------------------------------------- issue #18: selection, valid, elastic
def _valid_keys(batches: Any) -> list[str]:
    return [k for b in batches for k, v in zip(b["__key__"], b["valid"].tolist()) if v]


def test_batches_carry_valid_and_source(packed: Path, backend: str) -> None:
    expected(packed, 0)  # fills _INDEX_KEYS
    ranks = [make(packed, backend, rank=r, world_size=7) for r in range(7)]  # 60 over 7: 3 padding slots
    streams = [list(dl) for dl in ranks]
    for s in streams:
        for b in s:
            assert b["valid"].dtype == torch.bool and b["__source__"].dtype == torch.int64
            assert len(b["valid"]) == len(b["__source__"]) == len(b["__key__"]) and not b["__source__"].any()
    assert sum(int((~b["valid"]).sum()) for s in streams for b in s) == 3
    assert sorted(_valid_keys(b for s in streams for b in s)) == sorted(_INDEX_KEYS[packed])


def test_subset_and_filter(packed: Path, backend: str) -> None:
    expected(packed, 0)  # fills _INDEX_KEYS
    names = _INDEX_KEYS[packed]
    labels = DatasetIndex.load(packed).labels
    dl = make(packed, backend, filter=lambda m: m["label"] == int(labels[0]), batch_size=100)
    want = sorted(n for n, lab in zip(names, labels) if lab == labels[0])
    assert sorted(k for b in dl for k in b["__key__"]) == want and len(dl) == 1
    some = make(packed, backend, subset=[5, 0, 59])
    assert sorted(k for b in some for k in b["__key__"]) == sorted(names[i] for i in (0, 5, 59))


def test_pad_false_every_sample_once_with_an_empty_last_batch(packed: Path, backend: str) -> None:
    """60 over 7 ranks, batches of 3: spans of 8 and 9 -> 3 steps; an 8-sample rank ends with 2."""
    expected(packed, 0)
    ranks = [make(packed, backend, rank=r, world_size=7, batch_size=3, pad=False) for r in range(7)]
    streams = [list(dl) for dl in ranks]
    assert {len(s) for s in streams} == {len(ranks[0])} == {3}
    assert sorted(k for s in streams for b in s for k in b["__key__"]) == sorted(_INDEX_KEYS[packed])
    empty = list(make(packed, backend, rank=0, world_size=16, batch_size=3, pad=False))[-1]  # 3 of 2 steps
    assert empty["__key__"] == [] and empty["valid"].shape == (0,) and empty["label"].shape == (0,)
    assert empty["image"].shape[0] == 0


@pytest.mark.parametrize("pad", [True, False])
def test_elastic_resume_at_another_world_and_batch_size(packed: Path, backend: str, pad: bool) -> None:
    expected(packed, 0)
    old = [make(packed, backend, rank=r, world_size=3, batch_size=4, pad=pad) for r in range(3)]
    head: list[str] = []
    for dl in old:
        dl.set_epoch(2)
        it = iter(dl)
        head += _valid_keys([next(it), next(it)])
    state = json.loads(json.dumps(old[1].state_dict()))
    new = [make(packed, backend, rank=r, world_size=2, batch_size=5) for r in range(2)]
    streams = []
    for dl in new:
        dl.load_state_dict(state)
        streams.append(list(dl))
    assert len({len(s) for s in streams}) == 1
    assert sorted(head + _valid_keys(b for s in streams for b in s)) == sorted(_INDEX_KEYS[packed])
    assert all(dl.epoch == 2 for dl in new)
    assert keys(new[0]) == expected(packed, 3, rank=0, world_size=2, batch_size=5)  # then a fresh run's


def _index_keys(root: Path) -> list[str]:
    if root not in _INDEX_KEYS:
        expected(root, 0)
    return _INDEX_KEYS[root]


def mixed_expected(roots: list[Path], weights: list[float], epoch: int, *, rank: int = 0, world_size: int = 1,
                   batch_size: int = BATCH) -> list[list[tuple[int, str]]]:
    """Per batch of ``epoch`` on ``rank``: (dataset, key) of each sample, from the plan."""
    names = [_index_keys(r) for r in roots]
    spec = plan_spec([DatasetIndex.load(r).shard_counts for r in roots], weights=weights, seed=SEED)
    plan = plan_rank(spec, epoch=epoch, world_size=world_size, rank=rank, batch_size=batch_size)
    return [[(k, names[k][i]) for i, k in zip(plan.batch(b).ids.tolist(), plan.batch(b).source.tolist())]
            for b in range(plan.num_batches)]


def sourced(batches: Any, valid_only: bool = False) -> list[list[tuple[int, str]]]:
    return [[(int(s), k) for s, k, v in zip(b["__source__"].tolist(), b["__key__"], b["valid"].tolist())
             if v or not valid_only] for b in batches]


def test_mixing(packed: Path, other: Path, backend: str) -> None:
    """Both backends deliver the shared mixing plan: per batch the same (dataset, key)
    pairs, ``__source__`` and labels as the CPU path, in the weights' proportions."""
    roots, weights = [packed, other], [3.0, 1.0]
    dl = make(roots, backend, weights=weights, batch_size=4)
    batches = list(dl)
    assert sourced(batches) == mixed_expected(roots, weights, 0, batch_size=4) and len(dl) == len(batches)
    src = [s for b in batches for s in b["__source__"].tolist()]
    assert src.count(0) == 60 and src.count(1) == 20
    assert all(int((b["__source__"] == 1).sum()) == 1 for b in batches)  # 4 * 1/4 per batch
    cpu = list(make(roots, "cpu", weights=weights, batch_size=4))
    assert [b["__source__"].tolist() for b in batches] == [b["__source__"].tolist() for b in cpu]
    assert [b["label"].tolist() for b in batches] == [b["label"].tolist() for b in cpu]
    assert {int(x) for b in batches for x, s in zip(b["label"].tolist(), b["__source__"].tolist()) if s} <= {5, 6, 7}


def test_mixing_resumes_mid_epoch_and_elastically(packed: Path, other: Path, backend: str) -> None:
    roots, weights = [packed, other], [2.0, 1.0]
    old = [make(roots, backend, weights=weights, rank=r, world_size=2) for r in range(2)]
    head: list[list[tuple[int, str]]] = []
    for dl in old:
        dl.set_epoch(1)
        it = iter(dl)
        head += sourced([next(it), next(it)], valid_only=True)
    state = json.loads(json.dumps(old[0].state_dict()))
    same = make(roots, backend, weights=weights, rank=1, world_size=2)  # the same shape: the rest of rank 1
    same.load_state_dict(state)
    assert sourced(same) == mixed_expected(roots, weights, 1, rank=1, world_size=2)[2:]
    alone = make(roots, backend, weights=weights, world_size=1, batch_size=5)  # 2 ranks -> 1
    alone.load_state_dict(state)
    rest = sourced(alone, valid_only=True)
    full = [p for b in mixed_expected(roots, weights, 1, world_size=1, batch_size=60) for p in b]
    assert sorted(p for b in head + rest for p in b) == sorted(full) and alone.epoch == 1
    assert sourced(alone) == mixed_expected(roots, weights, 2, batch_size=5)  # then a fresh run's


def test_dali_mixing_needs_image_datasets(packed: Path, tmp_path: Path) -> None:
    require_dali()
    text = tar_dataset(tmp_path / "text", [(f"t{i}", {"txt": b"words", "cls": b"1"}) for i in range(6)], 3,
                       labels=[1] * 6)
    with pytest.raises(ConfigError, match=f"{text}.*no image field DALI decodes.*fields: cls, txt"):
        make([packed, text], "dali", weights=[1, 1])
    rng = np.random.default_rng(2)
    unlabelled = tar_dataset(tmp_path / "unlabelled", [(f"u{i}", {"jpg": make_jpeg(rng, (20, 16))}) for i in range(3)],
                             3)
    with pytest.raises(ConfigError, match="mixed datasets differ in labels.*decode='dali' batches"):
        make([packed, unlabelled], "dali", weights=[1, 1])
    with pytest.raises(ConfigError, match="decode='dali' reads packed datasets.*not a list of tars"):
        fastfeed.loader([fastfeed.Source([str(packed)], weight=1), fastfeed.Source(str(text), weight=1)],
                        batch_size=BATCH, image_size=16, **DALI_CPU)
