"""LoaderStats: wait time, throughput, skips, periodic lines, with a controlled clock."""

from __future__ import annotations

import logging

import pytest

from fastfeed.errors import ConfigError
from fastfeed.loading.stats import LoaderStats


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_wait_fraction_and_throughput() -> None:
    clock = Clock()
    stats = LoaderStats(clock=clock)
    stats.begin_pass()
    clock.t = 2.0  # start-up: 2 s to the first batch, kept apart
    stats.record(2.0, clock.t, 10)
    for _ in range(4):  # then each step: the loop computes 0.3 s, waits 0.1 s for data
        wait_from = clock.t + 0.3
        clock.t += 0.4
        stats.record(clock.t - wait_from, clock.t, 10)
    s = stats.summary()
    assert s["steps"] == 5 and s["samples"] == 50 and s["first_batch_s"] == 2.0
    assert s["wait_fraction"] == pytest.approx(0.25) and s["samples_per_s"] == pytest.approx(25.0)
    assert s["p50_wait_ms"] == pytest.approx(100.0)


def test_track_counts_skips_and_logs_once(caplog: pytest.LogCaptureFixture) -> None:
    stats = LoaderStats()
    batches = [{"n": 3, "skip": []}, {"n": 2, "skip": ["s.tar: sample 'k1' at offset 512: bad"]},
               {"n": 1, "skip": ["s.tar: sample 'k7' at offset 9: bad", "x"]}]
    with caplog.at_level(logging.WARNING, logger="fastfeed.loader"):
        out = list(stats.track(iter(batches), lambda b: b["n"], lambda b: (len(b["skip"]), b["skip"])))
    assert out == batches and stats.steps == 3 and stats.samples == 6 and stats.skipped == 3
    assert len(caplog.records) == 1 and "'k1'" in caplog.records[0].getMessage()
    assert stats.skip_messages[0].startswith("s.tar")


def test_periodic_line_with_hook(caplog: pytest.LogCaptureFixture) -> None:
    stats = LoaderStats(log_every=2)
    stats.add_line_hook(lambda w: f"verdict: {w['steps']} steps")
    with caplog.at_level(logging.INFO, logger="fastfeed.loader"):
        list(stats.track(iter(range(5)), lambda b: 1))
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and lines[0].startswith("step 2: ") and lines[1].endswith("verdict: 2 steps")
    assert LoaderStats().log_every == 0  # off by default
    with pytest.raises(ConfigError):
        LoaderStats(log_every=-1)
    stats.reset()
    assert stats.summary()["steps"] == 0
