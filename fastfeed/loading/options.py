"""The loader's options: each defined once, validated once, for both backends.

``fastfeed.loader()`` keeps the common options flat (:class:`LoaderOptions`' plain fields:
``batch_size``, ``shuffle``, ``seed``, ``decode``, ``image_size``, ``augment``,
``num_workers``, ...) and groups the rest in frozen objects, each checked when it is built:

- :class:`Crop`: how an image becomes the output tensor (crop ranges, flips, the
  evaluation crop, the image field);
- :class:`Workers`: the DataLoader worker processes of ``decode="cpu"`` / None;
- :class:`Dali`: the options of ``decode="dali"`` only;
- :class:`Storage`: remote reads (fsspec options, the shard cache's bound);
- :class:`Tokens`: padded token batches;
- :class:`Order`: the shuffle window and the length of a mixed epoch;
- :class:`Source`: a dataset to read, with its weight and selection (to mix several).

Every option is a field made by :func:`fastfeed._options.option`: its type, default, check,
doc line, CLI flag and former flat spelling come from that one place. The docstrings of
the groups and of ``loader()``, the API reference, ``--help`` and the old spellings
(:data:`LEGACY`: ``crop_scale=`` still works for one release, with a ``FutureWarning``
naming ``crop=fastfeed.Crop(scale=...)``) are derived from it.

What applies where: ``decode="dali"`` has no worker processes and decodes with DALI, so
the options marked ``dali="refuse"`` (``num_workers``, ``transform``, most of
:class:`Workers`) are an error there unless neutral, with the reason (:data:`DALI_REFUSES`);
those marked ``dali="meets"`` are accepted and have no effect (:data:`DALI_MEETS`); a
:class:`Dali` group with another ``decode`` is an error. Anything else is an error that
names the closest option (``imagesize=`` -> "did you mean image_size=?").

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

from fastfeed._options import Spec, fill_doc, group, option, specs
from fastfeed._util import check_on_error
from fastfeed.dist import resolve_world
from fastfeed.errors import ConfigError
from fastfeed.loading.order import DEFAULT_SHUFFLE_BLOCK

# This module imports nothing that loads numpy or torch at import time: `fastfeed --help` builds
# its flags from these definitions. The checks import their helpers when they run.

__all__ = [
    "Crop",
    "DALI_MEETS",
    "DALI_ONLY",
    "DALI_REFUSES",
    "DECODES",
    "Dali",
    "GROUPS",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "LAYOUTS",
    "LEGACY",
    "LoaderOptions",
    "OUTPUTS",
    "Order",
    "Source",
    "Storage",
    "Tokens",
    "Workers",
    "as_sources",
    "check_dali_knobs",
    "check_source",
    "find_option",
    "loader_options",
    "with_values",
]

DECODES = ("cpu", "dali", None)
OUTPUTS = ("uint8", "float16", "float32")
LAYOUTS = ("NCHW", "NHWC")
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


# ---------------------------------------------------------------------- checks
def _int(name: str, value: Any, minimum: int, *, or_auto: bool = False) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        also = " (or 'auto')" if or_auto else ""
        raise ConfigError(f"{name}={value!r} must be an integer >= {minimum}{also}")
    return value


def _at_least(minimum: int, *, auto: bool = False, none: bool = False) -> Callable[[Any, str], Any]:
    """A check: an integer >= ``minimum``; ``"auto"`` and/or None kept as they are when allowed."""
    def check(value: Any, name: str) -> Any:
        if (auto and value == "auto") or (none and value is None):
            return value
        return _int(name, value, minimum, or_auto=auto)
    return check


def _flag(value: Any, name: str) -> bool:
    return bool(value)


def _auto_or_int(text: str) -> int | str:
    """The CLI's reading of ``auto`` or a number."""
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"{text!r}: write a number or auto") from None


def _triple(name: str, value: Sequence[float] | None) -> tuple[float, float, float] | None:
    if value is None:
        return None
    try:
        vals = tuple(float(v) for v in value)
    except (TypeError, ValueError):
        vals = ()
    if len(vals) != 3:
        raise ConfigError(f"{name}={value!r}: give one value per RGB channel, in the 0-1 scale")
    return vals  # type: ignore[return-value]


def _plain(value: Any) -> bool:
    """A number or a string (so ``0.0`` counts as ``0``, and ``False`` as nothing)."""
    return isinstance(value, (int, float, str)) and not isinstance(value, bool)


def _load(value: Any, name: str) -> Any:
    if value is None or value == "auto":
        return "auto"
    load = float(value) if _plain(value) and not isinstance(value, str) else -1.0
    if not 0.0 <= load <= 1.0:
        raise ConfigError(f"{name.rpartition('.')[2]}={value!r} must be in [0, 1] (or 'auto')")
    return load


