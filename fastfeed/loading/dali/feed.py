"""What feeds fastfeed's DALI pipeline: memory-mapped shards and the batch feeder.

:class:`ShardMaps` memory-maps shards on demand. :class:`BatchFeeder` makes the batches
the loader feeds to the pipeline's inputs: it follows fastfeed's epoch plan
(:mod:`fastfeed.loading.order.rankplan`, the same order as ``decode="cpu"``) and gives each batch's
images as zero-copy views of the mapped shards (located by the
:class:`~fastfeed.loading.dali.table.SampleTable`), gathered into one DALI
``TensorListCPU`` (:func:`tensor_batch`), with a small int64 ``meta`` row per sample
``(generation, epoch, step, id, label)`` that carries the label and lets the loader
match every output batch to the batch it fed. :class:`FieldReader` decodes the other
fields of a batch on the host, as the CPU path does.

Mixing (several datasets): the table (:func:`~fastfeed.loading.dali.table.concat_tables`)
and the maps number the samples and shards of all datasets one dataset after the other,
and the feeder turns each planned ``(dataset, id)`` into that global number, so the feed,
the ``meta`` rows and the error messages work on one numbering.

Integrity, as on the CPU path (``Storage(verify=True)``, the default): before a batch is fed,
:meth:`ShardMaps.damaged` checks each sample's bytes in the map against the checksum ``pack``
recorded (:func:`fastfeed.packed.reader.sample_sums`); a damaged one is a
:class:`~fastfeed.errors.SampleError` naming shard and key, or with ``on_error="skip"`` left
out and counted. Each shard's size is checked (one ``fstat``) every time the feed or the field
reader uses its map, so a shard truncated under the loader is a
:class:`~fastfeed.errors.ShardError`; DALI reads the fed views later, in its own threads, so a
shard truncated between that check and DALI's read still faults (``docs/format.md``).

Why not ``fn.readers.webdataset``: its order is a shuffle buffer seeded once per
pipeline, its ``shard_id``/``num_shards`` split gives ranks unequal sample counts, and
it cannot start mid-epoch. Feeding views of the same memory-mapped files keeps the
reading as cheap (no copy, no Python per byte) while the order stays fastfeed's: a pure
function of (seed, epoch, world size), equal on every rank, resumable at any batch.

Example:
    >>> maps = ShardMaps(index, cache_dir=None)                              # doctest: +SKIP
    >>> feeder = BatchFeeder(table, maps, None, plan, placeholder_jpeg())    # doctest: +SKIP
    >>> feeder.restart(epoch=0, step=0); images, meta = feeder()             # doctest: +SKIP
"""

from __future__ import annotations

import io
import logging
import mmap
import os
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np

from fastfeed.loading.dali.table import SampleTable
from fastfeed.decode.fields import decode_field, last_ext
from fastfeed.errors import ConfigError, SampleError, ShardError
from fastfeed.formats.checksum import mismatch, mismatch_reason
from fastfeed.formats.span import OpenFile, check_size
from fastfeed.packed.index import DatasetIndex
from fastfeed.packed.reader import sample_sums
from fastfeed.loading.order.rankplan import Batch, RankPlan
from fastfeed.storage.remote import is_url, open_shard

__all__ = [
    "BatchFeeder", "FedBatch", "FieldReader", "ShardMaps", "field_bytes", "image_bytes",
    "placeholder_jpeg", "tensor_batch", "where",
]

log = logging.getLogger(__name__)

#: Columns of the int64 ``meta`` row fed with every sample.
GENERATION, EPOCH, STEP, SAMPLE, LABEL = range(5)
META_COLUMNS = 5


