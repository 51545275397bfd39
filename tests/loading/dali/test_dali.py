"""decode="dali": the DALI pipeline over fastfeed's tar shards, run CPU-only here (device_id=None).

What runs without a GPU: pipeline construction, the order (the same as decode="cpu",
per rank, per epoch), equal steps, epochs and resume, decoded pixels against the CPU
path, bad samples and bad indexes, the DALI index format against DALI's own reader and
reference files, and the tune knobs. Tests that need DALI skip without it (CI installs
the ``dali`` extra); the missing-DALI and laziness tests run either way.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from loading.dali._dali_data import corrupt_samples, dali_cpu, require_dali, tar_dataset, write_image_folder
from _dist import epoch_keys, run_ranks
import torch

import fastfeed
from fastfeed.loading.dali.backend import TUNE_SPACE
from fastfeed.loading.options import DALI_ONLY
from fastfeed.errors import (
    ConfigError,
    IndexMismatchError,
    MissingDependencyError,
    SampleError,
    StateError,
)
from fastfeed.formats.tar import TarShardReader, TarShardWriter
from fastfeed.packed.index import DatasetIndex
from fastfeed.loading.order.epoch import plan_epoch
from tools.synth import make_jpeg

pytestmark = [pytest.mark.dali, pytest.mark.usefixtures("isolated_store")]


@pytest.fixture(scope="module")
def dali() -> Any:
    return require_dali()


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """37 images of varied sizes, packed by ``fastfeed.pack`` into 5 tar shards."""
    rng = np.random.default_rng(1)
    sizes = [(int(rng.integers(40, 90)), int(rng.integers(40, 90))) for _ in range(37)]
    base = tmp_path_factory.mktemp("dali")
    src = write_image_folder(base / "src", sizes)
    fastfeed.pack(src, base / "ff", samples_per_shard=8)
    return base / "ff"


@pytest.fixture(scope="module")
def square(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """12 images of exactly 32x32 (no resize anywhere with image_size=32, Crop(fraction=1))."""
    base = tmp_path_factory.mktemp("dali_sq")
    src = write_image_folder(base / "src", [(32, 32)] * 12, texture=20.0)
    fastfeed.pack(src, base / "ff", samples_per_shard=5)
    return base / "ff"


def _loader(root: Path, **kw: Any) -> Any:
    """A CPU-only DALI loader; the fields of fastfeed.Dali in ``kw`` (num_threads=, ...) change DALI_CPU's."""
    args: dict[str, Any] = dict(batch_size=4, image_size=16)
    args.update(kw)
    return fastfeed.loader(str(root), **dali_cpu(**args))


def _keys(dl: Any) -> list[list[str]]:
    return [b["__key__"] for b in dl]


