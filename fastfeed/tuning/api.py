"""``fastfeed tune``: pick ``num_workers`` / ``prefetch_factor`` by measuring, not guessing.

:func:`tune` measures the real loader (``fastfeed.loader()``, the same decode and
augmentation) at candidate settings chosen by :func:`fastfeed.tuning.search.search` (climb
workers while throughput rises, stop on a plateau, then prefetch factor, then the
decode mode's own knobs, then a longer interleaved re-measure of the top candidates
that makes the choice), within a time and memory budget, and stores the result where
``loader(num_workers="auto", prefetch_factor="auto")`` finds it
(:mod:`fastfeed.knobs.record`). Every measurement goes through :func:`fastfeed.timing.measure.measure`.

Without a stored result, :func:`resolve_auto` falls back to a heuristic (see
:func:`heuristic_workers`) and logs a one-line hint to run ``fastfeed tune``, once per
process.

Example:
    >>> r = fastfeed.tune("/data/imagenet-ff", batch_size=256, image_size=224)  # doctest: +SKIP
    >>> print(r.table())                                                        # doctest: +SKIP
    >>> dl = fastfeed.loader("/data/imagenet-ff", batch_size=256, image_size=224)  # uses it # doctest: +SKIP
"""

from __future__ import annotations

import datetime
import logging
import multiprocessing as mp
import os
import pickle
import time
import warnings
from dataclasses import replace
from typing import Any, Callable, Mapping

from fastfeed._options import check_int, fill_doc, mapping_or_none, number, path_or_none
from fastfeed._util import format_bytes, parse_duration, parse_size
from fastfeed.formats.naming import holds_pixels
from fastfeed.dist import local_world_size, resolve_world
from fastfeed.errors import ConfigError
from fastfeed.host import cpu_count, memory_total
from fastfeed.loading.api import build_loader
from fastfeed.loading.autotune import GOAL as WAIT_GOAL
from fastfeed.loading.auto import (
    HEURISTIC_MAX_WORKERS,
    heuristic_workers,
    lookup,
    resolve_auto,
)
from fastfeed.knobs.space import SearchSpace, Setting, space_for, worker_ladder
from fastfeed.knobs.record import (
    TuneKey,
    TuneRecord,
    better_stored,
    save_record,
    stored_record,
)
from fastfeed.loading.groups import Crop, Dali, Order, Storage, Tokens, Workers
from fastfeed.loading.options import MAX_WORKERS, LoaderOptions, loader_options, with_values
from fastfeed.loading.sources import as_sources
from fastfeed.packed.reader import resolve_index
from fastfeed.timing.measure import Measurement, measure
from fastfeed.tuning.defaults import check_demand, resolve_defaults, small_dataset_note
from fastfeed.tuning.report import TuneResult, plot_result, require_plot
from fastfeed.tuning.search import Trial, search

__all__ = [
    "HEURISTIC_MAX_WORKERS",
    "LOADER_OPTIONS",
    "TuneResult",
    "busy_step",
    "heuristic_workers",
    "lookup",
    "measure_loader",
    "measured_options",
    "resolve_auto",
    "tune",
]

log = logging.getLogger(__name__)

# ---------------------------------------------------------------------- the measured loader's options
#: The ``loader()`` options ``tune`` and ``doctor`` take besides their own: the ones that change
#: what a batch costs (their doc lines come from :class:`~fastfeed.loading.options.LoaderOptions`).
LOADER_OPTIONS = ("augment", "transform", "seq_len", "cache_dir", "crop", "workers", "dali", "storage", "tokens",
                  "order")


