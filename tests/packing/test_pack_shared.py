"""Real photos (../shared/data/imagenet-sample) packed to tar and LMDB, verified, and read
back by ``webdataset.WebDataset`` with the same keys and bytes."""

from __future__ import annotations

from pathlib import Path

import pytest

import fastfeed
from _pack_data import shard_samples
from fastfeed.packing.api import pack


def _originals(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root).with_suffix("")): p.read_bytes() for p in root.rglob("*.jpg")}


@pytest.mark.parametrize("fmt", ["tar", "lmdb"])
def test_imagenet_sample_packs_and_verifies(shared_data: Path, tmp_path: Path, fmt: str) -> None:
    src = shared_data / "imagenet-sample"
    originals = _originals(src)
    idx = pack(src, tmp_path / "o", format=fmt, samples_per_shard=10, jpeg_restarts=False)  # source bytes
    assert idx.input == "imagefolder" and idx.num_samples == len(originals) == 47
    assert idx.classes == tuple(sorted(p.name for p in src.iterdir() if p.is_dir()))
    assert list(idx.shard_counts) == [10, 10, 9, 9, 9]
    report = fastfeed.verify(tmp_path / "o")
    assert report.ok and report.images == 47, report.problems
    got = {s["__key__"]: s for s in shard_samples(tmp_path / "o")}
    assert {k: s["jpg"] for k, s in got.items()} == originals
    assert all(idx.classes[int(s["cls"])] == k.split("/")[0] for k, s in got.items())


def test_webdataset_reads_fastfeed_tars(shared_data: Path, tmp_path: Path) -> None:
    wds = pytest.importorskip("webdataset")
    src = shared_data / "imagenet-sample"
    idx = pack(src, tmp_path / "o", samples_per_shard=12, max_side=None, jpeg_restarts=False)
    urls = [str(tmp_path / "o" / s.name) for s in idx.shards]
    ours = shard_samples(tmp_path / "o")
    theirs = list(wds.WebDataset(urls, shardshuffle=False, empty_check=False))
    assert [s["__key__"] for s in theirs] == [s["__key__"] for s in ours]
    for a, b in zip(theirs, ours):
        assert {k: v for k, v in a.items() if not k.startswith("__")} == \
            {k: v for k, v in b.items() if not k.startswith("__")}
    originals = _originals(src)
    assert {s["__key__"]: s["jpg"] for s in theirs} == originals
