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

All file reading goes through :func:`read_source` (one small function), so another
engine can route it elsewhere (fsspec) without touching the rest.

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
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterator

from fastfeed.decode import roi
from fastfeed.errors import BadFileError, SourceError
from fastfeed.formats import FORMATS
from fastfeed.formats.images import decode_errors, looks_like_image, reencode
from fastfeed.formats.naming import is_image
from fastfeed.formats.tar import TarShardWriter
from fastfeed.packed.index import atomic_write_bytes
from fastfeed.packed.layout import resume_record
from fastfeed.packing.plan import PackPlan, ShardPlan
from fastfeed.packing.source import (
    Member,
    SampleSpec,
    parse_length,
    resolve_length_member,
    show,
)
from fastfeed.packing.srcurl import read as read_url
from fastfeed.packing.stream import Item, length_of_value, table_items, with_tokens
from fastfeed.storage.remote import is_url

__all__ = ["ShardResult", "read_source", "shard_fingerprint", "write_shard"]

log = logging.getLogger("fastfeed.pack")

#: Local sources: samples whose files are opened and read ahead by the kernel (``_loaded``).
READAHEAD = 32
#: Sources on object storage: reader threads per writing process, keeping requests in flight.
IO_THREADS = 8
_CHUNK = 4
_O_READ = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)
_TEXT_EXTS = frozenset({"txt", "text", "transcript", "md", "csv", "tsv"})
ProgressFn = Callable[[int, int], None]


