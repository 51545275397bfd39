"""One record batch of a table -> samples: the per-row part of :mod:`fastfeed.packing.sources.parquet`.

:func:`batch_samples` turns a ``pyarrow.RecordBatch`` into :class:`Sample` s, or a
:class:`RowProblem` for a row that cannot be stored (the caller knows the file and row
group and applies ``on_error``). Values are taken out of arrow one column at a time.
:func:`field_length` is a row's ``--length``.

Example:
    >>> import pyarrow as pa
    >>> from fastfeed.packing.sources.columns import resolve_columns
    >>> batch = pa.record_batch({"caption": ["a cat", None], "label": [3, 4]})
    >>> fields = resolve_columns(batch.schema, None, None, "demo")
    >>> [s for s in batch_samples(batch, fields, None, first_row=0, width=9, root=".")]
    [Sample(key='000000000', fields={'caption.txt': b'a cat', 'label.json': b'3'}, label=3), \
Sample(key='000000001', fields={'label.json': b'4'}, label=4)]
"""

from __future__ import annotations

import io
import json
import os
from dataclasses import dataclass
from typing import Any, Iterator, NamedTuple

import numpy as np

from fastfeed.errors import BadFileError, SourceError, UnsafePathError
from fastfeed.packing.sources.columns import LABEL_COLUMNS, ColumnField, encode, media_ext
from fastfeed.packing.sources.base import LENGTH_TEXT_EXTS, key_problem, length_of_value, parse_length, show

__all__ = ["RowProblem", "Sample", "batch_samples", "field_length"]


class Sample(NamedTuple):
    """One row as pack stores it: key, fields (extension -> bytes), class label (-1: none)."""

    key: str
    fields: dict[str, bytes]
    label: int = -1


@dataclass(frozen=True)
class RowProblem:
    """A row that cannot be stored: its offset in the batch, key, column, reason and fix."""

    offset: int
    key: str
    column: str
    reason: str
    fix: str
    cls: type[SourceError] = BadFileError

    def error(self, where: str) -> SourceError:
        """The error to raise, ``where`` naming the file, row group and row."""
        col = f", column {self.column!r}" if self.column else ""
        return self.cls(f"{where} (key {show(self.key)!r}){col}: {self.reason}; {self.fix}")


def _leaf_dtype(typ: Any) -> np.dtype:
    import pyarrow as pa

    while pa.types.is_list(typ) or pa.types.is_large_list(typ) or pa.types.is_fixed_size_list(typ):
        typ = typ.value_type
    return np.dtype(typ.to_pandas_dtype())


def _values(col: Any, cf: ColumnField) -> tuple[list[Any], list[Any] | None]:
    """The Python values of one column (and, for ``{bytes, path}`` structs, the paths)."""
    if cf.kind == "media":
        paths = col.field("path").to_pylist() if col.type.get_field_index("path") >= 0 else None
        data = col.field("bytes").to_pylist()
        valid = col.is_valid().to_pylist()
        return [d if ok else None for d, ok in zip(data, valid)], paths
    values = col.to_pylist()
    if cf.kind == "array":
        dtype = _leaf_dtype(col.type)
        return [None if v is None else _array(v, dtype) for v in values], None
    return values, None


def _array(value: Any, dtype: np.dtype) -> Any:
    try:
        return np.asarray(value, dtype=dtype)
    except ValueError:
        return value  # ragged: encode() says so (npy) or stores the list (json)


def _media(data: bytes | None, path: str | None, root: str) -> bytes | None:
    """The bytes of a ``{bytes, path}`` value; with no bytes, the file ``path`` names."""
    if data is not None or not path:
        return data
    full = path if os.path.isabs(path) else os.path.join(root, path)
    if not os.path.isfile(full):
        raise ValueError(f"has no bytes and its path {show(path)!r} is not a file")
    with open(full, "rb") as f:
        return f.read()


