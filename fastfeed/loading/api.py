"""``fastfeed.loader()``: the DataLoader to put in a training script.

The one module that knows DataLoader's arguments. It resolves rank and world size
(:func:`fastfeed.dist.resolve_world`), ``num_workers`` / ``prefetch_factor`` ``"auto"``
(:func:`fastfeed.loading.auto.resolve_auto`), builds a :class:`~fastfeed.loading.dataset.ShardBatches`
and wraps it in :class:`Loader`, a ``torch.utils.data.DataLoader`` subclass (so
Lightning, Accelerate and plain loops accept it) with ``set_epoch``, ``state_dict`` /
``load_state_dict``, ``len()`` in batches and always-on ``stats``.

Epochs: ``set_epoch(e)`` picks the epoch of the next pass. Without it, every new pass
runs the next epoch (the first pass runs epoch 0), so a new pass always brings a new
order, as a new pass over a shuffling DataLoader does, and forgetting ``set_epoch``
never repeats an order.

Resume: ``state_dict()`` is a few ints and strings (epoch, batches consumed, and what
the order depends on); ``load_state_dict()`` in a fresh process (any ``num_workers``)
makes the next pass continue that epoch at the next batch, in the same order. All
ranks consume the same number of batches, so the state saved by rank 0 fits every rank.

Example:
    >>> dl = fastfeed.loader("/data/imagenet-ff", batch_size=256, image_size=224)   # doctest: +SKIP
    >>> for epoch in range(start_epoch, 90):                                         # doctest: +SKIP
    ...     dl.set_epoch(epoch)
    ...     for batch in dl:
    ...         train_step(batch["image"].cuda(non_blocking=True), batch["label"].cuda())
"""

from __future__ import annotations

import inspect
import logging
import os
from typing import Any, Callable, Iterator, Mapping, Sequence

import torch
from torch.utils.data import DataLoader

from fastfeed._util import format_bytes
from fastfeed.loading.bottleneck import line_hook
from fastfeed.loading.compat import FrameworkHooks
from fastfeed.decode.bufpool import BUFFER_KEY, BufferPool
from fastfeed.loading.dataset import SKIPPED_KEY, TIMING_KEY, ShardBatches
from fastfeed.packed.reader import ShardSource, check_shards, resolve_index
from fastfeed.decode.cpu import CpuDecoder, RawDecoder, normalize_image_size
from fastfeed.dist import resolve_world
from fastfeed.errors import ConfigError, StateError
from fastfeed.packed.index import DatasetIndex
from fastfeed.loading.plan import DEFAULT_SHUFFLE_BLOCK
from fastfeed.storage.remote import is_url
from fastfeed.loading.stats import LoaderStats

__all__ = ["Loader", "STATE_VERSION", "loader"]

log = logging.getLogger(__name__)

#: Version of the ``state_dict()`` layout.
STATE_VERSION = 1
DECODES = ("cpu", "dali", None)
# state fields that must match exactly, in the order they are reported
_MUST_MATCH = ("dataset", "num_samples", "world_size", "batch_size", "drop_last", "shuffle", "seed",
               "shuffle_block")