@dataclass
class ShardResult:
    """What writing one shard produced; plain data (picklable, JSON-able).

    Attributes:
        number, name: the shard, as planned.
        samples: samples written (planned minus those skipped while writing).
        bytes, sha256: the shard file's size and checksum.
        offsets: per written sample (offset, size) for tar, (record, 0) for LMDB.
        labels: per written sample class index (-1 when none).
        lengths: per written sample ``--length``, or None.
        skipped: inputs left out while writing (``on_error="skip"``).
        fields: the member fields seen in this shard, sorted.
        dali_index, dali_sha256: the DALI index file next to a tar shard, or None.
        fingerprint: identity of the shard's inputs (for reuse on resume).
        files_read, bytes_read: source files and bytes read.
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
    reused: bool = False

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "reused"}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "ShardResult":
        d = dict(d)
        d["offsets"] = [(int(a), int(b)) for a, b in d["offsets"]]
        return cls(**d)


class _Problem(Exception):
    """A bad input met while writing; becomes a SourceError or a skip entry."""

    def __init__(self, cls: type[SourceError], where: str, reason: str, fix: str) -> None:
        super().__init__(reason)
        self.cls, self.where, self.reason, self.fix = cls, where, reason, fix

    def error(self, root: str) -> SourceError:
        path = self.where if os.path.isabs(self.where) else os.path.join(root, self.where)
        return self.cls(f"{show(path)}: {self.reason}; {self.fix}")


# ---------------------------------------------------------------- reading
def read_source(path: str, size: int, offset: int | None = None) -> bytes:
    """Read a source file whole (checking it still has ``size`` bytes), or ``size``
    bytes at ``offset``. The single place packing reads input data.

    Raises:
        BadFileError: unreadable, or changed since it was planned.
    """
    if is_url(path):  # a source on object storage
        return read_url(path, size, offset)
    try:
        fd = os.open(path, _O_READ)
    except OSError as e:
        raise BadFileError(f"{show(path)}: cannot read ({e.strerror}); fix its permissions, "
                           "or pass --on-error skip") from None
    return _read_open(fd, path, size, offset)


def _read_open(fd: int, path: str, size: int, offset: int | None = None) -> bytes:
    """:func:`read_source` on a file already open as ``fd`` (closed here)."""
    try:
        pos = offset or 0
        want = size if offset is not None else size + 1  # one more byte detects growth
        parts = []
        got = 0
        while got < want:
            chunk = os.pread(fd, want - got, pos + got)
            if not chunk:
                break
            parts.append(chunk)
            got += len(chunk)
    except OSError as e:
        raise BadFileError(f"{show(path)}: read failed ({e.strerror}); fix or remove the file, "
                           "or pass --on-error skip") from None
    finally:
        os.close(fd)
    data = parts[0] if len(parts) == 1 else b"".join(parts)
    if len(data) != size:
        raise BadFileError(f"{show(path)}: changed while packing ({len(data)}{'+' if got > size else ''} "
                           f"bytes, planned {size}); re-run pack")
    return data


def _json_value(value: Any) -> bytes:
    if isinstance(value, str):
        return value.encode("utf-8")
    return json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":")).encode("utf-8")


def _load_sample(plan: PackPlan, spec: SampleSpec, fds: dict[str, int] | None = None
                 ) -> tuple[dict[str, bytes], int, int]:
    """Read one sample's members (using files ``fds`` already opened by ``_loaded``);
    returns (fields, files read, bytes read)."""
    fields: dict[str, bytes] = {}
    files = nbytes = 0
    record: dict[str, Any] | None = None
    for m in spec.members:
        if m.path is not None:
            where = m.path
            path = os.path.join(plan.root, m.path)
            fd = fds.pop(path, None) if fds else None
            try:
                data = read_source(path, m.size) if fd is None else _read_open(fd, path, m.size)
            except (BadFileError, OSError) as e:
                reason = str(e).removeprefix(f"{show(path)}: ").split("; ")[0]
                raise _Problem(BadFileError, where, reason,
                               "fix or remove the file, or pass --on-error skip") from None
            files += 1
            nbytes += len(data)
            if is_image(m.field):
                data = _check_image(plan, m, data)
        elif m.data is not None:
            data = m.data
        else:
            if record is None:
                record = _manifest_record(plan, spec)
            try:
                data = _json_value(record[m.json_key])
            except (KeyError, UnicodeEncodeError, ValueError) as e:
                raise _Problem(BadFileError, f"{plan.manifest}:{spec.key}",
                               f"field {m.json_key!r} cannot be stored ({e})",
                               "fix the manifest line, or pass --on-error skip") from None
        fields[m.field] = data
    return fields, files, nbytes


def _manifest_record(plan: PackPlan, spec: SampleSpec) -> dict[str, Any]:
    offset, length = spec.line or (0, 0)
    path = os.path.join(plan.root, plan.manifest or "")
    raw = read_source(path, length, offset)
    if offset == 0 and raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]
    try:
        obj = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        obj = None
    if not isinstance(obj, dict):
        raise _Problem(BadFileError, plan.manifest or "", f"the line of sample {show(spec.key)!r} changed "
                       "while packing", "re-run pack")
    return obj


def _check_image(plan: PackPlan, m: Member, data: bytes) -> bytes:
    if not looks_like_image(data[:32], m.field):
        raise _Problem(BadFileError, m.path or "", f"has an image extension but is not an image "
                       f"(starts with {data[:8]!r})", "fix or remove the file, or pass --on-error skip")
    opts = plan.options
    if opts.max_side is not None:
        try:
            data = reencode(data, m.field, opts.max_side, opts.quality)
        except decode_errors() as e:
            raise _Problem(BadFileError, m.path or "", f"cannot decode image for --max-side "
                           f"({type(e).__name__}: {e})", "fix or remove the file, or pass --on-error skip") from None
    if opts.jpeg_restarts and data[:3] == b"\xff\xd8\xff":
        data = _with_restarts(data)
    return data


def _with_restarts(data: bytes) -> bytes:
    """The JPEG with a restart marker after every MCU, losslessly (same DCT coefficients,
    re-optimised Huffman tables), so the loader decodes a crop's MCUs only; a JPEG libjpeg
    cannot transcode cleanly (corrupt data, CMYK) is stored as it was."""
    head = roi.header(data)
    if head is None or not head[2]:  # unreadable header, CMYK/YCCK: stored as it was
        return data
    try:
        return roi.add_restarts(data)
    except ValueError:
        return data


def _length(plan: PackPlan, spec: SampleSpec, fields: dict[str, bytes]) -> int:
    spec_text = plan.options.length or ""
    name, sub = parse_length(spec_text)
    m = resolve_length_member(spec.members, name)
    where = m.path if m is not None and m.path else f"{plan.manifest or ''}:{spec.key}" if plan.manifest \
        else spec.key
    if m is None:
        raise _Problem(SourceError, where, f"sample {show(spec.key)!r} has no field {name!r} for --length",
                       "add the field, or choose another --length")
    data = fields[m.field]
    ext = m.field.rpartition(".")[2]
    try:
        if sub is not None or ext in ("json", "jsn"):
            value = json.loads(data)
            if sub is not None:
                value = value[sub]
            return length_of_value(value)
        text = data.decode("utf-8")
        if ext in _TEXT_EXTS:
            return len(text.split())
        return length_of_value(int(text.strip()))
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
        raise _Problem(SourceError, where, f"--length {spec_text}: sample {show(spec.key)!r} has no usable "
                       f"length ({type(e).__name__}: {e})",
                       "store a non-negative integer, a text or a list there, or pass --on-error skip") from None


def _label(plan: PackPlan, spec: SampleSpec, fields: dict[str, bytes]) -> int:
    if spec.label >= 0 or plan.kind != "files":
        return spec.label
    raw = fields.get("cls")
    if raw is None:
        return -1
    try:
        return int(raw.strip())
    except ValueError:
        return -1


def _load_or_problem(plan: PackPlan, spec: SampleSpec, fds: dict[str, int] | None = None
                     ) -> tuple[SampleSpec, Any]:
    try:
        fields, files, nbytes = _load_sample(plan, spec, fds)
        label = _label(plan, spec, fields)
        length = _length(plan, spec, fields) if plan.options.length and plan.tokens is None else None
        return spec, (fields, files, nbytes, label, length)
    except _Problem as p:
        return spec, p


def _loaded(plan: PackPlan, samples: tuple[SampleSpec, ...]) -> Iterator[tuple[SampleSpec, Any]]:
    """Load samples in order, with reads of the next ones already under way.

    Local files: the files of the next :data:`READAHEAD` samples are opened and the
    kernel is asked to read them (``posix_fadvise(WILLNEED)``), so disk or network file
    system reads overlap with hashing and writing, at the cost of one system call per
    file and without Python threads (which cost more CPU than they save on a warm page
    cache). Object storage:
    :data:`IO_THREADS` reader threads keep requests in flight.
    """
    if is_url(plan.root):
        yield from _loaded_threads(plan, samples)
        return
    if not hasattr(os, "posix_fadvise"):
        for spec in samples:
            yield _load_or_problem(plan, spec)
        return
    fds: dict[str, int] = {}  # files opened ahead; reading one closes it
    try:
        for ahead in samples[:READAHEAD]:
            _will_need(plan.root, ahead, fds)
        for i, spec in enumerate(samples):
            if i + READAHEAD < len(samples):
                _will_need(plan.root, samples[i + READAHEAD], fds)
            yield _load_or_problem(plan, spec, fds)
    finally:
        for fd in fds.values():
            os.close(fd)


def _will_need(root: str, spec: SampleSpec, fds: dict[str, int]) -> None:
    """Open the sample's files and ask the kernel to start reading them."""
    for m in spec.members:
        if m.path is None:
            continue
        path = os.path.join(root, m.path)
        try:
            fd = os.open(path, _O_READ)
        except OSError:
            continue  # reading it later reports the problem
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
        except OSError:
            pass
        old = fds.pop(path, None)  # the same file twice in the window (a JSONL manifest can)
        if old is not None:
            os.close(old)
        fds[path] = fd


