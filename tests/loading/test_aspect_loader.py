"""``loader(path, batch_sampler=DistributedAspectRatioSampler(...))``: bucket batches through real workers.

Every batch is one tensor at its bucket's (height, width), each image resized to cover the bucket and
cropped (center, or random with ``augment``), maybe flipped, with ``original_size`` / ``crop_top_left``
(SDXL's conditioning) and ``valid``; bad input is an error naming the key or a counted skip; a state
saved mid-epoch resumes the rest of the epoch identically. Test images are made here with Pillow and
packed with ``fastfeed.pack``.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from loading._aspect_data import odd_images, pack, photo, sampler, save, write_images
from PIL import Image, ImageOps

import fastfeed
from fastfeed.decode.geometry import cover_crops
from fastfeed.errors import ConfigError, SampleError
from fastfeed.packed.index import DatasetIndex


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return pack(tmp_path_factory.mktemp("aspect"))


def _originals(dst: Path) -> dict[str, np.ndarray]:
    """Each sample's upright RGB pixels, decoded here by Pillow (key -> HWC uint8)."""
    from fastfeed.packed.reader import DatasetReader

    idx = DatasetIndex.load(dst)
    reader = DatasetReader(idx, max_open=4)
    out = {}
    for i in range(idx.num_samples):
        s = reader.read(i)
        img = ImageOps.exif_transpose(Image.open(io.BytesIO(s["jpg"])))
        out[s["__key__"]] = np.asarray(img.convert("RGB"))
    return out


def _expected(pixels: np.ndarray, box: list[int], hw: tuple[int, int], flip: bool) -> np.ndarray:
    """The crop ``box`` of ``pixels`` resized to ``hw`` by Pillow, maybe mirrored: HWC float."""
    y, x, h, w = box
    img = Image.fromarray(pixels[y:y + h, x:x + w]).resize((hw[1], hw[0]), Image.BILINEAR)
    arr = np.asarray(img, dtype=np.float64)
    return arr[:, ::-1] if flip else arr


# ---------------------------------------------------------------------- the batches
@pytest.mark.parametrize("augment", [False, True])
def test_bucket_batches_are_one_tensor_covering_the_bucket(photos: Path, augment: bool) -> None:
    s = sampler(photos)
    dl = fastfeed.loader(photos, batch_sampler=s, augment=augment, num_workers=2)
    plan = [list(b) for b in s]  # the sampler's epoch 0 (the loader runs epoch 0 on its first pass)
    originals = _originals(photos)
    batches = list(dl)
    assert len(batches) == len(plan) == len(dl)
    flipped = 0
    for b, ids in zip(batches, plan):
        H, W = s.batch_shape(ids)
        assert tuple(b["image"].shape) == (len(ids), 3, H, W)
        assert b["valid"].tolist() == [True] * len(ids)
        c = cover_crops(s.sizes[ids], H, W, seed=0, epoch=0, ids=np.array(ids), random=augment, flip=augment)
        assert b["original_size"].tolist() == s.sizes[ids].tolist()
        assert b["crop_top_left"].tolist() == c.top_left.tolist()
        for j, key in enumerate(b["__key__"]):
            got = b["image"][j].permute(1, 2, 0).numpy().astype(np.float64)
            want = _expected(originals[key], c.boxes[j].tolist(), (H, W), bool(c.flips[j]))
            assert np.abs(got - want).mean() < 6, key  # resamplers differ slightly, a wrong crop by far more
        flipped += int(c.flips.sum())
    if augment:
        assert flipped > 0
    else:  # center crops: the same batches again
        dl.set_epoch(0)
        assert all((x["image"] == y["image"]).all() for x, y in zip(batches, list(dl)))


def test_center_bucket_crop_when_augmenting(photos: Path) -> None:
    s = sampler(photos)
    dl = fastfeed.loader(photos, batch_sampler=s, num_workers=0, crop=fastfeed.Crop(bucket_crop="center", flip=False))
    for b, ids in zip(dl, s):
        H, W = s.batch_shape(ids)
        c = cover_crops(s.sizes[ids], H, W, seed=0, epoch=0, ids=np.array(ids), random=False, flip=False)
        assert b["crop_top_left"].tolist() == c.top_left.tolist()


