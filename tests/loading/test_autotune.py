"""fastfeed.loading.autotune and the loader's Autotuner: the setting follows the data wait, the order does not.

:func:`decide` is pure: it runs over a grid of measurements and settings without any process. A
few real loaders (2 worker processes to start, a slow per-sample transform so that the loop
waits) show the wiring: a deeper prefetch within the epoch, more workers from the next one, the
same batches in the same order as ``autotune=False``, and an exact resume.
"""

from __future__ import annotations

import itertools
import logging
import time
from pathlib import Path
from typing import Any

import pytest

import fastfeed
from fastfeed.loading import auto
from fastfeed.loading.autotune import GOAL, MIN_STEPS, Limits, Setting, Window, decide
from fastfeed.loading.cpu import loader as cpu_loader_module
from fastfeed.loading.cpu.loader import Autotuner

pytestmark = pytest.mark.usefixtures("isolated_store")

LOGGER = "fastfeed.loading.cpu.loader"
# the loader may grow past this 2-core machine's cores in these tests (the limit is patched): PyTorch says so
MANY_WORKERS = "ignore:This DataLoader will create:UserWarning"


# ---------------------------------------------------------------------- decide(), pure
def _window(wait: float, busy: float | None, n: int, steps: int = 16, step_s: float = 2.0) -> Window:
    return Window(steps, wait * step_s, step_s, None if busy is None else busy * n * step_s)


WAITS = (0.0, 0.01, GOAL, 0.021, 0.05, 0.3, 0.9, 1.0)
BUSIES = (None, 0.0, 0.3, 0.84, 0.85, 1.0, 1.7)
LIMITS = (Limits(max_workers=1), Limits(max_workers=2), Limits(max_workers=8), Limits(max_workers=14, max_prefetch=4),
          Limits(max_workers=8, batch_bytes=1000, max_in_flight_bytes=24_000),
          Limits(max_workers=8, batch_bytes=1000, max_in_flight_bytes=500))


@pytest.mark.parametrize("n, pf", [(1, 1), (1, 8), (2, 2), (2, 4), (4, 2), (8, 8), (12, 2), (16, 16)])
def test_decide_never_lowers_and_respects_its_limits(n: int, pf: int) -> None:
    cur = Setting(n, pf)
    for wait, busy, lim in itertools.product(WAITS, BUSIES, LIMITS):
        d = decide([_window(wait, busy, n)], cur, lim)
        what = f"wait {wait}, busy {busy}, {lim}: {d}"
        assert d.prefetch_factor >= pf and d.num_workers >= n, what  # never lowers
        assert d.prefetch_factor <= max(pf, lim.max_prefetch), what
        assert d.num_workers <= max(n, lim.max_workers), what
        if d.prefetch_factor > pf or d.num_workers > n:  # a change never passes the memory bound
            assert lim.fits(Setting(d.num_workers, d.prefetch_factor)), what
        if wait <= GOAL:
            assert (d.prefetch_factor, d.num_workers, d.reason, d.at_limit) == (pf, n, "", False), what
            continue
        assert d.reason.startswith(f"data wait {min(wait, 0.99):.1%} of step time over 16 steps"), what
        assert d.changed != d.at_limit, what  # waiting: it changes something, or says it cannot
        if d.at_limit:
            assert (d.prefetch_factor, d.num_workers) == (pf, n) and "at its limits" in d.reason, what
        else:
            assert (f"prefetch_factor {pf} -> {d.prefetch_factor} now" in d.reason) == (d.prefetch_factor > pf)
            assert (f"num_workers {n} -> {d.num_workers} from the next epoch" in d.reason) == (d.num_workers > n)


@pytest.mark.parametrize("steps", [0, 1, MIN_STEPS - 1])
def test_too_few_steps_decide_nothing(steps: int) -> None:
    d = decide([_window(0.9, 1.0, 2, steps=steps)], Setting(2, 2), Limits(max_workers=8))
    assert (d.prefetch_factor, d.num_workers, d.changed, d.at_limit) == (2, 2, False, False)


def test_windows_pool_until_enough_steps() -> None:
    w = _window(0.5, 1.0, 2, steps=4)
    assert not decide([w], Setting(2, 2), Limits(max_workers=8)).changed
    assert decide([w, w], Setting(2, 2), Limits(max_workers=8)).changed


@pytest.mark.parametrize("busy, workers_now", [(0.3, False), (0.84, False), (0.85, True), (1.0, True), (None, True)])
def test_idle_workers_get_a_deeper_prefetch_first_busy_ones_more_workers(busy: float | None, workers_now: bool) -> None:
    d = decide([_window(0.2, busy, 2)], Setting(2, 2), Limits(max_workers=8))
    assert d.prefetch_factor == 4
    assert (d.num_workers > 2) == workers_now


