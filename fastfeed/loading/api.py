"""``fastfeed.loader()``: the front door, the DataLoader to put in a training script.

It validates the arguments once, into :class:`~fastfeed.loading.options.LoaderOptions`
(:func:`~fastfeed.loading.options.loader_options`, which also resolves rank and world
size), before any data is read; opens the datasets and their selections
(:func:`~fastfeed.loading.sources.open_sources`); and hands both to one backend:
:func:`fastfeed.loading.cpu.loader.cpu_loader` (DataLoader worker processes; a
:class:`~fastfeed.loading.cpu.loader.Loader`) or, for ``decode="dali"``,
:func:`fastfeed.loading.dali.backend.dali_loader`. Both backends drive the same
:class:`~fastfeed.loading.order.cursor.EpochCursor`, so epochs and resume behave the same.

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

import os
from typing import Any, Callable, Mapping, Sequence

from fastfeed.errors import ConfigError
from fastfeed.loading.cpu.loader import Loader, cpu_loader
from fastfeed.loading.cpu.sampled import check_sampler_fits
from fastfeed.loading.dali.backend import dali_loader
from fastfeed.loading.options import LoaderOptions, check_source, loader_options
from fastfeed.loading.order.cursor import STATE_VERSION
from fastfeed.loading.order.epoch import DEFAULT_SHUFFLE_BLOCK
from fastfeed.loading.sources import Sources, open_sources
from fastfeed.packed.index import DatasetIndex

# STATE_VERSION (the state_dict layout) lives in fastfeed.loading.order.cursor; importable from here too
__all__ = ["Loader", "STATE_VERSION", "loader"]


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
            :mod:`fastfeed.loading.cpu.tokens`). One whole dataset only (no ``weights``, ``subset``,
            ``filter``, ``epoch_samples``, ``pad=False``); its state resumes at any world
            size and batch size (the rest of the epoch's token stream, re-cut).
        pad_id: the value of padded ``input_ids`` (default: the pad id ``pack --tokenizer``
            stored, else 0). Without ``seq_len``, a tokens field and ragged arrays from a
            ``transform`` come out padded, with an ``attention_mask``
            (:mod:`fastfeed.decode.collate`).
        pad_multiple: round padded lengths up to a multiple of this.
        batch_sampler: a ``DistributedTokenBudgetSampler`` or ``DistributedLengthBucketSampler``
            that decides every batch (:mod:`fastfeed.loading.cpu.sampled`); the batch size and
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
    return cpu_loader(sources, options)


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
