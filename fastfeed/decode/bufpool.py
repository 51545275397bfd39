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
- In the main process, a batch that arrives is tracked until nothing references it any
  more (the user dropped it, or ``pin_memory`` copied it); :meth:`BufferPool.sweep` then
  clears its flag. A batch the user keeps, or a view of it, keeps its slot taken.
- :meth:`BufferPool.reclaim`, before a pass starts its workers, frees the slots of
  batches that were made but never handed out (a pass left early): persistent workers
  discard those when the next pass begins.

**By reference** (the default, ``by_reference=True``): the main process maps each slot's
buffer once and keeps it mapped; a batch then crosses the queue as a :class:`Packed`
record (slot, generation, where each tensor lies in the buffer), not as storages. Sending a
storage costs both processes a socket connection, an authentication handshake and the
passing of a file descriptor (torch's ``file_descriptor`` sharing), then an ``mmap``, a
page fault per 4 KiB page as the batch is read, and an ``munmap`` (~1 ms of the training
thread's CPU per batch on the 2-core VM for two storages of a small batch: the figure is in
``benchmarks/RESULTS.md``, train_step's main-process section). :meth:`BufferPool.pack` (in
the worker) also moves the batch's small tensors (labels, ``valid``, ``__source__``) into
the buffer's tail, so a batch in a slot costs no storage at all; :meth:`BufferPool.unpack`
(in the main process) gives back the tensors: views of the mapped buffer for the large ones
(the image batch), and private copies of the small ones, so that a label kept for a metric
never keeps a 38 MB slot taken. A buffer's first batch (and the first after it was
reallocated larger) carries the storage itself; the main process acknowledges each
mapping in ``acks``, and a worker sends the storage until it is acknowledged (a batch that
was discarded, in a pass left early, carried it for nothing).

**Pinned by registration** (``pin=True``; the loader sets it where CUDA is available and
``pin_memory`` is on only while :data:`REGISTER` is True, which it is not now: see there): each mapped buffer is registered with CUDA once
(``cudaHostRegister``), so the views handed out are pinned memory as they are: no pinned
copy per batch, and ``.to("cuda", non_blocking=True)`` is a real asynchronous DMA. A slot
whose batch was dropped is then released only once a CUDA event recorded on the current
stream after the drop has completed (a copy enqueued from it, on that stream, is done):
copy batches on a side stream only after ``current_stream().wait_stream(side)``, or pass
``reuse_buffers=False``. A failed registration falls back to a pinned copy of that slot's
batches (logged once).

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

import logging
import os
from typing import Any, NamedTuple

import numpy as np
import torch
from torch.multiprocessing.reductions import StorageWeakRef

__all__ = ["BUFFER_KEY", "BY_REFERENCE", "IN_SLOT", "REGISTER", "TAIL_BYTES", "BufferPool", "Packed", "activate",
           "active"]

log = logging.getLogger(__name__)

BUFFER_KEY = "__buffer__"  # batch key: the pool slots its tensors live in (popped by the loader)
#: Pools the loader makes send batches by reference (False: as storages, the way before; a
#: benchmark's before/after switch, read when a pool is made).
BY_REFERENCE = True
#: Pinned pools register their buffers with CUDA (pinned views, no copy). Off: on one NVIDIA H200
#: (CUDA 13, torch 2.11) ``cudaHostRegister`` refused every shared-memory batch buffer, and the
#: refusal left its error for the next CUDA call (the first ``.to("cuda")`` failed with "invalid
#: argument"). While it is off, a loader that pins (CUDA, ``pin_memory``) sends batches as storages,
#: which DataLoader's pin-memory thread copies into pinned memory off the training thread, as before
#: the by-reference pools; pools by reference serve loaders that do not pin.
REGISTER = False
#: Bytes after each pooled buffer's first use kept for the batch's small tensors.
TAIL_BYTES = 64 << 10
_ALIGN = 64
_SMALL_DTYPES = frozenset({torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
                           torch.float16, torch.bfloat16, torch.float32, torch.float64})