def test_the_worker_count_is_what_delivers_the_rate() -> None:
    # 2 workers busy 100%, 50% waiting: 2 x 1.15 / 0.5 = 4.6 -> 5
    assert decide([_window(0.5, 1.0, 2)], Setting(2, 2), Limits(max_workers=14)).num_workers == 5
    # prefetch at its deepest, workers idle: one more
    assert decide([_window(0.5, 0.3, 2)], Setting(2, 8), Limits(max_workers=14)).num_workers == 3
    # capped by the host
    assert decide([_window(0.99, 1.0, 4)], Setting(4, 2), Limits(max_workers=6)).num_workers == 6


@pytest.mark.parametrize("cur, lim, why", [
    (Setting(2, 8), Limits(max_workers=2), "num_workers=2 is what the host has left for workers; prefetch_factor=8"),
    (Setting(4, 2), Limits(max_workers=4, batch_bytes=100, max_in_flight_bytes=800), "the memory bound"),
    (Setting(16, 16), Limits(max_workers=8), "num_workers=16 is what the host has left"),
])
def test_at_its_limits_it_says_which(cur: Setting, lim: Limits, why: str) -> None:
    d = decide([_window(0.4, 1.0, cur.num_workers)], cur, lim)
    assert d.at_limit and not d.changed and why in d.reason
    assert (d.prefetch_factor, d.num_workers) == (cur.prefetch_factor, cur.num_workers)


def test_a_prefetch_beyond_the_deepest_stays() -> None:
    """A tuned prefetch factor deeper than the tuner's own limit is kept, never cut to it."""
    d = decide([_window(0.5, 0.2, 4)], Setting(4, 12), Limits(max_workers=8))
    assert d.prefetch_factor == 12 and d.num_workers == 5


# ---------------------------------------------------------------------- the Autotuner, in one process
def _tuner(setting: Setting, limits: Limits) -> Autotuner:
    t = Autotuner(setting, gpu=False)
    t.limits = limits  # this host's cores out of the way
    return t


def test_the_autotuner_says_its_limit_once(caplog: pytest.LogCaptureFixture) -> None:
    t = _tuner(Setting(2, 8), Limits(max_workers=2))
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        for _ in range(5):
            t.observe(wait_s=0.5, step_s=2.0, steps=16, work_s=4.0)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("autotune: ")]
    assert len(lines) == 1 and "at its limits" in lines[0]
    assert t.changes == [] and t.limit == lines[0][len("autotune: "):]
    assert t.setting == Setting(2, 8) and t.boundary(1) is None


def test_the_autotuner_applies_prefetch_now_and_workers_at_the_boundary(caplog: pytest.LogCaptureFixture) -> None:
    t = _tuner(Setting(2, 2), Limits(max_workers=8))
    asked: list[int] = []
    t._prefetch = asked.append
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        t.observe(wait_s=0.5, step_s=2.0, steps=16, work_s=4.0)
        assert t.setting == Setting(2, 4) and asked == [4]
        t.observe(wait_s=0.5, step_s=2.0, steps=16, work_s=4.0)  # still waiting: deeper, and the workers stay asked for
        assert t.setting == Setting(2, 8) and asked == [4, 8]
        assert t.boundary(epoch=1) == 4 and t.setting == Setting(4, 8)  # 2 x 1.15 / 0.75 = 3.07
        assert t.boundary(epoch=2) is None
    lines = [r.getMessage() for r in caplog.records]
    assert len(t.changes) == 2 and all(c in " ".join(lines) for c in t.changes)
    assert "num_workers 2 -> 4 from epoch 1" in lines[-1]


# ---------------------------------------------------------------------- real loaders
SLEEP_S = 0.01  # per sample, in the workers: 2 workers deliver a 4-image batch every 20 ms, the loop takes none


def slow(sample: dict[str, Any]) -> dict[str, Any]:
    """A slow per-sample transform (a module-level function: the workers import it)."""
    time.sleep(SLEEP_S)
    return sample


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """64 PIL images in 2 class folders, packed by fastfeed.pack."""
    from PIL import Image

    src = tmp_path_factory.mktemp("autotune-src")
    for i in range(64):
        d = src / f"c{i % 2}"
        d.mkdir(exist_ok=True)
        Image.new("RGB", (24 + i % 5, 20 + i % 3), (i * 4 % 256, 80, 160)).save(d / f"im{i:03d}.jpg")
    dst = tmp_path_factory.mktemp("autotune-packed")
    fastfeed.pack(src, dst, samples_per_shard=16, overwrite=True)
    return dst


