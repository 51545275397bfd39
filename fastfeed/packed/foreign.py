"""WebDataset tars without a fastfeed index: find them, scan them, index them in memory.

``fastfeed.loader()`` accepts what webdataset accepts: a folder of shards, one shard, a
list of paths/URLs, a brace pattern (``s3://b/train/shard-{000000..000099}.tar``),
``::``-joined patterns, or a glob; plain ``.tar`` and gzipped ``.tgz``/``.tar.gz``
(:func:`fastfeed.storage.shardlist.expand_shards`). :func:`open_index` loads the fastfeed
index when there is one and otherwise calls :func:`scan_index`, which reads every tar's
member headers once (:func:`fastfeed.formats.wds.scan_tar`) and builds a
:class:`~fastfeed.packed.index.DatasetIndex` (format ``"tar"``) in memory: per sample the
offset of its first header and the byte span of its members, so every partition,
shuffle, equal-steps and resume guarantee of the loader holds as for packed data.
Hidden members (``train/._0001.jpg``) are left out and listed in ``index.skipped``.

Gzipped tars cannot be read by offset. They are decompressed once by
:func:`fastfeed.storage.remote.open_shard` (into ``cache_dir`` when given, else into memory or
a temporary file per process) and offsets refer to the decompressed tar. With a
``cache_dir`` this costs the uncompressed size on disk once per host; without one,
every worker decompresses each ``.tgz`` it reads (fine for small shards; pass
``cache_dir`` for large ones). Remote shards are read whole to scan them: pass
``cache_dir`` so that the scan's download is the one the loader reads later, or
write a fastfeed index once (``fastfeed pack``) for very large remote datasets.

Example:
    >>> idx = scan_index("data/shards/train-{000000..000009}.tar")     # doctest: +SKIP
    >>> idx.num_samples, idx.fields                                     # doctest: +SKIP
    (10000, ('cls', 'jpg'))
"""

from __future__ import annotations

import json
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Mapping, Sequence

import numpy as np

from fastfeed._util import check_on_error
from fastfeed.errors import ConfigError, IndexMismatchError, ShardError
from fastfeed.formats.wds import ScannedShard, scan_tar
from fastfeed.packed.index import DatasetIndex, ShardInfo, join
from fastfeed.packed.layout import INDEX_NAME, RESUME_DIR, SHAPES_NAME
from fastfeed.storage.remote import (
    RetryPolicy,
    is_url,
    local_path,
    object_size,
    open_shard,
    read_bytes,
)
from fastfeed.storage.shardlist import SHARD_SUFFIXES, expand_shards, is_shard_name

__all__ = ["open_index", "scan_index"]

log = logging.getLogger(__name__)


def _scan_one(
    url: str,
    cache_dir: str | os.PathLike[str] | None,
    cache_size: str | int,
    storage_options: Mapping[str, Any] | None,
    retry: RetryPolicy | None,
    on_error: str,
) -> ScannedShard:
    local = local_path(url)
    size = os.path.getsize(local) if local is not None and os.path.isfile(local) else None
    if local is None:
        size = object_size(url, storage_options=storage_options, retry=retry)
    src = open_shard(url, cache_dir=cache_dir, cache_size=cache_size, storage_options=storage_options,
                     size=size, retry=retry)
    try:
        scanned = scan_tar(src, name=url, on_error=on_error)
    finally:
        if not isinstance(src, str):
            src.close()
    scanned.bytes = int(size) if size is not None else scanned.bytes
    return scanned


def _common_root(paths: list[str]) -> str:
    parents = {p.rstrip("/").rsplit("/", 1)[0] if is_url(p) else os.path.dirname(p) for p in paths}
    return parents.pop() if len(parents) == 1 else ""


def scan_index(
    spec: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    cache_size: str | int = "50GB",
    storage_options: Mapping[str, Any] | None = None,
    retry: RetryPolicy | None = None,
    on_error: str = "raise",
    workers: int = 8,
) -> DatasetIndex:
    """Build a fastfeed index in memory for WebDataset tars that have none.

    Args:
        spec: a folder/prefix, a shard, a brace pattern, a glob, ``::``-joined
            patterns, or a list (see :func:`expand_shards`); local paths or fsspec URLs.
        cache_dir: shared local cache for remote and gzipped shards (see module doc).
        cache_size: bound of that cache.
        storage_options: passed to fsspec.
        retry: retry policy for remote reads.
        on_error: ``"raise"`` (default) on a damaged shard, or ``"skip"`` to keep the
            samples before the damage and record the loss in ``index.skipped``.
        workers: shards scanned in parallel (threads; reading is I/O bound).

    Returns:
        A :class:`DatasetIndex` with format ``"tar"``, per-shard sample counts and
        shard byte sizes, offsets, and the fields seen; shards without samples are
        left out and listed in ``skipped``.

    Example:
        >>> idx = scan_index("shards/train-{000000..000009}.tar")        # doctest: +SKIP
        >>> idx.num_samples, idx.shards[0].samples                       # doctest: +SKIP
        (10000, 1000)
    """
    on_error = check_on_error(on_error)
    urls = expand_shards(spec, storage_options=storage_options)
    if not urls:
        raise ConfigError(
            f"{spec}: no shards found (looked for {', '.join(SHARD_SUFFIXES)}); check the path, "
            "or pack the files with `fastfeed pack`"
        )
    remote = [u for u in urls if is_url(u)]
    if remote and cache_dir is None:
        log.warning(
            "scanning %d remote shards without cache_dir downloads each one now and again when "
            "training reads it; pass cache_dir= (or write a fastfeed index with `fastfeed pack`)",
            len(remote),
        )
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(urls)))) as pool:
        scanned = list(pool.map(
            lambda u: _scan_one(u, cache_dir, cache_size, storage_options, retry, on_error), urls
        ))
    return _build_index(spec, scanned)


