"""fastfeed.decode.bufpool: workers refill shared-memory batches only after the main process let go.

The slot logic runs in one process (both sides); the loader tests run real workers and
compare every pixel with a loader that allocates a fresh buffer per batch.
"""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import pytest
import torch

import fastfeed
from fastfeed.decode.bufpool import BufferPool

from _loader_data import image_fields, write_dataset


def _sides(num_workers: int, slots: int) -> tuple[BufferPool, BufferPool]:
    """(worker side, main side): two pool objects over the same shared flags and counts,
    each with its own buffers and references, as after the pool is sent to a worker."""
    worker = BufferPool(num_workers=num_workers, slots=slots)
    main = BufferPool.__new__(BufferPool)
    main.__dict__.update(worker.__getstate__())  # shares worker.flags and worker.counts
    return worker, main


def _batch(n: int) -> torch.Tensor:
    """The main process's own mapping of a received batch (shared memory)."""
    return torch.zeros(n, dtype=torch.uint8).share_memory_()


def test_a_slot_is_refilled_only_after_the_main_process_dropped_its_batch() -> None:
    worker, main = _sides(num_workers=2, slots=2)
    a, b = worker.take(1, 100), worker.take(1, 100)
    assert worker.claims() == [2, 3] and worker.fresh == 2 and worker.reused == 0
    c = worker.take(1, 100)  # worker 1's two slots are taken: a buffer outside the pool
    assert worker.claims() == [] and main.fresh == 3 and c.nbytes() >= 100
    ta, tb = _batch(100), _batch(100)
    main.received([2], ta)
    main.received([3], tb)
    view = tb[10:20]  # a view of a batch holds it too
    del tb
    main.sweep()
    assert main.flags.tolist() == [0, 0, 1, 1]
    del ta
    gc.collect()
    main.sweep()
    assert main.flags.tolist() == [0, 0, 0, 1]
    d = worker.take(1, 80)  # slot 2 again: the same memory
    assert worker.claims() == [2] and worker.reused == 1 and d.data_ptr() == a.data_ptr()
    e = worker.take(1, 200)  # slot 3 is held by the view: a fresh buffer
    assert worker.claims() == [] and e.nbytes() >= 200 and view.numel() == 10


def test_reclaim_frees_slots_of_batches_never_handed_out_and_keeps_held_ones() -> None:
    worker, main = _sides(num_workers=1, slots=3)
    for _ in range(3):
        worker.take(0, 10)
    assert worker.claims() == [0, 1, 2]
    kept = _batch(10)
    main.received([0], kept)  # slots 1 and 2: made, never delivered (a pass left early)
    main.reclaim()
    assert main.flags.tolist() == [1, 0, 0]


def test_pinned_or_replaced_images_release_the_slot_at_once() -> None:
    worker, main = _sides(num_workers=1, slots=1)
    worker.take(0, 10)
    main.received(worker.claims(), torch.zeros(10, dtype=torch.uint8))  # a private (pinned) copy
    assert main.flags.tolist() == [0]
    worker.take(0, 10)
    main.received(worker.claims(), None)
    assert main.flags.tolist() == [0]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("pooldata")
    write_dataset(root, shard_counts=(23, 23, 23, 18), fields=image_fields)
    return root


def _epochs(dl: fastfeed.Loader, epochs: int, keep: bool) -> list[tuple[list[str], torch.Tensor]]:
    out = []
    for e in range(epochs):
        dl.set_epoch(e)
        for b in dl:
            # keep=True holds every batch itself (a refill would change them); else a copy
            out.append((b["__key__"], b["image"] if keep else b["image"].clone()))
    return out


def _loader(data: Path, seed: int, **workers: Any) -> fastfeed.Loader:
    """Two workers with two batches each in flight, no pinned copies (``workers``: more Workers options)."""
    return fastfeed.loader(data, batch_size=8, image_size=16, num_workers=2, seed=seed,
                           workers=fastfeed.Workers(prefetch_factor=2, pin_memory=False, **workers))


@pytest.mark.parametrize("keep", [False, True])
def test_workers_reuse_buffers_and_every_batch_keeps_its_pixels(data: Path, keep: bool) -> None:
    want = _epochs(_loader(data, 1, reuse_buffers=False), 3, keep=True)
    dl = _loader(data, 1)
    got = _epochs(dl, 3, keep=keep)
    assert [k for k, _ in got] == [k for k, _ in want]
    for (_, a), (_, b) in zip(got, want):
        assert torch.equal(a, b)
    pool = dl._pool
    assert pool is not None and pool.reused + pool.fresh == len(got)
    if keep:
        assert pool.reused == 0  # nothing held by the caller was refilled
    else:
        assert pool.reused >= len(got) // 2  # copies dropped at once: most batches refill


def test_a_pass_left_early_does_not_leak_slots(data: Path) -> None:
    want = _epochs(_loader(data, 2, reuse_buffers=False), 2, keep=True)
    dl = _loader(data, 2)
    for _ in range(3):  # three passes left after two batches
        dl.set_epoch(0)
        for i, _b in enumerate(dl):
            if i == 1:
                break
    got = _epochs(dl, 2, keep=False)
    assert [k for k, _ in got] == [k for k, _ in want]
    assert all(torch.equal(a, b) for (_, a), (_, b) in zip(got, want))
    assert dl._pool is not None and dl._pool.reused > len(got) // 2


def test_no_pool_without_persistent_workers_or_workers(data: Path) -> None:
    assert fastfeed.loader(data, batch_size=8, image_size=16, num_workers=0)._pool is None
    assert fastfeed.loader(data, batch_size=8, image_size=16, num_workers=2,
                           workers=fastfeed.Workers(persistent_workers=False))._pool is None
