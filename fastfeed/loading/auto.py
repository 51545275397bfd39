"""What ``num_workers="auto"`` and ``prefetch_factor="auto"`` become in ``loader()``.

A stored ``fastfeed tune`` result (:mod:`fastfeed.knobs.record`) whose key matches wins;
without one, :func:`heuristic_workers` decides and a one-line hint (once per process, local
rank 0 only) says how to measure instead. The loader reads tuned settings here; the tuner
(:mod:`fastfeed.tuning`) writes them, so loading never imports tuning.

Example:
    >>> heuristic_workers(32, 4), heuristic_workers(16, 1, gpu=True), heuristic_prefetch(1)
    (6, 12, 8)
"""

from __future__ import annotations

import logging
import os
from typing import Any

from fastfeed.dist import local_world_size
from fastfeed.errors import ConfigError
from fastfeed.host import cpu_count, worker_cores
from fastfeed.knobs.space import SearchSpace, space_for
from fastfeed.decode.geometry import normalize_image_size
from fastfeed.knobs.record import TuneKey, TuneRecord, find_record

__all__ = ["HEURISTIC_MAX_WORKERS", "MIN_IN_FLIGHT", "heuristic_prefetch", "heuristic_workers", "lookup",
           "resolve_auto"]

log = logging.getLogger(__name__)

#: The heuristic never goes beyond this many workers per rank.
HEURISTIC_MAX_WORKERS = 12
#: Batches the heuristic keeps in flight per rank at least (workers x prefetch factor).
MIN_IN_FLIGHT = 8
_hinted = False


def heuristic_workers(cores: int, local_ranks: int, space: SearchSpace | None = None, *, gpu: bool = False) -> int:
    """Workers per rank when nothing was measured: the cores the host has left for them, at most 12.

    That is :func:`fastfeed.host.worker_cores`: the rank's share of the cores (``cores //
    LOCAL_WORLD_SIZE``: the ranks on a host share them) less what its training process
    keeps busy (its Python thread; with a GPU also the pin-memory thread and CUDA's) and
    one core in eight for the rest of the host. A worker more than that competes with the
    training step for a core: the step slows by more than the batches gain (on 2 cores a
    second worker took the training thread's core; on 16 cores tune measured 10 workers at
    17,700 img/s and 16 at 12,800). Beyond 12 workers per rank CPU decode for one GPU
    rarely scales further while memory keeps growing (each worker holds its own dataset
    state and its batches in flight). With one core per rank this gives 0: loading in the
    main process beats a worker that fights it for the core.

    Example:
        >>> heuristic_workers(32, 4), heuristic_workers(2, 1), heuristic_workers(64, 1), heuristic_workers(8, 8)
        (6, 1, 12, 0)
        >>> heuristic_workers(16, 1, gpu=True), heuristic_workers(64, 8, gpu=True)
        (12, 5)
    """
    n = min(worker_cores(cores, local_ranks, gpu=gpu), HEURISTIC_MAX_WORKERS)
    if space is not None and space.workers is not None:
        allowed = sorted(space.workers)
        n = max((w for w in allowed if w <= n), default=allowed[0])
    return n


