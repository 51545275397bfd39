"""The token plan of ``pack``: which text field a tokenizer reads, checked once before any shard is written.

:func:`token_plan` checks ``--tokenizer PATH`` with ``--tokenize FIELD`` / ``--length FIELD``
against the fields of the source (:class:`~fastfeed.packing.sources.base.Fields`: a column of
a table, a field or JSON key of the samples): the field must exist and hold text, and the
tokenizer file must load. The result, a :class:`TokenPlan`, travels in the pack plan to the
workers. Without a tokenizer, :func:`check_length_field` checks that ``--length FIELD`` names
a field of the source.

Example:
    >>> fields = Fields({"caption": "caption.txt", "caption.txt": "caption.txt"}, ("caption",), "column")
    >>> text_field("caption", fields, "data.parquet", "--tokenize")
    'caption.txt'
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fastfeed.errors import ConfigError
from fastfeed.packing.content.tokenize import TOKENS_FIELD, Tokenizer
from fastfeed.packing.sources.base import Fields
from fastfeed.packing.sources.columns import TEXT_EXTS

__all__ = ["TokenPlan", "check_length_field", "check_token_options", "text_field", "token_plan"]


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
               fields: Fields, where: str) -> TokenPlan | None:
    """Resolve the tokenized field against what the source holds; None without a tokenizer.

    Args:
        tok: the loaded tokenizer, or None.
        tokenize, length: the options (see :func:`check_token_options`).
        fields: the fields of the source, by every name FIELD may be given as.
        where: the source, for messages.
    """
    if tok is None:
        return None
    name = tokenize if tokenize is not None else str(length)
    what = "--tokenize" if tokenize is not None else "--length"
    if tokenize is not None and TOKENS_FIELD in fields.names.values():
        raise ConfigError(f"--tokenize {tokenize}: {where} already has a field {TOKENS_FIELD}, where the token "
                          "ids would go; rename that field (for a table: --columns), or leave --tokenize out")
    field = text_field(name, fields, where, what)
    return TokenPlan(tok, field, tokenize is not None)


def text_field(name: str, fields: Fields, where: str, what: str) -> str:
    """The text field ``name`` refers to; ConfigError (naming the fix) when missing or not text.

    Example:
        >>> text_field("txt", Fields({"txt": "txt"}, ("txt",)), "data/", "--tokenize")
        'txt'
    """
    thing, names = fields.noun, fields.names
    columns = thing == "column"
    field = names.get(name, names.get(name.lower()))
    shown = sorted(set(fields.listed))
    texts = [n for n in shown if _is_text(names.get(n, ""))]
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


def check_length_field(spec: str, fields: Fields, where: str) -> None:
    """Refuse ``--length FIELD`` (no tokenizer) naming no field of the source, listing the fields.

    A listed source checks every sample when it is opened (a sample without the field is a
    problem of its own), so this refuses only what no sample could hold: a column of no table.

    Example:
        >>> check_length_field("n:tokens", Fields({"n": "n.json"}, ("n",), "column"), "data.parquet")
    """
    name = spec.partition(":")[0]
    low = name.lower()
    names = fields.names
    if name in names or low in names or any(f.lower().startswith(low + ".") for f in names.values() if f):
        return
    thing = fields.noun
    raise ConfigError(f"--length {spec}: {where} has no {thing} {name!r}; the {thing}s are: "
                      f"{', '.join(sorted(set(fields.listed))) or 'none'}; name the {thing} holding each "
                      f"{'row' if thing == 'column' else 'sample'}'s length")


def _is_text(field: str) -> bool:
    return bool(field) and field.lower().rpartition(".")[2] in TEXT_EXTS