def test_pixel_budget_and_two_ranks_have_equal_steps(photos: Path) -> None:
    budget = 4 * 64 * 64
    runs = []
    for rank in range(2):
        s = sampler(photos, batch_size=None, max_pixels=budget, num_replicas=2, rank=rank)
        runs.append(list(fastfeed.loader(photos, batch_sampler=s, num_workers=2)))
    assert len(runs[0]) == len(runs[1])
    keys = [k for r in runs for b in r for k, v in zip(b["__key__"], b["valid"].tolist()) if v]
    assert sorted(keys) == sorted(set(keys)) and len(keys) == 24  # every image once
    assert all(b["image"].shape[0] * b["image"].shape[2] * b["image"].shape[3] <= budget for r in runs for b in r)


def test_padding_repeats_are_flagged_in_valid(tmp_path: Path) -> None:
    dst = pack(tmp_path, n=5)
    runs = [list(fastfeed.loader(dst, batch_sampler=sampler(dst, batch_size=1, num_replicas=3, rank=r),
                                 num_workers=0)) for r in range(3)]
    assert len({len(r) for r in runs}) == 1
    valid = [v for r in runs for b in r for v in b["valid"].tolist()]
    assert valid.count(False) == 1 and len(valid) == 6


def test_the_loader_options_a_bucket_sampler_owns(photos: Path) -> None:
    s = sampler(photos)
    with pytest.raises(ConfigError, match=r"image_size=\(32, 32\): with a DistributedAspectRatioSampler each batch takes"):
        fastfeed.loader(photos, batch_sampler=s, image_size=32)
    with pytest.raises(ConfigError, match="batch_size=5 but the DistributedAspectRatioSampler makes batches of 3"):
        fastfeed.loader(photos, batch_sampler=s, batch_size=5)
    with pytest.raises(ConfigError, match="batch_size=5: a DistributedAspectRatioSampler sizes every batch to fit "
                                          "max_pixels=16384"):
        fastfeed.loader(photos, batch_sampler=sampler(photos, batch_size=None, max_pixels=16384), batch_size=5)
    with pytest.raises(ConfigError, match="Crop.bucket_crop='top' must be 'random' or 'center'"):
        fastfeed.Crop(bucket_crop="top")


# ---------------------------------------------------------------------- resume
def test_resume_mid_epoch_gives_the_rest_of_the_epoch(photos: Path) -> None:
    def make(workers: int) -> Any:
        return fastfeed.loader(photos, batch_sampler=sampler(photos, seed=5), num_workers=workers)

    whole = make(2)
    whole.set_epoch(1)
    full = list(whole)
    dl = make(2)
    dl.set_epoch(1)
    it = iter(dl)
    head = [next(it) for _ in range(3)]
    state = dl.state_dict()
    del it
    fresh = make(2)
    fresh.load_state_dict(state)
    rest = list(fresh)
    assert len(head) + len(rest) == len(full)
    for a, b in zip(head + rest, full):
        assert a["__key__"] == b["__key__"]
        assert (a["image"] == b["image"]).all()
        assert a["crop_top_left"].tolist() == b["crop_top_left"].tolist()


# ---------------------------------------------------------------------- bad input
def test_a_header_that_lies_is_an_error_naming_the_key_or_a_counted_skip(tmp_path: Path) -> None:
    dst = pack(tmp_path, n=12)
    idx = DatasetIndex.load(dst)
    sizes = np.asarray(idx.image_sizes).copy()
    sizes[4] = sizes[4][::-1]  # the index says portrait, the file is landscape (or the other way)
    sizes[4][0] += 0 if sizes[4][0] != sizes[4][1] else 10
    idx.with_sizes(sizes).save(dst)
    key = DatasetIndex.load(dst)
    from fastfeed.packed.reader import DatasetReader

    name = DatasetReader(key, max_open=1).read(4)["__key__"]
    with pytest.raises(SampleError, match=rf"{name}.*does not match the index.*fastfeed shapes"):
        list(fastfeed.loader(dst, batch_sampler=sampler(dst), num_workers=2))
    dl = fastfeed.loader(dst, batch_sampler=sampler(dst), num_workers=2, on_error="skip")
    got = [k for b in dl for k in b["__key__"]]
    assert name not in got and len(got) == 11
    assert dl.stats.summary()["skipped"] == 1


