"""Parquet files and HF ``datasets`` as the input of ``pack``: rows -> samples, in bounded memory.

SRC may be a ``.parquet`` file, a folder of them (searched recursively, sorted by path),
a glob (``data/train-*.parquet``), a ``datasets.Dataset`` or a folder written by
``Dataset.save_to_disk``. :func:`scan_parquet` reads only metadata (parquet footers; for a
key column, that column) and splits the table into :class:`Unit` s: one per parquet row
group, or a range of rows of a ``datasets.Dataset``. The units are a pure function of the
files and their metadata, so pack can plan shards from them (:func:`group_units`), name
a shard by the units it holds and, after a crash, rewrite only the missing shards.
:func:`iter_unit` streams the samples of one unit in record batches of ``batch_rows``
rows; nothing ever holds a whole table.

Each row is one sample ``(key, {field: bytes}, label)``. Columns become fields by the
rules of :mod:`fastfeed.packing.sources.columns` (a ``columns`` mapping selects and renames);
``__key__`` is the ``key`` column's value, else the row number over the whole source,
zero-padded to 9 digits (as for JSONL manifests) so keys sort in row order. A null value
leaves its field out of that row. A row that cannot be stored (a key that is not a safe
member name, bytes that are no image under an image field, a ragged list under ``npy``)
follows ``on_error``: ``"raise"`` stops with an error naming the file, row group, row and
column and the fix; ``"skip"`` leaves the row out and records it in ``skipped``. A file
that is not readable parquet (truncated, corrupt) is a :class:`~fastfeed.errors.BadFileError`
naming it.

Example:
    >>> src = scan_parquet("wiki/train-*.parquet", columns="text=txt")   # doctest: +SKIP
    >>> src.num_rows, len(src.units), src.fields[0].field                # doctest: +SKIP
    (6458670, 41, 'txt')
    >>> next(iter_unit(src, src.units[0]))                               # doctest: +SKIP
    Sample(key='000000000', fields={'txt': b'Anarchism is ...'}, label=-1)
"""

from __future__ import annotations

import glob as globlib
import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from fastfeed._util import check_on_error
from fastfeed.errors import (
    BadFileError,
    ConfigError,
    DuplicateKeyError,
    EmptySourceError,
    SourceError,
    missing_dependency,
)
from fastfeed.packing.sources.columns import ColumnField, parse_columns, resolve_columns
from fastfeed.packing.sources.hf import (
    hf_batches,
    hf_ranges,
    is_hf_folder,
    is_hf_object,
    load_from_disk,
    refuse_dataset_dict,
)
from fastfeed.packing.sources.rows import RowProblem, Sample, batch_samples
from fastfeed.packing.sources.base import show

__all__ = [
    "Sample",
    "TableSource",
    "Unit",
    "group_units",
    "is_table_source",
    "iter_samples",
    "iter_unit",
    "scan_parquet",
]

PARQUET_SUFFIXES = (".parquet", ".parq", ".pq")


@dataclass(frozen=True)
class Unit:
    """A slice of the source that one pack task reads: a parquet row group or HF row range.

    Attributes:
        file: the parquet file, relative to ``TableSource.root`` (``""`` for HF datasets).
        row_group: the row group in that file; -1 for a HF row range.
        file_row: the row number (in the file, or the dataset) of the unit's first row.
        first_row: the row number over the whole source of its first row (row-number keys).
        num_rows: rows in the unit.
        nbytes: uncompressed bytes, from the parquet metadata (HF: an estimate).
    """

    file: str
    row_group: int
    file_row: int
    first_row: int
    num_rows: int
    nbytes: int


@dataclass(frozen=True)
class TableSource:
    """The validated table input of ``pack``: what to read, split into units."""

    kind: str  # "parquet" or "hf"
    root: str
    files: tuple[str, ...]
    fields: tuple[ColumnField, ...]
    key: str | None
    units: tuple[Unit, ...]
    num_rows: int
    fingerprint: str
    skipped: tuple[dict[str, str], ...] = ()
    dataset: Any = field(default=None, compare=False, repr=False)  # a datasets.Dataset given as SRC
    #: rows left out as later duplicates of a key (``on_error="skip"``): ``(file, row_group, file_row)``
    dropped: frozenset[tuple[str, int, int]] = frozenset()

    @property
    def columns(self) -> tuple[str, ...]:
        """The columns read for each row (fields, then the key column)."""
        return tuple(dict.fromkeys([f.column for f in self.fields] + ([self.key] if self.key else [])))

    def key_width(self) -> int:
        """Digits of a row-number key (9, or more for a source of a billion rows or more)."""
        return max(9, len(str(max(self.num_rows - 1, 0))))


def _pyarrow() -> Any:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise missing_dependency("pyarrow", "text", "parquet sources") from None
    return pq


def is_table_source(src: Any) -> bool:
    """True when ``src`` is for this module: a ``datasets`` object, a parquet file or glob,
    a folder whose files are all parquet, or a ``save_to_disk`` folder.

    Example:
        >>> is_table_source("corpus/train-*.parquet"), is_table_source("photos/")
        (True, False)
    """
    if is_hf_object(src):
        return True
    text = os.fspath(src)
    if text.lower().endswith(PARQUET_SUFFIXES) or is_hf_folder(text):
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


