"""The planning pieces of ``pack`` for table inputs and for a pack-time tokenizer.

Table inputs (parquet files, HF ``datasets``; :mod:`fastfeed.packing.sources.parquet`) are planned by
units, not by samples: :func:`wants_table` decides whether SRC is one, :func:`split_units`
cuts a unit larger than a shard may be (``samples_per_shard``, ``shard_size``) into row ranges
(free for a HF dataset; a parquet row group is then read once per range, which is logged
once), :func:`table_shards` cuts its units (row groups, row ranges) into shards, and :func:`table_content` is the
content id of the planned output (without ``shuffle`` the rows keep the source's order;
with ``shuffle``, the units are put in a seeded random order before they are cut into
shards, so a shard mixes row groups of different files; the rows of one unit keep
their order, which is what lets a unit stream from its file in bounded memory).

:func:`token_plan` checks ``--tokenizer PATH`` with ``--tokenize FIELD`` / ``--length FIELD``
once, before any shard is written: the field must exist (a column of the table, a field
of the samples) and hold text, and the tokenizer file must load. The result,
a :class:`TokenPlan`, travels in the pack plan to the workers.

Example:
    >>> wants_table("corpus/train-00000.parquet", None)
    True
    >>> wants_table("photos/", "imagefolder")
    False
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass, replace
from typing import Any, Iterable, Mapping

import numpy as np

from fastfeed import __version__
from fastfeed.errors import ConfigError
from fastfeed.packing.sources.columns import TEXT_EXTS
from fastfeed.packing.sources.hf import is_hf_folder, is_hf_object
from fastfeed.packing.sources.parquet import TableSource, Unit, group_units, is_table_source
from fastfeed.packing.sources.base import TABLE_INPUTS, show
from fastfeed.packing.content.tokenize import TOKENS_FIELD, Tokenizer

__all__ = ["TokenPlan", "check_length_column", "check_token_options", "split_units", "table_content", "table_shards",
           "text_field", "token_plan", "wants_table"]

log = logging.getLogger(__name__)


def wants_table(src: Any, input: str | None) -> bool:
    """True when ``src`` (with ``input``: chosen, or None to detect) is read as a table.

    Raises:
        ConfigError: ``input="hf"`` for something that is no ``datasets`` object or
            ``save_to_disk`` folder, or a ``datasets`` object with a file input.
    """
    hf = is_hf_object(src)
    if input == "hf" and not hf and not is_hf_folder(os.fspath(src)):
        raise ConfigError(f"input='hf': {show(os.fspath(src))} is not a folder written by "
                          "Dataset.save_to_disk (no state.json and dataset_info.json); pass that folder, "
                          "or --input parquet for parquet files")
    if input in TABLE_INPUTS:
        return True
    if hf:
        if input is not None:
            raise ConfigError(f"input={input!r}: SRC is a datasets object; leave input out (or pass input='hf')")
        return True
    return input is None and is_table_source(src)


def split_units(src: TableSource, shard_bytes: int, shard_rows: int | None) -> TableSource:
    """``src`` with each unit of more than ``shard_rows`` rows or ``shard_bytes`` (estimated from
    its bytes per row) cut into consecutive row ranges that fit, so the shards can meet both.

    Example:
        >>> src = TableSource("hf", "", (), (), None, (Unit("", -1, 0, 0, 100, 1000),), 100, "fp")
        >>> [(u.file_row, u.num_rows, u.nbytes) for u in split_units(src, 10**9, 40).units]
        [(0, 40, 400), (40, 40, 400), (80, 20, 200)]
    """
    units: list[Unit] = []
    split: list[tuple[Unit, int]] = []
    for u in src.units:
        cap = u.num_rows if shard_rows is None else min(u.num_rows, shard_rows)
        if u.nbytes > shard_bytes:
            cap = min(cap, max(1, shard_bytes * u.num_rows // u.nbytes))
        if cap >= u.num_rows:
            units.append(u)
            continue
        split.append((u, cap))
        for off in range(0, u.num_rows, cap):
            n = min(cap, u.num_rows - off)
            units.append(Unit(u.file, u.row_group, u.file_row + off, u.first_row + off, n, u.nbytes * n // u.num_rows))
    if split and src.kind == "parquet":
        u, cap = split[0]
        log.warning("%s: row group %d has %d rows, more than one shard holds (%d); %d row group(s) larger than a "
                    "shard are each read once per shard they span; write the parquet with smaller row groups "
                    "(row_group_size=) to pack faster", show(os.path.join(src.root, u.file)), u.row_group,
                    u.num_rows, cap, len(split))
    return replace(src, units=tuple(units))


def table_shards(src: TableSource, shard_bytes: int, shard_rows: int | None,
                 seed: int | None = None) -> list[tuple[tuple[int, ...], int]]:
    """``(unit indices, rows)`` per shard: units up to ``shard_bytes`` (uncompressed) or
    ``shard_rows`` rows (a row group larger than that is a shard alone), in source order,
    or with ``seed`` in a seeded random order (deterministic: the same seed, the same shards).

    Example:
        >>> from fastfeed.packing.sources.parquet import Unit
        >>> units = tuple(Unit("a.parquet", g, 3 * g, 3 * g, 3, 100) for g in range(4))
        >>> src = TableSource("parquet", ".", ("a.parquet",), (), None, units, 12, "fp")
        >>> table_shards(src, 250, None)
        [((0, 1), 6), ((2, 3), 6)]
    """
    order = list(range(len(src.units))) if seed is None else \
        [int(i) for i in np.random.default_rng(seed).permutation(len(src.units))]
    ordered = replace(src, units=tuple(src.units[i] for i in order))
    return [(tuple(order[j] for j in group), sum(src.units[order[j]].num_rows for j in group))
            for group in group_units(ordered, shard_bytes, shard_rows)]


def table_content(src: TableSource, shards: Iterable[tuple[int, ...]], options: Mapping[str, Any],
                  tokenizer: str | None) -> str:
    """The content id of a planned table pack: options, tokenizer, the source's fingerprint, units."""
    h = hashlib.sha256(json.dumps([__version__, src.kind, dict(options), tokenizer, src.fingerprint,
                                   sorted(src.dropped)], sort_keys=True, default=str).encode())
    for units in shards:
        h.update(b"|shard")
        h.update(repr([src.units[i] for i in units]).encode("utf-8", "surrogateescape"))
    return h.hexdigest()[:32]


