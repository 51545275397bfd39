"""``fastfeed.loader()``: the DataLoader to put in a training script.

The one module that knows DataLoader's arguments. It resolves ``num_workers`` /
``prefetch_factor`` ``"auto"`` (:func:`fastfeed.loading.auto.resolve_auto`), builds a
:class:`~fastfeed.loading.dataset.ShardBatches`
and wraps it in :class:`Loader`, a ``torch.utils.data.DataLoader`` subclass (so
Lightning, Accelerate and plain loops accept it) with ``set_epoch``, ``state_dict`` /
``load_state_dict``, ``len()`` in batches and always-on ``stats``.

The arguments are validated once, into :class:`~fastfeed.loading.options.LoaderOptions`
(:func:`~fastfeed.loading.options.loader_options`, which also resolves rank and world
size), before any data is read; ``decode="dali"`` hands them to
:func:`fastfeed.loading.dali.backend.dali_loader`. Both backends drive the same
:class:`~fastfeed.loading.cursor.EpochCursor`, so epochs and resume behave the same.

Epochs: ``set_epoch(e)`` picks the epoch of the next pass. Without it, every new pass
runs the next epoch (the first pass runs epoch 0), whether the previous pass finished or
was abandoned (``break``), so a new pass always brings a new order, as a new pass over a
shuffling DataLoader does, and forgetting ``set_epoch`` never repeats an order.

Resume: ``state_dict()`` is a few ints and strings (epoch, batches consumed, and what
the order depends on); ``load_state_dict()`` in a fresh process (any ``num_workers``,
either ``decode``) makes the next pass continue that epoch at the next batch, in the same
order. All ranks consume the same number of batches, so the state saved by rank 0 fits
every rank.

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
from torch.utils.data import DataLoader, default_convert

from fastfeed._util import format_bytes
from fastfeed.errors import ConfigError
from fastfeed.loading.compat import FrameworkHooks
from fastfeed.decode.bufpool import BUFFER_KEY, BufferPool
from fastfeed.decode.cpu import CpuDecoder, RawDecoder
from fastfeed.loading.auto import resolve_auto
from fastfeed.loading.bottleneck import line_hook
from fastfeed.loading.cursor import STATE_VERSION, EpochCursor, Pass, Resumable
from fastfeed.loading.dali.backend import dali_loader
from fastfeed.loading.dataset import SKIPPED_KEY, TIMING_KEY, ShardBatches
from fastfeed.loading.options import LoaderOptions, check_source, loader_options
from fastfeed.loading.plan import DEFAULT_SHUFFLE_BLOCK
from fastfeed.loading.elastic import Stage, mode_of
from fastfeed.loading.sampled import SamplerBatches, check_sampler_fits
from fastfeed.loading.sources import Sources, open_sources
from fastfeed.loading.stats import LoaderStats
from fastfeed.loading.tokens import TokenBatches, padding_of
from fastfeed.packed.index import DatasetIndex
from fastfeed.packed.reader import ShardSource
from fastfeed.storage.remote import is_url

# STATE_VERSION (the state_dict layout) lives in fastfeed.loading.cursor; importable from here too
__all__ = ["Loader", "STATE_VERSION", "loader"]

log = logging.getLogger(__name__)


_ATOMS = (str, int, float, bool, type(None))  # what default_convert hands back as it is


def _plain(value: Any) -> bool:
    """True for what ``default_convert`` would give back equal: tensors, str / numbers, and
    lists (of lists) of those (``__key__``, decoded text fields, skip reasons)."""
    t = type(value)
    if t in _ATOMS or isinstance(value, torch.Tensor):
        return True
    return t is list and all(type(v) in _ATOMS or (type(v) is list and all(type(x) in _ATOMS for x in v))
                             for v in value)


def convert_batch(batch: Any) -> Any:
    """The batch as ``default_convert`` gives it (what ``DataLoader(batch_size=None)`` runs on
    every batch: numpy arrays to tensors, at any depth), without walking the values that
    have nothing to convert element by element (50-80 us a text batch, measured; 3-6% of a
    token batch's CPU).

    Example:
        >>> import numpy as np
        >>> b = convert_batch({"__key__": ["a", "b"], "x": np.zeros(2), "t": (1, np.ones(1))})
        >>> b["__key__"], type(b["x"]).__name__, b["t"]
        (['a', 'b'], 'Tensor', [1, tensor([1.], dtype=torch.float64)])
    """
    if type(batch) is not dict:
        return default_convert(batch)
    return {k: v if _plain(v) else default_convert(v) for k, v in batch.items()}


class Loader(FrameworkHooks, Resumable, DataLoader):
    """A DataLoader over fastfeed shards; build it with :func:`loader`.

    Epochs: ``set_epoch(e)`` makes the next pass run epoch ``e``. Without it, every new
    pass (``iter(dl)``) runs the next epoch, **whether the previous pass finished or was
    abandoned** (``break`` out of the loop, then iterate again): a new pass is a new order,
    as with a shuffling DataLoader, and Lightning's ``limit_train_batches`` gets new
    batches every epoch. Call ``set_epoch`` with the same epoch to replay it. A pass
    begins at the first ``next()``, and only the newest pass delivers batches.
    ``decode="dali"``'s loader follows the same rules (one
    :class:`~fastfeed.loading.cursor.EpochCursor` serves both; see that module for why).

    Resume: :meth:`state_dict` / :meth:`load_state_dict`: the next pass continues the saved
    epoch after its last consumed batch (a state saved by either ``decode``, any
    ``num_workers``, any rank of the same world size).

    Attributes:
        index: the dataset index.
        rank, world_size: this process's place in the job.
        stats: :class:`~fastfeed.loading.stats.LoaderStats`, always on.
        workers_from: where ``num_workers`` came from (``"explicit"``, ``"tuned"``, ``"heuristic"``).
        epoch: the epoch of the current (or next) pass.

    Accelerate's ``prepare`` returns it as is and Lightning can re-create it (``predict``):
    see :mod:`fastfeed.loading.compat`.
    """

    def __init__(self, dataset: ShardBatches, *, num_workers: int, prefetch_factor: int | None,
                 pin_memory: bool, persistent_workers: bool, timeout: float,
                 multiprocessing_context: Any, worker_init_fn: Callable[[int], None] | None,
                 log_every: int | None, workers_from: str, cursor: EpochCursor,
                 reuse_buffers: bool = False, sampler: None = None, batch_sampler: None = None) -> None:
        # sampler / batch_sampler: only None, which frameworks that re-create a DataLoader over an
        # IterableDataset pass (Lightning's predict); DataLoader rejects anything else
        kwargs: dict[str, Any] = {}
        if num_workers > 0:  # PyTorch rejects prefetch_factor / persistent workers without workers
            kwargs.update(prefetch_factor=prefetch_factor, persistent_workers=persistent_workers,
                          multiprocessing_context=multiprocessing_context)
        if "in_order" in inspect.signature(DataLoader.__init__).parameters:
            kwargs["in_order"] = True  # the round-robin order of batches is the contract
        super().__init__(dataset, batch_size=None, sampler=sampler, batch_sampler=batch_sampler,
                         collate_fn=convert_batch, num_workers=num_workers, pin_memory=pin_memory, timeout=timeout,
                         worker_init_fn=worker_init_fn, **kwargs)
        # workers refill the shared-memory batches the main process has let go (fastfeed.decode.bufpool);
        # only with persistent workers: one process per worker id for the loader's life
        self._pool: BufferPool | None = None
        if reuse_buffers and num_workers > 0 and persistent_workers:
            self._pool = dataset.pool = BufferPool(num_workers, (prefetch_factor or 2) + 1)
        self.index: DatasetIndex = dataset.source.index
        self.indexes: tuple[DatasetIndex, ...] = tuple(src.index for src in dataset.sources)
        self.rank, self.world_size = dataset.rank, dataset.world_size
        self.stats = LoaderStats(log_every=log_every)
        self.stats.add_line_hook(line_hook(num_workers))  # "; decode-bound (workers busy 97%, ...)"
        self.workers_from = workers_from
        self._cursor = cursor

    def __iter__(self) -> Iterator[dict[str, Any]]:  # type: ignore[override]
        return self._cursor.run(self._open_pass)

    def _open_pass(self, p: Pass) -> Iterator[dict[str, Any]]:
        """The batches of pass ``p``: the workers start (or reset) at its epoch and first batch."""
        self.dataset.set_position(p.position)
        if self._pool is not None:
            self._pool.reclaim()  # batches of a pass left early are discarded by the workers' reset
        return self.stats.track(super().__iter__(), _batch_size, self._pop_extras)

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


def _batch_size(batch: dict[str, Any]) -> int:
    return len(batch["__key__"])


def _pop_skipped(batch: dict[str, Any]) -> tuple[int, list[str]]:
    skipped = batch.pop(SKIPPED_KEY, None) or []
    return len(skipped), skipped


def loader(
    path_or_url: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    batch_size: int | None = None,
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
    seq_len: int | None = None,
    pad_id: int | None = None,
    pad_multiple: int = 1,
    batch_sampler: Any = None,
    weights: Sequence[float] | None = None,
    epoch_samples: int | None = None,
    subset: Any = None,
    filter: Any = None,
    pad: bool = True,
    **dali_options: Any,
) -> Loader:
    """A deterministic, resumable, rank- and worker-aware DataLoader over fastfeed shards.

    Args:
        path_or_url: a packed dataset (folder or fsspec URL with ``index.json``), or
            WebDataset tars without index (folder, shard, list, brace pattern, glob). With
            ``weights``, a list of such datasets to mix (one entry each; an entry may be a
            list of tars). A list of packed folders without ``weights`` is an error asking
            for them; a list of tars without ``weights`` is one dataset.
        batch_size: samples per batch on each rank (rows with ``seq_len``; from the sampler
            with ``batch_sampler``).
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
            ``world_size - 1`` samples (flagged ``batch["valid"] == False``) to give every
            rank the same count.
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
        seq_len: pack the epoch's documents (a ``tokens`` field) into rows of exactly this
            many tokens: ``input_ids``, ``position_ids``, ``valid``, ``cu_seqlens`` (see
            :mod:`fastfeed.loading.tokens`). One whole dataset only (no ``weights``, ``subset``,
            ``filter``, ``epoch_samples``, ``pad=False``); its state resumes at any world
            size and batch size (the rest of the epoch's token stream, re-cut).
        pad_id: the value of padded ``input_ids`` (default: the pad id ``pack --tokenizer``
            stored, else 0). Without ``seq_len``, a tokens field and ragged arrays from a
            ``transform`` come out padded, with an ``attention_mask``
            (:mod:`fastfeed.decode.collate`).
        pad_multiple: round padded lengths up to a multiple of this.
        batch_sampler: a ``DistributedTokenBudgetSampler`` or ``DistributedLengthBucketSampler``
            that decides every batch (:mod:`fastfeed.loading.sampled`); the batch size and
            the order come from it. One whole dataset only, like ``seq_len``; its state
            resumes with a sampler of another ``num_replicas`` (the sampler's re-plan of
            the steps not yet run).
        weights: one per dataset of ``path_or_url`` (normalised): each batch's samples
            come from the datasets in these proportions, and ``batch["__source__"]`` (int64)
            says which dataset each sample is from. Every ``decode`` mixes, in the same
            order (``decode="dali"``: packed tar datasets of images).
        epoch_samples: samples per epoch when mixing (default: the largest-weight dataset
            read once; smaller ones are cycled in complete reshuffled passes).
        subset: sample ids (or a bool mask) to keep; with several datasets, a list with one
            per dataset (None for none).
        filter: ``fn(meta) -> bool mask`` over the index's per-sample metadata (numpy
            arrays ``"index"``, ``"label"``, ``"length"``, ``"key"`` where recorded),
            evaluated once; with several datasets, one per dataset.
        pad: with ``drop_last=False``, repeat up to ``world_size - 1`` samples so every
            rank's share has the same size (True), or deliver every sample exactly once
            (False): every rank still runs the same number of steps, a rank's last batch may
            be shorter or empty (a dict of zero-length entries).
        **dali_options: the options of ``decode="dali"`` only (``num_threads``,
            ``hw_decoder_load``, ``prefetch_queue_depth``, ``num_pipelines``, ``device_id``,
            ``output``, ``mean``, ``std``, ``layout``; see :mod:`fastfeed.loading.dali.backend`). With
            ``decode="dali"``, the DataLoader options above that it cannot honour
            (``num_workers=8``, ``transform``, ...) are an error that says why, and
            ``pin_memory``, ``persistent_workers``, ``reuse_buffers`` have no effect
            (:mod:`fastfeed.loading.options`). A misspelled name is an error naming the
            closest option.

    Returns:
        A :class:`Loader` (with ``decode="dali"``, a
        :class:`~fastfeed.loading.dali.pipeline.DaliLoader` with the same epoch, resume and
        ``stats`` API); each batch is a dict (see :mod:`fastfeed.decode.cpu`).

    Every batch of samples also carries ``"valid"`` (bool, False exactly on padding repeats)
    and ``"__source__"`` (int64, the dataset of each sample; all 0 for one dataset); with
    ``seq_len``, ``"valid"`` is the per-token loss mask of the rows instead.

    Resume: :meth:`Loader.load_state_dict` takes a state saved at another world size,
    batch size or ``drop_last``/``pad`` (elastic resume): the epoch continues with exactly
    its unconsumed samples dealt to the new ranks, each once; later epochs are a fresh
    run's at the new shape. A state of other data or another order is refused. A
    ``seq_len`` / ``batch_sampler`` state (the same layout plus their fields) resumes
    elastically too: the rest of the epoch's token stream cut at the new shape (every
    token not yet delivered, once), or the sampler's re-plan of the steps not yet run at
    its new ``num_replicas``.

    Raises:
        ConfigError: an invalid argument (validated before any data is read), weights that
            do not fit the datasets, or datasets that cannot share a batch (named).

    Examples:
        One dataset:

        >>> dl = fastfeed.loader("/data/imagenet-ff", batch_size=256, image_size=224)  # doctest: +SKIP
        >>> batch = next(iter(dl)); batch["image"].shape, batch["label"].dtype         # doctest: +SKIP
        (torch.Size([256, 3, 224, 224]), torch.int64)

        Mixing datasets, 70/30 in every batch:

        >>> dl = fastfeed.loader(["/data/web-ff", "/data/books-ff"], weights=[0.7, 0.3],
        ...                      batch_size=100, decode=None)                          # doctest: +SKIP
        >>> int((next(iter(dl))["__source__"] == 1).sum())                              # doctest: +SKIP
        30

        Filters and subsets (evaluated once, from the index's metadata):

        >>> dl = fastfeed.loader("/data/imagenet-ff", batch_size=256, image_size=224,
        ...                      filter=lambda m: m["label"] < 100)                    # doctest: +SKIP

        Elastic resume (a state saved by 8 ranks, loaded on 6 with another batch size):

        >>> dl = fastfeed.loader("/data/imagenet-ff", batch_size=320, image_size=224)  # doctest: +SKIP
        >>> dl.load_state_dict(torch.load("ckpt.pt")["data"])                           # doctest: +SKIP
        >>> dl.state_dict()["stages"]                                                   # doctest: +SKIP
        [[8, 256, 'pad', 1200], [6, 320, 'pad', 0]]

        Exact-once evaluation (every sample once over all ranks, equal steps):

        >>> val = fastfeed.loader("/data/val-ff", batch_size=250, image_size=224, augment=False,
        ...                       pad=False, shuffle=False)                             # doctest: +SKIP
        >>> sum(len(b["__key__"]) for b in val)       # this rank's share, no repeat     # doctest: +SKIP
        6250
    """
    check_source(path_or_url, decode, weights)
    options = loader_options(
        batch_size=batch_size, shuffle=shuffle, seed=seed, decode=decode, transform=transform,
        image_size=image_size, augment=augment, num_workers=num_workers, prefetch_factor=prefetch_factor,
        pin_memory=pin_memory, drop_last=drop_last, rank=rank, world_size=world_size, on_error=on_error,
        cache_dir=cache_dir, cache_size=cache_size, storage_options=storage_options,
        persistent_workers=persistent_workers, shuffle_block=shuffle_block, decode_backend=decode_backend,
        image_field=image_field, crop_scale=crop_scale, crop_ratio=crop_ratio, flip=flip,
        crop_fraction=crop_fraction, log_every=log_every, timeout=timeout,
        multiprocessing_context=multiprocessing_context, worker_init_fn=worker_init_fn,
        reuse_buffers=reuse_buffers, seq_len=seq_len, pad_id=pad_id, pad_multiple=pad_multiple,
        batch_sampler=batch_sampler, weights=weights, epoch_samples=epoch_samples, subset=subset,
        filter=filter, pad=pad, **dali_options,
    )
    sources = open_sources(path_or_url, options)
    if options.batch_sampler is not None or options.seq_len is not None:
        check_whole_dataset(sources, options)
    if options.batch_sampler is not None:
        index = sources.indexes[0]
        check_sampler_fits(options.batch_sampler, index.num_samples, index.root or index.input)
    elif options.seq_len is None:  # seq_len: TokenBatches checks that one window of tokens fits
        options.check_fits(sources.spec.epoch_samples)
    if options.decode == "dali":
        for index in sources.indexes:
            check_encoded(index)
        return dali_loader(sources.indexes, options, sources.spec, sources.names)
    return _cpu_loader(sources, options)


def _cpu_loader(sources: Sources, o: LoaderOptions) -> Loader:
    """``decode="cpu"`` / None: DataLoader workers decode whole batches of the epoch plan."""
    index = sources.indexes[0]  # a tune result is looked up for the first dataset
    workers, prefetch, workers_from = resolve_auto(
        index, batch_size=o.batch_size, decode=o.decode, image_size=o.image_size,
        num_workers=o.num_workers, prefetch_factor=o.prefetch_factor)
    for idx in sources.indexes:
        if o.cache_dir is None and idx.shards and is_url(idx.shard_path(0)):
            _warn_no_cache(idx, workers, _max_open(idx, o.shuffle_block, o.cache_dir))
    padding, tokens_field = padding_of(index, o)
    decoder: CpuDecoder | RawDecoder
    if o.decode == "cpu":
        decoder = CpuDecoder(image_size=o.image_size, augment=o.augment, seed=o.seed, backend=o.decode_backend,
                             image_field=o.image_field, transform=o.transform, scale=o.crop_scale,
                             ratio=o.crop_ratio, flip=o.flip, crop_fraction=o.crop_fraction, pad=padding,
                             tokens_field=tokens_field)
    else:
        decoder = RawDecoder(o.transform, pad=padding)
    readers = [ShardSource(idx, cache_dir=o.cache_dir, cache_size=o.cache_size, storage_options=o.storage_options,
                           max_open=_max_open(idx, o.shuffle_block, o.cache_dir))
               for idx in sources.indexes]
    shape = Stage(o.world_size, o.batch_size, mode_of(drop_last=o.drop_last, pad=o.pad))
    dataset: ShardBatches | TokenBatches
    if o.seq_len is not None:
        dataset = TokenBatches.from_options(readers[0], o)
    elif o.batch_sampler is not None:
        dataset = SamplerBatches(readers[:1], decoder, spec=sources.spec, shape=shape, rank=o.rank,
                                 on_error=o.on_error, sampler=o.batch_sampler)
    else:
        dataset = ShardBatches(readers, decoder, spec=sources.spec, shape=shape, rank=o.rank, on_error=o.on_error)
    cursor = EpochCursor(sources.spec, fingerprints=sources.fingerprints, batch_size=o.batch_size,
                         drop_last=o.drop_last, pad=o.pad, rank=o.rank, world_size=o.world_size,
                         stream=getattr(dataset, "stream", None))  # seq_len / batch_sampler batches
    return Loader(
        dataset, num_workers=workers, prefetch_factor=prefetch,
        pin_memory=torch.cuda.is_available() if o.pin_memory is None else bool(o.pin_memory),
        persistent_workers=o.persistent_workers, timeout=o.timeout,
        multiprocessing_context=o.multiprocessing_context, worker_init_fn=o.worker_init_fn,
        log_every=o.log_every, workers_from=workers_from, cursor=cursor,
        reuse_buffers=o.reuse_buffers and o.seq_len is None,
    )


def check_encoded(index: DatasetIndex) -> None:
    """``decode="dali"`` decodes image files on the GPU; a dataset of raw pixels (``pack --store raw``) has none.

    Raises:
        ConfigError: the dataset stores images as pixels, with the two ways out.
    """
    if index.store is None:
        return
    where = index.root or "this dataset"
    raise ConfigError(f"{where}: decode='dali' decodes image files on the GPU, and this dataset stores its images as "
                      f"pixels (packed with --store {index.options.get('store', index.store.get('mode'))}); load it "
                      "with decode='cpu' (no decode needed: a crop and a resize per image), or re-pack it with "
                      "`fastfeed pack SRC DST --store jpeg` for DALI")


def check_whole_dataset(sources: Sources, o: LoaderOptions) -> None:
    """``seq_len`` / ``batch_sampler`` loaders read one whole dataset, every sample per epoch.

    Raises:
        ConfigError: with mixing, ``subset``/``filter``, ``epoch_samples`` or ``pad=False``.
    """
    what = "seq_len=" if o.seq_len is not None else "batch_sampler="
    used = [name for name, on in (
        (f"{len(sources.indexes)} datasets (weights=)", len(sources.indexes) > 1),
        ("subset=/filter=", any(s.kept is not None for s in sources.spec.sources)),
        ("epoch_samples=", o.epoch_samples is not None), ("pad=False", not o.pad)) if on]
    if used:
        raise ConfigError(f"loader({what}...) reads one whole dataset in its own order, and got {', '.join(used)}; "
                          f"drop {' and '.join(used)}, or drop {what} (sample batches mix, select and pad)")


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