# ---------------------------------------------------------------------- no DALI, no GPU
def test_importing_fastfeed_does_not_import_dali() -> None:
    code = ("import sys, fastfeed, fastfeed.loading.dali.backend, fastfeed.loading.api, fastfeed.tuning.api; "
            "from fastfeed.knobs.space import space_for; space_for('dali'); "
            "print('nvidia.dali' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stderr[-2000:]


def test_missing_dali_is_one_error_with_the_install_line(packed: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [m for m in sys.modules if m == "nvidia.dali" or m.startswith("nvidia.dali.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "nvidia.dali", None)  # import nvidia.dali -> ImportError
    for make in (lambda: _loader(packed),
                 lambda: fastfeed.loader(str(packed), batch_size=4, image_size=16, decode="dali")):
        with pytest.raises(MissingDependencyError) as e:
            make()
        msg = str(e.value)
        assert "pip install 'fastfeed[dali]'" in msg and "pip install 'fastfeed[dali-cuda120]'" in msg
        assert "nvidia-dali-cuda130" in msg and "nvidia-dali-cuda120" in msg and "decode='cpu'" in msg
        assert isinstance(e.value, ImportError)


def test_without_a_gpu_the_error_suggests_cpu_decode(dali: Any, packed: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    for make in (lambda: _loader(packed, device_id="auto"),
                 lambda: fastfeed.loader(str(packed), batch_size=4, image_size=16, decode="dali")):
        with pytest.raises(ConfigError, match="decode='cpu'"):
            make()


def test_options_are_validated(dali: Any, packed: Path) -> None:
    with pytest.raises(ConfigError, match="image_size"):
        _loader(packed, image_size=None)
    with pytest.raises(ConfigError, match="transform"):
        _loader(packed, transform=lambda s: s)
    with pytest.raises(ConfigError, match="mean.*std.*normalise float outputs"):
        _loader(packed, mean=(0.5, 0.5, 0.5))
    with pytest.raises(ConfigError, match="hw_decoder_load"):
        _loader(packed, hw_decoder_load=1.5)
    with pytest.raises(ConfigError, match="output"):
        _loader(packed, output="int8")
    with pytest.raises(ConfigError, match="worker_init_fn"):
        _loader(packed, workers=fastfeed.Workers(worker_init_fn=print))
    with pytest.raises(ConfigError, match="bogus"):
        _loader(packed, bogus=1)


# ---------------------------------------------------------------------- batches
def test_batches_have_the_cpu_paths_structure(dali: Any, packed: Path) -> None:
    idx = DatasetIndex.load(packed)
    dl = _loader(packed, batch_size=8)
    assert len(dl) == 5 and dl.options.knobs_from == "explicit"
    labels_by_key = {}
    for s in range(len(idx.shards)):
        for smp in TarShardReader(idx.shard_path(s)):
            labels_by_key[smp["__key__"]] = int(smp["cls"])
    seen = 0
    for b in dl:
        n = len(b["__key__"])
        assert b["image"].shape == (n, 3, 16, 16) and b["image"].dtype == torch.uint8
        assert b["label"].dtype == torch.int64 and b["label"].shape == (n,)
        assert b["label"].tolist() == [labels_by_key[k] for k in b["__key__"]]
        assert b["cls"] == b["label"].tolist()  # the shards' cls field, as the CPU path gives it
        seen += n
    assert seen == 37 and dl.stats.steps == 5 and dl.stats.samples == 37


def test_float16_normalised_nhwc_output(dali: Any, packed: Path) -> None:
    mean, std = (0.5, 0.4, 0.3), (0.2, 0.25, 0.3)
    u8 = next(iter(_loader(packed, augment=False)))["image"].float()
    f16 = next(iter(_loader(packed, augment=False, output="float16", mean=mean, std=std, layout="NHWC")))["image"]
    assert f16.dtype == torch.float16 and f16.shape == (4, 16, 16, 3)
    expect = (u8.permute(0, 2, 3, 1) / 255 - torch.tensor(mean)) / torch.tensor(std)
    assert torch.allclose(f16.float(), expect, atol=0.02)
    default = next(iter(_loader(packed, augment=False, output="float32")))["image"]
    mean_in, std_in = torch.tensor((0.485, 0.456, 0.406)), torch.tensor((0.229, 0.224, 0.225))
    ref = (u8 / 255 - mean_in[:, None, None]) / std_in[:, None, None]
    assert torch.allclose(default, ref, atol=1e-3)


# ---------------------------------------------------------------------- order
@pytest.mark.parametrize("world_size,drop_last", [(1, False), (3, False), (3, True), (4, False)])
def test_order_is_the_cpu_paths_per_rank_and_epoch(dali: Any, packed: Path, world_size: int, drop_last: bool) -> None:
    for rank in range(world_size):
        dl = _loader(packed, world_size=world_size, rank=rank, drop_last=drop_last, batch_size=3, seed=5)
        cpu = fastfeed.loader(str(packed), batch_size=3, image_size=16, world_size=world_size, rank=rank,
                              drop_last=drop_last, seed=5, num_workers=0)
        assert len(dl) == len(cpu)
        for epoch in (0, 2):
            dl.set_epoch(epoch)
            cpu.set_epoch(epoch)
            got, want = list(dl), list(cpu)
            assert [b["__key__"] for b in got] == [b["__key__"] for b in want]
            assert [b["label"].tolist() for b in got] == [b["label"].tolist() for b in want]


@pytest.mark.parametrize("world_size,drop_last", [(2, False), (3, False), (3, True), (5, False)])
def test_ranks_split_the_data_with_equal_steps(dali: Any, packed: Path, world_size: int, drop_last: bool) -> None:
    key_of = {}
    idx = DatasetIndex.load(packed)
    for s in range(len(idx.shards)):
        for smp in TarShardReader(idx.shard_path(s)):
            key_of[smp["__key__"]] = smp["__key__"]
    per_rank = [[k for b in _loader(packed, world_size=world_size, rank=r, drop_last=drop_last, batch_size=2)
                 for k in b["__key__"]] for r in range(world_size)]
    steps = {len(_loader(packed, world_size=world_size, rank=r, drop_last=drop_last, batch_size=2))
             for r in range(world_size)}
    assert len(steps) == 1
    counts = {len(k) for k in per_rank}
    assert len(counts) == 1  # equal samples, so equal batches, on every rank
    flat = [k for ks in per_rank for k in ks]
    if drop_last:
        assert len(set(flat)) == len(flat) and len(flat) <= 37
    else:
        assert set(flat) == set(key_of)  # every sample, ...
        assert len(flat) - len(set(flat)) <= world_size - 1  # ... at most world_size - 1 repeats


def test_shuffle_changes_with_epoch_and_is_deterministic(dali: Any, packed: Path) -> None:
    a, b, c = _loader(packed, seed=1), _loader(packed, seed=1), _loader(packed, seed=2)
    e0, e1 = _keys(a), _keys(a)  # the second pass moves to epoch 1 by itself
    assert e0 != e1 and sorted(sum(e0, [])) == sorted(sum(e1, []))
    assert _keys(b) == e0
    assert _keys(c) != e0
    unshuffled = [k for batch in _keys(_loader(packed, shuffle=False)) for k in batch]
    idx = DatasetIndex.load(packed)
    plan = plan_epoch(idx.shard_counts, seed=0, epoch=0, world_size=1, rank=0, batch_size=4,
                      drop_last=False, shuffle=False)
    assert plan.samples.tolist() == list(range(37)) and len(unshuffled) == 37


# ---------------------------------------------------------------------- epochs and resume
def test_epochs_jump_and_discard_in_flight_batches(dali: Any, packed: Path) -> None:
    ref = _loader(packed, seed=3)
    want = {e: (ref.set_epoch(e), _keys(ref))[1] for e in (0, 1, 2, 4)}
    dl = _loader(packed, seed=3, prefetch_queue_depth=3)
    it = iter(dl)
    assert [next(it)["__key__"] for _ in range(2)] == want[0][:2]
    it.close()  # abandoned mid-epoch: batches 2.. are already in flight
    assert _keys(dl) == want[1]  # a new pass is the next epoch, as on the CPU path
    assert _keys(dl) == want[2]  # and so after a completed one
    dl.set_epoch(4)
    assert _keys(dl) == want[4]
    dl.set_epoch(0)
    assert _keys(dl) == want[0]
    assert dl.stats.passes == 5


def test_only_the_newest_iterator_delivers(dali: Any, packed: Path) -> None:
    dl = _loader(packed)
    first = iter(dl)
    next(first)
    second = iter(dl)
    next(second)
    with pytest.raises(fastfeed.FastfeedError, match="iterated again"):
        next(first)


@pytest.mark.parametrize("stop", [0, 1, 3, 5])
def test_resume_mid_epoch_continues_the_same_stream(dali: Any, packed: Path, stop: int) -> None:
    full = _loader(packed, batch_size=4, seed=9, world_size=2, rank=1)
    full.set_epoch(2)
    want = _keys(full)  # 5 batches (19 samples of 37 on each of 2 ranks)
    next_epoch = _keys(full)
    dl = _loader(packed, batch_size=4, seed=9, world_size=2, rank=1)
    dl.set_epoch(2)
    it = iter(dl)
    head = [next(it)["__key__"] for _ in range(stop)]
    state = dl.state_dict()
    assert (state["epoch"], state["batches"]) == (2, stop)
    fresh = _loader(packed, batch_size=4, seed=9, world_size=2, rank=1)
    fresh.load_state_dict(state)
    if stop < len(want):
        assert head + _keys(fresh) == want
    else:  # saved at the end of the epoch: the next pass is epoch 3
        assert head == want and _keys(fresh) == next_epoch and fresh.epoch == 3


def test_state_is_interchangeable_with_the_cpu_path(dali: Any, packed: Path) -> None:
    cpu = fastfeed.loader(str(packed), batch_size=4, image_size=16, seed=4, num_workers=0)
    it = iter(cpu)
    head = [next(it)["__key__"] for _ in range(3)]
    dl = _loader(packed, seed=4)
    assert set(dl.state_dict()) == set(cpu.state_dict())
    dl.load_state_dict(cpu.state_dict())
    cpu2 = fastfeed.loader(str(packed), batch_size=4, image_size=16, seed=4, num_workers=0)
    assert head + _keys(dl) == _keys(cpu2)


def test_state_from_another_setup_is_refused(dali: Any, packed: Path) -> None:
    state = _loader(packed, world_size=2, rank=0).state_dict()
    _loader(packed, world_size=4, rank=0).load_state_dict(state)  # elastic: another world size fits
    with pytest.raises(StateError, match="seed=0, now 1"):
        _loader(packed, world_size=2, rank=0, seed=1).load_state_dict(state)
    with pytest.raises(StateError, match="lacks"):
        _loader(packed, world_size=2, rank=0).load_state_dict({"epoch": 1})
    with pytest.raises(StateError, match="batches=99"):
        _loader(packed, world_size=2, rank=0).load_state_dict({**state, "batches": 99})


# ---------------------------------------------------------------------- pixels
def test_decoded_pixels_match_the_cpu_decoder(dali: Any, square: Path) -> None:
    """Same samples, no random augmentation, no resize: DALI's CPU decoder vs fastfeed's."""
    from fastfeed.decode.cpu import CpuDecoder

    idx = DatasetIndex.load(square)
    raw = {s["__key__"]: s for i in range(len(idx.shards)) for s in TarShardReader(idx.shard_path(i))}
    dl = _loader(square, image_size=32, augment=False, crop=fastfeed.Crop(fraction=1.0), batch_size=5)
    for backend, max_tol, mean_tol in (("pillow", 0, 0.0), ("auto", 8, 1.5)):
        dec = CpuDecoder(image_size=32, augment=False, crop_fraction=1.0, backend=backend)
        for b in dl:
            keys = b["__key__"]
            ref = dec.decode_batch([raw[k] for k in keys], np.arange(len(keys)), 0, None, None)
            diff = (b["image"].int() - ref["image"].contiguous().int()).abs()
            assert diff.max() <= max_tol and diff.float().mean() <= mean_tol, backend
            assert b["label"].tolist() == ref["label"].tolist() == [int(raw[k]["cls"]) for k in keys]


@pytest.mark.parametrize("backend,tolerance", [("pillow", 1.0), ("auto", 2.0)])
def test_evaluation_crop_matches_the_cpu_loader(dali: Any, packed: Path, backend: str, tolerance: float) -> None:
    """The same crop box from each image's header; only the resamplers differ (DALI's
    antialiased linear, Pillow's bilinear / OpenCV after DCT-scaled decode)."""
    dl = _loader(packed, image_size=24, augment=False, batch_size=8)
    cpu = fastfeed.loader(str(packed), batch_size=8, image_size=24, augment=False, num_workers=0,
                          workers=fastfeed.Workers(decode_backend=backend))
    for a, b in zip(dl, cpu):
        assert a["__key__"] == b["__key__"] and torch.equal(a["label"], b["label"])
        diff = (a["image"].int() - b["image"].contiguous().int()).abs().float()
        assert diff.mean() < tolerance


def test_augmentation_is_random_and_seeded(dali: Any, packed: Path) -> None:
    a = next(iter(_loader(packed, image_size=16)))["image"]
    b = next(iter(_loader(packed, image_size=16)))["image"]
    c = next(iter(_loader(packed, image_size=16, augment=False)))["image"]
    assert torch.equal(a, b) and not torch.equal(a, c)


# ---------------------------------------------------------------------- bad input
@pytest.fixture(scope="module")
def corrupt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tar_dataset(tmp_path_factory.mktemp("corrupt") / "ff", corrupt_samples(), 6)


def test_undecodable_sample_raises_with_shard_and_key(dali: Any, corrupt: Path) -> None:
    with pytest.raises(SampleError, match="k009.*no image field"):
        _loader(corrupt)
    samples = [(f"k{i:03d}", {"jpg": make_jpeg(np.random.default_rng(i), (24, 20))}) for i in range(6)]
    samples[2] = ("k002", {"jpg": b"garbage" * 40})
    root = tar_dataset(corrupt.parent / "one_bad", samples, 6)
    with pytest.raises(SampleError) as e:
        list(_loader(root, shuffle=False, batch_size=3))
    assert "shard-000000.tar" in str(e.value) and "k002" in str(e.value) and e.value.key == "k002"
    assert "on_error='skip'" in str(e.value)


def test_skip_counts_bad_samples_and_keeps_steps_equal(dali: Any, corrupt: Path) -> None:
    dl = _loader(corrupt, on_error="skip", batch_size=4, world_size=2, rank=0)
    other = _loader(corrupt, on_error="skip", batch_size=4, world_size=2, rank=1)
    for epoch in range(2):
        dl.set_epoch(epoch)
        other.set_epoch(epoch)
        mine, theirs = _keys(dl), _keys(other)
        assert len(mine) == len(theirs) == len(dl) == 2
        got = {k for b in mine + theirs for k in b}
        assert got == {f"k{i:03d}" for i in range(14)} - {"k005", "k009"}
    assert dl.stats.skipped + other.stats.skipped == 4  # two bad samples, two epochs
    assert any("k005" in m for m in dl.stats.skip_messages + other.stats.skip_messages)


def test_batch_of_only_bad_samples_still_makes_a_step(dali: Any, tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    samples = [(f"k{i}", {"jpg": make_jpeg(rng, (16, 16))}) for i in range(4)]
    samples[2] = ("k2", {"jpg": b"bad" * 50})
    samples[3] = ("k3", {"jpg": b"bad" * 50})
    dl = _loader(tar_dataset(tmp_path / "ff", samples, 4), shuffle=False, batch_size=2, on_error="skip")
    got = list(dl)
    assert [b["__key__"] for b in got] == [["k0", "k1"], []]
    assert got[1]["image"].shape == (0, 3, 16, 16) and dl.stats.skipped == 2


def test_index_problems_are_named(dali: Any, packed: Path, tmp_path: Path) -> None:
    import shutil

    broken = tmp_path / "ff"
    shutil.copytree(packed, broken)
    (broken / "shard-000001.idx").unlink()
    with pytest.raises(IndexMismatchError, match="shard-000001.idx.*fastfeed pack"):
        _loader(broken)
    text = (packed / "shard-000001.idx").read_text().splitlines()
    (broken / "shard-000001.idx").write_text("\n".join(text[:-1]) + "\n")
    with pytest.raises(IndexMismatchError, match="shard-000001.idx"):
        _loader(broken)
    lmdb_src = write_image_folder(tmp_path / "src", [(20, 20)] * 4)
    fastfeed.pack(lmdb_src, tmp_path / "lmdb", format="lmdb")
    with pytest.raises(ConfigError, match="tar shards.*decode='cpu'"):
        _loader(tmp_path / "lmdb")


# ---------------------------------------------------------------------- DALI index format
def test_dali_index_matches_dalis_reference_files(dali: Any, shared_data: Path, tmp_path: Path) -> None:
    """fastfeed's tar writer + DALI index, on DALI_extra's images in its tar's order, give
    the very index files DALI_extra ships (v1.2, and v1.1 without member names)."""
    src = shared_data / "imagenet-sample"
    ref12 = (shared_data / "dali-index" / "v1.2.idx").read_text()
    w = TarShardWriter(tmp_path / "train.tar")
    for line in ref12.splitlines()[1:]:
        member = line.split()[3]  # single_cpy/jpeg/<label>/<name>.cls
        key = member.rsplit(".", 1)[0]
        label, name = key.split("/")[-2:]
        w.add(key, {"cls": label.encode(), "jpg": (src / label / f"{name}.jpg").read_bytes()})
    ours = w.dali_index()
    w.close()
    assert ours.split() == ref12.split()
    v11 = [" ".join(tok for j, tok in enumerate(line.split()) if j % 4 != 3) for line in ours.splitlines()[1:]]
    ref11 = (shared_data / "dali-index" / "v1.1.idx").read_text().splitlines()
    assert v11 == [ln.strip() for ln in ref11[1:]]


def test_dalis_own_reader_reads_fastfeeds_shards(dali: Any, packed: Path) -> None:
    """fn.readers.webdataset (what hand-written pipelines use) accepts pack's index files
    and yields the very bytes fastfeed feeds."""
    from nvidia.dali import Pipeline, fn

    idx = DatasetIndex.load(packed)
    raw = {s["__key__"]: s for i in range(len(idx.shards)) for s in TarShardReader(idx.shard_path(i))}
    pipe = Pipeline(batch_size=37, num_threads=1, device_id=None)
    with pipe:
        jpg, cls = fn.readers.webdataset(
            paths=[idx.shard_path(i) for i in range(len(idx.shards))],
            index_paths=[str(packed / s.dali_index) for s in idx.shards], ext=["jpg", "cls"])
        pipe.set_outputs(jpg, cls)
    pipe.build()
    jpgs, clss = pipe.run()
    got = {bytes(np.array(jpgs[i])) for i in range(37)}
    assert got == {s["jpg"] for s in raw.values()}
    assert sorted(int(bytes(np.array(clss[i]))) for i in range(37)) == sorted(int(s["cls"]) for s in raw.values())


def test_index_parser_handles_member_names_with_spaces() -> None:
    from fastfeed.loading.dali.table import parse_dali_index

    got = parse_dali_index("v1.2 1\ncls 512 1 my dir/a b.cls jpg 1536 9 my dir/a b.jpg\n", "x.idx")
    assert got == [[("cls", 512, 1, "my dir/a b.cls"), ("jpg", 1536, 9, "my dir/a b.jpg")]]
    with pytest.raises(IndexMismatchError, match="x.idx"):
        parse_dali_index("v2.0 1\n", "x.idx")


def test_keys_of_names_with_spaces_come_from_the_tar_headers(tmp_path: Path) -> None:
    """Shards whose member names hold whitespace get a v1.1 DALI index (no names): the
    table reads those keys from the tar headers (plain, pax non-ASCII and long names), so
    decode="dali" returns the same keys as decode="cpu" (no DALI needed for the table)."""
    from fastfeed.loading.dali.table import sample_table
    from tools.synth import make_jpeg

    rng = np.random.default_rng(3)
    names = ["IMG 0001", "plain", "caf\u00e9 au lait", "x" * 120 + " long", "tab\tname"]
    for i, stem in enumerate(names):
        d = tmp_path / "src" / f"class {i % 2}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{stem}.jpg").write_bytes(make_jpeg(rng, (24, 16)))
    fastfeed.pack(tmp_path / "src", tmp_path / "ff", samples_per_shard=2)
    idx = DatasetIndex.load(tmp_path / "ff")
    assert any((tmp_path / "ff" / str(s.dali_index)).read_text().startswith("v1.1") for s in idx.shards)
    table = sample_table(idx)
    want = [k for b in fastfeed.loader(tmp_path / "ff", batch_size=1, shuffle=False, decode=None, num_workers=0)
            for k in b["__key__"]]
    assert table.keys(np.arange(idx.num_samples)) == want
    assert sorted(k.rsplit("/", 1)[1] for k in want) == sorted(names)


# ---------------------------------------------------------------------- tune
def test_tune_space_names_loader_keywords_and_tuned_knobs_are_used(dali: Any, packed: Path) -> None:
    import inspect

    from fastfeed.host import host_info
    from fastfeed.tuning.search import search
    from fastfeed.knobs.record import TuneKey, TuneRecord, save_record

    params = inspect.signature(fastfeed.loader).parameters
    assert TUNE_SPACE.workers == (0,)
    for knob in TUNE_SPACE.knobs:  # loader() takes them through dali=fastfeed.Dali(...)
        assert knob.name in DALI_ONLY and knob.name not in params and knob.default in knob.candidates(16)
    assert TUNE_SPACE.knobs[1].candidates(4) == (2, 4)

    from fastfeed.timing.measure import measure

    def measure_fn(setting: Any) -> Any:
        dl = _loader(packed, batch_size=4, **dict(setting.knobs))
        return measure(lambda: iter(dl), min_batches=2, min_time=0.0, max_time=2.0, settle=0.0)

    out = search(measure_fn, cores=2, space=TUNE_SPACE, time_budget=3.0)
    assert out.best.ok and {k for k, _ in out.best.setting.knobs} == {k.name for k in TUNE_SPACE.knobs}

    idx = DatasetIndex.load(packed)
    key = TuneKey(idx.fingerprint, host_info(), 1, 4, "dali", (16, 16))
    save_record(TuneRecord(key, 0, None, {"num_threads": 3, "hw_decoder_load": 0.9,
                                          "prefetch_queue_depth": 3}, 1000.0, "2026-01-01"), str(packed))
    cpu_dali = fastfeed.Dali(device_id=None)
    dl = fastfeed.loader(str(packed), batch_size=4, image_size=16, decode="dali", dali=cpu_dali)
    o, knobs = dl.options, dl.options.dali
    assert (knobs.num_threads, knobs.hw_decoder_load, knobs.prefetch_queue_depth, o.knobs_from) == (3, 0.9, 3, "tuned")
    assert next(iter(dl))["image"].shape == (4, 3, 16, 16)
    other = fastfeed.loader(str(packed), batch_size=8, image_size=16, decode="dali", dali=cpu_dali)  # another key
    assert other.options.knobs_from == "default" and other.options.dali.hw_decoder_load == 0.65


def test_fastfeed_tune_decode_dali_end_to_end(dali: Any, packed: Path) -> None:
    """``fastfeed tune --decode dali`` measures the real loader and ``"auto"`` uses the result."""
    import importlib
    import inspect

    loader_mod = importlib.import_module("fastfeed.loading.api")
    params = inspect.signature(loader_mod.loader).parameters.values()
    if not any(p.kind is p.VAR_KEYWORD for p in params):
        pytest.skip("fastfeed.loader() does not forward decode='dali' options (num_threads, ...) yet")
    tune = importlib.import_module("fastfeed.tuning.api").tune
    res = tune(str(packed), batch_size=4, decode="dali", image_size=16, time_budget=4,
               dali=fastfeed.Dali(device_id=None))
    knobs = dict(res.setting.knobs)
    assert set(knobs) == {k.name for k in TUNE_SPACE.knobs} and res.setting.num_workers == 0
    dl = fastfeed.loader(str(packed), batch_size=4, image_size=16, decode="dali", dali=fastfeed.Dali(device_id=None))
    assert dl.options.knobs_from == "tuned"
    assert {k: getattr(dl.options.dali, k) for k in knobs} == knobs


# ---------------------------------------------------------------------- real ranks
def _dali_rank(rank: int, world: int, root: str, out: str, init: str) -> None:
    import json

    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world)
    try:
        dl = fastfeed.loader(root, batch_size=3, image_size=16, decode="dali", seed=5,
                             dali=fastfeed.Dali(device_id=None, num_threads=1, hw_decoder_load=0.65,
                                                prefetch_queue_depth=2))
        epochs = epoch_keys(dl, 2)
        Path(out).write_text(json.dumps({"rank": dl.rank, "world": dl.world_size, "len": len(dl),
                                         "epochs": epochs}))
    finally:
        dist.destroy_process_group()


@pytest.mark.dist
def test_three_gloo_ranks_take_rank_from_torch_distributed(dali: Any, packed: Path, tmp_path: Path) -> None:
    import json
    import multiprocessing as mp
    from collections import Counter

    # fresh processes like torchrun's (DALI's threads do not survive a fork of this one); the
    # fork server imports torch and DALI once, so the ranks start fast
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "nvidia.dali", "fastfeed.loading.dali.backend", "test_dali"])
    results = run_ranks(ctx, _dali_rank, lambda r, out: (r, 3, str(packed), out, str(tmp_path / "init")),
                        3, tmp_path)
    assert [(r["rank"], r["world"]) for r in results] == [(0, 3), (1, 3), (2, 3)]
    assert len({r["len"] for r in results}) == 1
    for e in range(2):
        counts = Counter(k for r in results for k in r["epochs"][e])
        assert len(counts) == 37 and sum(counts.values()) == 39  # 37 samples + 2 repeated slots
    assert results[0]["epochs"][0] != results[0]["epochs"][1]