# ---------------------------------------------------------------------- shard mapping
class ShardMaps:
    """Memory-mapped shards, opened on first use, least recently used ones let go.

    A dropped map is not closed explicitly: it unmaps once the last array viewing it
    is gone (DALI may still be reading batches it was fed), so nothing is ever read
    from unmapped memory. Remote shards (URLs) go through the loader's shard cache
    (:func:`fastfeed.storage.remote.open_shard` with ``cache_dir``).

    With several datasets (``index`` a sequence: mixing), shard ``s`` counts over all of
    them, dataset 0's shards first (the numbering of
    :func:`~fastfeed.loading.dali.table.concat_tables`).

    Example:
        >>> maps = ShardMaps(index, cache_dir=None)                  # doctest: +SKIP
        >>> bytes(maps.view(0, 1536, 4))                             # doctest: +SKIP
        b'\\xff\\xd8\\xff\\xe0'
    """

    def __init__(self, index: DatasetIndex | Sequence[DatasetIndex], *,
                 cache_dir: str | os.PathLike[str] | None, cache_size: str | int = "50GB",
                 storage_options: Any = None, max_open: int = 256, verify: bool = True) -> None:
        self.indexes: tuple[DatasetIndex, ...] = (index,) if isinstance(index, DatasetIndex) else tuple(index)
        self._sums = [sample_sums(idx, verify) for idx in self.indexes]  # None: not checked
        self._files: dict[int, tuple[OpenFile, int, str]] = {}  # per mapped shard: its file, size, path
        self.index = self.indexes[0]
        self.cache_dir = cache_dir
        self.cache_size = cache_size
        self.storage_options = storage_options
        self.max_open = max_open
        # with several datasets (mixing) shards are numbered one dataset after the other,
        # as concat_tables numbers them
        self._first_shard = np.cumsum([0] + [len(i.shards) for i in self.indexes]).astype(np.int64)
        self._maps: OrderedDict[int, np.ndarray] = OrderedDict()
        for idx in self.indexes:
            if is_url(idx.root) and cache_dir is None:
                raise ConfigError(
                    f"{idx.root}: decode='dali' maps shards into memory and needs them on local disk; "
                    "pass cache_dir='/local/ssd/ff-cache' (shards are downloaded once and kept, "
                    "bounded by cache_size) or use decode='cpu'"
                )

    def _locate(self, s: int) -> tuple[DatasetIndex, int]:
        k = int(np.searchsorted(self._first_shard, s, side="right")) - 1
        return self.indexes[k], s - int(self._first_shard[k])

    def shard_path(self, s: int) -> str:
        """The path or URL of shard ``s`` (numbered over all datasets)."""
        index, local = self._locate(s)
        return index.shard_path(local)

    def array(self, s: int) -> np.ndarray:
        """The whole of shard ``s`` as a read-only uint8 array over its mapping.

        Raises:
            ShardError: the shard is shorter than the index says (truncated since it was mapped).
        """
        arr = self._maps.get(s)
        if arr is not None:
            self._maps.move_to_end(s)
            file, size, path = self._files[s]
            check_size(file.fd, size, path)  # a page past the end of a file that shrank: SIGBUS
            return arr
        arr = self._open(s)
        self._maps[s] = arr
        while len(self._maps) > self.max_open:
            old, _ = self._maps.popitem(last=False)
            self._files.pop(old, None)
        return arr

    def damaged(self, table: SampleTable, ids: np.ndarray) -> list[tuple[int, SampleError, str]]:
        """The samples of ``ids`` (global numbers of ``table``) whose bytes do not have the checksum
        ``pack`` recorded, as (position in ``ids``, the error naming shard and key, what differs);
        empty when the datasets have no checksums or verification is off."""
        if not any(self._sums) or not len(ids):
            return []
        out: list[tuple[int, SampleError, str]] = []
        source, shards = table.source_of(ids), table.shard_of(ids).tolist()
        starts = table.source_starts if table.source_starts is not None else np.zeros(1, dtype=np.int64)
        for k in np.unique(source).tolist():
            sums = self._sums[k]
            if sums is None:
                continue
            pos = np.flatnonzero(source == k)
            local = ids[pos] - starts[k]
            want, checked = sums.expected(local)
            spans = np.asarray(self.indexes[k].offsets[local]).tolist()
            for j, (off, size), w, c in zip(pos.tolist(), spans, want.tolist(), checked.tolist()):
                got = sums.digest(self.array(shards[j])[off:off + size]) if c else w
                if got != w:
                    path, key = self.shard_path(shards[j]), table.key(int(ids[j]))
                    out.append((j, mismatch(path, "offset", off, key, sums.algorithm, got, w),
                                f"its bytes at offset {off}: {mismatch_reason(sums.algorithm, got, w)}"))
        return sorted(out, key=lambda e: e[0])

    def _open(self, s: int) -> np.ndarray:
        index, local = self._locate(s)
        info = index.shards[local]
        url = index.shard_path(local)
        path = open_shard(url, cache_dir=self.cache_dir, cache_size=self.cache_size,
                          storage_options=self.storage_options, size=info.bytes, sha256=info.sha256)
        if not isinstance(path, str):  # only without cache_dir, refused in __init__
            path.close()
            raise ConfigError(f"{url}: cannot memory-map a shard held in memory; pass cache_dir=")
        size = os.path.getsize(path)
        if size != info.bytes:
            raise ShardError(
                f"{path}: {size} bytes but the index says {info.bytes}; the shard is truncated or "
                "was replaced, restore it or re-run `fastfeed pack`"
            )
        file = OpenFile.open(path)  # kept: every use of the map checks the file's size first
        mm = mmap.mmap(file.fd, 0, access=mmap.ACCESS_READ)
        if hasattr(mm, "madvise"):
            mm.madvise(mmap.MADV_RANDOM)  # samples are read in shuffled order
        self._files[s] = (file, info.bytes, path)
        return np.frombuffer(mm, dtype=np.uint8)

    def view(self, s: int, offset: int, size: int) -> np.ndarray:
        """Bytes ``[offset, offset + size)`` of shard ``s`` without copying."""
        return self.array(s)[offset : offset + size]


