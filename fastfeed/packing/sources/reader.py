"""Reading the planned samples of a listed source (folder, object-store prefix, JSONL manifest, tars).

All reading of source bytes goes through :func:`read_source` (one small function: a local
``pread``, or an fsspec read with retries for a URL). :class:`SampleReader` yields the samples of
a shard in order, with the reads of the next ones already under way (``posix_fadvise`` locally,
reader threads on object storage). A member's bytes come from its file (a tar member: a range
of the tar), inline data, or its key in the sample's manifest line; every image member goes
through the writer's :data:`~fastfeed.packing.sources.base.ImageFn`. A bad input is a
:class:`~fastfeed.packing.sources.base.Problem`, raised or recorded as ``reading.on_error`` says.

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
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

from fastfeed.decode.fields import decode_field
from fastfeed.errors import BadFileError, SampleError, SourceError
from fastfeed.formats.naming import RAW_FIELD, is_image
from fastfeed.packing.sources.base import (
    LENGTH_TEXT_EXTS,
    Item,
    Problem,
    Reading,
    SampleSpec,
    image_member,
    length_of_value,
    parse_length,
    resolve_length_member,
    show,
)
from fastfeed.storage.remote import filesystem, is_url, with_retries

__all__ = ["IO_THREADS", "READAHEAD", "SampleReader", "read_source"]

#: Local sources: samples whose files are opened and read ahead by the kernel.
READAHEAD = 32
#: Sources on object storage: reader threads per writing process, keeping requests in flight.
IO_THREADS = 8
_CHUNK = 4
_O_READ = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)


# ---------------------------------------------------------------- bytes
def read_source(path: str, size: int, offset: int | None = None) -> bytes:
    """Read a source file whole (checking it still has ``size`` bytes), or ``size``
    bytes at ``offset``. The single place packing reads input data (a path or a URL).

    Raises:
        BadFileError: unreadable, or changed since it was planned.
    """
    if is_url(path):  # a source on object storage
        return _read_url(path, size, offset)
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


def _read_url(url: str, size: int, offset: int | None = None) -> bytes:
    """The whole object (checking it still has ``size`` bytes), or ``size`` bytes at ``offset``."""
    fs, path = filesystem(url)
    start = offset or 0

    def get() -> bytes:
        if offset is None:
            return bytes(fs.cat_file(path))
        return bytes(fs.cat_file(path, start=start, end=start + size))

    try:
        data = with_retries(get, url, "read")
    except (FileNotFoundError, PermissionError) as e:
        why = "not found" if isinstance(e, FileNotFoundError) else "access denied"
        raise BadFileError(f"{url}: cannot read ({why}); fix or remove the object, "
                           "or pass --on-error skip") from None
    if len(data) != size:
        raise BadFileError(f"{url}: changed while packing ({len(data)} bytes, planned {size}); re-run pack")
    return data


def _json_value(value: Any) -> bytes:
    if isinstance(value, str):
        return value.encode("utf-8")
    return json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":")).encode("utf-8")


# ---------------------------------------------------------------- samples
@dataclass(frozen=True)
class SampleReader:
    """Reads the samples of one listed source.

    Attributes:
        root: what member paths are relative to (a folder or a URL prefix).
        manifest: the JSONL manifest's name inside ``root`` (members with a ``json_key``), else None.
        cls_labels: take a sample without a planned label from its ``cls`` field (files, tars).
    """

    root: str
    manifest: str | None = None
    cls_labels: bool = False

    def read(self, samples: Sequence[SampleSpec], raw: Sequence[bool], reading: Reading) -> Iterator[Item]:
        """The samples in order (see the module doc); a bad one raised or appended to ``reading.skipped``."""
        for spec, loaded in self._loaded(samples, raw or (False,) * len(samples), reading):
            if isinstance(loaded, Problem):
                if reading.on_error != "skip":
                    raise loaded.error(self.root)
                reading.skipped.append({"path": show(loaded.where), "key": show(spec.key), "reason": loaded.reason})
                continue
            yield loaded

    def _loaded(self, samples: Sequence[SampleSpec], flags: Sequence[bool], reading: Reading
                ) -> Iterator[tuple[SampleSpec, Item | Problem]]:
        """Load samples in order, with reads of the next ones already under way.

        Local files: the files of the next :data:`READAHEAD` samples are opened and the
        kernel is asked to read them (``posix_fadvise(WILLNEED)``), so disk or network file
        system reads overlap with hashing and writing, at the cost of one system call per
        file and without Python threads (which cost more CPU than they save on a warm page
        cache). Object storage: :data:`IO_THREADS` reader threads keep requests in flight.
        """
        if is_url(self.root):
            yield from self._loaded_threads(samples, flags, reading)
            return
        if not hasattr(os, "posix_fadvise"):
            for spec, r in zip(samples, flags):
                yield self._load_or_problem(spec, reading, raw=r)
            return
        fds: dict[str, int] = {}  # files opened ahead; reading one closes it
        try:
            for ahead in samples[:READAHEAD]:
                self._will_need(ahead, fds)
            for i, spec in enumerate(samples):
                if i + READAHEAD < len(samples):
                    self._will_need(samples[i + READAHEAD], fds)
                yield self._load_or_problem(spec, reading, fds, flags[i])
        finally:
            for fd in fds.values():
                os.close(fd)

    def _will_need(self, spec: SampleSpec, fds: dict[str, int]) -> None:
        """Open the sample's files and ask the kernel to start reading them."""
        for m in spec.members:
            if m.path is None or m.offset is not None:  # tar members: read by offset, not whole
                continue
            path = os.path.join(self.root, m.path)
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

    def _loaded_threads(self, samples: Sequence[SampleSpec], flags: Sequence[bool], reading: Reading
                        ) -> Iterator[tuple[SampleSpec, Item | Problem]]:
        pairs = list(zip(samples, flags))
        chunks = [pairs[i:i + _CHUNK] for i in range(0, len(pairs), _CHUNK)]

        def load_chunk(chunk: list[tuple[SampleSpec, bool]]) -> list[tuple[SampleSpec, Item | Problem]]:
            return [self._load_or_problem(s, reading, raw=r) for s, r in chunk]

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

    def _load_or_problem(self, spec: SampleSpec, reading: Reading, fds: dict[str, int] | None = None,
                         raw: bool = False) -> tuple[SampleSpec, Item | Problem]:
        try:
            fields, files, nbytes = self._load(spec, reading, fds, raw)
            length = self._length(spec, fields, reading.length) if reading.length else None
            return spec, Item(spec.key, fields, self._label(spec, fields), length, files, nbytes)
        except Problem as p:
            return spec, p

    def _load(self, spec: SampleSpec, reading: Reading, fds: dict[str, int] | None, raw: bool
              ) -> tuple[dict[str, Any], int, int]:
        """Read one sample's members (using files ``fds`` already opened); returns (fields, files
        read, bytes read). With ``raw``, its image goes to :data:`~fastfeed.formats.naming.RAW_FIELD`
        as ``reading.image`` decodes it."""
        fields: dict[str, Any] = {}
        files = nbytes = 0
        record: dict[str, Any] | None = None
        pixel_member = image_member(spec) if raw else None
        for m in spec.members:
            if m.path is not None:
                where = m.path
                path = os.path.join(self.root, m.path)
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
                if reading.image is not None and m is pixel_member:
                    fields[RAW_FIELD] = reading.image(m._replace(path=where), data, True)
                    continue
                if reading.image is not None and is_image(m.field):
                    data = reading.image(m._replace(path=where), data, False)
            elif m.data is not None:
                data = m.data
            else:
                if record is None:
                    record = self._manifest_record(spec)
                try:
                    data = _json_value(record[m.json_key])
                except (KeyError, UnicodeEncodeError, ValueError) as e:
                    raise Problem(BadFileError, f"{self.manifest}:{spec.key}",
                                  f"field {m.json_key!r} cannot be stored ({e})",
                                  "fix the manifest line, or pass --on-error skip") from None
            fields[m.field] = data
        return fields, files, nbytes

    def _manifest_record(self, spec: SampleSpec) -> dict[str, Any]:
        offset, length = spec.line or (0, 0)
        path = os.path.join(self.root, self.manifest or "")
        raw = read_source(path, length, offset)
        if offset == 0 and raw.startswith(b"\xef\xbb\xbf"):
            raw = raw[3:]
        try:
            obj = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            obj = None
        if not isinstance(obj, dict):
            raise Problem(BadFileError, self.manifest or "", f"the line of sample {show(spec.key)!r} changed "
                          "while packing", "re-run pack")
        return obj

    def _label(self, spec: SampleSpec, fields: dict[str, Any]) -> int:
        if spec.label >= 0 or not self.cls_labels:
            return spec.label
        raw = fields.get("cls")
        if raw is None:
            return -1
        try:
            return int(raw.strip())
        except ValueError:
            return -1

    def _length(self, spec: SampleSpec, fields: dict[str, Any], spec_text: str) -> int:
        name, sub = parse_length(spec_text)
        m = resolve_length_member(spec.members, name)
        where = m.path if m is not None and m.path else f"{self.manifest or ''}:{spec.key}" if self.manifest \
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
