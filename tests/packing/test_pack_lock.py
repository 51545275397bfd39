"""Two ``fastfeed pack`` processes into one DST (``--overwrite`` or not): the second is refused, naming the first.

Real processes: the first is held inside its pack (its progress callback waits for a file), the
second is the CLI. A holder killed with SIGKILL leaves its lock file behind; the kernel released its
lock, so the next pack takes it over and finishes byte-identically to a clean run.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import fastfeed
from _pack_data import tree_digest, write_messy_folder
from fastfeed.errors import DestinationBusyError, DestinationError
from fastfeed.packed.layout import LOCK_NAME
from fastfeed.packing.dest import hold_destination

REPO = Path(__file__).resolve().parents[2]

#: A pack that, once under way, waits until the file ``GO`` exists (and says so in ``READY``).
HOLDER = """
import sys, time
from pathlib import Path
import fastfeed
src, dst, ready, go = sys.argv[1:5]
def progress(*_):
    Path(ready).touch()
    while not Path(go).exists():
        time.sleep(0.05)
fastfeed.pack(src, dst, samples_per_shard=3, workers=1, overwrite=True, progress=progress)
"""


@pytest.fixture(scope="module")
def src(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("lock-src")
    write_messy_folder(root)
    return root


def _start_holder(src: Path, dst: Path, tmp: Path) -> tuple[subprocess.Popen[bytes], Path]:
    go = tmp / "go"
    ready = tmp / "ready"
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(src), str(dst), str(ready), str(go)], cwd=REPO)
    deadline = time.monotonic() + 60
    while not ready.exists():
        assert proc.poll() is None, "the first pack ended early"
        assert time.monotonic() < deadline, "the first pack never started writing"
        time.sleep(0.05)
    return proc, go


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fastfeed", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=120)


def test_a_second_pack_into_a_busy_dst_is_refused_naming_the_first(src: Path, tmp_path: Path) -> None:
    dst = tmp_path / "ds"
    first, go = _start_holder(src, dst, tmp_path)
    try:
        holder = json.loads((dst / LOCK_NAME).read_text())
        assert holder["pid"] == first.pid and holder["host"] == socket.gethostname() and holder["started"]
        r = _cli("pack", str(src), str(dst), "--overwrite", "--samples-per-shard", "3")
        assert r.returncode == 2, r.stderr
        line = r.stderr.strip().splitlines()[-1]
        assert f"{dst}: another `fastfeed pack` is writing into this folder (pid {first.pid} on " \
               f"{socket.gethostname()}, started {holder['started']}" in line
        assert f"kill {first.pid} on {socket.gethostname()}" in line and "internal error" not in r.stderr
        with pytest.raises(DestinationBusyError) as e:  # the API too, without --overwrite
            fastfeed.pack(src, dst, samples_per_shard=3)
        assert e.value.holder["pid"] == first.pid and isinstance(e.value, DestinationError)
        assert list((dst / ".fastfeed-pack").iterdir())  # the refused packs removed nothing of the first's
    finally:
        go.touch()
        assert first.wait(60) == 0
    assert not (dst / LOCK_NAME).exists()  # the holder removed it when it ended
    assert fastfeed.verify(dst).ok
    assert _cli("pack", str(src), str(dst), "--overwrite", "--samples-per-shard", "3").returncode == 0


def test_the_lock_of_a_killed_pack_is_taken_over(src: Path, tmp_path: Path) -> None:
    clean = tmp_path / "clean"
    fastfeed.pack(src, clean, samples_per_shard=3, workers=1)
    dst = tmp_path / "ds"
    first, _ = _start_holder(src, dst, tmp_path)
    os.kill(first.pid, signal.SIGKILL)
    first.wait(30)
    assert json.loads((dst / LOCK_NAME).read_text())["pid"] == first.pid  # left behind, but not held
    r = _cli("pack", str(src), str(dst), "--samples-per-shard", "3")
    assert r.returncode == 0, r.stderr
    assert "taking over the lock of a pack that is no longer running" in r.stderr and str(first.pid) in r.stderr
    assert not (dst / LOCK_NAME).exists()
    assert tree_digest(dst) == tree_digest(clean)


def test_a_failed_plan_leaves_no_folder_and_no_lock(src: Path, tmp_path: Path) -> None:
    with pytest.raises(DestinationError, match="inside the source"):
        fastfeed.pack(src, src / "inside")
    assert not (src / "inside").exists()
    busy = tmp_path / "busy"
    with hold_destination(busy):
        with pytest.raises(DestinationBusyError, match=f"pid {os.getpid()} on "):
            with hold_destination(busy):
                pass
        assert (busy / LOCK_NAME).exists()
    assert not busy.exists()


def test_a_complete_read_only_dst_is_still_reported_complete(src: Path, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A dataset shared read-only: no lock can be made there, and none is needed (nothing writes)."""
    dst = tmp_path / "ds"
    fastfeed.pack(src, dst, samples_per_shard=3, workers=1)
    real_open = os.open

    def read_only(path: Any, *args: Any, **kwargs: Any) -> int:
        if str(path).endswith(LOCK_NAME):  # what the kernel answers in a folder mode 555 (root aside)
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", read_only)
    assert fastfeed.pack(src, dst, samples_per_shard=3, workers=1).num_samples > 0
    assert not (dst / LOCK_NAME).exists()