# ---------------------------------------------------------------------- the feeder
@dataclass(frozen=True)
class FedBatch:
    """A batch handed to DALI, kept until its output comes back.

    Attributes:
        generation: the feeder's generation when it was fed (a restart bumps it).
        epoch: epoch of the batch.
        step: batch number within the epoch.
        ids: global sample numbers fed, in order (-1: a placeholder, see BatchFeeder).
        valid: per id, False on a padding repeat (and on a placeholder).
        skipped: samples of the plan's batch left out (no image / failed before).
        views: what was given to DALI (kept alive until the output is consumed).
    """

    generation: int
    epoch: int
    step: int
    ids: np.ndarray
    skipped: tuple[int, ...] = ()
    views: tuple[Any, ...] = field(default=(), repr=False)
    valid: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool), repr=False)


class BatchFeeder:
    """Batches of image bytes in fastfeed's plan order, for the pipeline's inputs.

    It streams epoch after epoch from its start position; :meth:`restart` moves it to
    another (epoch, step) and bumps the generation, so outputs of batches fed before
    are recognised (``meta`` column 0) and discarded. Samples passed to :meth:`exclude`
    are left out of their batch; a batch left with no sample gets one placeholder image (id -1)
    so that the step still happens on every rank.

    Args:
        table: where images are (of every mixed dataset, :func:`~fastfeed.loading.dali.table.concat_tables`).
        maps: the mapped shards.
        labels: ``labels(ids) -> int64 array``, or None (zeros are fed).
        plan: ``plan(epoch) -> RankPlan`` of this rank (:meth:`EpochCursor.plan
            <fastfeed.loading.order.cursor.EpochCursor.plan>`).
        placeholder: bytes of a tiny valid image for empty batches.
        pack: ``views -> what external_source is fed`` (:func:`tensor_batch`; the list
            of views itself by default).
        on_error: a sample whose bytes fail their checksum (:meth:`ShardMaps.damaged`):
            ``"raise"`` a SampleError, or ``"skip"`` it (excluded from then on, its reason in
            :attr:`reasons`).
        extra: ``extra(planned, ids, epoch) -> int64 (len(ids), k)``: more ``meta`` columns after
            the first :data:`META_COLUMNS` (an aspect-ratio batch's crop boxes, from the batch's
            planned samples and the ones fed, -1 for a placeholder); None: none.
    """

    def __init__(self, table: SampleTable, maps: ShardMaps,
                 labels: Callable[[np.ndarray], np.ndarray] | None,
                 plan: Callable[[int], RankPlan], placeholder: bytes,
                 pack: Callable[[list[memoryview]], Any] = list, on_error: str = "raise",
                 extra: Callable[[np.ndarray, np.ndarray, int], np.ndarray] | None = None) -> None:
        self.on_error = on_error
        self.extra = extra
        #: why samples were left out by the feed (sample number -> message), with on_error="skip"
        self.reasons: dict[int, str] = {}
        self.table = table
        self.maps = maps
        self.labels = labels
        self.plan = plan
        self.pack = pack
        self._excluded = np.empty(0, dtype=np.int64)  # sorted sample numbers
        self.generation = 0
        self.pending: deque[FedBatch] = deque()
        self._placeholder = memoryview(placeholder)
        self._batches: Iterator[tuple[int, int, Batch]] = iter(())

    @property
    def excluded(self) -> frozenset[int]:
        """Samples left out of every batch fed from now on."""
        return frozenset(self._excluded.tolist())

    def exclude(self, ids: Iterable[int]) -> None:
        """Leave samples ``ids`` out of every batch fed from now on."""
        self._excluded = np.union1d(self._excluded, np.fromiter(ids, dtype=np.int64))

    def restart(self, epoch: int, step: int) -> None:
        """Feed from batch ``step`` of ``epoch`` on; earlier fed batches become stale."""
        self.generation += 1
        self._batches = self._stream(epoch, step)

    def _stream(self, epoch: int, step: int) -> Iterator[tuple[int, int, Batch]]:
        while True:
            plan = self.plan(epoch)
            for b in range(step, plan.num_batches):
                yield epoch, b, plan.batch(b)
            epoch, step = epoch + 1, 0

    def __call__(self) -> tuple[Any, np.ndarray]:
        """The next batch to feed: its images (``pack(views)``) and ``meta`` rows
        ``(generation, epoch, step, sample id, label)``, int64 (B, 5)."""
        epoch, step, planned = next(self._batches)
        wanted = self.table.global_ids(planned.ids, planned.source)
        ids, skipped, valid = self._drop_excluded(wanted, planned.valid)
        ids, skipped, valid = self._drop_damaged(ids, skipped, valid)
        views = self._views(ids)
        if not views:  # every sample excluded, or an empty batch (pad=False): one placeholder
            ids, valid = np.array([-1], dtype=np.int64), np.zeros(1, dtype=bool)
            views = [self._placeholder]
        images = self.pack(views)
        more = None if self.extra is None else self.extra(wanted, ids, epoch)
        meta = np.empty((len(ids), META_COLUMNS + (0 if more is None else more.shape[1])), dtype=np.int64)
        meta[:, GENERATION], meta[:, EPOCH], meta[:, STEP], meta[:, SAMPLE] = self.generation, epoch, step, ids
        meta[:, LABEL] = self.labels(np.maximum(ids, 0)) if self.labels is not None else 0
        if more is not None:
            meta[:, META_COLUMNS:] = more
        self.pending.append(FedBatch(self.generation, epoch, step, ids, skipped, (images, views), valid))
        return images, meta

    def _drop_excluded(self, planned: np.ndarray, valid: np.ndarray,
                       ) -> tuple[np.ndarray, tuple[int, ...], np.ndarray]:
        """The planned samples minus the excluded ones, the ones left out, and the kept ``valid``."""
        if not self._excluded.size:
            return planned, (), valid
        out = np.isin(planned, self._excluded)
        if not out.any():
            return planned, (), valid
        return planned[~out], tuple(planned[out].tolist()), valid[~out]

    def _drop_damaged(self, ids: np.ndarray, skipped: tuple[int, ...], valid: np.ndarray,
                      ) -> tuple[np.ndarray, tuple[int, ...], np.ndarray]:
        """The samples whose bytes pass their checksum; a damaged one raises, or is skipped (and
        excluded from then on) with ``on_error="skip"``."""
        bad = self.maps.damaged(self.table, ids)
        if not bad:
            return ids, skipped, valid
        if self.on_error == "raise":
            e = bad[0][1]
            raise SampleError(f"{e}; pass on_error='skip' to skip bad samples", shard=e.shard, key=e.key,
                              offset=e.offset)
        out = [int(ids[j]) for j, _, _ in bad]
        self.reasons.update({int(ids[j]): reason for j, _, reason in bad})
        self.exclude(out)
        keep = np.ones(len(ids), dtype=bool)
        keep[[j for j, _, _ in bad]] = False
        return ids[keep], (*skipped, *out), valid[keep]

    def _views(self, ids: np.ndarray) -> list[memoryview]:
        """Zero-copy views of the batch's image bytes in the mapped shards, in order."""
        table, maps = self.table, self.maps
        shard_list = table.shard_of(ids).tolist()
        starts = table.offsets[ids]
        ends = starts + table.sizes[ids]
        memory = {s: memoryview(maps.array(s)) for s in set(shard_list)}
        return [memory[s][a:b] for s, a, b in zip(shard_list, starts.tolist(), ends.tolist())]


