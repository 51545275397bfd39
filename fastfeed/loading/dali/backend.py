"""``decode="dali"``: GPU image decoding through NVIDIA DALI, behind fastfeed's loader API.

``fastfeed.loader(path, decode="dali", ...)`` returns a :class:`DaliLoader`: the same
order, batches, ``len``, ``set_epoch``, ``stats`` and ``state_dict`` as ``decode="cpu"``,
with JPEGs decoded on the GPU (nvJPEG and the hardware JPEG decoder, ``device="mixed"``)
and batches delivered as CUDA tensors.

How it works:

- **Reading**: the DALI index files ``fastfeed pack`` writes next to each tar shard say
  where every image's bytes are (no scanning); shards are memory-mapped and each batch
  is handed to DALI's ``external_source`` as zero-copy views.
- **Order**: fastfeed's own epoch plan (:mod:`fastfeed.loading.plan`), the one the CPU path
  uses: a pure function of (seed, epoch, world size), shuffled anew every epoch, every
  sample once per epoch across ranks, the same number of batches on every rank
  (``drop_last=False`` repeats at most ``world_size - 1`` samples, ``True`` drops the
  remainder). DALI's own ``fn.readers.webdataset`` is not used for this: its shuffle is
  a buffer seeded once per pipeline, its ``shard_id`` split gives ranks unequal counts,
  and it cannot start mid-epoch.
- **Epochs**: one pipeline streams epoch after epoch (the next epoch's first batches
  are decoded while the current one ends, so there is no refill bubble); ``set_epoch``
  to anything else, or a new ``iter()`` mid-epoch, restarts the feed and discards the
  few batches already in flight.
- **Resume**: ``state_dict()`` is a few integers (epoch, batches consumed, the world
  shape, the seed, the dataset fingerprint); ``load_state_dict()`` in a fresh process
  continues with exactly the remaining batches of the epoch, in the same order, at any
  batch (and is interchangeable with ``decode="cpu"``'s). The random crops and flips are
  DALI's (``fn.decoders.image_random_crop``, ``fn.random.coin_flip``): they are drawn
  from the pipeline's generator, seeded from (seed, rank, epoch, batch) when the
  pipeline is built, so they are reproducible for a run that starts at the same point,
  but not bit-identical to the CPU path's or to an uninterrupted run after a resume.
- **Pipeline**: random-crop decode (ROI decode: only the crop is decoded) -> resize to
  ``image_size`` -> random flip -> ``crop_mirror_normalize`` to uint8 or float16,
  NCHW or NHWC. Without ``augment``: the CPU path's evaluation crop box (the central
  ``crop_fraction`` of the shorter side, computed from each image's header), ROI-decoded
  and resized, so DALI and CPU evaluation images agree to resampling noise.

A batch is a dict: ``"image"`` (CUDA, ``B x 3 x H x W`` uint8, or float16 normalised by
``mean``/``std``), ``"label"`` (CUDA int64, from the index's labels or the ``cls``
field; absent when there are neither), ``"__key__"`` (list of keys), and every other
field decoded on the host as a list, as ``decode="cpu"`` gives them. Not available:
``transform`` (a Python function per sample defeats GPU decoding; use ``decode="cpu"``
for custom transforms, or post-process the CUDA batch) and ``image_size=None`` (DALI
batches need one size).

DALI knobs: ``num_threads`` (DALI's CPU threads), ``hw_decoder_load`` (share of JPEGs
sent to the hardware decoder; the best value depends on image sizes and must be
measured), ``prefetch_queue_depth``. ``"auto"`` takes them from ``fastfeed tune
--decode dali`` (:data:`TUNE_SPACE`) for this dataset, host and batch shape, else
:data:`DEFAULTS`. ``num_workers`` and ``prefetch_factor`` are accepted so code can switch
``decode=`` freely, but unused: no worker processes exist, DALI's threads do the work.

``device_id=None`` runs the whole pipeline on the CPU (DALI's CPU decoder, CPU
tensors): slow, meant for tests and machines without a GPU.

Example:
    >>> dl = fastfeed.loader("/data/imagenet-ff", batch_size=256, image_size=224,
    ...                      decode="dali", output="float16")            # doctest: +SKIP
    >>> for epoch in range(90):                                          # doctest: +SKIP
    ...     dl.set_epoch(epoch)
    ...     for batch in dl:                                        # on this rank's GPU
    ...         loss = criterion(model(batch["image"]), batch["label"])
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, Sequence

from fastfeed.errors import ConfigError, MissingDependencyError
from fastfeed.loading.plan import DEFAULT_SHUFFLE_BLOCK
from fastfeed.loading.knobs import Knob, SearchSpace

from fastfeed.packed.index import DatasetIndex

if TYPE_CHECKING:  # pragma: no cover
    from fastfeed.loading.dali.pipeline import DaliLoader

__all__ = [
    "DALI_INSTALL",
    "DEFAULTS",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "TUNE_SPACE",
    "DaliLoader",
    "DaliOptions",
    "dali_available",
    "dali_loader",
    "import_dali",
]

log = logging.getLogger(__name__)

DALI_INSTALL = (
    "pip install 'fastfeed[dali]' (CUDA 13: nvidia-dali-cuda130) or "
    "pip install 'fastfeed[dali-cuda120]' (CUDA 12: nvidia-dali-cuda120)"
)

#: What ``"auto"`` knobs become without a tune result. ``num_threads`` is further capped
#: at the cores per local rank (see :func:`default_num_threads`).
DEFAULTS: dict[str, Any] = {"num_threads": 8, "hw_decoder_load": 0.65, "prefetch_queue_depth": 2}

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
OUTPUTS = ("uint8", "float16", "float32")
LAYOUTS = ("NCHW", "NHWC")

#: What ``fastfeed tune --decode dali`` searches (see :mod:`fastfeed.loading.knobs`):
#: no DataLoader workers; one coordinate pass over the hardware decoder's share (the
#: knob that matters most and whose best value depends on the images), DALI's thread
#: count, then its prefetch depth. Values are listed cheapest first: more work on the
#: hardware decoder leaves GPU SMs and CPU cores to training; fewer threads leave cores.
TUNE_SPACE = SearchSpace(
    workers=(0,),
    prefetch=(2,),
    default_prefetch=2,
    knobs=(
        Knob("hw_decoder_load", (1.0, 0.9, 0.8, 0.65, 0.5), default=0.65,
             help="share of JPEGs sent to the GPU's hardware JPEG decoder"),
        Knob("num_threads", lambda cores: [n for n in (2, 4, 6, 8, 12, 16, 24, 32) if n <= max(2, cores)],
             default=4, help="DALI CPU threads (host-side decode stages, resize on CPU)",
             uses_cores=True),
        Knob("prefetch_queue_depth", (2, 3, 4), default=2, help="batches DALI prepares ahead"),
    ),
)

_hinted = False


# ---------------------------------------------------------------------- the dependency
def import_dali() -> SimpleNamespace:
    """Import DALI and its PyTorch plugin, or raise one error with the install line.

    Returns:
        A namespace with ``Pipeline``, ``fn``, ``types``, ``TensorCPU``, ``TensorListCPU``,
        ``feed_ndarray``, ``to_torch_type`` and ``version``.

    Raises:
        MissingDependencyError: DALI is not installed (or cannot load).

    Example:
        >>> d = import_dali()                                # doctest: +SKIP
        >>> d.version                                        # doctest: +SKIP
        '2.4.0'
    """
    try:
        import nvidia.dali as dali
        import nvidia.dali.fn as fn
        import nvidia.dali.types as types
        from nvidia.dali.plugin.pytorch import feed_ndarray, to_torch_type
        from nvidia.dali.tensors import TensorCPU, TensorListCPU
    except ImportError as e:
        raise MissingDependencyError(
            f"decode='dali' needs NVIDIA DALI ({e}): {DALI_INSTALL}; or use decode='cpu'"
        ) from None
    return SimpleNamespace(Pipeline=dali.Pipeline, fn=fn, types=types, TensorCPU=TensorCPU,
                           TensorListCPU=TensorListCPU, feed_ndarray=feed_ndarray,
                           to_torch_type=to_torch_type, version=getattr(dali, "__version__", "?"))


def dali_available() -> bool:
    """True when DALI imports (without raising).

    Example:
        >>> isinstance(dali_available(), bool)
        True
    """
    try:
        import_dali()
    except MissingDependencyError:
        return False
    return True


# ---------------------------------------------------------------------- options
@dataclass(frozen=True)
class DaliOptions:
    """Validated settings of a :class:`DaliLoader` (see :func:`dali_loader`)."""

    batch_size: int
    image_size: tuple[int, int]
    shuffle: bool = True
    seed: int = 0
    augment: bool = True
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    flip: bool = True
    crop_fraction: float = 0.875
    rank: int = 0
    world_size: int = 1
    drop_last: bool = False
    on_error: str = "raise"
    num_threads: int = DEFAULTS["num_threads"]
    hw_decoder_load: float = DEFAULTS["hw_decoder_load"]
    prefetch_queue_depth: int = DEFAULTS["prefetch_queue_depth"]
    device_id: int | None = 0
    output: str = "uint8"
    mean: tuple[float, float, float] | None = None
    std: tuple[float, float, float] | None = None
    layout: str = "NCHW"
    image_field: str | None = None
    shuffle_block: int = DEFAULT_SHUFFLE_BLOCK
    knobs_from: str = "explicit"

    @property
    def gpu(self) -> bool:
        return self.device_id is not None


def _image_size(image_size: Any) -> tuple[int, int]:
    if image_size is None:
        raise ConfigError(
            "decode='dali' needs image_size= (an int or (height, width)): DALI delivers each "
            "batch as one tensor, so every image is cropped/resized to one size"
        )
    from fastfeed.decode.cpu import normalize_image_size

    size = normalize_image_size(image_size)
    return size if size is not None else (0, 0)


def _pair(name: str, value: Sequence[float], lo: float, hi: float) -> tuple[float, float]:
    try:
        a, b = (float(v) for v in value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name}={value!r}: give two numbers (low, high)") from None
    if not lo < a <= b <= hi:
        raise ConfigError(f"{name}={value!r}: need {lo} < low <= high <= {hi}")
    return a, b


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


def _int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{name}={value!r} must be an integer >= {minimum} (or 'auto')")
    return value


def resolve_device(device_id: int | str | None) -> int | None:
    """``"auto"`` -> this process's GPU (``LOCAL_RANK``, else the current CUDA device).

    Raises:
        ConfigError: no usable CUDA GPU (with the fix: ``decode="cpu"``), or a bad id.

    Example:
        >>> resolve_device(None) is None
        True
    """
    if device_id is None:
        return None
    import torch

    if not torch.cuda.is_available():
        raise ConfigError(
            "decode='dali' decodes on a CUDA GPU, and torch.cuda.is_available() is False on this "
            "machine; use decode='cpu' (or device_id=None to run DALI on the CPU, slowly, e.g. in tests)"
        )
    count = torch.cuda.device_count()
    if device_id == "auto":
        local = os.environ.get("LOCAL_RANK")
        device_id = int(local) % count if local is not None and local.isdigit() else torch.cuda.current_device()
    device_id = _int("device_id", device_id, 0)
    if device_id >= count:
        raise ConfigError(f"device_id={device_id} but this machine has {count} CUDA device(s)")
    return device_id


def default_num_threads() -> int:
    """``DEFAULTS["num_threads"]``, capped at this host's cores per local rank (>= 1).

    Example:
        >>> 1 <= default_num_threads() <= DEFAULTS["num_threads"]
        True
    """
    from fastfeed.dist import local_world_size
    from fastfeed.host import cpu_count

    return max(1, min(DEFAULTS["num_threads"], cpu_count() // local_world_size()))


def _resolve_knobs(index: DatasetIndex, batch_size: int, image_size: tuple[int, int],
                   knobs: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """Replace ``"auto"`` knobs by the stored tune result, else by the defaults."""
    auto = [k for k, v in knobs.items() if v == "auto" or v is None]
    if not auto:
        return knobs, "explicit"
    from fastfeed.loading.auto import lookup

    rec = lookup(index, batch_size=batch_size, decode="dali", image_size=image_size)
    out = dict(knobs)
    source = "tuned" if rec is not None else "default"
    for k in auto:
        if rec is not None and k in rec.knobs:
            out[k] = rec.knobs[k]
        else:
            out[k] = default_num_threads() if k == "num_threads" else DEFAULTS[k]
    if rec is not None:
        log.info("decode='dali': tuned %s from %s", {k: out[k] for k in auto}, rec.path)
    else:
        _hint(index, batch_size, image_size, {k: out[k] for k in auto})
    return out, source


def _hint(index: DatasetIndex, batch_size: int, image_size: tuple[int, int], used: dict[str, Any]) -> None:
    global _hinted
    if _hinted or os.environ.get("LOCAL_RANK", "0") != "0":
        return
    _hinted = True
    size = f" --image-size {image_size[0]}" if image_size[0] == image_size[1] else ""
    log.warning(
        "decode='dali': no tune result, using %s; the best hw_decoder_load depends on your images, "
        "measure it with `fastfeed tune %s --decode dali --batch-size %d%s`",
        ", ".join(f"{k}={v}" for k, v in sorted(used.items())), index.root or "DATASET", batch_size, size)


def _check_unused(transform: Any, num_workers: Any, prefetch_factor: Any, worker_init_fn: Any,
                  extra: dict[str, Any]) -> None:
    if transform is not None:
        raise ConfigError(
            "decode='dali' does not run transform= (a Python function per sample would undo GPU "
            "decoding); use the built-in augment/output/mean/std, transform the CUDA batch in "
            "your training step, or use decode='cpu'"
        )
    if worker_init_fn is not None:
        raise ConfigError("decode='dali' has no worker processes, so worker_init_fn= would never run; drop it")
    unknown = {k: v for k, v in extra.items() if v is not None}
    if unknown:
        raise ConfigError(f"decode='dali' does not take {', '.join(sorted(unknown))}; see fastfeed.loading.dali.backend")
    if num_workers not in ("auto", None, 0) or prefetch_factor not in ("auto", None):
        log.debug("decode='dali': num_workers=%r / prefetch_factor=%r unused (DALI threads decode; "
                  "set num_threads / prefetch_queue_depth)", num_workers, prefetch_factor)


def dali_loader(
    path_or_url: str | os.PathLike[str] | DatasetIndex,
    *,
    batch_size: int,
    shuffle: bool = True,
    seed: int = 0,
    image_size: int | tuple[int, int] | None = None,
    augment: bool = True,
    crop_scale: tuple[float, float] = (0.08, 1.0),
    crop_ratio: tuple[float, float] = (3 / 4, 4 / 3),
    flip: bool = True,
    crop_fraction: float = 0.875,
    rank: int | None = None,
    world_size: int | None = None,
    drop_last: bool = False,
    on_error: str = "raise",
    image_field: str | None = None,
    num_threads: int | str = "auto",
    hw_decoder_load: float | str = "auto",
    prefetch_queue_depth: int | str = "auto",
    device_id: int | str | None = "auto",
    output: str = "uint8",
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    layout: str = "NCHW",
    shuffle_block: int = DEFAULT_SHUFFLE_BLOCK,
    cache_dir: str | os.PathLike[str] | None = None,
    cache_size: str | int = "50GB",
    storage_options: dict[str, Any] | None = None,
    log_every: int | None = None,
    decode: str | None = "dali",
    num_workers: int | str | None = "auto",
    prefetch_factor: int | str | None = "auto",
    transform: Any = None,
    worker_init_fn: Any = None,
    pin_memory: Any = None,
    persistent_workers: Any = None,
    decode_backend: Any = None,
    timeout: Any = None,
    multiprocessing_context: Any = None,
    **unsupported: Any,
) -> DaliLoader:
    """A DALI GPU-decoding loader over a packed tar dataset (see the module docstring).

    ``fastfeed.loader(..., decode="dali")`` calls this with its own arguments; the DALI
    knobs (``num_threads`` ... ``layout``) are specific to it.

    Args:
        path_or_url: the packed dataset (folder, fsspec URL (needs ``cache_dir``), or a
            loaded :class:`~fastfeed.packed.index.DatasetIndex`).
        batch_size: samples per batch.
        shuffle: shuffle every epoch (a pure function of ``seed`` and the epoch).
        seed: the shuffle seed (also seeds DALI's augmentation generator).
        image_size: output ``int`` or ``(height, width)``; required.
        augment: RandomResizedCrop + flip (True) or the evaluation center crop.
        crop_scale: RandomResizedCrop area range.
        crop_ratio: RandomResizedCrop aspect-ratio range.
        flip: random horizontal flip when augmenting.
        crop_fraction: evaluation crop as a fraction of the shorter side.
        rank: this rank (default: :func:`fastfeed.dist.resolve_world`).
        world_size: number of ranks (same).
        drop_last: drop the remainder (True) or repeat at most ``world_size - 1``
            samples and end with a short batch (False); equal steps on every rank either way.
        on_error: ``"raise"`` (a :class:`~fastfeed.errors.SampleError` naming shard, key
            and offset; samples without an image field are reported when the loader is
            built) or ``"skip"`` (drop the sample, count it in ``stats``, log once).
        image_field: the field to decode (default: jpg, jpeg, png, webp, ... per sample).
        num_threads: DALI's CPU threads, or ``"auto"``.
        hw_decoder_load: share of JPEGs for the hardware decoder (0..1), or ``"auto"``.
        prefetch_queue_depth: batches DALI prepares ahead, or ``"auto"``.
        device_id: CUDA device, ``"auto"`` (``LOCAL_RANK`` / the current device), or
            None for a CPU-only pipeline.
        output: ``"uint8"`` (0..255, like the CPU path), ``"float16"`` or ``"float32"``
            (normalised by ``mean``/``std``).
        mean: per-channel mean in the 0-1 scale for float outputs (default ImageNet's).
        std: per-channel std in the 0-1 scale for float outputs (default ImageNet's).
        layout: ``"NCHW"`` or ``"NHWC"``.
        shuffle_block: samples mixed together in a rank's span (as the CPU path).
        cache_dir: local shard cache for remote datasets.
        cache_size: bound of that cache.
        storage_options: fsspec options for remote datasets.
        log_every: log one stats line every N batches.
        decode: ``"dali"`` (accepted from ``loader()``).
        num_workers: accepted and unused (no worker processes; see ``num_threads``).
        prefetch_factor: accepted and unused (see ``prefetch_queue_depth``).
        transform: must be None (see the module docstring).
        worker_init_fn: must be None (there are no workers to initialise).
        pin_memory: unused (batches are on the GPU already).
        persistent_workers: unused.
        decode_backend: unused (the CPU path's JPEG library choice).
        timeout: unused.
        multiprocessing_context: unused.
        **unsupported: other options; a non-None value is an error.

    Returns:
        A :class:`DaliLoader`.

    Raises:
        MissingDependencyError: DALI is not installed (the message has the pip line).
        ConfigError: no GPU (suggests ``decode="cpu"``), or an invalid option.
        IndexMismatchError: the dataset's DALI index files are missing or wrong.

    Example:
        >>> dl = dali_loader("/data/ff", batch_size=256, image_size=224)  # doctest: +SKIP
        >>> len(dl), next(iter(dl))["image"].shape                       # doctest: +SKIP
        (5005, torch.Size([256, 3, 224, 224]))
    """
    from fastfeed.loading.dataset import check_shards, resolve_index
    from fastfeed.loading.dali.pipeline import DaliLoader
    from fastfeed.dist import resolve_world

    if decode not in ("dali", None):
        raise ConfigError(f"dali_loader() got decode={decode!r}; it only does decode='dali'")
    _check_unused(transform, num_workers, prefetch_factor, worker_init_fn, unsupported)
    d = import_dali()
    size = _image_size(image_size)
    if on_error not in ("raise", "skip"):
        raise ConfigError(f"on_error={on_error!r} must be 'raise' or 'skip'")
    if output not in OUTPUTS:
        raise ConfigError(f"output={output!r} must be one of {', '.join(OUTPUTS)}")
    if layout not in LAYOUTS:
        raise ConfigError(f"layout={layout!r} must be 'NCHW' or 'NHWC'")
    if output == "uint8" and (mean is not None or std is not None):
        raise ConfigError("mean/std normalise float outputs; pass output='float16' (or 'float32') with them")
    if not 0 < float(crop_fraction) <= 1:
        raise ConfigError(f"crop_fraction={crop_fraction} must be in (0, 1]")
    batch_size = _int("batch_size", batch_size, 1)
    rank, world_size = resolve_world(rank, world_size)
    if not isinstance(path_or_url, (str, os.PathLike, DatasetIndex)):
        raise ConfigError(
            f"decode='dali' reads one packed dataset (a folder or URL with index.json), not "
            f"{type(path_or_url).__name__}; pack the tars with `fastfeed pack` (it writes the DALI "
            "index files) or use decode='cpu'")
    idx = resolve_index(path_or_url, cache_dir=cache_dir, cache_size=cache_size,
                        storage_options=storage_options)
    check_shards(idx)
    if drop_last and idx.num_samples // world_size < batch_size:
        raise ConfigError(
            f"{idx.num_samples} samples over world_size={world_size} cannot fill one batch of "
            f"{batch_size} per rank with drop_last=True; lower batch_size or pass drop_last=False")
    knobs, source = _resolve_knobs(idx, batch_size, size, {
        "num_threads": num_threads, "hw_decoder_load": hw_decoder_load,
        "prefetch_queue_depth": prefetch_queue_depth})
    load = float(knobs["hw_decoder_load"])
    if not 0.0 <= load <= 1.0:
        raise ConfigError(f"hw_decoder_load={load} must be in [0, 1]")
    float_out = output != "uint8"
    opts = DaliOptions(
        batch_size=batch_size, image_size=size, shuffle=bool(shuffle), seed=_int("seed", seed, 0),
        augment=bool(augment), scale=_pair("crop_scale", crop_scale, 0.0, 1.0),
        ratio=_pair("crop_ratio", crop_ratio, 0.0, 100.0), flip=bool(flip),
        crop_fraction=float(crop_fraction), rank=rank, world_size=world_size,
        drop_last=bool(drop_last), on_error=on_error,
        num_threads=_int("num_threads", knobs["num_threads"], 1), hw_decoder_load=load,
        prefetch_queue_depth=_int("prefetch_queue_depth", knobs["prefetch_queue_depth"], 1),
        device_id=resolve_device(device_id), output=output,
        mean=_triple("mean", mean if mean is not None or not float_out else IMAGENET_MEAN),
        std=_triple("std", std if std is not None or not float_out else IMAGENET_STD),
        layout=layout, image_field=image_field, shuffle_block=_int("shuffle_block", shuffle_block, 1),
        knobs_from=source,
    )
    if opts.std is not None and min(opts.std) <= 0:
        raise ConfigError(f"std={opts.std} must be positive")
    return DaliLoader(idx, opts, dali=d, cache_dir=cache_dir, cache_size=cache_size,
                      storage_options=storage_options, log_every=log_every)


def __getattr__(name: str) -> Any:
    if name == "DaliLoader":  # the class lives with the pipeline code, imported on use
        from fastfeed.loading.dali.pipeline import DaliLoader

        return DaliLoader
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
