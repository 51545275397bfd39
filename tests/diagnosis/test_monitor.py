"""The step monitor in one process: a plain DataLoader, a fastfeed loader from generated data,
any iterable; its outputs (log line, JSON lines, HTML); its edge cases."""

from __future__ import annotations

import json
import logging
import re
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
import torch

import fastfeed
from fastfeed.diagnosis.feed import to_device
from fastfeed.errors import ConfigError
from _loader_data import write_dataset

pytestmark = pytest.mark.usefixtures("isolated_store")


class Slow(torch.utils.data.Dataset):
    """Small tensors, each ``delay`` seconds to load."""

    def __init__(self, n: int, delay: float) -> None:
        self.n, self.delay = n, delay

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(self.delay)
        return torch.full((4,), float(i))


def _train(mon: fastfeed.StepMonitor, batches: Any, step_s: float, limit: int | None = None) -> int:
    n = 0
    for _ in mon(batches):
        time.sleep(step_s)
        n += 1
        if limit is not None and n == limit:
            break
    return n


def sleepy_transform(sample: dict[str, Any]) -> dict[str, Any]:
    time.sleep(0.01)
    return sample


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("monitor") / "data"
    write_dataset(root, shard_counts=(40, 40, 40))
    return root


def test_a_plain_dataloader_that_loads_in_the_loop_is_input_bound() -> None:
    dl = torch.utils.data.DataLoader(Slow(48, 0.004), batch_size=4)  # ~16 ms a batch, a 4 ms step
    mon = fastfeed.StepMonitor(every=4)
    _train(mon, dl, 0.004)
    r = mon.report()
    assert r.verdict == "input-bound" and r.stage is None and r.shares["data"] > 0.5, r.text()
    assert "num_workers" in r.fix and r.samples_per_s and r.loaders[0]["kind"] == "dataloader"
    assert r.steps == 11 and len(r.windows) == 3 and r.world_size == 1


def test_a_fastfeed_loader_feeding_a_slow_step_is_compute_bound_with_its_headroom(dataset: Path) -> None:
    dl = fastfeed.loader(dataset, batch_size=4, decode=None, num_workers=1, seed=0)
    mon = fastfeed.StepMonitor(every=5)
    _train(mon, dl, 0.06, limit=16)  # receiving a batch costs ~2 ms here: well under 10% of a 60 ms step
    r = mon.report()
    assert r.verdict == "compute-bound" and r.shares["compute"] > 0.8, r.text()
    assert r.headroom and r.headroom > 2 and "faster" in r.why
    assert r.loaders[0]["kind"] == "fastfeed" and r.loaders[0]["path"] == str(dataset)
    assert r.loaders[0]["batches"] > 0  # the loader's own stage times reached the report


def test_a_fastfeed_loader_whose_workers_decode_too_slowly_names_the_decode_stage(dataset: Path) -> None:
    dl = fastfeed.loader(dataset, batch_size=4, decode=None, num_workers=1, seed=0, transform=sleepy_transform)
    mon = fastfeed.StepMonitor(every=10)
    _train(mon, dl, 0.002, limit=25)
    r = mon.report()
    assert r.verdict == "input-bound" and r.stage == "decode", r.text()
    assert "decode='dali'" in r.fix and f"fastfeed tune {dataset} --batch-size 4" in r.fix


def test_any_iterable_without_len_works_and_the_last_partial_window_is_reported() -> None:
    def batches() -> Iterator[dict[str, Any]]:
        for i in range(27):
            yield {"x": torch.zeros(2, 3), "i": i}

    mon = fastfeed.StepMonitor(every=10)
    _train(mon, batches(), 0.001)
    r = mon.report()
    assert [(w.first_step, w.steps) for w in r.windows] == [(0, 10), (10, 10), (20, 7)]
    assert r.steps == 26 and r.samples_per_s  # the first step (start-up) is left out
    assert any("first step" in n for n in r.notes)


def test_epochs_breaks_and_reports_mid_run_continue_the_count() -> None:
    mon = fastfeed.StepMonitor(every=5)
    _train(mon, range(8), 0.001, limit=6)  # break: the 6th step ends at the break
    assert mon.steps == 6
    first = mon.report()  # the partial window (steps 6) is gathered; the next one starts after it
    _train(mon, range(8), 0.001)
    r = mon.report()
    assert first.steps == 5 and r.steps == 13
    assert [(w.first_step, w.steps) for w in r.windows] == [(0, 5), (5, 1), (6, 5), (11, 3)]


def test_not_initialised_distributed_reports_alone_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "4")  # a launcher set it, but nobody called init_process_group
    mon = fastfeed.StepMonitor(every=4)
    _train(mon, range(9), 0.001)
    r = mon.report()
    assert r.world_size == 1 and any("torch.distributed is not initialised (WORLD_SIZE=4" in n for n in r.notes)


