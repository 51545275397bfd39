"""What ``loader()``'s first argument names: one dataset, or several to mix, with selections.

Rules (documented in :func:`fastfeed.loader`):

- A path, URL or :class:`~fastfeed.packed.index.DatasetIndex`: one dataset.
- A list without ``weights``: the WebDataset tar shards of **one** dataset, as before. A
  list of packed-dataset folders (each with ``index.json``) without weights is an error
  that asks for ``weights=`` (mixing needs proportions; weights proportional to the sizes,
  ``weights=[len_a, len_b]``, read each once per epoch).
- A list with ``weights`` (one per entry): one dataset per entry (an entry may itself be
  a list of tars), mixed in those proportions.
- ``subset=`` / ``filter=``: for one dataset, one value; with several, one value for all
  or a list with one per dataset (None for none).

Datasets mixed into one batch must decode the same way: with ``decode="cpu"`` and an
image size every dataset needs an image field, and labels must come from every
dataset's index or from none; otherwise a :class:`~fastfeed.errors.ConfigError` names
the datasets and what differs. ``decode="dali"`` mixes packed tar datasets under the same
label rule; each needs images DALI decodes (checked against its DALI index files when
the loader is built, :func:`fastfeed.loading.dali.pipeline.mixed_table`). With ``decode=None`` batches carry the index's labels
(``"label"``) only when every dataset records them (the raw ``cls`` field is there anyway). Other fields may differ (a field missing from a sample
collates to None, as within one dataset).

Example:
    >>> o = loader_options(batch_size=4, rank=0, world_size=1, weights=[1, 1])  # doctest: +SKIP
    >>> open_sources(["/data/a", "/data/b"], o).spec.epoch_samples     # doctest: +SKIP
    20000
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Sequence

from fastfeed.decode.cpu import pick_image_field
from fastfeed.errors import ConfigError
from fastfeed.loading.options import LoaderOptions
from fastfeed.loading.order.cursor import BatchStream, EpochCursor
from fastfeed.loading.order.rankplan import PlanSpec, plan_spec
from fastfeed.loading.order.selection import index_metadata, select
from fastfeed.packed.index import DatasetIndex
from fastfeed.packed.reader import check_shards, resolve_index

__all__ = ["Sources", "open_sources", "split_sources"]


@dataclass(frozen=True)
class Sources:
    """The datasets of a loader: their indexes, names and the validated plan inputs."""

    indexes: tuple[DatasetIndex, ...]
    names: tuple[str, ...]
    spec: PlanSpec

    @property
    def fingerprints(self) -> list[str]:
        return [i.fingerprint for i in self.indexes]


def split_sources(path_or_url: Any, weights: Sequence[float] | None) -> list[Any]:
    """The entries of ``path_or_url`` that are one dataset each (see the module docstring).

    Example:
        >>> split_sources(["a.tar", "b.tar"], None), split_sources(["a", "b"], [1, 2])
        ([['a.tar', 'b.tar']], ['a', 'b'])
    """
    listed = isinstance(path_or_url, (list, tuple))
    if weights is None:
        if listed and path_or_url and all(_is_packed(p) for p in path_or_url) and len(path_or_url) > 1:
            raise ConfigError(
                f"loader() got {len(path_or_url)} packed datasets ({', '.join(map(str, path_or_url[:3]))}"
                f"{', ...' if len(path_or_url) > 3 else ''}) without weights=; pass weights= to mix them "
                "(e.g. weights=[0.7, 0.3]; weights proportional to their sizes read each once per epoch)")
        return [list(path_or_url) if listed else path_or_url]
    entries = list(path_or_url) if listed else [path_or_url]
    if len(entries) != len(weights):
        raise ConfigError(f"weights={list(weights)} has {len(weights)} entries for {len(entries)} dataset(s); "
                          "give one weight per dataset")
    return entries


def _is_packed(p: Any) -> bool:
    if isinstance(p, DatasetIndex):
        return True
    return isinstance(p, (str, os.PathLike)) and os.path.isfile(os.path.join(os.fspath(p), "index.json"))


def _per_dataset(value: Any, k: int, what: str) -> list[Any]:
    if k == 1:
        return [value]
    if isinstance(value, (list, tuple)) and len(value) == k and \
            all(v is None or callable(v) or isinstance(v, (list, tuple)) or hasattr(v, "shape") for v in value):
        return list(value)
    if value is None or callable(value):
        return [value] * k
    raise ConfigError(f"{what}= with {k} datasets: give one per dataset (a list of {k}, None for none)")


def open_sources(path_or_url: Any, o: LoaderOptions) -> Sources:
    """Resolve, check and select the datasets of ``loader(path_or_url, **options)``.

    Raises:
        ConfigError: weights that do not fit the datasets, a bad subset/filter, or
            datasets that cannot share a batch (the message names them).
    """
    entries = split_sources(path_or_url, o.weights)
    indexes = []
    for entry in entries:
        index = resolve_index(entry, cache_dir=o.cache_dir, cache_size=o.cache_size,
                              storage_options=o.storage_options, on_error=o.on_error)
        check_shards(index)
        indexes.append(index)
    names = tuple(_name(e, i) for e, i in zip(entries, indexes))
    if len(indexes) > 1:
        check_compatible(indexes, names, o)
    subsets = _per_dataset(o.subset, len(indexes), "subset")
    filters = _per_dataset(o.filter, len(indexes), "filter")
    sels = [select(idx.shard_counts, subset=sub, filter=f, meta=index_metadata(idx) if f is not None else None,
                   name=name)
            for idx, name, sub, f in zip(indexes, names, subsets, filters)]
    spec = plan_spec(sels, weights=o.weights, epoch_samples=o.epoch_samples, seed=o.seed, shuffle=o.shuffle,
                     shuffle_block=o.shuffle_block)
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
        fields = [o.image_field if o.image_field in i.fields else None if o.image_field else
                  pick_image_field(i.fields) for i in indexes]
        lack = [f"{n} (fields {', '.join(i.fields) or 'unknown'})" for n, i, f in zip(names, indexes, fields)
                if f is None and i.fields]
        if lack:
            raise ConfigError(f"decode='cpu' with image_size= decodes an image per sample, and "
                              f"{'; '.join(lack)} has no {o.image_field or 'image'} field; mix image datasets, "
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
        spec = plan_spec([indexes[0].shard_counts], seed=o.seed, shuffle=o.shuffle, shuffle_block=o.shuffle_block)
    return EpochCursor(spec, fingerprints=[i.fingerprint for i in indexes], batch_size=o.batch_size,
                       drop_last=o.drop_last, pad=o.pad, rank=o.rank, world_size=o.world_size, stream=stream)
