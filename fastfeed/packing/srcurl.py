"""Pack sources on object storage (``fastfeed pack s3://bucket/train DST``), through fsspec.

:func:`fastfeed.packing.walk.scan` hands URL sources to :func:`scan_url`, which lists the prefix
once (``fs.find``) and then applies exactly the local checks and grouping of
:mod:`fastfeed.packing.walk` (ImageFolder, files by key, JSONL manifests), so a prefix and a
local copy of it give the same samples and the same skips. Names starting with ``.``
are ignored, as locally; object stores have no symlinks, permissions bits or FIFOs, so
those checks do not apply (an object that cannot be read fails, or is skipped, when
its shard is written).

Reading (:func:`read`, used by :func:`fastfeed.packing.write.read_source`) fetches whole
objects or byte ranges with :func:`fastfeed.storage.remote.with_retries`. Credentials and
endpoints come from the environment (``AWS_*`` variables, ``~/.aws``): of the driver
for planning, and of every node for ``--engine ray``.

Example:
    >>> src = scan_url("s3://bucket/train", input=None, on_error="fail")   # doctest: +SKIP
    >>> src.kind, len(src.samples)                                          # doctest: +SKIP
    ('imagefolder', 1281167)
"""

from __future__ import annotations

import datetime
import logging
from typing import IO, Any, NamedTuple

from fastfeed.errors import BadFileError, ConfigError, SourceError
from fastfeed.storage.remote import filesystem, is_url, with_retries

__all__ = ["UrlPath", "UrlStat", "is_url", "list_tree", "open_url", "read", "scan_url", "stat"]

log = logging.getLogger("fastfeed.pack")

#: (size, mtime_ns) of objects, filled by listings during one scan (see :func:`stat`).
_LISTED: dict[str, tuple[int, int]] = {}
_LISTED_DIRS: set[str] = set()


class UrlPath(str):
    """A URL with the two ``Path`` attributes :mod:`fastfeed.packing.walk` uses (``parent``, ``name``)."""

    @property
    def parent(self) -> "UrlPath":
        return UrlPath(self.rstrip("/").rsplit("/", 1)[0])

    @property
    def name(self) -> str:
        return self.rstrip("/").rsplit("/", 1)[-1]


def _mtime_ns(info: dict[str, Any]) -> int:
    """Modification time of an fsspec entry in ns (0 when the store reports none)."""
    for key in ("LastModified", "mtime", "last_modified", "updated", "modified", "created"):
        v = info.get(key)
        if v is None:
            continue
        if isinstance(v, datetime.datetime):
            return int(v.timestamp() * 1e9)
        if isinstance(v, (int, float)):
            return int(v * 1e9)
        try:
            return int(datetime.datetime.fromisoformat(str(v).replace("Z", "+00:00")).timestamp() * 1e9)
        except ValueError:
            continue
    return 0


def _url(fs: Any, path: str) -> str:
    return fs.unstrip_protocol(path)


def list_tree(url: str) -> tuple[list[Any], list[str], list[str]]:
    """List every object under ``url``: (files, top-level folders, ignored names), as
    :func:`fastfeed.packing.walk._list` does for a local folder (files sorted by relative path)."""
    from fastfeed.packing.walk import _File

    fs, root = filesystem(url)
    root = root.rstrip("/")
    entries = with_retries(lambda: fs.find(root, withdirs=True, detail=True), url, "list")
    files: list[_File] = []
    top_dirs: set[str] = set()
    ignored: set[str] = set()
    for path, info in entries.items():
        rel = path.rstrip("/")[len(root):].lstrip("/")
        if not rel:
            continue
        parts = rel.split("/")
        hidden = next((i for i, p in enumerate(parts) if p.startswith(".")), None)
        if hidden is not None:
            ignored.add("/".join(parts[: hidden + 1]))
            continue
        if len(parts) > 1 or info.get("type") == "directory":
            top_dirs.add(parts[0])
        if info.get("type") == "directory":
            continue
        size, mtime = int(info.get("size") or 0), _mtime_ns(info)
        _LISTED[_url(fs, path)] = (size, mtime)
        files.append(_File(rel, size, mtime))
    _LISTED_DIRS.add(url.rstrip("/"))
    files.sort()
    return files, sorted(top_dirs), sorted(ignored)


