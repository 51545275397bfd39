"""List, group and validate the input of ``pack``; decide nothing about shards.

Three inputs, detected or chosen (``input=``):

- ``imagefolder``: ``SRC/<class>/.../<name>.<image ext>``, one sample per image with the
  class index (classes sorted by name, as torchvision numbers them) in a ``cls`` field;
  files directly in SRC (``labels.txt``, a README) are not samples and are reported;
- ``files``: every file, grouped into samples by key (WebDataset convention:
  ``a/b/0001.jpg`` + ``a/b/0001.json`` = sample ``a/b/0001`` with fields ``jpg``, ``json``);
- ``jsonl``: a manifest, one JSON object per line. A string field naming an existing file
  (relative to the manifest) is read from disk; other strings are stored as text, other
  values as JSON (:mod:`fastfeed.packing.sources.jsonl` reads it; see
  :func:`~fastfeed.packing.sources.jsonl.member_name` for the member names).

Auto-detection: a ``.jsonl``/``.ndjson`` file is a manifest; a folder of tar shards only is
``webdataset`` (converted member by member, :mod:`fastfeed.packing.sources.webdataset`); a folder whose files all sit
in sub-folders and carry image extensions is an ImageFolder, also when a few stray
non-image files (a README, ``Thumbs.db``: at most one per class folder, or 1%) sit among
them: those are left out and listed in ``Source.skipped``; a folder whose non-image files
share keys with images (``0001.jpg`` + ``0001.json``), or with no class sub-folders, is
files; many unrelated non-images among the images are an error that names both ways out.

The source lives in a *tree* (:mod:`fastfeed.packing.sources.tree`): a local folder or an
object-store prefix (:mod:`fastfeed.packing.sources.remote`); :func:`scan` is the one scan over
either. Names starting with ``.`` (``.DS_Store``, ``.git``) are never samples; they are
listed in ``Source.ignored``. Every other problem is a :class:`~fastfeed.errors.SourceError`
that names the path and the fix, collected by :class:`~fastfeed.packing.sources.base.Problems`:
with ``on_error="raise"`` the scan raises the first one (mentioning how many more there
are), with ``"skip"`` the sample is left out and recorded.

Example:
    >>> src = scan("imagenet/train", input=None, on_error="raise")  # doctest: +SKIP
    >>> src.kind, len(src.samples), src.classes[:2]                  # doctest: +SKIP
    ('imagefolder', 1281167, ('n01440764', 'n01443537'))
"""

from __future__ import annotations

import logging
import os
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from fastfeed.errors import (
    BadFileError,
    ConfigError,
    DuplicateKeyError,
    EmptySourceError,
    SourceError,
    UnsafePathError,
)
from fastfeed.formats.images import looks_like_image
from fastfeed.formats.naming import field_ext, is_image, is_metadata, split_key
from fastfeed.packing.sources.jsonl import manifest_source
from fastfeed.packing.sources.base import (
    FileEntry,
    Member,
    Problems,
    SampleSpec,
    Source,
    key_problem,
    parse_length,
    resolve_length_member,
    show,
    text_problem,
)
from fastfeed.packing.sources.remote import UrlTree
from fastfeed.packing.sources.tree import LocalTree, Tree
from fastfeed.packing.sources.webdataset import is_tar_source, webdataset_source
from fastfeed.storage.remote import is_url
from fastfeed.storage.shardlist import is_shard_name

__all__ = ["probe", "scan"]

log = logging.getLogger("fastfeed.pack")


