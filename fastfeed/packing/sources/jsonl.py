"""JSONL manifests as a ``pack`` input: one JSON object per line, one sample per object.

:func:`fastfeed.packing.sources.detect.open_source` calls :func:`manifest_source` when SRC is one file
(or object) of a :class:`~fastfeed.packing.sources.tree.Tree`. A string field naming an existing file
(relative to the manifest) is stored as a member read from that file, named by
:func:`~fastfeed.packing.sources.columns.member_name`; other strings are stored as text (``.txt``) and
other values as JSON (``.json``). ``__key__`` gives the sample key (default: the line
number), ``cls`` or ``label`` (an int) its label. Bad lines are reported with the line
number and the fix; with ``on_error="skip"`` they are left out and counted.

A field is a *file field* when one of its values names an existing file, or when every one of its
string values looks like the path of a media file (``img/0001.jpg``, ``a.wav``: an extension of
:data:`FILE_EXTENSIONS`): then each row's value must name a file, and a path that is missing is an
error naming the line, never stored as text. Each file must resolve inside the manifest's folder
(an absolute path elsewhere, a ``..`` that climbs out, a symlink out are refused) unless
``allow_outside``.

Example:
    >>> import pathlib, tempfile
    >>> from fastfeed.packing.sources.tree import LocalTree
    >>> tree = LocalTree(tempfile.mkdtemp())
    >>> _ = pathlib.Path(tree.root, "texts.jsonl").write_text('{"caption": "a cat"}\\n')
    >>> listing = read_manifest(tree, "texts.jsonl", Problems("raise", tree.shown))
    >>> listing.kind, [(s.key, s.members[0].field) for s in listing.samples]
    ('jsonl', [('000000000', 'caption.txt')])
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from typing import Any, Iterable

from fastfeed.errors import (
    BadFileError,
    ConfigError,
    DuplicateKeyError,
    SourceError,
    UnsafePathError,
)
from fastfeed.formats.naming import IMAGE_EXTENSIONS
from fastfeed.packing.sources.base import MANIFEST_SUFFIXES, OUTSIDE_FIX, Member, SampleSpec, key_problem, show
from fastfeed.packing.sources.columns import member_name
from fastfeed.packing.sources.tree import FileStat, Listing, Problems, Tree

__all__ = ["FILE_EXTENSIONS", "manifest_source", "read_manifest"]

_PATHLIKE = re.compile(r"[^\n\r\0]{1,1024}\.[A-Za-z0-9]{1,10}")
#: Extensions of files that are never text: a field whose string values all end so names files.
FILE_EXTENSIONS = IMAGE_EXTENSIONS | frozenset(
    "wav flac mp3 ogg opus m4a aac mp4 m4v webm mkv avi mov npy npz".split())


def _file_like(value: str) -> bool:
    """True when ``value`` looks like the path of a media file (not a text that ends in ``.com``)."""
    return _PATHLIKE.fullmatch(value) is not None and value.rpartition(".")[2].lower() in FILE_EXTENSIONS

def _manifest_lines(tree: Tree, name: str) -> Iterable[tuple[int, int, bytes]]:
    offset = 0
    with tree.open(name) as f:
        for n, line in enumerate(f):
            yield n, offset, line
            offset += len(line)


def manifest_source(tree: Tree, name: str, kind: str | None, problems: Problems,
                    allow_outside: bool = False) -> Listing:
    """The source of ``pack`` when SRC is one file (or object) ``name`` of ``tree``: a JSONL manifest
    (``allow_outside``: its paths may name files outside its folder).

    Raises:
        ConfigError: ``--input`` asks for a folder layout, or the name is not a manifest's
            (``.jsonl``/``.ndjson``/``.jsonlines``) and ``--input jsonl`` was not given.
    """
    shown = show(tree.path(name))
    if kind not in (None, "jsonl"):
        raise ConfigError(f"{shown}: is a {tree.noun}, but --input {kind} needs a {tree.container}")
    if kind is None and not name.lower().endswith(MANIFEST_SUFFIXES):
        raise ConfigError(f"{shown}: is a {tree.noun}; pass a {tree.container}, or a JSONL manifest "
                          "(name it .jsonl or pass --input jsonl)")
    return read_manifest(tree, name, problems, allow_outside)


def read_manifest(tree: Tree, name: str, problems: Problems, allow_outside: bool = False) -> Listing:
    """The samples of a JSONL manifest (one JSON object per line), checked line by line.

    A string field naming an existing file (relative to the manifest) becomes a member read
    from disk; other strings are stored as text and other values as JSON. Every bad line is
    reported to ``problems`` with its line number (``texts.jsonl:17``) and the fix: among them
    a file field's path that is missing, or (without ``allow_outside``) that resolves outside
    the manifest's folder (see the module doc).

    Example:
        >>> tree = LocalTree("data")                                                  # doctest: +SKIP
        >>> listing = read_manifest(tree, "texts.jsonl", Problems("raise", tree.shown))   # doctest: +SKIP
        >>> listing.kind, listing.manifest                                            # doctest: +SKIP
        ('jsonl', 'texts.jsonl')
    """
    digest = hashlib.sha256()
    records: list[tuple[int, int, int, dict[str, Any]]] = []
    for n, offset, line in _manifest_lines(tree, name):
        digest.update(line)
        text = line[3:] if n == 0 and line.startswith(b"\xef\xbb\xbf") else line
        if not text.strip():
            continue
        try:
            obj = json.loads(text)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            problems.report(BadFileError, f"{name}:{n + 1}", f"not valid JSON ({e})",
                            "fix the line, or pass --on-error skip")
            continue
        if not isinstance(obj, dict):
            problems.report(BadFileError, f"{name}:{n + 1}", "not a JSON object",
                            "write one {...} object per line, or pass --on-error skip")
            continue
        records.append((n, offset, len(line), obj))
    stats: dict[str, FileStat | None] = {}
    file_fields: set[str] = set()
    texts: set[str] = set()  # fields with a string value that names no media file
    for _, _, _, obj in records:
        for k, v in obj.items():
            if not isinstance(v, str) or not v:
                continue
            if not _file_like(v):
                texts.add(k)
            if _PATHLIKE.fullmatch(v):
                if v not in stats:
                    stats[v] = tree.stat(v)
                if stats[v] is not None:
                    file_fields.add(k)
    file_fields |= {k for _, _, _, obj in records for k, v in obj.items()
                    if isinstance(v, str) and v and k not in texts}  # every value a media path: files
    samples: list[SampleSpec] = []
    seen: dict[str, int] = {}
    for n, offset, length, obj in records:
        where = f"{name}:{n + 1}"
        sample = _jsonl_sample(tree, where, n, offset, length, obj, file_fields, stats, problems, allow_outside)
        if sample is None:
            continue
        if sample.key in seen:
            problems.report(DuplicateKeyError, where,
                            f"duplicate __key__ {show(sample.key)!r} (also line {seen[sample.key]})",
                            "make the keys unique, or pass --on-error skip", sample.key)
            continue
        seen[sample.key] = n + 1
        samples.append(sample)
    has_labels = any(s.label >= 0 for s in samples)
    return Listing("jsonl", tree.root, samples, manifest=name, manifest_sha256=digest.hexdigest(),
                  has_labels=has_labels)


def _jsonl_sample(tree: Tree, where: str, n: int, offset: int, length: int, obj: dict[str, Any],
                  file_fields: set[str], stats: dict[str, FileStat | None],
                  problems: Problems, allow_outside: bool) -> SampleSpec | None:
    key = obj.get("__key__", f"{n:09d}")
    if not isinstance(key, str) or (why := key_problem(key)) is not None:
        why = "__key__ is not a string" if not isinstance(key, str) else why
        problems.report(UnsafePathError, where, f"unusable __key__ {show(str(key))!r}: {why}",
                        "fix __key__ in the manifest, or pass --on-error skip")
        return None
    members: dict[str, Member] = {}
    for k in sorted(obj):
        v = obj[k]
        if k == "__key__" or v is None:
            continue
        if not k or any(c in k for c in "/\n\r\0"):
            problems.report(UnsafePathError, where, f"field name {show(k)!r} cannot be a member name",
                            "rename the field (no '/', newline or NUL), or pass --on-error skip", key)
            return None
        if k in file_fields:
            st = stats.get(v) if isinstance(v, str) else None
            if st is None:
                problems.report(BadFileError, where, f"field {k!r} names {show(str(v))!r}, which is not a file "
                                "(paths are relative to the manifest's folder)", "fix the path, or pass --on-error skip",
                                key)
                return None
            if st.st_size == 0 or not tree.readable(v):
                what = "a zero-byte file" if st.st_size == 0 else "an unreadable file"
                problems.report(BadFileError, where, f"field {k!r} names {what} ({show(v)})",
                                "fix or remove the file, or pass --on-error skip", key)
                return None
            real = tree.outside(v)
            if real is not None and not allow_outside:
                problems.report(UnsafePathError, where, f"field {k!r} names {show(v)!r}, which resolves outside "
                                f"the manifest's folder (to {show(real)})",
                                f"keep the files under the manifest's folder (or move the manifest up), "
                                f"{OUTSIDE_FIX}, or pass --on-error skip", key)
                return None
            m = Member(member_name(k, v.rpartition(".")[2]), v, st.st_size, st.st_mtime_ns,
                       outside=None if real is None else sys.intern(os.path.dirname(real)))
        else:
            m = Member(member_name(k, "txt" if isinstance(v, str) else "json"), None, 0, 0, json_key=k)
        if m.field in members:
            problems.report(DuplicateKeyError, where, f"fields {members[m.field].json_key or members[m.field].path!r} "
                            f"and {k!r} both map to member {m.field!r}",
                            "rename one of the fields, or pass --on-error skip", key)
            return None
        members[m.field] = m
    if not members:
        problems.report(SourceError, where, "the record has no fields to store",
                        "remove the line, or pass --on-error skip", key)
        return None
    label = -1
    for k in ("cls", "label"):
        v = obj.get(k)
        if isinstance(v, int) and not isinstance(v, bool):
            label = v
            break
    return SampleSpec(key, tuple(members[f] for f in sorted(members)), label, (offset, length))