def scan_parquet(src: Any, *, columns: str | dict[str, str] | None = None, key: str | None = None,
                 on_error: str = "raise") -> TableSource:
    """Read the metadata of a parquet / HF source and split it into units.

    Args:
        src: a parquet file, folder or glob; a ``datasets.Dataset``; a ``save_to_disk`` folder.
        columns: ``"image=jpg,caption=txt"`` or a dict: the columns to pack and their fields
            (default: every column, fields by type).
        key: the column holding ``__key__`` (default: the row number).
        on_error: ``"raise"`` or ``"skip"`` (an unreadable file is left out and recorded).

    Raises:
        BadFileError: a file is not readable parquet (``"raise"``).
        ConfigError: a column of ``columns`` / ``key`` is missing (the message lists the
            columns there are), or SRC is a ``DatasetDict`` (pick a split).
        DuplicateKeyError: two rows have the same ``key`` (``"raise"``; ``"skip"`` keeps the first).
        EmptySourceError: no parquet file, or no rows.
    """
    on_error = check_on_error(on_error)
    mapping = parse_columns(columns)
    if is_hf_object(src):
        return _scan_hf(src, None, mapping, key, on_error)
    text = os.fspath(src)
    if is_hf_folder(text):
        refuse_dataset_dict(Path(text))
        return _scan_hf(load_from_disk(text), text, mapping, key, on_error)
    root, files = _list_parquet(text)
    return _scan_files(root, files, mapping, key, on_error)


def _list_parquet(text: str) -> tuple[str, list[str]]:
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


def _scan_files(root: str, files: list[str], mapping: dict[str, str] | None, key: str | None,
                on_error: str) -> TableSource:
    units: list[Unit] = []
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
            units.append(Unit(rel, g, file_row, row, rg.num_rows, rg.total_byte_size))
            file_row += rg.num_rows
            row += rg.num_rows
        kept.append(rel)
    if fields is None or row == 0:
        raise EmptySourceError(f"{show(root)}: the parquet files hold no rows"
                               + (f" ({len(skipped)} unreadable file(s) skipped)" if skipped else ""))
    src = TableSource("parquet", root, tuple(kept), fields, key, tuple(u for u in units if u.num_rows),
                      row, digest.hexdigest(), tuple(skipped))
    return _check_keys(src, on_error)


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


def _scan_hf(ds: Any, path: str | None, mapping: dict[str, str] | None, key: str | None,
             on_error: str) -> TableSource:
    where = show(path) if path else "datasets.Dataset"
    schema, ranges, fp = hf_ranges(ds, where)
    fields = resolve_columns(schema, mapping, key, where)
    units = tuple(Unit("", -1, a, a, n, nbytes) for a, n, nbytes in ranges)
    num_rows = sum(u.num_rows for u in units)
    digest = hashlib.sha256(json.dumps([mapping, key, fp, num_rows, path]).encode()).hexdigest()
    src = TableSource("hf", path or "", (), fields, key, units, num_rows, digest, dataset=None if path else ds)
    return _check_keys(src, on_error)


def _check_keys(src: TableSource, on_error: str) -> TableSource:
    """Read the key column (only it) and refuse duplicate keys (``skip``: recorded, kept first)."""
    if src.key is None:
        return src
    seen: dict[str, tuple[Unit, int]] = {}
    dups: list[dict[str, str]] = []
    dropped: set[tuple[str, int, int]] = set()
    for unit in src.units:
        for batch, _ in _batches(src, unit, (src.key,), 65536):
            for j, value in enumerate(batch.column(0).to_pylist()):
                k = str(value)
                if k in seen:
                    u0, r0 = seen[k]
                    where = _where(src, unit, unit.file_row + j)
                    msg = (f"{where}: duplicate key {show(k)!r} in column {src.key!r} (also "
                           f"{_where(src, u0, r0)}); make the keys unique, or pass --on-error skip")
                    if on_error == "raise":
                        raise DuplicateKeyError(msg)
                    dups.append({"path": where, "key": show(k), "reason": "duplicate key"})
                    dropped.add((unit.file, unit.row_group, unit.file_row + j))
                else:
                    seen[k] = (unit, unit.file_row + j)
    if not dups:
        return src
    return TableSource(src.kind, src.root, src.files, src.fields, src.key, src.units, src.num_rows,
                       src.fingerprint, src.skipped + tuple(dups), src.dataset, frozenset(dropped))


def _where(src: TableSource, unit: Unit, row: int) -> str:
    if src.kind == "hf":
        return f"{show(src.root) or 'datasets.Dataset'}: row {row}"
    return f"{show(os.path.join(src.root, unit.file))}: row group {unit.row_group}, row {row}"