@dataclass(frozen=True)
class TokenPlan:
    """What the pack workers do with the tokenizer (plain data, picklable).

    Attributes:
        tokenizer: from :func:`~fastfeed.packing.content.tokenize.load_tokenizer`.
        field: the text field tokenized (a sample field name, e.g. ``caption.txt``).
        store: store the ids in :data:`~fastfeed.packing.content.tokenize.TOKENS_FIELD` (``--tokenize``),
            or only count them for ``lengths.npy`` (``--length``).
    """

    tokenizer: Tokenizer
    field: str
    store: bool

    def index_meta(self) -> dict[str, Any]:
        """The index's ``tokenizer`` entry: sha256, vocab_size, pad_id, dtype, field, tokens."""
        return {**self.tokenizer.index_meta(), "field": self.field,
                "tokens": TOKENS_FIELD if self.store else None}


def check_token_options(tokenizer: str | None, tokenize: str | None, length: str | None) -> None:
    """The combinations of ``tokenizer``/``tokenize``/``length`` that make sense (no file read)."""
    if tokenizer is None:
        if tokenize is not None:
            raise ConfigError(f"--tokenize {tokenize} needs a tokenizer: pass --tokenizer PATH (tokenizer=: a "
                              "local tokenizer.json, or the folder save_pretrained() wrote)")
        return
    if tokenize is None and length is None:
        raise ConfigError("--tokenizer needs --tokenize FIELD (store the token ids of FIELD) or --length "
                          "FIELD (record FIELD's token counts only)")
    if tokenize is not None and length is not None and length != tokenize:
        raise ConfigError(f"--tokenize {tokenize} with --length {length}: with --tokenize, lengths.npy holds "
                          f"the token counts of {tokenize}; leave --length out")
    if tokenize is None and length is not None and ":" in length:
        raise ConfigError(f"--length {length} with --tokenizer: name the text field to count tokens of "
                          "(e.g. --length txt); FIELD:KEY is for numbers stored in JSON, without --tokenizer")


