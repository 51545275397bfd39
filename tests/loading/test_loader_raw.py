"""``loader()`` over raw-pixel shards (``pack --store raw|mixed:P``): the JPEG loader's guarantees, no decode."""

from __future__ import annotations

import gc
import hashlib
import json
import os
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import fastfeed
import fastfeed.packed.reader as reader_mod
from fastfeed.decode.geometry import NUM_UNIFORMS, random_resized_crop, uniforms
from fastfeed.decode.raw import SpanPixels, crop_into, is_pixels, pixels
from fastfeed.errors import ConfigError, SampleError
from fastfeed.formats.span import FileSpan
from fastfeed.packed.layout import SHAPES_NAME
from fastfeed.packed.reader import DatasetReader, resolve_index
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
    # an index that vouches for these shapes (else shapes.npy's sha256 in index.json stops the loader at once):
    # the sample's own size check is what this tests
    meta = json.loads((path / "index.json").read_text())
    meta["checksums"]["sidecars"][SHAPES_NAME] = hashlib.sha256((path / SHAPES_NAME).read_bytes()).hexdigest()
    (path / "index.json").write_text(json.dumps(meta))
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


# ------------------------------------------------------------------ raw reads: memory map or rows (FileSpan)
def _record_raw_reads(out_dir: str, worker_id: int) -> None:
    """worker_init_fn: write down how this worker's reader reads raw pixels, and what it hands over."""
    src = torch.utils.data.get_worker_info().dataset.source
    kind = type(src.read(0)["rgb8"]).__name__
    Path(out_dir, f"{worker_id}-{os.getpid()}").write_text(f"{src.raw_reads()} {kind}")


def _same_batches(a: list[dict], b: list[dict]) -> None:
    assert len(a) == len(b) and len(a) > 1
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for k in x:
            u, v = x[k], y[k]
            if isinstance(u, torch.Tensor):
                assert u.dtype == v.dtype and u.shape == v.shape and torch.equal(u, v), k
            elif isinstance(u, list) and u and isinstance(u[0], torch.Tensor):
                assert len(u) == len(v) and all(p.shape == q.shape and torch.equal(p, q) for p, q in zip(u, v)), k
            else:
                assert u == v, k


@pytest.mark.parametrize("decode", ["cpu", None])
def test_map_and_rows_reads_give_the_same_epoch(packs: dict[str, Path], tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch, decode: str | None) -> None:
    path = packs["tar-raw"]
    kw: dict[str, Any] = dict(image_size=24, augment=True) if decode else dict(decode=None, image_size=None)
    got = {}
    for mode, handed in (("map", "memoryview"), ("rows", "FileSpan")):
        monkeypatch.setenv("FASTFEED_RAW_READS", mode)
        seen = tmp_path / f"{mode}-workers"
        seen.mkdir()
        dl = fastfeed.loader(path, batch_size=5, num_workers=2, seed=9, shuffle=True, **kw,
                             workers=fastfeed.Workers(worker_init_fn=partial(_record_raw_reads, str(seen))))
        dl.set_epoch(1)
        got[mode] = list(dl)
        del dl
        gc.collect()
        # both worker processes read the pixels the way the environment asked
        workers = sorted(p.name.split("-")[0] for p in seen.iterdir())
        assert workers == ["0", "1"] and {p.read_text() for p in seen.iterdir()} == {f"{mode} {handed}"}
    keys = [k for b in got["map"] for k in b["__key__"]]
    assert len(keys) == len(set(keys)) == fastfeed.info(path)["num_samples"]
    _same_batches(got["map"], got["rows"])
    if decode is None:  # whole images, as HWC arrays, of the shapes in the index
        arrays = [x for b in got["rows"] for x in b["rgb8"]]
        assert len(arrays) == len(keys) and all(x.ndim == 3 and x.shape[2] == 3 for x in arrays)
        assert len({tuple(x.shape) for x in arrays}) > 3
    else:
        assert got["rows"][0]["image"].shape[1:] == (3, 24, 24)


def _shards_total(index: Any) -> int:
    return sum(int(sh.bytes) for sh in index.shards)


@pytest.mark.parametrize("env", [None, "", "bogus", "mmap"])
def test_raw_reads_follow_the_dataset_size_against_memory(packs: dict[str, Path], monkeypatch: pytest.MonkeyPatch,
                                                          env: str | None, caplog: pytest.LogCaptureFixture) -> None:
    if env is None:
        monkeypatch.delenv("FASTFEED_RAW_READS", raising=False)
    else:  # not map or rows: the size rule decides
        monkeypatch.setenv("FASTFEED_RAW_READS", env)
    index = resolve_index(packs["tar-raw"])
    total = _shards_total(index)
    for memory, want, handed in ((4 * total - 1, "rows", FileSpan), (4 * total, "map", memoryview),
                                 (1 << 50, "map", memoryview), (1 << 20, "rows", FileSpan)):
        monkeypatch.setattr(reader_mod, "_memory_bytes", lambda m=memory: m)
        r = DatasetReader(index)
        caplog.clear()
        assert r.raw_reads() == want, (memory, total)
        named = [rec for rec in caplog.records if "FASTFEED_RAW_READS" in rec.getMessage()]
        assert len(named) == (1 if env in ("bogus", "mmap") else 0)  # a value that is no choice is said once
        assert type(r.read(3)["rgb8"]) is handed
        r.close()