@pytest.fixture
def start_at_two(monkeypatch: pytest.MonkeyPatch) -> None:
    """num_workers='auto' starts at 2 workers (the heuristic's answer), and may grow to 4."""
    monkeypatch.setattr(auto, "heuristic_workers", lambda *a, **k: 2)
    monkeypatch.setattr(cpu_loader_module, "worker_cores", lambda *a, **k: 4)


def _loader(packed: Path, **kw: Any) -> fastfeed.Loader:
    workers = {"pin_memory": False, **kw.pop("workers", {})}
    return fastfeed.loader(packed, batch_size=4, image_size=16, seed=3, transform=slow,
                           workers=fastfeed.Workers(**workers), **kw)


def _keys(dl: fastfeed.Loader, epochs: range, seen: list[tuple[int, int, int, int]] | None = None) -> list[list[str]]:
    """The batch keys of each epoch; ``seen``: (epoch, batch, num_workers, prefetch_factor) per batch."""
    out = []
    for e in epochs:
        dl.set_epoch(e)
        keys = []
        for i, b in enumerate(dl):
            keys.append(b["__key__"])
            if seen is not None:
                seen.append((e, i, dl.num_workers, dl.prefetch_factor))
        out.append(keys)
    return out


@pytest.mark.filterwarnings(MANY_WORKERS)
def test_autotune_deepens_prefetch_now_and_adds_workers_next_epoch_same_batches(
        packed: Path, start_at_two: None, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        fixed = _loader(packed, workers={"autotune": False})
        assert fixed.autotune is None and (fixed.num_workers, fixed.workers_from) == (2, "heuristic")
        want = _keys(fixed, range(3))
        assert not [r for r in caplog.records if r.getMessage().startswith("autotune: ")]
        assert (fixed.num_workers, fixed.prefetch_factor) == (2, 4)  # autotune=False: nothing changes

        dl = _loader(packed)
        assert dl.autotune is not None and (dl.num_workers, dl.prefetch_factor) == (2, 4)
        seen: list[tuple[int, int, int, int]] = []
        got = _keys(dl, range(3), seen)
    assert got == want  # the same batches, in the same order
    keys = sorted(k for b in want[0] for k in b)
    assert all(sorted(k for b in epoch for k in b) == keys for epoch in got) and len(keys) == 64  # exactly once
    first = [s for s in seen if s[0] == 0]
    assert first[0][2:] == (2, 4) and first[-1][3] == 8  # prefetch deepened within epoch 0
    assert {s[2] for s in first} == {2}  # ... the workers did not change mid-epoch
    assert {s[2] for s in seen if s[0] >= 1} == {4}  # more workers from epoch 1 (capped at the patched 4)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("autotune: ")]
    assert any("prefetch_factor 4 -> 8 now" in x and "data wait" in x for x in lines)
    assert any("num_workers 2 -> 4 from epoch 1" in x for x in lines)
    assert dl.autotune.changes and all(c.startswith("data wait ") for c in dl.autotune.changes)


@pytest.mark.filterwarnings(MANY_WORKERS)
@pytest.mark.parametrize("stop_epoch, stop_at", [(0, 10), (1, 5)])
def test_resume_is_exact_while_autotune_changed_the_setting(
        packed: Path, start_at_two: None, stop_epoch: int, stop_at: int) -> None:
    want = _keys(_loader(packed, workers={"autotune": False}), range(2))
    dl = _loader(packed)
    got: list[list[str]] = []
    for e in range(stop_epoch + 1):
        dl.set_epoch(e)
        got.append([])
        for i, b in enumerate(dl):
            got[-1].append(b["__key__"])
            if e == stop_epoch and i + 1 == stop_at:
                break
    assert dl.autotune is not None and dl.autotune.changes  # the setting changed before the stop
    assert dl.prefetch_factor == 8 and dl.num_workers == (4 if stop_epoch else 2)
    state = dl.state_dict()
    again = _loader(packed)
    again.load_state_dict(state)
    for e in range(stop_epoch, 2):
        if e > stop_epoch:
            again.set_epoch(e)
            got.append([])
        got[-1] += [b["__key__"] for b in again]
    assert got == want


def test_explicit_workers_never_autotune(packed: Path, start_at_two: None, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        dl = _loader(packed, num_workers=2, workers={"prefetch_factor": 2})
        assert dl.autotune is None and dl.workers_from == "explicit"
        _keys(dl, range(2))
        dl0 = _loader(packed, num_workers=0)
        assert dl0.autotune is None
    assert (dl.num_workers, dl.prefetch_factor) == (2, 2)
    assert not [r for r in caplog.records if r.getMessage().startswith("autotune: ")]
