"""The docs cannot rot: the example training loop runs and resumes exactly; the API reference
lists every public name at its defining module. (`make test` also runs `mkdocs build --strict`.)"""

from __future__ import annotations

import importlib.util
import re
import os
import subprocess
import sys
from pathlib import Path

import pytest

import fastfeed
from tools.synth import make_image_folder

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "docs" / "examples" / "train_cpu.py"


def _example():
    spec = importlib.util.spec_from_file_location("train_cpu", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("docs")
    make_image_folder(tmp / "src", num_images=40, num_classes=3, size=(48, 40))
    fastfeed.pack(tmp / "src", tmp / "ff", samples_per_shard=16)
    return tmp / "ff"


def test_train_cpu_resumes_exactly(packed: Path, tmp_path: Path) -> None:
    train = _example().train
    full = train(str(packed), str(tmp_path / "a.pt"), epochs=2)
    assert len(full) == 2 * 40
    assert sorted(full[:40]) == sorted(full[40:]) and full[:40] != full[40:]   # every sample, a new order
    first = train(str(packed), str(tmp_path / "b.pt"), epochs=2, stop_after=24)  # "crash" in epoch 0
    rest = train(str(packed), str(tmp_path / "b.pt"), epochs=2)
    assert first + rest == full


def test_train_cpu_runs_as_a_script(packed: Path, tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, str(EXAMPLE), str(packed), "--epochs", "1", "--ckpt",
                          str(tmp_path / "c.pt")], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "trained on 40 samples"


def test_api_reference_lists_every_public_name_at_its_module() -> None:
    text = "\n".join(p.read_text() for p in (ROOT / "docs" / "reference").glob("*.md"))
    listed = re.findall(r"^::: (fastfeed\.[\w.]+)\.(\w+)$", text, flags=re.M)
    assert sorted(name for _, name in listed) == sorted(fastfeed._EXPORTS)
    for module, name in listed:
        assert fastfeed._EXPORTS[name] == module, f"{name} is defined in {fastfeed._EXPORTS[name]}"


MONITOR_EXAMPLE = ROOT / "docs" / "examples" / "monitor_cpu.py"


def test_monitor_example_reports_where_the_steps_went(packed: Path, tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("monitor_cpu", MONITOR_EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    r = mod.train(str(packed), epochs=2, every=3, html=str(tmp_path / "m.html"), jsonl=str(tmp_path / "m.jsonl"))
    assert r.steps == 2 * 40 // 8 - 1 and r.verdict in fastfeed.diagnosis.vocabulary.VERDICTS
    assert "verdict" not in r.fix and (tmp_path / "m.html").read_text().startswith("<!DOCTYPE html>")
    assert (tmp_path / "m.jsonl").read_text().count("\n") == 1 + 4 + 1  # header, 4 windows, the report


@pytest.mark.slow
def test_monitor_example_runs_as_a_script(packed: Path) -> None:
    out = subprocess.run([sys.executable, str(MONITOR_EXAMPLE), str(packed), "--epochs", "1", "--every", "2"],
                         capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr
    assert "fastfeed step monitor: 1 rank(s)" in out.stdout and "verdict: " in out.stdout
    assert "fastfeed monitor: steps 1-2 on 1 rank(s)" in out.stderr  # rank 0's line per window


@pytest.mark.slow
@pytest.mark.dist
def test_monitor_example_runs_under_torchrun(packed: Path) -> None:
    torchrun = Path(sys.executable).with_name("torchrun")
    out = subprocess.run([str(torchrun), "--standalone", "--nproc-per-node", "2", str(MONITOR_EXAMPLE), str(packed),
                          "--epochs", "2", "--every", "2"], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr[-3000:]
    assert "fastfeed step monitor: 2 rank(s)" in out.stdout and "slowest rank" in out.stdout