class UrlStat(NamedTuple):
    """The two fields of ``os.stat_result`` that :mod:`fastfeed.packing.walk` reads."""

    st_size: int
    st_mtime_ns: int


def stat(url: str) -> UrlStat | None:
    """Size and modification time of the object at ``url``, or None when there is none.

    The first question about a folder lists it (one paged request, not one per object),
    so checking the files a JSONL manifest names costs a listing per folder.
    """
    url = url.rstrip("/")
    folder = url.rsplit("/", 1)[0]
    if folder not in _LISTED_DIRS:
        fs, path = filesystem(folder)

        def ls() -> list[dict[str, Any]]:
            try:
                return list(fs.ls(path, detail=True))
            except FileNotFoundError:
                return []

        for info in with_retries(ls, folder, "list"):
            if info.get("type") != "directory":
                _LISTED[_url(fs, str(info["name"]))] = (int(info.get("size") or 0), _mtime_ns(info))
        _LISTED_DIRS.add(folder)
    found = _LISTED.get(url)
    return None if found is None else UrlStat(*found)


def open_url(url: str) -> IO[bytes]:
    """Open an object for reading (a seekable fsspec file)."""
    fs, path = filesystem(url)
    return with_retries(lambda: fs.open(path, "rb"), url, "open")


def read(url: str, size: int, offset: int | None = None) -> bytes:
    """The whole object (checking it still has ``size`` bytes), or ``size`` bytes at ``offset``.

    Raises:
        BadFileError: missing, unreadable, or changed since it was planned.
    """
    fs, path = filesystem(url)
    start = offset or 0

    def get() -> bytes:
        if offset is None:
            return bytes(fs.cat_file(path))
        return bytes(fs.cat_file(path, start=start, end=start + size))

    try:
        data = with_retries(get, url, "read")
    except (FileNotFoundError, PermissionError) as e:
        why = "not found" if isinstance(e, FileNotFoundError) else "access denied"
        raise BadFileError(f"{url}: cannot read ({why}); fix or remove the object, "
                           "or pass --on-error skip") from None
    if len(data) != size:
        raise BadFileError(f"{url}: changed while packing ({len(data)} bytes, planned {size}); re-run pack")
    return data


def scan_url(url: str, *, input: str | None, on_error: str, length: str | None = None,
             probe_threads: int = 8) -> Any:
    """:func:`fastfeed.packing.walk.scan` for a prefix or a JSONL manifest on object storage."""
    from fastfeed.packing import walk
    from fastfeed.packing.manifest import manifest_source

    _LISTED.clear()
    _LISTED_DIRS.clear()
    try:
        return _scan(walk, UrlPath(url.rstrip("/")), input, on_error, length, probe_threads)
    finally:
        _LISTED.clear()
        _LISTED_DIRS.clear()


def _scan(walk: Any, path: UrlPath, kind: str | None, on_error: str, length: str | None,
          probe_threads: int) -> Any:
    problems = walk.Problems(on_error, str(path))
    info = stat(path)
    if info is not None:  # an object: a manifest
        source = manifest_source(path, kind, problems, noun="object", container="prefix (a folder)")
    elif kind == "jsonl":
        raise ConfigError(f"{path}: is a prefix, but --input jsonl needs a manifest object")
    else:
        files, top_dirs, ignored = list_tree(path)
        if not files:
            raise SourceError(f"{path}: no objects under this prefix; pass the prefix or JSONL manifest "
                              "to pack (and check the credentials and endpoint)")
        if kind is None:
            kind, why = walk._detect(files, top_dirs)
            log.info("%s: packing as %s (%s)", path, kind, why)
        if kind == "imagefolder":
            source = walk._imagefolder(str(path), files, top_dirs, problems)
        else:
            source = walk._files(str(path), files, problems)
        if source.ignored:
            log.warning("%s: %d file(s) at the top level of an ImageFolder are not samples: %s",
                        path, len(source.ignored), ", ".join(walk.show(p) for p in source.ignored[:5]))
        source.ignored = ignored + source.ignored
    return walk._finish(source, problems, str(path), on_error, length, probe_threads)
