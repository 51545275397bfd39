"""``loader()`` over raw-pixel shards (``pack --store raw|mixed:P``): the JPEG loader's guarantees, no decode."""

from __future__ import annotations

import gc
from pathlib import Path

import numpy as np
import pytest
import torch

import fastfeed
from fastfeed.errors import ConfigError, SampleError
from fastfeed.packed.layout import SHAPES_NAME
from _raw_data import write_raw_source


@pytest.fixture(scope="module")
def packs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The same source packed as jpeg, raw and mixed:0.5, in tar and LMDB."""
    base = tmp_path_factory.mktemp("rawload")
    write_raw_source(base / "src")
    out = {}
    for fmt in ("tar", "lmdb"):
        for store in ("jpeg", "raw", "mixed:0.5"):
            dst = base / f"{fmt}-{store.replace(':', '')}"
            fastfeed.pack(base / "src", dst, format=fmt, store=store, samples_per_shard=7, seed=4)
            out[f"{fmt}-{store}"] = dst
    return out


def _epoch(path: Path, epoch: int = 0, **kw: object) -> list[dict]:
    opts: dict = dict(batch_size=5, image_size=24, num_workers=0, seed=9)
    opts.update(kw)
    dl = fastfeed.loader(path, **opts)
    dl.set_epoch(epoch)
    return list(dl)


@pytest.mark.parametrize("fmt", ["tar", "lmdb"])
@pytest.mark.parametrize("store", ["raw", "mixed:0.5"])
@pytest.mark.parametrize("augment", [True, False])
def test_raw_loader_matches_the_jpeg_loader(packs: dict[str, Path], fmt: str, store: str, augment: bool) -> None:
    ref = _epoch(packs[f"{fmt}-jpeg"], 1, augment=augment)
    got = _epoch(packs[f"{fmt}-{store}"], 1, augment=augment)
    assert [b["__key__"] for b in got] == [b["__key__"] for b in ref]  # the same order
    assert all((a["label"] == b["label"]).all() for a, b in zip(got, ref))
    a = np.concatenate([b["image"].numpy() for b in ref]).astype(int)
    b = np.concatenate([b["image"].numpy() for b in got]).astype(int)
    # the same crop boxes and flips (the position code in red/green), close pixels; the JPEG path's
    # DCT-scaled decodes differ from full-size pixels in fine detail only
    assert a.shape == b.shape and np.abs(a - b)[:, :2].mean() < 3 and np.abs(a - b).mean() < 6


def test_mixed_batches_hold_both_kinds(packs: dict[str, Path]) -> None:
    ds = fastfeed.open_dataset(packs["tar-mixed:0.5"])
    kinds = {("rgb8" in ds[i]) for i in range(len(ds))}
    assert kinds == {True, False}
    raw = next(ds[i] for i in range(len(ds)) if "rgb8" in ds[i])  # decode=None: the pixels as an HWC array
    h, w = (int(x) for x in ds.index.shapes[[i for i in range(len(ds)) if "rgb8" in ds[i]][0]])
    assert raw["rgb8"].shape == (h, w, 3) and "__shape__" not in raw
    batches = _epoch(packs["tar-mixed:0.5"], decode=None, image_size=None)
    arrays = [x for b in batches for x in b["rgb8"] if x is not None]  # the DataLoader made them tensors
    assert arrays and all(x.ndim == 3 and x.shape[2] == 3 and x.dtype == torch.uint8 for x in arrays)
    sample = fastfeed.open_dataset(packs["lmdb-raw"], decode="cpu")[0]
    assert sample["image"].ndim == 3 and sample["image"].flags.writeable


@pytest.mark.parametrize("fmt", ["tar", "lmdb"])
def test_resume_mid_epoch_continues_the_same_batches(packs: dict[str, Path], fmt: str) -> None:
    path = packs[f"{fmt}-mixed:0.5"]
    full = _epoch(path, 2)
    dl = fastfeed.loader(path, batch_size=5, image_size=24, num_workers=0, seed=9)
    dl.set_epoch(2)
    it = iter(dl)
    first = [next(it) for _ in range(2)]
    state = dl.state_dict()
    del it, dl  # the stopped run ends (an LMDB environment open here could not be opened by a forked worker)
    gc.collect()
    again = fastfeed.loader(path, batch_size=5, image_size=24, num_workers=1, seed=9)
    again.load_state_dict(state)
    rest = list(again)
    for a, b in zip(first + rest, full, strict=True):
        assert a["__key__"] == b["__key__"] and (a["image"] == b["image"]).all()


def test_equal_steps_on_two_ranks(packs: dict[str, Path]) -> None:
    lens = []
    keys: list[str] = []
    for rank in (0, 1):
        batches = _epoch(packs["tar-raw"], world_size=2, rank=rank, batch_size=4)
        lens.append(len(batches))
        keys += [k for b in batches for k, v in zip(b["__key__"], b["valid"].tolist()) if v]
    assert lens[0] == lens[1] and len(keys) == len(set(keys)) == fastfeed.info(packs["tar-raw"])["num_samples"]


def test_wrong_size_raw_sample_is_an_error_or_a_counted_skip(packs: dict[str, Path], tmp_path: Path) -> None:
    import shutil

    path = tmp_path / "damaged"
    shutil.copytree(packs["tar-raw"], path)
    shapes = np.load(path / SHAPES_NAME)
    shapes[3] = shapes[3] + 1  # the index no longer matches sample 3's bytes
    np.save(path / SHAPES_NAME, shapes)
    key = fastfeed.open_dataset(path).source.read(3)["__key__"]
    with pytest.raises(SampleError, match=rf"shard-\d+\.tar: sample '{key}' at offset \d+: raw pixels .* expected \d+"):
        _epoch(path, shuffle=False)
    dl = fastfeed.loader(path, batch_size=5, image_size=24, num_workers=0, on_error="skip", shuffle=False)
    got = [k for b in dl for k in b["__key__"]]
    assert key not in got and len(set(got)) == fastfeed.info(path)["num_samples"] - 1
    assert dl.stats.skipped >= 1 and key in dl.stats.skip_messages[0] and "expected" in dl.stats.skip_messages[0]
    report = fastfeed.verify(path)
    assert not report.ok and any(f"sample '{key}'" in p and "shapes.npy" in p for p in report.problems)
    assert fastfeed.verify(packs["tar-mixed:0.5"]).ok


def test_dali_refuses_raw_pixels_with_the_fix(packs: dict[str, Path]) -> None:
    with pytest.raises(ConfigError, match=r"--store jpeg"):
        fastfeed.loader(packs["tar-raw"], batch_size=4, image_size=24, decode="dali")
