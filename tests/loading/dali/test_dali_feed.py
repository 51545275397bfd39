"""How decode="dali" feeds its pipeline (CPU-only DALI here, device_id=None).

The feeder gives DALI each batch as one ``TensorListCPU`` of zero-copy views of the
mapped shards plus int64 ``meta`` rows (generation, epoch, step, id, label); the loader
keeps the pipeline's inputs fed one batch ahead and starts DALI's next iteration before
it builds the torch batch. These tests pin that down: the bytes and their addresses,
the meta rows, the order of the steps, DALI's legacy executor, and a DALI whose
``TensorListCPU`` cannot gather without copying.
"""

from __future__ import annotations

import functools
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from loading.dali._dali_data import dali_cpu

import fastfeed
from fastfeed.loading.dali.pipeline import _AHEAD, DaliLoader
from fastfeed.loading.dali.feed import EPOCH, GENERATION, LABEL, SAMPLE, STEP, image_bytes, tensor_batch
from fastfeed.loading.dali.backend import import_dali
from fastfeed.formats.tar import TarShardWriter
from fastfeed.packed.index import DatasetIndex, ShardInfo
from tools.synth import make_jpeg

pytestmark = [pytest.mark.dali, pytest.mark.usefixtures("isolated_store")]


@pytest.fixture(scope="module")
def dali() -> Any:
    pytest.importorskip("nvidia.dali")
    return import_dali()


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """23 JPEGs of varied sizes in 3 classes, packed into 4 tar shards."""
    rng = np.random.default_rng(5)
    base = tmp_path_factory.mktemp("dali_feed")
    for i in range(23):
        d = base / "src" / f"c{i % 3}"
        d.mkdir(parents=True, exist_ok=True)
        size = (int(rng.integers(24, 60)), int(rng.integers(24, 60)))
        (d / f"img{i:03d}.jpg").write_bytes(make_jpeg(rng, size, texture=3.0))
    fastfeed.pack(base / "src", base / "ff", samples_per_shard=6)
    return base / "ff"


def _loader(root: Path, **kw: Any) -> Any:
    """A CPU-only DALI loader; the fields of fastfeed.Dali in ``kw`` (prefetch_queue_depth=, ...) change DALI_CPU's."""
    args: dict[str, Any] = dict(batch_size=4, image_size=16, seed=3)
    args.update(kw)
    return fastfeed.loader(str(root), **dali_cpu(**args))


def _with(dl: Any, dali: SimpleNamespace) -> DaliLoader:
    """A loader like ``dl`` built on another DALI namespace."""
    return DaliLoader(dl.index, dl.options, dali=dali)


def test_feeder_gives_dali_views_of_the_mapped_shards_and_meta_rows(dali: Any, packed: Path) -> None:
    dl = _loader(packed, world_size=2, rank=1)
    feeder, table, maps = dl._feeder, dl._table, dl._maps
    feeder.restart(epoch=1, step=2)
    images, meta = feeder()
    planned = dl._cursor.plan(1).batch(2).ids
    assert meta.dtype == np.int64 and meta.shape == (len(planned), 5)
    assert (meta[:, GENERATION] == feeder.generation).all()
    assert (meta[:, EPOCH] == 1).all() and (meta[:, STEP] == 2).all()
    assert meta[:, SAMPLE].tolist() == planned.tolist()
    assert meta[:, LABEL].tolist() == np.asarray(dl.index.labels)[planned].tolist()
    assert len(images) == len(planned)
    for j, i in enumerate(planned.tolist()):
        assert np.array(images[j]).tobytes() == image_bytes(table, maps, i)
        s = int(table.shard_of(np.array([i]))[0])
        assert images[j].data_ptr() == maps.array(s).ctypes.data + int(table.offsets[i])  # not a copy
    fed = feeder.pending[-1]
    assert (fed.epoch, fed.step, fed.ids.tolist()) == (1, 2, planned.tolist())


def test_excluded_samples_leave_their_batch_and_are_reported(dali: Any, packed: Path) -> None:
    dl = _loader(packed, shuffle=False)
    feeder = dl._feeder
    feeder.exclude([1, 2])
    feeder.exclude(np.array([2, 5]))
    assert feeder.excluded == {1, 2, 5}
    feeder.restart(0, 0)
    _, meta = feeder()
    _, meta2 = feeder()
    assert meta[:, SAMPLE].tolist() == [0, 3] and feeder.pending[0].skipped == (1, 2)
    assert meta2[:, SAMPLE].tolist() == [4, 6, 7] and feeder.pending[1].skipped == (5,)


