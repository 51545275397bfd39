"""The ``fastfeed`` command as a new user meets it: defaults, exit codes, progress, JSON.

Runs the real CLI (``fastfeed.cli.main``) on data packed in tmp_path, and ``python -m
fastfeed`` in a subprocess where the exit status or stderr without a terminal matters.
Budgets are tiny (2-3 s): the figures are not the point here, the conventions are.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import fastfeed
from fastfeed.cli import (
    EXIT_INTERNAL,
    EXIT_OK,
    EXIT_PROBLEMS,
    EXIT_USAGE,
    build_parser,
    main,
)
from fastfeed.knobs.record import TuneKey, TuneRecord, save_record, stored_record
from fastfeed.packed.index import DatasetIndex

pytestmark = pytest.mark.usefixtures("isolated_store")  # see tests/conftest.py

REPO = Path(__file__).resolve().parent.parent


def _cli(*args: str, code: str | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m fastfeed ARGS`` (or ``python -c CODE ARGS``), stdout/stderr piped: no terminal."""
    cmd = [sys.executable, "-c", code, *args] if code else [sys.executable, "-m", "fastfeed", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False,
                          env={**os.environ, "PYTHONPATH": str(REPO)})


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """60 photo-like JPEGs of different sizes, packed (one tar shard)."""
    from tools.synth import make_image_folder

    root = tmp_path_factory.mktemp("cli")
    make_image_folder(root / "train", num_images=60, num_classes=3, size=(96, 72), vary_size=True)
    fastfeed.pack(root / "train", root / "ff")
    return root


# ---------------------------------------------------------------------- conventions
def test_help_documents_the_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == EXIT_OK
    out = capsys.readouterr().out
    assert "exit codes:" in out
    for code, words in ((0, "ok"), (1, "verify found"), (2, "usage error"), (3, "internal error")):
        assert any(line.strip().startswith(f"{code} ") and words in line for line in out.splitlines()), out


def test_verbose_before_or_after_the_command() -> None:
    parser = build_parser()
    assert parser.parse_args(["info", "x", "-v"]).verbose is True
    assert parser.parse_args(["-v", "info", "x"]).verbose is True
    assert parser.parse_args(["info", "x"]).verbose is False


def test_usage_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["no-such-command"]) == EXIT_USAGE
    assert main(["info", str(tmp_path / "missing")]) == EXIT_USAGE
    assert "fastfeed info: error:" in capsys.readouterr().err
    assert main(["tune", str(tmp_path), "--image-size", "big"]) == EXIT_USAGE


def test_internal_error_exits_3_with_a_pointer_to_v(photos: Path) -> None:
    # a runner with a bug (what no test of the real commands can provoke on purpose)
    code = ("import sys, fastfeed.cli as c\n"
            "c.COMMANDS[1] = ('info', 'x', c._add_info, lambda a: {}['missing'])\n"
            "sys.exit(c.main(sys.argv[1:]))")
    quiet = _cli("info", str(photos / "ff"), code=code)
    assert quiet.returncode == EXIT_INTERNAL
    assert quiet.stderr.strip().splitlines() == [
        "fastfeed info: internal error: KeyError: 'missing' (run again with -v for the traceback; please report it)"]
    loud = _cli("info", str(photos / "ff"), "-v", code=code)  # -v after the command
    assert loud.returncode == EXIT_INTERNAL and "Traceback (most recent call last)" in loud.stderr


def test_exit_codes_of_the_real_commands(photos: Path, tmp_path: Path) -> None:
    assert _cli("verify", str(photos / "ff"), "--no-decode").returncode == EXIT_OK
    assert _cli("info", str(tmp_path)).returncode == EXIT_USAGE
    assert _cli("pack", "--no-such-flag").returncode == EXIT_USAGE  # argparse
    broken = tmp_path / "broken"
    fastfeed.pack(photos / "train", broken)
    shard = next(broken.glob("*.tar"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte: the checksum differs
    shard.write_bytes(bytes(data))
    bad = _cli("verify", str(broken), "--no-decode")
    assert bad.returncode == EXIT_PROBLEMS and "problem(s)" in bad.stderr


# ---------------------------------------------------------------------- pack
def test_pack_json_and_already_complete(photos: Path, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    dst = tmp_path / "o"
    assert main(["pack", str(photos / "train"), str(dst), "--json"]) == 0
    first = json.loads(capsys.readouterr().out)
    assert first == {"dst": str(dst), "already_complete": False, "num_samples": 60, "num_shards": 1,
                     "format": "tar", "bytes": first["bytes"], "skipped": 0, "input": "imagefolder",
                     "classes": 3}
    assert first["bytes"] == sum(s.bytes for s in DatasetIndex.load(dst).shards)
    assert main(["pack", str(photos / "train"), str(dst), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["already_complete"] is True
    assert main(["pack", str(photos / "train"), str(dst)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"already complete: {dst} holds these 60 samples") and "packed 60" not in out
    assert main(["pack", str(photos / "train"), str(dst), "--overwrite"]) == 0
    assert capsys.readouterr().out.startswith("packed 60 samples")


def test_progress_lines_without_a_terminal(photos: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    import fastfeed._progress as progress

    # capsys: stderr is not a terminal. A run shorter than the interval prints no line ...
    assert main(["pack", str(photos / "train"), str(tmp_path / "quiet"), "--workers", "1"]) == 0
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(progress, "PROGRESS_EVERY", 0.0)  # ... a longer one a line per interval
    assert main(["pack", str(photos / "train"), str(tmp_path / "o"), "--workers", "1"]) == 0
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert lines and lines[-1].startswith("pack: 60/60 files (100%)") and "MB/s of" in lines[-1]
    assert "\r" not in err  # lines for a log file, not a bar
    assert main(["verify", str(tmp_path / "o")]) == 0
    assert "verify: 1/1 shards (100%)" in capsys.readouterr().err


def test_progress_line_every_interval(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import time

    import fastfeed._progress as progress

    monkeypatch.setattr(progress, "PROGRESS_EVERY", 0.2)
    bar = progress.Progress("verify", "shard", tty=False)
    bar.update(1, 10)
    assert capsys.readouterr().err == ""  # not yet an interval
    time.sleep(0.25)
    bar.update(2, 10)
    bar.update(3, 10)  # within the interval of the last line
    assert capsys.readouterr().err.splitlines() == ["verify: 2/10 shards (20%), 0 s"]
    bar.update(10, 10)  # the end, since lines were shown
    assert capsys.readouterr().err.startswith("verify: 10/10 shards (100%)")


# ---------------------------------------------------------------------- tune and doctor defaults
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


def test_doctor_without_resizing_on_photos_of_different_sizes_stops_with_the_error(photos: Path) -> None:
    # the decode probe's pool used to hang: its initializer raised, and the pool restarted it forever
    out = _cli("doctor", str(photos / "ff"), "--image-size", "none", "--batch-size", "8",
               "--time-budget", "3s", "--num-workers", "0")
    assert out.returncode == EXIT_USAGE, out.stderr[-2000:]
    assert "different shapes" in out.stderr


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


# ---------------------------------------------------------------------- tune: store policy, --plot
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