def measured_options(*, batch_size: int, decode: str | None, image_size: Any, seed: int = 0,
                     loader_kwargs: Mapping[str, Any] | None = None, caller: str = "tune",
                     **options: Any) -> LoaderOptions:
    """The options of the loaders ``tune`` / ``doctor`` measure: training's, shuffled, validated once.

    ``options`` are :data:`LOADER_OPTIONS` (None: the loader's default); ``loader_kwargs``
    is their former spelling as one dict (a ``FutureWarning`` names the new one).

    Example:
        >>> o = measured_options(batch_size=64, decode=None, image_size=None, rank=0, world_size=1)
        >>> o.batch_size, o.shuffle
        (64, True)
    """
    given = {k: v for k, v in options.items() if v is not None}
    if loader_kwargs:
        shown = ", ".join(f"{k}=..." for k in loader_kwargs)
        warnings.warn(f"{caller}(loader_kwargs={{...}}) is the former spelling; pass the loader's options "
                      f"directly: {caller}(path, {shown}) with the groups fastfeed.Crop/Workers/Dali/Storage/"
                      "Tokens/Order; it still works in this release", FutureWarning, stacklevel=3)
        given = {**dict(loader_kwargs), **given}
    return loader_options(_stacklevel=4, batch_size=batch_size, decode=decode, image_size=image_size, shuffle=True,
                          seed=seed, **given)


# ---------------------------------------------------------------------- measuring the loader
def measure_loader(
    path: str | os.PathLike[str],
    setting: Setting,
    *,
    options: LoaderOptions | None = None,
    batch_size: int | None = None,
    decode: str | None = "cpu",
    image_size: int | tuple[int, int] | None = None,
    seconds: float = 5.0,
    min_batches: int = 8,
    min_rounds: int = 4,
    seed: int = 0,
    loader_kwargs: Mapping[str, Any] | None = None,
    clock: Callable[[], float] = time.perf_counter,
    consume: Callable[[Any], None] | None = None,
    on_loader: Callable[[Any], None] | None = None,
) -> Measurement:
    """Measure ``fastfeed.loader()`` at one setting (what tune, doctor and the benchmarks run).

    ``options``: the loader's validated options (:func:`measured_options`), of which the
    setting replaces ``num_workers``, ``prefetch_factor`` and the decode mode's knobs;
    without them, ``batch_size``, ``decode``, ``image_size``, ``seed`` and ``loader_kwargs``
    (``loader()`` keywords) build them.

    A measurement times at least ``0.6 x seconds`` of steady state and ``min_rounds``
    batches per worker, after start-up and warm-up (found from the arrivals, see
    :func:`fastfeed.timing.measure.measure`), and stops at ``3 x seconds`` in all (then it may
    come back with ``steady`` False). Epochs restart (with ``set_epoch``) when the
    dataset is shorter than the measurement; with persistent workers (the loader's
    default) the epochs are measured as one stream, boundaries included, so a short
    epoch is not mistaken for its prefetched burst. Memory of the main process and its
    workers is sampled. ``consume`` is called with every batch inside the
    timed loop (``fastfeed doctor`` simulates a training step with it); ``on_loader`` gets
    the loader before measuring starts (its ``stats`` stay readable afterwards).
    ``num_workers=0`` with CPU decode (and no callbacks) is measured in a forked child
    process, so OpenCV's thread pool never starts in this one (see :func:`_in_child`).

    Example:
        >>> m = measure_loader("/data/ff", Setting(4, 2), batch_size=256)  # doctest: +SKIP
        >>> m.samples_per_s                                                # doctest: +SKIP
    """
    if options is None:
        if batch_size is None:
            raise ConfigError("measure_loader() needs options= or batch_size=")
        with warnings.catch_warnings():  # the former spellings of loader_kwargs: a benchmark's own business
            warnings.simplefilter("ignore", FutureWarning)
            options = loader_options(batch_size=batch_size, decode=decode, image_size=image_size, shuffle=True,
                                     seed=seed, **dict(loader_kwargs or {}))
    o = with_values(options, setting.loader_kwargs())
    if (setting.num_workers == 0 and o.decode in ("cpu", None) and consume is None and on_loader is None
            and "fork" in mp.get_all_start_methods()):
        return _in_child(lambda: _measure_loader(path, setting, o, seconds=seconds, min_batches=min_batches,
                                                 min_rounds=min_rounds, clock=clock))
    return _measure_loader(path, setting, o, seconds=seconds, min_batches=min_batches, min_rounds=min_rounds,
                           clock=clock, consume=consume, on_loader=on_loader)


