"""DistributedAspectRatioSampler planning: buckets, assignment and every guarantee over many world
shapes, without processes (the plan is pure numpy); resume and elastic resume in-process."""

from __future__ import annotations

import collections
import itertools
from typing import Any

import numpy as np
import pytest

import fastfeed
from fastfeed.errors import ConfigError, StateError
from fastfeed.packed.index import ShardInfo
from fastfeed.sampling.aspect import DistributedAspectRatioSampler, plan_buckets
from fastfeed.sampling.buckets import FitPolicy, as_buckets, assign, fit, make_buckets


def _photos(n: int, seed: int = 0) -> np.ndarray:
    """Sizes like a web photo collection: mostly 4:3 / 3:2 / 16:9 both ways, some square, a few panoramas."""
    rng = np.random.default_rng(seed)
    ratios = rng.choice([4 / 3, 3 / 2, 16 / 9, 1.0, 3 / 4, 2 / 3, 9 / 16, 3.0, 1 / 3, 5 / 4],
                        size=n, p=[.25, .15, .1, .12, .12, .08, .06, .04, .03, .05])
    ratios = ratios * np.exp(rng.normal(0, 0.03, n))
    area = np.exp(rng.normal(np.log(1.5e6), 0.4, n))
    h = np.sqrt(area / ratios)
    return np.stack([np.round(h), np.round(h * ratios)], axis=1).astype(np.int64)


def _sampler(sizes: np.ndarray, world: int, rank: int = 0, **kw: Any) -> DistributedAspectRatioSampler:
    kw = {"max_upscale": None, "seed": 3, **kw}
    if "batch_size" not in kw and "max_pixels" not in kw and "max_cost" not in kw:
        kw["batch_size"] = 4
    return DistributedAspectRatioSampler(sizes, num_replicas=world, rank=rank, **kw)


# ---------------------------------------------------------------------- buckets
@pytest.mark.parametrize("resolution, step, max_ratio", [(1024, 64, 4.0), (512, 64, 2.0), (768, 32, 3.0),
                                                         (256, 16, 4.0), (1024, 128, 4.0)])
def test_generated_buckets_are_symmetric_multiples_of_step_near_the_area(resolution: int, step: int,
                                                                          max_ratio: float) -> None:
    b = make_buckets(resolution, step=step, max_ratio=max_ratio)
    shapes = b.shapes()
    assert all(h % step == 0 and w % step == 0 for h, w in shapes)
    assert set(shapes) == {(w, h) for h, w in shapes}  # both orientations
    assert all(max(h / w, w / h) <= max_ratio + 1e-9 for h, w in shapes)
    # the other side is the multiple of step closest to the area
    for h, w in shapes:
        assert abs(h * w - resolution ** 2) <= max(h, w) * step / 2 + 1e-9
    assert np.all(np.diff(b.log_ratios) > 0)
    if resolution % step == 0:
        assert (resolution, resolution) in shapes


def test_the_1024_buckets_span_512x2048_to_2048x512() -> None:
    b = make_buckets(1024)
    assert b.shape(0) == (2048, 512) and b.shape(len(b) - 1) == (512, 2048) and len(b) == 33
    assert np.all(np.abs(b.areas / 1024 ** 2 - 1) < 0.06)


def test_each_image_goes_to_the_nearest_aspect_ratio_in_log_space() -> None:
    sizes = _photos(3000, seed=1)
    for buckets in (make_buckets(1024), as_buckets([(1024, 1024), (832, 1216), (1216, 832), (640, 1536)])):
        got = assign(sizes, buckets)
        dist = np.abs(np.log(sizes[:, 1] / sizes[:, 0])[:, None] - buckets.log_ratios[None, :])
        best = dist.min(axis=1)
        assert np.allclose(dist[np.arange(len(sizes)), got], best)


def test_user_buckets_are_checked() -> None:
    sdxl = [(1024, 1024), (1152, 896), (896, 1152), (1216, 832), (832, 1216), (1344, 768), (768, 1344)]
    assert as_buckets(sdxl).shapes()[0] == (1344, 768)
    with pytest.raises(ConfigError, match=r"buckets \(512, 512\) and \(1024, 1024\) have the same aspect ratio"):
        as_buckets([(512, 512), (1024, 1024)])
    for bad in ([(0, 5)], [(1.5, 3)], "1024x1024", [(1, 2, 3)], []):
        with pytest.raises(ConfigError, match=r"buckets=.*\(height, width\) pairs of positive integers"):
            as_buckets(bad)
    with pytest.raises(ConfigError, match="resolution=0 must be a positive integer"):
        make_buckets(0)