def heuristic_prefetch(workers: int, default: int = 2, deepest: int = 8) -> int | None:
    """The prefetch factor when nothing was measured: at least :data:`MIN_IN_FLIGHT` batches in flight.

    A worker's batch is due once every ``workers`` steps, and what it has finished ahead
    is what covers a slow batch (a large image, a page-cache miss) or a step that took its
    core: with ``prefetch_factor`` p it absorbs a delay of ``(p - 1) x workers`` steps. So
    few workers get a deeper queue (1 worker: 8; 2: 4; 3: 3; 4 or more: ``default``), which
    costs ``workers x p`` batches of shared memory. None with 0 workers.

    Example:
        >>> [heuristic_prefetch(w) for w in (0, 1, 2, 3, 4, 12)]
        [None, 8, 4, 3, 2, 2]
    """
    if workers <= 0:
        return None
    return max(default, min(deepest, -(-MIN_IN_FLIGHT // workers)))


def _check_auto(name: str, value: Any, minimum: int) -> None:
    if value == "auto" or value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{name}={value!r} must be 'auto' or an integer >= {minimum}")


def lookup(
    index: Any, *, batch_size: int, decode: str | None = "cpu",
    image_size: int | tuple[int, int] | None = None,
) -> TuneRecord | None:
    """The stored tune result for this dataset, host, local world size and loader shape.

    Decode modes read their own tuned knobs here (``record.knobs``).

    Example:
        >>> rec = lookup(DatasetIndex.load(root), batch_size=256, image_size=224)  # doctest: +SKIP
        >>> rec.num_workers, rec.knobs                                             # doctest: +SKIP
    """
    key = TuneKey.current(index.fingerprint, batch_size=batch_size, decode=decode,
                          image_size=image_size, local_world_size=local_world_size())
    return find_record(str(getattr(index, "root", "") or ""), key)


def resolve_auto(
    index: Any,
    *,
    batch_size: int,
    decode: str | None = "cpu",
    image_size: int | tuple[int, int] | None = None,
    num_workers: int | str = "auto",
    prefetch_factor: int | str | None = "auto",
    gpu: bool | None = None,
) -> tuple[int, int | None, str]:
    """Resolve ``"auto"`` worker and prefetch settings for ``loader()``.

    Explicit integers pass through untouched. ``"auto"`` takes a stored ``fastfeed
    tune`` result whose key matches (dataset fingerprint, host, ``LOCAL_WORLD_SIZE``,
    batch size, decode mode, image size), else :func:`heuristic_workers` and
    :func:`heuristic_prefetch`, with a one-line hint (once per process, local rank 0 only)
    to run ``fastfeed tune``. ``gpu``: the training process feeds a GPU (its pin-memory
    thread and CUDA's take a core; default: ``torch.cuda.is_available()``). An "auto"
    prefetch factor with explicit workers takes the tuned factor only when the tuned
    worker count is the same. With 0 workers the prefetch factor is always None (PyTorch
    rejects one), whatever was passed.

    Returns:
        ``(num_workers, prefetch_factor or None, source)`` where source is
        ``"explicit"``, ``"tuned"`` or ``"heuristic"`` (what decided ``num_workers``).

    Example:
        >>> resolve_auto(idx, batch_size=256, num_workers=4, prefetch_factor=2)  # doctest: +SKIP
        (4, 2, 'explicit')
    """
    _check_auto("num_workers", num_workers, 0)
    _check_auto("prefetch_factor", prefetch_factor, 1)
    if prefetch_factor is None:
        prefetch_factor = "auto"
    if isinstance(num_workers, int) and (num_workers == 0 or isinstance(prefetch_factor, int)):
        return num_workers, (prefetch_factor if num_workers else None), "explicit"
    rec = lookup(index, batch_size=batch_size, decode=decode, image_size=image_size)
    space = space_for(decode)
    if isinstance(num_workers, int):  # explicit workers, "auto" prefetch
        tuned = rec is not None and rec.num_workers == num_workers
        pf = rec.prefetch_factor if tuned and rec is not None else space.default_prefetch
        return num_workers, pf, "explicit"
    if rec is not None:
        log.info("using tuned num_workers=%d prefetch_factor=%s from %s", rec.num_workers,
                 rec.prefetch_factor, rec.path)
        pf = rec.prefetch_factor if prefetch_factor == "auto" else prefetch_factor
        return rec.num_workers, (pf if rec.num_workers else None), "tuned"
    if gpu is None:
        import torch

        gpu = torch.cuda.is_available()
    cores, ranks = cpu_count(), local_world_size()
    workers = heuristic_workers(cores, ranks, space, gpu=gpu)
    pf = (heuristic_prefetch(workers, space.default_prefetch, max(space.prefetch)) if prefetch_factor == "auto"
          else prefetch_factor)
    _hint(index, workers, cores, ranks, batch_size, decode, image_size)
    return workers, (pf if workers else None), "heuristic"


def _hint(index: Any, workers: int, cores: int, ranks: int, batch_size: int,
          decode: str | None, image_size: Any) -> None:
    global _hinted
    if _hinted or os.environ.get("LOCAL_RANK", "0") != "0":
        return
    _hinted = True
    size = normalize_image_size(image_size)
    if size is None:  # tune's default is 224 on image data: say "none" so the result matches this loader
        extra = " --image-size none" if decode is not None else ""
    else:  # the CLI takes one side; a non-square size is tuned through fastfeed.tune(image_size=(h, w))
        extra = f" --image-size {size[0]}" if size[0] == size[1] else ""
    extra += f" --decode {decode}" if decode not in ("cpu", None) else ""
    log.warning(
        "num_workers='auto' -> %d by heuristic (%d cores, LOCAL_WORLD_SIZE=%d); measure instead "
        "with `fastfeed tune %s --batch-size %d%s`", workers, cores, ranks,
        getattr(index, "root", "") or "DATASET", batch_size, extra)
