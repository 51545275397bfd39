"""``fastfeed.loader()`` over several datasets, subsets and filters, ``pad=False``, ``valid``,
and elastic resume, on real packed datasets (tar and LMDB) with real DataLoader workers.

The planner itself is tested in test_mixing.py / test_elastic.py / test_selection.py;
here the wiring: what batches carry, that every rank and worker count sees the plan, and
that states move between shapes. Samples are named ``(source, key)`` (the datasets'
keys overlap).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from _loader_data import image_fields, write_dataset

import fastfeed
from fastfeed.errors import ConfigError, StateError
from fastfeed.loading.order.epoch import plan_epoch

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create")


def _named(prefix: str):  # type: ignore[no-untyped-def]
    def fields(i: int, rng: np.random.Generator) -> dict[str, bytes]:
        return {"txt": f"{prefix}{i}".encode(), "cls": str(i % 5).encode()}
    return fields


@pytest.fixture(scope="module")
def two(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A: 25 samples in 4 tar shards; B: 10 samples in 2 (LMDB: test_mixed_images_decode_together)."""
    root = tmp_path_factory.mktemp("mix")
    write_dataset(root / "a", shard_counts=(7, 7, 7, 4), fields=_named("a"))
    write_dataset(root / "b", shard_counts=(5, 5), fields=_named("b"))
    return root / "a", root / "b"


def load(paths: Any, **kw: Any) -> Any:
    args: dict[str, Any] = {"batch_size": 4, "decode": None, "num_workers": 0, "seed": 3}
    args.update(kw)
    return fastfeed.loader(paths if not isinstance(paths, tuple) else [str(p) for p in paths], **args)


def mix(paths: Any, weights: list[float]) -> list[fastfeed.Source]:
    """One weighted Source per dataset (a folder, or a list of tars)."""
    return [fastfeed.Source(p if isinstance(p, list) else str(p), weight=w)
            for p, w in zip(paths, weights, strict=True)]


def texts(batch: dict[str, Any]) -> list[str]:
    return [t.decode() if isinstance(t, bytes) else t for t in batch["txt"]]


def samples(batches: Any, *, valid_only: bool = False) -> list[tuple[int, str]]:
    out = []
    for b in batches:
        for s, t, v in zip(b["__source__"].tolist(), texts(b), b["valid"].tolist()):
            if v or not valid_only:
                out.append((s, t))
    return out


# ---------------------------------------------------------------------- mixing
def test_mixed_batches_carry_their_source_in_proportion(two: tuple[Path, Path]) -> None:
    dl = load(mix(two, [0.7, 0.3]))
    batches = list(dl)
    assert len(dl) == len(batches) == 9  # default epoch: A (largest weight) once: 35 positions
    for b in batches:
        assert b["__source__"].dtype == torch.int64 and b["valid"].dtype == torch.bool
        assert [t[0] for t in texts(b)] == ["ab"[s] for s in b["__source__"].tolist()]  # source is right
    got = samples(batches)
    counts = Counter(s for s, _ in got)
    assert counts == {0: 25, 1: 10}
    assert sorted(t for s, t in got if s == 0) == sorted(f"a{i}" for i in range(25))  # A exactly once
    assert all(1 <= int((b["__source__"] == 1).sum()) <= 2 for b in batches[:-1])  # 4 * 0.3 per batch
    # B (10) cycled: 21 = 2 passes + 1
    longer = samples(load(mix(two, [0.7, 0.3]), order=fastfeed.Order(epoch_samples=70)))
    b_seq = [t for s, t in longer if s == 1]
    assert sorted(Counter(b_seq).values()) == [2] * 9 + [3]  # complete passes (shuffled together in a block)
    assert sorted(Counter(t for s, t in longer if s == 0).values()) == [1] + [2] * 24  # 49 = 70 * 0.7


def test_mixing_is_deterministic_and_independent_of_workers(two: tuple[Path, Path]) -> None:
    ref = load(mix(two, [2, 1]), order=fastfeed.Order(epoch_samples=30))
    ref.set_epoch(1)
    want = [samples([b]) for b in ref]
    for workers in (1, 3):
        dl = load(mix(two, [2, 1]), order=fastfeed.Order(epoch_samples=30), num_workers=workers)
        dl.set_epoch(1)
        assert [samples([b]) for b in dl] == want
    other = load(mix(two, [2, 1]), order=fastfeed.Order(epoch_samples=30))
    other.set_epoch(2)
    assert [samples([b]) for b in other] != want


