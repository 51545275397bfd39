"""The index's sidecar arrays (``offsets.npy``, ``labels.npy``, ...): written, hashed, loaded and checked.

Every sidecar is a plain ``.npy`` file (never pickle). ``pack`` records the sha256 of each in
``index.json`` (the ``checksums`` entry, :mod:`fastfeed.packed.index`), and a reader checks
that hash when it opens the file. Whatever the index records, a loaded sidecar must also make
sense on its own (:func:`check_sidecar`): integer dtypes and the right shape (a float or object
``labels.npy`` is an error, never truncated or unpickled), labels within the classes, and
offsets that point into their own shard, in file order, without two samples overlapping (a row
swapped with another, or pointing at another sample, is caught there even in an index written
before checksums existed). A problem is an :class:`~fastfeed.errors.IndexMismatchError` naming
the file, what is wrong and the fix; offsets that do not fit their shard are a
:class:`~fastfeed.errors.SampleError` (a :class:`~fastfeed.errors.ShardError`) naming the shard
too, as a read at such an offset always was.

Example:
    >>> blob = npy_bytes(np.array([0, 2, 1]))
    >>> arr, sha = load_npy("labels.npy", blob)
    >>> arr.tolist(), sha == sha256_hex(blob)
    ([0, 2, 1], True)
    >>> check_sidecar("labels.npy", np.array([0, 7]), Layout(2, "tar", (2,), (4096,), classes=("a", "b", "c")))
    Traceback (most recent call last):
    ...
    fastfeed.errors.IndexMismatchError: labels.npy: label 7 of sample 1 is outside the 3 classes of the index (0-2, or -1 for none); labels.npy was changed or damaged after packing: restore it or re-run `fastfeed pack`
"""

from __future__ import annotations

import hashlib
import io
import os
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from fastfeed.errors import IndexMismatchError, SampleError
from fastfeed.packed.layout import CHECKSUMS_NAME, LABELS_NAME, LENGTHS_NAME, OFFSETS_NAME, SHAPES_NAME, SIZES_NAME

__all__ = ["Layout", "check_content", "check_form", "check_hash", "check_sidecar", "file_sha256", "load_npy",
           "npy_bytes", "sha256_hex"]

#: Per sidecar: the dtype kinds it may have (numpy's ``dtype.kind``) and its number of columns (0: 1-D).
_SPECS: dict[str, tuple[str, int]] = {
    OFFSETS_NAME: ("iu", 2), LABELS_NAME: ("iu", 0), LENGTHS_NAME: ("iu", 0), SHAPES_NAME: ("iu", 2),
    CHECKSUMS_NAME: ("u", 0), SIZES_NAME: ("iu", 2),
}
_FIX = "was changed or damaged after packing: restore it or re-run `fastfeed pack`"


@dataclass(frozen=True)
class Layout:
    """What a sidecar is checked against: the index's samples, shards and classes.

    Attributes:
        num_samples: samples in the dataset.
        format: ``tar`` (offsets are byte spans) or ``lmdb`` (record numbers).
        shard_counts: samples per shard, in order.
        shard_bytes: each shard's size.
        classes: the class names, or None (then labels are only checked to be >= -1).
        shard_names: the shards' names, for messages.
    """

    num_samples: int
    format: str
    shard_counts: Sequence[int]
    shard_bytes: Sequence[int]
    classes: Sequence[str] | None = None
    shard_names: Sequence[str] = ()


def npy_bytes(arr: np.ndarray) -> bytes:
    """The ``.npy`` file of ``arr`` (``numpy.save``, no pickle): what ``pack`` writes and hashes."""
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(arr), allow_pickle=False)
    return buf.getvalue()


def sha256_hex(data: bytes | memoryview) -> str:
    """The sha256 of ``data``, in hex."""
    return hashlib.sha256(data).hexdigest()


