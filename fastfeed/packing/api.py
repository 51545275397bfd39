"""``fastfeed pack``: small files -> tar (WebDataset) or LMDB shards plus a versioned index.

Packing is three steps with a public, picklable interface, so that any engine produces
the same bytes:

1. :func:`~fastfeed.packing.plan.plan_pack` (``src, dst, **options -> PackPlan``): walk, group
   by key, validate, order (shuffle), cut into balanced shards; checks and prepares DST.
2. :func:`~fastfeed.packing.write.write_shard` (``plan, number -> ShardResult``): write one
   shard atomically (or reuse a complete one from an interrupted run).
3. :func:`finalize` (``plan, results -> DatasetIndex``): write the sidecars,
   ``skipped.txt`` and, last and atomically, ``index.json``.

:func:`pack` runs them on this machine, ``write_shard`` in a process pool. A dataset is
complete if and only if ``DST/index.json`` exists; re-running the same command after a
crash finishes the job.

Example:
    >>> import fastfeed
    >>> idx = fastfeed.pack("imagenet/train", "/data/in-ff", workers=8)  # doctest: +SKIP
    >>> idx.num_samples, len(idx.shards)                                 # doctest: +SKIP
    (1281167, 540)
"""

from __future__ import annotations

import json
import logging
import multiprocessing as mp
import os
import queue
import shutil
import signal
import threading
import time
import warnings
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from fastfeed import __version__
from fastfeed.errors import ConfigError, EmptySourceError, IndexMismatchError
from fastfeed.packed.index import INDEX_NAME, DatasetIndex, ShardInfo, atomic_write_bytes
from fastfeed.packing.plan import RESUME_DIR, SKIPPED_NAME, PackOptions, PackPlan, ShardPlan, plan_pack, \
    remove_own_files
from fastfeed.packing.write import ShardResult, write_shard
from fastfeed.packing.walk import show

__all__ = [
    "PackOptions",
    "PackPlan",
    "ShardPlan",
    "ShardResult",
    "finalize",
    "pack",
    "plan_pack",
    "write_shard",
]

log = logging.getLogger("fastfeed.pack")

#: ``progress(files_done, files_total, bytes_done, bytes_total)``, called from the main process.
Progress = Callable[[int, int, int, int], None]