#: A stand-in step spins at most this many times its CPU seconds on the wall clock (a starved thread).
BUSY_STEP_MAX_WALL = 10.0


def busy_step(seconds: float) -> Callable[[Any], None]:
    """A stand-in for a training step: ``seconds`` of CPU on the calling thread per batch.

    ``tune(step_time=)`` measures every setting with it, so the loader is measured as the job
    runs it: ``num_workers=0`` decodes between steps, not beside them, and a worker that takes
    the training thread's core slows the step. It spins until the thread's own CPU time has
    advanced by ``seconds`` (``time.thread_time``), not to a wall-clock deadline: a spin to a
    deadline would take the same wall time however many workers compete for its core, and on
    2 cores tune then chose 2 workers, which gave the real job 30% fewer samples/s than 1 (bounded at
    :data:`BUSY_STEP_MAX_WALL` times ``seconds`` of wall clock).

    Example:
        >>> import time
        >>> t0 = time.thread_time(); busy_step(0.01)(None); time.thread_time() - t0 >= 0.01
        True
    """
    def step(batch: Any) -> None:
        cpu_end = time.thread_time() + seconds
        wall_end = time.perf_counter() + BUSY_STEP_MAX_WALL * seconds
        while time.thread_time() < cpu_end and time.perf_counter() < wall_end:
            pass

    return step


def _in_child(fn: Callable[[], Measurement]) -> Measurement:
    """Run ``fn`` in a forked child process and return its measurement (or raise its error).

    Why: decoding in this process starts OpenCV's thread pool, which is not fork-safe: a
    DataLoader worker forked after it hangs in its first OpenCV call (``setNumThreads``
    waits on a condition variable of threads that do not exist in the child). Measuring
    ``num_workers=0`` in a child keeps this process's decoder unused, so the worker
    settings measured after it start cleanly. (The decoder now keeps OpenCV single-threaded
    in every process, which removes the pool; the child stays as a second guard.) Where CUDA
    is available the measurement runs here: a child forked after this process touched the
    driver (``torch.cuda.is_available()`` may, without ``is_initialized()`` saying so) fails
    its first pinned batch with "CUDA error: initialization error" (seen on an H200).
    """
    import torch

    if torch.cuda.is_initialized() or torch.cuda.is_available():  # a forked child cannot use CUDA
        return fn()
    ctx = mp.get_context("fork")
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child_main, args=(fn, send))
    proc.start()
    send.close()
    try:
        ok, value = recv.recv()
    except EOFError:
        proc.join()
        raise RuntimeError(f"the num_workers=0 measuring process died (exit code {proc.exitcode})") from None
    finally:
        recv.close()
    proc.join()
    if not ok:
        raise value
    return value


def _child_main(fn: Callable[[], Measurement], send: Any) -> None:
    try:
        result: tuple[bool, Any] = (True, fn())
    except Exception as e:  # handed to the parent, which raises it
        result = (False, e)
    try:
        send.send(result)
    except (TypeError, AttributeError, pickle.PicklingError):  # an error that does not pickle
        send.send((False, RuntimeError(f"{type(result[1]).__name__}: {result[1]}")))
    finally:
        send.close()


def _measure_loader(
    path: str | os.PathLike[str], setting: Setting, options: LoaderOptions, *, seconds: float, min_batches: int,
    min_rounds: int, clock: Callable[[], float], consume: Callable[[Any], None] | None = None,
    on_loader: Callable[[Any], None] | None = None,
) -> Measurement:
    persistent = setting.num_workers == 0 or options.workers.persistent_workers
    with warnings.catch_warnings():  # tune oversubscribes the cores on purpose
        warnings.filterwarnings("ignore", message=r"This DataLoader will create \d+ worker processes",
                                category=UserWarning)
        dl = build_loader(as_sources(str(path)), options)
        if on_loader is not None:
            on_loader(dl)
        epoch = 0

        def one_epoch() -> Any:
            nonlocal epoch
            if hasattr(dl, "set_epoch"):
                dl.set_epoch(epoch)
            epoch += 1
            return iter(dl)

        try:
            return measure(one_epoch, num_workers=setting.num_workers,
                           prefetch_factor=setting.prefetch_factor, min_batches=min_batches,
                           min_time=0.6 * seconds, min_rounds=min_rounds, max_time=3 * seconds,
                           persistent=persistent, consume=consume, sample_memory=True, clock=clock)
        finally:
            _shutdown(dl)


