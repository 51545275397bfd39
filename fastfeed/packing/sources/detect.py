"""The one detection of ``pack``'s input: :func:`open_source` picks the source and opens it.

What SRC is, tried in this order (``input=`` names it instead; the kinds are
:data:`~fastfeed.packing.sources.base.INPUTS`):

=================================================================  ==============  =============================
SRC                                                                kind            module
=================================================================  ==============  =============================
a ``datasets.Dataset``, or a folder written by ``save_to_disk``    ``hf``          :mod:`~.hf`, :mod:`~.table`
a ``.parquet`` file or glob, a folder holding only parquet files   ``parquet``     :mod:`~.parquet`, :mod:`~.table`
one file (or object): a manifest named ``.jsonl``                  ``jsonl``       :mod:`~.jsonl`
a folder (or prefix) whose files are all tars                      ``webdataset``  :mod:`~.webdataset`
a folder of class folders holding images                           ``imagefolder`` :mod:`~.folder`
any other folder: its files grouped by key                         ``files``       :mod:`~.folder`
=================================================================  ==============  =============================

Tables become a :class:`~fastfeed.packing.sources.table.TableSource`; every other input is listed
from its tree (:class:`~fastfeed.packing.sources.tree.LocalTree` or, for an fsspec URL,
:class:`~fastfeed.packing.sources.remote.UrlTree`) and becomes a
:class:`~fastfeed.packing.sources.samples.SampleSource`. A new format is one module in
``sources/`` and one line here. Names starting with ``.`` (``.DS_Store``, ``.git``) are never
samples; they are listed in ``Source.ignored``. A file that resolves outside SRC (a symlink out
of the folder, an absolute or ``../`` path of a manifest: outside the manifest's folder) is
refused unless ``allow_outside`` (:mod:`~fastfeed.packing.sources.base`, "Confinement"). Every other problem is a
:class:`~fastfeed.errors.SourceError` that names the path and the fix: with
``on_error="raise"`` the first one is raised (mentioning how many more there are), with
``"skip"`` the sample is left out and recorded.

Example:
    >>> import pathlib, tempfile
    >>> root = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (root / "data.jsonl").write_text('{"text": "a cat"}\\n')
    >>> src = open_source(root / "data.jsonl")
    >>> src.kind, src.units[0].key, src.blocks
    ('jsonl', '000000000', False)
"""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path
from typing import Any, Mapping

from fastfeed._util import check_on_error
from fastfeed.errors import ConfigError, SourceError
from fastfeed.packing.sources import folder
from fastfeed.packing.sources.base import TABLE_INPUTS, Source, check_input, show
from fastfeed.packing.sources.hf import is_hf_folder, is_hf_object
from fastfeed.packing.sources.jsonl import manifest_source
from fastfeed.packing.sources.parquet import is_parquet_source
from fastfeed.packing.sources.remote import UrlTree
from fastfeed.packing.sources.samples import listed_source
from fastfeed.packing.sources.table import scan_table
from fastfeed.packing.sources.tree import Listing, LocalTree, Problems, Tree
from fastfeed.packing.sources.webdataset import is_tar_source, webdataset_source
from fastfeed.storage.remote import is_url

__all__ = ["is_table", "open_source"]

log = logging.getLogger("fastfeed.pack")


def open_source(src: str | os.PathLike[str] | Any, *, input: str | None = None, on_error: str = "raise",
                length: str | None = None, columns: str | Mapping[str, str] | None = None,
                key: str | None = None, store: str = "jpeg", allow_outside: bool = False) -> Source:
    """Detect what ``src`` is (or take ``input``), list and validate it: the source to plan.

    Args:
        src: a folder or file (local, or an fsspec URL), a parquet glob, or a ``datasets.Dataset``.
        input: one of :data:`~fastfeed.packing.sources.base.INPUTS`, or None to detect.
        on_error: ``raise`` raises the first problem; ``skip`` records it in ``Source.skipped``.
        length: ``pack --length`` (checked for presence in every sample of a listed source).
        columns, key: for tables: the columns to pack and their fields, the key column.
        store: ``pack --store`` (tables refuse anything but ``jpeg``).
        allow_outside: ``pack --allow-outside``: pack files that resolve outside SRC (counted in
            ``Source.outside``); False: each is a problem.

    Raises:
        ConfigError: ``input`` does not fit SRC, or options that are not for this kind of input.
        SourceError: a subclass naming the path and the fix (``raise``), or
            EmptySourceError when nothing is left to pack.
    """
    input = check_input(input)
    on_error = check_on_error(on_error)
    if not is_hf_object(src) and (not isinstance(src, (str, os.PathLike)) or not os.fspath(src)):
        raise ConfigError(f"src={src!r}: give the folder, manifest or parquet file to pack (a path or URL), or a "
                          "datasets.Dataset")
    _check_name(src)
    if is_table(src, input):
        table_columns = dict(columns) if isinstance(columns, Mapping) else columns
        return scan_table(src, columns=table_columns, key=key, on_error=on_error, store=store)
    if columns is not None or key is not None:
        raise ConfigError(f"{show(os.fspath(src))}: columns/key (--columns, --key) are for parquet and HF "
                          "datasets input; this SRC is not one (leave them out, or pass --input parquet)")
    return _open_listed(src, input, on_error, length, allow_outside)


