"""What ``fastfeed verify`` adds to the read path's checks: every problem reported, none fatal.

The loader stops at the first sidecar that does not match its hash and checks the samples it
reads; ``verify`` wants every problem of a dataset at once, and must survive what it finds:

- :func:`verify_sidecars` loads each sidecar on its own and reports every way it is wrong
  (missing, not a plain ``.npy``, a sha256 other than ``index.json``'s, a float or object
  array, labels outside the classes, offsets out of order), keeping what is still usable;
- :func:`sample_problems` checks every sample of a shard against ``checksums.npy``, as the
  loader does when it reads them (:mod:`fastfeed.formats.checksum`), naming each damaged one;
- :func:`run_isolated` checks shards in worker processes and, when one dies (a signal, the
  out-of-memory killer), names the shard whose check killed it instead of failing with
  ``BrokenProcessPool``.

Example:
    >>> arrays, problems = verify_sidecars(DatasetIndex.load("/data/in-ff"))   # doctest: +SKIP
    >>> sorted(arrays), problems                                               # doctest: +SKIP
    (['checksums.npy', 'labels.npy', 'offsets.npy'], [])
"""

from __future__ import annotations

import os
import signal
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Callable, Sequence, TypeVar

import numpy as np

from fastfeed.errors import FastfeedError, IndexMismatchError, SampleError
from fastfeed.formats.checksum import digest
from fastfeed.formats.lmdb import LmdbShardReader
from fastfeed.formats.tar_reader import parse_sample
from fastfeed.packed.index import DatasetIndex, join
from fastfeed.packed.layout import INDEX_NAME
from fastfeed.packed.sidecars import check_content, check_form, check_hash, load_npy

__all__ = ["run_isolated", "sample_problems", "verify_sidecars"]

_T = TypeVar("_T")
_R = TypeVar("_R")


def verify_sidecars(idx: DatasetIndex) -> tuple[dict[str, np.ndarray], list[str]]:
    """Every sidecar of a packed dataset's index that is usable, and every problem found in them.

    A sidecar whose hash or rows are wrong is reported and still returned (the shards are then
    checked against what it says, and disagree where it is wrong); one that cannot be read, or
    has the wrong dtype or shape, is reported and left out.
    """
    arrays: dict[str, np.ndarray] = {}
    problems: list[str] = []
    layout = idx.layout
    recorded = dict((idx.checksums or {}).get("sidecars") or {})
    for name in idx.to_json()["arrays"]:
        where = join(idx.root, name)
        try:
            arr, sha = load_npy(where, mmap=True)
        except FileNotFoundError:
            problems.append(f"{where}: sidecar of {join(idx.root, INDEX_NAME)} is missing; re-run `fastfeed pack` "
                            "to rebuild the dataset")
            continue
        except IndexMismatchError as e:
            problems.append(str(e))
            continue
        if idx.checksums is not None:
            try:
                check_hash(where, sha, recorded.get(name), INDEX_NAME)
            except IndexMismatchError as e:
                problems.append(str(e))  # still read: where its rows are wrong, the shards disagree with them
        try:
            check_form(where, arr, layout)
        except IndexMismatchError as e:
            problems.append(str(e))
            continue  # a float or object array, the wrong shape: nothing to check the shards against
        try:
            check_content(where, arr, layout)
        except (IndexMismatchError, SampleError) as e:
            problems.append(str(e))
        arrays[name] = arr
    return arrays, problems


def sample_problems(path: str, fmt: str, offsets: np.ndarray, sums: np.ndarray, algorithm: str,
                    keys: Sequence[str], problem: Callable[[str], None]) -> None:
    """Check every sample of one shard against its checksum; ``problem`` gets one line per damaged one.

    ``offsets`` and ``sums`` are the shard's rows of ``offsets.npy`` and ``checksums.npy``;
    ``keys`` the keys read from the shard, in order (for the messages).
    """
    try:
        fn = digest(algorithm)
    except FastfeedError as e:
        problem(f"samples not checked against checksums.npy: {e}")
        return

    def key(i: int, data: Any) -> str:
        if i < len(keys):
            return keys[i]
        try:
            sample = parse_sample(data) if fmt == "tar" else None
        except FastfeedError:
            sample = None
        return str(sample["__key__"]) if sample else ""

    def check(i: int, data: Any, where: str) -> None:
        got, want = fn(data), int(sums[i])
        if got != want:
            name = key(i, data)
            what = f"sample {name!r}" if name else f"sample {i}"
            problem(f"{what} at {where}: its bytes' {algorithm} checksum is {got:016x}, checksums.npy says "
                    f"{want:016x}; the sample was damaged after packing: restore the shard or re-pack")

    if fmt == "lmdb":
        reader = LmdbShardReader(path)
        try:
            for n, value in reader.records():
                if n < len(sums):
                    check(n, value, f"record {n}")
        finally:
            reader.close()
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        for i, (off, size) in enumerate(offsets.tolist()):
            data = os.pread(fd, size, off)
            if len(data) < size:
                problem(f"sample {i} at offset {off}: the shard ends before its {size} bytes; restore it or re-pack")
                break
            check(i, data, f"offset {off}")
    finally:
        os.close(fd)


def run_isolated(fn: Callable[[_T], _R], jobs: Sequence[_T], workers: int, died: Callable[[int, str], _R],
                 progress: Callable[[int], None] | None = None) -> list[_R]:
    """``[fn(job) for job in jobs]`` in ``workers`` processes, in order; a job whose process dies
    gives ``died(i, why)`` instead (``why``: ``killed by SIGBUS``, ``exit code 1``, ...).

    When a process of the pool dies, every job still in flight fails with it; those are run
    again one at a time, each in a process of its own, so the one that kills its process is
    named and the others are checked.
    """
    import multiprocessing as mp

    ctx = mp.get_context("forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn")
    out: list[Any] = [None] * len(jobs)
    again: list[int] = []
    with ProcessPoolExecutor(min(workers, len(jobs)), mp_context=ctx) as ex:
        futures: list[Future[_R]] = [ex.submit(fn, job) for job in jobs]
        for i, f in enumerate(futures):
            try:
                out[i] = f.result()
            except BrokenProcessPool:
                again.append(i)
                continue
            if progress is not None:
                progress(i)
    for i in again:
        out[i] = _alone(ctx, fn, jobs[i], lambda why, i=i: died(i, why))
        if progress is not None:
            progress(i)
    return out


def _alone(ctx: Any, fn: Callable[[_T], _R], job: _T, died: Callable[[str], _R]) -> _R:
    """``fn(job)`` in a process of its own; ``died(why)`` when that process dies before it answers."""
    recv, send = ctx.Pipe(duplex=False)
    p = ctx.Process(target=_child, args=(fn, job, send), daemon=True)
    p.start()
    send.close()
    try:
        ok, value = recv.recv()
    except EOFError:  # it died without a word
        p.join()
        return died(_why(p.exitcode))
    finally:
        recv.close()
    p.join()
    if not ok:
        raise value
    return value


def _child(fn: Callable[[Any], Any], job: Any, conn: Any) -> None:
    try:
        result = (True, fn(job))
    except Exception as e:  # noqa: BLE001 - handed to the parent, which re-raises it
        result = (False, e)
    conn.send(result)
    conn.close()


def _why(code: int | None) -> str:
    """How a process ended, from its exit code: ``killed by SIGBUS``, ``exit code 1``, ``died``.

    Example:
        >>> _why(-7), _why(3), _why(None)
        ('killed by SIGBUS', 'exit code 3', 'died')
    """
    if code is not None and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}" if code else "died"