def _knob(value: Any, name: str) -> Any:
    if value is None or value == "auto":
        return "auto"
    return _int(name.rpartition(".")[2], value, 1, or_auto=True)


def _device(value: Any, name: str) -> Any:
    if value is not None and value != "auto":
        _int("device_id", value, 0)
    return value


def _one_of(choices: Sequence[Any], what: str) -> Callable[[Any, str], Any]:
    def check(value: Any, name: str) -> Any:
        if value not in choices:
            raise ConfigError(f"{name.rpartition('.')[2]}={value!r} must be {what}")
        return value
    return check


def _callable_or_none(value: Any, name: str) -> Any:
    if value is not None and not callable(value):
        raise ConfigError(f"{name.rpartition('.')[2]}={value!r} is not callable; pass a function or None")
    return value


def _refuse(accepted: tuple[Any, ...], why: str) -> dict[str, Any]:
    """Spec extras: ``decode="dali"`` refuses values other than ``accepted``, for ``why``."""
    return {"dali": "refuse", "dali_accepts": accepted, "dali_why": why}


def _meets(why: str) -> dict[str, Any]:
    """Spec extras: ``decode="dali"`` serves the option's purpose itself (``why``): any value, no effect."""
    return {"dali": "meets", "dali_why": why}


# ---------------------------------------------------------------------- the groups
@group
class Crop:
    """How an image becomes the output tensor: the random-resized-crop ranges, flips, the evaluation crop.

    Both backends read it (``decode="cpu"`` and ``"dali"`` crop alike).

    Example:
        >>> fastfeed.Crop(scale=(0.35, 1.0), flip=False)          # doctest: +SKIP
        Crop(scale=(0.35, 1.0), flip=False)
    """

    scale: tuple[float, float] = option((0.08, 1.0), "RandomResizedCrop's range of the crop's area, as a "
                                        "share of the image's", legacy="crop_scale")
    ratio: tuple[float, float] = option((3 / 4, 4 / 3), "RandomResizedCrop's range of aspect ratios (width / "
                                        "height)", legacy="crop_ratio")
    flip: bool = option(True, "random horizontal flips when augmenting", check=_flag)
    fraction: float = option(0.875, "the evaluation crop (augment=False) as a share of the shorter side",
                             legacy="crop_fraction")
    image_field: str | None = option(None, "the field decoded as the image (default: the first of jpg, jpeg, "
                                     "png, webp, ... the dataset has)")

    def _check_together(self) -> dict[str, Any] | None:
        if all(getattr(self, f.name) == f.default for f in fields(self) if f.name in ("scale", "ratio", "fraction")):
            return None  # the defaults need no check (and are built at import, before numpy loads)
        from fastfeed.decode.geometry import check_crop  # numpy: not at import (see the imports)

        scale, ratio, fraction = check_crop(self.scale, self.ratio, self.fraction,
                                            names=("Crop.scale", "Crop.ratio", "Crop.fraction"))
        return {"scale": scale, "ratio": ratio, "fraction": fraction}


@group
class Workers:
    """The DataLoader worker processes of ``decode="cpu"`` / None, and their JPEG decoder.

    Their number is ``loader(num_workers=)``. ``decode="dali"`` has no worker processes: it
    refuses these options unless neutral, and ignores the ones its pipeline already serves.

    Example:
        >>> fastfeed.Workers(prefetch_factor=4, pin_memory=False)   # doctest: +SKIP
        Workers(prefetch_factor=4, pin_memory=False)
    """

    prefetch_factor: int | str | None = option(
        "auto", "batches in flight per worker; 'auto': a fastfeed tune result, else 2",
        check=_at_least(1, auto=True, none=True), flag="--prefetch-factor", parse=_auto_or_int, metavar="N",
        **_refuse(("auto", None), "DALI prepares batches ahead in its own queue; drop it and set "
                                  "dali=fastfeed.Dali(prefetch_queue_depth=...) (or leave it 'auto')"))
    pin_memory: bool | None = option(
        None, "copy batches into pinned memory for a fast copy to the GPU (default: when CUDA is available)",
        **_meets("batches come out of DALI's own buffers (on the GPU unless device_id=None)"))
    persistent_workers: bool = option(True, "keep the workers between epochs (ignored with 0 workers)", check=_flag,
                                      **_meets("the DALI pipeline lives as long as the loader"))
    timeout: float = option(0, "seconds to wait for a worker's batch before an error (0: forever)",
                            **_refuse((0, None), "DALI has no worker processes to wait for; drop it"))
    multiprocessing_context: Any = option(None, "DataLoader's start method for the workers ('fork', 'spawn', ...)",
                                          **_refuse((None,), "DALI starts no worker processes; drop it"))
    worker_init_fn: Callable[[int], None] | None = option(
        None, "called in each worker as it starts, with its id", check=_callable_or_none,
        **_refuse((None,), "DALI has no worker processes, so it would never run; drop it"))
    reuse_buffers: bool = option(
        True, "let persistent workers refill the shared-memory batches the main process has dropped, instead "
              "of a fresh buffer per batch (~0.2 ms of page faults per 224 px image where measured; see "
              "fastfeed.decode.bufpool); a batch you keep, or a view of it, is never refilled; pass False if "
              "you hand batches to another process without copying them", check=_flag,
        **_meets("each batch is DALI's own tensor, never refilled while you hold it"))
    decode_backend: str = option(
        "auto", "the CPU decoder's JPEG library: 'auto' (simplejpeg + OpenCV when installed), 'turbo', 'pillow'",
        **_refuse(("auto",), "it picks the CPU decoder's JPEG library, and DALI decodes with its own (nvJPEG "
                             "on the GPU); drop it"))