def test_keys_with_non_ascii_characters(dali: Any, tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    keys = ["été/ü-1", "a/b", "日本/猫", "z"]
    root = tmp_path / "ff"
    root.mkdir()
    w = TarShardWriter(root / "shard-000000.tar")
    offsets = [w.add(k, {"jpg": make_jpeg(rng, (16, 16)), "cls": b"%d" % j}) for j, k in enumerate(keys)]
    (root / "shard-000000.idx").write_text(w.dali_index())
    size, sha = w.close()
    idx = DatasetIndex(format="tar", num_samples=4, shards=(ShardInfo("shard-000000.tar", 4, size, sha,
                                                                       "shard-000000.idx"),), fields=("cls", "jpg"))
    idx.with_arrays(offsets=np.array(offsets), labels=None).save(root)
    got = [k for b in _loader(root, shuffle=False, batch_size=3) for k in b["__key__"]]
    want = [k for b in fastfeed.loader(str(root), batch_size=3, image_size=16, shuffle=False, num_workers=0)
            for k in b["__key__"]]
    assert got == want == keys


@pytest.mark.parametrize("dynamic", [True, False])
def test_the_next_iteration_starts_before_the_batch_is_built(dali: Any, packed: Path, dynamic: bool) -> None:
    """With DALI's dynamic executor (outputs outlive release) the loader hands DALI its next
    iteration first; with the legacy one it copies the outputs out first. Either way the
    pipeline's inputs stay fed ``_AHEAD`` batch beyond what it runs."""
    ns = SimpleNamespace(**{**vars(dali), "Pipeline": functools.partial(dali.Pipeline, exec_dynamic=dynamic)})
    ref = _loader(packed, prefetch_queue_depth=3, augment=False)
    dl = _with(ref, ns)
    seen: list[tuple[int, int]] = []
    build = dl._to_batch

    def spy(outs: Any, ids: np.ndarray, valid: np.ndarray) -> Any:
        pending = dl._feeder.pending
        seen.append((len(pending), pending[-1].step))
        return build(outs, ids, valid)

    dl._to_batch = spy  # type: ignore[method-assign]
    got = list(dl)
    assert dl._dynamic is dynamic
    ahead = 3 + _AHEAD if dynamic else 3 + _AHEAD - 1
    assert [n for n, _ in seen] == [ahead] * len(dl)
    assert [last for _, last in seen[:2]] == [ahead, ahead + 1]  # the feed runs ahead of the batches
    want = list(ref)
    assert [b["__key__"] for b in got] == [b["__key__"] for b in want]
    for a, b in zip(got, want):
        assert torch.equal(a["image"], b["image"]) and torch.equal(a["label"], b["label"])


def test_restarts_discard_what_was_fed_ahead_with_the_legacy_executor(dali: Any, packed: Path) -> None:
    ns = SimpleNamespace(**{**vars(dali), "Pipeline": functools.partial(dali.Pipeline, exec_dynamic=False)})
    ref = _loader(packed)
    want = {e: (ref.set_epoch(e), [b["__key__"] for b in ref])[1] for e in (0, 2)}
    dl = _with(_loader(packed, prefetch_queue_depth=3), ns)
    it = iter(dl)
    assert next(it)["__key__"] == want[0][0]
    dl.set_epoch(2)
    assert [b["__key__"] for b in dl] == want[2]
    saved = dl.state_dict()
    state = {**saved, "epoch": 0, "batches": 3, "stages": [saved["stages"][-1][:3] + [3]]}
    dl.load_state_dict(state)
    assert [b["__key__"] for b in dl] == want[0][3:]


def test_a_dali_that_cannot_gather_without_copying_gets_a_list_of_tensors(dali: Any, packed: Path) -> None:
    class OldTensorList:
        """``TensorListCPU`` of a DALI without the ``contiguous`` argument."""

        def __new__(cls, *args: Any) -> Any:
            if len(args) > 2:
                raise TypeError("incompatible constructor arguments")
            return dali.TensorListCPU(*args)

    old = SimpleNamespace(**{**vars(dali), "TensorListCPU": OldTensorList})
    views = [memoryview(b"ab"), memoryview(b"cde")]
    packed_views = tensor_batch(old)(views)
    assert isinstance(packed_views, list) and [np.array(t).tobytes() for t in packed_views] == [b"ab", b"cde"]
    gathered = tensor_batch(dali)(views)
    assert [np.array(gathered[j]).tobytes() for j in range(2)] == [b"ab", b"cde"]
    ref = _loader(packed, augment=False)
    got, want = list(_with(ref, old)), list(ref)
    assert [b["__key__"] for b in got] == [b["__key__"] for b in want]
    assert all(torch.equal(a["image"], b["image"]) for a, b in zip(got, want))
