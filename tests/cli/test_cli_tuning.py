"""``fastfeed tune``: its defaults as a new user meets them, the store policy, --plot, --json.

Budgets are tiny (2-3 s): the figures are not the point here, the conventions are.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import fastfeed
from fastfeed.cli import EXIT_USAGE, main
from fastfeed.knobs.record import TuneKey, TuneRecord, save_record, stored_record
from fastfeed.packed.index import DatasetIndex

pytestmark = pytest.mark.usefixtures("isolated_store")  # see tests/conftest.py


def test_tune_with_no_flags_on_photos_of_different_sizes(photos: Path, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["tune", str(photos / "ff"), "--time-budget", "3s", "--max-workers", "1",
               "--store-dir", str(tmp_path / "store")])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "assumed --image-size 224 --batch-size 64 (the data has images); pass them to change" in err
    assert "chosen: num_workers=" in out
    # 60 samples, batch 64: said, with what to do
    assert "warning: the batch (64) is larger than the dataset per rank (60 samples)" in out
    assert "--batch-size training uses (at most 60" in out


def test_tune_and_doctor_python_defaults_agree(photos: Path) -> None:
    r = fastfeed.tune(photos / "ff", time_budget="2s", max_workers=0, store=False)
    d = fastfeed.doctor(photos / "ff", time_budget="2s", num_workers=0)
    assert (r.key.batch_size, r.key.image_size) == (64, (224, 224))
    assert (d.settings["batch_size"], d.settings["image_size"]) == (64, [224, 224])
    assert any(f.kind == "small-dataset" for f in d.findings)


def test_defaults_without_images(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from fastfeed.tuning.defaults import resolve_defaults
    from tests._loader_data import write_dataset

    write_dataset(tmp_path / "texts", shard_counts=(40, 40))
    rc = main(["tune", str(tmp_path / "texts"), "--time-budget", "2s", "--max-workers", "0", "--json"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "assumed --batch-size 64 (the data has no images); pass it to change" in err
    assert json.loads(out)["key"]["image_size"] is None and json.loads(out)["key"]["batch_size"] == 64
    given = resolve_defaults(has_images=True, batch_size=8, image_size=None, decode="cpu")
    assert given.line() == "" and given.image_size is None
    raw = resolve_defaults(has_images=True, batch_size=None, image_size="auto", decode=None)
    assert raw.image_size is None  # raw bytes are never resized


def test_tune_keeps_a_better_stored_result(photos: Path, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    dst, store = photos / "ff", tmp_path / "store"
    idx = DatasetIndex.load(dst)
    key = TuneKey.current(idx.fingerprint, batch_size=16, decode="cpu", image_size=224, local_world_size=1)
    better = TuneRecord(key, 7, 3, {}, 5000.0, "2000-01-01T00:00:00+00:00",
                        {"chosen": {"steady": True}, "confirmed": [{"num_workers": 7}], "measuring_s": 600.0})
    save_record(better, str(dst), store)
    args = ["tune", str(dst), "--batch-size", "16", "--time-budget", "2s", "--max-workers", "1",
            "--store-dir", str(store)]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "warning: not stored: the result stored in" in out and "(num_workers=7)" in out
    assert "--replace" in out and "stored in" not in out.replace("the result stored in", "")
    assert stored_record(str(dst), key, store).num_workers == 7
    assert main([*args, "--replace"]) == 0
    assert "loader(num_workers='auto') will use it" in capsys.readouterr().out
    assert stored_record(str(dst), key, store).num_workers <= 1


def test_better_stored_policy() -> None:
    from fastfeed.host import host_info
    from fastfeed.knobs.record import better_stored

    key = TuneKey("f", host_info(), 1, 64, "cpu", None)

    def rec(steady: bool, seconds: float, confirmed: bool = False) -> TuneRecord:
        return TuneRecord(key, 2, 2, details={"chosen": {"steady": steady}, "measuring_s": seconds,
                                              "confirmed": [1] if confirmed else []})

    assert "never reached steady state" in better_stored(rec(True, 10), rec(False, 60))
    assert better_stored(rec(False, 60), rec(True, 1)) is None  # steady beats unsteady, however short
    assert "confirmed" in better_stored(rec(True, 60, True), rec(True, 60))
    assert "measured for 60 s" in better_stored(rec(True, 60), rec(True, 20))
    assert better_stored(rec(True, 60), rec(True, 40)) is None
    assert better_stored(TuneRecord(key, 2, 2), rec(True, 1)) is None  # an old record without the figures


def test_tune_plot_without_matplotlib_fails_before_measuring(photos: Path, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    import time

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now fails
    start = time.monotonic()
    rc = main(["tune", str(photos / "ff"), "--time-budget", "60s", "--plot", str(tmp_path / "t.png"),
               "--no-store"])
    assert rc == EXIT_USAGE and time.monotonic() - start < 30
    assert "pip install 'fastfeed[plot]'" in capsys.readouterr().err
    assert main(["tune", str(photos / "ff"), "--plot", str(tmp_path / "no" / "t.png")]) == EXIT_USAGE
