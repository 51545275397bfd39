"""``fastfeed tune`` quotes one figure per setting: the headline, the table's ``*``, the JSON, the plot
and the stored record agree; a batch larger than the dataset is said at once and measured in seconds.

The confirmation path is driven by fake measurements (a lucky search figure, then slower
re-measurements: the case where a headline used to quote one round while the next line said
"median ..."); the rest runs the real loader on data built in ``tmp_path``.
"""

from __future__ import annotations

import json
import logging
import re
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import fastfeed
from fastfeed.host import host_info
from fastfeed.knobs.record import TuneKey
from fastfeed.knobs.space import Setting
from fastfeed.timing.measure import Measurement
from fastfeed.tuning.report import TuneResult
from fastfeed.tuning.search import search

pytestmark = pytest.mark.usefixtures("isolated_store")  # see tests/conftest.py


def _m(rate: float) -> Measurement:
    wins = (rate * 0.98, rate, rate * 1.02)
    return Measurement(rate, rate / 64, rate * 0.98, rate * 1.02, rate, 60, 3840, 3840 / rate, 3.0, 0.2, 4, 0.01,
                       1, (), wins, True)


class Bench:
    """A fake loader on 2 cores: the search sees workers=2 prefetch=4 at a lucky 1,442/s; re-measured, every
    setting is slower, and each round of a setting differs (the median is none of the rounds)."""

    searched = {0: 1094.0, 1: 946.0, 2: 1328.0}
    rounds = {Setting(2, 2): [1088.0, 1011.0], Setting(2, 4): [1120.0, 1085.0]}

    def __init__(self) -> None:
        self.now = 0.0
        self.seen: dict[Setting, int] = {}

    def clock(self) -> float:
        return self.now

    def measure(self, s: Setting) -> Measurement:
        self.now += 2.0
        return _m(1442.0 if s == Setting(2, 4) else self.searched.get(s.num_workers, 900.0))

    def confirm(self, s: Setting) -> Measurement:
        self.now += 3.0
        i = self.seen.get(s, 0)
        self.seen[s] = i + 1
        return _m(self.rounds.get(s, [800.0, 800.0])[i % 2])


@pytest.fixture
def confirmed() -> TuneResult:
    b = Bench()
    out = search(b.measure, cores=2, time_budget=60, confirm_fn=b.confirm, confirm_scale=1.5, clock=b.clock)
    assert out.confirmed, "the fake must drive the confirmation step"
    key = TuneKey("f" * 16, host_info(), 1, 64, "cpu", (224, 224))
    return TuneResult("ds", key, out.best.setting, out.best.measurement, out.trials, out.reason, None, None,
                      2, 2, None, 60.0, b.now, out.out_of_time, confirmed=out.confirmed)


def _headline(summary: str) -> float:
    m = re.search(r"^chosen: .*\(([\d,]+) samples/s", summary, re.M)
    assert m, summary
    return float(m.group(1).replace(",", ""))


def test_the_headline_is_the_figure_the_choice_was_made_on(confirmed: TuneResult) -> None:
    r = confirmed
    pick = next(c for c in r.confirmed if c.setting == r.setting)
    assert r.samples_per_s == pick.rate != r.measurement.samples_per_s  # the median, not one of its rounds
    summary, d = r.summary(), r.to_json()
    assert _headline(summary) == round(pick.rate) == round(d["chosen"]["samples_per_s"])
    assert f"median {pick.rate:,.0f} samples/s" in r.reason  # the why line quotes the same figure
    marked = [t for t in d["trials"] if t["chosen"]]
    assert len(marked) == d["chosen"]["runs"] == len(pick.rates) == 2
    assert np.median([t["measurement"]["samples_per_s"] for t in marked]) == d["chosen"]["samples_per_s"]
    assert all(t["phase"] == "confirm" and t["prefetch_factor"] == r.prefetch_factor for t in marked)
    starred = [line for line in r.table().splitlines() if line.startswith("*")]
    assert len(starred) == 2 and all(" confirm " in line for line in starred)
    assert "the median of the 2 re-measurements marked *" in summary
    base = r.rate_of(Setting(0))
    assert f"vs num_workers=0 (PyTorch's default): {r.samples_per_s / base:.1f}x ({base:,.0f} samples/s)" in summary


