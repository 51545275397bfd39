"""``pack`` of a folder of WebDataset tars: each tar member becomes a field of its sample.

A source whose files are all tar shards (``.tar``; gzipped ones must be decompressed
first, since members are read by offset) is converted member by member, the way the
loader reads such tars without an index: the one key rule
(:func:`fastfeed.formats.naming.split_key`) and the one tar scan
(:func:`fastfeed.formats.wds.scan_tar`, as :mod:`fastfeed.packed.foreign` uses it), so
keys and fields stay what they were. Each member is a :class:`~fastfeed.packing.sources.base.Member`
with the tar as its path and the member's data offset; labels come from ``cls`` members.

Example:
    >>> src = open_source("wds-train")                          # doctest: +SKIP
    >>> src.kind, src.units[0].members[0].offset                # doctest: +SKIP
    ('webdataset', 1536)
"""

from __future__ import annotations

from fastfeed.errors import BadFileError, ConfigError, ShardError, UnsafePathError
from fastfeed.formats.wds import ScannedShard, scan_tar
from fastfeed.packing.sources.base import Member, SampleSpec, key_problem, show
from fastfeed.packing.sources.tree import FileEntry, Listing, Problems, Tree
from fastfeed.storage.shardlist import is_shard_name

__all__ = ["is_tar_source", "webdataset_source"]

_FIX = "re-download or repair it, or pass --on-error skip"


def is_tar_source(files: list[FileEntry]) -> bool:
    """True when every listed file is a tar shard (``.tar``, ``.tgz``, ``.tar.gz``)."""
    return bool(files) and all(is_shard_name(f.rel) for f in files)


def webdataset_source(tree: Tree, files: list[FileEntry], problems: Problems) -> Listing:
    """The samples of the WebDataset tars ``files`` of ``tree``, member by member.

    Raises:
        ConfigError: a gzipped tar (members cannot be read by offset).
    """
    gz = [f.rel for f in files if not f.rel.lower().endswith(".tar") and is_shard_name(f.rel)]
    if gz:
        raise ConfigError(f"{show(tree.shown)}: {show(gz[0])} is a gzipped tar ({len(gz)} of {len(files)}); "
                          "pack reads tar members by offset: decompress them first (gunzip keeps the .tar "
                          "name), or train on them as they are with fastfeed.loader(SRC)")
    owner: dict[str, str] = {}
    samples: list[SampleSpec] = []
    ignored: list[str] = []
    for f in sorted(files):
        if not is_shard_name(f.rel):
            problems.report(BadFileError, f.rel, "not a tar shard among WebDataset tars",
                            "move it out of SRC, or pass --on-error skip")
            continue
        scanned = _scan(tree, f, problems)
        if scanned is None:
            continue
        ignored += [f"{f.rel}:{name}" for name in scanned.ignored]
        for key, members in zip(scanned.keys, scanned.members):
            if (why := key_problem(key)) is not None:
                problems.report(UnsafePathError, f"{f.rel}:{key}", f"unusable key: {why}",
                                "rename the member, or pass --on-error skip", key)
                continue
            if key in owner:
                problems.report(BadFileError, f"{f.rel}:{key}", f"duplicate key {show(key)!r} (also in "
                                f"{show(owner[key])})", "rename the members of one of them, or pass "
                                "--on-error skip", key)
                continue
            owner[key] = f.rel
            specs = tuple(Member(ext, f.rel, size, f.mtime_ns, offset=off, outside=f.outside)
                          for ext, off, size in sorted(members))
            samples.append(SampleSpec(key, specs))
    has_labels = any(m.field == "cls" for s in samples for m in s.members)
    return Listing("webdataset", tree.root, samples, ignored=ignored, has_labels=has_labels)


def _scan(tree: Tree, f: FileEntry, problems: Problems) -> ScannedShard | None:
    """One tar's samples with their members; a damaged tar is a problem (its readable part kept with skip)."""
    try:
        with tree.open(f.rel) as fh:
            scanned = scan_tar(fh, name=f.rel, on_error=problems.on_error, members=True)
    except ShardError as e:
        problems.report(BadFileError, f.rel, str(e).removeprefix(f"{f.rel}: ").split("; ")[0], _FIX)
        return None
    except OSError as e:
        problems.report(BadFileError, f.rel, f"cannot read ({e.strerror or e})", _FIX)
        return None
    if scanned.problem is not None:
        problems.report(BadFileError, f.rel, f"{scanned.problem}; its {len(scanned.keys)} samples before "
                        "that are packed", _FIX)
    return scanned