def _batches(src: TableSource, unit: Unit, columns: tuple[str, ...], batch_rows: int
             ) -> Iterator[tuple[Any, int]]:
    """Record batches of ``columns`` of one unit, with the row (in the file) of each first row.

    A parquet unit that is a row range inside its row group (:func:`~fastfeed.packing.content.tables.split_units`)
    streams the row group from its start and keeps the range: memory stays one record batch.
    """
    import pyarrow as pa

    if src.kind == "hf":
        ds = src.dataset if src.dataset is not None else load_from_disk(src.root)
        yield from hf_batches(ds, unit.file_row, unit.num_rows, list(columns), batch_rows)
        return
    pf = _open_parquet(src.root, unit.file)
    start = sum(pf.metadata.row_group(g).num_rows for g in range(unit.row_group))
    row, end = start, unit.file_row + unit.num_rows  # a unit may be a row range inside its row group
    try:
        for batch in pf.iter_batches(batch_size=batch_rows, row_groups=[unit.row_group],
                                     columns=list(columns), use_threads=False):
            lo, hi = max(unit.file_row - row, 0), min(end - row, batch.num_rows)
            if hi > lo:
                yield (batch if (lo, hi) == (0, batch.num_rows) else batch.slice(lo, hi - lo)), row + lo
            row += batch.num_rows
            if row >= end:
                return
    except (pa.ArrowException, OSError) as e:
        raise BadFileError(f"{_where(src, unit, row)}: cannot read the row group ({e}); the file may be "
                           "corrupt: re-write it, or pass --on-error skip") from None


def iter_unit(src: TableSource, unit: Unit, *, on_error: str = "raise",
              skipped: list[dict[str, str]] | None = None, batch_rows: int = 1024) -> Iterator[Sample]:
    """The samples of one unit, in row order, reading ``batch_rows`` rows at a time.

    Args:
        src: from :func:`scan_parquet`.
        unit: one of ``src.units``.
        on_error: ``"raise"``: the first bad row raises; ``"skip"``: bad rows (and, for a
            row group that cannot be read, its remaining rows) are appended to ``skipped``
            as ``{"path", "key", "reason"}`` and left out.
        skipped: where ``"skip"`` records; None: not recorded (only left out).
        batch_rows: rows per record batch (bounds the memory of one read).

    Raises:
        BadFileError, UnsafePathError: a bad row or row group under ``"raise"``.
    """
    on_error = check_on_error(on_error)
    record = skipped if skipped is not None else []
    it = _batches(src, unit, src.columns, batch_rows)
    while True:
        try:
            batch, row = next(it)
        except StopIteration:
            return
        except BadFileError as e:
            if on_error == "raise":
                raise
            record.append({"path": _where(src, unit, unit.file_row), "key": "", "reason": str(e)})
            return
        batch, rows = _drop_duplicates(src, unit, batch, row)
        for item in batch_samples(batch, src.fields, src.key, first_row=unit.first_row + row - unit.file_row,
                                  width=src.key_width(), root=src.root):
            if isinstance(item, RowProblem):
                where = _where(src, unit, rows[item.offset])
                if on_error == "raise":
                    raise item.error(where)
                record.append({"path": where, "key": show(item.key), "reason": item.reason})
            else:
                yield item


def _drop_duplicates(src: TableSource, unit: Unit, batch: Any, row: int) -> tuple[Any, list[int]]:
    """The batch without the rows :func:`_check_keys` left out, and the file row of each kept row."""
    rows = list(range(row, row + batch.num_rows))
    if not src.dropped:
        return batch, rows
    keep = [(unit.file, unit.row_group, r) not in src.dropped for r in rows]
    if all(keep):
        return batch, rows
    import pyarrow as pa

    return batch.filter(pa.array(keep)), [r for r, k in zip(rows, keep) if k]


def iter_samples(src: TableSource, *, on_error: str = "raise",
                 skipped: list[dict[str, str]] | None = None) -> Iterator[Sample]:
    """Every sample of the source, unit after unit (see :func:`iter_unit`)."""
    for unit in src.units:
        yield from iter_unit(src, unit, on_error=on_error, skipped=skipped)


def group_units(src: TableSource, shard_bytes: int, shard_rows: int | None = None) -> list[tuple[int, ...]]:
    """Consecutive units (by index) per shard: a new shard starts when adding a unit would pass
    ``shard_bytes`` (uncompressed) or ``shard_rows``; a unit larger than that is a shard alone.

    Deterministic: the same source and limits give the same shards (resume after a crash).

    Example:
        >>> src = scan_parquet("corpus/")            # doctest: +SKIP
        >>> group_units(src, 256_000_000)[:2]        # doctest: +SKIP
        [(0, 1, 2), (3, 4)]
    """
    if shard_bytes <= 0 or (shard_rows is not None and shard_rows <= 0):
        raise ConfigError(f"shard_bytes={shard_bytes}, shard_rows={shard_rows}: must be positive")
    shards: list[tuple[int, ...]] = []
    cur: list[int] = []
    nbytes = rows = 0
    for i, u in enumerate(src.units):
        over = nbytes + u.nbytes > shard_bytes or (shard_rows is not None and rows + u.num_rows > shard_rows)
        if cur and over:
            shards.append(tuple(cur))
            cur, nbytes, rows = [], 0, 0
        cur.append(i)
        nbytes += u.nbytes
        rows += u.num_rows
    if cur:
        shards.append(tuple(cur))
    return shards
