"""Reading the planned samples of a folder or JSONL source, for :mod:`fastfeed.packing.write`.

All file reading of ``pack`` goes through :func:`read_source` (one small function), so
another engine can route it elsewhere (fsspec) without touching the rest.
:func:`load_samples` yields the samples of a shard in order, with the reads of the next
ones already under way (``posix_fadvise`` locally, reader threads on object storage);
a bad input is a :class:`Problem` that the writer raises or records (``on_error``).
Images are checked, and re-encoded for ``max_side`` / ``jpeg_restarts``, by :func:`check_image`;
an image stored as pixels (``--store raw``) is decoded by :func:`raw_image` instead.

Example:
    >>> import tempfile
    >>> with tempfile.NamedTemporaryFile() as f:
    ...     _ = f.write(b"hello"); f.flush()
    ...     read_source(f.name, 5)
    b'hello'
"""

from __future__ import annotations

import json
import os
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterator

from fastfeed.decode import roi
from fastfeed.decode.fields import decode_field
from fastfeed.decode.raw import to_pixels
from fastfeed.errors import BadFileError, SampleError, SourceError
from fastfeed.formats.images import (
    decode_errors,
    jpeg_truncated,
    looks_like_image,
    reencode,
)
from fastfeed.formats.naming import RAW_FIELD, is_image
from fastfeed.packing.content.pixels import Pixels, image_member
from fastfeed.packing.plan import PackPlan
from fastfeed.packing.sources.base import (
    Member,
    SampleSpec,
    parse_length,
    resolve_length_member,
    show,
)
from fastfeed.packing.sources.remote import read as read_url
from fastfeed.packing.stream import LENGTH_TEXT_EXTS, length_of_value
from fastfeed.storage.remote import is_url

__all__ = ["IO_THREADS", "READAHEAD", "Problem", "check_image", "load_samples", "raw_image", "read_source"]

#: Local sources: samples whose files are opened and read ahead by the kernel (``load_samples``).
READAHEAD = 32
#: Sources on object storage: reader threads per writing process, keeping requests in flight.
IO_THREADS = 8
_CHUNK = 4
_O_READ = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)


class Problem(Exception):
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


