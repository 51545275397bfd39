"""Several readers of one LMDB dataset in one process: loaders, open_dataset, real workers.

py-lmdb opens an environment once per process, so every reader shares one per shard file
(fastfeed.formats.lmdb.open_shared_env); forked workers open their own.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

import fastfeed
from fastfeed.formats.lmdb import LmdbShardReader, LmdbShardWriter, open_shared_env

from _loader_data import image_fields, keys_of, write_dataset

ALL = [f"s{i:05d}" for i in range(18)]


@pytest.fixture(scope="module")
def lmdb_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("lmdb-shared")
    write_dataset(root, fmt="lmdb", shard_counts=(6, 6, 6))
    return root


def _interleave(a: object, b: object) -> tuple[list[dict], list[dict]]:
    """Every batch of both loaders, taking one of each in turn."""
    ia, ib = iter(a), iter(b)  # type: ignore[call-overload]
    out_a: list[dict] = []
    out_b: list[dict] = []
    while True:
        na, nb = next(ia, None), next(ib, None)
        if na is None and nb is None:
            return out_a, out_b
        out_a += [na] if na is not None else []
        out_b += [nb] if nb is not None else []


@pytest.mark.parametrize("workers", [0, 2])
def test_two_loaders_on_one_lmdb_dataset_interleaved(lmdb_data: Path, workers: int) -> None:
    kw = dict(batch_size=4, num_workers=workers, decode=None)
    a = fastfeed.loader(lmdb_data, seed=1, **kw)
    b = fastfeed.loader(lmdb_data, seed=2, **kw)
    ba, bb = _interleave(a, b)
    assert sorted(keys_of(ba)) == ALL and sorted(keys_of(bb)) == ALL
    assert keys_of(ba) != keys_of(bb)  # two orders, so both really read


def test_train_and_eval_loader_and_open_dataset(tmp_path: Path) -> None:
    src = tmp_path / "src"
    for c in ("a", "b"):
        (src / c).mkdir(parents=True)
        for i in range(4):
            (src / c / f"{c}{i}.jpg").write_bytes(image_fields(i, None)["jpg"])  # type: ignore[arg-type]
    dst = tmp_path / "ff"
    fastfeed.pack(src, dst, format="lmdb", samples_per_shard=3)
    train = fastfeed.loader(dst, batch_size=2, num_workers=0, image_size=8, augment=True)
    evl = fastfeed.loader(dst, batch_size=2, num_workers=0, image_size=8, augment=False, shuffle=False)
    ds, raw = fastfeed.open_dataset(dst, decode="cpu", image_size=8), fastfeed.open_dataset(dst)
    bt, be = _interleave(train, evl)
    assert len(keys_of(bt)) == len(keys_of(be)) == 8
    assert [raw[i]["__key__"] for i in range(8)] == [ds[i]["__key__"] for i in range(8)]
    assert sorted(keys_of(be)) == sorted(raw[i]["__key__"] for i in range(8))


@pytest.mark.parametrize("first", ["a", "b"])
def test_two_loaders_close_in_either_order(lmdb_data: Path, first: str) -> None:
    dl = {k: fastfeed.loader(lmdb_data, batch_size=3, num_workers=0, decode=None, seed=s)
          for k, s in (("a", 1), ("b", 2))}
    it = {k: iter(v) for k, v in dl.items()}
    seen = {k: keys_of([next(it[k])]) for k in dl}  # every loader has a shard open
    dl[first].dataset.source.close()
    other = "b" if first == "a" else "a"
    seen[other] += keys_of(list(it[other]))  # the shared environments are still open
    assert sorted(seen[other]) == ALL
    dl[other].dataset.source.close()
    assert sorted(keys_of(list(dl[first]))) == ALL  # all let go: the files open afresh
    dl[first].dataset.source.close()


def test_shared_env_is_counted(tmp_path: Path) -> None:
    p = str(tmp_path / "s.lmdb")
    w = LmdbShardWriter(p)
    w.add("k0", {"txt": b"x"})
    w.close()
    a, b = LmdbShardReader(p), LmdbShardReader(os.path.join(str(tmp_path), ".", "s.lmdb"))
    assert a.read(0)["txt"] == b.read(0)["txt"] == b"x"
    assert a._env is b._env  # two paths to one file: one environment
    a.close()
    a.close()  # a second close does not take b's share
    assert b.read(0)["__key__"] == "k0"
    env = b._env
    b.close()
    env2, release = open_shared_env(p)
    assert env2 is not env and env2.stat()["entries"] == 1
    release()
    del a  # a reader dropped without close() lets go too
    c = LmdbShardReader(p)
    assert len(c) == 1
    env3 = c._env
    del c
    env4, release = open_shared_env(p)
    assert env4 is not env3
    release()


def test_forked_workers_open_their_own_after_the_parent_read(lmdb_data: Path) -> None:
    """The parent has the shards open when DataLoader forks its workers."""
    ds = fastfeed.open_dataset(lmdb_data)
    parent = [ds[i]["__key__"] for i in range(18)]  # every shard open in the parent
    dl = torch.utils.data.DataLoader(ds, batch_size=5, num_workers=2, shuffle=True,
                                     multiprocessing_context="fork", collate_fn=lambda b: b)
    assert sorted(s["__key__"] for batch in dl for s in batch) == parent == ALL
    assert ds[3]["__key__"] == "s00003"  # the parent's handles still work
    loader = fastfeed.loader(lmdb_data, batch_size=4, num_workers=2, decode=None,
                             workers=fastfeed.Workers(multiprocessing_context="fork"))
    assert sorted(keys_of(list(loader))) == ALL
