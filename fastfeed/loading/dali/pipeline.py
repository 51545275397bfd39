"""The loader object around fastfeed's DALI pipeline (see :mod:`fastfeed.loading.dali.backend`;
the graph itself is :mod:`fastfeed.loading.dali.graph`, the epochs and resume state
:mod:`fastfeed.loading.order.cursor`).

``num_pipelines`` pipelines (one by default) live as long as the loader: built at the
first batch, kept across ``set_epoch``, ``load_state_dict``, abandoned passes and new
``iter()`` calls (a pass that starts elsewhere restarts the feed: the few batches in
flight are run out and dropped, nothing is rebuilt), released by :meth:`DaliLoader.close`
or a pipeline failure. The loader feeds them the batches of
:class:`~fastfeed.loading.dali.feed.BatchFeeder` in plan order, epoch after epoch, in
turn: the j-th batch fed since the feed (re)started goes to pipeline ``j % N`` and is
taken back from it, so the batches, their order and ``state_dict`` do not depend on N
(the turn is a schedule, not part of the state). Each pipeline is kept one batch ahead
of what DALI runs (``Pipeline.feed_input``: a batch's images as one ``TensorListCPU``,
its ``meta`` rows ``(generation, epoch, step, id, label)``); each step starts the
pipeline's next iteration before it builds the torch batch, so no Python runs between
two DALI iterations, and with N > 1 one pipeline decodes while the other's batch is
being handed over (the hardware JPEG decoder idles less; ``num_threads`` is shared
between them, :func:`~fastfeed.loading.dali.graph.split_threads`). A loader dropped
without ``close()`` leaves pipelines that draw no random numbers to the next loader of
the same shape (:mod:`fastfeed.loading.dali.reuse`). It matches every output to the
batch it fed through the ``meta`` columns, drops outputs of a superseded feed (after
``set_epoch``/``load_state_dict``/an abandoned pass), and turns outputs into torch
tensors the way DALI's own PyTorch iterator does (DLPack with DALI's dynamic executor,
else a copy on the current CUDA stream).

A pipeline that fails (a sample DALI cannot decode) is rebuilt; the culprit is found
from DALI's message (``sample #k``) or by decoding the failed batch's images one by one
with the same decoder, then raised as :class:`~fastfeed.errors.SampleError` or skipped
and counted.

A pipeline that never returns (DALI's threads or the GPU stuck) is not waited for without
a word: with ``Workers(stall_timeout=)`` (120 s by default) the training thread waits for
each output on a helper thread (:class:`OutputWait`, ~50 us a batch), logs a warning
naming the pipeline and the batch once the wait passes ``stall_timeout`` (again every 5
minutes), and with ``on_stall="raise"`` raises a :class:`~fastfeed.errors.StallError`; the
stuck pipeline is then abandoned with what it was fed (never destroyed: its threads may
still read that memory), and the next batch builds new ones. Remote shards the feed reads
are bounded by ``Storage(timeout=, retries=)``.

Example:
    >>> dl = DaliLoader(index, opts, dali=import_dali())        # doctest: +SKIP
    >>> batch = next(iter(dl)); batch["image"].device            # doctest: +SKIP
    device(type='cuda', index=0)
"""

from __future__ import annotations

import gc
import logging
import os
import re
import time
import weakref
from collections import deque
from typing import Any, Iterator, Sequence

import numpy as np
import torch