# ---------------------------------------------------------------- folders
def _detect(files: list[FileEntry], top_dirs: list[str], where: str) -> tuple[str, str, frozenset[str]]:
    """Pick ``imagefolder`` or ``files`` for a listed folder: (kind, reason, stray files).

    An ImageFolder may hold a few stray non-image files in its class folders (a README, a
    ``Thumbs.db``): they are returned, to be left out and reported. A non-image file that
    shares its key with an image (``0001.jpg`` + ``0001.json``) makes samples of several
    files: ``files``. Many unrelated non-images next to the images are neither: SourceError.
    """
    if not top_dirs:
        return "files", "no class sub-folders", frozenset()
    nested: list[str] = []
    for f in files:
        if "/" in f.rel:
            nested.append(f.rel)
        elif _image_name(f.rel):
            return "files", f"image {show(f.rel)} sits at the top level", frozenset()
    others = [r for r in nested if not _image_name(r)]
    if not others:
        return "imagefolder", "every file sits in a class folder and is an image", frozenset()
    image_keys = {_key_of(r) for r in nested if _image_name(r)}
    if not image_keys:
        return "files", f"no images in the sub-folders ({show(others[0])}, ...)", frozenset()
    paired = next((r for r in others if _key_of(r) in image_keys), None)
    if paired is not None:
        return "files", f"{show(paired)} shares its key with an image (samples of several files)", frozenset()
    if len(others) <= max(len(top_dirs), len(nested) // 100):
        return "imagefolder", f"images in class folders, {len(others)} stray non-image file(s)", frozenset(others)
    shown = ", ".join(show(r) for r in others[:3])
    raise SourceError(
        f"{show(where)}: not an ImageFolder: {len(others)} of {len(nested)} files in its sub-folders are not "
        f"images (e.g. {shown}) and share no key with an image; pass --input imagefolder --on-error skip to "
        "pack the images with their class labels and leave the rest out (listed in skipped.txt), or --input "
        "files to pack every file as a sample of its own (labels then come only from .cls files)")


def _image_name(rel: str) -> bool:
    base = rel.rpartition("/")[2]
    return "." in base and is_image(base)


def _key_of(rel: str) -> str:
    parts = split_key(rel)
    return parts[0] if parts is not None else rel


def _imagefolder(tree: Tree, files: list[FileEntry], top_dirs: list[str], problems: Problems,
                 strays: frozenset[str] = frozenset()) -> Source:
    classes = tuple(sorted(top_dirs))
    index = {c: i for i, c in enumerate(classes)}
    candidates: dict[str, list[tuple[FileEntry, str]]] = defaultdict(list)
    ignored: list[str] = []
    for f in files:
        if "/" not in f.rel:
            ignored.append(f.rel)
            continue
        if f.rel in strays:
            problems.leave_out(f.rel, "not an image: a stray file in a class folder of an ImageFolder "
                               "(pass --input files to pack every file)")
            continue
        folder, _, base = f.rel.rpartition("/")
        stem, dot, ext = base.rpartition(".")
        ext = field_ext(ext)
        if not dot or not stem or not is_image(ext):
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
        if not _file_ok(problems, tree, f, key):
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
                    show(tree.root), len(empty), ", ".join(show(c) for c in empty[:5]))
    return Source("imagefolder", tree.root, samples, classes=classes, ignored=ignored, has_labels=True)


def _report_duplicates(problems: Problems, key: str, by_field: dict[str, list[FileEntry]]) -> bool:
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


def _files(tree: Tree, files: list[FileEntry], problems: Problems) -> Source:
    groups: dict[str, list[tuple[FileEntry, str]]] = defaultdict(list)
    for f in files:
        parts = split_key(f.rel)
        if is_metadata(f.rel):
            problems.report(BadFileError, f.rel, "a name under a top-level __name__ folder is metadata to "
                            "WebDataset readers, not a sample", "move or rename it, or pass --on-error skip")
            continue
        if parts is None or not all(parts[1].split(".")):
            problems.report(BadFileError, f.rel, "no usable extension (files are grouped as KEY.EXT)",
                            "rename it to KEY.EXT or remove it, or pass --on-error skip")
            continue
        key, ext = parts
        if (why := key_problem(key) or text_problem(ext)) is not None:
            problems.report(UnsafePathError, f.rel, f"unusable name: {why}", "rename it, or pass --on-error skip")
            continue
        groups[key].append((f, field_ext(ext)))
    samples: list[SampleSpec] = []
    for key, group in groups.items():
        bad = [f for f, _ in group if not _file_ok(problems, tree, f, key)]
        if bad:
            continue
        by_field: dict[str, list[FileEntry]] = defaultdict(list)
        for f, fld in group:
            by_field[fld].append(f)
        if _report_duplicates(problems, key, by_field):
            continue
        members = tuple(Member(fld, fs[0].rel, fs[0].size, fs[0].mtime_ns) for fld, fs in sorted(by_field.items()))
        samples.append(SampleSpec(key, members))
    has_labels = any(m.field == "cls" for s in samples for m in s.members)
    return Source("files", tree.root, samples, has_labels=has_labels)


def _file_ok(problems: Problems, tree: Tree, f: FileEntry, key: str) -> bool:
    """Zero-byte and unreadable files are problems; True when ``f`` can be packed."""
    if f.size == 0:
        problems.report(BadFileError, f.rel, "zero-byte file",
                        "remove it or copy it again, or pass --on-error skip", key)
        return False
    if not tree.readable(f.rel):
        problems.report(BadFileError, f.rel, "not readable (permission denied)",
                        "fix its permissions (chmod a+r), or pass --on-error skip", key)
        return False
    return True



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
def probe(src: Source, tree: Tree, problems: Problems, threads: int = 8) -> None:
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


