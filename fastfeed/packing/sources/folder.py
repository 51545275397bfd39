"""A listed folder (or prefix) as an ImageFolder or as files grouped by key; which of the two it is.

- ``imagefolder`` (:func:`imagefolder`): ``SRC/<class>/.../<name>.<image ext>``, one sample per
  image with the class index (classes sorted by name, as torchvision numbers them) in a ``cls``
  field; files directly in SRC (``labels.txt``, a README) are not samples and are reported;
- ``files`` (:func:`files_by_key`): every file, grouped into samples by key (WebDataset convention:
  ``a/b/0001.jpg`` + ``a/b/0001.json`` = sample ``a/b/0001`` with fields ``jpg``, ``json``).

:func:`detect` tells them apart: a folder whose files all sit in sub-folders and carry image
extensions is an ImageFolder, also when a few stray non-image files (a README, ``Thumbs.db``:
at most one per class folder, or 1%) sit among them: those are left out and listed in the
skips; a folder whose non-image files share keys with images (``0001.jpg`` + ``0001.json``),
or with no class sub-folders, is files; many unrelated non-images among the images are an
error that names both ways out. Every problem goes to the listing's
:class:`~fastfeed.packing.sources.tree.Problems`.

Example:
    >>> from fastfeed.packing.sources.tree import FileEntry
    >>> detect([FileEntry("cat/1.jpg", 10, 0), FileEntry("dog/2.jpg", 10, 0)], ["cat", "dog"], "train")[0]
    'imagefolder'
"""

from __future__ import annotations

import logging
from collections import defaultdict

from fastfeed.errors import BadFileError, DuplicateKeyError, SourceError, UnsafePathError
from fastfeed.formats.naming import field_ext, is_image, is_metadata, split_key
from fastfeed.packing.sources.base import Member, SampleSpec, key_problem, show, text_problem
from fastfeed.packing.sources.tree import FileEntry, Listing, Problems, Tree
from fastfeed.storage.shardlist import is_shard_name

__all__ = ["detect", "files_by_key", "imagefolder"]

log = logging.getLogger("fastfeed.pack")


# ---------------------------------------------------------------- folders
def detect(files: list[FileEntry], top_dirs: list[str], where: str) -> tuple[str, str, frozenset[str]]:
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


def imagefolder(tree: Tree, files: list[FileEntry], top_dirs: list[str], problems: Problems,
                strays: frozenset[str] = frozenset()) -> Listing:
    """The samples of an ImageFolder: one per image, labelled by its class folder (``strays``: left out)."""
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
        members = (Member("cls", None, 0, 0, data=b"%d" % label),
                   Member(ext, f.rel, f.size, f.mtime_ns, outside=f.outside))
        samples.append(SampleSpec(key, members, label))
    counts: dict[int, int] = defaultdict(int)
    for s in samples:
        counts[s.label] += 1
    empty = [c for c in classes if counts[index[c]] == 0]
    if empty:
        log.warning("%s: %d class folder(s) hold no images (%s); they keep their class index",
                    show(tree.root), len(empty), ", ".join(show(c) for c in empty[:5]))
    return Listing("imagefolder", tree.root, samples, classes=classes, ignored=ignored, has_labels=True)


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


def files_by_key(tree: Tree, files: list[FileEntry], problems: Problems) -> Listing:
    """Every file, grouped into samples by key; tars among other files are packed whole (warned)."""
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
        members = tuple(Member(fld, fs[0].rel, fs[0].size, fs[0].mtime_ns, outside=fs[0].outside)
                        for fld, fs in sorted(by_field.items()))
        samples.append(SampleSpec(key, members))
    has_labels = any(m.field == "cls" for s in samples for m in s.members)
    _warn_tars(tree, files)
    return Listing("files", tree.root, samples, has_labels=has_labels)


def _warn_tars(tree: Tree, files: list[FileEntry]) -> None:
    """Tars among other files are packed whole (one ``tar`` field); say how to convert them instead."""
    tars = [f.rel for f in files if is_shard_name(f.rel)]
    if tars:
        log.warning("%s: %d tar file(s) such as %s are packed whole, one sample each (field 'tar'); a folder "
                    "holding only WebDataset tars is converted member by member (--input webdataset)",
                    show(tree.shown), len(tars), show(tars[0]))


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
