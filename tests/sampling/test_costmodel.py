"""Cost models: features, built-ins, fitting under noise, save/load, quality warnings, calibration."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest

from fastfeed.sampling.calibration import ShapeSetupWarning, calibrate, design_shapes
from fastfeed.sampling.costmodel import FEATURES, CostModel, PoorFitWarning, batch_features, fit_cost_model
from fastfeed.errors import ConfigError

TRUE = CostModel(const=1.5e-3, padded=4e-7, padded_sq=2.5e-10, tokens=1e-7, tokens_sq=5e-11, unit="seconds")


def random_batches(n: int, seed: int = 0) -> list[np.ndarray]:
    """Varied shapes: uniform and mixed lengths, small and large batches."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        L = int(rng.integers(16, 1025))
        size = int(rng.integers(1, max(2, 16384 // L)))
        lens = np.full(size, L) if rng.random() < 0.5 else np.concatenate([[L], rng.integers(16, L + 1, size - 1)])
        out.append(lens)
    return out


def test_features_and_builtins() -> None:
    assert batch_features([[2, 3], [4]]).tolist() == [[1, 6, 18, 5, 13], [1, 4, 16, 4, 16]]
    assert CostModel.builtin("tokens").predict([10, 30, 20]) == 90
    att = CostModel.attention(d_model=512)
    assert att.predict([600, 300]) == pytest.approx(2 * 600 + 2 * 600**2 / 3072)
    var = CostModel.varlen(d_model=1024)
    assert var.predict([[600, 300]])[0] == pytest.approx(900 + (600**2 + 300**2) / 6144)
    assert "n*max^2" in att.summary() and "token-equivalents" in att.summary()
    with pytest.raises(ConfigError, match="built-in"):
        CostModel.builtin("flops")
    with pytest.raises(ConfigError, match=">= 0"):
        CostModel(padded=-1.0)
    with pytest.raises(ConfigError, match="length feature"):
        CostModel(const=1.0)
    with pytest.raises(ConfigError, match="empty"):
        batch_features([[]])


def test_capacity_is_the_largest_batch_within_budget() -> None:
    for m in (CostModel.builtin("tokens"), CostModel.attention(), TRUE):
        for L in (16, 100, 1000):
            budget = m.predict([L] * 37)
            cap = int(m.capacity(np.array([L]), budget)[0])
            assert cap == 37 or m.predict([L] * cap) <= budget < m.predict([L] * (cap + 1))


@pytest.mark.parametrize("features", ["all", "padded", "varlen"])
def test_fit_recovers_known_coefficients_under_noise(features: str) -> None:
    names = {"all": FEATURES, "padded": FEATURES[:3], "varlen": ("const", "tokens", "tokens_sq")}[features]
    true = CostModel(**{f: getattr(TRUE, f) for f in names}, unit="seconds")
    rng = np.random.default_rng(1)
    batches = random_batches(400, seed=2)
    times = true.predict(batches) * (1 + rng.normal(0, 0.02, len(batches)))
    m = fit_cost_model(zip(batches, times), features=features)
    pred = m.predict(batches)
    assert np.median(np.abs(pred - true.predict(batches)) / true.predict(batches)) < 0.01
    assert m.fit is not None and m.fit.median_ape < 0.03 and m.fit.loo_median_ape < 0.03
    for f in ("const", "padded", "tokens") if features != "varlen" else ("const", "tokens"):
        if f in names:
            assert getattr(m, f) == pytest.approx(getattr(true, f), rel=0.25), f
    assert all(getattr(m, f) >= 0 for f in FEATURES)


def test_fit_is_non_negative_and_drops_outliers() -> None:
    batches = random_batches(60, seed=3)
    true = CostModel(const=1e-3, padded=5e-7, unit="seconds")
    times = true.predict(batches)
    times[[5, 17]] *= 6  # two hiccups (a GC pause, another job)
    m = fit_cost_model(zip(batches, times))
    assert m.fit.outliers == (5, 17)
    assert m.padded == pytest.approx(5e-7, rel=1e-3) and m.const == pytest.approx(1e-3, rel=1e-3)
    assert m.fit.median_ape < 1e-6


def test_poor_fit_warns() -> None:
    batches = random_batches(40, seed=4)
    times = np.random.default_rng(0).uniform(0.01, 0.1, len(batches))  # unrelated to the shapes
    with pytest.warns(PoorFitWarning, match="poorly"):
        fit_cost_model(zip(batches, times))


def test_fit_input_errors() -> None:
    with pytest.raises(ConfigError, match="at least"):
        fit_cost_model([([10], 1.0)] * 3)
    with pytest.raises(ConfigError, match="record 1"):
        fit_cost_model([([10], 1.0), ([10], -1.0)] * 5)
    with pytest.raises(ConfigError, match="record 0"):
        fit_cost_model([42] * 10)
    with pytest.raises(ConfigError, match="features"):
        fit_cost_model([([10], 1.0)] * 10, features=["flops"])
    recs = [{"lengths": b, "seconds": float(TRUE(b))} for b in random_batches(20)]
    assert fit_cost_model(recs).fit.median_ape < 1e-6  # mappings work too


def test_save_load_predicts_the_same(tmp_path: Path) -> None:
    batches = random_batches(80, seed=5)
    m = fit_cost_model(zip(batches, TRUE.predict(batches)), meta={"gpu": "test"})
    path = m.save(tmp_path / "cost.json")
    loaded = CostModel.load(path)
    assert np.array_equal(loaded.predict(batches), m.predict(batches))
    assert loaded.fit == m.fit and loaded.meta["gpu"] == "test" and loaded.unit == "seconds"
    assert "median |error|" in loaded.summary()
    d = json.loads(path.read_text())
    assert d["fastfeed_cost_model"] == 1 and set(d["coefficients"]) == set(FEATURES)
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ConfigError, match="bad.json: not valid JSON"):
        CostModel.load(tmp_path / "bad.json")
    (tmp_path / "old.json").write_text(json.dumps({**d, "fastfeed_cost_model": 99}))
    with pytest.raises(ConfigError, match="version"):
        CostModel.load(tmp_path / "old.json")
    with pytest.raises(ConfigError, match="no such"):
        CostModel.load(tmp_path / "missing.json")


def test_design_shapes_are_varied_and_bounded() -> None:
    lengths = np.clip(np.random.default_rng(0).lognormal(5, 1, 10000), 16, 1024).astype(np.int64)
    shapes = design_shapes(lengths, max_tokens=16384, num_shapes=32)
    assert 20 <= len(shapes) <= 32
    padded = [len(s) * lengths[s].max() for s in shapes]
    assert max(padded) <= 16384 and max(padded) / min(padded) > 20
    longest = [lengths[s].max() for s in shapes]
    assert max(longest) / min(longest) > 10
    mixed = [lengths[s].sum() / (len(s) * lengths[s].max()) for s in shapes if len(s) > 4]
    assert min(mixed) < 0.7 and max(mixed) > 0.95  # uniform and mixed batches both present



def test_design_shapes_min_fraction_keeps_batches_near_the_budget() -> None:
    lengths = np.clip(np.random.default_rng(0).lognormal(5, 1, 10000), 16, 1024).astype(np.int64)
    shapes = design_shapes(lengths, max_tokens=32768, num_shapes=32, min_fraction=1 / 4)
    padded = np.array([len(s) * lengths[s].max() for s in shapes])
    assert padded.max() <= 32768 and padded.min() >= 0.2 * 32768  # no launch-bound tiny steps
    assert len({int(lengths[s].max()) for s in shapes}) >= 5  # still varied in length
    with pytest.raises(ConfigError, match="min_fraction"):
        design_shapes(lengths, max_tokens=32768, min_fraction=0)

class FakeClock:
    """A clock that a fake training step advances by the true cost (+ noise)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.rng = np.random.default_rng(0)
        self.calls = 0

    def perf_counter(self) -> float:
        return self.now

    def step(self, lengths: np.ndarray) -> None:
        self.calls += 1
        self.now += float(TRUE(lengths)) * (1 + self.rng.normal(0, 0.01))


def test_calibrate_fits_the_step_it_times(monkeypatch: pytest.MonkeyPatch) -> None:
    import fastfeed.sampling.calibration as cal

    clock = FakeClock()
    monkeypatch.setattr(cal.time, "perf_counter", clock.perf_counter)
    lengths = np.clip(np.random.default_rng(1).lognormal(5, 1, 5000), 16, 1024).astype(np.int64)
    syncs = []
    m = calibrate(clock.step, lengths, max_tokens=16384, num_shapes=24, repeats=3, warmup=2,
                  sync=lambda: syncs.append(1), meta={"model": "fake"})
    assert clock.calls == 2 + 24 * 3 and len(syncs) == 2 * clock.calls  # synchronised around each step
    assert m.unit == "seconds" and m.meta["model"] == "fake" and m.meta["shapes"] == 24
    assert m.fit.median_ape < 0.02
    test = random_batches(50, seed=9)
    err = np.abs(m.predict(test) - TRUE.predict(test)) / TRUE.predict(test)
    assert np.median(err) < 0.03


def test_calibrate_stops_at_the_time_budget(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    import fastfeed.sampling.calibration as cal

    clock = FakeClock()
    monkeypatch.setattr(cal.time, "perf_counter", clock.perf_counter)
    lengths = np.arange(16, 1025)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PoorFitWarning)
        m = calibrate(clock.step, lengths, max_tokens=16384, num_shapes=30, repeats=1, warmup=0,
                      time_budget=0.05, sync=None)
    assert 7 <= m.meta["shapes"] < 30 and "stopped after" in caplog.text


def test_calibrate_with_indices_passes_real_samples() -> None:
    lengths = np.clip(np.random.default_rng(2).lognormal(5, 1, 3000), 16, 1024).astype(np.int64)
    got = []

    def step(idx: np.ndarray) -> None:
        got.append(idx)
        np.ones((len(idx), int(lengths[idx].max()))).sum()  # real work that grows with the batch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PoorFitWarning)  # wall-clock timing on a shared CPU is noisy
        calibrate(step, lengths, max_tokens=4096, num_shapes=10, repeats=1, warmup=1, call_with="indices", sync=None)
    assert all(i.dtype.kind == "i" and i.max() < 3000 for i in got)
    with pytest.raises(ConfigError, match="call_with"):
        calibrate(step, lengths, max_tokens=4096, call_with="tensors")


def test_samplers_accept_a_saved_model(tmp_path: Path) -> None:
    from fastfeed.sampling.samplers import DistributedTokenBudgetSampler

    path = TRUE.save(tmp_path / "m.json")
    lengths = np.clip(np.random.default_rng(3).lognormal(5, 1, 4000), 16, 1024).astype(np.int64)
    s = DistributedTokenBudgetSampler(lengths, max_cost="25ms", cost=str(path), num_replicas=4, rank=2)
    assert s.max_cost == pytest.approx(0.025)
    assert all(TRUE(lengths[b]) <= 0.025 * (1 + 1e-9) for b in s)


def test_calibrate_fits_warm_runs_and_warns_about_per_shape_setup(monkeypatch: pytest.MonkeyPatch) -> None:
    """A step that pays extra on the first run of each shape (e.g. a cuDNN plan build) is named, not fitted."""
    import fastfeed.sampling.calibration as cal

    clock = FakeClock()
    seen: set[tuple[int, ...]] = set()

    def step(lengths: np.ndarray) -> None:
        key = tuple(int(x) for x in lengths)
        if key not in seen:
            seen.add(key)
            clock.now += 0.04  # a 40 ms setup on every new shape
        clock.step(lengths)

    monkeypatch.setattr(cal.time, "perf_counter", clock.perf_counter)
    lengths = np.clip(np.random.default_rng(1).lognormal(5, 1, 5000), 16, 1024).astype(np.int64)
    with pytest.warns(ShapeSetupWarning, match="per-shape setup"):
        m = calibrate(step, lengths, max_tokens=16384, num_shapes=24, repeats=3, warmup=1, sync=None)
    assert m.meta["first_call_extra_s"] == pytest.approx(0.04, rel=0.1)
    assert m.fit.median_ape < 0.02 and m.const < 0.01  # the setup cost stays out of the model
