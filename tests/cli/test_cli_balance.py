"""``fastfeed balance``: prints the BalanceReport (text(), to_json()) of a packed dataset's lengths."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import fastfeed
from fastfeed.cli import EXIT_OK, EXIT_USAGE, main


@pytest.fixture(scope="module")
def texts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """200 texts of lognormal lengths, packed with their lengths."""
    from tools.synth import make_text_jsonl

    root = tmp_path_factory.mktemp("balance")
    src = make_text_jsonl(root / "texts.jsonl", num_samples=200, seed=2)
    fastfeed.pack(src, root / "ds", length="text", workers=1)
    return root / "ds"


def test_balance_prints_the_report(texts: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["balance", str(texts), "--world-size", "2", "--batch-size", "8", "--seed", "1"]
    report = fastfeed.balance_report(texts, world_size=2, batch_size=8, seed=1)
    assert main(args) == EXIT_OK
    out = capsys.readouterr().out
    assert out == report.text() + "\n" and report.text() == report.table()
    assert out.startswith("200 samples, world size 2, cost tokens [tokens]")
    assert out.splitlines()[-1].startswith("predicted speed-up per real token: ")
    assert main([*args, "--json"]) == EXIT_OK
    assert json.loads(capsys.readouterr().out) == json.loads(json.dumps(report.to_json()))


def test_balance_needs_a_world_size_and_one_budget(texts: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["balance", str(texts), "--batch-size", "8"]) == EXIT_USAGE
    assert main(["balance", str(texts), "--world-size", "2"]) == EXIT_USAGE
    assert main(["balance", str(texts), "--world-size", "2", "--batch-size", "8", "--max-cost", "100"]) == EXIT_USAGE
    assert "not allowed with argument" in capsys.readouterr().err
