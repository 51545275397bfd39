"""Parquet files as a table source: the part of :mod:`fastfeed.packing.sources.table` that knows parquet.

SRC may be a ``.parquet`` file, a folder of them (searched recursively, sorted by path) or a
glob (``data/train-*.parquet``). :func:`scan_files` reads only metadata (the footers): every file
must have the columns packed, of one type, and each row group becomes one unit
``(file, row group, row in the file, row over the source, rows, uncompressed bytes)``.
:func:`row_group_batches` streams a row group (or a row range inside it) in record batches of
bounded size. A file that is not readable parquet (truncated, corrupt) is a
:class:`~fastfeed.errors.BadFileError` naming it.

Example:
    >>> is_parquet_source("corpus/train-*.parquet"), is_parquet_source("photos/")
    (True, False)
"""

from __future__ import annotations

import glob as globlib
import hashlib
import json
import os
from pathlib import Path
from typing import Any, Iterator, NamedTuple

from fastfeed.errors import BadFileError, EmptySourceError, SourceError, missing_dependency
from fastfeed.packing.sources.base import show
from fastfeed.packing.sources.columns import ColumnField, resolve_columns

__all__ = ["PARQUET_SUFFIXES", "ParquetScan", "is_parquet_source", "list_parquet", "row_group_batches", "row_where",
           "scan_files"]

PARQUET_SUFFIXES = (".parquet", ".parq", ".pq")


class ParquetScan(NamedTuple):
    """The metadata of parquet files: what :class:`~fastfeed.packing.sources.table.TableSource` is made of.

    Attributes:
        root: the folder the files are relative to.
        files: the readable files, relative to ``root``.
        fields: how their columns are packed.
        units: per row group ``(file, row group, row in the file, row over the source, rows, bytes)``.
        num_rows: rows over all files.
        fingerprint: digest of the files' names, sizes, mtimes and row counts (and the options).
        skipped: unreadable files left out (``on_error="skip"``).
    """

    root: str
    files: tuple[str, ...]
    fields: tuple[ColumnField, ...]
    units: tuple[tuple[str, int, int, int, int, int], ...]
    num_rows: int
    fingerprint: str
    skipped: tuple[dict[str, str], ...]


def _pyarrow() -> Any:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise missing_dependency("pyarrow", "text", "parquet sources") from None
    return pq


def is_parquet_source(src: Any) -> bool:
    """True for a parquet file name or glob, or a folder whose files are all parquet."""
    text = os.fspath(src)
    if text.lower().endswith(PARQUET_SUFFIXES):
        return True
    path = Path(text)
    if not path.is_dir():
        return False
    found = False
    for p in path.rglob("*"):  # stops at the first file that is not parquet (an image tree)
        if p.name.startswith((".", "_")) or not p.is_file():
            continue
        if not p.name.lower().endswith(PARQUET_SUFFIXES):
            return False
        found = True
    return found


def list_parquet(text: str) -> tuple[str, list[str]]:
    """(root, files relative to it) of a parquet file, folder or glob.

    Raises:
        SourceError: no such file or folder; EmptySourceError: no parquet file there.
    """
    path = Path(text)
    if globlib.has_magic(text):
        found = sorted(p for p in globlib.glob(text, recursive=True) if os.path.isfile(p))
        head = text[: min(text.find(c) for c in "*?[" if c in text)]
        root = head if head.endswith(os.sep) else os.path.dirname(head)
        root = root or "."
    elif path.is_dir():
        root = text
        found = sorted(str(p) for p in path.rglob("*") if p.is_file()
                       and p.name.lower().endswith(PARQUET_SUFFIXES) and not p.name.startswith("."))
    elif path.is_file():
        root, found = str(path.parent), [text]
    else:
        raise SourceError(f"{show(text)}: no such file or folder; pass a .parquet file, a folder or "
                          "glob of them, or a datasets.save_to_disk folder")
    if not found:
        raise EmptySourceError(f"{show(text)}: no parquet files ({', '.join(PARQUET_SUFFIXES)}) found; "
                               "check the path or glob")
    return root, [os.path.relpath(p, root) for p in found]


def _open_parquet(root: str, rel: str) -> Any:
    pq = _pyarrow()
    import pyarrow as pa

    path = os.path.join(root, rel)
    try:
        return pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as e:
        raise BadFileError(f"{show(path)}: not a readable parquet file ({e}); it may be truncated or "
                           "corrupt: re-download or re-write it, or pass --on-error skip") from None


