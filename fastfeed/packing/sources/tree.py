"""The tree a listed source lives in, and what listing it finds.

``pack`` lists a *tree* (:class:`Tree`): a local folder (:class:`LocalTree`) or an object-store
prefix (:class:`fastfeed.packing.sources.remote.UrlTree`). A tree only lists, stats, opens and
tells whether a file is readable; member paths are relative to ``Tree.root`` (or absolute). What
is found becomes a :class:`Listing` (samples, plus what was left out and why), and
:class:`Problems` collects what is wrong: with ``on_error="raise"`` the first problem is raised
(mentioning how many more there are), with ``"skip"`` the sample is left out and recorded.

Listing a local folder follows symlinks (a loop, a broken link, a FIFO or an unreadable
folder is a problem naming the path) and marks every file that resolves outside the root (a
symlinked file or folder whose target lies elsewhere: :attr:`FileEntry.outside`), so that the
source can refuse it or count it (``allow_outside``, :func:`~fastfeed.packing.sources.samples.listed_source`);
:meth:`LocalTree.outside` answers the same for one path (a JSONL manifest's). Names starting with
``.`` are never samples and are returned as ignored.

Example:
    >>> import tempfile
    >>> tree = LocalTree(tempfile.mkdtemp())
    >>> tree.list(Problems("raise", tree.shown))
    ([], [], [])
"""

from __future__ import annotations

import errno
import os
import stat
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, NamedTuple, Protocol

from fastfeed.errors import BadFileError, SourceError, UnsafePathError
from fastfeed.formats.naming import is_hidden
from fastfeed.packing.sources.base import SampleSpec, show

__all__ = ["FileEntry", "FileStat", "Listing", "LocalTree", "Problems", "Tree", "within"]


class FileEntry(NamedTuple):
    """One file of a listed folder or prefix: its path relative to the root, size, mtime, and, when
    it resolves outside the root (through a symlink), the real folder it is in (else None)."""

    rel: str
    size: int
    mtime_ns: int
    outside: str | None = None


@dataclass
class Listing:
    """The samples found in a tree, plus what was left out and why (mutable while the checks run)."""

    kind: str
    root: str
    samples: list[SampleSpec]
    classes: tuple[str, ...] | None = None
    skipped: list[dict[str, str]] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)
    manifest: str | None = None
    manifest_sha256: str | None = None
    has_labels: bool = False


class Problems:
    """Collects source problems: raise them (``raise``) or record them as skips (``skip``)."""

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

    def leave_out(self, where: str, reason: str, key: str = "") -> None:
        """Record an input left out on purpose whatever ``on_error`` (a stray file next to an ImageFolder's images)."""
        self.skipped.append({"path": show(where), "key": show(key), "reason": reason})

    def raise_if_any(self) -> None:
        """Raise the first problem (naming how many more there are), if any."""
        if not self.errors:
            return
        first, rest = self.errors[0], self.errors[1:]
        if not rest:
            raise first
        more = "; ".join(str(e) for e in rest[:4])
        extra = f" and {len(rest) - 4} more" if len(rest) > 4 else ""
        raise type(first)(f"{first} (also {len(rest)} more problem(s): {more}{extra})") from None


class FileStat(NamedTuple):
    """The two fields of ``os.stat_result`` a scan reads."""

    st_size: int
    st_mtime_ns: int


class Tree(Protocol):
    """Where a ``pack`` source lives: a local folder or an object-store prefix.

    Attributes:
        root: what member paths are relative to (``Source.root``).
        shown: how messages name the tree.
        noun, folder, container: words for messages (``file``/``folder``, or
            ``object``/``prefix``).
    """

    root: str
    shown: str
    noun: str
    folder: str
    container: str

    def path(self, rel: str) -> str:
        """Where ``rel`` (relative to the root, or absolute) is: a path or a URL."""

    def outside(self, path: str) -> str | None:
        """Where ``path`` (relative to the root, or absolute) really is when that is outside the
        root (the resolved path or URL), else None."""

    def list(self, problems: Problems) -> tuple[list[FileEntry], list[str], list[str]]:
        """Every file under the root, sorted: (files, top-level folders, ignored names)."""

    def stat(self, path: str) -> FileStat | None:
        """Size and mtime of the regular file at ``path`` (relative to the root), or None."""

    def readable(self, path: str) -> bool:
        """False when ``path`` surely cannot be read (local permission bits)."""

    def open(self, path: str) -> IO[bytes]:
        """Open ``path`` (relative to the root) for reading bytes."""