def test_datasets_that_cannot_share_a_batch_are_named(two: tuple[Path, Path], tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="without weights"):
        load(two)  # two packed folders and no weights
    with pytest.raises(ConfigError, match=r"mixes 3 sources and '.*/a' has no weight"):
        load([*mix(two, [1, 2]), fastfeed.Source(str(two[0]))])
    write_dataset(tmp_path / "nolab", shard_counts=(5,), fields=_named("n"), labels=False)
    with pytest.raises(ConfigError, match=r"differ in labels: .*/a record labels .*nolab do not"):
        load(mix((two[0], tmp_path / "nolab"), [1, 1]), decode="cpu")
    raw = list(load(mix((two[0], tmp_path / "nolab"), [1, 1])))  # decode=None: raw cls, no index label
    assert all("label" not in b and len(b["cls"]) == len(b["__key__"]) for b in raw)
    write_dataset(tmp_path / "img", shard_counts=(4,), fields=image_fields)
    with pytest.raises(ConfigError, match=r"/a \(fields cls, txt\) has no image field"):
        load(mix((tmp_path / "img", two[0]), [1, 1]), decode="cpu", image_size=8)
    raw = list(load(mix((tmp_path / "img", two[0]), [1, 1]), order=fastfeed.Order(epoch_samples=8)))  # fields differ
    assert {k for b in raw for k in b} >= {"jpg", "json", "txt"}
    with pytest.raises(ConfigError, match=r"weight=-1\): give a positive number"):
        load(mix(two, [1, -1]))


def test_a_list_of_tars_without_weights_is_still_one_dataset(two: tuple[Path, Path]) -> None:
    tars = sorted(str(p) for p in two[0].glob("*.tar"))
    dl = load(tars, shuffle=False, batch_size=25)
    (b,) = list(dl)
    assert b["__source__"].tolist() == [0] * 25 and sorted(texts(b)) == sorted(f"a{i}" for i in range(25))


def test_webdataset_tars_mix_with_a_packed_dataset(two: tuple[Path, Path]) -> None:
    tars = sorted(str(p) for p in two[0].glob("*.tar"))  # read as WebDataset tars (no index)
    dl = load(mix([tars, two[1]], [1, 1]), order=fastfeed.Order(epoch_samples=20), shuffle=False)
    got = samples(dl)
    assert Counter(s for s, _ in got) == {0: 10, 1: 10} and {t for s, t in got if s == 1} == {f"b{i}" for i in
                                                                                              range(10)}
    assert all(t.startswith("ab"[s]) for s, t in got)


def test_mixed_images_decode_together(tmp_path: Path) -> None:
    write_dataset(tmp_path / "x", shard_counts=(6,), fields=image_fields)
    write_dataset(tmp_path / "y", fmt="lmdb", shard_counts=(3, 3), fields=image_fields)
    dl = fastfeed.loader(mix((tmp_path / "x", tmp_path / "y"), [1, 1]), batch_size=4, image_size=8, num_workers=1,
                         order=fastfeed.Order(epoch_samples=12))
    batches = list(dl)
    assert [tuple(b["image"].shape) for b in batches] == [(4, 3, 8, 8)] * 3
    assert sum(int((b["__source__"] == 1).sum()) for b in batches) == 6


# ---------------------------------------------------------------------- subsets and filters
def test_subset_and_filter_select_samples(two: tuple[Path, Path]) -> None:
    a = str(two[0])
    by_label = load(fastfeed.Source(a, filter=lambda m: m["label"] == 2), batch_size=100)
    assert sorted(t for _, t in samples(by_label)) == sorted(f"a{i}" for i in range(25) if i % 5 == 2)
    assert len(by_label) == 1 and by_label.state_dict()["num_samples"] == 5
    some = load(fastfeed.Source(a, subset=[3, 1, 24]), batch_size=2)
    assert sorted(t for _, t in samples(some)) == ["a1", "a24", "a3"] and len(some) == 2
    mask = np.zeros(25, dtype=bool)
    mask[:10] = True
    both = load(fastfeed.Source(a, subset=mask, filter=lambda m: m["index"] % 2 == 0), batch_size=100)
    assert sorted(t for _, t in samples(both)) == sorted(f"a{i}" for i in range(0, 10, 2))
    with pytest.raises(ConfigError, match="filter leaves no sample"):
        load(fastfeed.Source(a, filter=lambda m: m["label"] > 9))
    with pytest.raises(ConfigError, match="not callable"):
        load(fastfeed.Source(a, filter=3))


def test_a_filter_per_mixed_dataset(two: tuple[Path, Path]) -> None:
    dl = load([fastfeed.Source(str(two[0]), weight=1, filter=lambda m: m["label"] < 2),
               fastfeed.Source(str(two[1]), weight=1, subset=[0, 1, 2, 3])], order=fastfeed.Order(epoch_samples=20))
    got = samples(dl)
    assert {t for s, t in got if s == 0} == {f"a{i}" for i in range(25) if i % 5 < 2}
    assert {t for s, t in got if s == 1} == {"b0", "b1", "b2", "b3"}
    # only the former parallel lists can give a selection that is not one per dataset
    with pytest.warns(FutureWarning, match=r"loader\(weights=, subset=\) is the former spelling"):
        with pytest.raises(ConfigError, match="one per dataset"):
            load(two, weights=[1, 1], subset=[1, 2, 3])


