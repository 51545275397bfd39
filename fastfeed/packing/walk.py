"""List, group and validate the input of ``pack``; decide nothing about shards.

Three inputs, detected or chosen (``input=``):

- ``imagefolder``: ``SRC/<class>/.../<name>.<image ext>``, one sample per image with the
  class index (classes sorted by name, as torchvision numbers them) in a ``cls`` field;
  files directly in SRC (``labels.txt``, a README) are not samples and are reported;
- ``files``: every file, grouped into samples by key (WebDataset convention:
  ``a/b/0001.jpg`` + ``a/b/0001.json`` = sample ``a/b/0001`` with fields ``jpg``, ``json``);
- ``jsonl``: a manifest, one JSON object per line. A string field naming an existing file
  (relative to the manifest) is read from disk; other strings are stored as text, other
  values as JSON (:mod:`fastfeed.packing.manifest` reads it; see
  :func:`~fastfeed.packing.manifest.member_name` for the member names).

Auto-detection: a ``.jsonl``/``.ndjson`` file is a manifest; a folder whose files all sit
in sub-folders and all carry image extensions is an ImageFolder; anything else is files.

Names starting with ``.`` (``.DS_Store``, ``.git``) are never samples; they are listed in
``Source.ignored``. Every other problem is a :class:`~fastfeed.errors.SourceError` that
names the path and the fix, collected by :class:`Problems`: with ``on_error="fail"`` the
scan raises the first one (mentioning how many more there are), with ``"skip"`` the sample
is left out and recorded.

Example:
    >>> src = scan("imagenet/train", input=None, on_error="fail")   # doctest: +SKIP
    >>> src.kind, len(src.samples), src.classes[:2]                  # doctest: +SKIP
    ('imagefolder', 1281167, ('n01440764', 'n01443537'))
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import stat
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, NamedTuple

from fastfeed.errors import (
    BadFileError,
    ConfigError,
    DuplicateKeyError,
    EmptySourceError,
    SourceError,
    UnsafePathError,
)
from fastfeed.formats.tar import split_key
from fastfeed.formats.images import IMAGE_EXTS, field_ext, is_image_field, sniff
from fastfeed.storage.remote import is_url

__all__ = [
    "INPUTS",
    "MANIFEST_SUFFIXES",
    "Member",
    "Problems",
    "SampleSpec",
    "Source",
    "key_problem",
    "parse_length",
    "resolve_length_member",
    "scan",
    "show",
]

log = logging.getLogger("fastfeed.pack")

INPUTS = ("imagefolder", "files", "jsonl")
MANIFEST_SUFFIXES = (".jsonl", ".ndjson", ".jsonlines")
#: JSON field names used as member names unchanged (WebDataset extensions).


class Member(NamedTuple):
    """One field of a sample and where its bytes come from.

    Exactly one source applies: ``path`` (a file, relative to ``Source.root`` or
    absolute), ``data`` (inline bytes), or ``json_key`` (that key of the sample's line
    in the JSONL manifest, re-read when the shard is written).
    """

    field: str
    path: str | None
    size: int
    mtime_ns: int
    data: bytes | None = None
    json_key: str | None = None


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
    """Collects source problems: raise them (``fail``) or record them as skips (``skip``)."""

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

    def raise_if_any(self) -> None:
        if not self.errors:
            return
        first, rest = self.errors[0], self.errors[1:]
        if not rest:
            raise first
        more = "; ".join(str(e) for e in rest[:4])
        extra = f" and {len(rest) - 4} more" if len(rest) > 4 else ""
        raise type(first)(f"{first} (also {len(rest)} more problem(s): {more}{extra})") from None


# ---------------------------------------------------------------- listing
class _File(NamedTuple):
    rel: str
    size: int
    mtime_ns: int


def _list(root: Path, problems: Problems) -> tuple[list[_File], list[str], list[str]]:
    """Walk ``root`` following symlinks: (regular files, top-level folders, ignored names)."""
    files: list[_File] = []
    ignored: list[str] = []
    top_dirs: list[str] = []
    st0 = root.stat()
    stack: list[tuple[str, str, dict[tuple[int, int], str]]] = [
        ("", str(root), {(st0.st_dev, st0.st_ino): "."})
    ]
    while stack:
        rel_dir, abs_dir, ancestors = stack.pop()
        try:
            with os.scandir(abs_dir) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError as e:
            problems.report(BadFileError, rel_dir or ".", f"cannot list folder ({e.strerror})",
                            "fix its permissions, or pass --on-error skip")
            continue
        subdirs = []
        for e in entries:
            rel = f"{rel_dir}/{e.name}" if rel_dir else e.name
            if e.name.startswith("."):
                ignored.append(rel)
                continue
            try:
                st = e.stat()
            except OSError as err:
                _report_stat_error(problems, rel, e.path, err)
                continue
            if stat.S_ISDIR(st.st_mode):
                ident = (st.st_dev, st.st_ino)
                if ident in ancestors:
                    problems.report(UnsafePathError, rel,
                                    f"symlink loop (points back to {show(ancestors[ident])})",
                                    "remove or fix the link, or pass --on-error skip")
                    continue
                if not rel_dir:
                    top_dirs.append(rel)
                subdirs.append((rel, e.path, {**ancestors, ident: rel}))
            elif stat.S_ISREG(st.st_mode):
                files.append(_File(rel, st.st_size, st.st_mtime_ns))
            else:
                problems.report(BadFileError, rel, "not a regular file (a FIFO, socket or device)",
                                "remove it, or pass --on-error skip")
        stack.extend(reversed(subdirs))
    files.sort()
    return files, top_dirs, ignored


def _report_stat_error(problems: Problems, rel: str, path: str, err: OSError) -> None:
    if err.errno == errno.ELOOP:
        problems.report(UnsafePathError, rel, "symlink loop", "remove or fix the link, or pass --on-error skip")
    elif err.errno == errno.ENOENT:
        try:
            target = os.readlink(path)
        except OSError:
            target = "?"
        problems.report(BadFileError, rel, f"broken symlink (points to {show(target)})",
                        "fix or remove the link, or pass --on-error skip")
    else:
        problems.report(BadFileError, rel, f"cannot read ({err.strerror})",
                        "fix its permissions, or pass --on-error skip")


def _file_ok(problems: Problems, root: str, f: _File, key: str) -> bool:
    """Zero-byte and unreadable files are problems; True when ``f`` can be packed."""
    if f.size == 0:
        problems.report(BadFileError, f.rel, "zero-byte file",
                        "remove it or copy it again, or pass --on-error skip", key)
        return False
    if not _readable(os.path.join(root, f.rel)):
        problems.report(BadFileError, f.rel, "not readable (permission denied)",
                        "fix its permissions (chmod a+r), or pass --on-error skip", key)
        return False
    return True


def _text_problem(name: str) -> str | None:
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
    if (why := _text_problem(key)) is not None:
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


# ---------------------------------------------------------------- folders
def _detect(files: list[_File], top_dirs: list[str]) -> tuple[str, str]:
    """Pick ``imagefolder`` or ``files`` for a listed folder; returns (kind, reason)."""
    if not top_dirs:
        return "files", "no class sub-folders"
    for f in files:
        base = f.rel.rpartition("/")[2]
        is_image = "." in base and field_ext(base.rpartition(".")[2]) in IMAGE_EXTS
        if "/" not in f.rel:
            if is_image:
                return "files", f"image {show(f.rel)} sits at the top level"
        elif not is_image:
            return "files", f"{show(f.rel)} is not an image"
    return "imagefolder", "every file sits in a class folder and is an image"


def _imagefolder(root: str, files: list[_File], top_dirs: list[str], problems: Problems) -> Source:
    classes = tuple(sorted(top_dirs))
    index = {c: i for i, c in enumerate(classes)}
    candidates: dict[str, list[tuple[_File, str]]] = defaultdict(list)
    ignored: list[str] = []
    for f in files:
        if "/" not in f.rel:
            ignored.append(f.rel)
            continue
        folder, _, base = f.rel.rpartition("/")
        stem, dot, ext = base.rpartition(".")
        ext = field_ext(ext)
        if not dot or not stem or ext not in IMAGE_EXTS:
            problems.report(BadFileError, f.rel, "not an image file in an ImageFolder",
                            "remove it, pass --on-error skip, or pack every file with --input files")
            continue
        key = f"{folder}/{stem.replace('.', '_')}"
        if (why := key_problem(key)) is not None:
            problems.report(UnsafePathError, f.rel, f"unusable name: {why}", "rename it, or pass --on-error skip")
            continue
        candidates[key].append((f, ext))
    samples: list[SampleSpec] = []
    for key, group in candidates.items():
        if len(group) > 1:  # one sample per image: x.jpg and x.png (or x.jpeg) collide
            _report_duplicates(problems, key, {"image": [f for f, _ in group]})
            continue
        f, ext = group[0]
        if not _file_ok(problems, root, f, key):
            continue
        label = index[f.rel.split("/", 1)[0]]
        members = (Member("cls", None, 0, 0, data=b"%d" % label), Member(ext, f.rel, f.size, f.mtime_ns))
        samples.append(SampleSpec(key, members, label))
    counts: dict[int, int] = defaultdict(int)
    for s in samples:
        counts[s.label] += 1
    empty = [c for c in classes if counts[index[c]] == 0]
    if empty:
        log.warning("%s: %d class folder(s) hold no images (%s); they keep their class index",
                    show(root), len(empty), ", ".join(show(c) for c in empty[:5]))
    return Source("imagefolder", root, samples, classes=classes, ignored=ignored, has_labels=True)


def _report_duplicates(problems: Problems, key: str, by_field: dict[str, list[_File]]) -> bool:
    """Report every file of a (key, field) that several files map to; True if any."""
    found = False
    for fld, fs in sorted(by_field.items()):
        if len(fs) < 2:
            continue
        found = True
        names = ", ".join(show(f.rel) for f in fs)
        for f in fs:
            problems.report(DuplicateKeyError, f.rel, f"duplicate key {show(key)!r} field {fld!r} ({names})",
                            "rename or remove all but one, or pass --on-error skip", key)
    return found


def _files(root: str, files: list[_File], problems: Problems) -> Source:
    groups: dict[str, list[tuple[_File, str]]] = defaultdict(list)
    for f in files:
        parts = split_key(f.rel)
        if parts is None or not all(parts[1].split(".")):
            problems.report(BadFileError, f.rel, "no usable extension (files are grouped as KEY.EXT)",
                            "rename it to KEY.EXT or remove it, or pass --on-error skip")
            continue
        key, ext = parts
        if (why := key_problem(key) or _text_problem(ext)) is not None:
            problems.report(UnsafePathError, f.rel, f"unusable name: {why}", "rename it, or pass --on-error skip")
            continue
        groups[key].append((f, field_ext(ext)))
    samples: list[SampleSpec] = []
    for key, group in groups.items():
        bad = [f for f, _ in group if not _file_ok(problems, root, f, key)]
        if bad:
            continue
        by_field: dict[str, list[_File]] = defaultdict(list)
        for f, fld in group:
            by_field[fld].append(f)
        if _report_duplicates(problems, key, by_field):
            continue
        members = tuple(Member(fld, fs[0].rel, fs[0].size, fs[0].mtime_ns) for fld, fs in sorted(by_field.items()))
        samples.append(SampleSpec(key, members))
    has_labels = any(m.field == "cls" for s in samples for m in s.members)
    return Source("files", root, samples, has_labels=has_labels)


# ---------------------------------------------------------------- lengths
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
    """The member ``--length`` reads: the field itself, or the JSONL field of that name."""
    ms = list(members)
    for m in ms:
        if m.field == name.lower():
            return m
    for m in ms:
        if m.json_key == name:
            return m
    return None


def _check_lengths(src: Source, spec: str | None, problems: Problems) -> None:
    if spec is None:
        return
    if src.kind == "imagefolder":
        raise ConfigError(f"length={spec!r}: an ImageFolder holds only images; --length needs a "
                          "text or number field (pack a files or JSONL input)")
    name, _ = parse_length(spec)
    keep = []
    for s in src.samples:
        if resolve_length_member(s.members, name) is None:
            where = next((m.path for m in s.members if m.path), s.key)
            if src.manifest is not None and s.line is not None:
                where = src.manifest
            problems.report(SourceError, where, f"sample {show(s.key)!r} has no field {name!r} for --length",
                            "add the field, choose another --length, or pass --on-error skip", s.key)
            continue
        keep.append(s)
    src.samples = keep


# ---------------------------------------------------------------- probing (skip mode)
def probe(src: Source, problems: Problems, threads: int = 8) -> None:
    """Read the first bytes of every image file and drop samples whose images are not.

    Used with ``on_error="skip"`` so that bad files are known before shards are cut
    (shards then stay balanced); with ``"fail"`` the same check runs while writing.
    """
    todo = [(i, m) for i, s in enumerate(src.samples) for m in s.members
            if m.path is not None and is_image_field(m.field)]

    def head(m: Member) -> str | None:
        try:
            with _open(os.path.join(src.root, m.path or "")) as f:
                data = f.read(32)
        except OSError as e:
            return f"cannot read ({e.strerror})"
        return None if sniff(data) else f"has an image extension but is not an image (starts with {data[:8]!r})"

    with ThreadPoolExecutor(threads) as ex:
        results = list(ex.map(lambda im: head(im[1]), todo))
    bad: set[int] = set()
    for (i, m), why in zip(todo, results):
        if why is not None and i not in bad:
            bad.add(i)
            problems.report(BadFileError, m.path or "", why, "fix or remove the file", src.samples[i].key)
    if bad:
        src.samples = [s for i, s in enumerate(src.samples) if i not in bad]


# ---------------------------------------------------------------- entry point
def scan(src: str | os.PathLike[str], *, input: str | None, on_error: str,
         length: str | None = None, probe_threads: int = 8) -> Source:
    """List and validate ``src``; samples come back sorted by key.

    Args:
        src: an ImageFolder or files folder, or a JSONL manifest.
        input: ``imagefolder``, ``files``, ``jsonl``, or None to detect.
        on_error: ``fail`` raises the first problem; ``skip`` records it in ``Source.skipped``.
        length: ``pack --length`` (checked for presence here; read when writing).

    Raises:
        SourceError: a subclass naming the path and the fix (``fail``), or
        EmptySourceError when nothing is left to pack.
    """
    if is_url(src):  # object storage: listed and read through fsspec, same checks after that
        from fastfeed.packing.srcurl import scan_url

        return scan_url(str(src), input=input, on_error=on_error, length=length, probe_threads=probe_threads)
    path = Path(src)
    if not path.exists():
        raise SourceError(f"{show(str(path))}: does not exist; pass the folder or JSONL manifest to pack")
    problems = Problems(on_error, str(path))
    kind = input
    if path.is_file():
        from fastfeed.packing.manifest import manifest_source  # imports this module's types

        source = manifest_source(path, kind, problems)
    elif kind == "jsonl":
        raise ConfigError(f"{show(str(path))}: is a folder, but --input jsonl needs a manifest file")
    else:
        root = str(path.resolve())
        files, top_dirs, ignored = _list(path.resolve(), problems)
        if kind is None:
            kind, why = _detect(files, top_dirs)
            log.info("%s: packing as %s (%s)", show(str(path)), kind, why)
        if kind == "imagefolder":
            source = _imagefolder(root, files, top_dirs, problems)
        else:
            source = _files(root, files, problems)
        if source.ignored:
            log.warning("%s: %d file(s) at the top level of an ImageFolder are not samples: %s",
                        show(str(path)), len(source.ignored), ", ".join(show(p) for p in source.ignored[:5]))
        if ignored:
            log.info("%s: %d hidden name(s) (starting with '.') left out, e.g. %s",
                     show(str(path)), len(ignored), show(ignored[0]))
        source.ignored = ignored + source.ignored
    return _finish(source, problems, str(path), on_error, length, probe_threads)


def _finish(source: Source, problems: Problems, path: str, on_error: str, length: str | None,
            probe_threads: int) -> Source:
    """The checks every listed source gets (local or URL), then sort; raises or returns it."""
    _check_lengths(source, length, problems)
    if on_error == "skip":
        probe(source, problems, probe_threads)
    problems.raise_if_any()
    source.samples.sort(key=lambda s: s.key)
    source.skipped = sorted(problems.skipped, key=lambda d: (d["path"], d["key"]))
    if not source.samples:
        extra = ""
        if source.skipped:
            first = source.skipped[0]
            extra = (f" (all {len(source.skipped)} candidate(s) were skipped; first: "
                     f"{first['path']}: {first['reason']})")
        raise EmptySourceError(f"{show(path)}: nothing to pack{extra}; check the path and --input")
    return source


# ---------------------------------------------------------------- file access: local, or a URL
def _readable(path: str) -> bool:
    """Object stores have no permission bits to check up front: reading them tells."""
    return is_url(path) or os.access(path, os.R_OK)


def _open(path: str | os.PathLike[str]) -> Any:
    """Open a source file (or an object, through fsspec) for reading bytes."""
    if is_url(path):
        from fastfeed.packing.srcurl import open_url

        return open_url(str(path))
    return open(path, "rb")
