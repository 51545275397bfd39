"""What every input of ``pack`` is to the planner and the writer: the :class:`Source` protocol.

:func:`fastfeed.packing.sources.detect.open_source` opens SRC as one of two implementations:

- :class:`~fastfeed.packing.sources.samples.SampleSource`, whose units are the samples themselves
  (:class:`SampleSpec`: a key, its :class:`Member` fields and where their bytes come from): an
  ImageFolder, files grouped by key, a JSONL manifest, WebDataset tars; local or on object storage;
- :class:`~fastfeed.packing.sources.table.TableSource`, whose units are blocks of rows (parquet
  row groups, ranges of a HF dataset), streamed one record batch at a time.

The planner (:func:`fastfeed.packing.plan.plan_pack`) orders the units and cuts them into shards
by their :class:`Measure`; the writer reads a planned shard's units back with :meth:`Source.read`,
as :class:`Item` s. Besides, this module holds the records and rules the implementations share:
keys that are safe member names, ``--length`` specs, a bad input met while reading (:class:`Problem`),
and what came from outside the source (:func:`outside_entry`).

**Confinement.** Every file a listed source packs must resolve inside its root (SRC, or the
folder of a JSONL manifest): a symlink whose target is elsewhere, an absolute or ``../`` path
of a manifest is an :class:`~fastfeed.errors.UnsafePathError` naming it and the fix
(:data:`OUTSIDE_FIX`; a skip with ``on_error="skip"``), unless ``pack(allow_outside=True)`` (``--allow-outside``);
then each such :class:`Member` carries the real folder it came from, and the source counts them:
``Source.outside``, the index's ``outside`` entry and a line of the pack summary.

Example:
    >>> key_problem("cat/0001"), key_problem("../etc/passwd")
    (None, "name contains '..'")
    >>> parse_length("json:num_tokens")
    ('json', 'num_tokens')
    >>> outside_entry(["/data/in/train/n01", "/data/in/train/n02", "/data/in/train/n02"])
    {'files': 3, 'roots': ['/data/in/train/n01', '/data/in/train/n02']}
    >>> outside_entry(["/data/in/train/n01", "/data/in/train/n02", "/data/in/val"], limit=1)
    {'files': 3, 'roots': ['/data/in']}
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Mapping, NamedTuple, Protocol, Sequence, runtime_checkable

from fastfeed.errors import ConfigError, SourceError
from fastfeed.formats.naming import is_image, pick_image_field

__all__ = [
    "INPUTS",
    "LENGTH_TEXT_EXTS",
    "MANIFEST_SUFFIXES",
    "OUTSIDE_FIX",
    "OUTSIDE_ROOTS",
    "TABLE_INPUTS",
    "Content",
    "Fields",
    "ImageFn",
    "Item",
    "Measure",
    "Member",
    "Problem",
    "Reading",
    "SampleSpec",
    "Source",
    "check_input",
    "image_member",
    "key_problem",
    "length_of_value",
    "outside_entry",
    "parse_length",
    "resolve_length_member",
    "show",
    "text_problem",
]

INPUTS = ("imagefolder", "files", "jsonl", "parquet", "hf", "webdataset")
#: Inputs read as tables (rows -> samples, see :mod:`fastfeed.packing.sources.parquet`).
TABLE_INPUTS = ("parquet", "hf")
MANIFEST_SUFFIXES = (".jsonl", ".ndjson", ".jsonlines")
#: Field extensions whose ``--length`` is the whitespace-token count of the text.
LENGTH_TEXT_EXTS = frozenset({"txt", "text", "transcript", "md", "csv", "tsv"})
#: The way to pack a file that resolves outside the source (part of every such error's fix).
OUTSIDE_FIX = "pass --allow-outside to pack files from outside SRC (counted in the pack summary and the index)"
#: At most this many folders name where the files from outside the source came from (the index's
#: ``outside.roots``): their common parents when there are more.
OUTSIDE_ROOTS = 8


# ---------------------------------------------------------------- the protocol
class Fields(NamedTuple):
    """The fields of a source as ``--tokenize`` / ``--length`` may name them.

    Attributes:
        names: every name an option may use (a field, a JSON key, a column) -> the field it is
            stored in (``""``: chosen per value, bytes of a sniffed type).
        listed: the names an error lists (a table's columns; else every name).
        noun: ``field``, or ``column`` for a table (the wording of errors).
    """

    names: Mapping[str, str]
    listed: tuple[str, ...]
    noun: str = "field"


class Measure(NamedTuple):
    """One unit to the planner: samples (rows) in it, estimated bytes in a shard, and the source
    files and bytes reading it takes (progress)."""

    rows: int
    size: int
    files: int
    nbytes: int


class Content(NamedTuple):
    """The content id of a planned output, and the Pillow version it depends on (recorded in the index)."""

    id: str
    pillow: str | None


class Item(NamedTuple):
    """One sample ready to write: key, fields, label, length (or None), source files and bytes read."""

    key: str
    fields: dict[str, Any]
    label: int
    length: int | None
    files: int
    nbytes: int


class Member(NamedTuple):
    """One field of a sample and where its bytes come from.

    Exactly one source applies: ``path`` (a file, relative to the source's root or
    absolute; with ``offset``, the ``size`` bytes at that offset of it: a member of a
    WebDataset tar), ``data`` (inline bytes), or ``json_key`` (that key of the sample's
    line in the JSONL manifest, re-read when the shard is written). ``outside``: the real
    folder of a file that resolves outside the source's root (packed with ``allow_outside``),
    else None.
    """

    field: str
    path: str | None
    size: int
    mtime_ns: int
    data: bytes | None = None
    json_key: str | None = None
    offset: int | None = None
    outside: str | None = None


class SampleSpec(NamedTuple):
    """One sample as planned: key, members in field order, class index (-1 when none)."""

    key: str
    members: tuple[Member, ...]
    label: int = -1
    line: tuple[int, int] | None = None  # JSONL: (byte offset, byte length) of its line


#: What the writer does with the bytes of an image member: ``(member, data, as_pixels)`` -> the
#: bytes to store (checked, maybe re-encoded), or with ``as_pixels`` its decoded pixels; raises
#: :class:`Problem` for a bad image. ``member.path`` names where the bytes came from.
ImageFn = Callable[[Member, bytes, bool], Any]


@dataclass(frozen=True)
class Reading:
    """How the writer wants a shard's samples from :meth:`Source.read`.

    Attributes:
        on_error: ``raise``: the first bad input raises (a SourceError naming it and the fix);
            ``skip``: it is left out and appended to ``skipped``.
        skipped: where ``skip`` records ``{"path", "key", "reason"}``.
        length: the ``--length`` spec to compute per sample (None: no lengths, or a tokenizer
            counts them later).
        image: applied to the bytes of every image member; None: stored as read.
        reencodes: ``image`` changes the bytes (``max_side``, ``jpeg_restarts``). A table's
            image values, sniffed when the row was read, go through ``image`` only then.
    """

    on_error: str
    skipped: list[dict[str, str]]
    length: str | None = None
    image: ImageFn | None = None
    reencodes: bool = False


@runtime_checkable
class Source(Protocol):
    """An input of ``pack``, opened: what the planner cuts into shards and the writer reads.

    Plain data, picklable (the plan carries :meth:`for_writer` to every engine's writers).
    ``isinstance(x, Source)`` checks that the members are there (not their types).

    Attributes:
        kind: one of :data:`INPUTS`.
        src: the input as the plan names it: an absolute path, a URL, or ``datasets.Dataset``.
        shown: how messages name it (printable, as given).
        root: what member paths are relative to (``""`` for a dataset object in memory).
        location: its resume identity: the resolved path, the URL, or ``datasets.Dataset:<fingerprint>``.
        identity: what its content depends on beyond the units (the JSONL manifest's sha256; the
            digest of the table files' metadata and of the rows dropped as duplicates), part of every
            shard's fingerprint.
        classes: class names (ImageFolder), else None.
        has_labels: whether the index gets ``labels.npy``.
        skipped: inputs left out while opening (``on_error="skip"``), sorted.
        ignored: names that are never samples (hidden files, top-level files of an ImageFolder).
        units: what shards are cut from, in source order: samples (key order) or blocks of rows.
        blocks: True when a unit is a block of rows kept whole: shards take consecutive units up to
            the limits. False: a unit is one sample, and shards get counts within one of each other.
        fields: the names ``--tokenize`` / ``--length`` may use.
        outside: the files packed from outside the source (``allow_outside``):
            ``{"files": N, "roots": [folders]}`` (:func:`outside_entry`), or None when none are.

    Example:
        >>> import pathlib, tempfile
        >>> from fastfeed.packing.sources.detect import open_source
        >>> root = pathlib.Path(tempfile.mkdtemp())
        >>> _ = (root / "a.txt").write_text("hello world")
        >>> src = open_source(root)
        >>> src.kind, [u.key for u in src.units], src.measure(src.units[0], "tar").rows
        ('files', ['a'], 1)
        >>> [it.fields for it in src.read(src.units, (), Reading("raise", []))]
        [{'txt': b'hello world'}]
    """

    @property
    def kind(self) -> str: ...

    @property
    def src(self) -> str: ...

    @property
    def shown(self) -> str: ...

    @property
    def root(self) -> str: ...

    @property
    def location(self) -> str: ...

    @property
    def identity(self) -> str: ...

    @property
    def classes(self) -> tuple[str, ...] | None: ...

    @property
    def has_labels(self) -> bool: ...

    @property
    def skipped(self) -> tuple[dict[str, str], ...]: ...

    @property
    def ignored(self) -> tuple[str, ...]: ...

    @property
    def units(self) -> tuple[Any, ...]: ...

    @property
    def blocks(self) -> bool: ...

    @property
    def fields(self) -> Fields: ...

    @property
    def outside(self) -> Mapping[str, Any] | None: ...

    def measure(self, unit: Any, fmt: str) -> Measure:
        """Rows, estimated shard bytes (``fmt``: ``tar`` or ``lmdb``), files and bytes read of ``unit``."""
        ...

    def split(self, shard_bytes: int, shard_rows: int | None) -> "Source":
        """This source with every unit larger than a shard cut into units that fit (a sample is never cut)."""
        ...

    def content(self, shards: Sequence[tuple[Sequence[Any], Sequence[bool]]], options: Mapping[str, Any],
                tokenizer: str | None) -> Content:
        """The content id of the output planned from ``(units, raw flags)`` per shard, ``options``
        (:meth:`~fastfeed.packing.options.PackOptions.output_options`) and a tokenizer's sha256."""
        ...

    def for_writer(self) -> "Source":
        """This source without its units (each shard carries its own) and its planning records:
        what the plan sends to every writer."""
        ...

    def read(self, units: Sequence[Any], raw: Sequence[bool], reading: Reading) -> Iterator[Item]:
        """The samples of ``units`` in order, as items; ``raw[i]``: store the image of sample ``i``
        as pixels (empty: none). Bad input follows ``reading.on_error``."""
        ...


# ---------------------------------------------------------------- shared rules and records
def check_input(input: str | None) -> str | None:
    """``input=`` checked: one of :data:`INPUTS`, or None (``auto``, ``""``) to detect.

    Example:
        >>> check_input("auto"), check_input("jsonl")
        (None, 'jsonl')
    """
    if isinstance(input, str) and input in ("auto", ""):
        return None
    if input is not None and (not isinstance(input, str) or input not in INPUTS):
        raise ConfigError(f"input={input!r}: choose one of {', '.join(INPUTS)} (or leave it out to detect)")
    return input


def show(path: str) -> str:
    """A path made safe to print (undecodable bytes and control characters escaped)."""
    text = path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    return text.replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t")


class Problem(Exception):
    """A bad input met while reading a shard; the reader raises it as a SourceError or records a skip."""

    def __init__(self, cls: type[SourceError], where: str, reason: str, fix: str) -> None:
        super().__init__(reason)
        self.cls, self.where, self.reason, self.fix = cls, where, reason, fix

    def error(self, root: str) -> SourceError:
        """The error to raise, naming ``where`` (relative to ``root``) and the fix."""
        path = self.where if os.path.isabs(self.where) else os.path.join(root, self.where)
        return self.cls(f"{show(path)}: {self.reason}; {self.fix}")


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


def length_of_value(value: Any) -> int:
    """A ``--length`` value: numbers as they are (integral), texts as their whitespace-token count, lists by size.

    Example:
        >>> length_of_value([1, 2, 3]), length_of_value("a b"), length_of_value(7.0)
        (3, 2, 7)
    """
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


def outside_entry(folders: Iterable[str], limit: int = OUTSIDE_ROOTS) -> dict[str, Any] | None:
    """What came from outside the source: ``{"files": N, "roots": [...]}`` from the real folder of
    each such file, or None for none. The roots are at most ``limit`` folders that hold them all:
    the folders themselves, or, when there are more, their parents, deepest first.

    Example:
        >>> outside_entry(["/a/x/1", "/a/x/2", "/b"], limit=2)
        {'files': 3, 'roots': ['/a/x', '/b']}
        >>> outside_entry([]) is None
        True
    """
    count = 0
    distinct: set[str] = set()
    for folder in folders:
        count += 1
        distinct.add(folder)
    if not count:
        return None
    parts = {tuple(d.rstrip("/").split("/")) for d in distinct}
    while True:
        kept: list[tuple[str, ...]] = []
        for p in sorted(parts):  # a folder sorts right after its ancestors: keep the topmost
            if not kept or p[:len(kept[-1])] != kept[-1]:
                kept.append(p)
        deepest = max(len(p) for p in kept)
        if len(kept) <= limit or deepest <= 1:
            return {"files": count, "roots": ["/".join(p) or "/" for p in kept]}
        parts = {p[:-1] if len(p) == deepest else p for p in kept}


def image_member(spec: SampleSpec) -> Member | None:
    """The member of a sample that ``--store raw`` stores as pixels (the loader's image field), or None."""
    fields = [m.field for m in spec.members if m.path is not None and is_image(m.field)]
    name = pick_image_field(fields)
    if name is None:
        return None
    return next(m for m in spec.members if m.field == name and m.path is not None)
