"""The loader never waits without a bound or a word: a frozen object store ends in a RemoteError naming
the shard's URL; a stopped worker is named by the stall watchdog (its state, its shard), or raises.

Real faults only: a moto S3 server behind tools/faultproxy.py that holds connections open
without answering, and DataLoader workers stopped with SIGSTOP.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

import fastfeed
from _loader_data import write_dataset
from fastfeed.errors import RemoteError, StallError
from fastfeed.loading.cpu import watchdog
from tools.faultproxy import FaultProxy

WATCHDOG = "fastfeed.loading.cpu.watchdog"
ONE = dict(rank=0, world_size=1, decode=None)


class Records(logging.Handler):
    """The watchdog's log records, and an event set at the first stall report."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []
        self.stalled = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        if "loader stalled" in record.getMessage():
            self.stalled.set()

    def messages(self, text: str = "") -> list[str]:
        return [r.getMessage() for r in self.records if text in r.getMessage()]


@pytest.fixture
def records() -> Iterator[Records]:
    handler = Records()
    logger = logging.getLogger(WATCHDOG)
    logger.addHandler(handler)
    yield handler
    logger.removeHandler(handler)


def _pid_of(dl: Any, worker: int, wait: float = 10.0) -> int:
    """The pid worker ``worker`` published in the watchdog's table (once it has started)."""
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        pid = dl.watchdog.slots.rows()[worker].pid
        if pid > 0:
            return pid
        time.sleep(0.02)
    raise AssertionError(f"worker {worker} never started")


@pytest.fixture
def short_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    """The waits between attempts (1 s, doubling) cut to 50 ms (workers fork with it): the timeouts stay real."""
    from fastfeed.storage import retry

    monkeypatch.setattr(retry, "_sleep", lambda s: time.sleep(min(s, 0.05)))


@pytest.fixture
def stopped() -> Iterator[list[int]]:
    """Pids a test stops; each is continued at the end whatever happens (so it can exit)."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass


# ---------------------------------------------------------------- a stopped worker
def test_a_stopped_worker_is_named_with_its_state_and_the_loop_goes_on_when_it_does(
        tmp_path: Path, records: Records, stopped: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(watchdog, "REPEAT_S", 0.6)  # the warning again while the stall lasts
    write_dataset(tmp_path / "ds", shard_counts=(8, 8, 8, 8))
    dl = fastfeed.loader(str(tmp_path / "ds"), batch_size=2, num_workers=2, shuffle=False, **ONE,
                         workers=fastfeed.Workers(stall_timeout=1, prefetch_factor=1))
    it = iter(dl)
    got = [next(it)]
    pid = _pid_of(dl, 1)
    os.kill(pid, signal.SIGSTOP)
    stopped.append(pid)

    def resume() -> None:  # after two warnings, the worker goes on
        deadline = time.monotonic() + 20
        while len(records.messages("loader stalled")) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(pid, signal.SIGCONT)

    helper = threading.Thread(target=resume, daemon=True)
    helper.start()
    got += list(it)
    helper.join()
    assert len(got) == len(dl) == 16  # every batch, in order, once it went on
    first = records.messages("loader stalled")[0]
    assert re.search(rf"loader stalled: no batch for \d+ s \(epoch 0, batch \d+\); "
                     rf"worker 1 \(pid {pid}\) is stopped \(state T: SIGSTOP or a debugger; "
                     rf"kill -CONT {pid} resumes it\)", first), first
    assert re.search(r"worker 0 \(pid \d+\) is ", first) and "Workers(on_stall='raise')" in first
    assert records.messages("(still)") and len(records.messages("loader stall over")) == 1
    print("\nthe watchdog's line:", first)


@pytest.mark.parametrize("sent", [False, True], ids=["stopped-any-time", "stopped-once-it-sent-its-batch"])
def test_on_stall_raise_ends_the_wait_with_a_stall_error_naming_the_worker(
        tmp_path: Path, stopped: list[int], sent: bool) -> None:
    """A stopped worker: the DataLoader's timeout ends the wait, or (stopped once it had sent its
    batch) the loop waits inside PyTorch's receive of the batch's shared memory, which asks the
    stopped process and no timeout covers. Either way the watchdog kills the loader's workers (a
    stopped one also blocks PyTorch's shutdown), the loop raises, and the next pass starts anew."""
    write_dataset(tmp_path / "ds", shard_counts=(8, 8, 8, 8))
    dl = fastfeed.loader(str(tmp_path / "ds"), batch_size=2, num_workers=2, shuffle=False, **ONE,
                         workers=fastfeed.Workers(stall_timeout=2, on_stall="raise", prefetch_factor=1))
    it = iter(dl)
    next(it)
    pid = _pid_of(dl, 1)
    if sent:  # worker 1 made batch 1 (the one the loop waits for) and put it in the queue
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            row = dl.watchdog.slots.rows()[1]
            if row.batch == 1 and row.phase == "between batches":
                break
            time.sleep(0.01)
        time.sleep(0.3)
    os.kill(pid, signal.SIGSTOP)
    stopped.append(pid)
    t0 = time.monotonic()
    with pytest.raises(StallError) as e:
        for _ in it:
            pass
    waited = time.monotonic() - t0
    assert waited < 2 + 1 + 4, waited  # the bound (and a second's grace), and the batches worker 0 had made
    err = e.value
    assert isinstance(err, RuntimeError) and (err.worker, err.pid) == (1, pid) and err.state.startswith("stopped")
    assert f"worker 1 (pid {pid}) is stopped (state T" in str(err) and err.waited >= 2
    assert "the loader's workers were killed to end it" in str(err)
    assert watchdog.process_state(pid) in ("Z", "gone")
    assert len(list(dl)) == len(dl) == 16  # the next pass: new workers
    # the traceback holds this frame, and so the loader, in a cycle: freed by the garbage collector,
    # PyTorch would shut the workers down after its queues (5 s a worker); dropped now, at once
    del e, err, it