_ACTIVE: tuple[BufferPool, int] | None = None  # (pool, worker id) in a worker process


class _InSlot:
    """The value a packed tensor leaves in its batch until the main process puts it back."""

    def __reduce__(self) -> str:
        return "IN_SLOT"  # pickled by reference: the one instance

    def __repr__(self) -> str:
        return "IN_SLOT"


#: Placeholder of a tensor that crosses the queue inside a pool slot (see :class:`Packed`).
IN_SLOT = _InSlot()


class Packed(NamedTuple):
    """A batch's tensors in one pool slot, as a worker sends them (see the module docstring).

    Attributes:
        slot: the slot (``worker * slots + k``).
        gen: the generation of the slot's buffer (bumped when a worker reallocates it).
        storage: the buffer itself, until the main process has acknowledged mapping it; else None.
        used: bytes of the buffer the batch uses.
        views: ``(key, byte offset, byte extent, dtype, shape, stride, copy)`` per tensor;
            ``copy``: a small tensor the main process copies out.
    """

    slot: int
    gen: int
    storage: torch.UntypedStorage | None
    used: int
    views: tuple[tuple[str, int, int, torch.dtype, tuple[int, ...], tuple[int, ...], bool], ...]


class _AllOf:
    """Expired when every one of a batch's references has (a slot holding several of its tensors)."""

    def __init__(self, refs: list[StorageWeakRef]) -> None:
        self.refs = refs

    def expired(self) -> bool:
        return all(r.expired() for r in self.refs)


class _Mapping(NamedTuple):
    gen: int
    storage: torch.UntypedStorage
    array: np.ndarray
    registered: bool


def _fresh(nbytes: int) -> torch.UntypedStorage:
    return torch.UntypedStorage._new_shared(max(1, nbytes))