def file_sha256(path: str | os.PathLike[str]) -> str:
    """The sha256 of a file's bytes, in hex (read in 4 MB pieces)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def load_npy(where: str, data: bytes | None = None, *, mmap: bool = False) -> tuple[np.ndarray, str]:
    """A sidecar and the sha256 of its file: from ``data``, or the file ``where`` (memory-mapped with ``mmap``).

    Raises:
        FileNotFoundError: no such file (the caller names the index it belongs to).
        IndexMismatchError: not a ``.npy`` file numpy reads without pickle (an object array,
            a damaged header, a file shorter than its header says).
    """
    try:
        if data is not None:
            return np.load(io.BytesIO(data), allow_pickle=False), sha256_hex(data)
        sha = file_sha256(where)
        return np.load(where, mmap_mode="r" if mmap else None, allow_pickle=False), sha
    except FileNotFoundError:
        raise
    except (ValueError, OSError, EOFError) as e:  # pickled objects, a bad header, a short file
        raise IndexMismatchError(f"{where}: not a plain .npy array fastfeed can read ({e}); the file {_FIX}") from None


def check_sidecar(where: str, arr: np.ndarray, layout: Layout) -> None:
    """Check a loaded sidecar on its own terms (see the module doc); ``where`` names its file.

    Raises:
        IndexMismatchError: naming the file, the first bad row and the fix.
        SampleError: offsets that do not fit their shard (:func:`check_content`).
    """
    check_form(where, arr, layout)
    check_content(where, arr, layout)


def check_hash(where: str, sha: str, want: str | None, index_name: str) -> None:
    """Check a sidecar file's sha256 against the one ``index_name`` recorded (``want``).

    Raises:
        IndexMismatchError: they differ, or the index recorded none for the file.
    """
    if want is None:
        raise IndexMismatchError(f"{where}: {index_name} records no sha256 for it; the index is damaged, re-run "
                                 "`fastfeed pack`")
    if sha != want:
        raise IndexMismatchError(f"{where}: sha256 {sha[:16]}... differs from the {want[:16]}... {index_name} "
                                 f"recorded; the file {_FIX}")


def check_form(where: str, arr: np.ndarray, layout: Layout) -> None:
    """The sidecar's dtype and shape: integers (unsigned for checksums), one row per sample.

    Raises:
        IndexMismatchError: a float or object array, or the wrong shape.
    """
    name = os.path.basename(where)
    kinds, cols = _SPECS.get(name, ("iu", -1))
    if arr.dtype.kind not in kinds or arr.dtype.hasobject:
        want = "unsigned integers" if kinds == "u" else "integers"
        raise IndexMismatchError(f"{where}: holds {arr.dtype} values, fastfeed writes {want} here; the file {_FIX}")
    shape_ok = arr.ndim == 1 if cols == 0 else (arr.ndim == 2 and arr.shape[1] == cols) if cols > 0 else True
    if not shape_ok or arr.shape[0] != layout.num_samples:
        want = f"({layout.num_samples},)" if cols == 0 else f"({layout.num_samples}, {cols})"
        raise IndexMismatchError(f"{where}: shape {arr.shape}, the index needs {want} for its "
                                 f"{layout.num_samples} samples; the file {_FIX}")


def check_content(where: str, arr: np.ndarray, layout: Layout) -> None:
    """The rows of a sidecar of the right form: labels within the classes, offsets in order
    and inside their shards (other sidecars: nothing more to check).

    Raises:
        IndexMismatchError: a label outside the classes (naming the first).
        SampleError: offsets that do not fit their shard (naming the shard and the first bad row).
    """
    name = os.path.basename(where)
    if name == LABELS_NAME:
        _check_labels(where, arr, layout.classes)
    elif name == OFFSETS_NAME:
        _check_offsets(where, np.asarray(arr, dtype=np.int64), layout)


def _check_labels(where: str, labels: np.ndarray, classes: Sequence[str] | None) -> None:
    if not len(labels):
        return
    high = len(classes) if classes is not None else None
    bad = labels < -1
    if high is not None:
        bad |= labels >= high
    rows = np.flatnonzero(bad)
    if not rows.size:
        return
    i = int(rows[0])
    more = f" (and {rows.size - 1} more)" if rows.size > 1 else ""
    within = (f"the {high} classes of the index (0-{high - 1}, or -1 for none)" if high is not None
              else "the class indexes (>= 0, or -1 for none)")
    raise IndexMismatchError(f"{where}: label {int(labels[i])} of sample {i}{more} is outside {within}; "
                             f"{os.path.basename(where)} {_FIX}")


def _check_offsets(where: str, offsets: np.ndarray, layout: Layout) -> None:
    """Each row inside its own shard, in file order, overlapping no other (tar); record ``j`` of
    its shard for the ``j``-th sample of it, size 0 (LMDB)."""
    n = layout.num_samples
    if not n:
        return
    counts = np.asarray(layout.shard_counts, dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(counts)])
    shard_of = np.repeat(np.arange(len(counts)), counts)
    off, size = offsets[:, 0], offsets[:, 1]
    if layout.format == "lmdb":
        want = np.arange(n, dtype=np.int64) - starts[shard_of]
        bad = (off != want) | (size != 0)
        why = "record {o} (size {z}) where the shard's records run 0, 1, ... in order (record {w} here)"
    else:
        nxt = np.empty(n, dtype=np.int64)
        nxt[:-1] = off[1:]
        last = starts[1:][counts > 0] - 1
        nxt[last] = np.asarray(layout.shard_bytes, dtype=np.int64)[counts > 0]  # the last sample ends in its shard
        want = nxt
        bad = (off < 0) | (size <= 0) | (off + size > nxt)
        why = "offset {o} and size {z} run past {w}, where the next sample (or the shard) starts"
    rows = np.flatnonzero(bad)
    if not rows.size:
        return
    i = int(rows[0])
    s = int(shard_of[i])
    shard = layout.shard_names[s] if s < len(layout.shard_names) else f"shard {s}"
    more = f" (and {rows.size - 1} more rows)" if rows.size > 1 else ""
    # a SampleError (a ShardError) naming the shard: the index does not match this shard's samples
    raise SampleError(
        f"{where}: row {i} ({shard}): " + why.format(o=int(off[i]), z=int(size[i]), w=int(want[i]))
        + f"{more}: a row was swapped or points at another sample, the index does not match this shard; "
        f"{os.path.basename(where)} {_FIX}", shard=shard, offset=int(off[i]))