def _build_index(spec: Any, scanned: list[ScannedShard]) -> DatasetIndex:
    kept = [s for s in scanned if s.keys]
    skipped: list[dict[str, str]] = [
        {"path": s.url, "reason": s.problem or "no samples"} for s in scanned if s.problem or not s.keys
    ]
    skipped += [
        {"path": f"{s.url}:{member}", "reason": "hidden file (its base name starts with a dot)"}
        for s in scanned for member in s.ignored
    ]
    if not kept:
        raise ShardError(
            f"{spec}: the shards hold no samples (members named <key>.<ext>); check that these "
            "are WebDataset tars"
        )
    root = _common_root([s.url for s in kept])
    shards = tuple(
        ShardInfo(name=s.url[len(root):].lstrip("/") if root else s.url, samples=len(s.keys), bytes=s.bytes,
                  sha256="")
        for s in kept
    )
    offsets = np.array([span for s in kept for span in s.spans], dtype=np.int64).reshape(-1, 2)
    fields = sorted(set().union(*(s.fields for s in kept)))
    idx = DatasetIndex(
        format="tar",
        num_samples=int(offsets.shape[0]),
        shards=shards,
        fields=tuple(fields),
        input=str(spec) if isinstance(spec, (str, os.PathLike)) else ",".join(map(str, spec)),
        options={"source": "webdataset", "scanned": True},
        skipped=tuple(skipped),
        root=root,
    ).with_arrays(offsets=offsets)
    return idx


def open_index(
    path: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    storage_options: Mapping[str, Any] | None = None,
    **scan_options: Any,
) -> DatasetIndex:
    """The index of a dataset: its fastfeed ``index.json`` when present, else a scan.

    This is what ``fastfeed.loader()`` calls: packed datasets load their index;
    WebDataset tars (folder, shard, pattern or list) are scanned by :func:`scan_index`
    with ``scan_options`` (``cache_dir``, ``cache_size``, ``retry``, ``on_error``...).

    Example:
        >>> open_index("/data/imagenet-ff").options.get("source")              # doctest: +SKIP
        >>> open_index("/data/wds/shard-{000..009}.tar").options["source"]     # doctest: +SKIP
        'webdataset'
    """
    if isinstance(path, (str, os.PathLike)):
        s = str(path)
        plain = "::" not in s and "{" not in s and not any(c in s.split("://")[-1] for c in "*?[")
        if plain and not is_shard_name(s):
            if not is_url(s) and DatasetIndex.exists(local_path(s) or s):
                return DatasetIndex.load(local_path(s) or s)
            if not is_url(s):
                _refuse_unfinished_pack(local_path(s) or s)
            if is_url(s):
                idx = _load_remote_index(s.rstrip("/"), storage_options, scan_options.get("retry"))
                if idx is not None:
                    return idx
    return scan_index(path, storage_options=storage_options, **scan_options)


def _refuse_unfinished_pack(folder: str) -> None:
    """A ``fastfeed pack`` output without its index is unfinished, not a WebDataset folder."""
    if os.path.isdir(os.path.join(folder, RESUME_DIR)):
        raise IndexMismatchError(
            f"{folder}: `fastfeed pack` into this folder did not finish (no index.json yet); "
            "re-run the same `fastfeed pack SRC DST` command to complete it"
        )


def _load_remote_index(
    root: str, storage_options: Mapping[str, Any] | None, retry: RetryPolicy | None
) -> DatasetIndex | None:
    """A packed dataset's index from object storage (with ``storage_options``), or None.

    The sidecar arrays are read here too (they are small), so nothing later needs the
    storage options to reach them.
    """
    def fetch(name: str) -> bytes:
        return read_bytes(join(root, name), storage_options=storage_options, retry=retry)

    try:
        raw = fetch(INDEX_NAME)
    except FileNotFoundError:
        return None
    try:
        idx = DatasetIndex.from_json(json.loads(raw), root=root)
    except json.JSONDecodeError as e:
        raise IndexMismatchError(f"{join(root, INDEX_NAME)}: not valid JSON ({e}); re-run `fastfeed pack`") from None
    names = [name for name in idx.to_json()["arrays"] if name != SHAPES_NAME]  # shapes: read when asked
    files: dict[str, bytes] = {}
    for name in names:
        try:
            files[name] = fetch(name)
        except FileNotFoundError:
            raise IndexMismatchError(
                f"{join(root, name)}: sidecar of {join(root, INDEX_NAME)} is missing; re-run `fastfeed pack`"
            ) from None
    return idx.with_sidecars(files)  # each checked: its recorded sha256, dtype, shape, rows
