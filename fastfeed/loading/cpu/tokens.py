"""Token data in ``loader()``: packed rows (``seq_len=``) and the settings of padded batches.

``fastfeed.loader(DST, batch_size=B, seq_len=L)`` over a dataset with a tokens field
(``pack --tokenizer ... --tokenize FIELD`` stores ``tokens.npy`` and exact token counts
in ``lengths.npy``) runs :class:`TokenBatches`: the epoch's documents, in the global
plan order (:func:`fastfeed.loading.order.epoch.epoch_order`), laid end to end and cut into
rows of exactly ``L`` tokens (:mod:`fastfeed.loading.order.seqpack`). Batch ``i`` holds
``input_ids`` and ``position_ids`` int64 ``(B, L)``, ``valid`` bool ``(B, L)`` (the loss
mask: False on the padding of the last window), ``cu_seqlens`` int32 (flat segment
boundaries over the ``B * L`` tokens, as varlen attention kernels take them),
``max_seqlen`` and ``__key__`` (per row, the keys of the documents it touches).

Guarantees, from the plan: every rank has the same number of steps; with
``drop_last=False`` every token of the epoch is delivered exactly once over all ranks
and steps (the last window padded), with ``drop_last=True`` only full windows are; batch
``b`` is built by worker ``(b - start) % num_workers`` and depends on nothing but the plan,
so the stream does not depend on ``num_workers``. The resume state adds two integers
(:class:`TokenStream`): ``seq_len`` and ``tokens``, the stream offset consumed. It
resumes at any world size and batch size (elastic resume): the consumed tokens are a
prefix of the epoch's stream, so the rest is the stream from that offset, cut into rows
at the new shape (every not-yet-delivered token once, with ``drop_last=False``); later
epochs are a fresh run's at the new shape.

Without ``seq_len``, :func:`padding_of` gives the decoders their
:class:`~fastfeed.decode.collate.Padding` and the tokens field, delivered as a padded
``input_ids`` with an ``attention_mask``; ``pad_id`` defaults to the pad id pack stored
(``index.tokenizer["pad_id"]``), else 0.

Example:
    >>> dl = fastfeed.loader("/data/wiki-ff", batch_size=8, seq_len=2048)     # doctest: +SKIP
    >>> b = next(iter(dl)); b["input_ids"].shape, b["cu_seqlens"].dtype       # doctest: +SKIP
    (torch.Size([8, 2048]), torch.int32)
"""

from __future__ import annotations

import time
from typing import Any, Mapping

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from fastfeed.decode.collate import Padding, one_storage
from fastfeed.decode.fields import decode_field
from fastfeed.errors import ConfigError, SampleError, StateError
from fastfeed.loading.cpu.dataset import SKIPPED_KEY, TIMING_KEY
from fastfeed.loading.order.elastic import ElasticState, Stage
from fastfeed.loading.options import LoaderOptions
from fastfeed.loading.order.epoch import epoch_order, worker_batches
from fastfeed.loading.order.position import Position, SharedPosition
from fastfeed.loading.order.seqpack import BatchPieces, SeqPackPlan, assemble, plan_seqpack
from fastfeed.packed.index import DatasetIndex
from fastfeed.packed.reader import ShardSource, sample_error

__all__ = ["TOKEN_FIELDS", "TokenBatches", "TokenStream", "padding_of", "stored_pad_id", "tokens_field"]

#: Field names taken as token ids when the index names none (``tokens.npy`` is what pack writes).
TOKEN_FIELDS = ("tokens.npy", "tokens")


def _where(index: DatasetIndex) -> str:
    return index.root or index.input or "the dataset"


def stored_pad_id(index: DatasetIndex) -> int | None:
    """The pad id ``pack --tokenizer`` recorded in the index, or None.

    Example:
        >>> stored_pad_id(DatasetIndex.load("/data/wiki-ff"))      # doctest: +SKIP
        0
    """
    tok = getattr(index, "tokenizer", None)
    pad = tok.get("pad_id") if isinstance(tok, Mapping) else getattr(tok, "pad_id", None)
    return int(pad) if isinstance(pad, (int, np.integer)) and not isinstance(pad, bool) and pad >= 0 else None


