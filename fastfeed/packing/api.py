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
from typing import Any, Mapping

from fastfeed._util import check_on_error
from fastfeed.errors import ConfigError
from fastfeed.packed.index import DatasetIndex
from fastfeed.packing.engines.local import Progress, run_local
from fastfeed.packing.engines.objstore import RemoteDest, write_shard_remote
from fastfeed.packing.engines.ray import cluster_restarts, connection, require_ray, run_ray
from fastfeed.packing.finish import cleanup, finalize
from fastfeed.packing.plan import PackOptions, PackPlan, ShardPlan, plan_pack
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
        input: ``imagefolder``, ``files``, ``jsonl``, ``parquet``, ``hf`` or ``webdataset`` (a folder
            of tars, converted member by member); detected when None.
        format: ``tar`` (WebDataset, with DALI index files) or ``lmdb``.
        shard_size: target shard size (``"256MB"``, ``"1GiB"``, bytes), estimated from
            the source sizes; ignored when ``samples_per_shard`` is given.
        samples_per_shard: at most this many samples per shard.
        workers: processes writing shards in parallel (``"auto"``: one per usable core,
            :func:`fastfeed.host.cpu_count`, which honours a container's CPU quota).
        shuffle: store samples in a seeded random order (a shard mixes classes);
            otherwise in key order.
        seed: the shuffle seed.
        max_side: resize images whose longer side is larger, re-encoding them (EXIF
            orientation applied; see :func:`fastfeed.formats.images.reencode`); originals on
            disk are never touched.
        quality: JPEG/WebP quality of re-encoded images.
        length: per-sample length for length-bucketed samplers: a field holding a
            number (or a list: its size), a text field (its whitespace-separated token
            count; with ``tokenizer``: its exact token count), or ``FIELD:KEY`` for a key
            inside a JSON field.
        columns: parquet/HF input: the columns to pack and their fields, ``"image=jpg,caption=txt"``
            or a dict (default: every column, fields by type; see :mod:`fastfeed.packing.sources.columns`).
        key: parquet/HF input: the column holding each row's ``__key__`` (default: the row number).
        tokenizer: a local ``tokenizers`` JSON file, or a folder holding ``tokenizer.json``;
            with ``tokenize`` or ``length``. Its pad id is recorded in the index.
        tokenize: a text field (``txt``; a column name for tables) whose token ids are stored
            in the field ``tokens.npy`` (uint16 when the vocabulary fits, else uint32), their
            counts in ``lengths.npy``; tokenized in the pack workers (batched ``encode_batch``).
        on_error: ``raise`` stops at the first bad input with an error naming the file
            and the fix; ``skip`` leaves bad samples out, listing them in
            ``DST/skipped.txt`` and the index. (``fail``, the old spelling of ``raise``,
            still works, with a FutureWarning.)
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
        store: ``jpeg`` (images stored as they are), ``raw`` (each sample's image decoded now and
            stored as uint8 pixels in the field ``rgb8``, its shape in ``shapes.npy``: the loader
            then crops without decoding, for ~10x the disk of ImageNet-sized JPEGs; with
            ``max_side`` the longer side is bounded first) or ``mixed:P`` (the share ``P`` of the
            images with the fewest pixels stored raw, the rest as JPEG). See
            :mod:`fastfeed.packing.content.pixels` for exactly which images, and the guide's section
            "Raw pixels: trade disk for CPU". Folder, manifest and WebDataset sources only.
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
    on_error = check_on_error(on_error)  # here, so that a FutureWarning points at the caller
    options: dict[str, Any] = dict(
        input=input, format=format, shard_size=shard_size,
        samples_per_shard=samples_per_shard, workers=workers, shuffle=shuffle, seed=seed,
        max_side=max_side, quality=quality, length=length, on_error=on_error, overwrite=overwrite,
        columns=columns, key=key, tokenizer=tokenizer, tokenize=tokenize,
        jpeg_restarts=jpeg_restarts, store=store,
    )
    # engines and object-store destinations (issue: pack on Ray)
    if engine not in ("local", "ray"):
        raise ConfigError(f"engine={engine!r}: choose local (processes on this machine) or ray (a Ray cluster)")
    if engine == "ray":
        require_ray()  # before planning, which can take long on a large source
        with connection(ray_address):  # one connection: the nodes' check, then the tasks
            # every shard with restart markers or none, whichever node writes it: decided before planning
            options["jpeg_restarts"] = cluster_restarts(options["jpeg_restarts"])
            return _run_pack(src, dst, engine, None, storage_options, progress, options)
    return _run_pack(src, dst, engine, ray_address, storage_options, progress, options)


def _run_pack(src: str | os.PathLike[str], dst: str | os.PathLike[str], engine: str, ray_address: str | None,
              storage_options: Mapping[str, Any] | None, progress: Progress | None,
              options: dict[str, Any]) -> DatasetIndex:
    """:func:`pack` after its options are checked: plan, write with ``engine``, finalize."""
    if is_url(dst):
        return _pack_into_url(src, str(dst), engine=engine, ray_address=ray_address,
                              storage_options=storage_options, progress=progress, **options)
    dst = local_path(dst) or dst
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


