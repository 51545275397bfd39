"""The loader on real files from ../shared/data (skipped when absent)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import fastfeed
from fastfeed.decode.image import turbo_available
from fastfeed.formats.tar import TarShardWriter
from fastfeed.packed.index import DatasetIndex, ShardInfo

from _loader_data import keys_of


def test_webdataset_testdata(shared_data: Path) -> None:
    wds = shared_data / "webdataset-testdata"
    first = next(iter(fastfeed.loader(wds / "compressed.tar", batch_size=3, shuffle=False, num_workers=0)))
    assert first["__key__"][0] == "compressed/0001" and first["txt.gz"][0] == "hello\n"
    gz = list(fastfeed.loader(wds / "testgz.tar", batch_size=100, shuffle=False, num_workers=0))
    assert len(keys_of(gz)) == 1000 and gz[0]["txt.gz"][0] == ", or more info on the item."
    digits = fastfeed.loader(wds / "sample.tgz", batch_size=32, num_workers=2, seed=1)
    batches = list(digits)
    assert len(keys_of(batches)) == 90 and len(set(keys_of(batches))) == 90
    assert tuple(batches[0]["image"].shape) == (32, 3, 28, 28) and batches[0]["label"].max() <= 9
    three = [str(wds / n) for n in ("mpdata.tar", "tendata.tar", "compressed.tar")]
    assert len(keys_of(fastfeed.loader(three, batch_size=16, num_workers=0, decode=None))) == 203


@pytest.mark.parametrize("backend", ["pillow", pytest.param(
    "turbo", marks=pytest.mark.skipif(not turbo_available(), reason="[turbo] not installed"))])
def test_real_photos(shared_data: Path, tmp_path: Path, backend: str) -> None:
    lines = (shared_data / "imagenet-sample" / "image_list.txt").read_text().split("\n")
    items = [ln.split() for ln in lines if ln.strip()]
    w = TarShardWriter(tmp_path / "shard-000000.tar")
    offsets = [w.add(f"img{i:03d}", {"jpg": (shared_data / "imagenet-sample" / p).read_bytes(),
                                     "cls": lab.encode()}) for i, (p, lab) in enumerate(items)]
    size, sha = w.close()
    DatasetIndex(format="tar", num_samples=len(items),
                 shards=(ShardInfo("shard-000000.tar", len(items), size, sha),), fields=("cls", "jpg"),
                 ).with_arrays(offsets=np.array(offsets), labels=np.array([int(x[1]) for x in items])).save(tmp_path)
    dl = fastfeed.loader(tmp_path, batch_size=16, image_size=64, num_workers=0,
                         workers=fastfeed.Workers(decode_backend=backend))
    batches = list(dl)
    assert len(keys_of(batches)) == len(items) == 47 and dl.stats.skipped == 0
    img = batches[0]["image"].float()
    assert img.std() > 10 and tuple(img.shape[1:]) == (3, 64, 64)
    assert sorted(int(x) for b in batches for x in b["label"]) == sorted(int(x[1]) for x in items)
