"""The doctor's raw-pixel advice (``pack --store raw|mixed:P``): when decode limits and the disk has room."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import fastfeed
from fastfeed.diagnosis.probes import ImageStats
from fastfeed.diagnosis.report import Stage
from fastfeed.diagnosis.verdict import RAW_GAIN, Facts, conclude


def _facts(**over: Any) -> Facts:
    stages = {
        "storage": Stage("storage", "storage", 40_000.0, "400 MB/s", {}),
        "decode_core": Stage("decode_core", "decode + augment (1 core)", 500.0, "", {}),
        "decode_all": Stage("decode_all", "decode + augment (8 cores)", 4_000.0, "", {}),
        "loader": Stage("loader", "loader", 3_900.0, "", {}),
    }
    base: dict[str, Any] = dict(
        path="/data/ff", batch_size=64, image_size=(224, 224), decode="cpu", num_workers=8, prefetch_factor=2,
        workers_from="tuned", cores_per_rank=8, local_ranks=1, remote=False, cache_dir=None,
        fits_in_memory=True, demand=None, step_time=None, stages=stages, profile=None,
        images=ImageStats(64, 500.0, 375.0, 110_000.0), balance=None, dali_skipped="no GPU",
        num_samples=1_000_000, disk_free=2_000_000_000_000)
    base.update(over)
    return Facts(**base)


def _fix(**over: Any) -> str:
    findings = conclude(_facts(**over))[0]
    return findings[0].fix


def test_decode_bound_with_disk_to_spare_suggests_raw_with_its_cost() -> None:
    fix = _fix()
    assert "`fastfeed pack SRC DST --store raw`" in fix
    assert "~562.5 GB of disk for 1,000,000 images of ~500x375" in fix, fix  # 3 x 500 x 375 bytes each
    rate = RAW_GAIN * 4_000
    assert f"at {rate:,.0f} images/s the storage must then deliver ~{rate * 562_500 / 1e6:,.0f} MB/s" in fix
    demand = _fix(demand=9_000.0)
    assert "at 9,000 images/s the storage must then deliver ~5,062 MB/s" in demand


def test_less_disk_suggests_a_mixed_share_and_none_when_stored_raw() -> None:
    fix = _fix(disk_free=300_000_000_000)  # 0.8 x 300 GB = 240 GB of the 562 GB
    assert "--store mixed:0.4" in fix and "smallest images as pixels" in fix
    assert "--store" not in _fix(disk_free=50_000_000_000)  # not even a fifth fits
    assert "--store" not in _fix(stored_raw=True)
    assert "--store" not in _fix(decode="dali")


def test_large_images_are_costed_at_the_suggested_max_side() -> None:
    fix = _fix(images=ImageStats(64, 2000.0, 1500.0, 900_000.0))
    assert "--max-side 448" in fix and "`fastfeed pack SRC DST --max-side 448 --store raw`" in fix


def test_doctor_reads_a_raw_dataset(tmp_path: Path) -> None:
    from _raw_data import write_raw_source

    write_raw_source(tmp_path / "src", copies=2, messy=False)
    fastfeed.pack(tmp_path / "src", tmp_path / "raw", store="raw")
    report = fastfeed.doctor(tmp_path / "raw", batch_size=4, image_size=32, num_workers=0, time_budget="4s")
    assert report.stage("decode_core") is not None and "--store raw" not in report.verdict.fix
    img = report.to_json()
    assert img["bottleneck"]
