"""Datasets over shards: an iterable of whole batches (for ``loader()``) and a map-style one.

:class:`ShardBatches` yields collated batches, one rank plan
(:func:`fastfeed.loading.order.position.rank_plan`) at a time: batch ``b`` is built by worker
``(b - start) % num_workers``, so ``DataLoader(batch_size=None)`` hands them back in
order and the stream does not depend on ``num_workers``. The epoch and the first batch
of a pass (and the earlier stages of an elastically resumed epoch) live in a small
shared-memory tensor, so persistent workers see ``set_epoch`` and resume points without
being restarted. With several datasets (mixing) each has its own reader.

Samples are read through :class:`fastfeed.packed.reader.ShardSource` (shards opened lazily in
each worker). A shard that does not match the index is an error whatever ``on_error``
says; a sample that cannot be read or decoded raises
:class:`~fastfeed.errors.SampleError` naming shard, key and offset, or with
``on_error="skip"`` is left out of its batch and reported in the batch's
``"__skipped__"`` list (which :class:`fastfeed.loading.api.Loader` moves into its stats).
Each batch also carries ``"__timing__"``: the seconds its worker spent reading and
decoding it and its CPU seconds (three ``perf_counter``/``process_time`` readings per
batch), which the Loader also moves into its stats (:mod:`fastfeed.loading.bottleneck`).
Each worker publishes what it is doing (batch, shard, phase, since when) in its row of the
loader's :class:`~fastfeed.loading.cpu.watchdog.WorkerSlots`, for the stall watchdog: a few
stores per batch and per shard change.

:func:`open_dataset` gives map-style access (``len``, ``ds[i]``) for users who bring
their own sampler.

Example:
    >>> ds = open_dataset("/data/imagenet-ff")                 # doctest: +SKIP
    >>> len(ds), sorted(ds[0])                                 # doctest: +SKIP
    (1281167, ['__key__', 'cls', 'jpg'])
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info

from fastfeed.decode import bufpool
from fastfeed.decode.bufpool import BufferPool
from fastfeed.decode.collate import one_storage
from fastfeed.decode.cpu import CpuDecoder, RawDecoder
from fastfeed.formats.naming import holds_pixels
from fastfeed.errors import ConfigError, SampleError, ShardError
from fastfeed.packed.index import DatasetIndex
from fastfeed.loading.order.elastic import Stage
from fastfeed.loading.order.epoch import worker_batches
from fastfeed.loading.order.rankplan import Batch, PlanSpec, RankPlan
from fastfeed.loading.order.position import Position, SharedPosition, rank_plan
from fastfeed.loading.cpu.watchdog import NO_SLOT, Slot, WorkerSlots
from fastfeed.storage.remote import is_url
from fastfeed.packed.reader import ShardSource, check_shards, resolve_index, sample_error

# check_shards, resolve_index and ShardSource live in fastfeed.packed.reader; importable from here too
__all__ = ["SKIPPED_KEY", "TIMING_KEY", "ShardBatches", "ShardDataset", "ShardSource", "check_shards",
           "open_dataset", "resolve_index"]

log = logging.getLogger(__name__)

Decoder = CpuDecoder | RawDecoder
#: Batch key holding the skip reasons of a batch (popped by the Loader).
SKIPPED_KEY = "__skipped__"
#: Batch key holding (read seconds, decode seconds, CPU seconds) of the batch's worker.
TIMING_KEY = "__timing__"


class ShardBatches(IterableDataset):
    """Whole collated batches of one rank, for ``DataLoader(batch_size=None)``.

    Args:
        sources: where samples are read from, one per dataset (the planner's order).
        decoder: turns a list of samples into a batch dict (``CpuDecoder`` / ``RawDecoder``).
        spec: the datasets' plan inputs (:func:`fastfeed.loading.order.rankplan.plan_spec`).
        shape: this loader's world size, batch size and mode.
        rank: this rank.
        on_error: ``"raise"`` or ``"skip"`` for bad samples.

    Each batch carries ``"valid"`` (bool, False on padding repeats) and ``"__source__"``
    (int64, the dataset of each sample), aligned with ``"__key__"``; a batch of no sample
    (``pad=False``, a rank's last) is a well-formed dict of zero-length entries.

    Built by :func:`fastfeed.loader` from options already validated
    (:func:`fastfeed.loading.options.loader_options`); nothing is checked again here.
    """

    def __init__(self, sources: Sequence[ShardSource], decoder: Decoder, *, spec: PlanSpec, shape: Stage,
                 rank: int, on_error: str = "raise") -> None:
        self.sources, self.decoder = list(sources), decoder
        self.spec, self.shape, self.rank, self.on_error = spec, shape, rank, on_error
        self.batch_size, self.world_size = shape.batch_size, shape.world_size
        # decoders see ids unique over the datasets, so crops differ between datasets
        self._offsets = np.concatenate([[0], np.cumsum([s.index.num_samples for s in self.sources])[:-1]])
        self._position = SharedPosition()
        self._empty = _empty_entries(self.sources, decoder)
        self.pool: BufferPool | None = None  # set by the loader (persistent workers only)
        self.slots: WorkerSlots | None = None  # set by the loader: what each worker does, for its watchdog
        self._slot: Slot = NO_SLOT  # this process's row of ``slots``
        self._plan: RankPlan | None = None
        self._plan_key: Position | None = None

    @property
    def source(self) -> ShardSource:
        """The first dataset's source (the only one without mixing)."""
        return self.sources[0]

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_plan"], state["_plan_key"] = None, None  # workers compute their own
        state["_slot"] = NO_SLOT  # each process takes its own row
        return state

    def set_position(self, pos: Position) -> None:
        """Make the next pass start at ``pos`` (all workers)."""
        self._position.set(pos)

    def plan(self, epoch: int, prior: tuple[Stage, ...] = (), legacy: bool = False) -> RankPlan:
        """This rank's plan of ``epoch`` after the stages ``prior`` (cached for the last asked)."""
        key = Position(epoch, 0, prior, legacy)
        if self._plan is None or self._plan_key != key:
            self._plan = rank_plan(self.spec, self.shape, self.rank, key)
            self._plan_key = key
        return self._plan

    def __iter__(self):  # type: ignore[no-untyped-def]
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 0)
        if info is not None:
            bufpool.activate(self.pool, worker)
        slot = self._slot = self.slots.slot(worker) if self.slots is not None else NO_SLOT
        pos = self._position.get()
        plan = self.plan(pos.epoch, pos.prior, pos.legacy)
        mine = worker_batches(plan.num_batches, start=pos.start, num_workers=workers, worker=worker)
        for i, b in enumerate(mine):
            slot.batch(pos.epoch, b)
            if i + 1 < len(mine):  # the next batch's reads start while this one decodes
                nxt = plan.batch(mine[i + 1])
                for k, src in enumerate(self.sources):
                    src.will_need(nxt.ids[nxt.source == k] if len(self.sources) > 1 else nxt.ids)
            batch = self.make_batch(plan.batch(b), pos.epoch)
            slot.idle()
            yield batch

    def make_batch(self, planned: Batch, epoch: int) -> dict[str, Any]:
        """Read, decode and collate the samples of ``planned`` (in that order)."""
        t0, cpu0 = time.perf_counter(), time.process_time()
        ids, which = planned.ids, planned.source
        n = len(ids)
        shard_of = np.zeros(n, dtype=np.int64)
        offset_of = np.zeros(n, dtype=np.int64)
        skipped: list[str] = []
        got: list[dict[str, Any] | None] = [None] * n
        for k in np.unique(which).tolist():
            src = self.sources[k]
            pos = np.flatnonzero(which == k)
            shards, locs = src.locate(ids[pos])
            shard_of[pos], offset_of[pos] = shards, locs[:, 0]
            where, shard_list, loc_list = pos.tolist(), shards.tolist(), locs.tolist()
            reader, at = None, -1  # the open reader of shard ``at``
            for j in np.argsort(ids[pos], kind="stable").tolist():  # read in file order, keep batch order
                s, (off, size) = shard_list[j], loc_list[j]
                try:
                    if s != at:
                        self._slot.shard(k, s)
                        reader, at = src.reader(s), s
                    got[where[j]] = src.attach_shape(reader.read(off, size), int(ids[where[j]]))
                except SampleError as e:
                    self._fail(skipped, sample_error(src, s, off, "", e))
        kept = [j for j, g in enumerate(got) if g is not None]
        samples = [got[j] for j in kept]
        kept_arr = np.asarray(kept, dtype=np.int64)
        failed: set[int] = set()

        def fail(k: int, exc: BaseException) -> None:
            j = kept[k]
            failed.add(k)
            err = sample_error(self.sources[int(which[j])], int(shard_of[j]), int(offset_of[j]),
                               samples[k].get("__key__", ""), exc)
            self._fail(skipped, err)

        t1 = time.perf_counter()
        self._slot.decoding()
        labels = self._labels(ids[kept_arr], which[kept_arr])
        batch = self.decoder.decode_batch(samples, ids[kept_arr] + self._offsets[which[kept_arr]], epoch,
                                          labels, fail)
        rows = kept_arr[[k for k in range(len(kept)) if k not in failed]] if failed else kept_arr
        if not rows.size:  # an empty batch (pad=False, or all skipped) has the keys of a full one
            for k in self._empty:
                batch.setdefault(k, torch.zeros(0, dtype=torch.int64) if k == "label" else [])
        batch["__source__"] = torch.from_numpy(np.ascontiguousarray(which[rows], dtype=np.int64))
        batch["valid"] = torch.from_numpy(np.ascontiguousarray(planned.valid[rows], dtype=bool))
        pooled = bufpool.active()
        if pooled is not None:  # the tensors in its slots (and the small ones) cross by reference
            batch = pooled[0].pack(batch)
        batch = one_storage(batch)  # in a worker: what is left sent as one storage
        batch[SKIPPED_KEY] = skipped
        batch[TIMING_KEY] = (t1 - t0, time.perf_counter() - t1, time.process_time() - cpu0)
        return batch

    def _labels(self, ids: np.ndarray, which: np.ndarray) -> np.ndarray | None:
        """Index labels of the samples, when every dataset records them (else None)."""
        if any(src.index.labels is None for src in self.sources):
            return None
        out = np.zeros(len(ids), dtype=np.int64)
        for k in np.unique(which).tolist():
            m = which == k
            out[m] = np.asarray(self.sources[k].index.labels)[ids[m]]
        return out

    def _fail(self, skipped: list[str], err: SampleError) -> None:
        if self.on_error == "raise":
            raise SampleError(f"{err}; pass on_error='skip' to skip bad samples",
                              shard=err.shard, key=err.key, offset=err.offset)
        skipped.append(str(err))


def _empty_entries(sources: Sequence[ShardSource], decoder: Decoder) -> tuple[str, ...]:
    """The entries an empty batch carries besides ``__key__``: each field (an empty list),
    and ``label`` (an empty int64 tensor) where batches have labels."""
    fields: dict[str, None] = {}
    for src in sources:
        fields.update(dict.fromkeys(src.index.fields))
    cpu = isinstance(decoder, CpuDecoder)
    out = [f for f in fields if not (cpu and (holds_pixels(f) or f == "cls"))]
    if all(src.index.labels is not None for src in sources) or (cpu and "cls" in fields):
        out.append("label")
    return tuple(out)


class _Epoch:
    """The epoch of :class:`ShardDataset`'s crops, in shared memory so workers see updates."""

    def __init__(self) -> None:
        self.t = torch.zeros(1, dtype=torch.int64).share_memory_()

    def set(self, epoch: int) -> None:
        self.t[0] = epoch

    def get(self) -> int:
        return int(self.t[0])


class ShardDataset(Dataset):
    """Map-style access to a dataset: ``len(ds)`` samples, ``ds[i]`` a sample dict.

    ``ds[i]`` is ``{"__key__": ..., "<field>": bytes, ...}`` with ``decode=None``, or the
    sample decoded like a batch of one (image as an upright HWC uint8 array) with
    ``decode="cpu"``. Random crops depend on ``(seed, epoch, i)``; call
    :meth:`set_epoch` to change them (it reaches persistent workers too).
    """

    def __init__(self, source: ShardSource, decoder: Decoder) -> None:
        self.source, self.decoder = source, decoder
        self._epoch = _Epoch()

    @property
    def index(self) -> DatasetIndex:
        return self.source.index

    def __len__(self) -> int:
        return self.source.index.num_samples

    def set_epoch(self, epoch: int) -> None:
        """Epoch used for the random crops of ``decode="cpu"``."""
        self._epoch.set(int(epoch))

    def __getitem__(self, i: int) -> dict[str, Any]:
        n = len(self)
        if not isinstance(i, (int, np.integer)):
            raise TypeError(f"dataset indices are integers, not {type(i).__name__}")
        if not -n <= i < n:
            raise IndexError(f"sample {i} out of range for {n} samples")
        i = int(i) % n
        shards, locs = self.source.locate(np.array([i]))
        s, off, size = int(shards[0]), int(locs[0, 0]), int(locs[0, 1])
        key = ""
        try:
            sample = self.source.read_at(s, off, size, i)
            key = sample.get("__key__", "")
            labels = self.source.index.labels
            label = None if labels is None else int(labels[i])
            return self.decoder.decode_sample(sample, i, self._epoch.get(), label)
        except (SampleError, OSError, ValueError) as e:
            if isinstance(e, ConfigError) or (isinstance(e, ShardError) and not isinstance(e, SampleError)):
                raise
            raise sample_error(self.source, s, off, key, e) from None


def open_dataset(
    path_or_url: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    decode: str | None = None,
    image_size: int | tuple[int, int] | None = None,
    augment: bool = False,
    seed: int = 0,
    transform: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    cache_size: str | int = "50GB",
    storage_options: Mapping[str, Any] | None = None,
    decode_backend: str = "auto",
    image_field: str | None = None,
) -> ShardDataset:
    """Map-style dataset over packed shards (tar by offset, LMDB by record) or WebDataset tars.

    Args:
        path_or_url: dataset folder/URL with ``index.json``, or tars (see :func:`resolve_index`).
        decode: None for raw bytes per field, ``"cpu"`` to decode (see :mod:`fastfeed.decode.cpu`).
        image_size: with ``decode="cpu"``, crop/resize images to this size.
        augment: random crop + flip (True) or the evaluation center crop (False).
        seed: seed of the random crops.
        transform: called on every sample dict.
        cache_dir: local shard cache for remote or gzipped shards.
        cache_size: bound of that cache.
        storage_options: fsspec options.
        decode_backend: ``"auto"``, ``"turbo"`` or ``"pillow"``.
        image_field: field decoded as ``"image"`` (default: jpg, jpeg, png, webp, ...).

    Example:
        >>> ds = fastfeed.open_dataset("/data/imagenet-ff")    # doctest: +SKIP
        >>> ds[0]["__key__"], len(ds[0]["jpg"])                # doctest: +SKIP
        ('n01440764/n01440764_10026', 13697)
    """
    if decode not in (None, "cpu"):
        raise ConfigError(f"open_dataset(decode={decode!r}); use None (raw bytes) or 'cpu'")
    index = resolve_index(path_or_url, cache_dir=cache_dir, cache_size=cache_size,
                          storage_options=storage_options)
    check_shards(index)
    max_open = 64
    if cache_dir is None and index.shards and is_url(index.shard_path(0)):
        max_open = 4  # whole shards held in memory: random access over many would not fit
        log.warning("open_dataset over remote shards without cache_dir keeps %d whole shards in memory "
                    "per process and downloads again on a miss; pass cache_dir=", max_open)
    source = ShardSource(index, cache_dir=cache_dir, cache_size=cache_size, storage_options=storage_options,
                         max_open=max_open)
    decoder: Decoder
    if decode == "cpu":
        decoder = CpuDecoder(image_size=image_size, augment=augment, seed=seed, backend=decode_backend,
                             image_field=image_field, transform=transform)
    else:
        decoder = RawDecoder(transform)
    return ShardDataset(source, decoder)
