"""Batches leave a DataLoader worker in one shared-memory storage, with the same values.

A real worker process: a small IterableDataset whose worker yields ``one_storage`` of varied
tensors, compared with the same tensors made in this process (where nothing is sent and the
batch is left as it is). fastfeed's own loaders: ``tests/loading/test_loader_tokens.py``.
"""

from __future__ import annotations

from typing import Any, Iterator

import torch
from torch.utils.data import DataLoader, IterableDataset

from fastfeed.decode.collate import ONE_STORAGE_MAX_BYTES, one_storage


def _tensors() -> dict[str, Any]:
    base = torch.arange(20, dtype=torch.int64)
    same = torch.ones(3, dtype=torch.int32)
    shared = torch.zeros(4, dtype=torch.uint8).share_memory_()
    return {
        "ids": torch.arange(2 * 7, dtype=torch.int64).view(2, 7),
        "mask": torch.tensor([[True, False, True]]),
        "cu": torch.tensor([0, 3, 9], dtype=torch.int32),
        "half": torch.linspace(0, 1, 5, dtype=torch.bfloat16),
        "f64": torch.full((3, 1), 0.25, dtype=torch.float64),
        "empty": torch.zeros((0, 5), dtype=torch.int16),
        "view": base[5:9],  # a view that does not cover its storage: left as it is
        "same_a": same, "same_b": same,  # one tensor under two keys: the second left as it is
        "grad": torch.ones(2, requires_grad=True),
        "complex": torch.ones(2, dtype=torch.complex64),
        "shared": shared,
        "big": torch.ones(ONE_STORAGE_MAX_BYTES // 4 + 1, dtype=torch.int32),  # its own storage
        "text": ["a", "b"], "n": 3,
    }


class _Batches(IterableDataset):
    def __iter__(self) -> Iterator[dict[str, Any]]:
        b = _tensors()
        b.pop("grad")  # a tensor that needs grad cannot leave a worker: checked in-process below
        yield one_storage(b)


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def test_a_worker_sends_one_storage_with_the_same_values() -> None:
    want = _tensors()
    (got,) = list(DataLoader(_Batches(), batch_size=None, num_workers=1))
    assert list(got) == [k for k in want if k != "grad"]  # keys in their order
    for k, v in got.items():
        if isinstance(v, torch.Tensor):
            assert v.dtype == want[k].dtype and v.shape == want[k].shape and torch.equal(v, want[k]), k
            assert v.is_contiguous()
        else:
            assert v == want[k]
    merged = ["ids", "mask", "cu", "half", "f64", "empty", "same_a"]
    assert len({_storage(got[k]) for k in merged}) == 1
    assert all(_storage(got[k]) != _storage(got["ids"]) for k in ("view", "same_b", "complex", "shared", "big"))


def test_outside_a_worker_the_batch_is_left_as_it_is() -> None:
    b = _tensors()
    assert one_storage(b) is b