def pack(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    *,
    input: str | None = None,
    format: str = "tar",
    shard_size: str | int = "256MB",
    samples_per_shard: int | None = None,
    workers: int | str = 1,
    shuffle: bool = True,
    seed: int = 0,
    max_side: int | None = None,
    quality: int = 90,
    length: str | None = None,
    on_error: str = "fail",
    overwrite: bool = False,
    jpeg_restarts: bool | None = None,
    progress: Progress | None = None,
    engine: str = "local",
    ray_address: str | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> DatasetIndex:
    """Pack a folder of small files (or a JSONL manifest) into shards plus an index.

    Args:
        src: an ImageFolder (``SRC/<class>/<file>``), a folder of files grouped into
            samples by key (``a/0001.jpg`` + ``a/0001.json``), or a JSONL manifest.
        dst: the output folder (created). Refused when inside ``src`` or when it holds
            something other than an unfinished run of this job, unless ``overwrite``.
        input: ``imagefolder``, ``files`` or ``jsonl``; detected when None.
        format: ``tar`` (WebDataset, with DALI index files) or ``lmdb``.
        shard_size: target shard size (``"256MB"``, ``"1GiB"``, bytes), estimated from
            the source sizes; ignored when ``samples_per_shard`` is given.
        samples_per_shard: at most this many samples per shard.
        workers: processes writing shards in parallel (``"auto"``: one per core).
        shuffle: store samples in a seeded random order (a shard mixes classes);
            otherwise in key order.
        seed: the shuffle seed.
        max_side: resize images whose longer side is larger, re-encoding them (EXIF
            orientation applied; see :func:`fastfeed.formats.images.reencode`); originals on
            disk are never touched.
        quality: JPEG/WebP quality of re-encoded images.
        length: per-sample length for length-bucketed samplers: a field holding a
            number (or a list: its size), a text field (its whitespace-separated token
            count), or ``FIELD:KEY`` for a key inside a JSON field.
        on_error: ``fail`` stops at the first bad input with an error naming the file
            and the fix; ``skip`` leaves bad samples out, listing them in
            ``DST/skipped.txt`` and the index.
        overwrite: replace fastfeed's files in a non-empty DST.
        jpeg_restarts: store JPEGs with a restart marker after every MCU, losslessly (the
            same DCT coefficients, so the same decoded pixels; Huffman tables re-optimised,
            so files are usually no larger). The CPU loader then decodes only the MCUs of
            each random crop, 1.5-2x less work per image for RandomResizedCrop (see
            :func:`fastfeed.decode.roi.add_restarts`). The stored bytes differ from the
            source files (checksums of the originals do not match them); pack takes
            longer. Needs the C extension ``fastfeed._jpegroi``. ``None`` (the default):
            on when the extension is built, else off with one warning; ``False`` stores
            the source bytes unchanged.
        progress: callback ``(files_done, files_total, bytes_done, bytes_total)``.
        engine: ``local`` (processes on this machine, ``workers`` of them) or ``ray``
            (one Ray task per shard on a cluster, the same bytes; see
            :mod:`fastfeed.packing.ray_engine`; needs ``pip install 'fastfeed[ray]'``).
        ray_address: with ``engine="ray"``, the cluster: ``HOST:PORT`` of the head node,
            ``auto``, or ``ray://...``; default: ``RAY_ADDRESS``, else a new local Ray.
        storage_options: fsspec options (endpoint, credentials) when ``dst`` is an
            object-store URL such as ``s3://bucket/prefix`` (see :mod:`fastfeed.packing.objstore`).

    Returns:
        The index of the packed dataset (also written to ``DST/index.json``).

    Raises:
        ConfigError, SourceError, DestinationError: with the path and the fix.

    Example:
        >>> import fastfeed
        >>> idx = fastfeed.pack("train", "train-ff", samples_per_shard=1000, workers=4)  # doctest: +SKIP
    """
    options: dict[str, Any] = dict(
        input=input, format=format, shard_size=shard_size,
        samples_per_shard=samples_per_shard, workers=workers, shuffle=shuffle, seed=seed,
        max_side=max_side, quality=quality, length=length, on_error=on_error, overwrite=overwrite,
        jpeg_restarts=jpeg_restarts,
    )
    # engines and object-store destinations (issue: pack on Ray)
    if engine not in ("local", "ray"):
        raise ConfigError(f"engine={engine!r}: choose local (processes on this machine) or ray (a Ray cluster)")
    if engine == "ray":
        from fastfeed.packing.ray_engine import require_ray

        require_ray()  # before planning, which can take long on a large source
    from fastfeed.storage.remote import is_url, local_path

    if is_url(dst):
        from fastfeed.packing.objstore import pack_url

        return pack_url(src, str(dst), engine=engine, ray_address=ray_address,
                        storage_options=storage_options, progress=progress, **options)
    dst = local_path(dst) or dst
    plan = plan_pack(src, dst, **options)
    if plan.complete:
        log.info("%s: already holds this dataset; nothing to do (pass --overwrite to re-pack)",
                 show(plan.dst))
        _cleanup(plan, keep=None)
        return DatasetIndex.load(plan.dst)
    if engine == "ray":
        from fastfeed.packing.ray_engine import run_ray

        results = run_ray(plan, ray_address=ray_address, progress=progress)
    else:
        results = run_local(plan, plan.options.workers, progress)
    return finalize(plan, results)


# ---------------------------------------------------------------- local engine
#: Below this much source data (and without ``max_side``) shards are written in-process.
POOL_MIN_BYTES = 32_000_000
_worker_plan: PackPlan | None = None
_worker_queue: Any = None
_worker_writer: Callable[..., ShardResult] = write_shard


def _watch_parent(pid: int) -> None:
    """End this writer process as soon as the pack process ``pid`` is gone (even after a
    SIGKILL, which nothing can catch), so no straggler keeps writing into DST."""

    def watch() -> None:
        while _alive(pid):
            time.sleep(0.2)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="fastfeed-watch-parent", daemon=True).start()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"  # a zombie is dead too
    except (OSError, IndexError):
        return True


