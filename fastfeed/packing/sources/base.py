"""What ``pack`` reads: the sample specs of a source, and how problems with it are reported.

A source (an ImageFolder, a folder of files grouped by key, or a JSONL manifest; on disk
or on object storage) becomes a :class:`Source`: samples as :class:`SampleSpec` (a key,
its :class:`Member` fields and where their bytes come from), plus what was left out.
:class:`Problems` collects what is wrong with it: with ``on_error="raise"`` the scan
raises the first problem (mentioning how many more there are), with ``"skip"`` the
sample is left out and recorded.

Example:
    >>> key_problem("cat/0001"), key_problem("../etc/passwd")
    (None, "name contains '..'")
    >>> parse_length("json:num_tokens")
    ('json', 'num_tokens')
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Iterable, NamedTuple

from fastfeed.errors import ConfigError, SourceError

__all__ = [
    "INPUTS",
    "MANIFEST_SUFFIXES",
    "TABLE_INPUTS",
    "FileEntry",
    "Member",
    "Problems",
    "SampleSpec",
    "Source",
    "key_problem",
    "parse_length",
    "resolve_length_member",
    "show",
    "text_problem",
]

INPUTS = ("imagefolder", "files", "jsonl", "parquet", "hf", "webdataset")
#: Inputs read as tables (rows -> samples, see :mod:`fastfeed.packing.sources.parquet`).
TABLE_INPUTS = ("parquet", "hf")
MANIFEST_SUFFIXES = (".jsonl", ".ndjson", ".jsonlines")


class Member(NamedTuple):
    """One field of a sample and where its bytes come from.

    Exactly one source applies: ``path`` (a file, relative to ``Source.root`` or
    absolute; with ``offset``, the ``size`` bytes at that offset of it: a member of a
    WebDataset tar), ``data`` (inline bytes), or ``json_key`` (that key of the sample's
    line in the JSONL manifest, re-read when the shard is written).
    """

    field: str
    path: str | None
    size: int
    mtime_ns: int
    data: bytes | None = None
    json_key: str | None = None
    offset: int | None = None


class SampleSpec(NamedTuple):
    """One sample as planned: key, members in field order, class index (-1 when none)."""

    key: str
    members: tuple[Member, ...]
    label: int = -1
    line: tuple[int, int] | None = None  # JSONL: (byte offset, byte length) of its line


@dataclass
class Source:
    """The validated input: samples sorted by key plus what was left out and why."""

    kind: str
    root: str
    samples: list[SampleSpec]
    classes: tuple[str, ...] | None = None
    skipped: list[dict[str, str]] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)
    manifest: str | None = None
    manifest_sha256: str | None = None
    has_labels: bool = False

    @property
    def fields(self) -> tuple[str, ...]:
        return tuple(sorted({m.field for s in self.samples for m in s.members}))


def show(path: str) -> str:
    """A path made safe to print (undecodable bytes and control characters escaped)."""
    text = path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    return text.replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t")


class Problems:
    """Collects source problems: raise them (``raise``) or record them as skips (``skip``)."""

    def __init__(self, on_error: str, src: str) -> None:
        self.on_error = on_error
        self.src = src
        self.errors: list[SourceError] = []
        self.skipped: list[dict[str, str]] = []

    def report(self, cls: type[SourceError], where: str, reason: str, fix: str, key: str = "") -> None:
        """Record one problem at ``where`` (a path relative to SRC, or ``manifest:LINE``)."""
        if self.on_error == "skip":
            self.skipped.append({"path": show(where), "key": show(key), "reason": reason})
            return
        self.errors.append(cls(f"{show(os.path.join(self.src, where))}: {reason}; {fix}"))

    def leave_out(self, where: str, reason: str, key: str = "") -> None:
        """Record an input left out on purpose whatever ``on_error`` (a stray file next to an ImageFolder's images)."""
        self.skipped.append({"path": show(where), "key": show(key), "reason": reason})

    def raise_if_any(self) -> None:
        if not self.errors:
            return
        first, rest = self.errors[0], self.errors[1:]
        if not rest:
            raise first
        more = "; ".join(str(e) for e in rest[:4])
        extra = f" and {len(rest) - 4} more" if len(rest) > 4 else ""
        raise type(first)(f"{first} (also {len(rest)} more problem(s): {more}{extra})") from None


class FileEntry(NamedTuple):
    """One file of a listed folder or prefix: its path relative to the root, size, mtime."""

    rel: str
    size: int
    mtime_ns: int


def text_problem(name: str) -> str | None:
    """Why ``name`` cannot be stored as text in a member name (newline, NUL, not UTF-8), or None."""
    if any(c in name for c in "\n\r\0"):
        return "name contains a newline or NUL character"
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return "name is not valid UTF-8"
    return None


#: Keys made only of these characters, no dots, no empty parts: safe without more checks.
_PLAIN_KEY = re.compile(r"[\w\-+=,@%~()]+(?:/[\w\-+=,@%~()]+)*")


def key_problem(key: str) -> str | None:
    """Why ``key`` cannot be stored safely as a member name, or None."""
    if _PLAIN_KEY.fullmatch(key):
        return None
    if not key:
        return "empty key"
    if (why := text_problem(key)) is not None:
        return why
    if key.startswith("/") or re.match(r"^[A-Za-z]:[\\/]", key):
        return "absolute path"
    parts = key.split("/")
    if ".." in parts:
        return "name contains '..'"
    if any(p in ("", ".") for p in parts):
        return "empty or '.' path component"
    if "." in parts[-1]:
        return "the key's last part contains '.' (readers split member names at the first dot)"
    return None


def parse_length(spec: str) -> tuple[str, str | None]:
    """``--length FIELD`` or ``FIELD:KEY`` (a key inside a JSON member) -> (field, key).

    Example:
        >>> parse_length("txt"), parse_length("json:num_tokens")
        (('txt', None), ('json', 'num_tokens'))
    """
    name, _, sub = spec.partition(":")
    if not name:
        raise ConfigError(f"length={spec!r}: write a field name such as txt, or json:num_tokens")
    return name, (sub or None)


def resolve_length_member(members: Iterable[Member], name: str) -> Member | None:
    """The member ``--length`` reads: the field itself, the JSONL field of that name, or the
    one field whose name without its extension is ``name`` (``tokens`` -> ``tokens.npy``)."""
    ms = list(members)
    for m in ms:
        if m.field == name.lower():
            return m
    for m in ms:
        if m.json_key == name:
            return m
    stems = [m for m in ms if m.field.rpartition(".")[0] == name.lower()]
    return stems[0] if len(stems) == 1 else None
