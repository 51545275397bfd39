"""The loader's options: every ``fastfeed.loader()`` argument, validated once, for both backends.

:func:`loader_options` turns ``loader()``'s keyword arguments into one frozen
:class:`LoaderOptions`; ``decode="cpu"`` / ``None`` (:class:`fastfeed.loading.api.Loader`)
and ``decode="dali"`` (:class:`fastfeed.loading.dali.pipeline.DaliLoader`) both read it,
and nothing downstream checks an argument again. What applies where:

- **Both backends**: the order (``batch_size``, ``shuffle``, ``seed``, ``drop_last``,
  ``shuffle_block``, ``rank``, ``world_size``), the crops (``image_size``, ``augment``,
  ``crop_scale``, ``crop_ratio``, ``flip``, ``crop_fraction``, ``image_field``),
  ``on_error``, the reading (``cache_dir``, ``cache_size``, ``storage_options``) and
  ``log_every``.
- **CPU only** (DataLoader workers and the CPU decoder): ``decode="dali"`` has no worker
  processes and decodes with DALI. It refuses a value of :data:`DALI_REFUSES` other
  than the neutral ones, with the reason (``num_workers=8``: "DALI decodes in its own
  threads; set num_threads="), and takes :data:`DALI_MEETS` with any value, since its
  pipeline already does what they ask for (they have no effect there).
- **DALI only** (:data:`DALI_ONLY`: ``num_threads``, ``hw_decoder_load``,
  ``prefetch_queue_depth``, ``num_pipelines``, ``device_id``, ``output``, ``mean``, ``std``, ``layout``):
  an error with another ``decode``.
- **Anything else** is an error that names the closest option (``imagesize=`` ->
  "did you mean image_size?").

``num_workers`` / ``prefetch_factor`` ``"auto"`` are resolved by
:mod:`fastfeed.loading.auto`, the DALI knobs' ``"auto"`` by
:mod:`fastfeed.loading.dali.backend` (both from a stored tune result); a dataset-dependent
check (``drop_last`` needs one full batch per rank) is :meth:`LoaderOptions.check_fits`.

Example:
    >>> o = loader_options(batch_size=32, image_size=224, rank=0, world_size=1)
    >>> o.image_size, o.decode, o.on_error
    ((224, 224), 'cpu', 'raise')
    >>> loader_options(batch_size=32, imagesize=224)
    Traceback (most recent call last):
    ...
    fastfeed.errors.ConfigError: loader() got an unexpected keyword argument 'imagesize'; did you mean image_size=?
"""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass, fields
from typing import Any, Callable, Mapping, Sequence

from fastfeed._util import check_on_error
from fastfeed.decode.geometry import check_crop, normalize_image_size
from fastfeed.dist import resolve_world
from fastfeed.errors import ConfigError
from fastfeed.loading.order.epoch import DEFAULT_SHUFFLE_BLOCK
from fastfeed.loading.textopts import text_settings
from fastfeed.packed.index import DatasetIndex

__all__ = [
    "DALI_MEETS",
    "DALI_ONLY",
    "DALI_REFUSES",
    "DECODES",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "LAYOUTS",
    "LoaderOptions",
    "OUTPUTS",
    "check_dali_knobs",
    "check_source",
    "loader_options",
]

DECODES = ("cpu", "dali", None)
OUTPUTS = ("uint8", "float16", "float32")
LAYOUTS = ("NCHW", "NHWC")
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

