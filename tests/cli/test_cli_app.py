"""The conventions every ``fastfeed`` command shares: --help, -v, exit codes, the entry points.

Runs the real CLI (``fastfeed.cli.main``) on data packed in tmp_path, and ``python -m
fastfeed`` / the console script in a subprocess where the exit status or stderr without a
terminal matters.
"""

from __future__ import annotations

import dataclasses
from importlib.metadata import entry_points
from pathlib import Path

import pytest
from _cli import REPO, run_cli

import fastfeed
import fastfeed.cli
from fastfeed.cli import (
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_PROBLEMS,
    EXIT_USAGE,
    build_parser,
    main,
)
from fastfeed.cli import app

pytestmark = pytest.mark.usefixtures("isolated_store")  # see tests/conftest.py


def test_public_names() -> None:
    assert fastfeed.cli.__all__ == sorted(fastfeed.cli.__all__)
    assert (EXIT_OK, EXIT_PROBLEMS, EXIT_USAGE, EXIT_INTERNAL, EXIT_INTERRUPTED) == (0, 1, 2, 3, 130)
    assert fastfeed.cli.main is app.main and [c.name for c in app.COMMANDS] == [
        "pack", "info", "verify", "shapes", "tune", "balance", "doctor"]


def test_help_documents_the_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == EXIT_OK
    out = capsys.readouterr().out
    assert "exit codes:" in out
    for code, words in ((0, "ok"), (1, "verify found"), (2, "usage error"), (3, "internal error"),
                        (130, "interrupted")):
        assert any(line.strip().startswith(f"{code} ") and words in line for line in out.splitlines()), out


@pytest.mark.parametrize("command", [c.name for c in app.COMMANDS])
def test_every_command_has_its_help(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([command, "--help"]) == EXIT_OK
    out = capsys.readouterr().out
    assert out.startswith(f"usage: fastfeed {command} ") and "-v, --verbose" in out
    assert next(c.help for c in app.COMMANDS if c.name == command)[:30] in " ".join(out.split())


def test_verbose_before_or_after_the_command() -> None:
    parser = build_parser()
    assert parser.parse_args(["info", "x", "-v"]).verbose is True
    assert parser.parse_args(["-v", "info", "x"]).verbose is True
    assert parser.parse_args(["info", "x"]).verbose is False


def test_usage_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["no-such-command"]) == EXIT_USAGE
    assert main([]) == EXIT_USAGE  # no command: the help, exit 2
    assert "usage: fastfeed" in capsys.readouterr().out
    assert main(["info", str(tmp_path / "missing")]) == EXIT_USAGE
    assert "fastfeed info: error:" in capsys.readouterr().err
    assert main(["tune", str(tmp_path), "--image-size", "big"]) == EXIT_USAGE


def test_internal_error_exits_3_with_a_pointer_to_v(photos: Path) -> None:
    # a runner with a bug (what no test of the real commands can provoke on purpose)
    code = ("import dataclasses, sys, fastfeed.cli.app as app\n"
            "app.COMMANDS = tuple(dataclasses.replace(c, run=lambda a: {}['missing']) if c.name == 'info' else c\n"
            "                     for c in app.COMMANDS)\n"
            "sys.exit(app.main(sys.argv[1:]))")
    quiet = run_cli("info", str(photos / "ff"), code=code)
    assert quiet.returncode == EXIT_INTERNAL
    assert quiet.stderr.strip().splitlines() == [
        "fastfeed info: internal error: KeyError: 'missing' (run again with -v for the traceback; please report it)"]
    loud = run_cli("info", str(photos / "ff"), "-v", code=code)  # -v after the command
    assert loud.returncode == EXIT_INTERNAL and "Traceback (most recent call last)" in loud.stderr


def test_interrupted_exits_130(photos: Path, monkeypatch: pytest.MonkeyPatch,
                               capsys: pytest.CaptureFixture[str]) -> None:
    def interrupted(args: object) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(app, "COMMANDS", tuple(dataclasses.replace(c, run=interrupted) if c.name == "info" else c
                                               for c in app.COMMANDS))
    assert main(["info", str(photos / "ff")]) == EXIT_INTERRUPTED
    assert capsys.readouterr().err == "interrupted\n"


def test_exit_codes_of_the_real_commands(photos: Path, tmp_path: Path) -> None:
    assert run_cli("verify", str(photos / "ff"), "--no-decode").returncode == EXIT_OK
    assert run_cli("info", str(tmp_path)).returncode == EXIT_USAGE
    assert run_cli("pack", "--no-such-flag").returncode == EXIT_USAGE  # argparse
    broken = tmp_path / "broken"
    fastfeed.pack(photos / "train", broken)
    shard = next(broken.glob("*.tar"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte: the checksum differs
    shard.write_bytes(bytes(data))
    bad = run_cli("verify", str(broken), "--no-decode")
    assert bad.returncode == EXIT_PROBLEMS and "problem(s)" in bad.stderr


def test_python_m_fastfeed(photos: Path, capsys: pytest.CaptureFixture[str]) -> None:
    version = run_cli("--version")
    assert (version.returncode, version.stdout) == (EXIT_OK, f"fastfeed {fastfeed.__version__}\n")
    out = run_cli("info", str(photos / "ff"))
    assert main(["info", str(photos / "ff")]) == EXIT_OK
    assert (out.returncode, out.stdout, out.stderr) == (EXIT_OK, capsys.readouterr().out, "")


def test_console_script(photos: Path, tmp_path: Path) -> None:
    (ep,) = entry_points(group="console_scripts", name="fastfeed")
    assert ep.value == "fastfeed.cli:main" and ep.load() is main
    script = REPO / ".venv" / "bin" / "fastfeed"
    if not script.is_file():
        pytest.skip(f"{script}: no console script (install with `make demo` or pip install -e .)")
    ok = run_cli("info", str(photos / "ff"), "--json", exe=script)
    assert ok.returncode == EXIT_OK and '"num_samples": 60' in ok.stdout
    missing = run_cli("info", str(tmp_path / "missing"), exe=script)
    assert missing.returncode == EXIT_USAGE and missing.stderr.startswith("fastfeed info: error:")


def test_building_the_parser_imports_no_heavy_module() -> None:
    # `fastfeed --help` must answer at once: numpy, torch and the loader's machinery load when a command
    # runs; the flags come from the loader options' definitions, which import neither
    code = ("import sys, fastfeed.cli as c; c.build_parser()\n"
            "print(sorted(m for m in ('numpy', 'torch', 'fastfeed.loading.api', 'fastfeed.packed') if m in sys.modules))")
    out = run_cli(code=code)
    assert (out.returncode, out.stdout.strip()) == (0, "[]"), out.stderr