def _init_worker(plan: PackPlan, q: Any, parent: int, writer: Callable[..., ShardResult] = write_shard) -> None:
    global _worker_plan, _worker_queue, _worker_writer
    _watch_parent(parent)
    _worker_plan, _worker_queue, _worker_writer = plan, q, writer


def _worker_progress(files: int, nbytes: int) -> None:
    _worker_queue.put((files, nbytes))


def _worker_write(number: int) -> ShardResult:
    if _worker_plan is None:  # pragma: no cover - initializer always ran
        raise RuntimeError("fastfeed pack worker used without its plan")
    return _worker_writer(_worker_plan, number, progress=_worker_progress)


def _context() -> Any:
    """``fork`` when no other Python thread runs: nothing is started or imported again
    and the plan is inherited instead of pickled to every worker, which saves seconds
    per worker (hundreds of MB of plan for ImageNet; a training script's ``__main__``
    importing torch). Forking while other Python threads may hold locks can deadlock
    the child, so then ``forkserver`` (or ``spawn``). Native threads (numpy's BLAS pool)
    do not count: the writers only run fastfeed's own code, as PyTorch's DataLoader
    workers do when it forks.
    """
    methods = mp.get_all_start_methods()
    if "fork" in methods and threading.active_count() == 1:
        return mp.get_context("fork")
    return mp.get_context("forkserver" if "forkserver" in methods else "spawn")


def run_local(
    plan: PackPlan, workers: int, progress: Progress | None = None, *,
    writer: Callable[..., ShardResult] = write_shard,
) -> list[ShardResult]:
    """Run :func:`write_shard` (or ``writer``, same signature) for every shard of ``plan`` on this machine.

    With ``workers > 1``, shards are written by a pool of processes (see :func:`_context`
    for how they start); otherwise, or for small jobs (under :data:`POOL_MIN_BYTES`
    of source data without ``max_side``), in this process. Returns results in shard order.
    On an error the shards already complete stay on disk for the re-run.
    """
    total_files, total_bytes = plan.total_files, plan.total_bytes
    done = [0, 0]

    def report(files: int, nbytes: int) -> None:
        done[0] += files
        done[1] += nbytes
        if progress is not None:
            progress(done[0], total_files, done[1], total_bytes)

    n = len(plan.shards)
    workers = max(1, min(workers, n))
    if plan.options.max_side is None and not plan.options.jpeg_restarts and total_bytes < POOL_MIN_BYTES:
        workers = 1  # starting processes would cost more than it saves
    if workers == 1:
        report(0, 0)
        return [writer(plan, i, progress=report) for i in range(n)]
    ctx = _context()
    q = ctx.Queue()
    results: dict[int, ShardResult] = {}
    with ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init_worker,
                             initargs=(plan, q, os.getpid(), writer)) as ex:
        with warnings.catch_warnings():
            # Python >= 3.12 warns on fork() whenever the OS reports other threads, native
            # ones included (numpy's BLAS pool): see _context for why this fork is safe.
            warnings.filterwarnings("ignore", message=r".*use of fork\(\) may lead to deadlocks",
                                    category=DeprecationWarning)
            pending: dict[Future, int] = {ex.submit(_worker_write, i): i for i in range(n)}
        report(0, 0)  # after the workers started: a progress bar may start a thread
        try:
            while pending:
                finished, _ = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
                _drain(q, report)
                for fut in finished:
                    results[pending.pop(fut)] = fut.result()
        except BaseException:
            for fut in pending:
                fut.cancel()
            raise
        _drain(q, report)
    return [results[i] for i in range(n)]


def _drain(q: Any, report: Callable[[int, int], None]) -> None:
    while True:
        try:
            files, nbytes = q.get_nowait()
        except queue.Empty:
            return
        report(files, nbytes)