class Loader(FrameworkHooks, DataLoader):
    """A DataLoader over fastfeed shards; build it with :func:`loader`.

    Attributes:
        index: the dataset index.
        rank, world_size: this process's place in the job.
        stats: :class:`~fastfeed.loading.stats.LoaderStats`, always on.
        workers_from: where ``num_workers`` came from (``"explicit"``, ``"tuned"``, ``"heuristic"``).

    Accelerate's ``prepare`` returns it as is and Lightning can re-create it (``predict``):
    see :mod:`fastfeed.loading.compat`.
    """

    def __init__(self, dataset: ShardBatches, *, num_workers: int, prefetch_factor: int | None,
                 pin_memory: bool, persistent_workers: bool, timeout: float,
                 multiprocessing_context: Any, worker_init_fn: Callable[[int], None] | None,
                 log_every: int | None, workers_from: str, reuse_buffers: bool = False,
                 sampler: None = None, batch_sampler: None = None) -> None:
        # sampler / batch_sampler: only None, which frameworks that re-create a DataLoader over an
        # IterableDataset pass (Lightning's predict); DataLoader rejects anything else
        kwargs: dict[str, Any] = {}
        if num_workers > 0:  # PyTorch rejects prefetch_factor / persistent workers without workers
            kwargs.update(prefetch_factor=prefetch_factor, persistent_workers=persistent_workers,
                          multiprocessing_context=multiprocessing_context)
        if "in_order" in inspect.signature(DataLoader.__init__).parameters:
            kwargs["in_order"] = True  # the round-robin order of batches is the contract
        super().__init__(dataset, batch_size=None, sampler=sampler, batch_sampler=batch_sampler,
                         num_workers=num_workers, pin_memory=pin_memory, timeout=timeout,
                         worker_init_fn=worker_init_fn, **kwargs)
        # workers refill the shared-memory batches the main process has let go (fastfeed.decode.bufpool);
        # only with persistent workers: one process per worker id for the loader's life
        self._pool: BufferPool | None = None
        if reuse_buffers and num_workers > 0 and persistent_workers:
            self._pool = dataset.pool = BufferPool(num_workers, (prefetch_factor or 2) + 1)
        self.index: DatasetIndex = dataset.source.index
        self.rank, self.world_size = dataset.rank, dataset.world_size
        self.stats = LoaderStats(log_every=log_every)
        self.stats.add_line_hook(line_hook(num_workers))  # "; decode-bound (workers busy 97%, ...)"
        self.workers_from = workers_from
        self._epoch = 0
        self._consumed = 0  # batches of self._epoch handed out (incl. a resumed prefix)
        self._resume: int | None = None  # first batch of the next pass, from load_state_dict
        self._epoch_set = False
        self._passes = 0

    # ------------------------------------------------------------------ epochs
    def __len__(self) -> int:
        """Batches per epoch on this rank (the same on every rank)."""
        return self.dataset.num_batches

    @property
    def epoch(self) -> int:
        """The epoch of the current (or next) pass."""
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        """Run ``epoch`` on the next pass: from its start, or from a loaded resume point.

        After :meth:`load_state_dict`, ``set_epoch`` with the saved epoch keeps the resume
        point (a state saved after the last batch of an epoch then gives an empty pass).
        """
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ConfigError(f"set_epoch({epoch!r}): the epoch is an integer >= 0")
        if self._resume is None or epoch != self._epoch:
            self._resume = None
            self._consumed = 0
        self._epoch, self._epoch_set = epoch, True

    def _begin_pass(self) -> tuple[int, int]:
        start = 0
        if self._resume is not None:
            start, self._resume = self._resume, None
            if not self._epoch_set and start >= len(self):
                self._epoch, start = self._epoch + 1, 0  # the saved epoch was complete
        elif not self._epoch_set and self._passes > 0:
            self._epoch += 1  # a new pass is a new epoch, as a new shuffle is in DataLoader
        self._passes += 1
        self._epoch_set, self._consumed = False, start
        return self._epoch, start

    def __iter__(self) -> Iterator[dict[str, Any]]:  # type: ignore[override]
        epoch, start = self._begin_pass()
        self.dataset.set_position(epoch, start)
        if self._pool is not None:
            self._pool.reclaim()  # batches of a pass left early are discarded by the workers' reset
        batches = super().__iter__()
        for batch in self.stats.track(batches, _batch_size, self._pop_extras):
            self._consumed += 1
            yield batch

    def _pop_extras(self, batch: dict[str, Any]) -> tuple[int, list[str]]:
        """Move the batch's worker timings into ``stats``; return its skips."""
        timing = batch.pop(TIMING_KEY, None)
        if timing is not None:
            self.stats.record_work(*timing)
        slots = batch.pop(BUFFER_KEY, None)
        if self._pool is not None:
            self._pool.sweep()
            if slots:
                self._pool.received(slots, batch.get("image"))
        return _pop_skipped(batch)

    # ------------------------------------------------------------------ resume
    def state_dict(self) -> dict[str, Any]:
        """Where this loader is: the epoch, batches consumed, and what the order depends on.

        Example:
            >>> dl.state_dict()                                    # doctest: +SKIP
            {'fastfeed_loader': 1, 'epoch': 3, 'batches': 1200, 'seed': 0, 'world_size': 8, ...}
        """
        ds = self.dataset
        return {
            "fastfeed_loader": STATE_VERSION,
            "epoch": self._epoch,
            "batches": self._consumed,
            "seed": ds.seed,
            "world_size": ds.world_size,
            "rank": ds.rank,
            "batch_size": ds.batch_size,
            "drop_last": ds.drop_last,
            "shuffle": ds.shuffle,
            "shuffle_block": ds.shuffle_block,
            "dataset": self.index.fingerprint,
            "num_samples": self.index.num_samples,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state`` (from :meth:`state_dict`) on the next pass.

        Every field is checked; anything the order depends on must match, and the error
        says what differs (``"saved with world_size=8, now 4"``). The saving rank does
        not matter: all ranks consume the same number of batches.

        Raises:
            StateError: the state is malformed or was saved by a loader with another order.
        """
        check_state(state, self.state_dict(), len(self))
        self._epoch, self._consumed, self._resume = state["epoch"], state["batches"], state["batches"]
        self._epoch_set = False


def check_state(state: Any, now: Mapping[str, Any], epoch_batches: int) -> None:
    """Validate a saved loader state against the loader's own (``now``); shared by the
    CPU and DALI loaders, whose state layouts are the same.

    Raises:
        StateError: the state is malformed, or the order it was saved with differs (the
            message names every difference: "saved with world_size=8, now 4").
    """
    if not isinstance(state, Mapping):
        raise StateError(f"load_state_dict() takes the dict from state_dict(), not {type(state).__name__}")
    missing = sorted(set(now) - set(state))
    if missing:
        raise StateError(f"loader state lacks {', '.join(missing)}; pass the dict from Loader.state_dict()")
    if state["fastfeed_loader"] != STATE_VERSION:
        raise StateError(f"loader state version {state['fastfeed_loader']!r}, this fastfeed reads {STATE_VERSION}")
    for name in ("epoch", "batches", "rank", "seed", "world_size", "batch_size", "num_samples", "shuffle_block"):
        v = state[name]
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise StateError(f"loader state: {name}={v!r} is not an integer >= 0")
    diffs = [f"{k}={state[k]!r}, now {now[k]!r}" for k in _MUST_MATCH if state[k] != now[k]]
    if diffs:
        raise StateError(
            "loader state does not fit this loader: saved with " + "; ".join(diffs)
            + ". Resume with the same dataset, world size, batch size, drop_last, shuffle, seed "
            "and shuffle_block (the sample order depends on them)"
        )
    if not state["rank"] < state["world_size"]:
        raise StateError(f"loader state: rank={state['rank']} outside world_size={state['world_size']}")
    if state["batches"] > epoch_batches:
        raise StateError(
            f"loader state: batches={state['batches']} but an epoch of this loader has only {epoch_batches}"
        )


def _batch_size(batch: dict[str, Any]) -> int:
    return len(batch["__key__"])


def _pop_skipped(batch: dict[str, Any]) -> tuple[int, list[str]]:
    skipped = batch.pop(SKIPPED_KEY, None) or []
    return len(skipped), skipped


def _auto_workers(index: DatasetIndex, *, batch_size: int, decode: str | None,
                  image_size: tuple[int, int] | None, num_workers: int | str,
                  prefetch_factor: int | str | None) -> tuple[int, int | None, str]:
    from fastfeed.loading.auto import resolve_auto

    return resolve_auto(index, batch_size=batch_size, decode=decode, image_size=image_size,
                        num_workers=num_workers, prefetch_factor=prefetch_factor)


def _check_args(batch_size: int, seed: int, on_error: str, decode: str | None, shuffle_block: int) -> None:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ConfigError(f"batch_size={batch_size!r} must be an integer >= 1")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ConfigError(f"seed={seed!r} must be an integer >= 0")
    if on_error not in ("raise", "skip"):
        raise ConfigError(f"on_error={on_error!r}; use 'raise' or 'skip'")
    if decode not in DECODES:
        raise ConfigError(f"decode={decode!r}; use 'cpu', 'dali' or None (raw bytes)")
    if isinstance(shuffle_block, bool) or not isinstance(shuffle_block, int) or shuffle_block < 1:
        raise ConfigError(f"shuffle_block={shuffle_block!r} must be an integer >= 1")


def loader(
    path_or_url: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    batch_size: int,
    shuffle: bool = True,
    seed: int = 0,
    decode: str | None = "cpu",
    transform: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    image_size: int | tuple[int, int] | None = None,
    augment: bool = True,
    num_workers: int | str = "auto",
    prefetch_factor: int | str | None = "auto",
    pin_memory: bool | None = None,
    drop_last: bool = False,
    rank: int | None = None,
    world_size: int | None = None,
    on_error: str = "raise",
    cache_dir: str | os.PathLike[str] | None = None,
    cache_size: str | int = "50GB",
    storage_options: Mapping[str, Any] | None = None,
    persistent_workers: bool = True,
    shuffle_block: int = DEFAULT_SHUFFLE_BLOCK,
    decode_backend: str = "auto",
    image_field: str | None = None,
    crop_scale: tuple[float, float] = (0.08, 1.0),
    crop_ratio: tuple[float, float] = (3 / 4, 4 / 3),
    flip: bool = True,
    crop_fraction: float = 0.875,
    log_every: int | None = None,
    timeout: float = 0,
    multiprocessing_context: Any = None,
    worker_init_fn: Callable[[int], None] | None = None,
    reuse_buffers: bool = True,
    **dali_options: Any,
) -> Loader:
    """A deterministic, resumable, rank- and worker-aware DataLoader over fastfeed shards.

    Args:
        path_or_url: a packed dataset (folder or fsspec URL with ``index.json``), or
            WebDataset tars without index (folder, shard, list, brace pattern, glob).
        batch_size: samples per batch on each rank.
        shuffle: new shard and sample order every epoch (False: index order).
        seed: the seed of the order and of the random crops (>= 0).
        decode: ``"cpu"`` (decode in the workers), ``"dali"`` (NVIDIA DALI, GPU) or None
            (raw bytes of every field).
        transform: called on every sample dict before collation (see :mod:`fastfeed.decode.cpu`).
        image_size: output ``int`` or ``(h, w)`` of images; None keeps their size.
        augment: RandomResizedCrop + flip (True) or the evaluation center crop (False).
        num_workers: worker processes, or ``"auto"`` (a ``fastfeed tune`` result, else a heuristic).
        prefetch_factor: batches prefetched per worker, or ``"auto"``.
        pin_memory: page-locked batches for fast GPU copies (default: CUDA is available).
        drop_last: drop the remainder (only full batches) instead of repeating up to
            ``world_size - 1`` samples to give every rank the same count.
        rank, world_size: default from torch.distributed, then RANK/WORLD_SIZE, then (0, 1).
        on_error: ``"raise"`` on a bad sample (names shard, key, offset), or ``"skip"``
            it (counted in ``stats``, logged once).
        cache_dir: local cache for remote and gzipped shards, shared by the host's processes.
        cache_size: bound of that cache (least recently used shards are evicted).
        storage_options: fsspec options (endpoint, credentials) for remote data.
        persistent_workers: keep workers between epochs (ignored with 0 workers).
        shuffle_block: samples mixed together within a rank's share (part of the order).
        decode_backend: ``"auto"`` (simplejpeg + OpenCV when installed), ``"turbo"``, ``"pillow"``.
        image_field: the field decoded as ``"image"`` (default: jpg, jpeg, png, webp, ...).
        crop_scale, crop_ratio: RandomResizedCrop ranges.
        flip: random horizontal flips when augmenting.
        crop_fraction: the evaluation crop (``augment=False``) as a fraction of the shorter side.
        log_every: log one stats line every N batches (off by default).
        timeout, multiprocessing_context, worker_init_fn: passed to DataLoader.
        reuse_buffers: let persistent workers refill the shared-memory batches the main
            process has dropped, instead of a fresh buffer per batch (whose page faults cost
            ~0.2 ms per 224 px image where measured; see :mod:`fastfeed.decode.bufpool`). A batch you
            keep, or a view of it, is never refilled. Pass False if you hand batches on to
            another process without copying them.
        **dali_options: options of :func:`fastfeed.loading.dali.backend.dali_loader` (``num_threads``,
            ``output``, ``mean``, ``std``, ...), only with ``decode="dali"``.

    Returns:
        A :class:`Loader`; each batch is a dict (see :mod:`fastfeed.decode.cpu`).

    Example:
        >>> dl = fastfeed.loader("/data/imagenet-ff", batch_size=256, image_size=224)  # doctest: +SKIP
        >>> batch = next(iter(dl)); batch["image"].shape, batch["label"].dtype         # doctest: +SKIP
        (torch.Size([256, 3, 224, 224]), torch.int64)
    """
    if decode == "dali":
        from fastfeed.loading.dali.backend import dali_loader

        return dali_loader(
            path_or_url, batch_size=batch_size, shuffle=shuffle, seed=seed, decode=decode,
            transform=transform, image_size=image_size, augment=augment, num_workers=num_workers,
            prefetch_factor=prefetch_factor, pin_memory=pin_memory, drop_last=drop_last, rank=rank,
            world_size=world_size, on_error=on_error, cache_dir=cache_dir, cache_size=cache_size,
            storage_options=storage_options, persistent_workers=persistent_workers,
            shuffle_block=shuffle_block, decode_backend=decode_backend, image_field=image_field,
            crop_scale=crop_scale, crop_ratio=crop_ratio, flip=flip, crop_fraction=crop_fraction,
            log_every=log_every, timeout=timeout, multiprocessing_context=multiprocessing_context,
            worker_init_fn=worker_init_fn, **dali_options,
        )
    if dali_options:
        raise ConfigError(
            f"loader() got unexpected option(s) {', '.join(sorted(dali_options))}; "
            "DALI options need decode='dali'"
        )
    _check_args(batch_size, seed, on_error, decode, shuffle_block)
    size = normalize_image_size(image_size)
    rank, world_size = resolve_world(rank, world_size)
    index = resolve_index(path_or_url, cache_dir=cache_dir, cache_size=cache_size,
                          storage_options=storage_options, on_error=on_error)
    check_shards(index)
    if drop_last and index.num_samples // world_size < batch_size:
        raise ConfigError(
            f"{index.num_samples} samples over world_size={world_size} cannot fill one batch of "
            f"{batch_size} per rank with drop_last=True; lower batch_size or pass drop_last=False"
        )
    workers, prefetch, workers_from = _auto_workers(
        index, batch_size=batch_size, decode=decode, image_size=size, num_workers=num_workers,
        prefetch_factor=prefetch_factor,
    )
    max_open = _max_open(index, shuffle_block, cache_dir)
    if cache_dir is None and index.shards and is_url(index.shard_path(0)):
        _warn_no_cache(index, workers, max_open)
    decoder: CpuDecoder | RawDecoder
    if decode == "cpu":
        decoder = CpuDecoder(image_size=size, augment=augment, seed=seed, backend=decode_backend,
                             image_field=image_field, transform=transform, scale=crop_scale,
                             ratio=crop_ratio, flip=flip, crop_fraction=crop_fraction)
    else:
        decoder = RawDecoder(transform)
    source = ShardSource(index, cache_dir=cache_dir, cache_size=cache_size, storage_options=storage_options,
                         max_open=max_open)
    dataset = ShardBatches(source, decoder, batch_size=batch_size, seed=seed, shuffle=shuffle,
                           drop_last=drop_last, rank=rank, world_size=world_size,
                           shuffle_block=shuffle_block, on_error=on_error)
    return Loader(
        dataset, num_workers=workers, prefetch_factor=prefetch,
        pin_memory=torch.cuda.is_available() if pin_memory is None else bool(pin_memory),
        persistent_workers=persistent_workers, timeout=timeout,
        multiprocessing_context=multiprocessing_context, worker_init_fn=worker_init_fn,
        log_every=log_every, workers_from=workers_from, reuse_buffers=reuse_buffers,
    )


def _max_open(index: DatasetIndex, shuffle_block: int, cache_dir: Any) -> int:
    """Shards a worker keeps open: enough for one shuffle block, so nothing is re-read.

    Local files and cached shards are cheap to hold (64 to 512 file handles); in-memory
    remote shards hold their bytes, so they are limited to what a block spans.
    """
    counts = [s.samples for s in index.shards if s.samples > 0]
    span = -(-shuffle_block // max(1, min(counts))) + 2 if counts else 2
    remote_in_memory = cache_dir is None and len(index.shards) > 0 and is_url(index.shard_path(0))
    return span if remote_in_memory else min(512, max(64, span))


def _warn_no_cache(index: DatasetIndex, workers: int, max_open: int) -> None:
    per_shard = sum(s.bytes for s in index.shards) / len(index.shards)
    log.warning(
        "reading remote shards without cache_dir: each of the %d workers downloads the shards it reads "
        "and keeps up to %d of them (~%s) in memory; pass cache_dir= to download each shard once per "
        "host to local disk", max(1, workers), max_open, format_bytes(max_open * per_shard),
    )

