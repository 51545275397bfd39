"""``fastfeed doctor``: planted bottlenecks, each named with its figures; one measuring core; the live line.

Each scenario plants one bottleneck in a small generated dataset and checks that the
doctor's verdict names it:

1. slow storage: shards served over HTTP by a server on 127.0.0.1 that sleeps per request;
2. ``num_workers=0`` with heavy decode;
3. large JPEGs where decode dominates;
4. skewed lengths with torch's ``DistributedSampler``;
5. a pipeline far faster than a slow training step (not input-bound).
"""

from __future__ import annotations

import functools
import http.server
import importlib
import json
import logging
import os
import re
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

import fastfeed
from fastfeed.loading.bottleneck import LoadProfile, diagnose
from fastfeed.errors import ConfigError
from fastfeed.timing.measure import Measurement
from tools.synth import make_image_folder, make_jpeg, make_text_jsonl

BUDGET = 4.0  # seconds of measuring per diagnosis (stages take a share each; start-up comes on top)
HEAVY_BUDGET = 6.0  # large JPEGs: enough for a few batches of ~0.3 s per stage


# ---------------------------------------------------------------------- data
@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Small photo-like JPEGs: cheap to decode, packed in 12 shards."""
    root = tmp_path_factory.mktemp("doctor-small")
    make_image_folder(root / "src", num_images=384, num_classes=4, size=(64, 48))
    fastfeed.pack(root / "src", root / "packed", samples_per_shard=32, workers=1)
    return root


@pytest.fixture(scope="module")
def heavy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Large JPEGs (1600x1200, ~1 MB): decode costs ~40 ms each, reading ~1 ms."""
    root = tmp_path_factory.mktemp("doctor-heavy")
    rng = np.random.default_rng(0)
    photos = [make_jpeg(rng, (1600, 1200)) for _ in range(3)]
    for i in range(48):
        folder = root / "src" / f"c{i % 2}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"img{i:03d}.jpg").write_bytes(photos[i % 3])
    fastfeed.pack(root / "src", root / "packed", samples_per_shard=8, workers=1, jpeg_restarts=False)  # plain JPEGs
    return root / "packed"


class _Body:
    """The bytes ``[start, start + n)`` of a file, for a 206 answer."""

    def __init__(self, f: Any, n: int) -> None:
        self.f, self.n = f, n

    def read(self, k: int = -1) -> bytes:
        k = self.n if k is None or k < 0 else min(k, self.n)
        data = self.f.read(k) if k > 0 else b""
        self.n -= len(data)
        return data

    def close(self) -> None:
        self.f.close()


class SlowHandler(http.server.SimpleHTTPRequestHandler):
    """Static files with single-range support, sleeping ``delay`` seconds before each answer."""

    delay = 0.12

    def log_message(self, *args: Any) -> None:
        pass

    def send_head(self) -> Any:
        time.sleep(self.delay)
        path = self.translate_path(self.path)
        if not os.path.isfile(path):
            self.send_error(404)
            return None
        size = os.path.getsize(path)
        f = open(path, "rb")
        m = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
        if m is None:
            self.send_response(200)
            self.send_header("Content-Length", str(size))
            self.send_header("Content-Type", "application/octet-stream")
            self.end_headers()
            return f
        start = int(m.group(1))
        end = min(size - 1, int(m.group(2)) if m.group(2) else size - 1)
        f.seek(start)
        self.send_response(206)
        self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        self.send_header("Content-Length", str(end - start + 1))
        self.send_header("Content-Type", "application/octet-stream")
        self.end_headers()
        return _Body(f, end - start + 1)


