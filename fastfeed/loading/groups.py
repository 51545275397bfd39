"""The grouped options of ``fastfeed.loader()``: frozen objects, each checked when it is built.

- :class:`Crop`: how an image becomes the output tensor (crop ranges, flips, the
  evaluation crop, the image field);
- :class:`Workers`: the DataLoader worker processes of ``decode="cpu"`` / None;
- :class:`Dali`: the options of ``decode="dali"`` only;
- :class:`Storage`: remote reads (fsspec options, the shard cache's bound, timeouts and retries);
- :class:`Tokens`: padded token batches;
- :class:`Order`: the shuffle window and the length of a mixed epoch.

Each field is made by :func:`fastfeed._options.option`: its type, default, check, doc line,
former flat spelling and what ``decode="dali"`` makes of it (:func:`dali_refuses`,
:func:`dali_meets`) are written once, here. :mod:`fastfeed.loading.options` puts the groups
beside ``loader()``'s flat options; :data:`GROUPS` names them by their keyword.

This module imports nothing that loads numpy or torch at import time: ``fastfeed --help``
builds its flags from these definitions. A check imports its helpers when it runs.

Example:
    >>> Crop(scale=(0.35, 1)).scale, Workers().prefetch_factor, Dali(output="float16").mean
    ((0.35, 1.0), 'auto', (0.485, 0.456, 0.406))
    >>> Order(shuffle_block=0)
    Traceback (most recent call last):
    ...
    fastfeed.errors.ConfigError: Order.shuffle_block=0 must be an integer >= 1
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any, Callable, Mapping, Sequence

from fastfeed._options import (
    MAX_COUNT,
    as_bool,
    at_least,
    auto_or_int,
    callable_or_none,
    check_int,
    group,
    mapping_or_none,
    number,
    one_of,
    option,
    text_or_none,
)
from fastfeed._util import parse_size
from fastfeed.errors import ConfigError
from fastfeed.loading.order import DEFAULT_SHUFFLE_BLOCK
from fastfeed.storage.retry import check_retries, check_timeout

__all__ = ["BUCKET_CROPS", "Crop", "Dali", "GROUPS", "IMAGENET_MEAN", "IMAGENET_STD", "LAYOUTS", "OUTPUTS", "Order",
           "Storage", "Tokens", "Workers", "dali_meets", "dali_refuses", "plain"]

OUTPUTS = ("uint8", "float16", "float32")
#: ``Crop(bucket_crop=)``: the placements of :data:`fastfeed.decode.geometry.CROPS` (kept here, numpy-free).
BUCKET_CROPS = ("random", "center")
LAYOUTS = ("NCHW", "NHWC")
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


# ---------------------------------------------------------------------- checks of the groups
def _triple(name: str, value: Sequence[float] | None) -> tuple[float, float, float] | None:
    if value is None:
        return None
    try:
        vals = tuple(float(v) for v in value)
    except (TypeError, ValueError, OverflowError):  # OverflowError: an int too large for a float
        vals = ()
    if len(vals) != 3:
        raise ConfigError(f"{name}={value!r}: give one value per RGB channel, in the 0-1 scale")
    return vals  # type: ignore[return-value]


def plain(value: Any) -> bool:
    """A number or a string (so ``0.0`` counts as ``0``, and ``False`` as nothing)."""
    return isinstance(value, (int, float, str)) and not isinstance(value, bool)


def _load(value: Any, name: str) -> Any:
    if value is None or (isinstance(value, str) and value == "auto"):
        return "auto"
    # compared before float(): an int too large for a float (10**400) is out of range, not an OverflowError
    load = value if plain(value) and not isinstance(value, str) else -1.0
    if not 0.0 <= load <= 1.0:
        raise ConfigError(f"{name}={value!r} must be in [0, 1] (or 'auto')")
    return float(load)


def _knob(value: Any, name: str) -> Any:
    if value is None or (isinstance(value, str) and value == "auto"):
        return "auto"
    return check_int(name, value, 1, or_auto=True, most=1024)


def _device(value: Any, name: str) -> Any:
    if value is not None and not (isinstance(value, str) and value == "auto"):
        return check_int(name, value, 0, most=1023)
    return value


def _pin_memory(value: Any, name: str) -> bool | None:
    return None if value is None else as_bool(value, name)


def _start_method(value: Any, name: str) -> Any:
    """None, a start method's name, or a ``multiprocessing`` context (anything with ``Process``)."""
    import multiprocessing as mp  # the standard library's: loads no numpy or torch

    if value is None or hasattr(value, "Process"):
        return value
    methods = mp.get_all_start_methods()
    if not isinstance(value, str) or value not in methods:
        raise ConfigError(f"{name}={value!r}: pass one of {', '.join(map(repr, methods))}, a "
                          "multiprocessing context (multiprocessing.get_context(...)), or None")
    return value


def _worker_timeout(value: Any, name: str) -> float:
    """DataLoader's ``timeout``: seconds >= 0 (None: 0, forever)."""
    return 0.0 if value is None else float(number(0, unit="seconds; 0: forever")(value, name) or 0.0)


