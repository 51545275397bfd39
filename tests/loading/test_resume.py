"""One resume harness for every format: stop at random points, resume in a fresh loader with
other num_workers, and compare with the uninterrupted stream (keys and pixels)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

import fastfeed
from fastfeed.errors import StateError

from _loader_data import image_fields, write_dataset

EPOCHS = 2
Make = Callable[..., Any]


def fingerprint(batch: dict) -> tuple:
    """What a batch is: its keys, labels and the exact pixels (crops and flips included)."""
    pixels = hashlib.sha1(batch["image"].contiguous().numpy().tobytes()).hexdigest()
    return tuple(batch["__key__"]), tuple(batch["label"].tolist()), pixels


def uninterrupted(make: Make) -> list[tuple]:
    dl = make(num_workers=2)
    out = []
    for epoch in range(EPOCHS):
        dl.set_epoch(epoch)
        out += [fingerprint(b) for b in dl]
    return out


def interrupted(make: Make, stops: list[int], workers: list[int]) -> list[tuple]:
    """The training-loop pattern: save the state at each stop, restart in a new loader."""
    out: list[tuple] = []
    state: dict | None = None
    for part, w in enumerate(workers):
        dl = make(num_workers=w)
        if state is not None:
            dl.load_state_dict(state)
        start_epoch = state["epoch"] if state is not None else 0
        stop = stops[part] if part < len(stops) else None
        for epoch in range(start_epoch, EPOCHS):
            dl.set_epoch(epoch)
            for batch in dl:
                out.append(fingerprint(batch))
                if stop is not None and len(out) == stop:
                    break
            if stop is not None and len(out) == stop:
                state = dl.state_dict()
                break
    return out


def check_resume(make: Make, seed: int) -> None:
    """THE harness: several random stops (incl. epoch boundaries), changing worker counts."""
    ref = uninterrupted(make)
    per_epoch = len(ref) // EPOCHS
    rng = np.random.default_rng(seed)
    stops = sorted(set(rng.integers(1, len(ref), size=3).tolist()) | {per_epoch})
    got = interrupted(make, stops, workers=[2, 0, 1, 2, 0][: len(stops) + 1])
    assert got == ref


@pytest.mark.parametrize("fmt", ["tar", "lmdb"])
def test_resume_matches_the_uninterrupted_stream(tmp_path: Path, fmt: str) -> None:
    write_dataset(tmp_path, fmt=fmt, shard_counts=(8, 8, 8, 7), fields=image_fields)

    def make(num_workers: int) -> Any:
        return fastfeed.loader(tmp_path, batch_size=3, image_size=12, num_workers=num_workers, seed=11, rank=1,
                               world_size=2, workers=fastfeed.Workers(prefetch_factor=2 if num_workers else None))

    check_resume(make, seed=len(fmt))


def test_state_saved_after_the_last_batch(tmp_path: Path) -> None:
    write_dataset(tmp_path, shard_counts=(5, 5))
    dl = fastfeed.loader(tmp_path, batch_size=4, num_workers=0, decode=None)
    first = [b["__key__"] for b in dl]
    state = dl.state_dict()
    assert (state["epoch"], state["batches"]) == (0, len(dl))
    a = fastfeed.loader(tmp_path, batch_size=4, num_workers=0, decode=None)
    a.load_state_dict(state)
    a.set_epoch(0)
    assert list(a) == []  # the rest of epoch 0 is empty
    b = fastfeed.loader(tmp_path, batch_size=4, num_workers=0, decode=None)
    b.load_state_dict(state)
    second = [x["__key__"] for x in b]  # no set_epoch: moves on to epoch 1
    assert b.epoch == 1 and second != first


def test_state_is_small_and_validated(tmp_path: Path) -> None:
    write_dataset(tmp_path, shard_counts=(5, 5))
    dl = fastfeed.loader(tmp_path, batch_size=2, num_workers=0, decode=None, rank=3, world_size=8,
                         seed=4)
    it = iter(dl)
    next(it)
    state = dl.state_dict()
    flat = [v for v in state.values() if not isinstance(v, list)] + [x for s in state["stages"] for x in s]
    assert all(v is None or isinstance(v, (int, str, bool)) for v in flat)  # a few ints per stage
    assert state["batches"] == 1 and state["world_size"] == 8 and state["rank"] == 3
    assert state["stages"] == [[8, 2, "pad", 1]] and state["fastfeed_loader"] == 2

    def fresh(**kw: Any) -> Any:
        args = dict(batch_size=2, num_workers=0, decode=None, rank=0, world_size=8, seed=4)
        args.update(kw)
        return fastfeed.loader(tmp_path, **args)

    fresh(rank=5).load_state_dict(state)  # another rank may load rank 3's state
    fresh(world_size=4, rank=0).load_state_dict(state)  # elastic: another world size continues the epoch
    with pytest.raises(StateError, match="seed=4, now 5.*shuffle_block=8192, now 3"):
        fresh(batch_size=3, seed=5, order=fastfeed.Order(shuffle_block=3)).load_state_dict(state)
    with pytest.raises(StateError, match="lacks batches"):
        fresh().load_state_dict({k: v for k, v in state.items() if k != "batches"})
    with pytest.raises(StateError, match="epoch='1' is not an integer"):
        fresh().load_state_dict({**state, "epoch": "1"})
    with pytest.raises(StateError, match="batches=99 but its last stage says 1"):
        fresh().load_state_dict({**state, "batches": 99})
    with pytest.raises(StateError, match="consumed 99 batches of 1"):
        fresh().load_state_dict({**state, "batches": 99, "stages": [[8, 2, "pad", 99]]})
    other = tmp_path / "other"
    write_dataset(other, shard_counts=(5, 4))
    with pytest.raises(StateError, match="dataset=.*num_samples=10, now 9"):
        fastfeed.loader(other, batch_size=2, num_workers=0, rank=0, world_size=8, seed=4).load_state_dict(state)
