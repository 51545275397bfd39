"""Shared-memory batch buffers that DataLoader workers reuse once the main process lets go.

A worker hands each batch to the main process in shared memory. A fresh buffer for a
256 x 224 x 224 x 3 uint8 batch (38.5 MB) costs its writer one page fault per 4 KiB page,
each zeroed by the kernel: ~50 ms per batch on the 2-core VM where this was measured,
against ~6 ms to fill a buffer that is already mapped (``benchmarks/RESULTS.md``). That is
~0.2 ms per image, 10-15% of a fast JPEG pipeline.

The pool lets a worker refill a buffer it sent earlier, but only once the main process no
longer references that batch:

- ``flags`` is one byte per (worker, slot) in shared memory, made by the main process: 1
  while the main process may hold the slot's batch.
- In a worker, :meth:`BufferPool.take` returns the first of its own slots whose flag is 0
  (and whose buffer is large enough) and sets the flag; with none free it returns a fresh
  buffer outside the pool, as without a pool.
- In the main process, :meth:`BufferPool.received` keeps a weak reference to the storage
  of each batch that arrives; :meth:`BufferPool.sweep` clears the flag once the batch is
  gone (the user dropped it, or ``pin_memory`` copied it). A batch the user keeps, or a
  view of it, keeps its slot taken.
- :meth:`BufferPool.reclaim`, before a pass starts its workers, frees the slots of
  batches that were made but never handed out (a pass left early): persistent workers
  discard those when the next pass begins.

The loader uses a pool only with persistent workers (one process per worker id for the
loader's life). Caveat: a batch passed on, without copying, to a third process is not
tracked once the main process drops it; pass ``reuse_buffers=False`` to
:func:`fastfeed.loader` for that.

Example:
    >>> pool = BufferPool(num_workers=2, slots=3)
    >>> pool.num_slots, pool.reused, pool.fresh
    (6, 0, 0)
"""

from __future__ import annotations

from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef

__all__ = ["BUFFER_KEY", "BufferPool", "activate", "active"]

BUFFER_KEY = "__buffer__"  # batch key: the pool slots its tensors live in (popped by the loader)

_ACTIVE: tuple[BufferPool, int] | None = None  # (pool, worker id) in a worker process


def _fresh(nbytes: int) -> torch.UntypedStorage:
    return torch.UntypedStorage._new_shared(max(1, nbytes))


class BufferPool:
    """``slots`` reusable shared-memory buffers per worker (see the module docstring).

    Args:
        num_workers: DataLoader workers.
        slots: buffers per worker (``prefetch_factor + 1`` covers a worker's batches in
            flight plus the one the training step holds).
    """

    def __init__(self, num_workers: int, slots: int) -> None:
        self.num_workers, self.slots = int(num_workers), int(slots)
        self.flags = torch.zeros(max(1, self.num_workers * self.slots), dtype=torch.uint8).share_memory_()
        self._buffers: dict[int, torch.UntypedStorage] = {}  # worker side: slot -> storage
        self._claims: list[int] = []  # worker side: slots taken for the batch being made
        self._held: dict[int, StorageWeakRef] = {}  # main side: slot -> weak reference to the batch
        # per worker: buffers refilled, buffers made fresh (shared, so the main process sees them)
        self.counts = torch.zeros((max(1, self.num_workers), 2), dtype=torch.int64).share_memory_()

    @property
    def reused(self) -> int:
        """Batches written into a buffer sent before, over all workers."""
        return int(self.counts[:, 0].sum())

    @property
    def fresh(self) -> int:
        """Batches that needed a new buffer, over all workers."""
        return int(self.counts[:, 1].sum())

    @property
    def num_slots(self) -> int:
        return self.num_workers * self.slots

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_buffers"], state["_held"], state["_claims"] = {}, {}, []
        return state

    # ------------------------------------------------------------------ worker side
    def take(self, worker: int, nbytes: int) -> torch.UntypedStorage:
        """A shared-memory storage of at least ``nbytes``; its slot goes to :meth:`claims`."""
        flags = self.flags.numpy()
        base = worker * self.slots
        for k in range(base, base + self.slots):
            if flags[k]:
                continue
            buf = self._buffers.get(k)
            if buf is None or buf.nbytes() < nbytes:
                buf = self._buffers[k] = _fresh(nbytes)
                self.counts[worker, 1] += 1
            else:
                self.counts[worker, 0] += 1
            flags[k] = 1
            self._claims.append(k)
            return buf
        self.counts[worker, 1] += 1
        return _fresh(nbytes)

    def claims(self) -> list[int]:
        """The slots taken since the last call (a worker puts them in its batch)."""
        out, self._claims = self._claims, []
        return out

    # ------------------------------------------------------------------ main side
    def received(self, slots: list[int], tensor: Any) -> None:
        """The main process got a batch made in ``slots``; ``tensor`` is its image tensor."""
        for k in slots:
            if not 0 <= k < self.num_slots:
                continue
            if isinstance(tensor, torch.Tensor) and tensor.is_shared():
                self._held[k] = StorageWeakRef(tensor.untyped_storage())
            else:  # pinned (a copy was made) or replaced: the shared buffer is no longer used
                self._release(k)

    def sweep(self) -> None:
        """Free the slots whose batches the main process no longer references."""
        for k in [k for k, ref in self._held.items() if ref.expired()]:
            self._release(k)

    def reclaim(self) -> None:
        """Free every slot not held by a delivered batch (call before a pass starts)."""
        self.sweep()
        flags = self.flags.numpy()
        for k in range(self.num_slots):
            if flags[k] and k not in self._held:
                flags[k] = 0

    def _release(self, k: int) -> None:
        self._held.pop(k, None)
        self.flags[k] = 0


def activate(pool: BufferPool | None, worker: int) -> None:
    """Make ``pool`` the one :func:`fastfeed.decode.collate.batch_buffer` takes from in this process."""
    global _ACTIVE
    _ACTIVE = None if pool is None else (pool, worker)


def active() -> tuple[BufferPool, int] | None:
    """The pool and worker id of this process, if a loader activated one."""
    return _ACTIVE