def test_rank_zero_logs_one_line_per_window(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="fastfeed.monitor")
    mon = fastfeed.StepMonitor(every=5)
    _train(mon, range(15), 0.001)
    lines = [r.getMessage() for r in caplog.records if r.name == "fastfeed.monitor"]
    assert len(lines) == 3 and lines[0].startswith("fastfeed monitor: steps 1-5 on 1 rank(s)")
    assert re.search(r"data \S+%, compute \S+%, collective \S+%, wait \S+%, other \S+%", lines[1]), lines[1]


def test_the_json_lines_file_holds_a_header_every_window_and_the_report(tmp_path: Path) -> None:
    path = tmp_path / "runs" / "monitor.jsonl"
    path.parent.mkdir()
    path.write_text("a previous run\n")
    mon = fastfeed.StepMonitor(every=4, jsonl=path)
    _train(mon, range(10), 0.001)
    r = mon.report()
    rows = [json.loads(line) for line in path.read_text().splitlines()]  # the previous run is gone
    assert [row["type"] for row in rows] == ["header", "window", "window", "window", "report"]
    assert rows[0]["world_size"] == 1 and rows[0]["ranks"][0]["host"]
    assert rows[-1]["verdict"] == r.verdict and rows[-1]["shares"] == r.shares
    assert json.loads(json.dumps(r.to_json())) == rows[-1]


def test_the_html_page_is_self_contained_and_leads_with_the_verdict(tmp_path: Path) -> None:
    mon = fastfeed.StepMonitor(every=5)
    _train(mon, torch.utils.data.DataLoader(Slow(40, 0.002), batch_size=2), 0.002)
    r = mon.report()
    page = r.html(tmp_path / "monitor.html")
    assert (tmp_path / "monitor.html").read_text() == page
    assert page.index(r.verdict) < page.index("Where the step went") < page.index("<svg")
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page) and "<script" not in page
    assert page.count("<svg") == 2 and "fix" in page


def test_a_blocking_collective_of_the_step_counts_as_collective() -> None:
    mon = fastfeed.StepMonitor(every=5)
    for _ in mon(range(12)):
        time.sleep(0.002)
        with mon.collective(nbytes=1024):
            time.sleep(0.01)  # one process: nobody to wait for, so it is all transfer
    r = mon.report()
    assert r.watched and r.shares["collective"] > 0.6 and r.shares["wait"] == 0
    assert r.verdict == "communication-bound", r.text()


def test_callback_style_steps_take_the_data_wait_from_the_caller() -> None:
    mon = fastfeed.StepMonitor(every=3)
    for i in range(7):
        time.sleep(0.004)  # the framework between two steps: fetching, logging
        mon.begin_step(samples=8, data_s=0.001 if i else None)
        time.sleep(0.004)
        mon.end_step()
    r = mon.report()
    assert 0.05 < r.shares["data"] < 0.3 and r.shares["other"] > 0.2, r.text()  # 1 ms of the 4 ms gap is data
    assert r.samples_per_s and r.steps == 6


def test_to_device_moves_tensors_and_keeps_the_rest() -> None:
    batch = {"x": torch.ones(2), "k": ["a", "b"], "t": (torch.zeros(1), 3)}
    out = to_device(batch, "cpu")
    assert out["k"] == ["a", "b"] and out["t"][1] == 3 and torch.equal(out["x"], batch["x"])
    mon = fastfeed.StepMonitor(every=2)
    assert [b["x"].device.type for b in mon([batch, batch], device="cpu")] == ["cpu", "cpu"]


def test_watch_returns_a_model_it_cannot_time_as_it_is(caplog: pytest.LogCaptureFixture) -> None:
    model = torch.nn.Linear(2, 2)
    assert fastfeed.StepMonitor().watch(model) is model and not caplog.records  # one process: nothing to time


@pytest.mark.parametrize(("kwargs", "words"), [
    ({"every": 0}, "every=0"), ({"every": 50, "accumulation": 4}, "use every=52"),
    ({"timeout": 0}, "timeout=0"), ({"clock": "tsc"}, "clock='tsc'"), ({"every": True}, "every=True"),
])
def test_bad_arguments_say_what_and_how_to_fix(kwargs: dict[str, Any], words: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(words)):
        fastfeed.StepMonitor(**kwargs)


def test_a_report_needs_steps() -> None:
    mon = fastfeed.StepMonitor(every=5)
    with pytest.raises(ConfigError, match="no step was measured"):
        mon.report()
    _train(mon, range(1), 0.0)
    with pytest.raises(ConfigError, match="only the first step"):
        mon.report()


@pytest.mark.gpu
def test_cuda_events_time_a_gpu_step_without_per_step_syncs() -> None:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    model = torch.nn.Linear(1024, 1024).cuda()
    mon = fastfeed.StepMonitor(every=10, clock="cuda")
    for x in mon([torch.randn(256, 1024) for _ in range(40)], device="cuda"):
        model(x).sum().backward()
    r = mon.report()
    assert r.steps == 39 and r.shares["compute"] > 0.5 and r.verdict in ("compute-bound", "input-bound")
