"""Parquet files and HF ``datasets`` as the input of ``pack``: rows -> samples, in bounded memory.

SRC may be a ``.parquet`` file, a folder of them (searched recursively, sorted by path),
a glob (``data/train-*.parquet``; :mod:`~fastfeed.packing.sources.parquet`), a ``datasets.Dataset``
or a folder written by ``Dataset.save_to_disk`` (:mod:`~fastfeed.packing.sources.hf`).
:func:`scan_table` reads only metadata (parquet footers; for a key column, that column) and
splits the table into :class:`Unit` s: one per parquet row group, or a range of rows of a
``datasets.Dataset``. The units are a pure function of the files and their metadata, so pack
can plan shards from them (a :class:`TableSource` is a :class:`~fastfeed.packing.sources.base.Source`
whose units are kept whole), name a shard by the units it holds and, after a crash, rewrite
only the missing shards. :func:`iter_unit` streams the samples of one unit in record batches
of ``batch_rows`` rows; nothing ever holds a whole table.

Each row is one sample ``(key, {field: bytes}, label)``. Columns become fields by the
rules of :mod:`fastfeed.packing.sources.columns` (a ``columns`` mapping selects and renames);
``__key__`` is the ``key`` column's value, else the row number over the whole source,
zero-padded to 9 digits (as for JSONL manifests) so keys sort in row order. A null value
leaves its field out of that row. A row that cannot be stored (a key that is not a safe
member name, bytes that are no image under an image field, a ragged list under ``npy``)
follows ``on_error``: ``"raise"`` stops with an error naming the file, row group, row and
column and the fix; ``"skip"`` leaves the row out and records it in ``skipped``.

Example:
    >>> src = scan_table("wiki/train-*.parquet", columns="text=txt")   # doctest: +SKIP
    >>> src.num_rows, len(src.units), src.column_fields[0].field       # doctest: +SKIP
    (6458670, 41, 'txt')
    >>> next(iter_unit(src, src.units[0]))                             # doctest: +SKIP
    Sample(key='000000000', fields={'txt': b'Anarchism is ...'}, label=-1)
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from fastfeed import __version__
from fastfeed._util import check_on_error
from fastfeed.errors import BadFileError, ConfigError, DuplicateKeyError, SourceError
from fastfeed.formats.naming import is_image
from fastfeed.packing.sources.base import Content, Fields, Item, Measure, Member, Problem, Reading, show
from fastfeed.packing.sources.columns import LABEL_COLUMNS, ColumnField, parse_columns, resolve_columns
from fastfeed.packing.sources.hf import (
    hf_batches,
    hf_ranges,
    is_hf_folder,
    is_hf_object,
    load_from_disk,
    refuse_dataset_dict,
)
from fastfeed.packing.sources.parquet import list_parquet, row_group_batches, row_where, scan_files
from fastfeed.packing.sources.rows import RowProblem, Sample, batch_samples, field_length

__all__ = ["Sample", "TableSource", "Unit", "iter_samples", "iter_unit", "scan_table"]

log = logging.getLogger(__name__)


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
    """The validated table input of ``pack``: what to read, split into units.

    See :class:`~fastfeed.packing.sources.base.Source` for the protocol; besides, ``files``
    (the parquet files, relative to ``root``), ``column_fields`` (how each column is packed),
    ``key`` (the key column), ``num_rows``, ``fingerprint`` (digest of the metadata),
    ``dataset`` (a ``datasets.Dataset`` given as SRC, travelling in the plan) and ``dropped``
    (rows left out as later duplicates of a key, ``on_error="skip"``: ``(file, row_group, file_row)``).
    """

    kind: str  # "parquet" or "hf"
    root: str
    files: tuple[str, ...]
    column_fields: tuple[ColumnField, ...]
    key: str | None
    units: tuple[Unit, ...]
    num_rows: int
    fingerprint: str
    skipped: tuple[dict[str, str], ...] = ()
    dataset: Any = field(default=None, compare=False, repr=False)
    dropped: frozenset[tuple[str, int, int]] = frozenset()
    src: str = ""
    shown: str = ""

    #: a unit is a block of rows read whole: shards take consecutive units up to the limits
    blocks = True
    classes = None
    ignored = ()
    #: files from outside the source are not counted for tables (a ``{bytes, path}`` value's file is read as named)
    outside = None

    @property
    def location(self) -> str:
        """The resolved path, or ``datasets.Dataset:<fingerprint>`` for a dataset object."""
        return f"datasets.Dataset:{self.fingerprint}" if self.dataset is not None else os.path.realpath(self.src)

    @property
    def identity(self) -> str:
        """The metadata digest, and the rows dropped as duplicate keys."""
        return f"{self.fingerprint}|{sorted(self.dropped)}"

    @property
    def has_labels(self) -> bool:
        """A ``cls`` or ``label`` column is packed."""
        return any(cf.column in LABEL_COLUMNS for cf in self.column_fields)

    @property
    def fields(self) -> Fields:
        """Columns and the fields they are packed as (a field names itself too)."""
        names = {**{cf.field: cf.field for cf in self.column_fields if cf.field},
                 **{cf.column: cf.field for cf in self.column_fields}}
        return Fields(names, tuple(cf.column for cf in self.column_fields), "column")

    @property
    def columns(self) -> tuple[str, ...]:
        """The columns read for each row (fields, then the key column)."""
        return tuple(dict.fromkeys([f.column for f in self.column_fields] + ([self.key] if self.key else [])))

    def key_width(self) -> int:
        """Digits of a row-number key (9, or more for a source of a billion rows or more)."""
        return max(9, len(str(max(self.num_rows - 1, 0))))

    def measure(self, unit: Unit, fmt: str) -> Measure:
        """Its rows, and its uncompressed bytes (for the shard size and progress alike)."""
        return Measure(unit.num_rows, unit.nbytes, unit.num_rows, unit.nbytes)

    def split(self, shard_bytes: int, shard_rows: int | None) -> "TableSource":
        """Each unit of more than ``shard_rows`` rows or ``shard_bytes`` (estimated from its bytes per
        row) cut into consecutive row ranges that fit, so the shards can meet both limits (free for a
        HF dataset; a parquet row group is then read once per range, which is logged once).

        Example:
            >>> src = TableSource("hf", "", (), (), None, (Unit("", -1, 0, 0, 100, 1000),), 100, "fp")
            >>> [(u.file_row, u.num_rows, u.nbytes) for u in src.split(10**9, 40).units]
            [(0, 40, 400), (40, 40, 400), (80, 20, 200)]
        """
        units: list[Unit] = []
        split: list[tuple[Unit, int]] = []
        for u in self.units:
            cap = u.num_rows if shard_rows is None else min(u.num_rows, shard_rows)
            if u.nbytes > shard_bytes:
                cap = min(cap, max(1, shard_bytes * u.num_rows // u.nbytes))
            if cap >= u.num_rows:
                units.append(u)
                continue
            split.append((u, cap))
            for off in range(0, u.num_rows, cap):
                n = min(cap, u.num_rows - off)
                units.append(Unit(u.file, u.row_group, u.file_row + off, u.first_row + off, n,
                                  u.nbytes * n // u.num_rows))
        if split and self.kind == "parquet":
            u, cap = split[0]
            log.warning("%s: row group %d has %d rows, more than one shard holds (%d); %d row group(s) larger "
                        "than a shard are each read once per shard they span; write the parquet with smaller row "
                        "groups (row_group_size=) to pack faster", show(os.path.join(self.root, u.file)),
                        u.row_group, u.num_rows, cap, len(split))
        return replace(self, units=tuple(units))

    def content(self, shards: Sequence[tuple[Sequence[Any], Sequence[bool]]], options: Mapping[str, Any],
                tokenizer: str | None) -> Content:
        """Options, tokenizer, the source's fingerprint and the units of every shard (no Pillow version:
        a table's index never recorded one)."""
        h = hashlib.sha256(json.dumps([__version__, self.kind, dict(options), tokenizer, self.fingerprint,
                                       sorted(self.dropped)], sort_keys=True, default=str).encode())
        for units, _ in shards:
            h.update(b"|shard")
            h.update(repr(list(units)).encode("utf-8", "surrogateescape"))
        return Content(h.hexdigest()[:32], None)

    def for_writer(self) -> "TableSource":
        """Without its units (each shard carries its own) and skips."""
        return replace(self, units=(), skipped=())

    def read(self, units: Sequence[Unit], raw: Sequence[bool], reading: Reading) -> Iterator[Item]:
        """The rows of ``units`` in order, with their ``--length``; image values re-encoded when
        ``reading.reencodes`` (bad rows raised or appended to ``reading.skipped``)."""
        spec = reading.length
        image = reading.image if reading.reencodes else None
        for unit in units:
            first = True
            for s in iter_unit(self, unit, on_error=reading.on_error, skipped=reading.skipped):
                length = None
                if spec:
                    try:
                        length = field_length(s.fields, spec)
                    except (KeyError, ValueError, TypeError, IndexError, UnicodeDecodeError) as e:
                        msg = (f"{show(self.src)}: --length {spec}: row {show(s.key)!r} has no usable length "
                               f"({type(e).__name__}: {e})")
                        if reading.on_error == "raise":
                            raise SourceError(f"{msg}; store a non-negative integer, a text or a list there, "
                                              "or pass --on-error skip") from None
                        reading.skipped.append({"path": show(self.src), "key": show(s.key), "reason": msg})
                        continue
                # progress counts rows as files and the unit's (uncompressed) bytes when it is read
                item = Item(s.key, s.fields, s.label, length, 1, unit.nbytes if first else 0)
                first = False
                if image is not None:
                    try:
                        item = item._replace(fields={
                            f: image(Member(f, f"{item.key}.{f}", len(d), 0), d, False) if is_image(f) else d
                            for f, d in item.fields.items()})
                    except Problem as p:
                        if reading.on_error != "skip":
                            raise p.error(self.root) from None
                        reading.skipped.append({"path": show(p.where), "key": show(item.key), "reason": p.reason})
                        continue
                yield item


