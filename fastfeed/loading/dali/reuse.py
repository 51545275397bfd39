"""Built DALI pipelines handed from a dropped loader to the next one of the same shape.

Building fastfeed's GPU pipeline is most of the ~2 s before a ``decode="dali"`` loader's
first batch. A loader keeps its pipelines across ``set_epoch``, ``load_state_dict`` and
new passes (:mod:`fastfeed.loading.dali.pipeline`); this module covers the next loader
in the same process (an evaluation loader made anew per epoch or per ``fit`` call): when a loader is garbage-collected without :meth:`~DaliLoader.close`, its
:class:`PipelineSet` is *parked* here, and the next loader whose pipelines would be built
from the same options (:func:`pipeline_key`: batch shape, crops, output, device, DALI
knobs; the dataset does not matter, the pipelines are fed from outside) *adopts* it
instead of building. The few batches the dropped loader had in flight are run out and
dropped by the adopting loader, as after a ``set_epoch``.

A loader's build is also cheap while *any* DALI pipeline with a GPU decoder is alive in the
process: ``Pipeline.build()`` of fastfeed's graph takes ~1.7 s on an H200 when it is the only
one, and ~0.2 s beside another (a second pipeline of a ``num_pipelines=2`` loader;
``benchmarks/dali_phases.py``): DALI shares the decoder's set-up between live pipelines and
tears it down with the last one. So after its first build, a process keeps one one-image
pipeline of that decoder per GPU alive (:func:`keep_warm`, a few MB of GPU memory), and a
loader built after ``close()``, a resume in a new loader or an evaluation loader built anew
pays ~0.2 s instead of the whole set-up. ``FASTFEED_DALI_KEEP_WARM=0`` turns it off;
:func:`release_parked` releases it too.

Only pipelines that draw no random numbers are reused (``augment=False``: evaluation
crops, the same for every run): DALI's random crops and flips come from generators
seeded when a pipeline is built, so an adopted training pipeline would give a new
loader the crops that follow the dropped loader's, not those of its own (seed, rank,
epoch, batch), and two loaders with one seed would no longer agree.

Safety:

- a set is parked only by a loader that no longer exists and adopted by one loader
  (popped from the cache), so two live loaders never share a pipeline;
- ``close()`` releases a loader's pipelines (GPU memory, threads) and parks nothing; so
  does :func:`release_parked` for what is parked; at most :data:`MAX_PARKED` sets are kept
  (the newest), an older one is released when another is parked;
- a forked child never releases or adopts what its parent parked (a DALI pipeline
  destroyed where its threads do not exist hangs): the child forgets them unreleased.

Example:
    >>> key = pipeline_key(LoaderOptions(batch_size=4, decode="dali", image_size=(16, 16), augment=False))
    >>> adopt(key) is None                      # nothing parked
    True
"""

from __future__ import annotations

import atexit
import os
import threading
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any

from fastfeed.loading.options import LoaderOptions

__all__ = ["MAX_PARKED", "PipelineSet", "adopt", "keep_warm", "park", "parked", "pipeline_key", "release_parked",
           "warm"]

#: Pipeline sets kept for adoption (each holds its pipelines' GPU buffers).
MAX_PARKED = 1

# What the pipelines are built from: every option the graph, the decoder and the schedule
# read (fastfeed.loading.dali.graph), and nothing about the dataset, the order or the host side.
_KEY_FIELDS = ("batch_size", "image_size", "augment", "crop", "dali", "batch_sampler")

_PARKED: OrderedDict[tuple[Any, ...], "PipelineSet"] = OrderedDict()
# a loader's finalizer runs where the garbage collector does: any thread, or this one inside adopt()
_LOCK = threading.RLock()
_LEFT_IN_CHILD: list[Any] = []  # a forked child's inherited sets: never destroyed there
_WARM: dict[Any, Any] = {}  # device_id -> this process's one-image pipeline (keep_warm)


@dataclass
class PipelineSet:
    """A loader's built pipelines and what they are running.

    Attributes:
        pipes: the pipelines, fed in turn (empty: none built).
        turn: the pipeline whose output comes next.
        dynamic: they run DALI's dynamic executor.
        pending: the batches fed and not yet taken back, in feed order (the loader's
            :attr:`BatchFeeder.pending <fastfeed.loading.dali.feed.BatchFeeder>`, whose views
            keep the mapped shards alive while DALI reads them).
    """

    pipes: list[Any] = field(default_factory=list)
    turn: int = 0
    dynamic: bool = False
    pending: deque[Any] = field(default_factory=deque)

    def release(self) -> None:
        """Drop the pipelines (they stop before the fed views are let go)."""
        self.pipes.clear()  # in place: whoever shares the list sees them gone
        self.turn = 0
        self.pending.clear()