def _up(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def _extent(t: torch.Tensor) -> int:
    """Bytes of storage ``t`` spans from its first element."""
    if t.numel() == 0:
        return 0
    return (1 + sum((s - 1) * st for s, st in zip(t.shape, t.stride()))) * t.element_size()


def _small(t: Any) -> bool:
    return (type(t) is torch.Tensor and t.device.type == "cpu" and t.dtype in _SMALL_DTYPES and not t.requires_grad
            and t.is_contiguous() and not t.is_shared())


class BufferPool:
    """``slots`` reusable shared-memory buffers per worker (see the module docstring).

    Args:
        num_workers: DataLoader workers.
        slots: buffers per worker (``prefetch_factor + 1`` covers a worker's batches in
            flight plus the one the training step holds).
        by_reference: send batches in slots as :class:`Packed` records (False: as storages).
        pin: main process only: register mapped buffers with CUDA (pinned views).
    """

    def __init__(self, num_workers: int, slots: int, *, by_reference: bool = True, pin: bool = False) -> None:
        self.num_workers, self.slots = int(num_workers), int(slots)
        self.by_reference, self.pin = bool(by_reference), bool(pin)
        n = max(1, self.num_workers * self.slots)
        self.flags = torch.zeros(n, dtype=torch.uint8).share_memory_()
        self.gens = torch.zeros(n, dtype=torch.int64).share_memory_()  # written by the slot's worker
        self.acks = torch.zeros(n, dtype=torch.int64).share_memory_()  # the generation the main process mapped
        # per worker: buffers refilled, buffers made fresh (shared, so the main process sees them)
        self.counts = torch.zeros((max(1, self.num_workers), 2), dtype=torch.int64).share_memory_()
        self._reset_local()

    def _reset_local(self) -> None:
        """The state each process keeps for itself (pickled empty)."""
        self._np: dict[str, np.ndarray] = {}  # numpy views of the shared tensors
        self._buffers: dict[int, torch.UntypedStorage] = {}  # worker side: slot -> storage
        self._flat: dict[int, torch.Tensor] = {}  # worker side: slot -> uint8 tensor over it
        self._claims: list[int] = []  # worker side: slots taken for the batch being made
        self._held: dict[int, Any] = {}  # main side: slot -> weak reference with .expired()
        self._mapped: dict[int, _Mapping] = {}  # main side: slot -> its buffer, mapped once
        self._draining: dict[int, Any] = {}  # main side, pinned: slot -> CUDA event after its drop
        self._warned = False
        self._pid = os.getpid()  # a forked worker inherits the main side's mappings: never its to close

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        fresh = BufferPool.__new__(BufferPool)
        fresh._reset_local()
        state.update(fresh.__dict__)
        return state

    def _view(self, name: str) -> np.ndarray:
        arr = self._np.get(name)
        if arr is None:
            arr = self._np[name] = getattr(self, name).numpy()
        return arr

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

    # ------------------------------------------------------------------ worker side
    def take(self, worker: int, nbytes: int) -> torch.UntypedStorage:
        """A shared-memory storage of at least ``nbytes``; its slot goes to :meth:`claims`."""
        flags, counts = self._view("flags"), self._view("counts")
        base = worker * self.slots
        for k in range(base, base + self.slots):
            if flags[k]:
                continue
            buf = self._buffers.get(k)
            if buf is None or buf.nbytes() < nbytes + TAIL_BYTES:
                buf = self._buffers[k] = _fresh(_up(nbytes) + TAIL_BYTES)
                self._flat.pop(k, None)
                self._view("gens")[k] += 1  # shared: a worker started anew never reuses a generation
                counts[worker, 1] += 1
            else:
                counts[worker, 0] += 1
            flags[k] = 1
            self._claims.append(k)
            return buf
        counts[worker, 1] += 1
        return _fresh(nbytes)

    def claims(self) -> list[int]:
        """The slots taken since the last call (a worker puts them in its batch)."""
        out, self._claims = self._claims, []
        return out

    def pack(self, batch: dict[str, Any]) -> dict[str, Any]:
        """In a worker: the batch as it crosses the queue (under :data:`BUFFER_KEY`, its slots).

        By reference, each tensor that lives in a slot taken for this batch becomes
        :data:`IN_SLOT` and a :class:`Packed` record says where it is; small tensors are copied
        into the first slot's tail (at most :data:`TAIL_BYTES`). Otherwise the slots' ids.

        Example:
            >>> BufferPool(1, 2).pack({"x": 1})    # no slot taken: unchanged
            {'x': 1}
        """
        claims = self.claims()
        if not claims:
            return batch
        out = dict(batch)
        if not self.by_reference:
            out[BUFFER_KEY] = claims
            return out
        packed, tail_done = [], False
        gens, acks = self._view("gens"), self._view("acks")
        for k in claims:
            buf = self._buffers[k]
            ptr, views, end = buf.data_ptr(), [], 0
            for key, t in batch.items():
                if type(t) is torch.Tensor and t.device.type == "cpu" and t.untyped_storage().data_ptr() == ptr:
                    off, ext = t.storage_offset() * t.element_size(), _extent(t)
                    views.append((key, off, ext, t.dtype, tuple(t.shape), tuple(t.stride()), False))
                    out[key] = IN_SLOT
                    end = max(end, off + ext)
            if views and not tail_done:
                tail_done = True
                end = self._tail(k, buf, batch, out, views, _up(end))
            gen = int(gens[k])
            packed.append(Packed(k, gen, buf if int(acks[k]) != gen else None, end, tuple(views)))
        out[BUFFER_KEY] = packed
        return out

    def _tail(self, k: int, buf: torch.UntypedStorage, batch: dict[str, Any], out: dict[str, Any],
              views: list[Any], at: int) -> int:
        """Copy the batch's small tensors into slot ``k`` from byte ``at``; the end used."""
        flat = self._flat.get(k)
        if flat is None:
            flat = self._flat[k] = torch.empty(0, dtype=torch.uint8).set_(buf)
        room = buf.nbytes()
        for key, t in batch.items():
            if out[key] is IN_SLOT or not _small(t) or at + t.nbytes > room:
                continue
            if t.nbytes:
                flat[at:at + t.nbytes].view(t.dtype).view(t.shape).copy_(t)
            views.append((key, at, t.nbytes, t.dtype, tuple(t.shape), tuple(t.stride()), True))
            out[key] = IN_SLOT
            at = _up(at + t.nbytes)
        return at

    # ------------------------------------------------------------------ main side
    def unpack(self, batch: dict[str, Any]) -> None:
        """In the main process: put the batch's tensors back (in place) and track its slots.

        Also sweeps: slots whose earlier batches are gone are freed here, once per batch.
        """
        entry = batch.pop(BUFFER_KEY, None)
        self.sweep()
        if not entry:
            return
        if not isinstance(entry[0], Packed):
            self.received(entry, batch.get("image"))
            return
        for p in entry:
            self._rebuild(p, batch)

    def _rebuild(self, p: Packed, batch: dict[str, Any]) -> None:
        k = p.slot
        if p.storage is not None:
            self._map(k, p.gen, p.storage)
        m = self._mapped.get(k)
        if m is None or m.gen != p.gen:  # an acknowledged buffer always comes before its references
            raise RuntimeError(f"fastfeed buffer pool: slot {k} (generation {p.gen}) arrived without its buffer "
                               f"(mapped: {None if m is None else m.gen}); this is a fastfeed bug: please report it, "
                               "and pass workers=fastfeed.Workers(reuse_buffers=False) meanwhile")
        held: list[StorageWeakRef] = []
        for key, off, ext, dtype, shape, stride, copy in p.views:
            t = _view(m.array, off, ext, dtype, shape, stride, copy and not self.pin)
            if copy and self.pin:
                t = self._pinned(t)
            elif not copy:
                if self.pin and not m.registered:
                    t = self._pinned(t)
                else:  # a storage of its own over the slot's memory: its views (and only they) hold it
                    held.append(StorageWeakRef(t.untyped_storage()))
            batch[key] = t
        if held:
            self._held[k] = held[0] if len(held) == 1 else _AllOf(held)
        else:
            self._release(k)

    @staticmethod
    def _pinned(t: torch.Tensor) -> torch.Tensor:
        out = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, pin_memory=True)
        return out.copy_(t)

    def _map(self, k: int, gen: int, storage: torch.UntypedStorage) -> None:
        old = self._mapped.get(k)
        if old is not None and old.gen == gen:
            return
        if old is not None:
            self._unregister(old)
        arr = torch.empty(0, dtype=torch.uint8).set_(storage).numpy()
        self._mapped[k] = _Mapping(gen, storage, arr, self.pin and REGISTER and self._register(storage))
        self._view("acks")[k] = gen

    def _register(self, storage: torch.UntypedStorage) -> bool:
        """``cudaHostRegister`` the buffer (once per mapping); False, logged once, when CUDA refuses."""
        try:
            cudart = torch.cuda.cudart()
            rc = cudart.cudaHostRegister(storage.data_ptr(), storage.nbytes(), 0)
            ok = _code(rc) == 0
            if not ok and hasattr(cudart, "cudaGetLastError"):
                cudart.cudaGetLastError()  # a refusal stays CUDA's last error, which the next CUDA call would raise
        except (RuntimeError, AttributeError, TypeError) as e:
            ok, rc = False, e
        if not ok and not self._warned:
            self._warned = True
            log.warning("fastfeed buffer pool: cudaHostRegister of a %d-byte batch buffer failed (%s); its batches "
                        "are copied into pinned memory instead", storage.nbytes(), rc)
        return ok

    def _unregister(self, m: _Mapping) -> None:
        if not m.registered:
            return
        try:
            torch.cuda.cudart().cudaHostUnregister(m.storage.data_ptr())
        except (RuntimeError, AttributeError, TypeError):  # CUDA torn down at exit: the driver frees it
            pass

    def received(self, slots: list[int], tensor: Any) -> None:
        """The main process got a batch made in ``slots`` as storages; ``tensor`` is its image tensor."""
        for k in slots:
            if not 0 <= k < self.num_slots:
                continue
            if isinstance(tensor, torch.Tensor) and tensor.is_shared():
                self._held[k] = StorageWeakRef(tensor.untyped_storage())
            else:  # pinned (a copy was made) or replaced: the shared buffer is no longer used
                self._release(k)

    def sweep(self) -> None:
        """Free the slots whose batches the main process no longer references."""
        gone = [k for k, ref in self._held.items() if ref.expired()]
        for k in gone:
            if self.pin and k in self._mapped and self._mapped[k].registered:
                del self._held[k]
                ev = torch.cuda.Event()
                ev.record()  # after every copy the loop enqueued from this batch on the current stream
                self._draining[k] = ev
            else:
                self._release(k)
        for k in [k for k, ev in self._draining.items() if ev.query()]:
            self._release(k)

    def reclaim(self) -> None:
        """Free every slot not held by a delivered batch (call before a pass starts)."""
        self.sweep()
        flags = self._view("flags")
        for k in range(self.num_slots):
            if flags[k] and k not in self._held and k not in self._draining:
                flags[k] = 0

    def close(self) -> None:
        """Main side: unregister the mapped buffers (after the GPU's work) and let them go."""
        if self._pid != os.getpid():  # a forked copy: the mappings are its parent's
            self._mapped.clear()
            return
        if any(m.registered for m in self._mapped.values()):
            try:
                torch.cuda.synchronize()
            except RuntimeError:
                pass
        for m in self._mapped.values():
            self._unregister(m)
        self._mapped.clear()
        self._draining.clear()

    def __del__(self) -> None:
        try:
            if self.__dict__.get("_mapped") and self.__dict__.get("_pid") == os.getpid():
                self.close()
        except Exception:  # at interpreter exit (modules torn down): the driver frees the registrations
            pass

    def _release(self, k: int) -> None:
        self._held.pop(k, None)
        self._draining.pop(k, None)
        self._view("flags")[k] = 0


