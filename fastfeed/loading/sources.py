"""What ``loader()``'s first argument names: one dataset, or several to mix, with selections.

Rules (documented in :func:`fastfeed.loader`; :func:`~fastfeed.loading.options.as_sources`
reads the argument):

- A path, URL or :class:`~fastfeed.packed.index.DatasetIndex`: one dataset; a list of
  WebDataset tars: the shards of **one** dataset.
- A :class:`~fastfeed.loading.options.Source`: one dataset with its ``subset`` / ``filter``.
- A list of :class:`~fastfeed.loading.options.Source`, each with a ``weight``: one dataset
  per entry (an entry may itself be a list of tars), mixed in those proportions. A list of
  packed-dataset folders without weights is an error that asks for them (weights
  proportional to the sizes read each once per epoch).

Datasets mixed into one batch must decode the same way: with ``decode="cpu"`` and an
image size every dataset needs an image field, and labels must come from every
dataset's index or from none; otherwise a :class:`~fastfeed.errors.ConfigError` names
the datasets and what differs. ``decode="dali"`` mixes packed tar datasets under the same
label rule; each needs images DALI decodes (checked against its DALI index files when
the loader is built, :func:`fastfeed.loading.dali.pipeline.mixed_table`). With ``decode=None`` batches carry the index's labels
(``"label"``) only when every dataset records them (the raw ``cls`` field is there anyway). Other fields may differ (a field missing from a sample
collates to None, as within one dataset).

Example:
    >>> o = loader_options(batch_size=4, rank=0, world_size=1)                  # doctest: +SKIP
    >>> open_sources(as_sources(["/data/a", "/data/b"], weights=[1, 1]), o).spec.epoch_samples  # doctest: +SKIP
    20000
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Sequence

from fastfeed.decode.cpu import pick_image_field
from fastfeed.errors import ConfigError
from fastfeed.loading.options import LoaderOptions, Source, as_sources
from fastfeed.loading.order.cursor import BatchStream, EpochCursor
from fastfeed.loading.order.rankplan import PlanSpec, plan_spec
from fastfeed.loading.order.selection import index_metadata, select
from fastfeed.packed.index import DatasetIndex
from fastfeed.packed.reader import check_shards, resolve_index

__all__ = ["Sources", "cursor_for", "open_sources"]


@dataclass(frozen=True)
class Sources:
    """The datasets of a loader: their indexes, names and the validated plan inputs."""

    indexes: tuple[DatasetIndex, ...]
    names: tuple[str, ...]
    spec: PlanSpec

    @property
    def fingerprints(self) -> list[str]:
        return [i.fingerprint for i in self.indexes]


def open_sources(sources: Sequence[Source], o: LoaderOptions) -> Sources:
    """Resolve, check and select the datasets of ``loader(path, ...)`` (``sources``: :func:`as_sources` of it).

    Raises:
        ConfigError: a bad subset/filter, or datasets that cannot share a batch (the
            message names them).
    """
    indexes = []
    for src in sources:
        index = resolve_index(src.path, cache_dir=o.cache_dir, cache_size=o.storage.cache_size,
                              storage_options=o.storage.options, on_error=o.on_error)
        check_shards(index)
        indexes.append(index)
    names = tuple(_name(s.path, i) for s, i in zip(sources, indexes))
    if len(indexes) > 1:
        check_compatible(indexes, names, o)
    sels = [select(idx.shard_counts, subset=src.subset, filter=src.filter,
                   meta=index_metadata(idx) if src.filter is not None else None, name=name)
            for idx, name, src in zip(indexes, names, sources)]
    weights = None if len(sources) == 1 and sources[0].weight is None else [s.weight for s in sources]
    spec = plan_spec(sels, weights=weights, epoch_samples=o.order.epoch_samples, seed=o.seed, shuffle=o.shuffle,
                     shuffle_block=o.order.shuffle_block)
    return Sources(indexes=tuple(indexes), names=names, spec=spec)


def _name(entry: Any, index: DatasetIndex) -> str:
    if isinstance(entry, (str, os.PathLike)):
        return os.fspath(entry)
    return str(index.root or "dataset")


def check_compatible(indexes: Sequence[DatasetIndex], names: Sequence[str], o: LoaderOptions) -> None:
    """Datasets mixed into one batch decode the same way (see the module docstring).

    Raises:
        ConfigError: naming the datasets and what differs.
    """
    labelled = [i.has_labels for i in indexes]
    if o.decode in ("cpu", "dali") and any(labelled) and not all(labelled):
        have = [n for n, h in zip(names, labelled) if h]
        lack = [n for n, h in zip(names, labelled) if not h]
        raise ConfigError(f"mixed datasets differ in labels: {', '.join(have)} record labels in the index, "
                          f"{', '.join(lack)} do not, so decode={o.decode!r} batches would mix index labels with "
                          "parsed cls fields; pack them alike (labels for all or none), or use decode=None "
                          "(raw fields; no index label then)")
    if o.decode == "cpu" and o.image_size is not None:
        fields = [o.crop.image_field if o.crop.image_field in i.fields else None if o.crop.image_field else
                  pick_image_field(i.fields) for i in indexes]
        lack = [f"{n} (fields {', '.join(i.fields) or 'unknown'})" for n, i, f in zip(names, indexes, fields)
                if f is None and i.fields]
        if lack:
            raise ConfigError(f"decode='cpu' with image_size= decodes an image per sample, and "
                              f"{'; '.join(lack)} has no {o.crop.image_field or 'image'} field; mix image datasets, "
                              "pass image_field=, or decode=None for raw bytes")


def cursor_for(index: DatasetIndex | Sequence[DatasetIndex], o: LoaderOptions, spec: PlanSpec | None = None, *,
               stream: BatchStream | None = None) -> EpochCursor:
    """The epoch cursor of a loader over ``index`` with options ``o``: both backends build theirs here.

    ``index``: one dataset, or a sequence of them when mixing; ``spec`` carries the weights
    and subset/filter (:attr:`Sources.spec`), None: every sample of one dataset.
    ``stream``: the batch stream of ``seq_len`` / ``batch_sampler`` loaders, whose batches
    are not cut from the plan by ``batch_size``.

    Example:
        >>> sources = open_sources("/data/ff", options)                        # doctest: +SKIP
        >>> cursor = cursor_for(sources.indexes, options, sources.spec)         # doctest: +SKIP
    """
    indexes = [index] if isinstance(index, DatasetIndex) else list(index)
    if spec is None:
        if len(indexes) != 1:
            raise ConfigError(f"cursor_for: {len(indexes)} datasets need their plan spec "
                              "(open_sources(...).spec), which holds the weights")
        spec = plan_spec([indexes[0].shard_counts], seed=o.seed, shuffle=o.shuffle, shuffle_block=o.order.shuffle_block)
    return EpochCursor(spec, fingerprints=[i.fingerprint for i in indexes], batch_size=o.batch_size,
                       drop_last=o.drop_last, pad=o.pad, rank=o.rank, world_size=o.world_size, stream=stream)