def _shutdown(dl: Any) -> None:
    """Stop the loader's workers now, so the next setting's memory reading is its own."""
    close = getattr(dl, "close", None)
    if callable(close):
        close()
        return
    it = getattr(dl, "_iterator", None)  # persistent workers live on DataLoader._iterator
    stop = getattr(it, "_shutdown_workers", None)
    if callable(stop):
        stop()
        dl._iterator = None


# ---------------------------------------------------------------------- tune()
#: Confirmation trials are this much longer than search trials.
CONFIRM_SCALE = 1.5
#: Candidates confirmed, and rounds of re-measuring each.
CONFIRM_TOP, CONFIRM_ROUNDS = 3, 2
#: Share of the time budget kept for confirmation.
CONFIRM_SHARE = 0.4
#: Seconds per trial when the batch is larger than the dataset per rank (only num_workers=0 is measured).
SMALL_TRIAL_S = 2.0
#: Why only num_workers=0 is measured then.
SMALL_WHY = "every epoch is one partial batch, which no worker can prepare ahead"


def _per_trial_time(budget: float, space: SearchSpace, cap: int, cores_per_rank: int) -> float:
    """Seconds per measurement so that a typical search fits the budget.

    A typical search measures the ladder up to a plateau a little past the cores (at
    most ~7 rungs), ~3 refine/prefetch points, each knob's values, and confirms the
    top candidates with longer trials.
    """

    rungs = len(space.workers) if space.workers is not None else len(
        [w for w in worker_ladder(cap) if w <= cores_per_rank + 2])
    expected = min(rungs, 7) + 3 + sum(len(k.candidates(cores_per_rank)) - 1 for k in space.knobs)
    expected += CONFIRM_TOP * CONFIRM_ROUNDS * CONFIRM_SCALE
    return min(20.0, max(1.0, budget / max(1, expected)))


