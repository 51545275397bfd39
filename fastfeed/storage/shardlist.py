"""From what a user passes to the list of shard paths/URLs: folders, patterns, globs, lists.

The forms webdataset users know: a folder or prefix (its ``.tar``/``.tgz``/``.tar.gz``
files), one shard, a brace pattern (``shard-{000000..000099}.tar``), ``::``-joined
patterns, a glob, or a list of any of these; local paths or fsspec URLs.

Example:
    >>> expand_shards("s3://bucket/train/shard-{000..002}.tar")
    ['s3://bucket/train/shard-000.tar', 's3://bucket/train/shard-001.tar', 's3://bucket/train/shard-002.tar']
"""

from __future__ import annotations

import glob as _glob
import os
import re
from typing import Any, Mapping, Sequence

from fastfeed.errors import ConfigError
from fastfeed.storage.bounded import filesystem
from fastfeed.storage.remote import local_path
from fastfeed.storage.retry import policy_of, with_retries

__all__ = ["SHARD_SUFFIXES", "expand_braces", "expand_shards", "is_shard_name"]

#: File name endings recognised as shards when a folder or prefix is listed.
SHARD_SUFFIXES = (".tar", ".tgz", ".tar.gz")


def expand_braces(pattern: str) -> list[str]:
    """Expand shell-style braces: ``{a,b}`` lists and ``{000..009}`` / ``{a..e}`` ranges.

    Zero-padding follows the wider endpoint when either has a leading zero, and
    braces nest; a brace group that is neither stays literal.

    Example:
        >>> expand_braces("s-{008..010}.tar")
        ['s-008.tar', 's-009.tar', 's-010.tar']
        >>> expand_braces("{train,val}/{a,b{1..2}}")
        ['train/a', 'train/b1', 'train/b2', 'val/a', 'val/b1', 'val/b2']
    """
    start = pattern.find("{")
    while start >= 0:
        end = _matching_brace(pattern, start)
        if end < 0:
            return [pattern]
        alternatives = _brace_alternatives(pattern[start + 1:end])
        if alternatives is not None:
            head, tails = pattern[:start], expand_braces(pattern[end + 1:])
            return [head + a + t for alt in alternatives for a in expand_braces(alt) for t in tails]
        start = pattern.find("{", start + 1)
    return [pattern]


def _matching_brace(s: str, start: int) -> int:
    depth = 0
    for i in range(start, len(s)):
        depth += {"{": 1, "}": -1}.get(s[i], 0)
        if depth == 0:
            return i
    return -1


def _brace_alternatives(body: str) -> list[str] | None:
    parts, depth, cur = [], 0, []
    for ch in body:
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
            continue
        depth += {"{": 1, "}": -1}.get(ch, 0)
        cur.append(ch)
    parts.append("".join(cur))
    if len(parts) > 1:
        return parts
    m = re.fullmatch(r"(-?\d+)\.\.(-?\d+)(?:\.\.(-?\d+))?", body)
    if m:
        a, b = int(m.group(1)), int(m.group(2))
        step = abs(int(m.group(3) or 1)) or 1
        pad = any(len(x.lstrip("-")) > 1 and x.lstrip("-")[0] == "0" for x in m.group(1, 2))
        width = max(len(m.group(1)), len(m.group(2))) if pad else 0
        seq = range(a, b + 1, step) if a <= b else range(a, b - 1, -step)
        return [str(n).zfill(width) for n in seq]
    m = re.fullmatch(r"([A-Za-z])\.\.([A-Za-z])", body)
    if m:
        a, b = ord(m.group(1)), ord(m.group(2))
        return [chr(c) for c in (range(a, b + 1) if a <= b else range(a, b - 1, -1))]
    return None


def is_shard_name(name: str) -> bool:
    """True for names ending in ``.tar``, ``.tgz`` or ``.tar.gz`` (any case)."""
    return name.lower().endswith(SHARD_SUFFIXES)


def expand_shards(
    spec: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    storage_options: Mapping[str, Any] | None = None,
) -> list[str]:
    """Turn what a user passes into the ordered list of shard paths/URLs.

    Accepts a folder or prefix (its ``.tar``/``.tgz``/``.tar.gz`` files, sorted by
    name, not recursive), one shard, a brace pattern, a glob (``*``, ``?``, ``[``),
    ``::``-joined patterns, or a list of any of these. Order is kept as given;
    folders and globs are sorted.

    Example:
        >>> expand_shards(["s3://b/x-{0..1}.tar", "/d/y.tgz"])
        ['s3://b/x-0.tar', 's3://b/x-1.tar', '/d/y.tgz']
    """
    if isinstance(spec, (str, os.PathLike)):
        items = [p for p in str(spec).split("::") if p]
    else:
        items = [str(p) for p in spec]
    if not items:
        raise ConfigError("no shards given; pass a folder, a shard, a brace pattern or a list of shards")
    if any(s.startswith("pipe:") for s in items):
        raise ConfigError(
            "pipe: URLs run shell commands, which fastfeed does not do; pass the http(s):// or "
            "s3:// URL (or any fsspec URL) directly"
        )
    out: list[str] = []
    for item in items:
        for one in expand_braces(item):
            out.extend(_expand_one(one, storage_options))
    return out


def _expand_one(path: str, storage_options: Mapping[str, Any] | None) -> list[str]:
    local = local_path(path)
    has_glob = any(c in path.split("://")[-1] for c in "*?[")
    if local is not None:
        if has_glob:
            return sorted(p for p in _glob.glob(local) if is_shard_name(p) and os.path.isfile(p))
        if os.path.isdir(local):
            return sorted(e.path for e in os.scandir(local) if is_shard_name(e.name) and e.is_file())
        if not is_shard_name(local) and not os.path.exists(local):
            raise ConfigError(f"{path}: no such file or folder; check the path")
        return [local]
    if is_shard_name(path) and not has_glob:
        return [path]
    policy = policy_of(storage_options)  # the timeout and retries of each listing request
    fs, fpath = filesystem(path, storage_options, retry=policy)
    protocol = path.split("://", 1)[0]

    def url(p: str) -> str:
        return p if "://" in p else f"{protocol}://{p}"

    if has_glob:
        found = with_retries(lambda: fs.glob(fpath), path, "listing", policy)
        return sorted(url(p) for p in found if is_shard_name(p))
    if with_retries(lambda: fs.isdir(fpath), path, "listing", policy):
        found = with_retries(lambda: fs.ls(fpath, detail=False), path, "listing", policy)
        return sorted(url(p) for p in found if is_shard_name(p))
    if not with_retries(lambda: fs.exists(fpath), path, "listing", policy):
        raise ConfigError(
            f"{path}: nothing there (no index.json, no shards); check the URL, and the endpoint "
            "and credentials (storage_options or AWS_* environment variables)"
        )
    return [path]
