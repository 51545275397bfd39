"""fastfeed.loader() over token data: packed rows (seq_len), padded batches, the balanced samplers."""

from __future__ import annotations

import io
import json
import multiprocessing as mp
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import fastfeed
from fastfeed.errors import ConfigError, StateError
from fastfeed.loading.compat import recreate_kwargs
from fastfeed.packed.index import DatasetIndex
from fastfeed.sampling.samplers import DistributedLengthBucketSampler, DistributedTokenBudgetSampler

from _dist import run_ranks
from _loader_data import image_fields, write_dataset
from _token_data import doc_length, doc_tokens, index_has_tokenizer, write_token_dataset

N_DOCS = 150
TOTAL = sum(doc_length(i) for i in range(N_DOCS))


@pytest.fixture(scope="module")
def tokens(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tokens")
    write_token_dataset(root)
    return root


def _tokens_of(batches: list[dict]) -> list[tuple[int, int]]:
    """(document, position) of every valid token delivered, checked against the documents."""
    out = []
    for b in batches:
        ids, pos, valid = b["input_ids"], b["position_ids"], b["valid"]
        for r in range(ids.shape[0]):
            row = ids[r][valid[r]].tolist()
            docs = [t // 100 for t in row]
            assert [t % 100 for t in row] == pos[r][valid[r]].tolist()  # position inside the document
            assert sorted(set(docs)) == sorted({int(k[1:]) for k in b["__key__"][r]})  # keys of the row
            out += [(t // 100, t % 100) for t in row]
    return out


def _check_cu_seqlens(b: dict, seq_len: int) -> None:
    """Segments cut at every row start and every document start, covering all B * L tokens."""
    cu, pos, valid = b["cu_seqlens"], b["position_ids"].reshape(-1), b["valid"].reshape(-1)
    assert cu.dtype == torch.int32 and cu[0] == 0 and cu[-1] == pos.numel()
    flat = b["input_ids"].reshape(-1)
    starts = {i for i in range(pos.numel()) if valid[i] and (pos[i] == 0 or i % seq_len == 0
                                                            or flat[i] // 100 != flat[i - 1] // 100)}
    assert starts <= set(cu.tolist())
    assert b["max_seqlen"] == int(torch.diff(cu).max())


def _epoch(root: Path, world: int, **kw: object) -> list[list[dict]]:
    return [list(fastfeed.loader(root, rank=r, world_size=world, **kw)) for r in range(world)]


@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("drop_last", [False, True])
def test_seq_len_every_token_once_equal_steps(tokens: Path, world: int, drop_last: bool) -> None:
    B, L = 2, 40
    ranks = _epoch(tokens, world, batch_size=B, seq_len=L, drop_last=drop_last, num_workers=0, seed=3)
    assert len({len(r) for r in ranks}) == 1  # equal steps on every rank
    window = world * B * L
    steps = len(ranks[0])
    assert steps == (TOTAL // window if drop_last else -(-TOTAL // window))
    for r in ranks:
        for b in r:
            assert b["input_ids"].dtype == torch.int64 and tuple(b["input_ids"].shape) == (B, L)
            assert tuple(b["position_ids"].shape) == (B, L) and b["valid"].dtype == torch.bool
            _check_cu_seqlens(b, L)
    seen = Counter(t for r in ranks for t in _tokens_of(r))
    assert max(seen.values()) == 1  # never twice
    every = {(i, p) for i in range(N_DOCS) for p in range(doc_length(i))}
    if drop_last:
        assert len(seen) == steps * window and set(seen) <= every  # only full windows, the tail left out
    else:
        assert set(seen) == every  # every token of the epoch exactly once
        last = ranks[-1][-1]
        assert not last["valid"].all() and (last["input_ids"][~last["valid"]] == 0).all()  # padded with pad_id


def test_seq_len_rows_follow_the_documents(tokens: Path) -> None:
    """Unshuffled, the stream is the documents in index order; a long document continues in the next row."""
    (batches,) = _epoch(tokens, 1, batch_size=3, seq_len=16, shuffle=False, num_workers=0)
    stream = torch.cat([b["input_ids"][b["valid"]] for b in batches])
    assert stream.tolist() == np.concatenate([doc_tokens(i) for i in range(N_DOCS)]).astype(np.int64).tolist()
    first = batches[0]
    # document 0 has 12 tokens, document 1 has 49: it starts in row 0 and continues in rows 1, 2, ...
    assert first["__key__"][0] == ["s00000", "s00001"] and first["__key__"][1] == ["s00001"]
    assert first["position_ids"][0].tolist() == list(range(12)) + [0, 1, 2, 3]  # restarts at document 1
    assert first["position_ids"][1].tolist() == list(range(4, 20))  # and keeps counting in the next row


def test_seq_len_deterministic_and_independent_of_workers(tokens: Path) -> None:
    kw: dict[str, Any] = {"batch_size": 2, "seq_len": 32, "seed": 7}
    a = list(fastfeed.loader(tokens, num_workers=0, **kw))
    b = list(fastfeed.loader(tokens, num_workers=2, **kw))
    assert len(a) == len(b)
    assert all(torch.equal(x["input_ids"], y["input_ids"]) and torch.equal(x["cu_seqlens"], y["cu_seqlens"])
               for x, y in zip(a, b))
    other = list(fastfeed.loader(tokens, num_workers=0, **{**kw, "seed": 8}))
    assert not all(torch.equal(x["input_ids"], y["input_ids"]) for x, y in zip(a, other))
    dl = fastfeed.loader(tokens, num_workers=2, **kw)  # persistent workers see the next epoch
    epochs = []
    for epoch in range(2):
        dl.set_epoch(epoch)
        epochs.append(list(dl))
    assert all(torch.equal(x["input_ids"], y["input_ids"]) for x, y in zip(epochs[0], a))
    assert not all(torch.equal(x["input_ids"], y["input_ids"]) for x, y in zip(epochs[0], epochs[1]))
    assert Counter(_tokens_of(epochs[1])) == Counter(_tokens_of(a))  # a new order of the same tokens


@pytest.mark.parametrize("kw", [{"batch_size": 3, "seq_len": 32}, {"batch_size": 5}], ids=["seq_len", "padded"])
def test_batches_from_workers_equal_the_in_process_ones_in_one_storage(tokens: Path, kw: dict[str, Any]) -> None:
    """Workers send a batch's tensors as views of one shared storage (one file descriptor, not
    one per tensor: decode.collate.one_storage); the values are those of num_workers=0."""
    a = list(fastfeed.loader(tokens, num_workers=0, seed=3, **kw))
    b = list(fastfeed.loader(tokens, num_workers=2, seed=3, **kw))
    assert len(a) == len(b) > 2
    for x, y in zip(a, b):
        assert list(x) == list(y)
        for k in x:
            if isinstance(x[k], torch.Tensor):
                assert x[k].dtype == y[k].dtype and x[k].is_contiguous() and torch.equal(x[k], y[k]), k
            else:
                assert x[k] == y[k], k
        tensors = [v for v in y.values() if isinstance(v, torch.Tensor)]
        assert len(tensors) >= 4 and len({t.untyped_storage().data_ptr() for t in tensors}) == 1


@pytest.mark.parametrize("workers_before,workers_after", [(0, 2), (2, 1)])
def test_seq_len_resume_mid_epoch_in_a_fresh_loader(tokens: Path, workers_before: int, workers_after: int) -> None:
    kw: dict[str, Any] = {"batch_size": 2, "seq_len": 24, "seed": 1, "rank": 1, "world_size": 2}
    full = list(fastfeed.loader(tokens, num_workers=0, **kw))
    dl = fastfeed.loader(tokens, num_workers=workers_before, **kw)
    dl.set_epoch(0)
    it = iter(dl)
    head = [next(it) for _ in range(5)]
    state = dl.state_dict()
    assert state["tokens"] == 5 * 2 * 2 * 24 and state["seq_len"] == 24 and state["batches"] == 5
    del it
    fresh = fastfeed.loader(tokens, num_workers=workers_after, **kw)
    fresh.load_state_dict(json.loads(json.dumps(state)))  # a few integers and strings
    rest = list(fresh)
    assert len(head) + len(rest) == len(full)
    assert all(torch.equal(x["input_ids"], y["input_ids"]) for x, y in zip(head + rest, full))
    with pytest.raises(StateError, match="seq_len=24, now 32"):
        fastfeed.loader(tokens, num_workers=0, **{**kw, "seq_len": 32}).load_state_dict(state)
    with pytest.raises(StateError, match="seq_len"):
        fastfeed.loader(tokens, batch_size=2, num_workers=0, rank=1, world_size=2, seed=1).load_state_dict(state)


def test_seq_len_state_is_v2_and_resumes_elastically(tokens: Path) -> None:
    """2 ranks x 2 rows stop after 2 steps; 1 rank x 3 rows continues the epoch with exactly
    the tokens not yet delivered; the next epoch is a fresh run's at the new shape."""
    kw: dict[str, Any] = {"seq_len": 24, "seed": 1, "num_workers": 0}
    old = [fastfeed.loader(tokens, rank=r, world_size=2, batch_size=2, **kw) for r in range(2)]
    head = []
    for dl in old:
        it = iter(dl)
        head += [next(it), next(it)]
    state = json.loads(json.dumps(old[0].state_dict()))
    assert state["fastfeed_loader"] == 2 and state["stages"] == [[2, 2, "pad", 2]] and state["tokens"] == 2 * 2 * 2 * 24
    new = fastfeed.loader(tokens, rank=0, world_size=1, batch_size=3, **kw)
    new.load_state_dict(state)
    rest = list(new)
    assert len(rest) == -(-(TOTAL - state["tokens"]) // (3 * 24)) and new.epoch == 0
    seen = Counter(_tokens_of(head) + _tokens_of(rest))
    assert max(seen.values()) == 1 and set(seen) == {(i, p) for i in range(N_DOCS) for p in range(doc_length(i))}
    after = new.state_dict()
    assert after["stages"] == [[2, 2, "pad", 2], [1, 3, "pad", len(rest)]] and after["tokens"] == TOTAL
    again = fastfeed.loader(tokens, rank=0, world_size=1, batch_size=3, **kw)  # a state saved after the resize
    again.load_state_dict(after)
    fresh = fastfeed.loader(tokens, rank=0, world_size=1, batch_size=3, **kw)
    fresh.set_epoch(1)
    nxt, ref = list(again), list(fresh)
    assert again.epoch == 1 and len(nxt) == len(ref) == len(fresh)  # the next epoch: a fresh run's
    assert all(torch.equal(x["input_ids"], y["input_ids"]) for x, y in zip(nxt, ref))
    with pytest.raises(StateError, match="tokens=5 does not match its stages"):
        new.load_state_dict({**state, "tokens": 5})
    with pytest.raises(StateError, match=r"stage 0 \(2 ranks, 2 rows, pad\) consumed 99 batches"):
        new.load_state_dict({**state, "batches": 99, "stages": [[2, 2, "pad", 99]], "tokens": TOTAL})
    twin = type(old[0])(**recreate_kwargs(old[0]))  # Lightning's re-created loader: same stream, fresh position
    assert len(twin) == len(old[0]) and twin.epoch == 0
    assert torch.equal(next(iter(twin))["input_ids"], head[0]["input_ids"])


def test_seq_len_and_batch_sampler_read_one_whole_dataset(tokens: Path) -> None:
    for source, extra in ((fastfeed.Source(tokens, subset=[0, 1, 2]), {}),
                          (tokens, {"order": fastfeed.Order(epoch_samples=10)}), (tokens, {"pad": False})):
        with pytest.raises(ConfigError, match=r"reads one whole dataset.*drop seq_len="):
            fastfeed.loader(source, batch_size=2, seq_len=16, **extra)
    with pytest.raises(ConfigError, match=r"reads one whole dataset.*2 datasets \(a mix of Source\)"):
        fastfeed.loader([fastfeed.Source(tokens, weight=1), fastfeed.Source(tokens, weight=1)], batch_size=2,
                        seq_len=16)
    with pytest.raises(ConfigError, match=r"reads one whole dataset.*drop batch_sampler="):
        fastfeed.loader(fastfeed.Source(tokens, subset=[0, 1]), batch_sampler=_budget(tokens, 1, 0))


def test_seq_len_errors(tokens: Path, tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    write_dataset(plain, shard_counts=(5, 5))
    with pytest.raises(ConfigError, match=r"no tokens field.*fastfeed pack .*--tokenizer .*--tokenize FIELD"):
        fastfeed.loader(plain, batch_size=2, seq_len=16)
    for dali in ({"seq_len": 16}, {"tokens": fastfeed.Tokens(pad_multiple=8)}):
        with pytest.raises(ConfigError, match="decode='dali' decodes images.*use decode='cpu'"):
            fastfeed.loader(tokens, batch_size=2, decode="dali", image_size=8, **dali)
    with pytest.raises(ConfigError, match="transform"):
        fastfeed.loader(tokens, batch_size=2, seq_len=16, transform=lambda s: s)
    with pytest.raises(ConfigError, match="on_error='raise'"):
        fastfeed.loader(tokens, batch_size=2, seq_len=16, on_error="skip")
    with pytest.raises(ConfigError, match="seq_len=0"):
        fastfeed.loader(tokens, batch_size=2, seq_len=0)
    with pytest.raises(ConfigError, match="cannot fill one window"):
        fastfeed.loader(tokens, batch_size=64, seq_len=4096, drop_last=True)


# ---------------------------------------------------------------------- padded batches
def test_padded_token_batches(tokens: Path) -> None:
    batches = list(fastfeed.loader(tokens, batch_size=4, shuffle=False, num_workers=0))
    for b in batches:
        ids, mask = b["input_ids"], b["attention_mask"]
        lengths = [doc_length(int(k[1:])) for k in b["__key__"]]
        assert ids.dtype == torch.int64 and tuple(ids.shape) == (len(lengths), max(lengths))
        assert mask.sum(1).tolist() == lengths
        for row, key, n in zip(ids, b["__key__"], lengths):
            assert row[:n].tolist() == doc_tokens(int(key[1:])).tolist() and (row[n:] == 0).all()
        assert "tokens.npy" not in b and b["txt"][0].startswith("doc ")
    padded = next(iter(fastfeed.loader(tokens, batch_size=4, shuffle=False, num_workers=0,
                                       tokens=fastfeed.Tokens(pad_multiple=32, pad_id=7))))
    lengths = [doc_length(i) for i in range(4)]
    assert padded["input_ids"].shape[1] == 96  # longest 86, rounded up to 32
    assert padded["attention_mask"].sum(1).tolist() == lengths
    assert (padded["input_ids"][padded["attention_mask"] == 0] == 7).all()


def test_pad_id_defaults_to_the_index(tmp_path: Path) -> None:
    if not index_has_tokenizer():
        pytest.skip("this fastfeed's index does not record pack's tokenizer yet")
    root = tmp_path / "tok"
    write_token_dataset(root, tokenizer={"sha256": "0" * 64, "vocab_size": 60000, "pad_id": 5, "dtype": "uint16",
                                         "field": "txt", "tokens": "tokens.npy"})
    b = next(iter(fastfeed.loader(root, batch_size=4, shuffle=False, num_workers=0)))
    assert (b["input_ids"][b["attention_mask"] == 0] == 5).all() and (b["attention_mask"] == 0).any()
    packed = list(fastfeed.loader(root, batch_size=4, seq_len=64, num_workers=0))[-1]
    assert (packed["input_ids"][~packed["valid"]] == 5).all()


def test_ragged_arrays_from_a_transform_are_padded(tmp_path: Path) -> None:
    root = tmp_path / "text"
    write_dataset(root, shard_counts=(6, 6))

    def tokenize(s: dict) -> dict:  # a tokenizer run in the workers: ragged ids and their labels
        ids = np.frombuffer(s["txt"].encode(), dtype=np.uint8).astype(np.int64)
        return {"__key__": s["__key__"], "input_ids": ids, "labels": ids + 1, "label": s["label"]}

    for workers in (0, 2):
        b = next(iter(fastfeed.loader(root, batch_size=12, shuffle=False, num_workers=workers,
                                      transform=tokenize, tokens=fastfeed.Tokens(pad_multiple=8))))
        texts = [f"sample {i}" for i in range(12)]
        assert tuple(b["input_ids"].shape) == (12, 16) and b["attention_mask"].sum(1).tolist() == [len(t) for t in texts]
        assert b["labels"].shape == b["input_ids"].shape  # aligned with input_ids
        assert bytes(b["input_ids"][11, :9].tolist()).decode() == "sample 11"
        assert b["label"].tolist() == [i % 5 for i in range(12)]


# ---------------------------------------------------------------------- batch_sampler
def _lengths(root: Path) -> np.ndarray:
    # the budget planner overflows on a length-0 sample (capacity 2**62 x world_size, in
    # fastfeed.sampling.steps.plan_budget): count the empty document as 1 token
    return np.maximum(DatasetIndex.load(root).lengths, 1)


def _budget(root: Path, world: int, rank: int, max_cost: int = 300) -> DistributedTokenBudgetSampler:
    return DistributedTokenBudgetSampler(_lengths(root), max_cost=max_cost, num_replicas=world, rank=rank, seed=4)


def _samplers(root: Path, world: int, kind: str) -> list:
    if kind == "budget":
        return [_budget(root, world, r) for r in range(world)]
    return [DistributedLengthBucketSampler(root, batch_size=3, num_replicas=world, rank=r, seed=4)
            for r in range(world)]


@pytest.mark.parametrize("kind", ["budget", "bucket"])
def test_batch_sampler_equal_steps_and_the_samplers_batches(tokens: Path, kind: str) -> None:
    world = 2
    samplers = _samplers(tokens, world, kind)
    expect = [[sorted(f"s{i:05d}" for i in b) for b in s] for s in _samplers(tokens, world, kind)]
    got = [list(fastfeed.loader(tokens, batch_sampler=s, num_workers=1)) for s in samplers]
    assert len({len(g) for g in got}) == 1 and len(got[0]) == len(expect[0])
    for r in range(world):
        assert [sorted(b["__key__"]) for b in got[r]] == expect[r]
        for b in got[r]:
            assert b["input_ids"].shape[1] == max(doc_length(int(k[1:])) for k in b["__key__"])
            if kind == "budget":
                assert b["input_ids"].numel() <= 300  # the budget of padded tokens
    keys = Counter(k for g in got for b in g for k in b["__key__"])
    assert set(keys) == {f"s{i:05d}" for i in range(N_DOCS)}  # drop_last=False: every sample at least once


def test_batch_sampler_resume_through_state_dict(tokens: Path) -> None:
    def make(workers: int) -> fastfeed.Loader:
        s = _budget(tokens, 2, 0)
        return fastfeed.loader(tokens, batch_sampler=s, num_workers=workers, tokens=fastfeed.Tokens(pad_multiple=8))

    dl = make(2)
    dl.set_epoch(1)
    full = list(dl)
    assert dl.stats.steps == len(full) == len(dl) and dl.stats.samples == sum(len(b["__key__"]) for b in full)
    dl.set_epoch(1)
    it = iter(dl)
    head = [next(it) for _ in range(3)]
    state = dl.state_dict()
    assert state["epoch"] == 1 and state["batches"] == 3 and state["sampler"].startswith("DistributedTokenBudget")
    del it
    fresh = make(0)
    fresh.load_state_dict(state)
    rest = list(fresh)
    assert [b["__key__"] for b in head + rest] == [b["__key__"] for b in full]
    assert all(b["input_ids"].shape[1] % 8 == 0 for b in rest)
    other = _budget(tokens, 2, 0, max_cost=400)
    with pytest.raises(StateError, match="batch_sampler"):
        fastfeed.loader(tokens, batch_sampler=other, num_workers=0).load_state_dict(state)


@pytest.mark.parametrize("kind", ["budget", "bucket"])
def test_batch_sampler_resumes_at_another_world_size(tokens: Path, kind: str) -> None:
    """A state saved by 2 ranks loads into loaders whose samplers have 3 ranks: the epoch
    continues with the samples the old ranks had not run, equal steps on the new ranks;
    the next epoch is the samplers' fresh plan at 3 ranks."""
    old = [fastfeed.loader(tokens, batch_sampler=s, num_workers=0) for s in _samplers(tokens, 2, kind)]
    head: list[str] = []
    for dl in old:
        dl.set_epoch(1)
        it = iter(dl)
        head += [k for _ in range(3) for k in next(it)["__key__"]]
    state = json.loads(json.dumps(old[1].state_dict()))
    whole = Counter()
    for s in _samplers(tokens, 2, kind):
        s.set_epoch(1)
        whole.update(f"s{i:05d}" for b in s for i in b)
    new = [fastfeed.loader(tokens, batch_sampler=s, num_workers=w)
           for s, w in zip(_samplers(tokens, 3, kind), (0, 1, 0))]
    rests = []
    for dl in new:
        dl.load_state_dict(state)
        rests.append(list(dl))
        assert [st[0] for st in dl.state_dict()["stages"]] == [2, 3] and dl.epoch == 1
    assert len({len(r) for r in rests}) == 1
    got = Counter(head) + Counter(k for r in rests for b in r for k in b["__key__"])
    assert not whole - got and sum((got - whole).values()) <= 3 - 1  # the new size's remainder: <= W' - 1 repeats
    fresh = _samplers(tokens, 3, kind)[0]
    fresh.set_epoch(2)
    assert [sorted(b["__key__"]) for b in new[0]] == [sorted(f"s{i:05d}" for i in b) for b in fresh]


def test_batch_sampler_over_images_reuses_buffers(tmp_path: Path) -> None:
    root = tmp_path / "img"
    write_dataset(root, shard_counts=(7, 7, 7, 4), fields=image_fields)
    lengths = np.arange(25) % 7 + 1
    s = DistributedLengthBucketSampler(lengths, batch_size=4, num_replicas=1, rank=0, seed=2)
    dl = fastfeed.loader(root, batch_sampler=s, image_size=16, num_workers=2)
    assert dl._pool is not None  # persistent workers refill the batches let go
    for epoch in range(2):
        dl.set_epoch(epoch)
        s.set_epoch(epoch)
        expect = [[f"s{i:05d}" for i in b] for b in s]
        got = list(dl)
        assert [b["__key__"] for b in got] == expect
        assert all(tuple(b["image"].shape) == (len(k), 3, 16, 16) for b, k in zip(got, expect))
        assert all(b["label"].tolist() == [int(k[1:]) % 3 for k in b["__key__"]] for b in got)


def test_batch_sampler_errors(tokens: Path, tmp_path: Path) -> None:
    budget = _budget(tokens, 2, 1)
    bucket = DistributedLengthBucketSampler(tokens, batch_size=3, num_replicas=1, rank=0)
    with pytest.raises(ConfigError, match="drop batch_size="):
        fastfeed.loader(tokens, batch_sampler=budget, batch_size=8)
    with pytest.raises(ConfigError, match="batches of 3; drop batch_size="):
        fastfeed.loader(tokens, batch_sampler=bucket, batch_size=8)
    assert len(fastfeed.loader(tokens, batch_sampler=bucket, batch_size=3, num_workers=0)) == len(bucket)
    with pytest.raises(ConfigError, match="world_size=4 but the batch_sampler was built for world_size=2"):
        fastfeed.loader(tokens, batch_sampler=budget, world_size=4, rank=1)
    with pytest.raises(ConfigError, match="shuffle=False.*pass shuffle/seed/drop_last to the sampler"):
        fastfeed.loader(tokens, batch_sampler=bucket, shuffle=False)
    with pytest.raises(ConfigError, match="seq_len"):
        fastfeed.loader(tokens, batch_sampler=bucket, seq_len=16)
    small = tmp_path / "small"
    write_token_dataset(small, shard_counts=(5, 5))
    with pytest.raises(ConfigError, match="holds 150 lengths but the dataset has 10 samples"):
        fastfeed.loader(small, batch_sampler=bucket)
    with pytest.raises(ConfigError, match="needs batch_size="):
        fastfeed.loader(tokens)


# ---------------------------------------------------------------------- real ranks (gloo)
def _run_rank(rank: int, world: int, root: str, out: str, init: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world)
    try:
        dl = fastfeed.loader(root, batch_size=2, seq_len=40, num_workers=1, seed=2)
        steps, toks = 0, []
        for b in dl:
            dist.all_reduce(torch.ones(1))  # a rank with fewer steps would hang here
            steps += 1
            toks += b["input_ids"][b["valid"]].tolist()
        Path(out).write_text(json.dumps({"rank": dl.rank, "len": len(dl), "steps": steps, "tokens": toks}))
    finally:
        dist.destroy_process_group()


@pytest.mark.dist
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_two_gloo_ranks_seq_len_equal_steps(tokens: Path, tmp_path: Path) -> None:
    init = tmp_path / "init"
    results = run_ranks(mp.get_context("fork"), _run_rank, lambda r, out: (r, 2, str(tokens), out, str(init)),
                        2, tmp_path, timeout=180)
    assert [r["rank"] for r in results] == [0, 1]
    assert results[0]["steps"] == results[1]["steps"] == results[0]["len"] == -(-TOTAL // (2 * 2 * 40))
    delivered = Counter(t for r in results for t in r["tokens"])
    assert max(delivered.values()) == 1 and sum(delivered.values()) == TOTAL


def _run_resumed_rank(rank: int, world: int, root: str, out: str, init: str, states: str) -> None:
    """A rank of a job resized from 1 rank to 2: both loaders continue the saved epoch."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world)
    try:
        saved = json.loads(Path(states).read_text())
        rows = fastfeed.loader(root, batch_size=2, seq_len=40, num_workers=1, seed=2)
        rows.load_state_dict(saved["rows"])
        steps, toks = 0, []
        for b in rows:
            dist.all_reduce(torch.ones(1))  # a rank with fewer steps would hang here
            steps += 1
            toks += [(int(t) // 100, int(p)) for t, p in zip(b["input_ids"][b["valid"]], b["position_ids"][b["valid"]])]
        sampled = fastfeed.loader(root, batch_sampler=_budget(Path(root), world, rank), num_workers=0)
        sampled.load_state_dict(saved["sampled"])
        keys = []
        for b in sampled:
            dist.all_reduce(torch.ones(1))
            keys += b["__key__"]
        Path(out).write_text(json.dumps({"steps": steps, "len": len(rows), "tokens": toks, "keys": keys,
                                         "sampled_steps": sampled.stats.steps}))
    finally:
        dist.destroy_process_group()


@pytest.mark.dist
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_gloo_elastic_resume_from_one_rank_to_two(tokens: Path, tmp_path: Path) -> None:
    rows = fastfeed.loader(tokens, batch_size=2, seq_len=40, num_workers=0, seed=2, rank=0, world_size=1)
    it = iter(rows)
    head = [next(it) for _ in range(7)]
    sampled = fastfeed.loader(tokens, batch_sampler=_budget(tokens, 1, 0), num_workers=0)
    it2 = iter(sampled)
    head_keys = [k for _ in range(4) for k in next(it2)["__key__"]]
    states = tmp_path / "states.json"
    states.write_text(json.dumps({"rows": rows.state_dict(), "sampled": sampled.state_dict()}))
    init = tmp_path / "init"
    results = run_ranks(mp.get_context("fork"), _run_resumed_rank,
                        lambda r, out: (r, 2, str(tokens), out, str(init), str(states)), 2, tmp_path, timeout=180)
    assert results[0]["steps"] == results[1]["steps"] == -(-(TOTAL - 7 * 2 * 40) // (2 * 2 * 40))
    delivered = Counter(_tokens_of(head)) + Counter(tuple(t) for r in results for t in r["tokens"])
    assert max(delivered.values()) == 1 and sum(delivered.values()) == TOTAL  # every token once
    assert results[0]["sampled_steps"] == results[1]["sampled_steps"]
    got = Counter(head_keys) + Counter(k for r in results for k in r["keys"])
    assert set(got) == {f"s{i:05d}" for i in range(N_DOCS)} and sum(got.values()) - N_DOCS <= 1


# ---------------------------------------------------------------------- a real BPE tokenizer
def _bpe(texts: list[str]) -> Any:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=300, special_tokens=["<pad>", "<unk>"]))
    return tok


def test_real_bpe_tokens_packed_and_padded(tmp_path: Path) -> None:
    """Text tokenized by a BPE trained here: stored ids packed into rows give back the stream of
    documents; tokenizing in the workers (transform) gives the same padded batches as stored ids."""
    words = ["the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while", "seven", "wizards",
             "quietly", "brew", "potent", "elixirs"]
    texts = [" ".join(words[(i * 5 + j) % len(words)] for j in range(3 + (i * 7) % 40)) for i in range(60)]
    tok = _bpe(texts)
    pad = tok.token_to_id("<pad>")
    ids = [np.array(tok.encode(t).ids, dtype=np.uint16) for t in texts]

    def fields_of(i: int, rng: np.random.Generator) -> dict[str, bytes]:
        buf = io.BytesIO()
        np.save(buf, ids[i], allow_pickle=False)
        return {"tokens.npy": buf.getvalue(), "txt": texts[i].encode()}

    root = tmp_path / "bpe"
    index = write_dataset(root, shard_counts=(25, 20, 15), fields=fields_of, labels=False)
    replace(index, lengths_field="tokens").with_arrays(
        offsets=np.asarray(index.offsets), lengths=np.array([a.size for a in ids])).save(root)

    rows = list(fastfeed.loader(root, batch_size=4, seq_len=32, shuffle=False, num_workers=2))
    stream = torch.cat([b["input_ids"][b["valid"]] for b in rows]).tolist()
    assert stream == np.concatenate(ids).astype(np.int64).tolist()
    assert tok.decode(rows[0]["input_ids"][0].tolist()).startswith(texts[0][:10])

    def encode(s: dict) -> dict:
        return {"__key__": s["__key__"], "input_ids": np.array(tok.encode(s["txt"]).ids, dtype=np.int64)}

    padding = fastfeed.Tokens(pad_id=pad, pad_multiple=8)
    stored = list(fastfeed.loader(root, batch_size=8, shuffle=False, num_workers=0, tokens=padding))
    live = list(fastfeed.loader(root, batch_size=8, shuffle=False, num_workers=2, tokens=padding, transform=encode))
    assert all(torch.equal(a["input_ids"], b["input_ids"]) and torch.equal(a["attention_mask"], b["attention_mask"])
               for a, b in zip(stored, live))
    assert stored[0]["input_ids"].shape[1] % 8 == 0 and (stored[0]["input_ids"][stored[0]["attention_mask"] == 0]
                                                         == pad).all()
