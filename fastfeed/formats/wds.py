"""Existing WebDataset tars: their samples and byte spans, read from member headers only.

:func:`scan_tar` reads the headers of one uncompressed tar (tarfile seeks over member
data) and returns, per sample, its key and the byte span of its members, as
:func:`fastfeed.packed.foreign.scan_index` needs to index tars that have no fastfeed index.

Keys are the one key rule, WebDataset's (:func:`fastfeed.formats.naming.split_key`):
adjacent members with the same key form one sample, members with no key (no dot in the
base name, ``__dunder__/`` metadata) and non-file members are not sample data, and a
repeated field in one sample is an error. One deliberate difference: a hidden file in a
folder (``train/._0001.jpg``, as macOS tar adds) would be a sample keyed ``train/`` in
webdataset; fastfeed leaves it out of every sample and lists it in ``ScannedShard.ignored``
(the index's ``skipped``).

Example:
    >>> s = scan_tar("/data/shard-000000.tar", name="shard-000000.tar")  # doctest: +SKIP
    >>> s.keys[:2], s.fields                                             # doctest: +SKIP
    (['n01440764/1', 'n01440764/2'], {'cls', 'jpg'})
"""

from __future__ import annotations

import logging
import os
import tarfile
from dataclasses import dataclass, field
from typing import BinaryIO

from fastfeed.errors import ShardError
from fastfeed.formats.naming import is_hidden, split_key

__all__ = ["ScannedShard", "scan_tar"]

log = logging.getLogger(__name__)

_BLOCK = 512


@dataclass
class ScannedShard:
    """What scanning one tar found: per sample (key, offset, span) and the fields seen."""

    url: str
    bytes: int
    keys: list[str] = field(default_factory=list)
    spans: list[tuple[int, int]] = field(default_factory=list)
    fields: set[str] = field(default_factory=set)
    problem: str | None = None
    ignored: list[str] = field(default_factory=list)
    #: with ``scan_tar(members=True)``: per sample, its members as (field, data offset, size)
    members: list[list[tuple[str, int, int]]] = field(default_factory=list)


def scan_tar(file: str | os.PathLike[str] | BinaryIO, *, name: str | None = None,
             on_error: str = "raise", members: bool = False) -> ScannedShard:
    """Scan an uncompressed tar (path or seekable file) into webdataset samples.

    ``name`` names the tar in messages (default: the path). With ``members``, every
    sample's members are listed too (``ScannedShard.members``: what ``pack`` reads to
    convert the tar member by member).

    Only headers are read (tarfile seeks over member data). A damaged header in the
    middle, or members running past the end of the file, raise ShardError naming the
    offset; with ``on_error="skip"`` the samples before it are kept and
    ``problem`` says what was lost.

    Example:
        >>> s = scan_tar("/data/shard-000000.tar", name="shard-000000.tar")  # doctest: +SKIP
        >>> s.keys[:2], s.spans[:2]                                          # doctest: +SKIP
        (['n01440764/1', 'n01440764/2'], [(0, 110592), (110592, 98304)])
    """
    is_path = isinstance(file, (str, os.PathLike))
    name = name or (str(file) if is_path else getattr(file, "name", "<stream>"))
    try:
        f: BinaryIO = open(file, "rb") if is_path else file  # type: ignore[arg-type]
    except FileNotFoundError:
        raise ShardError(f"{name}: shard is missing; restore it or fix the path") from None
    try:
        end_of_file = f.seek(0, os.SEEK_END)
        f.seek(0)
        out = ScannedShard(url=name, bytes=end_of_file)
        _scan_members(f, out, end_of_file, on_error, members)
        return out
    finally:
        if is_path:
            f.close()


def _scan_members(f: BinaryIO, out: ScannedShard, end_of_file: int, on_error: str, members: bool) -> None:
    name = out.url
    current: list[tuple[str, int, int]] = []

    def close(k: str, start: int, stop: int) -> None:
        out.keys.append(k)
        out.spans.append((start, stop - start))
        if members:
            out.members.append(current.copy())
    try:
        tf = tarfile.open(fileobj=f, mode="r:")
    except tarfile.TarError as e:
        if end_of_file == 0:
            return
        raise ShardError(f"{name}: not a tar archive ({e}); check the file, or re-download it") from None
    key: str | None = None
    start = stop = 0
    exts: set[str] = set()
    problem = None
    try:
        for m in tf:
            parts = split_key(m.name) if m.isreg() else None
            if parts is None:
                continue  # not sample data; the readers skip it inside a span too
            if is_hidden(m.name):
                # webdataset makes ``a/b/.x.txt`` a sample keyed ``a/b/``: keep it out of
                # every sample's byte span, and report it as skipped
                if key is not None:
                    close(key, start, stop)
                    key = None
                out.ignored.append(m.name)
                continue
            k, ext = parts
            if k != key:
                if key is not None:
                    close(key, start, stop)
                key, start, exts = k, m.offset, set()
                current.clear()
            if ext in exts:
                raise ShardError(
                    f"{name}: member {m.name!r} repeats field '{ext}' of sample '{k}' (webdataset "
                    "rejects this too); rename one of them"
                )
            exts.add(ext)
            out.fields.add(ext)
            current.append((ext, m.offset_data, m.size))
            stop = m.offset_data + m.size + (-m.size % _BLOCK)
            if m.offset_data + m.size > end_of_file:
                problem = f"member {m.name!r} at offset {m.offset} runs past the end of the file (truncated)"
                key = None
                break
    except tarfile.TarError as e:
        problem = f"corrupt tar data after offset {start} ({e})"
    if key is not None:
        close(key, start, stop)
    problem = problem or _trailing_garbage(f, tf.offset, end_of_file)
    if out.ignored:
        log.warning(
            "%s: skipped %d hidden member(s) such as %r (webdataset would yield each as a sample "
            "keyed by its folder); they are listed in the index's `skipped`",
            name, len(out.ignored), out.ignored[0],
        )
    if problem is not None:
        msg = f"{name}: {problem}; {len(out.keys)} samples before it are readable"
        if on_error != "skip":
            raise ShardError(msg + "; re-download or repair the shard, or pass on_error='skip' to use them")
        log.warning("%s (skipping the rest of the shard)", msg)
        out.problem = problem


def _trailing_garbage(f: BinaryIO, offset: int, end_of_file: int) -> str | None:
    """Where tarfile stopped must be the end-of-archive marker (zeros) or the end of file.

    tarfile silently stops at an invalid header after the first one; that would lose
    every sample after it without a word.
    """
    if offset >= end_of_file:
        return None
    f.seek(offset)
    block = f.read(_BLOCK)
    if block.count(0) == len(block) and len(block) == _BLOCK:
        return None
    if len(block) < _BLOCK:
        return f"truncated tar header at offset {offset}"
    return f"invalid tar header at offset {offset}"


