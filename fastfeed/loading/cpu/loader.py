"""The CPU backend of ``fastfeed.loader()``: DataLoader worker processes decode whole batches.

:func:`cpu_loader` builds a :class:`~fastfeed.loading.cpu.dataset.ShardBatches` (or its
token / sampler variants) over the planned epoch and wraps it in :class:`Loader`, a
``torch.utils.data.DataLoader`` subclass (so Lightning, Accelerate and plain loops accept
it) with ``set_epoch``, ``state_dict`` / ``load_state_dict``, ``len()`` in batches and
always-on ``stats``. The front door, :func:`fastfeed.loader`, validates the arguments and
picks this backend or :mod:`fastfeed.loading.dali`.

Every wait is bounded or watched: remote reads carry ``Storage(timeout=, retries=)`` into
every worker (:func:`fastfeed.storage.retry.with_policy`), and the stall watchdog
(:mod:`fastfeed.loading.cpu.watchdog`) names the worker that holds the loop up once it has
waited ``Workers(stall_timeout=)``, or raises with ``on_stall="raise"``.
"""

from __future__ import annotations

import inspect
import logging
import weakref
from dataclasses import replace
from typing import Any, Callable, Iterator

import torch
from torch.utils.data import DataLoader, default_convert

from fastfeed._util import format_bytes
from fastfeed.decode import bufpool
from fastfeed.decode.bufpool import BUFFER_KEY, BufferPool
from fastfeed.decode.collate import Padding
from fastfeed.decode.cpu import CoverDecoder, CpuDecoder, RawDecoder
from fastfeed.dist import local_world_size
from fastfeed.host import cpu_count, memory_total, shm_free, worker_cores
from fastfeed.loading.auto import resolve_auto
from fastfeed.loading.autotune import Limits, Setting, Window, decide, window_steps
from fastfeed.loading.bottleneck import line_hook
from fastfeed.loading.compat import FrameworkHooks
from fastfeed.loading.cpu.dataset import SKIPPED_KEY, TIMING_KEY, ShardBatches
from fastfeed.loading.cpu.sampled import SamplerBatches
from fastfeed.loading.cpu.tokens import TokenBatches, padding_of
from fastfeed.loading.cpu.watchdog import Watchdog, WorkerInit, WorkerSlots, shard_namer
from fastfeed.loading.options import LoaderOptions
from fastfeed.loading.order.cursor import EpochCursor, Pass, Resumable
from fastfeed.loading.order.elastic import Stage, mode_of
from fastfeed.loading.sources import Sources, cursor_for
from fastfeed.loading.stats import LoaderStats
from fastfeed.loading.textopts import cover_decoder, is_aspect
from fastfeed.packed.index import DatasetIndex
from fastfeed.packed.reader import ShardSource
from fastfeed.errors import StallError
from fastfeed.storage.remote import is_url
from fastfeed.storage.retry import with_policy

__all__ = ["Autotuner", "Loader", "convert_batch", "cpu_loader", "decoder_for"]

log = logging.getLogger(__name__)

_ATOMS = (str, int, float, bool, type(None))  # what default_convert hands back as it is


def _plain(value: Any) -> bool:
    """True for what ``default_convert`` would give back equal: tensors, str / numbers, and
    lists (of lists) of those (``__key__``, decoded text fields, skip reasons)."""
    t = type(value)
    if t in _ATOMS or isinstance(value, torch.Tensor):
        return True
    return t is list and all(type(v) in _ATOMS or (type(v) is list and all(type(x) in _ATOMS for x in v))
                             for v in value)


def convert_batch(batch: Any) -> Any:
    """The batch as ``default_convert`` gives it (what ``DataLoader(batch_size=None)`` runs on
    every batch: numpy arrays to tensors, at any depth), without walking the values that
    have nothing to convert element by element (50-80 us a text batch, measured; 3-6% of a
    token batch's CPU).

    Example:
        >>> import numpy as np
        >>> b = convert_batch({"__key__": ["a", "b"], "x": np.zeros(2), "t": (1, np.ones(1))})
        >>> b["__key__"], type(b["x"]).__name__, b["t"]
        (['a', 'b'], 'Tensor', [1, tensor([1.], dtype=torch.float64)])
    """
    if type(batch) is not dict:
        return default_convert(batch)
    return {k: v if _plain(v) else default_convert(v) for k, v in batch.items()}


