"""Run the ``fastfeed`` command in a subprocess, stdout/stderr piped (no terminal)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run_cli(*args: str, code: str | None = None, exe: str | os.PathLike[str] | None = None
            ) -> subprocess.CompletedProcess[str]:
    """``python -m fastfeed ARGS``; ``code``: ``python -c CODE ARGS``; ``exe``: that program (the console script)."""
    if exe is not None:
        cmd = [str(exe), *args]
    elif code is not None:
        cmd = [sys.executable, "-c", code, *args]
    else:
        cmd = [sys.executable, "-m", "fastfeed", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
