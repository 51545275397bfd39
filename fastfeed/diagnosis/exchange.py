"""The step monitor's one collective: each window's small vector, all-gathered, never blocking a step.

Every ``every`` steps each rank packs its window (a short header and five figures per step,
:func:`pack`) into one float64 vector of fixed length, and :class:`Exchange` all-gathers it
**asynchronously** over a gloo group of the monitor's own: the step goes on at once, the
gathered window is picked up by :meth:`Exchange.poll` at a later step, when it has arrived.
The group is the monitor's alone (``dist.new_group(backend="gloo")``, CPU tensors), so a
collective of the monitor can never pair with one of training (whatever its backend), and
it takes nothing from the GPU.

Every wait is bounded by ``timeout``: creating the group (all ranks must construct their
monitor), each window's gather (a rank that stopped calling the monitor), and the report's
last gather. Past it the exchange is marked failed, says why (:attr:`Exchange.failed`), and
the monitor reports what it gathered before, or this rank alone.

Example:
    >>> import numpy as np
    >>> vec = pack({"window": 0, "first_step": 0, "steps": 2}, np.ones((2, 5)), every=4)
    >>> len(vec) == len(HEADER) + 4 * 5
    True
    >>> headers, cube = unpack(np.stack([vec, vec]), every=4)
    >>> headers[1]["steps"], cube.shape
    (2.0, (2, 2, 5))
"""

from __future__ import annotations

import datetime
import logging
import time
from collections import deque
from typing import Any, Mapping

import numpy as np

from fastfeed.diagnosis.attribution import COLUMNS

__all__ = ["HEADER", "Exchange", "LocalExchange", "pack", "unpack"]

log = logging.getLogger("fastfeed.monitor")

#: The header of a window's vector (then ``every`` x :data:`~fastfeed.diagnosis.attribution.COLUMNS`).
HEADER = ("window", "first_step", "steps", "samples", "startup_s", "coll_bytes", "coll_steps",
          "memory_available", "read_s", "decode_s", "cpu_s", "load_batches", "load_step_s", "watched")


def pack(header: Mapping[str, float], steps: np.ndarray, every: int) -> np.ndarray:
    """One window as a vector: :data:`HEADER` (missing: NaN), then ``every`` rows of steps (NaN padded)."""
    vec = np.full(len(HEADER) + every * len(COLUMNS), np.nan)
    for i, name in enumerate(HEADER):
        if name in header and header[name] is not None:
            vec[i] = float(header[name])
    n = min(every, len(steps))
    vec[len(HEADER):len(HEADER) + n * len(COLUMNS)] = np.asarray(steps[:n], dtype=np.float64).ravel()
    return vec


def unpack(matrix: np.ndarray, every: int) -> tuple[list[dict[str, float]], np.ndarray]:
    """The ranks' headers and their steps (ranks x steps x columns) from the gathered vectors."""
    matrix = np.asarray(matrix, dtype=np.float64)
    headers = [dict(zip(HEADER, row[:len(HEADER)].tolist())) for row in matrix]
    steps = max([int(h["steps"]) for h in headers if h["steps"] == h["steps"]] or [0])
    cube = matrix[:, len(HEADER):].reshape(len(matrix), every, len(COLUMNS))[:, :steps, :]
    return headers, cube


class LocalExchange:
    """One process (or no ``torch.distributed``): each window is "gathered" at once, from this rank."""

    def __init__(self, facts: dict[str, Any], failed: str | None = None) -> None:
        self.facts: list[dict[str, Any]] = [facts]
        self.failed = failed
        self._ready: list[tuple[int, np.ndarray]] = []

    @property
    def world_size(self) -> int:
        return 1

    def post(self, index: int, vec: np.ndarray) -> None:
        self._ready.append((index, vec[None, :]))

    def poll(self) -> list[tuple[int, np.ndarray]]:
        out, self._ready = self._ready, []
        return out

    def drain(self) -> list[tuple[int, np.ndarray]]:
        return self.poll()


class Exchange:
    """The gather of every rank's window vectors over the monitor's own gloo group (see the module docstring).

    Build it with :meth:`open` on every rank at the same point (the monitor's first step).
    """

    def __init__(self, group: Any, rank: int, world_size: int, timeout: float, facts: list[dict[str, Any]]) -> None:
        self._group = group
        self.rank = rank
        self._world = world_size
        self.timeout = timeout
        self.facts = facts
        self.failed: str | None = None
        self._pending: deque[tuple[int, Any, list[Any], float]] = deque()

    @property
    def world_size(self) -> int:
        return self._world

    @classmethod
    def open(cls, rank: int, world_size: int, timeout: float, facts: dict[str, Any]) -> Exchange | LocalExchange:
        """The group and every rank's ``facts`` (host, cores, loader), or a :class:`LocalExchange` saying why not."""
        import torch.distributed as dist

        if not dist.is_gloo_available():
            return LocalExchange(facts, failed="torch.distributed has no gloo backend here, which the monitor's "
                                               "exchange uses: this rank reports on its own steps only")
        t0 = time.perf_counter()
        try:
            group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=timeout))
            everyone: list[Any] = [None] * world_size
            dist.all_gather_object(everyone, facts, group=group)
        except RuntimeError as e:  # DistStoreError / gloo timeouts: a peer never came
            why = (f"rank {rank}: the other ranks did not join the monitor's exchange within {timeout:g} s (waited "
                   f"{time.perf_counter() - t0:.1f} s; does every rank run a StepMonitor, started at the same "
                   f"point?): {str(e).splitlines()[0][:200]}; this rank reports on its own steps only")
            log.warning("%s", why)
            return LocalExchange(facts, failed=why)
        return cls(group, rank, world_size, timeout, everyone)

    def post(self, index: int, vec: np.ndarray) -> None:
        """Start gathering window ``index`` (returns at once)."""
        if self.failed is not None:
            return
        import torch
        import torch.distributed as dist

        mine = torch.from_numpy(np.ascontiguousarray(vec, dtype=np.float64))
        outs = [torch.empty_like(mine) for _ in range(self._world)]
        try:
            work = dist.all_gather(outs, mine, group=self._group, async_op=True)
        except RuntimeError as e:
            self._fail(index, e)
            return
        self._pending.append((index, work, outs, time.perf_counter()))

    def _fail(self, index: int, e: BaseException) -> None:
        self.failed = (f"rank {self.rank}: the gather of window {index} failed ({str(e).splitlines()[0][:200]}): a "
                       f"rank stopped calling the monitor (it ran fewer steps, or did not call report()), or fell "
                       f"more than {self.timeout:g} s behind; the report covers the windows gathered before")
        log.warning("%s", self.failed)
        self._pending.clear()

    def poll(self) -> list[tuple[int, np.ndarray]]:
        """The windows gathered so far, in order (never waits)."""
        out = []
        while self._pending and self._pending[0][1].is_completed():
            index, work, outs, _ = self._pending.popleft()
            try:
                work.wait()
            except RuntimeError as e:
                self._fail(index, e)
                break
            out.append((index, np.stack([t.numpy() for t in outs])))
        return out

    def drain(self) -> list[tuple[int, np.ndarray]]:
        """Wait for every posted window (at most ``timeout`` past the last one's start)."""
        out = self.poll()
        while self._pending:
            started = self._pending[-1][3]
            if time.perf_counter() - started > self.timeout + 5:
                self._fail(self._pending[0][0], TimeoutError(f"no answer within {self.timeout:g} s"))
                break
            time.sleep(0.002)
            out += self.poll()
        return out