class Loader(FrameworkHooks, Resumable, DataLoader):
    """A DataLoader over fastfeed shards; build it with :func:`loader`.

    Epochs: ``set_epoch(e)`` makes the next pass run epoch ``e``. Without it, every new
    pass (``iter(dl)``) runs the next epoch, **whether the previous pass finished or was
    abandoned** (``break`` out of the loop, then iterate again): a new pass is a new order,
    as with a shuffling DataLoader, and Lightning's ``limit_train_batches`` gets new
    batches every epoch. Call ``set_epoch`` with the same epoch to replay it. A pass
    begins at the first ``next()``, and only the newest pass delivers batches.
    ``decode="dali"``'s loader follows the same rules (one
    :class:`~fastfeed.loading.order.cursor.EpochCursor` serves both; see that module for why).

    Resume: :meth:`state_dict` / :meth:`load_state_dict`: the next pass continues the saved
    epoch after its last consumed batch (a state saved by either ``decode``, any
    ``num_workers``, any rank of the same world size).

    Attributes:
        index: the dataset index.
        rank, world_size: this process's place in the job.
        stats: :class:`~fastfeed.loading.stats.LoaderStats`, always on.
        workers_from: where ``num_workers`` came from (``"explicit"``, ``"tuned"``, ``"heuristic"``).
        epoch: the epoch of the current (or next) pass.
        watchdog: the stall :class:`~fastfeed.loading.cpu.watchdog.Watchdog` (None with
            ``stall_timeout=None``); ``watchdog.stall(0).message()`` says what each worker does now.
        autotune: the :class:`Autotuner` that keeps tuning ``num_workers="auto"`` while it runs
            (``Workers(autotune=False)``, explicit workers or none: None); ``autotune.changes``
            says what it changed and why.

    Accelerate's ``prepare`` returns it as is and Lightning can re-create it (``predict``):
    see :mod:`fastfeed.loading.compat`.
    """

    def __init__(self, dataset: ShardBatches, *, num_workers: int, prefetch_factor: int | None,
                 pin_memory: bool, persistent_workers: bool, timeout: float,
                 multiprocessing_context: Any, worker_init_fn: Callable[[int], None] | None,
                 log_every: int | None, workers_from: str, cursor: EpochCursor,
                 reuse_buffers: bool = False, stall_timeout: float | None = None, on_stall: str = "log",
                 autotune: bool = False, sampler: None = None, batch_sampler: None = None) -> None:
        # sampler / batch_sampler: only None, which frameworks that re-create a DataLoader over an
        # IterableDataset pass (Lightning's predict); DataLoader rejects anything else
        self.watchdog: Watchdog | None = None
        self._user_init, self._user_timeout = worker_init_fn, timeout
        self._stall = (stall_timeout, on_stall)
        worker_init_fn, timeout = self._watch(dataset, num_workers)
        kwargs: dict[str, Any] = {}
        if num_workers > 0:  # PyTorch rejects prefetch_factor / persistent workers without workers
            kwargs.update(prefetch_factor=prefetch_factor, persistent_workers=persistent_workers,
                          multiprocessing_context=multiprocessing_context)
        if "in_order" in inspect.signature(DataLoader.__init__).parameters:
            kwargs["in_order"] = True  # the round-robin order of batches is the contract
        super().__init__(dataset, batch_size=None, sampler=sampler, batch_sampler=batch_sampler,
                         collate_fn=convert_batch, num_workers=num_workers, pin_memory=pin_memory, timeout=timeout,
                         worker_init_fn=worker_init_fn, **kwargs)
        self.autotune: Autotuner | None = None
        if autotune and num_workers > 0:
            self.autotune = Autotuner(Setting(num_workers, prefetch_factor or 2), gpu=bool(pin_memory))
        # workers refill the shared-memory batches the main process has let go (fastfeed.decode.bufpool);
        # only with persistent workers: one process per worker id for the loader's life
        self._pool: BufferPool | None = None
        self._reuse = reuse_buffers and persistent_workers
        self._make_pool(num_workers, prefetch_factor)
        self._live: Any = None  # the DataLoader iterator of the current pass
        self.index: DatasetIndex = dataset.source.index
        self.indexes: tuple[DatasetIndex, ...] = tuple(src.index for src in dataset.sources)
        self.rank, self.world_size = dataset.rank, dataset.world_size
        self.stats = LoaderStats(log_every=log_every)
        self.stats.add_line_hook(_line_hook(self))  # "; decode-bound (workers busy 97%, ...)"
        self.workers_from = workers_from
        self._cursor = cursor

    def _watch(self, dataset: ShardBatches, num_workers: int) -> tuple[Callable[[int], None] | None, float]:
        """The stall watchdog for ``num_workers`` workers; the workers' init function and DataLoader timeout."""
        init, timeout = self._user_init, self._user_timeout
        stall_timeout, on_stall = self._stall
        if stall_timeout is None:
            return init, timeout
        slots = WorkerSlots(num_workers)
        dataset.slots = slots  # the workers publish what they do there
        self.watchdog = Watchdog(slots, stall_timeout=stall_timeout, on_stall=on_stall, num_workers=num_workers,
                                 shard_name=shard_namer([src.index for src in dataset.sources]))
        if num_workers > 0:
            init = WorkerInit(slots, init)
            bound = self.watchdog.torch_timeout  # raise mode: DataLoader's own timeout, as a StallError
            if bound:
                timeout = min(timeout, bound) if timeout else bound
        return init, timeout

    def _make_pool(self, num_workers: int, prefetch_factor: int | None) -> None:
        """The buffer pool of ``num_workers`` persistent workers: a slot per batch in flight, the one the
        loop holds and the one it receives meanwhile (one more while pinned slots drain; with autotune,
        for its deepest prefetch)."""
        if not self._reuse or num_workers <= 0:
            return
        pin = bool(self.pin_memory) and torch.cuda.is_available()
        # a pinning loader sends by reference only when the pool registers its buffers with CUDA
        # (bufpool.REGISTER); else as storages, which DataLoader's pin-memory thread copies off this thread
        by_reference = bufpool.BY_REFERENCE and (bufpool.REGISTER or not pin)
        deepest = max(prefetch_factor or 2, self.autotune.limits.max_prefetch if self.autotune else 0)
        self._pool = self.dataset.pool = BufferPool(num_workers, deepest + 2 + pin,
                                                    by_reference=by_reference, pin=pin and by_reference)

    def _set_workers(self, num_workers: int) -> None:
        """Replace the persistent workers by ``num_workers`` new ones, which the next pass starts (an epoch
        boundary: the order of batches is the plan's, whatever builds them)."""
        it, self._iterator, self._live = self._iterator, None, None
        shutdown = getattr(it, "_shutdown_workers", None)
        if callable(shutdown):
            shutdown()
        if self.watchdog is not None:
            self.watchdog.close()
        if self._pool is not None:
            self._pool.close()
        self.num_workers = num_workers
        self.worker_init_fn, self.timeout = self._watch(self.dataset, num_workers)
        self._make_pool(num_workers, self.prefetch_factor)

    def _set_prefetch(self, prefetch_factor: int) -> None:
        """Deepen the prefetch at once: the running workers get the extra batches to make now."""
        self.prefetch_factor = prefetch_factor
        it = self._live
        old, put = getattr(it, "_prefetch_factor", None), getattr(it, "_try_put_index", None)
        if it is None or old is None or put is None or prefetch_factor <= old or not getattr(it, "_num_workers", 0):
            return  # no live workers (or another DataLoader): the next pass starts with it
        it._prefetch_factor = prefetch_factor
        for _ in range((prefetch_factor - old) * it._num_workers):
            put()

    def __iter__(self) -> Iterator[dict[str, Any]]:  # type: ignore[override]
        return self._cursor.run(self._open_pass)

    def _open_pass(self, p: Pass) -> Iterator[dict[str, Any]]:
        """The batches of pass ``p``: the workers start (or reset) at its epoch and first batch."""
        self.dataset.set_position(p.position)
        if self.autotune is not None:
            workers = self.autotune.boundary(p.epoch)  # more workers, decided during the last pass
            if workers is not None:
                self._set_workers(workers)
        if self._pool is not None:
            self._pool.reclaim()  # batches of a pass left early are discarded by the workers' reset
        if self.watchdog is not None and (self._iterator is None or not self.persistent_workers):
            self.watchdog.slots.reset()  # new workers start: the rows of the last ones would mislead
        batches: Iterator[dict[str, Any]] = super().__iter__()
        self._live = batches
        if self.watchdog is not None:
            batches = self.watchdog.watch(batches, p.epoch, p.start, reset=self._new_workers)
        elif self.timeout:
            batches = _timed_out_as_stall(batches, self.timeout)
        batches = self.stats.track(batches, _batch_size, self._pop_extras)
        if self.autotune is not None:
            batches = self.autotune.watch(batches, self.stats, self._set_prefetch)
        return batches

    def _new_workers(self) -> None:
        """The next pass starts new workers (the watchdog ended a stall by killing these)."""
        self._iterator = None  # DataLoader keeps persistent workers' iterator here

    def _pop_extras(self, batch: dict[str, Any]) -> tuple[int, list[str]]:
        """Move the batch's worker timings into ``stats``; return its skips."""
        timing = batch.pop(TIMING_KEY, None)
        if timing is not None:
            self.stats.record_work(*timing)
        if self._pool is not None:
            self._pool.unpack(batch)  # the tensors sent by reference put back; the slots let go freed
        else:
            batch.pop(BUFFER_KEY, None)
        return _pop_skipped(batch)


