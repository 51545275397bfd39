"""HF ``datasets`` as a table source: a ``Dataset`` object or a ``save_to_disk`` folder.

The part of :mod:`fastfeed.packing.sources.table` that knows ``datasets``: recognising its
objects and folders, opening a folder memory-mapped (once per process), splitting the
rows into ranges and reading a range as arrow record batches. Rows are read through
``Dataset.with_format("arrow")``, so an indices mapping (``select``, ``shuffle``) gives
the dataset's order, and HF ``Image``/``Audio`` features arrive as their stored
``{bytes, path}`` structs (never decoded).

Example:
    >>> is_hf_object([1, 2]), is_hf_folder("photos/")
    (False, False)
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterator

from fastfeed.errors import BadFileError, ConfigError, EmptySourceError, missing_dependency
from fastfeed.packing.sources.base import show

__all__ = ["hf_batches", "hf_ranges", "is_hf_folder", "is_hf_object", "load_from_disk", "refuse_dataset_dict"]

_MARKERS = ("state.json", "dataset_info.json")
#: Rows per range: as many as fit this many bytes (1..65536).
_RANGE_BYTES = 64 * 1024 * 1024


def _datasets() -> Any:
    try:
        import datasets
    except ImportError:
        raise missing_dependency("datasets", "text", "HF datasets sources") from None
    return datasets


def is_hf_object(src: Any) -> bool:
    """True for an object of the ``datasets`` package (checked without importing it)."""
    return type(src).__module__.split(".")[0] == "datasets"


def is_hf_folder(path: str | Path) -> bool:
    """True for a folder written by ``Dataset.save_to_disk`` or ``DatasetDict.save_to_disk``."""
    p = Path(path)
    try:
        return p.is_dir() and (all((p / m).is_file() for m in _MARKERS) or (p / "dataset_dict.json").is_file())
    except OSError:  # a name too long, say: not one (opening the source says what is wrong)
        return False


def refuse_dataset_dict(path: Path) -> None:
    """Raise for a ``DatasetDict`` folder, naming its splits (pack takes one split)."""
    if (path / "dataset_dict.json").is_file():
        splits = sorted(p.name for p in path.iterdir() if p.is_dir())
        example = show(str(path / splits[0])) if splits else "SRC/train"
        raise ConfigError(f"{show(str(path))}: a DatasetDict (splits: {', '.join(splits)}); "
                          f"pass one split, e.g. {example}")


@lru_cache(maxsize=8)
def load_from_disk(path: str) -> Any:
    """A ``save_to_disk`` folder, memory-mapped (cached per process: units reopen it cheaply)."""
    lib = _datasets()
    try:
        return lib.load_from_disk(path)
    except (OSError, ValueError, json.JSONDecodeError) as e:
        raise BadFileError(f"{show(path)}: not a readable datasets.save_to_disk folder ({e}); "
                           "re-save it with Dataset.save_to_disk") from None


def hf_ranges(ds: Any, where: str) -> tuple[Any, list[tuple[int, int, int]], str]:
    """(arrow schema, row ranges ``(first, rows, estimated bytes)``, fingerprint) of a dataset.

    Raises:
        ConfigError: ``ds`` is not a ``datasets.Dataset`` (a ``DatasetDict``, an ``IterableDataset``).
        EmptySourceError: no rows.
    """
    if not hasattr(ds, "with_format") or not hasattr(ds, "data") or not hasattr(ds, "__len__"):
        raise ConfigError(f"{where}: a {type(ds).__name__} cannot be packed; pass a datasets.Dataset "
                          "(one split of a DatasetDict; save an IterableDataset first)")
    n = len(ds)
    if n == 0:
        raise EmptySourceError(f"{where}: the dataset has no rows")
    row_bytes = max(1, ds.data.nbytes // max(1, ds.data.num_rows))
    step = max(1, min(65536, _RANGE_BYTES // row_bytes))
    ranges = [(a, min(step, n - a), min(step, n - a) * row_bytes) for a in range(0, n, step)]
    return ds.data.schema, ranges, str(getattr(ds, "_fingerprint", "") or "")


def hf_batches(ds: Any, first: int, rows: int, columns: list[str], batch_rows: int) -> Iterator[tuple[Any, int]]:
    """Record batches of ``columns`` for rows ``[first, first + rows)``, with each batch's first row."""
    table = ds.with_format("arrow")
    for a in range(first, first + rows, batch_rows):
        b = min(a + batch_rows, first + rows)
        yield table[a:b].select(columns).combine_chunks().to_batches()[0], a