def test_fit_scale_and_crop() -> None:
    b = as_buckets([(100, 200)])
    f = fit(np.array([[50, 100], [200, 200], [100, 400]]), b, np.zeros(3, dtype=np.int64))
    assert f.scale.tolist() == [2.0, 1.0, 1.0]
    assert np.allclose(f.crop, [0.0, 0.5, 0.5])
    bad, counts = FitPolicy(max_upscale=1.5, max_crop=0.4).misfits(np.array([[50, 100], [200, 200], [0, 0]]), b)
    assert bad.tolist() == [True, True, True] and counts == {"no size": 1, "upscale": 1, "crop": 1}


# ---------------------------------------------------------------------- the plan over many world shapes
_N = (1, 5, 37, 200, 1001)
_WORLDS = (1, 2, 3, 5, 8, 16, 64)


def _check_plan(s: DistributedAspectRatioSampler, epoch: int) -> None:
    p = s.epoch_plan(epoch)
    W = s.num_replicas
    S = p.num_steps
    assert p.counts.shape == (S, W) and p.starts.shape == (S, W)
    assert sorted(p.order.tolist()) == list(range(S))
    valid = p.valid if p.valid is not None else np.ones(len(p.samples), dtype=bool)
    members = np.flatnonzero(s.bucket_of >= 0)
    for st, ct in zip(p.starts.ravel(), p.counts.ravel()):
        ids = p.samples[st:st + ct]
        assert len(np.unique(s.bucket_of[ids])) == 1  # one bucket per batch
        assert ct <= s.batch_sizes[s.bucket_of[ids[0]]]
        if s.drop_last:
            assert ct == s.batch_sizes[s.bucket_of[ids[0]]]
    if not s.drop_last:
        assert (p.counts >= 1).all()  # no rank ever gets an empty batch
        real = collections.Counter(p.samples[valid].tolist())
        assert sorted(real) == members.tolist() and set(real.values()) <= {1}  # every image exactly once
        assert p.num_repeats == int((~valid).sum()) <= W - 1
    else:
        assert valid.all() and len(np.unique(p.samples)) == len(p.samples)
        assert p.num_dropped == len(members) - len(p.samples) + s.num_skipped + s.num_filtered
    # every rank's batches together are the plan's, and every rank runs S steps
    flat = []
    for r in range(W):
        f, off = p.rank_batches(r)
        assert len(off) - 1 == S
        flat += f.tolist()
        assert len(p.rank_valid(r)) == len(f)
    assert sorted(flat) == sorted(p.samples.tolist())


@pytest.mark.parametrize("n, world", list(itertools.product(_N, _WORLDS)))
@pytest.mark.parametrize("budget", ["batch", "pixels"])
@pytest.mark.parametrize("drop_last", [False, True])
def test_every_world_shape_gets_equal_steps_one_bucket_per_batch_every_image_once(n: int, world: int, budget: str,
                                                                                  drop_last: bool) -> None:
    sizes = _photos(n, seed=n)
    kw = {"batch_size": 3} if budget == "batch" else {"max_pixels": 5 * 1024 * 1024}
    s = _sampler(sizes, world, drop_last=drop_last, **kw)
    for epoch in (0, 1):
        _check_plan(s, epoch)


def test_the_plan_is_a_function_of_seed_epoch_and_world_and_differs_by_epoch() -> None:
    sizes = _photos(500)
    a, b = _sampler(sizes, 4, 1), _sampler(sizes, 4, 1)
    assert [x for x in a] == [x for x in b]
    a.set_epoch(1)
    assert list(a) != list(b)
    c = _sampler(sizes, 4, 1, seed=4)
    assert list(c) != list(b)
    b.set_epoch(1)
    assert list(a) == list(b)
    one = _sampler(sizes, 1)
    e0 = {frozenset(x) for x in one}
    one.set_epoch(1)
    e1 = {frozenset(x) for x in one}
    assert len(e0 & e1) <= len(e0) // 10  # batch-mates are drawn afresh every epoch


def test_without_shuffle_the_plan_is_fixed_and_dearest_first() -> None:
    sizes = _photos(300)
    s = _sampler(sizes, 2, max_pixels=8 * 1024 * 1024, shuffle=False)
    assert list(s) == list(_sampler(sizes, 2, max_pixels=8 * 1024 * 1024, shuffle=False, seed=9))
    p = s.epoch_plan(0)
    cost = p.costs(s._cost_fn).max(axis=1)
    assert np.all(np.diff(cost[p.order]) <= 1e-9)


def _straggler(s: DistributedAspectRatioSampler) -> float:
    p = s.epoch_plan(0)
    px = p.counts * s.buckets.areas[s.bucket_of[p.samples[p.starts]]]
    return float(np.mean(px.max(axis=1) / px.mean(axis=1)))