def scan_files(root: str, files: list[str], mapping: dict[str, str] | None, key: str | None,
               on_error: str) -> ParquetScan:
    """The metadata of ``files`` (relative to ``root``): fields from the first readable file's schema,
    checked against every other file; one unit per non-empty row group.

    Raises:
        BadFileError: a file is not readable parquet (``on_error="raise"``).
        SourceError: a file lacks a packed column, or holds it with another type.
        EmptySourceError: no rows.
    """
    units: list[tuple[str, int, int, int, int, int]] = []
    skipped: list[dict[str, str]] = []
    kept: list[str] = []
    digest = hashlib.sha256(json.dumps([mapping, key]).encode())
    fields: tuple[ColumnField, ...] | None = None
    schema0: Any = None
    row = 0
    for rel in files:
        try:
            pf = _open_parquet(root, rel)
        except BadFileError as e:
            if on_error == "raise":
                raise
            skipped.append({"path": show(rel), "key": "", "reason": str(e)})
            continue
        schema = pf.schema_arrow
        if fields is None:
            fields, schema0 = resolve_columns(schema, mapping, key, show(os.path.join(root, rel))), schema
            first = rel
        else:
            _check_schema(schema0, schema, fields, key, first, rel, root)
        st = os.stat(os.path.join(root, rel))
        meta = pf.metadata
        digest.update(json.dumps([rel, st.st_size, st.st_mtime_ns, meta.num_rows]).encode())
        file_row = 0
        for g in range(meta.num_row_groups):
            rg = meta.row_group(g)
            units.append((rel, g, file_row, row, rg.num_rows, rg.total_byte_size))
            file_row += rg.num_rows
            row += rg.num_rows
        kept.append(rel)
    if fields is None or row == 0:
        raise EmptySourceError(f"{show(root)}: the parquet files hold no rows"
                               + (f" ({len(skipped)} unreadable file(s) skipped)" if skipped else ""))
    return ParquetScan(root, tuple(kept), fields, tuple(u for u in units if u[4]), row, digest.hexdigest(),
                       tuple(skipped))


def _check_schema(schema0: Any, schema: Any, fields: tuple[ColumnField, ...], key: str | None,
                  first: str, rel: str, root: str) -> None:
    for col in [f.column for f in fields] + ([key] if key else []):
        if schema.get_field_index(col) < 0:
            raise SourceError(f"{show(os.path.join(root, rel))}: has no column {col!r} ({show(first)} has it); "
                              f"the columns are: {', '.join(schema.names)}; pack files of one schema")
        t0, t = schema0.field(col).type, schema.field(col).type
        if t0 != t:
            raise SourceError(f"{show(os.path.join(root, rel))}: column {col!r} is {t}, but {t0} in "
                              f"{show(first)}; pack files of one schema (cast the column)")


def row_where(root: str, rel: str, row_group: int, row: int) -> str:
    """How messages name a row of a parquet file."""
    return f"{show(os.path.join(root, rel))}: row group {row_group}, row {row}"


def row_group_batches(root: str, rel: str, row_group: int, first: int, rows: int, columns: list[str],
                      batch_rows: int) -> Iterator[tuple[Any, int]]:
    """Record batches of ``columns`` for rows ``[first, first + rows)`` (rows in the file) of one
    row group, with the row (in the file) of each batch's first row.

    A row range inside its row group (a unit split to fit a shard) streams the row group from its
    start and keeps the range: memory stays one record batch.

    Raises:
        BadFileError: the row group cannot be read (naming the file, row group and row).
    """
    import pyarrow as pa

    pf = _open_parquet(root, rel)
    start = sum(pf.metadata.row_group(g).num_rows for g in range(row_group))
    row, end = start, first + rows
    try:
        for batch in pf.iter_batches(batch_size=batch_rows, row_groups=[row_group],
                                     columns=columns, use_threads=False):
            lo, hi = max(first - row, 0), min(end - row, batch.num_rows)
            if hi > lo:
                yield (batch if (lo, hi) == (0, batch.num_rows) else batch.slice(lo, hi - lo)), row + lo
            row += batch.num_rows
            if row >= end:
                return
    except (pa.ArrowException, OSError) as e:
        raise BadFileError(f"{row_where(root, rel, row_group, row)}: cannot read the row group ({e}); the file "
                           "may be corrupt: re-write it, or pass --on-error skip") from None