@pytest.fixture(scope="module")
def slow_http(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A packed dataset (4 samples per shard) behind an HTTP server on 127.0.0.1 adding latency."""
    pytest.importorskip("aiohttp", reason="fsspec's HTTP filesystem needs aiohttp (dev dependencies)")
    root = tmp_path_factory.mktemp("doctor-http")
    make_image_folder(root / "src", num_images=160, num_classes=4, size=(48, 32))
    fastfeed.pack(root / "src", root / "packed", samples_per_shard=4, workers=1)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(SlowHandler, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/packed"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def texts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Text samples with lognormal(5, 1) word counts, lengths recorded at pack time."""
    root = tmp_path_factory.mktemp("doctor-text")
    make_text_jsonl(root / "t.jsonl", num_samples=3000, seed=1, max_len=1024)
    fastfeed.pack(root / "t.jsonl", root / "packed", samples_per_shard=500, length="text", workers=1)
    return root / "packed"


def _figures_from_measure(report: Any) -> None:
    """Every rate in the report is a Measurement's median-of-windows rate."""
    for s in report.stages:
        if s.skipped or s.samples_per_s is None:
            continue
        assert isinstance(s.measurement, Measurement), s.key
        assert s.samples_per_s > 0, s.key


# ---------------------------------------------------------------------- the planted bottlenecks
def test_slow_storage_is_named(slow_http: str) -> None:
    report = fastfeed.doctor(slow_http, batch_size=8, image_size=32, num_workers=2, time_budget=BUDGET,
                             workers=fastfeed.Workers(prefetch_factor=2))
    assert report.bottleneck == "storage" and report.limiting == "storage", report.text()
    storage = report.stage("storage")
    assert storage is not None and storage.figures["remote"] and storage.figures["latency_ms"] >= 100
    decode = report.stage("decode_all")
    assert decode is not None and decode.samples_per_s > 5 * storage.samples_per_s  # planted: storage only
    assert "cache_dir" in report.verdict.fix and "--shard-size" in report.verdict.fix
    _figures_from_measure(report)


def test_num_workers_zero_with_heavy_decode(heavy: Path) -> None:
    report = fastfeed.doctor(heavy, batch_size=8, image_size=64, num_workers=0, step_time=0.3,
                             time_budget=HEAVY_BUDGET)
    assert report.bottleneck == "workers" and report.input_bound, report.text()
    # loading runs inside every step, so training waits whatever the headroom
    assert "num_workers=0" in report.verdict.title and "waits" in report.verdict.title
    assert re.search(r"set num_workers=[1-9]", report.verdict.fix)
    profile = report.stage("loader").figures["profile"]
    assert profile["num_workers"] == 0 and profile["read_share"] < 0.5  # planted: decode, not reading
    _figures_from_measure(report)


def test_large_jpegs_are_decode_bound(heavy: Path) -> None:
    cores = len(os.sched_getaffinity(0))
    report = fastfeed.doctor(heavy, batch_size=8, image_size=64, num_workers=cores, target_rate=5000,
                             time_budget=HEAVY_BUDGET, workers=fastfeed.Workers(prefetch_factor=2))
    assert report.bottleneck == "decode" and report.input_bound and report.headroom < 1, report.text()
    profile = report.stage("loader").figures["profile"]
    assert profile["decode_s"] > 2 * profile["read_s"]  # the workers' own timings say: decoding
    assert "--max-side" in report.verdict.fix and "decode='dali'" in report.verdict.fix
    assert "--store raw" in report.verdict.fix and "MB/s" in report.verdict.fix  # disk to spare in tmp
    from fastfeed.decode import roi

    if roi.available():  # plain JPEGs: the restart-marker re-pack is suggested too
        assert "--jpeg-restarts" in report.verdict.fix
    dali = report.stage("dali")
    assert dali is not None and dali.skipped  # no GPU here: skipped, with the reason
    _figures_from_measure(report)


def test_skewed_lengths_with_distributed_sampler(texts: Path) -> None:
    report = fastfeed.doctor(texts, batch_size=16, world_size=8, num_workers=1, time_budget=BUDGET,
                             workers=fastfeed.Workers(prefetch_factor=2))
    assert report.bottleneck == "balance", report.text()
    balance = report.stage("balance")
    ff, base = balance.figures["samplers"]
    assert base["padding_efficiency"] < 0.7 < 0.95 < ff["padding_efficiency"]
    assert base["straggler_ratio"] > ff["straggler_ratio"]
    assert "DistributedLengthBucketSampler" in report.verdict.fix
    assert json.loads(json.dumps(report.to_json()))["bottleneck"] == "balance"


def test_fast_pipeline_slow_step_is_not_input_bound(small: Path, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    from fastfeed.cli import main

    html = tmp_path / "report.html"
    code = main(["doctor", str(small / "packed"), "--batch-size", "8", "--image-size", "32", "--step-time", "0.3",
                 "--num-workers", "2", "--prefetch-factor", "2", "--time-budget", str(BUDGET), "--json",
                 "--report", str(html), "--source", str(small / "src")])
    assert code == 0
    d = json.loads(capsys.readouterr().out)
    assert d["bottleneck"] == "not-input-bound" and d["input_bound"] is False, d["verdict"]
    assert d["headroom"] > 3 and d["demand"] == pytest.approx(8 / 0.3)
    step = next(s for s in d["stages"] if s["key"] == "loader_step")
    assert step["figures"]["wait_fraction"] < 0.2
    assert {"storage", "source", "decode_core", "decode_all", "loader", "dali", "balance"} <= {
        s["key"] for s in d["stages"]}
    page = html.read_text(encoding="utf-8")
    assert "<svg" in page and "demand" in page and "not input-bound" in page
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page)  # self-contained: no external assets


# ---------------------------------------------------------------------- one measuring core
def test_loader_figure_comes_from_the_measuring_core(small: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tune_module = importlib.import_module("fastfeed.tuning.api")
    probes = importlib.import_module("fastfeed.diagnosis.probes")
    seen: list[Measurement] = []

    def spy(real: Any) -> Any:
        def wrapped(*args: Any, **kwargs: Any) -> Measurement:
            m = real(*args, **kwargs)
            seen.append(m)
            return m
        return wrapped

    monkeypatch.setattr(tune_module, "measure", spy(tune_module.measure))
    monkeypatch.setattr(probes, "measure", spy(probes.measure))
    report = fastfeed.doctor(small / "packed", batch_size=8, image_size=32, num_workers=1, time_budget=3,
                             workers=fastfeed.Workers(prefetch_factor=2))
    loader = report.stage("loader")
    assert loader.measurement in seen and loader.samples_per_s == loader.measurement.samples_per_s
    for key in ("storage", "decode_core", "decode_all"):
        stage = report.stage(key)
        assert stage.measurement in seen, key
    # the same function tune and the benchmarks measure the loader with
    assert report.stage("loader").figures["measurement"]["samples_per_s"] == loader.samples_per_s
    text = report.text()
    assert "verdict:" in text and f"{loader.samples_per_s:,.0f}" in text


# ---------------------------------------------------------------------- the live line
def test_periodic_line_names_the_bottleneck(heavy: Path, caplog: pytest.LogCaptureFixture) -> None:
    dl = fastfeed.loader(heavy, batch_size=4, image_size=64, num_workers=0, log_every=3)
    with caplog.at_level(logging.INFO, logger="fastfeed.loader"):
        for _ in dl:
            pass
    lines = [r.getMessage() for r in caplog.records if r.name == "fastfeed.loader"]
    assert lines and "loading in the training process (num_workers=0" in lines[-1], lines
    s = dl.stats.summary()
    assert s["load_batches"] == s["steps"] - 1 and s["decode_s"] > s["read_s"] > 0


def test_diagnose_classes() -> None:
    def p(wait: float, read: float, dec: float, workers: int, step: float = 10.0) -> str:
        return diagnose(LoadProfile(wait, step, read, dec, read + dec, 50, workers)).kind

    assert p(0.01, 5, 5, 2) == "not-input-bound"
    assert p(0.3, 1, 18, 2) == "decode"
    assert p(0.3, 16, 3, 2) == "storage"
    assert p(0.3, 1, 4, 2) == "transfer"
    assert p(0.3, 1, 4, 0) == "workers"
    assert diagnose(LoadProfile(0.3, 10, 0, 0, 0, 0, 2)).kind == "input-bound"  # no timings (DALI)


def test_bad_arguments(small: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not both"):
        fastfeed.doctor(small / "packed", target_rate=100, step_time=0.1)
    with pytest.raises(ConfigError, match="step_time"):
        fastfeed.doctor(small / "packed", step_time=0)
    with pytest.raises(ConfigError, match="fastfeed pack"):
        fastfeed.doctor(small / "src")  # raw files: pack them first
    with pytest.raises(ConfigError, match="--source"):
        fastfeed.doctor(small / "packed", source=tmp_path / "missing", time_budget=1)


@pytest.mark.dali
def test_dali_stage_measures_the_dali_loader(small: Path) -> None:
    """The GPU-decode stage runs loader(decode="dali") through the measuring core (CPU-only DALI here)."""
    pytest.importorskip("nvidia.dali", reason="NVIDIA DALI is in the [dali] extra")
    from fastfeed.diagnosis.stages import Budget, Run, dali_stage
    from fastfeed.knobs.space import Setting
    from fastfeed.tuning.api import measured_options

    stages: list[Any] = []
    training = measured_options(batch_size=8, decode="cpu", image_size=(32, 32), seed=0, rank=0, world_size=1)
    # the stage runs DALI with training's Dali group: device_id=None puts DALI on the CPU (no GPU here)
    options = replace(training, dali=fastfeed.Dali(device_id=None))
    run = Run(str(small / "packed"), Setting(1, 2), options, Budget(2, ["dali"]), stages.append)
    dali_stage(run, None)
    (stage,) = stages
    assert stage.key == "dali" and stage.skipped is None and stage.samples_per_s > 0
    assert isinstance(stage.measurement, Measurement) and stage.samples_per_s == stage.measurement.samples_per_s


def test_image_stats_count_plain_jpegs() -> None:
    from fastfeed.decode import roi
    from fastfeed.diagnosis.probes import image_stats
    from tools.synth import make_jpeg

    plain = make_jpeg(np.random.default_rng(0), (64, 48))
    assert image_stats([{"jpg": plain}] * 4).plain_jpeg_share == 1.0
    if roi.available():
        rst = roi.add_restarts(plain)
        assert image_stats([{"jpg": plain}, {"jpg": rst}]).plain_jpeg_share == 0.5


# ---------------------------------------------------------------------- verdict wording
def _facts(**over: Any) -> Any:
    from fastfeed.diagnosis.report import Stage
    from fastfeed.diagnosis.verdict import Facts

    stages = {
        "storage": Stage("storage", "storage", 40_000.0, "400 MB/s", {}),
        "source": Stage("source", "raw files", 3_000.0, "3,000 files/s", {}),
        "decode_core": Stage("decode_core", "decode + augment (1 core)", None, "", {},
                             skipped="decode='dali': measured by the loader stage"),
        "loader": Stage("loader", "loader", 900.0, "", {}),
    }
    base: dict[str, Any] = dict(
        path="/data/ff", batch_size=64, image_size=(224, 224), decode="dali", num_workers=2, prefetch_factor=2,
        workers_from="heuristic", cores_per_rank=8, local_ranks=1, remote=False, cache_dir=None,
        fits_in_memory=True, demand=2000.0, step_time=None, stages=stages, profile=None, images=None,
        balance=None, dali_skipped="the loader stage already runs decode='dali'")
    base.update(over)
    return Facts(**base)


def test_dali_verdict_says_what_was_measured_and_packing_is_not_a_fix() -> None:
    from fastfeed.diagnosis.verdict import conclude

    findings, kind, deliverable, input_bound, _ = conclude(_facts())
    assert kind == "decode" and deliverable == 900.0 and input_bound is True
    text = "\n".join(f"{f.title} | {f.why} | {f.fix}" for f in findings)
    assert "?" not in text, text
    main = findings[0]
    assert main.why.startswith("the DALI loader (GPU decode) delivers 900 samples/s (CPU decode not measured: "
                               "decode='dali'")
    assert "loader(..., decode='dali')" not in main.fix and "--decode dali" in main.fix  # already on DALI
    packing = next(f for f in findings if f.kind == "packing")
    assert packing.title == "what packing bought: the packed shards read 13.3x faster than the raw files"
    assert packing.fix.startswith("nothing to do: you already read the packed shards")
    assert "train from the packed shards" not in text


def test_small_dataset_is_named_with_what_to_do() -> None:
    from fastfeed.diagnosis.verdict import conclude
    from fastfeed.tuning.defaults import small_dataset_note

    note = small_dataset_note(40, 64, 2)
    findings = conclude(_facts(decode="cpu", small_dataset=note))[0]
    small = next(f for f in findings if f.kind == "small-dataset")
    assert small.title == "the batch (64) is larger than the dataset per rank (20 samples over 2 ranks)"
    assert "num_workers=0 looks best" in small.why and "at most 20" in small.fix
    assert small_dataset_note(128, 64, 2) is None
