"""``decode="dali"`` with a :class:`~fastfeed.DistributedAspectRatioSampler`: the batches of ``decode="cpu"``.

The same steps, keys, bucket shapes, ``original_size`` and ``crop_top_left`` (the crops come from the one
``cover_crops``), pixels within resampling noise; a header that lies is an error naming the key or a counted
skip; resume mid-epoch. DALI runs CPU-only here (``Dali(device_id=None)``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from loading._aspect_data import odd_images, pack, sampler, write_images
from loading.dali._dali_data import dali_cpu, require_dali

import fastfeed
from fastfeed.errors import SampleError
from fastfeed.packed.index import DatasetIndex

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return pack(tmp_path_factory.mktemp("dali-aspect"))


def _both(dst: Path, epoch: int = 0, **kw: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Epoch ``epoch`` through decode="cpu" and decode="dali" with the same sampler settings."""
    cpu = fastfeed.loader(dst, batch_sampler=sampler(dst, **kw.pop("s", {})), num_workers=0, **kw)
    dali = fastfeed.loader(dst, batch_sampler=sampler(dst), **dali_cpu(**kw))
    cpu.set_epoch(epoch)
    dali.set_epoch(epoch)
    return list(cpu), list(dali)


def _assert_same(cpu: list[dict[str, Any]], dali: list[dict[str, Any]], noise: float = 4.0) -> None:
    assert len(cpu) == len(dali) > 0
    for a, b in zip(cpu, dali):
        assert a["__key__"] == b["__key__"]
        assert a["image"].shape == b["image"].shape
        for k in ("original_size", "crop_top_left", "valid", "label"):
            assert a[k].tolist() == b[k].tolist(), k
        diff = (a["image"].float() - b["image"].float()).abs().mean(dim=(1, 2, 3))
        assert diff.max() < noise, (a["__key__"], diff.tolist())  # resamplers differ; a wrong crop by far more


@pytest.mark.parametrize("augment", [False, True])
def test_dali_cuts_the_cpu_crops(photos: Path, augment: bool) -> None:
    require_dali()
    cpu, dali = _both(photos, epoch=1, augment=augment)
    _assert_same(cpu, dali)
    assert len({tuple(b["image"].shape[2:]) for b in dali}) > 1  # several buckets, each batch one tensor


def test_dali_odd_images_and_exif_rotation(tmp_path: Path) -> None:
    require_dali()
    odd = odd_images()
    src = write_images(tmp_path / "src", n=4, extra={k: v[0] for k, v in odd.items()})
    dst = tmp_path / "ff"
    fastfeed.pack(src, dst, samples_per_shard=4, shuffle=False)
    cpu = list(fastfeed.loader(dst, batch_sampler=sampler(dst, batch_size=1), num_workers=0, augment=False))
    dali = list(fastfeed.loader(dst, batch_sampler=sampler(dst, batch_size=1), **dali_cpu(augment=False)))
    _assert_same(cpu, dali, noise=6.0)


def test_dali_header_that_lies(tmp_path: Path) -> None:
    require_dali()
    dst = pack(tmp_path, n=12)
    idx = DatasetIndex.load(dst)
    sizes = np.asarray(idx.image_sizes).copy()
    sizes[4] = sizes[4][::-1] + np.array([0, 0] if sizes[4][0] != sizes[4][1] else [10, 0])
    idx.with_sizes(sizes).save(dst)
    with pytest.raises(SampleError, match=r"sample '.*': the image is .* does not match the index"):
        list(fastfeed.loader(dst, batch_sampler=sampler(dst), **dali_cpu()))
    dl = fastfeed.loader(dst, batch_sampler=sampler(dst), **dali_cpu(on_error="skip"))
    keys = [k for b in dl for k in b["__key__"]]
    assert len(keys) == 11 and dl.stats.summary()["skipped"] == 1
    cpu = fastfeed.loader(dst, batch_sampler=sampler(dst), num_workers=0, on_error="skip")
    assert [k for b in cpu for k in b["__key__"]] == keys


def test_dali_resume_mid_epoch(photos: Path) -> None:
    require_dali()
    whole = fastfeed.loader(photos, batch_sampler=sampler(photos), **dali_cpu())
    whole.set_epoch(2)
    full = list(whole)
    dl = fastfeed.loader(photos, batch_sampler=sampler(photos), **dali_cpu())
    dl.set_epoch(2)
    it = iter(dl)
    head = [next(it) for _ in range(2)]
    state = dl.state_dict()
    fresh = fastfeed.loader(photos, batch_sampler=sampler(photos), **dali_cpu())
    fresh.load_state_dict(state)
    rest = list(fresh)
    _assert_same(full, head + rest, noise=0.5)
    cpu = fastfeed.loader(photos, batch_sampler=sampler(photos), num_workers=0)  # the same state fits decode="cpu"
    cpu.load_state_dict(state)
    _assert_same(list(cpu), rest)


def test_auto_knobs_under_an_aspect_sampler_look_the_record_up_without_an_image_size(
        photos: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The knobs left 'auto' (no tune result) take the defaults; the buckets set the sizes, so no
    image size is in the record's key (it was (0, 0): 'image_size=(0, 0) must be positive')."""
    monkeypatch.setenv("FASTFEED_TUNE_DIR", str(tmp_path / "no-records"))
    dl = fastfeed.loader(photos, batch_sampler=sampler(photos), decode="dali", augment=False,
                         dali=fastfeed.Dali(device_id=None))
    batches = list(dl)
    assert batches and all(b["image"].ndim == 4 for b in batches)
