"""The DALI index files ``fastfeed pack`` writes, read into flat per-sample arrays.

Next to every tar shard, ``fastfeed pack`` writes DALI's webdataset index (format v1.2:
per sample, ``ext data_offset size member_path`` for each member; the same files
``fn.readers.webdataset(index_paths=...)`` takes). :func:`sample_table` reads them, without
scanning any tar, into a :class:`SampleTable`: for every global sample, where the bytes of
its image (and of each other field) start in its shard, how many there are, and its key.
Each file is checked against ``index.json`` (sample counts), its shard (no byte past the
end) and ``offsets.npy`` (each field inside its sample's span).

Example:
    >>> table = sample_table(DatasetIndex.load("/data/ff"))          # doctest: +SKIP
    >>> table.image_field, table.key(0)                              # doctest: +SKIP
    ('jpg', 'n01440764/n01440764_10026')
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from fastfeed.decode.fields import is_image, last_ext
from fastfeed.errors import ConfigError, IndexMismatchError
from fastfeed.formats.naming import split_key
from fastfeed.formats.tar_reader import first_member_name
from fastfeed.packed.index import DatasetIndex, join
from fastfeed.storage.remote import filesystem, is_url, read_bytes

__all__ = ["DALI_IMAGE_EXTENSIONS", "SampleTable", "concat_tables", "parse_dali_index", "sample_table"]

#: Image extensions DALI's decoders read, most common first: when a sample holds
#: several, the first one in this order is decoded.
DALI_IMAGE_EXTENSIONS: tuple[str, ...] = (
    "jpg", "jpeg", "jpe", "jfif", "png", "webp", "bmp", "tif", "tiff", "jp2", "j2k", "pnm",
    "ppm", "pgm", "pbm",
)


# ---------------------------------------------------------------------- index files
def parse_dali_index(text: str, where: str) -> list[list[tuple[str, int, int, str]]]:
    """Parse DALI's webdataset index (v1.1 or v1.2) into per-sample component lists.

    Each component is ``(ext, data_offset, size, member_name)``; v1.1 has no member
    names (``""``). A member name holding spaces (legal in tar, ambiguous in the index)
    is rejoined up to the token that ends in ``.<ext>``.

    Example:
        >>> parse_dali_index("v1.2 1\\ncls 512 1 a/k.cls jpg 1536 9 a/k.jpg\\n", "x.idx")
        [[('cls', 512, 1, 'a/k.cls'), ('jpg', 1536, 9, 'a/k.jpg')]]
    """
    lines = text.splitlines()
    head = lines[0].split() if lines else []
    if len(head) != 2 or head[0] not in ("v1.1", "v1.2") or not head[1].isdigit():
        raise IndexMismatchError(
            f"{where}: not a DALI webdataset index v1.1/v1.2 (first line {lines[:1]!r}); "
            "re-run `fastfeed pack` to rewrite it"
        )
    named = head[0] == "v1.2"
    count = int(head[1])
    body = [ln for ln in lines[1:] if ln.strip()]
    if len(body) != count:
        raise IndexMismatchError(
            f"{where}: header says {count} samples but {len(body)} lines follow; the file is "
            "truncated or damaged, re-run `fastfeed pack`"
        )
    out = []
    for lineno, line in enumerate(body, start=2):
        try:
            out.append(_parse_line(line.split(), named))
        except ValueError as e:
            raise IndexMismatchError(f"{where} line {lineno}: {e}; re-run `fastfeed pack`") from None
    return out


def _parse_line(toks: list[str], named: bool) -> list[tuple[str, int, int, str]]:
    comps = []
    i = 0
    while i < len(toks):
        if i + 3 > len(toks):
            raise ValueError(f"incomplete component {toks[i:]!r}")
        ext, off, size = toks[i], int(toks[i + 1]), int(toks[i + 2])
        i += 3
        name = ""
        if named:
            if i >= len(toks):
                raise ValueError(f"component {ext!r} has no member name")
            parts = [toks[i]]
            i += 1
            while not parts[-1].endswith("." + ext) and i < len(toks):
                parts.append(toks[i])
                i += 1
            name = " ".join(parts)
        if off < 0 or size < 0:
            raise ValueError(f"negative offset or size in component {ext!r}")
        comps.append((ext, off, size, name))
    if not comps:
        raise ValueError("a sample without components")
    return comps


# ---------------------------------------------------------------------- the table
@dataclass(frozen=True)
class SampleTable:
    """Where every sample's fields live, from the DALI index files.

    Attributes:
        offsets: int64 (N,) byte offset of the image data in its shard (-1: no image).
        sizes: int64 (N,) byte size of the image data.
        image_ext: int16 (N,) the image field of each sample, as an index into ``exts``.
        exts: every field name found, in order of first appearance.
        field_offsets: per field name, int64 (N,) data offsets (-1: the sample lacks it).
        field_sizes: per field name, int64 (N,) data sizes.
        shard_starts: int64 (S + 1,) global number of each shard's first sample.
        key_text: the sample keys, concatenated (one string: a batch's keys are slices).
        key_starts: int64 (N + 1,) where each key starts in ``key_text``.
        source_starts: int64 (K + 1,) global number of each dataset's first sample: a
            table of K mixed datasets (:func:`concat_tables`) numbers them one after the
            other, dataset ``k``'s sample ``i`` is global sample ``source_starts[k] + i``.
    """

    offsets: np.ndarray
    sizes: np.ndarray
    image_ext: np.ndarray
    exts: tuple[str, ...]
    field_offsets: dict[str, np.ndarray] = field(repr=False)
    field_sizes: dict[str, np.ndarray] = field(repr=False)
    shard_starts: np.ndarray = field(repr=False)
    key_text: str = field(repr=False)
    key_starts: np.ndarray = field(repr=False)
    source_starts: np.ndarray | None = field(default=None, repr=False)

    def global_ids(self, ids: np.ndarray, source: np.ndarray) -> np.ndarray:
        """Global sample numbers of dataset ``source[j]``'s sample ``ids[j]``."""
        if self.source_starts is None:
            return np.asarray(ids, dtype=np.int64)
        return self.source_starts[np.asarray(source, dtype=np.int64)] + ids

    def source_of(self, ids: np.ndarray) -> np.ndarray:
        """The dataset of each global sample number (int64)."""
        ids = np.asarray(ids, dtype=np.int64)
        if self.source_starts is None:
            return np.zeros(ids.shape[0], dtype=np.int64)
        return (np.searchsorted(self.source_starts, ids, side="right") - 1).astype(np.int64)

    @property
    def image_field(self) -> str:
        """The most common image field (``"jpg"``), or ``""`` when there is none."""
        valid = self.image_ext[self.image_ext >= 0]
        return self.exts[int(np.bincount(valid).argmax())] if valid.size else ""

    def key(self, i: int) -> str:
        """The key of global sample ``i``."""
        return self.key_text[self.key_starts[i] : self.key_starts[i + 1]]

    def keys(self, ids: np.ndarray) -> list[str]:
        """Keys of the given samples, in order."""
        text, starts, ids = self.key_text, self.key_starts, np.asarray(ids, dtype=np.int64)
        return [text[a:b] for a, b in zip(starts[ids].tolist(), starts[ids + 1].tolist())]

    def shard_of(self, ids: np.ndarray) -> np.ndarray:
        """Shard number of each global sample number."""
        return np.searchsorted(self.shard_starts, ids, side="right") - 1

    def missing(self) -> np.ndarray:
        """Global numbers of the samples that hold no image DALI can decode."""
        return np.flatnonzero(self.offsets < 0)


def _read_text(path: str, storage_options: Any = None) -> str:
    try:
        if is_url(path):
            raw = read_bytes(path, storage_options=storage_options)
        else:
            with open(path, "rb") as f:
                raw = f.read()
    except FileNotFoundError:
        raise IndexMismatchError(
            f"{path}: DALI index file is missing; re-run `fastfeed pack` to write it"
        ) from None
    return raw.decode("utf-8")


def _image_rank(ext: str, image_field: str | None) -> int:
    """Preference of a field as the image (lower wins; -1: not the image)."""
    if image_field is not None:
        return 0 if ext == image_field else -1
    base = last_ext(ext)
    if base in DALI_IMAGE_EXTENSIONS:
        return DALI_IMAGE_EXTENSIONS.index(base)
    return len(DALI_IMAGE_EXTENSIONS) if is_image(ext) else -1


class _Columns:
    """Per-field offset/size columns, grown as new field names appear."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.exts: list[str] = []
        self.offsets: dict[str, np.ndarray] = {}
        self.sizes: dict[str, np.ndarray] = {}

    def put(self, ext: str, i: int, offset: int, size: int) -> int:
        if ext not in self.offsets:
            self.exts.append(ext)
            self.offsets[ext] = np.full(self.n, -1, dtype=np.int64)
            self.sizes[ext] = np.zeros(self.n, dtype=np.int64)
        self.offsets[ext][i], self.sizes[ext][i] = offset, size
        return self.exts.index(ext)


def sample_table(index: DatasetIndex, image_field: str | None = None,
                 storage_options: Any = None) -> SampleTable:
    """Read every shard's DALI index file into a :class:`SampleTable`.

    Args:
        index: a loaded tar dataset index (``ShardInfo.dali_index`` names the files).
        image_field: decode this field (e.g. ``"png"``); default: each sample's first
            image field in the order of :data:`DALI_IMAGE_EXTENSIONS`.
        storage_options: fsspec options for a remote dataset's index files.

    Raises:
        ConfigError: the dataset is not made of tar shards.
        IndexMismatchError: an index file is missing, damaged, or does not match its
            shard (sample count, offsets past the end, spans other than the index's).
    """
    if index.format != "tar":
        raise ConfigError(
            f"{index.root}: decode='dali' reads tar shards, this dataset is {index.format}; "
            "re-pack with `fastfeed pack --format tar` or use decode='cpu'"
        )
    n = index.num_samples
    cols = _Columns(n)
    offsets = np.full(n, -1, dtype=np.int64)
    sizes = np.zeros(n, dtype=np.int64)
    image_ext = np.full(n, -1, dtype=np.int16)
    keys: list[str] = []
    starts = index.shard_starts
    names = _HeaderNames(index, storage_options)
    for s, shard in enumerate(index.shards):
        samples = _shard_entries(index, s, storage_options)
        names.shard(s)
        base = int(starts[s])
        for j, comps in enumerate(samples):
            i = base + j
            best, best_rank = -1, 1 << 30
            for ext, off, size, _ in comps:
                k = cols.put(ext, i, off, size)
                r = _image_rank(ext, image_field)
                if 0 <= r < best_rank:
                    best, best_rank, offsets[i], sizes[i] = k, r, off, size
            image_ext[i] = best
            member = comps[0][3] or names.first(i)  # v1.1 indexes carry no names
            parts = split_key(member)
            keys.append(parts[0] if parts else f"{shard.name}:{j}")
        for ext in cols.exts:
            _check_bounds(cols.offsets[ext][base : base + shard.samples],
                          cols.sizes[ext][base : base + shard.samples], shard.bytes,
                          join(index.root, str(shard.dali_index)))
    names.shard(-1)  # closes the last shard opened for names
    _check_spans(index, offsets, sizes)
    key_starts = np.zeros(n + 1, dtype=np.int64)
    np.cumsum([len(k) for k in keys], out=key_starts[1:])
    return SampleTable(offsets, sizes, image_ext, tuple(cols.exts), cols.offsets, cols.sizes,
                       starts, "".join(keys), key_starts)


def concat_tables(tables: Sequence[SampleTable]) -> SampleTable:
    """One table over several datasets' samples, numbered one dataset after the other.

    Shards are numbered the same way (dataset 0's first, ...: what
    :class:`~fastfeed.loading.dali.feed.ShardMaps` over the same datasets maps), field
    names are the union (a field a dataset lacks is missing, offset -1, on its samples),
    and :attr:`SampleTable.source_starts` says where each dataset begins. One table is
    returned as it is.

    Example:
        >>> a = SampleTable(np.array([5]), np.array([3]), np.array([0], np.int16), ("jpg",),
        ...                 {"jpg": np.array([5])}, {"jpg": np.array([3])}, np.array([0, 1]), "a", np.array([0, 1]))
        >>> b = SampleTable(np.array([7, 9]), np.array([1, 1]), np.array([1, 1], np.int16), ("cls", "png"),
        ...                 {"cls": np.array([2, 4]), "png": np.array([7, 9])}, {"cls": np.array([1, 1]),
        ...                 "png": np.array([1, 1])}, np.array([0, 2]), "b0b1", np.array([0, 2, 4]))
        >>> t = concat_tables([a, b])
        >>> t.exts, t.image_ext.tolist(), t.keys(np.array([0, 2])), t.shard_starts.tolist()
        (('jpg', 'cls', 'png'), [0, 2, 2], ['a', 'b1'], [0, 1, 3])
        >>> t.global_ids(np.array([1, 0]), np.array([1, 0])).tolist(), t.source_of(np.array([0, 1, 2])).tolist()
        ([2, 0], [0, 1, 1])
    """
    if len(tables) == 1:
        return tables[0]
    exts: list[str] = []
    for t in tables:
        exts += [e for e in t.exts if e not in exts]
    sizes = [int(t.offsets.shape[0]) for t in tables]
    source_starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    image_ext = []
    for t in tables:
        remap = np.array([exts.index(e) for e in t.exts] + [-1], dtype=np.int16)  # -1 stays -1
        image_ext.append(remap[t.image_ext.astype(np.int64)])
    f_off = {e: np.concatenate([t.field_offsets[e] if e in t.field_offsets else np.full(n, -1, np.int64)
                                for t, n in zip(tables, sizes)]) for e in exts}
    f_size = {e: np.concatenate([t.field_sizes[e] if e in t.field_sizes else np.zeros(n, np.int64)
                                 for t, n in zip(tables, sizes)]) for e in exts}
    shard_starts, key_starts = [np.zeros(1, np.int64)], [np.zeros(1, np.int64)]
    text_len = 0
    for t, base in zip(tables, source_starts[:-1].tolist()):
        shard_starts.append(t.shard_starts[1:] + base)
        key_starts.append(t.key_starts[1:] + text_len)
        text_len += len(t.key_text)
    return SampleTable(np.concatenate([t.offsets for t in tables]), np.concatenate([t.sizes for t in tables]),
                       np.concatenate(image_ext), tuple(exts), f_off, f_size, np.concatenate(shard_starts),
                       "".join(t.key_text for t in tables), np.concatenate(key_starts), source_starts)


class _HeaderNames:
    """First member names read from the shards' tar headers, for samples whose DALI index
    line has none (v1.1: written when a member name holds whitespace). Opens a shard only
    when one of its samples needs it, and reads only header blocks."""

    def __init__(self, index: DatasetIndex, storage_options: Any) -> None:
        self.index, self.storage_options = index, storage_options
        self._s, self._file = -1, None

    def shard(self, s: int) -> None:
        if self._file is not None:
            self._file.close()
        self._s, self._file = s, None

    def first(self, i: int) -> str:
        url = self.index.shard_path(self._s)
        if self._file is None:
            if is_url(url):
                fs, path = filesystem(url, self.storage_options)
                self._file = fs.open(path, "rb")
            else:
                self._file = open(url, "rb")
        f = self._file

        def read(offset: int, size: int) -> bytes:
            f.seek(offset)
            return f.read(size)

        return first_member_name(read, int(self.index.offsets[i, 0]), url)


def _shard_entries(index: DatasetIndex, s: int, storage_options: Any = None
                   ) -> list[list[tuple[str, int, int, str]]]:
    shard = index.shards[s]
    if not shard.dali_index:
        raise IndexMismatchError(
            f"{index.shard_path(s)}: the index records no DALI index file for this shard; "
            "re-pack with `fastfeed pack` (it writes one next to every tar shard)"
        )
    where = join(index.root, shard.dali_index)
    samples = parse_dali_index(_read_text(where, storage_options), where)
    if len(samples) != shard.samples:
        raise IndexMismatchError(
            f"{where}: lists {len(samples)} samples but {join(index.root, 'index.json')} "
            f"says {shard.name} holds {shard.samples}; re-run `fastfeed pack`"
        )
    return samples


def _check_bounds(offsets: np.ndarray, sizes: np.ndarray, shard_bytes: int, where: str) -> None:
    ok = offsets >= 0
    bad = np.flatnonzero(ok & (offsets + sizes > shard_bytes))
    if bad.size:
        raise IndexMismatchError(
            f"{where}: sample {int(bad[0])} ends at byte {int(offsets[bad[0]] + sizes[bad[0]])}, past "
            f"the end of its {shard_bytes}-byte shard; the index does not match the shard, "
            "re-run `fastfeed pack`"
        )


def _check_spans(index: DatasetIndex, offsets: np.ndarray, sizes: np.ndarray) -> None:
    """Each image must lie inside its sample's span recorded in ``offsets.npy``."""
    spans = np.asarray(index.offsets)
    ok = offsets >= 0
    inside = (offsets >= spans[:, 0]) & (offsets + sizes <= spans[:, 0] + spans[:, 1])
    bad = np.flatnonzero(ok & ~inside)
    if bad.size:
        i = int(bad[0])
        s = int(index.shard_of(i))
        raise IndexMismatchError(
            f"{index.shard_path(s)}: the DALI index puts sample {i}'s image at byte "
            f"{int(offsets[i])} but offsets.npy says the sample spans "
            f"[{int(spans[i, 0])}, {int(spans[i, 0] + spans[i, 1])}); the index files disagree, "
            "re-run `fastfeed pack`"
        )