class Autotuner:
    """The loader's tuning while it runs (``num_workers="auto"``): windows of the loop's data wait
    from ``loader.stats``, the decisions of :func:`fastfeed.loading.autotune.decide`, each change
    logged with the figure that caused it.

    Every :func:`~fastfeed.loading.autotune.window_steps` batches it closes a window; a deeper
    prefetch applies at once (the live workers get the extra batches to make), more workers
    at the next pass (:meth:`boundary`: persistent workers are rebuilt there). A step monitor, or
    anything that times the steps better than the loader can (CUDA events), may hand its own
    figures to :meth:`observe` instead.

    Attributes:
        setting: the current :class:`~fastfeed.loading.autotune.Setting`.
        limits: how far it may go (:class:`~fastfeed.loading.autotune.Limits`).
        changes: every change made, as logged (``"data wait 23.0% ...: prefetch_factor 2 -> 4 now"``).
        limit: what it said when it was still waiting at its limits (None: it has not been).

    Example:
        >>> t = Autotuner(Setting(2, 2), gpu=False)
        >>> t.observe(wait_s=0.5, step_s=2.0, steps=16, work_s=3.9)   # 25% waiting, workers busy
        >>> t.setting.prefetch_factor, t.boundary(epoch=1), t.setting.num_workers >= 2
        (4, None, True)
    """

    def __init__(self, setting: Setting, *, gpu: bool) -> None:
        ranks = local_world_size()
        shm = shm_free()
        room = [b for b in (memory_total() // (4 * ranks), None if shm is None else shm // (2 * ranks)) if b]
        self.setting = setting
        self.limits = Limits(max_workers=max(setting.num_workers, worker_cores(cpu_count(), ranks, gpu=gpu)),
                             max_in_flight_bytes=min(room) if room else None)
        self.changes: list[str] = []
        self._windows: list[Window] = []
        self._pending = setting.num_workers
        self.limit: str | None = None
        self._external = False
        self._prefetch: Callable[[int], None] | None = None

    def watch(self, batches: Iterator[dict[str, Any]], stats: LoaderStats,
              prefetch: Callable[[int], None]) -> Iterator[dict[str, Any]]:
        """Yield ``batches``, closing a window of ``stats`` every few of them."""
        self._prefetch = prefetch
        mark = _totals(stats)
        count = 0
        for batch in batches:
            if self.limits.batch_bytes is None:
                self.limits = replace(self.limits, batch_bytes=_nbytes(batch))
            yield batch
            count += 1
            if count >= window_steps(self.setting.num_workers) and not self._external:
                count, now = 0, _totals(stats)
                d = [b - a for a, b in zip(mark, now)]
                mark = now
                if d[0] > 0 and d[3] >= 0:  # steps went forward (no stats.reset() between)
                    work = d[3] * d[0] / d[4] if d[4] > 0 else None
                    self._add(Window(int(d[0]), d[1], d[2], work))

    def observe(self, *, wait_s: float, step_s: float, steps: int, work_s: float | None = None) -> None:
        """A window timed by someone else (a step monitor): from now on only these are used."""
        self._external = True
        self._add(Window(int(steps), float(wait_s), float(step_s), work_s))

    def boundary(self, epoch: int) -> int | None:
        """At the start of a pass: the worker count to rebuild with, when the last pass asked for more."""
        if self._pending <= self.setting.num_workers:
            return None
        old, self.setting = self.setting.num_workers, Setting(self._pending, self.setting.prefetch_factor)
        self._windows.clear()
        log.warning("autotune: num_workers %d -> %d from epoch %d (asked for during the last pass)",
                    old, self._pending, epoch)
        return self._pending

    def _add(self, w: Window) -> None:
        self._windows.append(w)
        d = decide(self._windows, self.setting, self.limits)
        if d.at_limit:
            if self.limit is None:  # said once
                self.limit = d.reason
                log.warning("autotune: %s", d.reason)
            return
        if not d.changed:
            self._pending = max(self.setting.num_workers, min(self._pending, d.num_workers))
            return
        news = d.prefetch_factor != self.setting.prefetch_factor or d.num_workers != self._pending
        self._pending = d.num_workers
        if d.prefetch_factor != self.setting.prefetch_factor:
            self.setting = Setting(self.setting.num_workers, d.prefetch_factor)
            self._windows.clear()  # the next windows measure the new depth
            if self._prefetch is not None:
                self._prefetch(d.prefetch_factor)
        if news:
            self.changes.append(d.reason)
            log.warning("autotune: %s", d.reason)


def _totals(stats: LoaderStats) -> tuple[float, float, float, float, float]:
    """(steps, wait s, step s, workers' read + decode s, batches with worker times) so far."""
    s = stats.summary()
    return (s["steps"], s["wait_s"], s["step_s"], s["read_s"] + s["decode_s"], s["load_batches"])


def _nbytes(batch: Any) -> int:
    """Bytes of a batch's tensors (what one batch in flight holds)."""
    values = batch.values() if isinstance(batch, dict) else ()
    return sum(v.nbytes for v in values if isinstance(v, torch.Tensor)) or 1


def _line_hook(dl: "Loader") -> Callable[[dict[str, Any]], str]:
    """The stats line's diagnosis at the loader's current worker count (autotune may change it)."""
    ref = weakref.ref(dl)

    def hook(window: dict[str, Any]) -> str:
        loader = ref()
        return line_hook(loader.num_workers if loader is not None else 0)(window)

    return hook


def _timed_out_as_stall(batches: Iterator[dict[str, Any]], timeout: float) -> Iterator[dict[str, Any]]:
    """The batches; PyTorch's ``DataLoader timed out`` (``Workers(timeout=)`` without the watchdog)
    as a :class:`StallError`, which is the RuntimeError it was."""
    try:
        yield from batches
    except RuntimeError as e:
        if not str(e).startswith("DataLoader timed out"):
            raise
        raise StallError(f"{e}: no batch from the workers within Workers(timeout={timeout:g}); "
                         "Workers(stall_timeout=...) also names the worker and what it does", waited=timeout) from e


def _batch_size(batch: dict[str, Any]) -> int:
    return len(batch["__key__"])


def _pop_skipped(batch: dict[str, Any]) -> tuple[int, list[str]]:
    skipped = batch.pop(SKIPPED_KEY, None) or []
    return len(skipped), skipped


def cpu_loader(sources: Sources, o: LoaderOptions) -> Loader:
    """``decode="cpu"`` / None: DataLoader workers decode whole batches of the epoch plan."""
    w = o.workers
    index = sources.indexes[0]  # a tune result is looked up for the first dataset
    pin = torch.cuda.is_available() if w.pin_memory is None else bool(w.pin_memory)
    workers, prefetch, workers_from = resolve_auto(
        index, batch_size=o.batch_size, decode=o.decode, image_size=o.image_size,
        num_workers=o.num_workers, prefetch_factor=w.prefetch_factor, gpu=pin)
    for idx in sources.indexes:
        if o.cache_dir is None and idx.shards and is_url(idx.shard_path(0)):
            _warn_no_cache(idx, workers, _max_open(idx, o.order.shuffle_block, o.cache_dir))
    padding, tokens_field = padding_of(index, o)
    decoder: CpuDecoder | CoverDecoder | RawDecoder
    if o.decode == "cpu":
        decoder = decoder_for(o, pad=padding, tokens_field=tokens_field)
    else:
        decoder = RawDecoder(o.transform, pad=padding)
    # Storage(timeout=, retries=) ride in the fsspec options to every read of every worker
    storage_options = with_policy(o.storage.options, timeout=o.storage.timeout, retries=o.storage.retries)
    readers = [ShardSource(idx, cache_dir=o.cache_dir, cache_size=o.storage.cache_size, storage_options=storage_options,
                           max_open=_max_open(idx, o.order.shuffle_block, o.cache_dir), verify=o.storage.verify)
               for idx in sources.indexes]
    shape = Stage(o.world_size, o.batch_size, mode_of(drop_last=o.drop_last, pad=o.pad))
    dataset: ShardBatches | TokenBatches
    if o.seq_len is not None:
        dataset = TokenBatches.from_options(readers[0], o)
    elif o.batch_sampler is not None:
        dataset = SamplerBatches(readers[:1], decoder, spec=sources.spec, shape=shape, rank=o.rank,
                                 on_error=o.on_error, sampler=o.batch_sampler)
    else:
        dataset = ShardBatches(readers, decoder, spec=sources.spec, shape=shape, rank=o.rank, on_error=o.on_error)
    cursor = cursor_for(sources.indexes, o, sources.spec, stream=getattr(dataset, "stream", None))
    return Loader(
        dataset, num_workers=workers, prefetch_factor=prefetch,
        pin_memory=pin, persistent_workers=w.persistent_workers, timeout=w.timeout,
        multiprocessing_context=w.multiprocessing_context, worker_init_fn=w.worker_init_fn,
        log_every=o.log_every, workers_from=workers_from, cursor=cursor,
        reuse_buffers=w.reuse_buffers and o.seq_len is None, stall_timeout=w.stall_timeout, on_stall=w.on_stall,
        autotune=w.autotune and workers_from != "explicit",
    )


def decoder_for(o: LoaderOptions, *, pad: Padding | None = None,
                tokens_field: str | None = None) -> CpuDecoder | CoverDecoder:
    """The CPU decoder of ``decode="cpu"`` with options ``o``: the loader's, and ``fastfeed doctor``'s probes'.

    With a :class:`~fastfeed.sampling.aspect.DistributedAspectRatioSampler` as ``batch_sampler``,
    a :class:`~fastfeed.decode.cpu.CoverDecoder` over it (:func:`~fastfeed.loading.textopts.cover_decoder`).

    Example:
        >>> from fastfeed.loading.groups import Crop
        >>> from fastfeed.loading.options import loader_options
        >>> d = decoder_for(loader_options(batch_size=4, image_size=32, crop=Crop(flip=False), rank=0, world_size=1))
        >>> d.image_size, d.flip
        ((32, 32), False)
    """
    c = o.crop
    base = CpuDecoder(image_size=o.image_size, augment=o.augment, seed=o.seed, backend=o.workers.decode_backend,
                      image_field=c.image_field, transform=o.transform, scale=c.scale, ratio=c.ratio, flip=c.flip,
                      crop_fraction=c.fraction, pad=pad, tokens_field=tokens_field)
    return cover_decoder(base, o.batch_sampler, o.crop.bucket_crop) if is_aspect(o.batch_sampler) else base


def _max_open(index: DatasetIndex, shuffle_block: int, cache_dir: Any) -> int:
    """Shards a worker keeps open: enough for one shuffle block, so nothing is re-read.

    Local files and cached shards are cheap to hold (64 to 512 file handles); in-memory
    remote shards hold their bytes, so they are limited to what a block spans.
    """
    counts = [s.samples for s in index.shards if s.samples > 0]
    span = -(-shuffle_block // max(1, min(counts))) + 2 if counts else 2
    remote_in_memory = cache_dir is None and len(index.shards) > 0 and is_url(index.shard_path(0))
    return span if remote_in_memory else min(512, max(64, span))


def _warn_no_cache(index: DatasetIndex, workers: int, max_open: int) -> None:
    per_shard = sum(s.bytes for s in index.shards) / len(index.shards)
    log.warning(
        "reading remote shards without cache_dir: each of the %d workers downloads the shards it reads "
        "and keeps up to %d of them (~%s) in memory; pass cache_dir= to download each shard once per "
        "host to local disk", max(1, workers), max_open, format_bytes(max_open * per_shard),
    )