@pytest.mark.parametrize("world", [8, 64])
def test_a_pixel_budget_keeps_the_straggler_ratio_under_1_05(world: int) -> None:
    sizes = _photos(60_000, seed=5)
    s = _sampler(sizes, world, resolution=1024, max_pixels=16 * 1024 ** 2)
    assert _straggler(s) <= 1.05
    fixed = _sampler(sizes, world, resolution=1024, batch_size=16)
    assert _straggler(fixed) <= 1.05


def test_steps_are_made_of_batches_next_to_each_other_in_cost() -> None:
    """A bucket's smaller last batch shares its step with batches of about its cost, not with full ones."""
    sizes = _photos(700, seed=4)
    s = _sampler(sizes, 4, resolution=512, batch_size=8)
    p = s.epoch_plan(0)
    cost = p.costs(s._cost_fn)
    lo, hi = cost.min(axis=1), cost.max(axis=1)
    by = np.argsort(-hi, kind="stable")
    assert np.all(lo[by][:-1] >= hi[by][1:] - 1e-9)  # no step's batch is cheaper than the next step's dearest


def test_fewer_images_than_ranks_repeat_at_most_w_minus_1_flagged() -> None:
    s = _sampler(np.array([[100, 100]] * 3), 8, resolution=64)
    p = s.epoch_plan(0)
    assert p.num_steps == 1 and p.num_repeats == 5 and int((~p.valid).sum()) == 5
    assert s.num_repeats == 5


# ---------------------------------------------------------------------- misfits, subset, inputs
def test_misfits_are_an_error_naming_the_first_or_a_counted_skip(caplog: pytest.LogCaptureFixture) -> None:
    sizes = np.array([[1000, 1000], [100, 120], [0, 0], [900, 1200]])
    with pytest.raises(ConfigError, match=r"sizes: 2 image\(s\) fit no bucket well \(1 no size, 1 upscale; "
                                          r"max_upscale=2.0, max_crop=None\); the first: image 1, 100x120: a "
                                          r"\d+\.\d\dx resize to cover its bucket .*; pass misfit='skip'"):
        DistributedAspectRatioSampler(sizes, resolution=1024, batch_size=2)
    s = DistributedAspectRatioSampler(sizes, resolution=1024, batch_size=2, misfit="skip", num_replicas=1, rank=0)
    assert s.num_skipped == 2 and s.skipped_reasons == {"no size": 1, "upscale": 1, "crop": 0}
    assert "leaving them out of every epoch" in caplog.text
    assert sorted(i for b in s for i in b) == [0, 3] and s.num_dropped == 2
    everything = DistributedAspectRatioSampler(sizes[[0, 1, 3]], resolution=1024, batch_size=2, max_upscale=None,
                                               num_replicas=1, rank=0)
    assert everything.num_skipped == 0 and len(everything) == 3  # three buckets, a batch each
    crop = DistributedAspectRatioSampler(np.array([[100, 1000], [1000, 1000]]), resolution=512, batch_size=2,
                                         max_crop=0.3, misfit="skip", max_upscale=None, num_replicas=1, rank=0)
    assert crop.skipped_reasons["crop"] == 1


def test_subset_leaves_images_out_and_is_part_of_the_identity() -> None:
    sizes = _photos(100)
    keep = np.arange(100) % 3 == 0
    s = _sampler(sizes, 2, subset=keep)
    assert s.num_filtered == 66
    drawn = set(s.epoch_plan(0).samples[s.epoch_plan(0).valid].tolist())
    assert drawn == set(np.flatnonzero(keep).tolist())
    assert _sampler(sizes, 2, subset=np.flatnonzero(keep)).state_dict() == s.state_dict()
    with pytest.raises(StateError, match="lengths_digest"):
        _sampler(sizes, 2).load_state_dict(s.state_dict())


