"""fastfeed.loader() and open_dataset() over real tar and LMDB shards, with real workers."""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

import fastfeed
from fastfeed.errors import ConfigError
from fastfeed.packed.index import DatasetIndex

from _loader_data import image_fields, keys_of, write_dataset


@pytest.fixture(scope="module")
def image_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("imgdata")
    write_dataset(root, shard_counts=(7, 7, 7, 4), fields=image_fields)
    return root


@pytest.fixture(scope="module", params=["tar", "lmdb"])
def text_data(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp(f"text-{request.param}")
    write_dataset(root, fmt=request.param, shard_counts=(9, 9, 9, 9, 5))
    return root


def test_batch_structure(image_data: Path) -> None:
    dl = fastfeed.loader(image_data, batch_size=4, image_size=(16, 12), num_workers=0)
    assert isinstance(dl, torch.utils.data.DataLoader) and len(dl) == 7
    batches = list(dl)
    b = batches[0]
    assert b["image"].dtype == torch.uint8 and tuple(b["image"].shape) == (4, 3, 16, 12)
    assert b["label"].dtype == torch.int64 and b["label"].shape == (4,)
    assert isinstance(b["__key__"], list) and len(b["__key__"]) == 4
    # label from the index, cls not repeated, json decoded, no private keys leak out
    assert set(b) == {"image", "label", "__key__", "json", "valid", "__source__"}
    for key, label, meta in zip(b["__key__"], b["label"].tolist(), b["json"]):
        i = int(key[1:])
        assert label == i % 3 and meta == {"i": i}
    assert b["image"].float().std() > 1  # real pixels, not an empty buffer
    assert sorted(keys_of(batches)) == [f"s{i:05d}" for i in range(25)]
    assert len(batches[-1]["__key__"]) == 1  # 25 = 6 * 4 + 1


def test_eval_mode_is_deterministic_and_raw_bytes(image_data: Path) -> None:
    a = list(fastfeed.loader(image_data, batch_size=5, image_size=8, augment=False, shuffle=False,
                             num_workers=0))
    b = list(fastfeed.loader(image_data, batch_size=5, image_size=8, augment=False, shuffle=False,
                             num_workers=0, seed=5))
    assert keys_of(a) == [f"s{i:05d}" for i in range(25)]
    assert all(torch.equal(x["image"], y["image"]) for x, y in zip(a, b))
    raw = next(iter(fastfeed.loader(image_data, batch_size=5, decode=None, shuffle=False, num_workers=0)))
    assert raw["jpg"][0][:3] == b"\xff\xd8\xff" and raw["cls"][0] == b"0"
    assert raw["label"].tolist() == [0, 1, 2, 0, 1]


def test_native_size_images_need_image_size(image_data: Path) -> None:
    dl = fastfeed.loader(image_data, batch_size=5, num_workers=0, shuffle=False)
    with pytest.raises(ConfigError, match="different shapes.*image_size="):
        next(iter(dl))


def test_transform_sees_decoded_sample(image_data: Path) -> None:
    seen = []

    def transform(sample: dict) -> dict:
        seen.append((sample["image"].shape, type(sample["label"]), sample["json"]["i"]))
        return {"__key__": sample["__key__"], "image": sample["image"][::2, ::2].copy(),
                "label": sample["label"], "twice": sample["json"]["i"] * 2}

    b = next(iter(fastfeed.loader(image_data, batch_size=3, image_size=10, transform=transform,
                                  num_workers=0, shuffle=False)))
    assert seen[0] == ((10, 10, 3), int, 0)
    assert tuple(b["image"].shape) == (3, 3, 5, 5) and b["twice"].tolist() == [0, 2, 4]


@pytest.mark.filterwarnings("ignore:This DataLoader will create")  # 3 workers on a 2-core CI box
@pytest.mark.parametrize("workers", [1, 3])
def test_order_does_not_depend_on_workers(text_data: Path, workers: int) -> None:
    ref = keys_of(fastfeed.loader(text_data, batch_size=4, num_workers=0, seed=3))
    got = keys_of(fastfeed.loader(text_data, batch_size=4, num_workers=workers, seed=3,
                                  workers=fastfeed.Workers(prefetch_factor=2)))
    assert got == ref and sorted(ref) == [f"s{i:05d}" for i in range(41)]


def test_epochs_change_the_order(text_data: Path) -> None:
    dl = fastfeed.loader(text_data, batch_size=4, num_workers=2, seed=1)
    e0 = keys_of(dl)
    e1 = keys_of(dl)  # no set_epoch: a completed epoch moves on by itself
    assert dl.epoch == 1 and e1 != e0 and sorted(e1) == sorted(e0)
    dl.set_epoch(0)
    e0_again = keys_of(dl)
    assert e0_again == e0
    dl.set_epoch(5)
    fresh = fastfeed.loader(text_data, batch_size=4, num_workers=0, seed=1)
    fresh.set_epoch(5)
    assert keys_of(dl) == keys_of(fresh)


def test_a_new_pass_after_an_abandoned_one_is_a_new_epoch(text_data: Path) -> None:
    dl = fastfeed.loader(text_data, batch_size=4, num_workers=2, seed=2)
    it = iter(dl)
    first = [k for _ in range(3) for k in next(it)["__key__"]]
    del it
    second = keys_of(dl)
    assert dl.epoch == 1 and second[:12] != first and len(second) == 41
    dl.set_epoch(0)
    assert keys_of(dl)[:12] == first  # set_epoch wins: epoch 0 again, from its start


@pytest.mark.parametrize("world,drop_last", [(3, False), (4, True), (16, False)])
def test_ranks_split_the_epoch(text_data: Path, world: int, drop_last: bool) -> None:
    streams = [keys_of(fastfeed.loader(text_data, batch_size=2, num_workers=0, rank=r, world_size=world,
                                       drop_last=drop_last, seed=9)) for r in range(world)]
    lens = {len(fastfeed.loader(text_data, batch_size=2, num_workers=0, rank=r, world_size=world,
                                drop_last=drop_last)) for r in range(world)}
    assert len(lens) == 1 and len({len(s) for s in streams}) == 1
    counts = Counter(k for s in streams for k in s)
    if drop_last:
        assert max(counts.values()) == 1 and 41 - len(counts) < world * 2
    else:
        assert len(counts) == 41 and sum(counts.values()) - 41 <= world - 1


def test_rank_from_environment(text_data: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    dl = fastfeed.loader(text_data, batch_size=4, num_workers=0)
    assert (dl.rank, dl.world_size) == (1, 2)
    explicit = fastfeed.loader(text_data, batch_size=4, num_workers=0, rank=0, world_size=1)
    assert (explicit.rank, explicit.world_size) == (0, 1)  # arguments beat the environment


def test_stats_and_periodic_log(text_data: Path, caplog: pytest.LogCaptureFixture) -> None:
    dl = fastfeed.loader(text_data, batch_size=4, num_workers=1, log_every=5)
    with caplog.at_level(logging.INFO, logger="fastfeed.loader"):
        n = sum(len(b["__key__"]) for b in dl)
    s = dl.stats.summary()
    assert s["steps"] == len(dl) == 11 and s["samples"] == n == 41 and s["skipped"] == 0
    assert 0 <= s["wait_fraction"] <= 1 and s["samples_per_s"] > 0
    lines = [r.getMessage() for r in caplog.records if r.name == "fastfeed.loader"]
    assert len(lines) == 2 and lines[0].startswith("step 5:") and "samples/s" in lines[0]


def test_drop_last_with_too_few_samples(text_data: Path) -> None:
    with pytest.raises(ConfigError, match="cannot fill one batch.*drop_last=False"):
        fastfeed.loader(text_data, batch_size=32, world_size=2, rank=0, drop_last=True, num_workers=0)


def test_bad_arguments(text_data: Path) -> None:
    for kwargs, match in [({"batch_size": 0}, "batch_size"), ({"batch_size": 2, "seed": -1}, "seed"),
                          ({"batch_size": 2, "on_error": "ignore"}, "on_error"),
                          ({"batch_size": 2, "decode": "gpu"}, "decode"),
                          ({"batch_size": 2, "rank": 2, "world_size": 2}, "rank=2"),
                          ({"batch_size": 2, "image_size": (1, 2, 3)}, "image_size"),
                          ({"batch_size": 2, "dali": fastfeed.Dali(num_threads=4)}, "num_threads.*decode=.dali.")]:
        with pytest.raises(ConfigError, match=match):
            fastfeed.loader(text_data, num_workers=0, **kwargs)


def test_open_dataset_map_style(image_data: Path) -> None:
    ds = fastfeed.open_dataset(image_data)
    assert len(ds) == 25
    s = ds[13]
    assert s["__key__"] == "s00013" and s["cls"] == b"1" and s["jpg"][:2] == b"\xff\xd8"
    assert ds[-1]["__key__"] == "s00024"
    with pytest.raises(IndexError):
        ds[25]
    dec = fastfeed.open_dataset(image_data, decode="cpu", image_size=8)
    d = dec[13]
    assert d["image"].shape == (8, 8, 3) and d["label"] == 1 and d["json"] == {"i": 13}
    dl = torch.utils.data.DataLoader(dec, batch_size=5, num_workers=2, shuffle=True)
    assert sorted(k for b in dl for k in b["__key__"]) == [f"s{i:05d}" for i in range(25)]


def test_lmdb_and_tar_give_the_same_stream(tmp_path: Path) -> None:
    write_dataset(tmp_path / "t", fmt="tar", shard_counts=(6, 6, 6))
    write_dataset(tmp_path / "l", fmt="lmdb", shard_counts=(6, 6, 6))
    a = list(fastfeed.loader(tmp_path / "t", batch_size=4, num_workers=0, decode=None))
    b = list(fastfeed.loader(tmp_path / "l", batch_size=4, num_workers=0, decode=None))
    assert keys_of(a) == keys_of(b) and [x["txt"] for x in a] == [x["txt"] for x in b]


def test_index_from_loader_matches(text_data: Path) -> None:
    dl = fastfeed.loader(text_data, batch_size=4, num_workers=0)
    assert isinstance(dl.index, DatasetIndex) and dl.index.num_samples == 41
    assert np.asarray(dl.index.offsets).shape == (41, 2)


@pytest.mark.slow
def test_spawned_persistent_workers_follow_set_epoch(tmp_path: Path) -> None:
    """With spawn (forkserver is Python 3.14's default) the shared epoch still reaches workers."""
    write_dataset(tmp_path, shard_counts=(9, 9, 5))
    ref = fastfeed.loader(tmp_path, batch_size=4, num_workers=0, seed=2)
    dl = fastfeed.loader(tmp_path, batch_size=4, num_workers=1, seed=2,
                         workers=fastfeed.Workers(multiprocessing_context="spawn"))
    for epoch in (0, 3):
        ref.set_epoch(epoch)
        dl.set_epoch(epoch)
        assert keys_of(dl) == keys_of(ref)


def test_fastfeed_loader_is_the_function_whatever_was_imported_first(text_data: Path) -> None:
    import fastfeed.loading.api as module

    assert fastfeed.loader is module.loader
    assert len(fastfeed.loader(text_data, batch_size=4, num_workers=0)) == 11


def test_each_worker_hints_its_next_batch_to_the_kernel(image_data: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Cold page cache: the byte spans of a worker's next batch are handed to
    posix_fadvise(WILLNEED) before the current batch is read, so reads overlap decoding."""
    import os

    from fastfeed.packed.reader import ShardSource

    hinted: list[tuple[int, int]] = []
    real = os.posix_fadvise

    def record(fd: int, offset: int, size: int, advice: int) -> None:
        assert advice == os.POSIX_FADV_WILLNEED
        hinted.append((offset, size))
        real(fd, offset, size, advice)

    monkeypatch.setattr(os, "posix_fadvise", record)
    dl = fastfeed.loader(image_data, batch_size=4, image_size=8, num_workers=0, seed=3)
    batches = list(dl)
    ds = dl.dataset
    plan = ds.plan(0)
    src: ShardSource = ds.source
    want = []
    for b in range(1, plan.num_batches):  # every batch but the first was hinted, in order
        _, locs = src.locate(plan.batch(b).ids)
        want += [(int(o), int(s)) for o, s in locs]
    assert hinted == want
    assert sorted(keys_of(batches)) == [f"s{i:05d}" for i in range(25)]


def test_read_hints_never_raise(tmp_path: Path) -> None:
    """A hint for a missing shard or a stream is skipped; the read reports the problem."""
    import io

    from fastfeed.errors import ShardError
    from fastfeed.formats.tar_reader import FastTarReader
    from fastfeed.packed.reader import ShardSource

    root = tmp_path / "d"
    write_dataset(root, shard_counts=(3, 3), fields=image_fields)
    src = ShardSource(DatasetIndex.load(root))
    src.will_need(np.arange(6))
    FastTarReader(io.BytesIO(b"\0" * 1024), name="stream").will_need(0, 512)
    missing = FastTarReader(root / "nothing.tar")
    missing.will_need(0, 512)
    with pytest.raises(ShardError, match="nothing.tar: shard is missing"):
        missing.read(0, 512)
    shard = DatasetIndex.load(root).shard_path(1)
    Path(shard).unlink()
    fresh = ShardSource(DatasetIndex.load(root))
    fresh.will_need(np.arange(6))  # shard 1 is gone: no error here
    with pytest.raises(ShardError, match="shard is missing"):
        fresh.read(4)