#: torch dtypes numpy has: their views are built by numpy (one call, ~1 us), the others by torch (~15 us)
_NUMPY = {torch.bool: np.bool_, torch.uint8: np.uint8, torch.int8: np.int8, torch.int16: np.int16,
          torch.int32: np.int32, torch.int64: np.int64, torch.float16: np.float16, torch.float32: np.float32,
          torch.float64: np.float64}


def _view(mapped: np.ndarray, off: int, ext: int, dtype: torch.dtype, shape: tuple[int, ...],
          stride: tuple[int, ...], copy: bool) -> torch.Tensor:
    """The tensor at byte ``off`` of the mapped buffer, on a storage of its own (``torch.from_numpy``
    of a new array: a view shares it, so it expires with the last of them); with ``copy``, a private
    copy."""
    npd = _NUMPY.get(dtype)
    if npd is not None:
        size = np.dtype(npd).itemsize
        arr = np.ndarray(shape, dtype=npd, buffer=mapped, offset=off, strides=tuple(s * size for s in stride))
        return torch.from_numpy(arr.copy() if copy else arr)
    t = torch.from_numpy(mapped[off:off + ext]).view(dtype).as_strided(shape, stride)
    return t.clone() if copy else t


def _code(rc: Any) -> int:
    """A CUDA runtime return value (an enum of torch's cudart binding) as its number."""
    try:
        return int(rc)
    except TypeError:
        return int(getattr(rc, "value"))


def activate(pool: BufferPool | None, worker: int) -> None:
    """Make ``pool`` the one :func:`fastfeed.decode.collate.batch_buffer` takes from in this process."""
    global _ACTIVE
    _ACTIVE = None if pool is None else (pool, worker)


def active() -> tuple[BufferPool, int] | None:
    """The pool and worker id of this process, if a loader activated one."""
    return _ACTIVE