def token_plan(tok: Tokenizer | None, tokenize: str | None, length: str | None,
               fields: Mapping[str, str], where: str, *, columns: bool,
               listed: Iterable[str] | None = None) -> TokenPlan | None:
    """Resolve the tokenized field against what the source holds; None without a tokenizer.

    Args:
        tok: the loaded tokenizer, or None.
        tokenize, length: the options (see :func:`check_token_options`).
        fields: name -> field: every name FIELD may be given as (a column, a JSON key, a
            field) and the sample field it is stored in (``""``: chosen per value, bytes).
        where: the source, for messages.
        columns: the names are table columns (for the wording of errors).
        listed: the names an error lists (default: every name of ``fields``).
    """
    if tok is None:
        return None
    name = tokenize if tokenize is not None else str(length)
    what = "--tokenize" if tokenize is not None else "--length"
    if tokenize is not None and TOKENS_FIELD in fields.values():
        raise ConfigError(f"--tokenize {tokenize}: {where} already has a field {TOKENS_FIELD}, where the token "
                          "ids would go; rename that field (for a table: --columns), or leave --tokenize out")
    field = text_field(name, fields, where, what, columns=columns, listed=listed)
    return TokenPlan(tok, field, tokenize is not None)


def text_field(name: str, fields: Mapping[str, str], where: str, what: str, *, columns: bool,
               listed: Iterable[str] | None = None) -> str:
    """The text field ``name`` refers to; ConfigError (naming the fix) when missing or not text.

    Example:
        >>> text_field("caption", {"caption": "caption.txt"}, "data.parquet", "--tokenize", columns=True)
        'caption.txt'
    """
    thing = "column" if columns else "field"
    field = fields.get(name, fields.get(name.lower()))
    shown = sorted(fields if listed is None else set(listed))
    texts = [n for n in shown if _is_text(fields.get(n, ""))]
    hint = f" (the text {thing}s: {', '.join(texts)})" if texts else ""
    if field is None:
        raise ConfigError(f"{what} {name}: {where} has no {thing} {name!r}; the {thing}s are: "
                          f"{', '.join(shown) or 'none'}; name one that holds text{hint}")
    if not _is_text(field):
        stored = f"packed as {field}" if field else "packed as bytes (type sniffed per value)"
        fix = f", or store it as text with --columns {name}=txt" if columns else ""
        raise ConfigError(f"{what} {name}: the {thing} {name!r} of {where} is {stored}, not text; name a "
                          f"text {thing}{hint}{fix}")
    return field


def check_length_column(spec: str, fields: Mapping[str, str], where: str,
                        listed: Iterable[str] | None = None) -> None:
    """Refuse ``--length FIELD`` (no tokenizer) naming no column of the table, listing the columns.

    Example:
        >>> check_length_column("n:tokens", {"n": "n.json"}, "data.parquet")
    """
    name = spec.partition(":")[0]
    low = name.lower()
    if name in fields or low in fields or any(f.lower().startswith(low + ".") for f in fields.values() if f):
        return
    shown = sorted(fields if listed is None else set(listed))
    raise ConfigError(f"--length {spec}: {where} has no column {name!r}; the columns are: "
                      f"{', '.join(shown) or 'none'}; name the column holding each row's length")


def _is_text(field: str) -> bool:
    return bool(field) and field.lower().rpartition(".")[2] in TEXT_EXTS