def _cell(cf: ColumnField, value: Any, path: str | None, root: str) -> tuple[str, bytes] | None:
    if cf.kind == "media":
        value = _media(value, path, root)
    if value is None:
        return None
    if cf.kind in ("binary", "media") and not cf.field:
        return cf.field_for(media_ext(bytes(value[:32]), path)), bytes(value)
    return cf.field, encode(cf.field, value)


def _key(value: Any, row: int, width: int) -> tuple[str, str | None]:
    if value is None:
        return f"{row:0{width}d}", None
    key = value if isinstance(value, str) else str(value)
    return key, key_problem(key)


def batch_samples(batch: Any, fields: tuple[ColumnField, ...], key: str | None, *, first_row: int,
                  width: int, root: str) -> Iterator[Sample | RowProblem]:
    """The samples of one record batch, in row order (a :class:`RowProblem` for a bad row).

    Args:
        batch: a ``pyarrow.RecordBatch`` holding (at least) the columns of ``fields`` and ``key``.
        fields: from :func:`~fastfeed.packing.sources.columns.resolve_columns`.
        key: the key column, or None (row-number keys).
        first_row: the row number over the whole source of the batch's first row.
        width: digits of a row-number key.
        root: the folder relative ``{bytes, path}`` paths are read from.
    """
    names = batch.schema.names
    cols = [(cf, *_values(batch.column(names.index(cf.column)), cf)) for cf in fields]
    keys = batch.column(names.index(key)).to_pylist() if key else [None] * batch.num_rows
    labels = [batch.column(names.index(c)).to_pylist() if c in names else None for c in LABEL_COLUMNS]
    for j in range(batch.num_rows):
        k, why = _key(keys[j], first_row + j, width)
        if why is not None:
            yield RowProblem(j, k, key or "", f"unusable key ({why})",
                             f"fix the {key!r} column, or pass --on-error skip", UnsafePathError)
            continue
        out: dict[str, bytes] = {}
        problem = None
        for cf, values, paths in cols:
            try:
                cell = _cell(cf, values[j], paths[j] if paths else None, root)
            except (ValueError, TypeError, OSError) as e:
                problem = RowProblem(j, k, cf.column, f"cannot be stored as {cf.field or 'bytes'} ({e})",
                                     "fix the value, map the column to another field with --columns, "
                                     "or pass --on-error skip")
                break
            if cell is not None:
                out[cell[0]] = cell[1]
        if problem is None and not out:
            problem = RowProblem(j, k, "", "the row has no non-null field to store",
                                 "remove the row, or pass --on-error skip")
        if problem is not None:
            yield problem
            continue
        yield Sample(k, out, _label(labels, j))


def _label(labels: list[list[Any] | None], j: int) -> int:
    for values in labels:
        v = values[j] if values is not None else None
        if isinstance(v, int) and not isinstance(v, bool) and v >= 0:
            return v
    return -1


def field_length(fields: dict[str, bytes], spec: str) -> int:
    """``--length spec`` of a table row: its field ``FIELD`` (or ``FIELD.<ext>``), read by extension.

    Raises:
        KeyError: no such field; ValueError/TypeError: no usable length there.

    Example:
        >>> field_length({"n.json": b"12", "caption.txt": b"a cat sat"}, "n"), field_length({"caption.txt": b"a b"}, "caption")
        (12, 2)
    """
    name, sub = parse_length(spec)
    low = name.lower()
    found = [f for f in fields if f.lower() == low] or [f for f in fields if f.lower().startswith(low + ".")]
    if not found:
        raise KeyError(f"no field {name!r} (fields: {', '.join(sorted(fields))})")
    field = found[0]
    data = fields[field]
    ext = field.rpartition(".")[2].lower()
    if ext == "npy":
        return int(np.load(io.BytesIO(data), allow_pickle=False).shape[0])
    if sub is not None or ext in ("json", "jsn"):
        value = json.loads(data)
        return length_of_value(value[sub] if sub is not None else value)
    text = data.decode("utf-8")
    if ext in LENGTH_TEXT_EXTS:
        return len(text.split())
    return length_of_value(int(text.strip()))
