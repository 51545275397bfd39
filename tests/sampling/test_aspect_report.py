"""The aspect balance report (fastfeed balance --resolution): buckets and counts, the crop, and the pixel
straggler ratio of fastfeed's sampler against naive per-rank bucketing, on datasets packed from PIL images."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import fastfeed
from fastfeed.errors import ConfigError
from fastfeed.sampling.aspect import DistributedAspectRatioSampler
from fastfeed.sampling.aspect_report import (
    aspect_balance_report,
    naive_rank_batches,
    step_balance,
)
from fastfeed.sampling.buckets import assign, make_buckets

#: (width, height) of the images packed: landscape, portrait, square, wide, tall, a panorama, a small one
SHAPES = [(400, 300), (300, 400), (320, 320), (480, 270), (270, 480), (600, 200), (120, 90)]
COUNTS = [14, 9, 7, 5, 4, 3, 2]


def pack_shapes(root: Path, shapes: list[tuple[int, int]] = SHAPES, counts: list[int] = COUNTS) -> Path:
    """JPEGs of ``shapes`` (``counts`` of each) in two classes, packed into ``root/ds``."""
    from PIL import Image

    rng = np.random.default_rng(0)
    n = 0
    for (w, h), c in zip(shapes, counts):
        for _ in range(c):
            folder = root / "src" / ("a" if n % 2 else "b")
            folder.mkdir(parents=True, exist_ok=True)
            pixels = rng.integers(0, 255, (h, w, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(folder / f"img{n:03d}.jpg", quality=80)
            n += 1
    fastfeed.pack(root / "src", root / "ds", workers=1)
    return root / "ds"


def strip_sizes(ds: Path) -> Path:
    """Make ``ds`` look packed before pack recorded sizes: no ``sizes`` entry, no sizes.npy."""
    path = ds / "index.json"
    d = json.loads(path.read_text())
    d.pop("sizes", None)
    d["arrays"] = [a for a in d["arrays"] if a != "sizes.npy"]
    if d.get("checksums"):
        d["checksums"]["sidecars"].pop("sizes.npy", None)
    path.write_text(json.dumps(d, indent=1) + "\n")
    (ds / "sizes.npy").unlink()
    return ds


@pytest.fixture(scope="module")
def shapes_ds(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return pack_shapes(tmp_path_factory.mktemp("aspect-report"))


def _photos(n: int, seed: int = 0) -> np.ndarray:
    """Sizes like a web photo collection (as the sampler's tests)."""
    rng = np.random.default_rng(seed)
    ratios = rng.choice([4 / 3, 3 / 2, 16 / 9, 1.0, 3 / 4, 2 / 3, 9 / 16, 3.0, 1 / 3, 5 / 4],
                        size=n, p=[.25, .15, .1, .12, .12, .08, .06, .04, .03, .05])
    ratios = ratios * np.exp(rng.normal(0, 0.03, n))
    h = np.sqrt(np.exp(rng.normal(np.log(1.5e6), 0.4, n)) / ratios)
    return np.stack([np.round(h), np.round(h * ratios)], axis=1).astype(np.int64)


# ---------------------------------------------------------------------- on a packed dataset
def test_the_buckets_and_counts_are_those_of_the_images_packed(shapes_ds: Path) -> None:
    r = aspect_balance_report(shapes_ds, resolution=256, world_size=2, batch_size=4)
    sizes = fastfeed.DatasetIndex.load(shapes_ds).image_sizes
    assert sorted(map(tuple, np.unique(sizes, axis=0).tolist())) == sorted((h, w) for w, h in SHAPES)
    b = make_buckets(256)
    assert r.buckets == tuple(b.shapes())
    k = assign(sizes, b)
    # the 120x90 images need more than a 2x enlargement: left out and counted, not bucketed
    small = (sizes[:, 0] == 90)
    assert r.skipped["upscale"] == int(small.sum()) == 2
    assert list(r.counts) == np.bincount(k[~small], minlength=len(b)).tolist()
    assert sum(r.counts) + r.skipped["upscale"] == r.num_images == sum(COUNTS)
    assert set(r.batch_sizes) == {4}


def test_the_crop_share_is_that_of_cover_then_crop(shapes_ds: Path) -> None:
    r = aspect_balance_report(shapes_ds, resolution=256, world_size=2, batch_size=4, max_upscale=None)
    b = make_buckets(256)
    cut, px, up = [], [], 0
    for (w, h), c in zip(SHAPES, COUNTS):
        H, W = b.shape(int(assign(np.array([[h, w]]), b)[0]))
        s = max(H / h, W / w)  # resize to cover, then crop H x W out of (s h) x (s w)
        cut += [1 - H * W / (s * h * s * w)] * c
        px += [h * w] * c
        up += c if s > 1 else 0
    cut_a, px_a = np.array(cut), np.array(px, dtype=float)
    assert r.crop.mean == pytest.approx(cut_a.mean())
    assert r.crop.max == pytest.approx(cut_a.max())
    assert r.crop.pixels == pytest.approx((cut_a * px_a).sum() / px_a.sum())
    assert r.crop.upscaled == up and r.skipped["upscale"] == 0


@pytest.mark.parametrize("world", [1, 2, 3, 8])
def test_both_plans_draw_every_image_and_fastfeeds_steps_are_equal(shapes_ds: Path, world: int) -> None:
    r = aspect_balance_report(shapes_ds, resolution=256, world_size=world, max_pixels=3 * 256 * 256)
    used = sum(r.counts)
    ff, naive = r.rows
    assert ff.steps_equal and ff.images == used + r.settings["repeats"] and r.settings["repeats"] < world
    assert naive.images == used + (-used) % world  # DistributedSampler's padding
    assert r.settings["baseline_batch_size"] == 3
    assert r == aspect_balance_report(shapes_ds, resolution=256, world_size=world, max_pixels=3 * 256 * 256)


def test_text_and_json_say_the_same(shapes_ds: Path) -> None:
    r = aspect_balance_report(shapes_ds, resolution=256, world_size=2, batch_size=4)
    text = r.text()
    assert text.startswith(f"{sum(COUNTS)} images, resolution 256 (")
    assert "left out (2 upscale)" in text.splitlines()[0]
    for (h, w), c in zip(r.buckets, r.counts):
        assert (f"{h}x{w}" in text) == bool(c)
    assert "cropping cuts away " in text and "fastfeed (batch 4)" in text and "naive per-rank buckets (batch 4)" in text
    j = json.loads(json.dumps(r.to_json()))
    assert [b["images"] for b in j["buckets"]] == list(r.counts)
    assert j["samplers"][0]["steps_equal"] is True and j["crop"]["pixels"] == r.crop.pixels
    assert j["skipped"] == {"no size": 0, "upscale": 2, "crop": 0, "subset": 0}


def test_a_dataset_packed_without_sizes_is_told_fastfeed_shapes(tmp_path: Path) -> None:
    ds = strip_sizes(pack_shapes(tmp_path, SHAPES[:2], [3, 3]))
    with pytest.raises(ConfigError, match=r"records no image sizes .*run `fastfeed shapes .*ds` once"):
        aspect_balance_report(ds, resolution=256, world_size=2)
    from fastfeed.packing.shapes import add_shapes

    add_shapes(ds)
    assert sum(aspect_balance_report(ds, resolution=256, world_size=2).counts) == 6


# ---------------------------------------------------------------------- pure numpy
@pytest.mark.parametrize("world", [8, 64])
@pytest.mark.parametrize("budget", [{"batch_size": 8}, {"max_pixels": 8 * 1024 * 1024}])
def test_fastfeed_balances_pixels_better_than_naive_per_rank_bucketing(world: int, budget: dict[str, Any]) -> None:
    r = aspect_balance_report(_photos(20000), resolution=1024, world_size=world, **budget)
    ff, naive = r.rows
    assert ff.steps_equal and not naive.steps_equal
    assert ff.straggler_mean <= 1.05 < naive.straggler_mean
    assert ff.straggler_p95 < naive.straggler_p95 and ff.wait_share < naive.wait_share


def test_naive_ranks_bucket_their_own_shard() -> None:
    sizes = _photos(3001, seed=4)
    b = make_buckets(1024)
    k = assign(sizes, b)
    px, n = naive_rank_batches(k, b.areas, world_size=7, batch_size=6, seed=1)
    assert len(px) == 7 and int(np.concatenate(n).sum()) == 3001 + (-3001) % 7
    for p, c in zip(px, n):
        assert c.max() <= 6 and np.isin(p / c, b.areas).all()  # one bucket per batch
        assert (c < 6).sum() <= len(b)  # at most one smaller batch per bucket
    again = naive_rank_batches(k, b.areas, world_size=7, batch_size=6, seed=1)
    assert all((a == c).all() for a, c in zip(px, again[0]))
    other = naive_rank_batches(k, b.areas, world_size=7, batch_size=6, seed=1, epoch=1)
    assert any(a.shape != c.shape or (a != c).any() for a, c in zip(px, other[0]))


def test_step_balance_of_known_steps() -> None:
    s = step_balance("x", [np.array([4.0, 2.0, 9.0]), np.array([2.0, 2.0])], [np.array([2, 1, 3]), np.array([1, 1])])
    assert s.steps_per_rank == (2, 3) and not s.steps_equal
    assert s.straggler_mean == pytest.approx((4 / 3 + 1) / 2) and s.straggler_max == pytest.approx(4 / 3)
    assert s.wait_share == pytest.approx(2 / 12) and s.images == 8 and s.pixels_per_step == pytest.approx(5.0)


@pytest.mark.parametrize("kw, match", [
    ({"batch_size": 4, "max_pixels": 10 ** 6}, "one of batch_size"),
    ({"world_size": 0}, "world_size"),
    ({"baseline_batch_size": 0}, "baseline_batch_size"),
    ({"buckets": [(1, 2, 3)]}, "height, width"),
])
def test_bad_arguments_are_refused(kw: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        aspect_balance_report(_photos(50), **{"resolution": 256, "world_size": 2, **kw})


def test_counts_agree_with_the_sampler() -> None:
    sizes = _photos(500)
    r = aspect_balance_report(sizes, resolution=512, world_size=4, max_pixels=6 * 512 * 512)
    s = DistributedAspectRatioSampler(sizes, resolution=512, max_pixels=6 * 512 * 512, misfit="skip",
                                      num_replicas=4, rank=0)
    assert list(r.counts) == s.bucket_counts().tolist() and list(r.batch_sizes) == s.batch_sizes.tolist()
    assert r.rows[0].steps_per_rank == (len(s), len(s))
