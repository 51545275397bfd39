"""``fastfeed pack``: small files -> tar (WebDataset) or LMDB shards plus a versioned index.

Packing is a straight pipeline with a public, picklable interface, so that any engine
produces the same bytes:

1. :func:`~fastfeed.packing.plan.plan_pack` (``src, dst, **options -> PackPlan``): open the source
   (:func:`~fastfeed.packing.sources.detect.open_source`: detect, list, validate), order its units
   (shuffle), cut them into shards; check and prepare DST.
2. :func:`~fastfeed.packing.write.write_shard` (``plan, number -> ShardResult``): write one
   shard atomically (or reuse a complete one from an interrupted run), run by an engine for
   every shard: on this machine, in a process pool (:mod:`fastfeed.packing.engines.local`), or
   one Ray task per shard (:mod:`fastfeed.packing.engines.ray`).
3. :func:`~fastfeed.packing.finish.finalize` (``plan, results -> DatasetIndex``): write the
   sidecars, ``skipped.txt`` and, last and atomically, ``index.json``.

Into a folder, or into an object-store prefix (:mod:`fastfeed.packing.engines.objstore`: the plan
is made against a local staging folder, every shard is published as it is written, the index
last). A dataset is complete if and only if ``DST/index.json`` exists; re-running the same
command after a crash finishes the job.

Example:
    >>> import fastfeed
    >>> idx = fastfeed.pack("imagenet/train", "/data/in-ff", workers=8)  # doctest: +SKIP
    >>> idx.num_samples, len(idx.shards)                                 # doctest: +SKIP
    (1281167, 540)
"""

from __future__ import annotations

import logging
import os
import tempfile
from functools import partial
from pathlib import Path
from typing import Any, Mapping

from fastfeed._options import fill_doc
from fastfeed._util import check_on_error
from fastfeed.errors import ConfigError
from fastfeed.packed.index import DatasetIndex
from fastfeed.packing.dest import hold_destination
from fastfeed.packing.engines.local import Progress, run_local
from fastfeed.packing.engines.objstore import RemoteDest, write_shard_remote
from fastfeed.packing.engines.ray import cluster_restarts, connection, require_ray, run_ray
from fastfeed.packing.finish import cleanup, finalize
from fastfeed.packing.options import MAX_PIXELS, OPTIONS, PackOptions
from fastfeed.packing.plan import PackPlan, ShardPlan, plan_pack
from fastfeed.packing.sources.base import show
from fastfeed.packing.write import ShardResult, write_shard
from fastfeed.storage.remote import is_url, local_path

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


