"""subset= and filter=: evaluation into kept ids, errors, and plans over filtered datasets."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from _loader_data import write_dataset
from hypothesis import given, settings
from hypothesis import strategies as st
from loading.order._planning import all_ranks, delivered, shard_counts

from fastfeed.errors import ConfigError
from fastfeed.loading.order.rankplan import plan_rank, plan_spec
from fastfeed.loading.order.selection import Selection, index_metadata, select


def test_subset_ids_and_masks_give_sorted_kept_ids_per_shard() -> None:
    sel = select([3, 0, 4], subset=[6, 0, 4])
    assert sel.kept.tolist() == [0, 4, 6] and sel.kept_counts.tolist() == [1, 0, 2] and sel.size == 3
    mask = np.zeros(7, dtype=bool)
    mask[[0, 4, 6]] = True
    assert select([3, 0, 4], subset=mask).kept.tolist() == [0, 4, 6]
    assert select([3, 4]).kept is None and select([3, 4]).size == 7


def test_filter_sees_metadata_and_combines_with_subset() -> None:
    meta = {"index": np.arange(6), "label": np.array([0, 1, 0, 1, 0, 1]), "length": np.arange(6) * 10}
    seen = {}

    def odd_label(m):
        seen.update(m)
        return m["label"] == 1

    sel = select([2, 4], filter=odd_label, meta=meta, subset=[1, 2, 3])
    assert sel.kept.tolist() == [1, 3] and sel.kept_counts.tolist() == [1, 1]
    assert sorted(seen) == ["index", "label", "length"]


def test_index_metadata_reads_the_index_sidecars(tmp_path) -> None:
    idx = write_dataset(tmp_path / "d", shard_counts=(3, 2))
    meta = index_metadata(idx)
    assert sorted(meta) == ["index", "label"] and meta["index"].tolist() == [0, 1, 2, 3, 4]
    assert meta["label"].tolist() == idx.labels.tolist()
    sel = select(idx.shard_counts, filter=lambda m: m["index"] >= 2, meta=meta, name=str(tmp_path / "d"))
    assert sel.kept.tolist() == [2, 3, 4]


@pytest.mark.parametrize("kwargs, pattern", [
    ({"subset": [0, 9]}, r"subset= holds sample id 9, out of range for 5 samples"),
    ({"subset": [-1]}, r"subset= holds sample id -1.*no negative indexing"),
    ({"subset": [1, 1]}, r"subset= lists sample 1 more than once.*np.unique"),
    ({"subset": np.ones(4, dtype=bool)}, r"subset= is a bool mask of shape \(4,\).*5 samples"),
    ({"subset": [0.5]}, r"subset= must be a 1-D list of integer sample ids"),
    ({"subset": []}, r"subset= is empty"),
    ({"filter": lambda m: m["index"][:3] > 0}, r"filter .* returned shape \(3,\), expected \(5,\)"),
    ({"filter": lambda m: m["index"] * 1.0}, r"filter .* returned dtype float64, expected bool.*astype"),
    ({"filter": lambda m: m["index"] > 99}, r"filter leaves no sample of 5"),
    ({"subset": [0], "filter": lambda m: m["index"] > 0}, r"subset and filter leave"),
    ({"filter": 3}, r"filter=3 is not callable"),
])
def test_bad_selections_name_the_dataset_the_argument_and_the_fix(kwargs, pattern) -> None:
    with pytest.raises(ConfigError, match=pattern) as e:
        select([2, 3], name="/data/web", **kwargs)
    assert str(e.value).startswith("/data/web: ")


def test_keeping_everything_plans_like_no_selection() -> None:
    counts = shard_counts(300)
    full = plan_spec([select(counts, filter=lambda m: m["index"] >= 0)], seed=2)
    plain = plan_spec([counts], seed=2)
    for r in range(3):
        a = plan_rank(full, epoch=1, world_size=3, rank=r, batch_size=8)
        b = plan_rank(plain, epoch=1, world_size=3, rank=r, batch_size=8)
        assert a.ids.tolist() == b.ids.tolist() and a.valid.tolist() == b.valid.tolist()


@settings(max_examples=60, deadline=None, database=None)
@given(n=st.integers(1, 300), mod=st.integers(1, 7), world=st.integers(1, 9), batch=st.integers(1, 8),
       epoch=st.integers(0, 2), pad=st.booleans(), shuffle=st.booleans())
def test_a_filtered_dataset_keeps_every_guarantee(n, mod, world, batch, epoch, pad, shuffle) -> None:
    counts = shard_counts(n, mod)
    sel = select(counts, filter=lambda m: m["index"] % mod == 0)
    spec = plan_spec([sel], seed=1, shuffle=shuffle, shuffle_block=4)
    plans = all_ranks(spec, epoch=epoch, world_size=world, batch_size=batch, pad=pad)
    assert len({p.num_batches for p in plans}) == 1
    got = delivered(plans)
    assert got == Counter((0, i) for i in range(0, n, mod))  # each kept sample once, nothing else
    allowed = set(range(0, n, mod))
    assert {i for p in plans for i in p.ids.tolist()} <= allowed  # padding repeats kept samples too


def test_filters_per_dataset_work_with_mixing() -> None:
    a = select(shard_counts(500), filter=lambda m: m["index"] < 250, name="a")
    b = select(shard_counts(80, 1), subset=np.arange(0, 80, 2), name="b")
    spec = plan_spec([a, b], weights=[2, 1], seed=0)
    got = delivered(all_ranks(spec, epoch=0, world_size=4, batch_size=6))
    assert sorted(i for s, i in got.elements() if s == 0) == list(range(250))
    small = [i for s, i in got.elements() if s == 1]
    assert set(small) <= set(range(0, 80, 2)) and len(small) == spec.per_epoch[1] == 125


def test_a_memory_mapped_kept_sidecar_plans_like_an_array(tmp_path) -> None:
    counts = shard_counts(400)
    kept = np.arange(0, 400, 3, dtype=np.int64)
    np.save(tmp_path / "kept.npy", kept)
    mapped = Selection.from_kept(counts, np.load(tmp_path / "kept.npy", mmap_mode="r"), name="big")
    plain = select(counts, subset=kept)
    assert mapped.kept_counts.tolist() == plain.kept_counts.tolist()
    a = plan_rank(plan_spec([mapped], seed=0), epoch=0, world_size=2, rank=1, batch_size=5)
    b = plan_rank(plan_spec([plain], seed=0), epoch=0, world_size=2, rank=1, batch_size=5)
    assert a.ids.tolist() == b.ids.tolist()