def _loaded_threads(plan: PackPlan, samples: tuple[SampleSpec, ...]) -> Iterator[tuple[SampleSpec, Any]]:
    chunks = [samples[i:i + _CHUNK] for i in range(0, len(samples), _CHUNK)]

    def load_chunk(chunk: tuple[SampleSpec, ...]) -> list[tuple[SampleSpec, Any]]:
        return [_load_or_problem(plan, s) for s in chunk]

    with ThreadPoolExecutor(IO_THREADS, thread_name_prefix="fastfeed-read") as ex:
        window: deque = deque()
        it = iter(chunks)
        for c in it:
            window.append(ex.submit(load_chunk, c))
            if len(window) >= 2 * IO_THREADS:
                break
        while window:
            done = window.popleft().result()
            nxt = next(it, None)
            if nxt is not None:
                window.append(ex.submit(load_chunk, nxt))
            yield from done


# ---------------------------------------------------------------- resume records
def shard_fingerprint(plan: PackPlan, shard: ShardPlan) -> str:
    """Identity of a shard's inputs: the job, its samples, and their sizes and mtimes (a table:
    the source's fingerprint and the shard's units)."""
    h = hashlib.sha256(f"{plan.job}|{shard.number}|{shard.name}|{plan.manifest_sha256}".encode())
    if plan.table is not None:
        h.update(f"|{plan.table.fingerprint}|{sorted(plan.table.dropped)}".encode())
        h.update(repr([plan.table.units[i] for i in shard.units]).encode("utf-8", "surrogateescape"))
    for s in shard.samples:
        h.update(repr((s.key, s.label, s.line, s.members)).encode("utf-8", "surrogateescape"))
    return h.hexdigest()


