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
from fastfeed.decode.bufpool import BUFFER_KEY, IN_SLOT, BufferPool, Packed

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


# ---------------------------------------------------------------------- by reference: Packed records
def _made(worker: BufferPool, shape: tuple[int, ...], fill: int) -> dict[str, Any]:
    """A batch as a worker makes it: the image in a slot taken from the pool, small tensors beside it."""
    n = int(torch.tensor(shape).prod())
    storage = worker.take(0, n)
    image = torch.empty(0, dtype=torch.uint8).set_(storage)[:n].view(shape).fill_(fill)
    return {"__key__": ["a", "b"], "image": image, "label": torch.tensor([fill, fill + 1]),
            "valid": torch.tensor([True, False])}


def test_by_reference_the_buffer_crosses_once_then_only_its_place() -> None:
    worker, main = _sides(num_workers=1, slots=2)
    sent = worker.pack(_made(worker, (2, 4, 4, 3), 7))
    (p,) = sent[BUFFER_KEY]
    assert isinstance(p, Packed) and p.storage is not None  # the first batch of a buffer carries it
    assert sent["image"] is IN_SLOT and sent["label"] is IN_SLOT and sent["valid"] is IN_SLOT
    got = dict(sent)  # one process: the queue would hand over the same record (and the storage once)
    main.unpack(got)
    assert got["image"].shape == (2, 4, 4, 3) and int(got["image"].sum()) == 7 * 96
    assert got["label"].tolist() == [7, 8] and got["valid"].tolist() == [True, False]
    del got
    gc.collect()
    main.sweep()
    again = worker.pack(_made(worker, (2, 4, 4, 3), 9))  # slot 0 again, acknowledged: no storage this time
    assert again[BUFFER_KEY][0].slot == 0 and again[BUFFER_KEY][0].storage is None and worker.reused == 1
    main.unpack(again)
    assert int(again["image"].sum()) == 9 * 96 and again["label"].tolist() == [9, 10]


def test_a_kept_batch_keeps_its_slot_and_small_tensors_are_private_copies() -> None:
    worker, main = _sides(num_workers=1, slots=2)
    kept = worker.pack(_made(worker, (2, 8), 1))
    main.unpack(kept)
    labels = worker.pack(_made(worker, (2, 8), 2))
    main.unpack(labels)
    label, valid = labels["label"], labels["valid"]
    mapped = main._mapped[1].array
    lo, hi = mapped.ctypes.data, mapped.ctypes.data + mapped.nbytes
    assert not lo <= label.data_ptr() < hi and not lo <= valid.data_ptr() < hi  # copies, not views of the slot
    del labels  # only the label and valid of the second batch are kept: its slot goes
    gc.collect()
    main.sweep()
    assert main.flags.tolist() == [1, 0]  # the first batch, kept whole, keeps slot 0
    third = worker.pack(_made(worker, (2, 8), 3))
    assert third[BUFFER_KEY][0].slot == 1  # slot 1 refilled, slot 0 untouched
    main.unpack(third)
    assert int(kept["image"].sum()) == 16 and label.tolist() == [2, 3] and int(third["image"].sum()) == 48


def test_reclaim_after_a_pass_left_early_by_reference() -> None:
    worker, main = _sides(num_workers=1, slots=3)
    delivered = worker.pack(_made(worker, (4,), 1))
    worker.pack(_made(worker, (4,), 2))  # made, never delivered
    worker.pack(_made(worker, (4,), 3))
    main.unpack(delivered)
    main.reclaim()
    assert main.flags.tolist() == [1, 0, 0]
    del delivered
    gc.collect()
    main.reclaim()
    assert main.flags.tolist() == [0, 0, 0]


def _all_epochs(dl: fastfeed.Loader, epochs: int) -> list[dict[str, Any]]:
    """Every batch of ``epochs``, its tensors cloned (the batch itself dropped at once)."""
    out = []
    for e in range(epochs):
        dl.set_epoch(e)
        out += [{k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in b.items()} for b in dl]
    return out


def test_by_reference_every_field_equals_reuse_buffers_false(data: Path) -> None:
    want = _all_epochs(_loader(data, 4, reuse_buffers=False), 2)
    dl = _loader(data, 4)
    assert dl._pool is not None and dl._pool.by_reference
    got = _all_epochs(dl, 2)
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert a.keys() == b.keys()
        for k in a:
            if isinstance(b[k], torch.Tensor):
                assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k
            else:
                assert a[k] == b[k], k
    assert dl._pool.reused > len(got) // 2


def test_a_batch_kept_by_the_user_keeps_its_slot_and_its_pixels(data: Path) -> None:
    dl = _loader(data, 5)
    dl.set_epoch(0)
    it = iter(dl)
    first = next(it)
    pixels, labels = first["image"].clone(), first["label"]
    held = [k for k, ref in dl._pool._held.items() if not ref.expired()]
    assert len(held) == 1
    rest = [b["label"] for b in it]  # the other batches: only their (private) labels kept
    assert rest and torch.equal(first["image"], pixels) and labels is first["label"]
    assert dl._pool.flags[held[0]] == 1  # still taken: nothing refilled it
    assert not first["label"].is_shared()  # the labels are copies, holding no slot
    del first
    gc.collect()
    dl._pool.sweep()
    assert dl._pool.flags[held[0]] == 0