@group
class Dali:
    """The options of ``decode="dali"`` (NVIDIA DALI decodes on the GPU); an error with another ``decode``.

    ``"auto"`` knobs come from a ``fastfeed tune --decode dali`` result, else DALI's
    defaults (:mod:`fastfeed.loading.dali.backend`). ``mean`` / ``std`` default to
    ImageNet's for float outputs.

    Example:
        >>> fastfeed.Dali(num_threads=4, output="float16")        # doctest: +SKIP
        Dali(num_threads=4, output='float16', mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))
    """

    num_threads: int | str = option("auto", "DALI's CPU threads", check=_knob)
    hw_decoder_load: float | str = option("auto", "the share of JPEGs for the GPU's hardware decoder", check=_load)
    prefetch_queue_depth: int | str = option("auto", "batches DALI prepares ahead", check=_knob)
    num_pipelines: int | str = option("auto", "DALI pipelines fed in turn (they share num_threads)", check=_knob)
    device_id: int | str | None = option("auto", "the CUDA device DALI decodes on ('auto': the rank's; None: "
                                         "DALI on the CPU)", check=_device)
    output: str = option("uint8", "the image dtype of the batches: uint8, float16 or float32",
                         check=_one_of(OUTPUTS, "one of " + ", ".join(OUTPUTS)))
    mean: tuple[float, float, float] | None = option(None, "the normalisation of float outputs (0-1 scale; "
                                                     "default ImageNet's)")
    std: tuple[float, float, float] | None = option(None, "the normalisation of float outputs (0-1 scale; "
                                                    "default ImageNet's)")
    layout: str = option("NCHW", "NCHW or NHWC batches", check=_one_of(LAYOUTS, "'NCHW' or 'NHWC'"))

    def _check_together(self) -> dict[str, Any]:
        if self.output == "uint8" and (self.mean is not None or self.std is not None):
            raise ConfigError("mean/std normalise float outputs; pass output='float16' (or 'float32') with them")
        floats = self.output != "uint8"
        mean = _triple("mean", self.mean) or (IMAGENET_MEAN if floats else None)
        std = _triple("std", self.std) or (IMAGENET_STD if floats else None)
        if std is not None and min(std) <= 0:
            raise ConfigError(f"std={std} must be positive")
        return {"mean": mean, "std": std}

    @property
    def gpu(self) -> bool:
        """DALI decodes on a GPU (``device_id`` is not None)."""
        return self.device_id is not None


@group
class Storage:
    """Where remote shards come from (``s3://``, ``gs://``, ... through fsspec) and how much the cache holds.

    The cache's folder is ``loader(cache_dir=)``.

    Example:
        >>> fastfeed.Storage(options={"endpoint_url": "http://127.0.0.1:9000"}, cache_size="200GB")  # doctest: +SKIP
    """

    options: Mapping[str, Any] | None = option(None, "fsspec options (endpoint, credentials) for remote data",
                                               legacy="storage_options")
    cache_size: str | int = option("50GB", "bound of the shard cache (least recently used shards are evicted)")


def _pad_id(value: Any, name: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"pad_id={value!r} must be a token id (an integer >= 0), or None for the "
                          "pad id the dataset's tokenizer recorded (else 0)")
    return value