def test_a_state_from_another_selection_or_dataset_is_refused(two: tuple[Path, Path]) -> None:
    state = load(fastfeed.Source(str(two[0]), filter=lambda m: m["label"] < 3)).state_dict()
    with pytest.raises(StateError, match="num_samples=15, now 25.*selection="):
        load(str(two[0])).load_state_dict(state)
    with pytest.raises(StateError, match="dataset=.*weights=None, now"):
        load(mix(two, [1, 1])).load_state_dict(state)


# ---------------------------------------------------------------------- exact-once evaluation
@pytest.mark.parametrize("world,batch", [(3, 3), (4, 2), (7, 5), (2, 25)])
def test_pad_false_every_sample_once_and_equal_steps(two: tuple[Path, Path], world: int, batch: int) -> None:
    ranks = [load(str(two[0]), pad=False, batch_size=batch, rank=r, world_size=world, num_workers=r % 2)
             for r in range(world)]
    streams = [list(dl) for dl in ranks]
    assert len({len(s) for s in streams}) == 1 and {len(dl) for dl in ranks} == {len(streams[0])}
    got = [t for s in streams for _, t in samples(s)]
    assert sorted(got) == sorted(f"a{i}" for i in range(25))
    assert all(b["valid"].all() for s in streams for b in s)


def test_an_empty_batch_is_a_well_formed_dict(tmp_path: Path) -> None:
    """10 samples, 3 ranks, batches of 3: spans 3, 3, 4 -> 2 steps; ranks 0 and 1 end on an empty batch."""
    write_dataset(tmp_path / "img", shard_counts=(10,), fields=image_fields)
    for decode, extra in ((None, {}), ("cpu", {"image_size": 8})):
        last = list(fastfeed.loader(tmp_path / "img", batch_size=3, pad=False, rank=0, world_size=3,
                                    num_workers=0, decode=decode, **extra))[-1]
        assert last["__key__"] == [] and last["valid"].shape == (0,) and last["__source__"].shape == (0,)
        assert last["label"].shape == (0,) and last["label"].dtype == torch.int64
        assert last["json"] == []  # every field, as a full batch has it
        if extra:
            assert tuple(last["image"].shape) == (0, 3, 8, 8) and "jpg" not in last
        else:
            assert last["jpg"] == []


def test_valid_is_false_exactly_on_padding(two: tuple[Path, Path]) -> None:
    ranks = [load(str(two[0]), batch_size=3, rank=r, world_size=4) for r in range(4)]  # 25 -> 28 slots
    all_ = [x for dl in ranks for x in samples(dl)]
    valid = [x for dl in ranks for x in samples(dl, valid_only=True)]
    assert len(all_) == 28 and sorted(t for _, t in valid) == sorted(f"a{i}" for i in range(25))


# ---------------------------------------------------------------------- elastic resume
def _run_to(dls: list[Any], steps: int) -> list[tuple[int, str]]:
    out: list[tuple[int, str]] = []
    for dl in dls:
        it = iter(dl)
        for _ in range(steps):
            out += samples([next(it)], valid_only=True)
    return out


@pytest.mark.parametrize("old,new", [((3, 3, True), (2, 4, True)), ((2, 4, True), (3, 2, False)),
                                     ((4, 2, False), (1, 5, True)), ((3, 3, True), (5, 1, True))])
@pytest.mark.parametrize("mixed", [False, True])
def test_elastic_resume_deals_the_rest_once(two: tuple[Path, Path], old: tuple, new: tuple,
                                            mixed: bool) -> None:
    paths: Any = mix(two, [0.7, 0.3]) if mixed else str(two[0])
    (w, b, pad), (w2, b2, pad2) = old, new
    before = [load(paths, batch_size=b, pad=pad, rank=r, world_size=w) for r in range(w)]
    for dl in before:
        dl.set_epoch(1)
    consumed = _run_to(before, 2)
    state = json.loads(json.dumps(before[-1].state_dict()))
    after = [load(paths, batch_size=b2, pad=pad2, rank=r, world_size=w2, num_workers=r % 2) for r in range(w2)]
    rest = []
    for dl in after:
        dl.load_state_dict(state)
        batches = list(dl)
        assert dl.epoch == 1
        rest.append(batches)
    assert len({len(s) for s in rest}) == 1  # equal steps at the new shape
    full = load(paths, batch_size=1000)
    full.set_epoch(1)
    assert Counter(consumed + [x for s in rest for x in samples(s, valid_only=True)]) == Counter(samples(full))
    padding = sum(int((~bt["valid"]).sum()) for s in rest for bt in s)
    assert padding <= w2 - 1 and (pad2 or padding == 0)
    # a state saved at the new shape resumes there; the next epoch is a fresh run's at the new shape
    fresh = load(paths, batch_size=b2, pad=pad2, rank=0, world_size=w2)
    fresh.set_epoch(2)
    assert samples(after[0]) == samples(fresh)