class LocalTree:
    """A folder on this machine (see :class:`Tree`).

    Args:
        root: the folder (resolved for member paths).
        shown: how messages name it (default: ``root`` as given).
    """

    noun = "file"
    folder = "folder"
    container = "folder"

    def __init__(self, root: str | os.PathLike[str], shown: str | None = None) -> None:
        self.shown = str(root) if shown is None else shown
        self.root = str(root)
        self._real_root = os.path.realpath(self.root)
        self._real_dirs: dict[str, str] = {}

    def path(self, rel: str) -> str:
        return os.path.join(self.root, rel)

    def outside(self, path: str) -> str | None:
        """The resolved path of ``path`` when it lies outside the root (``..``, an absolute path
        elsewhere, a symlink out), else None. Each folder is resolved once (a manifest names
        many files per folder)."""
        head, tail = os.path.split(os.path.join(self.root, path))
        real_head = self._real_dirs.get(head)
        if real_head is None:
            real_head = self._real_dirs[head] = os.path.realpath(head)
        real = os.path.join(real_head, tail)
        if tail in ("", ".", "..") or os.path.islink(real):
            real = os.path.realpath(real)
        return None if within(real, self._real_root) else real

    def list(self, problems: Problems) -> tuple[list[FileEntry], list[str], list[str]]:
        return _walk(Path(self.root), problems)

    def stat(self, path: str) -> FileStat | None:
        try:
            st = os.stat(self.path(path))
        except (OSError, ValueError):
            return None
        return FileStat(st.st_size, st.st_mtime_ns) if stat.S_ISREG(st.st_mode) else None

    def readable(self, path: str) -> bool:
        return os.access(self.path(path), os.R_OK)

    def open(self, path: str) -> IO[bytes]:
        return open(self.path(path), "rb")


def within(path: str, root: str) -> bool:
    """True when the (resolved) ``path`` is ``root`` or lies under it.

    Example:
        >>> within("/data/train/a.jpg", "/data/train"), within("/data/train2/a.jpg", "/data/train")
        (True, False)
    """
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _walk(root: Path, problems: Problems) -> tuple[list[FileEntry], list[str], list[str]]:
    """Walk ``root`` following symlinks: (regular files, top-level folders, ignored names).

    Every folder's real path is carried along (a symlinked one resolved once), so a file that
    resolves outside ``root`` is marked (:attr:`FileEntry.outside`) at the cost of one
    ``realpath`` per symlink."""
    files: list[FileEntry] = []
    ignored: list[str] = []
    top_dirs: list[str] = []
    st0 = root.stat()
    real_root = os.path.realpath(root)
    stack: list[tuple[str, str, dict[tuple[int, int], str], str]] = [
        ("", str(root), {(st0.st_dev, st0.st_ino): "."}, real_root)
    ]
    while stack:
        rel_dir, abs_dir, ancestors, real_dir = stack.pop()
        out_dir = None if within(real_dir, real_root) else real_dir
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
            if is_hidden(e.name):
                ignored.append(rel)
                continue
            try:
                st = e.stat()
            except OSError as err:
                _report_stat_error(problems, rel, e.path, err)
                continue
            link = e.is_symlink()
            real = os.path.realpath(e.path) if link else os.path.join(real_dir, e.name)
            if stat.S_ISDIR(st.st_mode):
                ident = (st.st_dev, st.st_ino)
                if ident in ancestors:
                    problems.report(UnsafePathError, rel,
                                    f"symlink loop (points back to {show(ancestors[ident])})",
                                    "remove or fix the link, or pass --on-error skip")
                    continue
                if not rel_dir:
                    top_dirs.append(rel)
                subdirs.append((rel, e.path, {**ancestors, ident: rel}, real))
            elif stat.S_ISREG(st.st_mode):
                outside = out_dir
                if link:
                    outside = None if within(real, real_root) else sys.intern(os.path.dirname(real))
                files.append(FileEntry(rel, st.st_size, st.st_mtime_ns, outside))
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