@group
class Tokens:
    """Padded token batches: a ``tokens`` field, or ragged arrays a ``transform`` returns.

    Example:
        >>> fastfeed.Tokens(pad_id=0, pad_multiple=8)              # doctest: +SKIP
        Tokens(pad_id=0, pad_multiple=8)
    """

    pad_id: int | None = option(None, "the value of padded input_ids (default: the pad id `pack --tokenizer` "
                                "stored, else 0)", check=_pad_id)
    pad_multiple: int = option(1, "round padded lengths up to a multiple of this", check=_at_least(1))


@group
class Order:
    """How an epoch is drawn beyond ``shuffle`` and ``seed``; part of every resume state.

    Example:
        >>> fastfeed.Order(shuffle_block=4096)                      # doctest: +SKIP
        Order(shuffle_block=4096)
    """

    shuffle_block: int = option(DEFAULT_SHUFFLE_BLOCK, "samples mixed together within a rank's share (larger: "
                                "closer to a full shuffle, more shards open at once)", check=_at_least(1))
    epoch_samples: int | None = option(None, "samples per epoch when mixing (default: the largest-weight dataset "
                                       "read once; smaller ones are cycled in complete reshuffled passes)",
                                       check=_at_least(1, none=True))


#: The group keywords of ``loader()``, in order, and their classes.
GROUPS: dict[str, type] = {"crop": Crop, "workers": Workers, "dali": Dali, "storage": Storage, "tokens": Tokens,
                           "order": Order}


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
                             flag="--batch-size", metavar="B")
    shuffle: bool = option(True, "a new order every epoch, a function of (seed, epoch, world size); False: "
                           "the stored order", check=_flag)
    seed: int = option(0, "the seed of the order and of the augmentation", check=_at_least(0))
    decode: str | None = option("cpu", "'cpu': JPEG decode and crops in worker processes; 'dali': on the GPU "
                                "through NVIDIA DALI (see Dali); None: raw bytes", flag="--decode",
                                choices=("cpu", "dali", "none"), parse=lambda text: None if text == "none" else text)
    image_size: tuple[int, int] | None = option(None, "the output size (an int or (height, width)): random-"
                                                "resized crops when augmenting, else a center crop; None: "
                                                "images as stored", flag="--image-size", metavar="PX")
    augment: bool = option(True, "random-resized crops and flips (see Crop); False: the evaluation crop",
                           check=_flag)
    num_workers: int | str = option(
        "auto", "DataLoader worker processes; 'auto': a fastfeed tune result for this dataset, host and batch "
                "shape, else a heuristic of the cores left per rank", flag="--num-workers", parse=_auto_or_int,
        metavar="N", **_refuse(("auto", 0), "DALI decodes in its own threads, not in DataLoader workers; drop it "
                                             "and set dali=fastfeed.Dali(num_threads=...) (or leave it 'auto')"))
    drop_last: bool = option(False, "drop the last incomplete batch of each rank", check=_flag)
    pad: bool = option(True, "with drop_last=False, repeat up to world_size - 1 samples so every rank's share "
                       "has the same size (flagged in batch['valid']); False: every sample exactly once (every "
                       "rank still runs the same number of steps, a last batch may be shorter or empty)",
                       check=_flag)
    rank: int = option(None, "this process's rank (default: torch.distributed, then RANK)")
    world_size: int = option(None, "the number of ranks (default: torch.distributed, then WORLD_SIZE)")
    cache_dir: str | os.PathLike[str] | None = option(
        None, "local cache for remote and gzipped shards, shared by the host's processes (see Storage)",
        flag="--cache-dir", metavar="DIR")
    on_error: str = option("raise", "a sample that fails to read or decode: 'raise' an error naming it, or "
                           "'skip' it (counted in loader.stats)", check=lambda v, name: check_on_error(v))
    transform: Callable[[dict[str, Any]], dict[str, Any]] | None = option(
        None, "fn(sample) -> sample, run in the workers after decoding each sample",
        **_refuse((None,), "a Python function per sample would undo GPU decoding; use augment and "
                           "dali=fastfeed.Dali(output=, mean=, std=), transform the batch in your training step, "
                           "or use decode='cpu'"))
    batch_sampler: Any = option(None, "a DistributedTokenBudgetSampler or DistributedLengthBucketSampler that "
                                "decides every batch (fastfeed.loading.cpu.sampled); one whole dataset")
    seq_len: int | None = option(None, "pack the epoch's documents (a tokens field) into rows of exactly this "
                                 "many tokens: input_ids, position_ids, valid, cu_seqlens "
                                 "(fastfeed.loading.cpu.tokens); one whole dataset")
    log_every: int | None = option(None, "log one stats line every N batches (off by default)")
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
    (spec.legacy or f.name): (key, f.name) for key, cls in GROUPS.items() for f, spec in specs(cls)}
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
_KNOBS = ("num_threads", "hw_decoder_load", "prefetch_queue_depth", "num_pipelines")


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
    from fastfeed.decode.geometry import normalize_image_size  # numpy, torch: not at import (see the imports)
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
    args.update(text_settings(args))  # seq_len, batch_sampler (and batch_size, rank, world_size from it)
    if args.get("batch_size") is None:
        raise ConfigError("loader() needs batch_size= (samples per batch on each rank)")
    decode = args["decode"]
    if decode not in DECODES:
        raise ConfigError(f"decode={decode!r}; use 'cpu', 'dali' or None (raw bytes)")
    if decode == "dali":
        _check_dali_can_honour(args)
        if args["image_size"] is None:
            raise ConfigError(
                "decode='dali' needs image_size= (an int or (height, width)): DALI delivers each "
                "batch as one tensor, so every image is cropped/resized to one size")
    elif _changed(args["dali"]):
        changed = _changed(args["dali"])
        shown = ", ".join(f"{k}={v!r}" for k, v in changed.items()) or "dali=Dali()"
        first = next(iter(changed), "num_threads")
        raise ConfigError(f"{shown}: option(s) of decode='dali' ({DALI_ONLY[first]}), not decode={decode!r}; "
                          "pass decode='dali' or drop them")
    rank, world_size = resolve_world(args["rank"], args["world_size"])
    for f, spec in _FLAT_SPECS:
        if spec.check is not None and f.name not in ("rank", "world_size"):
            args[f.name] = spec.check(args[f.name], f.name)
    args.update(batch_size=_int("batch_size", args["batch_size"], 1), rank=rank, world_size=world_size,
                image_size=normalize_image_size(args["image_size"]))
    return LoaderOptions(**args)


