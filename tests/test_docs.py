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