def tune(
    path: str | os.PathLike[str],
    *,
    batch_size: int | None = None,
    decode: str | None = "cpu",
    image_size: int | tuple[int, int] | str | None = "auto",
    augment: bool | None = None,
    transform: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    seq_len: int | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    crop: Crop | Mapping[str, Any] | None = None,
    workers: Workers | Mapping[str, Any] | None = None,
    dali: Dali | Mapping[str, Any] | None = None,
    storage: Storage | Mapping[str, Any] | None = None,
    tokens: Tokens | Mapping[str, Any] | None = None,
    order: Order | Mapping[str, Any] | None = None,
    time_budget: str | float = "60s",
    max_workers: int | None = None,
    target_rate: float | None = None,
    step_time: float | None = None,
    memory_budget: str | int | None = None,
    headroom: float = 0.1,
    trial_time: float | None = None,
    plot: str | os.PathLike[str] | None = None,
    store: bool = True,
    store_dir: str | os.PathLike[str] | None = None,
    replace_better: bool = False,
    seed: int = 0,
    loader_kwargs: Mapping[str, Any] | None = None,
    on_trial: Callable[[Trial], None] | None = None,
) -> TuneResult:
    """Measure the loader at candidate settings and choose ``num_workers`` / ``prefetch_factor``.

    Targets are per rank: what one GPU's training step consumes. The result is stored
    (see :mod:`fastfeed.knobs.record`) so ``loader(num_workers="auto")`` uses it.

    Args:
        path: a packed dataset (folder or URL).
        batch_size: the per-rank batch size training uses (default
            :data:`~fastfeed.tuning.defaults.DEFAULT_BATCH_SIZE`, the same as ``doctor``'s).
        decode: the decode mode (``"cpu"``, ``"dali"``, None for raw bytes).
        image_size: the output size training uses (decode cost depends on it); ``"auto"``:
            224 when the dataset has images (and is decoded), else None, as ``doctor``.
        {loader options}
        time_budget: measuring time, e.g. ``"60s"`` or ``"2m"``.
        max_workers: cap on workers (default: twice the cores per rank).
        target_rate: samples/s the training step consumes per rank; picks the cheapest
            setting that reaches it (plus ``headroom``) and leaves the other cores free.
        step_time: the training step's seconds per batch instead: every setting is measured
            with a stand-in for the step (:func:`busy_step`: ``step_time`` of CPU on the
            measuring thread per batch, as a training thread uses its core), and the target
            is the step's own rate less the data wait the loader's autotune aims below
            (``batch_size / step_time x (1 - 2%)``, no headroom): the loader alone delivers
            more than in the job (``num_workers=0`` decodes between steps, not beside them).
        memory_budget: what main process + workers may use, e.g. ``"16GB"`` (default:
            half of the usable memory divided by ``LOCAL_WORLD_SIZE``).
        headroom: margin above the target (default 10%).
        trial_time: seconds to measure each setting (steady state for at least 60% of
            it, after start-up and warm-up; at most 3x in all); default: the budget
            divided by the number of settings a search usually needs. The top
            candidates are then re-measured with 1.5x longer trials.
        plot: write throughput against workers to this PNG (needs matplotlib).
        store: store the result for ``loader(num_workers="auto")``.
        store_dir: store there instead of the dataset folder / user cache.
        replace_better: store even when the stored result for the same key is better
            (steady where this one is not, confirmed, or measured over twice as long);
            otherwise that one is kept and ``TuneResult.notes`` says so.
        seed: shuffle seed of the measured loader.
        loader_kwargs: the former spelling of the options above as one dict (a ``FutureWarning``).
        on_trial: called after every measured setting (progress).

    Returns:
        A :class:`TuneResult`.

    Example:
        >>> r = tune("/data/imagenet-ff", batch_size=256, image_size=224, step_time=0.25)  # doctest: +SKIP
        >>> r.num_workers, r.prefetch_factor, r.reason                                     # doctest: +SKIP
    """

    target_rate, step_time = check_demand(target_rate, step_time)
    if max_workers is not None:
        max_workers = check_int("max_workers", max_workers, 0, most=MAX_WORKERS)
    trial_time = number(0, above=True, none=True, unit="seconds per setting")(trial_time, "trial_time")
    loader_kwargs = mapping_or_none(loader_kwargs, "loader_kwargs")
    if path_or_none(plot, "plot") is not None:
        require_plot(plot)  # before measuring for the whole budget
    index = resolve_index(path, cache_dir=cache_dir)  # what the loader accepts: a packed dataset, or WebDataset tars
    chosen = resolve_defaults(has_images=any(holds_pixels(f) for f in index.fields), batch_size=batch_size,
                              image_size=image_size, decode=decode)
    batch_size, image_size = chosen.batch_size, chosen.image_size
    if chosen.assumed:
        log.info("tune: %s", chosen.line())
    options = measured_options(batch_size=batch_size, decode=decode, image_size=image_size, seed=seed,
                               loader_kwargs=loader_kwargs, augment=augment, transform=transform, seq_len=seq_len,
                               cache_dir=cache_dir, crop=crop, workers=workers, dali=dali, storage=storage,
                               tokens=tokens, order=order)
    consume = None
    if step_time is not None:
        # measured beside a stand-in for the step, a setting delivers at most the step's rate
        target_rate, headroom, consume = batch_size / step_time * (1 - WAIT_GOAL), 0.0, busy_step(step_time)
    budget = parse_duration(time_budget, "time_budget")
    if budget <= 0:
        raise ConfigError(f"time_budget={time_budget!r} must be positive")
    ranks = local_world_size()
    cores = cpu_count()
    mem_budget = (parse_size(memory_budget, "memory_budget") if memory_budget is not None
                  else (memory_total() // (2 * ranks) or None))

    space = space_for(decode)
    cores_per_rank = max(1, cores // ranks)
    cap = 2 * cores_per_rank if max_workers is None else max_workers
    per_trial = trial_time if trial_time is not None else _per_trial_time(budget, space, cap, cores_per_rank)
    world = resolve_world()[1]
    note = small_dataset_note(index.num_samples, batch_size, world)
    confirm_top = CONFIRM_TOP
    if note:  # checked before measuring: said at once, then the one setting that makes sense, briefly
        space, per_trial, confirm_top = replace(space, workers=(0,), knobs=()), min(per_trial, SMALL_TRIAL_S), 0
        log.warning("tune: %s: %s", note.partition(": ")[0], SMALL_WHY + ", so only num_workers=0 is measured "
                    "(a few seconds); the warning at the end says what to do")
    log.info("tune: %d cores (%d per rank), %.1f s per setting, memory budget %s", cores,
             cores_per_rank, per_trial, format_bytes(mem_budget) if mem_budget else "none")

    def measure_fn(s: Setting, seconds: float = per_trial) -> Measurement:
        return measure_loader(index.root or path, s, options=options, seconds=seconds, consume=consume)

    def confirm_fn(s: Setting) -> Measurement:
        return measure_fn(s, CONFIRM_SCALE * per_trial)

    start = time.monotonic()
    out = search(measure_fn, cores=cores, space=space, local_world_size=ranks,
                 max_workers=max_workers, target_rate=target_rate, headroom=headroom,
                 memory_budget=mem_budget, time_budget=budget, confirm_top=confirm_top,
                 confirm_rounds=CONFIRM_ROUNDS, confirm_fn=confirm_fn, confirm_scale=CONFIRM_SCALE,
                 confirm_share=CONFIRM_SHARE, on_trial=on_trial)
    key = TuneKey.current(index.fingerprint, batch_size=batch_size, decode=decode,
                          image_size=image_size, local_world_size=ranks)
    m = out.best.measurement
    if m is None:  # pragma: no cover - search only chooses measured trials
        raise ConfigError("tune: the chosen setting has no measurement")
    reason = out.reason
    if note:  # in result.notes (summary, JSON) with what to do; said in short before measuring
        reason = (f"{SMALL_WHY} ({index.num_samples // world} samples per rank, batch {batch_size}): "
                  f"num_workers=0, measured once ({out.rate:,.0f} samples/s)")
    result = TuneResult(str(path), key, out.best.setting, m, out.trials, reason, target_rate,
                        out.target_met, cores, cores_per_rank, mem_budget, budget,
                        time.monotonic() - start, out.out_of_time, confirmed=out.confirmed,
                        notes=(note,) if note else ())
    if store:
        result = _store(result, index, store_dir, replace_better)
    if plot is not None:
        try:
            plot_result(result, plot)
        except OSError as e:  # the measurements are worth more than the picture: keep them
            log.info("tune: --plot %s: %s", plot, e)
            result = replace(result, notes=result.notes + (f"the plot was not written ({plot}: {e})",))
    return result


def _store(result: TuneResult, index: Any, store_dir: Any, replace_better: bool) -> TuneResult:
    s = result.setting
    details = {k: v for k, v in result.to_json().items() if k not in ("key", "stored_at", "notes")}
    rec = TuneRecord(result.key, s.num_workers, s.prefetch_factor, dict(s.knobs),
                     result.samples_per_s,
                     datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                     details)
    root = str(index.root or result.path)
    old = stored_record(root, result.key, store_dir)
    why = None if old is None or replace_better else better_stored(old, rec)
    if why is not None:
        note = (f"not stored: the result stored in {old.path} is better ({why}) and stays what "
                f"loader(num_workers='auto') uses (num_workers={old.num_workers}); tune with a longer "
                "--time-budget, or pass --replace (replace_better=True) to store this one anyway")
        log.info("tune: %s", note)
        return replace(result, notes=result.notes + (note,))
    where = save_record(rec, root, store_dir)
    return replace(result, stored_at=str(where))


fill_doc(tune, LoaderOptions, names=LOADER_OPTIONS, marker="{loader options}")