def test_a_healthy_run_says_nothing_however_long_the_training_step(tmp_path: Path, records: Records) -> None:
    write_dataset(tmp_path / "ds", shard_counts=(4, 4))
    dl = fastfeed.loader(str(tmp_path / "ds"), batch_size=2, num_workers=2, **ONE,
                         workers=fastfeed.Workers(stall_timeout=1.5))
    for i, _ in enumerate(dl):
        if i == 1:
            time.sleep(2.0)  # a long step: the loop was not waiting, so no stall
    assert len(dl) == 4 and records.records == [] and dl.watchdog.stalls == 0
    assert fastfeed.loader(str(tmp_path / "ds"), batch_size=2, num_workers=0, **ONE,
                           workers=fastfeed.Workers(stall_timeout=None)).watchdog is None


def test_what_a_worker_is_doing_in_words() -> None:
    """The verdicts the watchdog gives each state the kernel reports (rows as a worker writes them)."""
    row = watchdog.SlotRow(worker=1, pid=42, phase="reading", since=time.monotonic() - 30, epoch=0, batch=7,
                           dataset=0, shard=3)
    said = {state: watchdog.WorkerState(row, state, "/data/ds/shard-000003.tar").describe(time.monotonic(),
                                                                                         time.time())
            for state in ("T", "D", "S", "R", "gone")}
    assert said["T"].startswith("is stopped (state T: SIGSTOP or a debugger; kill -CONT 42 resumes it), in batch 7")
    assert said["D"].startswith("is in disk wait (state D:") and "dead NFS mount" in said["D"]
    assert re.fullmatch(r"is sleeping in a read \(the storage is slow or not answering\), in batch 7, "
                        r"on /data/ds/shard-000003.tar since \d\d:\d\d:\d\d \(30 s\)", said["S"]), said["S"]
    assert said["gone"] == "is gone (it exited), in batch 7, on /data/ds/shard-000003.tar since " + \
        said["S"].split(" since ")[1]
    with pytest.raises(fastfeed.ConfigError, match=r"Workers.on_stall='panic' must be 'log' or 'raise'"):
        fastfeed.Workers(on_stall="panic")
    with pytest.raises(fastfeed.ConfigError, match=r"Workers.stall_timeout=-1 must be a number of seconds > 0"):
        fastfeed.Workers(stall_timeout=-1)
    assert fastfeed.Workers(stall_timeout="5m").stall_timeout == 300.0


# ---------------------------------------------------------------- a frozen object store
@pytest.fixture
def store(s3_server: Any, s3_bucket: str, tmp_path: Path) -> Iterator[tuple[str, FaultProxy, dict[str, Any]]]:
    """A packed dataset of 12 shards on moto, reached through a fault proxy: (URL, proxy, fsspec options)."""
    write_dataset(tmp_path / "ds", shard_counts=(4,) * 12)
    client = s3_server.client()
    for p in sorted((tmp_path / "ds").iterdir()):
        client.upload_file(str(p), s3_bucket, f"ds/{p.name}")
    host, port = s3_server.endpoint.removeprefix("http://").rsplit(":", 1)
    with FaultProxy((host, int(port))) as proxy:
        so = dict(s3_server.storage_options)
        so["client_kwargs"] = {**so["client_kwargs"], "endpoint_url": proxy.endpoint}
        yield f"s3://{s3_bucket}/ds", proxy, so


@pytest.mark.s3
@pytest.mark.parametrize("num_workers", [0, 2])
def test_the_loader_over_a_store_that_freezes_mid_epoch_raises_a_remote_error_naming_the_shard(
        store: tuple[str, FaultProxy, dict[str, Any]], num_workers: int, records: Records,
        short_backoff: None) -> None:
    url, proxy, so = store
    dl = fastfeed.loader(url, batch_size=4, num_workers=num_workers, shuffle=False, **ONE,
                         storage=fastfeed.Storage(options=so, timeout=0.5, retries=1),
                         workers=fastfeed.Workers(stall_timeout=0.5))
    it = iter(dl)
    next(it)  # the first shard came; then the store stops answering
    proxy.hold()
    t0 = time.monotonic()
    with pytest.raises(RemoteError) as e:
        for _ in it:
            pass
    waited = time.monotonic() - t0
    msg = str(e.value)
    assert re.search(rf"{re.escape(url)}/shard-0000\d\d\.tar: download timed out 2 times", msg), msg
    assert "Storage(timeout=1, retries=3)" in msg
    # each shard read: 2 attempts of 0.5 s (and s3fs's 0.1 s pauses); with workers, up to two reads
    # (one a worker started before the freeze)
    assert waited < (3 if num_workers == 0 else 6), waited
    if num_workers == 0:  # the loop reads itself, and the watchdog says so while it waits
        said = records.messages("loader stalled")
        assert said and re.search(rf"the loop itself \(pid {os.getpid()}, num_workers=0\) is sleeping in a "
                                  rf"read .*, in batch \d+, on {re.escape(url)}/shard-0000\d\d\.tar since", said[0])
