"""The samples of one shard as the writer consumes them: table rows, token ids, lengths.

:func:`~fastfeed.packing.write.write_shard` writes a stream of :class:`Item` s. A folder or
JSONL source makes them from its planned samples (:mod:`fastfeed.packing.write`); a table
source from its rows, here (:func:`table_items`: the units of the shard, streamed in record
batches). With a tokenizer, :func:`with_tokens` tokenizes the stream in chunks of
:data:`TOKENIZE_CHUNK` samples (one ``encode_batch`` each, bounded memory), adds the
``tokens.npy`` field (``--tokenize``) and sets every item's length to its token count.
Bad input (a bad row, a sample without the text field) follows ``on_error``: raised, or
appended to the shard's ``skipped`` list.

Example:
    >>> length_of_value([1, 2, 3]), length_of_value("a b"), length_of_value(7.0)
    (3, 2, 7)
"""

from __future__ import annotations

import io
import json
from typing import Any, Iterator, NamedTuple

import numpy as np

from fastfeed.errors import SourceError
from fastfeed.packing.sources.parquet import iter_unit
from fastfeed.packing.plan import PackPlan, ShardPlan
from fastfeed.packing.sources.base import parse_length, show
from fastfeed.packing.content.tables import TokenPlan
from fastfeed.packing.content.tokenize import tokenize_samples

__all__ = ["LENGTH_TEXT_EXTS", "TOKENIZE_CHUNK", "Item", "field_length", "length_of_value", "table_items", "with_tokens"]

#: Samples tokenized per ``encode_batch`` call.
TOKENIZE_CHUNK = 512
#: Field extensions whose ``--length`` is the whitespace-token count of the text.
LENGTH_TEXT_EXTS = frozenset({"txt", "text", "transcript", "md", "csv", "tsv"})


class Item(NamedTuple):
    """One sample ready to write: key, fields, label, length (or None), source files and bytes read."""

    key: str
    fields: dict[str, bytes]
    label: int
    length: int | None
    files: int
    nbytes: int


def length_of_value(value: Any) -> int:
    """Numbers as they are (integral), texts as their whitespace-token count, lists by size."""
    if isinstance(value, bool):
        raise TypeError("a boolean is not a length")
    if isinstance(value, float):
        if not value.is_integer():
            raise ValueError(f"{value} is not an integer (store integer lengths, e.g. milliseconds)")
        value = int(value)
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"{value} is negative")
        return value
    if isinstance(value, str):
        return len(value.split())
    if isinstance(value, list):
        return len(value)
    raise TypeError(f"a {type(value).__name__} is not a length")


def field_length(fields: dict[str, bytes], spec: str) -> int:
    """``--length spec`` of a table row: its field ``FIELD`` (or ``FIELD.<ext>``), read by extension.

    Raises:
        KeyError: no such field; ValueError/TypeError: no usable length there.

    Example:
        >>> field_length({"n.json": b"12", "caption.txt": b"a cat sat"}, "n"), field_length({"caption.txt": b"a b"}, "caption")
        (12, 2)
    """
    name, sub = parse_length(spec)
    low = name.lower()
    found = [f for f in fields if f.lower() == low] or [f for f in fields if f.lower().startswith(low + ".")]
    if not found:
        raise KeyError(f"no field {name!r} (fields: {', '.join(sorted(fields))})")
    field = found[0]
    data = fields[field]
    ext = field.rpartition(".")[2].lower()
    if ext == "npy":
        return int(np.load(io.BytesIO(data), allow_pickle=False).shape[0])
    if sub is not None or ext in ("json", "jsn"):
        value = json.loads(data)
        return length_of_value(value[sub] if sub is not None else value)
    text = data.decode("utf-8")
    if ext in LENGTH_TEXT_EXTS:
        return len(text.split())
    return length_of_value(int(text.strip()))


def table_items(plan: PackPlan, shard: ShardPlan, skipped: list[dict[str, str]]) -> Iterator[Item]:
    """The rows of a table shard as items, in row order (bad rows raised or appended to ``skipped``)."""
    src = plan.table
    if src is None:  # pragma: no cover - write_shard calls it for table plans only
        raise TypeError(f"{shard.name}: table_items needs a plan of a table source")
    on_error = plan.options.on_error
    spec = plan.options.length if plan.tokens is None else None
    for i in shard.units:
        unit = src.units[i]
        first = True
        for s in iter_unit(src, unit, on_error=on_error, skipped=skipped):
            length = None
            if spec:
                try:
                    length = field_length(s.fields, spec)
                except (KeyError, ValueError, TypeError, IndexError, UnicodeDecodeError) as e:
                    msg = (f"{show(plan.src)}: --length {spec}: row {show(s.key)!r} has no usable length "
                           f"({type(e).__name__}: {e})")
                    if on_error == "raise":
                        raise SourceError(f"{msg}; store a non-negative integer, a text or a list there, "
                                          "or pass --on-error skip") from None
                    skipped.append({"path": show(plan.src), "key": show(s.key), "reason": msg})
                    continue
            # progress counts rows as files and the unit's (uncompressed) bytes when it is read
            yield Item(s.key, s.fields, s.label, length, 1, unit.nbytes if first else 0)
            first = False


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