def _cache_size(value: Any, name: str) -> Any:
    parse_size(value, name)  # checked here; the cache parses it again where it is built
    return value


#: The JPEG libraries of the CPU decoder (fastfeed.decode.path.BACKENDS, written here so that
#: this module loads no torch at import; tests/test_public_errors.py checks they agree).
DECODE_BACKENDS = ("auto", "turbo", "pillow")


def _seconds(value: Any, name: str) -> float | None:
    return None if value is None else check_timeout(value, name)


def _retries(value: Any, name: str) -> int | None:
    return None if value is None else check_retries(value, name)


def dali_refuses(accepted: tuple[Any, ...], why: str) -> dict[str, Any]:
    """Spec extras: ``decode="dali"`` refuses values other than ``accepted``, for ``why``.

    Example:
        >>> dali_refuses((None,), "DALI starts no worker processes")["dali"]
        'refuse'
    """
    return {"dali": "refuse", "dali_accepts": accepted, "dali_why": why}


def dali_meets(why: str) -> dict[str, Any]:
    """Spec extras: ``decode="dali"`` serves the option's purpose itself (``why``): any value, no effect.

    Example:
        >>> dali_meets("the DALI pipeline lives as long as the loader")["dali"]
        'meets'
    """
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
    flip: bool = option(True, "random horizontal flips when augmenting", check=as_bool)
    fraction: float = option(0.875, "the evaluation crop (augment=False) as a share of the shorter side",
                             legacy="crop_fraction")
    image_field: str | None = option(None, "the field decoded as the image (default: the first of jpg, jpeg, "
                                     "png, webp, ... the dataset has)", check=text_or_none)
    bucket_crop: str = option("random", "with an aspect-ratio batch_sampler, where the image resized to cover its "
                              "bucket is cropped when augmenting: 'random' or 'center' (augment=False: the center)",
                              check=one_of(BUCKET_CROPS, "'random' or 'center'"))

    def _check_together(self) -> dict[str, Any] | None:
        if all(getattr(self, f.name) is f.default for f in fields(self) if f.name in ("scale", "ratio", "fraction")):
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
    ``stall_timeout`` and ``on_stall`` watch both loops: the workers' batches, and DALI's.

    Example:
        >>> fastfeed.Workers(prefetch_factor=4, pin_memory=False)   # doctest: +SKIP
        Workers(prefetch_factor=4, pin_memory=False)
    """

    prefetch_factor: int | str | None = option(
        "auto", "batches in flight per worker; 'auto': a fastfeed tune result, else 2",
        check=at_least(1, auto=True, none=True, most=MAX_COUNT), flag="--prefetch-factor", parse=auto_or_int,
        metavar="N",
        **dali_refuses(("auto", None), "DALI prepares batches ahead in its own queue; drop it and set "
                                  "dali=fastfeed.Dali(prefetch_queue_depth=...) (or leave it 'auto')"))
    pin_memory: bool | None = option(
        None, "copy batches into pinned memory for a fast copy to the GPU (default: when CUDA is available)",
        check=_pin_memory,
        **dali_meets("batches come out of DALI's own buffers (on the GPU unless device_id=None)"))
    persistent_workers: bool = option(True, "keep the workers between epochs (ignored with 0 workers)", check=as_bool,
                                      **dali_meets("the DALI pipeline lives as long as the loader"))
    timeout: float = option(0, "seconds to wait for a worker's batch before an error (0: forever)",
                            check=_worker_timeout,
                            **dali_refuses((0, None), "DALI has no worker processes to wait for; drop it"))
    multiprocessing_context: Any = option(None, "DataLoader's start method for the workers ('fork', 'spawn', ...)",
                                          check=_start_method,
                                          **dali_refuses((None,), "DALI starts no worker processes; drop it"))
    worker_init_fn: Callable[[int], None] | None = option(
        None, "called in each worker as it starts, with its id", check=callable_or_none,
        **dali_refuses((None,), "DALI has no worker processes, so it would never run; drop it"))
    reuse_buffers: bool = option(
        True, "let persistent workers refill the shared-memory batches the main process has dropped, instead "
              "of a fresh buffer per batch (~0.2 ms of page faults per 224 px image where measured; see "
              "fastfeed.decode.bufpool); a batch you keep, or a view of it, is never refilled; pass False if "
              "you hand batches to another process without copying them", check=as_bool,
        **dali_meets("each batch is DALI's own tensor, never refilled while you hold it"))
    decode_backend: str = option(
        "auto", "the CPU decoder's JPEG library: 'auto' (simplejpeg + OpenCV when installed), 'turbo', 'pillow'",
        check=one_of(DECODE_BACKENDS, "'auto', 'turbo' or 'pillow'"),
        **dali_refuses(("auto",), "it picks the CPU decoder's JPEG library, and DALI decodes with its own (nvJPEG "
                             "on the GPU); drop it"))
    stall_timeout: float | str | None = option(
        120.0, "seconds the training loop may wait for a batch before the watchdog names the worker that holds "
               "it up, its state (stopped, in disk wait, reading which shard since when, alive but slow) and "
               "the shard (decode='dali': the pipeline); a number or '5m'; None: no watchdog", check=_seconds,
        legacy="")
    on_stall: str = option(
        "log", "what a stall does: 'log' (one warning when the wait passes stall_timeout, again every 5 "
               "minutes while it lasts) or 'raise' (a fastfeed.errors.StallError; with num_workers=0 it logs)",
        check=one_of(("log", "raise"), "'log' or 'raise'"), legacy="")
    autotune: bool = option(
        True, "with num_workers='auto' (a tune result or the heuristic, at least 1 worker): keep tuning while "
              "training runs: when the loop waits for data over 2% of step time, a deeper prefetch_factor at "
              "once and more workers from the next epoch (up to the cores the host has left for them), each "
              "change logged with the figure that caused it; the order of batches and resume do not change "
              "(fastfeed.loading.autotune); False: keep the setting", check=as_bool, legacy="")


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
                         check=one_of(OUTPUTS, "one of " + ", ".join(OUTPUTS)))
    mean: tuple[float, float, float] | None = option(None, "the normalisation of float outputs (0-1 scale; "
                                                     "default ImageNet's)")
    std: tuple[float, float, float] | None = option(None, "the normalisation of float outputs (0-1 scale; "
                                                    "default ImageNet's)")
    layout: str = option("NCHW", "NCHW or NHWC batches", check=one_of(LAYOUTS, "'NCHW' or 'NHWC'"))

    def _check_together(self) -> dict[str, Any]:
        if self.output == "uint8" and (self.mean is not None or self.std is not None):
            raise ConfigError("Dali(mean=, std=) normalise float outputs; pass output='float16' (or 'float32') with them")
        floats = self.output != "uint8"
        mean = _triple("Dali.mean", self.mean) or (IMAGENET_MEAN if floats else None)
        std = _triple("Dali.std", self.std) or (IMAGENET_STD if floats else None)
        if std is not None and min(std) <= 0:
            raise ConfigError(f"Dali.std={std} must be positive")
        return {"mean": mean, "std": std}

    @property
    def gpu(self) -> bool:
        """DALI decodes on a GPU (``device_id`` is not None)."""
        return self.device_id is not None


@group
class Storage:
    """Where remote shards come from (``s3://``, ``gs://``, ... through fsspec), how much the cache holds,
    and how long a remote read may stall.

    The cache's folder is ``loader(cache_dir=)``. A store that stops answering costs at most
    ``(retries + 1) * timeout`` plus the backoff per read (about 6.5 minutes with the
    defaults), then a :class:`~fastfeed.errors.RemoteError` names the URL and the fix.

    Example:
        >>> fastfeed.Storage(options={"endpoint_url": "http://127.0.0.1:9000"}, cache_size="200GB")  # doctest: +SKIP
        >>> Storage(timeout="2m", retries=8)
        Storage(timeout=120.0, retries=8)
    """

    options: Mapping[str, Any] | None = option(None, "fsspec options (endpoint, credentials) for remote data",
                                               check=mapping_or_none, legacy="storage_options")
    cache_size: str | int = option("50GB", "bound of the shard cache (least recently used shards are evicted)",
                                   check=_cache_size)
    timeout: float | str | None = option(
        None, "seconds a remote connect or read may go without progress before it is given up and retried (a "
              "number or '90s'); None: $FASTFEED_STORAGE_TIMEOUT, else 60", check=_seconds,
        legacy="")
    retries: int | None = option(
        None, "tries after the first of a remote read that failed or timed out, with backoff (1 s, doubling, at "
              "most 30 s); then a RemoteError names the URL; None: $FASTFEED_STORAGE_RETRIES, else 5",
        check=_retries, legacy="")
    verify: bool = option(
        True, "check every sample read against the checksum `fastfeed pack` recorded (a mismatch is a SampleError "
              "naming shard and key, or a counted skip with on_error='skip'); False: read unchecked (saves ~1% of the "
              "CPU per image)", check=as_bool, legacy="")


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
    pad_multiple: int = option(1, "round padded lengths up to a multiple of this", check=at_least(1, most=1 << 20))


@group
class Order:
    """How an epoch is drawn beyond ``shuffle`` and ``seed``; part of every resume state.

    Example:
        >>> fastfeed.Order(shuffle_block=4096)                      # doctest: +SKIP
        Order(shuffle_block=4096)
    """

    shuffle_block: int = option(DEFAULT_SHUFFLE_BLOCK, "samples mixed together within a rank's share (larger: "
                                "closer to a full shuffle, more shards open at once)",
                                check=at_least(1, most=MAX_COUNT))
    epoch_samples: int | None = option(None, "samples per epoch when mixing (default: the largest-weight dataset "
                                       "read once; smaller ones are cycled in complete reshuffled passes)",
                                       check=at_least(1, none=True, most=MAX_COUNT))


#: The group keywords of ``loader()``, in order, and their classes.
#: The group keywords of ``loader()``, in order, and their classes.
GROUPS: dict[str, type] = {"crop": Crop, "workers": Workers, "dali": Dali, "storage": Storage, "tokens": Tokens,
                           "order": Order}