def pack(
    src: str | os.PathLike[str] | Any,
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
    columns: str | Mapping[str, str] | None = None,
    key: str | None = None,
    tokenizer: str | os.PathLike[str] | None = None,
    tokenize: str | None = None,
    on_error: str = "raise",
    overwrite: bool = False,
    jpeg_restarts: bool | None = None,
    store: str = "jpeg",
    max_pixels: int = MAX_PIXELS,
    allow_outside: bool = False,
    progress: Progress | None = None,
    engine: str = "local",
    ray_address: str | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> DatasetIndex:
    """Pack a folder of small files (a JSONL manifest, parquet files, a HF dataset) into shards plus an index.

    Args:
        src: an ImageFolder (``SRC/<class>/<file>``), a folder of files grouped into
            samples by key (``a/0001.jpg`` + ``a/0001.json``), a JSONL manifest, a
            ``.parquet`` file (a folder or glob of them: one sample per row, columns become
            fields, see :mod:`fastfeed.packing.sources.parquet`; rows stream in bounded memory, one
            row group at a time, so ``shuffle`` orders whole row groups, not rows), a
            ``datasets.Dataset`` or a ``Dataset.save_to_disk`` folder.
        dst: the output folder (created). Refused when inside ``src`` or when it holds
            something other than an unfinished run of this job, unless ``overwrite``.
        {options}
        progress: callback ``(files_done, files_total, bytes_done, bytes_total)``.
        engine: ``local`` (processes on this machine, ``workers`` of them) or ``ray``
            (one Ray task per shard on a cluster, the same bytes; see
            :mod:`fastfeed.packing.engines.ray`; needs ``pip install 'fastfeed[ray]'``).
        ray_address: with ``engine="ray"``, the cluster: ``HOST:PORT`` of the head node,
            ``auto``, or ``ray://...``; default: ``RAY_ADDRESS``, else a new local Ray.
        storage_options: fsspec options (endpoint, credentials) when ``dst`` is an
            object-store URL such as ``s3://bucket/prefix`` (see :mod:`fastfeed.packing.engines.objstore`).

    Returns:
        The index of the packed dataset (also written to ``DST/index.json``).

    Raises:
        ConfigError, SourceError, DestinationError: with the path and the fix.

    Example:
        >>> import fastfeed
        >>> idx = fastfeed.pack("train", "train-ff", samples_per_shard=1000, workers=4)  # doctest: +SKIP
        >>> raw = fastfeed.pack("train", "train-raw", store="raw", max_side=256)           # doctest: +SKIP
    """
    given = locals()  # first thing: exactly pack()'s arguments
    options: dict[str, Any] = {name: given[name] for name in OPTIONS}  # PackOptions' fields, by their names
    options["on_error"] = check_on_error(on_error)  # here, so that a FutureWarning points at the caller
    # engines and object-store destinations (issue: pack on Ray)
    if not isinstance(dst, (str, os.PathLike)) or not os.fspath(dst):
        raise ConfigError(f"dst={dst!r}: give the folder (or object-store URL) to pack into, e.g. 'train-ff'")
    if progress is not None and not callable(progress):
        raise ConfigError(f"progress={progress!r}: pass a function progress(files_done, files_total, bytes_done, "
                          "bytes_total), or None")
    if not isinstance(engine, str) or engine not in ("local", "ray"):
        raise ConfigError(f"engine={engine!r}: choose local (processes on this machine) or ray (a Ray cluster)")
    if engine == "ray":
        require_ray()  # before planning, which can take long on a large source
        with connection(ray_address):  # one connection: the nodes' check, then the tasks
            # every shard with restart markers or none, whichever node writes it: decided before planning
            options["jpeg_restarts"] = cluster_restarts(options["jpeg_restarts"])
            return _run_pack(src, dst, engine, None, storage_options, progress, options)
    return _run_pack(src, dst, engine, ray_address, storage_options, progress, options)


fill_doc(pack, PackOptions, names=OPTIONS)  # its Args: lines of the options, from their definitions


def _run_pack(src: str | os.PathLike[str], dst: str | os.PathLike[str], engine: str, ray_address: str | None,
              storage_options: Mapping[str, Any] | None, progress: Progress | None,
              options: dict[str, Any]) -> DatasetIndex:
    """:func:`pack` after its options are checked: plan, write with ``engine``, finalize."""
    if is_url(dst):
        return _pack_into_url(src, str(dst), engine=engine, ray_address=ray_address,
                              storage_options=storage_options, progress=progress, **options)
    dst = local_path(dst) or dst
    with hold_destination(Path(dst).absolute()):  # one pack at a time into DST: a second one is refused
        plan = plan_pack(src, dst, **options)  # open the source, cut it into shards
        if plan.complete:
            log.info("%s: already holds this dataset; nothing to do (pass --overwrite to re-pack)",
                     show(plan.dst))
            cleanup(plan, keep=None)
            return DatasetIndex.load(plan.dst)
        if engine == "ray":  # every shard: write_shard
            results = run_ray(plan, ray_address=ray_address, progress=progress)
        else:
            results = run_local(plan, plan.options.workers, progress)
        return finalize(plan, results)


def _pack_into_url(
    src: str | os.PathLike[str],
    dst: str,
    *,
    engine: str,
    ray_address: str | None,
    storage_options: Mapping[str, Any] | None,
    progress: Progress | None,
    **options: Any,
) -> DatasetIndex:
    """:func:`pack` into an object-store prefix (see :mod:`fastfeed.packing.engines.objstore`): plan
    against a local staging folder, write and publish every shard, publish the index last."""
    dest = RemoteDest.create(dst, storage_options)
    with tempfile.TemporaryDirectory(prefix="fastfeed-pack-") as staging:
        plan = plan_pack(src, staging, **options)
        if dest.check(plan):
            log.info("%s: already holds this dataset; nothing to do (pass --overwrite to re-pack)", dest.url)
            dest.cleanup(keep=None)
            return dest.load_index()
        dest.prepare(plan)
        writer = partial(write_shard_remote, dest=dest)  # write_shard, then publish the shard
        if engine == "ray":
            results = run_ray(plan, writer=writer, ray_address=ray_address, progress=progress)
        else:
            results = run_local(plan, plan.options.workers, progress, writer=writer)
        return dest.publish_dataset(plan.dst, finalize(plan, results))


