"""``fastfeed doctor``: its defaults, --fail-if-input-bound as a CI gate, the text and JSON it prints."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _cli import run_cli

from fastfeed.cli import EXIT_OK, EXIT_PROBLEMS, EXIT_USAGE, main

pytestmark = pytest.mark.usefixtures("isolated_store")  # see tests/conftest.py


def test_doctor_without_resizing_on_photos_of_different_sizes_stops_with_the_error(photos: Path) -> None:
    # the decode probe's pool used to hang: its initializer raised, and the pool restarted it forever
    out = run_cli("doctor", str(photos / "ff"), "--image-size", "none", "--batch-size", "8",
                  "--time-budget", "3s", "--num-workers", "0")
    assert out.returncode == EXIT_USAGE, out.stderr[-2000:]
    assert "different shapes" in out.stderr


def test_doctor_defaults_and_fail_if_input_bound(photos: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dst = str(photos / "ff")
    common = ["--time-budget", "2s", "--num-workers", "0", "--batch-size", "16", "--json"]
    assert main(["doctor", dst, "--fail-if-input-bound", *common]) == EXIT_USAGE  # no demand: nothing to gate
    assert "needs what training consumes" in capsys.readouterr().err
    assert main(["doctor", dst, "--step-time", "0.00001", "--fail-if-input-bound", *common]) == EXIT_PROBLEMS
    out, err = capsys.readouterr()
    assert json.loads(out)["input_bound"] is True and "exit 1 (--fail-if-input-bound)" in err
    assert "assumed --image-size 224 (the data has images); pass it to change" in err
    assert main(["doctor", dst, "--step-time", "1000", "--fail-if-input-bound", *common]) == EXIT_OK
    assert json.loads(capsys.readouterr().out)["input_bound"] is False


def test_doctor_prints_its_report_and_says_where_the_html_is(photos: Path, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    html = tmp_path / "r.html"
    assert main(["doctor", str(photos / "ff"), "--time-budget", "2s", "--num-workers", "0", "--batch-size", "16",
                 "--report", str(html)]) == EXIT_OK
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert lines[0] == f"fastfeed doctor: {photos / 'ff'}" and "verdict: " in out
    assert lines[-1] == f"report: {html}" and html.is_file()
    assert "  measured " in err  # progress, one line per stage, on stderr
    assert main(["doctor", str(photos / "ff"), "--num-workers", "many"]) == EXIT_USAGE
    assert capsys.readouterr().err.endswith("fastfeed doctor: error: --num-workers 'many': write a number or auto\n")
