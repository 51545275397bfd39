"""Sequence packing: the epoch's documents laid end to end into rows of exactly ``seq_len`` tokens.

Pure numpy, a function of ``(document ids and token lengths in plan order, batch_size B,
seq_len L, world_size, rank, drop_last, start_token)`` only, so a batch never depends
on ``num_workers`` and resuming needs one integer.

How an epoch is laid out:

1. **One token stream.** The documents, in the epoch's global plan order (the order of
   :func:`~fastfeed.loading.order.epoch.epoch_order`), are concatenated; their lengths come
   from ``lengths.npy`` (``pack --tokenize``: exact token counts). Documents of length 0
   take no room.
2. **Windows.** Step ``s`` consumes the window of ``world_size * B * L`` tokens that
   starts at ``start_token + s * world_size * B * L``; rank ``r`` takes block ``r`` of
   it (``B * L`` tokens), laid row by row into a ``(B, L)`` batch. A document crossing
   a row (or block) end continues in the next row (block); its ``position_ids`` keep
   counting from where it stopped (``positions="document"``, the default) or restart at
   0 in every row (``positions="row"``).
3. **Every token once, equal steps.** ``drop_last=True``: only full windows, so every
   rank has ``(T - start_token) // (world_size * B * L)`` steps and the tail (fewer than
   one window of tokens) is not delivered this epoch. ``drop_last=False``: the last
   window is padded (``pad_id``, ``valid`` False, a rank past the end gets an all-padding
   batch), so every token is delivered exactly once over all ranks and steps.
4. **Resume.** After ``k`` steps on every rank the stream is consumed up to
   :meth:`SeqPackPlan.token_offset` ``(k)``; a plan built with that ``start_token``
   continues exactly where the old one stopped, for any world size (the consumed tokens
   are always a prefix of the stream).

:meth:`SeqPackPlan.batch` (the planner) says which token ranges of which documents make
batch ``i``; :func:`assemble` turns those documents' token arrays into the batch dict:
``input_ids`` and ``position_ids`` ``(B, L)`` int64, ``valid`` ``(B, L)`` bool (the loss
mask), ``cu_seqlens`` int32 (the flat segment boundaries over the ``B * L`` tokens, cut at
every document start and every row start, as flash-attention varlen kernels take them),
``max_seqlen`` and ``__key__`` (per row, the keys of the documents it touches).

Example:
    >>> plan = plan_seqpack([10, 11, 12], [3, 5, 2], batch_size=2, seq_len=3, world_size=1, rank=0,
    ...                     drop_last=False)
    >>> plan.num_batches, plan.batch(0).doc.tolist(), plan.batch(0).begin.tolist()
    (2, [10, 11], [0, 0])
    >>> toks = {10: np.array([1, 2, 3]), 11: np.array([4, 5, 6, 7, 8]), 12: np.array([9, 9])}
    >>> b = assemble(plan.batch(1), toks)
    >>> b["input_ids"].tolist(), b["position_ids"].tolist(), b["valid"].sum()
    ([[7, 8, 9], [9, 0, 0]], [[3, 4, 0], [1, 0, 0]], np.int64(4))
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from fastfeed.errors import ConfigError, SampleError

__all__ = ["BatchPieces", "SeqPackPlan", "assemble", "plan_seqpack"]

POSITIONS = ("document", "row")


@dataclass(frozen=True)
class BatchPieces:
    """One batch as planned: its pieces (a token range of one document inside one row), in
    stream order.

    Attributes:
        index: the batch number on this rank.
        batch_size, seq_len: the batch shape ``(B, L)``.
        start: the stream offset of the batch's first token.
        num_valid: real tokens; the last ``B * L - num_valid`` are padding.
        row: per piece, the row it lies in.
        col: per piece, the column of its first token.
        pos: per piece, the document's position in the plan order.
        doc: per piece, the document id (the sample id of the index).
        begin, end: per piece, the token range ``[begin, end)`` inside the document.
        doc_len: per piece, the document's planned length (``lengths.npy``).
    """

    index: int
    batch_size: int
    seq_len: int
    start: int
    num_valid: int
    row: np.ndarray
    col: np.ndarray
    pos: np.ndarray
    doc: np.ndarray
    begin: np.ndarray
    end: np.ndarray
    doc_len: np.ndarray

    def doc_ids(self) -> np.ndarray:
        """The distinct documents the batch reads, in first-use order."""
        _, first = np.unique(self.doc, return_index=True)
        return self.doc[np.sort(first)]


@dataclass(frozen=True)
class SeqPackPlan:
    """The sequence-packing plan of one rank for one epoch (see the module docstring)."""

    docs: np.ndarray
    lengths: np.ndarray
    offsets: np.ndarray
    batch_size: int
    seq_len: int
    world_size: int
    rank: int
    drop_last: bool
    start_token: int

    @property
    def total_tokens(self) -> int:
        """Tokens in the whole stream (all documents)."""
        return int(self.offsets[-1])

    @property
    def window(self) -> int:
        """Tokens one step consumes over all ranks: ``world_size * batch_size * seq_len``."""
        return self.world_size * self.batch_size * self.seq_len

    @property
    def num_batches(self) -> int:
        """Batches of this rank (the same on every rank)."""
        left = self.total_tokens - self.start_token
        return left // self.window if self.drop_last else -(-left // self.window)

    def token_offset(self, steps: int) -> int:
        """The stream offset after ``steps`` steps on every rank: ``start_token`` to resume from."""
        if not 0 <= steps <= self.num_batches:
            raise ConfigError(f"steps={steps}: the plan has {self.num_batches} batches")
        return min(self.total_tokens, self.start_token + steps * self.window)

    def batch(self, i: int) -> BatchPieces:
        """Which token ranges of which documents make batch ``i`` of this rank."""
        if not 0 <= i < self.num_batches:
            raise ConfigError(f"batch {i}: the plan has {self.num_batches} batches (0..{self.num_batches - 1})")
        size = self.batch_size * self.seq_len
        a = self.start_token + (i * self.world_size + self.rank) * size
        e = min(a + size, self.total_tokens)
        if e <= a:
            empty = np.zeros(0, np.int64)
            return BatchPieces(i, self.batch_size, self.seq_len, a, 0, *([empty] * 7))
        lo = np.searchsorted(self.offsets, a, side="right")
        hi = np.searchsorted(self.offsets, e, side="left")
        cuts = np.unique(np.concatenate([[a, e], self.offsets[lo:hi], np.arange(a + self.seq_len, e, self.seq_len)]))
        starts, stops = cuts[:-1], cuts[1:]
        pos = np.searchsorted(self.offsets, starts, side="right") - 1
        flat = starts - a
        return BatchPieces(
            i, self.batch_size, self.seq_len, int(a), int(e - a), flat // self.seq_len, flat % self.seq_len,
            pos, self.docs[pos], starts - self.offsets[pos], stops - self.offsets[pos], self.lengths[pos],
        )


def _int_array(values: Sequence[int] | np.ndarray, what: str) -> np.ndarray:
    arr = np.asarray(values)
    if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
        raise ConfigError(f"{what}: a 1-D sequence of integers, got shape {arr.shape} dtype {arr.dtype}")
    return arr.astype(np.int64, copy=False)


def plan_seqpack(docs: Sequence[int] | np.ndarray, lengths: Sequence[int] | np.ndarray, *,
                 batch_size: int, seq_len: int, world_size: int = 1, rank: int = 0,
                 drop_last: bool = True, start_token: int = 0) -> SeqPackPlan:
    """Plan sequence packing for ``rank`` over the epoch's documents.

    Args:
        docs: the document (sample) ids in the epoch's global plan order, the same on every rank.
        lengths: their token lengths (``index.lengths[docs]``).
        batch_size, seq_len: rows per batch and tokens per row.
        world_size, rank: the world shape.
        drop_last: only full windows (True), or pad the last one (False).
        start_token: the stream offset to start at (resume: :meth:`SeqPackPlan.token_offset`).

    Raises:
        ConfigError: a size below 1, a rank outside the world, negative lengths, or a
            ``start_token`` outside ``[0, total tokens]``.
    """
    docs_a, lens = _int_array(docs, "docs"), _int_array(lengths, "lengths")
    if docs_a.shape != lens.shape:
        raise ConfigError(f"docs ({docs_a.size}) and lengths ({lens.size}) must have one entry per document")
    if lens.size and lens.min() < 0:
        bad = int(np.argmax(lens < 0))
        raise ConfigError(f"lengths: document {int(docs_a[bad])} has length {int(lens[bad])}; lengths are >= 0")
    for name, v in (("batch_size", batch_size), ("seq_len", seq_len), ("world_size", world_size)):
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1:
            raise ConfigError(f"{name}={v!r}: must be an integer >= 1")
    if not 0 <= rank < world_size:
        raise ConfigError(f"rank={rank}: must be in 0..{world_size - 1} (world_size={world_size})")
    offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    if not 0 <= start_token <= offsets[-1]:
        raise ConfigError(f"start_token={start_token}: the stream has {int(offsets[-1])} tokens")
    return SeqPackPlan(docs_a, lens, offsets, int(batch_size), int(seq_len), int(world_size), int(rank),
                       bool(drop_last), int(start_token))


def _tokens_of(tokens: Mapping[int, Any] | Callable[[int], Any], doc: int) -> np.ndarray:
    arr = tokens(doc) if callable(tokens) else tokens[doc]
    return arr if type(arr) is np.ndarray and arr.ndim == 1 else np.asarray(arr).reshape(-1)


def assemble(pieces: BatchPieces, tokens: Mapping[int, Any] | Callable[[int], Any], *,
             keys: Mapping[int, str] | Callable[[int], str] | None = None, pad_id: int = 0,
             positions: str = "document") -> dict[str, Any]:
    """The batch dict of planned ``pieces`` from the token arrays of their documents.

    Args:
        pieces: :meth:`SeqPackPlan.batch`.
        tokens: document id -> its token ids (a mapping, or a function); each array must have
            the planned length.
        keys: document id -> sample key for ``__key__`` (default: the id as text).
        pad_id: the value of padding tokens (``input_ids`` where ``valid`` is False).
        positions: ``"document"`` (offset inside the document) or ``"row"`` (restart at 0 in
            every row).

    Raises:
        SampleError: a document's token array does not have the length the plan has for it.
    """
    if positions not in POSITIONS:
        raise ConfigError(f"positions={positions!r}: use 'document' or 'row'")
    B, L = pieces.batch_size, pieces.seq_len
    size = B * L
    ids = np.full(size, pad_id, dtype=np.int64)
    pos_ids = np.zeros(size, dtype=np.int64)
    valid = np.zeros(size, dtype=bool)
    flat = pieces.row * L + pieces.col
    lens = pieces.end - pieces.begin
    arrays: dict[int, np.ndarray] = {}
    parts: list[np.ndarray] = []
    docs, begins, ends, planned = (pieces.doc.tolist(), pieces.begin.tolist(), pieces.end.tolist(),
                                   pieces.doc_len.tolist())
    for k, doc in enumerate(docs):
        arr = arrays.get(doc)
        if arr is None:
            arr = arrays[doc] = _tokens_of(tokens, doc)  # once a document, however many pieces
            if arr.size != planned[k]:
                raise SampleError(f"document {doc}: {arr.size} tokens, but lengths.npy says "
                                  f"{int(planned[k])}; re-pack with --tokenize so both agree", key=str(doc))
        parts.append(arr[begins[k]:ends[k]])
    if parts:
        # pieces lie end to end from column 0 of row 0 (the plan's layout): one copy of all of
        # them, positions by one repeat (each piece's first position, minus where it starts)
        first = pieces.begin if positions == "document" else np.zeros_like(flat)
        ends_at = np.cumsum(lens)
        if flat[0] == 0 and np.array_equal(flat[1:], ends_at[:-1]):
            total = int(ends_at[-1])
            ids[:total] = np.concatenate(parts)
            pos_ids[:total] = np.arange(total) + np.repeat(first - flat, lens)
            valid[:total] = True
        else:  # pieces laid out otherwise (a hand-made BatchPieces): one at a time
            for k, part in enumerate(parts):
                s, n = int(flat[k]), part.size
                ids[s:s + n] = part
                pos_ids[s:s + n] = np.arange(int(first[k]), int(first[k]) + n)
                valid[s:s + n] = True
    # every piece start, row start, the end of the real tokens and the end: ~50 numbers, in
    # Python (np.unique costs more on so few)
    bounds = sorted({*flat.tolist(), *range(0, size, L), pieces.num_valid, size})
    cu = np.array(bounds, dtype=np.int32)
    name = keys if callable(keys) else (keys.__getitem__ if keys is not None else str)
    rows: list[list[str]] = [[] for _ in range(B)]
    for r, d in zip(pieces.row.tolist(), pieces.doc.tolist()):
        rows[r].append(name(d))
    return {
        "input_ids": ids.reshape(B, L),
        "position_ids": pos_ids.reshape(B, L),
        "valid": valid.reshape(B, L),
        "cu_seqlens": cu,
        "max_seqlen": max((b - a for a, b in zip(bounds, bounds[1:])), default=0),
        "__key__": rows,
    }