from fastfeed.loading.dali.feed import (
    EPOCH,
    GENERATION,
    SAMPLE,
    STEP,
    BatchFeeder,
    FedBatch,
    FieldReader,
    ShardMaps,
    image_bytes,
    placeholder_jpeg,
    tensor_batch,
    where,
)
from fastfeed.loading.dali.graph import (
    ENCODED,
    META,
    PROBE,
    build_pipeline,
    pipeline_seed,
    probe_pipeline,
    split_threads,
)
from fastfeed.loading.dali.cover import CoverFeed, mismatch_message
from fastfeed.loading.dali.wait import OutputWait
from fastfeed.loading.dali.reuse import PipelineSet, adopt, keep_warm, park, pipeline_key
from fastfeed.loading.dali.table import SampleTable, concat_tables, sample_table
from fastfeed.errors import ConfigError, FastfeedError, SampleError, StallError
from fastfeed.packed.index import DatasetIndex
from fastfeed.loading.order.cursor import Pass, Resumable
from fastfeed.loading.options import LoaderOptions
from fastfeed.loading.order.rankplan import PlanSpec
from fastfeed.loading.sources import cursor_for
from fastfeed.loading.stats import LoaderStats
from fastfeed.storage.retry import with_policy

# build_pipeline lives in fastfeed.loading.dali.graph; importable from here too
__all__ = ["DaliLoader", "build_pipeline"]

log = logging.getLogger(__name__)

_SAMPLE_NO = re.compile(r"sample #(\d+)")
_AHEAD = 1  # batches fed beyond the ones DALI runs (so each run finds its input fed)
_TABLES: dict[tuple[str, str, str | None], SampleTable] = {}  # the last tables read, reused
_TABLES_KEPT = 8
_ABANDONED: list[Any] = []  # pipelines that never returned, with what they were fed: kept, never destroyed


# A DALI pipeline that is garbage (dropped, in a reference cycle) when the process forks
# (a DataLoader starting its workers, say) would be destroyed by the child's garbage
# collector, where its threads do not exist: the child then hangs in the pipeline's
# destructor. Pipelines are therefore collected in the parent before a fork, and only when
# one was dropped since the last fork or a loader still exists (no cost for processes that
# never use DALI).
_PIPELINES_CHANGED = False
_LOADERS: weakref.WeakSet[Any] = weakref.WeakSet()


def _collect_before_fork() -> None:
    global _PIPELINES_CHANGED
    if _PIPELINES_CHANGED or len(_LOADERS):
        _PIPELINES_CHANGED = False
        gc.collect()


def _pipelines_changed() -> None:
    global _PIPELINES_CHANGED
    _PIPELINES_CHANGED = True


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_collect_before_fork)


def _table(index: DatasetIndex, image_field: str | None, storage_options: Any) -> SampleTable:
    """The dataset's :class:`SampleTable`, reused while the same dataset is loaded again
    (``fastfeed tune`` builds one loader per measured setting)."""
    key = (index.root, index.fingerprint, image_field)
    table = _TABLES.get(key)
    if table is None:
        table = sample_table(index, image_field, storage_options)
        while len(_TABLES) >= _TABLES_KEPT:
            _TABLES.pop(next(iter(_TABLES)))
        _TABLES[key] = table
    return table


def mixed_table(indexes: Sequence[DatasetIndex], names: Sequence[str], image_field: str | None,
                storage_options: Any) -> SampleTable:
    """One :class:`SampleTable` over the datasets of a loader (several when mixing).

    Raises:
        ConfigError: a mixed dataset holds no image DALI decodes (named, with its fields).
    """
    tables = [_table(idx, image_field, storage_options) for idx in indexes]
    if len(tables) > 1:
        for name, t, idx in zip(names, tables, indexes):
            if not (t.offsets >= 0).any():
                raise ConfigError(
                    f"{name}: decode='dali' decodes an image per sample, and this dataset has no "
                    f"{image_field or 'image'} field DALI decodes (fields: {', '.join(t.exts) or 'none'}); "
                    "mix image datasets (jpg, png, ...), pass image_field=, or use decode=None for raw bytes")
    return concat_tables(tables)


