"""A real SIGKILL of ``fastfeed pack`` mid-shard, then a re-run: byte-identical to a clean run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from _pack_data import tree_digest
from fastfeed.cli import main

REPO = Path(__file__).resolve().parents[2]


def _source(root: Path, samples: int = 40, size: int = 1_000_000) -> Path:
    """40 MB in samples of a 1 MB ``.bin`` and a ``.json``: enough to use the process pool."""
    for i in range(samples):
        d = root / f"part{i % 3}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{i:05d}.bin").write_bytes(os.urandom(size))
        (d / f"{i:05d}.json").write_text(json.dumps({"i": i}))
    return root


def _group_alive(pgid: int) -> bool:
    """Any live (non-zombie) process left in the process group?"""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def _size(path: Path) -> int:
    """Size of ``path``, 0 when it is gone (a temporary file renamed since the listing)."""
    try:
        return os.path.getsize(path)
    except FileNotFoundError:
        return 0


def _kill_mid_shard(src: Path, dst: Path, args: list[str], *, whole_group: bool) -> tuple[list[str], list[str]]:
    """Start the CLI and SIGKILL it (all its processes, or the pack command only) as soon as a
    shard is complete and another one is half written; return (complete, partial) names."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "fastfeed", "pack", str(src), str(dst), *args],
                            env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            names = os.listdir(dst) if dst.is_dir() else []
            partial = [n for n in names if n.endswith(".tmp") and _size(dst / n) > 0]
            if partial and any(n.endswith(".tar") for n in names):
                if whole_group:
                    os.killpg(proc.pid, signal.SIGKILL)
                else:
                    os.kill(proc.pid, signal.SIGKILL)
                break
            time.sleep(0.001)
    finally:
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, f"pack ended before it could be killed: {proc.stderr.read()!r}"
    t0 = time.monotonic()
    while _group_alive(proc.pid):  # writers notice their parent is gone and end themselves
        assert time.monotonic() - t0 < 20, "writer processes outlived the killed pack"
        time.sleep(0.05)
    names = sorted(os.listdir(dst))
    return [n for n in names if n.endswith(".tar")], [n for n in names if n.endswith(".tmp")]


def test_sigkill_mid_pack_then_rerun_is_byte_identical(tmp_path: Path) -> None:
    src = _source(tmp_path / "src")
    args = ["--samples-per-shard", "4", "--workers", "2"]
    assert main(["pack", str(src), str(tmp_path / "clean"), *args]) == 0
    clean = tree_digest(tmp_path / "clean")
    # 1. every process killed at once (like an OOM kill of the job): frozen mid-shard
    dst = tmp_path / "out"
    complete, partial = _kill_mid_shard(src, dst, args, whole_group=True)
    assert partial and complete and not (dst / "index.json").exists()
    kept = {n: (dst / n).stat().st_mtime_ns for n in complete}
    assert main(["pack", str(src), str(dst), *args]) == 0  # the same command again
    assert tree_digest(dst) == clean
    assert [n for n, t in kept.items() if (dst / n).stat().st_mtime_ns == t], "complete shards not reused"
    # 2. only the pack command killed: its writer processes must stop too, then resume
    dst2 = tmp_path / "out2"
    complete, _ = _kill_mid_shard(src, dst2, args, whole_group=False)
    assert complete and not (dst2 / "index.json").exists()
    assert main(["pack", str(src), str(dst2), *args]) == 0
    assert tree_digest(dst2) == clean
