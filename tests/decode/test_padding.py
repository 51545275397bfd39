"""Padded batches of a tokens field or ragged arrays, in a real DataLoader with workers."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fastfeed.decode.collate import Padding, collate
from fastfeed.decode.fields import decode_field
from fastfeed.decode.padding import PadCollate, pad_collate
from fastfeed.errors import ConfigError


def _samples(lengths: list[int]) -> list[dict]:
    return [{"__key__": f"k{i}", "tokens.npy": np.arange(1, n + 1, dtype=np.uint16), "cls": i}
            for i, n in enumerate(lengths)]


def test_pads_to_longest_with_mask() -> None:
    b = PadCollate(pad_id=7)(_samples([3, 1, 4]))
    assert b["input_ids"].dtype == torch.int64 and b["input_ids"].shape == (3, 4)
    assert b["input_ids"].tolist() == [[1, 2, 3, 7], [1, 7, 7, 7], [1, 2, 3, 4]]
    assert b["attention_mask"].tolist() == [[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1]]
    assert b["attention_mask"].dtype == torch.int64 and b["lengths"].tolist() == [3, 1, 4]
    assert b["__key__"] == ["k0", "k1", "k2"] and b["cls"].tolist() == [0, 1, 2]  # other fields: collate
    assert "tokens.npy" not in b
    assert PadCollate()(_samples([2, 1]))["input_ids"].tolist() == [[1, 2], [1, 0]]  # default pad 0


def test_pad_multiple_and_max_length() -> None:
    assert PadCollate(pad_multiple=8)(_samples([3, 9]))["input_ids"].shape == (2, 16)
    assert PadCollate(pad_multiple=8)(_samples([8]))["input_ids"].shape == (1, 8)
    b = PadCollate(pad_multiple=4, max_length=6)(_samples([9, 2]))
    assert b["input_ids"].shape == (2, 6) and b["lengths"].tolist() == [6, 2]
    assert b["input_ids"][0].tolist() == [1, 2, 3, 4, 5, 6]
    b = PadCollate(pad_multiple=4, max_length=16)(_samples([5, 2]))
    assert b["input_ids"].shape == (2, 8)


def test_ragged_feature_arrays_and_json_lists() -> None:
    feats = [{"feats.npy": np.full((n, 3), n, np.float32)} for n in (2, 5)]
    b = PadCollate(field="feats", name="features", mask_name="feature_mask")(feats)
    assert b["features"].dtype == torch.float32 and b["features"].shape == (2, 5, 3)
    assert b["features"][0, 2:].abs().sum() == 0 and b["feature_mask"].sum(1).tolist() == [2, 5]
    lists = [{"ids.json": decode_field("ids.json", b"[5, 6]")}, {"ids.json": [9]}]
    assert pad_collate(lists, field="ids", pad_id=-1)["input_ids"].tolist() == [[5, 6], [9, -1]]


def test_errors() -> None:
    with pytest.raises(ConfigError, match=r"sample 'k0' has no such field \(fields: cls, tokens.npy\)"):
        PadCollate(field="text")(_samples([2]))
    with pytest.raises(ConfigError, match="only the first axis may be ragged"):
        PadCollate(field="f")([{"f": np.zeros((2, 3))}, {"f": np.zeros((2, 4))}])
    with pytest.raises(ConfigError, match="must hold a sequence of numbers"):
        PadCollate(field="txt")([{"__key__": "a", "txt": "hello"}])
    with pytest.raises(ConfigError, match="pad_multiple=0"):
        PadCollate(pad_multiple=0)
    with pytest.raises(ConfigError, match="max_length=0"):
        PadCollate(max_length=0)


class _Docs(torch.utils.data.Dataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        return {"__key__": f"d{i}", "tokens.npy": np.arange(i % 7 + 1, dtype=np.uint16)}


def test_in_a_dataloader_with_workers() -> None:
    collate = PadCollate(pad_id=0, pad_multiple=4)
    loader = torch.utils.data.DataLoader(_Docs(20), batch_size=5, num_workers=2, collate_fn=collate)
    batches = list(loader)
    assert len(batches) == 4
    for j, b in enumerate(batches):
        lens = [i % 7 + 1 for i in range(5 * j, 5 * j + 5)]
        assert b["lengths"].tolist() == lens
        assert b["input_ids"].shape == (5, -(-max(lens) // 4) * 4)
        assert b["attention_mask"].sum().item() == sum(lens)


def test_one_rule_with_the_loader_collate() -> None:
    """PadCollate and the loader's padded collate give the same batch (the rule lives in collate.py)."""
    samples = [{"__key__": f"k{i}", "input_ids": np.arange(1, n + 1, dtype=np.int32)} for i, n in enumerate([5, 2, 9])]
    for pad in (Padding(pad_id=3), Padding(pad_id=3, pad_multiple=4), Padding(pad_id=3, pad_multiple=4, max_length=6)):
        ours = PadCollate(field="input_ids", pad_id=pad.pad_id, pad_multiple=pad.pad_multiple,
                          max_length=pad.max_length)(samples)
        loaders = collate(samples, pad=pad)
        assert torch.equal(ours["input_ids"], loaders["input_ids"])
        assert torch.equal(ours["attention_mask"], loaders["attention_mask"])
    assert loaders["input_ids"].shape == (3, 6) and loaders["attention_mask"].sum(1).tolist() == [5, 2, 6]
    labels = [dict(s, labels=s["input_ids"] * 10) for s in samples]  # an aligned field is truncated alike
    assert collate(labels, pad=Padding(max_length=4))["labels"].tolist()[2] == [10, 20, 30, 40]
    with pytest.raises(ConfigError, match="max_length=0"):
        Padding(max_length=0)
