"""Sequence packing: every token once, equal steps, resume by token offset, assembled batches."""

from __future__ import annotations

import numpy as np
import pytest

from fastfeed.errors import ConfigError, SampleError
from fastfeed.loading.order.seqpack import assemble, plan_seqpack


def _stream(docs: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(doc id, offset in doc) of every token of the concatenated stream."""
    ids = np.repeat(docs, lengths)
    within = np.concatenate([np.arange(n) for n in lengths]) if lengths.size else np.zeros(0, np.int64)
    return ids, within


def _tokens(docs: np.ndarray, lengths: np.ndarray) -> dict[int, np.ndarray]:
    """Token values that encode (doc, offset), so every position of a batch can be checked."""
    return {int(d): int(d) * 100_000 + np.arange(n) for d, n in zip(docs, lengths)}


def check_plan(lengths: list[int], batch_size: int, seq_len: int, world: int, drop_last: bool,
               resume_steps: int) -> None:
    """The properties of the module docstring, for one configuration."""
    lens = np.asarray(lengths, dtype=np.int64)
    docs = np.arange(lens.size, dtype=np.int64) * 7 + 3  # ids unlike plan positions
    plans = [plan_seqpack(docs, lens, batch_size=batch_size, seq_len=seq_len, world_size=world, rank=r,
                          drop_last=drop_last) for r in range(world)]
    steps = {p.num_batches for p in plans}
    assert len(steps) == 1, "equal steps on every rank"
    (n_steps,) = steps
    total = int(lens.sum())
    window = world * batch_size * seq_len
    delivered = (n_steps * window if drop_last else total)
    assert (total - delivered < window) if drop_last else (n_steps * window >= total > (n_steps - 1) * window
                                                          or total == n_steps == 0)
    toks = _tokens(docs, lens)
    seen = []
    for s in range(n_steps):
        for r, p in enumerate(plans):
            pieces = p.batch(s)
            b = assemble(pieces, toks)
            ids, valid = b["input_ids"].reshape(-1), b["valid"].reshape(-1)
            assert ids.shape == (batch_size * seq_len,)
            assert valid.sum() == pieces.num_valid and valid[: pieces.num_valid].all()
            assert (ids[~valid] == 0).all()
            seen.append(ids[valid])
            # pieces stay inside one row; documents restart at position 0
            assert ((pieces.col + pieces.end - pieces.begin) <= seq_len).all()
            pos = b["position_ids"].reshape(-1)
            assert (pos[valid] == ids[valid] % 100_000).all()
            cu = b["cu_seqlens"]
            assert cu[0] == 0 and cu[-1] == batch_size * seq_len and (np.diff(cu) > 0).all()
            assert set(range(0, batch_size * seq_len, seq_len)) <= set(cu.tolist())
            starts = np.flatnonzero(valid & (pos == 0))
            assert set(starts.tolist()) <= set(cu.tolist())
            assert b["max_seqlen"] == int(np.diff(cu).max()) <= seq_len
            assert len(b["__key__"]) == batch_size
    got = np.concatenate(seen) if seen else np.zeros(0, np.int64)
    sid, within = _stream(docs, lens)
    want = (sid * 100_000 + within)[:delivered]
    np.testing.assert_array_equal(got, want)  # every delivered token exactly once, in stream order
    # resume from a token offset continues exactly, with the same or another world size
    k = min(resume_steps, n_steps)
    offset = plans[0].token_offset(k)
    for r, p in enumerate(plans):
        again = plan_seqpack(docs, lens, batch_size=batch_size, seq_len=seq_len, world_size=world, rank=r,
                             drop_last=drop_last, start_token=offset)
        assert again.num_batches == n_steps - k
        for j in range(again.num_batches):
            a, b = again.batch(j), p.batch(k + j)
            for name in ("row", "col", "doc", "begin", "end"):
                np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    # ... and from any cut point (not only a step boundary), under another world size
    other = world % 3 + 1
    for cut in (offset, total * resume_steps // 5):
        rest = [plan_seqpack(docs, lens, batch_size=batch_size, seq_len=seq_len, world_size=other, rank=r,
                             drop_last=False, start_token=cut) for r in range(other)]
        tail = [assemble(p.batch(s), toks) for s in range(rest[0].num_batches) for p in rest]
        tail_ids = np.concatenate([t["input_ids"].reshape(-1)[t["valid"].reshape(-1)] for t in tail]) if tail \
            else np.zeros(0, np.int64)
        np.testing.assert_array_equal(tail_ids, (sid * 100_000 + within)[cut:])


_RNG = np.random.default_rng(1234)
_CASES = [
    (list(_RNG.integers(0, int(_RNG.integers(1, 40)), size=int(_RNG.integers(0, 30)))),
     int(_RNG.integers(1, 5)), int(_RNG.integers(1, 17)), int(_RNG.integers(1, 5)), bool(_RNG.integers(0, 2)),
     int(_RNG.integers(0, 4)))
    for _ in range(60)
]


@pytest.mark.parametrize("lengths,batch_size,seq_len,world,drop_last,resume", _CASES)
def test_plan_properties_random(lengths, batch_size, seq_len, world, drop_last, resume) -> None:
    check_plan(lengths, batch_size, seq_len, world, drop_last, resume)


def test_plan_properties_hypothesis() -> None:
    hypothesis = pytest.importorskip("hypothesis")
    st = hypothesis.strategies

    @hypothesis.settings(max_examples=150, deadline=None, derandomize=True)
    @hypothesis.given(st.lists(st.integers(0, 60), max_size=25), st.integers(1, 4), st.integers(1, 20),
                      st.integers(1, 4), st.booleans(), st.integers(0, 5))
    def run(lengths, batch_size, seq_len, world, drop_last, resume):
        check_plan(lengths, batch_size, seq_len, world, drop_last, resume)

    run()


def test_long_document_continues_and_positions() -> None:
    plan = plan_seqpack([5, 6], [7, 2], batch_size=2, seq_len=4, drop_last=False)
    toks = {5: np.arange(10, 17), 6: np.array([90, 91])}
    b = assemble(plan.batch(0), toks, keys={5: "doc-a", 6: "doc-b"}, pad_id=-1)
    assert b["input_ids"].tolist() == [[10, 11, 12, 13], [14, 15, 16, 90]]
    assert b["position_ids"].tolist() == [[0, 1, 2, 3], [4, 5, 6, 0]]
    assert b["cu_seqlens"].tolist() == [0, 4, 7, 8]
    assert b["__key__"] == [["doc-a"], ["doc-a", "doc-b"]]
    rows = assemble(plan.batch(0), toks, positions="row")
    assert rows["position_ids"].tolist() == [[0, 1, 2, 3], [0, 1, 2, 0]]
    last = assemble(plan.batch(1), toks, pad_id=-1)
    assert last["input_ids"].tolist() == [[91, -1, -1, -1], [-1, -1, -1, -1]]
    assert last["valid"].sum() == 1 and last["cu_seqlens"].tolist() == [0, 1, 4, 8]
    assert last["input_ids"].dtype == np.int64 and last["cu_seqlens"].dtype == np.int32
    assert plan.batch(0).doc_ids().tolist() == [5, 6]


def test_batches_are_independent_of_worker_split() -> None:
    """A batch is a function of (plan, batch number): any order of calls gives the same batch."""
    rng = np.random.default_rng(0)
    lens = rng.integers(1, 50, 200)
    docs = rng.permutation(200)
    plan = plan_seqpack(docs, lens, batch_size=3, seq_len=16, world_size=2, rank=1)
    toks = _tokens(docs, lens)
    forward = [assemble(plan.batch(i), toks)["input_ids"] for i in range(plan.num_batches)]
    for workers in (2, 3):  # round-robin like DataLoader workers, assembled out of order
        for w in range(workers):
            for i in range(w, plan.num_batches, workers):
                np.testing.assert_array_equal(assemble(plan.batch(i), toks)["input_ids"], forward[i])


def test_errors() -> None:
    with pytest.raises(ConfigError, match="rank=2"):
        plan_seqpack([1], [3], batch_size=1, seq_len=2, world_size=2, rank=2)
    with pytest.raises(ConfigError, match="seq_len=0"):
        plan_seqpack([1], [3], batch_size=1, seq_len=0)
    with pytest.raises(ConfigError, match="document 9 has length -1"):
        plan_seqpack([8, 9], [3, -1], batch_size=1, seq_len=2)
    with pytest.raises(ConfigError, match="one entry per document"):
        plan_seqpack([8, 9], [3], batch_size=1, seq_len=2)
    with pytest.raises(ConfigError, match="start_token=10"):
        plan_seqpack([1], [3], batch_size=1, seq_len=2, start_token=10)
    plan = plan_seqpack([1], [3], batch_size=1, seq_len=2, drop_last=True)
    with pytest.raises(ConfigError, match="the plan has 1 batches"):
        plan.batch(1)
    with pytest.raises(SampleError, match="document 1: 2 tokens, but lengths.npy says 3"):
        assemble(plan.batch(0), {1: np.array([1, 2])})


@pytest.mark.parametrize("positions", ["document", "row"])
def test_pieces_laid_out_otherwise_assemble_piece_by_piece(positions: str) -> None:
    """A hand-made BatchPieces whose pieces do not lie end to end (the plan's never do) takes
    the piece-by-piece path; it must put every piece where it says and agree with the plan's
    own layout on the pieces both have."""
    from dataclasses import replace

    plan = plan_seqpack([4, 5, 6], [5, 7, 3], batch_size=2, seq_len=8, drop_last=False)
    toks = _tokens(np.array([4, 5, 6]), np.array([5, 7, 3]))
    p = plan.batch(0)
    want = assemble(p, toks, positions=positions)
    # the same pieces in reverse order: each still at its own row and column
    rev = replace(p, **{f: getattr(p, f)[::-1].copy() for f in ("row", "col", "pos", "doc", "begin", "end", "doc_len")})
    got = assemble(rev, toks, positions=positions)
    for k in ("input_ids", "position_ids", "valid", "cu_seqlens"):
        assert np.array_equal(got[k], want[k]), k
    assert got["max_seqlen"] == want["max_seqlen"]
    # a gap: the last piece moved one column right (the batch has room) leaves a padding position
    last = p.col.size - 1
    gap = replace(p, col=np.where(np.arange(p.col.size) == last, p.col + 1, p.col))
    g = assemble(gap, toks, positions=positions, pad_id=-1)
    s = int(p.row[last] * 8 + p.col[last])
    n = int(p.end[last] - p.begin[last])
    assert g["input_ids"].reshape(-1)[s] == -1 and not g["valid"].reshape(-1)[s]
    assert np.array_equal(g["input_ids"].reshape(-1)[s + 1:s + 1 + n], toks[int(p.doc[last])][p.begin[last]:p.end[last]])
    assert np.array_equal(g["input_ids"].reshape(-1)[:s], want["input_ids"].reshape(-1)[:s])