def test_the_plot_star_sits_on_the_chosen_series(confirmed: TuneResult, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from fastfeed.tuning.report import figure_of, plot_result

    r = confirmed
    lines = {ln.get_label(): ln for ln in figure_of(r).axes[0].get_lines()}
    star = next(ln for label, ln in lines.items() if label.startswith("chosen: "))
    series = lines[f"prefetch_factor={r.prefetch_factor}"]
    x, y = star.get_xdata()[0], star.get_ydata()[0]
    points = dict(zip(series.get_xdata(), series.get_ydata()))
    assert (x, y) == (r.num_workers, r.samples_per_s) and points[x] == y  # on its line, at the headline figure
    assert star.get_color() == series.get_color()
    assert f"({r.samples_per_s:,.0f}/s)" in star.get_label()
    # every setting at one figure: the re-measured ones at their median, the others at their search figure
    rings = lines[next(label for label in lines if label.startswith("re-measured"))]
    assert sorted(rings.get_ydata()) == sorted(c.rate for c in r.confirmed)
    png = plot_result(r, tmp_path / "t.png")
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_without_confirmation_the_figure_is_the_search_trial() -> None:
    def curve(s: Setting) -> Measurement:
        return _m(100.0 * min(s.num_workers + 1, 3))

    out = search(curve, cores=4, time_budget=60, confirm_top=0)
    assert not out.confirmed and out.rate == out.best.rate
    key = TuneKey("f" * 16, host_info(), 1, 64, "cpu", None)
    r = TuneResult("ds", key, out.best.setting, out.best.measurement, out.trials, out.reason, None, None, 4, 4,
                   None, 60.0, 1.0, False)
    assert _headline(r.summary()) == r.samples_per_s == out.best.rate
    assert [t["chosen"] for t in r.to_json()["trials"]].count(True) == 1
    assert "re-measurements marked" not in r.summary()


# ---------------------------------------------------------------------- the real loader
@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from tools.synth import make_image_folder

    root = tmp_path_factory.mktemp("figures")
    make_image_folder(root / "small", num_images=47, num_classes=3, size=(64, 48), vary_size=True)
    make_image_folder(root / "big", num_images=96, num_classes=3, size=(48, 36))
    return {"small": Path(fastfeed.pack(root / "small", root / "small-ff", workers=1).root),
            "big": Path(fastfeed.pack(root / "big", root / "big-ff", workers=1).root)}


def test_real_tune_headline_table_json_and_store_agree(photos: dict[str, Path], tmp_path: Path) -> None:
    from fastfeed.knobs.record import stored_record

    r = fastfeed.tune(photos["big"], batch_size=8, image_size=32, time_budget="5s", max_workers=2,
                      store_dir=tmp_path)
    d = json.loads(json.dumps(r.to_json()))
    assert _headline(r.summary()) == round(d["chosen"]["samples_per_s"])
    marked = [t["measurement"]["samples_per_s"] for t in d["trials"] if t["chosen"]]
    assert marked and np.median(marked) == pytest.approx(d["chosen"]["samples_per_s"])
    assert stored_record(str(photos["big"]), r.key, tmp_path).samples_per_s == r.samples_per_s


def test_a_batch_larger_than_the_dataset_is_said_at_once_and_measured_in_seconds(
        photos: dict[str, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="fastfeed.tuning.api")
    seen: list[Any] = []

    def on_trial(t: Any) -> None:  # the warning came before the first measurement
        seen.append([r.getMessage() for r in caplog.records])

    start = time.monotonic()
    r = fastfeed.tune(photos["small"], time_budget="60s", store_dir=tmp_path, on_trial=on_trial)
    took = time.monotonic() - start
    assert took < 30, f"{took:.0f} s for one partial batch per epoch"
    assert r.key.batch_size == 64 and r.num_workers == 0 and len(r.trials) == 1
    assert any("the batch (64) is larger than the dataset per rank (47 samples)" in m and "only num_workers=0"
               in m for m in seen[0])
    assert "every epoch is one partial batch, which no worker can prepare ahead" in r.reason
    assert any("at most 47" in n for n in r.notes) and r.stored_at is not None
    assert "warning: the batch (64) is larger than the dataset" in r.summary()
