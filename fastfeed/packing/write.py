"""Step 2 of packing: :func:`write_shard` writes one planned shard, or reuses it.

A shard is written to ``<name>.<pid>.tmp``; when it is complete, tar shards get their
DALI index ``<stem>.idx``, its :class:`ShardResult` is recorded in
``DST/.fastfeed-pack/<stem>.json``, and only then is it renamed into place. When that record exists, was made
from the same inputs (fingerprint of keys, paths, sizes, mtimes and the job), and the
shard on disk still has the recorded size and sha256, the shard is reused instead: this
is how a re-run after a crash (even a SIGKILL mid-shard) finishes the job and produces
exactly what an uninterrupted run produces. Temporary names carry the writer's pid, so
a straggling writer of a killed run can never interleave with a new one; both would
write identical bytes anyway.

Shards are not fsynced: a killed process loses nothing the kernel already has, and a
re-run re-checks every reused shard's checksum. Run ``fastfeed verify`` after a power
failure.

The samples come from the plan's source (:func:`fastfeed.packing.load.shard_items`: the source
reads its units, images are checked and re-encoded), tokenized by :mod:`fastfeed.packing.stream`
when the plan has a tokenizer; the writer treats every input alike.

Example:
    >>> plan = plan_pack("train", "train-ff")                       # doctest: +SKIP
    >>> results = [write_shard(plan, n) for n in range(len(plan.shards))]  # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from fastfeed.decode import roi
from fastfeed.decode.imagesize import sample_size
from fastfeed.errors import ConfigError
from fastfeed.formats import FORMATS
from fastfeed.formats.checksum import pack_algorithm
from fastfeed.formats.naming import RAW_FIELD
from fastfeed.formats.tar import TarShardWriter
from fastfeed.packed.index import atomic_write_bytes
from fastfeed.packed.layout import resume_record
from fastfeed.packing.dest import on_full_disk
from fastfeed.packing.content.pixels import Pixels
from fastfeed.packing.load import shard_items
from fastfeed.packing.options import RESTARTS_FIX
from fastfeed.packing.plan import PackPlan, ShardPlan
from fastfeed.packing.stream import with_tokens

__all__ = ["ProgressFn", "ShardResult", "shard_fingerprint", "write_shard"]

log = logging.getLogger("fastfeed.pack")

ProgressFn = Callable[[int, int], None]


@dataclass
class ShardResult:
    """What writing one shard produced; plain data (picklable, JSON-able).

    Attributes:
        number: the shard's number, as planned.
        name: the shard's file name, as planned.
        samples: samples written (planned minus those skipped while writing).
        bytes: the shard file's size.
        sha256: the shard file's sha256.
        offsets: per written sample (offset, size) for tar, (record, 0) for LMDB.
        labels: per written sample class index (-1 when none).
        lengths: per written sample ``--length``, or None.
        skipped: inputs left out while writing (``on_error="skip"``).
        fields: the member fields seen in this shard, sorted.
        dali_index: the DALI index file next to a tar shard, or None.
        dali_sha256: that file's sha256, or None.
        fingerprint: identity of the shard's inputs (for reuse on resume).
        shapes: with ``--store raw|mixed:P``, per written sample the (height, width) of its
            pixels, ``(0, 0)`` for one stored encoded; else empty.
        raw_bytes: bytes of the pixels written.
        encoded_bytes: bytes of the image files those pixels were decoded from.
        files_read: source files read.
        bytes_read: source bytes read.
        checksum: the per-sample checksum's algorithm (:mod:`fastfeed.formats.checksum`).
        checksums: per written sample, the checksum of the bytes its reader reads
            (``index.json``'s ``checksums``).
        sizes: per written sample the displayed (height, width) of its image, read from the
            stored image's header (EXIF orientation applied; the pixels' shape for raw pixels),
            ``(0, 0)`` when it has none (``sizes.npy``); empty in a record written before sizes.
        reused: True when an earlier run's complete shard was kept.
    """

    number: int
    name: str
    samples: int
    bytes: int
    sha256: str
    offsets: list[tuple[int, int]]
    labels: list[int]
    lengths: list[int] | None
    skipped: list[dict[str, str]] = field(default_factory=list)
    fields: list[str] = field(default_factory=list)
    dali_index: str | None = None
    dali_sha256: str | None = None
    fingerprint: str = ""
    files_read: int = 0
    bytes_read: int = 0
    shapes: list[tuple[int, int]] = field(default_factory=list)
    raw_bytes: int = 0
    encoded_bytes: int = 0
    checksum: str = ""
    checksums: list[int] = field(default_factory=list)
    sizes: list[tuple[int, int]] = field(default_factory=list)
    reused: bool = False

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "reused"}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "ShardResult":
        d = dict(d)
        d["offsets"] = [(int(a), int(b)) for a, b in d["offsets"]]
        d["shapes"] = [(int(a), int(b)) for a, b in d.get("shapes", ())]
        d["sizes"] = [(int(a), int(b)) for a, b in d.get("sizes", ())]
        return cls(**d)


# ---------------------------------------------------------------- resume records
def shard_fingerprint(plan: PackPlan, shard: ShardPlan) -> str:
    """Identity of a shard's inputs: the job, the source's identity (a manifest's checksum, the
    table files' metadata), and the shard's units with their sizes and mtimes."""
    # the checksum algorithm too: a record of another (or of none: written before checksums) is not reused
    h = hashlib.sha256(f"{plan.job}|{shard.number}|{shard.name}|{plan.source.identity}|"
                       f"checksum:{pack_algorithm()}".encode())
    for unit in shard.units:
        h.update(repr(unit).encode("utf-8", "surrogateescape"))
    if shard.raw:
        h.update(b"|raw" + bytes(shard.raw))
    return h.hexdigest()


def _record_path(plan: PackPlan, shard: ShardPlan) -> Path:
    return Path(plan.dst) / resume_record(shard.name)


def _reusable(plan: PackPlan, shard: ShardPlan, fingerprint: str) -> ShardResult | None:
    try:
        rec = ShardResult.from_json(json.loads(_record_path(plan, shard).read_text("utf-8")))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if rec.fingerprint != fingerprint or rec.name != shard.name or len(rec.checksums) != rec.samples:
        return None
    dst = Path(plan.dst)
    if not _file_matches(dst / shard.name, rec.bytes, rec.sha256):
        log.info("%s: checksum differs from the resume record; writing it again", shard.name)
        return None
    if rec.dali_index and not _file_matches(dst / rec.dali_index, None, rec.dali_sha256):
        return None
    return replace(rec, reused=True)


def _file_matches(path: Path, size: int | None, sha256: str | None) -> bool:
    try:
        if size is not None and path.stat().st_size != size:
            return False
        h = hashlib.sha256()
        with open(path, "rb") as f:
            while chunk := f.read(1 << 22):
                h.update(chunk)
    except OSError:
        return False
    return h.hexdigest() == sha256


# ---------------------------------------------------------------- writing
def write_shard(plan: PackPlan, number: int, *, progress: ProgressFn | None = None) -> ShardResult:
    """Write shard ``number`` of ``plan`` (or reuse a complete earlier one); see the module doc.

    Args:
        plan: from :func:`~fastfeed.packing.plan.plan_pack`.
        number: the shard, ``0 <= number < len(plan.shards)``.
        progress: called with increments ``(files, bytes)`` of source data handled.

    Raises:
        SourceError: a bad input met while writing, with ``on_error="raise"``.
        ConfigError: the plan adds JPEG restart markers and ``fastfeed._jpegroi`` does not
            load in this process (the driver decides for every shard; see
            :func:`fastfeed.packing.engines.ray.cluster_restarts`).

    Example:
        >>> result = write_shard(plan, 0)   # doctest: +SKIP
        >>> result.samples, result.sha256[:8]  # doctest: +SKIP
        (1000, '5be0c7a1')
    """
    shard = plan.shards[number]
    fingerprint = shard_fingerprint(plan, shard)
    done = _reusable(plan, shard, fingerprint)
    if done is not None:
        if progress is not None:
            progress(done.files_read, done.bytes_read)
        return done
    if plan.options.jpeg_restarts and (why := roi.why_not_built()):
        # no Python fallback writes the same bytes; without markers this shard would differ from the others
        raise ConfigError(f"{shard.name}: this pack adds JPEG restart markers to every shard, but fastfeed._jpegroi "
                          f"does not load in this process (pid {os.getpid()}: {why}); {RESTARTS_FIX}; or pack "
                          "again with jpeg_restarts=False (--no-jpeg-restarts)")
    dst = Path(plan.dst)
    tmp = dst / f"{shard.name}.{os.getpid()}.tmp"
    try:
        with on_full_disk(dst, needed=plan.bytes_to_write, what=tmp.name):  # ENOSPC/EDQUOT: a DiskFullError naming DST
            result = _write(plan, shard, tmp, fingerprint, progress)
            # Record first, rename last: a shard under its final name always has its record,
            # so a re-run can check and reuse every shard that became visible.
            atomic_write_bytes(_record_path(plan, shard), json.dumps(result.to_json()).encode())
            os.replace(tmp, dst / shard.name)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return result


def _write(plan: PackPlan, shard: ShardPlan, tmp: Path, fingerprint: str,
           progress: ProgressFn | None) -> ShardResult:
    dst = Path(plan.dst)
    fmt = plan.options.format
    fileobj = open(tmp, "wb", buffering=1 << 20) if fmt == "tar" else None
    algorithm = pack_algorithm()
    try:
        writer = (TarShardWriter(tmp, fileobj=fileobj, checksum=algorithm) if fileobj is not None
                  else FORMATS[fmt][0](tmp, checksum=algorithm))
        offsets: list[tuple[int, int]] = []
        labels: list[int] = []
        lengths: list[int] | None = [] if plan.lengths_field else None
        skipped: list[dict[str, str]] = []
        fields: set[str] = set()
        stores_pixels = plan.options.store != "jpeg"
        shapes: list[tuple[int, int]] = []
        sizes: list[tuple[int, int]] = []
        raw_bytes = encoded_bytes = 0
        files = nbytes = pend_files = pend_bytes = 0
        last = time.monotonic()
        for item in with_tokens(plan, shard, shard_items(plan, shard, skipped), skipped):
            px = item.fields.get(RAW_FIELD) if stores_pixels else None
            if isinstance(px, Pixels):  # an image decoded for --store raw: its bytes, its shape for the index
                item = item._replace(fields={**item.fields, RAW_FIELD: px.array.tobytes()})
                shapes.append((int(px.array.shape[0]), int(px.array.shape[1])))
                raw_bytes += px.array.nbytes
                encoded_bytes += px.encoded
            elif stores_pixels:
                shapes.append((0, 0))
            sizes.append((int(px.array.shape[0]), int(px.array.shape[1])) if isinstance(px, Pixels)
                         else sample_size(item.fields))
            offsets.append(writer.add(item.key, item.fields))
            labels.append(item.label)
            if lengths is not None:
                lengths.append(int(item.length or 0))
            fields.update(item.fields)
            files += item.files
            nbytes += item.nbytes
            pend_files += item.files
            pend_bytes += item.nbytes
            if progress is not None and time.monotonic() - last > 0.2:
                progress(pend_files, pend_bytes)
                pend_files = pend_bytes = 0
                last = time.monotonic()
        size, sha = writer.close()
    finally:
        if fileobj is not None:
            fileobj.close()
    if progress is not None and (pend_files or pend_bytes):
        progress(pend_files, pend_bytes)
    dali_name = dali_sha = None
    # DALI's index next to the tar (``fn.readers.webdataset(index_paths=...)``). Why DALI
    # reads it (webdataset_loader.cc, ParseIndexFile/ParseSampleDesc): line 1 is
    # "v1.2 N" with N > 0 (empty shards never get one: finalize drops them); then N lines
    # of whitespace-separated "ext offset size path" groups, one per member, read with
    # `>>` (hence v1.1 without paths when a name holds whitespace, see
    # TarShardWriter.dali_index). ``offset`` is where the member's data starts, after its
    # header(s) (pax included) - what DALI's own tar scan computes as TellArchive() +
    # HeaderSize() - and is a multiple of 512 as DALI enforces, since headers are whole
    # blocks and data is padded to blocks. ``ext`` is the member name after the first dot
    # of its base name, DALI's split_name rule. tests/test_pack.py rebuilds DALI_extra's
    # reference tar and compares the index byte for byte.
    if fmt == "tar" and offsets:
        text = writer.dali_index().encode("utf-8")
        dali_name = shard.dali_index_name
        dali_sha = hashlib.sha256(text).hexdigest()
        idx_tmp = dst / f"{dali_name}.{os.getpid()}.tmp"
        try:
            idx_tmp.write_bytes(text)
            os.replace(idx_tmp, dst / dali_name)
        except BaseException:
            idx_tmp.unlink(missing_ok=True)
            raise
    return ShardResult(
        number=shard.number, name=shard.name, samples=len(offsets), bytes=size, sha256=sha,
        offsets=offsets, labels=labels, lengths=lengths, skipped=skipped, fields=sorted(fields),
        dali_index=dali_name, dali_sha256=dali_sha, fingerprint=fingerprint, files_read=files,
        bytes_read=nbytes, shapes=shapes, raw_bytes=raw_bytes, encoded_bytes=encoded_bytes,
        checksum=algorithm, checksums=list(writer.checksums), sizes=sizes,
    )
