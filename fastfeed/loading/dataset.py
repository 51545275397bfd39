"""Datasets over shards: an iterable of whole batches (for ``loader()``) and a map-style one.

:class:`ShardBatches` yields collated batches, one epoch plan
(:func:`fastfeed.loading.plan.plan_epoch`) at a time: batch ``b`` is built by worker
``(b - start) % num_workers``, so ``DataLoader(batch_size=None)`` hands them back in
order and the stream does not depend on ``num_workers``. The epoch and the first batch
of a pass live in a small shared-memory tensor, so persistent workers see
``set_epoch`` and resume points without being restarted.

Samples are read through :class:`fastfeed.packed.reader.ShardSource` (shards opened lazily in
each worker). A shard that does not match the index is an error whatever ``on_error``
says; a sample that cannot be read or decoded raises
:class:`~fastfeed.errors.SampleError` naming shard, key and offset, or with
``on_error="skip"`` is left out of its batch and reported in the batch's
``"__skipped__"`` list (which :class:`fastfeed.loading.api.Loader` moves into its stats).
Each batch also carries ``"__timing__"``: the seconds its worker spent reading and
decoding it and its CPU seconds (three ``perf_counter``/``process_time`` readings per
batch), which the Loader also moves into its stats (:mod:`fastfeed.loading.bottleneck`).

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
from fastfeed.decode.bufpool import BUFFER_KEY, BufferPool
from fastfeed.decode.cpu import CpuDecoder, RawDecoder
from fastfeed.errors import ConfigError, SampleError, ShardError
from fastfeed.packed.index import DatasetIndex
from fastfeed.loading.plan import DEFAULT_SHUFFLE_BLOCK, EpochPlan, num_batches, plan_epoch, worker_batches
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


class _Position:
    """(epoch, first batch) of the next pass, in shared memory so workers see updates."""

    def __init__(self) -> None:
        self.t = torch.zeros(2, dtype=torch.int64).share_memory_()

    def set(self, epoch: int, start: int) -> None:
        self.t[0], self.t[1] = epoch, start

    def get(self) -> tuple[int, int]:
        e, s = self.t.tolist()
        return int(e), int(s)


class ShardBatches(IterableDataset):
    """Whole collated batches of one rank, for ``DataLoader(batch_size=None)``.

    Args:
        source: where samples are read from.
        decoder: turns a list of samples into a batch dict (``CpuDecoder`` / ``RawDecoder``).
        batch_size, seed, shuffle, drop_last, rank, world_size, shuffle_block: the plan
            (see :func:`fastfeed.loading.plan.plan_epoch`).
        on_error: ``"raise"`` or ``"skip"`` for bad samples.

    Built by :func:`fastfeed.loader` from options already validated
    (:func:`fastfeed.loading.options.loader_options`); nothing is checked again here.
    """

    def __init__(self, source: ShardSource, decoder: Decoder, *, batch_size: int, seed: int,
                 shuffle: bool, drop_last: bool, rank: int, world_size: int,
                 shuffle_block: int = DEFAULT_SHUFFLE_BLOCK, on_error: str = "raise") -> None:
        self.source, self.decoder = source, decoder
        self.batch_size, self.seed, self.shuffle, self.drop_last = batch_size, seed, shuffle, drop_last
        self.rank, self.world_size, self.shuffle_block, self.on_error = rank, world_size, shuffle_block, on_error
        self.num_batches = num_batches(source.index.num_samples, world_size=world_size,
                                       batch_size=batch_size, drop_last=drop_last)
        self._position = _Position()
        self.pool: BufferPool | None = None  # set by the loader (persistent workers only)
        self._plan: EpochPlan | None = None
        self._plan_epoch = -1

    def __len__(self) -> int:
        return self.num_batches

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_plan"], state["_plan_epoch"] = None, -1  # workers compute their own
        return state

    def set_position(self, epoch: int, start: int) -> None:
        """Make the next pass run ``epoch`` starting at batch ``start`` (all workers)."""
        self._position.set(epoch, start)

    def plan(self, epoch: int) -> EpochPlan:
        """This rank's plan for ``epoch`` (cached for the last epoch asked)."""
        if self._plan is None or self._plan_epoch != epoch:
            self._plan = plan_epoch(
                self.source.index.shard_counts, seed=self.seed, epoch=epoch, world_size=self.world_size,
                rank=self.rank, batch_size=self.batch_size, drop_last=self.drop_last,
                shuffle=self.shuffle, shuffle_block=self.shuffle_block,
            )
            self._plan_epoch = epoch
        return self._plan

    def __iter__(self):  # type: ignore[no-untyped-def]
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 0)
        if info is not None:
            bufpool.activate(self.pool, worker)
        epoch, start = self._position.get()
        plan = self.plan(epoch)
        mine = worker_batches(plan.num_batches, start=start, num_workers=workers, worker=worker)
        for i, b in enumerate(mine):
            if i + 1 < len(mine):  # the next batch's reads start while this one decodes
                self.source.will_need(plan.batch(mine[i + 1]))
            yield self.make_batch(plan.batch(b), epoch)

    def make_batch(self, ids: np.ndarray, epoch: int) -> dict[str, Any]:
        """Read, decode and collate the samples ``ids`` (in that order)."""
        t0, cpu0 = time.perf_counter(), time.process_time()
        src = self.source
        shards, locs = src.locate(ids)
        skipped: list[str] = []
        got: list[dict[str, Any] | None] = [None] * len(ids)
        for j in np.argsort(ids, kind="stable"):  # read in file order, keep batch order
            s, off, size = int(shards[j]), int(locs[j, 0]), int(locs[j, 1])
            try:
                got[j] = src.read_at(s, off, size)
            except SampleError as e:
                self._fail(skipped, sample_error(src, s, off, "", e))
        kept = [j for j, g in enumerate(got) if g is not None]
        samples = [got[j] for j in kept]
        kept_arr = np.asarray(kept, dtype=np.int64)
        labels = self._labels(ids[kept_arr])

        def fail(k: int, exc: BaseException) -> None:
            j = kept[k]
            err = sample_error(src, int(shards[j]), int(locs[j, 0]), samples[k].get("__key__", ""), exc)
            self._fail(skipped, err)

        t1 = time.perf_counter()
        batch = self.decoder.decode_batch(samples, ids[kept_arr], epoch, labels, fail)
        batch[SKIPPED_KEY] = skipped
        batch[TIMING_KEY] = (t1 - t0, time.perf_counter() - t1, time.process_time() - cpu0)
        pooled = bufpool.active()
        if pooled is not None:
            batch[BUFFER_KEY] = pooled[0].claims()
        return batch

    def _labels(self, ids: np.ndarray) -> np.ndarray | None:
        labels = self.source.index.labels
        return None if labels is None else np.asarray(labels[ids])

    def _fail(self, skipped: list[str], err: SampleError) -> None:
        if self.on_error == "raise":
            raise SampleError(f"{err}; pass on_error='skip' to skip bad samples",
                              shard=err.shard, key=err.key, offset=err.offset)
        skipped.append(str(err))


class ShardDataset(Dataset):
    """Map-style access to a dataset: ``len(ds)`` samples, ``ds[i]`` a sample dict.

    ``ds[i]`` is ``{"__key__": ..., "<field>": bytes, ...}`` with ``decode=None``, or the
    sample decoded like a batch of one (image as an upright HWC uint8 array) with
    ``decode="cpu"``. Random crops depend on ``(seed, epoch, i)``; call
    :meth:`set_epoch` to change them (it reaches persistent workers too).
    """

    def __init__(self, source: ShardSource, decoder: Decoder) -> None:
        self.source, self.decoder = source, decoder
        self._position = _Position()

    @property
    def index(self) -> DatasetIndex:
        return self.source.index

    def __len__(self) -> int:
        return self.source.index.num_samples

    def set_epoch(self, epoch: int) -> None:
        """Epoch used for the random crops of ``decode="cpu"``."""
        self._position.set(int(epoch), 0)

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
            sample = self.source.read_at(s, off, size)
            key = sample.get("__key__", "")
            labels = self.source.index.labels
            label = None if labels is None else int(labels[i])
            return self.decoder.decode_sample(sample, i, self._position.get()[0], label)
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