def tensor_batch(dali: Any) -> Callable[[list[memoryview]], Any]:
    """``views -> TensorListCPU`` sharing the views' memory (nothing is copied).

    Why: handed a Python list of B arrays, ``external_source`` inspects and wraps each one
    in Python (~5 us per sample on the training thread, measured); wrapping each in C++
    (``TensorCPU``) and gathering them into one non-contiguous ``TensorListCPU`` costs a
    third of that, and DALI then takes the batch as it is. A DALI whose ``TensorListCPU``
    cannot gather without copying (no ``contiguous`` argument) gets the list of
    ``TensorCPU``, which it also takes without inspecting each sample's array.

    Example:
        >>> pack = tensor_batch(import_dali())                        # doctest: +SKIP
        >>> pack([memoryview(b"ab"), memoryview(b"cde")]).shape()      # doctest: +SKIP
        [(2,), (3,)]
    """
    wrap, gather = dali.TensorCPU, dali.TensorListCPU
    try:
        gather([wrap(memoryview(b"\0"))], None, False)
    except TypeError:  # an older DALI: a list of TensorCPU
        return lambda views: list(map(wrap, views))
    return lambda views: gather(list(map(wrap, views)), None, False)


def field_bytes(table: SampleTable, maps: ShardMaps, ext: str, i: int) -> bytes | None:
    """A copy of field ``ext`` of sample ``i`` (None when the sample lacks it)."""
    off = int(table.field_offsets[ext][i])
    if off < 0:
        return None
    s = int(table.shard_of(np.array([i]))[0])
    return bytes(maps.view(s, off, int(table.field_sizes[ext][i])))