def _load_sample(plan: PackPlan, spec: SampleSpec, fds: dict[str, int] | None = None, raw: bool = False
                 ) -> tuple[dict[str, Any], int, int]:
    """Read one sample's members (using files ``fds`` already opened by ``load_samples``);
    returns (fields, files read, bytes read). With ``raw``, its image is decoded into
    :data:`~fastfeed.formats.naming.RAW_FIELD` (a :class:`~fastfeed.packing.content.pixels.Pixels`)."""
    fields: dict[str, Any] = {}
    files = nbytes = 0
    record: dict[str, Any] | None = None
    pixel_member = image_member(spec) if raw else None
    for m in spec.members:
        if m.path is not None:
            where = m.path
            path = os.path.join(plan.root, m.path)
            if m.offset is not None:  # a member of a WebDataset tar
                where = f"{m.path}:{spec.key}.{m.field}"
            fd = fds.pop(path, None) if fds and m.offset is None else None
            try:
                data = read_source(path, m.size, m.offset) if fd is None else _read_open(fd, path, m.size)
            except (BadFileError, OSError) as e:
                reason = str(e).removeprefix(f"{show(path)}: ").split("; ")[0]
                raise Problem(BadFileError, where, reason,
                               "fix or remove the file, or pass --on-error skip") from None
            files += 1
            nbytes += len(data)
            if m is pixel_member:
                fields[RAW_FIELD] = raw_image(plan, m._replace(path=where), data)
                continue
            if is_image(m.field):
                data = check_image(plan, m._replace(path=where), data)
        elif m.data is not None:
            data = m.data
        else:
            if record is None:
                record = _manifest_record(plan, spec)
            try:
                data = _json_value(record[m.json_key])
            except (KeyError, UnicodeEncodeError, ValueError) as e:
                raise Problem(BadFileError, f"{plan.manifest}:{spec.key}",
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
        raise Problem(BadFileError, plan.manifest or "", f"the line of sample {show(spec.key)!r} changed "
                       "while packing", "re-run pack")
    return obj


def check_image(plan: PackPlan, m: Member, data: bytes) -> bytes:
    if not looks_like_image(data[:32], m.field):
        raise Problem(BadFileError, m.path or "", f"has an image extension but is not an image "
                       f"(starts with {data[:8]!r})", "fix or remove the file, or pass --on-error skip")
    opts = plan.options
    if opts.max_side is not None:
        try:
            data = reencode(data, m.field, opts.max_side, opts.quality)
        except decode_errors() as e:
            raise Problem(BadFileError, m.path or "", f"cannot decode image for --max-side "
                           f"({type(e).__name__}: {e})", "fix or remove the file, or pass --on-error skip") from None
    if (why := jpeg_truncated(data)) is not None:  # the loader would fail on it hours into training
        raise Problem(BadFileError, m.path or "", why, "copy or download the file again, remove it, "
                      "or pass --on-error skip")
    if opts.jpeg_restarts and data[:3] == b"\xff\xd8\xff":
        data = _with_restarts(data)
    return data


def raw_image(plan: PackPlan, m: Member, data: bytes) -> Pixels:
    """An image file decoded for ``--store raw`` (:func:`fastfeed.decode.raw.to_pixels`, ``max_side`` applied).

    Raises:
        Problem: not an image, a truncated JPEG, or an image that does not decode.
    """
    if not looks_like_image(data[:32], m.field):
        raise Problem(BadFileError, m.path or "", f"has an image extension but is not an image "
                       f"(starts with {data[:8]!r})", "fix or remove the file, or pass --on-error skip")
    if (why := jpeg_truncated(data)) is not None:
        raise Problem(BadFileError, m.path or "", why, "copy or download the file again, remove it, "
                      "or pass --on-error skip")
    try:
        arr = to_pixels(data, plan.options.max_side)
    except SampleError as e:
        raise Problem(BadFileError, m.path or "", f"{e} for --store {plan.options.store}",
                      "fix or remove the file, or pass --on-error skip") from None
    return Pixels(arr, len(data))


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
        raise Problem(SourceError, where, f"sample {show(spec.key)!r} has no field {name!r} for --length",
                       "add the field, or choose another --length")
    data = fields[m.field]
    ext = m.field.rpartition(".")[2]
    try:
        if ext == "npy" and sub is None:  # an array (token ids...): its first dimension
            arr = decode_field(m.field, data)
            return int(arr.shape[0]) if arr.ndim else length_of_value(int(arr))
        if sub is not None or ext in ("json", "jsn"):
            value = json.loads(data)
            if sub is not None:
                value = value[sub]
            return length_of_value(value)
        text = data.decode("utf-8")
        if ext in LENGTH_TEXT_EXTS:
            return len(text.split())
        return length_of_value(int(text.strip()))
    except (ValueError, KeyError, TypeError, UnicodeDecodeError, SampleError) as e:
        raise Problem(SourceError, where, f"--length {spec_text}: sample {show(spec.key)!r} has no usable "
                       f"length ({type(e).__name__}: {e})",
                       "store a non-negative integer, a text or a list there, or pass --on-error skip") from None


def _label(plan: PackPlan, spec: SampleSpec, fields: dict[str, bytes]) -> int:
    if spec.label >= 0 or plan.kind not in ("files", "webdataset"):
        return spec.label
    raw = fields.get("cls")
    if raw is None:
        return -1
    try:
        return int(raw.strip())
    except ValueError:
        return -1


def _load_or_problem(plan: PackPlan, spec: SampleSpec, fds: dict[str, int] | None = None, raw: bool = False
                     ) -> tuple[SampleSpec, Any]:
    try:
        fields, files, nbytes = _load_sample(plan, spec, fds, raw)
        label = _label(plan, spec, fields)
        length = _length(plan, spec, fields) if plan.options.length and plan.tokens is None else None
        return spec, (fields, files, nbytes, label, length)
    except Problem as p:
        return spec, p


def load_samples(plan: PackPlan, samples: tuple[SampleSpec, ...], raw: tuple[bool, ...] = ()
                 ) -> Iterator[tuple[SampleSpec, Any]]:
    """Load samples in order, with reads of the next ones already under way; ``raw[i]``: store the
    image of ``samples[i]`` as pixels (empty: none).

    Local files: the files of the next :data:`READAHEAD` samples are opened and the
    kernel is asked to read them (``posix_fadvise(WILLNEED)``), so disk or network file
    system reads overlap with hashing and writing, at the cost of one system call per
    file and without Python threads (which cost more CPU than they save on a warm page
    cache). Object storage:
    :data:`IO_THREADS` reader threads keep requests in flight.
    """
    flags = raw or (False,) * len(samples)
    if is_url(plan.root):
        yield from _loaded_threads(plan, samples, flags)
        return
    if not hasattr(os, "posix_fadvise"):
        for spec, r in zip(samples, flags):
            yield _load_or_problem(plan, spec, raw=r)
        return
    fds: dict[str, int] = {}  # files opened ahead; reading one closes it
    try:
        for ahead in samples[:READAHEAD]:
            _will_need(plan.root, ahead, fds)
        for i, spec in enumerate(samples):
            if i + READAHEAD < len(samples):
                _will_need(plan.root, samples[i + READAHEAD], fds)
            yield _load_or_problem(plan, spec, fds, flags[i])
    finally:
        for fd in fds.values():
            os.close(fd)


def _will_need(root: str, spec: SampleSpec, fds: dict[str, int]) -> None:
    """Open the sample's files and ask the kernel to start reading them."""
    for m in spec.members:
        if m.path is None or m.offset is not None:  # tar members: read by offset, not whole
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


def _loaded_threads(plan: PackPlan, samples: tuple[SampleSpec, ...], flags: tuple[bool, ...]
                    ) -> Iterator[tuple[SampleSpec, Any]]:
    pairs = list(zip(samples, flags))
    chunks = [pairs[i:i + _CHUNK] for i in range(0, len(pairs), _CHUNK)]

    def load_chunk(chunk: list[tuple[SampleSpec, bool]]) -> list[tuple[SampleSpec, Any]]:
        return [_load_or_problem(plan, s, raw=r) for s, r in chunk]

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