def _check_name(src: Any) -> None:
    """A local SRC whose name the OS refuses (too long) is a SourceError naming it, before any detection."""
    if is_hf_object(src) or is_url(src):
        return
    try:
        os.stat(src)
    except OSError as e:
        if e.errno == errno.ENAMETOOLONG:
            raise SourceError(f"{show(os.fspath(src))}: the name is too long for the file system "
                              f"({len(os.fspath(src))} characters); check the path") from None


def is_table(src: Any, input: str | None) -> bool:
    """True when ``src`` (with ``input``: chosen, or None to detect) is read as a table.

    Raises:
        ConfigError: ``input="hf"`` for something that is no ``datasets`` object or
            ``save_to_disk`` folder, or a ``datasets`` object with a file input.

    Example:
        >>> is_table("corpus/train-00000.parquet", None), is_table("photos/", "imagefolder")
        (True, False)
    """
    hf = is_hf_object(src)
    if input == "hf" and not hf and not is_hf_folder(os.fspath(src)):
        raise ConfigError(f"input='hf': {show(os.fspath(src))} is not a folder written by "
                          "Dataset.save_to_disk (no state.json and dataset_info.json); pass that folder, "
                          "or --input parquet for parquet files")
    if input in TABLE_INPUTS:
        return True
    if hf:
        if input is not None:
            raise ConfigError(f"input={input!r}: SRC is a datasets object; leave input out (or pass input='hf')")
        return True
    return input is None and (is_hf_folder(os.fspath(src)) or is_parquet_source(src))


def _open_listed(src: str | os.PathLike[str], input: str | None, on_error: str, length: str | None,
                 allow_outside: bool) -> Source:
    """A folder, prefix or manifest: list it once, pick the layout, group its files into samples."""
    url = is_url(src)
    where = str(src).rstrip("/") if url else str(Path(src).absolute())
    tree, manifest = _locate(where)
    problems = Problems(on_error, tree.shown)
    if manifest is not None:
        listing = manifest_source(tree, manifest, input, problems, allow_outside)
    elif input == "jsonl":
        raise ConfigError(f"{show(tree.shown)}: is a {tree.folder}, but --input jsonl needs a manifest {tree.noun}")
    else:
        listing = _list_folder(tree, input, problems)
    return listed_source(listing, tree, problems, src=where, location=where if url else os.path.realpath(where),
                         on_error=on_error, length=length, allow_outside=allow_outside)


def _list_folder(tree: Tree, kind: str | None, problems: Problems) -> Listing:
    """List the tree, detect its layout when ``kind`` is None, and group its files into samples."""
    files, top_dirs, ignored = tree.list(problems)
    strays: frozenset[str] = frozenset()
    if kind is None and is_tar_source(files):
        kind = "webdataset"
        log.info("%s: packing as webdataset (every file is a tar shard: converted member by member)",
                 show(tree.shown))
    if kind is None:
        kind, why, strays = folder.detect(files, top_dirs, tree.shown)
        log.info("%s: packing as %s (%s)", show(tree.shown), kind, why)
    if strays:
        log.warning("%s: packing as an ImageFolder; %d stray non-image file(s) in its class folders are "
                    "left out (listed in skipped.txt): %s; pass --input files to pack every file instead",
                    show(tree.shown), len(strays), ", ".join(show(p) for p in sorted(strays)[:5]))
    if kind == "imagefolder":
        listing = folder.imagefolder(tree, files, top_dirs, problems, strays)
    elif kind == "webdataset":
        listing = webdataset_source(tree, files, problems)
    else:
        listing = folder.files_by_key(tree, files, problems)
    if listing.ignored and kind == "imagefolder":
        log.warning("%s: %d file(s) at the top level of an ImageFolder are not samples: %s",
                    show(tree.shown), len(listing.ignored), ", ".join(show(p) for p in listing.ignored[:5]))
    if ignored:
        log.info("%s: %d hidden name(s) (starting with '.') left out, e.g. %s",
                 show(tree.shown), len(ignored), show(ignored[0]))
    listing.ignored = ignored + listing.ignored
    return listing


def _locate(src: str) -> tuple[Tree, str | None]:
    """The tree of ``src`` and, when ``src`` is one file (a manifest), its name in that tree."""
    if is_url(src):
        parent, _, name = src.rpartition("/")
        folder_tree = UrlTree(parent)
        if folder_tree.stat(name) is not None:
            return folder_tree, name
        return UrlTree(src), None
    path = Path(src)
    if not path.exists():
        raise SourceError(f"{show(str(path))}: does not exist; pass the folder or JSONL manifest to pack")
    if path.is_file():
        return LocalTree(path.parent), path.name
    return LocalTree(path.resolve(), shown=str(path)), None
