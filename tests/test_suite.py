"""The test suite's own shared pieces: fixtures defined once, in tests/conftest.py."""

from __future__ import annotations

import os
import re
from pathlib import Path

from fastfeed.knobs.record import candidate_files

TESTS = Path(__file__).resolve().parent


def test_isolated_store_keeps_tune_results_in_the_test(isolated_store: Path) -> None:
    assert os.environ["XDG_CACHE_HOME"] == str(isolated_store) and not any(isolated_store.iterdir())
    assert "FASTFEED_TUNE_DIR" not in os.environ and "LOCAL_WORLD_SIZE" not in os.environ
    assert candidate_files("", "f00d") == [isolated_store / "fastfeed" / "tune" / "f00d.json"]


def test_store_isolation_is_defined_once() -> None:
    """Modules use conftest's ``isolated_store``; a copy of it in a module drifts."""
    copies = [str(p.relative_to(TESTS)) for p in sorted(TESTS.rglob("*.py"))
              if p.name != "conftest.py" and re.search(r"^def _isolated_store\(", p.read_text("utf-8"), re.M)]
    assert copies == [], f"define store isolation once, in tests/conftest.py (isolated_store): {copies}"