#: Options of the CPU path that ``decode="dali"`` cannot honour: name -> (the values it
#: accepts, which are those that ask for nothing, and why the others cannot work).
DALI_REFUSES: dict[str, tuple[tuple[Any, ...], str]] = {
    "transform": ((None,), "a Python function per sample would undo GPU decoding; use augment/output/"
                           "mean/std, transform the batch in your training step, or use decode='cpu'"),
    "worker_init_fn": ((None,), "DALI has no worker processes, so it would never run; drop it"),
    "num_workers": (("auto", 0), "DALI decodes in its own threads, not in DataLoader workers; drop it "
                                 "and set num_threads= (or leave it 'auto')"),
    "prefetch_factor": (("auto", None), "DALI prepares batches ahead in its own queue; drop it and set "
                                        "prefetch_queue_depth= (or leave it 'auto')"),
    "multiprocessing_context": ((None,), "DALI starts no worker processes; drop it"),
    "timeout": ((0, None), "DALI has no worker processes to wait for; drop it"),
    "decode_backend": (("auto",), "it picks the CPU decoder's JPEG library, and DALI decodes with its own "
                                  "(nvJPEG on the GPU); drop it"),
}
#: Options of the CPU path whose purpose DALI's pipeline serves by itself: accepted with
#: any value under ``decode="dali"``, where they have no effect.
DALI_MEETS: dict[str, str] = {
    "pin_memory": "batches come out of DALI's own buffers (on the GPU unless device_id=None)",
    "persistent_workers": "the DALI pipeline lives as long as the loader",
    "reuse_buffers": "each batch is DALI's own tensor, never refilled while you hold it",
}
#: Options only ``decode="dali"`` takes, and what they are.
DALI_ONLY: dict[str, str] = {
    "num_threads": "DALI's CPU threads",
    "hw_decoder_load": "the share of JPEGs for the GPU's hardware decoder",
    "prefetch_queue_depth": "batches DALI prepares ahead",
    "num_pipelines": "DALI pipelines fed in turn (they share num_threads)",
    "device_id": "the CUDA device DALI decodes on",
    "output": "the image dtype of DALI batches",
    "mean": "the normalisation of DALI's float outputs",
    "std": "the normalisation of DALI's float outputs",
    "layout": "NCHW or NHWC DALI batches",
}
_KNOBS = ("num_threads", "hw_decoder_load", "prefetch_queue_depth", "num_pipelines")


@dataclass(frozen=True)
class LoaderOptions:
    """``loader()``'s arguments, validated (build it with :func:`loader_options`).

    The defaults are ``fastfeed.loader()``'s. ``rank`` / ``world_size`` are resolved;
    ``num_workers``, ``prefetch_factor`` and the DALI knobs may still be ``"auto"``
    (the backend resolves them against the dataset); ``knobs_from`` says where the DALI
    knobs came from (``"explicit"``, ``"tuned"``, ``"default"``).
    """

    #: always an int once validated; None (the default) only in ``loader()``'s signature, where a
    #: ``batch_sampler`` may give it
    batch_size: int = None  # type: ignore[assignment]
    # the order (part of every resume state)
    shuffle: bool = True
    seed: int = 0
    drop_last: bool = False
    shuffle_block: int = DEFAULT_SHUFFLE_BLOCK
    rank: int = 0
    world_size: int = 1
    # what a batch is
    decode: str | None = "cpu"
    image_size: tuple[int, int] | None = None
    augment: bool = True
    crop_scale: tuple[float, float] = (0.08, 1.0)
    crop_ratio: tuple[float, float] = (3 / 4, 4 / 3)
    flip: bool = True
    crop_fraction: float = 0.875
    image_field: str | None = None
    on_error: str = "raise"
    # reading and reporting
    cache_dir: str | os.PathLike[str] | None = None
    cache_size: str | int = "50GB"
    storage_options: Mapping[str, Any] | None = None
    log_every: int | None = None
    # the CPU path: DataLoader workers and the CPU decoder
    transform: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    decode_backend: str = "auto"
    num_workers: int | str = "auto"
    prefetch_factor: int | str | None = "auto"
    pin_memory: bool | None = None
    persistent_workers: bool = True
    timeout: float = 0
    multiprocessing_context: Any = None
    worker_init_fn: Callable[[int], None] | None = None
    reuse_buffers: bool = True
    # decode="dali"
    num_threads: int | str = "auto"
    hw_decoder_load: float | str = "auto"
    prefetch_queue_depth: int | str = "auto"
    num_pipelines: int | str = "auto"
    device_id: int | str | None = "auto"
    output: str = "uint8"
    mean: tuple[float, float, float] | None = None
    std: tuple[float, float, float] | None = None
    layout: str = "NCHW"
    # text (fastfeed.loading.textopts): sequence packing, padding, a balanced batch sampler
    seq_len: int | None = None
    pad_id: int | None = None
    pad_multiple: int = 1
    batch_sampler: Any = None
    knobs_from: str = "explicit"
    # several datasets, subsets and exact-once evaluation (fastfeed.loading.order.rankplan)
    weights: tuple[float, ...] | None = None
    epoch_samples: int | None = None
    subset: Any = None
    filter: Any = None
    pad: bool = True

    @property
    def gpu(self) -> bool:
        """DALI decodes on a GPU (``device_id`` is not None)."""
        return self.device_id is not None

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