class DaliLoader(Resumable):
    """Batches of GPU-decoded images in fastfeed's order (see :mod:`fastfeed.loading.dali.backend`).

    Not a ``torch.utils.data.DataLoader`` (nothing here is a Dataset with workers), so
    Lightning and Accelerate pass it through untouched instead of re-wrapping its sampler.
    ``len``, ``epoch``, ``set_epoch``, ``state_dict`` and ``load_state_dict`` are those of
    the CPU loader (:class:`~fastfeed.loading.order.cursor.Resumable` over the same
    :class:`~fastfeed.loading.order.cursor.EpochCursor`): without ``set_epoch`` every new pass
    runs the next epoch, finished or abandoned; a pass begins at the first ``next()``, and
    only the newest pass delivers batches.

    Attributes:
        batch_size: samples per batch.
        options: the validated :class:`~fastfeed.loading.options.LoaderOptions` (DALI
            knobs and ``device_id`` resolved).
        index: the dataset index (the first one when mixing).
        indexes: every dataset's index (several when mixing: ``batch["__source__"]`` says
            which each sample is from).
        rank, world_size: this process's place in the job.
        stats: per-step wait times, throughput and skipped samples.
    """

    def __init__(self, index: DatasetIndex | Sequence[DatasetIndex], options: LoaderOptions, *, dali: Any,
                 spec: PlanSpec | None = None, names: Sequence[str] | None = None, stream: Any = None) -> None:
        self.indexes: tuple[DatasetIndex, ...] = (index,) if isinstance(index, DatasetIndex) else tuple(index)
        self.index = self.indexes[0]
        self.options = options
        self.batch_size = options.batch_size
        self.rank, self.world_size = options.rank, options.world_size
        self.stats = LoaderStats(log_every=options.log_every)
        self._cursor = cursor_for(self.indexes, options, spec, stream=stream)
        self._sampled = stream  # an aspect-ratio sampler's batches (SamplerStream), or None
        self._cover = None if stream is None else CoverFeed(options)
        self._planned: tuple[Any, ...] = ((), False)  # (prior stages, legacy) the pipe was fed for
        self._dali = dali
        # Storage(timeout=, retries=) ride in the fsspec options to every read of the feed
        storage_options = with_policy(options.storage.options, timeout=options.storage.timeout,
                                      retries=options.storage.retries)
        self._maps = ShardMaps(self.indexes, cache_dir=options.cache_dir, cache_size=options.storage.cache_size,
                               storage_options=storage_options, verify=options.storage.verify)
        names = names or [str(i.root or f"dataset {k}") for k, i in enumerate(self.indexes)]
        self._table = mixed_table(self.indexes, names, options.crop.image_field, storage_options)
        self._fields = FieldReader(self._table, self._maps)
        self._labels, self._label_field = self._label_source()
        self._as_image = np.bincount(self._table.image_ext[self._table.image_ext >= 0],
                                     minlength=len(self._table.exts)) > 0
        # the fields batches may carry beside the image (one decoded as some samples' image
        # counts for the others): "cls" when labels come from the index, "txt", "json", ...
        self._other = [e for e in self._table.exts
                       if e != self._label_field and self._beside_image(e).any()]
        self._feeder = BatchFeeder(self._table, self._maps, self._labels, self._plan, placeholder_jpeg(),
                                   pack=tensor_batch(dali), on_error=options.on_error, extra=self._cover)
        # the pipelines (batch j of the feed comes from pipeline j % N) and what they run;
        # left to the next loader of the same shape if this one is dropped unclosed
        self._set = PipelineSet(pending=self._feeder.pending)
        self._key = pipeline_key(options, dali.Pipeline)
        weakref.finalize(self, park, self._key, self._set, os.getpid()).atexit = False
        self._builds = 0  # pipeline sets built (one per loader unless closed or failed)
        self._adopted = 0  # pipeline sets taken over from a dropped loader
        self._stream: tuple[int, int] | None = None  # (epoch, step) the pipe outputs next
        self._skip_reasons: dict[int, str] = {}
        w = options.workers
        self._wait = None if w.stall_timeout is None else OutputWait(w.stall_timeout, w.on_stall)
        self._check_images()

    # ------------------------------------------------------------------ setup
    def _plan(self, epoch: int) -> Any:
        """This rank's batches of ``epoch``: the cursor's plan, or the sampler's steps (of the rest
        of the epoch after the stages of an elastic resume)."""
        if self._sampled is None:
            return self._cursor.plan(epoch)
        return self._sampled.plan(epoch, self._planned[0] if epoch == self._cursor.epoch else ())

    def _label_source(self) -> tuple[Any, str | None]:
        """Labels from the index, else parsed from the ``cls`` field (once per sample),
        else None (no ``"label"`` in batches), as ``decode="cpu"`` does."""
        if all(idx.has_labels for idx in self.indexes):
            per_source = [idx.labels for idx in self.indexes]
            if len(per_source) == 1:
                labels = per_source[0]
                return (lambda ids: np.asarray(labels[ids], dtype=np.int64)), None
            return (lambda ids: _mixed_labels(self._table, per_source, ids)), None
        if "cls" not in self._table.exts:
            return None, None
        return (lambda ids: self._fields.ints("cls", ids)), "cls"

    def _check_images(self) -> None:
        missing = self._table.missing()
        if not missing.size:
            return
        shard, key, _ = where(self._table, self._maps, int(missing[0]))
        what = self.options.crop.image_field or "jpg/jpeg/png/webp/..."
        if self.options.on_error == "raise":
            raise SampleError(
                f"{shard}: sample '{key}' has no image field ({what}), and {missing.size - 1} more "
                "samples lack one; pass image_field=, on_error='skip' (they are counted in "
                "loader.stats), or decode=None for raw fields",
                shard=shard, key=key)
        self._feeder.exclude(missing.tolist())

    # ------------------------------------------------------------------ the API
    # len, epoch, set_epoch, state_dict, load_state_dict: Resumable (fastfeed.loading.order.cursor)
    def __iter__(self) -> Iterator[dict[str, Any]]:
        return self._cursor.run(self._open_pass)

    def _open_pass(self, p: Pass) -> Iterator[dict[str, Any]]:
        if (p.prior, p.legacy) != self._planned:  # a resume at another shape: another plan
            self._planned, self._stream = (p.prior, p.legacy), None
        self.stats.begin_pass()
        return self._run(p.epoch, p.start)

    def _run(self, epoch: int, start: int) -> Iterator[dict[str, Any]]:
        clock = time.perf_counter
        for step in range(start, self._cursor.epoch_batches(epoch)):
            t0 = clock()
            batch, skipped, messages = self._next_batch(epoch, step)
            t1 = clock()
            self.stats.record(t1 - t0, t1, len(batch["__key__"]), skipped, messages)
            yield batch

    @property
    def _pipes(self) -> list[Any]:
        """The built pipelines, fed in turn (empty before the first batch or after close)."""
        return self._set.pipes

    @property
    def _pipe(self) -> Any:
        """The pipeline whose output comes next (None before the first batch or after close)."""
        return self._set.pipes[self._set.turn] if self._set.pipes else None

    @property
    def _dynamic(self) -> bool:
        """The pipelines run DALI's dynamic executor (outputs stay valid after release)."""
        return self._set.dynamic

    def close(self) -> None:
        """Release the pipelines (GPU memory, threads) now; the loader can be iterated again
        (it builds them anew). A loader dropped without ``close()`` leaves its pipelines to
        the next loader of the same shape in this process (:mod:`fastfeed.loading.dali.reuse`)."""
        self._stream = None
        self._set.release()  # the pipelines stop (and stop reading what they were fed) before
        _pipelines_changed()  # the views of the mapped shards are let go

    def __enter__(self) -> "DaliLoader":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        o = self.options
        return (f"DaliLoader({self.index.root!r}, batch_size={o.batch_size}, image_size={o.image_size}, "
                f"device_id={o.dali.device_id}, num_threads={o.dali.num_threads}, hw_decoder_load={o.dali.hw_decoder_load}, "
                f"prefetch_queue_depth={o.dali.prefetch_queue_depth}, num_pipelines={o.dali.num_pipelines}, "
                f"rank={o.rank}/{o.world_size}, "
                f"batches={len(self)})")

    # ------------------------------------------------------------------ the stream
    # The training thread feeds the pipelines: one batch per batch it takes, each pipeline
    # kept ``_AHEAD`` batch ahead of what DALI runs next. Each step first hands the
    # pipeline it took from its next iteration (release + schedule_run, its input already
    # fed), then feeds that pipeline one more and builds the torch batch while DALI works:
    # no Python stands between DALI finishing an iteration and starting the next (the
    # hand-written reader pipeline's advantage). Feeding and taking both go round the
    # pipelines in turn, so the batch fed next always goes to the pipeline just taken from.
    def _feed_from(self, epoch: int, step: int) -> None:
        """Make the pipelines output (epoch, step) next, building them if needed."""
        if self._pipes and self._stream == (epoch, step):
            return
        if not self._pipes:
            parked = adopt(self._key)
            if parked is not None:
                self._take(parked)
        self._feeder.restart(epoch, step)
        if not self._pipes:
            self._build(epoch, step)
        self._stream = (epoch, step)

    def _build(self, epoch: int, step: int) -> None:
        """Build the ``num_pipelines`` pipelines, each started on its share of the first
        batches (j % N) before the next one is built."""
        o = self.options
        self._feeder.pending.clear()
        self._builds += 1
        n = o.dali.num_pipelines
        first = [self._feeder() for _ in range(n * (o.dali.prefetch_queue_depth + _AHEAD))]
        pipes: list[Any] = []
        pipe = None
        try:
            for lane, threads in enumerate(split_threads(o.dali.num_threads, n)):
                pipe = build_pipeline(self._dali, o, pipeline_seed(o, epoch, step, self._builds, lane),
                                      num_threads=threads)
                for images, meta in first[lane::n]:
                    self._put(pipe, images, meta)
                pipe.schedule_run()  # runs prefetch_queue_depth iterations while the next is built
                pipes.append(pipe)
        except BaseException:
            pipes.clear()  # the ones started stop now (the traceback keeps this frame), before
            pipe = None  # close() lets their fed views go
            raise
        self._set.pipes, self._set.turn = pipes, 0
        self._set.dynamic = bool(getattr(pipes[0], "exec_dynamic", False))
        keep_warm(lambda: probe_pipeline(self._dali, o), o.dali.device_id if o.gpu else None)  # later builds: ~0.2 s
        _pipelines_changed()
        _LOADERS.add(self)

    def _take(self, parked: PipelineSet) -> None:
        """Run the pipelines of a dropped loader (:mod:`~fastfeed.loading.dali.reuse`): its
        batches in flight stay pending under their old generations, so the restart that
        follows supersedes them (they are run out and dropped) without a build."""
        stale = list(parked.pending)
        self._feeder.pending.clear()
        self._feeder.pending.extend(stale)
        self._feeder.generation = max([self._feeder.generation, *(f.generation for f in stale)])
        self._set.pipes, self._set.turn, self._set.dynamic = parked.pipes, parked.turn, parked.dynamic
        parked.pipes, parked.pending = [], deque()
        self._adopted += 1
        _LOADERS.add(self)

    def _feed_one(self, pipe: Any) -> None:
        images, meta = self._feeder()
        self._put(pipe, images, meta)

    @staticmethod
    def _put(pipe: Any, images: Any, meta: np.ndarray) -> None:
        pipe.feed_input(ENCODED, images)
        pipe.feed_input(META, meta)

    def _advance(self, epoch: int, step: int) -> None:
        n = self._cursor.epoch_batches(epoch)
        self._stream = (epoch, step + 1) if step + 1 < n else (epoch + 1, 0)

    def _next_batch(self, epoch: int, step: int) -> tuple[dict[str, Any], int, list[str]]:
        try:
            return self._next_batch_or_fail(epoch, step)
        except BaseException:
            self.close()  # a failure in the feed (a missing shard, ...) or an interrupt
            raise

    def _next_batch_or_fail(self, epoch: int, step: int) -> tuple[dict[str, Any], int, list[str]]:
        while True:
            self._feed_from(epoch, step)
            try:
                outs = self._outputs(epoch, step)
            except RuntimeError as e:
                if isinstance(e, StallError):
                    raise
                self._failed(e, epoch, step)
                continue
            fed = self._feeder.pending.popleft()
            if fed.generation != self._feeder.generation:
                self._next_iteration()  # a batch of a superseded feed
                continue
            meta = np.array(outs[2].as_tensor())
            if (meta[0, GENERATION], meta[0, EPOCH], meta[0, STEP]) != (fed.generation, epoch, step) \
                    or fed.step != step:
                raise FastfeedError(
                    f"internal error: DALI returned batch {tuple(meta[0, :3])} where ({fed.generation}, "
                    f"{epoch}, {step}) was expected; please report it")
            if self._dynamic:  # outputs stay valid after release: start the next iteration first
                self._next_iteration()
                batch, dropped = self._to_batch(outs, meta[:, SAMPLE], fed.valid)
            else:  # release recycles the output buffers: copy them out first
                batch, dropped = self._to_batch(outs, meta[:, SAMPLE], fed.valid)
                self._next_iteration()
            self._advance(epoch, step)
            skipped = [*fed.skipped, *dropped]
            return batch, len(skipped), [self._skip_message(i, "no image") for i in skipped]

    def _outputs(self, epoch: int, step: int) -> Any:
        """The next pipeline's outputs; waited for within ``Workers(stall_timeout=)`` (module docstring)."""
        pipe = self._pipe
        if self._wait is None:
            return pipe.share_outputs()
        where = f"epoch {epoch}, batch {step}; pipeline {self._set.turn + 1} of {len(self._set.pipes)}"
        try:
            return self._wait.outputs(pipe, where)
        except StallError:
            # the stuck pipeline keeps what it was fed (its threads may read it) and is never destroyed;
            # close() then lets the loader's references go, and the next batch builds new pipelines
            _ABANDONED.append((list(self._set.pipes), list(self._feeder.pending)))
            self._wait = OutputWait(self._wait.stall_timeout, self._wait.on_stall)  # its thread is stuck too
            raise

    def _next_iteration(self) -> None:
        """Give the consumed outputs back, run the pipeline's next (already fed) iteration,
        feed it one more; the next output comes from the next pipeline."""
        pipe = self._pipe
        pipe.release_outputs()
        pipe.schedule_run()
        self._feed_one(pipe)
        self._set.turn = (self._set.turn + 1) % len(self._set.pipes)

    def _tensor(self, out: Any) -> torch.Tensor:
        t = out.as_tensor()
        on_gpu = type(t).__name__ == "TensorGPU"
        device = torch.device("cuda", self.options.dali.device_id) if on_gpu else torch.device("cpu")
        if self._dynamic:  # outputs are not reused: share them
            with device:
                return torch.from_dlpack(t)
        x = torch.empty(t.shape(), dtype=self._dali.to_torch_type[t.dtype], device=device)
        stream = torch.cuda.current_stream(device) if on_gpu else None
        self._dali.feed_ndarray(t, x, cuda_stream=stream)
        return x

    def _to_batch(self, outs: Any, ids: np.ndarray, valid: np.ndarray) -> tuple[dict[str, Any], list[int]]:
        """Torch batch of one pipeline output (``valid``: per fed sample, False on padding);
        also returns samples dropped here (bad fields, a header that lies)."""
        images = self._tensor(outs[0])
        labels = self._tensor(outs[1]) if self._labels is not None else None
        keep = ids >= 0  # placeholder rows (a batch whose samples were all skipped) go
        others: dict[str, list[Any]] = {}
        dropped: list[int] = []
        top_left = None
        if self._cover is not None:
            top_left = self._cover.top_left(np.array(outs[2].as_tensor()))
            shapes = np.array(outs[3].as_tensor())
            for j in self._cover.mismatched(ids, shapes):
                self._refuse(int(ids[j]), mismatch_message(shapes[j], self._cover.sizes[ids[j]]))
                keep[j] = False
                dropped.append(int(ids[j]))
        for ext in self._other:
            values, bad = self._field_values(ext, ids)
            if values is not None:
                others[ext] = values
            for j in bad:
                keep[j] = False
                dropped.append(int(ids[j]))
        if not keep.all():
            mask = torch.from_numpy(keep).to(images.device)
            images = images[mask]
            labels = labels[mask] if labels is not None else None
            others = {k: [v for v, kp in zip(vals, keep.tolist()) if kp] for k, vals in others.items()}
            ids = ids[keep]
            valid = valid[keep]
            top_left = None if top_left is None else top_left[keep]
        batch: dict[str, Any] = {"image": images}
        if labels is not None:
            batch["label"] = labels
        batch["__key__"] = self._table.keys(ids)
        batch.update(others)
        batch["__source__"] = torch.from_numpy(self._table.source_of(ids))
        batch["valid"] = torch.from_numpy(np.ascontiguousarray(valid, dtype=bool))
        if top_left is not None:  # SDXL's conditioning, as decode="cpu" gives it
            batch["original_size"] = torch.from_numpy(self._cover.sizes[ids].reshape(-1, 2))
            batch["crop_top_left"] = torch.from_numpy(np.ascontiguousarray(top_left))
        return batch, dropped

    def _refuse(self, i: int, why: str) -> None:
        """Sample ``i`` cannot be delivered: a SampleError naming it, or (``on_error="skip"``) its reason kept."""
        shard, key, offset = where(self._table, self._maps, i)
        if self.options.on_error == "raise":
            raise SampleError(f"{shard}: sample '{key}': {why}", shard=shard, key=key, offset=offset)
        self._skip_reasons[i] = why

    def _beside_image(self, ext: str, ids: np.ndarray | slice = slice(None)) -> np.ndarray:
        """Which of samples ``ids`` hold field ``ext`` other than as their image."""
        has = self._table.field_offsets[ext][ids] >= 0
        if self._as_image[self._table.exts.index(ext)]:
            has &= self._table.image_ext[ids] != self._table.exts.index(ext)
        return has

    def _field_values(self, ext: str, ids: np.ndarray) -> tuple[list[Any] | None, list[int]]:
        """Another field of the batch decoded like the CPU path, or None when no sample
        here has it (beside as its image); and the rows that failed with on_error='skip'."""
        image_ext = self._table.exts.index(ext)
        as_image = self._as_image[image_ext]  # does any sample decode this field as its image?
        if not self._beside_image(ext, ids[ids >= 0]).any():
            return None, []
        safe = np.maximum(ids, 0)
        try:
            values = self._fields.values(ext, safe)
        except SampleError:
            if self.options.on_error == "raise":
                raise
            values, bad = [], []
            for j, i in enumerate(safe.tolist()):
                try:
                    values.extend(self._fields.values(ext, safe[j : j + 1]))
                except SampleError as e:
                    values.append(None)
                    bad.append(j)
                    self._skip_reasons[i] = str(e)
            return values, bad
        if as_image:
            is_image = (self._table.image_ext[safe] == image_ext).tolist()
            values = [None if img else v for v, img in zip(values, is_image)]
        return values, []

    # ------------------------------------------------------------------ failures
    def _failed(self, error: RuntimeError, epoch: int, step: int) -> None:
        """A pipeline run failed: find the sample(s), then raise or skip and rebuild."""
        fed = self._feeder.pending[0] if self._feeder.pending else None
        current = self._feeder.generation
        self.close()  # DALI documents the pipeline as unusable after an error
        if fed is None or fed.generation != current:  # a superseded batch failed: just rebuild
            return
        if (fed.epoch, fed.step) != (epoch, step):
            raise FastfeedError(f"internal error: DALI failed on batch {fed.step} of epoch {fed.epoch} "
                                f"while batch {step} of epoch {epoch} was due ({error})") from error
        text = str(error)
        bad = self._culprits(fed, text)
        reason = _first_line(text)
        if self.options.on_error == "raise":
            i = bad[0]
            shard, key, offset = where(self._table, self._maps, i)
            more = f" ({len(bad) - 1} more in the batch)" if len(bad) > 1 else ""
            raise SampleError(
                f"{shard}: DALI cannot decode sample '{key}' (image at byte {offset}){more}: {reason}; "
                "fix or remove the file and re-pack, or pass on_error='skip'",
                shard=shard, key=key, offset=offset) from None
        self._feeder.exclude(bad)
        log.debug("DALI failed on %d sample(s) of epoch %d batch %d: %s", len(bad), epoch, step, reason)
        self._skip_reasons.update({i: reason for i in bad})

    def _culprits(self, fed: FedBatch, text: str) -> list[int]:
        """Sample numbers that made DALI fail: the ``sample #k`` of its message, else the
        samples of the batch that fail alone in a one-sample pipeline with the same decoder."""
        m = _SAMPLE_NO.search(text)
        if m is not None and int(m.group(1)) < len(fed.ids) and fed.ids[int(m.group(1))] >= 0:
            return [int(fed.ids[int(m.group(1))])]
        bad = self._probe([int(i) for i in fed.ids.tolist() if i >= 0])
        if not bad:
            raise FastfeedError(
                f"DALI failed on batch {fed.step} of epoch {fed.epoch} and no single sample of it fails "
                f"alone, so it is not a bad image: {_first_line(text)}")
        return bad

    def _probe(self, ids: list[int]) -> list[int]:
        """The samples that DALI's decoder (same device and settings) cannot decode alone."""
        bad: list[int] = []
        pipe = None
        for i in ids:
            if pipe is None:
                pipe = probe_pipeline(self._dali, self.options)
            try:
                pipe.feed_input(PROBE, [np.frombuffer(image_bytes(self._table, self._maps, i), np.uint8)])
                pipe.run()
            except RuntimeError:
                bad.append(i)
                pipe = None  # unusable after an error
        return bad

    def _skip_message(self, i: int, default: str) -> str:
        shard, key, offset = where(self._table, self._maps, i)
        reason = self._skip_reasons.get(i) or self._feeder.reasons.get(i, default)  # the feed's: a bad checksum
        return f"{shard}: sample '{key}' (image at byte {offset}): {reason}"


def _mixed_labels(table: SampleTable, labels: Sequence[Any], ids: np.ndarray) -> np.ndarray:
    """The index labels of global samples ``ids`` of mixed datasets (each its own labels)."""
    out = np.empty(ids.shape[0], dtype=np.int64)
    source = table.source_of(ids)
    starts = table.source_starts if table.source_starts is not None else np.zeros(1, dtype=np.int64)
    for k in np.unique(source).tolist():
        m = source == k
        out[m] = np.asarray(labels[k][ids[m] - starts[k]], dtype=np.int64)
    return out


def _first_line(text: str) -> str:
    """The informative line of a DALI error (after 'encountered:'), else its first line."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for k, ln in enumerate(lines):
        if ln.startswith("encountered") and k + 1 < len(lines):
            return lines[k + 1]
    return lines[0] if lines else "unknown DALI error"