def pipeline_key(o: LoaderOptions, builder: Any = None) -> tuple[Any, ...] | None:
    """What decides whether built pipelines fit a loader (see the module docstring), with
    ``builder`` what built them (DALI's ``Pipeline`` class); None for pipelines that are
    never reused (``augment=True``: they draw random numbers).

    Example:
        >>> a = LoaderOptions(batch_size=4, image_size=(16, 16), augment=False, seed=1)
        >>> pipeline_key(a) == pipeline_key(LoaderOptions(batch_size=4, image_size=(16, 16), augment=False))
        True
        >>> pipeline_key(a) == pipeline_key(LoaderOptions(batch_size=8, image_size=(16, 16), augment=False))
        False
        >>> pipeline_key(LoaderOptions(batch_size=4, image_size=(16, 16))) is None
        True
    """
    if o.augment or o.batch_sampler is not None:  # an aspect-ratio sampler's pipelines: their own graph
        return None
    return (builder, *(getattr(o, name) for name in _KEY_FIELDS))


def park(key: tuple[Any, ...] | None, pipes: PipelineSet, pid: int) -> None:
    """Keep ``pipes`` (of a loader that is gone) for the next loader with ``key``;
    ``pid``: the process that built them (a forked child parks nothing)."""
    if key is None or not pipes.pipes or pid != os.getpid():
        return
    with _LOCK:
        old = _PARKED.pop(key, None)
        _PARKED[key] = pipes
        evicted = [old] if old is not None else []
        while len(_PARKED) > MAX_PARKED:
            evicted.append(_PARKED.popitem(last=False)[1])
    for p in evicted:
        p.release()


def adopt(key: tuple[Any, ...] | None) -> PipelineSet | None:
    """The parked pipelines for ``key``, now the caller's alone; None if there are none."""
    if key is None:
        return None
    with _LOCK:
        return _PARKED.pop(key, None)


def parked() -> int:
    """How many pipeline sets are parked in this process.

    Example:
        >>> parked() >= 0
        True
    """
    return len(_PARKED)


def keep_warm(build: Any, device_id: int | None) -> bool:
    """Keep a pipeline from ``build()`` (a one-image pipeline of the loader's GPU decoder:
    :func:`~fastfeed.loading.dali.graph.probe_pipeline`) alive on ``device_id`` for the rest
    of the process, so later builds there skip DALI's decoder set-up (module docstring).
    Called right after a loader's build, while its pipelines are alive, so building it is
    cheap. True if one is kept (now or before); nothing for CPU pipelines
    (``Dali(device_id=None)``) or with ``FASTFEED_DALI_KEEP_WARM=0``.

    Example:
        >>> keep_warm(lambda: None, None)      # CPU-only pipelines: nothing to keep
        False
    """
    if device_id is None or os.environ.get("FASTFEED_DALI_KEEP_WARM", "1").strip() in ("0", "false", "no"):
        return False
    with _LOCK:
        if device_id not in _WARM:
            _WARM[device_id] = build()
    return True


def warm() -> int:
    """How many GPUs this process keeps a warm pipeline on (:func:`keep_warm`).

    Example:
        >>> warm() >= 0
        True
    """
    return len(_WARM)


def release_parked() -> None:
    """Release every parked pipeline set now (their GPU memory and threads), and the
    warm pipelines of :func:`keep_warm`.

    Example:
        >>> release_parked(); parked(), warm()
        (0, 0)
    """
    with _LOCK:
        sets = list(_PARKED.values())
        _PARKED.clear()
        _WARM.clear()  # the last reference: the pipelines go now
    for p in sets:
        p.release()


def _forget_in_child() -> None:
    _LEFT_IN_CHILD.extend(_PARKED.values())
    _LEFT_IN_CHILD.extend(_WARM.values())
    _PARKED.clear()
    _WARM.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)
atexit.register(release_parked)  # before DALI's module is torn down (its pipelines' __del__ needs it)
