"""Pack sources on object storage (``fastfeed pack s3://bucket/train DST``), through fsspec.

:class:`UrlTree` is the object-store :class:`~fastfeed.packing.sources.tree.Tree`:
:func:`fastfeed.packing.sources.detect.open_source` lists a prefix once (``fs.find``) and then applies
exactly the grouping and checks of a local folder (ImageFolder, files by key, JSONL
manifests), so a prefix and a local copy of it give the same samples and the same skips.
Names starting with ``.`` are ignored, as locally; object stores have no symlinks,
permission bits or FIFOs, so those checks do not apply (an object that cannot be read
fails, or is skipped, when its shard is written). A path a manifest names is outside the
prefix (:meth:`UrlTree.outside`) when it is absolute, a URL, or climbs out with ``..`` (object
keys may hold a literal ``..``, so it is never resolved against the prefix).

Reading an object (:func:`fastfeed.packing.sources.reader.read_source`) fetches it whole or a
byte range of it with :func:`fastfeed.storage.remote.with_retries`; a manifest or a
WebDataset tar is streamed through :func:`fastfeed.storage.bounded.open_remote` (ranged
requests, each bounded and retried). Every request is bounded (a minute without progress,
then retries, then a :class:`~fastfeed.errors.RemoteError` naming the object:
:mod:`fastfeed.storage.retry`); ``FASTFEED_STORAGE_TIMEOUT`` / ``FASTFEED_STORAGE_RETRIES``
change the bound, as pack's sources take no fsspec options. Credentials and endpoints come
from the environment (``AWS_*`` variables, ``~/.aws``): of the driver for planning, and of
every node for ``--engine ray``.

Example:
    >>> tree = UrlTree("s3://bucket/train")                                   # doctest: +SKIP
    >>> files, top_dirs, ignored = tree.list(Problems("raise", tree.shown))   # doctest: +SKIP
"""

from __future__ import annotations

import datetime
import errno
import os
import posixpath
from typing import IO, Any

from fastfeed.errors import SourceError
from fastfeed.formats.naming import is_hidden
from fastfeed.packing.sources.tree import FileEntry, FileStat, Problems
from fastfeed.storage.bounded import filesystem, open_remote
from fastfeed.storage.retry import with_retries

__all__ = ["UrlTree"]


class UrlTree:
    """A prefix on an fsspec file system (see :class:`~fastfeed.packing.sources.tree.Tree`).

    Listings are kept for the life of the object, so the stat of every file a JSONL
    manifest names costs one listing per folder, not one request per file.
    """

    noun = "object"
    folder = "prefix"
    container = "prefix (a folder)"

    def __init__(self, root: str) -> None:
        self.root = self.shown = root.rstrip("/")
        self._listed: dict[str, FileStat] = {}
        self._listed_dirs: set[str] = set()

    def path(self, rel: str) -> str:
        return os.path.join(self.root, rel)

    def outside(self, path: str) -> str | None:
        """``path`` as it would be read when it is not under the prefix (absolute, a URL, or a
        ``..`` that climbs out of it), else None."""
        if "://" in path or path.startswith("/"):
            return path
        norm = posixpath.normpath(path)
        if norm == ".." or norm.startswith("../"):
            return self.path(path)
        return None

    def list(self, problems: Problems) -> tuple[list[FileEntry], list[str], list[str]]:
        """Every object under the root (files sorted by relative path); SourceError when none."""
        fs, root = filesystem(self.root)
        root = root.rstrip("/")
        entries = with_retries(lambda: fs.find(root, withdirs=True, detail=True), self.root, "list")
        files: list[FileEntry] = []
        top_dirs: set[str] = set()
        ignored: set[str] = set()
        for path, info in entries.items():
            rel = path.rstrip("/")[len(root):].lstrip("/")
            if not rel:
                continue
            parts = rel.split("/")
            hidden = next((i for i, p in enumerate(parts) if is_hidden(p)), None)
            if hidden is not None:
                ignored.add("/".join(parts[: hidden + 1]))
                continue
            if len(parts) > 1 or info.get("type") == "directory":
                top_dirs.add(parts[0])
            if info.get("type") == "directory":
                continue
            found = FileStat(int(info.get("size") or 0), _mtime_ns(info))
            self._listed[fs.unstrip_protocol(path)] = found
            files.append(FileEntry(rel, *found))
        self._listed_dirs.add(self.root)
        if not files:
            raise SourceError(f"{self.root}: no objects under this prefix; pass the prefix or JSONL manifest "
                              "to pack (and check the credentials and endpoint)")
        files.sort()
        return files, sorted(top_dirs), sorted(ignored)

    def stat(self, path: str) -> FileStat | None:
        """Size and mtime of the object at ``path``, or None; the first question about a
        folder lists it (one paged request)."""
        url = self.path(path).rstrip("/")
        folder = url.rsplit("/", 1)[0]
        if folder not in self._listed_dirs:
            fs, fpath = filesystem(folder)

            def ls() -> list[dict[str, Any]]:
                try:
                    return list(fs.ls(fpath, detail=True))
                except FileNotFoundError:
                    return []

            for info in with_retries(ls, folder, "list"):
                if info.get("type") != "directory":
                    self._listed[fs.unstrip_protocol(str(info["name"]))] = FileStat(
                        int(info.get("size") or 0), _mtime_ns(info))
            self._listed_dirs.add(folder)
        return self._listed.get(url)

    def readable(self, path: str) -> bool:
        return True  # no permission bits to check up front: reading tells

    def open(self, path: str) -> IO[bytes]:
        """Open an object for reading: a seekable file whose reads are bounded, retried requests.

        Raises:
            FileNotFoundError: no such object.
        """
        found = self.stat(path)
        if found is None:
            raise FileNotFoundError(errno.ENOENT, "no such object", self.path(path))
        return open_remote(self.path(path), size=found.st_size)


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