@pytest.mark.parametrize("kw, match", [
    ({}, r"exactly one of batch_size= .*max_pixels= .*max_cost="),
    ({"batch_size": 2, "max_pixels": 10}, r"got batch_size and max_pixels"),
    ({"batch_size": 0}, r"batch_size=0 must be a positive integer"),
    ({"max_pixels": 1000}, r"max_pixels=1000 does not fit one image of bucket \d+x\d+"),
    ({"batch_size": 2, "cost": "tokens"}, r"cost='tokens': use 'pixels'"),
    ({"batch_size": 2, "misfit": "drop"}, r"misfit='drop' must be 'error' or 'skip'"),
    ({"batch_size": 2, "max_upscale": 0.5}, r"max_upscale=0.5 must be a number >= 1"),
    ({"max_cost": "10ms"}, r"max_cost='10ms' is a duration, but the cost is not a fitted model in seconds"),
])
def test_bad_arguments_say_what_to_do(kw: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        DistributedAspectRatioSampler(_photos(10), resolution=256, num_replicas=1, rank=0, **kw)


def test_bad_sizes_and_a_dataset_without_them(tmp_path: Any) -> None:
    for bad, match in (([[1, 2, 3]], r"shape \(N, 2\)"), ([[-1, 4]], "negative size"), (np.zeros((0, 2), int),
                                                                                         "no images")):
        with pytest.raises(ConfigError, match=match):
            DistributedAspectRatioSampler(np.asarray(bad), batch_size=1, num_replicas=1, rank=0)
    idx = fastfeed.DatasetIndex("tar", 1, (ShardInfo("shard-000000.tar", 1, 1024, "0" * 64),), root=str(tmp_path))
    with pytest.raises(ConfigError, match=r"records no image sizes .*run `fastfeed shapes .*` once"):
        DistributedAspectRatioSampler(idx, batch_size=1, num_replicas=1, rank=0)


def test_a_fitted_cost_model_over_pixels_sizes_the_batches() -> None:
    cm = fastfeed.CostModel(const=0.01, padded=1e-8, unit="seconds", name="fitted")
    s = _sampler(_photos(200), 2, max_cost="60ms", cost=cm)
    assert s.max_cost == pytest.approx(0.06)
    want = np.floor((0.06 - 0.01) / (1e-8 * s.buckets.areas) * (1 + 1e-9))  # seconds left after the step's constant
    assert s.batch_sizes.tolist() == want.astype(int).tolist()
    _check_plan(s, 0)
    calls = _sampler(_photos(50), 2, max_cost=4e6, cost=lambda px: float(np.sum(px)))
    assert calls.batch_sizes.tolist() == (4e6 // calls.buckets.areas).astype(int).tolist()


# ---------------------------------------------------------------------- resume, elastic resume
@pytest.mark.parametrize("world, rank", [(1, 0), (3, 2), (8, 5)])
@pytest.mark.parametrize("drop_last", [False, True])
def test_a_state_mid_epoch_resumes_exactly(world: int, rank: int, drop_last: bool) -> None:
    sizes = _photos(400)
    ref = _sampler(sizes, world, rank, drop_last=drop_last)
    ref.set_epoch(2)
    want = list(ref)
    for stop in sorted({0, 1, len(want) // 2, len(want)}):
        s = _sampler(sizes, world, rank, drop_last=drop_last)
        s.set_epoch(2)
        it = iter(s)
        head = [next(it) for _ in range(stop)]
        state = s.state_dict()
        fresh = _sampler(sizes, world, rank, drop_last=drop_last)
        fresh.load_state_dict(state)
        assert head + list(fresh) == want
        assert state["sampler"] == "DistributedAspectRatioSampler" and state["stages"] == [[world, stop]]


@pytest.mark.parametrize("old, new", [(4, 3), (2, 5), (8, 1), (3, 3), (1, 64)])
@pytest.mark.parametrize("budget", [{"batch_size": 3}, {"max_pixels": 6 * 1024 * 1024}])
def test_elastic_resume_delivers_every_image_not_consumed_with_equal_steps(old: int, new: int,
                                                                           budget: dict[str, Any]) -> None:
    sizes = _photos(333, seed=2)
    first = _sampler(sizes, old, 0, **budget)
    plan = first.epoch_plan(0)
    t = plan.num_steps // 3
    consumed: collections.Counter[int] = collections.Counter()
    for r in range(old):
        f, off = plan.rank_batches(r)
        consumed.update(f[:off[t]][plan.rank_valid(r)[:off[t]]].tolist())
    state = _sampler(sizes, old, 0, **budget).state_dict(steps=t)
    rest: collections.Counter[int] = collections.Counter()
    steps = set()
    for r in range(new):
        s = _sampler(sizes, new, r, **budget)
        s.load_state_dict(state)
        batches = list(s)
        steps.add(len(batches))
        for b in batches:
            assert len(np.unique(s.bucket_of[np.asarray(b)])) == 1
            rest.update(b)
        want = [[new, t + len(batches)]] if old == new else [[old, t], [new, len(batches)]]
        assert s.state_dict()["stages"] == want
    assert len(steps) == 1  # every new rank runs the same number of steps
    members = np.flatnonzero(first.bucket_of >= 0).tolist()
    total = consumed + rest
    assert sorted(total) == members  # every image not consumed comes, nothing is lost
    assert sum(total.values()) - len(members) <= new - 1  # the new plan's at most W' - 1 repeats