# ---------------------------------------------------------------- finalize
def finalize(plan: PackPlan, results: Sequence[ShardResult]) -> DatasetIndex:
    """Write the sidecars, ``skipped.txt`` and then ``index.json``; clean up.

    ``results`` holds one :class:`ShardResult` per shard of ``plan`` (any order). Shards
    that ended up empty (every sample skipped while writing) are removed and left out of
    the index.

    Raises:
        IndexMismatchError: a result is missing or does not match the plan.
        EmptySourceError: every sample was skipped.

    Example:
        >>> idx = finalize(plan, [write_shard(plan, i) for i in range(len(plan.shards))])  # doctest: +SKIP
    """
    by_number = {r.number: r for r in results}
    ordered = []
    for sp in plan.shards:
        r = by_number.get(sp.number)
        if r is None or r.name != sp.name or r.samples + len(r.skipped) != len(sp.samples):
            got = "no result" if r is None else f"a result for {r.name} with {r.samples} samples"
            raise IndexMismatchError(
                f"{show(plan.dst)}: shard {sp.name} has {got}, expected {len(sp.samples)} samples; "
                "run write_shard for every shard of this plan, then finalize"
            )
        ordered.append(r)
    keep = [r for r in ordered if r.samples > 0]
    dst = Path(plan.dst)
    for r in ordered:
        if r.samples == 0:
            (dst / r.name).unlink(missing_ok=True)
            if r.dali_index:
                (dst / r.dali_index).unlink(missing_ok=True)
    skipped = [dict(s) for s in plan.skipped] + [dict(s) for r in ordered for s in r.skipped]
    num = sum(r.samples for r in keep)
    if num == 0:
        raise EmptySourceError(f"{show(plan.src)}: every sample was skipped ({len(skipped)}); "
                               f"nothing to pack. First: {skipped[0]['path']}: {skipped[0]['reason']}")
    _write_skipped(dst, skipped)
    offsets = np.array([o for r in keep for o in r.offsets], dtype=np.int64).reshape(-1, 2)
    labels = np.array([x for r in keep for x in r.labels], dtype=np.int64) if plan.has_labels else None
    lengths = None
    if plan.options.length:
        lengths = np.array([x for r in keep for x in (r.lengths or [])], dtype=np.int64)
    index = DatasetIndex(
        format=plan.options.format,
        num_samples=num,
        shards=tuple(ShardInfo(r.name, r.samples, r.bytes, r.sha256, r.dali_index) for r in keep),
        fields=tuple(sorted({f for r in keep for f in r.fields})),
        classes=plan.classes,
        input=plan.kind,
        options=plan.index_options(),
        skipped=tuple(skipped),
        lengths_field=plan.options.length,
        fastfeed_version=__version__,
    ).with_arrays(offsets=offsets, labels=labels, lengths=lengths)
    index.save(dst)
    own = [r.name for r in keep] + [r.dali_index for r in keep if r.dali_index]
    _cleanup(plan, keep=own + index.to_json()["arrays"] + ([SKIPPED_NAME] if skipped else []))
    log.info("%s: %d samples in %d shard(s), %d skipped", show(plan.dst), num, len(keep), len(skipped))
    return replace(index, root=plan.dst)


def _write_skipped(dst: Path, skipped: list[dict[str, str]]) -> None:
    path = dst / SKIPPED_NAME
    if not skipped:
        path.unlink(missing_ok=True)
        return
    lines = [f"# fastfeed pack skipped {len(skipped)} input(s): path<TAB>key<TAB>reason\n"]
    for s in skipped:
        lines.append("\t".join(_one_line(s.get(k, "")) for k in ("path", "key", "reason")) + "\n")
    atomic_write_bytes(path, "".join(lines).encode("utf-8", "backslashreplace"))


def _one_line(text: str) -> str:
    """Entries are already printable (see ``walk.show``); keep any stray control character
    from breaking the one-line-per-input layout."""
    return text.replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")


def _cleanup(plan: PackPlan, keep: list[str] | None) -> None:
    """Remove the resume records, temporaries and files of older plans (all not in ``keep``;
    None: what ``index.json`` lists)."""
    dst = Path(plan.dst)
    shutil.rmtree(dst / RESUME_DIR, ignore_errors=True)
    if keep is None:
        try:
            d = json.loads((dst / INDEX_NAME).read_text("utf-8"))
            keep = [s["name"] for s in d["shards"]] + [s["dali_index"] for s in d["shards"] if s.get("dali_index")]
            keep += list(d.get("arrays", [])) + ([SKIPPED_NAME] if d.get("num_skipped") else [])
        except (OSError, ValueError, KeyError, TypeError):
            return
    remove_own_files(dst, keep=tuple(keep) + (INDEX_NAME,))