def scan_table(src: Any, *, columns: str | dict[str, str] | None = None, key: str | None = None,
               on_error: str = "raise", store: str = "jpeg") -> TableSource:
    """Read the metadata of a parquet / HF source and split it into units.

    Args:
        src: a parquet file, folder or glob; a ``datasets.Dataset``; a ``save_to_disk`` folder.
        columns: ``"image=jpg,caption=txt"`` or a dict: the columns to pack and their fields
            (default: every column, fields by type).
        key: the column holding ``__key__`` (default: the row number).
        on_error: ``"raise"`` or ``"skip"`` (an unreadable file is left out and recorded).
        store: ``pack --store``; only ``jpeg`` (images stay encoded) for a table.

    Raises:
        BadFileError: a file is not readable parquet (``"raise"``).
        ConfigError: a column of ``columns`` / ``key`` is missing (the message lists the
            columns there are), SRC is a ``DatasetDict`` (pick a split), or ``store`` is not ``jpeg``.
        DuplicateKeyError: two rows have the same ``key`` (``"raise"``; ``"skip"`` keeps the first).
        EmptySourceError: no parquet file, or no rows.
    """
    on_error = check_on_error(on_error)
    hf_object = is_hf_object(src)
    shown = "datasets.Dataset" if hf_object else show(os.fspath(src))
    if store != "jpeg":
        raise ConfigError(f"{shown}: store={store!r} is for image folders, manifests and WebDataset tars; "
                          "parquet/HF input stores its images encoded: drop --store (or pack the images from a folder)")
    where = {"src": "datasets.Dataset" if hf_object else str(Path(src).absolute()), "shown": shown}
    mapping = parse_columns(columns)
    if hf_object:
        return replace(_scan_hf(src, None, mapping, key, on_error), **where)
    text = os.fspath(src)
    if is_hf_folder(text):
        refuse_dataset_dict(Path(text))
        return replace(_scan_hf(load_from_disk(text), text, mapping, key, on_error), **where)
    root, files = list_parquet(text)
    found = scan_files(root, files, mapping, key, on_error)
    table = TableSource("parquet", found.root, found.files, found.fields, key, tuple(Unit(*u) for u in found.units),
                        found.num_rows, found.fingerprint, found.skipped)
    return replace(_check_keys(table, on_error), **where)


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
    return replace(src, skipped=src.skipped + tuple(dups), dropped=frozenset(dropped))