#: Fields that decode to a small int (fields.py's ``cls`` family): decoded once, cached.
INT_FIELDS = frozenset({"cls", "cls2", "index", "inx", "id", "class", "count"})
_UNSET = np.iinfo(np.int64).min  # not parsed yet
_MISSING = _UNSET + 1  # the sample has no such field


class FieldReader:
    """Reads and decodes the non-image fields of a batch, as ``decode="cpu"`` does.

    Integer fields (``cls`` ...) are parsed once per sample and cached, so a label field
    costs a gather per batch rather than a parse per sample.
    """

    def __init__(self, table: SampleTable, maps: ShardMaps) -> None:
        self.table, self.maps = table, maps
        self._ints: dict[str, np.ndarray] = {}

    def raw(self, ext: str, ids: np.ndarray) -> list[bytes | None]:
        """The bytes of field ``ext`` of each sample (None where it is missing)."""
        offs = self.table.field_offsets[ext][ids].tolist()
        sizes = self.table.field_sizes[ext][ids].tolist()
        shards = self.table.shard_of(ids).tolist()
        arrays = {s: self.maps.array(s) for s, o in zip(shards, offs) if o >= 0}
        return [arrays[s][o : o + z].tobytes() if o >= 0 else None for s, o, z in zip(shards, offs, sizes)]

    def ints(self, ext: str, ids: np.ndarray, missing: int = -1) -> np.ndarray:
        """Field ``ext`` as int64 per sample (cached; ``missing`` where a sample lacks it).

        Raises:
            SampleError: a value that is not an integer (names shard and key).
        """
        cache = self._ints.get(ext)
        if cache is None:
            cache = self._ints[ext] = np.full(len(self.table.image_ext), _UNSET, dtype=np.int64)
        todo = ids[cache[ids] == _UNSET]
        if todo.size:
            for i, raw in zip(todo.tolist(), self.raw(ext, todo)):
                cache[i] = _MISSING if raw is None else self._decode(ext, raw, i)
        out = cache[ids]
        out[out == _MISSING] = missing
        return out

    def values(self, ext: str, ids: np.ndarray) -> list[Any]:
        """Field ``ext`` of each sample decoded like the CPU path (None where missing)."""
        if last_ext(ext) in INT_FIELDS:
            ints = self.ints(ext, ids, _MISSING)
            if not (ints == _MISSING).any():
                return ints.tolist()
            return [None if v == _MISSING else v for v in ints.tolist()]
        return [None if raw is None else self._decode(ext, raw, i)
                for i, raw in zip(ids.tolist(), self.raw(ext, ids))]

    def _decode(self, ext: str, raw: bytes, i: int) -> Any:
        try:
            return decode_field(ext, raw)
        except SampleError as e:
            shard, key, _ = where(self.table, self.maps, i)
            raise SampleError(f"{shard}: sample '{key}': {e}", shard=shard, key=key) from None


def image_bytes(table: SampleTable, maps: ShardMaps, i: int) -> bytes:
    """A copy of sample ``i``'s image bytes (for error diagnosis)."""
    s = int(table.shard_of(np.array([i]))[0])
    return bytes(maps.view(s, int(table.offsets[i]), int(table.sizes[i])))


def where(table: SampleTable, maps: ShardMaps, i: int) -> tuple[str, str, int]:
    """(shard path, key, image offset) of sample ``i``, for messages."""
    s = int(table.shard_of(np.array([i]))[0])
    return maps.shard_path(s), table.key(i), int(table.offsets[i])


def placeholder_jpeg() -> bytes:
    """An 8x8 grey JPEG (fed when every sample of a batch had to be skipped)."""
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (8, 8), (128, 128, 128)).save(buf, format="JPEG", quality=90)
    return buf.getvalue()
