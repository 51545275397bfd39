"""The loader's options: each defined once, validated once, for both backends.

``fastfeed.loader()`` keeps the common options flat (:class:`LoaderOptions`' plain fields:
``batch_size``, ``shuffle``, ``seed``, ``decode``, ``image_size``, ``augment``,
``num_workers``, ...) and groups the rest in frozen objects, each checked when it is built
(:mod:`fastfeed.loading.groups`: ``Crop``, ``Workers``, ``Dali``, ``Storage``, ``Tokens``,
``Order``); the datasets themselves are :class:`~fastfeed.loading.sources.Source` objects.

Every option is a field made by :func:`fastfeed._options.option`: its type, default, check,
doc line, CLI flag and former flat spelling come from that one place. The docstrings of
the groups and of ``loader()`` / ``tune()`` / ``doctor()``, the API reference, the CLI's flags
and the former spellings (:data:`LEGACY`: ``crop_scale=`` still works for one release, with
a ``FutureWarning`` naming ``crop=fastfeed.Crop(scale=...)``) are derived from it.

What applies where: ``decode="dali"`` has no worker processes and decodes with DALI, so
the options marked :func:`~fastfeed.loading.groups.dali_refuses` (``num_workers``,
``transform``, most of ``Workers``) are an error there unless neutral, with the reason
(:data:`DALI_REFUSES`); those marked :func:`~fastfeed.loading.groups.dali_meets` are
accepted and have no effect (:data:`DALI_MEETS`); a ``Dali`` group with another ``decode``
is an error. Anything else is an error that names the closest option (``imagesize=`` ->
"did you mean image_size=?").

``num_workers`` / ``prefetch_factor`` ``"auto"`` are resolved by
:mod:`fastfeed.loading.auto`, the DALI knobs' ``"auto"`` by
:mod:`fastfeed.loading.dali.backend` (both from a stored tune result); a dataset-dependent
check (``drop_last`` needs one full batch per rank) is :meth:`LoaderOptions.check_fits`.

Example:
    >>> o = loader_options(batch_size=32, image_size=224, crop=Crop(scale=(0.35, 1)), rank=0, world_size=1)
    >>> o.image_size, o.decode, o.crop.scale, o.workers.prefetch_factor
    ((224, 224), 'cpu', (0.35, 1.0), 'auto')
    >>> loader_options(batch_size=32, imagesize=224)
    Traceback (most recent call last):
    ...
    fastfeed.errors.ConfigError: loader() got an unexpected keyword argument 'imagesize'; did you mean image_size=?
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import warnings
from dataclasses import dataclass, fields, replace
from typing import Any, Callable, Mapping, Sequence

from fastfeed._options import (
    MAX_COUNT,
    Spec,
    as_bool,
    at_least,
    auto_or_int,
    callable_or_none,
    check_int,
    fill_doc,
    option,
    path_or_none,
    specs,
)
from fastfeed._util import check_on_error
from fastfeed.dist import check_rank, resolve_world
from fastfeed.errors import ConfigError
from fastfeed.loading.groups import GROUPS, Crop, Dali, Order, Storage, Tokens, Workers, dali_refuses, plain


# This module imports nothing that loads numpy or torch at import time: `fastfeed --help` builds
# its flags from these definitions. The checks import their helpers when they run.

__all__ = [
    "DALI_MEETS",
    "DALI_ONLY",
    "DALI_REFUSES",
    "DECODES",
    "FLAT",
    "LEGACY",
    "LEGACY_SOURCE",
    "LoaderOptions",
    "as_keywords",
    "check_dali_knobs",
    "document",
    "find_option",
    "loader_options",
    "with_values",
]

DECODES = ("cpu", "dali", None)
#: The most DataLoader worker processes one rank starts (a host has never had this many cores).
MAX_WORKERS = 1024
#: The longest ``seq_len`` (2**26 tokens: a row of int64 ids is 512 MB).
MAX_SEQ_LEN = 1 << 26


def _image_size(value: Any, name: str) -> tuple[int, int] | None:
    """``image_size`` read the one way (:func:`fastfeed.decode.geometry.normalize_image_size`): an int or
    (height, width), each side from 1 to :data:`~fastfeed.decode.geometry.MAX_IMAGE_SIDE`; None stays None."""
    from fastfeed.decode.geometry import normalize_image_size  # numpy: not at import (see the imports)

    return normalize_image_size(value)


# ---------------------------------------------------------------------- the options object
@dataclass(frozen=True)
class LoaderOptions:
    """``loader()``'s arguments, validated (build it with :func:`loader_options`).

    The flat fields are ``loader()``'s keywords; :attr:`crop`, :attr:`workers`,
    :attr:`dali`, :attr:`storage`, :attr:`tokens` and :attr:`order` its groups.
    ``rank`` / ``world_size`` are resolved; ``num_workers``, ``prefetch_factor`` and the
    DALI knobs may still be ``"auto"`` (the backend resolves them against the dataset);
    ``knobs_from`` says where the DALI knobs came from (``"explicit"``, ``"tuned"``,
    ``"default"``).
    """

    batch_size: int = option(None, "samples per batch on each rank (with a batch_sampler: taken from it)",
                             check=at_least(1, none=True, most=MAX_COUNT), flag="--batch-size", metavar="B")
    shuffle: bool = option(True, "a new order every epoch, a function of (seed, epoch, world size); False: "
                           "the stored order", check=as_bool)
    seed: int = option(0, "the seed of the order and of the augmentation", check=at_least(0, most=(1 << 64) - 1))
    decode: str | None = option("cpu", "'cpu': JPEG decode and crops in worker processes; 'dali': on the GPU "
                                "through NVIDIA DALI; None ('none' on the command line): raw bytes", flag="--decode",
                                choices=("cpu", "dali", "none"), parse=lambda text: None if text == "none" else text)
    image_size: tuple[int, int] | None = option(None, "the output size (an int or (height, width), at most 8192 "
                                                "pixels a side): random-resized crops when augmenting, else a "
                                                "center crop; None: images as stored", check=_image_size,
                                                flag="--image-size", metavar="PX")
    augment: bool = option(True, "random-resized crops and flips (see Crop); False: the evaluation crop",
                           check=as_bool)
    num_workers: int | str = option(
        "auto", "DataLoader worker processes; 'auto': a fastfeed tune result for this dataset, host and batch "
                "shape, else a heuristic of the cores left per rank", check=at_least(0, auto=True, most=MAX_WORKERS),
        flag="--num-workers", parse=auto_or_int, metavar="N", **dali_refuses(("auto", 0), "DALI decodes in its own threads, not in DataLoader workers; drop it "
                                             "and set dali=fastfeed.Dali(num_threads=...) (or leave it 'auto')"))
    drop_last: bool = option(False, "drop the last incomplete batch of each rank", check=as_bool)
    pad: bool = option(True, "with drop_last=False, repeat up to world_size - 1 samples so every rank's share "
                       "has the same size (flagged in batch['valid']); False: every sample exactly once (every "
                       "rank still runs the same number of steps, a last batch may be shorter or empty)",
                       check=as_bool)
    rank: int = option(None, "this process's rank (default: torch.distributed, then RANK)", check=check_rank)
    world_size: int = option(None, "the number of ranks (default: torch.distributed, then WORLD_SIZE)",
                             check=check_rank)
    cache_dir: str | os.PathLike[str] | None = option(
        None, "local cache for remote and gzipped shards, shared by the host's processes (see Storage)",
        check=path_or_none, flag="--cache-dir", metavar="DIR")
    on_error: str = option("raise", "a sample that fails to read or decode: 'raise' an error naming it, or "
                           "'skip' it (counted in loader.stats)", check=lambda v, name: check_on_error(v))
    transform: Callable[[dict[str, Any]], dict[str, Any]] | None = option(
        None, "fn(sample) -> sample, run in the workers after decoding each sample", check=callable_or_none,
        **dali_refuses((None,), "a Python function per sample would undo GPU decoding; use augment and "
                           "dali=fastfeed.Dali(output=, mean=, std=), transform the batch in your training step, "
                           "or use decode='cpu'"))
    batch_sampler: Any = option(None, "a DistributedTokenBudgetSampler, DistributedLengthBucketSampler or "
                                "DistributedAspectRatioSampler that decides every batch "
                                "(fastfeed.loading.cpu.sampled); one whole dataset")
    seq_len: int | None = option(None, "pack the epoch's documents (a tokens field) into rows of exactly this "
                                 "many tokens: input_ids, position_ids, valid, cu_seqlens "
                                 "(fastfeed.loading.cpu.tokens); one whole dataset",
                                 check=at_least(1, none=True, most=MAX_SEQ_LEN))
    log_every: int | None = option(None, "log one stats line every N batches (off by default)",
                                   check=at_least(1, none=True))
    crop: Crop = option(Crop(), "crop ranges, flips, the evaluation crop and the image field")
    workers: Workers = option(Workers(), "the DataLoader worker processes of decode='cpu' / None")
    dali: Dali = option(Dali(), "the options of decode='dali'")
    storage: Storage = option(Storage(), "remote reads: fsspec options and the cache's bound")
    tokens: Tokens = option(Tokens(), "padded token batches")
    order: Order = option(Order(), "the shuffle window and a mixed epoch's length")
    knobs_from: str = "explicit"

    @property
    def gpu(self) -> bool:
        """DALI decodes on a GPU (``dali.device_id`` is not None)."""
        return self.dali.gpu

    def check_fits(self, num_samples: int) -> None:
        """``drop_last=True`` needs one full batch per rank from ``num_samples`` samples.

        Raises:
            ConfigError: it does not (the message says what to lower).

        Example:
            >>> loader_options(batch_size=8, drop_last=True, rank=0, world_size=4).check_fits(16)
            ... # doctest: +ELLIPSIS
            Traceback (most recent call last):
            ...
            fastfeed.errors.ConfigError: 16 samples over world_size=4 cannot fill one batch of 8 per rank ...
        """
        if self.drop_last and num_samples // self.world_size < self.batch_size:
            raise ConfigError(
                f"{num_samples} samples over world_size={self.world_size} cannot fill one batch of "
                f"{self.batch_size} per rank with drop_last=True; lower batch_size or pass drop_last=False")


#: The flat keywords of ``loader()`` (its groups excluded), in order.
_FLAT_SPECS = tuple((f, spec) for f, spec in specs(LoaderOptions) if f.name not in GROUPS)
FLAT: tuple[str, ...] = tuple(f.name for f, _ in _FLAT_SPECS)
#: Former flat spellings: old ``loader()`` keyword -> (group keyword, field).
LEGACY: dict[str, tuple[str, str]] = {
    (spec.legacy or f.name): (key, f.name) for key, cls in GROUPS.items() for f, spec in specs(cls)
    if spec.legacy != ""}  # legacy="": an option born in its group, with no former flat spelling
#: What the source list took as parallel lists before :class:`Source`: old keyword -> Source field.
LEGACY_SOURCE = {"weights": "weight", "subset": "subset", "filter": "filter"}


def _dali_rule(kind: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for owner in (LoaderOptions, Workers):
        for f, spec in specs(owner):
            if spec.get("dali") == kind:
                out[f.name] = (spec.get("dali_accepts"), spec.get("dali_why")) if kind == "refuse" \
                    else spec.get("dali_why")
    return out


#: Options ``decode="dali"`` cannot honour: name -> (the neutral values it accepts, why the others cannot work).
DALI_REFUSES: dict[str, tuple[tuple[Any, ...], str]] = _dali_rule("refuse")
#: Options whose purpose DALI's pipeline serves by itself: accepted with any value, no effect.
DALI_MEETS: dict[str, str] = _dali_rule("meets")
#: Options only ``decode="dali"`` takes (the fields of :class:`Dali`), and what they are.
DALI_ONLY: dict[str, str] = {f.name: spec.doc for f, spec in specs(Dali)}
_DALI_CHECKS: dict[str, Any] = {f.name: spec.check for f, spec in specs(Dali)}


def find_option(name: str) -> tuple[str | None, dataclasses.Field[Any], Spec]:
    """An option by its flat or former name: (its group keyword or None, its field, its spec).

    Example:
        >>> key, f, spec = find_option("crop_scale"); key, f.name
        ('crop', 'scale')
    """
    if name in LEGACY:
        key, field_name = LEGACY[name]
        owner = GROUPS[key]
    else:
        key, field_name, owner = None, name, LoaderOptions
    for f, spec in specs(owner):
        if f.name == field_name:
            return key, f, spec
    raise KeyError(name)


# ---------------------------------------------------------------------- building the options
def loader_options(*, _stacklevel: int = 2, **kwargs: Any) -> LoaderOptions:
    """Validate ``loader()``'s keyword arguments into :class:`LoaderOptions` (see the module docstring).

    Groups may be given as objects or as mappings of their fields; a former flat spelling
    (:data:`LEGACY`) is moved into its group with a ``FutureWarning``. ``rank`` /
    ``world_size`` left out or None are resolved by :func:`fastfeed.dist.resolve_world`.

    Raises:
        ConfigError: an invalid value, an option the chosen ``decode`` cannot honour, or an
            unknown name (with the closest known one).

    Example:
        >>> loader_options(batch_size=4, dali=Dali(num_threads=2), decode="dali", image_size=16, rank=0,
        ...                world_size=1).dali.num_threads
        2
    """
    from fastfeed.loading.textopts import text_settings

    _check_names(kwargs)
    legacy = {k: kwargs.pop(k) for k in list(kwargs) if k in LEGACY}
    given = sorted(k for k in kwargs if k in LEGACY_SOURCE)
    if given:
        raise ConfigError(f"{'=, '.join(given)}= describe the datasets; pass them as loader([fastfeed.Source(path, "
                          "weight=, subset=, filter=), ...])")
    groups = _groups(kwargs, legacy, stacklevel=_stacklevel + 1)
    args: dict[str, Any] = {**{f.name: f.default for f, _ in _FLAT_SPECS},
                            "rank": None, "world_size": None, **kwargs, **groups}
    for f, spec in _FLAT_SPECS:  # each value on its own first (its type, its range); then the rules between them
        if spec.check is not None:
            args[f.name] = spec.check(args[f.name], f.name)
    args.update(text_settings(args))  # seq_len, batch_sampler (and batch_size, rank, world_size from it)
    if args.get("batch_size") is None:
        raise ConfigError("loader() needs batch_size= (samples per batch on each rank)")
    decode = args["decode"]
    if decode not in DECODES:
        raise ConfigError(f"decode={decode!r}; use 'cpu', 'dali' or None (raw bytes)")
    if decode == "dali":
        _check_dali_can_honour(args)
        if args["image_size"] is None and args.get("batch_sampler") is None:  # an aspect sampler's buckets size it
            raise ConfigError(
                "decode='dali' needs image_size= (an int or (height, width)): DALI delivers each "
                "batch as one tensor, so every image is cropped/resized to one size")
    elif _changed(args["dali"]):
        changed = _changed(args["dali"])
        shown = ", ".join(f"{k}={v!r}" for k, v in changed.items()) or "dali=Dali()"
        first = next(iter(changed), "num_threads")
        raise ConfigError(f"{shown}: option(s) of decode='dali', not decode={decode!r}; pass decode='dali' or "
                          f"drop them ({first}: {DALI_ONLY[first]})")
    rank, world_size = resolve_world(args["rank"], args["world_size"])
    args.update(batch_size=check_int("batch_size", args["batch_size"], 1, most=MAX_COUNT), rank=rank,
                world_size=world_size)
    return LoaderOptions(**args)


def _check_names(kwargs: Mapping[str, Any]) -> None:
    known = (*FLAT, *GROUPS, *LEGACY, *LEGACY_SOURCE)
    fields_of = {f.name: (key, cls) for key, cls in GROUPS.items() for f, _ in specs(cls)}
    for name in kwargs:
        if name in known:
            continue
        if name in fields_of:  # a grouped option born in its group: no flat spelling
            key, cls = fields_of[name]
            raise ConfigError(f"loader() got an unexpected keyword argument {name!r}; it is an option of "
                              f"{cls.__name__}: pass {key}=fastfeed.{cls.__name__}({name}=...)")
        close = difflib.get_close_matches(name, known, n=1)
        hint = f"; did you mean {close[0]}=?" if close else "; see help(fastfeed.loader)"
        raise ConfigError(f"loader() got an unexpected keyword argument {name!r}{hint}")


def _as_group(key: str, value: Any) -> Any:
    cls = GROUPS[key]
    if value is None:
        return cls()
    if isinstance(value, cls):
        return value
    if isinstance(value, Mapping):
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(value) - names)
        if unknown:
            close = difflib.get_close_matches(unknown[0], names, n=1)
            hint = f"; did you mean {close[0]}?" if close else f"; {cls.__name__} has {', '.join(sorted(names))}"
            raise ConfigError(f"{key}={dict(value)!r}: {cls.__name__} has no option {unknown[0]!r}{hint}")
        return cls(**value)
    raise ConfigError(f"{key}={value!r}: pass a fastfeed.{cls.__name__}(...) (or a dict of its options)")


def _groups(kwargs: dict[str, Any], legacy: Mapping[str, Any], *, stacklevel: int) -> dict[str, Any]:
    """Every group as its object: given, built from a mapping, or the default; former spellings moved in."""
    out = {key: _as_group(key, kwargs.pop(key, None)) for key in GROUPS}
    moved: dict[str, dict[str, Any]] = {}
    for old, value in legacy.items():
        key, name = LEGACY[old]
        moved.setdefault(key, {})[name] = value
    for key, values in moved.items():
        cls = GROUPS[key]
        new = f"{key}=fastfeed.{cls.__name__}({', '.join(f'{n}=...' for n in values)})"
        olds = ", ".join(f"{o}=" for o, (k, _) in LEGACY.items() if k == key and o in legacy)
        if _changed(out[key]):
            raise ConfigError(f"loader() got {key}= and its former spelling {olds}; pass {new} only")
        warnings.warn(f"loader({olds}) is the former spelling of {new}; it still works in this release",
                      FutureWarning, stacklevel=stacklevel)
        out[key] = replace(out[key], **values)
    return out


def _changed(obj: Any) -> dict[str, Any]:
    """The fields of a group that differ from the defaults."""
    return {f.name: getattr(obj, f.name) for f in fields(obj) if getattr(obj, f.name) != f.default}


def _check_dali_can_honour(args: Mapping[str, Any]) -> None:
    values = {**args, **{f.name: getattr(args["workers"], f.name) for f in fields(Workers)}}
    for name, (accepted, why) in DALI_REFUSES.items():
        value = values[name]
        if not any(value is a or (plain(value) and value == a) for a in accepted):
            raise ConfigError(f"decode='dali' cannot honour {name}={value!r}: {why}")


def as_keywords(values: Mapping[str, Any]) -> dict[str, Any]:
    """``loader()`` keywords for options named by their flat or former names: the grouped ones
    as their group objects (what ``fastfeed.loader(path, **as_keywords(...))`` takes).

    Example:
        >>> as_keywords({"num_workers": 4, "prefetch_factor": 2})
        {'num_workers': 4, 'workers': Workers(prefetch_factor=2)}
    """
    out, grouped = _split(values)
    return {**out, **{key: GROUPS[key](**fields_) for key, fields_ in grouped.items()}}


def _split(values: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """``values`` by flat or former names as (flat options, {group: {field: value}})."""
    flat: dict[str, Any] = {}
    grouped: dict[str, dict[str, Any]] = {}
    for name, value in values.items():
        key, f, _ = find_option(name)
        if key is None:
            flat[name] = value
        else:
            grouped.setdefault(key, {})[f.name] = value
    return flat, grouped


def with_values(options: LoaderOptions, values: Mapping[str, Any]) -> LoaderOptions:
    """``options`` with some options set by their flat or former names (what a tune ``Setting`` holds).

    No warning: this is how tune's stored settings (``{"num_workers": 4, "num_threads": 2}``)
    reach a loader. The values are checked as if given to ``loader()``.

    Example:
        >>> o = with_values(loader_options(batch_size=4, rank=0, world_size=1), {"prefetch_factor": 4})
        >>> o.workers.prefetch_factor
        4
    """
    flat, grouped = _split(values)
    for name, value in flat.items():
        _, _, spec = find_option(name)
        flat[name] = spec.check(value, name) if spec.check is not None else value
    return replace(options, **flat, **{k: replace(getattr(options, k), **v) for k, v in grouped.items()})


def check_dali_knobs(knobs: Mapping[str, Any]) -> dict[str, Any]:
    """Validate DALI knob values (``num_threads``, ``hw_decoder_load``, ``prefetch_queue_depth``,
    ``num_pipelines``: integers >= 1, the load in [0, 1]) with :class:`Dali`'s own checks;
    ``"auto"`` (or None) stays ``"auto"``. Used for arguments and for stored tune results.

    Raises:
        ConfigError: a value out of range.

    Example:
        >>> check_dali_knobs({"num_threads": 4, "hw_decoder_load": None})
        {'num_threads': 4, 'hw_decoder_load': 'auto'}
    """
    return {name: _DALI_CHECKS[name](value, name) for name, value in knobs.items()}


def document(fn: Any) -> Any:
    """Write ``loader()``'s ``Args:`` lines of its flat options and groups from their definitions."""
    return fill_doc(fn, LoaderOptions, names=(*FLAT, *GROUPS))
