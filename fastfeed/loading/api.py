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
import warnings
from typing import Any, Callable, Mapping, Sequence

from fastfeed.errors import ConfigError
from fastfeed.loading.cpu.loader import Loader, cpu_loader
from fastfeed.loading.cpu.sampled import SamplerStream, check_sampler_fits
from fastfeed.loading.dali.backend import dali_loader
from fastfeed.loading.dali.pipeline import DaliLoader
from fastfeed.loading.groups import Crop, Dali, Order, Storage, Tokens, Workers
from fastfeed.loading.options import LEGACY_SOURCE, LoaderOptions, document, loader_options
from fastfeed.loading.order.cursor import STATE_VERSION
from fastfeed.loading.sources import Source, Sources, as_sources, check_source, open_sources
from fastfeed.packed.index import DatasetIndex

# STATE_VERSION (the state_dict layout) lives in fastfeed.loading.order.cursor; importable from here too
__all__ = ["Loader", "STATE_VERSION", "build_loader", "loader"]


@document
def loader(
    path: str | os.PathLike[str] | DatasetIndex | Source | Sequence[Any],
    *,
    batch_size: int | None = None,
    shuffle: bool = True,
    seed: int = 0,
    decode: str | None = "cpu",
    image_size: int | tuple[int, int] | None = None,
    augment: bool = True,
    num_workers: int | str = "auto",
    drop_last: bool = False,
    pad: bool = True,
    rank: int | None = None,
    world_size: int | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    on_error: str = "raise",
    transform: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    batch_sampler: Any = None,
    seq_len: int | None = None,
    log_every: int | None = None,
    crop: Crop | Mapping[str, Any] | None = None,
    workers: Workers | Mapping[str, Any] | None = None,
    dali: Dali | Mapping[str, Any] | None = None,
    storage: Storage | Mapping[str, Any] | None = None,
    tokens: Tokens | Mapping[str, Any] | None = None,
    order: Order | Mapping[str, Any] | None = None,
    **former: Any,
) -> Loader | DaliLoader:
    """A deterministic, resumable, rank- and worker-aware DataLoader over fastfeed shards.

    Args:
        path: a packed dataset (folder or fsspec URL with ``index.json``, or a loaded
            :class:`~fastfeed.packed.index.DatasetIndex`), a list of WebDataset ``.tar``
            files of one dataset, a :class:`Source` (a dataset with a ``subset`` / ``filter``),
            or a list of :class:`Source` with weights to mix (see :mod:`fastfeed.loading.sources`).
        {options}
        **former: the spellings before the groups (``crop_scale=``, ``prefetch_factor=``,
            ``num_threads=``, ``storage_options=``, ``weights=``, ...) still work in this release,
            each with a ``FutureWarning`` naming its new place (:data:`~fastfeed.loading.options.LEGACY`).
            A misspelled name is an error naming the closest option.

    Returns:
        A :class:`Loader` (with ``decode="dali"``, a
        :class:`~fastfeed.loading.dali.pipeline.DaliLoader` with the same epoch, resume and
        ``stats`` API); each batch is a dict (see :mod:`fastfeed.decode.cpu`).

    Every batch of samples also carries ``"valid"`` (bool, False exactly on padding repeats)
    and ``"__source__"`` (int64, the dataset of each sample; all 0 for one dataset); with
    ``seq_len``, ``"valid"`` is the per-token loss mask of the rows instead.

    With ``decode="dali"``, the options of worker processes it cannot honour
    (``num_workers=8``, ``transform``, most of :class:`Workers`) are an error that says why,
    and ``Workers(pin_memory=, persistent_workers=, reuse_buffers=)`` have no effect
    (:mod:`fastfeed.loading.options`).

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

        Grouped options, each checked when built:

        >>> dl = fastfeed.loader("/data/imagenet-ff", batch_size=256, image_size=224,
        ...                      crop=fastfeed.Crop(scale=(0.35, 1)),
        ...                      workers=fastfeed.Workers(prefetch_factor=4))           # doctest: +SKIP

        Mixing datasets, 70/30 in every batch:

        >>> dl = fastfeed.loader([fastfeed.Source("/data/web-ff", weight=0.7),
        ...                       fastfeed.Source("/data/books-ff", weight=0.3)],
        ...                      batch_size=100, decode=None)                          # doctest: +SKIP
        >>> int((next(iter(dl))["__source__"] == 1).sum())                              # doctest: +SKIP
        30

        Filters and subsets (evaluated once, from the index's metadata):

        >>> dl = fastfeed.loader(fastfeed.Source("/data/imagenet-ff", filter=lambda m: m["label"] < 100),
        ...                      batch_size=256, image_size=224)                        # doctest: +SKIP

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
    picked = {k: former.pop(k) for k in LEGACY_SOURCE if k in former}
    if picked:
        warnings.warn(f"loader({'=, '.join(picked)}=) is the former spelling of loader([fastfeed.Source(path, "
                      f"{', '.join(f'{LEGACY_SOURCE[k]}=...' for k in picked)}), ...]); it still works in this "
                      "release", FutureWarning, stacklevel=2)
    sources = as_sources(path, **picked)
    options = loader_options(
        _stacklevel=3, batch_size=batch_size, shuffle=shuffle, seed=seed, decode=decode, image_size=image_size,
        augment=augment, num_workers=num_workers, drop_last=drop_last, pad=pad, rank=rank, world_size=world_size,
        cache_dir=cache_dir, on_error=on_error, transform=transform, batch_sampler=batch_sampler, seq_len=seq_len,
        log_every=log_every, crop=crop, workers=workers, dali=dali, storage=storage, tokens=tokens, order=order,
        **former)
    return build_loader(sources, options)


def build_loader(sources: Sequence[Source], options: LoaderOptions) -> Loader | DaliLoader:
    """The loader of validated ``options`` over ``sources``: what :func:`loader` builds after its checks.

    ``fastfeed tune`` and ``fastfeed doctor`` build their loaders here from one
    :class:`~fastfeed.loading.options.LoaderOptions`, changing only the measured setting.

    Example:
        >>> o = loader_options(batch_size=64, image_size=224)                          # doctest: +SKIP
        >>> dl = build_loader(as_sources("/data/imagenet-ff"), o)                      # doctest: +SKIP
    """
    check_source(sources, options.decode)
    opened = open_sources(sources, options)
    if options.batch_sampler is not None or options.seq_len is not None:
        check_whole_dataset(opened, options)
    if options.batch_sampler is not None:
        index = opened.indexes[0]
        check_sampler_fits(options.batch_sampler, index.num_samples, index.root or index.input)
    elif options.seq_len is None:  # seq_len: TokenBatches checks that one window of tokens fits
        options.check_fits(opened.spec.epoch_samples)
    if options.decode == "dali":
        for index in opened.indexes:
            check_encoded(index)
        stream = None if options.batch_sampler is None else SamplerStream(options.batch_sampler)
        return dali_loader(opened.indexes, options, opened.spec, opened.names, stream=stream)
    return cpu_loader(opened, options)


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
        (f"{len(sources.indexes)} datasets (a mix of Source)", len(sources.indexes) > 1),
        ("subset=/filter=", any(s.kept is not None for s in sources.spec.sources)),
        ("Order(epoch_samples=)", o.order.epoch_samples is not None), ("pad=False", not o.pad)) if on]
    if used:
        raise ConfigError(f"loader({what}...) reads one whole dataset in its own order, and got {', '.join(used)}; "
                          f"drop {' and '.join(used)}, or drop {what} (sample batches mix, select and pad)")
