"""Bad input: corrupt samples (raise / skip), truncated or missing shards, mismatched indexes."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest

import fastfeed
from fastfeed.errors import IndexMismatchError, IndexVersionError, SampleError, ShardError

from _loader_data import keys_of, text_fields, tiny_jpeg, write_dataset


def bad_image_fields(i: int, rng: np.random.Generator) -> dict[str, bytes]:
    jpg = tiny_jpeg(i)
    if i == 5:
        jpg = jpg[:3] + b"this is not a jpeg" * 10  # JPEG magic, garbage after it
    return {"jpg": jpg, "cls": str(i % 3).encode()}


@pytest.fixture
def bad_image_data(tmp_path: Path) -> Path:
    write_dataset(tmp_path, shard_counts=(4, 4, 4), fields=bad_image_fields)
    return tmp_path


def test_corrupt_image_raises_with_shard_key_offset(bad_image_data: Path) -> None:
    offset = int(np.load(bad_image_data / "offsets.npy")[5, 0])
    dl = fastfeed.loader(bad_image_data, batch_size=4, image_size=8, num_workers=0, shuffle=False)
    with pytest.raises(SampleError) as info:
        list(dl)
    e = info.value
    assert e.shard.endswith("shard-000001.tar") and e.key == "s00005" and e.offset == offset
    msg = str(e)
    assert "shard-000001.tar" in msg and "'s00005'" in msg and f"offset {offset}" in msg
    assert "on_error='skip'" in msg


def test_corrupt_image_raises_through_workers(bad_image_data: Path) -> None:
    dl = fastfeed.loader(bad_image_data, batch_size=4, image_size=8, num_workers=2)
    with pytest.raises(SampleError, match=r"shard-000001.tar: sample 's00005' at offset \d+"):
        list(dl)


def test_skip_counts_and_logs_once(bad_image_data: Path, caplog: pytest.LogCaptureFixture) -> None:
    dl = fastfeed.loader(bad_image_data, batch_size=4, image_size=8, num_workers=2, on_error="skip")
    with caplog.at_level(logging.WARNING, logger="fastfeed.loader"):
        epochs = [keys_of(dl) for _ in range(2)]
    for keys in epochs:
        assert len(keys) == 11 and "s00005" not in keys
    assert dl.stats.skipped == 2 and "s00005" in dl.stats.skip_messages[0]
    warned = [r for r in caplog.records if "skipped a sample" in r.getMessage()]
    assert len(warned) == 1 and "s00005" in warned[0].getMessage()
    # equal steps survive skips: the batch is smaller, the number of batches is not
    assert dl.stats.steps == 2 * len(dl)


def test_bad_field_is_a_sample_error(tmp_path: Path) -> None:
    def fields(i: int, rng: np.random.Generator) -> dict[str, bytes]:
        return {"json": b"{broken" if i == 2 else b"{}", "cls": b"1"}

    write_dataset(tmp_path, shard_counts=(3, 3), fields=fields)
    with pytest.raises(SampleError, match=r"shard-000000.tar: sample 's00002'.*field 'json'"):
        list(fastfeed.loader(tmp_path, batch_size=2, num_workers=0))
    dl = fastfeed.loader(tmp_path, batch_size=2, num_workers=0, on_error="skip")
    assert len(keys_of(dl)) == 5 and dl.stats.skipped == 1


def test_truncated_shard_fails_before_the_first_batch(tmp_path: Path) -> None:
    write_dataset(tmp_path, shard_counts=(5, 5))
    shard = tmp_path / "shard-000001.tar"
    shard.write_bytes(shard.read_bytes()[:3000])
    with pytest.raises(IndexMismatchError, match=r"shard-000001.tar: 3000 bytes but the index says \d+.*fastfeed pack"):
        fastfeed.loader(tmp_path, batch_size=2, num_workers=0)
    with pytest.raises(IndexMismatchError, match="shard-000001.tar"):
        fastfeed.open_dataset(tmp_path)


def test_missing_shard(tmp_path: Path) -> None:
    write_dataset(tmp_path, fmt="lmdb", shard_counts=(5, 5))
    (tmp_path / "shard-000000.lmdb").unlink()
    with pytest.raises(ShardError, match=r"shard-000000.lmdb: shard is missing.*restore it"):
        fastfeed.loader(tmp_path, batch_size=2, num_workers=0)


def test_index_of_another_version(tmp_path: Path) -> None:
    write_dataset(tmp_path, shard_counts=(5,))
    meta = json.loads((tmp_path / "index.json").read_text())
    meta["fastfeed_index"] = 99
    (tmp_path / "index.json").write_text(json.dumps(meta))
    with pytest.raises(IndexVersionError, match="version 99.*re-pack"):
        fastfeed.loader(tmp_path, batch_size=2, num_workers=0)


def test_offsets_not_matching_the_shard(tmp_path: Path) -> None:
    write_dataset(tmp_path, shard_counts=(5, 5))
    offsets = np.load(tmp_path / "offsets.npy")
    offsets[3, 0] += 512  # points into the middle of a sample
    np.save(tmp_path / "offsets.npy", offsets)
    with pytest.raises(SampleError, match="index does not match|corrupt tar header"):
        list(fastfeed.loader(tmp_path, batch_size=2, num_workers=0, decode=None, shuffle=False))


def test_lmdb_shard_not_matching_the_index(tmp_path: Path) -> None:
    write_dataset(tmp_path, fmt="lmdb", shard_counts=(6, 3))
    a, b = tmp_path / "shard-000000.lmdb", tmp_path / "shard-000001.lmdb"
    a.write_bytes(b.read_bytes())  # shard 0 replaced by a 3-record shard
    meta = json.loads((tmp_path / "index.json").read_text())
    meta["shards"][0]["bytes"] = a.stat().st_size
    (tmp_path / "index.json").write_text(json.dumps(meta))
    dl = fastfeed.loader(tmp_path, batch_size=2, num_workers=0, shuffle=False)
    with pytest.raises(IndexMismatchError, match=r"shard-000000.lmdb: holds 3 records but the index says 6"):
        next(iter(dl))


def test_damaged_tar_header(tmp_path: Path) -> None:
    write_dataset(tmp_path, shard_counts=(4,), fields=text_fields)
    offsets = np.load(tmp_path / "offsets.npy")
    shard = tmp_path / "shard-000000.tar"
    data = bytearray(shard.read_bytes())
    data[int(offsets[2, 0]) + 10] ^= 0xFF  # a byte of the member name: checksum no longer matches
    shard.write_bytes(bytes(data))
    dl = fastfeed.loader(tmp_path, batch_size=4, num_workers=0, decode=None, shuffle=False)
    with pytest.raises(SampleError, match=rf"shard-000000.tar: corrupt tar header at offset {offsets[2, 0]}"):
        list(dl)
    skip = fastfeed.loader(tmp_path, batch_size=4, num_workers=0, decode=None, on_error="skip", shuffle=False)
    assert keys_of(skip) == ["s00000", "s00001", "s00003"] and skip.stats.skipped == 1