def tokens_field(index: DatasetIndex) -> str | None:
    """The field holding token ids: the one the index's tokenizer names, else ``tokens.npy`` /
    ``tokens`` when the dataset has it, else None."""
    tok = getattr(index, "tokenizer", None)
    named = tok.get("tokens") if isinstance(tok, Mapping) else getattr(tok, "tokens", None)
    if isinstance(named, str) and named:
        return named
    return next((f for f in TOKEN_FIELDS if f in index.fields), None)


def padding_of(index: DatasetIndex, options: LoaderOptions) -> tuple[Padding, str | None]:
    """The decoders' padding (``pad_id`` resolved against the index) and the tokens field."""
    pad_id = options.tokens.pad_id if options.tokens.pad_id is not None else (stored_pad_id(index) or 0)
    return Padding(pad_id=pad_id, pad_multiple=options.tokens.pad_multiple), tokens_field(index)


def _checked_lengths(index: DatasetIndex, field: str | None) -> np.ndarray:
    fix = "pack it with `fastfeed pack SRC DST --tokenizer tokenizer.json --tokenize FIELD`"
    if field is None:
        fields = ", ".join(index.fields) or "none"
        raise ConfigError(f"{_where(index)}: seq_len= packs token ids, but the dataset has no tokens field "
                          f"(fields: {fields}); {fix}, or drop seq_len=")
    if index.lengths is None:
        raise ConfigError(f"{_where(index)}: seq_len= needs the token count of every document (lengths.npy), "
                          f"and the dataset has none; {fix} (it records them)")
    return np.asarray(index.lengths, dtype=np.int64)


class TokenStream:
    """The cursor's view of a ``seq_len`` loader (a :class:`~fastfeed.loading.order.cursor.BatchStream`):
    the batches of an epoch or of its rest, and the token offset in the state.

    Elastic resume: the consumed tokens of an epoch are always a prefix of its token
    stream (which depends on the seed and epoch, not on the world shape), so after stages
    ``prior`` (world size, rows, mode, steps each) the offset is
    ``sum(steps * world_size * rows * seq_len)`` (capped at the stream's end) and the rest
    of the epoch is the stream from there, cut at the current shape.

    Example:
        >>> s = TokenStream(total_tokens=100, batch_size=2, seq_len=8, world_size=2, drop_last=False)
        >>> s.num_batches(0), s.state(0, 2)
        (4, {'seq_len': 8, 'tokens': 64})
        >>> s.num_batches(0, (Stage(1, 1, "pad", 5),)), s.state(0, 1, (Stage(1, 1, "pad", 5),))
        (2, {'seq_len': 8, 'tokens': 72})
    """

    def __init__(self, *, total_tokens: int, batch_size: int, seq_len: int, world_size: int,
                 drop_last: bool) -> None:
        self.total, self.seq_len = int(total_tokens), int(seq_len)
        self.stage = Stage(int(world_size), int(batch_size), "drop" if drop_last else "pad")
        self.window = world_size * batch_size * seq_len
        self._batches = self._count(self.total, self.stage)

    def _count(self, left: int, stage: Stage) -> int:
        window = stage.world_size * stage.batch_size * self.seq_len
        return left // window if stage.mode == "drop" else -(-left // window)

    def num_batches(self, epoch: int, prior: tuple[Stage, ...] = ()) -> int:
        if not prior:
            return self._batches
        return self._count(self.total - self.start(prior), self.stage)

    def start(self, prior: tuple[Stage, ...]) -> int:
        """The stream offset the stages ``prior`` consumed (the rest of the epoch starts there)."""
        offset = 0
        for st in prior:
            offset = min(self.total, offset + st.batches * st.world_size * st.batch_size * self.seq_len)
        return offset

    def offset(self, batches: int, prior: tuple[Stage, ...] = ()) -> int:
        """The stream offset consumed after ``prior`` and ``batches`` steps on every rank."""
        return min(self.total, self.start(prior) + batches * self.window)

    def state(self, epoch: int, batches: int, prior: tuple[Stage, ...] = ()) -> dict[str, Any]:
        return {"seq_len": self.seq_len, "tokens": self.offset(batches, prior)}

    def check_state(self, state: Mapping[str, Any]) -> None:
        if state.get("seq_len") != self.seq_len:
            raise StateError(f"loader state saved with seq_len={state.get('seq_len')!r}, now {self.seq_len}; "
                             "resume with the same seq_len (the rows depend on it)")
        batches, world, rows = state.get("batches"), state.get("world_size"), state.get("batch_size")
        if "stages" in state:
            stages = ElasticState.from_dict({"epoch": state.get("epoch"), "stages": state["stages"]}).stages
            expected = self.start(stages)
        elif all(isinstance(v, int) for v in (batches, world, rows)):  # version 1: at the state's own shape
            expected = min(self.total, batches * world * rows * self.seq_len)
        else:
            return
        if state.get("tokens") != expected:
            raise StateError(f"loader state: tokens={state.get('tokens')!r} does not match its stages "
                             f"(expected {expected}); pass the dict from Loader.state_dict()")

    def check_stages(self, epoch: int, stages: tuple[Stage, ...]) -> None:
        for i, st in enumerate(stages):
            n = self._count(self.total - self.start(stages[:i]), st)
            if st.batches > n:
                raise StateError(f"loader state: stage {i} ({st.world_size} ranks, {st.batch_size} rows, {st.mode}) "
                                 f"consumed {st.batches} batches of {n}; pass the dict from Loader.state_dict()")


