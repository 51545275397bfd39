"""The local engine of ``pack``: write every shard of a plan on this machine, in a process pool.

:func:`run_local` runs :func:`~fastfeed.packing.write.write_shard` (or any writer with its
signature, such as :func:`fastfeed.packing.engines.objstore.write_shard_remote`) for every shard.
Writers watch the pack process and end when it is gone, so no straggler keeps writing
into DST after the pack process was killed.

Example:
    >>> results = run_local(plan_pack("train", "train-ff"), workers=4)   # doctest: +SKIP
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import signal
import threading
import time
import warnings
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from typing import Any, Callable

from fastfeed.packing.plan import PackPlan
from fastfeed.packing.write import ShardResult, write_shard

__all__ = ["POOL_MIN_BYTES", "Progress", "run_local"]

#: ``progress(files_done, files_total, bytes_done, bytes_total)``, called from the main process.
Progress = Callable[[int, int, int, int], None]

#: Below this much source data (and without ``max_side``) shards are written in-process.
POOL_MIN_BYTES = 32_000_000
_worker_plan: PackPlan | None = None
_worker_queue: Any = None
_worker_writer: Callable[..., ShardResult] = write_shard


def _watch_parent(pid: int) -> None:
    """End this writer process as soon as the pack process ``pid`` is gone (even after a
    SIGKILL, which nothing can catch), so no straggler keeps writing into DST."""

    def watch() -> None:
        while _alive(pid):
            time.sleep(0.2)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="fastfeed-watch-parent", daemon=True).start()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"  # a zombie is dead too
    except (OSError, IndexError):
        return True


def _init_worker(plan: PackPlan, q: Any, parent: int, writer: Callable[..., ShardResult] = write_shard) -> None:
    global _worker_plan, _worker_queue, _worker_writer
    _watch_parent(parent)
    _worker_plan, _worker_queue, _worker_writer = plan, q, writer


def _worker_progress(files: int, nbytes: int) -> None:
    _worker_queue.put((files, nbytes))


def _worker_write(number: int) -> ShardResult:
    if _worker_plan is None:  # pragma: no cover - initializer always ran
        raise RuntimeError("fastfeed pack worker used without its plan")
    return _worker_writer(_worker_plan, number, progress=_worker_progress)


def _context() -> Any:
    """``fork`` when no other Python thread runs: nothing is started or imported again
    and the plan is inherited instead of pickled to every worker, which saves seconds
    per worker (hundreds of MB of plan for ImageNet; a training script's ``__main__``
    importing torch). Forking while other Python threads may hold locks can deadlock
    the child, so then ``forkserver`` (or ``spawn``). Native threads (numpy's BLAS pool)
    do not count: the writers only run fastfeed's own code, as PyTorch's DataLoader
    workers do when it forks.
    """
    methods = mp.get_all_start_methods()
    if "fork" in methods and threading.active_count() == 1:
        return mp.get_context("fork")
    return mp.get_context("forkserver" if "forkserver" in methods else "spawn")


def run_local(
    plan: PackPlan, workers: int, progress: Progress | None = None, *,
    writer: Callable[..., ShardResult] = write_shard,
) -> list[ShardResult]:
    """Run :func:`write_shard` (or ``writer``, same signature) for every shard of ``plan`` on this machine.

    With ``workers > 1``, shards are written by a pool of processes (see :func:`_context`
    for how they start); otherwise, or for small jobs (under :data:`POOL_MIN_BYTES`
    of source data without ``max_side``, ``jpeg_restarts`` or ``store``), in this process. Returns results in shard order.
    On an error the shards already complete stay on disk for the re-run.
    """
    total_files, total_bytes = plan.total_files, plan.total_bytes
    done = [0, 0]

    def report(files: int, nbytes: int) -> None:
        done[0] += files
        done[1] += nbytes
        if progress is not None:
            progress(done[0], total_files, done[1], total_bytes)

    n = len(plan.shards)
    workers = max(1, min(workers, n))
    cheap = plan.options.max_side is None and not plan.options.jpeg_restarts and plan.options.store == "jpeg"
    if cheap and total_bytes < POOL_MIN_BYTES:
        workers = 1  # starting processes would cost more than it saves
    if workers == 1:
        report(0, 0)
        return [writer(plan, i, progress=report) for i in range(n)]
    ctx = _context()
    q = ctx.Queue()
    results: dict[int, ShardResult] = {}
    with ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init_worker,
                             initargs=(plan, q, os.getpid(), writer)) as ex:
        with warnings.catch_warnings():
            # Python >= 3.12 warns on fork() whenever the OS reports other threads, native
            # ones included (numpy's BLAS pool): see _context for why this fork is safe.
            warnings.filterwarnings("ignore", message=r".*use of fork\(\) may lead to deadlocks",
                                    category=DeprecationWarning)
            pending: dict[Future, int] = {ex.submit(_worker_write, i): i for i in range(n)}
        report(0, 0)  # after the workers started: a progress bar may start a thread
        try:
            while pending:
                finished, _ = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
                _drain(q, report)
                for fut in finished:
                    results[pending.pop(fut)] = fut.result()
        except BaseException:
            for fut in pending:
                fut.cancel()
            raise
        _drain(q, report)
    return [results[i] for i in range(n)]


def _drain(q: Any, report: Callable[[int, int], None]) -> None:
    while True:
        try:
            files, nbytes = q.get_nowait()
        except queue.Empty:
            return
        report(files, nbytes)