def _where(src: TableSource, unit: Unit, row: int) -> str:
    if src.kind == "hf":
        return f"{show(src.root) or 'datasets.Dataset'}: row {row}"
    return row_where(src.root, unit.file, unit.row_group, row)


def _batches(src: TableSource, unit: Unit, columns: tuple[str, ...], batch_rows: int
             ) -> Iterator[tuple[Any, int]]:
    """Record batches of ``columns`` of one unit, with the row (in the file) of each first row."""
    if src.kind == "hf":
        ds = src.dataset if src.dataset is not None else load_from_disk(src.root)
        yield from hf_batches(ds, unit.file_row, unit.num_rows, list(columns), batch_rows)
        return
    yield from row_group_batches(src.root, unit.file, unit.row_group, unit.file_row, unit.num_rows,
                                 list(columns), batch_rows)


def iter_unit(src: TableSource, unit: Unit, *, on_error: str = "raise",
              skipped: list[dict[str, str]] | None = None, batch_rows: int = 1024) -> Iterator[Sample]:
    """The samples of one unit, in row order, reading ``batch_rows`` rows at a time.

    Args:
        src: from :func:`scan_table`.
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
        for item in batch_samples(batch, src.column_fields, src.key,
                                  first_row=unit.first_row + row - unit.file_row,
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