def test_elastic_resume_chains_and_resumes_at_the_same_shape(two: tuple[Path, Path]) -> None:
    a = str(two[0])
    first = [load(a, batch_size=2, rank=r, world_size=3) for r in range(3)]
    consumed = _run_to(first, 1)
    second = [load(a, batch_size=3, rank=r, world_size=2) for r in range(2)]
    for dl in second:
        dl.load_state_dict(first[0].state_dict())
    consumed += _run_to(second, 1)
    state = second[1].state_dict()
    assert state["stages"] == [[3, 2, "pad", 1], [2, 3, "pad", 1]]
    again = [load(a, batch_size=3, rank=r, world_size=2, num_workers=2) for r in range(2)]  # same shape
    rest = []
    for dl in again:
        dl.load_state_dict(state)
        rest += samples(list(dl), valid_only=True)
    assert sorted(t for _, t in consumed + rest) == sorted(f"a{i}" for i in range(25))


def test_persistent_workers_follow_a_resume_at_another_shape(two: tuple[Path, Path]) -> None:
    a = str(two[0])
    saved = [load(a, batch_size=2, rank=r, world_size=3) for r in range(3)]
    consumed = _run_to(saved, 3)
    dls = [load(a, batch_size=3, rank=r, world_size=2, num_workers=2) for r in range(2)]
    rest = []
    for dl in dls:
        list(dl)  # the workers are up, at epoch 0 of the new shape
        dl.load_state_dict(saved[0].state_dict())
        rest += samples(list(dl), valid_only=True)
        assert dl.epoch == 0 and dl.state_dict()["stages"][0] == [3, 2, "pad", 3]
    assert sorted(t for _, t in consumed + rest) == sorted(f"a{i}" for i in range(25))
    for dl in dls:
        dl.set_epoch(0)  # a replay of epoch 0 is a fresh run's at this shape
    fresh = [load(a, batch_size=3, rank=r, world_size=2) for r in range(2)]
    assert [samples(dl) for dl in dls] == [samples(dl) for dl in fresh]


# ---------------------------------------------------------------------- version-1 states
def _v1(dl: Any, epoch: int, batches: int) -> dict[str, Any]:
    """The state the version-1 loader wrote at this point."""
    s = dl.state_dict()
    return {"fastfeed_loader": 1, "epoch": epoch, "batches": batches, **{k: s[k] for k in (
        "seed", "world_size", "rank", "batch_size", "drop_last", "shuffle", "shuffle_block", "dataset",
        "num_samples")}}


def test_a_version_1_state_resumes_exactly(two: tuple[Path, Path]) -> None:
    a = str(two[0])
    names = [t for _, t in samples(load(a, shuffle=False, batch_size=100))]
    counts = [7, 7, 7, 4]
    for world, padded in ((5, False), (3, True)):  # 25 over 5: no padding; over 3: 2 slots of padding
        for r in range(world):
            old = plan_epoch(counts, seed=3, epoch=1, world_size=world, rank=r, batch_size=3, drop_last=False,
                             shuffle=True)
            want = [[names[i] for i in old.batch(b).tolist()] for b in range(old.num_batches)]
            dl = load(a, batch_size=3, rank=r, world_size=world, num_workers=2 * (r == 1))
            dl.load_state_dict(_v1(dl, 1, 1))
            got = list(dl)
            assert [texts(b) for b in got] == want[1:] and want[1:]  # the old order, exactly
            if padded:
                assert dl.state_dict()["fastfeed_loader"] == 1  # that epoch still saves version 1
            assert dl.state_dict()["epoch"] == 1
            ref = load(a, batch_size=3, rank=r, world_size=world)
            ref.set_epoch(2)
            assert [texts(b) for b in dl] == [texts(b) for b in ref]  # then the planner's epochs
            assert dl.state_dict()["fastfeed_loader"] == 2
    dl = load(a, batch_size=3, rank=0, world_size=3)
    state = _v1(dl, 1, 2)
    with pytest.raises(StateError, match="version-1 loader state saved mid-epoch.*resumes only at that shape"):
        load(a, batch_size=3, rank=0, world_size=2).load_state_dict(state)
    with pytest.raises(StateError, match="seed=3, now 4"):
        load(a, batch_size=3, rank=0, world_size=3, seed=4).load_state_dict(state)
    load(a, batch_size=4, rank=0, world_size=2).load_state_dict(_v1(dl, 1, 0))  # not begun: any shape
