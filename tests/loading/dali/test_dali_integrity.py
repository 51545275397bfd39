"""decode="dali" checks what it feeds as decode="cpu" checks what it reads (issue 27, parts 1 and 4).

The feed hands DALI views of memory-mapped shards: each sample's span is checked against its
checksum before it is fed (a SampleError naming shard and key, or a counted skip), and each
shard's size before its map is used again (a ShardError naming it). DALI's CPU-only mode.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import fastfeed
from _dali_data import DALI_CPU, require_dali, write_image_folder
from fastfeed.errors import SampleError, ShardError
from fastfeed.loading.dali.feed import SAMPLE

pytestmark = [pytest.mark.dali, pytest.mark.usefixtures("isolated_store")]


@pytest.fixture(scope="module")
def dali() -> Any:
    return require_dali()


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("dali_integrity")
    src = write_image_folder(root / "src", [(40 + i % 7, 30 + i % 5) for i in range(24)])
    fastfeed.pack(src, root / "ff", samples_per_shard=8, workers=1, seed=0)
    return root / "ff"


def _damaged(packed: Path, tmp_path: Path, sample: int) -> tuple[Path, str]:
    ds = tmp_path / "ds"
    shutil.copytree(packed, ds)
    got = fastfeed.open_dataset(ds).source.read(sample)
    index = fastfeed.DatasetIndex.load(ds)
    shard = ds / index.shards[int(index.shard_of(sample))].name
    data = bytearray(shard.read_bytes())
    off, size = (int(x) for x in np.load(ds / "offsets.npy")[sample])
    data[off + size - 700] ^= 0x33  # inside the JPEG's data
    shard.write_bytes(bytes(data))
    return ds, got["__key__"]


def _loader(ds: Path, **kw: Any) -> Any:
    return fastfeed.loader(str(ds), **{"batch_size": 4, "image_size": 16, **DALI_CPU, **kw})


def test_a_damaged_sample_is_an_error_or_a_counted_skip(dali: Any, packed: Path, tmp_path: Path) -> None:
    ds, key = _damaged(packed, tmp_path, 13)
    with pytest.raises(SampleError, match=rf"shard-000001.tar: sample '{key}' at offset \d+: its bytes' \w+ checksum "
                                          r"is [0-9a-f]{16}, the index recorded [0-9a-f]{16}.*on_error='skip'"):
        list(_loader(ds, shuffle=False))
    dl = _loader(ds, on_error="skip")
    keys = [k for b in dl for k in b["__key__"]]
    assert key not in keys and len(keys) == 23
    assert dl.stats.skipped == 1 and key in dl.stats.skip_messages[0] and "checksum" in dl.stats.skip_messages[0]
    feeder = _loader(ds, shuffle=False, storage=fastfeed.Storage(verify=False))._feeder
    feeder.restart(0, 0)
    fed = [i for _ in range(6) for i in feeder()[1][:, SAMPLE].tolist()]
    assert 13 in fed  # fed unchecked: what DALI's decoder makes of the damage is its own affair


def test_a_shard_truncated_under_the_feed_is_a_shard_error(dali: Any, packed: Path, tmp_path: Path) -> None:
    """What the feed guarantees: once a shard shrank, nothing more of it is fed (a ShardError naming it).
    The batches fed before (DALI reads them later, in its own threads) still fault: docs/format.md says
    so, and this test does not run them."""
    ds = tmp_path / "ds"
    shutil.copytree(packed, ds)
    feeder = _loader(ds, shuffle=False, batch_size=2)._feeder
    feeder.restart(0, 0)
    feeder()
    for shard in sorted(ds.glob("shard-*.tar")):
        os.truncate(shard, 2048)
    with pytest.raises(ShardError, match=r"shard-000000.tar: the shard is 2048 bytes now, \d+ when it was checked"):
        feeder()
