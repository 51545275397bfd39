"""The shard cache's wait for another process's download is bounded by that download's progress.

A real second process takes the entry's lock and starts the download, then is stopped
(SIGSTOP) halfway; a process that needs the same entry waits while the ``.part`` file
grows, and once it has not grown for ``wait`` seconds says who holds the lock and
downloads the entry itself.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import signal
import time
from pathlib import Path

import pytest

from fastfeed.storage.cache import ShardCache


def _stops_halfway(root: str) -> None:
    def produce(f: object) -> None:
        f.write(b"x" * 1000)  # type: ignore[attr-defined]
        f.flush()  # type: ignore[attr-defined]
        os.kill(os.getpid(), signal.SIGSTOP)  # stopped with the lock held
        f.write(b"y" * 1000)  # type: ignore[attr-defined]

    ShardCache(root, "1MB").get("entry.tar", produce)


def test_a_stopped_downloader_is_waited_for_within_the_bound(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    root = tmp_path / "cache"
    cache = ShardCache(root, "1MB")
    child = mp.get_context("spawn").Process(target=_stops_halfway, args=(str(root),), daemon=True)
    child.start()
    try:
        deadline = time.monotonic() + 30
        while not any((root / ".tmp").glob("entry.tar.*.part")) and time.monotonic() < deadline:
            time.sleep(0.02)
        t0 = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="fastfeed.storage.cache"):
            path = cache.get("entry.tar", lambda f: f.write(b"z" * 10), wait=0.5)
        assert time.monotonic() - t0 < 0.5 + 2
        assert Path(path).read_bytes() == b"z" * 10
        said = " ".join(r.getMessage() for r in caplog.records)
        assert "waited 0.5 s for another process's download of entry.tar that made no progress" in said
        assert f"pid {child.pid} since" in said and "downloading it here too" in said
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.join(5)
