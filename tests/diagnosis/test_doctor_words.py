"""``fastfeed doctor``'s figures and page: the verdict quotes a row of its table (and says which, when not
the loader's); a batch larger than the dataset gets one consistent action; the HTML renders commands
as code, colours a good verdict apart from a bad one, and keeps its axis labels apart."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

import fastfeed
from fastfeed.diagnosis.report import DoctorReport, Finding, Stage, nice_ticks

pytestmark = pytest.mark.usefixtures("isolated_store")  # see tests/conftest.py


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from tools.synth import make_image_folder

    root = tmp_path_factory.mktemp("doctor-words")
    make_image_folder(root / "src", num_images=192, num_classes=4, size=(64, 48))
    make_image_folder(root / "tiny", num_images=47, num_classes=3, size=(48, 36))
    return {"ff": Path(fastfeed.pack(root / "src", root / "ff", workers=1).root),
            "tiny": Path(fastfeed.pack(root / "tiny", root / "tiny-ff", workers=1).root)}


def _title_figure(report: DoctorReport) -> float:
    m = re.search(r"the pipeline delivers ([\d,]+) samples/s per rank", report.verdict.title)
    assert m, report.verdict.title
    return float(m.group(1).replace(",", ""))


def _rows(report: DoctorReport) -> dict[str, str]:
    return {s.key: f"{s.samples_per_s:,.0f}" for s in report.stages if s.samples_per_s is not None}


# ---------------------------------------------------------------------- the verdict's figure is a row's
def test_with_ranks_sharing_the_host_the_verdict_names_the_row_it_quotes(
        packed: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")  # decode on the host's cores, shared by 2 ranks
    r = fastfeed.doctor(packed["ff"], batch_size=16, image_size=32, num_workers=0, step_time=0.001,
                        time_budget=4)
    figure, rows = f"{_title_figure(r):,.0f}", _rows(r)
    assert figure == f"{r.deliverable:,.0f}" and figure in rows.values(), (r.text(), rows)
    if figure != rows["loader"]:
        assert r.verdict.why.startswith(f"{figure} samples/s per rank is the decode row's figure, not the loader "
                                        f"row's {rows['loader']}: the host's ")
        assert "shared by its 2 ranks" in r.verdict.why


def test_one_rank_the_verdict_quotes_the_loader_row(packed: dict[str, Path]) -> None:
    r = fastfeed.doctor(packed["ff"], batch_size=16, image_size=32, num_workers=1, time_budget=3)
    assert f"{_title_figure(r):,.0f}" == _rows(r)["loader"], r.text()
    assert "row's figure" not in r.verdict.why


def _facts(**over: Any) -> Any:
    from fastfeed.diagnosis.verdict import Facts

    stages = {"storage": Stage("storage", "storage", 500.0, "", {}),
              "decode_core": Stage("decode_core", "decode (1 core)", 300.0, "", {"per_cpu_second": 320.0}),
              "decode_all": Stage("decode_all", "decode (8 cores)", 1097.0, "", {"per_cpu_second": 310.0}),
              "loader": Stage("loader", "loader", 1509.0, "", {})}
    base: dict[str, Any] = dict(
        path="/data/ff", batch_size=64, image_size=(224, 224), decode="cpu", num_workers=7, prefetch_factor=2,
        workers_from="tuned", cores_per_rank=4, local_ranks=2, remote=False, cache_dir=None, fits_in_memory=True,
        demand=None, step_time=None, stages=stages, profile=None, images=None, balance=None, dali_skipped="x")
    base.update(over)
    return Facts(**base)


def test_each_figure_that_is_not_the_loader_row_says_why() -> None:
    from fastfeed.diagnosis.verdict import conclude

    shared = conclude(_facts(stages={**_facts().stages, "storage": Stage("storage", "storage", 9e4, "", {})}))[0][0]
    assert "delivers 1,097 samples/s per rank" in shared.title
    assert shared.why.startswith("1,097 samples/s per rank is the decode row's figure, not the loader row's 1,509: "
                                 "the host's 8 cores are shared by its 2 ranks")
    cold = conclude(_facts(local_ranks=1, fits_in_memory=False))[0][0]  # read from disk every epoch
    assert "delivers 500 samples/s per rank" in cold.title and cold.kind == "storage"
    assert cold.why.startswith("500 samples/s per rank is the storage row's figure, not the loader row's 1,509: "
                               "the shards are read cold every epoch")
    apart = conclude(_facts(local_ranks=1, cores_per_rank=8,
                            stages={**_facts().stages, "storage": Stage("storage", "storage", 9e4, "", {})}))[0][0]
    assert "delivers 1,509 samples/s per rank" in apart.title and "row's figure" not in apart.why
    assert "decode was measured apart, at another moment, and came out below the loader" in apart.why


# ---------------------------------------------------------------------- a batch larger than the dataset
def test_a_batch_larger_than_the_dataset_gets_one_action(packed: dict[str, Path]) -> None:
    r = fastfeed.doctor(packed["tiny"], num_workers=0, step_time=0.001, time_budget=3)  # batch 64 > 47 samples
    first = r.findings[0]
    assert first.kind == "small-dataset" and "at most 47" in first.fix, r.text()
    advice = " ".join(f.fix for f in r.findings)
    assert not re.search(r"(set|raise) num_workers", advice), r.text()
    assert "num_workers=0" not in " ".join(f.title for f in r.findings)  # not named as the limit either
    assert all(f.kind != "workers" for f in r.findings)


# ---------------------------------------------------------------------- the page
def _page(report: DoctorReport) -> str:
    page = report.html()
    assert "`" not in re.sub(r"<code>.*?</code>", "", page), "a literal backtick on the page"
    return page


def test_the_page_of_a_healthy_and_of_an_input_bound_run(packed: dict[str, Path]) -> None:
    good = fastfeed.doctor(packed["ff"], batch_size=16, image_size=32, num_workers=1, step_time=30, time_budget=3)
    assert good.verdict.kind == "not-input-bound" and good.tone == "not-input-bound"
    page = _page(good)
    assert "<div class='f v not-input-bound'>" in page and "<div class='f v input-bound'>" not in page
    bad = fastfeed.doctor(packed["ff"], batch_size=16, image_size=32, num_workers=0, step_time=0.0001,
                          time_budget=3)
    assert bad.input_bound and bad.tone == "input-bound"
    page = _page(bad)
    assert "<div class='f v input-bound'>" in page and "<code>fastfeed tune " in page
    from fastfeed.diagnosis.monitor_page import VERDICT_COLORS

    assert VERDICT_COLORS["input-bound"] in page  # the step monitor's colour for the same verdict
    assert f".not-input-bound{{border-color:{VERDICT_COLORS['compute-bound']}}}" in page


def test_the_chart_keeps_its_axis_labels_apart() -> None:
    for hi in (45.0, 1_509.0, 11_000.0, 19_123.0, 87_000.0, 2.4e6):
        ticks = nice_ticks(hi)
        assert 3 <= len(ticks) <= 7 and ticks[-1] >= hi and ticks[0] == 0, (hi, ticks)
    from fastfeed.diagnosis.report import svg_chart

    stages = tuple(Stage(k, k, v, "", {}) for k, v in
                   (("storage", 19_123.0), ("decode_core", 1_210.0), ("decode_all", 2_290.0), ("loader", 2_105.0)))
    verdict = Finding("workers", "input-bound", "why", "fix")
    report = DoctorReport("ff", {}, {}, {}, 4_000.0, "", 2_105.0, "workers", True, 0.5, (verdict,), stages, 1.0)
    svg = svg_chart(report)
    xs = [float(x) for x in re.findall(r'<text x="([\d.]+)" y="\d+" text-anchor="middle" fill="#666">', svg)]
    assert 3 <= len(xs) <= 7 and min(b - a for a, b in zip(xs, xs[1:])) >= 60, xs  # no smear
    assert ">20k<" in svg and ">5k<" in svg


def test_the_monitor_page_renders_commands_as_code_in_the_same_colours(tmp_path: Path) -> None:
    import time

    import torch

    from fastfeed.diagnosis.monitor_page import VERDICT_COLORS

    class Slow(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 40

        def __getitem__(self, i: int) -> torch.Tensor:
            time.sleep(0.004)
            return torch.zeros(2)

    mon = fastfeed.StepMonitor(every=5)
    for _ in mon(torch.utils.data.DataLoader(Slow(), batch_size=2)):
        time.sleep(0.001)
    r = mon.report()
    assert r.verdict == "input-bound" and "`" in r.fix, r.text()
    page = r.html(tmp_path / "monitor.html")
    assert "`" not in re.sub(r"<code>.*?</code>", "", page) and "<code>fastfeed " in page
    assert f"border-color:{VERDICT_COLORS['input-bound']}" in page
