"""Tokenizing the stream of a shard's samples (``--tokenizer``), for :mod:`fastfeed.packing.write`.

:func:`~fastfeed.packing.write.write_shard` writes a stream of
:class:`~fastfeed.packing.sources.base.Item` s, read by the plan's source
(:func:`fastfeed.packing.load.shard_items`). With a tokenizer, :func:`with_tokens` tokenizes the
stream in chunks of :data:`TOKENIZE_CHUNK` samples (one ``encode_batch`` each, bounded memory),
adds the ``tokens.npy`` field (``--tokenize``) and sets every item's length to its token count.
A sample without the text field follows ``on_error``: raised, or appended to the shard's
``skipped`` list.

Example:
    >>> items = [Item("a", {"txt": b"hi"}, -1, None, 1, 2)]
    >>> list(with_tokens(plan, plan.shards[0], iter(items), []))   # doctest: +SKIP
    [Item(key='a', fields={'txt': b'hi', 'tokens.npy': b'...'}, label=-1, length=1, files=1, nbytes=2)]
"""

from __future__ import annotations

from typing import Iterator

from fastfeed.packing.content.tokenize import tokenize_samples
from fastfeed.packing.content.tokens import TokenPlan
from fastfeed.packing.plan import PackPlan, ShardPlan
from fastfeed.packing.sources.base import Item, show

__all__ = ["TOKENIZE_CHUNK", "with_tokens"]

#: Samples tokenized per ``encode_batch`` call.
TOKENIZE_CHUNK = 512


def with_tokens(plan: PackPlan, shard: ShardPlan, items: Iterator[Item],
                skipped: list[dict[str, str]]) -> Iterator[Item]:
    """``items`` tokenized in chunks: length = token count; with ``--tokenize`` the ids added."""
    tp = plan.tokens
    if tp is None:
        yield from items
        return
    where = f"{show(plan.src)} (shard {shard.name})"
    chunk: list[Item] = []
    for item in items:
        chunk.append(item)
        if len(chunk) >= TOKENIZE_CHUNK:
            yield from _tokenize_chunk(plan, tp, chunk, where, skipped)
            chunk = []
    if chunk:
        yield from _tokenize_chunk(plan, tp, chunk, where, skipped)


def _tokenize_chunk(plan: PackPlan, tp: TokenPlan, chunk: list[Item], where: str,
                    skipped: list[dict[str, str]]) -> Iterator[Item]:
    out = tokenize_samples(tp.tokenizer, [(it.key, it.fields) for it in chunk], tp.field, store=tp.store,
                           on_error=plan.options.on_error, where=where)
    skipped.extend(out.skipped)
    for j, i in enumerate(out.keep):
        item = chunk[i]
        yield item._replace(fields={**item.fields, **out.fields[j]}, length=int(out.lengths[j]))