_NAMES = tuple(f.name for f in fields(LoaderOptions) if f.name != "knobs_from")
# rank / world_size left out are resolved (torch.distributed, then the environment)
_DEFAULTS = {**{f.name: f.default for f in fields(LoaderOptions) if f.name != "batch_size"},
             "rank": None, "world_size": None, "batch_size": None}


def loader_options(**kwargs: Any) -> LoaderOptions:
    """Validate ``loader()``'s keyword arguments into :class:`LoaderOptions` (see the module docstring).

    ``rank`` / ``world_size`` left out or None are resolved by :func:`fastfeed.dist.resolve_world`.

    Raises:
        ConfigError: an invalid value, an option the chosen ``decode`` cannot honour, or an
            unknown name (with the closest known one).

    Example:
        >>> loader_options(batch_size=4, num_threads=2, decode="dali", image_size=16, rank=0,
        ...                world_size=1).num_threads
        2
    """
    _check_names(kwargs)
    args = {**_DEFAULTS, **kwargs}
    args.update(text_settings(args))  # seq_len, pad_id, pad_multiple, batch_sampler (and batch_size from it)
    if args.get("batch_size") is None:
        raise ConfigError("loader() needs batch_size= (samples per batch on each rank)")
    decode = args["decode"]
    if decode not in DECODES:
        raise ConfigError(f"decode={decode!r}; use 'cpu', 'dali' or None (raw bytes)")
    if decode == "dali":
        _check_dali_can_honour(args)
    else:
        given = sorted(k for k in kwargs if k in DALI_ONLY)
        if given:
            raise ConfigError(
                f"{', '.join(f'{k}={kwargs[k]!r}' for k in given)}: option(s) of decode='dali' "
                f"({DALI_ONLY[given[0]]}), not decode={decode!r}; pass decode='dali' or drop them")
    scale, ratio, fraction = check_crop(args["crop_scale"], args["crop_ratio"], args["crop_fraction"])
    rank, world_size = resolve_world(args["rank"], args["world_size"])
    args.update(
        batch_size=_int("batch_size", args["batch_size"], 1),
        seed=_int("seed", args["seed"], 0),
        shuffle_block=_int("shuffle_block", args["shuffle_block"], 1),
        shuffle=bool(args["shuffle"]), drop_last=bool(args["drop_last"]), augment=bool(args["augment"]),
        flip=bool(args["flip"]), rank=rank, world_size=world_size,
        on_error=check_on_error(args["on_error"]),
        image_size=normalize_image_size(args["image_size"]),
        crop_scale=scale, crop_ratio=ratio, crop_fraction=fraction,
    )
    if decode == "dali":
        args.update(_dali_settings(args))
    args.update(_mixing_settings(args))
    return LoaderOptions(**args)


def check_dali_knobs(knobs: Mapping[str, Any]) -> dict[str, Any]:
    """Validate DALI knob values (``num_threads``, ``hw_decoder_load``, ``prefetch_queue_depth``,
    ``num_pipelines``: integers >= 1, the load in [0, 1]);
    ``"auto"`` (or None) stays ``"auto"``. Used for arguments and for stored tune results.

    Raises:
        ConfigError: a value out of range.

    Example:
        >>> check_dali_knobs({"num_threads": 4, "hw_decoder_load": None})
        {'num_threads': 4, 'hw_decoder_load': 'auto'}
    """
    out: dict[str, Any] = {}
    for name, value in knobs.items():
        if value is None or value == "auto":
            out[name] = "auto"
        elif name == "hw_decoder_load":
            load = float(value) if _plain(value) and not isinstance(value, str) else -1.0
            if not 0.0 <= load <= 1.0:
                raise ConfigError(f"hw_decoder_load={value!r} must be in [0, 1] (or 'auto')")
            out[name] = load
        else:
            out[name] = _int(name, value, 1, or_auto=True)
    return out


def check_source(path_or_url: Any, decode: str | None, weights: Any = None) -> None:
    """``decode="dali"`` reads packed datasets (their DALI index files), not a list of tars:
    one (a folder, a URL or a loaded :class:`~fastfeed.packed.index.DatasetIndex`), or with
    ``weights`` a list of them to mix.

    Example:
        >>> check_source("/data/ff", "dali")
        >>> check_source(["/data/a", "/data/b"], "dali", weights=[1, 1])
    """
    one = (str, os.PathLike, DatasetIndex)
    listed = isinstance(path_or_url, (list, tuple))
    if decode != "dali" or isinstance(path_or_url, one) or \
            (listed and weights is not None and all(isinstance(p, one) for p in path_or_url)):
        return
    what = "a list of tars (an entry holding several)" if listed else type(path_or_url).__name__
    raise ConfigError(
        f"decode='dali' reads packed datasets (a folder or URL with index.json; with weights=, a list "
        f"of them), not {what}; pack the tars with `fastfeed pack` (it writes the DALI "
        "index files) or use decode='cpu'")


