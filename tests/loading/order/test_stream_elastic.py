"""Elastic resume of the batch streams (``seq_len=`` rows, ``batch_sampler=`` steps) as pure
numpy planning over many world shapes, without processes: a state saved at one shape
resumes at another, and the union over the new ranks of the rest of the epoch is exactly
what the old stages had not consumed, each once (tokens; a sampler's samples as often as
its plan held them)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastfeed.errors import StateError
from fastfeed.loading.order.elastic import Stage
from fastfeed.loading.cpu.sampled import SamplerStream, sampler_plan
from fastfeed.loading.order.seqpack import plan_seqpack
from fastfeed.loading.cpu.tokens import TokenStream
from fastfeed.sampling.samplers import DistributedLengthBucketSampler, DistributedTokenBudgetSampler

SEQ = 5
token_shape = st.tuples(st.integers(1, 5), st.integers(1, 4), st.sampled_from(["pad", "drop"]))


def _token_steps(lengths: np.ndarray, shape: tuple[int, int, str], prior: tuple[Stage, ...],
                 steps: int | None) -> tuple[list[tuple[int, int]], int]:
    """The stream offsets ``[a, e)`` every rank delivers in the first ``steps`` batches
    (None: all) of the stage ``shape`` after ``prior``, and the stage's batch count."""
    w, b, mode = shape
    stream = TokenStream(total_tokens=int(lengths.sum()), batch_size=b, seq_len=SEQ, world_size=w,
                         drop_last=mode == "drop")
    spans, n = [], stream.num_batches(0, prior)
    for r in range(w):
        plan = plan_seqpack(np.arange(lengths.size), lengths, batch_size=b, seq_len=SEQ, world_size=w, rank=r,
                            drop_last=mode == "drop", start_token=stream.start(prior))
        assert plan.num_batches == n  # the stream's count is the plan's, on every rank
        for i in range(n if steps is None else steps):
            pieces = plan.batch(i)
            spans.append((pieces.start, pieces.start + pieces.num_valid))
    return spans, n


def _covered(spans: list[tuple[int, int]]) -> Counter:
    return Counter(t for a, e in spans for t in range(a, e))


@settings(max_examples=120, deadline=None, database=None)
@given(lengths=st.lists(st.integers(0, 30), min_size=1, max_size=40),
       shapes=st.lists(token_shape, min_size=2, max_size=4), cuts=st.lists(st.floats(0, 1), min_size=3, max_size=3))
def test_seq_len_rest_of_the_epoch_is_the_unconsumed_tokens_once(lengths, shapes, cuts) -> None:
    lens = np.array(lengths, dtype=np.int64)
    total = int(lens.sum())
    prior: tuple[Stage, ...] = ()
    consumed: list[tuple[int, int]] = []
    for (w, b, mode), cut in zip(shapes[:-1], cuts):
        _, n = _token_steps(lens, (w, b, mode), prior, 0)
        k = int(round(cut * n))
        spans, _ = _token_steps(lens, (w, b, mode), prior, k)
        consumed += spans
        prior += (Stage(w, b, mode, k),)
    rest, _ = _token_steps(lens, shapes[-1], prior, None)
    seen = _covered(consumed + rest)
    assert max(seen.values(), default=1) == 1  # nothing twice
    stream = TokenStream(total_tokens=total, batch_size=shapes[-1][1], seq_len=SEQ, world_size=shapes[-1][0],
                         drop_last=shapes[-1][2] == "drop")
    assert set(_covered(consumed)) == set(range(stream.start(prior)))  # consumed: a prefix of the stream
    if shapes[-1][2] == "pad":
        assert set(seen) == set(range(total))  # every token of the epoch exactly once
    else:  # only full windows of the last shape: a tail shorter than one window is left
        assert total - len(seen) < shapes[-1][0] * shapes[-1][1] * SEQ
    stream.check_stages(0, prior)  # what was consumed fits
    state = stream.state(0, 0, prior)
    stream.check_state({**state, "epoch": 0, "stages": [[s.world_size, s.batch_size, s.mode, s.batches]
                                                        for s in prior]})


def test_token_stream_refuses_stages_past_their_end() -> None:
    s = TokenStream(total_tokens=100, batch_size=2, seq_len=10, world_size=1, drop_last=False)
    s.check_stages(0, (Stage(2, 1, "pad", 5),))  # 5 windows of 20 tokens: the whole stream
    with pytest.raises(StateError, match=r"stage 1 \(1 ranks, 2 rows, pad\) consumed 1 batches of 0"):
        s.check_stages(0, (Stage(2, 1, "pad", 5), Stage(1, 2, "pad", 1)))
    with pytest.raises(StateError, match="tokens=7 does not match its stages"):
        s.check_state({"seq_len": 10, "tokens": 7, "epoch": 0, "stages": [[2, 1, "pad", 2]]})


LENGTHS = np.random.default_rng(5).integers(1, 200, size=97)


def _sampler(kind: str, world: int, rank: int) -> object:
    if kind == "bucket":
        return DistributedLengthBucketSampler(LENGTHS, batch_size=3, num_replicas=world, rank=rank, seed=9,
                                              jitter=0.03)
    return DistributedTokenBudgetSampler(LENGTHS, max_cost=900, num_replicas=world, rank=rank, seed=9, jitter=0.03)


@pytest.mark.parametrize("kind", ["bucket", "budget"])
@pytest.mark.parametrize("old,new,cut", [(2, 1, 0.5), (1, 3, 0.3), (4, 2, 0.0), (3, 5, 0.7), (2, 2, 1.0)])
def test_batch_sampler_rest_after_a_resize_is_the_unconsumed_samples(kind: str, old: int, new: int,
                                                                     cut: float) -> None:
    epoch = 2
    olds = [sampler_plan(_sampler(kind, old, r), epoch) for r in range(old)]
    steps = olds[0].num_batches
    assert {p.num_batches for p in olds} == {steps}
    k = int(round(cut * steps))
    consumed = Counter(int(i) for p in olds for b in range(k) for i in p.batch(b).ids)
    whole = Counter(int(i) for p in olds for b in range(steps) for i in p.batch(b).ids)
    prior = (Stage(old, 3, "pad", k),)
    samplers = [_sampler(kind, new, r) for r in range(new)]
    rests = [sampler_plan(s, epoch, prior) for s in samplers]
    assert len({p.num_batches for p in rests}) == 1  # equal steps on the new ranks
    assert {SamplerStream(s).num_batches(epoch, prior) for s in samplers} == {rests[0].num_batches}
    rest = Counter(int(i) for p in rests for b in range(p.num_batches) for i in p.batch(b).ids)
    left = whole - consumed
    extra, lost = rest - left, left - rest
    assert not lost  # every unconsumed sample delivered
    # the remainder policy at the new size repeats at most new - 1 samples
    assert sum(extra.values()) <= new - 1
    SamplerStream(samplers[0]).check_stages(epoch, prior + (Stage(new, 3, "pad", rests[0].num_batches),))
    with pytest.raises(StateError, match="consumed"):
        SamplerStream(samplers[0]).check_stages(epoch, (Stage(old, 3, "pad", steps + 1),))