def test_gray_cmyk_alpha_and_exif_rotated_images(tmp_path: Path) -> None:
    odd = odd_images()
    src = write_images(tmp_path / "src", n=4, extra={k: v[0] for k, v in odd.items()})
    dst = tmp_path / "ff"
    fastfeed.pack(src, dst, samples_per_shard=4, shuffle=False)
    s = sampler(dst, batch_size=1)
    dl = fastfeed.loader(dst, batch_sampler=s, num_workers=2, augment=False)
    seen = {}
    for b, ids in zip(dl, s):
        H, W = s.batch_shape(ids)
        assert tuple(b["image"].shape) == (1, 3, H, W)
        seen[b["__key__"][0]] = (b, s.buckets.shape(int(s.bucket_of[ids[0]])))
    for name, (_, (h, w)) in odd.items():
        key = next(k for k in seen if k.endswith(name.split(".")[0]))
        b, bucket = seen[key]
        assert b["original_size"].tolist() == [[h, w]], name  # the displayed orientation
        assert (bucket[0] > bucket[1]) == (h > w) and (bucket[0] == bucket[1]) == (h == w), name
    rotated = next(v for k, v in seen.items() if k.endswith("rotated"))[0]["image"][0]
    # the EXIF-rotated image decoded upright: its pixels follow Pillow's exif_transpose
    pixels = np.asarray(ImageOps.exif_transpose(Image.open(io.BytesIO(odd["rotated.jpg"][0]))).convert("RGB"))
    H, W = rotated.shape[1:]
    c = cover_crops(np.array([pixels.shape[:2]]), H, W, seed=0, epoch=0, ids=np.array([0]), random=False,
                    flip=False)
    want = _expected(pixels, c.boxes[0].tolist(), (H, W), False)
    assert np.abs(rotated.permute(1, 2, 0).numpy() - want).mean() < 6


def test_images_smaller_than_any_bucket_follow_the_fit_policy(tmp_path: Path) -> None:
    small = {"tiny.jpg": save(photo((20, 16), 13)), "small.jpg": save(photo((24, 24), 14))}
    dst = tmp_path / "ff"
    fastfeed.pack(write_images(tmp_path / "src", n=6, extra=small), dst, samples_per_shard=4, shuffle=False)
    with pytest.raises(ConfigError, match=r"2 image\(s\) fit no bucket well \(2 upscale.*misfit='skip'"):
        sampler(dst)
    s = sampler(dst, misfit="skip")
    assert s.num_skipped == 2 and s.skipped_reasons["upscale"] == 2
    keys = [k for b in fastfeed.loader(dst, batch_sampler=s, num_workers=2) for k in b["__key__"]]
    assert len(keys) == 6 and not any(k.endswith(("tiny", "small")) for k in keys)
    s = sampler(dst, max_upscale=None)  # no limit: enlarged to cover their bucket
    got = {k: b for b in fastfeed.loader(dst, batch_sampler=s, num_workers=0) for k in b["__key__"]}
    tiny = next(b for k, b in got.items() if k.endswith("tiny"))
    assert tiny["image"].shape[2] * tiny["image"].shape[3] >= 48 * 48


def test_a_state_saved_on_two_ranks_resumes_on_three(photos: Path) -> None:
    old = [fastfeed.loader(photos, batch_sampler=sampler(photos, num_replicas=2, rank=r), num_workers=0)
           for r in range(2)]
    heads = []
    for dl in old:
        it = iter(dl)
        heads.append([next(it) for _ in range(2)])
    state = old[0].state_dict()
    new = [fastfeed.loader(photos, batch_sampler=sampler(photos, num_replicas=3, rank=r), num_workers=w)
           for r, w in ((0, 0), (1, 2), (2, 0))]
    for dl in new:
        dl.load_state_dict(state)
    rests = [list(dl) for dl in new]
    assert len({len(r) for r in rests}) == 1  # equal steps on the new ranks
    valid = [k for part in (heads, rests) for r in part for b in r
             for k, v in zip(b["__key__"], b["valid"].tolist()) if v]
    assert sorted(valid) == sorted(set(valid)) and len(valid) == 24  # every image once
    assert all(b["image"].shape[0] == len(b["__key__"]) == len(b["crop_top_left"]) for r in rests for b in r)