# ---------------------------------------------------------------------- pieces
def _int(name: str, value: Any, minimum: int, *, or_auto: bool = False) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        also = " (or 'auto')" if or_auto else ""
        raise ConfigError(f"{name}={value!r} must be an integer >= {minimum}{also}")
    return value


def _check_names(kwargs: Mapping[str, Any]) -> None:
    for name in kwargs:
        if name in _NAMES:
            continue
        close = difflib.get_close_matches(name, _NAMES, n=1)
        hint = f"; did you mean {close[0]}=?" if close else "; see help(fastfeed.loader)"
        raise ConfigError(f"loader() got an unexpected keyword argument {name!r}{hint}")


def _check_dali_can_honour(args: Mapping[str, Any]) -> None:
    for name, (accepted, why) in DALI_REFUSES.items():
        value = args[name]
        if not any(value is a or (_plain(value) and value == a) for a in accepted):
            raise ConfigError(f"decode='dali' cannot honour {name}={value!r}: {why}")


def _plain(value: Any) -> bool:
    """A number or a string (so ``0.0`` counts as ``0``, and ``False`` as nothing)."""
    return isinstance(value, (int, float, str)) and not isinstance(value, bool)


def _triple(name: str, value: Sequence[float] | None, default: tuple[float, float, float] | None,
            ) -> tuple[float, float, float] | None:
    if value is None:
        return default
    try:
        vals = tuple(float(v) for v in value)
    except (TypeError, ValueError):
        vals = ()
    if len(vals) != 3:
        raise ConfigError(f"{name}={value!r}: give one value per RGB channel, in the 0-1 scale")
    return vals  # type: ignore[return-value]


def _mixing_settings(args: Mapping[str, Any]) -> dict[str, Any]:
    """``weights``, ``epoch_samples``, ``subset``, ``filter`` and ``pad``, checked as far as
    they can be without the datasets (their number and sizes are checked at plan time)."""
    weights = args["weights"]
    if weights is not None:
        try:
            ws = tuple(float(w) for w in weights)
        except (TypeError, ValueError):
            ws = ()
        if not ws or any(not w > 0 or w == float("inf") for w in ws) or isinstance(weights, (str, bytes)):
            raise ConfigError(f"weights={weights!r}: give one positive number per dataset, e.g. [0.7, 0.3] "
                              "(they are normalised)")
        weights = ws
    e = args["epoch_samples"]
    if e is not None:
        _int("epoch_samples", e, 1)
    filt = args["filter"]
    for f in filt if isinstance(filt, (list, tuple)) else [filt]:
        if f is not None and not callable(f):
            raise ConfigError(f"filter={f!r} is not callable; pass fn(meta) -> bool mask (or one per dataset)")
    return {"weights": weights, "pad": bool(args["pad"])}


def _dali_settings(args: Mapping[str, Any]) -> dict[str, Any]:
    """The checked DALI-only settings (mean/std default to ImageNet's for float outputs)."""
    if args["image_size"] is None:
        raise ConfigError(
            "decode='dali' needs image_size= (an int or (height, width)): DALI delivers each "
            "batch as one tensor, so every image is cropped/resized to one size")
    output, layout = args["output"], args["layout"]
    if output not in OUTPUTS:
        raise ConfigError(f"output={output!r} must be one of {', '.join(OUTPUTS)}")
    if layout not in LAYOUTS:
        raise ConfigError(f"layout={layout!r} must be 'NCHW' or 'NHWC'")
    mean, std = args["mean"], args["std"]
    if output == "uint8" and (mean is not None or std is not None):
        raise ConfigError("mean/std normalise float outputs; pass output='float16' (or 'float32') with them")
    floats = output != "uint8"
    mean = _triple("mean", mean, IMAGENET_MEAN if floats else None)
    std = _triple("std", std, IMAGENET_STD if floats else None)
    if std is not None and min(std) <= 0:
        raise ConfigError(f"std={std} must be positive")
    device = args["device_id"]
    if device is not None and device != "auto":
        _int("device_id", device, 0)
    return {"mean": mean, "std": std, **check_dali_knobs({k: args[k] for k in _KNOBS})}
