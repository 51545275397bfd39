"""What ``loader()``'s first argument names: one dataset, or several to mix, with selections.

Rules (documented in :func:`fastfeed.loader`; :func:`as_sources`
reads the argument):

- A path, URL or :class:`~fastfeed.packed.index.DatasetIndex`: one dataset; a list of
  WebDataset tars: the shards of **one** dataset.
- A :class:`Source`: one dataset with its ``subset`` / ``filter``.
- A list of :class:`Source`, each with a ``weight``: one dataset
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
from typing import Any, Callable, Mapping, Sequence

from fastfeed.decode.cpu import pick_image_field
from fastfeed.errors import ConfigError
from fastfeed.loading.options import LoaderOptions
from fastfeed.loading.order.cursor import BatchStream, EpochCursor
from fastfeed.loading.order.rankplan import PlanSpec, plan_spec
from fastfeed.loading.order.selection import index_metadata, select
from fastfeed.packed.index import DatasetIndex
from fastfeed.packed.reader import check_shards, resolve_index
from fastfeed.storage.retry import with_policy

__all__ = ["Source", "Sources", "as_sources", "check_source", "cursor_for", "open_sources"]


@dataclass(frozen=True)
class Source:
    """A dataset for ``loader()``, with its share of a mix and its selection (mosaicml/streaming's ``Stream``).

    Pass one ``Source`` to select from one dataset, or a list of them to mix: each batch
    takes its samples from the sources in proportion to their weights (normalised), and
    ``batch["__source__"]`` says which source each sample came from.

    Attributes:
        path: a packed dataset (folder or fsspec URL with ``index.json``), a loaded
            :class:`~fastfeed.packed.index.DatasetIndex`, or a list of WebDataset tars of one dataset.
        weight: its share of a mix (any positive number; required when mixing).
        subset: sample ids (or a bool mask) to keep.
        filter: ``fn(meta) -> bool mask`` over the index's per-sample metadata (numpy arrays
            ``"index"``, ``"label"``, ``"length"``, ``"key"`` where recorded), evaluated once.

    Example:
        >>> web, books = Source("/data/web-ff", weight=0.7), Source("/data/books-ff", weight=0.3)
        >>> books
        Source('/data/books-ff', weight=0.3)
    """

    path: Any
    weight: float | None = None
    subset: Any = None
    filter: Callable[[Mapping[str, Any]], Any] | None = None

    def __post_init__(self) -> None:
        _check_path(self.path)
        w = self.weight
        if w is not None:
            try:
                ok = not isinstance(w, (bool, str, bytes)) and 0 < float(w) < float("inf")
            except (TypeError, ValueError):
                ok = False
            if not ok:
                raise ConfigError(f"Source({self.path!r}, weight={w!r}): give a positive number (the weights of "
                                  "a mix are normalised)")
            object.__setattr__(self, "weight", float(w))
        if self.filter is not None and not callable(self.filter):
            raise ConfigError(f"filter={self.filter!r} is not callable; pass fn(meta) -> bool mask")

    def __repr__(self) -> str:
        rest = [f"{k}={getattr(self, k)!r}" for k in ("weight", "subset", "filter") if getattr(self, k) is not None]
        return f"Source({', '.join([repr(self.path), *rest])})"




def _check_path(path: Any) -> None:
    """A dataset is a path or URL, a loaded index, or a non-empty list of tar paths or URLs."""
    one = (str, os.PathLike)
    if isinstance(path, DatasetIndex) or (isinstance(path, one) and os.fspath(path)):
        return
    if isinstance(path, (list, tuple)) and path and all(isinstance(p, one) and os.fspath(p) for p in path):
        return
    raise ConfigError(f"loader({path!r}): name a dataset: a folder or URL with index.json, a loaded "
                      "fastfeed.DatasetIndex, a list of WebDataset .tar files, or fastfeed.Source(...)s to mix")


def as_sources(path_or_url: Any, *, weights: Any = None, subset: Any = None, filter: Any = None
               ) -> tuple[Source, ...]:
    """``loader()``'s first argument as a tuple of :class:`Source`: one dataset, or one per dataset to mix.

    A path, URL, index or list of tars is one dataset; a :class:`Source` or a list of them
    is taken as it is. ``weights`` / ``subset`` / ``filter`` are the former parallel lists
    (one value for one dataset; with several, a list with one per dataset, or one value for
    all). A list of packed datasets with no weight is an error asking for weights.

    Raises:
        ConfigError: weights that do not fit the datasets, or mixing without weights.

    Example:
        >>> as_sources("/data/ff")
        (Source('/data/ff'),)
        >>> as_sources(["/data/a", "/data/b"], weights=[3, 1])
        (Source('/data/a', weight=3.0), Source('/data/b', weight=1.0))
    """
    listed = isinstance(path_or_url, (list, tuple))
    if isinstance(path_or_url, Source) or (listed and path_or_url and
                                            all(isinstance(p, Source) for p in path_or_url)):
        given = (path_or_url,) if isinstance(path_or_url, Source) else tuple(path_or_url)
        if weights is not None or subset is not None or filter is not None:
            raise ConfigError("loader(Source(...)) carries its own weight=, subset= and filter=; drop "
                              "weights=/subset=/filter= from loader()")
        _check_mix(given)
        return given
    if listed and any(isinstance(p, Source) for p in path_or_url):
        raise ConfigError("loader([...]) mixes Source objects with plain paths; wrap every entry in "
                          "fastfeed.Source(path, weight=...)")
    if weights is None:
        if listed and len(path_or_url) > 1 and all(_is_packed(p) for p in path_or_url):
            shown = ", ".join(map(str, path_or_url[:3])) + (", ..." if len(path_or_url) > 3 else "")
            raise ConfigError(
                f"loader() got {len(path_or_url)} packed datasets ({shown}) without weights; give each a "
                "weight to mix them: loader([fastfeed.Source(a, weight=0.7), fastfeed.Source(b, weight=0.3)]) "
                "(weights proportional to their sizes read each once per epoch)")
        return (Source(list(path_or_url) if listed else path_or_url, subset=subset, filter=filter),)
    try:
        ws = [float(w) for w in weights]
    except (TypeError, ValueError):
        ws = []
    if not ws or isinstance(weights, (str, bytes)) or any(not w > 0 or w == float("inf") for w in ws):
        raise ConfigError(f"weights={weights!r}: give one positive number per dataset, e.g. [0.7, 0.3] "
                          "(they are normalised)")
    entries = list(path_or_url) if listed else [path_or_url]
    if len(entries) != len(ws):
        raise ConfigError(f"weights={list(weights)} has {len(ws)} entries for {len(entries)} dataset(s); "
                          "give one weight per dataset")
    subsets = _per_dataset(subset, len(entries), "subset")
    filters = _per_dataset(filter, len(entries), "filter")
    return tuple(Source(p, weight=w, subset=s, filter=f) for p, w, s, f in zip(entries, ws, subsets, filters))


def _check_mix(sources: Sequence[Source]) -> None:
    if len(sources) > 1 and any(s.weight is None for s in sources):
        missing = [repr(s.path) for s in sources if s.weight is None]
        raise ConfigError(f"loader() mixes {len(sources)} sources and {', '.join(missing[:3])} has no weight; "
                          "give every Source a weight= (weights proportional to their sizes read each once "
                          "per epoch)")


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


def check_source(sources: Sequence[Source], decode: str | None) -> None:
    """``decode="dali"`` reads packed datasets (their DALI index files), not a list of tars:
    one (a folder, a URL or a loaded :class:`~fastfeed.packed.index.DatasetIndex`) per source.

    Example:
        >>> check_source(as_sources("/data/ff"), "dali")
        >>> check_source(as_sources(["/data/a", "/data/b"], weights=[1, 1]), "dali")
    """
    one = (str, os.PathLike, DatasetIndex)
    if decode != "dali" or all(isinstance(s.path, one) for s in sources):
        return
    bad = next(s.path for s in sources if not isinstance(s.path, one))
    what = "a list of tars (an entry holding several)" if isinstance(bad, (list, tuple)) else type(bad).__name__
    raise ConfigError(
        f"decode='dali' reads packed datasets (a folder or URL with index.json; to mix, a list "
        f"of them), not {what}; pack the tars with `fastfeed pack` (it writes the DALI "
        "index files) or use decode='cpu'")


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
                              storage_options=with_policy(o.storage.options, timeout=o.storage.timeout,
                                                          retries=o.storage.retries), on_error=o.on_error)
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
