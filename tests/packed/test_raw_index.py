"""The index of raw-pixel datasets: version 2 only for them, shapes.npy, info and verify."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import fastfeed
from fastfeed.cli import main
from fastfeed.errors import IndexMismatchError, IndexVersionError
from fastfeed.packed.index import DatasetIndex
from _raw_data import write_raw_source


@pytest.fixture(scope="module")
def packs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("rawidx")
    write_raw_source(base / "src", copies=1, messy=False)
    return {store: Path(fastfeed.pack(base / "src", base / store.replace(":", ""), store=store,
                                      samples_per_shard=3).root) for store in ("jpeg", "raw", "mixed:0.5")}


def test_only_raw_datasets_get_the_new_version(packs: dict[str, Path]) -> None:
    versions = {s: json.loads((p / "index.json").read_text())["fastfeed_index"] for s, p in packs.items()}
    assert versions == {"jpeg": 1, "raw": 2, "mixed:0.5": 2}  # a JPEG dataset stays readable by older fastfeeds
    assert DatasetIndex.load(packs["jpeg"]).shapes is None and not (packs["jpeg"] / "shapes.npy").exists()
    assert DatasetIndex.load(packs["raw"]).version == 2


def test_a_version_this_fastfeed_does_not_know_is_refused(packs: dict[str, Path], tmp_path: Path) -> None:
    d = json.loads((packs["raw"] / "index.json").read_text())
    with pytest.raises(IndexVersionError, match="index format version 3, this fastfeed reads versions 1, 2"):
        DatasetIndex.from_json({**d, "fastfeed_index": 3})
    with pytest.raises(IndexMismatchError, match='without a "store" entry'):
        DatasetIndex.from_json({k: v for k, v in d.items() if k != "store"})


def test_info_shows_the_store_and_the_jpeg_size(packs: dict[str, Path], capsys: pytest.CaptureFixture) -> None:
    assert fastfeed.info(packs["jpeg"])["store"] == {"mode": "jpeg"}
    st = fastfeed.info(packs["mixed:0.5"])["store"]
    assert st["mode"] == "mixed" and st["raw_samples"] == 4 and st["bytes_as_jpeg"] < st["bytes"]
    assert main(["info", str(packs["mixed:0.5"])]) == 0
    assert "store      mixed (share 0.5 as pixels) (rgb8): 4 image(s) as pixels" in capsys.readouterr().out
    assert main(["info", str(packs["jpeg"])]) == 0
    assert "store      jpeg" in capsys.readouterr().out


def test_verify_checks_pixels_against_shapes(packs: dict[str, Path], tmp_path: Path,
                                             capsys: pytest.CaptureFixture) -> None:
    import shutil

    assert fastfeed.verify(packs["mixed:0.5"]).ok and fastfeed.verify(packs["raw"]).pixels == 8
    bad = tmp_path / "bad"
    shutil.copytree(packs["mixed:0.5"], bad)
    shapes = np.load(bad / "shapes.npy")
    raw_row = int(np.flatnonzero(shapes[:, 0])[0])
    jpeg_row = int(np.flatnonzero(shapes[:, 0] == 0)[0])
    shapes[raw_row, 1] += 2
    shapes[jpeg_row] = (5, 5)
    np.save(bad / "shapes.npy", shapes)
    report = fastfeed.verify(bad)
    text = "\n".join(report.problems)
    assert not report.ok and "its shape" in text and "needs" in text and "but it has no field rgb8" in text
    assert main(["verify", str(bad)]) != 0 and "problem(s)" in capsys.readouterr().err
