"""``decode="dali"``: GPU image decoding through NVIDIA DALI, behind fastfeed's loader API.

``fastfeed.loader(path, decode="dali", ...)`` returns a :class:`DaliLoader`: the same
order, batches, ``len``, ``set_epoch``, ``stats`` and ``state_dict`` as ``decode="cpu"``,
with JPEGs decoded on the GPU (nvJPEG and the hardware JPEG decoder, ``device="mixed"``)
and batches delivered as CUDA tensors.

How it works:

- **Reading**: the DALI index files ``fastfeed pack`` writes next to each tar shard say
  where every image's bytes are (no scanning); shards are memory-mapped and each batch
  is handed to DALI's ``external_source`` as zero-copy views.
- **Order**: fastfeed's own epoch plan (:mod:`fastfeed.loading.order.epoch`), the one the CPU path
  uses: a pure function of (seed, epoch, world size), shuffled anew every epoch, every
  sample once per epoch across ranks, the same number of batches on every rank
  (``drop_last=False`` repeats at most ``world_size - 1`` samples, ``True`` drops the
  remainder). DALI's own ``fn.readers.webdataset`` is not used for this: its shuffle is
  a buffer seeded once per pipeline, its ``shard_id`` split gives ranks unequal counts,
  and it cannot start mid-epoch.
- **Epochs**: the rules of :mod:`fastfeed.loading.order.cursor`, the one epoch cursor that the
  CPU loader drives too: without ``set_epoch`` every new pass runs the next epoch,
  whether the previous pass finished or was abandoned. The pipelines stream epoch after
  epoch (the next epoch's first batches are decoded while the current one ends, so there
  is no refill bubble); a pass that starts anywhere else (``set_epoch`` to another epoch,
  a new ``iter()`` after a ``break``, ``load_state_dict``) restarts the feed and discards
  the few batches already in flight, without rebuilding the pipeline (only the loader's
  first batch, or the first after ``close()`` or a failed pipeline, pays for a build).
- **Resume**: ``state_dict()`` is a few integers (epoch, batches consumed, the world
  shape, the seed, the dataset fingerprint); ``load_state_dict()`` in a fresh process
  continues with exactly the remaining batches of the epoch, in the same order, at any
  batch (and is interchangeable with ``decode="cpu"``'s: the same cursor writes both). The random crops and flips are
  DALI's (``fn.decoders.image_random_crop``, ``fn.random.coin_flip``): they are drawn
  from each pipeline's generator, seeded from (seed, rank, epoch, batch, pipeline) when
  the pipelines are built, so they are reproducible for a run that starts at the same
  point with the same ``num_pipelines``, but not bit-identical to the CPU path's, to an
  uninterrupted run after a resume, or across ``num_pipelines`` (evaluation images,
  ``augment=False``, are the same for every N).
- **Pipeline**: random-crop decode (ROI decode: only the crop is decoded) -> resize to
  ``image_size`` -> random flip -> ``crop_mirror_normalize`` to uint8 or float16,
  NCHW or NHWC. Without ``augment``: the CPU path's evaluation crop box (the central
  ``crop_fraction`` of the shorter side, computed from each image's header), ROI-decoded
  and resized, so DALI and CPU evaluation images agree to resampling noise.

A batch is a dict: ``"image"`` (CUDA, ``B x 3 x H x W`` uint8, or float16 normalised by
``mean``/``std``), ``"label"`` (CUDA int64, from the index's labels or the ``cls``
field; absent when there are neither), ``"__key__"`` (list of keys), ``"valid"`` and
``"__source__"`` (as with ``decode="cpu"``), and every other field decoded on the host as a
list, as ``decode="cpu"`` gives them.

Mixing: ``fastfeed.loader([a, b], weights=[0.7, 0.3], decode="dali")`` feeds the samples of
several packed tar datasets of images (each its own DALI index files and memory-mapped
shards, numbered one after the other, :func:`~fastfeed.loading.dali.table.concat_tables`)
in the shared mixing plan, so every batch's samples, ``"__source__"`` and labels are those
of ``decode="cpu"`` for the same seed, epoch and world shape, and resume and elastic resume
are unchanged. Labels come from every dataset's index or from none; a dataset without
images DALI decodes is a :class:`~fastfeed.errors.ConfigError` naming it. Not available:
``transform`` (a Python function per sample defeats GPU decoding; use ``decode="cpu"``
for custom transforms, or post-process the CUDA batch) and ``image_size=None`` (DALI
batches need one size), except with an aspect-ratio ``batch_sampler``
(``DistributedAspectRatioSampler``), whose batches each take their bucket's size and the
crops of ``decode="cpu"`` (:mod:`fastfeed.loading.dali.cover`).

DALI knobs: ``num_threads`` (DALI's CPU threads), ``hw_decoder_load`` (share of JPEGs
sent to the hardware decoder; the best value depends on image sizes and must be
measured), ``prefetch_queue_depth``, ``num_pipelines`` (pipelines fed in turn: batch j
of the feed from pipeline ``j % N``, the ``num_threads`` shared between them; the
batches, their order and ``state_dict`` are the same for every N, a second pipeline
keeps the hardware JPEG decoder busier, each holds its own ``prefetch_queue_depth``
batches of GPU memory). ``"auto"`` takes them from ``fastfeed tune
--decode dali`` (:data:`TUNE_SPACE`) for this dataset, host and batch shape, else
:data:`DEFAULTS`. There are no worker processes: DataLoader options that would need them
(``num_workers=8``, ``prefetch_factor=4``, ``worker_init_fn``, ``timeout``, ...) are an
error that says what to set instead, their neutral values (``"auto"``, 0, None) are
accepted so code can switch ``decode=``; ``pin_memory``, ``persistent_workers`` and
``reuse_buffers`` have no effect (the pipeline already does what they ask for). The
lists are in :mod:`fastfeed.loading.options`, where every option is validated.

``Dali(device_id=None)`` runs the whole pipeline on the CPU (DALI's CPU decoder, CPU
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
from dataclasses import replace
from types import SimpleNamespace
from typing import Any, Sequence

from fastfeed.dist import local_world_size
from fastfeed.errors import ConfigError, MissingDependencyError
from fastfeed.host import cpu_count
from fastfeed.loading.auto import lookup
from fastfeed.loading.dali.pipeline import DaliLoader
from fastfeed.knobs.space import Knob, SearchSpace
from fastfeed.loading.groups import IMAGENET_MEAN, IMAGENET_STD
from fastfeed.loading.options import LoaderOptions, check_dali_knobs
from fastfeed.loading.order.rankplan import PlanSpec
from fastfeed.packed.index import DatasetIndex

__all__ = [
    "DALI_INSTALL",
    "DEFAULTS",
    "DaliLoader",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "TUNE_SPACE",
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
#: ``num_pipelines`` stays 1 until measured: a second pipeline paid off on one H200 with
#: small JPEGs (``benchmarks/dali_variants.py``), but it doubles DALI's buffers and the
#: gain depends on the images and the GPU, so ``fastfeed tune`` decides.
DEFAULTS: dict[str, Any] = {"num_threads": 8, "hw_decoder_load": 0.65, "prefetch_queue_depth": 2,
                            "num_pipelines": 1}


#: What ``fastfeed tune --decode dali`` searches (see :mod:`fastfeed.knobs.space`):
#: no DataLoader workers; one coordinate pass over the hardware decoder's share (the
#: knob that matters most and whose best value depends on the images), DALI's thread
#: count, then its prefetch depth, then one or two pipelines: two are tried with the
#: threads found shared between them and with twice those threads, capped at the cores
#: (``num_threads`` is the total of both; on an H200 two pipelines x the 4 threads found
#: for one beat both one pipeline and two sharing 4). Values are listed cheapest first:
#: more work on the hardware decoder leaves GPU SMs and CPU cores to training; fewer
#: threads leave cores; one pipeline holds half the GPU memory of two.
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
        Knob("num_pipelines", (1, 2), default=1, scales=("num_threads",),
             help="DALI pipelines fed in turn (num_threads shared between them; "
                  "also tried with twice the threads, capped at the cores)"),
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


# ---------------------------------------------------------------------- the loader
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
            "machine; use decode='cpu' (or dali=fastfeed.Dali(device_id=None) to run DALI on the CPU, slowly, e.g. in tests)"
        )
    count = torch.cuda.device_count()
    if device_id == "auto":
        local = os.environ.get("LOCAL_RANK")
        device_id = int(local) % count if local is not None and local.isdigit() else torch.cuda.current_device()
    if isinstance(device_id, bool) or not isinstance(device_id, int) or not 0 <= device_id < count:
        raise ConfigError(f"device_id={device_id!r} but this machine has {count} CUDA device(s) (0..{count - 1})")
    return device_id


def default_num_threads() -> int:
    """``DEFAULTS["num_threads"]``, capped at this host's cores per local rank (>= 1).

    Example:
        >>> 1 <= default_num_threads() <= DEFAULTS["num_threads"]
        True
    """
    return max(1, min(DEFAULTS["num_threads"], cpu_count() // local_world_size()))


def _resolve_knobs(index: DatasetIndex, o: LoaderOptions) -> tuple[dict[str, Any], str]:
    """The DALI knobs with ``"auto"`` replaced by the stored tune result, else the defaults."""
    knobs = {k.name: getattr(o.dali, k.name) for k in TUNE_SPACE.knobs}
    auto = [k for k, v in knobs.items() if v == "auto"]
    if not auto:
        return knobs, "explicit"
    size = o.image_size  # None under an aspect-ratio sampler (its buckets set the sizes): the record's key says so
    rec = lookup(index, batch_size=o.batch_size, decode="dali", image_size=size)
    out = dict(knobs)
    for k in auto:
        if rec is not None and k in rec.knobs:
            out[k] = rec.knobs[k]
        else:
            out[k] = default_num_threads() if k == "num_threads" else DEFAULTS[k]
    out = check_dali_knobs(out)  # a tune file is data read from disk
    if rec is not None:
        log.info("decode='dali': tuned %s from %s", {k: out[k] for k in auto}, rec.path)
    else:
        _hint(index, o.batch_size, size, {k: out[k] for k in auto})
    return out, "tuned" if rec is not None else "default"


def _hint(index: DatasetIndex, batch_size: int, image_size: tuple[int, int] | None, used: dict[str, Any]) -> None:
    global _hinted
    if _hinted or os.environ.get("LOCAL_RANK", "0") != "0":
        return
    _hinted = True
    size = f" --image-size {image_size[0]}" if image_size and image_size[0] == image_size[1] else ""
    log.warning(
        "decode='dali': no tune result, using %s; the best hw_decoder_load depends on your images, "
        "measure it with `fastfeed tune %s --decode dali --batch-size %d%s`",
        ", ".join(f"{k}={v}" for k, v in sorted(used.items())), index.root or "DATASET", batch_size, size)


def dali_loader(index: DatasetIndex | Sequence[DatasetIndex], options: LoaderOptions,
                spec: PlanSpec | None = None, names: Sequence[str] | None = None, *,
                stream: Any = None) -> DaliLoader:
    """The ``decode="dali"`` loader over packed tar datasets (see the module docstring).

    ``fastfeed.loader(..., decode="dali")`` calls this with the datasets' indexes and its
    validated options (:func:`fastfeed.loading.options.loader_options`); here the DALI
    knobs left ``"auto"`` are resolved (a stored tune result for the first dataset, else
    :data:`DEFAULTS`) and ``device_id`` becomes a device.

    Args:
        index: the packed dataset's index (tar shards with DALI index files), or one per
            dataset to mix.
        options: the loader's options, ``decode="dali"``.
        spec: the plan inputs with the weights and each dataset's ``subset`` / ``filter``
            (:func:`fastfeed.loading.sources.open_sources`); None: every sample of one dataset.
        names: the datasets as the user named them, for messages.
        stream: with an aspect-ratio ``batch_sampler``, its batches
            (:class:`~fastfeed.loading.cpu.sampled.SamplerStream`: each epoch's steps, the state's fields).

    Returns:
        A :class:`DaliLoader`; ``options.knobs_from`` says where its knobs came from.

    Raises:
        MissingDependencyError: DALI is not installed (the message has the pip line).
        ConfigError: no GPU (suggests ``decode="cpu"``), options of another ``decode``, a
            dataset that is not tar shards, or a mixed dataset without images.
        IndexMismatchError: the dataset's DALI index files are missing or wrong.

    Example:
        >>> o = loader_options(batch_size=256, image_size=224, decode="dali")   # doctest: +SKIP
        >>> dl = dali_loader(DatasetIndex.load("/data/ff"), o)                  # doctest: +SKIP
        >>> len(dl), next(iter(dl))["image"].shape                              # doctest: +SKIP
        (5005, torch.Size([256, 3, 224, 224]))
    """
    if options.decode != "dali":
        raise ConfigError(f"dali_loader() got options with decode={options.decode!r}; build them with "
                          "loader_options(decode='dali', ...)")
    indexes = [index] if isinstance(index, DatasetIndex) else list(index)
    d = import_dali()
    knobs, source = _resolve_knobs(indexes[0], options)
    dali = replace(options.dali, **knobs, device_id=resolve_device(options.dali.device_id))
    resolved = replace(options, dali=dali, knobs_from=source)
    return DaliLoader(indexes, resolved, dali=d, spec=spec, names=names, stream=stream)