def _check_names(kwargs: Mapping[str, Any]) -> None:
    known = (*FLAT, *GROUPS, *LEGACY, *LEGACY_SOURCE)
    for name in kwargs:
        if name in known:
            continue
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
                      FutureWarning, stacklevel=stacklevel + 1)
        out[key] = replace(out[key], **values)
    return out


def _changed(obj: Any) -> dict[str, Any]:
    """The fields of a group that differ from the defaults."""
    return {f.name: getattr(obj, f.name) for f in fields(obj) if getattr(obj, f.name) != f.default}


def _check_dali_can_honour(args: Mapping[str, Any]) -> None:
    values = {**args, **{f.name: getattr(args["workers"], f.name) for f in fields(Workers)}}
    for name, (accepted, why) in DALI_REFUSES.items():
        value = values[name]
        if not any(value is a or (_plain(value) and value == a) for a in accepted):
            raise ConfigError(f"decode='dali' cannot honour {name}={value!r}: {why}")


def with_values(options: LoaderOptions, values: Mapping[str, Any]) -> LoaderOptions:
    """``options`` with some options set by their flat or former names (what a tune ``Setting`` holds).

    No warning: this is how tune's stored settings (``{"num_workers": 4, "num_threads": 2}``)
    reach a loader. The values are checked as if given to ``loader()``.

    Example:
        >>> o = with_values(loader_options(batch_size=4, rank=0, world_size=1), {"prefetch_factor": 4})
        >>> o.workers.prefetch_factor
        4
    """
    flat: dict[str, Any] = {}
    grouped: dict[str, dict[str, Any]] = {}
    for name, value in values.items():
        key, f, _ = find_option(name)
        if key is None:
            flat[name] = value
        else:
            grouped.setdefault(key, {})[f.name] = value
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
    from fastfeed.packed.index import DatasetIndex  # numpy: not at import (see the imports)

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
    from fastfeed.packed.index import DatasetIndex  # numpy: not at import (see the imports)

    one = (str, os.PathLike, DatasetIndex)
    if decode != "dali" or all(isinstance(s.path, one) for s in sources):
        return
    bad = next(s.path for s in sources if not isinstance(s.path, one))
    what = "a list of tars (an entry holding several)" if isinstance(bad, (list, tuple)) else type(bad).__name__
    raise ConfigError(
        f"decode='dali' reads packed datasets (a folder or URL with index.json; to mix, a list "
        f"of them), not {what}; pack the tars with `fastfeed pack` (it writes the DALI "
        "index files) or use decode='cpu'")


def document(fn: Any) -> Any:
    """Write ``loader()``'s ``Args:`` lines of its flat options and groups from their definitions."""
    return fill_doc(fn, LoaderOptions, names=(*FLAT, *GROUPS))