def _record_path(plan: PackPlan, shard: ShardPlan) -> Path:
    return Path(plan.dst) / resume_record(shard.name)


def _reusable(plan: PackPlan, shard: ShardPlan, fingerprint: str) -> ShardResult | None:
    try:
        rec = ShardResult.from_json(json.loads(_record_path(plan, shard).read_text("utf-8")))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if rec.fingerprint != fingerprint or rec.name != shard.name:
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
    dst = Path(plan.dst)
    tmp = dst / f"{shard.name}.{os.getpid()}.tmp"
    try:
        result = _write(plan, shard, tmp, fingerprint, progress)
        # Record first, rename last: a shard under its final name always has its record,
        # so a re-run can check and reuse every shard that became visible.
        atomic_write_bytes(_record_path(plan, shard), json.dumps(result.to_json()).encode())
        os.replace(tmp, dst / shard.name)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return result


def _items(plan: PackPlan, shard: ShardPlan, skipped: list[dict[str, str]]) -> Iterator[Item]:
    """The planned samples of a folder / JSONL shard, loaded (bad ones raised or appended to ``skipped``)."""
    for spec, loaded in _loaded(plan, shard.samples):
        if isinstance(loaded, _Problem):
            if plan.options.on_error != "skip":
                raise loaded.error(plan.root)
            skipped.append({"path": show(loaded.where), "key": show(spec.key), "reason": loaded.reason})
            continue
        data, f, b, label, length = loaded
        yield Item(spec.key, data, label, length, f, b)


def _table_rows(plan: PackPlan, shard: ShardPlan, skipped: list[dict[str, str]]) -> Iterator[Item]:
    """The rows of a table shard, their images re-encoded (``max_side``, ``jpeg_restarts``) as files are."""
    items = table_items(plan, shard, skipped)
    if plan.options.max_side is None and not plan.options.jpeg_restarts:
        yield from items
        return
    for item in items:
        try:
            fields = {f: _check_image(plan, Member(f, f"{item.key}.{f}", len(d), 0), d) if is_image(f) else d
                      for f, d in item.fields.items()}
        except _Problem as p:
            if plan.options.on_error != "skip":
                raise p.error(plan.root) from None
            skipped.append({"path": show(p.where), "key": show(item.key), "reason": p.reason})
            continue
        yield item._replace(fields=fields)


def _write(plan: PackPlan, shard: ShardPlan, tmp: Path, fingerprint: str,
           progress: ProgressFn | None) -> ShardResult:
    dst = Path(plan.dst)
    fmt = plan.options.format
    fileobj = open(tmp, "wb", buffering=1 << 20) if fmt == "tar" else None
    try:
        writer = TarShardWriter(tmp, fileobj=fileobj) if fileobj is not None else FORMATS[fmt][0](tmp)
        offsets: list[tuple[int, int]] = []
        labels: list[int] = []
        lengths: list[int] | None = [] if plan.lengths_field else None
        skipped: list[dict[str, str]] = []
        fields: set[str] = set()
        files = nbytes = pend_files = pend_bytes = 0
        last = time.monotonic()
        items = _table_rows(plan, shard, skipped) if plan.table is not None else _items(plan, shard, skipped)
        for item in with_tokens(plan, shard, items, skipped):
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
        idx_tmp.write_bytes(text)
        os.replace(idx_tmp, dst / dali_name)
    return ShardResult(
        number=shard.number, name=shard.name, samples=len(offsets), bytes=size, sha256=sha,
        offsets=offsets, labels=labels, lengths=lengths, skipped=skipped, fields=sorted(fields),
        dali_index=dali_name, dali_sha256=dali_sha, fingerprint=fingerprint, files_read=files,
        bytes_read=nbytes,
    )