@pytest.mark.parametrize("mode", ["map", "rows"])
def test_the_environment_beats_the_size_rule(packs: dict[str, Path], monkeypatch: pytest.MonkeyPatch,
                                             mode: str) -> None:
    monkeypatch.setenv("FASTFEED_RAW_READS", mode)
    index = resolve_index(packs["tar-raw"])
    for memory in (1 << 20, 1 << 50):  # a small machine would say rows, a large one map
        monkeypatch.setattr(reader_mod, "_memory_bytes", lambda m=memory: m)
        r = DatasetReader(index)
        assert r.raw_reads() == mode
        assert type(r.read(0)["rgb8"]) is (FileSpan if mode == "rows" else memoryview)
        r.close()


def test_raw_reads_take_the_map_however_many_processes_share_an_epoch(packs: dict[str, Path],
                                                                      monkeypatch: pytest.MonkeyPatch,
                                                                      tmp_path: Path) -> None:
    """On a machine whose memory holds the dataset, every worker of every rank reads through the
    map, a few or many (measured: 1.46x fewer CPU-seconds per image than rows with 16 workers);
    on one whose memory does not, every worker reads rows."""
    monkeypatch.delenv("FASTFEED_RAW_READS", raising=False)
    for workers, world, memory, want in ((2, 1, 1 << 50, "map"), (1, 8, 1 << 50, "map"), (2, 3, 1 << 50, "map"),
                                         (2, 3, 1 << 20, "rows")):
        monkeypatch.setattr(reader_mod, "_memory_bytes", lambda m=memory: m)
        seen = tmp_path / f"w{workers}-{world}-{memory}"
        seen.mkdir()
        dl = fastfeed.loader(packs["tar-raw"], batch_size=2, image_size=16, num_workers=workers, rank=0,
                             world_size=world,
                             workers=fastfeed.Workers(worker_init_fn=partial(_record_raw_reads, str(seen))))
        next(iter(dl))
        del dl
        gc.collect()
        assert {p.read_text().split()[0] for p in seen.iterdir()} == {want}, (workers, world, memory)


def _boxes(seed: int) -> list:
    u = uniforms(seed=seed, epoch=0, ids=np.arange(4), n=NUM_UNIFORMS)
    boxes = [lambda h, w, r=r: random_resized_crop(h, w, r) for r in u]
    boxes.append(lambda h, w: (0, 0, h, w))  # all of it
    boxes.append(lambda h, w: (h - max(1, h // 3), w // 4, max(1, h // 3), max(1, w // 2)))  # the last rows
    return boxes


def test_spans_stay_readable_after_their_reader_is_evicted(packs: dict[str, Path],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    index = resolve_index(packs["tar-raw"])
    starts = [int(x) for x in index.shard_starts]
    assert len(index.shards) >= 3
    # shard 0, then 1 (shard 0's reader is closed), then 2 (1's is), then 0 again (a new reader)
    ids = [starts[0] + 1, starts[0] + 4, starts[1] + 2, starts[2], starts[2 + 1] - 1, starts[0] + 6]
    monkeypatch.setenv("FASTFEED_RAW_READS", "rows")
    rows = DatasetReader(index, max_open=1)
    samples = [rows.read(i) for i in ids]
    fds = {s["rgb8"].file.fd for s in samples}
    assert len(fds) == 4  # one descriptor per opening, three of them readers long closed
    gc.collect()
    for fd in fds:
        os.fstat(fd)  # the spans keep them open
    monkeypatch.setenv("FASTFEED_RAW_READS", "map")
    mapped = DatasetReader(index)
    assert mapped.raw_reads() == "map"
    dst_a, dst_b = np.empty((20, 16, 3), np.uint8), np.empty((20, 16, 3), np.uint8)
    for n, (i, s) in enumerate(zip(ids, samples)):
        ref = mapped.read(i)
        assert s["__key__"] == ref["__key__"] and s["__shape__"] == ref["__shape__"]
        px, ref_px = pixels(s["rgb8"], s["__shape__"]), pixels(ref["rgb8"], ref["__shape__"])
        assert isinstance(px, SpanPixels) and isinstance(ref_px, np.ndarray) and is_pixels(px)
        assert px.shape == ref_px.shape
        for k, box in enumerate(_boxes(n)):
            dst_a.fill(0)
            dst_b.fill(255)
            crop_into(px, dst_a, box, flip=bool(k % 2))
            crop_into(ref_px, dst_b, box, flip=bool(k % 2))
            assert np.array_equal(dst_a, dst_b), (i, k)
        whole = np.asarray(px)
        assert whole.flags.writeable and np.array_equal(whole, ref_px) and np.array_equal(px.copy(), ref_px)
    mapped.close()
    rows.close()
    del samples, s, px, whole
    gc.collect()
    for fd in fds:
        with pytest.raises(OSError):
            os.fstat(fd)  # the last span of each closed it
