"""Step 3 of packing: :func:`finalize` writes the index of the shards that were written.

The sidecars (``offsets.npy``, ``labels.npy``, ``lengths.npy``, ``shapes.npy`` with ``--store raw``,
``checksums.npy``: every sample's checksum, ``sizes.npy``: every image's displayed size, for datasets
of images), ``skipped.txt`` and, last
and atomically, ``index.json``: the dataset is complete iff ``index.json`` exists. Then the
resume records and the files of older plans are removed.

Example:
    >>> idx = finalize(plan, [write_shard(plan, i) for i in range(len(plan.shards))])  # doctest: +SKIP
"""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Sequence

import numpy as np

from fastfeed import __version__
from fastfeed.errors import EmptySourceError, IndexMismatchError
from fastfeed.formats.naming import holds_pixels
from fastfeed.packed.index import INDEX_VERSION, JPEG_INDEX_VERSION, DatasetIndex, ShardInfo, atomic_write_bytes
from fastfeed.packed.layout import INDEX_NAME, RESUME_DIR, SKIPPED_NAME
from fastfeed.packing.dest import on_full_disk, remove_own_files
from fastfeed.packing.content.pixels import summary
from fastfeed.packing.plan import PackPlan
from fastfeed.packing.sources.base import show
from fastfeed.packing.write import ShardResult

__all__ = ["cleanup", "finalize"]

log = logging.getLogger("fastfeed.pack")


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
        if r is None or r.name != sp.name or not _counts_match(plan, sp.planned, r):
            got = "no result" if r is None else f"a result for {r.name} with {r.samples} samples"
            raise IndexMismatchError(
                f"{show(plan.dst)}: shard {sp.name} has {got}, expected {sp.planned} samples; "
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
    with on_full_disk(dst, needed=plan.bytes_to_write):  # ENOSPC/EDQUOT: a DiskFullError naming DST
        _write_skipped(dst, skipped)
        index = _index(plan, keep, skipped, num)
        index.save(dst)
    own = [r.name for r in keep] + [r.dali_index for r in keep if r.dali_index]
    cleanup(plan, keep=own + index.to_json()["arrays"] + ([SKIPPED_NAME] if skipped else []))
    log.info("%s: %d samples in %d shard(s), %d skipped", show(plan.dst), num, len(keep), len(skipped))
    return replace(index, root=plan.dst)


def _index(plan: PackPlan, keep: Sequence[ShardResult], skipped: list[dict[str, str]], num: int) -> DatasetIndex:
    """The index of the shards kept, with its sidecar arrays (not saved yet)."""
    offsets = np.array([o for r in keep for o in r.offsets], dtype=np.int64).reshape(-1, 2)
    labels = np.array([x for r in keep for x in r.labels], dtype=np.int64) if plan.has_labels else None
    lengths = None
    if plan.lengths_field:
        lengths = np.array([x for r in keep for x in (r.lengths or [])], dtype=np.int64)
    algorithm, checksums = _checksums(plan, keep)
    mode, share = plan.options.store_mode
    shapes = store = None
    if mode != "jpeg":
        shapes = np.array([hw for r in keep for hw in r.shapes], dtype=np.int32).reshape(-1, 2)
        store = summary(mode, share, keep)
    sizes = _sizes(plan, keep)
    return DatasetIndex(
        format=plan.options.format,
        num_samples=num,
        shards=tuple(ShardInfo(r.name, r.samples, r.bytes, r.sha256, r.dali_index) for r in keep),
        fields=tuple(sorted({f for r in keep for f in r.fields})),
        classes=plan.classes,
        input=plan.kind,
        options=plan.index_options(),
        skipped=tuple(skipped),
        lengths_field=plan.lengths_field,
        tokenizer=plan.tokens.index_meta() if plan.tokens is not None else None,
        store=store,
        outside=plan.source.outside,  # files packed from outside SRC (allow_outside), else None
        version=INDEX_VERSION if store is not None else JPEG_INDEX_VERSION,
        fastfeed_version=__version__,
    ).with_arrays(offsets=offsets, labels=labels, lengths=lengths, shapes=shapes, checksums=checksums,
                  algorithm=algorithm, sizes=sizes)


def _sizes(plan: PackPlan, keep: Sequence[ShardResult]) -> np.ndarray | None:
    """Every sample's displayed image (height, width) in index order (``sizes.npy``), or None for a
    dataset without images, or when a reused shard's resume record predates sizes (logged: `fastfeed
    shapes DST` adds them afterwards)."""
    if not any(holds_pixels(f) for r in keep for f in r.fields):
        return None
    old = [r.name for r in keep if len(r.sizes) != r.samples]
    if old:
        log.warning("%s: %d shard(s) (%s) were kept from a pack that recorded no image sizes; run `fastfeed "
                    "shapes %s` to add them (the aspect-ratio sampler needs them)", show(plan.dst), len(old),
                    old[0], show(plan.dst))
        return None
    return np.array([hw for r in keep for hw in r.sizes], dtype=np.int32).reshape(-1, 2)


def _checksums(plan: PackPlan, keep: Sequence[ShardResult]) -> tuple[str, np.ndarray]:
    """The one checksum algorithm of the shards, and every sample's checksum in index order.

    Raises:
        IndexMismatchError: shards checksummed by different algorithms (writers where ``xxhash``
            is installed and writers where it is not), or a result without its checksums.
    """
    algorithms = sorted({r.checksum for r in keep})
    if len(algorithms) != 1 or not algorithms[0]:
        by = ", ".join(f"{a or 'none'}: {next(r.name for r in keep if r.checksum == a)}" for a in algorithms)
        raise IndexMismatchError(
            f"{show(plan.dst)}: the shards' checksums were made by different algorithms ({by}): every machine "
            "that writes shards needs the same packages (pip install xxhash everywhere, for xxh3_64); run the "
            "same `fastfeed pack` again to rewrite the others")
    for r in keep:
        if len(r.checksums) != r.samples:
            raise IndexMismatchError(f"{show(plan.dst)}: shard {r.name} has {len(r.checksums)} checksums for "
                                     f"{r.samples} samples; run the same `fastfeed pack` again to rewrite it")
    if algorithms[0] == "crc32":
        log.warning("%s: the samples' checksums are CRC32: the xxhash package is not installed here, so checking "
                    "them on read costs ~3-4%% of the loader's CPU per image instead of ~1%% with XXH3; pip install "
                    "xxhash, then pack again with --overwrite to change them", show(plan.dst))
    return algorithms[0], np.array([c for r in keep for c in r.checksums], dtype=np.uint64)


def _counts_match(plan: PackPlan, planned: int, r: ShardResult) -> bool:
    """Written + skipped = planned; for blocks of rows, at most planned (an unreadable row group is
    one skip entry for its rows, and rows dropped as duplicate keys were skipped when planning)."""
    if plan.source.blocks:
        return r.samples <= planned
    return r.samples + len(r.skipped) == planned


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
    """Entries are already printable (see ``source.show``); keep any stray control character
    from breaking the one-line-per-input layout."""
    return text.replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")


def cleanup(plan: PackPlan, keep: list[str] | None) -> None:
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