class TokenBatches(IterableDataset):
    """Packed rows of one rank for ``DataLoader(batch_size=None)`` (see the module docstring).

    Built by :func:`from_options`; ``loader()`` wraps it in a
    :class:`~fastfeed.loading.api.Loader` with its :class:`TokenStream`.
    """

    def __init__(self, source: ShardSource, *, field: str, lengths: np.ndarray, batch_size: int,
                 seq_len: int, seed: int, shuffle: bool, drop_last: bool, rank: int, world_size: int,
                 shuffle_block: int, pad_id: int) -> None:
        self.source, self.field, self.lengths = source, field, lengths
        self.sources = [source]  # what a Loader reads its indexes from (one dataset)
        self.batch_size, self.seq_len, self.seed, self.shuffle = batch_size, seq_len, seed, shuffle
        self.drop_last, self.rank, self.world_size = drop_last, rank, world_size
        self.shuffle_block, self.pad_id = shuffle_block, pad_id  # shuffle_block: part of the state only
        self.stream = TokenStream(total_tokens=int(lengths.sum()), batch_size=batch_size, seq_len=seq_len,
                                  world_size=world_size, drop_last=drop_last)
        self.pool = None  # token batches are fresh arrays; no buffer pool
        self._position = SharedPosition()
        self._plan: SeqPackPlan | None = None
        self._plan_key: tuple[int, tuple[Stage, ...]] | None = None

    @classmethod
    def from_options(cls, source: ShardSource, o: LoaderOptions) -> "TokenBatches":
        """The dataset of ``loader(seq_len=...)`` over ``source`` (checks that the index has token data)."""
        index = source.index
        field = tokens_field(index)
        lengths = _checked_lengths(index, field)
        ds = cls(source, field=field, lengths=lengths, batch_size=o.batch_size,  # type: ignore[arg-type]
                 seq_len=o.seq_len, seed=o.seed, shuffle=o.shuffle, drop_last=o.drop_last,  # type: ignore[arg-type]
                 rank=o.rank, world_size=o.world_size, shuffle_block=o.order.shuffle_block,
                 pad_id=o.tokens.pad_id if o.tokens.pad_id is not None else (stored_pad_id(index) or 0))
        if ds.stream.num_batches(0) == 0:
            raise ConfigError(
                f"{_where(index)}: {ds.stream.total} tokens cannot fill one window of world_size={o.world_size} "
                f"x batch_size={o.batch_size} x seq_len={o.seq_len} with drop_last=True; lower batch_size or "
                "seq_len, or pass drop_last=False (the last window is padded)")
        return ds

    def __len__(self) -> int:
        return self.stream.num_batches(0)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_plan"], state["_plan_key"] = None, None  # workers compute their own
        return state

    def set_position(self, pos: Position) -> None:
        """Make the next pass run ``pos.epoch`` starting at batch ``pos.start`` (all workers)."""
        self._position.set(pos)

    def plan(self, epoch: int, prior: tuple[Stage, ...] = ()) -> SeqPackPlan:
        """This rank's packing plan for ``epoch``, or for its rest after the stages ``prior``
        (an elastic resume: the stream from :meth:`TokenStream.start`); cached for the last asked."""
        if self._plan is None or self._plan_key != (epoch, prior):
            order = epoch_order(self.source.index.shard_counts, seed=self.seed, epoch=epoch, shuffle=self.shuffle)
            self._plan = plan_seqpack(order, self.lengths[order], batch_size=self.batch_size, seq_len=self.seq_len,
                                      world_size=self.world_size, rank=self.rank, drop_last=self.drop_last,
                                      start_token=self.stream.start(prior))
            self._plan_key = (epoch, prior)
        return self._plan

    def __iter__(self):  # type: ignore[no-untyped-def]
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 0)
        pos = self._position.get()
        epoch, start = pos.epoch, pos.start
        plan = self.plan(epoch, pos.prior)
        mine = worker_batches(plan.num_batches, start=start, num_workers=workers, worker=worker)
        for i, b in enumerate(mine):
            if i + 1 < len(mine):  # the next batch's reads start while this one is assembled
                self.source.will_need(plan.batch(mine[i + 1]).doc_ids())
            yield self.make_batch(plan.batch(b))

    def make_batch(self, pieces: BatchPieces) -> dict[str, Any]:
        """Read the documents of ``pieces`` and assemble the batch (tensors)."""
        t0, cpu0 = time.perf_counter(), time.process_time()
        ids = np.sort(pieces.doc_ids())  # read in file order
        src = self.source
        shards, locs = src.locate(ids)
        tokens: dict[int, np.ndarray] = {}
        keys: dict[int, str] = {}
        reader, at = None, -1  # the open reader of shard ``at`` (documents come in file order)
        for doc, s, (off, size) in zip(ids.tolist(), shards.tolist(), locs.tolist()):
            key = ""
            try:
                if s != at:
                    reader, at = src.reader(s), s
                sample = reader.read(off, size)
                key = str(sample.get("__key__", ""))
                tokens[doc], keys[doc] = self._tokens(sample), key
            except (SampleError, OSError, ValueError) as e:
                if isinstance(e, ConfigError):
                    raise
                raise sample_error(src, s, off, key, e) from None
        t1 = time.perf_counter()
        arrays = assemble(pieces, tokens, keys=keys, pad_id=self.pad_id)
        batch: dict[str, Any] = {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v
                                 for k, v in arrays.items()}
        batch = one_storage(batch)  # in a worker: one storage to send, not four
        batch[SKIPPED_KEY] = []
        batch[TIMING_KEY] = (t1 - t0, time.perf_counter() - t1, time.process_time() - cpu0)
        return batch

    def _tokens(self, sample: Mapping[str, Any]) -> np.ndarray:
        raw = sample.get(self.field)
        if raw is None:
            raise SampleError(f"no field {self.field!r} (the token ids) in this document")
        arr = decode_field(self.field, raw) if isinstance(raw, (bytes, bytearray, memoryview)) else raw
        arr = np.asarray(arr)
        if arr.ndim != 1 or arr.dtype.kind not in "iu":
            raise SampleError(f"field {self.field!r} holds {arr.dtype} of shape {arr.shape}, not 1-D token ids")
        return arr