# ---------------------------------------------------------------- entry point
def scan(src: str | os.PathLike[str], *, input: str | None, on_error: str,
         length: str | None = None, probe_threads: int = 8) -> Source:
    """List and validate ``src`` (a local path or an object-store URL); samples come back sorted by key.

    Args:
        src: an ImageFolder or files folder (or prefix), or a JSONL manifest.
        input: ``imagefolder``, ``files``, ``jsonl``, ``webdataset`` (a folder of tars), or None to detect.
        on_error: ``raise`` raises the first problem; ``skip`` records it in ``Source.skipped``.
        length: ``pack --length`` (checked for presence here; read when writing).

    Raises:
        SourceError: a subclass naming the path and the fix (``raise``), or
        EmptySourceError when nothing is left to pack.
    """
    tree, manifest = _locate(src)
    problems = Problems(on_error, tree.shown)
    if manifest is not None:
        source = manifest_source(tree, manifest, input, problems)
    elif input == "jsonl":
        raise ConfigError(f"{show(tree.shown)}: is a {tree.folder}, but --input jsonl needs a manifest {tree.noun}")
    else:
        files, top_dirs, ignored = tree.list(problems)
        kind = input
        strays: frozenset[str] = frozenset()
        if kind is None and is_tar_source(files):
            kind = "webdataset"
            log.info("%s: packing as webdataset (every file is a tar shard: converted member by member)",
                     show(tree.shown))
        if kind is None:
            kind, why, strays = _detect(files, top_dirs, tree.shown)
            log.info("%s: packing as %s (%s)", show(tree.shown), kind, why)
        if strays:
            log.warning("%s: packing as an ImageFolder; %d stray non-image file(s) in its class folders are "
                        "left out (listed in skipped.txt): %s; pass --input files to pack every file instead",
                        show(tree.shown), len(strays), ", ".join(show(p) for p in sorted(strays)[:5]))
        if kind == "imagefolder":
            source = _imagefolder(tree, files, top_dirs, problems, strays)
        elif kind == "webdataset":
            source = webdataset_source(tree, files, problems)
        else:
            source = _files(tree, files, problems)
            _warn_tars(tree, files)
        if source.ignored and kind == "imagefolder":
            log.warning("%s: %d file(s) at the top level of an ImageFolder are not samples: %s",
                        show(tree.shown), len(source.ignored), ", ".join(show(p) for p in source.ignored[:5]))
        if ignored:
            log.info("%s: %d hidden name(s) (starting with '.') left out, e.g. %s",
                     show(tree.shown), len(ignored), show(ignored[0]))
        source.ignored = ignored + source.ignored
    where = tree.shown if manifest is None else tree.path(manifest)
    return _finish(source, tree, problems, where, on_error, length, probe_threads)


def _warn_tars(tree: Tree, files: list[FileEntry]) -> None:
    """Tars among other files are packed whole (one ``tar`` field); say how to convert them instead."""
    tars = [f.rel for f in files if is_shard_name(f.rel)]
    if tars:
        log.warning("%s: %d tar file(s) such as %s are packed whole, one sample each (field 'tar'); a folder "
                    "holding only WebDataset tars is converted member by member (--input webdataset)",
                    show(tree.shown), len(tars), show(tars[0]))


def _locate(src: str | os.PathLike[str]) -> tuple[Tree, str | None]:
    """The tree of ``src`` and, when ``src`` is one file (a manifest), its name in that tree."""
    if is_url(src):
        url = str(src).rstrip("/")
        parent, _, name = url.rpartition("/")
        folder = UrlTree(parent)
        if folder.stat(name) is not None:
            return folder, name
        return UrlTree(url), None
    path = Path(src)
    if not path.exists():
        raise SourceError(f"{show(str(path))}: does not exist; pass the folder or JSONL manifest to pack")
    if path.is_file():
        return LocalTree(path.parent), path.name
    return LocalTree(path.resolve(), shown=str(path)), None


def _finish(source: Source, tree: Tree, problems: Problems, where: str, on_error: str, length: str | None,
            probe_threads: int) -> Source:
    """The checks every listed source gets (local or URL), then sort; raises or returns it."""
    _check_lengths(source, length, problems)
    if on_error == "skip":
        probe(source, tree, problems, probe_threads)
    problems.raise_if_any()
    source.samples.sort(key=lambda s: s.key)
    source.skipped = sorted(problems.skipped, key=lambda d: (d["path"], d["key"]))
    if not source.samples:
        extra = ""
        if source.skipped:
            first = source.skipped[0]
            extra = (f" (all {len(source.skipped)} candidate(s) were skipped; first: "
                     f"{first['path']}: {first['reason']})")
        raise EmptySourceError(f"{show(where)}: nothing to pack{extra}; check the path and --input")
    return source
