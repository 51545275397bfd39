"""The :class:`~fastfeed.packing.sources.base.Source` of inputs listed sample by sample.

An ImageFolder, files grouped by key (:mod:`~fastfeed.packing.sources.folder`), a JSONL manifest
(:mod:`~fastfeed.packing.sources.jsonl`) or WebDataset tars (:mod:`~fastfeed.packing.sources.webdataset`),
on disk or on object storage, become a :class:`SampleSource`: its units are the samples
(:class:`~fastfeed.packing.sources.base.SampleSpec`, sorted by key), each planned whole, so
shards get counts within one of each other. :func:`listed_source` runs the checks every listing
gets (files from outside the source refused or counted, ``--length`` present, image headers probed
with ``on_error="skip"``, sorted, not empty);
:class:`~fastfeed.packing.sources.reader.SampleReader` reads the samples back for the writer.

Example:
    >>> spec = SampleSpec("a", (Member("txt", "a.txt", 11, 0),))
    >>> src = SampleSource("files", "/data", "/data", "/data", "/data", (spec,))
    >>> src.measure(spec, "tar"), src.fields.names
    (Measure(rows=1, size=1024, files=1, nbytes=11), {'txt': 'txt'})
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, Iterator, Mapping, Sequence

from fastfeed import __version__
from fastfeed.errors import BadFileError, ConfigError, EmptySourceError, SourceError, UnsafePathError
from fastfeed.formats.images import looks_like_image
from fastfeed.formats.naming import is_image
from fastfeed.packing.sources.base import (
    OUTSIDE_FIX,
    Content,
    Fields,
    Item,
    Measure,
    Member,
    Reading,
    SampleSpec,
    outside_entry,
    parse_length,
    resolve_length_member,
    show,
)
from fastfeed.packing.sources.reader import SampleReader
from fastfeed.packing.sources.tree import Listing, Problems, Tree

__all__ = ["SampleSource", "listed_source", "probe"]

log = logging.getLogger("fastfeed.pack")

_TAR_MEMBER_OVERHEAD = 512


@dataclass(frozen=True)
class SampleSource:
    """A validated listed input: samples sorted by key plus what was left out and why.

    See :class:`~fastfeed.packing.sources.base.Source` for the attributes; besides,
    ``manifest`` (the JSONL manifest's name inside ``root``, else None) and ``manifest_sha256``
    (its checksum, part of the content id).

    Example:
        >>> src = SampleSource("files", "/d", "/d", "/d", "/d", (), outside={"files": 2, "roots": ["/x"]})
        >>> src.for_writer().outside
        {'files': 2, 'roots': ['/x']}
    """

    kind: str
    src: str
    shown: str
    root: str
    location: str
    units: tuple[SampleSpec, ...]
    classes: tuple[str, ...] | None = None
    skipped: tuple[dict[str, str], ...] = ()
    ignored: tuple[str, ...] = ()
    manifest: str | None = None
    manifest_sha256: str | None = None
    has_labels: bool = False
    outside: Mapping[str, Any] | None = None

    #: a unit is one sample: shards are dealt counts within one of each other
    blocks = False

    @property
    def identity(self) -> str:
        """The manifest's sha256 (its lines are re-read when writing), else ``""``."""
        return self.manifest_sha256 or ""

    @property
    def fields(self) -> Fields:
        """Every member field and JSONL key of the samples (a JSON key names the field it is stored in)."""
        names: dict[str, str] = {}
        for s in self.units:
            for m in s.members:
                names.setdefault(m.field, m.field)
                if m.json_key is not None:
                    names.setdefault(m.json_key, m.field)
        return Fields(names, tuple(names))

    def measure(self, unit: SampleSpec, fmt: str) -> Measure:
        """One sample: its estimated bytes in a ``fmt`` shard (source sizes; inline JSON ~ its line)."""
        total = 0
        inline = unit.line[1] if unit.line is not None else 0
        files = nbytes = 0
        for m in unit.members:
            size = m.size if m.path is not None else len(m.data) if m.data is not None else inline
            if m.path is not None:
                files += 1
                nbytes += m.size
            if fmt == "tar":
                total += _TAR_MEMBER_OVERHEAD + size + (-size % 512)
            else:
                total += 16 + len(m.field) + size
        if fmt == "lmdb":
            total = 4096 * math.ceil((total + 64) / 4096) if total > 2000 else total + 64
        return Measure(1, total, files, nbytes)

    def split(self, shard_bytes: int, shard_rows: int | None) -> "SampleSource":
        """Itself: a sample is never cut."""
        return self

    def content(self, shards: Sequence[tuple[Sequence[Any], Sequence[bool]]], options: Mapping[str, Any],
                tokenizer: str | None) -> Content:
        """Hash of what the output is made of: options, sample keys, fields, paths, sizes, raw flags."""
        pillow = _pillow_version() if options.get("max_side") is not None else None
        h = hashlib.sha256()
        h.update(json.dumps([__version__, self.kind, dict(options), pillow, self.classes, self.manifest_sha256,
                             *([tokenizer] if tokenizer is not None else [])], default=str).encode())
        for units, raw in shards:
            h.update(b"|shard")
            if raw:
                h.update(bytes(raw))
            for s in units:
                h.update(repr((s.key, s.label, [(m.field, m.path, m.size, m.data, m.json_key)
                                                + (() if m.offset is None else (m.offset,))
                                                for m in s.members])).encode("utf-8", "surrogateescape"))
        return Content(h.hexdigest()[:32], pillow)

    def for_writer(self) -> "SampleSource":
        """Without its samples (each shard carries its own), skips and ignored names (``outside``,
        a count and a few folders, stays: the index records it)."""
        return replace(self, units=(), skipped=(), ignored=())

    def read(self, units: Sequence[SampleSpec], raw: Sequence[bool], reading: Reading) -> Iterator[Item]:
        """The samples ``units``, read (see :class:`~fastfeed.packing.sources.reader.SampleReader`)."""
        reader = SampleReader(self.root, self.manifest, cls_labels=self.kind in ("files", "webdataset"))
        return reader.read(units, raw, reading)


def _pillow_version() -> str:
    import PIL

    return str(PIL.__version__)


def listed_source(listing: Listing, tree: Tree, problems: Problems, *, src: str, location: str,
                  on_error: str, length: str | None, allow_outside: bool = False,
                  probe_threads: int = 8) -> SampleSource:
    """The checks every listing gets (local or URL), then sorted: raises, or returns the source.

    Args:
        listing: what the scan of ``tree`` found.
        tree: where it lives (``probe`` reads image headers from it).
        problems: the problems found so far (raised here with ``on_error="raise"``).
        src: the input as the plan names it (a folder, a manifest, a URL); messages name it.
        location: its resume identity (the resolved path, or the URL).
        on_error, length, allow_outside: ``pack``'s options.

    Raises:
        SourceError: the first problem (``raise``), or EmptySourceError when nothing is left.
    """
    if not allow_outside:
        _refuse_outside(listing, tree, problems)
    _check_lengths(listing, length, problems)
    if on_error == "skip":
        probe(listing, tree, problems, probe_threads)
    problems.raise_if_any()
    listing.samples.sort(key=lambda s: s.key)
    skipped = sorted(problems.skipped, key=lambda d: (d["path"], d["key"]))
    if not listing.samples:
        extra = ""
        if skipped:
            first = skipped[0]
            extra = (f" (all {len(skipped)} candidate(s) were skipped; first: "
                     f"{first['path']}: {first['reason']})")
        raise EmptySourceError(f"{show(src)}: nothing to pack{extra}; check the path and --input")
    outside = outside_entry(m.outside for s in listing.samples for m in s.members if m.outside is not None)
    if outside is not None:
        log.info("%s: %d file(s) packed from outside it (allow_outside), from %s", show(src), outside["files"],
                    ", ".join(show(r) for r in outside["roots"]))
    return SampleSource(listing.kind, src, show(src), listing.root, location, tuple(listing.samples),
                        listing.classes, tuple(skipped), tuple(listing.ignored), listing.manifest,
                        listing.manifest_sha256, listing.has_labels, outside)


def _refuse_outside(listing: Listing, tree: Tree, problems: Problems) -> None:
    """Report every file of a folder (or of its tars) that resolves outside it, and leave its samples
    out. (A manifest's paths are checked line by line, where the line is known.)"""
    keep = []
    reported: set[str] = set()
    for s in listing.samples:
        out = [m for m in s.members if m.outside is not None and m.path is not None]
        if not out:
            keep.append(s)
            continue
        for m in out:
            if m.path in reported:
                continue
            reported.add(m.path or "")
            real = tree.outside(m.path or "") or m.outside
            problems.report(UnsafePathError, m.path or "", f"resolves outside SRC (to {show(str(real))}, through "
                            "a symlink)", f"{OUTSIDE_FIX}, copy the file into SRC instead of linking to it, or pass "
                            "--on-error skip", s.key)
    listing.samples = keep


def _check_lengths(src: Listing, spec: str | None, problems: Problems) -> None:
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


def probe(src: Listing, tree: Tree, problems: Problems, threads: int = 8) -> None:
    """Read the first bytes of every image file and drop samples whose images are not.

    Used with ``on_error="skip"`` so that bad files are known before shards are cut
    (shards then stay balanced); with ``"raise"`` the same check runs while writing.
    """
    todo = [(i, m) for i, s in enumerate(src.samples) for m in s.members
            if m.path is not None and is_image(m.field)]

    def head(m: Member) -> str | None:
        try:
            with tree.open(m.path or "") as f:
                if m.offset is not None:  # a member of a WebDataset tar
                    f.seek(m.offset)
                data = f.read(min(32, m.size) if m.offset is not None else 32)
        except OSError as e:
            return f"cannot read ({e.strerror})"
        if looks_like_image(data, m.field):
            return None
        return f"has an image extension but is not an image (starts with {data[:8]!r})"

    with ThreadPoolExecutor(threads) as ex:
        results = list(ex.map(lambda im: head(im[1]), todo))
    bad: set[int] = set()
    for (i, m), why in zip(todo, results):
        if why is not None and i not in bad:
            bad.add(i)
            where = (m.path or "") if m.offset is None else f"{m.path}:{src.samples[i].key}.{m.field}"
            problems.report(BadFileError, where, why, "fix or remove the file", src.samples[i].key)
    if bad:
        src.samples = [s for i, s in enumerate(src.samples) if i not in bad]
